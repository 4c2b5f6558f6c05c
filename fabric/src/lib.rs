//! vfabric: one address space over the GPUs, host memory and NVMe drives of a cluster.
//!
//! This crate holds the fabric as its users see it. What is built so far: the cluster configuration
//! ([`config`]), one node's memory as arenas of frames with a mover between them ([`memory`]), and the demo
//! ([`demo`]). The directory, coherence, leases and the agent come next (see `docs/architecture.md`).
//!
//! The layers below: `vfabric-allocator` (addresses, ranges, frames, quotas: pure) and `vfabric-transport` (the
//! device layer over CUDA or the emulated device, and the page movers).

#![deny(missing_docs)]

pub mod config;
pub mod demo;
pub mod logging;
pub mod memory;
pub mod pattern;
pub mod units;

pub use config::{ClusterConfig, ConfigError};
pub use memory::{NodeError, NodeMemory};
pub use units::ByteSize;
