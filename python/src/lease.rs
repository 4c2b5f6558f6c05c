//! `vfabric.Lease`: a held lease as Python sees it: where the requested bytes are, views of them, and its
//! release (the rule that arrays never outlive the lease is `state`'s).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyType;
use vfabric::{DeviceKind, LeasePtr, Location, Mode, Region};

use crate::args;
use crate::backend::{Backend, HeldLease};
use crate::errors::{to_py, LeaseInUse, NotContiguous, UnknownLease};
use crate::region::PyRegion;
use crate::state::{LeaseState, ReleaseError};
use crate::view::{self, PyTensorView};

/// The address of region bytes `at .. at + len` under a lease that starts at region offset `lease_offset`, if
/// they sit one after the other on the device (`at >= lease_offset`, and the range inside the lease).
/// `Err(index of the first page)` when they do not.
pub fn address(ptr: &LeasePtr, lease_offset: u64, page_size: u64, at: u64, len: u64) -> Result<u64, u64> {
    let rel = at - lease_offset;
    match ptr {
        LeasePtr::Contiguous { ptr, .. } => Ok(ptr + rel),
        LeasePtr::Pages(pages) => {
            let first = (rel / page_size) as usize;
            let last = if len == 0 { first } else { ((rel + len - 1) / page_size) as usize };
            match pages.get(first..=last) {
                Some(run) if run.windows(2).all(|w| w[1] == w[0] + page_size) => Ok(run[0] + rel % page_size),
                Some(_) => Err(first as u64),
                // Nothing under the lease there: only an empty range at its very end gets here.
                None => Ok(pages.last().map_or(0, |p| p + page_size)),
            }
        }
    }
}

/// A held lease: the right to use a byte range of a region on one device, at fixed addresses, until released.
///
/// Use it as a context manager (`with fabric.acquire(...) as lease:`) or call `release()`. `ptr` is the address
/// of the first requested byte; `view()` / `numpy()` give zero-copy arrays over the requested bytes (DLPack).
/// Arrays made from a lease must be deleted before it is released.
#[pyclass(name = "Lease", module = "vfabric", frozen)]
pub struct PyLease {
    state: Arc<LeaseState>,
    region: Region,
    offset: u64,
    nbytes: u64,
    device: Location,
    mode: Mode,
    device_kind: DeviceKind,
    lease_offset: u64,
    lease_len: u64,
    ptr: LeasePtr,
}

impl PyLease {
    /// The Python lease over `lease`, for the requested `offset .. offset + nbytes` of `region`.
    pub fn new(backend: Arc<dyn Backend>, lease: Box<dyn HeldLease>, region: Region, offset: u64, nbytes: u64) -> Self {
        let (device, mode, lease_offset, lease_len) = (lease.device(), lease.mode(), lease.offset(), lease.len());
        let ptr = lease.ptr().clone();
        let device_kind = backend.device_kind();
        PyLease {
            state: LeaseState::new(backend, lease),
            region,
            offset,
            nbytes,
            device,
            mode,
            device_kind,
            lease_offset,
            lease_len,
            ptr,
        }
    }

    fn check_held(&self) -> PyResult<()> {
        if self.state.is_held() {
            Ok(())
        } else {
            Err(UnknownLease::err("the lease was released"))
        }
    }

    /// The address of the requested `offset .. offset + nbytes`, as one run.
    fn span(&self) -> PyResult<u64> {
        address(&self.ptr, self.lease_offset, self.region.page_size, self.offset, self.nbytes).map_err(|page| {
            NotContiguous::err(format!(
                "the lease's pages are not one run on {} (the device was too fragmented): bytes {}..{} span page {} \
                 and the next, which are apart; acquire at most one page at a time to view it",
                self.device,
                self.offset,
                self.offset + self.nbytes,
                page
            ))
        })
    }
}

#[pymethods]
impl PyLease {
    /// Releases the lease: a write lease's changes become the region's bytes, and its pages may move again.
    ///
    /// Raises `LeaseInUse` (and keeps the lease) while arrays or tensors made from it are alive, and
    /// `UnknownLease` if it was already released. On a GPU, waits first for the work queued there, unless
    /// `wait=False`: then the caller vouches that no queued work uses its pages any more (it waited for a CUDA
    /// event recorded after the last kernel that did), and the GPU's other queued work goes on undisturbed.
    #[pyo3(signature = (wait=true))]
    fn release(&self, py: Python<'_>, wait: bool) -> PyResult<()> {
        match py.detach(|| self.state.release(wait)) {
            Ok(()) => Ok(()),
            Err(ReleaseError::Released) => Err(UnknownLease::err("the lease was already released")),
            Err(ReleaseError::InUse(n)) => Err(LeaseInUse::err(format!(
                "{n} arrays/tensors made from this lease are still alive: delete them before the lease ends"
            ))),
            Err(ReleaseError::Fabric(e)) => Err(to_py(e)),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases the lease if it is still held (see `release`).
    #[pyo3(signature = (_exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyType>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if self.state.is_held() {
            self.release(py, true)?;
        }
        Ok(false)
    }

