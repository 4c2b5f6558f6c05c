//! Waiting for a GPU's queued work, for the embedded fabric on CUDA: before a lease's pages may move, every
//! kernel this process queued on them (PyTorch's, a user's) must have finished.
//!
//! The fabric and PyTorch both use each GPU's primary context, so synchronising that context waits for every
//! stream of the process on the GPU. The context is pushed for the call and popped after it, so the calling
//! thread's current context (PyTorch's choice) is left as it was.

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use vfabric::DeviceError;

/// Waits until all work queued in this process on GPU `gpu` is done.
pub fn synchronize(gpu: u16) -> Result<(), DeviceError> {
    result::init().map_err(named("cuInit"))?;
    let device = result::device::get(i32::from(gpu)).map_err(named("cuDeviceGet"))?;
    // SAFETY: retaining and releasing the primary context are balanced below; the fabric holds its own
    // reference, so the context outlives this call either way.
    let ctx = unsafe { result::primary_ctx::retain(device) }.map_err(named("cuDevicePrimaryCtxRetain"))?;
    // SAFETY: `ctx` is a retained context; pushing it is undone by the pop below on every path.
    let synced = unsafe {
        check("cuCtxPushCurrent", sys::cuCtxPushCurrent_v2(ctx)).and_then(|()| {
            let synced = check("cuCtxSynchronize", sys::cuCtxSynchronize());
            let mut popped = std::ptr::null_mut();
            synced.and(check("cuCtxPopCurrent", sys::cuCtxPopCurrent_v2(&mut popped)))
        })
    };
    // SAFETY: balances the retain above.
    let released = unsafe { result::primary_ctx::release(device) }.map_err(named("cuDevicePrimaryCtxRelease"));
    synced.and(released)
}

/// A driver error as the device layer reports it, naming the call.
fn named(call: &'static str) -> impl FnOnce(DriverError) -> DeviceError {
    move |e| error(call, e.0)
}

fn check(call: &'static str, code: sys::CUresult) -> Result<(), DeviceError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error(call, code))
    }
}

fn error(call: &'static str, code: sys::CUresult) -> DeviceError {
    let e = DriverError(code);
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{code:?}"));
    let description = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    DeviceError::Cuda { call, code: code as u32, name, description }
}
