//! QUIC between nodes over loopback: mutual TLS from the cluster CA (and refusals), node names, the pinned
//! MTU, and certificates saved to and loaded from disk. (Page chunks on these streams: fabric/tests/proto_chunk.rs.)

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use quinn::{Connection, Endpoint};
use vfabric_transport::quic::{connect, endpoint, peer_name, ClusterCa, NodeIdentity, QuicError, QuicSettings};

/// Short idle timeout so a test that goes wrong fails soon rather than hanging.
fn settings() -> QuicSettings {
    QuicSettings { idle_timeout: Duration::from_secs(5), ..QuicSettings::default() }
}

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Fails the test instead of hanging if something never completes (not a timing assertion: far above need).
async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f).await.expect("test hung")
}

/// Deterministic pseudo-random bytes (splitmix64).
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A unique, empty scratch directory; removed by [`Scratch`]'s drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("vfabric-quic-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Accepts one connection attempt on `server`: the connection, or why its handshake failed.
async fn accept_one(server: &Endpoint) -> Result<Connection, quinn::ConnectionError> {
    server.accept().await.expect("endpoint closed").await
}

/// Two endpoints (server `server_id`, client `client_id`), connected: (server's connection, client's connection).
async fn connected(
    server_id: &NodeIdentity,
    client_id: &NodeIdentity,
    settings: &QuicSettings,
) -> (Endpoint, Endpoint, Connection, Connection) {
    let server = endpoint(local(), server_id, settings).unwrap();
    let client = endpoint(local(), client_id, settings).unwrap();
    let addr = server.local_addr().unwrap();
    let (accepted, dialed) = tokio::join!(accept_one(&server), connect(&client, addr, &server_id.name));
    (server, client, accepted.unwrap(), dialed.unwrap())
}

/// Runs one connection attempt from `client_id` to `server_id` expecting the name `expect`; returns both results.
async fn attempt(
    server_id: &NodeIdentity,
    client_id: &NodeIdentity,
    expect: &str,
) -> (Result<Connection, quinn::ConnectionError>, Result<Connection, QuicError>) {
    let server = endpoint(local(), server_id, &settings()).unwrap();
    let client = endpoint(local(), client_id, &settings()).unwrap();
    let addr = server.local_addr().unwrap();
    guard(async { tokio::join!(accept_one(&server), connect(&client, addr, expect)) }).await
}

/// The server never yields a working connection: its handshake fails, or if quinn handed one over, it is
/// already unusable.
async fn assert_server_refused(accepted: Result<Connection, quinn::ConnectionError>) {
    if let Ok(conn) = accepted {
        let r = guard(async {
            let mut s = conn.open_uni().await?;
            s.write_all(b"x").await?;
            s.finish().map_err(|e| std::io::Error::other(e.to_string()))?;
            s.stopped().await.map_err(|e| std::io::Error::other(e.to_string()))?;
            Ok::<_, Box<dyn std::error::Error>>(())
        })
        .await;
        assert!(r.is_err(), "the server got a working connection from a refused peer");
    }
}

#[tokio::test]
async fn nodes_of_one_ca_connect_and_know_each_other() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    guard(async {
        let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings()).await;
        assert_eq!(peer_name(&accepted).as_deref(), Some("n0"));
        assert_eq!(peer_name(&dialed).as_deref(), Some("n1"));

        // A bidirectional round trip: the server echoes what it reads, reversed.
        let echo = async {
            let (mut send, mut recv) = accepted.accept_bi().await.unwrap();
            let mut msg = recv.read_to_end(1 << 20).await.unwrap();
            msg.reverse();
            send.write_all(&msg).await.unwrap();
            send.finish().unwrap();
            let _ = send.stopped().await;
        };
        let ask = async {
            let (mut send, mut recv) = dialed.open_bi().await.unwrap();
            send.write_all(b"hello, n1").await.unwrap();
            send.finish().unwrap();
            recv.read_to_end(1 << 20).await.unwrap()
        };
        let ((), reply) = tokio::join!(echo, ask);
        assert_eq!(reply, b"1n ,olleh");
    })
    .await;
}

#[tokio::test]
async fn one_endpoint_both_listens_and_dials() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    guard(async {
        let a = endpoint(local(), &n0, &settings()).unwrap();
        let b = endpoint(local(), &n1, &settings()).unwrap();
        let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let (from_b, to_b) = tokio::join!(accept_one(&b), connect(&a, b_addr, "n1"));
        let (from_a, to_a) = tokio::join!(accept_one(&a), connect(&b, a_addr, "n0"));
        assert_eq!(peer_name(&from_b.unwrap()).as_deref(), Some("n0"));
        assert_eq!(peer_name(&to_b.unwrap()).as_deref(), Some("n1"));
        assert_eq!(peer_name(&from_a.unwrap()).as_deref(), Some("n1"));
        assert_eq!(peer_name(&to_a.unwrap()).as_deref(), Some("n0"));
    })
    .await;
}

