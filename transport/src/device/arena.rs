//! Arenas: ranges of memory created once and mapped once, in which pages live in frames.
//!
//! A node's memory is a set of [`Arena`]s, one or more per location, each created once at start and mapped once
//! (on CUDA: physical chunks mapped into one reserved virtual range, access granted to every GPU of the node).
//! Pages live in page-sized frames of arenas and move by copying between frames, through a
//! `Mover`; mappings never change on that path, because mapping, granting access and
//! unmapping cost far more per page than copying it (docs/benchmarks.md and docs/architecture.md have the
//! figures).

use std::any::Any;

use vfabric_allocator::Location;

use super::error::DeviceError;
use super::share::ExportedArena;

/// What arena to create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaSpec {
    /// Where its memory lives.
    pub location: Location,
    /// Its size in bytes (rounded up to the location's granularity).
    pub bytes: u64,
    /// Size of the physical chunks it is made of (GPU arenas; rounded to the granularity). Larger chunks cost
    /// fewer mapping calls at start, and every call costs time, so one large chunk maps far faster than many
    /// small ones (the measured times are in docs/benchmarks.md).
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
    /// The host address of the arena's first byte, for arenas in this process's host memory (the host tier,
    /// and every arena of the emulated device): what file I/O reads into and writes from. `None` for GPU
    /// memory.
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
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
    /// Makes the arena reachable by this process's GPUs (copy engines and kernels) if it is not yet: a local
    /// client's mapping of the host tier is registered with CUDA only when first needed. Cheap once done.
    fn prepare_for_devices(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Describes the arena and hands out new descriptors of its memory, for another process of the node to map
    /// ([`crate::DeviceLayer::import_arena`]). Arenas that cannot be shared say so.
    fn export(&self) -> Result<ExportedArena, DeviceError> {
        Err(DeviceError::NotShareable(self.location()))
    }
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

/// Checks that `offset..offset+len` lies inside an arena of `arena_len` bytes.
pub(crate) fn check_bounds(location: Location, arena_len: u64, offset: u64, len: u64) -> Result<(), DeviceError> {
    match offset.checked_add(len) {
        Some(end) if end <= arena_len => Ok(()),
        _ => Err(DeviceError::OutOfBounds { location, offset, len, arena_len }),
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
}
