//! Regions whose pages live on another node than their home, and the location hints that find them.
//!
//! A region's global address names its home for the region's whole life; a migration to another node's device
//! (`Agent::migrate_to`) does not change that. The home copies the pages into a region of its own making on
//! the target node (the *hosted* copy), frees its own, and keeps a forwarding entry: a request that names the
//! region at the home is answered `Moved { to }`. The requester follows it and caches `to` as a *hint*, so its
//! next calls go straight to the node that has the pages. A hint goes stale when the region moves again (or is
//! freed): the hosted copy it names is gone, the node answers `Moved` while it still forwards (see below) and
//! then `UseAfterFree` (its generation check sees a freed handle, also when the slot holds a newer region), and
//! the requester drops the hint and asks the home.
//!
//! While a region moves, no write may land in pages being copied away and no write may be lost: every
//! operation on a region of this node holds a read guard on the region's entry in [`Moves`] while it runs, and
//! a migration holds the write guard from the first copied byte until the forwarding entry is in place. Pages
//! that already moved are moved on by the home of the copy that has them, under its guard for that copy (writes
//! reach that copy directly through hints), which forwards to the new copy while the move runs; the region's
//! home then points at the new copy and has the old copy's node drop its entry (`Unforward`), so only a
//! region's home forwards for good. The
//! guards are per region, so two nodes moving regions to each other at once cannot wait on each other. A region
//! with a lease held on it is not moved (freeing the old copy fails, so the migration is undone).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::directory::RegionHandle as Region;
use crate::error::FabricError;
use crate::proto::message::ErrorKind;

/// The forwarding entries of a home, one lock per region of this node that an operation has named: `None`
/// while its pages are here, `Some(to)` once they moved to region `to` (on the node its address names).
#[derive(Default)]
pub(crate) struct Moves {
    regions: std::sync::Mutex<Entries>,
}

/// The entries, and the size at which the next one made sweeps out those no longer needed.
#[derive(Default)]
struct Entries {
    map: HashMap<Region, Arc<RwLock<Option<Region>>>>,
    sweep_at: usize,
}

/// The fewest entries kept before a sweep.
const SWEEP_FLOOR: usize = 1024;

impl Entries {
    /// Drops the entries that no operation holds and that forward nowhere: an operation makes one for every
    /// region it names, regions that are freed or never existed included (a peer may name any), and without
    /// this the table would only grow. Run under the table's lock, where no one can take an entry meanwhile,
    /// so an entry that nobody holds stays unheld until it is gone. Sweeping again only once the table has
    /// doubled keeps the cost per entry made constant.
    fn sweep(&mut self) {
        self.map.retain(|_, e| Arc::strong_count(e) > 1 || e.try_read().map_or(true, |to| to.is_some()));
        self.sweep_at = (2 * self.map.len()).max(SWEEP_FLOOR);
    }
}

impl Moves {
    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn entry(&self, region: &Region) -> Arc<RwLock<Option<Region>>> {
        let mut entries = self.entries();
        if entries.map.len() >= entries.sweep_at {
            entries.sweep();
        }
        Arc::clone(entries.map.entry(*region).or_default())
    }

    pub(crate) fn forget(&self, region: &Region) {
        self.entries().map.remove(region);
    }

    /// How many entries there are (regions named since the last sweep, and those moved away).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries().map.len()
    }

    /// Drops the forwarding entry of `region`, a copy whose pages moved on to `to`, once its region's home
    /// sends no caller there any more; any other entry stays (one whose pages are here, or that names another
    /// region: a stale or misdirected request changes nothing). Callers that waited on it, and later ones, then
    /// reach the fabric, which says the copy is gone (and they ask the home).
    pub(crate) async fn unforward(&self, region: &Region, to: &Region) {
        let existing = self.entries().map.get(region).cloned();
        let Some(entry) = existing else { return };
        let mut entry = entry.write_owned().await;
        if entry.as_ref() == Some(to) {
            *entry = None;
            self.forget(region);
        }
    }

    /// How many regions of this node have their pages elsewhere (an entry being changed right now may be left
    /// out).
    pub(crate) fn forwarding(&self) -> usize {
        self.entries().map.values().filter(|e| e.try_read().is_ok_and(|to| to.is_some())).count()
    }

    /// For an operation on `region`, a region of this node: a read guard that keeps it from moving while the
    /// operation runs, or `Moved` when its pages are elsewhere.
    pub(crate) async fn staying(&self, region: &Region) -> Result<OwnedRwLockReadGuard<Option<Region>>, FabricError> {
        let guard = self.entry(region).read_owned().await;
        match *guard {
            Some(to) => Err(FabricError::Moved { to }),
            None => Ok(guard),
        }
    }
}

/// How many times one call follows a `Moved` answer or drops a stale hint before it gives up.
const MAX_HOPS: usize = 4;

/// Location hints: where the pages of other nodes' regions were last found (region -> hosted copy).
pub(crate) type Hints = Mutex<HashMap<Region, Region>>;

fn lock(hints: &Hints) -> std::sync::MutexGuard<'_, HashMap<Region, Region>> {
    hints.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where one call on a region goes: the hint when there is one, else the region itself (its home), following
