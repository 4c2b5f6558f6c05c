//! Pinned host memory, mapped for every GPU of the node.

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::GpuContext;
use super::driver::cu;
use crate::device::error::DeviceError;

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
