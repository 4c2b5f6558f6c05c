//! One device's physical memory as page-sized frames: allocation with quotas and headroom,
//! leases that pin frames, and compaction plans.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::addr::PageSize;
use crate::error::AllocError;
use crate::extent::{Fragmentation, FreeExtents};
use crate::fit::Fit;
use crate::quota::{QuotaBook, TenantId, Tier};

/// The headroom [`FrameArenaConfig::new`] reserves for the fabric's own use, in percent.
pub const DEFAULT_HEADROOM_PERCENT: u8 = 15;

fn default_headroom() -> u8 {
    DEFAULT_HEADROOM_PERCENT
}

/// How a [`FrameArena`] is sized and how it places frames.
///
/// Deserialisable from a configuration file; `frame_size` (bytes, default 2 MiB),
/// `budget_bytes` (default none), `headroom_percent` (default 15) and `fit` (default
/// `"first-fit"`) may be left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrameArenaConfig {
    /// The tier this arena's memory belongs to; quotas are charged against it.
    pub tier: Tier,
    /// Size of one frame.
    #[serde(default)]
    pub frame_size: PageSize,
    /// Bytes of physical memory in the arena.
    pub capacity_bytes: u64,
    /// Optional cap below the capacity, e.g. to run a 141 GB GPU as an 8 GiB one. A budget
    /// above the capacity has no effect.
    #[serde(default)]
    pub budget_bytes: Option<u64>,
    /// Percentage of frames (rounded up) that only [`AllocClass::Reserved`] allocations may
    /// use. At most 100.
    #[serde(default = "default_headroom")]
    pub headroom_percent: u8,
    /// Placement policy for contiguous runs.
    #[serde(default)]
    pub fit: Fit,
}

impl FrameArenaConfig {
    /// An arena of `capacity_bytes` on `tier` with no budget cap, 15% headroom and first-fit.
    pub fn new(tier: Tier, frame_size: PageSize, capacity_bytes: u64) -> Self {
        Self {
            tier,
            frame_size,
            capacity_bytes,
            budget_bytes: None,
            headroom_percent: DEFAULT_HEADROOM_PERCENT,
            fit: Fit::FirstFit,
        }
    }

    /// The same configuration, capped at `budget_bytes`.
    pub fn with_budget(mut self, budget_bytes: u64) -> Self {
        self.budget_bytes = Some(budget_bytes);
        self
    }

    /// The same configuration with `percent` headroom.
    pub fn with_headroom(mut self, percent: u8) -> Self {
        self.headroom_percent = percent;
        self
    }

    /// The same configuration with another placement policy.
    pub fn with_fit(mut self, fit: Fit) -> Self {
        self.fit = fit;
        self
    }
}

/// Who an allocation is for, which decides whether it may use the headroom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AllocClass {
    /// Ordinary tenant allocations: limited to `frames - reserved_frames` used frames.
    #[default]
    Normal,
    /// The fabric's own use (migration targets, fetches during eviction, compaction): may
    /// use every frame. The headroom exists so these never deadlock behind tenants that
    /// filled the device.
    Reserved,
}

/// What a frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameState {
    /// Not allocated.
    Free,
    /// Allocated to a tenant.
    Used {
        /// The tenant whose quota the frame is charged to.
        tenant: TenantId,
    },
}

/// A run of consecutive frames `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrameRun {
    /// First frame.
    pub start: u32,
    /// Number of frames.
    pub len: u32,
}

impl FrameRun {
    /// One past the last frame. Saturates at `u32::MAX`; runs made by a [`FrameArena`]
    /// never do, since frame ids are below the arena's frame count.
    pub const fn end(&self) -> u32 {
        self.start.saturating_add(self.len)
    }

    /// Whether `frame` lies in the run.
    pub const fn contains(&self, frame: u32) -> bool {
        frame >= self.start && frame < self.end()
    }

    /// The frames of the run, in order.
    pub fn iter(&self) -> std::ops::Range<u32> {
        self.start..self.end()
    }
}

impl IntoIterator for FrameRun {
    type Item = u32;
    type IntoIter = std::ops::Range<u32>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The frames handed out by one [`FrameArena::alloc`]: one run when a contiguous extent was
/// available, otherwise the fewest runs that add up to the request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FrameAlloc {
    /// The runs, in address order. They never overlap or touch.
    pub runs: Vec<FrameRun>,
}

impl FrameAlloc {
    /// Every frame, run by run in address order. Page `i` of the allocation is backed by the
    /// `i`-th frame of this iterator.
    pub fn frames(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flat_map(FrameRun::iter)
    }

    /// Number of frames (saturating at `u32::MAX` for hand-built values).
    pub fn len(&self) -> u32 {
        self.runs.iter().fold(0u32, |acc, r| acc.saturating_add(r.len))
    }

    /// Whether it holds no frame.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the frames form a single run.
    pub fn is_contiguous(&self) -> bool {
        self.runs.len() <= 1
    }
}

/// One page copy that compaction needs: the caller copies frame `from` to frame `to`, then
/// tells the arena with [`FrameArena::apply_move`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameMove {
    /// The used frame to vacate.
    pub from: u32,
    /// The free frame that receives its contents.
    pub to: u32,
}

/// How to obtain a free run of frames: copy each page of `moves`, then `target` is free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionPlan {
    /// The run that is entirely free once every move is applied.
    pub target: FrameRun,
    /// The page copies to perform, sources in ascending order. Empty when `target` is
    /// already free.
    pub moves: Vec<FrameMove>,
}

