//! A region keeps how its pages are stored and evicted wherever it lives: allocated on another node, its
//! standby copies (and so the copy that takes over from a dead home), and a migration to another node are
//! stored with the compression and evicted at the priority its placement named; and a lossy region is leased from another node as values. Agents in this
//! process, on the emulated device, or on the GPUs with `VFABRIC_TEST_BACKEND=cuda` (the GPU machine runs this
//! test's executable so: scripts/device-run.sh, step `agents`).

mod common;
use common::{agents_in_process, small_cluster};
use vfabric::agent::Kept;
use vfabric::{Backend, Compression, Location, Priority, Region};

/// [`small_cluster`], on the GPUs when `VFABRIC_TEST_BACKEND=cuda`.
fn cluster(name: &str, nodes: usize) -> vfabric::ClusterConfig {
    let mut cfg = small_cluster(name, nodes);
    if std::env::var("VFABRIC_TEST_BACKEND").as_deref() == Ok("cuda") {
        cfg.device.backend = Backend::Cuda;
    }
    cfg
}

/// The region of `len` bytes on an agent's node other than `not` (a copy made for another node's region).
fn copy_on(agent: &vfabric::agent::Agent, len: u64, not: &Region) -> Region {
    let copies: Vec<Region> =
        agent.fabric().regions().into_iter().map(|(r, _)| r).filter(|r| r.len == len && r != not).collect();
    assert_eq!(copies.len(), 1, "one copy of {len} bytes on node {}: {copies:?}", agent.node());
    copies[0]
}

#[test]
fn a_region_keeps_its_compression_and_priority_on_every_node() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let agents = agents_in_process(&cluster("compressed", 3)).await;
        let ps = agents[0].fabric().page_size();
        // Allocated on another node, lossy.
        let r = agents[0]
            .alloc_with(
                1,
                2 * ps,
                Kept { compression: Compression::Fp8Bf16, priority: Priority::High, ..Kept::default() },
                1,
            )
            .await
            .expect("on n1");
        assert_eq!(agents[1].fabric().compression_of(&r).expect("n1 has it"), Compression::Fp8Bf16);
        assert_eq!(agents[1].fabric().placement_of(&r).expect("n1 has it").priority, Priority::High);
        let data: Vec<u8> = (0..2 * ps).map(|i| (i % 251) as u8 & 0x3f).collect();
        agents[0].write(&r, 0, &data).await.expect("write");
        // Moved on to a third node: the copy there is lossy too.
        agents[0].migrate_to(&r, 2, Location::Host).await.expect("migrate to n2");
        let moved = copy_on(&agents[2], r.len, &r);
        assert_eq!(agents[2].fabric().compression_of(&moved).expect("n2 has it"), Compression::Fp8Bf16);
        assert_eq!(agents[2].fabric().placement_of(&moved).expect("n2 has it").priority, Priority::High);
        let mut back = vec![0u8; data.len()];
        agents[0].read(&r, 0, &mut back).await.expect("read after the move");
        let lossy = Compression::Fp8Bf16.lossy().expect("lossy");
        let (worst, n) = vfabric_transport::device::lossy::worst_error(lossy, &data, &back);
        assert!(n > 0 && worst <= 1.0, "values after the move: {worst}x their bound");
        // Replicated: the standby copy on the next node (the one that would take over) is stored the same way.
        let kept = agents[0]
            .alloc_with(
                0,
                3 * ps,
                Kept { compression: Compression::Int8F32, priority: Priority::Low, ..Kept::default() },
                2,
            )
            .await
            .expect("on n0");
        assert_eq!(agents[0].fabric().compression_of(&kept).expect("n0"), Compression::Int8F32);
        let standby = copy_on(&agents[1], kept.len, &kept);
        assert_eq!(agents[1].fabric().compression_of(&standby).expect("the standby"), Compression::Int8F32);
        assert_eq!(agents[1].fabric().placement_of(&standby).expect("the standby").priority, Priority::Low);
        // The standby (in host memory) packs the home's writes as they reach it: its values are within the
        // bound of what was written, and not the written bytes themselves.
        let values: Vec<u8> =
            (0..kept.len / 4).flat_map(|i| ((i % 1000) as f32 * 0.37 - 150.0).to_le_bytes()).collect();
        agents[0].write(&kept, 0, &values).await.expect("write the replicated region");
        let mut there = vec![0u8; values.len()];
        agents[1].fabric().read(&standby, 0, &mut there).expect("read the standby copy");
        let lossy = Compression::Int8F32.lossy().expect("lossy");
        let (worst, n) = vfabric_transport::device::lossy::worst_error(lossy, &values, &there);
        assert!(n > 0 && worst <= 1.0, "the standby's values: {worst}x the bound over {n}");
        assert!(there != values, "the standby holds the written bytes: not stored lossily");
        // A lossless one as well, and the plain calls still store pages as they are.
        let lz4 = agents[2]
            .alloc_with(0, ps, Kept { compression: Compression::Lz4, ..Kept::default() }, 1)
            .await
            .expect("lz4 on n0");
        assert_eq!(agents[0].fabric().compression_of(&lz4).expect("n0"), Compression::Lz4);
        let plain = agents[2].alloc(0, ps, None).await.expect("plain on n0");
        assert_eq!(agents[0].fabric().compression_of(&plain).expect("n0"), Compression::None);
        for a in &agents {
            a.shutdown().await;
        }
    });
}

