//! Tenants across nodes: a call made for a tenant (`Agent::acting_for`, as a tenant's local client's calls are)
//! carries its tenant to every node it reaches, and the region's home holds it to its tenant's regions there:
//! allocations are made under its name, another tenant's region is refused like a handle naming none, and the
//! operator's calls (a migration, a peer's status) are refused. Calls made for no tenant (the node's operator) touch every region.
//! A node that belongs to a tenant (its certificate says so) acts for that tenant only, whatever it says. A
//! tenant's replicated region keeps its standby copies under the tenant's name, and stays the tenant's when a
//! copy takes over.

use vfabric::config::TenantSection;
use vfabric::{FabricError, TenantId};
use vfabric_tests::loopback::{cluster, config};
use vfabric_transport::quic::ClusterCa;
use vfabric_transport::Location;

fn denied<T: std::fmt::Debug>(r: Result<T, FabricError>, what: &str) {
    match r {
        Err(FabricError::PermissionDenied(_))
        | Err(FabricError::Remote { kind: vfabric::proto::ErrorKind::PermissionDenied, .. }) => {}
        other => panic!("{what}: expected PermissionDenied, got {other:?}"),
    }
}

/// `cfg` with tenants 3 and 4 in it (no quotas, no local users).
fn with_tenants_3_and_4(mut cfg: vfabric::ClusterConfig) -> vfabric::ClusterConfig {
    cfg.tenants = [3, 4]
        .into_iter()
        .map(|id| TenantSection { id, gpu: None, host: None, storage: None, uids: Vec::new() })
        .collect();
    cfg
}

#[test]
fn a_tenants_calls_reach_only_its_regions_on_every_node() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let cfg = config(2);
        let ca = ClusterCa::generate("loop").expect("ca");
        let nodes = cluster(&cfg, &ca).await;
        let (a, b) = (&nodes[0], &nodes[1]);
        let (three, four) = (TenantId(3), TenantId(4));
        // Tenant 3 allocates on n1 through n0: the region is its own there.
        let r = a.acting_for(three, a.alloc(1, 1 << 20, None)).await.expect("tenant 3 allocates on n1");
        assert_eq!(r.addr.node().0, 1);
        assert_eq!(b.fabric().tenant_of(&r).expect("the region"), three, "allocated under the tenant's name");
        a.acting_for(three, a.write(&r, 0, &[3u8; 4096])).await.expect("tenant 3 writes its region");
        let mut buf = vec![0u8; 4096];
        a.acting_for(three, a.read(&r, 0, &mut buf)).await.expect("tenant 3 reads its region");
        assert_eq!(buf, [3u8; 4096]);
        // Tenant 4 gets nothing of it, from either node, and the same answer as for a region that is not there.
        denied(a.acting_for(four, a.read(&r, 0, &mut buf)).await, "tenant 4 reads tenant 3's region from n0");
        denied(b.acting_for(four, b.read(&r, 0, &mut buf)).await, "tenant 4 reads tenant 3's region at its home");
        denied(a.acting_for(four, a.write(&r, 0, &[4u8; 16])).await, "tenant 4 writes tenant 3's region");
        let leased = a.acting_for(four, a.acquire(&r, 0..4096, Location::Host, vfabric::Mode::Read)).await;
        denied(leased.map(|_| ()), "tenant 4 leases tenant 3's region");
        denied(a.acting_for(four, a.free(&r)).await, "tenant 4 frees tenant 3's region");
        let freed = a.free(&r).await.map(|()| r);
        let gone = freed.expect("the operator frees it");
        denied(a.acting_for(three, a.read(&gone, 0, &mut buf)).await, "tenant 3 reads its freed region");
        // Operator's calls are not a tenant's, and a tenant's region here is held the same way.
        let mine = a.acting_for(four, a.alloc(0, 1 << 20, None)).await.expect("tenant 4 allocates on n0");
        denied(a.acting_for(three, a.read(&mine, 0, &mut buf)).await, "tenant 3 reads tenant 4's region on n0");
        denied(a.acting_for(four, a.migrate_to(&mine, 1, Location::Host)).await, "tenant 4 migrates");
        denied(a.acting_for(four, a.status_json(Some(1))).await, "tenant 4 asks for n1's status");
        let theirs: serde_json::Value =
            serde_json::from_str(&a.status_json(Some(1)).await.expect("the operator asks n1's status")).expect("JSON");
        assert_eq!(theirs["node"], 1, "n1's own status, over QUIC: {theirs}");
        a.read(&mine, 0, &mut buf).await.expect("the operator reads any region");
        for n in &nodes {
            n.shutdown().await;
        }
    });
}

