//! The fabric as Python sees it: `vfabric.FabricBase`, whose methods every kind of fabric has, and its
//! subclasses `vfabric.Fabric` (the embedded fabric of this process) and `vfabric.Client` (attached to the
//! node's agent by `vfabric.connect`).
//!
//! Each method checks its arguments while holding the GIL, then calls the backend with the GIL released, so
//! other Python threads run while the fabric copies pages.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use vfabric::{ClusterConfig, FabricError, HostAgentLaunch, Region};

use crate::args;
use crate::attached::Attached;
use crate::backend::{AllocArgs, Backend};
use crate::buffer::Buffer;
use crate::embedded::Embedded;
use crate::errors::to_py;
use crate::lease::PyLease;
use crate::region::PyRegion;
use crate::reservation::PyReservation;

/// The calls every fabric has: regions (alloc, free, write, read), leases (acquire), placement (prefetch,
/// migrate) and figures (stats).
///
/// Not made directly: `vfabric.Fabric(...)` runs an embedded fabric, `vfabric.connect(...)` attaches to a node's
/// agent; both are `FabricBase`s.
#[pyclass(name = "FabricBase", module = "vfabric", subclass, frozen)]
pub struct PyFabricBase {
    backend: Arc<dyn Backend>,
}

impl PyFabricBase {
    /// The attachment to the node's agent, for a `Client`.
    pub fn attached(&self) -> Option<vfabric::AttachedClient> {
        self.backend.attached()
    }

    /// A base over `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        PyFabricBase { backend }
    }
}

/// `offset .. offset + len` checked against a region, as the fabric would report it (before a buffer of `len`
/// bytes is made for it).
fn check_range(region: &Region, offset: u64, len: u64) -> PyResult<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region.len => Ok(()),
        _ => Err(to_py(FabricError::OutOfBounds { offset, len, region_len: region.len })),
    }
}

#[pymethods]
impl PyFabricBase {
    /// Allocates a region of `nbytes` bytes (rounded up to whole pages) and returns its handle.
    ///
    /// `device` ("gpu0", "host", ...) is where its pages go; by default the GPU with the most free memory.
    /// `priority` ("low", "normal", "high") orders eviction; `tenant` names whose quotas it counts against.
    /// `keep` matters for `connect()` only: a region not kept is freed when the client's connection ends.
    /// `compression` ("none", "lz4", "zstd") is how its pages are stored on the node's storage tier: each page
    /// that shrinks by at least a 4 KiB block is stored packed, the others as they are. The lossy ones
    /// ("fp8-bf16", "fp8-f32", "int8-bf16", "int8-f32") declare the region an array of bf16 or fp32 values and
    /// pack each page on the GPU as it leaves it (2x or 4x smaller in host memory's traffic and on storage),
    /// changing values by at most the documented bound; its pages cannot be leased in host memory.
    /// `reservation` (from `reserve`, of this fabric) is memory the region's pages take first on its device.
    /// `replicas` (through a node's agent, `connect()`) is how many nodes keep the region's writes, its home
    /// included: 2 adds a standby copy on another node that takes over when the home dies (0: the cluster's
    /// `network.replicas`); `replica_lag` (seconds) lets the standby fall that far behind, writes then
    /// returning before it has them (None: `network.replica_lag_ms`; 0: never behind).
    #[pyo3(signature = (nbytes, device=None, priority="normal", tenant=0, keep=false, compression="none", reservation=None, replicas=0, replica_lag=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, one parameter each
    fn alloc(
        &self,
        py: Python<'_>,
        nbytes: i64,
        device: Option<&str>,
        priority: &str,
        tenant: i64,
        keep: bool,
        compression: &str,
        reservation: Option<PyRef<'_, PyReservation>>,
        replicas: i64,
        replica_lag: Option<f64>,
    ) -> PyResult<PyRegion> {
        let size = args::non_negative(nbytes, "nbytes")?;
        let alloc = AllocArgs {
            device: device.map(args::location).transpose()?,
            priority: args::priority(priority)?,
            tenant: args::tenant(tenant)?,
            keep,
            compression: args::compression(compression)?,
            reservation: reservation.map(|r| r.id_for(&self.backend)).transpose()?,
            replication: args::replication(replicas, replica_lag)?,
        };
        let region = py.detach(|| self.backend.alloc(size, &alloc)).map_err(to_py)?;
        Ok(PyRegion { region })
    }

