//! The CUDA mover: copy engines and the SM gather/scatter kernel, on two queues (streams) per GPU, and the lossy
//! codec's kernels for coded moves.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::sys;

use super::arena::{GpuArena, HostArena};
use super::context::GpuContext;
use super::driver::{cu, has_symbol};
use super::gpus::NodeInner;
use super::module::{Kernel, Module};
use super::staging::IndexStaging;
use super::stream::{Event, Stream};
use crate::device::arena::Arena;
use crate::device::batch::{KernelLayout, PageBatch, Plan};
use crate::device::engine::{Engine, EngineChoice};
use crate::device::error::{DeviceError, MoveError};
use crate::device::mover::{
    prepare, prepare_coded, Coding, Execution, Mover, MoverConfig, Pending, Transfer, Way, MAX_SHORT_LAUNCH_PAGES,
};
use vfabric_allocator::{Element, Location, LossyCode, LOSSY_GROUP};

/// The page copy kernels, built from `kernels/page_copy.cu` with `nvcc -ptx -arch=compute_90` on the GPU machine.
pub const PAGE_COPY_PTX: &str = include_str!("../../../kernels/page_copy.ptx");
/// The kernel the mover launches (16-byte words, four loads in flight per thread).
pub const PAGE_COPY_KERNEL: &str = "vf_page_copy";
/// The same kernel for batches of at most [`SHORT_PAGES`] pages: their index lists are launch parameters.
pub const PAGE_COPY_SHORT_KERNEL: &str = "vf_page_copy_short";
/// `VF_SHORT_PAGES` in `page_copy.cu`: the length of each list a short launch passes.
const SHORT_PAGES: usize = MAX_SHORT_LAUNCH_PAGES as usize;
/// The lossy codec's kernels, built from `kernels/page_codec.cu` the same way.
pub const PAGE_CODEC_PTX: &str = include_str!("../../../kernels/page_codec.ptx");

/// One queue of one GPU, with the device buffer that carries the kernel's page index lists.
struct Lane {
    stream: Stream,
    index_buf: sys::CUdeviceptr,
    index_cap: usize,
    /// Pinned memory the index lists are copied from, so that a launch never waits for the stream.
    staging: IndexStaging,
}

impl Lane {
    /// Makes room for `bytes` of index lists, in stream order, so a launch still reading the old buffer is not
    /// disturbed.
    fn reserve_indices(&mut self, bytes: usize) -> Result<sys::CUdeviceptr, DeviceError> {
        if bytes > self.index_cap {
            let cap = bytes.next_power_of_two().max(64 << 10);
            // SAFETY: the stream is live and its context current (the caller bound it); the old buffer was
            // allocated on this stream.
            unsafe {
                if self.index_cap > 0 {
                    cu!(cuMemFreeAsync(self.index_buf, self.stream.raw()))?;
                    self.index_cap = 0;
                }
                let mut p: sys::CUdeviceptr = 0;
                cu!(cuMemAllocAsync(&mut p, cap, self.stream.raw()))?;
                self.index_buf = p;
            }
            self.index_cap = cap;
        }
        Ok(self.index_buf)
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        if self.index_cap > 0 {
            let _ = self.stream.context().bind();
            // SAFETY: allocated on this stream; freed once, then the stream is drained before it is destroyed.
            unsafe {
                let _ = cu!(cuMemFreeAsync(self.index_buf, self.stream.raw()));
            }
            let _ = self.stream.synchronize();
        }
    }
}

struct GpuLanes {
    ctx: Arc<GpuContext>,
    inbound: Mutex<Lane>,
    outbound: Mutex<Lane>,
    within: Mutex<Lane>,
    kernel: Kernel,
    short: Kernel,
    pack: Kernel,
    unpack: Kernel,
}

/// Moves pages between the arenas of a [`super::CudaNode`].
pub struct CudaMover {
    node: Arc<NodeInner>,
    config: MoverConfig,
    gpus: Vec<GpuLanes>,
    batch_copy: AtomicBool,
}

