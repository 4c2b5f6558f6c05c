//! Pinned host memory, mapped for every GPU of the node: private ([`PinnedHostMemory`], for staging buffers)
//! or shared with the node's other processes ([`RegisteredHostMemory`], the host tier).

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use super::context::GpuContext;
use super::driver::cu;
use crate::device::error::DeviceError;
use crate::device::shared_memory::SharedHostMemory;

/// Page-locked host memory from `cuMemHostAlloc`, portable (every context may use it) and mapped into the
/// unified address space, so copy engines reach it at PCIe speed and kernels can load and store it directly.
#[derive(Debug)]
pub struct PinnedHostMemory {
    ptr: *mut u8,
    len: usize,
    device_ptr: u64,
    ctx: Arc<GpuContext>,
}

// SAFETY: the memory is plain host memory owned by this value; access is through raw pointers whose use the
// arena above synchronises.
unsafe impl Send for PinnedHostMemory {}
// SAFETY: as above.
unsafe impl Sync for PinnedHostMemory {}

impl PinnedHostMemory {
    /// Allocates and pins `len` bytes.
    pub fn alloc(ctx: Arc<GpuContext>, len: u64) -> Result<Self, DeviceError> {
        ctx.bind()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: `p` is a valid out pointer.
        unsafe { cu!(cuMemHostAlloc(&mut p, len as usize, flags))? };
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `p` was just allocated with DEVICEMAP.
        let got = unsafe { cu!(cuMemHostGetDevicePointer_v2(&mut dptr, p, 0)) };
        if let Err(e) = got {
            // SAFETY: allocated above, freed once.
            unsafe {
                let _ = cu!(cuMemFreeHost(p));
            }
            return Err(e);
        }
        Ok(PinnedHostMemory { ptr: p as *mut u8, len: len as usize, device_ptr: dptr, ctx })
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The address kernels use (equal to the host address under unified addressing).
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedHostMemory {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: allocated in `alloc`, freed once.
        if let Err(e) = unsafe { cu!(cuMemFreeHost(self.ptr as *mut std::ffi::c_void)) } {
            tracing::warn!(error = %e, "freeing pinned host memory failed");
        }
    }
}

/// At most this many threads fault a host tier's pages in before it is registered (a bound, so that a host
/// with hundreds of cores does not start hundreds of threads for it).
const POPULATE_THREADS: usize = 16;

/// Shared host memory ([`SharedHostMemory`]: another process of the node may map the same file) page-locked and
/// mapped for every GPU with `cuMemHostRegister`: to the copy engines and kernels the same as
/// [`PinnedHostMemory`], and shareable. The agent registers its host tier at once; a local client registers its
/// mapping of it only when it first needs the GPUs to reach it (pinning a large tier takes a while, and most
/// clients lease GPU pages only).
#[derive(Debug)]
pub struct RegisteredHostMemory {
    // Unregistered (in `drop`) before the mapping goes.
    mem: SharedHostMemory,
    /// The device address, once registered.
    registered: OnceLock<u64>,
    /// Held while registering, so two threads never register the same range.
    registering: Mutex<()>,
    ctx: Arc<GpuContext>,
}

impl RegisteredHostMemory {
    /// Page-locks and maps `mem` for every GPU of the node, now.
    pub fn register(ctx: Arc<GpuContext>, mem: SharedHostMemory) -> Result<Self, DeviceError> {
        let m = Self::lazy(ctx, mem);
        m.ensure_registered()?;
        Ok(m)
    }

    /// `mem`, to be registered at its first [`RegisteredHostMemory::ensure_registered`].
    pub fn lazy(ctx: Arc<GpuContext>, mem: SharedHostMemory) -> Self {
        RegisteredHostMemory { mem, registered: OnceLock::new(), registering: Mutex::new(()), ctx }
    }

    /// Registers the memory unless it is; returns its device address.
    pub fn ensure_registered(&self) -> Result<u64, DeviceError> {
        if let Some(&d) = self.registered.get() {
            return Ok(d);
        }
        let _one = self.registering.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&d) = self.registered.get() {
            return Ok(d);
        }
        self.ctx.bind()?;
        // The pages faulted in by every core first: the driver's registration does it on one thread.
        let t = std::time::Instant::now();
        let threads = std::thread::available_parallelism().map_or(1, usize::from).min(POPULATE_THREADS);
        self.mem.populate(threads)?;
        let populated = t.elapsed();
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        let p = self.mem.as_ptr() as *mut std::ffi::c_void;
        // SAFETY: `p..p+len` is a live mapping owned by `mem`, which outlives the registration.
        unsafe { cu!(cuMemHostRegister_v2(p, self.mem.len() as usize, flags))? };
        tracing::info!(
            bytes = self.mem.len(),
            threads,
            populate_s = populated.as_secs_f64(),
            register_s = (t.elapsed() - populated).as_secs_f64(),
            "host memory pinned"
        );
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `p` was just registered with DEVICEMAP.
        if let Err(e) = unsafe { cu!(cuMemHostGetDevicePointer_v2(&mut dptr, p, 0)) } {
            // SAFETY: registered above, unregistered once.
            unsafe {
                let _ = cu!(cuMemHostUnregister(p));
            }
            return Err(e);
        }
        let _ = self.registered.set(dptr);
        Ok(dptr)
    }

    /// The shared memory underneath.
    pub fn shared(&self) -> &SharedHostMemory {
        &self.mem
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// The address kernels use: under unified addressing the host address, which the driver gives back once
    /// registered.
    pub fn device_ptr(&self) -> u64 {
        self.registered.get().copied().unwrap_or(self.mem.as_ptr() as u64)
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.mem.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }
}

impl Drop for RegisteredHostMemory {
    fn drop(&mut self) {
        if self.registered.get().is_none() {
            return;
        }
        let _ = self.ctx.bind();
        // SAFETY: registered in `ensure_registered`, unregistered once, before `mem` unmaps.
        if let Err(e) = unsafe { cu!(cuMemHostUnregister(self.mem.as_ptr() as *mut std::ffi::c_void)) } {
            tracing::warn!(error = %e, "unregistering shared host memory failed");
        }
    }
}
