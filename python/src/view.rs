//! `vfabric.TensorView`: a lease's requested bytes as a typed, shaped tensor that NumPy and PyTorch take
//! through DLPack (`numpy.from_dlpack(view)`, `torch.from_dlpack(view)`), without a copy.
//!
//! A view only describes memory; each `__dlpack__` call exports one tensor, counted alive in the lease's state
//! until the consumer deletes it (`state::ViewGuard`). The view holds the lease's state weakly: a view of a
//! released lease exports nothing (`UnknownLease`), and views alone do not keep a lease held.

use std::sync::Weak;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use vfabric::{DeviceKind, Location};

use crate::dlpack::{self, device_type, type_code, DLDataType, DLDevice, Tensor};
use crate::errors::{value_error, UnknownLease};
use crate::host_array;
use crate::state::{LeaseState, ViewGuard};

/// An element type: its name and DLPack code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DType {
    name: &'static str,
    code: u8,
    bits: u8,
}

impl DType {
    fn itemsize(&self) -> u64 {
        u64::from(self.bits / 8)
    }

    /// NumPy's array-interface type string (little-endian), if NumPy has the type.
    fn typestr(&self) -> Option<String> {
        let kind = match self.code {
            type_code::INT => 'i',
            type_code::UINT => 'u',
            type_code::FLOAT => 'f',
            type_code::BOOL => 'b',
            _ => return None,
        };
        let order = if self.bits == 8 { '|' } else { '<' };
        Some(format!("{order}{kind}{}", self.bits / 8))
    }
}

/// The element types a view can have.
const DTYPES: &[DType] = &[
    DType { name: "uint8", code: type_code::UINT, bits: 8 },
    DType { name: "int8", code: type_code::INT, bits: 8 },
    DType { name: "uint16", code: type_code::UINT, bits: 16 },
    DType { name: "int16", code: type_code::INT, bits: 16 },
    DType { name: "uint32", code: type_code::UINT, bits: 32 },
    DType { name: "int32", code: type_code::INT, bits: 32 },
    DType { name: "uint64", code: type_code::UINT, bits: 64 },
    DType { name: "int64", code: type_code::INT, bits: 64 },
    DType { name: "float16", code: type_code::FLOAT, bits: 16 },
    DType { name: "bfloat16", code: type_code::BFLOAT, bits: 16 },
    DType { name: "float32", code: type_code::FLOAT, bits: 32 },
    DType { name: "float64", code: type_code::FLOAT, bits: 64 },
    DType { name: "bool", code: type_code::BOOL, bits: 8 },
];

/// The element type `dtype` names: a string (`"float32"`), a NumPy dtype or scalar type (`numpy.float32`), or
/// a PyTorch dtype (`torch.float32`). `None` is `uint8`.
pub fn dtype(dtype: Option<&Bound<'_, PyAny>>) -> PyResult<DType> {
    let Some(obj) = dtype else { return Ok(DTYPES[0]) };
    let name = if let Ok(s) = obj.cast::<PyString>() {
        s.to_cow()?.into_owned()
    } else if let Ok(name) = obj.getattr("__name__").and_then(|n| n.extract::<String>()) {
        name // numpy.float32, a scalar type
    } else if let Ok(name) = obj.getattr("name").and_then(|n| n.extract::<String>()) {
        name // numpy.dtype("float32")
    } else {
        obj.str()?.to_cow()?.into_owned() // torch.float32 prints as "torch.float32"
    };
    let bare = name.strip_prefix("torch.").unwrap_or(&name);
    DTYPES.iter().copied().find(|d| d.name == bare).ok_or_else(|| {
        let known: Vec<&str> = DTYPES.iter().map(|d| d.name).collect();
        value_error(format!("unsupported dtype {name:?}: use one of {}", known.join(", ")))
    })
}

/// The shape of a view of `nbytes` bytes of `dtype`: `shape` (an int or a sequence of ints, one of which may be
/// -1 to be inferred), or one dimension over all the bytes. Its elements must cover the bytes exactly.
pub fn shape(shape: Option<&Bound<'_, PyAny>>, nbytes: u64, dtype: &DType) -> PyResult<Vec<i64>> {
    let size = dtype.itemsize();
    if nbytes % size != 0 {
        return Err(value_error(format!(
            "{nbytes} bytes are not a whole number of {} ({size} bytes each)",
            dtype.name
        )));
    }
    let count = nbytes / size;
    let Some(shape) = shape else { return Ok(vec![count as i64]) };
    let mut dims: Vec<i64> = match shape.extract::<i64>() {
        Ok(n) => vec![n],
        Err(_) => shape.extract().map_err(|_| value_error("shape must be an int or a sequence of ints"))?,
    };
    if dims.iter().any(|&d| d < -1) || dims.iter().filter(|&&d| d == -1).count() > 1 {
        return Err(value_error(format!("invalid shape {dims:?}: dimensions are >= 0, with at most one -1")));
    }
    let known: u64 =
        dims.iter().filter(|&&d| d >= 0).map(|&d| d as u64).try_fold(1u64, |a, d| a.checked_mul(d)).unwrap_or(u64::MAX);
    if let Some(free) = dims.iter_mut().find(|d| **d == -1) {
        if known == 0 || count % known != 0 {
            return Err(value_error(format!("cannot infer -1 in shape: {count} {} elements", dtype.name)));
        }
        *free = (count / known) as i64;
    } else if known != count {
        return Err(value_error(format!(
            "shape {dims:?} holds {known} {} elements, but the requested {nbytes} bytes hold {count}",
            dtype.name
        )));
    }
    Ok(dims)
}