impl CudaMover {
    pub(crate) fn new(node: Arc<NodeInner>, config: MoverConfig) -> Result<Self, DeviceError> {
        config.validate().map_err(|e| DeviceError::InvalidArgument(e.to_string()))?;
        let mut gpus = Vec::new();
        for ctx in &node.contexts {
            let module = Module::load_ptx(Arc::clone(ctx), PAGE_COPY_PTX)?;
            let codec = Module::load_ptx(Arc::clone(ctx), PAGE_CODEC_PTX)?;
            let lane = || -> Result<Mutex<Lane>, DeviceError> {
                Ok(Mutex::new(Lane {
                    stream: Stream::new(Arc::clone(ctx))?,
                    index_buf: 0,
                    index_cap: 0,
                    staging: IndexStaging::new(ctx)?,
                }))
            };
            gpus.push(GpuLanes {
                ctx: Arc::clone(ctx),
                inbound: lane()?,
                outbound: lane()?,
                within: lane()?,
                kernel: module.kernel(PAGE_COPY_KERNEL)?,
                short: module.kernel(PAGE_COPY_SHORT_KERNEL)?,
                pack: codec.kernel("vf_lossy_pack")?,
                unpack: codec.kernel("vf_lossy_unpack")?,
            });
        }
        let batch_copy = has_symbol("cuMemcpyBatchAsync_v2");
        if !batch_copy {
            tracing::info!("driver has no cuMemcpyBatchAsync_v2: the copy engine issues one call per run");
        }
        Ok(CudaMover { node, config, gpus, batch_copy: AtomicBool::new(batch_copy) })
    }

    fn lane(&self, exec: &Execution) -> Result<(&GpuLanes, MutexGuard<'_, Lane>), MoveError> {
        let g = self
            .gpus
            .get(usize::from(exec.gpu))
            .ok_or(DeviceError::NoSuchGpu { gpu: exec.gpu, count: self.gpus.len() })?;
        let m = match exec.way {
            Way::Inbound => &g.inbound,
            Way::Outbound => &g.outbound,
            Way::Within => &g.within,
        };
        // A panic while a lane was held leaves nothing half-done that matters here: the stream is still valid.
        Ok((g, m.lock().unwrap_or_else(|p| p.into_inner())))
    }

    /// Issues the plan's runs to the copy engine on `lane`'s stream.
    fn copy_runs(
        &self,
        lane: &Lane,
        plan: &Plan,
        src: u64,
        dst: u64,
        from: Location,
        to: Location,
    ) -> Result<(), DeviceError> {
        let runs = plan.runs();
        let s = lane.stream.raw();
        if runs.len() > 1 && self.batch_copy.load(Ordering::Relaxed) {
            let mut dsts: Vec<sys::CUdeviceptr> = runs.iter().map(|r| dst + r.dst_offset).collect();
            let mut srcs: Vec<sys::CUdeviceptr> = runs.iter().map(|r| src + r.src_offset).collect();
            let mut sizes: Vec<usize> = runs.iter().map(|r| r.len as usize).collect();
            // SAFETY: zero is a valid value of this plain C struct; the fields that matter are set below.
            let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
            attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
            attr.srcLocHint = loc_hint(from);
            attr.dstLocHint = loc_hint(to);
            let mut attr_idx: usize = 0;
            // SAFETY: the arrays hold `runs.len()` entries and outlive the call (the driver copies the
            // descriptors before returning); every range lies inside a mapped arena (the plan was checked).
            let r = unsafe {
                cu!(cuMemcpyBatchAsync_v2(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    runs.len(),
                    &mut attr,
                    &mut attr_idx,
                    1,
                    s
                ))
            };
            match r {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(error = %e, "cuMemcpyBatchAsync_v2 refused the batch; issuing one copy per run from now on");
                    self.batch_copy.store(false, Ordering::Relaxed);
                }
            }
        }
        for r in runs {
            // SAFETY: both ranges lie inside mapped arenas (the plan was checked against their lengths).
            unsafe { cu!(cuMemcpyAsync(dst + r.dst_offset, src + r.src_offset, r.len as usize, s))? };
        }
        Ok(())
    }

    /// Launches the kernel on `lane`'s stream, with the page index lists as parameters for a short batch, else
    /// uploaded first. Returns the host copy of uploaded lists, which the transfer keeps until it completes.
    fn launch_kernel(
        &self,
        g: &GpuLanes,
        lane: &mut Lane,
        plan: &Plan,
        blocks: u32,
        src: u64,
        dst: u64,
    ) -> Result<Vec<u32>, DeviceError> {
        let layout = plan.kernel_layout(blocks);
        if layout.src_frames.len() <= self.config.short_launch_pages as usize {
            launch_short(g, lane, &layout, self.config.threads_per_block, src, dst)?;
            return Ok(Vec::new());
        }
        let (indices, mut p_sf, mut p_df) = upload_indices(g, lane, &layout)?;
        let mut p_src: u64 = src;
        let mut p_dst: u64 = dst;
        let mut p_items: u64 = layout.items;
        let mut p_cpp: u32 = layout.chunks_per_page;
        let mut p_wpc: u32 = layout.words_per_chunk;
        let mut params: [*mut c_void; 7] = [
            &mut p_src as *mut u64 as *mut c_void,
            &mut p_dst as *mut u64 as *mut c_void,
            &mut p_sf as *mut u64 as *mut c_void,
            &mut p_df as *mut u64 as *mut c_void,
            &mut p_items as *mut u64 as *mut c_void,
            &mut p_cpp as *mut u32 as *mut c_void,
            &mut p_wpc as *mut u32 as *mut c_void,
        ];
        // SAFETY: the parameters match `vf_page_copy(const uint4*, uint4*, const u32*, const u32*, u64, u32, u32)`;
        // every frame is inside its arena (the plan was checked), and the arenas are kept alive by the transfer.
        unsafe { g.kernel.launch(layout.grid, self.config.threads_per_block, &lane.stream, &mut params)? };
        Ok(indices)
    }
}

