//! `vfabric.Reservation`: memory of one device set aside before a task starts (`FabricBase.reserve`), drawn on
//! by regions allocated with `alloc(..., reservation=r)`, and given back by `release()`, at the end of a `with`
//! block, or when it is collected.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;

use crate::args;
use crate::backend::{Backend, HeldReservation};
use crate::errors::{to_py, value_error};

/// Memory of one device held for a tenant: nobody else can take, evict or move it while it lasts.
///
/// Returned by `reserve`; `alloc(..., reservation=r)` makes a region's pages take it as they arrive on its
/// device. `nbytes` is what it still holds. `release()` (or leaving a `with` block) gives back the rest.
#[pyclass(name = "Reservation", module = "vfabric", frozen)]
pub struct PyReservation {
    /// The fabric it belongs to: only that fabric's regions may draw on it.
    pub backend: Arc<dyn Backend>,
    held: Mutex<Option<Box<dyn HeldReservation>>>,
    device: String,
}

impl PyReservation {
    /// A reservation just granted by `backend`.
    pub fn new(backend: Arc<dyn Backend>, held: Box<dyn HeldReservation>) -> PyReservation {
        let device = args::location_name(held.device());
        PyReservation { backend, held: Mutex::new(Some(held)), device }
    }

    /// The id a placement names, for a region of `backend`; an error when it was released or is another
    /// fabric's.
    pub fn id_for(&self, backend: &Arc<dyn Backend>) -> PyResult<u64> {
        if !std::ptr::addr_eq(Arc::as_ptr(&self.backend), Arc::as_ptr(backend)) {
            return Err(value_error("the reservation belongs to another fabric"));
        }
        self.lock().as_ref().map(|h| h.id()).ok_or_else(|| value_error("the reservation was released"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Box<dyn HeldReservation>>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyReservation {
    /// The device whose memory it holds.
    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// Bytes it still holds (what regions naming it have not taken yet); 0 once released.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> PyResult<u64> {
        let held = self.lock();
        match held.as_ref() {
            Some(h) => py.detach(|| h.bytes()).map_err(to_py),
            None => Ok(0),
        }
    }

    /// Whether it was released.
    #[getter]
    fn released(&self) -> bool {
        self.lock().is_none()
    }

    /// Gives back what it still holds. Releasing twice does nothing.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let held = self.lock().take();
        match held {
            Some(h) => py.detach(|| h.release()).map_err(to_py),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.release(py)?;
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.nbytes(py) {
            Ok(n) if !self.released() => format!("Reservation(device={:?}, nbytes={n})", self.device),
            _ => format!("Reservation(device={:?}, released)", self.device),
        }
    }
}
