//! The directory: which copies of which page live in which frame of which device, and the coherence rules
//! between them. Pure (sans-IO), like quinn-proto: calls take requests and return either a result or a
//! [`Stage`] of copies that the caller (the fabric's I/O layer, or a test's simulated memory) performs and then
//! commits. Nothing here touches memory.
//!
//! Coherence is single writer / multiple readers with invalidation. Every copy of a page holds the same
//! version: a `Read` acquire may replicate a page to another device; a `Write` acquire (or a write from a host
//! buffer) drops every other copy; the release of a write lease bumps the version. A page that was never
//! written has no copy and reads as zeros.
//!
//! Memory is managed per device by the allocator's [`FrameArena`]: when a device passes its high watermark,
//! unleased copies go to host memory in LRU order (lowest priority first) until it is under the low watermark;
//! a copy that exists elsewhere too is simply dropped. A lease wants its pages in one run of frames so a kernel
//! gets one pointer; when the device is too fragmented for that, compaction moves unleased pages within the
//! device first, and only when that cannot work does the lease get one pointer per page. Leased frames are
//! never moved, freed or evicted.

mod lru;
mod types;

use lru::Lru;

pub use types::*;

use std::collections::{BTreeSet, HashMap, VecDeque};

use vfabric_allocator::{
    AllocClass, FrameArena, FrameArenaConfig, FrameRun, GlobalAddr, NodeId, PageSize, QuotaBook, RangeAllocator,
    TenantId, Tier,
};
use vfabric_allocator::{Fit, MAX_OFFSET};
use vfabric_allocator::Location;

use crate::error::FabricError;

/// How the directory manages memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectoryConfig {
    /// This node's id: the high 16 bits of the addresses of regions allocated here.
    pub node: NodeId,
    /// The page size of every region of this node.
    pub page_size: PageSize,
    /// Share of each device's frames only the fabric's own moves may use.
    pub headroom_percent: u8,
    /// How frames are placed.
    pub fit: Fit,
    /// Eviction starts when a GPU's used frames would pass this share of its ordinary frames...
    pub high_watermark_percent: u8,
    /// ...and goes on until they are at or under this share.
    pub low_watermark_percent: u8,
    /// How far ahead of a walk in order pages are prefetched (0: no prefetch): once two acquires in a row
    /// continue a walk, [`Directory::step_prefetch`] keeps up to this many pages (or the last acquire's size,
    /// when larger) after it on its device, fetching the next half-window when fewer remain.
    pub readahead_pages: u32,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            node: NodeId(0),
            page_size: PageSize::MIB_2,
            headroom_percent: 15,
            fit: Fit::FirstFit,
            high_watermark_percent: 90,
            low_watermark_percent: 75,
            readahead_pages: 32,
        }
    }
}

/// One device's frames and the pages in them.
struct DeviceState {
    location: Location,
    frames: FrameArena,
    /// The page whose copy is in each frame.
    users: Vec<Option<PageRef>>,
    /// Eviction order of the frames whose copy is not pinned by a lease.
    lru: Lru,
}

impl DeviceState {
    fn is_gpu(&self) -> bool {
        self.location != Location::Host
    }
}

/// A live region.
#[derive(Debug, Clone)]
pub struct RegionEntry {
    /// The handle its users hold.
    pub handle: RegionHandle,
    /// Where its pages should live and how much they matter.
    pub placement: Placement,
    /// The device new pages go to (the placement's, changed by a migration).
    pub home: DevIdx,
    /// One entry per page.
    pub pages: Vec<PageEntry>,
    /// The walk the last acquires made.
    stream: Option<Stream>,
}

/// Most prefetch stages in flight at once: one on the link and one queued behind it, so the link stays busy
/// between one completing and the walk asking for the next.
pub const PREFETCH_DEPTH: usize = 2;

/// The walk the last acquires of a region made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stream {
    /// The device they were on.
    dev: DevIdx,
    /// The page after the last one acquired.
    next: u32,
    /// How many acquires in a row continued the walk (0 for the first).
    streak: u32,
    /// Pages the last acquire took.
    len: u32,
}

/// A prefetch stage in flight. Every frame it names is pinned until it commits or aborts, so that no
/// compaction moves them: the frames it took (no page points to them yet) and the copies it moves into them.
#[derive(Debug, Clone)]
struct InFlight {
    slot: u32,
    /// The pages it covers (those already in place are not copied).
    pages: std::ops::Range<u32>,
    /// Per page copied: the page, the frame it took, and the page's copy on the device that moves there (into
    /// the run), if it had one.
    moves: Vec<(u32, Copy, Option<Copy>)>,
}

#[derive(Debug, Clone)]
struct LeaseRecord {
    slot: u32,
    first_page: u32,
    dev: DevIdx,
    mode: Mode,
    frames: Vec<u32>,
}

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

/// Figures about one device.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceStats {
    /// The device.
    pub location: Location,
    /// Frames in its arena.
    pub frames: u32,
    /// Frames holding a copy.
    pub used: u32,
    /// Frames pinned by leases.
    pub leased: u32,
    /// The largest run of free frames.
    pub largest_free_run: u32,
    /// Free ranges.
    pub free_ranges: u64,
    /// Pages whose owner copy is here.
    pub owned: u64,
}

/// Figures about the whole directory.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DirectoryStats {
    /// Live regions.
    pub regions: usize,
    /// Pages of live regions.
    pub pages: u64,
    /// Pages never written (no copy anywhere).
    pub unbacked: u64,
    /// Leases held.
    pub leases: usize,
    /// Per device.
    pub devices: Vec<DeviceStats>,
    /// Host memory the directory's own tables take, in bytes (an estimate from the sizes of its structures).
    pub metadata_bytes: u64,
}