/// `ShortLists` of `page_copy.cu`: both index lists, by value (unused entries past the batch's pages).
#[repr(C)]
struct ShortLists {
    src: [u32; SHORT_PAGES],
    dst: [u32; SHORT_PAGES],
}

/// Launches `vf_page_copy_short` for a layout of at most [`SHORT_PAGES`] pages on `lane`'s stream.
fn launch_short(
    g: &GpuLanes,
    lane: &Lane,
    layout: &KernelLayout,
    threads: u32,
    src: u64,
    dst: u64,
) -> Result<(), DeviceError> {
    let n = layout.src_frames.len();
    if n > SHORT_PAGES || layout.dst_frames.len() != n {
        return Err(DeviceError::InvalidArgument(format!("{n} pages do not fit a short launch")));
    }
    let mut lists = ShortLists { src: [0; SHORT_PAGES], dst: [0; SHORT_PAGES] };
    lists.src[..n].copy_from_slice(&layout.src_frames);
    lists.dst[..n].copy_from_slice(&layout.dst_frames);
    let (mut p_src, mut p_dst, mut p_items) = (src, dst, layout.items);
    let (mut p_cpp, mut p_wpc) = (layout.chunks_per_page, layout.words_per_chunk);
    let mut params: [*mut c_void; 6] = [
        &mut p_src as *mut u64 as *mut c_void,
        &mut p_dst as *mut u64 as *mut c_void,
        &mut p_items as *mut u64 as *mut c_void,
        &mut p_cpp as *mut u32 as *mut c_void,
        &mut p_wpc as *mut u32 as *mut c_void,
        &mut lists as *mut ShortLists as *mut c_void,
    ];
    // SAFETY: the parameters match `vf_page_copy_short(const uint4*, uint4*, u64, u32, u32, ShortLists)`, whose
    // lists the launch copies (they may go when it returns); the kernel reads only the first `n` entries (the
    // items cover `n` pages); every frame is inside its arena (the plan was checked), and the arenas are kept
    // alive by the transfer.
    unsafe { g.short.launch(layout.grid, threads, &lane.stream, &mut params) }
}

/// Uploads a layout's page index lists to `lane`'s index buffer, in stream order. Returns the host copy of the
/// lists, which the transfer keeps until it completes, and where the two lists start on the device.
fn upload_indices(g: &GpuLanes, lane: &mut Lane, layout: &KernelLayout) -> Result<(Vec<u32>, u64, u64), DeviceError> {
    let n = layout.src_frames.len();
    let mut indices = Vec::with_capacity(2 * n);
    indices.extend_from_slice(&layout.src_frames);
    indices.extend_from_slice(&layout.dst_frames);
    let bytes = indices.len() * std::mem::size_of::<u32>();
    let buf = lane.reserve_indices(bytes)?;
    // From pinned memory the copy is queued behind the stream's work and the call returns; a list larger than
    // the staging ring goes from `indices`, which stays alive in the transfer until the stream has passed the
    // copy (the driver may make the host wait for the stream then).
    if !lane.staging.upload(&g.ctx, &lane.stream, buf, &indices)? {
        // SAFETY: `buf` holds at least `bytes`; `indices` outlives the copy (above).
        unsafe { cu!(cuMemcpyHtoDAsync_v2(buf, indices.as_ptr() as *const c_void, bytes, lane.stream.raw()))? };
    }
    Ok((indices, buf, buf + (n * std::mem::size_of::<u32>()) as u64))
}