/// The DLPack device of a lease's pages: a CUDA GPU's memory, or host memory (the "host" device, and every
/// device of the emulated layer, whose GPUs are host memory).
pub fn dl_device(kind: DeviceKind, location: Location) -> DLDevice {
    match (kind, location) {
        (DeviceKind::Cuda, Location::Gpu(gpu)) => {
            DLDevice { device_type: device_type::CUDA, device_id: i32::from(gpu) }
        }
        _ => DLDevice { device_type: device_type::CPU, device_id: 0 },
    }
}

/// A typed, shaped view of a lease's requested bytes, for `numpy.from_dlpack` / `torch.from_dlpack`.
///
/// Every array made from it counts against its lease: the lease cannot be released while one is alive. A view
/// of a released lease raises `UnknownLease` when exported. Views of read leases export read-only tensors to
/// consumers that understand DLPack 1.0's flags.
#[pyclass(name = "TensorView", module = "vfabric", frozen)]
pub struct PyTensorView {
    state: Weak<LeaseState>,
    data: u64,
    device: DLDevice,
    dtype: DType,
    shape: Vec<i64>,
    read_only: bool,
}

impl PyTensorView {
    /// A view of `shape` `dtype` elements at `data` on `device`, under the lease whose state is `state`.
    pub fn new(
        state: Weak<LeaseState>,
        data: u64,
        device: DLDevice,
        dtype: DType,
        shape: Vec<i64>,
        read_only: bool,
    ) -> Self {
        PyTensorView { state, data, device, dtype, shape, read_only }
    }

    /// One more tensor alive over the view's lease, if it is still held.
    fn export(&self) -> PyResult<ViewGuard> {
        let guard = self.state.upgrade().and_then(|s| s.export());
        guard.ok_or_else(|| UnknownLease::err("the view's lease was released"))
    }

    /// The view as a NumPy array (host memory only), counted against its lease like a DLPack tensor.
    pub fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.device.device_type != device_type::CPU {
            return Err(value_error(format!(
                "the lease is on CUDA GPU {}: NumPy cannot use GPU memory; use torch.from_dlpack(lease.view(...)) \
                 or lease the region on \"host\"",
                self.device.device_id
            )));
        }
        let typestr = self.dtype.typestr().ok_or_else(|| value_error(format!("NumPy has no {}", self.dtype.name)))?;
        host_array::numpy_array(py, self.data, &typestr, &self.shape, self.read_only, self.export()?)
    }
}

#[pymethods]
impl PyTensorView {
    /// Exports the view as a DLPack capsule (the consumer's side of `from_dlpack`). The memory is ready when
    /// the lease is granted, so `stream` needs no synchronisation; `max_version` >= 1 gets the versioned form,
    /// which can mark a read lease's memory read-only. Views never copy: `copy=True`, or a `dl_device` other
    /// than the view's, raises `BufferError`.
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        if copy == Some(true) {
            return Err(PyBufferError::new_err("vfabric views are zero-copy: copy=True is not supported"));
        }
        if let Some((device_type, device_id)) = dl_device {
            if (device_type, device_id) != (self.device.device_type, self.device.device_id) {
                return Err(PyBufferError::new_err(format!(
                    "the view is on DLPack device {:?}, not ({device_type}, {device_id}): vfabric views never copy",
                    (self.device.device_type, self.device.device_id)
                )));
            }
        }
        let guard = self.export()?;
        let tensor = Tensor {
            data: self.data,
            device: self.device,
            dtype: DLDataType { code: self.dtype.code, bits: self.dtype.bits, lanes: 1 },
            shape: self.shape.clone(),
            read_only: self.read_only,
        };
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        dlpack::capsule(py, tensor, versioned, Box::new(guard))
    }

    /// `(device_type, device_id)` in DLPack's numbering: `(1, 0)` for host memory, `(2, gpu)` for a CUDA GPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.device.device_type, self.device.device_id)
    }

    /// The view's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The element type's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name
    }

    /// The bytes the view covers.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product::<u64>() * self.dtype.itemsize()
    }

    /// The address of its first element.
    #[getter]
    fn ptr(&self) -> u64 {
        self.data
    }

    /// Whether it is a read lease's memory.
    #[getter]
    fn read_only(&self) -> bool {
        self.read_only
    }

    fn __repr__(&self) -> String {
        let device = match self.device.device_type {
            device_type::CUDA => format!("cuda:{}", self.device.device_id),
            _ => "cpu".to_string(),
        };
        format!("TensorView(shape={:?}, dtype={}, device={device}, ptr={:#x})", self.shape, self.dtype.name, self.data)
    }
}
