//! The device layer's interface: what every backend (CUDA, emulated) offers the fabric.
//!
//! A node's memory is a set of [`Arena`]s, one or more per location, each created once at start and mapped once
//! (on CUDA: physical chunks mapped into one reserved virtual range, access granted to every GPU of the node).
//! Pages live in page-sized frames of arenas and move by copying between frames, through a [`Mover`]; mappings
//! never change on that path, because on the H200s a map + set-access + unmap costs 30-55 us per mapping.

use std::any::Any;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::DeviceError;
use vfabric_allocator::Location;
use crate::mover::{Mover, MoverConfig};

/// Which implementation of the device layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    /// Real GPUs through the CUDA driver API (cudarc, VMM).
    Cuda,
    /// Host memory standing in for GPUs, so the fabric runs and is tested on machines without one.
    Emulated,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cuda => "cuda",
            DeviceKind::Emulated => "emulated",
        })
    }
}

/// What the device layer knows about one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The GPU's index on this node (the CUDA ordinal).
    pub index: u16,
    /// The product name, e.g. "NVIDIA H200".
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Number of streaming multiprocessors.
    pub multiprocessors: u32,
    /// The VMM allocation granularity in bytes: arena chunks are multiples of it.
    pub granularity: u64,
    /// Whether arena chunks can be exported as POSIX file descriptors for other processes.
    pub fd_export: bool,
}

/// What arena to create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaSpec {
    /// Where its memory lives.
    pub location: Location,
    /// Its size in bytes (rounded up to the location's granularity).
    pub bytes: u64,
    /// Size of the physical chunks it is made of (GPU arenas; rounded to the granularity). Larger chunks cost
    /// fewer mapping calls at start: 1 GiB as one chunk maps in 0.1 ms, as 512 chunks of 2 MiB in 45 ms.
    pub chunk_bytes: u64,
}

impl ArenaSpec {
    /// The default chunk size: 1 GiB.
    pub const DEFAULT_CHUNK: u64 = 1 << 30;

    /// An arena of `bytes` at `location` with the default chunk size.
    pub fn new(location: Location, bytes: u64) -> Self {
        ArenaSpec { location, bytes, chunk_bytes: Self::DEFAULT_CHUNK }
    }
}

/// A range of memory created once and mapped once, in which pages live in frames.
///
/// Reads and writes from host buffers are synchronous and meant for setup, verification and small transfers;
/// bulk movement between arenas goes through a [`Mover`].
pub trait Arena: Send + Sync + std::fmt::Debug {
    /// Where the memory lives.
    fn location(&self) -> Location;
    /// Size in bytes.
    fn len(&self) -> u64;
    /// Whether the arena is empty (never, for arenas the device layer creates).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The address at which kernels of this node reach the arena's first byte (a CUDA device pointer; for
    /// pinned host memory, its unified address; on the emulated device, the host address).
    fn device_ptr(&self) -> u64;
    /// Copies `data` into the arena at `offset`.
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError>;
    /// Copies `parts`, one after the other, into the arena from `offset` on (for payloads that arrive in
    /// pieces, such as a QUIC chunk in quinn's receive buffers). The default gathers them into one buffer and
    /// makes one [`Arena::write`] (one device copy, not one per piece); arenas in host memory copy each piece
    /// straight to its place, and GPU arenas gather small writes in pinned memory of their own.
    fn write_parts(&self, offset: u64, parts: &[&[u8]]) -> Result<(), DeviceError> {
        write_gathered(self, offset, parts)
    }
    /// Copies `out.len()` bytes from the arena at `offset` into `out`.
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), DeviceError>;
    /// Sets `len` bytes at `offset` to `byte`.
    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), DeviceError>;
    /// The backend's own type, for movers that need their backend's handles.
    fn as_any(&self) -> &dyn Any;
}

/// [`Arena::write_parts`] by one [`Arena::write`]: the pieces gathered first into a buffer kept per thread.
pub(crate) fn write_gathered<A: Arena + ?Sized>(arena: &A, offset: u64, parts: &[&[u8]]) -> Result<(), DeviceError> {
    if let [one] = parts {
        return arena.write(offset, one);
    }
    thread_local! {
        // Kept per thread: a fresh buffer per call would cost a page fault per 4 KiB of every chunk.
        static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    GATHER.with(|g| match g.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            for p in parts {
                buf.extend_from_slice(p);
            }
            arena.write(offset, &buf)
        }
        // Only if a `write` called from here wrote parts again on this thread.
        Err(_) => arena.write(offset, &parts.concat()),
    })
}

/// Copies `parts`, one after the other, to `dst`: [`Arena::write_parts`] of arenas in host memory.
///
/// # Safety
/// `dst` must be valid for writes of the parts' total length, and no part may overlap that range.
pub(crate) unsafe fn copy_parts(dst: *mut u8, parts: &[&[u8]]) {
    let mut at = 0;
    for p in parts {
        std::ptr::copy_nonoverlapping(p.as_ptr(), dst.add(at), p.len());
        at += p.len();
    }
}

