//! Host reads and writes: where the bytes of a host buffer go to or come from, page by page, and the version
//! of a byte range.

use std::ops::Range;

use vfabric_allocator::{AllocClass, Location};

use super::error::DirectoryError;
use super::page::{Copy, DevIdx, PageRef};
use super::region::RegionHandle;
use super::stage::{Stage, StageKind, Step, Update};
use super::state::Directory;

/// Where a host write puts the bytes of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTarget {
    /// The device of the page's (only) copy.
    pub location: Location,
    /// Its frame.
    pub frame: u32,
    /// Offset within the page.
    pub page_offset: u64,
    /// Offset within the caller's buffer.
    pub buf_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// Where a host read finds the bytes of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPiece {
    /// The copy to read (or zeros).
    pub source: ReadSource,
    /// Offset within the page.
    pub page_offset: u64,
    /// Offset within the caller's buffer.
    pub buf_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// Where a host read finds a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSource {
    /// The page was never written: zeros.
    Zero,
    /// A copy at this device and frame.
    At(Location, u32),
}

impl Directory {
    /// One step of a write of `len` bytes at `offset` from a host buffer: pages never written get a zero-filled
    /// frame on the region's device, evicting to make room or
    /// falling back to host memory; then every page's other copies are dropped, its version bumped, and the
    /// targets returned for the caller to write.
    pub fn step_write(
        &mut self,
        h: &RegionHandle,
        offset: u64,
        len: u64,
    ) -> Result<Step<Vec<WriteTarget>>, DirectoryError> {
        let (first, n) = self.span(h, offset, len)?;
        if !self.in_flight.is_empty() {
            // New bytes would not reach a copy being prefetched.
            return Ok(Step::Wait);
        }
        let ps = self.page_size();
        let slot = h.slot;
        let (home, unbacked) = {
            let r = self.region(h)?;
            for i in first..first + n {
                let p = &r.pages[i as usize];
                if p.leased() {
                    return Err(self.leased_error(h, u64::from(i), p));
                }
            }
            let u: Vec<u32> = (first..first + n).filter(|&i| r.pages[i as usize].owner().is_none()).collect();
            (r.home, u)
        };
        if !unbacked.is_empty() {
            let drawn = self.draw_reservation(slot, home, unbacked.len() as u32);
            let planned = self.plan_unbacked(slot, home, &unbacked, first..first + n);
            return self.settle_draw(drawn, planned, Step::stage_mut);
        }
        // A page kept only on the storage tier or in the compressed tier takes the write in host memory.
        let pages: Vec<u32> = (first..first + n).collect();
        let keep = |p: PageRef| p.slot == slot && p.page >= first && p.page < first + n;
        if let Some(stage) = self.stage_from_storage(slot, &pages, &keep, true)? {
            return Ok(Step::Stage(stage));
        }
        let mut targets = Vec::with_capacity(n as usize);
        for i in first..first + n {
            let page = PageRef { slot, page: i };
            // A page owned by its copy on the storage tier (or in the compressed tier) takes the write in another
            // copy (the one brought up to host memory above, else a GPU's replica): that copy becomes the owner,
            // and the stored one goes with the other copies.
            let owner = self.page(page).owner().map(|c| c.dev);
            if owner.is_some() && (owner == self.storage || owner == self.compressed) {
                let e = self.page(page);
                let up = e.copy_on(self.host_of(slot)).or_else(|| e.sharers().first().copied());
                if let Some(c) = up {
                    self.page_mut(page).promote(c.dev);
                }
            }
            let sharers = self.page_mut(page).take_sharers();
            for c in sharers {
                self.release_frame(c);
            }
            let e = self.page_mut(page);
            e.version += 1;
            let Some(owner) = e.owner() else { continue };
            self.touch(owner);
            let start = u64::from(i) * ps;
            let lo = offset.max(start);
            let hi = (offset + len).min(start + ps);
            targets.push(WriteTarget {
                location: self.loc(owner.dev),
                frame: owner.frame,
                page_offset: lo - start,
                buf_offset: lo - offset,
                len: hi - lo,
            });
        }
        Ok(Step::Done(targets))
    }

