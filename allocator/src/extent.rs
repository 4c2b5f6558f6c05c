//! A coalescing set of free extents: the one piece of free-space bookkeeping that both
//! [`RangeAllocator`](crate::RangeAllocator) (bytes) and [`FrameArena`](crate::FrameArena)
//! (frames) are built on.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::AllocError;
use crate::fit::Fit;

/// How fragmented an allocator's free space is.
///
/// All counts are in the unit of the allocator it describes (bytes for a
/// [`RangeAllocator`](crate::RangeAllocator), frames for a [`FrameArena`](crate::FrameArena)).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fragmentation {
    /// Free units in total.
    pub free_units: u64,
    /// Number of maximal free extents.
    pub free_ranges: u64,
    /// Length of the largest free extent.
    pub largest_free: u64,
    /// `largest_free / free_units`: the share of free space a single contiguous request can
    /// use. `1.0` means not fragmented at all (every free unit lies in one extent, or nothing
    /// is free, in which case there is nothing to fragment); values towards `0.0` mean the
    /// free space is scattered in many small extents. `1.0 - ratio` is the usual
    /// "external fragmentation" figure.
    pub ratio: f64,
}

/// The free units of a space `[0, total)`, kept as maximal half-open extents.
///
/// Invariants (checked by the property tests): extents never overlap, never touch (two
/// adjacent free extents are always merged into one) and lie inside `[0, total)`.
///
/// Two indexes are kept in step: by start address (for first-fit, neighbour lookup and
/// ordered iteration) and by `(len, start)` (so best-fit and "largest" are `O(log n)`).
/// First-fit scans extents in address order, `O(n)` in the number of free extents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeExtents {
    total: u64,
    free: u64,
    by_start: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
}

impl FreeExtents {
    /// A space of `total` units, all free.
    pub fn new_all_free(total: u64) -> Self {
        let mut s = Self::new_all_used(total);
        if total > 0 {
            s.insert(0, total);
        }
        s
    }

    /// A space of `total` units, none free.
    pub fn new_all_used(total: u64) -> Self {
        Self { total, free: 0, by_start: BTreeMap::new(), by_len: BTreeSet::new() }
    }

    /// Size of the whole space.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of free units.
    pub fn free_units(&self) -> u64 {
        self.free
    }

    /// Number of (maximal) free extents.
    pub fn free_ranges(&self) -> u64 {
        self.by_start.len() as u64
    }

    /// Length of the largest free extent (0 when nothing is free).
    pub fn largest(&self) -> u64 {
        self.by_len.last().map_or(0, |&(len, _)| len)
    }