/// `Moved` answers, dropping stale hints, and failing over to a standby copy when the home is dead. Callers
/// loop over `target()`, their attempt, and `settle()` ([`routed!`](crate::agent::forwarding::routed) writes
/// that loop once).
pub(crate) struct Route<'a> {
    hints: &'a Hints,
    region: Region,
    target: Region,
    hops: usize,
}

impl<'a> Route<'a> {
    /// The route of a call on `region`.
    pub(crate) fn new(hints: &'a Hints, region: &Region) -> Route<'a> {
        let target = lock(hints).get(region).copied().unwrap_or(*region);
        Route { hints, region: *region, target, hops: 0 }
    }

    /// The region to name in the next attempt (the hosted copy, or the region itself).
    pub(crate) fn target(&self) -> Region {
        self.target
    }

    /// Goes to `to` from now on (a standby copy that took over from the region's dead home), kept as a hint.
    pub(crate) fn follow(&mut self, to: Region) {
        lock(self.hints).insert(self.region, to);
        self.target = to;
        self.hops += 1;
    }

    /// What the attempt's outcome calls for: to return it, to try again at the new target (after `Moved`, whose
    /// hint is kept, or after a stale hint failed, which is dropped so that the home is asked), or to fail over
    /// (the node that has the region is dead).
    pub(crate) fn settle<T>(&mut self, r: Result<T, FabricError>) -> Settled<T> {
        if self.hops >= MAX_HOPS {
            return Settled::Done(r);
        }
        match &r {
            // The node that has the region (its home, or a copy that took over from it) is dead.
            Err(FabricError::PeerDead { node, .. }) if *node == self.target.addr.node().0 => {
                return Settled::HomeDead(r);
            }
            Err(FabricError::Moved { to }) => {
                lock(self.hints).insert(self.region, *to);
                self.target = *to;
            }
            Err(e) if self.target != self.region && is_stale(e) => {
                let mut hints = lock(self.hints);
                if hints.get(&self.region) == Some(&self.target) {
                    hints.remove(&self.region);
                }
                self.target = self.region;
            }
            _ => return Settled::Done(r),
        }
        self.hops += 1;
        Settled::Again
    }
}

/// What [`Route::settle`] makes of an attempt.
pub(crate) enum Settled<T> {
    /// The call's outcome.
    Done(Result<T, FabricError>),
    /// Try again at the route's new target.
    Again,
    /// The node that has the region is dead: a standby copy may take over (`Agent::fail_over`); if none does,
    /// this is the outcome.
    HomeDead(Result<T, FabricError>),
}

/// Runs `$attempt` (an expression that may use `$at`, the region to name) along `$route` until it settles,
/// failing over through `$agent` when the home is dead. A macro rather than a function taking the attempt as
/// an async closure: such a closure's future cannot be proven `Send` on stable Rust, and the agent's calls run
/// in spawned tasks.
macro_rules! routed {
    ($agent:expr, $route:expr, |$at:ident| $attempt:expr) => {{
        let mut route = $route;
        loop {
            let $at = route.target();
            match route.settle($attempt) {
                $crate::agent::forwarding::Settled::Done(r) => break r,
                $crate::agent::forwarding::Settled::Again => {}
                $crate::agent::forwarding::Settled::HomeDead(r) => match $agent.fail_over(&route.target()).await {
                    Some(copy) => route.follow(copy),
                    None => break r,
                },
            }
        }
    }};
}
pub(crate) use routed;

/// Whether an error says that the region named is gone: a hint to a hosted copy that moved on.
fn is_stale(e: &FabricError) -> bool {
    matches!(
        e,
        FabricError::UseAfterFree(_)
            | FabricError::InvalidAddress(_)
            | FabricError::Remote { kind: ErrorKind::UseAfterFree | ErrorKind::InvalidAddress, .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::message::WireRegion;

    fn region(slot: u32) -> Region {
        Region::from(&WireRegion {
            addr: (1u64 << 48) | u64::from(slot) << 21,
            len: 1 << 21,
            page_size: 1 << 21,
            slot,
            generation: 1,
        })
    }

    #[test]
    fn entries_nobody_needs_are_swept_and_the_others_kept() {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(async {
            let moves = Moves::default();
            // A region that moved away, and one an operation holds while the table fills.
            let moved = region(0);
            *moves.entry(&moved).write().await = Some(region(1));
            let held = moves.staying(&region(2)).await.expect("not moved");
            // A peer naming region after region that does not exist (each call makes an entry, then lets go).
            for slot in 3..20_000 {
                drop(moves.staying(&region(slot)).await.expect("not moved"));
                assert!(moves.len() <= 2 * SWEEP_FLOOR + 2, "{} entries after {slot} names", moves.len());
            }
            assert!(matches!(moves.staying(&moved).await, Err(FabricError::Moved { to }) if to == region(1)));
            assert_eq!(moves.forwarding(), 1, "the forwarding entry outlived every sweep");
            assert_eq!(Arc::strong_count(&moves.entry(&region(2))), 3, "the held entry is the one in the table");
            drop(held);
        });
    }
}
