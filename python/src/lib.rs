//! `vfabric._native`: the fabric's Python API, which the `vfabric` package re-exports.
//!
//! The modules, bottom up: `errors` (the exception classes and the mapping from the Rust errors), `args`
//! (device names, modes, sizes), `buffer` (Python's buffer protocol), `dlpack` (DLPack's C structures and
//! capsules), `backend` (what a fabric must offer: the trait both kinds implement),
//! `embedded` (the fabric inside this process), `attached` (the node's agent this process is attached to),
//! `region` (`Region`), `state` (a held lease and the rule that arrays never outlive it), `host_array`
//! (NumPy arrays over host memory), `view` (`TensorView`), `lease` (`Lease`), `client` (`FabricBase`,
//! `Fabric`, `Client`, `connect`), `torch_alloc` (PyTorch's CUDA allocations on the fabric's tensor pools).

mod args;
mod attached;
mod backend;
mod buffer;
mod client;
mod dlpack;
mod embedded;
mod errors;
mod host_array;
mod lease;
mod region;
mod reservation;
mod state;
mod torch_alloc;
mod view;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The fabric's warnings (a dropped lease that failed to release, ...) on stderr; `VFABRIC_LOG` for more.
    vfabric::logging::init();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<region::PyRegion>()?;
    m.add_class::<lease::PyLease>()?;
    m.add_class::<reservation::PyReservation>()?;
    m.add_class::<view::PyTensorView>()?;
    m.add_class::<host_array::PyHostMemory>()?;
    m.add_class::<client::PyFabricBase>()?;
    m.add_class::<client::PyFabric>()?;
    m.add_class::<client::PyClient>()?;
    m.add_function(wrap_pyfunction!(torch_alloc::_torch_allocator_start, m)?)?;
    m.add_function(wrap_pyfunction!(torch_alloc::_torch_allocator_stats, m)?)?;
    m.add_function(wrap_pyfunction!(torch_alloc::_torch_allocator_attach, m)?)?;
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_function(wrap_pyfunction!(client::_serve_host_agent, m)?)?;
    Ok(())
}
