//! Committing a stage whose copies arrived, or aborting one whose copies failed.

use super::page::Copy;
use super::stage::{Stage, StageKind, Update};
use super::state::Directory;

impl Directory {
    /// Applies a stage whose copies all arrived. Frames its call drew out of a reservation without taking them
    /// go back to it (the call draws them again when retried).
    pub fn commit(&mut self, mut stage: Stage) {
        self.forget_in_flight(&stage);
        let loose = std::mem::take(&mut stage.loose);
        let prefetched = stage.kind == StageKind::Prefetch;
        for u in stage.updates {
            match u {
                Update::Relocate { page, old, new } => {
                    self.page_mut(page).replace(old, new);
                    self.set_user(new, page);
                    // A copy gathered into a prefetch's run was waiting for its lease as much as the others.
                    let was_fresh = self.devs[usize::from(old.dev)].fresh[old.frame as usize];
                    self.release_frame(old);
                    self.mark_fresh(new, prefetched || was_fresh);
                }
                Update::Add { page, copy } => {
                    self.page_mut(page).add(copy);
                    self.set_user(copy, page);
                    self.mark_fresh(copy, prefetched);
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
                        d.fresh[mv.to as usize] = std::mem::take(&mut d.fresh[mv.from as usize]);
                        // The page keeps its place in the eviction order: moved pages made MRU would outlive the
                        // pages around them, leaving scattered frames behind when they finally go.
                        d.lru.replace(mv.from, mv.to);
                    }
                }
            }
        }
        for d in loose {
            self.undraw(d);
        }
    }

    /// Marks a GPU copy as prefetched and not yet leased (or not). Copies staged into host memory on their way
    /// up from storage are not marked: no lease takes them there, so the mark would never go.
    fn mark_fresh(&mut self, c: Copy, fresh: bool) {
        let d = &mut self.devs[usize::from(c.dev)];
        d.fresh[c.frame as usize] = fresh && d.is_gpu();
    }

    /// Forgets a stage whose copies failed: frees the frames it took, except that those which came out of a
    /// reservation go back to it (lent frames as they were, drawn ones taken for it again). The pages stay where
    /// they were.
    pub fn abort(&mut self, mut stage: Stage) {
        self.forget_in_flight(&stage);
        for (id, c) in std::mem::take(&mut stage.lent) {
            stage.taken.retain(|t| *t != c);
            self.return_lent(id, c);
        }
        for c in stage.taken {
            self.untake(c);
        }
        // After the frees: the frames drawn are among them.
        for d in stage.drawn.into_iter().chain(stage.loose) {
            self.undraw(d);
        }
    }
}
