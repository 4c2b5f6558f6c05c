//! A quinn endpoint with mutual TLS from the cluster CA, tuned for bulk transfers between nodes.
//!
//! One endpoint per node both listens and dials: [`endpoint`] sets a server config (clients must present a
//! certificate signed by the cluster CA) and a default client config (servers must too, and must be the node
//! [`connect`] expects). TLS 1.3 only, ring as the crypto provider, ALPN [`ALPN`].
//!
//! The transport follows what was measured on these machines (docs/benchmarks.md): the packet size is the main
//! throughput lever, so the MTU is a per-cluster setting ([`QuicSettings::mtu`]) and both the initial and the
//! minimum MTU are pinned to it, with path MTU discovery off: loss is never read as an MTU problem and the
//! connection never falls back to 1200-byte packets. Socket buffers are asked for at
//! [`QuicSettings::socket_buffer`] (4 MiB): the system default (208 KiB on Linux) overflows while a receiver is
//! busy copying a chunk, and each drop cuts the congestion window. The flow-control windows stay within what
//! that buffer holds, so a receiver that falls behind slows its sender instead of dropping its packets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::congestion::CubicConfig;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, EndpointConfig, IdleTimeout, TransportConfig, VarInt};
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use super::ca::NodeIdentity;
use super::error::QuicError;
use super::runtime::PinnedRuntime;
use super::socket::{gso_segments, CappedGsoSocket};
use super::x509;

/// The ALPN protocol every vfabric connection negotiates.
pub const ALPN: &[u8] = b"vfabric/1";
/// The smallest MTU QUIC allows (RFC 9000 §14).
pub const MIN_MTU: u16 = 1200;
/// The default MTU: fits a 1500-byte Ethernet frame over IPv6 (1500 - 40 - 8), so safe everywhere.
pub const DEFAULT_MTU: u16 = 1452;
/// The most packets quinn 0.11 puts in one send (`MAX_TRANSMIT_SEGMENTS` in its connection driver).
const QUINN_MAX_TRANSMIT_SEGMENTS: usize = 10;
/// The largest MTU allowed at all. quinn-proto 0.11 writes a long-header packet's length as a two-byte varint
/// and asserts that it is below 2^14 (`packet.rs`, `set_payload_length`): at a 16,384-byte MTU and above, the
/// first padded handshake packet panics inside the endpoint driver. Measured here: 16384 and 60000 abort the
/// process. A packet's length field covers less than the packet, so 16,383 bytes is safe.
pub const MAX_MTU: u16 = 16_383;
/// The smallest UDP payload the endpoint accepts from peers whatever its own MTU (quinn's default), so a peer
/// configured with a larger MTU still gets its handshake through.
const MIN_ACCEPTED_PAYLOAD: u16 = 1472;
/// RFC 9002's floor for the initial congestion window.
const INITIAL_WINDOW_FLOOR: u64 = 14_720;

/// The transport settings of every connection of an endpoint.
#[derive(Debug, Clone)]
pub struct QuicSettings {
    /// UDP payload bytes per packet; the initial and the minimum MTU are both pinned to it and MTU discovery is
    /// off (default 1452). Every node of a cluster must use a value that its links carry: a packet too large
    /// for the path is lost, and with the minimum pinned the connection does not fall back.
    ///
    /// Packets go out in segmentation-offload (GSO) batches of as many as fit in one UDP datagram (10 up to
    /// 6,550 bytes, 7 at jumbo frames' 8952, 3 at 16,383: [`super::socket`]); stock quinn's batches of 10 are
    /// refused by the kernel above 6,550 bytes and lost without a word.
    ///
    /// The endpoint accepts datagrams of up to `max(mtu, 1472)` bytes from peers, and quinn sizes its receive
    /// buffer from that (× 64 GRO segments × 32 datagrams per batch on Linux): 3 MiB at 1452, 18 MiB at 9000.
    pub mtu: u16,
    /// How many bytes a peer may send on one stream beyond what the application has read (default 8 MiB).
    pub stream_window: u64,
    /// How many bytes a peer may send on all streams of a connection beyond what the application has read, and
    /// how many unacknowledged bytes this side keeps in flight (default 8 MiB).
    ///
    /// Keep it within what the socket's receive buffer holds ([`QuicSettings::socket_buffer`]; Linux doubles
    /// the number asked for): then a receiver that falls behind holds its sender back by flow control. With a
    /// larger window the sender fills the buffer, the kernel drops packets, and each loss cuts the congestion
    /// window: on 2 cores, windows far beyond the buffer lost packets and wrote slower than windows within it.
    /// On a 16-core host, where receivers keep up, larger windows gain, and 8 MiB carries one connection's
    /// most over the round trips of a cluster (docs/benchmarks.md has the figures).
    pub connection_window: u64,
    /// A connection with no packet from its peer for this long is closed (default 10 s). Must be more than
    /// zero.
    pub idle_timeout: Duration,
    /// How often to send a keep-alive on an otherwise quiet connection (default 1 s); zero sends none. Must be
    /// shorter than `idle_timeout`.
    pub keep_alive: Duration,
    /// How many streams of each kind (bidirectional and unidirectional) a peer may have open at once
    /// (default 256).
    pub max_concurrent_streams: u32,
    /// Send and receive buffer of the endpoint's UDP socket, bytes (default 4 MiB; the kernel caps it at
    /// `net.core.rmem_max` / `wmem_max`); 0 keeps the system's default.
    pub socket_buffer: usize,
}

