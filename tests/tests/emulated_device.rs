//! The device conformance suite on the emulated device (what CI runs), and the CUDA backend's behaviour on a
//! machine without a driver.

use vfabric_tests::device_suite::{self, Scale};
use vfabric_transport::emulated::EmulatedNode;
use vfabric_transport::{cuda, open, Backend, DeviceError, DeviceKind, OpenOptions};

fn node() -> EmulatedNode {
    EmulatedNode::new(2, 256 << 20)
}

#[test]
fn arena_lifecycle() {
    device_suite::arena_lifecycle(&node(), Scale::SMALL);
}

#[test]
fn arena_errors() {
    device_suite::arena_errors(&node(), Scale::SMALL);
}

#[test]
fn moves_by_every_engine() {
    device_suite::moves_by_every_engine(&node(), Scale::SMALL);
}

#[test]
fn moves_within_one_arena() {
    device_suite::moves_within_one_arena(&node(), Scale::SMALL);
}

#[test]
fn concurrent_transfers() {
    device_suite::concurrent_transfers(&node(), Scale::SMALL);
}

#[test]
fn batch_errors() {
    device_suite::batch_errors(&node(), Scale::SMALL);
}

#[test]
fn coded_moves_match_the_cpu() {
    vfabric_tests::lossy_suite::coded_moves_match_the_cpu(&node(), Scale::SMALL);
}

#[test]
fn one_gpu_node_moves_through_host() {
    let n = EmulatedNode::new(1, 256 << 20);
    device_suite::concurrent_transfers(&n, Scale::SMALL);
}

/// Without a driver, opening CUDA is an error and `Auto` falls back to the emulated device, saying why; with a
/// driver (the GPU machine), CUDA opens.
#[test]
fn cuda_without_driver_is_an_error_not_a_panic() {
    let auto = open(&OpenOptions { backend: Backend::Auto, ..OpenOptions::default() }).expect("auto always opens");
    if cuda::driver_present() {
        return assert!(cuda::CudaNode::open().is_ok() || auto.fallback_reason.is_some());
    }
    assert!(matches!(cuda::CudaNode::open(), Err(DeviceError::DriverMissing)));
    assert!(matches!(
        open(&OpenOptions { backend: Backend::Cuda, ..OpenOptions::default() }),
        Err(DeviceError::DriverMissing)
    ));
    assert_eq!(auto.layer.kind(), DeviceKind::Emulated);
    assert!(matches!(auto.fallback_reason, Some(DeviceError::DriverMissing)));
    assert!(!auto.layer.nccl_available());
}
