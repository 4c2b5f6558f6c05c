//! A node that leaves the cluster hands its regions to the others first (`Agent::leave`, and `vfabric agent`
//! when it stops with `network.drain`): each region without a standby gets one, the whole region copied into
//! another node's host memory, and then every region's standby takes over at once, as a replicated region's
//! does when its home shuts down (`super::replication`). Callers find the copy as they find a dead home's
//! standby (`Agent::fail_over`): by the region's handle, which keeps working.

use std::time::Instant;

use super::shared::Agent;
use crate::directory::RegionHandle as Region;

/// What [`Agent::drain`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Regions given a standby copy on another node for the handover, and their bytes.
    pub copied: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Regions that stay here, with why: the node loses them when it stops.
    pub kept: Vec<(Region, String)>,
}

impl Agent {
    /// Hands every region of this node to another node (this node is about to leave): a region that has no
    /// standby gets one, with all its bytes, on the next node that takes it; then every standby takes over
    /// (its region's writes go there first). Calls on the regions meanwhile wait for their copies; once handed
    /// over, this node sends their callers on for as long as it answers, and callers that reach the copy
    /// directly find it by the handle. Standby copies this node keeps for other homes stay (their homes
    /// place new ones when they find this node gone). A tenant's region goes as any does, its copy the tenant's.
    pub async fn drain(&self) -> Drained {
        let t = Instant::now();
        let mut report = Drained::default();
        for (region, _) in self.shared.fabric.regions() {
            let origin = match self.shared.backups.standby(&region) {
                // A copy kept for another home: its home's to replace.
                Some(s) if !s.state.lock().await.promoted => continue,
                // A copy that took over: callers name the region it took over.
                Some(s) => s.origin,
                None => region,
            };
            if self.shared.backups.homed(&region).is_some() || self.is_private(&region) {
                continue; // replicated already (handed over below), or a private copy of another node's pages
            }
            match self.place_standbys((&region, &origin), 1, 1, &[]).await {
                Ok(copies) => {
                    // No write of the region is under way as it becomes a replicated one (the operations on it
                    // hold this entry's read guard): a write that began before would land after the copy read
                    // the region, and the handover would lose it. Writes after it reach the copy too.
                    let moving = self.shared.moves.entry(&region).write_owned().await;
                    self.shared.backups.add_homed(region, copies, (origin != region).then_some(origin), (1, None));
                    if let Some(entry) = self.shared.backups.homed(&region) {
                        entry.lock().await.pending.push(0..region.len);
                    }
                    drop(moving);
                    report.copied += 1;
                    report.bytes += region.len;
                }
                Err(e) => report.kept.push((region, e.to_string())),
            }
        }
        // Every replicated region, those just given a standby among them: the standby takes over.
        self.hand_over_all().await;
        for (region, why) in &report.kept {
            tracing::warn!(region = %region, why = %why, "a region stays on this leaving node: it goes with it");
        }
        tracing::info!(
            regions = report.copied,
            bytes = report.bytes,
            kept = report.kept.len(),
            seconds = t.elapsed().as_secs_f64(),
            "drained this node's regions to the others"
        );
        report
    }

    /// Leaves the cluster: [`Agent::drain`], then [`Agent::shutdown`].
    pub async fn leave(&self) -> Drained {
        let drained = self.drain().await;
        self.shutdown().await;
        drained
    }
}
