//! PyTorch's CUDA allocations on the fabric: the two C functions `torch.cuda.memory.CUDAPluggableAllocator`
//! calls (`vfabric_torch_malloc`, `vfabric_torch_free`, exported by this module's shared library), over a
//! [`TensorPool`] per GPU of an embedded fabric that `vfabric.torch.use_as_allocator()` starts, or of the node's
//! agent that a `vfabric.Client` is attached to (`use_as_allocator(client)`).
//!
//! A block PyTorch frees may still be read or written by kernels it queued on the free's stream, so it is not
//! given back to the pool at once: an event is recorded on that stream, and the block goes back once the event
//! has passed (checked at each allocation; all of them waited for before an allocation fails). On the emulated
//! device (tests) nothing runs asynchronously and blocks go back at once.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::{result, sys};
use pyo3::prelude::*;
use vfabric::{
    ByteSize, ClusterConfig, DeviceKind, Fabric, FabricError, Location, PoolConfig, PoolSource, PoolStats, TensorPool,
};

use crate::errors::to_py;

/// A pool per GPU over one source of regions (the embedded fabric, or the node's agent).
struct Pools<S: PoolSource + Clone> {
    source: S,
    pools: HashMap<i32, TensorPool<S>>,
}

/// What the allocator needs of its pools, whatever their source.
trait DevicePools: Send {
    fn alloc(&mut self, device: i32, size: u64) -> Result<u64, FabricError>;
    fn free(&mut self, device: i32, ptr: u64) -> Result<(), FabricError>;
    fn stats(&self) -> HashMap<String, PoolStats>;
}

impl<S: PoolSource + Clone + Send> DevicePools for Pools<S>
where
    S::Lease: Send,
{
    fn alloc(&mut self, device: i32, size: u64) -> Result<u64, FabricError> {
        if !self.pools.contains_key(&device) {
            let gpu = u16::try_from(device).map_err(|_| FabricError::DeviceUnavailable(Location::Host))?;
            let config = PoolConfig::new(&self.source, Location::Gpu(gpu));
            self.pools.insert(device, TensorPool::new(self.source.clone(), config)?);
        }
        self.pools.get_mut(&device).ok_or(FabricError::Internal("a pool just made is gone"))?.alloc(size)
    }

    fn free(&mut self, device: i32, ptr: u64) -> Result<(), FabricError> {
        match self.pools.get_mut(&device) {
            Some(p) => p.free(ptr),
            None => Err(FabricError::InvalidAddress(format!("no pool on GPU {device}"))),
        }
    }

    fn stats(&self) -> HashMap<String, PoolStats> {
        self.pools.iter().map(|(d, p)| (format!("gpu{d}"), p.stats())).collect()
    }
}

/// The pools, once started.
struct Allocator {
    pools: Box<dyn DevicePools>,
    /// Whether blocks live on real GPUs (frees then wait for their streams).
    cuda: bool,
    /// Blocks freed by PyTorch whose stream may still use them, oldest first.
    pending: VecDeque<Pending>,
    failures: u64,
}

/// A freed block and the event recorded on its stream at the free.
struct Pending {
    device: i32,
    ptr: u64,
    event: Option<sys::CUevent>,
}

// SAFETY: the raw event handles are only used under the allocator's lock.
unsafe impl Send for Allocator {}

static ALLOCATOR: Mutex<Option<Allocator>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Option<Allocator>> {
    ALLOCATOR.lock().unwrap_or_else(|p| p.into_inner())
}

impl Allocator {
    /// Gives back the pending blocks whose streams have passed their frees; with `wait`, all of them.
    fn reclaim(&mut self, wait: bool) {
        let mut keep = VecDeque::new();
        while let Some(p) = self.pending.pop_front() {
            let done = match p.event {
                None => true,
                // SAFETY: the event was created and recorded by `free` and is destroyed only below.
                Some(e) if wait => unsafe { result::event::synchronize(e) }.is_ok(),
                // SAFETY: as above.
                Some(e) => unsafe { result::event::query(e) }.is_ok(),
            };
            if !done {
                keep.push_back(p);
                continue;
            }
            if let Some(e) = p.event {
                // SAFETY: created by `free`, destroyed once.
                let _ = unsafe { result::event::destroy(e) };
            }
            if let Err(e) = self.pools.free(p.device, p.ptr) {
                tracing::warn!(error = %e, "giving a freed tensor's block back failed");
            }
        }
        self.pending = keep;
    }
}

