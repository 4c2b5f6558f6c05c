//! The CUDA device layer of one node: its GPUs (found by [`super::gpus`]), arenas on them and their mover.

use std::any::Any;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use vfabric_allocator::Location;

use super::arena::{GpuArena, HostArena};
use super::context::GpuContext;
use super::gpus::NodeInner;
use super::host::RegisteredHostMemory;
use super::mover::CudaMover;
use super::vmm::PhysicalChunk;
use crate::device::arena::{Arena, ArenaSpec};
use crate::device::error::DeviceError;
use crate::device::layer::{DeviceKind, DeviceLayer, GpuInfo};
use crate::device::mover::{Mover, MoverConfig};
use crate::device::peer_channel::{ChannelId, PeerChannel};
use crate::device::share::{ArenaShare, ShareKind};
use crate::device::shared_memory::SharedHostMemory;

/// The CUDA device layer of one node: every GPU the driver shows, each through its primary context.
pub struct CudaNode {
    inner: Arc<NodeInner>,
}

impl CudaNode {
    /// Loads the driver and opens every GPU. Errors (never panics) when there is no driver, no GPU, or a GPU
    /// without virtual memory management or unified addressing.
    pub fn open() -> Result<Self, DeviceError> {
        Ok(CudaNode { inner: Arc::new(NodeInner::discover()?) })
    }

    /// Imports a chunk exported by [`GpuArena::export_chunk`] (in this or another process of the node) and maps
    /// it as an arena of its own: the bytes are the exporter's, reached through a second address.
    pub fn import_chunk(&self, fd: BorrowedFd<'_>, gpu: u16, len: u64) -> Result<Arc<dyn Arena>, DeviceError> {
        Ok(Arc::new(self.import_chunks(gpu, &[(fd, len)])?))
    }

