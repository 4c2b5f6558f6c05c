//! Page payloads packed for the wire between agents (`network.compression = "lz4"`), over loopback QUIC: what
//! shrinks crosses packed both ways, what does not goes as it is, and every byte arrives.

use vfabric::agent::Agent;
use vfabric_tests::loopback::{cluster, config};
use vfabric_tests::pattern;
use vfabric_transport::quic::ClusterCa;
use vfabric_transport::Location;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

/// The bytes a node's links to its peers sent, all lanes together (its own connections: a call's request and
/// payload go out on the caller's, and the answer comes back on it).
async fn sent(agent: &Agent) -> u64 {
    agent.status().await.peers.iter().filter_map(|p| p.link.as_ref()).map(|l| l.sent_bytes).sum()
}

/// The bytes a node's links to its peers received, all lanes together: the answers to its calls.
async fn received(agent: &Agent) -> u64 {
    agent.status().await.peers.iter().filter_map(|p| p.link.as_ref()).map(|l| l.received_bytes).sum()
}

/// With `network.compression = "lz4"`, pages that shrink cross the wire packed both ways (a write to the home,
/// the home's answer to a read) in a fraction of their bytes, pages that do not go as they are, and every byte
/// arrives.
#[test]
fn sparse_pages_cross_the_wire_packed() {
    runtime().block_on(async {
        let mut cfg = config(2);
        cfg.network.compression = vfabric::Compression::Lz4;
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let len = 8usize << 20;
        let r = a[0].alloc(1, len as u64, Some(Location::Gpu(0))).await.expect("remote alloc");
        // Zeros but for a number every 4 KiB: what zero-initialised buffers and masks look like.
        let mut sparse = vec![0u8; len];
        for (i, w) in sparse.chunks_mut(4096).enumerate() {
            w[..8].copy_from_slice(&(i as u64 * 7 + 1).to_le_bytes());
        }
        let before = sent(&a[0]).await;
        a[0].write(&r, 0, &sparse).await.expect("remote write");
        let out = sent(&a[0]).await - before;
        assert!(out < len as u64 / 8, "the write sent {out} bytes for {len}");
        let mut back = vec![0u8; len];
        let before = received(&a[0]).await;
        a[0].read(&r, 0, &mut back).await.expect("remote read");
        assert!(back == sparse, "the sparse region read back");
        let answers = received(&a[0]).await - before;
        assert!(answers < len as u64 / 8, "the read's answer took {answers} bytes for {len}");
        // Dense bytes go as they are both ways, and arrive as they were.
        let dense = pattern::bytes(11, 0, len);
        let before = sent(&a[0]).await;
        a[0].write(&r, 0, &dense).await.expect("remote write");
        assert!(sent(&a[0]).await - before >= len as u64, "dense pages are sent whole");
        let before = received(&a[0]).await;
        a[0].read(&r, 0, &mut back).await.expect("remote read");
        assert_eq!(pattern::first_mismatch(11, 0, &back), None, "the dense region read back");
        assert!(received(&a[0]).await - before >= len as u64, "dense pages come back whole");
        for x in &a {
            x.shutdown().await;
        }
    });
}

