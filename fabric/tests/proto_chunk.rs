//! Page chunks on real QUIC streams between two nodes over loopback: checksummed on the way, taken whole,
//! in place or as quinn's own buffers, and refused when corrupted, too long or cut short.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, Endpoint, RecvStream};
use vfabric::proto::chunk::{
    copy_pieces, pack_chunk, read_chunk_header, read_chunk_payload, receive, ChunkError, ChunkHeader, ChunkRead,
    Payload, StreamChunks, CHUNK_HEADER_LEN,
};
use vfabric::proto::quic::{send_chunk, QuicChunks};
use vfabric::Compression;
use vfabric_transport::quic::ClusterCa;
use vfabric_transport::quic::{connect, endpoint, NodeIdentity, QuicSettings};

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

/// Reads one chunk into `buf`, refusing one longer than `max`; `None` at the end of the stream.
async fn read_chunk(stream: &mut RecvStream, max: u64, buf: &mut Vec<u8>) -> Result<Option<u64>, ChunkError> {
    let mut chunks = StreamChunks::new(stream, max);
    let Some(header) = chunks.next_header().await? else { return Ok(None) };
    *buf = chunks.next_payload(&header).await?.concat();
    Ok(Some(header.offset))
}

/// Writes `chunks` (offset, payload) on a new uni stream of `conn`, then finishes it.
async fn send_chunks(conn: &Connection, chunks: &[(u64, Vec<u8>)]) {
    let mut stream = conn.open_uni().await.unwrap();
    for (offset, payload) in chunks {
        send_chunk(&mut stream, *offset, Bytes::copy_from_slice(payload), Compression::None).await.unwrap();
    }
    stream.finish().unwrap();
    let _ = stream.stopped().await;
}

#[tokio::test]
async fn chunks_arrive_whole_and_verified() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    let chunks: Vec<(u64, Vec<u8>)> = vec![
        (0, random_bytes(64 << 10, 1)),
        (64 << 10, random_bytes(2 << 20, 2)),
        (5 << 30, random_bytes(64 << 10, 3)),
        (u64::MAX - 7, Vec::new()),
        (1 << 21, random_bytes(2 << 20, 4)),
        (7, random_bytes(1, 5)),
    ];
    guard(async {
        let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings()).await;
        let receive = async {
            let mut stream = accepted.accept_uni().await.unwrap();
            let mut got = Vec::new();
            let mut buf = Vec::new();
            while let Some(offset) = read_chunk(&mut stream, 2 << 20, &mut buf).await.unwrap() {
                got.push((offset, buf.clone()));
            }
            got
        };
        let ((), got) = tokio::join!(send_chunks(&dialed, &chunks), receive);
        assert_eq!(got.len(), chunks.len());
        for ((offset, data), (want_offset, want)) in got.iter().zip(&chunks) {
            assert_eq!(offset, want_offset);
            assert!(data == want, "chunk at {offset} differs");
        }
    })
    .await;
}

/// A dense chunk LZ4 finds nothing in crosses QUIC packed with zstd (in under fifteen sixteenths of its bytes),
/// arrives whole through the receiving loop, and is sent as it is with LZ4; one byte repeated is the byte alone.
#[tokio::test]
async fn zstd_chunks_cross_packed_and_arrive_whole() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    let data = vfabric::pattern::skewed(9, 1 << 20);
    assert!(pack_chunk(&data, Compression::Lz4).is_none(), "LZ4 finds nothing in it");
    assert_eq!(pack_chunk(&[0u8; 64 << 10], Compression::Zstd).expect("zeros"), [0, 1, 0, 0, 0]);
    assert_eq!(pack_chunk(&[7u8; 4096], Compression::Zstd).expect("a small piece of one byte"), [0, 0, 16, 0, 7]);
    assert!(pack_chunk(&[0u8; 64 << 10], Compression::None).is_none());
    guard(async {
        let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings()).await;
        let before = dialed.stats().udp_tx.bytes;
        let send = async {
            let mut stream = dialed.open_uni().await.unwrap();
            send_chunk(&mut stream, 0, Bytes::copy_from_slice(&data), Compression::Zstd).await.unwrap();
            stream.finish().unwrap();
            let _ = stream.stopped().await;
        };
        let take = async {
            let mut stream = accepted.accept_uni().await.unwrap();
            let mut back = vec![0u8; data.len()];
            let mut src = QuicChunks::new(&mut stream);
            receive::<_, ChunkError>(&mut src, Payload::new(1 << 20, 1 << 20), |at, pieces| {
                copy_pieces(&mut back[at as usize..], pieces);
                Ok(())
            })
            .await
            .unwrap();
            back
        };
        let ((), back) = tokio::join!(send, take);
        assert!(back == data, "the chunk arrived whole");
        let sent = dialed.stats().udp_tx.bytes - before;
        assert!(sent * 16 < data.len() as u64 * 15, "{sent} bytes on the wire for {}", data.len());
    })
    .await;
}

/// One stream: a good chunk, then `header` (whose checksum need not match) and `bad` written raw.
async fn send_good_then_bad(conn: &Connection, (offset, good): (u64, &[u8]), header: &ChunkHeader, bad: &[u8]) {
    let mut stream = conn.open_uni().await.unwrap();
    send_chunk(&mut stream, offset, Bytes::copy_from_slice(good), Compression::None).await.unwrap();
    stream.write_all(&header.encode()).await.unwrap();
    stream.write_all(bad).await.unwrap();
    stream.finish().unwrap();
    let _ = stream.stopped().await;
}