    /// The stage giving `unbacked` (pages of region `slot` never written) zero-filled frames on `home`, what
    /// fits there, or all of them in host memory when none does; or the stage making room first, never by
    /// evicting pages of `keep`.
    fn plan_unbacked(
        &mut self,
        slot: u32,
        home: DevIdx,
        unbacked: &[u32],
        keep: Range<u32>,
    ) -> Result<Step<Vec<WriteTarget>>, DirectoryError> {
        let need = unbacked.len() as u32;
        let keep = |p: PageRef| p.slot == slot && keep.contains(&p.page);
        let mut dev = home;
        let evict = self.eviction_need(dev, need);
        if evict > 0 {
            let stage = self.plan_evict(dev, evict, &keep)?;
            if !stage.updates.is_empty() {
                return Ok(Step::Stage(stage));
            }
        }
        let fits = self.available(dev).min(need);
        if fits == 0 {
            dev = self.host_of(slot);
        }
        // On the home device, what fits now; elsewhere (or at home in host memory with no room) all of them.
        let count = if dev == home && fits > 0 { fits } else { need };
        let avail = self.available(dev);
        if self.is_host_memory(dev) && avail < count && self.storage.is_some() {
            // Host memory is full: its least used pages go to the storage tier first.
            let stage = self.plan_evict(dev, count - avail, &keep)?;
            if !stage.updates.is_empty() {
                return Ok(Step::Stage(stage));
            }
        }
        let tenant = self.tenant_of(slot);
        let frames = self.take(dev, count, tenant, AllocClass::Normal)?;
        let mut stage = Stage::new(StageKind::Fetch);
        let loc = self.loc(dev);
        for (&page_idx, &f) in unbacked.iter().zip(&frames) {
            let copy = Copy { dev, frame: f };
            stage.taken.push(copy);
            // Zero-filled even where the write will cover the page: this stage commits before the write
            // runs, and a write that fails later must leave the page reading as zeros, as before it.
            stage.zero.push((loc, f));
            stage.updates.push(Update::Add { page: PageRef { slot, page: page_idx }, copy });
        }
        Ok(Step::Stage(stage))
    }

    /// The version of a byte range: the sum of its pages' versions, which grows whenever a write to one of
    /// them is released (host writes and write leases both bump a page's version), so a copy made at one
    /// version is current exactly while the range's version is unchanged.
    pub fn version(&self, h: &RegionHandle, offset: u64, len: u64) -> Result<u64, DirectoryError> {
        let (first, n) = self.span(h, offset, len)?;
        let r = self.region(h)?;
        Ok((first..first + n).fold(0u64, |v, i| v.wrapping_add(r.pages[i as usize].version)))
    }

    /// Where to read `len` bytes at `offset` into a host buffer: a host copy when there is one (no device
    /// copy needed), else the owner; zeros for pages never written. Refused while a page is leased for writing
    /// (its bytes are changing).
    pub fn plan_read(&mut self, h: &RegionHandle, offset: u64, len: u64) -> Result<Vec<ReadPiece>, DirectoryError> {
        let (first, n) = self.span(h, offset, len)?;
        let ps = self.page_size();
        let mut out = Vec::with_capacity(n as usize);
        for i in first..first + n {
            let page = PageRef { slot: h.slot, page: i };
            let e = self.page(page);
            if e.write_leased {
                return Err(self.leased_error(h, u64::from(i), e));
            }
            let copy = e.copy_on(self.host_of(h.slot)).or(e.owner());
            let source = match copy {
                Some(c) => {
                    self.touch(c);
                    ReadSource::At(self.loc(c.dev), c.frame)
                }
                None => ReadSource::Zero,
            };
            let start = u64::from(i) * ps;
            let lo = offset.max(start);
            let hi = (offset + len).min(start + ps);
            out.push(ReadPiece { source, page_offset: lo - start, buf_offset: lo - offset, len: hi - lo });
        }
        Ok(out)
    }
}