    /// Sets `nbytes` (rounded up to whole pages) of `device` (default: the device leases go to) aside for
    /// `tenant` now, evicting other pages as an acquire would, so that a task started after it cannot fail
    /// midway for want of that memory. Refused at once with `OutOfMemory` (saying what can be had) when it
    /// cannot be met, and with `QuotaExceeded` past the tenant's quota. Regions allocated with
    /// `reservation=` it take its memory; `release()` or the end of a `with` block gives back the rest.
    #[pyo3(signature = (nbytes, device=None, tenant=0))]
    fn reserve(&self, py: Python<'_>, nbytes: i64, device: Option<&str>, tenant: i64) -> PyResult<PyReservation> {
        let bytes = args::non_negative(nbytes, "nbytes")?;
        let device = match device {
            Some(d) => args::location(d)?,
            None => self.backend.default_device(),
        };
        let tenant = args::tenant(tenant)?;
        let held = py.detach(|| self.backend.reserve(device, bytes, tenant)).map_err(to_py)?;
        Ok(PyReservation::new(Arc::clone(&self.backend), held))
    }

    /// Frees a region and all its memory. Refused (`LeasedElsewhere`) while any of its pages is leased.
    fn free(&self, py: Python<'_>, region: PyRegion) -> PyResult<()> {
        py.detach(|| self.backend.free(&region.region)).map_err(to_py)
    }

    /// Copies `data` (any object with the buffer protocol: bytes, bytearray, memoryview, a C-contiguous NumPy
    /// array) into the region at byte `offset`.
    fn write(&self, py: Python<'_>, region: PyRegion, offset: i64, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let offset = args::non_negative(offset, "offset")?;
        let buffer = Buffer::get(data, false)?;
        let bytes = buffer.as_slice();
        py.detach(|| self.backend.write(&region.region, offset, bytes)).map_err(to_py)
    }