    /// The free extents as `(start, len)`, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start.iter().map(|(&s, &l)| (s, l))
    }

    /// Whether every unit of `[start, start + len)` is free. An empty range is trivially
    /// free; a range reaching outside `[0, total)` is not.
    pub fn is_free(&self, start: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        match self.containing(start) {
            Some((s, l)) => end <= s + l,
            None => false,
        }
    }

    /// The free extent `(start, len)` that contains `unit`, if `unit` is free.
    pub fn containing(&self, unit: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.by_start.range(..=unit).next_back()?;
        (unit < s + l).then_some((s, l))
    }

    /// Where [`take`](Self::take) would place `len` units under `fit`, without taking them.
    /// `None` when `len` is 0 or no extent is large enough.
    pub fn find(&self, fit: Fit, len: u64) -> Option<u64> {
        if len == 0 {
            return None;
        }
        match fit {
            Fit::FirstFit => self.by_start.iter().find(|&(_, &l)| l >= len).map(|(&s, _)| s),
            // The (len, start) order makes the first entry at or after (len, 0) the
            // smallest sufficient extent, lowest address among equals.
            Fit::BestFit => self.by_len.range((len, 0)..).next().map(|&(_, s)| s),
        }
    }

    /// Takes `len` units from the front of the extent chosen by `fit` and returns their
    /// start; `None` (and nothing changes) when `len` is 0 or no extent is large enough.
    pub fn take(&mut self, fit: Fit, len: u64) -> Option<u64> {
        let start = self.find(fit, len)?;
        let (s, l) = self.containing(start)?;
        self.carve(s, l, start, len);
        Some(start)
    }

    /// Takes exactly `[start, start + len)`, which must be entirely free.
    ///
    /// Errors: [`InvalidSize`](AllocError::InvalidSize) for `len == 0`,
    /// [`InvalidAddress`](AllocError::InvalidAddress) for a range reaching outside
    /// `[0, total)`, [`InUse`](AllocError::InUse) naming the first unit that is not free.
    pub fn take_exact(&mut self, start: u64, len: u64) -> Result<(), AllocError> {
        let end = self.check_range(start, len)?;
        match self.containing(start) {
            Some((s, l)) if end <= s + l => {
                self.carve(s, l, start, len);
                Ok(())
            }
            // `start` is free but the extent stops short: the unit right after it is used.
            Some((s, l)) => Err(AllocError::InUse { addr: s + l }),
            None => Err(AllocError::InUse { addr: start }),
        }
    }

    /// Returns `[start, start + len)` to the free set, merging it with free neighbours.
    ///
    /// Errors: [`InvalidSize`](AllocError::InvalidSize) for `len == 0`,
    /// [`InvalidAddress`](AllocError::InvalidAddress) for a range reaching outside
    /// `[0, total)`, [`DoubleFree`](AllocError::DoubleFree) naming the first unit of the
    /// range that is already free. Nothing changes on error.
    pub fn give_back(&mut self, start: u64, len: u64) -> Result<(), AllocError> {
        let end = self.check_range(start, len)?;
        if self.containing(start).is_some() {
            return Err(AllocError::DoubleFree { addr: start });
        }
        if let Some((&s, _)) = self.by_start.range(start..end).next() {
            return Err(AllocError::DoubleFree { addr: s });
        }
        let mut new_start = start;
        let mut new_len = len;
        // Merge with the extent ending exactly at `start`...
        if let Some((&s, &l)) = self.by_start.range(..start).next_back() {
            if s + l == start {
                self.remove(s, l);
                new_start = s;
                new_len += l;
            }
        }
        // ...and with the one starting exactly at `end`.
        if let Some(&l) = self.by_start.get(&end) {
            self.remove(end, l);
            new_len += l;
        }
        self.insert(new_start, new_len);
        Ok(())
    }

    /// Takes `min(max_len, largest())` units from the start of the largest extent (lowest
    /// address among equally large ones) and returns them as `(start, len)`. `None` when
    /// `max_len` is 0 or nothing is free.
    pub fn take_largest(&mut self, max_len: u64) -> Option<(u64, u64)> {
        if max_len == 0 {
            return None;
        }
        let largest = self.largest();
        let &(l, s) = self.by_len.range((largest, 0)..).next()?;
        let len = max_len.min(l);
        self.carve(s, l, s, len);
        Some((s, len))
    }

    /// Summary of how fragmented the free space is.
    pub fn fragmentation(&self) -> Fragmentation {
        let largest = self.largest();
        Fragmentation {
            free_units: self.free,
            free_ranges: self.free_ranges(),
            largest_free: largest,
            ratio: if self.free == 0 { 1.0 } else { largest as f64 / self.free as f64 },
        }
    }

    /// Validates a non-empty range inside `[0, total)` and returns its end.
    fn check_range(&self, start: u64, len: u64) -> Result<u64, AllocError> {
        if len == 0 {
            return Err(AllocError::InvalidSize { size: 0, reason: "an extent must be at least one unit long" });
        }
        if start >= self.total {
            return Err(AllocError::InvalidAddress { addr: start });
        }
        match start.checked_add(len) {
            Some(end) if end <= self.total => Ok(end),
            // The first unit outside the space.
            _ => Err(AllocError::InvalidAddress { addr: self.total }),
        }
    }

    /// Removes `[start, start + len)` from the free extent `(s, l)` that contains it,
    /// keeping the pieces on either side.
    fn carve(&mut self, s: u64, l: u64, start: u64, len: u64) {
        self.remove(s, l);
        if start > s {
            self.insert(s, start - s);
        }
        let end = start + len;
        if end < s + l {
            self.insert(end, s + l - end);
        }
    }

    fn insert(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
        self.free += len;
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
        self.free -= len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extents(f: &FreeExtents) -> Vec<(u64, u64)> {
        f.iter().collect()
    }

    #[test]
    fn construction() {
        let f = FreeExtents::new_all_free(10);
        assert_eq!(f.total(), 10);
        assert_eq!(f.free_units(), 10);
        assert_eq!(f.free_ranges(), 1);
        assert_eq!(f.largest(), 10);
        let u = FreeExtents::new_all_used(10);
        assert_eq!(u.free_units(), 0);
        assert_eq!(u.largest(), 0);
        assert_eq!(u.free_ranges(), 0);
        let e = FreeExtents::new_all_free(0);
        assert_eq!(e.free_ranges(), 0);
        assert_eq!(e.fragmentation().ratio, 1.0);
    }

    #[test]
    fn first_fit_and_best_fit() {
        let mut f = FreeExtents::new_all_used(100);
        f.give_back(0, 10).unwrap();
        f.give_back(20, 5).unwrap();
        f.give_back(40, 5).unwrap();
        f.give_back(60, 30).unwrap();
        assert_eq!(f.find(Fit::FirstFit, 5), Some(0));
        assert_eq!(f.find(Fit::BestFit, 5), Some(20));
        assert_eq!(f.find(Fit::BestFit, 6), Some(0));
        assert_eq!(f.find(Fit::BestFit, 11), Some(60));
        assert_eq!(f.find(Fit::FirstFit, 31), None);
        assert_eq!(f.take(Fit::BestFit, 5), Some(20));
        assert_eq!(f.take(Fit::BestFit, 5), Some(40));
        assert_eq!(f.take(Fit::FirstFit, 4), Some(0));
        assert_eq!(extents(&f), vec![(4, 6), (60, 30)]);
        assert_eq!(f.take(Fit::FirstFit, 0), None);
        assert_eq!(f.take(Fit::FirstFit, 31), None);
        assert_eq!(f.free_units(), 36);
    }

    #[test]
    fn exact_fit_consumes_the_extent() {
        let mut f = FreeExtents::new_all_free(8);
        assert_eq!(f.take(Fit::FirstFit, 8), Some(0));
        assert_eq!(f.free_units(), 0);
        assert_eq!(f.free_ranges(), 0);
        assert_eq!(f.take(Fit::BestFit, 1), None);
    }

    #[test]
    fn give_back_coalesces_both_sides() {
        let mut f = FreeExtents::new_all_used(30);
        f.give_back(0, 10).unwrap();
        f.give_back(20, 10).unwrap();
        assert_eq!(f.free_ranges(), 2);
        f.give_back(10, 10).unwrap();
        assert_eq!(extents(&f), vec![(0, 30)]);
        assert_eq!(f.largest(), 30);
    }

    #[test]
    fn give_back_errors_change_nothing() {
        let mut f = FreeExtents::new_all_used(30);
        f.give_back(10, 5).unwrap();
        let before = f.clone();
        assert_eq!(f.give_back(12, 1), Err(AllocError::DoubleFree { addr: 12 }));
        assert_eq!(f.give_back(5, 10), Err(AllocError::DoubleFree { addr: 10 }));
        assert_eq!(f.give_back(14, 3), Err(AllocError::DoubleFree { addr: 14 }));
        assert_eq!(f.give_back(30, 1), Err(AllocError::InvalidAddress { addr: 30 }));
        assert_eq!(f.give_back(25, 6), Err(AllocError::InvalidAddress { addr: 30 }));
        assert_eq!(f.give_back(25, u64::MAX), Err(AllocError::InvalidAddress { addr: 30 }));
        assert!(matches!(f.give_back(0, 0), Err(AllocError::InvalidSize { size: 0, .. })));
        assert_eq!(f, before);
    }

    #[test]
    fn take_exact() {
        let mut f = FreeExtents::new_all_free(20);
        f.take_exact(5, 5).unwrap();
        assert_eq!(extents(&f), vec![(0, 5), (10, 10)]);
        let before = f.clone();
        assert_eq!(f.take_exact(5, 1), Err(AllocError::InUse { addr: 5 }));
        assert_eq!(f.take_exact(3, 4), Err(AllocError::InUse { addr: 5 }));
        assert_eq!(f.take_exact(18, 3), Err(AllocError::InvalidAddress { addr: 20 }));
        assert_eq!(f.take_exact(20, 1), Err(AllocError::InvalidAddress { addr: 20 }));
        assert!(matches!(f.take_exact(0, 0), Err(AllocError::InvalidSize { .. })));
        assert_eq!(f, before);
        f.take_exact(0, 5).unwrap();
        f.take_exact(10, 10).unwrap();
        assert_eq!(f.free_units(), 0);
    }

    #[test]
    fn take_largest() {
        let mut f = FreeExtents::new_all_used(100);
        f.give_back(0, 10).unwrap();
        f.give_back(20, 30).unwrap();
        f.give_back(60, 30).unwrap();
        // Ties go to the lowest address.
        assert_eq!(f.take_largest(100), Some((20, 30)));
        assert_eq!(f.take_largest(7), Some((60, 7)));
        assert_eq!(f.take_largest(0), None);
        assert_eq!(extents(&f), vec![(0, 10), (67, 23)]);
        assert_eq!(f.take_largest(100), Some((67, 23)));
        assert_eq!(f.take_largest(100), Some((0, 10)));
        assert_eq!(f.take_largest(100), None);
    }

    #[test]
    fn is_free_and_containing() {
        let mut f = FreeExtents::new_all_free(10);
        f.take_exact(4, 2).unwrap();
        assert!(f.is_free(0, 4));
        assert!(!f.is_free(0, 5));
        assert!(f.is_free(6, 4));
        assert!(!f.is_free(6, 5));
        assert!(!f.is_free(9, u64::MAX));
        assert!(f.is_free(4, 0));
        assert_eq!(f.containing(5), None);
        assert_eq!(f.containing(7), Some((6, 4)));
        assert_eq!(f.containing(10), None);
    }

    #[test]
    fn fragmentation_ratio() {
        let mut f = FreeExtents::new_all_free(100);
        assert_eq!(f.fragmentation().ratio, 1.0);
        f.take_exact(25, 25).unwrap();
        let frag = f.fragmentation();
        assert_eq!(frag.free_units, 75);
        assert_eq!(frag.free_ranges, 2);
        assert_eq!(frag.largest_free, 50);
        assert!((frag.ratio - 50.0 / 75.0).abs() < 1e-12);
        f.take_exact(0, 25).unwrap();
        f.take_exact(50, 50).unwrap();
        assert_eq!(f.fragmentation().ratio, 1.0);
    }
}