impl Default for QuicSettings {
    fn default() -> Self {
        QuicSettings {
            mtu: DEFAULT_MTU,
            stream_window: 8 << 20,
            connection_window: 8 << 20,
            idle_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(1),
            max_concurrent_streams: 256,
            socket_buffer: 4 << 20,
        }
    }
}

impl QuicSettings {
    /// Checks the settings, saying what is wrong: the MTU within 1200..=16383, windows and stream counts
    /// nonzero (and windows within QUIC's 2^62 - 1), an idle timeout quinn can represent, and keep-alives
    /// more frequent than the idle timeout.
    pub fn validate(&self) -> Result<(), QuicError> {
        let bad = |why: String| Err(QuicError::Config(why));
        if self.mtu < MIN_MTU {
            return bad(format!("mtu {} is below QUIC's minimum of {MIN_MTU} bytes", self.mtu));
        }
        if self.mtu > MAX_MTU {
            return bad(format!(
                "mtu {} is above {MAX_MTU} bytes, the largest packet quinn 0.11 can send (its length field is \
                 two bytes)",
                self.mtu
            ));
        }
        for (name, window) in [("stream_window", self.stream_window), ("connection_window", self.connection_window)] {
            if window == 0 {
                return bad(format!("{name} is 0: the peer could never send anything"));
            }
            if VarInt::from_u64(window).is_err() {
                return bad(format!("{name} {window} is above QUIC's limit of 2^62 - 1"));
            }
        }
        if self.max_concurrent_streams == 0 {
            return bad("max_concurrent_streams is 0: the peer could never open a stream".into());
        }
        if self.idle_timeout.is_zero() {
            return bad("idle_timeout is 0".into());
        }
        if IdleTimeout::try_from(self.idle_timeout).is_err() {
            return bad(format!("idle_timeout {:?} is too long for QUIC", self.idle_timeout));
        }
        if !self.keep_alive.is_zero() && self.keep_alive >= self.idle_timeout {
            return bad(format!(
                "keep_alive {:?} is not shorter than idle_timeout {:?}: quiet connections would time out",
                self.keep_alive, self.idle_timeout
            ));
        }
        Ok(())
    }

    /// How many packets one send carries at most (segmentation offload, where the socket supports it): as many
    /// as fit in one UDP datagram, and no more than quinn's 10.
    pub fn packets_per_send(&self) -> usize {
        gso_segments(self.mtu, QUINN_MAX_TRANSMIT_SEGMENTS)
    }

    /// The quinn transport config for these (validated) settings.
    fn transport_config(&self) -> Result<TransportConfig, QuicError> {
        let varint = |name: &str, value: u64| {
            VarInt::from_u64(value).map_err(|_| QuicError::Config(format!("{name} {value} is above 2^62 - 1")))
        };
        let idle = IdleTimeout::try_from(self.idle_timeout)
            .map_err(|_| QuicError::Config(format!("idle_timeout {:?} is too long for QUIC", self.idle_timeout)))?;
        let mtu = u64::from(self.mtu);
        // RFC 9002 §7.2 with the pinned packet size: above 7,360-byte packets this is two packets, never one
        // (a window of one packet stalls the handshake).
        let mut cubic = CubicConfig::default();
        cubic.initial_window((10 * mtu).min(INITIAL_WINDOW_FLOOR.max(2 * mtu)));

        let mut transport = TransportConfig::default();
        transport
            .initial_mtu(self.mtu)
            .min_mtu(self.mtu)
            .mtu_discovery_config(None)
            .stream_receive_window(varint("stream_window", self.stream_window)?)
            .receive_window(varint("connection_window", self.connection_window)?)
            .send_window(self.connection_window)
            .max_concurrent_bidi_streams(VarInt::from_u32(self.max_concurrent_streams))
            .max_concurrent_uni_streams(VarInt::from_u32(self.max_concurrent_streams))
            .max_idle_timeout(Some(idle))
            .keep_alive_interval((!self.keep_alive.is_zero()).then_some(self.keep_alive))
            .congestion_controller_factory(Arc::new(cubic));
        Ok(transport)
    }
}

