//! Replicated regions, as tables: this node's regions whose released writes other nodes also keep (their
//! standby copies), and the standby copies this node keeps for other homes.
//!
//! A region allocated with `replicas = 2` has a standby copy in the host memory of another node (with
//! `replicas = N`, one on each of N - 1 others), which every write and write lease released at the home reaches
//! before the call returns (`super::replication`). When the home dies, a caller asks the standby's node to take
//! over (`super::failover`; with several standbys, the first to claim it in etcd does): from then on the copy is
//! the region, callers' location hints point at it, and the old home, should it come back, learns it at its
//! first exchange with the copy and sends its callers there. No acknowledged write is lost, and two homes
//! never serve one region at once:
//!
//! - a standby takes over only after it has heard nothing from the home for `network.dead_after_ms`;
//! - the home serves a replicated region on its own only for half of that after its last exchange with the
//!   standby (it then asks again first), and answers no write before the standby has it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::directory::RegionHandle as Region;

/// Whether a home may serve a replicated region on its own, `since` the last exchange that every standby
/// answered was sent (`None`: none was): for half of `dead_after`, so that it stops well before a standby may
/// take over ([`may_take_over`]), which is no earlier than `dead_after` after the standby last heard from it.
pub fn serves_alone(since: Option<Duration>, dead_after: Duration) -> bool {
    since.is_some_and(|s| s < dead_after / 2)
}

/// Whether a node that has not heard from a peer for `silent` may take it for dead (and a standby take over
/// from it as its home).
pub fn may_take_over(silent: Duration, dead_after: Duration) -> bool {
    silent >= dead_after
}

/// A replicated region of this node: its standby copies and what the home knows of them. Its lock is held for
/// the whole of each write (the write and its copy to the standbys are one step, so standbys see writes in the
/// order the home applied them).
#[derive(Debug, Default)]
pub(crate) struct Standbys {
    /// The copies, on other nodes, in the order they were placed (with one, it takes over; with more, the
    /// first to claim the takeover in etcd).
    pub(crate) copies: Vec<Region>,
    /// When the last exchange that every standby answered was sent: the home serves the region on its own
    /// until half of `network.dead_after_ms` past it.
    pub(crate) confirmed: Option<Instant>,
    /// Ranges written here that a standby did not take (their write failed): sent again before anything else.
    pub(crate) pending: Vec<std::ops::Range<u64>>,
    /// The copy that took over from this node (which its standby's node took for dead): the region lives there now.
    pub(crate) taken_over: Option<Region>,
    /// Exchanges sent to the standbys so far (each carries its number).
    pub(crate) seq: u64,
    /// The region as its users name it: this one, or the one it took over from a dead home.
    pub(crate) origin: Option<Region>,
    /// How many nodes keep the region, this one included (1: it is being handed over, `Agent::drain`).
    pub(crate) replicas: u8,
    /// How far behind the home its standbys may be (`None`: not at all, each write reaches them first).
    pub(crate) lag: Option<Duration>,
    /// Since when a write acknowledged here has not reached the standbys (asynchronous regions).
    pub(crate) behind_since: Option<Instant>,
    /// Whether a background flush of the pending writes is scheduled.
    pub(crate) flushing: bool,
}

/// A replicated region's entry at its home.
pub(crate) type HomeEntry = Arc<tokio::sync::Mutex<Standbys>>;

/// A standby copy this node keeps: the home's region, and its state behind a lock that a home's write holds
/// while it lands (so that none lands after the copy took over, or over a newer one).
#[derive(Debug, Clone)]
pub(crate) struct Standby {
    /// The region at its home.
    pub(crate) home: Region,
    /// The region as its users name it (`home`, or the region `home` took over from).
    pub(crate) origin: Region,
    /// How many nodes keep the region: a copy that takes over places standbys of its own when more than one.
    pub(crate) replicas: u8,
    /// What it took and whether it took over.
    pub(crate) state: Arc<tokio::sync::Mutex<StandbyState>>,
}

/// A standby copy's state.
#[derive(Debug, Default)]
pub(crate) struct StandbyState {
    /// Whether the copy took over from its home.
    pub(crate) promoted: bool,
    /// Whether the copy became another home's standby (`Backups::rehome`): this state's home may send
    /// nothing more to it.
    pub(crate) retired: bool,
    /// The last exchange of its home it took.
    pub(crate) seq: u64,
}

