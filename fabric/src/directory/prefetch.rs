//! Prefetch: keeping a walk of a region in order ahead of itself, with at most [`PREFETCH_DEPTH`] stages in
//! flight across later calls.

use std::ops::Range;

use vfabric_allocator::{AllocClass, Location};

use super::error::DirectoryError;
use super::page::{Copy, DevIdx, PageEntry, PageRef};
use super::region::RegionHandle;
use super::stage::{Stage, StageKind, Step, Update};
use super::state::{Directory, InFlight};

/// Most prefetch stages in flight at once: one on the link and one queued behind it, so the link stays busy
/// between one completing and the walk asking for the next.
pub const PREFETCH_DEPTH: usize = 2;

/// Most stages in flight at once bringing a GPU walk's pages up from the storage tier to host memory, beside the
/// [`PREFETCH_DEPTH`] going to the GPU: pages on storage take two hops, so their reads run up to two windows
/// ahead of the walk and keep the drive busy while the GPU's prefetches use the link. A stage is half a window
/// (or one of the walk's steps, when they are longer), so four keep both windows' reads queued at the drive at
/// once, as many as the tier's own reads keep in flight
/// when they reach its full speed; two left the drive idle between one landing and the next being asked for.
pub const STAGING_DEPTH: usize = 4;

impl Directory {
    /// One step of keeping a walk in order ahead of itself, called after an acquire of `h` on `device` (and
    /// again after each prefetch it starts, until it returns `Done(None)`). Once two acquires in a row continued
    /// a walk, the pages after it are kept coming: while fewer than a window of them are on the device or on
    /// their way, and fewer than [`PREFETCH_DEPTH`] prefetches are in flight, it returns `Done(Some(stage))`, a
    /// [`StageKind::Prefetch`] stage copying the next chunk (half a window, or the last acquire's size when
    /// larger; pages with a copy elsewhere and none here, in order) into frames taken in one allocation, so that
    /// the acquire that reaches them finds one run. The caller starts its copies and goes on; the stage stays in
    /// flight until it is committed or aborted, and meanwhile the calls that could disturb it return
    /// [`Step::Wait`]. Two in flight keep the link busy between one completing and the walk asking for more.
    /// Chunks with pages only on the storage tier are staged in host memory first, up to two windows ahead and
    /// [`STAGING_DEPTH`] stages at a time, and come on to the device when the window reaches them.
    /// Room is made first, as an ordinary eviction stage of just what the chunk needs past the high watermark
    /// (so that write-backs of dirty pages run beside the prefetches already in flight, the other way over the
    /// link, rather than in one long batch), or down to the low watermark when no run of free frames would
    /// hold the chunk.
    pub fn step_prefetch(&mut self, h: &RegionHandle, device: Location) -> Result<Step<Option<Stage>>, DirectoryError> {
        let dev = self.dev(device)?;
        let slot = h.slot;
        let r = self.region(h)?;
        let total = r.pages.len() as u32;
        let Some(st) = r.stream.filter(|s| s.dev == dev && s.streak >= 1) else { return Ok(Step::Done(None)) };
        // Stages in flight into this device, and into host memory for a device that is not it (staging from
        // storage, and write-backs, which stand for the same traffic).
        let into = |d: DevIdx| self.in_flight.iter().filter(|f| f.moves.first().map(|m| m.1.dev) == Some(d)).count();
        let here = into(dev);
        let up = self.host_of(slot);
        let staging = if self.is_host_memory(dev) { 0 } else { into(up) };
        let cold = self.storage.is_some() || self.compressed.is_some();
        let can_stage = cold && !self.is_host_memory(dev) && staging < STAGING_DEPTH;
        if (here >= PREFETCH_DEPTH && !can_stage) || self.cfg.readahead_pages == 0 {
            return Ok(Step::Done(None));
        }
        // Never more than half of what the device keeps before evicting: a window that does not fit would evict
        // its own pages before the walk reaches them.
        let fits = (self.watermarks(dev).0 / 2).clamp(1, u64::from(u32::MAX)) as u32;
        let window = self.cfg.readahead_pages.max(st.len.saturating_mul(2)).min(fits);
        let chunk = window.div_ceil(2).max(st.len).min(window);
        let end = st.next.saturating_add(window).min(total);
        // Walks of one page a step take pages wherever they are; longer steps want each chunk in one run, so
        // pages already here but elsewhere move into the chunk's run with the rest.
        let runs = st.len > 1;
        let in_flight = |i: u32| self.in_flight.iter().any(|f| f.slot == slot && f.pages.contains(&i));
        let in_place = |from: u32, to: u32| {
            let here: Vec<Option<u32>> =
                (from..to).map(|i| r.pages[i as usize].copy_on(dev).map(|c| c.frame)).collect();
            here.iter().all(Option::is_some)
                && (!runs || here.iter().enumerate().all(|(k, f)| *f == here[0].map(|s| s + k as u32)))
        };
        // Staging from storage looks two windows ahead.
        let stage_end = if can_stage { st.next.saturating_add(window.saturating_mul(2)).min(total) } else { end };
        // Only whole chunks (short at the region's end): small copies waste the link.
        let whole = |from: u32, to: u32, end: u32| from < end && (to <= end || to == total);
        // The first chunk, in the walk's steps, that is neither in place nor on its way and may start now: within
        // the window for the device, within two for staging.
        let mut from = st.next;
        let to = loop {
            let to = from.saturating_add(chunk).min(total);
            if !whole(from, to, stage_end) {
                return Ok(Step::Done(None));
            }
            if !(from..to).any(in_flight) && !in_place(from, to) {
                let stored = !self.is_host_memory(dev) && (from..to).any(|i| self.stored_only(&r.pages[i as usize]));
                if (stored && can_stage) || (!stored && whole(from, to, end) && here < PREFETCH_DEPTH) {
                    break to;
                }
            }
            from = to;
        };
        self.prefetch_chunk(slot, dev, from..to, runs, st.next..stage_end)
    }