/// Without `network.compression`, a region allocated with a lossless compression still crosses the wire
/// packed: the node that allocated it packs what it writes, and its home packs its answers to reads and the
/// pages of a lease. A region stored as it is goes whole.
#[test]
fn a_lossless_region_crosses_the_wire_packed_on_its_own() {
    runtime().block_on(async {
        let cfg = config(2);
        assert_eq!(cfg.network.compression, vfabric::Compression::None, "the network packs nothing");
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let len = 8usize << 20;
        let kept = vfabric::agent::Kept {
            device: Some(Location::Gpu(0)),
            compression: vfabric::Compression::Zstd,
            ..Default::default()
        };
        let packed = a[0].alloc_with(1, len as u64, kept, 1).await.expect("remote alloc, zstd");
        let plain = a[0].alloc(1, len as u64, Some(Location::Gpu(0))).await.expect("remote alloc");
        let mut sparse = vec![0u8; len];
        for (i, w) in sparse.chunks_mut(4096).enumerate() {
            w[..8].copy_from_slice(&(i as u64 * 3 + 5).to_le_bytes());
        }
        let before = sent(&a[0]).await;
        a[0].write(&packed, 0, &sparse).await.expect("remote write");
        let out = sent(&a[0]).await - before;
        assert!(out < len as u64 / 8, "the write sent {out} bytes for {len}");
        let mut back = vec![0u8; len];
        let before = received(&a[0]).await;
        a[0].read(&packed, 0, &mut back).await.expect("remote read");
        assert!(back == sparse, "the sparse region read back");
        let answers = received(&a[0]).await - before;
        assert!(answers < len as u64 / 8, "the read's answer took {answers} bytes for {len}");
        // A lease's pages come from the home packed too, and land whole.
        let before = received(&a[0]).await;
        let lease = a[0].acquire(&packed, 0..len as u64, Location::Gpu(0), vfabric::Mode::Read).await.expect("lease");
        let leased = received(&a[0]).await - before;
        assert!(leased < len as u64 / 8, "the lease's pages took {leased} bytes for {len}");
        let mut through = vec![0u8; len];
        lease.local().expect("a lease here").read(0, &mut through).expect("read through the lease");
        assert!(through == sparse, "the leased pages are the region's");
        a[0].release(lease).await.expect("release");
        // The same pages in a region stored as they are cross whole.
        let before = sent(&a[0]).await;
        a[0].write(&plain, 0, &sparse).await.expect("remote write");
        assert!(sent(&a[0]).await - before >= len as u64, "a plain region's pages are sent whole");
        let before = received(&a[0]).await;
        a[0].read(&plain, 0, &mut back).await.expect("remote read");
        assert!(back == sparse, "the plain region read back");
        assert!(received(&a[0]).await - before >= len as u64, "and come back whole");
        for x in &a {
            x.shutdown().await;
        }
    });
}

/// A zstd region's pages cross packed with zstd when `network.wire_zstd` says so, and shrink where LZ4 finds
/// nothing (dense bytes with skewed high bytes, like bf16 weights); by default they cross with LZ4, as an LZ4
/// region's do: whole, for such bytes. Every byte arrives either way.
#[test]
fn a_zstd_region_shrinks_dense_bytes_on_the_wire_where_lz4_cannot() {
    runtime().block_on(async {
        let len = 8usize << 20;
        let data = pattern::skewed(5, len);
        let mut back = vec![0u8; len];
        let (zstd, lz4) = (vfabric::Compression::Zstd, vfabric::Compression::Lz4);
        for (wire_zstd, codec, shrinks) in [(true, zstd, true), (true, lz4, false), (false, zstd, false)] {
            let mut cfg = config(2);
            cfg.network.wire_zstd = wire_zstd;
            let ca = ClusterCa::generate("loop").expect("ca");
            let a = cluster(&cfg, &ca).await;
            let kept =
                vfabric::agent::Kept { device: Some(Location::Gpu(0)), compression: codec, ..Default::default() };
            let r = a[0].alloc_with(1, len as u64, kept, 1).await.expect("remote alloc");
            let whole = len as u64 * 15 / 16;
            let how = format!("{codec} region, wire_zstd = {wire_zstd}");
            let before = sent(&a[0]).await;
            a[0].write(&r, 0, &data).await.expect("remote write");
            let out = sent(&a[0]).await - before;
            assert_eq!(out < whole, shrinks, "{how}: the write sent {out} bytes for {len}");
            let before = received(&a[0]).await;
            a[0].read(&r, 0, &mut back).await.expect("remote read");
            assert!(back == data, "{how}: read back");
            let answers = received(&a[0]).await - before;
            assert_eq!(answers < whole, shrinks, "{how}: the read's answer took {answers} bytes for {len}");
            for x in &a {
                x.shutdown().await;
            }
        }
    });
}
