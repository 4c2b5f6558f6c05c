//! vfabric: one address space over the GPUs, host memory and NVMe drives of a cluster.
//!
//! This crate holds the fabric as its users see it: the cluster configuration ([`config`]), the directory and
//! its coherence rules (pure: [`directory`]), the embedded fabric that carries out its copies ([`Fabric`]: the
//! Rust API), and the demo ([`demo`]). The agent and the network come next (see `docs/architecture.md`).
//!
//! ```no_run
//! use vfabric::{ClusterConfig, Fabric, Mode, Placement};
//! use vfabric_transport::Location;
//!
//! let fabric = Fabric::embedded(&ClusterConfig::embedded_local())?;
//! let region = fabric.alloc(64 << 20, Placement::on(Location::Gpu(0)))?;
//! fabric.write(&region, 0, &vec![7u8; 1 << 20])?;
//! let lease = fabric.acquire(&region, 0..(1 << 20), Location::Gpu(0), Mode::Read)?;
//! // lease.ptr() holds the device pointer(s) a kernel may use until the lease is released.
//! fabric.release(lease)?;
//! fabric.free(&region)?;
//! # Ok::<(), vfabric::FabricError>(())
//! ```
//!
//! The layers below: `vfabric-allocator` (addresses, ranges, frames, quotas: pure) and `vfabric-transport` (the
//! device layer over CUDA or the emulated device, and the page movers).

#![deny(missing_docs)]

pub mod agent;
pub mod config;
pub mod demo;
pub mod directory;
pub mod error;
pub mod fabric;
pub mod logging;
pub mod pattern;
pub mod proto;
pub mod units;

pub use config::{ClusterConfig, ConfigError};
pub use directory::{Mode, Placement, Priority};
pub use error::FabricError;
pub use fabric::{Fabric, Lease, LeasePtr, Region, Stats, Traffic};
pub use units::ByteSize;
