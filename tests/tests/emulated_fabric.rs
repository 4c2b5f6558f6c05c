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
    c.tenants.push(vfabric::config::TenantSection { id: 7, gpu: Some(ByteSize(2 << 20)), host: None, storage: None });
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