#[tokio::test]
async fn client_with_a_certificate_from_another_ca_is_refused() {
    let ca = ClusterCa::generate("test").unwrap();
    let other = ClusterCa::generate("test").unwrap();
    let server = ca.issue("n1").unwrap();
    // The client trusts the right CA (so it accepts the server) but presents a certificate of another one.
    let intruder = NodeIdentity { ca_pem: ca.cert_pem(), ..other.issue("n0").unwrap() };
    let (accepted, dialed) = attempt(&server, &intruder, "n1").await;
    assert!(matches!(dialed, Err(QuicError::Connection(_))), "client: {dialed:?}");
    assert!(accepted.is_err(), "the server accepted a client of another CA");
    assert_server_refused(accepted).await;
}

#[tokio::test]
async fn server_with_a_certificate_from_another_ca_is_refused() {
    let ca = ClusterCa::generate("test").unwrap();
    let other = ClusterCa::generate("test").unwrap();
    let client = ca.issue("n0").unwrap();
    // The server trusts the right CA (so it would accept the client) but presents a certificate of another one.
    let impostor = NodeIdentity { ca_pem: ca.cert_pem(), ..other.issue("n1").unwrap() };
    let (accepted, dialed) = attempt(&impostor, &client, "n1").await;
    assert!(matches!(dialed, Err(QuicError::Connection(_))), "client: {dialed:?}");
    assert_server_refused(accepted).await;
}

#[tokio::test]
async fn expecting_another_peer_name_fails() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    let (accepted, dialed) = attempt(&n1, &n0, "n2").await;
    assert!(matches!(dialed, Err(QuicError::Connection(_))), "client: {dialed:?}");
    assert_server_refused(accepted).await;
}

#[tokio::test]
async fn a_peer_name_that_is_no_dns_name_is_a_connect_error() {
    let ca = ClusterCa::generate("test").unwrap();
    let n0 = ca.issue("n0").unwrap();
    let client = endpoint(local(), &n0, &settings()).unwrap();
    let r = connect(&client, "127.0.0.1:9".parse().unwrap(), "not a name!").await;
    assert!(matches!(r, Err(QuicError::Connect(_))), "{r:?}");
}

/// The MTU is pinned on both sides of a connection, and packets go out in segmentation-offload batches that
/// the kernel accepts (no send above one UDP datagram's 65,507 bytes), also above 6,550 bytes where stock
/// quinn's batches of 10 are refused and lost: 9000 and the largest allowed, where quinn's packet length field
/// is nearly full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_mtu_is_the_packet_size() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    for mtu in [1200, 6500, 9000, vfabric_transport::quic::MAX_MTU] {
        let settings = QuicSettings { mtu, ..settings() };
        let payload = random_bytes(2 << 20, u64::from(mtu));
        guard(async {
            let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings).await;
            let receive = async {
                let mut stream = accepted.accept_uni().await.unwrap();
                stream.read_to_end(4 << 20).await.unwrap()
            };
            let send = async {
                let mut stream = dialed.open_uni().await.unwrap();
                stream.write_all(&payload).await.unwrap();
                stream.finish().unwrap();
                let _ = stream.stopped().await;
            };
            let ((), buf) = tokio::join!(send, receive);
            assert!(buf == payload);
            assert_eq!(dialed.stats().path.current_mtu, mtu, "client side");
            assert_eq!(accepted.stats().path.current_mtu, mtu, "server side");
            let tx = dialed.stats().udp_tx;
            assert!(tx.bytes <= tx.ios * 65_507, "mtu {mtu}: a send above one datagram: {tx:?}");
            // Where the system has segmentation offload (Linux 4.18 and later), sends carry several packets.
            if gso_supported() {
                assert!(tx.datagrams >= tx.ios + tx.ios / 2, "mtu {mtu}: hardly any batching: {tx:?}");
            }
        })
        .await;
    }
}

/// Whether this system's UDP sockets take segmentation-offload sends.
fn gso_supported() -> bool {
    let socket = std::net::UdpSocket::bind(local()).unwrap();
    quinn::udp::UdpSocketState::new((&socket).into()).unwrap().max_gso_segments() > 1
}

