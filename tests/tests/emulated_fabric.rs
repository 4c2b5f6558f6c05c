//! The fabric conformance suite on the emulated device (what CI runs).

use vfabric::{ByteSize, ClusterConfig};
use vfabric_transport::Backend;

/// Two emulated GPUs of 32 MiB arenas (16 pages of 2 MiB), 128 MiB of host memory.
fn config() -> ClusterConfig {
    let mut c = ClusterConfig::embedded_local();
    c.device.backend = Backend::Emulated;
    c.memory.gpu_budget = Some(ByteSize(32 << 20));
    c.memory.host_arena = ByteSize(128 << 20);
    c
}

vfabric_tests::fabric_suite_tests!(config());

/// A tenant's quotas from `[[tenant]]` hold from the start, as `set_quota`'s do.
#[test]
fn tenant_quotas_come_from_the_configuration() {
    use vfabric::{Fabric, FabricError, Mode, Placement, TenantId};
    let mut c = config();
    c.tenants.push(vfabric::config::TenantSection {
        id: 7,
        gpu: Some(ByteSize(2 << 20)),
        host: None,
        storage: None,
        uids: Vec::new(),
    });
    let f = Fabric::embedded(&c).expect("fabric");
    let g = vfabric::Location::Gpu(0);
    let q =
        f.alloc(4 << 20, Placement { device: Some(g), tenant: TenantId(7), ..Placement::default() }).expect("alloc");
    let err = f.acquire(&q, 0..4 << 20, g, Mode::Read).expect_err("two pages: over the quota of one");
    assert!(matches!(err, FabricError::QuotaExceeded { .. }), "{err}");
    f.acquire(&q, 0..2 << 20, g, Mode::Read).map(|l| f.release(l)).expect("within quota").expect("release");
    let other = f.alloc(4 << 20, Placement::on(g)).expect("alloc");
    f.acquire(&other, 0..4 << 20, g, Mode::Read)
        .map(|l| f.release(l))
        .expect("tenant 0 is unlimited")
        .expect("release");
}

/// A GPU budget larger than the GPU is refused at start, saying both sizes, rather than shrunk quietly.
#[test]
fn a_gpu_budget_past_the_gpu_is_refused() {
    let mut c = config();
    c.device.emulated_gpu_memory = ByteSize(64 << 20);
    c.memory.gpu_budget = Some(ByteSize(1 << 30));
    let err = vfabric::Fabric::embedded(&c).map(|_| ()).expect_err("1 GiB of a 64 MiB GPU");
    let text = err.to_string();
    assert!(text.contains("gpu_budget 1GiB") && text.contains("64MiB"), "{text}");
}

/// A handle kept from an earlier run of a node is refused by the next one, even where a new region has the
/// same address, slot and size: it never reads or writes someone else's bytes.
#[test]
fn a_handle_from_an_earlier_run_is_stale() {
    use vfabric::{Fabric, FabricError, Placement};
    let g = vfabric::Location::Gpu(0);
    let first = Fabric::embedded(&config()).expect("fabric");
    let old = first.alloc(4 << 20, Placement::on(g)).expect("alloc");
    first.write(&old, 0, &[1u8; 4096]).expect("write");
    drop(first);
    let second = Fabric::embedded(&config()).expect("fabric again");
    let new = second.alloc(4 << 20, Placement::on(g)).expect("alloc");
    second.write(&new, 0, &[2u8; 4096]).expect("write");
    assert_eq!((old.addr, old.len), (new.addr, new.len), "the same place and size");
    let mut buf = [0u8; 4096];
    match second.read(&old, 0, &mut buf) {
        Err(FabricError::UseAfterFree(why)) => assert!(why.contains("earlier run"), "{why}"),
        other => panic!("a stale handle read: {other:?}"),
    }
    assert!(matches!(second.write(&old, 0, &[3u8; 16]), Err(FabricError::UseAfterFree(_))));
    assert!(second.free(&old).is_err());
    second.read(&new, 0, &mut buf).expect("read");
    assert_eq!(buf, [2u8; 4096], "the new region is untouched");
}