/// Both tables.
#[derive(Default)]
pub(crate) struct Backups {
    homed: Mutex<HashMap<Region, HomeEntry>>,
    kept: Mutex<Kept>,
}

/// The standby copies kept here, by copy and by the home's region.
#[derive(Default)]
struct Kept {
    by_copy: HashMap<Region, Standby>,
    by_home: HashMap<Region, Region>,
}

impl Kept {
    fn forget(&mut self, copy: &Region) {
        if let Some(s) = self.by_copy.remove(copy) {
            self.by_home.remove(&s.home);
            self.by_home.remove(&s.origin);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Backups {
    /// The entry of `region` when it is a replicated region of this node.
    pub(crate) fn homed(&self, region: &Region) -> Option<HomeEntry> {
        lock(&self.homed).get(region).cloned()
    }

    /// Records `region`, a region of this node kept on `replicas` nodes whose standbys may be `lag` behind,
    /// with its standby copies; `origin` is the region its users name, when `region` took over from it.
    pub(crate) fn add_homed(
        &self,
        region: Region,
        copies: Vec<Region>,
        origin: Option<Region>,
        (replicas, lag): (u8, Option<Duration>),
    ) {
        let entry = Standbys { copies, origin, replicas, lag, ..Standbys::default() };
        lock(&self.homed).insert(region, Arc::new(tokio::sync::Mutex::new(entry)));
    }

    /// Records `region` as [`Backups::add_homed`] does, with no standby yet, and returns its entry locked: the
    /// region's writes wait until the caller has placed its standbys and let go.
    pub(crate) fn add_adopting(
        &self,
        region: Region,
        origin: Region,
        replicas: u8,
    ) -> tokio::sync::OwnedMutexGuard<Standbys> {
        let entry = Standbys { origin: Some(origin), replicas, ..Standbys::default() };
        let entry = Arc::new(tokio::sync::Mutex::new(entry));
        let held = entry.clone().try_lock_owned().expect("a new entry is not locked");
        lock(&self.homed).insert(region, entry);
        held
    }

    /// Takes `region`'s entry out (the region is freed).
    pub(crate) fn remove_homed(&self, region: &Region) -> Option<HomeEntry> {
        lock(&self.homed).remove(region)
    }

    /// The replicated regions this node is the home of.
    pub(crate) fn homed_regions(&self) -> Vec<Region> {
        lock(&self.homed).keys().copied().collect()
    }

    /// How many replicated regions this node is the home of.
    pub(crate) fn homed_count(&self) -> usize {
        lock(&self.homed).len()
    }

    /// The copy kept here of `home` (or of the region that `home` took over from), if any.
    pub(crate) fn copy_of(&self, home: &Region) -> Option<(Region, Standby)> {
        let kept = lock(&self.kept);
        let copy = *kept.by_home.get(home)?;
        kept.by_copy.get(&copy).map(|s| (copy, s.clone()))
    }

    /// The standby that `copy` is, if it is one.
    pub(crate) fn standby(&self, copy: &Region) -> Option<Standby> {
        lock(&self.kept).by_copy.get(copy).cloned()
    }

    /// Records `copy` as the standby copy of `home`, which its users name `origin`, a region kept on
    /// `replicas` nodes.
    pub(crate) fn keep(&self, home: Region, origin: Region, copy: Region, replicas: u8) {
        let mut kept = lock(&self.kept);
        kept.by_home.insert(home, copy);
        kept.by_home.insert(origin, copy);
        kept.by_copy.insert(copy, Standby { home, origin, replicas, state: Arc::default() });
    }

    /// Makes the copy kept here of `origin` (a region this node keeps a standby of under another home, not
    /// promoted: its home died and another of its copies took over) the standby copy of `home`, the copy that
    /// took over, with a fresh state: the region's bytes come again whole from its new home. The copy, or
    /// `None` when there is none to reuse (`Err` when the copy here took over itself: this node is a home of
    /// the region).
    pub(crate) fn rehome(&self, home: Region, origin: Region, replicas: u8) -> Result<Option<Region>, Region> {
        let mut kept = lock(&self.kept);
        let Some(copy) = kept.by_home.get(&origin).copied() else { return Ok(None) };
        let Some(old) = kept.by_copy.get(&copy) else { return Ok(None) };
        // Promoted, or being promoted or written right now: not this node's to give up.
        let Ok(mut state) = old.state.try_lock() else { return Err(copy) };
        if state.promoted {
            return Err(copy);
        }
        // A write of the old home's still under way (its payload arriving) finds the state retired once it
        // locks it, and lands nowhere.
        state.retired = true;
        drop(state);
        let old_home = old.home;
        if old_home != origin {
            kept.by_home.remove(&old_home);
        }
        kept.by_home.insert(home, copy);
        kept.by_home.insert(origin, copy);
        kept.by_copy.insert(copy, Standby { home, origin, replicas, state: Arc::default() });
        Ok(Some(copy))
    }

    /// Forgets `copy` (freed) as a standby.
    pub(crate) fn forget_copy(&self, copy: &Region) {
        lock(&self.kept).forget(copy);
    }

    /// How many standby copies this node keeps for other homes.
    pub(crate) fn kept_count(&self) -> usize {
        lock(&self.kept).by_copy.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::message::WireRegion;

    fn region(node: u64, slot: u32) -> Region {
        Region::from(&WireRegion {
            addr: node << 48 | u64::from(slot) << 21,
            len: 1 << 21,
            page_size: 1 << 21,
            slot,
            generation: 1,
        })
    }

    #[test]
    fn standbys_are_found_both_ways_and_forgotten_together() {
        let b = Backups::default();
        let (home, copy) = (region(0, 1), region(1, 4));
        b.keep(home, home, copy, 2);
        assert_eq!(b.copy_of(&home).map(|(c, s)| (c, s.home)), Some((copy, home)));
        assert_eq!(b.standby(&copy).map(|s| s.home), Some(home));
        assert!(b.standby(&home).is_none(), "a home's region is no standby");
        b.forget_copy(&copy);
        assert!(b.copy_of(&home).is_none() && b.standby(&copy).is_none());
        assert_eq!(b.kept_count(), 0);
    }

    #[test]
    fn a_copy_rehomed_to_the_copy_that_took_over_is_still_found_by_the_regions_first_name() {
        let b = Backups::default();
        let (origin, copy, took_over) = (region(0, 1), region(2, 4), region(1, 7));
        b.keep(origin, origin, copy, 3);
        let old = b.standby(&copy).expect("a standby");
        // Busy (a write of the old home's landing): not given up now.
        let busy = old.state.clone().try_lock_owned().expect("not locked yet");
        assert_eq!(b.rehome(took_over, origin, 3), Err(copy));
        drop(busy);
        assert_eq!(b.rehome(took_over, origin, 3), Ok(Some(copy)));
        assert!(old.state.try_lock().expect("free").retired, "the old home's state takes nothing more");
        let now = b.standby(&copy).expect("still a standby");
        assert_eq!((now.home, now.origin), (took_over, origin));
        assert!(!now.state.try_lock().expect("free").retired, "a fresh state for the new home");
        assert_eq!(b.copy_of(&origin).map(|(c, _)| c), Some(copy), "found by the region's first name");
        assert_eq!(b.copy_of(&took_over).map(|(c, _)| c), Some(copy), "and by its new home's");
        // A copy that took over itself is never given up.
        let (other, promoted) = (region(0, 2), region(2, 5));
        b.keep(other, other, promoted, 3);
        b.standby(&promoted).expect("a standby").state.try_lock().expect("free").promoted = true;
        assert_eq!(b.rehome(region(1, 8), other, 3), Err(promoted));
        assert_eq!(b.rehome(region(1, 9), region(0, 3), 3), Ok(None), "no copy of that region here");
    }

    #[test]
    fn homed_regions_come_and_go() {
        let b = Backups::default();
        b.add_homed(region(0, 1), vec![region(1, 2)], None, (2, None));
        assert!(b.homed(&region(0, 1)).is_some() && b.homed(&region(0, 2)).is_none());
        assert_eq!(b.homed_count(), 1);
        assert!(b.remove_homed(&region(0, 1)).is_some());
        assert_eq!(b.homed_count(), 0);
    }
}
