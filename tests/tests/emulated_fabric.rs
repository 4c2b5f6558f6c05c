//! The fabric conformance suite on the emulated device (what CI runs).

use vfabric::{ByteSize, ClusterConfig};
use vfabric_tests::fabric_suite;
use vfabric_transport::Backend;

/// Two emulated GPUs of 32 MiB arenas (16 pages of 2 MiB), 128 MiB of host memory.
fn config() -> ClusterConfig {
    let mut c = ClusterConfig::embedded_local();
    c.device.backend = Backend::Emulated;
    c.memory.gpu_budget = Some(ByteSize(32 << 20));
    c.memory.host_arena = ByteSize(128 << 20);
    c
}

#[test]
fn eviction_and_fetch_keep_every_byte() {
    fabric_suite::eviction_and_fetch_keep_every_byte(&config());
}

#[test]
fn compaction_and_page_lists() {
    let mut c = config();
    // No watermark eviction, so the fragmentation the test makes stays.
    c.memory.high_watermark_percent = 100;
    c.memory.low_watermark_percent = 100;
    c.memory.headroom_percent = 0;
    fabric_suite::compaction_and_page_lists(&c);
}

#[test]
fn kernels_through_lease_pointers() {
    fabric_suite::kernels_through_lease_pointers(&config());
}

#[test]
fn replicas_are_invalidated_on_write() {
    fabric_suite::replicas_are_invalidated_on_write(&config());
}

#[test]
fn errors_are_typed_and_harmless() {
    fabric_suite::errors_are_typed_and_harmless(&config());
}