impl CompactionPlan {
    /// Whether the target is already free and nothing needs copying.
    pub fn is_noop(&self) -> bool {
        self.moves.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Slot {
    /// `None` when free.
    owner: Option<TenantId>,
    /// Outstanding leases; only non-zero on used frames.
    leases: u32,
}

/// One device's memory budget as page-sized frames.
///
/// # Headroom
///
/// `reserved_frames = ceil(frames * headroom_percent / 100)` frames are kept back from
/// ordinary use: [`AllocClass::Normal`] allocations succeed only while the arena's *total*
/// used frames stay at or below `frames - reserved_frames`; [`AllocClass::Reserved`]
/// allocations may use every frame. The reservation is a count, not a region: no particular
/// frames are set aside, so it never fragments the arena. Frames used by reserved
/// allocations count towards the total, so they shrink what normal allocations can get.
///
/// # Leases
///
/// A lease pins a used frame (e.g. while a transfer reads it): a leased frame cannot be
/// freed or moved by compaction. Leases nest; the frame is unpinned when the count drops
/// back to zero.
///
/// Every failing call leaves the arena (and the [`QuotaBook`]) unchanged. Numbers in
/// [`AllocError::OutOfMemory`] are frames; quota numbers are bytes.
#[derive(Debug, Clone)]
pub struct FrameArena {
    cfg: FrameArenaConfig,
    frames: u32,
    reserved: u32,
    slots: Vec<Slot>,
    free: FreeExtents,
    leased: u32,
}

impl FrameArena {
    /// Builds an arena of `min(capacity, budget) / frame_size` frames (rounded down).
    ///
    /// Fails with [`InvalidConfig`](AllocError::InvalidConfig) when the headroom exceeds
    /// 100%, when the capacity or budget is smaller than one frame (almost always a unit
    /// mistake in a configuration), or when the arena would hold `u32::MAX` frames or more.
    pub fn new(cfg: FrameArenaConfig) -> Result<Self, AllocError> {
        if cfg.headroom_percent > 100 {
            return Err(AllocError::InvalidConfig { reason: "headroom_percent must be at most 100" });
        }
        let bytes = cfg.budget_bytes.map_or(cfg.capacity_bytes, |b| b.min(cfg.capacity_bytes));
        let frames = bytes / cfg.frame_size.bytes();
        if frames == 0 {
            return Err(AllocError::InvalidConfig { reason: "capacity or budget is smaller than one frame" });
        }
        // Frame ids are u32 and `end()` of a run must fit too, so u32::MAX itself is excluded.
        let frames = match u32::try_from(frames) {
            Ok(f) if f < u32::MAX => f,
            _ => return Err(AllocError::InvalidConfig { reason: "arena would hold u32::MAX frames or more" }),
        };
        let reserved = (u64::from(frames) * u64::from(cfg.headroom_percent)).div_ceil(100);
        // headroom <= 100%, so reserved <= frames.
        let reserved = u32::try_from(reserved).unwrap_or(frames).min(frames);
        Ok(Self {
            cfg,
            frames,
            reserved,
            slots: vec![Slot::default(); frames as usize],
            free: FreeExtents::new_all_free(u64::from(frames)),
            leased: 0,
        })
    }

    /// Allocates `n` frames for `tenant`, charging `n * frame_size` bytes to its quota on
    /// this arena's tier.
    ///
    /// Prefers one contiguous run chosen by the configured [`Fit`]; when no free extent holds
    /// `n` frames, takes the largest extents first, which yields the fewest runs.
    ///
    /// Errors, in this order: [`InvalidSize`](AllocError::InvalidSize) for `n == 0`;
    /// [`QuotaExceeded`](AllocError::QuotaExceeded); [`OutOfMemory`](AllocError::OutOfMemory)
    /// when fewer than `n` frames are available to `class`. On error neither the arena nor
    /// `quotas` changes.
    pub fn alloc(
        &mut self,
        n: u32,
        tenant: TenantId,
        class: AllocClass,
        quotas: &mut QuotaBook,
    ) -> Result<FrameAlloc, AllocError> {
        if n == 0 {
            return Err(AllocError::InvalidSize { size: 0, reason: "cannot allocate zero frames" });
        }
        let bytes = self.bytes_for(n);
        quotas.charge(tenant, self.cfg.tier, bytes)?;
        match self.place(n, tenant, class) {
            Ok(a) => Ok(a),
            Err(e) => {
                quotas.credit(tenant, self.cfg.tier, bytes);
                Err(e)
            }
        }
    }

    /// Allocates exactly the frames of `run` for `tenant` (compaction targets, tests).
    ///
    /// Errors, in this order: [`InvalidSize`](AllocError::InvalidSize) for an empty run;
    /// [`InvalidAddress`](AllocError::InvalidAddress) naming the first frame outside the
    /// arena; [`InUse`](AllocError::InUse) naming the first used frame of the run;
    /// [`QuotaExceeded`](AllocError::QuotaExceeded); [`OutOfMemory`](AllocError::OutOfMemory)
    /// when `class` may not use that many more frames. On error nothing changes.
    pub fn alloc_at(
        &mut self,
        run: FrameRun,
        tenant: TenantId,
        class: AllocClass,
        quotas: &mut QuotaBook,
    ) -> Result<FrameAlloc, AllocError> {
        if run.len == 0 {
            return Err(AllocError::InvalidSize { size: 0, reason: "cannot allocate an empty run" });
        }
        let (start, len) = (u64::from(run.start), u64::from(run.len));
        if run.start >= self.frames {
            return Err(AllocError::InvalidAddress { addr: start });
        }
        if start + len > u64::from(self.frames) {
            return Err(AllocError::InvalidAddress { addr: u64::from(self.frames) });
        }
        if let Some(used) = run.iter().find(|&f| self.slot(f).owner.is_some()) {
            return Err(AllocError::InUse { addr: u64::from(used) });
        }
        let bytes = self.bytes_for(run.len);
        quotas.charge(tenant, self.cfg.tier, bytes)?;
        let available = self.available(class);
        let placed =
            if run.len > available { Err(self.oom(run.len, available)) } else { self.free.take_exact(start, len) };
        if let Err(e) = placed {
            quotas.credit(tenant, self.cfg.tier, bytes);
            return Err(e);
        }
        for f in run.iter() {
            self.set_owner(f, Some(tenant));
        }
        Ok(FrameAlloc { runs: vec![run] })
    }

    /// Frees `frames` (from one or several allocations and tenants) and credits each owner's
    /// quota. Returns how many frames were freed.
    ///
    /// Validates every frame before changing anything: a frame outside the arena is
    /// [`InvalidAddress`](AllocError::InvalidAddress), a free one (or one listed twice)
    /// [`DoubleFree`](AllocError::DoubleFree), a leased one
    /// [`FrameLeased`](AllocError::FrameLeased). On error nothing changes.
    pub fn free<I>(&mut self, frames: I, quotas: &mut QuotaBook) -> Result<u32, AllocError>
    where
        I: IntoIterator<Item = u32>,
    {
        let mut list: Vec<u32> = frames.into_iter().collect();
        for &f in &list {
            let slot = self.check_frame(f)?;
            if slot.owner.is_none() {
                return Err(AllocError::DoubleFree { addr: u64::from(f) });
            }
            if slot.leases > 0 {
                return Err(AllocError::FrameLeased { frame: f });
            }
        }
        list.sort_unstable();
        if let Some((&dup, _)) = list.iter().zip(list.iter().skip(1)).find(|(a, b)| a == b) {
            return Err(AllocError::DoubleFree { addr: u64::from(dup) });
        }

        // Return maximal runs rather than single frames: fewer extent-map operations.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &f in &list {
            let f = u64::from(f);
            match runs.last_mut() {
                Some((s, l)) if *s + *l == f => *l += 1,
                _ => runs.push((f, 1)),
            }
        }
        for (start, len) in runs {
            // Validated above: every frame is used, so this cannot fail.
            self.free.give_back(start, len)?;
        }

        let mut credits: BTreeMap<TenantId, u32> = BTreeMap::new();
        for &f in &list {
            if let Some(t) = self.slot(f).owner {
                *credits.entry(t).or_default() += 1;
            }
            self.set_owner(f, None);
        }
        for (t, n) in credits {
            quotas.credit(t, self.cfg.tier, self.bytes_for(n));
        }
        // Distinct frame ids of this arena, so fewer than u32::MAX.
        Ok(list.len() as u32)
    }

    /// Adds a lease to a used frame and returns its new lease count.
    ///
    /// Errors: [`InvalidAddress`](AllocError::InvalidAddress) outside the arena,
    /// [`DoubleFree`](AllocError::DoubleFree) for a free frame,
    /// [`InvalidSize`](AllocError::InvalidSize) if the count would overflow `u32`.
    pub fn lease(&mut self, frame: u32) -> Result<u32, AllocError> {
        let slot = self.check_frame(frame)?;
        if slot.owner.is_none() {
            return Err(AllocError::DoubleFree { addr: u64::from(frame) });
        }
        let Some(leases) = slot.leases.checked_add(1) else {
            return Err(AllocError::InvalidSize { size: u64::from(u32::MAX), reason: "lease count would overflow" });
        };
        if leases == 1 {
            self.leased += 1;
        }
        if let Some(slot) = self.slots.get_mut(frame as usize) {
            slot.leases = leases;
        }
        Ok(leases)
    }

    /// Releases one lease of a frame and returns its remaining lease count.
    ///
    /// Errors: [`InvalidAddress`](AllocError::InvalidAddress) outside the arena,
    /// [`DoubleFree`](AllocError::DoubleFree) for a free frame,
    /// [`NotLeased`](AllocError::NotLeased) when it holds no lease.
    pub fn unlease(&mut self, frame: u32) -> Result<u32, AllocError> {
        let slot = self.check_frame(frame)?;
        if slot.owner.is_none() {
            return Err(AllocError::DoubleFree { addr: u64::from(frame) });
        }
        if slot.leases == 0 {
            return Err(AllocError::NotLeased { frame });
        }
        let leases = slot.leases - 1;
        if leases == 0 {
            self.leased -= 1;
        }
        if let Some(slot) = self.slots.get_mut(frame as usize) {
            slot.leases = leases;
        }
        Ok(leases)
    }

    /// Outstanding leases on `frame` (0 for free frames and frames outside the arena).
    pub fn lease_count(&self, frame: u32) -> u32 {
        self.slots.get(frame as usize).map_or(0, |s| s.leases)
    }

    /// What `frame` holds, or `None` if it is outside the arena.
    pub fn state(&self, frame: u32) -> Option<FrameState> {
        self.slots.get(frame as usize).map(|s| match s.owner {
            None => FrameState::Free,
            Some(tenant) => FrameState::Used { tenant },
        })
    }

    /// Plans page copies that leave `n` consecutive frames free.
    ///
    /// If a free run of `n` frames exists, the plan is that run (chosen by the configured
    /// [`Fit`]) with no moves. Otherwise the target is the window of `n` frames without any
    /// leased frame that holds the fewest used frames (lowest address among equals), and each
    /// used frame in it moves to a free frame outside it, lowest address first. Compaction is
    /// the fabric's own work, so destinations may come out of the headroom; it never changes
    /// the number of used frames.
    ///
    /// Errors: [`InvalidSize`](AllocError::InvalidSize) for `n == 0`;
    /// [`CompactionImpossible`](AllocError::CompactionImpossible) when `n` exceeds the arena
    /// or its free frames, or when every window of `n` frames holds a leased frame.
    pub fn compaction_plan(&self, n: u32) -> Result<CompactionPlan, AllocError> {
        let impossible = |reason| AllocError::CompactionImpossible { frames: u64::from(n), reason };
        if n == 0 {
            return Err(AllocError::InvalidSize { size: 0, reason: "cannot compact for an empty run" });
        }
        if n > self.frames {
            return Err(impossible("the run is larger than the arena"));
        }
        if let Some(start) = self.free.find(self.cfg.fit, u64::from(n)) {
            return Ok(CompactionPlan { target: FrameRun { start: start as u32, len: n }, moves: Vec::new() });
        }
        // Moving pages only permutes used and free frames, so a window can be emptied
        // exactly when the used frames inside it fit in the free frames outside it:
        // used_in <= free_total - (n - used_in), i.e. n <= free_total, for every window.
        if u64::from(n) > self.free.free_units() {
            return Err(impossible("fewer free frames than the run needs"));
        }

        // Sliding window over the slots, counting used and leased frames in [s, s + n).
        let n_us = n as usize;
        let is_used = |s: &Slot| u32::from(s.owner.is_some());
        let is_leased = |s: &Slot| u32::from(s.leases > 0);
        let (mut used, mut leased) =
            self.slots.iter().take(n_us).fold((0u32, 0u32), |(u, l), s| (u + is_used(s), l + is_leased(s)));
        let mut best: Option<(u32, usize)> = (leased == 0).then_some((used, 0));
        // Slot `i` leaves the window as slot `i + n` enters it; the window then starts at
        // `i + 1`.
        let moving = self.slots.iter().zip(self.slots.iter().skip(n_us));
        for (i, (out, inn)) in moving.enumerate() {
            let start = i + 1;
            used = used - is_used(out) + is_used(inn);
            leased = leased - is_leased(out) + is_leased(inn);
            if leased == 0 && best.is_none_or(|(u, _)| used < u) {
                best = Some((used, start));
            }
        }
        let Some((_, start)) = best else {
            return Err(impossible("every window of that many frames holds a leased frame"));
        };

        let target = FrameRun { start: start as u32, len: n };
        let sources = target.iter().filter(|&f| self.slot(f).owner.is_some());
        let destinations = self
            .free
            .iter()
            .flat_map(|(s, l)| s..s + l)
            // Free extents lie in [0, frames), so every unit is a valid frame id.
            .map(|f| f as u32)
            .filter(|&f| !target.contains(f));
        let moves = sources.zip(destinations).map(|(from, to)| FrameMove { from, to }).collect();
        Ok(CompactionPlan { target, moves })
    }

    /// Records that the caller copied frame `mv.from` to `mv.to`: `to` becomes used by the
    /// same tenant, `from` becomes free. Quotas are unchanged (the tenant holds as many
    /// frames as before).
    ///
    /// Errors: [`InvalidAddress`](AllocError::InvalidAddress) for a frame outside the arena,
    /// [`DoubleFree`](AllocError::DoubleFree) if `from` is free,
    /// [`FrameLeased`](AllocError::FrameLeased) if `from` is leased,
    /// [`InUse`](AllocError::InUse) if `to` is used. On error nothing changes.
    pub fn apply_move(&mut self, mv: FrameMove) -> Result<(), AllocError> {
        let tenant = self.check_move(mv, &BTreeMap::new())?;
        // Checked above: `to` is free and `from` used, so neither can fail.
        self.free.take_exact(u64::from(mv.to), 1)?;
        self.free.give_back(u64::from(mv.from), 1)?;
        self.set_owner(mv.to, Some(tenant));
        self.set_owner(mv.from, None);
        Ok(())
    }

    /// Applies every move of `plan` in order, after checking that all of them would succeed
    /// (each move seeing the effect of the ones before it). On error nothing changes.
    pub fn apply_plan(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        // Simulated owners of the frames the plan touched so far.
        let mut overlay: BTreeMap<u32, Option<TenantId>> = BTreeMap::new();
        for &mv in &plan.moves {
            let tenant = self.check_move(mv, &overlay)?;
            overlay.insert(mv.to, Some(tenant));
            overlay.insert(mv.from, None);
        }
        for &mv in &plan.moves {
            self.apply_move(mv)?;
        }
        Ok(())
    }

    /// Number of frames in the arena.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Frames only [`AllocClass::Reserved`] allocations may use.
    pub fn reserved_frames(&self) -> u32 {
        self.reserved
    }

    /// Frames allocated to some tenant.
    pub fn used_frames(&self) -> u32 {
        self.frames - self.free_frames()
    }

    /// Frames not allocated (including the headroom).
    pub fn free_frames(&self) -> u32 {
        // At most `frames`, which is a u32.
        self.free.free_units() as u32
    }

    /// Frames holding at least one lease.
    pub fn leased_frames(&self) -> u32 {
        self.leased
    }

    /// How many more frames an allocation of `class` may take now (possibly scattered).
    pub fn available(&self, class: AllocClass) -> u32 {
        match class {
            AllocClass::Normal => (self.frames - self.reserved).saturating_sub(self.used_frames()),
            AllocClass::Reserved => self.free_frames(),
        }
    }

    /// How fragmented the free frames are (units: frames).
    pub fn fragmentation(&self) -> Fragmentation {
        self.free.fragmentation()
    }

    /// Length of the largest free run of frames.
    pub fn largest_free_run(&self) -> u32 {
        self.free.largest() as u32
    }

    /// The free runs in address order.
    pub fn free_runs(&self) -> impl Iterator<Item = FrameRun> + '_ {
        self.free.iter().map(|(s, l)| FrameRun { start: s as u32, len: l as u32 })
    }