/// The directory of one node.
pub struct Directory {
    cfg: DirectoryConfig,
    devs: Vec<DeviceState>,
    host: DevIdx,
    regions: Vec<Option<RegionEntry>>,
    generations: Vec<u64>,
    free_slots: Vec<u32>,
    space: RangeAllocator,
    quotas: QuotaBook,
    leases: HashMap<u64, LeaseRecord>,
    next_lease: u64,
    /// Prefetch stages in flight, oldest first (at most [`PREFETCH_DEPTH`]).
    in_flight: VecDeque<InFlight>,
}

impl Directory {
    /// A directory over `devices` (location and arena size in bytes); exactly one must be the host.
    pub fn new(cfg: DirectoryConfig, devices: &[(Location, u64)]) -> Result<Self, FabricError> {
        if cfg.low_watermark_percent > cfg.high_watermark_percent || cfg.high_watermark_percent > 100 {
            return Err(FabricError::InvalidSize(format!(
                "watermarks low {}% high {}%: need low <= high <= 100",
                cfg.low_watermark_percent, cfg.high_watermark_percent
            )));
        }
        let mut devs = Vec::new();
        for &(location, bytes) in devices {
            let tier = if location == Location::Host { Tier::Host } else { Tier::Gpu };
            let frames = FrameArena::new(
                FrameArenaConfig::new(tier, cfg.page_size, bytes).with_headroom(cfg.headroom_percent).with_fit(cfg.fit),
            )
            .map_err(|e| FabricError::InvalidSize(format!("{location}: {e}")))?;
            let n = frames.frames() as usize;
            devs.push(DeviceState { location, frames, users: vec![None; n], lru: Lru::new(n) });
        }
        if devs.len() > usize::from(DevIdx::MAX) {
            return Err(FabricError::InvalidSize(format!("{} devices", devs.len())));
        }
        let host = devs
            .iter()
            .position(|d| d.location == Location::Host)
            .ok_or_else(|| FabricError::InvalidSize("the directory needs a host arena".into()))?
            as DevIdx;
        let ps = cfg.page_size.bytes();
        let space = RangeAllocator::new((MAX_OFFSET + 1) / ps * ps, ps, Fit::FirstFit)
            .map_err(|e| FabricError::InvalidSize(e.to_string()))?;
        Ok(Directory {
            cfg,
            devs,
            host,
            regions: Vec::new(),
            generations: Vec::new(),
            free_slots: Vec::new(),
            space,
            quotas: QuotaBook::new(),
            leases: HashMap::new(),
            next_lease: 1,
            in_flight: VecDeque::new(),
        })
    }

    /// The page size.
    pub fn page_size(&self) -> u64 {
        self.cfg.page_size.bytes()
    }

    /// The devices, in index order.
    pub fn locations(&self) -> Vec<Location> {
        self.devs.iter().map(|d| d.location).collect()
    }

    /// The index of a device.
    pub fn dev(&self, location: Location) -> Result<DevIdx, FabricError> {
        self.devs
            .iter()
            .position(|d| d.location == location)
            .map(|i| i as DevIdx)
            .ok_or(FabricError::DeviceUnavailable(location))
    }

    fn loc(&self, dev: DevIdx) -> Location {
        self.devs[usize::from(dev)].location
    }

    /// The tenant quotas.
    pub fn quotas_mut(&mut self) -> &mut QuotaBook {
        &mut self.quotas
    }

    // ---------------------------------------------------------------- regions