#[tokio::test]
async fn a_corrupted_chunk_is_a_checksum_error() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    let good = random_bytes(64 << 10, 6);
    let bad = random_bytes(4096, 7);
    let mut header = ChunkHeader::for_payload(0x10_0000, &bad);
    let real = header.checksum;
    header.checksum ^= 1;
    guard(async {
        let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings()).await;
        let send = send_good_then_bad(&dialed, (0, &good), &header, &bad);
        let receive = async {
            let mut stream = accepted.accept_uni().await.unwrap();
            let mut buf = Vec::new();
            assert_eq!(read_chunk(&mut stream, 1 << 20, &mut buf).await.unwrap(), Some(0));
            assert!(buf == good);
            read_chunk(&mut stream, 1 << 20, &mut buf).await
        };
        let ((), r) = tokio::join!(send, receive);
        match r {
            Err(ChunkError::Checksum { offset, expected, found }) => {
                assert_eq!(offset, 0x10_0000);
                assert_eq!(expected, real ^ 1);
                assert_eq!(found, real);
            }
            other => panic!("expected a checksum error, got {other:?}"),
        }
    })
    .await;
}

/// A payload taken as quinn's buffers: the pieces together are the payload, and a corrupted one is caught
/// before the caller sees it as good.
#[tokio::test]
async fn chunk_parts_are_verified() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    let good = random_bytes(256 << 10, 8);
    let bad = random_bytes(4096, 9);
    let mut header = ChunkHeader::for_payload(0x2000, &bad);
    header.checksum ^= 1 << 40;
    guard(async {
        let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings()).await;
        let send = send_good_then_bad(&dialed, (7, &good), &header, &bad);
        let receive = async {
            let mut stream = accepted.accept_uni().await.unwrap();
            let mut chunks = QuicChunks::new(&mut stream);
            let first = chunks.next_header().await.unwrap().unwrap();
            assert_eq!((first.offset, first.len as usize), (7, good.len()));
            let parts = chunks.next_payload(&first).await.unwrap();
            // Several QUIC frames, none copied together.
            assert!(parts.len() > 1, "{} parts", parts.len());
            assert!(parts.concat() == good);
            let second = chunks.next_header().await.unwrap().unwrap();
            chunks.next_payload(&second).await.map(|_| ())
        };
        let ((), r) = tokio::join!(send, receive);
        assert!(matches!(r, Err(ChunkError::Checksum { offset: 0x2000, .. })), "{r:?}");
    })
    .await;
}

#[tokio::test]
async fn a_chunk_longer_than_max_is_refused() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    guard(async {
        let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings()).await;
        let send = async {
            let mut stream = dialed.open_uni().await.unwrap();
            send_chunk(&mut stream, 0, random_bytes(4097, 8).into(), Compression::None).await.unwrap();
            stream.finish().unwrap();
        };
        let receive = async {
            let mut stream = accepted.accept_uni().await.unwrap();
            let mut buf = vec![1, 2, 3];
            let r = read_chunk(&mut stream, 4096, &mut buf).await;
            let _ = stream.stop(0u32.into());
            r
        };
        let ((), r) = tokio::join!(send, receive);
        assert!(matches!(r, Err(ChunkError::TooLarge { len: 4097, max: 4096 })), "{r:?}");
    })
    .await;
}

/// Payloads read straight into their destination: the header first, then exactly its length, verified.
#[tokio::test]
async fn payloads_read_into_place_are_verified_and_sized() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    let (a, b) = (random_bytes(5000, 1), random_bytes(3000, 2));
    guard(async {
        let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings()).await;
        let chunks = [(7, a.clone()), (9, b.clone())];
        let receive = async {
            let mut stream = accepted.accept_uni().await.unwrap();
            let h = read_chunk_header(&mut stream).await.unwrap().unwrap();
            assert_eq!((h.offset, h.len), (7, 5000));
            let mut dst = vec![0u8; 5000];
            read_chunk_payload(&mut stream, &h, &mut dst).await.unwrap();
            assert!(dst == a);
            let h = read_chunk_header(&mut stream).await.unwrap().unwrap();
            // Room of another size is refused before anything is read.
            let r = read_chunk_payload(&mut stream, &h, &mut [0u8; 2999]).await;
            assert!(matches!(r, Err(ChunkError::Outside { .. })), "{r:?}");
            let mut dst = vec![0u8; 3000];
            read_chunk_payload(&mut stream, &h, &mut dst).await.unwrap();
            assert!(dst == b);
            assert!(read_chunk_header(&mut stream).await.unwrap().is_none());
        };
        tokio::join!(send_chunks(&dialed, &chunks), receive);
    })
    .await;
}

#[tokio::test]
async fn a_stream_that_ends_inside_a_chunk_is_a_read_error() {
    let ca = ClusterCa::generate("test").unwrap();
    let (n0, n1) = (ca.issue("n0").unwrap(), ca.issue("n1").unwrap());
    let payload = random_bytes(100, 9);
    let header = ChunkHeader::for_payload(0, &payload);
    for cut in [CHUNK_HEADER_LEN / 2, CHUNK_HEADER_LEN + 10] {
        let wire: Vec<u8> = header.encode().iter().chain(&payload).copied().take(cut).collect();
        guard(async {
            let (_server, _client, accepted, dialed) = connected(&n1, &n0, &settings()).await;
            let send = async {
                let mut stream = dialed.open_uni().await.unwrap();
                stream.write_all(&wire).await.unwrap();
                stream.finish().unwrap();
                let _ = stream.stopped().await;
            };
            let receive = async {
                let mut stream = accepted.accept_uni().await.unwrap();
                read_chunk(&mut stream, 1 << 20, &mut Vec::new()).await
            };
            let ((), r) = tokio::join!(send, receive);
            assert!(matches!(r, Err(ChunkError::Truncated { .. })), "cut at {cut}: {r:?}");
        })
        .await;
    }
}
