//! Acquire and release: one step of an acquire (evict, compact, fetch, then grant the lease), the fetches it
//! plans, and the release that publishes a write lease's new version.

use vfabric_allocator::{AllocClass, Location, TenantId};

use super::error::DirectoryError;
use super::lease::{LeaseFrames, LeaseGrant, LeaseRecord, Mode};
use super::page::{Copy, DevIdx, PageEntry, PageRef};
use super::region::{RegionHandle, Stream};
use super::stage::{Stage, StageKind, Step, Update};
use super::state::Directory;

/// A request to acquire a range, kept across the steps that stage its copies.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The region.
    pub region: RegionHandle,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// The device that will use the pages.
    pub device: Location,
    /// Read or write.
    pub mode: Mode,
    /// Still trying for one run of frames (cleared when compaction cannot make one).
    contiguous: bool,
}

impl AcquireRequest {
    /// A request for `len` bytes at `offset` of `region` on `device`.
    pub fn new(region: RegionHandle, offset: u64, len: u64, device: Location, mode: Mode) -> Self {
        AcquireRequest { region, offset, len, device, mode, contiguous: true }
    }
}

impl Directory {
    /// One step of an acquire: either the lease, or the next stage of copies it needs (evictions, compaction,
    /// fetches), after which the caller commits and calls again.
    pub fn step_acquire(&mut self, req: &mut AcquireRequest) -> Result<Step<LeaseGrant>, DirectoryError> {
        match self.plan_acquire(req) {
            // The frames stages in flight hold (pinned) come free as they land: wait for them before calling
            // the device full.
            Err(DirectoryError::OutOfMemory { .. }) if !self.in_flight.is_empty() => Ok(Step::Wait),
            other => other,
        }
    }

    /// [`Directory::step_acquire`], but for waiting on stages in flight when the device seems full.
    fn plan_acquire(&mut self, req: &mut AcquireRequest) -> Result<Step<LeaseGrant>, DirectoryError> {
        let (first, n) = self.span(&req.region, req.offset, req.len)?;
        let dev = self.dev(req.device)?;
        if Some(dev) == self.storage {
            return Err(DirectoryError::StorageTier("holds no leases"));
        }
        if self.loc(dev).is_packed() {
            return Err(DirectoryError::PackedTier("holds no leases"));
        }
        if Some(dev) == self.compressed {
            return Err(DirectoryError::CompressedTier("holds no leases"));
        }
        let slot = req.region.slot;
        {
            let r = self.region(&req.region)?;
            if dev == self.host && r.placement.compression.is_lossy() {
                return Err(DirectoryError::PackedInHost(req.region));
            }
            for i in first..first + n {
                let p = &r.pages[i as usize];
                let conflict = match req.mode {
                    Mode::Write => p.leased(),
                    Mode::Read => p.write_leased,
                };
                if conflict {
                    return Err(self.leased_error(&req.region, u64::from(i), p));
                }
            }
        }
        let total = self.devs[usize::from(dev)].frames.frames();
        if n > total {
            return Err(DirectoryError::OutOfMemory {
                location: req.device,
                needed: u64::from(n),
                available: u64::from(total),
            });
        }
        let pages: Vec<PageRef> = (first..first + n).map(|page| PageRef { slot, page }).collect();
        let cur: Vec<Option<u32>> = pages.iter().map(|&p| self.page(p).copy_on(dev).map(|c| c.frame)).collect();
        let in_request = |p: PageRef| p.slot == slot && p.page >= first && p.page < first + n;
        if req.contiguous && cur.iter().flatten().any(|&f| self.devs[usize::from(dev)].frames.lease_count(f) > 0) {
            // A page here is pinned by another lease where it is: it cannot move into a run.
            req.contiguous = false;
        }
        if self.in_flight_over(slot, first..first + n) {
            // Pages of the request are on their way, moving into a run, or being written back: their frames
            // change at commit, and a write lease would drop the copies the stage reads.
            return Ok(Step::Wait);
        }
        let all_here = cur.iter().all(Option::is_some);
        let in_run = all_here && cur.iter().enumerate().all(|(i, f)| *f == cur[0].map(|c| c + i as u32));
        if all_here && (in_run || !req.contiguous) {
            return Ok(Step::Done(self.grant(req, dev, first, cur.into_iter().flatten().collect(), in_run)));
        }
        // Stages in flight elsewhere do not hold this one up: those over the request's pages made it wait
        // above, and the frames the others write or read are pinned, so the evictions and compaction planned
        // here leave them be (as a prefetch's own room-making does). Waiting for every one of them made each
        // acquire that needed a copy wait for all write-backs queued at PCIe speed.
        if dev != self.host {
            // Pages only on the storage tier or in the compressed tier come through host memory (expanded into
            // its frames on the CPU, then copied on by the link).
            let away: Vec<u32> = (0..n).filter(|&k| cur[k as usize].is_none()).map(|k| first + k).collect();
            if let Some(stage) = self.stage_from_storage(slot, &away, &in_request, true)? {
                return Ok(Step::Stage(stage));
            }
        }
        let tenant = self.tenant_of(slot);
        if req.contiguous {
            // Every page goes into one run, those already here included; only those not here yet draw on the
            // reservation (a page moved into the run frees its old frame to the pool, not to the reservation,
            // so drawing for it too would drain the reservation by the pages it already held).
            let drawn = self.draw_reservation(slot, dev, cur.iter().filter(|c| c.is_none()).count() as u32);
            let planned = self.plan_run(dev, &pages, &cur, tenant, &in_request);
            if let Some(step) = self.settle_draw(drawn, planned, |s| s.as_mut().and_then(Step::stage_mut))? {
                return Ok(step);
            }
            // No run can be had: page by page where there is room.
            req.contiguous = false;
            return self.plan_acquire(req);
        }
        // Page by page: only the pages not here yet need frames.
        let missing: Vec<PageRef> = (0..pages.len()).filter(|&i| cur[i].is_none()).map(|i| pages[i]).collect();
        let drawn = self.draw_reservation(slot, dev, missing.len() as u32);
        let planned = self.plan_pages(req.device, dev, &missing, tenant, &in_request);
        self.settle_draw(drawn, planned, Step::stage_mut)
    }