    /// Plans copying pages `pages` of region `slot` to `dev` ahead of use (into one run of frames when `runs`),
    /// as a [`StageKind::Prefetch`] stage recorded in flight; `Stage` first when room must be made (never by
    /// evicting pages of `keep`), `Done(None)` when nothing needs to come or no frames can be had.
    pub(super) fn prefetch_chunk(
        &mut self,
        slot: u32,
        dev: DevIdx,
        pages: Range<u32>,
        runs: bool,
        keep: Range<u32>,
    ) -> Result<Step<Option<Stage>>, DirectoryError> {
        let (from, to) = (pages.start, pages.end);
        let Some(r) = self.regions.get(slot as usize).and_then(|r| r.as_ref()) else { return Ok(Step::Done(None)) };
        // Pages only on the storage tier come up one tier at a time: a GPU's chunk that has some is first
        // brought to host memory (file reads in flight while the walk works), and copied on to the GPU by a
        // later step, once they have landed.
        let stored_only = |i: u32| self.stored_only(&r.pages[i as usize]);
        let staging = !self.is_host_memory(dev) && Some(dev) != self.storage && (from..to).any(stored_only);
        let dev = if staging { self.host_of(slot) } else { dev };
        // No runs in the packed tier: it holds no lease to want one, and its pages move only packed or expanded.
        let runs = runs && !staging && !self.loc(dev).is_packed();
        let frames = &self.devs[usize::from(dev)].frames;
        // The pages to copy, in order, up to one that cannot come (leased for writing, pinned where it is, or
        // never written).
        let mut wanted: Vec<(PageRef, Option<Copy>, Copy)> = Vec::new();
        for page in from..to {
            let e = &r.pages[page as usize];
            if e.write_leased {
                break;
            }
            if staging && !stored_only(page) {
                continue;
            }
            match e.copy_on(dev) {
                Some(_) if !runs => continue,
                Some(c) if frames.lease_count(c.frame) > 0 => break,
                Some(c) => wanted.push((PageRef { slot, page }, Some(c), c)),
                None => match self.fetch_source(e) {
                    // A page only on the storage tier or in the compressed tier reaches a GPU through host memory
                    // (staged above).
                    Some(src) if !self.is_cold(src.dev) || self.is_host_memory(dev) => {
                        wanted.push((PageRef { slot, page }, None, src))
                    }
                    _ => break,
                },
            }
        }
        if wanted.iter().all(|w| w.1.is_some()) && (!runs || wanted.len() < 2) {
            return Ok(Step::Done(None));
        }
        // Only pages not on `dev` yet draw on the reservation (one moved into a run frees its old frame to the
        // pool).
        let drawn = self.draw_reservation(slot, dev, wanted.iter().filter(|w| w.1.is_none()).count() as u32);
        let planned = self.plan_prefetch(slot, dev, &wanted, runs, pages, keep);
        self.settle_draw(drawn, planned, |s| match s {
            Step::Stage(s) | Step::Done(Some(s)) => Some(s),
            _ => None,
        })
    }

