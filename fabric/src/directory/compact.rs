//! Compaction: moving unleased pages within a device so that a run of free frames exists.

use vfabric_allocator::{CompactionPlan, Location};

use super::error::DirectoryError;
use super::page::DevIdx;
use super::stage::{Stage, StageKind, Step, Update};
use super::state::Directory;

impl Directory {
    /// Plans the moves that leave a run of `n` free frames on `device` (what an acquire does when the device is
    /// fragmented). `Done` when such a run already exists.
    pub fn plan_compaction(&mut self, device: Location, n: u32) -> Result<Step<()>, DirectoryError> {
        let dev = self.dev(device)?;
        if self.loc(dev).is_packed() {
            return Err(DirectoryError::PackedTier("is not compacted: its slots hold no lease"));
        }
        if Some(dev) == self.compressed {
            return Err(DirectoryError::CompressedTier("is not compacted: its runs hold no lease"));
        }
        let d = &self.devs[usize::from(dev)];
        if d.frames.largest_free_run() >= n {
            return Ok(Step::Done(()));
        }
        if !self.in_flight.is_empty() {
            // Compaction may move a prefetch's source frames.
            return Ok(Step::Wait);
        }
        let plan = d.frames.compaction_plan(n).map_err(|e| DirectoryError::from_alloc(e, device))?;
        Ok(Step::Stage(self.compaction_stage(dev, plan)))
    }

    /// The stage that carries out a compaction plan on `dev`.
    pub(super) fn compaction_stage(&self, dev: DevIdx, plan: CompactionPlan) -> Stage {
        let loc = self.loc(dev);
        let mut stage = Stage::new(StageKind::Compact);
        for mv in &plan.moves {
            stage.copy(loc, loc, mv.from, mv.to);
        }
        stage.updates.push(Update::Compact { dev, plan });
        stage
    }
}
