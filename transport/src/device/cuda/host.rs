//! Pinned host memory, mapped for every GPU of the node: private ([`PinnedHostMemory`], for staging buffers)
//! or shared with the node's other processes ([`RegisteredHostMemory`], the host tier).

use std::sync::Arc;

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

/// Shared host memory ([`SharedHostMemory`]: another process of the node may map the same file) page-locked and
/// mapped for every GPU with `cuMemHostRegister`: to the copy engines and kernels the same as
/// [`PinnedHostMemory`], and shareable.
#[derive(Debug)]
pub struct RegisteredHostMemory {
    // Unregistered (in `drop`) before the mapping goes.
    mem: SharedHostMemory,
    device_ptr: u64,
    ctx: Arc<GpuContext>,
}

impl RegisteredHostMemory {
    /// Page-locks and maps `mem` for every GPU of the node.
    pub fn register(ctx: Arc<GpuContext>, mem: SharedHostMemory) -> Result<Self, DeviceError> {
        ctx.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        let p = mem.as_ptr() as *mut std::ffi::c_void;
        // SAFETY: `p..p+len` is a live mapping owned by `mem`, which outlives the registration.
        unsafe { cu!(cuMemHostRegister_v2(p, mem.len() as usize, flags))? };
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `p` was just registered with DEVICEMAP.
        if let Err(e) = unsafe { cu!(cuMemHostGetDevicePointer_v2(&mut dptr, p, 0)) } {
            // SAFETY: registered above, unregistered once.
            unsafe {
                let _ = cu!(cuMemHostUnregister(p));
            }
            return Err(e);
        }
        Ok(RegisteredHostMemory { mem, device_ptr: dptr, ctx })
    }

    /// The shared memory underneath.
    pub fn shared(&self) -> &SharedHostMemory {
        &self.mem
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// The address kernels use (equal to the host address under unified addressing).
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
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
        let _ = self.ctx.bind();
        // SAFETY: registered in `register`, unregistered once, before `mem` unmaps.
        if let Err(e) = unsafe { cu!(cuMemHostUnregister(self.mem.as_ptr() as *mut std::ffi::c_void)) } {
            tracing::warn!(error = %e, "unregistering shared host memory failed");
        }
    }
}
