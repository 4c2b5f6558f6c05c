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

/// The bytes a node's links to its peers sent, all lanes together.
async fn sent(agent: &Agent) -> u64 {
    agent.status().await.peers.iter().filter_map(|p| p.link.as_ref()).map(|l| l.sent_bytes).sum()
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
        let before = (sent(&a[0]).await, sent(&a[1]).await);
        a[0].write(&r, 0, &sparse).await.expect("remote write");
        let mut back = vec![0u8; len];
        a[0].read(&r, 0, &mut back).await.expect("remote read");
        assert!(back == sparse, "the sparse region read back");
        let (out, answers) = (sent(&a[0]).await - before.0, sent(&a[1]).await - before.1);
        assert!(out < len as u64 / 8, "the write sent {out} bytes for {len}");
        assert!(answers < len as u64 / 8, "the read's answer sent {answers} bytes for {len}");
        // Dense bytes go as they are, and arrive as they were.
        let dense = pattern::bytes(11, 0, len);
        let before = sent(&a[0]).await;
        a[0].write(&r, 0, &dense).await.expect("remote write");
        assert!(sent(&a[0]).await - before >= len as u64, "dense pages are sent whole");
        a[0].read(&r, 0, &mut back).await.expect("remote read");
        assert_eq!(pattern::first_mismatch(11, 0, &back), None, "the dense region read back");
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
        let before = (sent(&a[0]).await, sent(&a[1]).await);
        a[0].write(&packed, 0, &sparse).await.expect("remote write");
        let mut back = vec![0u8; len];
        a[0].read(&packed, 0, &mut back).await.expect("remote read");
        assert!(back == sparse, "the sparse region read back");
        let (out, answers) = (sent(&a[0]).await - before.0, sent(&a[1]).await - before.1);
        assert!(out < len as u64 / 8, "the write sent {out} bytes for {len}");
        assert!(answers < len as u64 / 8, "the read's answer sent {answers} bytes for {len}");
        // A lease's pages come from the home packed too, and land whole.
        let before = sent(&a[1]).await;
        let lease = a[0].acquire(&packed, 0..len as u64, Location::Gpu(0), vfabric::Mode::Read).await.expect("lease");
        let leased = sent(&a[1]).await - before;
        assert!(leased < len as u64 / 8, "the lease's pages took {leased} bytes for {len}");
        let mut through = vec![0u8; len];
        lease.local().expect("a lease here").read(0, &mut through).expect("read through the lease");
        assert!(through == sparse, "the leased pages are the region's");
        a[0].release(lease).await.expect("release");
        // The same pages in a region stored as they are cross whole.
        let before = sent(&a[0]).await;
        a[0].write(&plain, 0, &sparse).await.expect("remote write");
        assert!(sent(&a[0]).await - before >= len as u64, "a plain region's pages are sent whole");
        a[0].read(&plain, 0, &mut back).await.expect("remote read");
        assert!(back == sparse, "the plain region read back");
        for x in &a {
            x.shutdown().await;
        }
    });
}
