//! DLPack: the C structures that hand a tensor's memory to NumPy or PyTorch without a copy, and the capsules
//! that carry them.
//!
//! Two forms exist. The legacy `DLManagedTensor` (DLPack 0.8) travels in a capsule named `"dltensor"`; the
//! versioned `DLManagedTensorVersioned` (DLPack 1.x, which can mark memory read-only) in one named
//! `"dltensor_versioned"`. A consumer that takes the tensor renames the capsule (`"used_dltensor"`,
//! `"used_dltensor_versioned"`) and from then on owns it: it calls the tensor's deleter when its array dies. A
//! capsule that still has its first name when it is destroyed was never consumed, so its destructor calls the
//! deleter itself; one that was renamed must not be touched.
//!
//! Each exported tensor is one heap block ([`Exported`]): the DLPack struct first (so a pointer to the block
//! is a pointer to it), then the shape and strides it points into, then what keeps the memory valid (the
//! caller's `keep`, dropped by the deleter).

use std::ffi::{c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;

/// `DLDeviceType`: where the memory is.
pub mod device_type {
    /// Host memory.
    pub const CPU: i32 = 1;
    /// A CUDA GPU's memory.
    pub const CUDA: i32 = 2;
}

/// `DLDataTypeCode`.
pub mod type_code {
    /// Signed integers.
    pub const INT: u8 = 0;
    /// Unsigned integers.
    pub const UINT: u8 = 1;
    /// IEEE floats.
    pub const FLOAT: u8 = 2;
    /// bfloat16.
    pub const BFLOAT: u8 = 4;
    /// Booleans.
    pub const BOOL: u8 = 6;
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the memory.
const FLAG_READ_ONLY: u64 = 1;

/// The DLPack version the versioned form declares.
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// A `device_type` constant.
    pub device_type: i32,
    /// The device's ordinal (the GPU's index; 0 for the host).
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// A `type_code` constant.
    pub code: u8,
    /// Bits per element.
    pub bits: u8,
    /// Vector lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (DLPack 0.8).
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.x).
#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// One exported tensor: the DLPack struct `M`, the arrays it points into, and what keeps its memory valid.
#[repr(C)]
struct Exported<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _keep: Box<dyn Send>,
}

/// A tensor to export: where its bytes are and how to read them.
pub struct Tensor {
    /// Address of the first element.
    pub data: u64,
    /// Its device.
    pub device: DLDevice,
    /// Element type.
    pub dtype: DLDataType,
    /// Dimensions (row-major, compact).
    pub shape: Vec<i64>,
    /// Whether consumers must not write it (only the versioned form can say so).
    pub read_only: bool,
}

impl Tensor {
    /// Row-major strides, in elements.
    fn strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.shape.len()];
        for i in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.shape[i + 1].max(1);
        }
        strides
    }
}

/// Wraps `tensor` in a DLPack capsule: the versioned form when `versioned`, the legacy one otherwise. `keep` is
/// dropped when the consumer is done with the memory (or when the capsule dies unconsumed), from whichever
/// thread that happens on, with or without the GIL.
pub fn capsule<'py>(
    py: Python<'py>,
    tensor: Tensor,
    versioned: bool,
    keep: Box<dyn Send>,
) -> PyResult<Bound<'py, PyAny>> {
    let dl_tensor = DLTensor {
        data: tensor.data as *mut c_void,
        device: tensor.device,
        ndim: tensor.shape.len() as i32,
        dtype: tensor.dtype,
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    if versioned {
        let managed = DLManagedTensorVersioned {
            version: VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: if tensor.read_only { FLAG_READ_ONLY } else { 0 },
            dl_tensor,
        };
        let raw = Exported::leak(managed, &tensor, keep, |m| &mut m.dl_tensor);
        // SAFETY: `raw` is a block of this type; the capsule's destructor or the consumer frees it, exactly once.
        unsafe { wrap(py, raw.cast(), VERSIONED_NAME, destroy_versioned_capsule, || delete_versioned(raw.cast())) }
    } else {
        let managed = DLManagedTensor { dl_tensor, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_legacy) };
        let raw = Exported::leak(managed, &tensor, keep, |m| &mut m.dl_tensor);
        // SAFETY: as above.
        unsafe { wrap(py, raw.cast(), LEGACY_NAME, destroy_legacy_capsule, || delete_legacy(raw.cast())) }
    }
}

impl<M> Exported<M> {
    /// The block on the heap, its tensor pointing at its own shape and strides, handed over as a raw pointer.
    fn leak(managed: M, tensor: &Tensor, keep: Box<dyn Send>, dl: fn(&mut M) -> &mut DLTensor) -> *mut Self {
        let mut block =
            Box::new(Exported { managed, shape: tensor.shape.clone(), strides: tensor.strides(), _keep: keep });
        let b = &mut *block;
        // The vectors' heap buffers stay where they are when the block moves: pointing into them is stable.
        let t = dl(&mut b.managed);
        t.shape = b.shape.as_mut_ptr();
        t.strides = b.strides.as_mut_ptr();
        Box::into_raw(block)
    }
}

/// A capsule named `name` around `ptr`, destroyed by `destructor`; if the capsule cannot be made, `free` frees
/// the block instead.
///
/// # Safety
/// `ptr` must be a block `free` and `destructor` know how to free, not yet owned by anything else.
unsafe fn wrap<'py>(
    py: Python<'py>,
    ptr: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
    free: impl FnOnce(),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `name` is 'static, as the capsule API requires.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if capsule.is_null() {
        free();
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference, just checked non-null.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// The legacy tensor's deleter: frees the block (and with it what kept the memory).
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        // SAFETY: every DLManagedTensor with this deleter is the first field of an `Exported` made by `capsule`,
        // and DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(managed.cast::<Exported<DLManagedTensor>>()) });
    }
}

/// The versioned tensor's deleter.
unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if !managed.is_null() {
        // SAFETY: as in `delete_legacy`.
        drop(unsafe { Box::from_raw(managed.cast::<Exported<DLManagedTensorVersioned>>()) });
    }
}

/// A legacy capsule's destructor: frees the tensor only if no consumer took it (the name is unchanged).
unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed; `PyCapsule_IsValid` sets no exception.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            delete_legacy(ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()).cast());
        }
    }
}

/// A versioned capsule's destructor: frees the tensor only if no consumer took it.
unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_legacy_capsule`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
            delete_versioned(ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr()).cast());
        }
    }
}
