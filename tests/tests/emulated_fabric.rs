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