    /// The prefetch stage copying `wanted` (pages of region `slot` within `pages`, each with its copy on `dev`
    /// to move into the run, if any, and the copy it comes from) to `dev`, recorded in flight; or the stage
    /// making room first (never by evicting pages of `keep`); `Done(None)` when no frames can be had.
    fn plan_prefetch(
        &mut self,
        slot: u32,
        dev: DevIdx,
        wanted: &[(PageRef, Option<Copy>, Copy)],
        runs: bool,
        pages: Range<u32>,
        keep: Range<u32>,
    ) -> Result<Step<Option<Stage>>, DirectoryError> {
        let (from, to) = (pages.start, pages.end);
        let need = wanted.len() as u32;
        let frames = &self.devs[usize::from(dev)].frames;
        let (high, _) = self.watermarks(dev);
        let used = u64::from(frames.used_frames());
        let over = (used + u64::from(need)).saturating_sub(high).min(u64::from(u32::MAX)) as u32;
        let mut evict = need.saturating_sub(self.available(dev)).max(over);
        let no_run = frames.largest_free_run() < need;
        if no_run {
            // No run for the chunk: evict down to the low watermark as an acquire would.
            evict = evict.max(self.eviction_need(dev, need));
        }
        // The walk's own pages ahead stay; those behind it are the least recently used anyway.
        let keep = |p: PageRef| p.slot == slot && keep.contains(&p.page);
        if evict > 0 && no_run && runs {
            // A full device with no run for the chunk: empty the window that costs least (as an acquire does).
            let stage = self.plan_window_evict(dev, need, &keep)?;
            if !stage.updates.is_empty() {
                return Ok(Step::Stage(stage));
            }
        }
        if evict > 0 {
            let stage = self.plan_evict(dev, evict, &keep)?;
            if !stage.updates.is_empty() {
                return Ok(Step::Stage(stage));
            }
        }
        let count = need.min(self.available(dev));
        if count == 0 || (runs && count < need) {
            return Ok(Step::Done(None));
        }
        let d = &self.devs[usize::from(dev)];
        if runs && d.frames.largest_free_run() < count {
            // Make the run first (frames in flight are pinned, so compaction leaves them be). Taking scattered
            // frames instead would make the acquire gather the chunk, and free scattered frames for the next.
            if let Ok(plan) = d.frames.compaction_plan(count) {
                if !plan.is_noop() {
                    return Ok(Step::Stage(self.compaction_stage(dev, plan)));
                }
            }
        }
        let tenant = self.tenant_of(slot);
        let taken = self.take(dev, count, tenant, AllocClass::Normal)?;
        let mut stage = Stage::new(StageKind::Prefetch);
        let to_loc = self.loc(dev);
        let mut moves = Vec::with_capacity(taken.len());
        let mut sources = Vec::new();
        for (&(p, old, src), &f) in wanted.iter().zip(&taken) {
            let new = Copy { dev, frame: f };
            stage.taken.push(new);
            self.copy_page(&mut stage, p.slot, self.loc(src.dev), to_loc, src.frame, f);
            match old {
                Some(old) => stage.updates.push(Update::Relocate { page: p, old, new }),
                None => {
                    stage.updates.push(Update::Add { page: p, copy: new });
                    sources.push(src);
                }
            }
            moves.push((p.page, new, old));
        }
        // Pinned while in flight: no compaction may move a frame no page points to yet, nor a copy being moved;
        // and no eviction or compaction of another device may free or move a frame the copies read (a prefetch
        // from host memory while host memory spills to storage, or from a GPU that evicts to make room).
        for &(_, new, old) in &moves {
            self.pin(new);
            if let Some(old) = old {
                self.pin(old);
            }
        }
        for &c in &sources {
            self.pin(c);
        }
        self.in_flight.push_back(InFlight { slot, pages: from..to, moves, sources });
        Ok(Step::Done(Some(stage)))
    }

    /// Whether a page's only copies are on the storage tier or in the compressed tier (and it may move: not
    /// leased for writing).
    fn stored_only(&self, e: &PageEntry) -> bool {
        !e.write_leased && e.owner().is_some() && e.copies().all(|c| self.is_cold(c.dev))
    }

    /// Whether a device is the storage tier or the compressed tier: no copy engine reaches a GPU from either.
    fn is_cold(&self, dev: DevIdx) -> bool {
        Some(dev) == self.storage || Some(dev) == self.compressed
    }

    /// Whether a stage in flight covers any of `pages` of region `slot`.
    pub(super) fn in_flight_over(&self, slot: u32, pages: Range<u32>) -> bool {
        self.in_flight.iter().any(|f| f.slot == slot && f.pages.start < pages.end && pages.start < f.pages.end)
    }

    /// Prefetch stages in flight.
    pub fn prefetches_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Drops the record of a prefetch stage that is being committed or aborted.
    pub(super) fn forget_in_flight(&mut self, stage: &Stage) {
        if !matches!(stage.kind, StageKind::Prefetch | StageKind::WriteBack) {
            return;
        }
        let first = stage.taken.first().copied();
        if let Some(i) = self.in_flight.iter().position(|f| f.moves.first().map(|m| m.1) == first) {
            if let Some(f) = self.in_flight.remove(i) {
                for (_, new, old) in f.moves {
                    self.unpin(new);
                    if let Some(old) = old {
                        self.unpin(old);
                    }
                }
                for c in f.sources {
                    self.unpin(c);
                }
            }
        }
    }
}