/// Threads per block of the codec kernels: 8 warps, each packing or expanding one group at a time.
const CODEC_THREADS: u32 = 256;
/// The most blocks a codec launch takes (each loops over the groups left).
const CODEC_MAX_BLOCKS: u64 = 1024;

/// Launches the codec kernel for `plan` on `lane`'s stream; returns the index lists the transfer keeps.
fn launch_codec(
    g: &GpuLanes,
    lane: &mut Lane,
    plan: &Plan,
    coding: Coding,
    src: (u64, Location),
    dst: (u64, Location),
) -> Result<Vec<u32>, DeviceError> {
    let layout = plan.kernel_layout(1);
    let (indices, mut p_sf, mut p_df) = upload_indices(g, lane, &layout)?;
    let l = coding.lossy();
    let mut p_src = src.0;
    let mut p_dst = dst.0;
    let mut p_page: u64 = plan.page_size();
    let mut p_src_stride: u64 = src.1.frame_bytes(plan.page_size());
    let mut p_dst_stride: u64 = dst.1.frame_bytes(plan.page_size());
    let mut p_groups: u64 = plan.pages() as u64 * (plan.page_size() / (LOSSY_GROUP * l.element.bytes()) as u64);
    let mut p_elem: u32 = match l.element {
        Element::Bf16 => 0,
        Element::F32 => 1,
    };
    let mut p_code: u32 = match l.code {
        LossyCode::Fp8E4m3 => 0,
        LossyCode::Int8 => 1,
    };
    let mut params: [*mut c_void; 10] = [
        &mut p_src as *mut u64 as *mut c_void,
        &mut p_dst as *mut u64 as *mut c_void,
        &mut p_sf as *mut u64 as *mut c_void,
        &mut p_df as *mut u64 as *mut c_void,
        &mut p_page as *mut u64 as *mut c_void,
        &mut p_groups as *mut u64 as *mut c_void,
        &mut p_elem as *mut u32 as *mut c_void,
        &mut p_code as *mut u32 as *mut c_void,
        &mut p_src_stride as *mut u64 as *mut c_void,
        &mut p_dst_stride as *mut u64 as *mut c_void,
    ];
    let grid = p_groups.div_ceil(u64::from(CODEC_THREADS / 32)).clamp(1, CODEC_MAX_BLOCKS) as u32;
    let kernel = match coding {
        Coding::Pack(_) => &g.pack,
        Coding::Unpack(_) => &g.unpack,
    };
    // SAFETY: the parameters match `vf_lossy_pack` / `vf_lossy_unpack(const u8*, u8*, const u32*, const u32*,
    // u64, u64, u32, u32, u64, u64)`; every frame is inside its arena at its stride (the plan was checked against
    // the frames each holds), the pages hold whole groups and the packed side's frames hold a packed page
    // (`prepare_coded`), and the arenas are kept alive by the transfer.
    unsafe { kernel.launch(grid, CODEC_THREADS, &lane.stream, &mut params)? };
    Ok(indices)
}

fn loc_hint(l: Location) -> sys::CUmemLocation {
    match l {
        Location::Gpu(g) => {
            sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: i32::from(g) }
        }
        // Storage never reaches a mover (`plan_execution` refuses it); host is the nearest hint.
        Location::Host | Location::Storage | Location::Packed(_) | Location::Compressed => {
            sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, id: 0 }
        }
    }
}

/// Checks that an arena belongs to the CUDA device layer.
fn is_cuda_arena(a: &dyn Arena) -> bool {
    a.as_any().is::<GpuArena>() || a.as_any().is::<HostArena>()
}

impl Mover for CudaMover {
    fn submit(
        &self,
        src: &Arc<dyn Arena>,
        dst: &Arc<dyn Arena>,
        batch: &PageBatch,
        engine: EngineChoice,
    ) -> Result<Transfer, MoveError> {
        let (plan, exec) = prepare(src.as_ref(), dst.as_ref(), batch, engine, &self.config, is_cuda_arena)?;
        self.queue(src, dst, &plan, exec, None)
    }

