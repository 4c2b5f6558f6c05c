//! The CUDA device layer of one node: its GPUs (found by [`super::gpus`]), arenas on them and their mover.

use std::any::Any;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use vfabric_allocator::Location;

use super::arena::{GpuArena, HostArena};
use super::context::GpuContext;
use super::gpus::NodeInner;
use super::host::PinnedHostMemory;
use super::mover::CudaMover;
use super::vmm::PhysicalChunk;
use crate::device::arena::{Arena, ArenaSpec};
use crate::device::error::DeviceError;
use crate::device::layer::{DeviceKind, DeviceLayer, GpuInfo};
use crate::device::mover::{Mover, MoverConfig};

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
        let ctx = Arc::clone(self.inner.context(gpu)?);
        let info = &self.inner.gpus[usize::from(gpu)];
        if len == 0 || len % info.granularity != 0 {
            return Err(DeviceError::InvalidArgument(format!(
                "an imported chunk's length ({len}) must be a non-zero multiple of {} bytes",
                info.granularity
            )));
        }
        ctx.bind()?;
        let chunk = PhysicalChunk::import_fd(fd, gpu, len)?;
        let arena = GpuArena::build(
            ctx,
            len,
            len,
            info.granularity,
            true,
            &self.inner.peers[usize::from(gpu)],
            Some(vec![chunk]),
        )?;
        Ok(Arc::new(arena))
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
            Location::Host => {
                let ctx = Arc::clone(self.inner.context(0)?);
                let mem = PinnedHostMemory::alloc(ctx, spec.bytes).map_err(|e| match e {
                    DeviceError::Cuda { ref name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY" => {
                        DeviceError::OutOfDeviceMemory {
                            location: Location::Host,
                            requested: spec.bytes,
                            detail: e.to_string(),
                        }
                    }
                    other => other,
                })?;
                Ok(Arc::new(HostArena::new(mem)))
            }
        }
    }

    fn mover(&self, config: MoverConfig) -> Result<Arc<dyn Mover>, DeviceError> {
        Ok(Arc::new(CudaMover::new(Arc::clone(&self.inner), config)?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