    /// The configuration the arena was built from.
    pub fn config(&self) -> &FrameArenaConfig {
        &self.cfg
    }

    /// The tier quotas are charged against.
    pub fn tier(&self) -> Tier {
        self.cfg.tier
    }

    /// Size of one frame.
    pub fn frame_size(&self) -> PageSize {
        self.cfg.frame_size
    }

    /// Bytes of `n` frames. Cannot overflow: `u32::MAX` frames of 2 MiB is below 2^53.
    fn bytes_for(&self, n: u32) -> u64 {
        u64::from(n) * self.cfg.frame_size.bytes()
    }

    fn oom(&self, requested: u32, available: u32) -> AllocError {
        AllocError::OutOfMemory {
            requested: u64::from(requested),
            available: u64::from(available),
            largest_free: self.free.largest(),
        }
    }

    /// Takes `n` frames for `tenant` after the quota was charged.
    fn place(&mut self, n: u32, tenant: TenantId, class: AllocClass) -> Result<FrameAlloc, AllocError> {
        let available = self.available(class);
        if n > available {
            return Err(self.oom(n, available));
        }
        let mut runs: Vec<FrameRun> = Vec::new();
        let mut remaining = u64::from(n);
        while remaining > 0 {
            // One run by the configured fit when some extent holds the rest; otherwise the
            // largest extent. Greedy largest-first minimises the number of runs, and using
            // the fit for the final piece keeps larger extents intact.
            let piece = match self.free.take(self.cfg.fit, remaining) {
                Some(start) => Some((start, remaining)),
                None => self.free.take_largest(remaining),
            };
            let Some((start, len)) = piece else {
                // Unreachable: `available` never exceeds the free frames. Undo and report
                // rather than panic.
                for r in &runs {
                    self.free.give_back(u64::from(r.start), u64::from(r.len))?;
                }
                return Err(self.oom(n, available));
            };
            runs.push(FrameRun { start: start as u32, len: len as u32 });
            remaining -= len;
        }
        runs.sort_unstable();
        for r in &runs {
            for f in r.iter() {
                self.set_owner(f, Some(tenant));
            }
        }
        Ok(FrameAlloc { runs })
    }

