//! `Lease.numpy()`: a NumPy array over a lease's host memory through NumPy's array interface, which every NumPy
//! takes writable (`numpy.from_dlpack` gives read-only arrays from DLPack 0.8 capsules, which NumPy before 2.1
//! is limited to, so on Python 3.9 an array it made could not be written).
//!
//! The array's base is a [`PyHostMemory`]: the object whose `__array_interface__` NumPy read, holding the
//! lease's [`ViewGuard`]. NumPy keeps its base alive as long as the array (and every array viewing it), so the
//! array counts against its lease exactly as a DLPack tensor does.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::state::ViewGuard;

/// A lease's host memory as NumPy's array interface (version 3), alive while an array made from it is.
#[pyclass(name = "HostMemory", module = "vfabric", frozen)]
pub struct PyHostMemory {
    interface: Py<PyDict>,
    _guard: ViewGuard,
}

#[pymethods]
impl PyHostMemory {
    /// The array interface: address, read-only flag, type string and shape.
    #[getter]
    fn __array_interface__(&self, py: Python<'_>) -> Py<PyDict> {
        self.interface.clone_ref(py)
    }
}

/// A NumPy array of `shape` elements of `typestr` (an array-interface type string such as `"<f4"`) at host
/// address `data`, read-only when `read_only`, counted alive by `guard` until NumPy frees it.
pub fn numpy_array<'py>(
    py: Python<'py>,
    data: u64,
    typestr: &str,
    shape: &[i64],
    read_only: bool,
    guard: ViewGuard,
) -> PyResult<Bound<'py, PyAny>> {
    let numpy = py.import("numpy")?;
    let interface = PyDict::new(py);
    interface.set_item("version", 3)?;
    interface.set_item("data", (data, read_only))?;
    interface.set_item("typestr", typestr)?;
    interface.set_item("shape", PyTuple::new(py, shape)?)?;
    let memory = Bound::new(py, PyHostMemory { interface: interface.unbind(), _guard: guard })?;
    numpy.call_method1("asarray", (memory,))
}