/// An endpoint bound to `bind` that accepts peers presenting a certificate signed by the identity's CA (mutual
/// TLS: clients must present one too) and connects to peers the same way. Server and client configs both set,
/// so one endpoint both listens and dials. ALPN "vfabric/1".
///
/// Accept with plain quinn: `endpoint.accept().await` gives an [`quinn::Incoming`] (or `None` once closed), and
/// awaiting that gives the [`Connection`] once the client's certificate has been verified; [`peer_name`] says
/// which node it is. Dial with [`connect`].
///
/// Must be called inside a Tokio runtime (the endpoint's driver is spawned on it, and its connections' drivers
/// on the runtime of whoever dials or accepts); outside one it returns [`QuicError::Io`].
pub fn endpoint(bind: SocketAddr, identity: &NodeIdentity, settings: &QuicSettings) -> Result<Endpoint, QuicError> {
    let runtime = quinn::default_runtime()
        .ok_or_else(|| std::io::Error::other("no Tokio runtime: create QUIC endpoints inside one"))?;
    build(bind, identity, settings, runtime)
}

/// [`endpoint()`] whose socket, timers and drivers (its own and every connection's) all live on the runtime
/// `runtime` pins to, whichever runtime creates it, dials or accepts. Callable from anywhere.
pub fn endpoint_pinned(
    bind: SocketAddr,
    identity: &NodeIdentity,
    settings: &QuicSettings,
    runtime: PinnedRuntime,
) -> Result<Endpoint, QuicError> {
    // The socket registers with the reactor of the runtime current when it is made.
    let handle = runtime.handle().clone();
    let _in = handle.enter();
    build(bind, identity, settings, Arc::new(runtime))
}

fn build(
    bind: SocketAddr,
    identity: &NodeIdentity,
    settings: &QuicSettings,
    runtime: Arc<dyn quinn::Runtime>,
) -> Result<Endpoint, QuicError> {
    settings.validate()?;
    let transport = Arc::new(settings.transport_config()?);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = |e: rustls::Error| QuicError::Tls(e.to_string());

    let mut roots = RootCertStore::empty();
    roots.add(identity.ca_der()?).map_err(|e| QuicError::Certificate(format!("the CA certificate: {e}")))?;
    let roots = Arc::new(roots);
    let chain = vec![identity.cert_der()?];

    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| QuicError::Tls(e.to_string()))?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), identity.key_der()?)
        .map_err(tls)?;
    server.alpn_protocols = vec![ALPN.to_vec()];
    let server = QuicServerConfig::try_from(server).map_err(|e| QuicError::Tls(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server));
    server.transport_config(transport.clone());

    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, identity.key_der()?)
        .map_err(tls)?;
    client.alpn_protocols = vec![ALPN.to_vec()];
    let client = QuicClientConfig::try_from(client).map_err(|e| QuicError::Tls(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client));
    client.transport_config(transport);

    let (reset_key, cid_key) = restart_keys(identity)?;
    let mut config = EndpointConfig::new(reset_key);
    config.cid_generator(move || Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key)));
    config
        .max_udp_payload_size(settings.mtu.max(MIN_ACCEPTED_PAYLOAD))
        .map_err(|e| QuicError::Config(format!("mtu {}: {e}", settings.mtu)))?;
    let socket = std::net::UdpSocket::bind(bind)?;
    let socket = CappedGsoSocket::new(socket, settings.mtu)?;
    if settings.socket_buffer > 0 {
        socket.set_buffer_sizes(settings.socket_buffer)?;
    }
    // What the kernel granted (on Linux twice the smaller of the size asked for and net.core.rmem_max): a flow
    // control window above it lets a busy receiver drop packets.
    let granted = socket.recv_buffer_size()?;
    static WARNED: std::sync::Once = std::sync::Once::new();
    if (granted as u64) < settings.connection_window {
        // Once per process: every lane's socket gets the same answer from the kernel.
        WARNED.call_once(|| {
            tracing::warn!(
                receive_buffer = granted,
                connection_window = settings.connection_window,
                "the UDP receive buffer is smaller than the QUIC connection window: a busy receiver will drop packets \
             (raise net.core.rmem_max, or lower the connection window)"
            )
        });
    }
    let socket = Arc::new(socket);
    let mut endpoint = Endpoint::new_with_abstract_socket(config, Some(server), socket, runtime)?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// The keys of the node's stateless resets and of its connection ids: the same across the node's restarts
