//! vfabric's end-to-end tests, the fabric conformance suite ([`fabric_suite`], with [`lossy_suite`]'s checks of
//! lossy regions, [`storage_suite`]'s of the storage tier, [`tiers_suite`]'s of walks over it and
//! [`compressed_suite`]'s of the compressed tier), and the device conformance suite ([`device_suite`]) that runs
//! the same checks on the emulated device (in CI, `tests/emulated_device.rs`) and on real GPUs (`tests/gpu.rs`,
//! built with the `gpu` feature and run on the GPU machine by `scripts/device-run.sh`).

pub mod compressed_suite;
pub mod device_suite;
pub mod fabric_rig;
pub mod fabric_suite;
pub mod loopback;
pub mod lossy_suite;
pub mod storage_suite;
pub mod tiers_suite;
/// The verifiable data the suite writes, shared with the demo and the benchmarks.
pub use vfabric::pattern;
