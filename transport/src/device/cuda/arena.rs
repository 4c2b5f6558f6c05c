//! CUDA arenas: a GPU's budget as physical chunks mapped once into one reserved range, and pinned host memory.

use std::any::Any;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::context::GpuContext;
use super::driver::cu;
use super::host::{PinnedHostMemory, RegisteredHostMemory};
use super::stream::Stream;
use super::vmm::{set_access, Mapping, PhysicalChunk, VirtualRange};
use crate::device::arena::{check_bounds, copy_parts, write_gathered, Arena};
use crate::device::error::DeviceError;
use crate::device::share::{ArenaShare, ExportedArena, ShareKind};
use vfabric_allocator::Location;

/// GPU memory: `chunks` mapped back to back into `range`, readable and writable by every GPU of the node that
/// can reach it.
#[derive(Debug)]
pub struct GpuArena {
    /// Pinned host memory for small writes: a copy from it is one DMA, where pageable memory costs the driver's
    /// own staging.
    staging: std::sync::Mutex<PinnedHostMemory>,
    /// The stream the arena's own writes, reads and fills run on, each waited for on it alone. A stream of its
    /// own that does not wait for other work: the legacy default stream (what the synchronous copies use) and a
    /// context synchronisation wait for every kernel of the process. A fabric that shares its process's
    /// context with an application (an agent inside a rank of a job) would then wait for the application's
    /// queued work, and so for whatever that waits on: another rank's collective, which may wait on this call.
    stream: Stream,
    // Field order is drop order: unmap, then release the chunks, then free the range.
    _mappings: Vec<Mapping>,
    chunks: Vec<PhysicalChunk>,
    range: VirtualRange,
    gpu: u16,
    ctx: Arc<GpuContext>,
}

/// Writes up to this many bytes go through the arena's pinned staging buffer (a chunk of the wire protocol).
const STAGING: usize = 1 << 20;

impl GpuArena {
    /// Writes `parts` (together at most [`STAGING`] bytes, in bounds: checked by the caller) to `offset` through
    /// the pinned staging buffer: gathered there, then one copy, complete when the driver call returns (a copy
    /// from pinned memory is synchronous for the host), so the buffer is free again at once.
    fn write_staged(&self, offset: u64, parts: &[&[u8]]) -> Result<(), DeviceError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.ctx.bind()?;
        let buf = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `len` <= STAGING, the buffer's length, and the pieces cannot alias pinned memory this arena owns.
        unsafe { copy_parts(buf.as_ptr(), parts) };
        // SAFETY: the destination range is inside the mapped arena (the caller checked), the source is `len` bytes
        // of pinned memory held (locked) until the copy is done (the stream is waited for before the lock goes).
        unsafe {
            cu!(cuMemcpyHtoDAsync_v2(
                self.range.base() + offset,
                buf.as_ptr() as *const std::ffi::c_void,
                len,
                self.stream.raw()
            ))?
        };
        self.stream.synchronize()
    }

    /// Creates `bytes` (a multiple of `granularity`) on the context's GPU in chunks of `chunk` bytes (also a
    /// multiple), maps them into one range and grants access to `accessors`. With `chunks` given (imported from
    /// another process), maps those instead of creating new ones.
    pub(crate) fn build(
        ctx: Arc<GpuContext>,
        bytes: u64,
        chunk: u64,
        granularity: u64,
        exportable: bool,
        accessors: &[u16],
        imported: Option<Vec<PhysicalChunk>>,
    ) -> Result<Self, DeviceError> {
        let gpu = ctx.gpu();
        ctx.bind()?;
        let range = VirtualRange::reserve(bytes, granularity)?;
        let chunks = match imported {
            Some(c) => c,
            None => {
                let mut chunks = Vec::new();
                let mut off = 0;
                while off < bytes {
                    let len = chunk.min(bytes - off);
                    chunks.push(PhysicalChunk::create(gpu, len, exportable).map_err(|e| oom(e, gpu, bytes))?);
                    off += len;
                }
                chunks
            }
        };
        let mut mappings = Vec::with_capacity(chunks.len());
        let mut off = 0;
        for c in &chunks {
            mappings.push(Mapping::map(range.base() + off, c)?);
            off += c.len();
        }
        set_access(range.base(), off, accessors)?;
        // Made now rather than at the first write: allocating pinned memory may synchronise the whole context,
        // which, in the middle of an application's work, could wait for it.
        let staging = std::sync::Mutex::new(PinnedHostMemory::alloc(Arc::clone(&ctx), STAGING as u64)?);
        let stream = Stream::new(Arc::clone(&ctx))?;
        Ok(GpuArena { staging, stream, _mappings: mappings, chunks, range, gpu, ctx })
    }

    /// Number of physical chunks.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Size of chunk `index` in bytes.
    pub fn chunk_len(&self, index: usize) -> Option<u64> {
        self.chunks.get(index).map(PhysicalChunk::len)
    }

    /// Exports chunk `index` as a POSIX file descriptor, for another process of the node to import.
    pub fn export_chunk(&self, index: usize) -> Result<OwnedFd, DeviceError> {
        let chunk = self
            .chunks
            .get(index)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("chunk {index} of {}", self.chunks.len())))?;
        chunk.export_fd()
    }

    /// The GPU the memory is on.
    pub fn gpu(&self) -> u16 {
        self.gpu
    }
}