#[test]
fn a_node_that_belongs_to_a_tenant_acts_for_it_only() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut cfg = with_tenants_3_and_4(config(3));
        // n2 belongs to tenant 3: `cluster init` (here the loopback helper) writes it into n2's certificate.
        cfg.nodes[2].tenant = Some(3);
        let ca = ClusterCa::generate("loop").expect("ca");
        let nodes = cluster(&cfg, &ca).await;
        let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
        let (three, four) = (TenantId(3), TenantId(4));
        let r3 = a.acting_for(three, a.alloc(0, 1 << 20, None)).await.expect("tenant 3's region on n0");
        let r4 = a.acting_for(four, a.alloc(0, 1 << 20, None)).await.expect("tenant 4's region on n0");
        let ro = a.alloc(0, 1 << 20, None).await.expect("the operator's region on n0");
        // n2's calls, made for no tenant at n2, reach tenant 3's regions at n0, and only those.
        c.write(&r3, 0, &[3u8; 4096]).await.expect("n2 writes tenant 3's region");
        let mut buf = vec![0u8; 4096];
        c.read(&r3, 0, &mut buf).await.expect("n2 reads tenant 3's region");
        assert_eq!(buf, [3u8; 4096]);
        denied(c.read(&r4, 0, &mut buf).await, "n2 reads tenant 4's region");
        denied(c.read(&ro, 0, &mut buf).await, "n2 reads the operator's region");
        denied(c.acting_for(four, c.read(&r4, 0, &mut buf)).await, "n2 says it acts for tenant 4");
        let made = c.alloc(0, 1 << 20, None).await.expect("n2 allocates on n0");
        assert_eq!(a.fabric().tenant_of(&made).expect("the region"), three, "allocated under tenant 3's name");
        denied(c.migrate_to(&r3, 1, Location::Host).await, "n2 migrates a region");
        denied(c.status_json(Some(0)).await, "n2 asks for n0's status");
        // n2 keeps nothing of others: the standby of n1's replicated region goes to n0, past n2.
        b.alloc_replicated(1, 1 << 20, None, 2).await.expect("a replicated region on n1");
        assert_eq!((a.replication(), c.replication()), ((0, 1), (0, 0)), "the standby is on n0, not on n2");
        for n in &nodes {
            n.shutdown().await;
        }
    });
}

#[test]
fn a_tenants_replicated_region_survives_its_home_and_stays_the_tenants() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let cfg = with_tenants_3_and_4(config(3));
        let ca = ClusterCa::generate("loop").expect("ca");
        let nodes = cluster(&cfg, &ca).await;
        let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
        let (three, four) = (TenantId(3), TenantId(4));
        // Tenant 3's region on n1, kept on two nodes: its standby copy (on n2, the next node) is tenant 3's too.
        let r = a.acting_for(three, a.alloc_replicated(1, 1 << 20, None, 2)).await.expect("a replicated region");
        assert_eq!(b.replication(), (1, 0), "n1 is its home");
        assert_eq!(c.replication(), (0, 1), "n2 keeps its standby");
        // The tenant's writes reach the standby (the fabric's own call, not the tenant's).
        a.acting_for(three, a.write(&r, 0, &[3u8; 8192])).await.expect("tenant 3 writes");
        denied(a.acting_for(four, a.write(&r, 0, &[4u8; 16])).await, "tenant 4 writes tenant 3's region");
        // Tenant 4's region on n1 kept on its home only.
        let r4 = a.acting_for(four, a.alloc_replicated(1, 1 << 20, None, 1)).await.expect("tenant 4's region");
        a.acting_for(four, a.write(&r4, 4096, &[4u8; 4096])).await.expect("tenant 4 writes");
        // Its home leaves: the standby takes over, the other region is drained to another node, and each is
        // still its tenant's alone, every byte there.
        let drained = b.leave().await;
        assert!(drained.kept.is_empty() && drained.copied == 1, "{drained:?}");
        let mut mine = vec![0u8; 4096];
        a.acting_for(four, a.read(&r4, 4096, &mut mine)).await.expect("tenant 4 reads its drained region");
        assert_eq!(mine, [4u8; 4096]);
        denied(a.acting_for(three, a.read(&r4, 4096, &mut mine)).await, "tenant 3 reads tenant 4's drained region");
        let mut buf = vec![0u8; 8192];
        a.acting_for(three, a.read(&r, 0, &mut buf)).await.expect("tenant 3 reads after the handover");
        assert_eq!(buf, [3u8; 8192]);
        denied(a.acting_for(four, a.read(&r, 0, &mut buf)).await, "tenant 4 reads it after the handover");
        let served = c.fabric().regions().into_iter().filter(|(_, t)| *t == three).count();
        assert_eq!(served, 1, "n2 serves the region now, under tenant 3's name");
        let held = [a, c].iter().flat_map(|n| n.fabric().regions()).filter(|(_, t)| *t == four).count();
        assert_eq!(held, 1, "tenant 4's region lives on under its name");
        for n in [a, c] {
            n.shutdown().await;
        }
    });
}
