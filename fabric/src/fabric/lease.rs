//! Leases: the right to use a range of a region on one device, and the bytes under it.

use std::sync::Arc;

use vfabric_allocator::Location;
use vfabric_transport::{Arena, EngineChoice, PageBatch, PageMove, TransferReport};

use super::node::{lock, Inner};
use crate::directory::{Mode, RegionHandle as Region};
use crate::error::FabricError;

/// Where a lease's pages are on its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeasePtr {
    /// One device pointer over the whole range (the pages sit in one run of frames, in order).
    Contiguous {
        /// Device pointer to the first page.
        ptr: u64,
        /// Bytes (whole pages).
        len: u64,
    },
    /// One device pointer per page, in page order (the device was too fragmented for one run).
    Pages(Vec<u64>),
}

/// The right to use a range of a region on one device. Its pages stay on that device, at these addresses,
/// until it is released ([`Fabric::release`], or dropping it). A `Write` lease's changes become the region's
/// bytes when it is released.
pub struct Lease {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: u64,
    pub(crate) region: Region,
    pub(crate) device: Location,
    pub(crate) mode: Mode,
    pub(crate) first_page: u32,
    pub(crate) frames: Vec<u32>,
    pub(crate) ptr: LeasePtr,
    pub(crate) released: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("region", &self.region)
            .field("device", &self.device)
            .field("mode", &self.mode)
            .field("ptr", &self.ptr)
            .finish()
    }
}

impl Lease {
    /// Device pointers to the leased pages.
    pub fn ptr(&self) -> &LeasePtr {
        &self.ptr
    }

    /// The device.
    pub fn device(&self) -> Location {
        self.device
    }

    /// Read or write.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The region.
    pub fn region(&self) -> Region {
        self.region
    }

    /// Offset in the region of the first leased byte (the lease covers whole pages).
    pub fn offset(&self) -> u64 {
        u64::from(self.first_page) * self.region.page_size
    }

    /// Bytes covered (whole pages).
    pub fn len(&self) -> u64 {
        self.frames.len() as u64 * self.region.page_size
    }

    /// Whether it covers nothing (never: leases cover at least one page).
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The frames of the device's arena that hold the pages, in page order (for tools that move them with the
    /// node's mover, such as the benchmarks).
    pub fn frames(&self) -> &[u32] {
        &self.frames
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.released {
            // A release only unpins and counts versions: it never conflicts with a parked stage, so it applies
            // at once even then (its pages are readable again, as the caller expects).
            let r = lock(&self.inner.state).dir.release(self.id);
            if let Err(e) = r {
                tracing::warn!(lease = self.id, error = %e, "releasing a dropped lease failed");
            }
        }
    }
}

impl Lease {
    /// The bytes under this lease (see [`LeasedPages`]).
    pub fn pages(&self) -> LeasedPages {
        let dir = &lock(&self.inner.state).dir;
        // The lease's device has an arena: the lease was granted there.
        let arena = self.inner.arena(dir, self.device).map(Arc::clone);
        LeasedPages {
            arena: arena.ok(),
            frames: self.frames.clone(),
            page_size: self.region.page_size,
            writable: self.mode == Mode::Write,
            mover: Arc::clone(&self.inner.mover),
            lease: self.id,
        }
    }

    /// Copies the leased bytes from `offset` (counted from [`Lease::offset`]) into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.pages().read(offset, buf)
    }

    /// Writes `data` into the leased bytes at `offset` (counted from [`Lease::offset`]); a `Write` lease only.
    /// The bytes become the region's when the lease is released.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        self.pages().write(offset, data)
    }
}

/// The bytes under a lease, on its device, page by page at the lease's frames: read, written, filled, or copied
/// by the node's mover into an arena of the caller's. What a kernel does through the lease's pointers, from the
/// host: for tools, tests and the agent, which move a lease's bytes themselves. Offsets count from the lease's
/// first byte. Use it only while the lease is held.
#[derive(Clone)]
pub struct LeasedPages {
    arena: Option<Arc<dyn Arena>>,
    mover: Arc<dyn vfabric_transport::Mover>,
    frames: Vec<u32>,
    page_size: u64,
    writable: bool,
    lease: u64,
}

impl LeasedPages {
    /// Bytes covered (whole pages).
    pub fn len(&self) -> u64 {
        self.frames.len() as u64 * self.page_size
    }

    /// Whether it covers nothing (never: leases cover at least one page).
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    fn arena(&self) -> Result<&Arc<dyn Arena>, FabricError> {
        self.arena.as_ref().ok_or(FabricError::UnknownLease(self.lease))
    }

    /// Runs `op(arena offset, range in the caller's buffer)` for each page's part of `offset..offset + len`.
    fn each(
        &self,
        offset: u64,
        len: u64,
        mut op: impl FnMut(u64, std::ops::Range<usize>) -> Result<(), FabricError>,
    ) -> Result<(), FabricError> {
        let total = self.len();
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(FabricError::OutOfBounds { offset, len, region_len: total });
        }
        let ps = self.page_size;
        let mut at = offset;
        while at < offset + len {
            let (page, within) = (at / ps, at % ps);
            let n = (ps - within).min(offset + len - at);
            let from = (at - offset) as usize;
            op(u64::from(self.frames[page as usize]) * ps + within, from..from + n as usize)?;
            at += n;
        }
        Ok(())
    }

    /// Copies the bytes at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let arena = self.arena()?;
        self.each(offset, buf.len() as u64, |at, r| Ok(arena.read(at, &mut buf[r])?))
    }

    /// Writes `data` at `offset`; refused for a `Read` lease.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let arena = self.writable_arena()?;
        self.each(offset, data.len() as u64, |at, r| Ok(arena.write(at, &data[r])?))
    }

    /// Sets `len` bytes at `offset` to `byte` on the device (a device memset); refused for a `Read` lease.
    pub fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), FabricError> {
        let arena = self.writable_arena()?;
        self.each(offset, len, |at, r| Ok(arena.fill(at, r.len() as u64, byte)?))
    }

    fn writable_arena(&self) -> Result<&Arc<dyn Arena>, FabricError> {
        match self.writable {
            true => self.arena(),
            false => Err(FabricError::ReadOnlyLease(self.lease)),
        }
    }

    /// Copies every leased page, in order, into frames `0..` of `dst` (an arena of the caller's, of this node)
    /// with the node's mover and `engine`, and waits for the copy: a device copy through the lease's pages.
    pub fn copy_to(&self, dst: &Arc<dyn Arena>, engine: EngineChoice) -> Result<TransferReport, FabricError> {
        let moves = self.frames.iter().enumerate().map(|(i, &src)| PageMove { src, dst: i as u32 }).collect();
        let batch = PageBatch::from_moves(self.page_size, moves);
        Ok(self.mover.submit(self.arena()?, dst, &batch, engine)?.wait()?)
    }
}
