//! Kernel modules: PTX built with nvcc and committed, loaded with `cuModuleLoadData` (no NVRTC at run time).

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::GpuContext;
use super::driver::{cu, from_result};
use super::stream::Stream;
use crate::device::error::DeviceError;

/// A loaded module, unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
    ctx: Arc<GpuContext>,
}

// SAFETY: modules are context-wide driver objects usable from any thread.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// JIT-compiles and loads PTX text on the context's GPU.
    pub fn load_ptx(ctx: Arc<GpuContext>, ptx: &str) -> Result<Arc<Self>, DeviceError> {
        let image =
            CString::new(ptx).map_err(|_| DeviceError::InvalidArgument("PTX text contains a NUL byte".into()))?;
        ctx.bind()?;
        // SAFETY: `image` is a NUL-terminated PTX image that outlives the call.
        let raw = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(from_result("cuModuleLoadData"))?;
        Ok(Arc::new(Module { raw, ctx }))
    }

    /// Looks a kernel up by its (extern "C") name.
    pub fn kernel(self: &Arc<Self>, name: &str) -> Result<Kernel, DeviceError> {
        let cname = CString::new(name).map_err(|_| DeviceError::InvalidArgument(format!("kernel name {name:?}")))?;
        self.ctx.bind()?;
        // SAFETY: the module is live.
        let raw =
            unsafe { result::module::get_function(self.raw, cname) }.map_err(from_result("cuModuleGetFunction"))?;
        Ok(Kernel { raw, _module: Arc::clone(self) })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: loaded once, unloaded once; kernels hold an Arc of the module, so none outlives it.
        if let Err(e) = unsafe { result::module::unload(self.raw) } {
            tracing::warn!(error = ?e, "unloading a module failed");
        }
    }
}

/// A kernel of a loaded module.
#[derive(Debug)]
pub struct Kernel {
    raw: sys::CUfunction,
    _module: Arc<Module>,
}

// SAFETY: function handles are immutable driver objects.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Launches `grid` blocks of `block` threads on `stream`.
    ///
    /// # Safety
    /// `params` must point at values whose types and order match the kernel's signature, and every pointer the
    /// kernel dereferences must stay valid until the launch completes.
    pub unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), DeviceError> {
        cu!(cuLaunchKernel(
            self.raw,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut()
        ))
    }
}