#[test]
fn settings_are_validated() {
    let d = QuicSettings::default;
    d().validate().unwrap();
    assert_eq!(d().mtu, 1452);
    for bad in [
        QuicSettings { mtu: 1199, ..d() },
        QuicSettings { mtu: 16_384, ..d() },
        QuicSettings { mtu: 65_507, ..d() },
        QuicSettings { stream_window: 0, ..d() },
        QuicSettings { connection_window: 0, ..d() },
        QuicSettings { max_concurrent_streams: 0, ..d() },
        QuicSettings { idle_timeout: Duration::ZERO, ..d() },
        QuicSettings { keep_alive: Duration::from_secs(20), ..d() },
    ] {
        assert!(matches!(bad.validate(), Err(QuicError::Config(_))), "{bad:?}");
    }
    // Every allowed MTU keeps segmentation offload, in batches within one UDP datagram.
    for (mtu, batch) in [(1200, 10), (6500, 10), (6551, 9), (9000, 7), (16_383, 3)] {
        let s = QuicSettings { mtu, ..d() };
        s.validate().unwrap();
        assert_eq!(s.packets_per_send(), batch, "mtu {mtu}");
    }
}

#[tokio::test]
async fn endpoint_refuses_bad_settings() {
    let ca = ClusterCa::generate("test").unwrap();
    let n0 = ca.issue("n0").unwrap();
    let r = endpoint(local(), &n0, &QuicSettings { mtu: 1100, ..settings() });
    assert!(matches!(r, Err(QuicError::Config(_))), "{r:?}");
}

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn a_saved_ca_loads_and_signs_for_the_same_cluster() {
    let scratch = Scratch::new("ca");
    let ca = ClusterCa::generate("prod").unwrap();
    let n0 = ca.issue("n0").unwrap();
    ca.save(&scratch.0).unwrap();
    let cert = std::fs::read_to_string(scratch.0.join("ca.pem")).unwrap();
    assert_eq!(cert, ca.cert_pem());
    assert!(!cert.contains("PRIVATE KEY"));
    #[cfg(unix)]
    assert_eq!(mode(&scratch.0.join("ca-key.pem")), 0o600);

    let loaded = ClusterCa::load(&scratch.0).unwrap();
    assert_eq!(loaded.cluster(), "prod");
    assert_eq!(loaded.cert_pem(), ca.cert_pem());
    assert_eq!(loaded.key_pem(), ca.key_pem());

    // A node issued by the loaded CA and one issued before saving trust each other, both ways.
    let n1 = loaded.issue("n1").unwrap();
    guard(async {
        let (_s, _c, accepted, dialed) = connected(&n1, &n0, &settings()).await;
        assert_eq!(peer_name(&accepted).as_deref(), Some("n0"));
        assert_eq!(peer_name(&dialed).as_deref(), Some("n1"));
        let (_s, _c, accepted, dialed) = connected(&n0, &n1, &settings()).await;
        assert_eq!(peer_name(&accepted).as_deref(), Some("n1"));
        assert_eq!(peer_name(&dialed).as_deref(), Some("n0"));
    })
    .await;

    // Missing files and a key of another CA do not load.
    assert!(ClusterCa::load(&scratch.0.join("nothing")).is_err());
    std::fs::write(scratch.0.join("ca-key.pem"), ClusterCa::generate("prod").unwrap().key_pem()).unwrap();
    assert!(matches!(ClusterCa::load(&scratch.0), Err(QuicError::Certificate(_))));
}

#[tokio::test]
async fn a_saved_identity_loads_and_connects() {
    let scratch = Scratch::new("node");
    let ca = ClusterCa::generate("prod").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("h200x2-1").unwrap());
    std::fs::create_dir_all(&scratch.0).unwrap();
    // A key file already there with loose permissions is tightened.
    std::fs::write(scratch.0.join("n0-key.pem"), "old").unwrap();
    n0.save(&scratch.0).unwrap();
    for file in ["n0.pem", "n0-key.pem", "ca.pem"] {
        assert!(scratch.0.join(file).is_file(), "{file}");
    }
    #[cfg(unix)]
    assert_eq!(mode(&scratch.0.join("n0-key.pem")), 0o600);

    let loaded = NodeIdentity::load(&scratch.0, "n0").unwrap();
    assert_eq!(loaded.name, n0.name);
    assert_eq!(loaded.cert_pem, n0.cert_pem);
    assert_eq!(loaded.key_pem, n0.key_pem);
    assert_eq!(loaded.ca_pem, ca.cert_pem());
    guard(async {
        let (_s, _c, accepted, dialed) = connected(&n1, &loaded, &settings()).await;
        assert_eq!(peer_name(&accepted).as_deref(), Some("n0"));
        assert_eq!(peer_name(&dialed).as_deref(), Some("h200x2-1"));
    })
    .await;

    // Another node's files, an absent node and an unsafe name do not load.
    assert!(NodeIdentity::load(&scratch.0, "n1").is_err());
    std::fs::copy(scratch.0.join("n0.pem"), scratch.0.join("n9.pem")).unwrap();
    std::fs::copy(scratch.0.join("n0-key.pem"), scratch.0.join("n9-key.pem")).unwrap();
    assert!(matches!(NodeIdentity::load(&scratch.0, "n9"), Err(QuicError::Certificate(_))));
    assert!(NodeIdentity::load(&scratch.0, "../n0").is_err());
}
