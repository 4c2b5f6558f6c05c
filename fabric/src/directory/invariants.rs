//! The directory's own invariants, checked by tests after every operation.

use std::collections::{BTreeSet, HashMap, HashSet};

use vfabric_allocator::FrameState;

use super::page::{Copy, DevIdx, PageRef};
use super::state::Directory;

/// A broken invariant of the directory's tables (a bug): what is inconsistent, naming the pages and frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("directory invariant broken: {0}")]
pub struct InvariantError(pub String);

fn broken(what: String) -> InvariantError {
    InvariantError(what)
}

impl Directory {
    /// Checks the directory's own invariants (for tests): every copy's frame is used and points back to its
    /// page; no frame holds two copies; pinned frames are exactly the leased copies; no page has two copies on
    /// one device; the compressed tier's runs are exactly its copies', and its used blocks theirs; every frame a
    /// reservation holds is used, pinned by it alone, and holds nothing else (no copy, no stage in flight, no
    /// other reservation).
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        self.check_reservations()?;
        let mut seen: HashMap<(DevIdx, u32), PageRef> = HashMap::new();
        for (slot, r) in self.regions.iter().enumerate() {
            let Some(r) = r else { continue };
            for (i, p) in r.pages.touched() {
                let page = PageRef { slot: slot as u32, page: i as u32 };
                let mut devs = BTreeSet::new();
                if p.owner().is_none() && !p.sharers().is_empty() {
                    return Err(broken(format!("{page:?} has sharers but no owner")));
                }
                for c in p.copies() {
                    if !devs.insert(c.dev) {
                        return Err(broken(format!("{page:?} has two copies on device {}", c.dev)));
                    }
                    if let Some(other) = seen.insert((c.dev, c.frame), page) {
                        return Err(broken(format!("frame {:?} holds {page:?} and {other:?}", (c.dev, c.frame))));
                    }
                    let d = &self.devs[usize::from(c.dev)];
                    if d.users[c.frame as usize] != Some(page) {
                        return Err(broken(format!("frame {:?} does not point back to {page:?}", (c.dev, c.frame))));
                    }
                    if d.frames.state(c.frame) == Some(FrameState::Free) {
                        return Err(broken(format!(
                            "frame {:?} of {page:?} is free in the allocator",
                            (c.dev, c.frame)
                        )));
                    }
                    let pinned = d.frames.lease_count(c.frame) > 0;
                    if pinned == d.lru.contains(c.frame) {
                        return Err(broken(format!(
                            "frame {:?}: pinned {pinned} but LRU membership disagrees",
                            (c.dev, c.frame)
                        )));
                    }
                }
                if p.write_leased && p.read_leases > 0 {
                    return Err(broken(format!("{page:?} is leased for reading and writing")));
                }
            }
        }
        for d in &self.devs {
            if let Some(f) = d.fresh.iter().zip(&d.users).position(|(&fresh, user)| fresh && user.is_none()) {
                return Err(broken(format!("frame {f} of {} is marked prefetched but holds no copy", d.location)));
            }
        }
        for f in &self.in_flight {
            let Some(r) = self.regions.get(f.slot as usize).and_then(|r| r.as_ref()) else {
                return Err(broken(format!("a prefetch is in flight for freed region slot {}", f.slot)));
            };
            let pinned = |c: Copy| self.devs[usize::from(c.dev)].frames.lease_count(c.frame) > 0;
            if let Some(c) = f.sources.iter().find(|c| !pinned(**c)) {
                return Err(broken(format!("frame {:?} read by a stage in flight is not pinned", (c.dev, c.frame))));
            }
            for &(page, new, old) in &f.moves {
                if !pinned(new) || old.is_some_and(|o| !pinned(o)) {
                    return Err(broken(format!("page {page}'s frames in flight are not pinned")));
                }
                let Some(p) = r.pages.get(page as usize) else {
                    return Err(broken(format!("a prefetch is in flight for page {page} past its region's end")));
                };
                if p.copy_on(new.dev) != old || self.devs[usize::from(new.dev)].users[new.frame as usize].is_some() {
                    return Err(broken(format!(
                        "prefetch of page {page} into frame {:?} collides with a copy",
                        new.frame
                    )));
                }
            }
        }
        for (di, d) in self.devs.iter().enumerate() {
            let prefetching =
                self.in_flight.iter().flat_map(|f| &f.moves).filter(|m| usize::from(m.1.dev) == di).count();
            let reserved = self.reserved_frames(di as DevIdx) as usize;
            // A copy in the compressed tier takes its run of blocks; elsewhere one frame.
            let held: usize = d
                .users
                .iter()
                .enumerate()
                .filter(|(_, u)| u.is_some())
                .map(|(f, _)| d.spans.get(f).map_or(1, |&s| usize::from(s)))
                .sum();
            if let Some(f) = d.spans.iter().enumerate().position(|(f, &s)| (s > 0) != d.users[f].is_some()) {
                return Err(broken(format!("{}: run at block {f} and the copy there disagree", d.location)));
            }
            // A run's other blocks are taken, and start nothing of their own.
            for (f, &s) in d.spans.iter().enumerate().filter(|(_, &s)| s > 1) {
                let inside = f + 1..f + usize::from(s);
                let bad = inside.clone().find(|&b| {
                    d.spans.get(b) != Some(&0)
                        || d.users[b].is_some()
                        || d.frames.state(b as u32).is_none_or(|st| st == FrameState::Free)
                });
                if let Some(b) = bad {
                    return Err(broken(format!(
                        "{}: block {b} of the run at {f} is free or holds another",
                        d.location
                    )));
                }
            }
            let used = (held + prefetching + reserved) as u32;
            let unpinned =
                d.users.iter().enumerate().filter(|(f, u)| u.is_some() && d.frames.lease_count(*f as u32) == 0).count();
            if unpinned != d.lru.len() {
                return Err(broken(format!(
                    "{}: {unpinned} unpinned copies but {} in the eviction order",
                    d.location,
                    d.lru.len()
                )));
            }
            if used != d.frames.used_frames() {
                return Err(broken(format!(
                    "{}: {used} frames hold pages but the allocator counts {}",
                    d.location,
                    d.frames.used_frames()
                )));
            }
            for (f, u) in d.users.iter().enumerate() {
                if let Some(p) = u {
                    if !seen.contains_key(&(di as DevIdx, f as u32)) {
                        return Err(broken(format!(
                            "{}: frame {f} points to {p:?}, which has no copy there",
                            d.location
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// The reservations' part of [`Directory::check_invariants`]: the frames each holds (which the allocator
    /// counts as used, beside the copies) are its own and nothing else's.
    fn check_reservations(&self) -> Result<(), InvariantError> {
        let mut held: HashSet<(DevIdx, u32)> = HashSet::new();
        for (&id, (dev, frames, _)) in &self.reservations.held {
            let Some(d) = self.devs.get(usize::from(*dev)) else {
                return Err(broken(format!("reservation {id} is of device {dev}, which the node does not have")));
            };
            for &f in frames {
                let at = (d.location, f);
                if !held.insert((*dev, f)) {
                    return Err(broken(format!("frame {at:?} is held twice by reservations (reservation {id})")));
                }
                if d.users.get(f as usize).is_none_or(|u| u.is_some()) {
                    return Err(broken(format!("frame {at:?} of reservation {id} holds a copy, or is past the end")));
                }
                if d.frames.state(f).is_none_or(|st| st == FrameState::Free) {
                    return Err(broken(format!("frame {at:?} of reservation {id} is free in the allocator")));
                }
                if d.frames.lease_count(f) != 1 || d.lru.contains(f) {
                    return Err(broken(format!(
                        "frame {at:?} of reservation {id} is pinned {} times (once, by the reservation, is right)",
                        d.frames.lease_count(f)
                    )));
                }
                if self.in_flight.iter().flat_map(|s| &s.moves).any(|m| m.1 == Copy { dev: *dev, frame: f }) {
                    return Err(broken(format!("frame {at:?} of reservation {id} is taken by a stage in flight")));
                }
            }
        }
        Ok(())
    }
}