    /// A DLPack view of the requested bytes as `dtype` elements (`"uint8"`, `"float32"`, ...; NumPy and
    /// PyTorch dtypes work too) in `shape` (default: one dimension over all the bytes). Pass it to
    /// `numpy.from_dlpack` or `torch.from_dlpack` for a zero-copy array. Raises `NotContiguous` when the bytes
    /// span pages that are apart on the device, and `ValueError` when the shape does not cover the bytes.
    #[pyo3(signature = (dtype=None, shape=None))]
    fn view(&self, dtype: Option<&Bound<'_, PyAny>>, shape: Option<&Bound<'_, PyAny>>) -> PyResult<PyTensorView> {
        self.check_held()?;
        let data = self.span()?;
        let dtype = view::dtype(dtype)?;
        let shape = view::shape(shape, self.nbytes, &dtype)?;
        Ok(PyTensorView::new(
            Arc::downgrade(&self.state),
            data,
            view::dl_device(self.device_kind, self.device),
            dtype,
            shape,
            self.mode == Mode::Read,
        ))
    }

    /// A zero-copy NumPy array of the requested bytes, as `view(dtype, shape)` describes them (host memory only:
    /// the emulated device, or the "host" device; `ValueError` for a CUDA GPU's). Writable for a write lease,
    /// read-only for a read lease, with any NumPy; it counts against the lease like `numpy.from_dlpack(view)`.
    #[pyo3(signature = (dtype=None, shape=None))]
    fn numpy<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        shape: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.view(dtype, shape)?.numpy(py)
    }

    /// The region offset of the first requested byte.
    #[getter]
    fn offset(&self) -> u64 {
        self.offset
    }

    /// The requested bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// The device the pages are on ("gpu0", "host", ...).
    #[getter]
    fn device(&self) -> String {
        args::location_name(self.device)
    }

    /// "r" or "w".
    #[getter]
    fn mode(&self) -> &'static str {
        args::mode_name(self.mode)
    }

    /// The region.
    #[getter]
    fn region(&self) -> PyRegion {
        PyRegion { region: self.region }
    }

    /// The address of the first requested byte on the device (a CUDA device pointer, or a host address on the
    /// emulated device and for "host"). With `NotContiguous` pages, the requested bytes are at this address
    /// only up to the end of their first page.
    #[getter]
    fn ptr(&self) -> PyResult<u64> {
        self.check_held()?;
        // Zero bytes never span two pages, so this cannot fail.
        Ok(address(&self.ptr, self.lease_offset, self.region.page_size, self.offset, 0).unwrap_or_default())
    }

    /// The region offset where the leased pages start (the requested offset rounded down to a page).
    #[getter]
    fn pages_offset(&self) -> u64 {
        self.lease_offset
    }

    /// The bytes the leased pages cover (whole pages).
    #[getter]
    fn pages_nbytes(&self) -> u64 {
        self.lease_len
    }

    /// Whether the leased pages are one run on the device (one pointer covers them all).
    #[getter]
    fn contiguous(&self) -> bool {
        matches!(self.ptr, LeasePtr::Contiguous { .. })
            || address(&self.ptr, self.lease_offset, self.region.page_size, self.lease_offset, self.lease_len).is_ok()
    }

    /// Whether the lease is still held.
    #[getter]
    fn held(&self) -> bool {
        self.state.is_held()
    }

    /// Arrays and tensors made from this lease that are still alive.
    #[getter]
    fn live_views(&self) -> usize {
        self.state.views()
    }

    fn __repr__(&self) -> String {
        format!(
            "Lease(region={:#x}, offset={}, nbytes={}, device={:?}, mode={:?}, {})",
            self.region.addr.raw(),
            self.offset,
            self.nbytes,
            self.device.to_string(),
            args::mode_name(self.mode),
            if self.state.is_held() { "held" } else { "released" }
        )
    }
}