/// bf16 values, `bytes` of them in bytes, of several magnitudes.
fn bf16_values(bytes: u64, seed: u32) -> Vec<u8> {
    (0..bytes / 2)
        .flat_map(|i| {
            let x = ((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001;
            let f = (x as f32 / 1000.0 - 1.0) * 10f32.powi((i % 5) as i32 - 2);
            vfabric_transport::device::lossy::f32_to_bf16(f).to_le_bytes()
        })
        .collect()
}

/// A lossy region leased from another node: its home leases the pages on its GPU (host memory holds them
/// packed), where they are expanded, and serves them as values; the lease's bytes are within the bound of what
/// was written, and a write lease's bytes, sent home at its release, are packed there within the bound too.
#[test]
fn a_lossy_region_is_leased_from_another_node_as_values() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let agents = agents_in_process(&cluster("lossy-leases", 2)).await;
        let ps = agents[0].fabric().page_size();
        let (g0, c) = (Location::Gpu(0), Compression::Fp8Bf16);
        let lossy = c.lossy().expect("lossy");
        let r = agents[0]
            .alloc_with(1, 2 * ps, Kept { device: Some(g0), compression: c, ..Kept::default() }, 1)
            .await
            .expect("on n1");
        let data = bf16_values(2 * ps, 7);
        agents[0].write(&r, 0, &data).await.expect("write");
        // Moved to host memory at the home (packed there: the region's home device is host memory now, and its
        // first GPU serves it), then leased from n0.
        agents[1].fabric().migrate(&r, Location::Host).expect("to host memory at the home");
        let lease = agents[0].acquire(&r, 0..2 * ps, g0, vfabric::Mode::Read).await.expect("a remote read lease");
        assert_eq!(lease.home(&agents[0]), 1);
        let mut got = vec![0u8; data.len()];
        lease.local().expect("local lease").read(0, &mut got).expect("read the leased pages");
        let (worst, n) = vfabric_transport::device::lossy::worst_error(lossy, &data, &got);
        assert!(n > 0 && worst <= 1.0, "leased values {worst}x their bound over {n}");
        assert!(got != data, "the leased values are the written ones exactly: not expanded from packed pages");
        agents[0].release(lease).await.expect("release");
        // A write lease from n0: new values go home at its release.
        let new = bf16_values(ps, 99);
        let w = agents[0].acquire(&r, ps..2 * ps, g0, vfabric::Mode::Write).await.expect("a remote write lease");
        w.local().expect("local lease").write(0, &new).expect("write through the lease");
        agents[0].release(w).await.expect("release sends the pages home");
        // Down to host memory at the home again: packed from what the lease wrote.
        agents[1].fabric().migrate(&r, Location::Host).expect("to host memory at the home");
        let mut back = vec![0u8; ps as usize];
        agents[0].read(&r, ps, &mut back).await.expect("read after the write lease");
        let (worst, n) = vfabric_transport::device::lossy::worst_error(lossy, &new, &back);
        assert!(n > 0 && worst <= 1.0, "values written through a remote lease: {worst}x their bound");
        assert!(back != new, "the written values came back exactly: not packed at the home");
        for a in &agents {
            a.shutdown().await;
        }
    });
}
