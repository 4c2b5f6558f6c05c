//! A region keeps how its pages are stored wherever it lives: allocated on another node, its standby copies
//! (and so the copy that takes over from a dead home), and a migration to another node are stored with the
//! compression its placement named. Three agents in this process.

mod common;
use common::{agents_in_process, small_cluster};
use vfabric::{Compression, Location, Region};

/// The region of `len` bytes on an agent's node other than `not` (a copy made for another node's region).
fn copy_on(agent: &vfabric::agent::Agent, len: u64, not: &Region) -> Region {
    let copies: Vec<Region> =
        agent.fabric().regions().into_iter().map(|(r, _)| r).filter(|r| r.len == len && r != not).collect();
    assert_eq!(copies.len(), 1, "one copy of {len} bytes on node {}: {copies:?}", agent.node());
    copies[0]
}

#[test]
fn a_region_keeps_its_compression_on_every_node() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let agents = agents_in_process(&small_cluster("compressed", 3)).await;
        let ps = agents[0].fabric().page_size();
        // Allocated on another node, lossy.
        let r = agents[0].alloc_compressed(1, 2 * ps, (None, Compression::Fp8Bf16), 1).await.expect("on n1");
        assert_eq!(agents[1].fabric().compression_of(&r).expect("n1 has it"), Compression::Fp8Bf16);
        let data: Vec<u8> = (0..2 * ps).map(|i| (i % 251) as u8 & 0x3f).collect();
        agents[0].write(&r, 0, &data).await.expect("write");
        // Moved on to a third node: the copy there is lossy too.
        agents[0].migrate_to(&r, 2, Location::Host).await.expect("migrate to n2");
        let moved = copy_on(&agents[2], r.len, &r);
        assert_eq!(agents[2].fabric().compression_of(&moved).expect("n2 has it"), Compression::Fp8Bf16);
        let mut back = vec![0u8; data.len()];
        agents[0].read(&r, 0, &mut back).await.expect("read after the move");
        // Replicated: the standby copy on the next node (the one that would take over) is stored the same way.
        let kept = agents[0].alloc_compressed(0, 3 * ps, (None, Compression::Int8F32), 2).await.expect("on n0");
        assert_eq!(agents[0].fabric().compression_of(&kept).expect("n0"), Compression::Int8F32);
        let standby = copy_on(&agents[1], kept.len, &kept);
        assert_eq!(agents[1].fabric().compression_of(&standby).expect("the standby"), Compression::Int8F32);
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
        let lz4 = agents[2].alloc_compressed(0, ps, (None, Compression::Lz4), 1).await.expect("lz4 on n0");
        assert_eq!(agents[0].fabric().compression_of(&lz4).expect("n0"), Compression::Lz4);
        let plain = agents[2].alloc(0, ps, None).await.expect("plain on n0");
        assert_eq!(agents[0].fabric().compression_of(&plain).expect("n0"), Compression::None);
        for a in &agents {
            a.shutdown().await;
        }
    });
}
