//! Eviction: the watermarks, how many frames to free before taking more, and the stage that frees them
//! (least recently used and lowest priority first, and in host memory over a storage tier the copies a walk has
//! passed first; the only copy of a page goes one tier down: a GPU's to host memory, host memory's to the
//! storage tier when the node has one, into the frames its tenant reserved there when it has any).

use std::collections::{HashMap, HashSet};

use vfabric_allocator::{AllocClass, FrameState, TenantId};

use super::error::DirectoryError;
use super::page::{Copy, DevIdx, PageRef};
use super::region::Priority;
use super::stage::{Stage, StageKind, Update};
use super::state::Directory;

impl Directory {
    /// How many frames to evict from `dev` before `need` more are taken there: enough for them, and, on a GPU
    /// or in host memory over a storage tier past its high watermark, down to the low watermark.
    pub(super) fn eviction_need(&self, dev: DevIdx, need: u32) -> u32 {
        let d = &self.devs[usize::from(dev)];
        let avail = d.frames.available(AllocClass::Normal);
        let mut evict = need.saturating_sub(avail);
        if d.is_gpu() || self.spills(dev) {
            let (high, low) = self.watermarks(dev);
            let after = u64::from(d.frames.used_frames()) + u64::from(need);
            if after > high {
                evict = evict.max(after.saturating_sub(low).min(u64::from(u32::MAX)) as u32);
            }
        }
        evict
    }

    /// The high and low watermarks of a device, in frames: shares of its ordinary frames (those outside the
    /// headroom), host memory's own over a storage tier ([`Directory::set_host_watermarks`]), the GPUs' elsewhere.
    pub(super) fn watermarks(&self, dev: DevIdx) -> (u64, u64) {
        let d = &self.devs[usize::from(dev)];
        let normal = u64::from(d.frames.frames() - d.frames.reserved_frames());
        let pct = |p: u8| normal * u64::from(p) / 100;
        let (high, low) = if self.spills(dev) {
            self.host_watermarks
        } else {
            (self.cfg.high_watermark_percent, self.cfg.low_watermark_percent)
        };
        (pct(high), pct(low))
    }

    /// Whether `dev` is host memory over a storage tier (host memory's frames or a packed tier's slots; not the
    /// compressed tier, whose copies take runs of blocks): its watermarks apply as a GPU's do, so that it spills
    /// to the storage tier in batches rather than a page for each caller that needs a frame there.
    pub(super) fn spills(&self, dev: DevIdx) -> bool {
        self.storage.is_some() && self.is_host_memory(dev) && Some(dev) != self.compressed
    }

    /// How many copies an eviction of `count` from `dev` takes: `count`, and, in host memory over a storage tier
    /// that `count` more frames would take past its high watermark, enough to bring it down to its low watermark.
    /// (Callers that asked [`Directory::eviction_need`] already count that; those that evict only what they lack
    /// get the batch here.)
    fn batch(&self, dev: DevIdx, count: u32) -> u32 {
        if count == 0 || !self.spills(dev) {
            return count;
        }
        let (high, low) = self.watermarks(dev);
        let used = u64::from(self.devs[usize::from(dev)].frames.used_frames());
        if used + u64::from(count) <= high {
            return count;
        }
        count.max(used.saturating_sub(low).min(u64::from(u32::MAX)) as u32)
    }

    /// Whether one more frame of `dev` takes it past its high watermark.
    fn past_high(&self, dev: DevIdx) -> bool {
        u64::from(self.devs[usize::from(dev)].frames.used_frames()) + 1 > self.watermarks(dev).0
    }

    /// Where the only copy of a page of region `slot` goes when it leaves `dev`: a GPU's to host memory (the
    /// region's: [`Directory::host_of`]), host memory's to the storage tier; `None` below the storage tier, and
    /// below host memory on a node without one.
    pub(super) fn below(&self, dev: DevIdx, slot: u32) -> Option<DevIdx> {
        if self.is_host_memory(dev) {
            self.storage
        } else if Some(dev) == self.storage {
            None
        } else {
            Some(self.host_of(slot))
        }
    }