    /// Allocates a region of `size` bytes (rounded up to whole pages). No memory is taken until pages are
    /// written or acquired.
    pub fn alloc(&mut self, size: u64, placement: Placement) -> Result<RegionHandle, FabricError> {
        if size == 0 {
            return Err(FabricError::InvalidSize("a region of 0 bytes".into()));
        }
        let ps = self.page_size();
        let pages = size.div_ceil(ps);
        if pages > u64::from(u32::MAX) {
            return Err(FabricError::InvalidSize(format!("{size} bytes is more than 2^32 pages")));
        }
        let home = match placement.device {
            Some(l) => self.dev(l)?,
            None => self.pick_gpu(),
        };
        let range = self.space.alloc(pages * ps).map_err(|e| FabricError::InvalidSize(e.to_string()))?;
        let addr = GlobalAddr::new(self.cfg.node, range.start).map_err(|e| FabricError::InvalidSize(e.to_string()))?;
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.regions.push(None);
                self.generations.push(0);
                (self.regions.len() - 1) as u32
            }
        };
        self.generations[slot as usize] += 1;
        let handle =
            RegionHandle { slot, generation: self.generations[slot as usize], addr, len: pages * ps, page_size: ps };
        self.regions[slot as usize] = Some(RegionEntry {
            handle,
            placement,
            home,
            pages: vec![PageEntry::default(); pages as usize],
            stream: None,
        });
        Ok(handle)
    }

    /// The GPU with the most frames available to ordinary allocations (the host when there is none).
    fn pick_gpu(&self) -> DevIdx {
        self.devs
            .iter()
            .enumerate()
            .filter(|(_, d)| d.is_gpu())
            .max_by_key(|(i, d)| (d.frames.available(AllocClass::Normal), std::cmp::Reverse(*i)))
            .map_or(self.host, |(i, _)| i as DevIdx)
    }

    /// The live region `h` names.
    pub fn region(&self, h: &RegionHandle) -> Result<&RegionEntry, FabricError> {
        match self.regions.get(h.slot as usize) {
            // The whole handle must match: one that crossed a wire may name a slot with other bounds.
            Some(Some(r)) if r.handle == *h => Ok(r),
            Some(_) if self.generations[h.slot as usize] >= h.generation => {
                Err(FabricError::UseAfterFree(h.to_string()))
            }
            _ => Err(FabricError::InvalidAddress(h.to_string())),
        }
    }

    fn page(&self, p: PageRef) -> &PageEntry {
        // Callers hold a PageRef only for live regions (taken from `users` or a checked handle).
        &self.regions[p.slot as usize].as_ref().expect("live region").pages[p.page as usize]
    }

    fn page_mut(&mut self, p: PageRef) -> &mut PageEntry {
        &mut self.regions[p.slot as usize].as_mut().expect("live region").pages[p.page as usize]
    }

    fn priority_of(&self, p: PageRef) -> Priority {
        self.regions[p.slot as usize].as_ref().map_or(Priority::Normal, |r| r.placement.priority)
    }

    fn tenant_of(&self, slot: u32) -> TenantId {
        self.regions[slot as usize].as_ref().map_or(TenantId::default(), |r| r.placement.tenant)
    }

    /// Frees a region and every frame its pages hold. Refused while any of its pages is leased; waits for a
    /// prefetch of its pages.
    pub fn free(&mut self, h: &RegionHandle) -> Result<Step<()>, FabricError> {
        let r = match self.region(h) {
            Ok(r) => r,
            Err(FabricError::UseAfterFree(s)) => return Err(FabricError::DoubleFree(s)),
            Err(e) => return Err(e),
        };
        if let Some((i, p)) = r.pages.iter().enumerate().find(|(_, p)| p.leased()) {
            return Err(self.leased_error(h, i as u64, p));
        }
        if self.in_flight.iter().any(|f| f.slot == h.slot) {
            return Ok(Step::Wait);
        }
        let copies: Vec<Copy> = r.pages.iter().flat_map(|p| p.copies().collect::<Vec<_>>()).collect();
        for c in copies {
            self.release_frame(c);
        }
        let addr = h.addr.offset();
        self.regions[h.slot as usize] = None;
        self.free_slots.push(h.slot);
        self.space.free(addr).map_err(|e| FabricError::InvalidAddress(e.to_string()))?;
        Ok(Step::Done(()))
    }

    fn leased_error(&self, h: &RegionHandle, page: u64, p: &PageEntry) -> FabricError {
        let how = if p.write_leased {
            let on = self
                .leases
                .values()
                .find(|l| l.slot == h.slot && l.mode == Mode::Write)
                .map_or(String::new(), |l| format!(" on {}", self.loc(l.dev)));
            format!("for writing{on}")
        } else {
            format!("for reading ({} lease(s))", p.read_leases)
        };
        FabricError::LeasedElsewhere { region: h.to_string(), page, how }
    }

    /// Checks a byte range of a region; returns its first page and page count.
    fn span(&self, h: &RegionHandle, offset: u64, len: u64) -> Result<(u32, u32), FabricError> {
        let r = self.region(h)?;
        let end = offset.checked_add(len);
        if len == 0 || end.is_none_or(|e| e > r.handle.len) {
            return Err(FabricError::OutOfBounds { offset, len, region_len: r.handle.len });
        }
        let ps = self.page_size();
        let first = offset / ps;
        let last = (offset + len).div_ceil(ps);
        Ok((first as u32, (last - first) as u32))
    }

    // ---------------------------------------------------------------- frames

    fn take(&mut self, dev: DevIdx, n: u32, tenant: TenantId, class: AllocClass) -> Result<Vec<u32>, FabricError> {
        let d = &mut self.devs[usize::from(dev)];
        let loc = d.location;
        d.frames
            .alloc(n, tenant, class, &mut self.quotas)
            .map(|a| a.frames().collect())
            .map_err(|e| FabricError::from_alloc(e, loc))
    }

    fn take_run(&mut self, dev: DevIdx, start: u32, n: u32, tenant: TenantId) -> Result<(), FabricError> {
        let d = &mut self.devs[usize::from(dev)];
        let loc = d.location;
        d.frames
            .alloc_at(FrameRun { start, len: n }, tenant, AllocClass::Normal, &mut self.quotas)
            .map(|_| ())
            .map_err(|e| FabricError::from_alloc(e, loc))
    }

    fn untake(&mut self, c: Copy) {
        let d = &mut self.devs[usize::from(c.dev)];
        if let Err(e) = d.frames.free([c.frame], &mut self.quotas) {
            tracing::error!(location = %d.location, frame = c.frame, error = %e, "freeing a frame the directory took failed");
        }
    }

    fn lru_insert(&mut self, c: Copy, prio: Priority) {
        self.devs[usize::from(c.dev)].lru.touch(c.frame, prio);
    }

    fn lru_remove(&mut self, c: Copy) {
        self.devs[usize::from(c.dev)].lru.remove(c.frame);
    }

    /// Marks a copy as just used.
    fn touch(&mut self, c: Copy) {
        let lru = &mut self.devs[usize::from(c.dev)].lru;
        if let Some(p) = lru.priority(c.frame) {
            lru.touch(c.frame, p);
        }
    }

    fn set_user(&mut self, c: Copy, page: PageRef) {
        let prio = self.priority_of(page);
        self.devs[usize::from(c.dev)].users[c.frame as usize] = Some(page);
        self.lru_insert(c, prio);
    }

    fn release_frame(&mut self, c: Copy) {
        self.lru_remove(c);
        self.devs[usize::from(c.dev)].users[c.frame as usize] = None;
        self.untake(c);
    }

    fn pin(&mut self, c: Copy) {
        self.lru_remove(c);
        let d = &mut self.devs[usize::from(c.dev)];
        if let Err(e) = d.frames.lease(c.frame) {
            tracing::error!(location = %d.location, frame = c.frame, error = %e, "pinning a leased frame failed");
        }
    }

    fn unpin(&mut self, c: Copy) {
        let d = &mut self.devs[usize::from(c.dev)];
        match d.frames.unlease(c.frame) {
            Ok(0) => {
                if let Some(p) = d.users[c.frame as usize] {
                    let prio = self.priority_of(p);
                    self.lru_insert(c, prio);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::error!(location = %d.location, frame = c.frame, error = %e, "unpinning failed"),
        }
    }

    /// Frames of `dev` that ordinary allocations may still take.
    fn available(&self, dev: DevIdx) -> u32 {
        self.devs[usize::from(dev)].frames.available(AllocClass::Normal)
    }

    /// How many frames to evict from `dev` before `need` more are taken there: enough for them, and, on a GPU
    /// past its high watermark, down to the low watermark.
    fn eviction_need(&self, dev: DevIdx, need: u32) -> u32 {
        let d = &self.devs[usize::from(dev)];
        let avail = d.frames.available(AllocClass::Normal);
        let mut evict = need.saturating_sub(avail);
        if d.is_gpu() {
            let (high, low) = self.watermarks(dev);
            let after = u64::from(d.frames.used_frames()) + u64::from(need);
            if after > high {
                evict = evict.max(after.saturating_sub(low).min(u64::from(u32::MAX)) as u32);
            }
        }
        evict
    }

    /// The high and low watermarks of a device, in frames.
    fn watermarks(&self, dev: DevIdx) -> (u64, u64) {
        let d = &self.devs[usize::from(dev)];
        let normal = u64::from(d.frames.frames() - d.frames.reserved_frames());
        let pct = |p: u8| normal * u64::from(p) / 100;
        (pct(self.cfg.high_watermark_percent), pct(self.cfg.low_watermark_percent))
    }

    /// Plans evicting up to `count` copies from `dev`, least recently used and lowest priority first, never a
    /// pinned frame and never a page `keep` names. A copy that exists elsewhere too is dropped; the only copy
    /// of a page goes to host memory. Returns an empty stage when nothing can be evicted.
    fn plan_evict(&mut self, dev: DevIdx, count: u32, keep: &dyn Fn(PageRef) -> bool) -> Result<Stage, FabricError> {
        let mut stage = Stage::new(StageKind::Evict);
        if count == 0 {
            return Ok(stage);
        }
        let candidates: Vec<(u32, PageRef)> = {
            let d = &self.devs[usize::from(dev)];
            d.lru.iter().filter_map(|f| d.users[f as usize].map(|p| (f, p))).collect()
        };
        let mut dropped: HashMap<PageRef, u32> = HashMap::new();
        let mut chosen = 0;
        for (frame, page) in candidates {
            if chosen == count {
                break;
            }
            if keep(page) {
                continue;
            }
            let copy = Copy { dev, frame };
            let copies = self.page(page).copies().count() as u32;
            let gone = dropped.get(&page).copied().unwrap_or(0);
            if copies - gone > 1 {
                stage.updates.push(Update::Drop { page, copy });
                *dropped.entry(page).or_default() += 1;
            } else if dev != self.host {
                let tenant = self.tenant_of(page.slot);
                let h = match self.take(self.host, 1, tenant, AllocClass::Reserved) {
                    Ok(f) => f[0],
                    Err(e) => {
                        if stage.updates.is_empty() {
                            self.abort(stage);
                            return Err(e);
                        }
                        break;
                    }
                };
                let host = Copy { dev: self.host, frame: h };
                stage.taken.push(host);
                stage.copy(self.loc(dev), Location::Host, frame, h);
                stage.updates.push(Update::Relocate { page, old: copy, new: host });
            } else {
                continue;
            }
            chosen += 1;
        }
        Ok(stage)
    }

    // ---------------------------------------------------------------- stages

    /// Applies a stage whose copies all arrived.
    pub fn commit(&mut self, stage: Stage) {
        self.forget_in_flight(&stage);
        for u in stage.updates {
            match u {
                Update::Relocate { page, old, new } => {
                    self.page_mut(page).replace(old, new);
                    self.set_user(new, page);
                    self.release_frame(old);
                }
                Update::Add { page, copy } => {
                    self.page_mut(page).add(copy);
                    self.set_user(copy, page);
                }
                Update::Drop { page, copy } => {
                    self.drop_copy(page, copy);
                }
                Update::Compact { dev, plan } => {
                    if let Err(e) = self.devs[usize::from(dev)].frames.apply_plan(&plan) {
                        tracing::error!(error = %e, "applying a compaction plan failed");
                        continue;
                    }
                    for mv in &plan.moves {
                        let (old, new) = (Copy { dev, frame: mv.from }, Copy { dev, frame: mv.to });
                        let Some(page) = self.devs[usize::from(dev)].users[mv.from as usize] else { continue };
                        self.page_mut(page).replace(old, new);
                        let d = &mut self.devs[usize::from(dev)];
                        d.users[mv.from as usize] = None;
                        d.users[mv.to as usize] = Some(page);
                        // The page keeps its place in the eviction order: moved pages made MRU would outlive the
                        // pages around them, leaving scattered frames behind when they finally go.
                        d.lru.replace(mv.from, mv.to);
                    }
                }
            }
        }
    }

    /// Forgets a stage whose copies failed: frees the frames it took. The pages stay where they were.
    pub fn abort(&mut self, stage: Stage) {
        self.forget_in_flight(&stage);
        for c in stage.taken {
            self.untake(c);
        }
    }

    /// Removes one copy of a page, promoting a sharer (a GPU's first) when it was the owner.
    fn drop_copy(&mut self, page: PageRef, copy: Copy) {
        let host = self.host;
        self.page_mut(page).remove(copy, host);
        self.release_frame(copy);
    }

    // ---------------------------------------------------------------- acquire / release

    /// One step of an acquire: either the lease, or the next stage of copies it needs (evictions, compaction,
    /// fetches), after which the caller commits and calls again.
    pub fn step_acquire(&mut self, req: &mut AcquireRequest) -> Result<Step<LeaseGrant>, FabricError> {
        let (first, n) = self.span(&req.region, req.offset, req.len)?;
        let dev = self.dev(req.device)?;
        let slot = req.region.slot;
        {
            let r = self.region(&req.region)?;
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
        if req.mode == Mode::Write && !self.in_flight.is_empty() {
            // A write lease drops the other copies, one of which may be the prefetch's source.
            return Ok(Step::Wait);
        }
        let total = self.devs[usize::from(dev)].frames.frames();
        if n > total {
            return Err(FabricError::OutOfMemory {
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
        if self.in_flight.iter().any(|f| f.slot == slot && f.pages.start < first + n && first < f.pages.end) {
            // Pages of the request are on their way, or moving into a run: their frames change at commit.
            return Ok(Step::Wait);
        }
        let all_here = cur.iter().all(Option::is_some);
        let in_run = all_here && cur.iter().enumerate().all(|(i, f)| *f == cur[0].map(|c| c + i as u32));
        if all_here && (in_run || !req.contiguous) {
            return Ok(Step::Done(self.grant(req, dev, first, cur.into_iter().flatten().collect(), in_run)));
        }
        if !self.in_flight.is_empty() {
            // Stages take frames and evict: only with no prefetch in flight (it may hold pages this one wants).
            return Ok(Step::Wait);
        }
        let tenant = self.tenant_of(slot);
        if req.contiguous {
            // Every page goes into one run, those already here included.
            let evict = self.eviction_need(dev, n);
            if evict > 0 {
                let stage = self.plan_evict(dev, evict, &in_request)?;
                if !stage.updates.is_empty() {
                    return Ok(Step::Stage(stage));
                }
                if self.available(dev) < n {
                    // Nothing more can leave: place page by page where there is room.
                    req.contiguous = false;
                    return self.step_acquire(req);
                }
            }
            let d = &self.devs[usize::from(dev)];
            if d.frames.largest_free_run() < n {
                return match d.frames.compaction_plan(n) {
                    Ok(plan) if !plan.is_noop() => Ok(Step::Stage(self.compaction_stage(dev, plan))),
                    _ => {
                        req.contiguous = false;
                        self.step_acquire(req)
                    }
                };
            }
            let run = self.devs[usize::from(dev)].frames.free_runs().find(|r| r.len >= n).map(|r| r.start);
            let Some(start) = run else {
                req.contiguous = false;
                return self.step_acquire(req);
            };
            self.take_run(dev, start, n, tenant)?;
            let targets: Vec<u32> = (start..start + n).collect();
            return Ok(Step::Stage(self.plan_fetch(dev, &pages, &targets, &cur)));
        }
        // Page by page: only the pages not here yet need frames.
        let missing: Vec<usize> = (0..pages.len()).filter(|&i| cur[i].is_none()).collect();
        let need = missing.len() as u32;
        let evict = self.eviction_need(dev, need);
        if evict > 0 {
            let stage = self.plan_evict(dev, evict, &in_request)?;
            if !stage.updates.is_empty() {
                return Ok(Step::Stage(stage));
            }
            if self.available(dev) < need {
                return Err(FabricError::OutOfMemory {
                    location: req.device,
                    needed: u64::from(need),
                    available: u64::from(self.available(dev)),
                });
            }
        }
        let frames = self.take(dev, need, tenant, AllocClass::Normal)?;
        let sub: Vec<PageRef> = missing.iter().map(|&i| pages[i]).collect();
        let none = vec![None; sub.len()];
        Ok(Step::Stage(self.plan_fetch(dev, &sub, &frames, &none)))
    }

    /// The copy a page is fetched from: a GPU's (NVLink) before the host's; `None` for a page never written.
    fn fetch_source(&self, e: &PageEntry) -> Option<Copy> {
        e.copies().find(|c| self.devs[usize::from(c.dev)].is_gpu()).or_else(|| e.copies().next())
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
                Some(s) => stage.copy(self.loc(s.dev), to, s.frame, new.frame),
                None => stage.zero.push((to, new.frame)),
            }
            stage.updates.push(Update::Add { page, copy: new });
        }
        stage
    }

    /// One step of keeping a walk in order ahead of itself, called after an acquire of `h` on `device` (and
    /// again after each prefetch it starts, until it returns `Done(None)`). Once two acquires in a row continued
    /// a walk, the pages after it are kept coming: while fewer than a window of them are on the device or on
    /// their way, and fewer than [`PREFETCH_DEPTH`] prefetches are in flight, it returns `Done(Some(stage))`, a
    /// [`StageKind::Prefetch`] stage copying the next chunk (half a window, or the last acquire's size when
    /// larger; pages with a copy elsewhere and none here, in order) into frames taken in one allocation, so that
    /// the acquire that reaches them finds one run. The caller starts its copies and goes on; the stage stays in
    /// flight until it is committed or aborted, and meanwhile the calls that could disturb it return
    /// [`Step::Wait`]. Two in flight keep the link busy between one completing and the walk asking for more.
    /// Room is made first, as an ordinary eviction stage of just what the chunk needs past the high watermark
    /// (so that write-backs of dirty pages run beside the prefetches already in flight, the other way over the
    /// link, rather than in one long batch), or down to the low watermark when no run of free frames would
    /// hold the chunk.
    pub fn step_prefetch(&mut self, h: &RegionHandle, device: Location) -> Result<Step<Option<Stage>>, FabricError> {
        let dev = self.dev(device)?;
        let slot = h.slot;
        let r = self.region(h)?;
        let total = r.pages.len() as u32;
        let Some(st) = r.stream.filter(|s| s.dev == dev && s.streak >= 1) else { return Ok(Step::Done(None)) };
        if self.in_flight.len() >= PREFETCH_DEPTH || self.cfg.readahead_pages == 0 {
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
        let frames = &self.devs[usize::from(dev)].frames;
        let in_flight = |i: u32| self.in_flight.iter().any(|f| f.slot == slot && f.pages.contains(&i));
        let in_place = |from: u32, to: u32| {
            let here: Vec<Option<u32>> =
                (from..to).map(|i| r.pages[i as usize].copy_on(dev).map(|c| c.frame)).collect();
            here.iter().all(Option::is_some)
                && (!runs || here.iter().enumerate().all(|(k, f)| *f == here[0].map(|s| s + k as u32)))
        };
        // The first chunk of the window, in the walk's steps, that is neither in place nor on its way.
        let mut from = st.next;
        let to = loop {
            let to = from.saturating_add(chunk).min(total);
            if from >= end || (to > end && to < total) {
                // Only whole chunks (short at the region's end): small copies waste the link.
                return Ok(Step::Done(None));
            }
            if !(from..to).any(in_flight) && !in_place(from, to) {
                break to;
            }
            from = to;
        };
        // The pages to copy, in order, up to one that cannot come (leased for writing, pinned where it is, or
        // never written).
        let mut wanted: Vec<(PageRef, Option<Copy>, Copy)> = Vec::new();
        for page in from..to {
            let e = &r.pages[page as usize];
            if e.write_leased {
                break;
            }
            match e.copy_on(dev) {
                Some(_) if !runs => continue,
                Some(c) if frames.lease_count(c.frame) > 0 => break,
                Some(c) => wanted.push((PageRef { slot, page }, Some(c), c)),
                None => match self.fetch_source(e) {
                    Some(src) => wanted.push((PageRef { slot, page }, None, src)),
                    None => break,
                },
            }
        }
        if wanted.iter().all(|w| w.1.is_some()) && (!runs || wanted.len() < 2) {
            return Ok(Step::Done(None));
        }
        let need = wanted.len() as u32;
        let (high, _) = self.watermarks(dev);
        let used = u64::from(frames.used_frames());
        let over = (used + u64::from(need)).saturating_sub(high).min(u64::from(u32::MAX)) as u32;
        let mut evict = need.saturating_sub(self.available(dev)).max(over);
        if frames.largest_free_run() < need {
            // No run for the chunk: evict down to the low watermark as an acquire would.
            evict = evict.max(self.eviction_need(dev, need));
        }
        if evict > 0 {
            // The walk's own pages ahead stay; those behind it are the least recently used anyway.
            let (lo, hi) = (st.next, end);
            let keep = |p: PageRef| p.slot == slot && p.page >= lo && p.page < hi;
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
        if d.frames.largest_free_run() < count {
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
        for (&(p, old, src), &f) in wanted.iter().zip(&taken) {
            let new = Copy { dev, frame: f };
            stage.taken.push(new);
            stage.copy(self.loc(src.dev), to_loc, src.frame, f);
            match old {
                Some(old) => stage.updates.push(Update::Relocate { page: p, old, new }),
                None => stage.updates.push(Update::Add { page: p, copy: new }),
            }
            moves.push((p.page, new, old));
        }
        // Pinned while in flight: no compaction may move a frame no page points to yet, nor a copy being moved.
        for &(_, new, old) in &moves {
            self.pin(new);
            if let Some(old) = old {
                self.pin(old);
            }
        }
        self.in_flight.push_back(InFlight { slot, pages: from..to, moves });
        Ok(Step::Done(Some(stage)))
    }

    /// Prefetch stages in flight.
    pub fn prefetches_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Drops the record of a prefetch stage that is being committed or aborted.
    fn forget_in_flight(&mut self, stage: &Stage) {
        if stage.kind != StageKind::Prefetch {
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
            }
        }
    }

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
    pub fn release(&mut self, id: u64) -> Result<(), FabricError> {
        let l = self.leases.remove(&id).ok_or(FabricError::UnknownLease(id))?;
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

    // ---------------------------------------------------------------- host reads and writes

    /// One step of a write of `len` bytes at `offset` from a host buffer: pages never written get a zero-filled
    /// frame on the region's device, evicting to make room or
    /// falling back to host memory; then every page's other copies are dropped, its version bumped, and the
    /// targets returned for the caller to write.
    pub fn step_write(
        &mut self,
        h: &RegionHandle,
        offset: u64,
        len: u64,
    ) -> Result<Step<Vec<WriteTarget>>, FabricError> {
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
            let need = unbacked.len() as u32;
            let keep = |p: PageRef| p.slot == slot && p.page >= first && p.page < first + n;
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
                dev = self.host;
            }
            let count = if dev == home { fits } else { need };
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
            return Ok(Step::Stage(stage));
        }
        let mut targets = Vec::with_capacity(n as usize);
        for i in first..first + n {
            let page = PageRef { slot, page: i };
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

    /// The version of a byte range: the sum of its pages' versions, which grows whenever a write to one of
    /// them is released (host writes and write leases both bump a page's version), so a copy made at one
    /// version is current exactly while the range's version is unchanged.
    pub fn version(&self, h: &RegionHandle, offset: u64, len: u64) -> Result<u64, FabricError> {
        let (first, n) = self.span(h, offset, len)?;
        let r = self.region(h)?;
        Ok((first..first + n).fold(0u64, |v, i| v.wrapping_add(r.pages[i as usize].version)))
    }

    /// Where to read `len` bytes at `offset` into a host buffer: a host copy when there is one (no device
    /// copy needed), else the owner; zeros for pages never written. Refused while a page is leased for writing
    /// (its bytes are changing).
    pub fn plan_read(&mut self, h: &RegionHandle, offset: u64, len: u64) -> Result<Vec<ReadPiece>, FabricError> {
        let (first, n) = self.span(h, offset, len)?;
        let ps = self.page_size();
        let mut out = Vec::with_capacity(n as usize);
        for i in first..first + n {
            let page = PageRef { slot: h.slot, page: i };
            let e = self.page(page);
            if e.write_leased {
                return Err(self.leased_error(h, u64::from(i), e));
            }
            let copy = e.copy_on(self.host).or(e.owner());
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

    // ---------------------------------------------------------------- migration and compaction

    /// One step of migrating a region to `device`: new pages will be placed there, and every page with a copy
    /// on another GPU moves there (a copy already there becomes the owner without moving; copies on the other
    /// GPUs are dropped). Pages only in host memory stay there until used. When the device cannot hold them
    /// all, the rest go to host memory, so the region leaves the other GPUs either way. Refused while any page
    /// is leased.
    pub fn step_migrate(&mut self, h: &RegionHandle, device: Location) -> Result<Step<()>, FabricError> {
        let dev = self.dev(device)?;
        let slot = h.slot;
        let pages = {
            let r = self.region(h)?;
            if let Some((i, p)) = r.pages.iter().enumerate().find(|(_, p)| p.leased()) {
                return Err(self.leased_error(h, i as u64, p));
            }
            r.pages.len() as u32
        };
        if !self.in_flight.is_empty() {
            // Copies it drops may be a prefetch's sources.
            return Ok(Step::Wait);
        }
        if let Some(r) = self.regions[slot as usize].as_mut() {
            r.home = dev;
        }
        // Pages with a copy on another GPU, and the copy to move (the owner if it is on a GPU).
        let mut remaining: Vec<(u32, Copy)> = Vec::new();
        for i in 0..pages {
            let page = PageRef { slot, page: i };
            let e = self.page(page);
            let elsewhere: Vec<Copy> =
                e.copies().filter(|c| c.dev != dev && self.devs[usize::from(c.dev)].is_gpu()).collect();
            if elsewhere.is_empty() {
                continue;
            }
            if e.copy_on(dev).is_some() {
                // Already here: make it the owner and let the other GPUs' copies go.
                self.page_mut(page).promote(dev);
                for c in elsewhere {
                    self.drop_copy(page, c);
                }
            } else {
                remaining.push((i, elsewhere[0]));
            }
        }
        if remaining.is_empty() {
            return Ok(Step::Done(()));
        }
        let keep = |p: PageRef| p.slot == slot;
        let want = remaining.len() as u32;
        let mut target = dev;
        if self.devs[usize::from(dev)].is_gpu() {
            let evict = self.eviction_need(dev, want);
            if evict > 0 {
                let stage = self.plan_evict(dev, evict, &keep)?;
                if !stage.updates.is_empty() {
                    return Ok(Step::Stage(stage));
                }
            }
            if self.available(dev) == 0 {
                target = self.host;
            }
        }
        let (count, class) = if target == dev && self.devs[usize::from(dev)].is_gpu() {
            (want.min(self.available(dev)), AllocClass::Normal)
        } else {
            (want, AllocClass::Reserved)
        };
        let tenant = self.tenant_of(slot);
        let frames = self.take(target, count, tenant, class)?;
        let mut stage = Stage::new(StageKind::Migrate);
        let to = self.loc(target);
        for (&(i, old), &f) in remaining.iter().zip(&frames) {
            let page = PageRef { slot, page: i };
            let new = Copy { dev: target, frame: f };
            stage.taken.push(new);
            if target != dev && self.page(page).copy_on(target).is_some() {
                // Going to host memory, which already holds a copy: nothing to move, just let this one go.
                stage.taken.pop();
                self.untake(new);
                stage.updates.push(Update::Drop { page, copy: old });
                continue;
            }
            stage.copy(self.loc(old.dev), to, old.frame, f);
            stage.updates.push(Update::Relocate { page, old, new });
        }
        Ok(Step::Stage(stage))
    }

    /// Plans the moves that leave a run of `n` free frames on `device` (what an acquire does when the device is
    /// fragmented). `Done` when such a run already exists.
    pub fn plan_compaction(&mut self, device: Location, n: u32) -> Result<Step<()>, FabricError> {
        let dev = self.dev(device)?;
        let d = &self.devs[usize::from(dev)];
        if d.frames.largest_free_run() >= n {
            return Ok(Step::Done(()));
        }
        if !self.in_flight.is_empty() {
            // Compaction may move a prefetch's source frames.
            return Ok(Step::Wait);
        }
        let plan = d.frames.compaction_plan(n).map_err(|e| FabricError::from_alloc(e, device))?;
        Ok(Step::Stage(self.compaction_stage(dev, plan)))
    }

    /// The stage that carries out a compaction plan on `dev`.
    fn compaction_stage(&self, dev: DevIdx, plan: vfabric_allocator::CompactionPlan) -> Stage {
        let loc = self.loc(dev);
        let mut stage = Stage::new(StageKind::Compact);
        for mv in &plan.moves {
            stage.copy(loc, loc, mv.from, mv.to);
        }
        stage.updates.push(Update::Compact { dev, plan });
        stage
    }

    // ---------------------------------------------------------------- figures

    /// Figures about every device and the tables themselves.
    pub fn stats(&self) -> DirectoryStats {
        let mut pages = 0u64;
        let mut unbacked = 0u64;
        let mut owned = vec![0u64; self.devs.len()];
        let mut sharer_bytes = 0u64;
        for r in self.regions.iter().flatten() {
            pages += r.pages.len() as u64;
            for p in &r.pages {
                match p.owner() {
                    Some(o) => owned[usize::from(o.dev)] += 1,
                    None => unbacked += 1,
                }
                sharer_bytes += p.heap_bytes() as u64;
            }
        }
        let devices = self
            .devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let f = d.frames.fragmentation();
                DeviceStats {
                    location: d.location,
                    frames: d.frames.frames(),
                    used: d.frames.used_frames(),
                    leased: d.frames.leased_frames(),
                    largest_free_run: d.frames.largest_free_run(),
                    free_ranges: f.free_ranges,
                    owned: owned[i],
                }
            })
            .collect();
        // Per page: its entry (and its replica list); per frame: the reverse map and the eviction order.
        let entry = std::mem::size_of::<PageEntry>() as u64;
        let per_frame = (std::mem::size_of::<Option<PageRef>>() + Lru::BYTES_PER_FRAME) as u64;
        let frames: u64 = self.devs.iter().map(|d| d.users.len() as u64).sum();
        let metadata_bytes = pages * entry + sharer_bytes + frames * per_frame;
        DirectoryStats {
            regions: self.regions.iter().flatten().count(),
            pages,
            unbacked,
            leases: self.leases.len(),
            devices,
            metadata_bytes,
        }
    }

    /// Checks the directory's own invariants (for tests): every copy's frame is used and points back to its
    /// page; no frame holds two copies; pinned frames are exactly the leased copies; no page has two copies on
    /// one device.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen: HashMap<(DevIdx, u32), PageRef> = HashMap::new();
        for (slot, r) in self.regions.iter().enumerate() {
            let Some(r) = r else { continue };
            for (i, p) in r.pages.iter().enumerate() {
                let page = PageRef { slot: slot as u32, page: i as u32 };
                let mut devs = BTreeSet::new();
                if p.owner().is_none() && !p.sharers().is_empty() {
                    return Err(format!("{page:?} has sharers but no owner"));
                }
                for c in p.copies() {
                    if !devs.insert(c.dev) {
                        return Err(format!("{page:?} has two copies on device {}", c.dev));
                    }
                    if let Some(other) = seen.insert((c.dev, c.frame), page) {
                        return Err(format!("frame {:?} holds {page:?} and {other:?}", (c.dev, c.frame)));
                    }
                    let d = &self.devs[usize::from(c.dev)];
                    if d.users[c.frame as usize] != Some(page) {
                        return Err(format!("frame {:?} does not point back to {page:?}", (c.dev, c.frame)));
                    }
                    if d.frames.state(c.frame) == Some(vfabric_allocator::FrameState::Free) {
                        return Err(format!("frame {:?} of {page:?} is free in the allocator", (c.dev, c.frame)));
                    }
                    let pinned = d.frames.lease_count(c.frame) > 0;
                    if pinned == d.lru.contains(c.frame) {
                        return Err(format!(
                            "frame {:?}: pinned {pinned} but LRU membership disagrees",
                            (c.dev, c.frame)
                        ));
                    }
                }
                if p.write_leased && p.read_leases > 0 {
                    return Err(format!("{page:?} is leased for reading and writing"));
                }
            }
        }
        for f in &self.in_flight {
            let Some(r) = self.regions.get(f.slot as usize).and_then(|r| r.as_ref()) else {
                return Err(format!("a prefetch is in flight for freed region slot {}", f.slot));
            };
            for &(page, new, old) in &f.moves {
                let pinned = |c: Copy| self.devs[usize::from(c.dev)].frames.lease_count(c.frame) > 0;
                if !pinned(new) || old.is_some_and(|o| !pinned(o)) {
                    return Err(format!("page {page}'s frames in flight are not pinned"));
                }
                let Some(p) = r.pages.get(page as usize) else {
                    return Err(format!("a prefetch is in flight for page {page} past its region's end"));
                };
                if p.copy_on(new.dev) != old || self.devs[usize::from(new.dev)].users[new.frame as usize].is_some() {
                    return Err(format!("prefetch of page {page} into frame {:?} collides with a copy", new.frame));
                }
            }
        }
        for (di, d) in self.devs.iter().enumerate() {
            let prefetching =
                self.in_flight.iter().flat_map(|f| &f.moves).filter(|m| usize::from(m.1.dev) == di).count();
            let used = (d.users.iter().filter(|u| u.is_some()).count() + prefetching) as u32;
            let unpinned =
                d.users.iter().enumerate().filter(|(f, u)| u.is_some() && d.frames.lease_count(*f as u32) == 0).count();
            if unpinned != d.lru.len() {
                return Err(format!(
                    "{}: {unpinned} unpinned copies but {} in the eviction order",
                    d.location,
                    d.lru.len()
                ));
            }
            if used != d.frames.used_frames() {
                return Err(format!(
                    "{}: {used} frames hold pages but the allocator counts {}",
                    d.location,
                    d.frames.used_frames()
                ));
            }
            for (f, u) in d.users.iter().enumerate() {
                if let Some(p) = u {
                    if !seen.contains_key(&(di as DevIdx, f as u32)) {
                        return Err(format!("{}: frame {f} points to {p:?}, which has no copy there", d.location));
                    }
                }
            }
        }
        Ok(())
    }
}
