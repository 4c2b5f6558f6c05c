//! `vfabric.Region`: a region's handle, a name and not memory. It can cross process boundaries (a tuple of five
//! integers, or a pickle) so ranks can hand regions to each other; the fabric checks a handle before using it,
//! so a stale or forged one is refused (`UseAfterFree`, `InvalidAddress`), never followed.

use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};
use vfabric::proto::WireRegion;
use vfabric::Region;

use crate::errors::value_error;

/// A region of the fabric's address space.
///
/// Returned by `alloc`; passed to every other call. Regions compare equal and hash alike when they name the
/// same allocation. `to_tuple()` / `Region.from_tuple()` (and pickle) carry one to another process.
#[pyclass(name = "Region", module = "vfabric", frozen, eq, hash, from_py_object)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyRegion {
    pub region: Region,
}

impl PyRegion {
    /// The tuple's fields: address, bytes, page size, slot, generation.
    fn parts(&self) -> (u64, u64, u64, u32, u64) {
        let w = WireRegion::from(&self.region);
        (w.addr, w.len, w.page_size, w.slot, w.generation)
    }

    /// A region from its parts, checked for what a handle of any fabric satisfies.
    fn from_parts(addr: u64, nbytes: u64, page_size: u64, slot: u32, generation: u64) -> PyResult<PyRegion> {
        if !page_size.is_power_of_two() {
            return Err(value_error(format!("page_size {page_size} is not a power of two")));
        }
        if nbytes == 0 || nbytes % page_size != 0 {
            return Err(value_error(format!(
                "nbytes {nbytes} is not a positive multiple of the page size {page_size}"
            )));
        }
        let wire = WireRegion { addr, len: nbytes, page_size, slot, generation };
        Ok(PyRegion { region: Region::from(&wire) })
    }
}

#[pymethods]
impl PyRegion {
    /// Rebuilds a region from `to_tuple()`'s five integers: `(addr, nbytes, page_size, slot, generation)`.
    #[new]
    fn new(addr: u64, nbytes: u64, page_size: u64, slot: u32, generation: u64) -> PyResult<PyRegion> {
        PyRegion::from_parts(addr, nbytes, page_size, slot, generation)
    }

    /// The region as five integers, `(addr, nbytes, page_size, slot, generation)`: what another process needs
    /// to name it (`Region.from_tuple`).
    fn to_tuple<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.parts().into_pyobject(py)
    }

    /// The region a `to_tuple()` describes. Raises `ValueError` for a tuple no region could have.
    #[classmethod]
    fn from_tuple(_cls: &Bound<'_, PyType>, parts: &Bound<'_, PyAny>) -> PyResult<PyRegion> {
        let (addr, nbytes, page_size, slot, generation): (u64, u64, u64, u32, u64) = parts.extract().map_err(|_| {
            value_error("a region tuple is five non-negative integers: (addr, nbytes, page_size, slot, generation)")
        })?;
        PyRegion::from_parts(addr, nbytes, page_size, slot, generation)
    }

    /// Pickles as `Region(*region.to_tuple())`.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyType>, Bound<'py, PyTuple>)> {
        Ok((py.get_type::<PyRegion>(), self.to_tuple(py)?))
    }

    /// The region's size in bytes (whole pages).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.region.len
    }

    /// The page size of the region, in bytes.
    #[getter]
    fn page_size(&self) -> u64 {
        self.region.page_size
    }

    /// The region's first global address (the home node in the high 16 bits).
    #[getter]
    fn addr(&self) -> u64 {
        self.region.addr.raw()
    }

    /// The node the region was allocated on (its home).
    #[getter]
    fn node(&self) -> u16 {
        self.region.addr.node().0
    }

    fn __repr__(&self) -> String {
        format!(
            "Region(addr={:#x}, node={}, nbytes={}, page_size={})",
            self.region.addr.raw(),
            self.region.addr.node().0,
            self.region.len,
            self.region.page_size
        )
    }
}