/// One node's memory devices: its GPUs and its pinned host memory.
pub trait DeviceLayer: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> DeviceKind;
    /// The node's GPUs.
    fn gpus(&self) -> &[GpuInfo];
    /// Whether NCCL's library can be loaded on this node.
    fn nccl_available(&self) -> bool;
    /// Creates an arena, mapped once for every GPU of the node.
    fn create_arena(&self, spec: &ArenaSpec) -> Result<Arc<dyn Arena>, DeviceError>;
    /// A mover for arenas of this device layer.
    fn mover(&self, config: MoverConfig) -> Result<Arc<dyn Mover>, DeviceError>;
    /// The backend's own type (the benchmark's baselines need the CUDA node's contexts).
    fn as_any(&self) -> &dyn Any;
    /// One line that says what this device layer is, for logs and reports.
    fn describe(&self) -> String {
        let gpus: Vec<String> = self
            .gpus()
            .iter()
            .map(|g| format!("gpu{} {} {:.1} GiB", g.index, g.name, g.total_memory as f64 / (1u64 << 30) as f64))
            .collect();
        format!("{} device layer: {}", self.kind(), gpus.join(", "))
    }
}

/// Checks that `offset..offset+len` lies inside an arena of `arena_len` bytes.
pub(crate) fn check_bounds(location: Location, arena_len: u64, offset: u64, len: u64) -> Result<(), DeviceError> {
    match offset.checked_add(len) {
        Some(end) if end <= arena_len => Ok(()),
        _ => Err(DeviceError::OutOfBounds { location, offset, len, arena_len }),
    }
}

/// Which backend to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// CUDA when a driver and a GPU are present, the emulated device otherwise (and say why).
    #[default]
    Auto,
    /// CUDA, or an error.
    Cuda,
    /// The emulated device.
    Emulated,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Backend::Auto),
            "cuda" => Ok(Backend::Cuda),
            "emulated" => Ok(Backend::Emulated),
            _ => Err(format!("`{s}` is not a device layer: use auto, cuda or emulated")),
        }
    }
}

/// How to open the device layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOptions {
    /// Which backend.
    pub backend: Backend,
    /// How many GPUs the emulated device pretends to have.
    pub emulated_gpus: u16,
    /// How much memory each emulated GPU has, in bytes (arenas beyond it fail as a full GPU would).
    pub emulated_gpu_memory: u64,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { backend: Backend::Auto, emulated_gpus: 2, emulated_gpu_memory: 4 << 30 }
    }
}

/// An opened device layer, and why it is the emulated one when CUDA was wanted but could not be used.
pub struct Opened {
    /// The device layer.
    pub layer: Arc<dyn DeviceLayer>,
    /// Set when [`Backend::Auto`] fell back to the emulated device: the reason CUDA could not be used.
    pub fallback_reason: Option<DeviceError>,
}

/// Opens the device layer that `options` ask for.
pub fn open(options: &OpenOptions) -> Result<Opened, DeviceError> {
    let emulated = || -> Arc<dyn DeviceLayer> {
        Arc::new(crate::emulated::EmulatedNode::new(options.emulated_gpus, options.emulated_gpu_memory))
    };
    match options.backend {
        Backend::Emulated => Ok(Opened { layer: emulated(), fallback_reason: None }),
        Backend::Cuda => Ok(Opened { layer: Arc::new(crate::cuda::CudaNode::open()?), fallback_reason: None }),
        Backend::Auto => match crate::cuda::CudaNode::open() {
            Ok(node) => Ok(Opened { layer: Arc::new(node), fallback_reason: None }),
            Err(e) => {
                tracing::info!(reason = %e, "no usable GPU: running on the emulated device");
                Ok(Opened { layer: emulated(), fallback_reason: Some(e) })
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert!(check_bounds(Location::Host, 100, 0, 100).is_ok());
        assert!(check_bounds(Location::Host, 100, 100, 0).is_ok());
        assert!(matches!(check_bounds(Location::Host, 100, 1, 100), Err(DeviceError::OutOfBounds { .. })));
        assert!(check_bounds(Location::Host, 100, u64::MAX, 2).is_err());
    }

    /// An arena that keeps the trait's own `write_parts` (gather, then one write), counting its writes.
    #[derive(Debug)]
    struct Gathering {
        inner: Arc<dyn Arena>,
        writes: std::sync::atomic::AtomicUsize,
    }

    impl Arena for Gathering {
        fn location(&self) -> Location {
            self.inner.location()
        }
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn device_ptr(&self) -> u64 {
            self.inner.device_ptr()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
            self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.write(offset, data)
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), DeviceError> {
            self.inner.read(offset, out)
        }
        fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), DeviceError> {
            self.inner.fill(offset, len, byte)
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn parts_land_one_after_the_other() {
        let node = crate::emulated::EmulatedNode::new(1, 8 << 20);
        let spec = |location| ArenaSpec { location, bytes: 2 << 20, chunk_bytes: 2 << 20 };
        let host = node.create_arena(&spec(Location::Host)).unwrap();
        let gathering = Gathering { inner: node.create_arena(&spec(Location::Gpu(0))).unwrap(), writes: 0.into() };
        let parts: [&[u8]; 4] = [b"abc", b"", b"defgh", b"ij"];
        for arena in [&*host, &gathering as &dyn Arena] {
            arena.write_parts(100, &parts).unwrap();
            let mut back = [0u8; 12];
            arena.read(99, &mut back).unwrap();
            assert_eq!(&back, b"\0abcdefghij\0");
            // Past the end: refused, and nothing of it written.
            let end = arena.len() - 4;
            let r = arena.write_parts(end, &parts);
            assert!(matches!(r, Err(DeviceError::OutOfBounds { .. })), "{r:?}");
            let mut tail = [1u8; 4];
            arena.read(end, &mut tail).unwrap();
            assert_eq!(tail, [0; 4]);
        }
        // The gathered pieces went to the device in one copy.
        assert_eq!(gathering.writes.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