/// (derived from its private key, so that nobody without that key can forge a reset). A restarted node then
/// recognises the connection ids its previous process gave out and resets, at their next packet, the
/// connections its peers still hold to that process: they dial again at once instead of waiting for the idle
/// timeout. With quinn's random keys the new process drops those packets as foreign, and a peer whose calls are
/// all on such a connection (while the restarted node's own calls keep it looking alive) waits 10 s.
fn restart_keys(identity: &NodeIdentity) -> Result<(Arc<ring::hmac::Key>, u64), QuicError> {
    let key = identity.key_der()?;
    let derive = |what: &[u8]| {
        let context = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, what);
        ring::hmac::sign(&context, key.secret_der())
    };
    let reset = derive(b"vfabric: QUIC stateless reset key");
    let cid = derive(b"vfabric: QUIC connection id key");
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&cid.as_ref()[..8]);
    Ok((Arc::new(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, reset.as_ref())), u64::from_le_bytes(cid_key)))
}

/// Dials `addr`, expecting the peer's certificate to name `peer` (its node name). Returns once the handshake
/// (both certificates checked) is complete.
///
/// In QUIC the client finishes its side of the handshake before the server has checked the client's
/// certificate, so this also waits for the server's HANDSHAKE_DONE (quinn counts it in
/// [`Connection::stats`]): a server that refuses this node's certificate makes this fail with
/// [`QuicError::Connection`] instead of handing back a connection that is about to close.
pub async fn connect(endpoint: &Endpoint, addr: SocketAddr, peer: &str) -> Result<Connection, QuicError> {
    let connecting = endpoint.connect(addr, peer).map_err(|e| QuicError::Connect(format!("{peer} at {addr}: {e}")))?;
    let connection = connecting.await?;
    confirmed(&connection).await?;
    Ok(connection)
}

/// Waits until the server has confirmed the handshake, or the connection has closed.
///
/// quinn 0.11 raises no event for HANDSHAKE_DONE, so this looks at the frame counter, backing off from 100 µs to
/// 10 ms; the handshake completes about one round trip after the client's. A server that never answers is caught
/// by the idle timeout, which closes the connection.
async fn confirmed(connection: &Connection) -> Result<(), QuicError> {
    let closed = connection.closed();
    tokio::pin!(closed);
    let mut delay = Duration::from_micros(100);
    loop {
        if connection.stats().frame_rx.handshake_done > 0 {
            return Ok(());
        }
        tokio::select! {
            reason = &mut closed => return Err(QuicError::Connection(reason)),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_millis(10));
    }
}

/// The node name (first DNS SAN) of the peer's verified certificate.
///
/// `None` before the handshake has completed or if the certificate has no DNS name (certificates issued by
/// [`ClusterCa::issue`](super::ca::ClusterCa::issue) always have one).
pub fn peer_name(conn: &Connection) -> Option<String> {
    let identity = conn.peer_identity()?;
    let chain = identity.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    certificate_node_name(chain.first()?)
}

/// The tenant `conn`'s peer belongs to, as its certificate says ([`certificate_tenant`]).
pub fn peer_tenant(conn: &Connection) -> Option<Option<u32>> {
    let identity = conn.peer_identity()?;
    let chain = identity.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    certificate_tenant(chain.first()?)
}

/// The tenant a node certificate (DER) binds its node to ([`ClusterCa::issue_for`](super::ClusterCa::issue_for)):
/// `Some(None)` for a node of no tenant, `Some(Some(id))` for one of tenant `id`, and `None` when the
/// certificate cannot be read or names a tenant that is no number (never a panic: this reads what peers send).
pub fn certificate_tenant(der: &[u8]) -> Option<Option<u32>> {
    match x509::organizational_unit(der) {
        Some(unit) => match unit.strip_prefix(super::ca::TENANT_UNIT) {
            Some(id) => id.parse().ok().map(Some),
            None => Some(None),
        },
        // No unit, or a certificate that cannot be read at all.
        None => x509::subject(der).map(|_| None),
    }
}

