//! Emulated arenas: host memory in shared memory files, so that the node's other processes can map them as they
//! would map a GPU's exported chunks.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::device::arena::{check_bounds, copy_parts, Arena};
use crate::device::error::DeviceError;
use crate::device::share::{ArenaShare, ExportedArena, ShareKind};
use crate::device::shared_memory::SharedHostMemory;
use vfabric_allocator::Location;

/// Memory charged to an emulated GPU: its counters, which GPU, how many bytes.
pub(crate) type Charge = (Arc<Vec<AtomicU64>>, usize, u64);

/// An arena of host memory standing in for GPU or pinned host memory.
pub struct EmulatedArena {
    ptr: *mut u8,
    mem: SharedHostMemory,
    location: Location,
    /// What the arena holds of its emulated GPU's memory (none for host arenas and imported ones).
    charge: Option<Charge>,
}

// SAFETY: the memory is owned by the arena and reached through raw pointers; as on a GPU, callers must not let
// two transfers write the same bytes at once, and the movers only read and write inside checked bounds.
unsafe impl Send for EmulatedArena {}
// SAFETY: as above.
unsafe impl Sync for EmulatedArena {}

impl std::fmt::Debug for EmulatedArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedArena").field("location", &self.location).field("len", &self.mem.len()).finish()
    }
}

impl EmulatedArena {
    pub(crate) fn new(location: Location, bytes: u64, charge: Option<Charge>) -> Result<Self, DeviceError> {
        let mem = SharedHostMemory::create(&format!("vfabric-emulated-{location}"), bytes)?;
        Ok(EmulatedArena { ptr: mem.as_ptr(), mem, location, charge })
    }

    /// The arena another process exported, mapped here (charged to nothing: the exporter holds the memory).
    pub(crate) fn import(share: &ArenaShare, mut fds: Vec<std::os::fd::OwnedFd>) -> Result<Self, DeviceError> {
        share.check(fds.len())?;
        if share.kind != ShareKind::HostFile {
            return Err(DeviceError::InvalidArgument(format!("the emulated device cannot map {:?}", share.kind)));
        }
        let mem = SharedHostMemory::map(fds.remove(0), share.len)?;
        Ok(EmulatedArena { ptr: mem.as_ptr(), mem, location: share.location, charge: None })
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`.
    ///
    /// # Safety
    /// Both ranges must lie inside their arenas and must not overlap.
    pub(crate) unsafe fn copy(src: &EmulatedArena, src_off: u64, dst: &EmulatedArena, dst_off: u64, len: u64) {
        std::ptr::copy_nonoverlapping(src.ptr.add(src_off as usize), dst.ptr.add(dst_off as usize), len as usize);
    }
}

impl Drop for EmulatedArena {
    fn drop(&mut self) {
        if let Some((used, g, bytes)) = &self.charge {
            used[*g].fetch_sub(*bytes, Ordering::AcqRel);
        }
    }
}

impl Arena for EmulatedArena {
    fn location(&self) -> Location {
        self.location
    }

    fn len(&self) -> u64 {
        self.mem.len()
    }

    fn device_ptr(&self) -> u64 {
        self.ptr as u64
    }

    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.ptr)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_bounds(self.location, self.len(), offset, data.len() as u64)?;
        // SAFETY: in bounds (checked); `data` cannot alias the arena's mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset as usize), data.len()) };
        Ok(())
    }

    fn write_parts(&self, offset: u64, parts: &[&[u8]]) -> Result<(), DeviceError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        check_bounds(self.location, self.len(), offset, len)?;
        // SAFETY: the pieces together are in bounds (checked), and cannot alias the arena's memory.
        unsafe { copy_parts(self.ptr.add(offset as usize), parts) };
        Ok(())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        check_bounds(self.location, self.len(), offset, out.len() as u64)?;
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset as usize), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), DeviceError> {
        check_bounds(self.location, self.len(), offset, len)?;
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_bytes(self.ptr.add(offset as usize), byte, len as usize) };
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn export(&self) -> Result<ExportedArena, DeviceError> {
        let share = ArenaShare {
            location: self.location,
            len: self.len(),
            kind: ShareKind::HostFile,
            pieces: vec![self.len()],
        };
        Ok(ExportedArena { share, fds: vec![self.mem.share()?] })
    }
}
