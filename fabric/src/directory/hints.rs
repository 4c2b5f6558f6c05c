//! Hints from a caller that knows its schedule: bring a range to a device before it is acquired (prefetch), and
//! copy the pages a device alone holds to host memory while the caller works (write-back), so that a later
//! eviction of them is a drop instead of a copy in someone's acquire. Both plan stages that stay in flight
//! across later calls, like the walk's prefetches, at most [`HINT_DEPTH`] in all.

use vfabric_allocator::{AllocClass, Location};

use super::error::DirectoryError;
use super::page::{Copy, PageRef};
use super::region::RegionHandle;
use super::stage::{Stage, StageKind, Step, Update};
use super::state::{Directory, InFlight};

/// Most stages in flight at once when a caller's hints ask for more: enough for a layer's weights and states,
/// in the pieces a caller leases them in, coming in while the previous layer's go out. Past it a hint waits
/// for one to land.
pub const HINT_DEPTH: usize = 128;

impl Directory {
    /// One step of prefetching bytes `offset .. offset + len` of `h` to `device`: `Done(Some(stage))` is a
    /// [`StageKind::Prefetch`] stage copying the pages not yet there into one run (with those already there
    /// but elsewhere, so that the acquire finds one run), in flight until committed; `Done(None)` when they are
    /// in place, on their way, cannot come (leased for writing, never written) or find no frames; `Stage` when
    /// room must be made first (never by evicting the range's own pages); `Wait` when [`HINT_DEPTH`] stages are
    /// in flight.
    pub fn step_prefetch_range(
        &mut self,
        h: &RegionHandle,
        offset: u64,
        len: u64,
        device: Location,
    ) -> Result<Step<Option<Stage>>, DirectoryError> {
        let (first, n) = self.span(h, offset, len)?;
        let dev = self.dev(device)?;
        if Some(dev) == self.storage {
            return Err(DirectoryError::StorageTier("takes no prefetches"));
        }
        if self.loc(dev).is_packed() {
            return Err(DirectoryError::PackedTier("takes no prefetches"));
        }
        if Some(dev) == self.compressed {
            return Err(DirectoryError::CompressedTier("takes no prefetches"));
        }
        let slot = h.slot;
        // A lossy region's pages in host memory live in the packed tier, where the node has one.
        let dev = if dev == self.host { self.host_of(slot) } else { dev };
        let pages = first..first + n;
        if self.in_flight_over(slot, pages.clone()) {
            return Ok(Step::Done(None));
        }
        if self.in_flight.len() >= HINT_DEPTH {
            return Ok(Step::Wait);
        }
        self.prefetch_chunk(slot, dev, pages.clone(), n > 1, pages)
    }

    /// One step of writing back bytes `offset .. offset + len` of `h` from `device`: `Done(Some(stage))` is a
    /// [`StageKind::WriteBack`] stage copying every page whose only copy is on `device` (and that no write lease
    /// holds: its bytes are not final) into host frames, in flight until committed; the device copy then stays
    /// as it was, with a copy in host memory beside it. `Done(None)` when there is no such page; `Wait` when a
    /// stage in flight covers the range or [`HINT_DEPTH`] are in flight. The device's frames are pinned while
    /// the copies run. A host memory too full for the pages is [`DirectoryError::OutOfMemory`].
    pub fn step_write_back(
        &mut self,
        h: &RegionHandle,
        offset: u64,
        len: u64,
        device: Location,
    ) -> Result<Step<Option<Stage>>, DirectoryError> {
        let (first, n) = self.span(h, offset, len)?;
        let dev = self.dev(device)?;
        let slot = h.slot;
        if self.is_host_memory(dev) || Some(dev) == self.storage {
            return Ok(Step::Done(None));
        }
        if self.in_flight.len() >= HINT_DEPTH || self.in_flight_over(slot, first..first + n) {
            return Ok(Step::Wait);
        }
        let r = self.region(h)?;
        let dirty: Vec<(u32, Copy)> = (first..first + n)
            .filter_map(|page| {
                let e = &r.pages[page as usize];
                let only = e.owner().filter(|c| c.dev == dev && e.sharers().is_empty())?;
                (!e.write_leased).then_some((page, only))
            })
            .collect();
        if dirty.is_empty() {
            return Ok(Step::Done(None));
        }
        let tenant = self.tenant_of(slot);
        let up = self.host_of(slot);
        let taken = self.take(up, dirty.len() as u32, tenant, AllocClass::Normal)?;
        let mut stage = Stage::new(StageKind::WriteBack);
        let mut moves = Vec::with_capacity(dirty.len());
        let mut sources = Vec::with_capacity(dirty.len());
        for (&(page, src), &f) in dirty.iter().zip(&taken) {
            let new = Copy { dev: up, frame: f };
            stage.taken.push(new);
            self.copy_page(&mut stage, slot, device, self.loc(up), src.frame, f);
            // The page has an owner (the device copy), so the host copy joins as a replica.
            stage.updates.push(Update::Add { page: PageRef { slot, page }, copy: new });
            moves.push((page, new, None));
            sources.push(src);
        }
        for &(_, new, _) in &moves {
            self.pin(new);
        }
        for &c in &sources {
            self.pin(c);
        }
        self.in_flight.push_back(InFlight { slot, pages: first..first + n, moves, sources });
        Ok(Step::Done(Some(stage)))
    }
}