/// The node name a certificate (DER) carries: its first DNS subject alternative name, when that is a node name
/// (`validate_node_name`). `None` for anything else, never a panic: this reads what peers send.
pub fn certificate_node_name(der: &[u8]) -> Option<String> {
    let name = x509::dns_names(der)?.into_iter().next()?;
    super::ca::validate_node_name(&name).ok().map(|()| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let s = QuicSettings::default();
        s.validate().unwrap();
        assert_eq!(s.mtu, 1452);
        assert_eq!(s.stream_window, 8 << 20);
        assert_eq!(s.connection_window, 8 << 20);
        assert_eq!(s.packets_per_send(), 10);
        s.transport_config().unwrap();
    }

    #[test]
    fn mtu_bounds() {
        let with = |mtu| QuicSettings { mtu, ..QuicSettings::default() };
        assert!(matches!(with(1199).validate(), Err(QuicError::Config(_))));
        assert!(matches!(with(0).validate(), Err(QuicError::Config(_))));
        assert!(matches!(with(16_384).validate(), Err(QuicError::Config(_))));
        assert!(matches!(with(65_507).validate(), Err(QuicError::Config(_))));
        assert!(matches!(with(u16::MAX).validate(), Err(QuicError::Config(_))));
        for ok in [1200, 1452, 6500, 6501, 8952, 16_383] {
            with(ok).validate().unwrap();
            with(ok).transport_config().unwrap();
        }
        assert_eq!(with(6500).packets_per_send(), 10);
        assert_eq!(with(6551).packets_per_send(), 9);
        assert_eq!(with(16_383).packets_per_send(), 3);
    }

    #[test]
    fn windows_streams_and_timeouts() {
        let d = QuicSettings::default;
        let rejected = [
            QuicSettings { stream_window: 0, ..d() },
            QuicSettings { connection_window: 0, ..d() },
            QuicSettings { stream_window: 1 << 62, ..d() },
            QuicSettings { connection_window: u64::MAX, ..d() },
            QuicSettings { max_concurrent_streams: 0, ..d() },
            QuicSettings { idle_timeout: Duration::ZERO, ..d() },
            QuicSettings { idle_timeout: Duration::from_secs(u64::MAX), ..d() },
            QuicSettings { keep_alive: Duration::from_secs(10), ..d() },
            QuicSettings { keep_alive: Duration::from_secs(11), ..d() },
        ];
        for s in rejected {
            assert!(matches!(s.validate(), Err(QuicError::Config(_))), "{s:?}");
        }
        QuicSettings { keep_alive: Duration::ZERO, ..d() }.validate().unwrap();
        QuicSettings { stream_window: (1 << 62) - 1, ..d() }.validate().unwrap();
    }

    #[test]
    fn certificates_say_which_tenant_their_node_belongs_to() {
        let ca = super::super::ca::ClusterCa::generate("t").unwrap();
        let der = |id: &NodeIdentity| id.cert_der().unwrap();
        assert_eq!(certificate_tenant(&der(&ca.issue("n0").unwrap())), Some(None));
        let bound = ca.issue_for("n1", Some(7)).unwrap();
        assert_eq!(certificate_tenant(&der(&bound)), Some(Some(7)));
        assert_eq!(certificate_node_name(&der(&bound)).as_deref(), Some("n1"));
        assert_eq!(certificate_tenant(b"not a certificate"), None);
    }

    #[test]
    fn endpoint_outside_a_runtime_is_an_error() {
        let ca = super::super::ca::ClusterCa::generate("t").unwrap();
        let id = ca.issue("n0").unwrap();
        let r = endpoint("127.0.0.1:0".parse().unwrap(), &id, &QuicSettings::default());
        assert!(matches!(r, Err(QuicError::Io(_))), "{r:?}");
    }

    #[test]
    fn endpoint_refuses_invalid_settings_and_broken_identities() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _guard = rt.enter();
        let ca = super::super::ca::ClusterCa::generate("t").unwrap();
        let id = ca.issue("n0").unwrap();
        let bind = "127.0.0.1:0".parse().unwrap();
        let r = endpoint(bind, &id, &QuicSettings { mtu: 1000, ..QuicSettings::default() });
        assert!(matches!(r, Err(QuicError::Config(_))), "{r:?}");
        let r = endpoint(bind, &NodeIdentity { key_pem: "junk".into(), ..id.clone() }, &Default::default());
        assert!(matches!(r, Err(QuicError::Certificate(_))), "{r:?}");
        // A key that is not the certificate's.
        let other = ca.issue("n1").unwrap();
        let r = endpoint(bind, &NodeIdentity { key_pem: other.key_pem, ..id.clone() }, &Default::default());
        assert!(matches!(r, Err(QuicError::Tls(_))), "{r:?}");
        endpoint(bind, &id, &QuicSettings::default()).unwrap();
    }
}
