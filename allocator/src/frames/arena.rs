//! The frame arena itself: its frames, and allocating and freeing them with quotas and headroom.
//!
//! Leases, compaction and read-only queries are further `impl FrameArena` blocks in `lease.rs`,
//! `compaction.rs` and `query.rs`; the frame bookkeeping they share ([`Slot`] and the helpers at
//! the end) is defined here.

use std::collections::BTreeMap;

use super::config::{AllocClass, FrameArenaConfig};
use super::run::{FrameAlloc, FrameRun};
use crate::error::AllocError;
use crate::extent::FreeExtents;
use crate::quota::QuotaBook;
use crate::tenant::TenantId;

/// What the arena records per frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Slot {
    /// `None` when free.
    pub(super) owner: Option<TenantId>,
    /// Outstanding leases; only non-zero on used frames.
    pub(super) leases: u32,
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
    pub(super) cfg: FrameArenaConfig,
    pub(super) frames: u32,
    pub(super) reserved: u32,
    pub(super) slots: Vec<Slot>,
    pub(super) free: FreeExtents,
    pub(super) leased: u32,
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

    /// How many more frames an allocation of `class` may take now (possibly scattered).
    pub fn available(&self, class: AllocClass) -> u32 {
        match class {
            AllocClass::Normal => (self.frames - self.reserved).saturating_sub(self.used_frames()),
            AllocClass::Reserved => self.free_frames(),
        }
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

    /// Bytes of `n` frames. Cannot overflow: `u32::MAX` frames of 2 MiB is below 2^53.
    pub(super) fn bytes_for(&self, n: u32) -> u64 {
        u64::from(n) * self.cfg.frame_size.bytes()
    }

    pub(super) fn oom(&self, requested: u32, available: u32) -> AllocError {
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

    pub(super) fn check_frame(&self, frame: u32) -> Result<Slot, AllocError> {
        self.slots.get(frame as usize).copied().ok_or(AllocError::InvalidAddress { addr: u64::from(frame) })
    }

    /// The slot of a frame known to be inside the arena. Out-of-range ids (a broken
    /// internal invariant) read as a free, unleased slot instead of panicking.
    pub(super) fn slot(&self, frame: u32) -> Slot {
        self.slots.get(frame as usize).copied().unwrap_or_default()
    }

    /// Sets the owner of a frame known to be inside the arena, dropping its leases when it
    /// becomes free. Callers only pass validated ids.
    pub(super) fn set_owner(&mut self, frame: u32, owner: Option<TenantId>) {
        if let Some(slot) = self.slots.get_mut(frame as usize) {
            slot.owner = owner;
            if owner.is_none() {
                slot.leases = 0;
            }
        }
    }
}
