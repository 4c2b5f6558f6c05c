//! Compaction plans: the page copies that leave a run of consecutive frames free, and recording them once
//! the caller has copied.

use std::collections::BTreeMap;

use super::arena::{FrameArena, Slot};
use super::run::FrameRun;
use crate::error::AllocError;
use crate::tenant::TenantId;

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

impl FrameArena {
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
}
