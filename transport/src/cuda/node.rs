//! A node's GPUs through the CUDA driver: discovery, contexts, arenas.

use std::any::Any;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::arena::{GpuArena, HostArena};
use super::context::GpuContext;
use super::driver::{self, from_result};
use super::host::PinnedHostMemory;
use super::mover::CudaMover;
use super::vmm::{granularity, PhysicalChunk};
use crate::error::DeviceError;
use crate::hal::{Arena, ArenaSpec, DeviceKind, DeviceLayer, GpuInfo};
use vfabric_allocator::Location;
use crate::mover::{Mover, MoverConfig};

/// The CUDA device layer of one node: every GPU the driver shows, each through its primary context.
pub struct CudaNode {
    inner: Arc<NodeInner>,
}

pub(crate) struct NodeInner {
    pub(crate) contexts: Vec<Arc<GpuContext>>,
    pub(crate) gpus: Vec<GpuInfo>,
    /// `peers[a]`: the GPUs (a included) that can load and store GPU a's memory.
    pub(crate) peers: Vec<Vec<u16>>,
    pub(crate) nccl: bool,
}

impl NodeInner {
    pub(crate) fn context(&self, gpu: u16) -> Result<&Arc<GpuContext>, DeviceError> {
        self.contexts.get(usize::from(gpu)).ok_or(DeviceError::NoSuchGpu { gpu, count: self.contexts.len() })
    }
}

impl CudaNode {
    /// Loads the driver and opens every GPU. Errors (never panics) when there is no driver, no GPU, or a GPU
    /// without virtual memory management or unified addressing.
    pub fn open() -> Result<Self, DeviceError> {
        driver::init()?;
        let count = result::device::get_count().map_err(from_result("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(DeviceError::NoGpu);
        }
        let count = u16::try_from(count).map_err(|_| DeviceError::InvalidArgument(format!("{count} GPUs")))?;
        let mut contexts = Vec::new();
        let mut gpus = Vec::new();
        for g in 0..count {
            let ctx = Arc::new(GpuContext::retain(g)?);
            use sys::CUdevice_attribute::*;
            if ctx.attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? != 1 {
                return Err(DeviceError::Unsupported { gpu: g, feature: "virtual memory management" });
            }
            if ctx.attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 1 {
                return Err(DeviceError::Unsupported { gpu: g, feature: "unified addressing" });
            }
            let fd_export = ctx.attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? == 1;
            let multiprocessors = ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32;
            let name = result::device::get_name(ctx.device()).map_err(from_result("cuDeviceGetName"))?;
            // SAFETY: the device handle is valid.
            let total = unsafe { result::device::total_mem(ctx.device()) }.map_err(from_result("cuDeviceTotalMem"))?;
            gpus.push(GpuInfo {
                index: g,
                name,
                total_memory: total as u64,
                multiprocessors,
                granularity: granularity(g, fd_export)?,
                fd_export,
            });
            contexts.push(ctx);
        }
        let mut peers = Vec::new();
        for a in 0..count {
            let mut can = vec![a];
            for b in (0..count).filter(|&b| b != a) {
                let mut ok: std::ffi::c_int = 0;
                // SAFETY: both ordinals are valid devices.
                unsafe {
                    driver::cu!(cuDeviceCanAccessPeer(
                        &mut ok,
                        contexts[usize::from(b)].device(),
                        contexts[usize::from(a)].device()
                    ))?
                };
                if ok == 1 {
                    can.push(b);
                }
            }
            peers.push(can);
        }
        let nccl = driver::nccl_present();
        tracing::info!(gpus = count, nccl, "CUDA device layer opened");
        Ok(CudaNode { inner: Arc::new(NodeInner { contexts, gpus, peers, nccl }) })
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