    /// The next step of bringing `pages` (whose copies on `dev` are `cur`) into one run of frames there: room
    /// made first (never by evicting pages `keep` names), compaction, then the stage that fetches them into the
    /// run. `None` when no run can be had and the pages should go where there is room.
    fn plan_run(
        &mut self,
        dev: DevIdx,
        pages: &[PageRef],
        cur: &[Option<u32>],
        tenant: TenantId,
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Option<Step<LeaseGrant>>, DirectoryError> {
        let n = pages.len() as u32;
        let evict = self.eviction_need(dev, n);
        if evict > 0 && self.devs[usize::from(dev)].frames.largest_free_run() < n {
            // A full device with no run: empty the window that costs least, instead of evicting pages
            // wherever they lie and then moving others to join the holes.
            let stage = self.plan_window_evict(dev, n, keep)?;
            if !stage.updates.is_empty() {
                return Ok(Some(Step::Stage(stage)));
            }
        }
        if evict > 0 {
            let stage = self.plan_evict(dev, evict, keep)?;
            if !stage.updates.is_empty() {
                return Ok(Some(Step::Stage(stage)));
            }
            if self.available(dev) < n {
                // What stages in flight pin comes free as they land; else nothing more can leave.
                return Ok((!self.in_flight.is_empty()).then_some(Step::Wait));
            }
        }
        let d = &self.devs[usize::from(dev)];
        if d.frames.largest_free_run() < n {
            return Ok(match d.frames.compaction_plan(n) {
                Ok(plan) if !plan.is_noop() => Some(Step::Stage(self.compaction_stage(dev, plan))),
                // Every window holds a pinned frame: those of stages in flight come free as they land.
                _ if !self.in_flight.is_empty() => Some(Step::Wait),
                _ => None,
            });
        }
        let run = self.devs[usize::from(dev)].frames.free_runs().find(|r| r.len >= n).map(|r| r.start);
        let Some(start) = run else { return Ok(None) };
        self.take_run(dev, start, n, tenant)?;
        let targets: Vec<u32> = (start..start + n).collect();
        Ok(Some(Step::Stage(self.plan_fetch(dev, pages, &targets, cur))))
    }

    /// The next step of bringing `missing` (pages with no copy on `dev`, of a request for `device`) to `dev`,
    /// each into whatever frame is free: room made first (never by evicting pages `keep` names), then the stage
    /// that fetches them.
    fn plan_pages(
        &mut self,
        device: Location,
        dev: DevIdx,
        missing: &[PageRef],
        tenant: TenantId,
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Step<LeaseGrant>, DirectoryError> {
        let need = missing.len() as u32;
        let evict = self.eviction_need(dev, need);
        if evict > 0 {
            let stage = self.plan_evict(dev, evict, keep)?;
            if !stage.updates.is_empty() {
                return Ok(Step::Stage(stage));
            }
            if self.available(dev) < need {
                return Err(DirectoryError::OutOfMemory {
                    location: device,
                    needed: u64::from(need),
                    available: u64::from(self.available(dev)),
                });
            }
        }
        let frames = self.take(dev, need, tenant, AllocClass::Normal)?;
        let none = vec![None; missing.len()];
        Ok(Step::Stage(self.plan_fetch(dev, missing, &frames, &none)))
    }

    /// The copy a page is fetched from: a GPU's (NVLink) before host memory's (packed or not), host memory's
    /// before the compressed tier's (expanded on the CPU), that before the storage tier's; `None` for a page
    /// never written.
    pub(super) fn fetch_source(&self, e: &PageEntry) -> Option<Copy> {
        let host = |c: &Copy| self.is_host_memory(c.dev) && Some(c.dev) != self.compressed;
        e.copies()
            .find(|c| self.devs[usize::from(c.dev)].is_gpu())
            .or_else(|| e.copies().find(host))
            .or_else(|| e.copies().find(|c| self.is_host_memory(c.dev)))
            .or_else(|| e.copies().next())
    }

    /// A stage bringing to host memory (the region's: [`Directory::host_of`]) those of `pages` (of region
    /// `slot`) whose only copy is on the storage tier, so that they can go on to a GPU (no mover reaches storage)
    /// or take a host write; `None` when there is none. With `compressed`, also those whose only copies are there
    /// or in the compressed tier, brought up from the compressed tier: expanded on the CPU into host memory's
    /// frames, from where the link takes them on to a GPU, and where a write can change them (a run cannot
    /// take a write: it changes the page's packed length). Host memory makes room first (its least used pages go to storage), never
    /// from pages `keep` names.
    pub(super) fn stage_from_storage(
        &mut self,
        slot: u32,
        pages: &[u32],
        keep: &dyn Fn(PageRef) -> bool,
        compressed: bool,
    ) -> Result<Option<Stage>, DirectoryError> {
        let cold = |d: DevIdx| Some(d) == self.storage || (compressed && Some(d) == self.compressed);
        if !(0..self.devs.len()).any(|d| cold(d as DevIdx)) {
            return Ok(None);
        }
        let stored: Vec<(u32, Copy)> = pages
            .iter()
            .filter_map(|&i| {
                let e = self.page(PageRef { slot, page: i });
                let from = e.copies().find(|c| Some(c.dev) == self.compressed).or(e.owner());
                from.filter(|_| e.copies().all(|c| cold(c.dev))).map(|c| (i, c))
            })
            .collect();
        if stored.is_empty() {
            return Ok(None);
        }
        let up = self.host_of(slot);
        let drawn = self.draw_reservation(slot, up, stored.len() as u32);
        let planned = self.plan_up(slot, up, &stored, keep);
        self.settle_draw(drawn, planned, |s| s.as_mut())
    }

    /// The stage bringing `stored` (pages of region `slot`, each with the copy it comes from) to `up`, host
    /// memory; or the stage making room there first, never by evicting pages `keep` names.
    fn plan_up(
        &mut self,
        slot: u32,
        up: DevIdx,
        stored: &[(u32, Copy)],
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Option<Stage>, DirectoryError> {
        let need = stored.len() as u32;
        let avail = self.available(up);
        if avail < need {
            let stage = self.plan_evict(up, need - avail, keep)?;
            if !stage.updates.is_empty() {
                return Ok(Some(stage));
            }
            return Err(DirectoryError::OutOfMemory {
                location: self.loc(up),
                needed: u64::from(need),
                available: u64::from(avail),
            });
        }
        let frames = self.take(up, need, self.tenant_of(slot), AllocClass::Normal)?;
        let mut stage = Stage::new(StageKind::Fetch);
        for (&(i, src), f) in stored.iter().zip(frames) {
            let new = Copy { dev: up, frame: f };
            stage.taken.push(new);
            stage.copy(self.loc(src.dev), self.loc(up), src.frame, f);
            stage.updates.push(Update::Add { page: PageRef { slot, page: i }, copy: new });
        }
        Ok(Some(stage))
    }

    /// Copies `pages` into `targets` (already taken) on `dev`: from their copy on `dev` when they have one
    /// (`cur`), else from a GPU copy (NVLink) before a host copy, else zeros.
    fn plan_fetch(&mut self, dev: DevIdx, pages: &[PageRef], targets: &[u32], cur: &[Option<u32>]) -> Stage {
        let mut stage = Stage::new(StageKind::Fetch);
        let to = self.loc(dev);
        for (i, &page) in pages.iter().enumerate() {
            let new = Copy { dev, frame: targets[i] };
            stage.taken.push(new);
            if let Some(old) = cur[i] {
                stage.copy(to, to, old, new.frame);
                stage.updates.push(Update::Relocate { page, old: Copy { dev, frame: old }, new });
                continue;
            }
            match self.fetch_source(self.page(page)) {
                Some(s) => self.copy_page(&mut stage, page.slot, self.loc(s.dev), to, s.frame, new.frame),
                None => stage.zero.push((to, new.frame)),
            }
            stage.updates.push(Update::Add { page, copy: new });
        }
        stage
    }

    /// Grants the lease on pages already in `frames` of `dev`: pins them, and for a write drops every other copy.
    fn grant(&mut self, req: &AcquireRequest, dev: DevIdx, first: u32, frames: Vec<u32>, in_run: bool) -> LeaseGrant {
        let slot = req.region.slot;
        for (i, &f) in frames.iter().enumerate() {
            let page = PageRef { slot, page: first + i as u32 };
            let here = Copy { dev, frame: f };
            if req.mode == Mode::Write {
                let others: Vec<Copy> = self.page(page).copies().filter(|c| *c != here).collect();
                for c in others {
                    self.release_frame(c);
                }
                let e = self.page_mut(page);
                e.keep_only(here);
                e.write_leased = true;
            } else {
                self.page_mut(page).read_leases += 1;
            }
            self.pin(here);
            // Taken: from now on it ages like any other copy.
            self.devs[usize::from(dev)].fresh[f as usize] = false;
        }
        let n = frames.len() as u32;
        if let Some(r) = self.regions[slot as usize].as_mut() {
            let streak = match r.stream {
                Some(s) if s.dev == dev && s.next == first => s.streak + 1,
                _ => 0,
            };
            r.stream = Some(Stream { dev, next: first + n, streak, len: n });
        }
        let id = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(id, LeaseRecord { slot, first_page: first, dev, mode: req.mode, frames: frames.clone() });
        let frames = if in_run {
            LeaseFrames::Run { first: frames[0], len: frames.len() as u32 }
        } else {
            LeaseFrames::Pages(frames)
        };
        LeaseGrant { id, device: req.device, frames, first_page: first, mode: req.mode }
    }

    /// Releases a lease; a write lease publishes a new version of its pages.
    pub fn release(&mut self, id: u64) -> Result<(), DirectoryError> {
        let l = self.leases.remove(&id).ok_or(DirectoryError::UnknownLease(id))?;
        for (i, &f) in l.frames.iter().enumerate() {
            let page = PageRef { slot: l.slot, page: l.first_page + i as u32 };
            let e = self.page_mut(page);
            match l.mode {
                Mode::Write => {
                    e.write_leased = false;
                    e.version += 1;
                }
                Mode::Read => e.read_leases = e.read_leases.saturating_sub(1),
            }
            self.unpin(Copy { dev: l.dev, frame: f });
        }
        Ok(())
    }
}