    /// Plans evicting up to `count` copies from `dev` (in host memory over a storage tier that this takes past
    /// its high watermark, down to its low watermark: [`Directory::batch`]), least recently used and lowest
    /// priority first (in host memory over a storage tier, within each priority, the copies a walk in order has
    /// passed and the storage tier also holds first: drop-behind), never a pinned frame and never a page `keep`
    /// names. A copy that exists elsewhere too is dropped; the only copy of a page goes one tier down (a GPU's
    /// to host memory, host memory's to storage), into a frame its tenant reserved there when it has one. When
    /// host memory is too full for a GPU's pages (or past its high watermark) and the node has a storage tier,
    /// the stage returned evicts host memory instead (the caller asks again). A page whose tenant's quota below
    /// has no room stays (its tenant's own pages below go down a tier first where they can): others go in its
    /// place, so that no call fails for another tenant's quota. Returns an empty stage when nothing can be
    /// evicted.
    pub(super) fn plan_evict(
        &mut self,
        dev: DevIdx,
        count: u32,
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Stage, DirectoryError> {
        let count = self.batch(dev, count);
        self.plan_evict_exactly(dev, count, keep)
    }

    /// [`Directory::plan_evict`] of `count` copies, with no batch: what a reservation evicts.
    pub(super) fn plan_evict_exactly(
        &mut self,
        dev: DevIdx,
        count: u32,
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Stage, DirectoryError> {
        let mut stage = Stage::new(StageKind::Evict);
        if count == 0 {
            return Ok(stage);
        }
        let candidates: Vec<(u32, PageRef)> = {
            let d = &self.devs[usize::from(dev)];
            let listed = d.lru.iter().filter_map(|f| d.users[f as usize].map(|p| (f, p)));
            // Prefetched copies no lease has taken yet go last, each group in its own order.
            let (mut c, fresh): (Vec<_>, Vec<_>) = listed.partition(|&(f, _)| !d.fresh[f as usize]);
            // In host memory, within each priority, copies a walk has passed and the storage tier holds too go
            // first (drop-behind): least recently used would take the pages ahead of it that were here before it
            // started, each written to the storage tier (the only copy) and read back when the walk reaches it,
            // while those behind it cost nothing to drop. (A page written since it was passed has no copy on
            // the storage tier and keeps its place.) GPUs keep plain recency: their evictions cost link time,
            // not the drive's, and a training step's backward pass wants the pages its forward pass left behind.
            if self.is_host_memory(dev) && self.storage.is_some() {
                // Recency stays the order within each group (one pass, not a sort: host memory may hold a
                // million frames).
                let mut groups: [Vec<(u32, PageRef)>; 6] = Default::default();
                for (f, p) in c {
                    let prio = d.lru.priority(f).unwrap_or_default() as usize;
                    groups[2 * prio + usize::from(!self.free_behind(p))].push((f, p));
                }
                c = groups.into_iter().flatten().collect();
            }
            c.extend(fresh);
            c
        };
        let mut plan = Planned::default();
        let mut chosen = 0;
        for (frame, page) in candidates {
            if chosen == count {
                break;
            }
            if keep(page) {
                continue;
            }
            match self.evict_copy(&mut stage, dev, frame, page, &mut plan, count - chosen, keep)? {
                Evicted::Planned => chosen += 1,
                Evicted::Kept | Evicted::OverQuota => {}
                Evicted::Full => break,
                Evicted::Instead(other) => return Ok(other),
            }
        }
        Ok(stage)
    }

    /// Whether a walk of `page`'s region in order (two acquires in a row continuing it) has passed the page
    /// and the storage tier holds a copy of it (so that dropping its copy here costs nothing).
    fn free_behind(&self, page: PageRef) -> bool {
        let stream = self.regions.get(page.slot as usize).and_then(|r| r.as_ref()).and_then(|r| r.stream);
        stream.is_some_and(|s| s.streak >= 1 && page.page < s.next)
            && self.page(page).copies().any(|c| Some(c.dev) == self.storage)
    }

    /// Plans emptying the window of `n` frames of `dev` that costs least to empty, for a run of that length on a
    /// device with none free: its unpinned copies are evicted as [`Directory::plan_evict`] evicts them, those
    /// already written back (dropped, no copy) before those that are not, lower priorities before higher, and
    /// prefetched copies not yet leased last. A window holding a pinned frame or a page `keep` names is not
    /// taken. Returns an empty stage when no window can be emptied.
    ///
    /// On a device that is full (a stream through more than it holds), this replaces evicting the least recently
    /// used pages wherever they lie and then moving pages within the device to join the holes into a run: that
    /// moved about as many bytes again as it evicted, and each acquire waited for both.
    pub(super) fn plan_window_evict(
        &mut self,
        dev: DevIdx,
        n: u32,
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Stage, DirectoryError> {
        let mut stage = Stage::new(StageKind::Evict);
        let Some(start) = self.cheapest_window(dev, n, keep) else { return Ok(stage) };
        let mut plan = Planned::default();
        for frame in start..start + n {
            let Some(page) = self.devs[usize::from(dev)].users[frame as usize] else { continue };
            match self.evict_copy(&mut stage, dev, frame, page, &mut plan, n, keep) {
                Ok(Evicted::Planned) => {}
                Ok(Evicted::Instead(other)) => return Ok(other),
                // The window cannot be emptied after all (the tier below is full, or a tenant's quota there):
                // nothing of it is evicted (reserved frames it took go back to their reservations), and the
                // caller evicts page by page and compacts as it did before windows.
                Ok(Evicted::Kept | Evicted::Full | Evicted::OverQuota) | Err(_) => {
                    self.abort(stage);
                    return Ok(Stage::new(StageKind::Evict));
                }
            }
        }
        Ok(stage)
    }

    /// The first frame of the window of `n` frames of `dev` that costs least to empty (see
    /// [`Directory::plan_window_evict`]), among those that hold no pinned frame and no page `keep` names and
    /// hold at least one page; `None` when there is none.
    fn cheapest_window(&self, dev: DevIdx, n: u32, keep: &dyn Fn(PageRef) -> bool) -> Option<u32> {
        let d = &self.devs[usize::from(dev)];
        let total = d.frames.frames();
        if n == 0 || n > total {
            return None;
        }
        // Where the only copy of a page would go (nothing is below the storage tier, nor below host memory on
        // a node without one): a window holding such a copy cannot be emptied.
        let below = if self.is_host_memory(dev) { self.storage.is_some() } else { Some(dev) != self.storage };
        // Per frame: None where it blocks the window, else what emptying it costs (0 for a free frame).
        let cost = |f: u32| -> Option<u64> {
            match (d.frames.state(f)?, d.users[f as usize]) {
                (FrameState::Free, _) => Some(0),
                (FrameState::Used { .. }, Some(page)) if d.lru.contains(f) && !keep(page) => {
                    let only_copy = self.page(page).copies().count() == 1;
                    if only_copy && !below {
                        return None;
                    }
                    let prio = match d.lru.priority(f) {
                        Some(Priority::High) => 2,
                        Some(Priority::Normal) => 1,
                        _ => 0,
                    };
                    Some(1 + if only_copy { 4 } else { 0 } + prio + if d.fresh[f as usize] { 8 } else { 0 })
                }
                // Taken by a stage in flight, leased, reserved, or a page to keep.
                _ => None,
            }
        };
        let mut w = Window::default();
        for f in 0..n {
            w.add(cost(f));
        }
        let mut best = w.takeable().then_some((w.cost, 0));
        for start in 1..=total - n {
            w.remove(cost(start - 1));
            w.add(cost(start + n - 1));
            if w.takeable() && best.is_none_or(|(b, _)| w.cost < b) {
                best = Some((w.cost, start));
            }
        }
        best.map(|(_, start)| start)
    }

    /// Adds evicting the copy of `page` in `frame` of `dev` to `stage`: dropped when the page has another copy
    /// (counting those `plan` already lets go), else moved one tier down, into a frame its tenant reserved there
    /// when it has one (recorded in the stage, which gives it back to the reservation if it aborts).
    #[allow(clippy::too_many_arguments)]
    fn evict_copy(
        &mut self,
        stage: &mut Stage,
        dev: DevIdx,
        frame: u32,
        page: PageRef,
        plan: &mut Planned,
        wanted: u32,
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Evicted, DirectoryError> {
        let copy = Copy { dev, frame };
        let copies = self.page(page).copies().count() as u32;
        let gone = plan.dropped.get(&page).copied().unwrap_or(0);
        if copies - gone > 1 {
            stage.updates.push(Update::Drop { page, copy });
            *plan.dropped.entry(page).or_default() += 1;
            return Ok(Evicted::Planned);
        }
        // The only copy goes one tier down: a GPU's to host memory (the packed tier for a lossy region's, where
        // the node has one), host memory's to storage.
        let Some(below) = self.below(dev, page.slot) else { return Ok(Evicted::Kept) };
        let f = if let Some((id, f)) = self.lend_reserved(page.slot, below) {
            // Its tenant reserved frames there: it takes one of those (charged to the tenant already), and no
            // other tenant's eviction takes them.
            stage.lent.push((id, Copy { dev: below, frame: f }));
            f
        } else {
            if stage.updates.is_empty() && !plan.no_batch && self.spills(below) && self.past_high(below) {
                // Host memory past its high watermark over a storage tier: it goes down to its low watermark in
                // one stage first, and the caller asks again. (When nothing there can go, the page goes anyway,
                // into the headroom, and this plan does not look again.)
                if let Ok(batch) = self.plan_evict(below, wanted, keep) {
                    if !batch.updates.is_empty() {
                        return Ok(Evicted::Instead(batch));
                    }
                }
                plan.no_batch = true;
            }
            match self.take(below, 1, self.tenant_of(page.slot), AllocClass::Reserved) {
                Ok(f) => f[0],
                Err(e) => return self.below_refused(stage, below, plan, e, wanted, keep),
            }
        };
        let to = Copy { dev: below, frame: f };
        stage.taken.push(to);
        self.copy_page(stage, page.slot, self.loc(dev), self.loc(below), frame, f);
        stage.updates.push(Update::Relocate { page, old: copy, new: to });
        Ok(Evicted::Planned)
    }

    /// What evicting the only copy of `page` does when `below` refused it a frame with `e`.
    ///
    /// Past its tenant's quota there, its tenant's own pages there go a tier down first where they can (host
    /// memory's to the storage tier: the stage returned does that, and the caller asks again); else the page
    /// stays and others go in its place, so that a call of another tenant never fails for this tenant's quota.
    /// When `below` is full, host memory over a storage tier makes room as above, whoever's pages go; a stage
    /// that already frees something is evicted first; else the error stands.
    fn below_refused(
        &mut self,
        stage: &mut Stage,
        below: DevIdx,
        plan: &mut Planned,
        e: DirectoryError,
        wanted: u32,
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Evicted, DirectoryError> {
        if let DirectoryError::QuotaExceeded { tenant, .. } = e {
            if !self.spills(below) || plan.stuck.contains(&tenant) {
                return Ok(Evicted::OverQuota);
            }
            if !stage.updates.is_empty() {
                // What is planned goes first; the next call starts with the room under the quota.
                return Ok(Evicted::Full);
            }
            let theirs: HashSet<u32> =
                self.regions.iter().flatten().filter(|r| r.placement.tenant == tenant).map(|r| r.handle.slot).collect();
            let others = |p: PageRef| keep(p) || !theirs.contains(&p.slot);
            if let Ok(own) = self.plan_evict_exactly(below, wanted, &others) {
                if !own.updates.is_empty() {
                    return Ok(Evicted::Instead(own));
                }
            }
            // The tenant's other pages stay as they are for the rest of this plan: no need to look again.
            plan.stuck.insert(tenant);
            return Ok(Evicted::OverQuota);
        }
        if !stage.updates.is_empty() {
            return Ok(Evicted::Full);
        }
        if self.spills(below) {
            // Host memory is full: make room there first (its pages go to storage), and the caller asks again.
            let cascade = self.plan_evict(below, wanted, keep)?;
            if !cascade.updates.is_empty() {
                return Ok(Evicted::Instead(cascade));
            }
        }
        Err(e)
    }
}

/// What an eviction stage being planned has done and found so far: the copies it drops, by page; and what not
/// to try again (a batch of host memory's evictions, making room under a tenant's quota), so that a plan
/// over many pages that cannot go scans the tier below once, not once a page.
#[derive(Default)]
struct Planned {
    dropped: HashMap<PageRef, u32>,
    no_batch: bool,
    stuck: HashSet<TenantId>,
}

/// A window of frames as it slides: how many of its frames block it, what emptying the others costs, and how
/// many of them hold a page.
#[derive(Default)]
struct Window {
    blocked: u32,
    cost: u64,
    used: u32,
}

impl Window {
    fn add(&mut self, c: Option<u64>) {
        match c {
            None => self.blocked += 1,
            Some(c) => {
                self.cost += c;
                self.used += u32::from(c > 0);
            }
        }
    }

    fn remove(&mut self, c: Option<u64>) {
        match c {
            None => self.blocked -= 1,
            Some(c) => {
                self.cost -= c;
                self.used -= u32::from(c > 0);
            }
        }
    }

    /// Whether it can be emptied and holds something to empty.
    fn takeable(&self) -> bool {
        self.blocked == 0 && self.used > 0
    }
}

/// What [`Directory::evict_copy`] did with one copy.
enum Evicted {
    /// Its eviction is in the stage.
    Planned,
    /// It stays: it is the only copy of its page and nothing is below its tier.
    Kept,
    /// It stays: its tenant's quota on the tier below has no room, and nothing of that tenant can make room.
    OverQuota,
    /// The tier below is full and the stage already frees something: evict what it holds.
    Full,
    /// The tier below is full: this other stage (evicting that tier) comes first, and the caller asks again.
    Instead(Stage),
}
