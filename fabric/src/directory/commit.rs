//! Committing a stage whose copies arrived, or aborting one whose copies failed.

use super::page::Copy;
use super::stage::{Stage, Update};
use super::state::Directory;

impl Directory {
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
}