/// `CUDAPluggableAllocator`'s allocation: a block of `size` bytes on GPU `device`, or null (PyTorch then raises
/// its out-of-memory error; for 0 bytes, null is the empty tensor's pointer).
#[no_mangle]
pub extern "C" fn vfabric_torch_malloc(size: usize, device: i32, _stream: *mut c_void) -> *mut c_void {
    if size == 0 {
        // An empty tensor: PyTorch keeps a null pointer for it, as its own allocator gives.
        return std::ptr::null_mut();
    }
    let got = std::panic::catch_unwind(|| {
        let mut guard = lock();
        let a = guard.as_mut()?;
        a.reclaim(false);
        let first = a.pools.alloc(device, size as u64);
        let ptr = match first {
            Ok(p) => Ok(p),
            // Full: wait for the blocks still in flight, then try once more.
            Err(_) if !a.pending.is_empty() => {
                a.reclaim(true);
                a.pools.alloc(device, size as u64)
            }
            Err(e) => Err(e),
        };
        match ptr {
            Ok(p) => Some(p as *mut c_void),
            Err(e) => {
                a.failures += 1;
                tracing::warn!(size, device, error = %e, "a PyTorch allocation failed");
                None
            }
        }
    });
    got.ok().flatten().unwrap_or(std::ptr::null_mut())
}

/// `CUDAPluggableAllocator`'s free: the block goes back to its pool once `stream` has done what was queued on
/// it before the free.
#[no_mangle]
pub extern "C" fn vfabric_torch_free(ptr: *mut c_void, _size: usize, device: i32, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let mut guard = lock();
        let Some(a) = guard.as_mut() else { return };
        let event = match a.cuda {
            false => None,
            true => {
                match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
                    // SAFETY: `stream` is PyTorch's stream of the freed block (null: the default stream), live for
                    // the call; the event was just made in the current context (PyTorch's, the GPU's primary one).
                    Ok(e) => match unsafe { result::event::record(e, stream as sys::CUstream) } {
                        Ok(()) => Some(e),
                        Err(_) => {
                            // SAFETY: created above.
                            let _ = unsafe { result::event::destroy(e) };
                            // Without an event, wait for the stream now: the block must not be reused early.
                            // SAFETY: as above.
                            let _ = unsafe { result::stream::synchronize(stream as sys::CUstream) };
                            None
                        }
                    },
                    Err(_) => {
                        // SAFETY: as above.
                        let _ = unsafe { result::stream::synchronize(stream as sys::CUstream) };
                        None
                    }
                }
            }
        };
        a.pending.push_back(Pending { device, ptr: ptr as u64, event });
        if event.is_none() {
            a.reclaim(false);
        }
    });
}

/// Starts the embedded fabric the allocator takes its memory from: `config` (a cluster TOML file; default the
/// embedded configuration) with `budget` bytes of each GPU if given. Fails if it already runs.
#[pyfunction]
#[pyo3(signature = (config=None, budget=None))]
pub fn _torch_allocator_start(
    py: Python<'_>,
    config: Option<std::path::PathBuf>,
    budget: Option<u64>,
) -> PyResult<String> {
    let mut guard = lock();
    if guard.is_some() {
        return Err(crate::errors::ConfigError::err("the fabric's PyTorch allocator is already in use".to_string()));
    }
    let fabric = py
        .detach(|| {
            let mut cfg = ClusterConfig::load(config.as_deref())?;
            if let Some(b) = budget {
                cfg.memory.gpu_budget = Some(ByteSize(b));
            }
            Fabric::embedded(&cfg)
        })
        .map_err(to_py)?;
    let kind = fabric.device_kind();
    let pools = Box::new(Pools { source: fabric, pools: HashMap::new() });
    *guard = Some(Allocator { pools, cuda: kind == DeviceKind::Cuda, pending: VecDeque::new(), failures: 0 });
    Ok(kind.to_string())
}

/// Starts the allocator over the node's agent that `client` is attached to: its pools' regions are the agent's,
/// leased into this process's mapping (and freed if it dies). Fails if the allocator already runs.
#[pyfunction]
pub fn _torch_allocator_attach(client: PyRef<'_, crate::client::PyClient>) -> PyResult<String> {
    let mut guard = lock();
    if guard.is_some() {
        return Err(crate::errors::ConfigError::err("the fabric's PyTorch allocator is already in use".to_string()));
    }
    let attached =
        client.as_super().attached().ok_or(FabricError::Internal("a Client without its attachment")).map_err(to_py)?;
    let kind = attached.device_kind();
    let pools = Box::new(Pools { source: attached, pools: HashMap::new() });
    *guard = Some(Allocator { pools, cuda: kind == DeviceKind::Cuda, pending: VecDeque::new(), failures: 0 });
    Ok(kind.to_string())
}

/// The allocator's figures as JSON: per GPU its pool's, and the blocks still waiting for their streams.
#[pyfunction]
pub fn _torch_allocator_stats() -> PyResult<String> {
    let guard = lock();
    let Some(a) = guard.as_ref() else {
        return Ok("null".into());
    };
    let doc = serde_json::json!({ "pools": a.pools.stats(), "pending_frees": a.pending.len(), "failed_allocations": a.failures });
    Ok(doc.to_string())
}
