//! A local client's lease: [`LocalLease`], pointers into the node's memory as mapped in this process.

use std::sync::Arc;

use vfabric_allocator::Location;
use vfabric_transport::{Arena, EngineChoice, Mover, PageBatch, PageMove, TransferReport};

use super::connection::Connection;
use crate::directory::{Mode, RegionHandle as Region};
use crate::error::FabricError;
use crate::fabric::LeasePtr;
use crate::proto::message::Message;

/// A lease a local client holds through its node's agent: the pages stay on the device, at these addresses of
/// this process, until it is released ([`LocalLease::release`], or dropping it). A `Write` lease's changes
/// become the region's bytes when it is released. If the process dies instead, the agent releases it.
pub struct LocalLease {
    client: Arc<Connection>,
    id: u64,
    region: Region,
    device: Location,
    mode: Mode,
    first: u64,
    ptr: LeasePtr,
    arena: Option<Arc<dyn Arena>>,
    mover: Option<Arc<dyn Mover>>,
    page_size: u64,
    released: bool,
}

impl std::fmt::Debug for LocalLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalLease")
            .field("id", &self.id)
            .field("region", &self.region)
            .field("device", &self.device)
            .field("mode", &self.mode)
            .field("ptr", &self.ptr)
            .finish()
    }
}

impl LocalLease {
    /// A lease the agent granted, before its pages are known (dropping it gives it back).
    pub(super) fn new(
        client: Arc<Connection>,
        id: u64,
        region: Region,
        device: Location,
        mode: Mode,
        first: u64,
    ) -> Self {
        let ptr = LeasePtr::Pages(Vec::new());
        LocalLease {
            client,
            id,
            region,
            device,
            mode,
            first,
            ptr,
            arena: None,
            mover: None,
            page_size: 1,
            released: false,
        }
    }

    /// The lease with its pages, in `arena` as this process maps it (and this process's mover).
    pub(super) fn with_pages(
        mut self,
        arena: Arc<dyn Arena>,
        mover: Arc<dyn Mover>,
        ptr: LeasePtr,
        page_size: u64,
    ) -> Self {
        self.arena = Some(arena);
        self.mover = Some(mover);
        self.ptr = ptr;
        self.page_size = page_size;
        self
    }

    /// The lease's id at the agent.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The region.
    pub fn region(&self) -> Region {
        self.region
    }

    /// The device the pages are on.
    pub fn device(&self) -> Location {
        self.device
    }

    /// Read or write.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Offset in the region of the first leased byte (the lease covers whole pages).
    pub fn offset(&self) -> u64 {
        self.first
    }

    /// Bytes covered (whole pages).
    pub fn len(&self) -> u64 {
        match &self.ptr {
            LeasePtr::Contiguous { len, .. } => *len,
            LeasePtr::Pages(p) => p.len() as u64 * self.page_size,
        }
    }

    /// Whether it covers nothing (never, once granted).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The addresses of the leased pages in this process: device pointers on a GPU (valid in this process's CUDA
    /// contexts), host addresses for the host tier and on the emulated device.
    pub fn ptr(&self) -> &LeasePtr {
        &self.ptr
    }

    /// Copies the leased bytes from `offset` (counted from [`LocalLease::offset`]) into `buf`, through this
    /// process's mapping.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let arena = self.arena.as_ref().ok_or(FabricError::UnknownLease(self.id))?;
        self.each(offset, buf.len() as u64, |at, r| Ok(arena.read(at, &mut buf[r])?))
    }

    /// Writes `data` into the leased bytes at `offset` through this process's mapping; a `Write` lease only.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        if self.mode != Mode::Write {
            return Err(FabricError::ReadOnlyLease(self.id));
        }
        let arena = self.arena.as_ref().ok_or(FabricError::UnknownLease(self.id))?;
        self.each(offset, data.len() as u64, |at, r| Ok(arena.write(at, &data[r])?))
    }

    /// Copies every leased page, in order, into frames `0..` of `dst` (an arena of this process, such as an
    /// [`AttachedClient::scratch_arena`](super::AttachedClient::scratch_arena)) with this process's mover, device
    /// to device, and waits for the copy.
    pub fn copy_to(&self, dst: &Arc<dyn Arena>, engine: EngineChoice) -> Result<TransferReport, FabricError> {
        let (Some(arena), Some(mover)) = (&self.arena, &self.mover) else {
            return Err(FabricError::UnknownLease(self.id));
        };
        let frame = |ptr: u64| ((ptr - arena.device_ptr()) / self.page_size) as u32;
        let batch = match &self.ptr {
            LeasePtr::Contiguous { ptr, len } => {
                PageBatch::contiguous(self.page_size, frame(*ptr), 0, (len / self.page_size) as u32)
            }
            LeasePtr::Pages(p) => PageBatch::from_moves(
                self.page_size,
                p.iter().enumerate().map(|(i, &ptr)| PageMove { src: frame(ptr), dst: i as u32 }).collect(),
            ),
        };
        Ok(mover.submit(arena, dst, &batch, engine)?.wait()?)
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
        let base = self.arena.as_ref().map_or(0, |a| a.device_ptr());
        let mut at = offset;
        while at < offset + len {
            let (n, dev) = match &self.ptr {
                LeasePtr::Contiguous { ptr, .. } => (offset + len - at, ptr + at),
                LeasePtr::Pages(p) => {
                    let (page, within) = (at / self.page_size, at % self.page_size);
                    ((self.page_size - within).min(offset + len - at), p[page as usize] + within)
                }
            };
            let from = (at - offset) as usize;
            op(dev - base, from..from + n as usize)?;
            at += n;
        }
        Ok(())
    }

    /// Gives the lease back: after this its pointers must not be used.
    pub fn release(mut self) -> Result<(), FabricError> {
        self.released = true;
        self.client.done(&Message::Release { lease: self.id })
    }
}

impl Drop for LocalLease {
    fn drop(&mut self) {
        if !self.released {
            if let Err(e) = self.client.done(&Message::Release { lease: self.id }) {
                tracing::warn!(lease = self.id, error = %e, "releasing a dropped local lease failed");
            }
        }
    }
}