    /// Returns `nbytes` bytes of the region from byte `offset` (pages never written read as zeros).
    fn read<'py>(&self, py: Python<'py>, region: PyRegion, offset: i64, nbytes: i64) -> PyResult<Bound<'py, PyBytes>> {
        let offset = args::non_negative(offset, "offset")?;
        let len = args::non_negative(nbytes, "nbytes")?;
        check_range(&region.region, offset, len)?;
        PyBytes::new_with(py, len as usize, |buf| {
            py.detach(|| self.backend.read(&region.region, offset, buf)).map_err(to_py)
        })
    }

    /// Copies `len(buffer)` bytes of the region from byte `offset` into `buffer` (a writable object with the
    /// buffer protocol: bytearray, memoryview, a C-contiguous NumPy array).
    fn read_into(&self, py: Python<'_>, region: PyRegion, offset: i64, buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let offset = args::non_negative(offset, "offset")?;
        let mut buffer = Buffer::get(buffer, true)?;
        let out = buffer.as_mut_slice();
        py.detach(|| self.backend.read(&region.region, offset, out)).map_err(to_py)
    }

    /// Leases bytes `offset .. offset + length` of the region (default: to its end) on `device` (default: this
    /// process's GPU: a rank's local GPU under a launcher, else the first), for reading
    /// (`mode="r"`, shared) or writing (`"w"`, exclusive). When it returns, the pages are on the device and stay
    /// at the lease's addresses until it is released. Use the lease as a context manager.
    #[pyo3(signature = (region, offset=0, length=None, device=None, mode="r"))]
    fn acquire(
        &self,
        py: Python<'_>,
        region: PyRegion,
        offset: i64,
        length: Option<i64>,
        device: Option<&str>,
        mode: &str,
    ) -> PyResult<PyLease> {
        let region = region.region;
        let offset = args::non_negative(offset, "offset")?;
        let length = match length {
            Some(l) => args::non_negative(l, "length")?,
            None => region.len.saturating_sub(offset),
        };
        check_range(&region, offset, length)?;
        let location = match device {
            Some(d) => args::location(d)?,
            None => self.backend.default_device(),
        };
        let mode = args::mode(mode)?;
        let end = offset + length;
        let lease = py.detach(|| self.backend.acquire(&region, offset..end, location, mode)).map_err(to_py)?;
        Ok(PyLease::new(Arc::clone(&self.backend), lease, region, offset, length))
    }

    /// Starts bringing bytes `offset .. offset + length` of the region to `device` ahead of their use, and
    /// returns: an acquire of them there later finds them in place (or waits for the copies still running).
    fn prefetch(&self, py: Python<'_>, region: PyRegion, offset: i64, length: i64, device: &str) -> PyResult<()> {
        let offset = args::non_negative(offset, "offset")?;
        let length = args::non_negative(length, "length")?;
        check_range(&region.region, offset, length)?;
        let location = args::location(device)?;
        py.detach(|| self.backend.prefetch(&region.region, offset..offset + length, location)).map_err(to_py)
    }

    /// Starts copying the pages of bytes `offset .. offset + length` that only `device` holds (written there
    /// under a write lease) to host memory, and returns: evicting them from `device` later is then a drop, not
    /// a copy in someone's acquire. Call it after releasing the lease that wrote them.
    fn write_back(&self, py: Python<'_>, region: PyRegion, offset: i64, length: i64, device: &str) -> PyResult<()> {
        let offset = args::non_negative(offset, "offset")?;
        let length = args::non_negative(length, "length")?;
        check_range(&region.region, offset, length)?;
        let location = args::location(device)?;
        py.detach(|| self.backend.write_back(&region.region, offset..offset + length, location)).map_err(to_py)
    }

    /// Moves the region to `device`: new pages go there, and its pages on other GPUs move there. Refused while
    /// any of its pages is leased.
    fn migrate(&self, py: Python<'_>, region: PyRegion, device: &str) -> PyResult<()> {
        let location = args::location(device)?;
        py.detach(|| self.backend.migrate(&region.region, location)).map_err(to_py)
    }

    /// The fabric's figures: the directory's (regions, pages per device, leases) and the bytes moved, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = py.detach(|| self.backend.stats_json()).map_err(to_py)?;
        py.import("json")?.call_method1("loads", (json,))
    }

    /// The page size of the node's regions, in bytes.
    #[getter]
    fn page_size(&self) -> u64 {
        self.backend.page_size()
    }

    /// The node's devices: the GPUs ("gpu0", "gpu1", ...), then "host".
    #[getter]
    fn devices(&self, py: Python<'_>) -> Vec<String> {
        py.detach(|| self.backend.devices()).into_iter().map(args::location_name).collect()
    }

    /// "cuda" (real GPUs) or "emulated" (host memory standing in for GPUs: device pointers are host addresses).
    #[getter]
    fn device_kind(&self) -> String {
        self.backend.device_kind().to_string()
    }
}

/// The fabric of one node, embedded in this process.
///
/// `config` is a cluster configuration file (TOML, as `vfabric demo --config` reads); by default the built-in
/// `cluster-configs/local.toml`: this machine's GPUs through CUDA, or the emulated device (host memory standing
/// in for two GPUs) where there is none.
#[pyclass(name = "Fabric", module = "vfabric", extends = PyFabricBase, frozen)]
pub struct PyFabric {
    describe: String,
}

#[pymethods]
impl PyFabric {
    #[new]
    #[pyo3(signature = (config=None))]
    fn new(py: Python<'_>, config: Option<PathBuf>) -> PyResult<PyClassInitializer<PyFabric>> {
        let embedded = py
            .detach(|| {
                ClusterConfig::load(config.as_deref()).map_err(FabricError::from).and_then(|c| Embedded::start(&c))
            })
            .map_err(to_py)?;
        let describe = embedded.describe();
        Ok(PyClassInitializer::from(PyFabricBase::new(Arc::new(embedded))).add_subclass(PyFabric { describe }))
    }

    fn __repr__(slf: PyRef<'_, Self>) -> String {
        format!("Fabric({}, page_size={})", slf.describe, slf.as_super().backend.page_size())
    }
}