    fn check_frame(&self, frame: u32) -> Result<Slot, AllocError> {
        self.slots.get(frame as usize).copied().ok_or(AllocError::InvalidAddress { addr: u64::from(frame) })
    }

    /// The owner `mv.to` would get, or why the move is refused, given simulated owners of
    /// frames already touched by earlier moves of the same plan (those have no leases).
    fn check_move(&self, mv: FrameMove, overlay: &BTreeMap<u32, Option<TenantId>>) -> Result<TenantId, AllocError> {
        let view = |f: u32| -> Result<Slot, AllocError> {
            let real = self.check_frame(f)?;
            Ok(match overlay.get(&f) {
                Some(&owner) => Slot { owner, leases: 0 },
                None => real,
            })
        };
        let from = view(mv.from)?;
        let to = view(mv.to)?;
        let Some(tenant) = from.owner else {
            return Err(AllocError::DoubleFree { addr: u64::from(mv.from) });
        };
        if from.leases > 0 {
            return Err(AllocError::FrameLeased { frame: mv.from });
        }
        if to.owner.is_some() {
            return Err(AllocError::InUse { addr: u64::from(mv.to) });
        }
        Ok(tenant)
    }

    /// The slot of a frame known to be inside the arena. Out-of-range ids (a broken
    /// internal invariant) read as a free, unleased slot instead of panicking.
    fn slot(&self, frame: u32) -> Slot {
        self.slots.get(frame as usize).copied().unwrap_or_default()
    }

