//! The device layer: one node's GPUs and pinned host memory, behind the trait every backend implements.

use std::any::Any;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vfabric_allocator::Location;

use super::arena::{Arena, ArenaSpec};
use super::error::DeviceError;
use super::mover::{Mover, MoverConfig};
use super::peer_channel::{ChannelId, PeerChannel};
use super::share::ArenaShare;

/// Which implementation of the device layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    /// Real GPUs through the CUDA driver API (cudarc, VMM).
    Cuda,
    /// Host memory standing in for GPUs, so the fabric runs and is tested on machines without one.
    Emulated,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cuda => "cuda",
            DeviceKind::Emulated => "emulated",
        })
    }
}

/// What the device layer knows about one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The GPU's index on this node (the CUDA ordinal).
    pub index: u16,
    /// The product name, e.g. "NVIDIA H200".
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Number of streaming multiprocessors.
    pub multiprocessors: u32,
    /// The VMM allocation granularity in bytes: arena chunks are multiples of it.
    pub granularity: u64,
    /// Whether arena chunks can be exported as POSIX file descriptors for other processes.
    pub fd_export: bool,
}

/// One node's memory devices: its GPUs and its pinned host memory.
pub trait DeviceLayer: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> DeviceKind;
    /// The node's GPUs.
    fn gpus(&self) -> &[GpuInfo];
    /// Whether NCCL's library can be loaded on this node.
    fn nccl_available(&self) -> bool;
    /// Creates an arena, mapped once for every GPU of the node.
    fn create_arena(&self, spec: &ArenaSpec) -> Result<Arc<dyn Arena>, DeviceError>;
    /// A mover for arenas of this device layer.
    fn mover(&self, config: MoverConfig) -> Result<Arc<dyn Mover>, DeviceError>;
    /// Maps an arena that another process of the node exported ([`Arena::export`]): the same memory at an
    /// address of this process. The descriptors are consumed.
    fn import_arena(&self, share: &ArenaShare, fds: Vec<OwnedFd>) -> Result<Arc<dyn Arena>, DeviceError>;
    /// Waits until the work this process queued on `location` (kernels, copies on any stream) is done: what a
    /// process does before it lets go of memory another process may then move.
    fn synchronize(&self, location: Location) -> Result<(), DeviceError>;
    /// A new identity for a channel between GPUs of different processes, which this end and the others then
    /// join ([`DeviceLayer::join_channel`]). A backend without such channels (the emulated one) refuses.
    fn channel_id(&self) -> Result<ChannelId, DeviceError> {
        Err(DeviceError::NcclMissing)
    }
    /// Joins channel `id` as rank `rank.0` of `rank.1` on GPU `gpu`, waiting at most `timeout` for every end to
    /// join (blocking).
    fn join_channel(
        &self,
        gpu: u16,
        id: &ChannelId,
        rank: (usize, usize),
        timeout: std::time::Duration,
    ) -> Result<Box<dyn PeerChannel>, DeviceError> {
        let _ = (gpu, id, rank, timeout);
        Err(DeviceError::NcclMissing)
    }
    /// The backend's own type (the benchmark's baselines need the CUDA node's contexts).
    fn as_any(&self) -> &dyn Any;
    /// One line that says what this device layer is, for logs and reports.
    fn describe(&self) -> String {
        let gpus: Vec<String> = self
            .gpus()
            .iter()
            .map(|g| format!("gpu{} {} {:.1} GiB", g.index, g.name, g.total_memory as f64 / (1u64 << 30) as f64))
            .collect();
        format!("{} device layer: {}", self.kind(), gpus.join(", "))
    }
}