/// A process attached to its node's agent: the node's memory is mapped here, so leases give pointers valid in
/// this process, while the agent owns the regions (shared with the node's other processes). Made by
/// `vfabric.connect()`.
#[pyclass(name = "Client", module = "vfabric", extends = PyFabricBase, frozen)]
pub struct PyClient {
    node: u16,
    default_device: String,
    hosts_agent: bool,
}

#[pymethods]
impl PyClient {
    /// The agent's node (its index in the cluster configuration, the home of the regions allocated here).
    #[getter]
    fn node(&self) -> u16 {
        self.node
    }

    /// The device leases go to when `acquire` names none: this rank's local GPU under a launcher.
    #[getter]
    fn default_device(&self) -> String {
        self.default_device.clone()
    }

    /// Whether this process runs the agent of its host's ranks (it is local rank 0 and none was running): the
    /// other ranks lose it when this process ends, so it should leave last.
    #[getter]
    fn hosts_agent(&self) -> bool {
        self.hosts_agent
    }

    fn __repr__(slf: PyRef<'_, Self>) -> String {
        let base = slf.as_super();
        format!(
            "Client(node={}, default_device={}, {}, page_size={})",
            slf.node,
            slf.default_device,
            base.backend.device_kind(),
            base.backend.page_size()
        )
    }
}

/// Attaches this process to its node's agent and maps the node's memory here. The agent is the one serving
/// `socket`, else `$VFABRIC_SOCKET`, else the job's socket; under a launcher (mpirun, Slurm, torchrun) local rank
/// 0 of a job on one host starts it when none runs (a process of its own, which ends with the rank;
/// `VFABRIC_HOST_AGENT=thread` runs it in the rank's process instead), and the other ranks wait for it. Returns
/// a `Client`, with the same calls as `Fabric`; its default device is the rank's local GPU. Regions it allocates
/// without `keep=True` are freed when this process disconnects or ends.
#[pyfunction]
#[pyo3(signature = (socket=None))]
pub fn connect(py: Python<'_>, socket: Option<PathBuf>) -> PyResult<Py<PyClient>> {
    let launch = host_agent_launch(py)?;
    let attached = py.detach(|| Attached::join(socket, launch)).map_err(to_py)?;
    let (node, hosts_agent) = (attached.node(), attached.hosts_agent());
    let default_device = args::location_name(attached.default_device());
    let init = PyClassInitializer::from(PyFabricBase::new(Arc::new(attached))).add_subclass(PyClient {
        node,
        default_device,
        hosts_agent,
    });
    Py::new(py, init)
}

/// How local rank 0 runs its host's agent: `VFABRIC_HOST_AGENT` is `process` (the default: this Python, with
/// this `vfabric` package, running `_serve_host_agent`) or `thread` (in this process).
fn host_agent_launch(py: Python<'_>) -> PyResult<HostAgentLaunch> {
    match std::env::var("VFABRIC_HOST_AGENT").as_deref() {
        Err(_) | Ok("process") => {}
        Ok("thread") => return Ok(HostAgentLaunch::InProcess),
        Ok(other) => {
            return Err(PyValueError::new_err(format!("VFABRIC_HOST_AGENT={other}: it is \"process\" or \"thread\"")))
        }
    }
    let program: PathBuf = py.import("sys")?.getattr("executable")?.extract()?;
    if program.as_os_str().is_empty() {
        return Err(PyValueError::new_err(
            "sys.executable is empty, so the host's agent cannot run as a process: set VFABRIC_HOST_AGENT=thread",
        ));
    }
    // The folder holding this `vfabric` package, first on the child's path: it runs the same one.
    let package: PathBuf = py.import("vfabric")?.getattr("__file__")?.extract()?;
    let root = package.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    // The terminal's Ctrl-C reaches the whole process group: the agent stops when rank 0 lets it go, not before.
    let code = "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); sys.path.insert(0, sys.argv[1]); \
                from vfabric._native import _serve_host_agent; _serve_host_agent()";
    Ok(HostAgentLaunch::Process { program, args: vec!["-c".into(), code.into(), root.into()] })
}

/// Serves the ranks of this host as the agent process their local rank 0 started (`connect`), until this
/// process's standard input ends.
#[pyfunction]
pub fn _serve_host_agent(py: Python<'_>) -> PyResult<()> {
    py.detach(vfabric::agent::serve_host_agent).map_err(to_py)
}
