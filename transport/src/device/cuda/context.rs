//! GPU contexts: the primary context of each GPU, retained for as long as the node uses it.

use cudarc::driver::{result, sys};

use super::driver::{cu, from_result};
use crate::device::error::DeviceError;

/// The primary context of one GPU, retained on creation and released on drop.
///
/// Every object of the device layer that lives on a GPU holds an `Arc` of its context, so the context outlives
/// the arenas, streams and modules made in it.
#[derive(Debug)]
pub struct GpuContext {
    gpu: u16,
    device: sys::CUdevice,
    raw: sys::CUcontext,
}

// SAFETY: a primary context is a process-wide driver object; the driver API may use it from any thread.
unsafe impl Send for GpuContext {}
// SAFETY: as above; `bind` only sets the calling thread's current context.
unsafe impl Sync for GpuContext {}

impl GpuContext {
    /// Retains the primary context of GPU `gpu`. The driver must be initialised.
    pub fn retain(gpu: u16) -> Result<Self, DeviceError> {
        let device = result::device::get(i32::from(gpu)).map_err(from_result("cuDeviceGet"))?;
        // SAFETY: `device` is a valid device handle from cuDeviceGet.
        let raw = unsafe { result::primary_ctx::retain(device) }.map_err(from_result("cuDevicePrimaryCtxRetain"))?;
        Ok(GpuContext { gpu, device, raw })
    }

    /// The GPU's index.
    pub fn gpu(&self) -> u16 {
        self.gpu
    }

    /// The driver's device handle.
    pub fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// The raw handle, for driver calls that name a context (peer copies).
    pub fn raw(&self) -> sys::CUcontext {
        self.raw
    }

    /// Makes this context current on the calling thread; driver calls that follow act on this GPU.
    pub fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: `raw` is a retained primary context, valid until drop.
        unsafe { cu!(cuCtxSetCurrent(self.raw)) }
    }

    /// Waits for all work on this GPU.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.bind()?;
        // SAFETY: a context is current.
        unsafe { cu!(cuCtxSynchronize()) }
    }

    /// Reads an integer attribute of the device.
    pub fn attribute(&self, attr: sys::CUdevice_attribute) -> Result<i32, DeviceError> {
        // SAFETY: `device` is valid.
        unsafe { result::device::get_attribute(self.device, attr) }.map_err(from_result("cuDeviceGetAttribute"))
    }
}

impl Drop for GpuContext {
    fn drop(&mut self) {
        // SAFETY: the context was retained in `retain` and is released once.
        if let Err(e) = unsafe { result::primary_ctx::release(self.device) } {
            tracing::warn!(gpu = self.gpu, error = ?e, "cuDevicePrimaryCtxRelease failed");
        }
    }
}
