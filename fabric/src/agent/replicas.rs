//! Copies of other nodes' pages kept after their leases end, so the next lease of the same range can skip the
//! transfer.
//!
//! Each copy is kept at the version the home gave it: the next acquire of the same range sends the version,
//! and when it is still current the home sends no pages (the lease still goes through the home, which keeps
//! writers out while the copy is in use). Bounded by `network.replica_cache` bytes, least recently used dropped
//! first, in constant time per copy (an LRU list, not a scan).

use lru::LruCache;
use vfabric_allocator::Location;

use crate::directory::RegionHandle;

/// A region of another node (address and generation), a page range of it (first page, pages) and the device of
/// this node the copy is on.
pub(crate) type ReplicaKey = (u64, u64, u64, u64, Location);

/// A kept copy: the private region on this node that holds it, and the home's version of the range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replica {
    /// The region that holds the copy.
    pub(crate) copy: RegionHandle,
    /// The range's version at the home when the copy was made.
    pub(crate) version: u64,
}

/// The kept copies.
pub(crate) struct ReplicaCache {
    entries: LruCache<ReplicaKey, Replica>,
    bytes: u64,
    cap: u64,
}

impl ReplicaCache {
    /// A cache of at most `cap` bytes of copies.
    pub(crate) fn new(cap: u64) -> ReplicaCache {
        ReplicaCache { entries: LruCache::unbounded(), bytes: 0, cap }
    }

    /// Takes the copy of `key` out (a lease uses it now; it comes back with [`ReplicaCache::keep`]).
    pub(crate) fn take(&mut self, key: &ReplicaKey) -> Option<Replica> {
        let r = self.entries.pop(key)?;
        self.bytes -= r.copy.len;
        Some(r)
    }

    /// Keeps `replica` as the most recently used copy of `key`; returns the copies that no longer fit (this one,
    /// when it alone is larger than the cache), for the caller to free.
    pub(crate) fn keep(&mut self, key: ReplicaKey, replica: Replica) -> Vec<RegionHandle> {
        if replica.copy.len > self.cap {
            return vec![replica.copy];
        }
        let mut dropped = Vec::new();
        if let Some(old) = self.entries.put(key, replica) {
            self.bytes -= old.copy.len;
            dropped.push(old.copy);
        }
        self.bytes += replica.copy.len;
        while self.bytes > self.cap {
            let Some((_, r)) = self.entries.pop_lru() else { break };
            self.bytes -= r.copy.len;
            dropped.push(r.copy);
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfabric_allocator::GlobalAddr;

    fn copy(i: u64, len: u64) -> Replica {
        let addr = GlobalAddr::from_raw(i << 30);
        Replica { copy: RegionHandle { slot: i as u32, generation: 1, addr, len, page_size: len }, version: i }
    }

    fn key(i: u64) -> ReplicaKey {
        (i, 1, 0, 1, Location::Gpu(0))
    }

    #[test]
    fn the_least_recently_used_copies_go_first() {
        let mut c = ReplicaCache::new(3 << 20);
        for i in 0..3 {
            assert!(c.keep(key(i), copy(i, 1 << 20)).is_empty());
        }
        // Used again: 0 becomes the most recent, so 1 is the one to go.
        let zero = c.take(&key(0)).expect("kept");
        assert!(c.keep(key(0), zero).is_empty());
        assert_eq!(c.keep(key(3), copy(3, 1 << 20)).iter().map(|r| r.slot).collect::<Vec<_>>(), vec![1]);
        // One larger than the cache is not kept at all; one that replaces its key frees the old copy.
        assert_eq!(c.keep(key(9), copy(9, 4 << 20)).len(), 1);
        assert_eq!(c.keep(key(3), copy(7, 1 << 20)).iter().map(|r| r.slot).collect::<Vec<_>>(), vec![3]);
        assert!(c.take(&key(1)).is_none() && c.take(&key(2)).is_some());
    }
}
