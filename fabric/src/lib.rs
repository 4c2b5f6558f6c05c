//! vfabric: one address space over the GPUs, host memory and NVMe drives of a cluster.
//!
//! This crate holds the fabric as its users see it: the cluster configuration ([`config`]), the directory and
//! its coherence rules (pure: [`directory`]), the embedded fabric that carries out its copies ([`Fabric`]: the
//! Rust API), the wire between nodes ([`proto`]), a node's daemon and its calls on other nodes' regions
//! ([`agent`]), and the demo ([`demo`]). `docs/architecture.md` draws the layers.
//!
//! ```no_run
//! use vfabric::{ClusterConfig, Fabric, Location, Mode, Placement};
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
//! device layer over CUDA or the emulated device with the page movers, and QUIC between nodes). What this
//! crate's API takes and returns from them is re-exported here, so a user depends on `vfabric` alone.

#![deny(missing_docs)]

pub mod agent;
pub mod config;
pub mod demo;
pub mod directory;
pub mod error;
pub mod fabric;
pub mod logging;
pub mod pattern;
pub mod pool;
pub mod proto;
pub mod units;

pub use agent::{
    Agent, AgentLease, AllocOptions, AttachedClient, HostAgentLaunch, JobRank, JoinOptions, LocalClient, LocalLease,
};
pub use config::{ClusterConfig, ConfigError};
pub use directory::{DirectoryError, Mode, Placement, Priority};
pub use error::{FabricError, LaunchError, NetworkError};
pub use fabric::{
    Fabric, Lease, LeasePtr, LeasedPages, NodePlan, Region, Reservation, Stalls, Stats, StorageUsage, Traffic,
};
pub use pool::{PoolConfig, PoolSource, PoolStats, TensorPool};
pub use units::ByteSize;
pub use vfabric_allocator::{
    Compression, GlobalAddr, Location, NodeId, PageSize, ParseCompressionError, TenantId, Tier, COMPRESSIONS,
};
pub use vfabric_transport::storage::StorageError;
pub use vfabric_transport::{Arena, Backend, DeviceError, DeviceKind, EngineChoice, MoveError, TransferReport};