    /// Imports exported chunks of GPU `gpu` and maps them back to back into one range, as an arena.
    fn import_chunks(&self, gpu: u16, pieces: &[(BorrowedFd<'_>, u64)]) -> Result<GpuArena, DeviceError> {
        let ctx = Arc::clone(self.inner.context(gpu)?);
        let info = &self.inner.gpus[usize::from(gpu)];
        let mut total = 0u64;
        for &(_, len) in pieces {
            if len == 0 || len % info.granularity != 0 {
                return Err(DeviceError::InvalidArgument(format!(
                    "an imported chunk's length ({len}) must be a non-zero multiple of {} bytes",
                    info.granularity
                )));
            }
            total =
                total.checked_add(len).ok_or_else(|| DeviceError::InvalidArgument("chunks past 2^64 bytes".into()))?;
        }
        ctx.bind()?;
        let chunks =
            pieces.iter().map(|&(fd, len)| PhysicalChunk::import_fd(fd, gpu, len)).collect::<Result<Vec<_>, _>>()?;
        let peers = &self.inner.peers[usize::from(gpu)];
        GpuArena::build(ctx, total, info.granularity, info.granularity, true, peers, Some(chunks))
    }

    /// The GPUs that can reach GPU `gpu`'s memory directly (itself included).
    pub fn peers_of(&self, gpu: u16) -> &[u16] {
        self.inner.peers.get(usize::from(gpu)).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The primary context of GPU `gpu`.
    pub fn context(&self, gpu: u16) -> Result<&Arc<GpuContext>, DeviceError> {
        self.inner.context(gpu)
    }
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

impl DeviceLayer for CudaNode {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.inner.gpus
    }

    fn nccl_available(&self) -> bool {
        self.inner.nccl
    }

    fn channel_id(&self) -> Result<ChannelId, DeviceError> {
        super::nccl::new_channel_id()
    }

    fn join_channel(
        &self,
        gpu: u16,
        id: &ChannelId,
        rank: (usize, usize),
        timeout: std::time::Duration,
    ) -> Result<Box<dyn PeerChannel>, DeviceError> {
        let ctx = Arc::clone(self.inner.context(gpu)?);
        Ok(Box::new(super::nccl::PeerComm::join(ctx, gpu, id, rank, timeout)?))
    }

    fn create_arena(&self, spec: &ArenaSpec) -> Result<Arc<dyn Arena>, DeviceError> {
        if spec.bytes == 0 {
            return Err(DeviceError::InvalidArgument("an arena of 0 bytes".into()));
        }
        match spec.location {
            Location::Gpu(g) => {
                let ctx = Arc::clone(self.inner.context(g)?);
                let info = &self.inner.gpus[usize::from(g)];
                let gran = info.granularity.max(1);
                let bytes = round_up(spec.bytes, gran);
                let chunk = round_up(spec.chunk_bytes.max(gran), gran);
                let t = std::time::Instant::now();
                let arena =
                    GpuArena::build(ctx, bytes, chunk, gran, info.fd_export, &self.inner.peers[usize::from(g)], None)?;
                tracing::debug!(
                    gpu = g,
                    bytes,
                    chunks = arena.chunk_count(),
                    ms = t.elapsed().as_secs_f64() * 1e3,
                    "GPU arena mapped"
                );
                Ok(Arc::new(arena))
            }
            Location::Host | Location::Packed(_) | Location::Compressed => {
                let ctx = Arc::clone(self.inner.context(0)?);
                let shared = SharedHostMemory::create("vfabric-host", spec.bytes)?;
                let mem = RegisteredHostMemory::register(ctx, shared).map_err(|e| match e {
                    DeviceError::Cuda { ref name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY" => {
                        DeviceError::OutOfDeviceMemory {
                            location: spec.location,
                            requested: spec.bytes,
                            detail: e.to_string(),
                        }
                    }
                    other => other,
                })?;
                Ok(Arc::new(HostArena::new(mem, spec.location)))
            }
            Location::Storage => Err(DeviceError::NoArena(Location::Storage)),
        }
    }

    fn mover(&self, config: MoverConfig) -> Result<Arc<dyn Mover>, DeviceError> {
        Ok(Arc::new(CudaMover::new(Arc::clone(&self.inner), config)?))
    }

    fn import_arena(&self, share: &ArenaShare, fds: Vec<OwnedFd>) -> Result<Arc<dyn Arena>, DeviceError> {
        share.check(fds.len())?;
        match (share.location, share.kind) {
            (Location::Gpu(g), ShareKind::GpuChunks) => {
                let pieces: Vec<_> = fds.iter().map(AsFd::as_fd).zip(share.pieces.iter().copied()).collect();
                Ok(Arc::new(self.import_chunks(g, &pieces)?))
            }
            (location @ (Location::Host | Location::Packed(_) | Location::Compressed), ShareKind::HostFile) => {
                let ctx = Arc::clone(self.inner.context(0)?);
                let fd = fds.into_iter().next().ok_or_else(|| DeviceError::InvalidArgument("no descriptor".into()))?;
                // Registered when first needed (`Arena::prepare_for_devices`): most clients lease GPU pages only.
                let mem = RegisteredHostMemory::lazy(ctx, SharedHostMemory::map(fd, share.len)?);
                Ok(Arc::new(HostArena::new(mem, location)))
            }
            (location, kind) => Err(DeviceError::InvalidArgument(format!("a {location} arena shared as {kind:?}"))),
        }
    }

    fn synchronize(&self, location: Location) -> Result<(), DeviceError> {
        match location {
            Location::Gpu(g) => self.inner.context(g)?.synchronize(),
            // Host memory is reached by this process's GPUs' work: wait for all of it.
            Location::Host | Location::Packed(_) | Location::Compressed => {
                self.inner.gpus.iter().try_for_each(|g| self.inner.context(g.index)?.synchronize())
            }
            // No GPU work touches the storage tier.
            Location::Storage => Ok(()),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