/// Maps the driver's out-of-memory error on chunk creation to the typed error.
fn oom(e: DeviceError, gpu: u16, requested: u64) -> DeviceError {
    match e {
        DeviceError::Cuda { ref name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY" => {
            DeviceError::OutOfDeviceMemory { location: Location::Gpu(gpu), requested, detail: e.to_string() }
        }
        other => other,
    }
}

impl Arena for GpuArena {
    fn location(&self) -> Location {
        Location::Gpu(self.gpu)
    }

    fn len(&self) -> u64 {
        self.range.len()
    }

    fn device_ptr(&self) -> u64 {
        self.range.base()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_bounds(self.location(), self.len(), offset, data.len() as u64)?;
        if data.len() <= STAGING {
            return self.write_staged(offset, &[data]);
        }
        self.ctx.bind()?;
        // SAFETY: the destination range is inside the mapped arena (checked); `data` is valid for its length and
        // stays borrowed until the stream is waited for (a copy from pageable memory may return before its DMA
        // ends).
        unsafe {
            cu!(cuMemcpyHtoDAsync_v2(
                self.range.base() + offset,
                data.as_ptr() as *const std::ffi::c_void,
                data.len(),
                self.stream.raw()
            ))?
        };
        self.stream.synchronize()
    }

    fn write_parts(&self, offset: u64, parts: &[&[u8]]) -> Result<(), DeviceError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        check_bounds(self.location(), self.len(), offset, len)?;
        if len <= STAGING as u64 {
            return self.write_staged(offset, parts);
        }
        write_gathered(self, offset, parts)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        check_bounds(self.location(), self.len(), offset, out.len() as u64)?;
        self.ctx.bind()?;
        // SAFETY: the source range is inside the mapped arena (checked); `out` is valid for its length and stays
        // borrowed until the stream is waited for.
        unsafe {
            cu!(cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr() as *mut std::ffi::c_void,
                self.range.base() + offset,
                out.len(),
                self.stream.raw()
            ))?
        };
        self.stream.synchronize()
    }

    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), DeviceError> {
        check_bounds(self.location(), self.len(), offset, len)?;
        self.ctx.bind()?;
        // SAFETY: the range is inside the mapped arena (checked); the stream is this context's.
        unsafe { cu!(cuMemsetD8Async(self.range.base() + offset, byte, len as usize, self.stream.raw()))? };
        self.stream.synchronize()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn export(&self) -> Result<ExportedArena, DeviceError> {
        let fds = (0..self.chunks.len()).map(|i| self.export_chunk(i)).collect::<Result<Vec<_>, _>>()?;
        let pieces = self.chunks.iter().map(PhysicalChunk::len).collect();
        Ok(ExportedArena {
            share: ArenaShare { location: self.location(), len: self.len(), kind: ShareKind::GpuChunks, pieces },
            fds,
        })
    }
}

impl Drop for GpuArena {
    fn drop(&mut self) {
        // The fields release mappings, chunks and range after this; make sure no queued copy still uses them.
        if let Err(e) = self.ctx.synchronize() {
            tracing::warn!(gpu = self.gpu, error = %e, "synchronising before releasing an arena failed");
        }
    }
}

/// Pinned host memory as an arena: a shared memory file registered with the driver, so the node's other
/// processes can map it too: host memory, or the packed tier (the same memory, holding packed pages).
#[derive(Debug)]
pub struct HostArena {
    mem: RegisteredHostMemory,
    location: Location,
}

impl HostArena {
    pub(crate) fn new(mem: RegisteredHostMemory, location: Location) -> Self {
        HostArena { mem, location }
    }
}

impl Arena for HostArena {
    fn location(&self) -> Location {
        self.location
    }

    fn len(&self) -> u64 {
        self.mem.len()
    }

    fn device_ptr(&self) -> u64 {
        self.mem.device_ptr()
    }

    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.mem.as_ptr())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_bounds(self.location, self.len(), offset, data.len() as u64)?;
        // SAFETY: in bounds (checked); host memory owned by `mem`. Concurrent device access to the same bytes is
        // the caller's to avoid, as for any arena.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_ptr().add(offset as usize), data.len()) };
        Ok(())
    }

    fn write_parts(&self, offset: u64, parts: &[&[u8]]) -> Result<(), DeviceError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        check_bounds(self.location, self.len(), offset, len)?;
        // SAFETY: the pieces together are in bounds (checked), and cannot alias the arena's memory.
        unsafe { copy_parts(self.mem.as_ptr().add(offset as usize), parts) };
        Ok(())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        check_bounds(self.location, self.len(), offset, out.len() as u64)?;
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.as_ptr().add(offset as usize), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), DeviceError> {
        check_bounds(self.location, self.len(), offset, len)?;
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes(self.mem.as_ptr().add(offset as usize), byte, len as usize) };
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
        Ok(ExportedArena { share, fds: vec![self.mem.shared().share()?] })
    }
}