    /// Sets the owner of a frame known to be inside the arena, dropping its leases when it
    /// becomes free. Callers only pass validated ids.
    fn set_owner(&mut self, frame: u32, owner: Option<TenantId>) {
        if let Some(slot) = self.slots.get_mut(frame as usize) {
            slot.owner = owner;
            if owner.is_none() {
                slot.leases = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 64 * 1024;
    const T1: TenantId = TenantId(1);
    const T2: TenantId = TenantId(2);
    const N: AllocClass = AllocClass::Normal;
    const R: AllocClass = AllocClass::Reserved;

    fn arena(frames: u64, headroom: u8) -> FrameArena {
        FrameArena::new(FrameArenaConfig::new(Tier::Gpu, PageSize::KIB_64, frames * F).with_headroom(headroom)).unwrap()
    }

    fn owners(a: &FrameArena) -> Vec<Option<TenantId>> {
        (0..a.frames())
            .map(|f| match a.state(f).unwrap() {
                FrameState::Free => None,
                FrameState::Used { tenant } => Some(tenant),
            })
            .collect()
    }

    #[test]
    fn sizing_budget_and_headroom() {
        let cfg = FrameArenaConfig::new(Tier::Gpu, PageSize::KIB_64, 100 * F + 5);
        let a = FrameArena::new(cfg).unwrap();
        assert_eq!(a.frames(), 100);
        assert_eq!(a.reserved_frames(), 15);
        assert_eq!(a.available(N), 85);
        assert_eq!(a.available(R), 100);
        // Budget below capacity caps the arena; above capacity has no effect.
        let a = FrameArena::new(cfg.with_budget(10 * F + 1)).unwrap();
        assert_eq!(a.frames(), 10);
        assert_eq!(a.reserved_frames(), 2); // ceil(1.5)
        let a = FrameArena::new(cfg.with_budget(1000 * F)).unwrap();
        assert_eq!(a.frames(), 100);
        assert_eq!(arena(10, 0).reserved_frames(), 0);
        assert_eq!(arena(10, 100).reserved_frames(), 10);
        assert_eq!(arena(10, 100).available(N), 0);
        assert_eq!(arena(10, 1).reserved_frames(), 1);
        assert_eq!(a.config().headroom_percent, DEFAULT_HEADROOM_PERCENT);
        assert_eq!(a.tier(), Tier::Gpu);
        assert_eq!(a.frame_size(), PageSize::KIB_64);
    }

    #[test]
    fn invalid_configs() {
        let cfg = FrameArenaConfig::new(Tier::Host, PageSize::MIB_2, 1 << 30);
        assert!(matches!(FrameArena::new(cfg.with_headroom(101)), Err(AllocError::InvalidConfig { .. })));
        assert!(matches!(
            FrameArena::new(cfg.with_budget(PageSize::MIB_2.bytes() - 1)),
            Err(AllocError::InvalidConfig { .. })
        ));
        assert!(matches!(
            FrameArena::new(FrameArenaConfig::new(Tier::Host, PageSize::MIB_2, 0)),
            Err(AllocError::InvalidConfig { .. })
        ));
        assert!(matches!(
            FrameArena::new(FrameArenaConfig::new(Tier::Nvme, PageSize::KIB_64, u64::MAX)),
            Err(AllocError::InvalidConfig { .. })
        ));
    }

    #[test]
    fn contiguous_alloc_charges_quota() {
        let mut a = arena(10, 0);
        let mut q = QuotaBook::new();
        let x = a.alloc(3, T1, N, &mut q).unwrap();
        assert_eq!(x.runs, vec![FrameRun { start: 0, len: 3 }]);
        assert!(x.is_contiguous());
        assert_eq!(x.len(), 3);
        assert!(!x.is_empty());
        assert_eq!(x.frames().collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(q.used(T1, Tier::Gpu), 3 * F);
        assert_eq!(a.used_frames(), 3);
        assert_eq!(a.free_frames(), 7);
        assert_eq!(a.state(1), Some(FrameState::Used { tenant: T1 }));
        assert_eq!(a.state(3), Some(FrameState::Free));
        assert_eq!(a.state(10), None);
    }

    #[test]
    fn exact_fit_fills_the_arena() {
        let mut a = arena(8, 0);
        let mut q = QuotaBook::new();
        let x = a.alloc(8, T1, N, &mut q).unwrap();
        assert_eq!(x.runs, vec![FrameRun { start: 0, len: 8 }]);
        assert_eq!(
            a.alloc(1, T1, R, &mut q),
            Err(AllocError::OutOfMemory { requested: 1, available: 0, largest_free: 0 })
        );
        assert_eq!(q.used(T1, Tier::Gpu), 8 * F);
    }

    #[test]
    fn scattered_alloc_uses_fewest_runs() {
        let mut a = arena(20, 0);
        let mut q = QuotaBook::new();
        // Free holes of 2, 5, 3 (and 0 at the end).
        let x = a.alloc(20, T1, N, &mut q).unwrap();
        a.free([1, 2], &mut q).unwrap();
        a.free(5..10, &mut q).unwrap();
        a.free(13..16, &mut q).unwrap();
        assert_eq!(a.free_frames(), 10);
        let y = a.alloc(7, T2, N, &mut q).unwrap();
        // Largest first (5), then the rest (2) by first-fit.
        assert_eq!(y.runs, vec![FrameRun { start: 1, len: 2 }, FrameRun { start: 5, len: 5 }]);
        assert!(!y.is_contiguous());
        assert_eq!(q.used(T2, Tier::Gpu), 7 * F);
        assert_eq!(x.len(), 20);
    }

    #[test]
    fn headroom_limits_normal_but_not_reserved() {
        let mut a = arena(10, 20); // 2 reserved
        let mut q = QuotaBook::new();
        a.alloc(8, T1, N, &mut q).unwrap();
        assert_eq!(a.available(N), 0);
        assert_eq!(
            a.alloc(1, T1, N, &mut q),
            Err(AllocError::OutOfMemory { requested: 1, available: 0, largest_free: 2 })
        );
        // The failed attempt was not charged.
        assert_eq!(q.used(T1, Tier::Gpu), 8 * F);
        a.alloc(2, T1, R, &mut q).unwrap();
        assert_eq!(a.free_frames(), 0);
        assert_eq!(a.available(R), 0);
    }

    #[test]
    fn reserved_use_shrinks_normal_availability() {
        let mut a = arena(10, 20);
        let mut q = QuotaBook::new();
        a.alloc(3, T1, R, &mut q).unwrap();
        assert_eq!(a.available(N), 5);
    }

    #[test]
    fn headroom_100_blocks_all_normal_allocations() {
        let mut a = arena(4, 100);
        let mut q = QuotaBook::new();
        assert!(matches!(a.alloc(1, T1, N, &mut q), Err(AllocError::OutOfMemory { .. })));
        a.alloc(4, T1, R, &mut q).unwrap();
    }

    #[test]
    fn quota_exceeded_changes_nothing() {
        let mut a = arena(10, 0);
        let mut q = QuotaBook::new();
        q.set_limit(T1, Tier::Gpu, Some(4 * F));
        a.alloc(3, T1, N, &mut q).unwrap();
        assert_eq!(
            a.alloc(2, T1, N, &mut q),
            Err(AllocError::QuotaExceeded { tenant: T1, tier: Tier::Gpu, limit: 4 * F, used: 3 * F, requested: 2 * F })
        );
        assert_eq!(a.used_frames(), 3);
        assert_eq!(q.used(T1, Tier::Gpu), 3 * F);
        // Quota applies to the reserved class as well.
        assert!(matches!(a.alloc(2, T1, R, &mut q), Err(AllocError::QuotaExceeded { .. })));
        a.alloc(1, T1, N, &mut q).unwrap();
        // Another tenant is unaffected.
        a.alloc(6, T2, N, &mut q).unwrap();
    }

    #[test]
    fn zero_frames_is_invalid() {
        let mut a = arena(4, 0);
        let mut q = QuotaBook::new();
        assert!(matches!(a.alloc(0, T1, N, &mut q), Err(AllocError::InvalidSize { size: 0, .. })));
        assert!(matches!(
            a.alloc_at(FrameRun { start: 0, len: 0 }, T1, N, &mut q),
            Err(AllocError::InvalidSize { size: 0, .. })
        ));
        assert!(matches!(a.compaction_plan(0), Err(AllocError::InvalidSize { size: 0, .. })));
    }

    #[test]
    fn alloc_at_errors() {
        let mut a = arena(10, 20);
        let mut q = QuotaBook::new();
        a.alloc_at(FrameRun { start: 2, len: 2 }, T1, N, &mut q).unwrap();
        assert_eq!(a.state(2), Some(FrameState::Used { tenant: T1 }));
        let run = |start, len| FrameRun { start, len };
        assert_eq!(a.alloc_at(run(10, 1), T1, N, &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
        assert_eq!(a.alloc_at(run(8, 3), T1, N, &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
        assert_eq!(a.alloc_at(run(8, u32::MAX), T1, N, &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
        assert_eq!(a.alloc_at(run(0, 4), T1, N, &mut q), Err(AllocError::InUse { addr: 2 }));
        assert_eq!(a.alloc_at(run(4, 7), T1, N, &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
        assert_eq!(a.alloc_at(run(3, 7), T1, N, &mut q), Err(AllocError::InUse { addr: 3 }));
        q.set_limit(T2, Tier::Gpu, Some(F));
        assert!(matches!(a.alloc_at(run(4, 2), T2, N, &mut q), Err(AllocError::QuotaExceeded { .. })));
        assert_eq!(q.used(T2, Tier::Gpu), 0);
        assert_eq!(a.used_frames(), 2);
        assert_eq!(q.used(T1, Tier::Gpu), 2 * F);
    }

    #[test]
    fn alloc_at_respects_headroom() {
        let mut a = arena(10, 20);
        let mut q = QuotaBook::new();
        let run = FrameRun { start: 0, len: 9 };
        assert_eq!(
            a.alloc_at(run, T1, N, &mut q),
            Err(AllocError::OutOfMemory { requested: 9, available: 8, largest_free: 10 })
        );
        assert_eq!(q.used(T1, Tier::Gpu), 0);
        a.alloc_at(run, T1, R, &mut q).unwrap();
        assert_eq!(q.used(T1, Tier::Gpu), 9 * F);
    }

    #[test]
    fn free_validates_everything_first() {
        let mut a = arena(10, 0);
        let mut q = QuotaBook::new();
        a.alloc(4, T1, N, &mut q).unwrap();
        a.alloc(2, T2, N, &mut q).unwrap();
        a.lease(1).unwrap();
        let before = owners(&a);
        assert_eq!(a.free([0, 10], &mut q), Err(AllocError::InvalidAddress { addr: 10 }));
        assert_eq!(a.free([0, 7], &mut q), Err(AllocError::DoubleFree { addr: 7 }));
        assert_eq!(a.free([0, 1], &mut q), Err(AllocError::FrameLeased { frame: 1 }));
        assert_eq!(a.free([2, 3, 2], &mut q), Err(AllocError::DoubleFree { addr: 2 }));
        assert_eq!(owners(&a), before);
        assert_eq!(q.used(T1, Tier::Gpu), 4 * F);
        // Several tenants in one call; each is credited.
        assert_eq!(a.free([5, 0, 4, 3], &mut q), Ok(4));
        assert_eq!(q.used(T1, Tier::Gpu), 2 * F);
        assert_eq!(q.used(T2, Tier::Gpu), 0);
        assert_eq!(
            a.free_runs().collect::<Vec<_>>(),
            vec![FrameRun { start: 0, len: 1 }, FrameRun { start: 3, len: 7 }]
        );
        assert_eq!(a.free(std::iter::empty(), &mut q), Ok(0));
    }

    #[test]
    fn leases() {
        let mut a = arena(4, 0);
        let mut q = QuotaBook::new();
        a.alloc(2, T1, N, &mut q).unwrap();
        assert_eq!(a.lease(0), Ok(1));
        assert_eq!(a.lease(0), Ok(2));
        assert_eq!(a.lease(1), Ok(1));
        assert_eq!(a.leased_frames(), 2);
        assert_eq!(a.lease_count(0), 2);
        assert_eq!(a.lease_count(3), 0);
        assert_eq!(a.lease_count(99), 0);
        assert_eq!(a.lease(2), Err(AllocError::DoubleFree { addr: 2 }));
        assert_eq!(a.lease(4), Err(AllocError::InvalidAddress { addr: 4 }));
        assert_eq!(a.unlease(2), Err(AllocError::DoubleFree { addr: 2 }));
        assert_eq!(a.unlease(4), Err(AllocError::InvalidAddress { addr: 4 }));
        assert_eq!(a.unlease(0), Ok(1));
        assert_eq!(a.unlease(0), Ok(0));
        assert_eq!(a.unlease(0), Err(AllocError::NotLeased { frame: 0 }));
        assert_eq!(a.leased_frames(), 1);
        assert_eq!(a.free([0], &mut q), Ok(1));
        assert_eq!(a.free([1], &mut q), Err(AllocError::FrameLeased { frame: 1 }));
        a.unlease(1).unwrap();
        assert_eq!(a.leased_frames(), 0);
        a.free([1], &mut q).unwrap();
    }

    /// The layout `UUUU.U.U..`: frames 0-3, 5 and 7 used by T1 on a 10-frame arena.
    fn layout() -> (FrameArena, QuotaBook) {
        let mut a = arena(10, 0);
        let mut q = QuotaBook::new();
        a.alloc(10, T1, N, &mut q).unwrap();
        a.free([4, 6, 8, 9], &mut q).unwrap();
        (a, q)
    }

    #[test]
    fn compaction_noop_when_a_run_is_free() {
        let (a, _) = layout();
        let plan = a.compaction_plan(2).unwrap();
        assert_eq!(plan.target, FrameRun { start: 8, len: 2 });
        assert!(plan.is_noop());
        assert!(a.compaction_plan(1).unwrap().is_noop());
    }

    #[test]
    fn compaction_moves_out_of_the_emptiest_window() {
        let (mut a, mut q) = layout();
        // Windows of 3 holding a single used frame: [4, 7), [6, 9), [7, 10); lowest wins.
        let plan = a.compaction_plan(3).unwrap();
        assert_eq!(plan.target, FrameRun { start: 4, len: 3 });
        assert_eq!(plan.moves, vec![FrameMove { from: 5, to: 8 }]);
        a.apply_plan(&plan).unwrap();
        assert!(plan.target.iter().all(|f| a.state(f) == Some(FrameState::Free)));
        assert_eq!(a.state(8), Some(FrameState::Used { tenant: T1 }));
        // Moves leave quotas alone.
        assert_eq!(q.used(T1, Tier::Gpu), 6 * F);
        a.alloc_at(plan.target, T2, N, &mut q).unwrap();
    }

    #[test]
    fn compaction_uses_every_free_frame_and_counts_honestly() {
        let (a, _) = layout();
        // 4 free frames: a run of 4 is possible, 5 is not.
        let plan = a.compaction_plan(4).unwrap();
        assert_eq!(plan.target, FrameRun { start: 6, len: 4 });
        assert_eq!(plan.moves, vec![FrameMove { from: 7, to: 4 }]);
        assert!(matches!(a.compaction_plan(5), Err(AllocError::CompactionImpossible { frames: 5, .. })));
        assert!(matches!(a.compaction_plan(11), Err(AllocError::CompactionImpossible { frames: 11, .. })));
        let mut b = a.clone();
        b.apply_plan(&plan).unwrap();
        assert_eq!(b.largest_free_run(), 4);
        assert_eq!(b.used_frames(), 6);
        assert_eq!(b.fragmentation().free_ranges, 1);
        // Headroom does not stop compaction: it is the fabric's own work.
        let mut c = arena(10, 50);
        let mut q = QuotaBook::new();
        c.alloc(5, T1, N, &mut q).unwrap();
        c.alloc(5, T1, R, &mut q).unwrap();
        c.free([1, 3, 5, 7, 9], &mut q).unwrap();
        let plan = c.compaction_plan(5).unwrap();
        assert_eq!(plan.moves.len(), 2);
        c.apply_plan(&plan).unwrap();
        assert_eq!(c.largest_free_run(), 5);
    }

    #[test]
    fn compaction_avoids_leased_frames() {
        let (mut a, _) = layout();
        a.lease(7).unwrap();
        let plan = a.compaction_plan(4).unwrap();
        // Windows holding frame 7 are excluded; [3, 7) holds the fewest used frames (3, 5).
        assert_eq!(plan.target, FrameRun { start: 3, len: 4 });
        assert_eq!(plan.moves, vec![FrameMove { from: 3, to: 8 }, FrameMove { from: 5, to: 9 }]);
        a.lease(3).unwrap();
        a.lease(5).unwrap();
        assert!(matches!(a.compaction_plan(4), Err(AllocError::CompactionImpossible { frames: 4, .. })));
        // A plan made before a lease is refused when applied.
        a.unlease(3).unwrap();
        a.unlease(5).unwrap();
        let plan = a.compaction_plan(4).unwrap();
        a.lease(5).unwrap();
        assert_eq!(a.apply_plan(&plan), Err(AllocError::FrameLeased { frame: 5 }));
        assert_eq!(a.state(8), Some(FrameState::Free));
    }

    #[test]
    fn apply_move_errors() {
        let (mut a, _) = layout();
        let mv = |from, to| FrameMove { from, to };
        assert_eq!(a.apply_move(mv(10, 4)), Err(AllocError::InvalidAddress { addr: 10 }));
        assert_eq!(a.apply_move(mv(0, 10)), Err(AllocError::InvalidAddress { addr: 10 }));
        assert_eq!(a.apply_move(mv(4, 6)), Err(AllocError::DoubleFree { addr: 4 }));
        assert_eq!(a.apply_move(mv(0, 1)), Err(AllocError::InUse { addr: 1 }));
        assert_eq!(a.apply_move(mv(0, 0)), Err(AllocError::InUse { addr: 0 }));
        a.lease(0).unwrap();
        assert_eq!(a.apply_move(mv(0, 4)), Err(AllocError::FrameLeased { frame: 0 }));
        a.unlease(0).unwrap();
        a.apply_move(mv(0, 4)).unwrap();
        assert_eq!(a.state(0), Some(FrameState::Free));
        assert_eq!(a.state(4), Some(FrameState::Used { tenant: T1 }));
        assert_eq!(a.used_frames(), 6);
    }

    #[test]
    fn apply_plan_is_all_or_nothing() {
        let (mut a, _) = layout();
        let before = owners(&a);
        let plan = CompactionPlan {
            target: FrameRun { start: 0, len: 1 },
            moves: vec![
                FrameMove { from: 0, to: 4 },
                // Chained: sees frame 4 used by the first move.
                FrameMove { from: 4, to: 6 },
                // Frame 0 was vacated by the first move.
                FrameMove { from: 0, to: 8 },
            ],
        };
        assert_eq!(a.apply_plan(&plan), Err(AllocError::DoubleFree { addr: 0 }));
        assert_eq!(owners(&a), before);
        let plan = CompactionPlan {
            target: FrameRun { start: 0, len: 1 },
            moves: vec![FrameMove { from: 0, to: 4 }, FrameMove { from: 4, to: 6 }],
        };
        a.apply_plan(&plan).unwrap();
        assert_eq!(a.state(0), Some(FrameState::Free));
        assert_eq!(a.state(4), Some(FrameState::Free));
        assert_eq!(a.state(6), Some(FrameState::Used { tenant: T1 }));
    }

    #[test]
    fn frame_run_helpers() {
        let r = FrameRun { start: 3, len: 2 };
        assert_eq!(r.end(), 5);
        assert!(r.contains(4));
        assert!(!r.contains(5));
        assert_eq!(r.into_iter().collect::<Vec<_>>(), vec![3, 4]);
        let huge = FrameRun { start: u32::MAX - 1, len: 10 };
        assert_eq!(huge.end(), u32::MAX);
        let a = FrameAlloc { runs: vec![FrameRun { start: 0, len: u32::MAX - 1 }; 2] };
        assert_eq!(a.len(), u32::MAX);
        assert!(FrameAlloc::default().is_empty());
    }
}