    fn submit_coded(
        &self,
        src: &Arc<dyn Arena>,
        dst: &Arc<dyn Arena>,
        batch: &PageBatch,
        coding: Coding,
    ) -> Result<Transfer, MoveError> {
        let (plan, exec) = prepare_coded(src.as_ref(), dst.as_ref(), batch, coding, &self.config, is_cuda_arena)?;
        self.queue(src, dst, &plan, exec, Some(coding))
    }

    fn config(&self) -> &MoverConfig {
        &self.config
    }
}

impl CudaMover {
    /// Queues a checked plan on its execution's lane: copied by its engine, or coded by the codec kernels.
    fn queue(
        &self,
        src: &Arc<dyn Arena>,
        dst: &Arc<dyn Arena>,
        plan: &Plan,
        exec: Execution,
        coding: Option<Coding>,
    ) -> Result<Transfer, MoveError> {
        // Both ends reachable by the GPUs (a local client's host tier is registered at its first move).
        src.prepare_for_devices()?;
        dst.prepare_for_devices()?;
        if usize::from(exec.gpu) >= self.node.gpus.len() {
            return Err(DeviceError::NoSuchGpu { gpu: exec.gpu, count: self.node.gpus.len() }.into());
        }
        let (g, mut lane) = self.lane(&exec)?;
        g.ctx.bind()?;
        let start = Event::new(Arc::clone(&g.ctx), true)?;
        let end = Event::new(Arc::clone(&g.ctx), true)?;
        start.record(&lane.stream)?;
        let mut indices = Vec::new();
        if plan.pages() > 0 {
            match (coding, exec.engine) {
                (Some(c), _) => {
                    let (s, d) = ((src.device_ptr(), src.location()), (dst.device_ptr(), dst.location()));
                    indices = launch_codec(g, &mut lane, plan, c, s, d)?;
                }
                (None, Engine::CopyEngine) => {
                    self.copy_runs(&lane, plan, src.device_ptr(), dst.device_ptr(), src.location(), dst.location())?
                }
                (None, Engine::SmKernel) => {
                    indices = self.launch_kernel(g, &mut lane, plan, exec.blocks, src.device_ptr(), dst.device_ptr())?
                }
            }
        }
        end.record(&lane.stream)?;
        drop(lane);
        let pending =
            CudaPending { start, end, _arenas: [Arc::clone(src), Arc::clone(dst)], _indices: indices, done: false };
        Ok(Transfer::new(Box::new(pending), exec, plan))
    }
}

/// A batch queued on a stream: its two timing events, and what must stay alive until it is done.
struct CudaPending {
    start: Event,
    end: Event,
    _arenas: [Arc<dyn Arena>; 2],
    _indices: Vec<u32>,
    done: bool,
}

impl Pending for CudaPending {
    fn wait(&mut self) -> Result<Option<Duration>, MoveError> {
        self.end.synchronize()?;
        self.done = true;
        Ok(Some(self.end.elapsed_since(&self.start)?))
    }

    fn poll(&mut self) -> Result<bool, MoveError> {
        if !self.done {
            self.done = self.end.is_done()?;
        }
        Ok(self.done)
    }
}

impl Drop for CudaPending {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.end.synchronize() {
                tracing::warn!(error = %e, "waiting for a dropped transfer failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short kernel's lists are as long as the mover fills them: the committed PTX, built from
    /// `page_copy.cu`, takes both lists as one parameter of `2 x SHORT_PAGES` u32s after the other five.
    #[test]
    fn the_short_kernels_lists_match_its_ptx() {
        let lists = std::mem::size_of::<ShortLists>();
        assert_eq!(lists, 2 * SHORT_PAGES * std::mem::size_of::<u32>());
        let param = format!(".param .align 4 .b8 {PAGE_COPY_SHORT_KERNEL}_param_5[{lists}]");
        assert!(PAGE_COPY_PTX.contains(&param), "page_copy.ptx has no {param}");
        // The whole launch within the 4 KiB every CUDA version takes: three pointers or counts, two u32s.
        assert!(3 * 8 + 2 * 4 + lists <= 4096);
    }
}
