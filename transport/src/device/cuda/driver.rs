//! The result layer: CUDA driver calls checked and turned into [`DeviceError`]s.
//!
//! cudarc's own `result` layer covers contexts, streams, events and modules, and those are used where they
//! exist; the virtual-memory calls (reserve, create, map, set access, export, import) and batched copies are
//! called through `cudarc::driver::sys` here, each through `cu!` so the failing call is named in the error.

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

use crate::device::error::DeviceError;

/// Turns a `CUresult` from `call` into an error, with the driver's name and description for it.
pub(crate) fn error(call: &'static str, code: sys::CUresult) -> DeviceError {
    let e = DriverError(code);
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{code:?}"));
    let description = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    DeviceError::Cuda { call, code: code as u32, name, description }
}

/// `Ok(())` for `CUDA_SUCCESS`, the named error otherwise.
pub(crate) fn check(call: &'static str, code: sys::CUresult) -> Result<(), DeviceError> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error(call, code))
    }
}

/// Maps an error of cudarc's result layer, naming the call.
pub(crate) fn from_result(call: &'static str) -> impl FnOnce(DriverError) -> DeviceError {
    move |e| error(call, e.0)
}

/// `cu!(cuFoo(a, b))` calls `sys::cuFoo(a, b)` and checks its result, naming `cuFoo` in the error. Use it inside
/// an `unsafe` block: the call's own safety conditions are the caller's to uphold.
macro_rules! cu {
    ($f:ident ( $($a:expr),* $(,)? )) => {
        $crate::device::cuda::driver::check(stringify!($f), cudarc::driver::sys::$f($($a),*))
    };
}
pub(crate) use cu;

/// Whether the CUDA driver library can be loaded. Never panics: cudarc's loader panics when the library is
/// missing, so every entry into the driver goes through this check first.
pub fn driver_present() -> bool {
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Whether NCCL's library can be loaded.
pub fn nccl_present() -> bool {
    std::panic::catch_unwind(|| unsafe { cudarc::nccl::sys::is_culib_present() }).unwrap_or(false)
}

/// Loads and initialises the driver.
pub(crate) fn init() -> Result<(), DeviceError> {
    if !driver_present() {
        return Err(DeviceError::DriverMissing);
    }
    cudarc::driver::result::init().map_err(from_result("cuInit"))
}

/// Whether the loaded driver exports `name`. cudarc panics on a missing symbol at its first call, so entry
/// points newer than the oldest supported driver are looked up before they are used.
pub(crate) fn has_symbol(name: &str) -> bool {
    if !driver_present() {
        return false;
    }
    // SAFETY: the library is present (checked above); looking a symbol up has no side effects, and the
    // returned symbol is dropped without being called.
    unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()).is_ok() }
}
