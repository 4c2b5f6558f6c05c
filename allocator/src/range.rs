//! Aligned virtual ranges carved out of one node's arena.

use std::collections::BTreeMap;

use crate::error::AllocError;
use crate::extent::{Fragmentation, FreeExtents};
use crate::fit::Fit;

/// A half-open byte range `[start, start + len)` handed out by a [`RangeAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Range {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Range {
    /// One past the last byte. Saturates at `u64::MAX`; ranges made by a
    /// [`RangeAllocator`] always lie inside its capacity and never do.
    pub const fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }

    /// Whether `offset` lies inside the range.
    pub const fn contains(&self, offset: u64) -> bool {
        offset >= self.start && offset < self.end()
    }
}

/// Hands out aligned, non-overlapping byte ranges of an arena of `capacity` bytes.
///
/// This is the virtual side of the fabric: it decides *where* in a node's address space an
/// allocation lives; which physical frames back it is the [`FrameArena`](crate::FrameArena)'s
/// business. Every length is rounded up to the alignment (normally the page size), so the
/// free space is always aligned too. Errors report bytes.
#[derive(Debug, Clone)]
pub struct RangeAllocator {
    capacity: u64,
    align: u64,
    fit: Fit,
    free: FreeExtents,
    /// Live ranges, start -> len, so `free` is `O(log n)` by start address.
    live: BTreeMap<u64, u64>,
}

impl RangeAllocator {
    /// An allocator over `[0, capacity)` handing out multiples of `align` bytes.
    ///
    /// Fails with [`InvalidConfig`](AllocError::InvalidConfig) unless `align` is a power of
    /// two and `capacity` a multiple of it. A capacity of 0 is allowed (every allocation
    /// fails), which keeps a node with no memory in a tier representable.
    pub fn new(capacity: u64, align: u64, fit: Fit) -> Result<Self, AllocError> {
        if !align.is_power_of_two() {
            return Err(AllocError::InvalidConfig { reason: "range alignment must be a power of two" });
        }
        if capacity % align != 0 {
            return Err(AllocError::InvalidConfig {
                reason: "range allocator capacity must be a multiple of its alignment",
            });
        }
        Ok(Self { capacity, align, fit, free: FreeExtents::new_all_free(capacity), live: BTreeMap::new() })
    }

    /// Allocates `size` bytes rounded up to the alignment.
    ///
    /// Errors: [`InvalidSize`](AllocError::InvalidSize) for 0;
    /// [`OutOfMemory`](AllocError::OutOfMemory) when no free extent holds the rounded size
    /// (`requested` is the rounded size, `available`/`largest_free` the free bytes in total
    /// and in the largest extent).
    pub fn alloc(&mut self, size: u64) -> Result<Range, AllocError> {
        if size == 0 {
            return Err(AllocError::InvalidSize { size, reason: "cannot allocate zero bytes" });
        }
        let Some(len) = size.checked_next_multiple_of(self.align) else {
            return Err(self.oom(size));
        };
        let Some(start) = self.free.take(self.fit, len) else {
            return Err(self.oom(len));
        };
        self.live.insert(start, len);
        Ok(Range { start, len })
    }

    /// Frees the live range starting at `start` and returns it.
    ///
    /// Errors, checked in this order: [`InvalidAddress`](AllocError::InvalidAddress) if
    /// `start` is outside the arena; [`Unaligned`](AllocError::Unaligned) if it is not
    /// aligned; [`DoubleFree`](AllocError::DoubleFree) if it lies in free space (never
    /// allocated, or already freed); [`InvalidAddress`](AllocError::InvalidAddress) if it
    /// lies inside a live range but is not its start.
    pub fn free(&mut self, start: u64) -> Result<Range, AllocError> {
        if start >= self.capacity {
            return Err(AllocError::InvalidAddress { addr: start });
        }
        if start % self.align != 0 {
            return Err(AllocError::Unaligned { addr: start, align: self.align });
        }
        let Some(&len) = self.live.get(&start) else {
            return Err(if self.free.containing(start).is_some() {
                AllocError::DoubleFree { addr: start }
            } else {
                AllocError::InvalidAddress { addr: start }
            });
        };
        // A live range is never free, so this cannot fail; propagating keeps the public
        // path free of panics even if that invariant were ever broken.
        self.free.give_back(start, len)?;
        self.live.remove(&start);
        Ok(Range { start, len })
    }

    /// The live range containing `offset`, if any.
    pub fn find(&self, offset: u64) -> Option<Range> {
        let (&start, &len) = self.live.range(..=offset).next_back()?;
        let r = Range { start, len };
        r.contains(offset).then_some(r)
    }

    /// Live ranges in address order.
    pub fn live(&self) -> impl Iterator<Item = Range> + '_ {
        self.live.iter().map(|(&start, &len)| Range { start, len })
    }

    /// Number of live ranges.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Bytes in live ranges (after rounding).
    pub fn used(&self) -> u64 {
        self.capacity - self.free.free_units()
    }

    /// Free bytes (possibly scattered).
    pub fn free_bytes(&self) -> u64 {
        self.free.free_units()
    }

    /// The largest single allocation that would succeed now, in bytes.
    pub fn largest_free(&self) -> u64 {
        self.free.largest()
    }

    /// Size of the arena in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The alignment every range is rounded to.
    pub fn align(&self) -> u64 {
        self.align
    }

    /// The placement policy.
    pub fn fit(&self) -> Fit {
        self.fit
    }

    /// The free extents as `(start, len)` in address order (for diagnostics and tests).
    pub fn free_extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter()
    }

    /// How fragmented the free space is, in bytes.
    pub fn fragmentation(&self) -> Fragmentation {
        self.free.fragmentation()
    }

    fn oom(&self, requested: u64) -> AllocError {
        AllocError::OutOfMemory { requested, available: self.free.free_units(), largest_free: self.free.largest() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    #[test]
    fn new_validates() {
        assert!(RangeAllocator::new(10 * P, P, Fit::FirstFit).is_ok());
        assert!(RangeAllocator::new(0, P, Fit::FirstFit).is_ok());
        assert!(matches!(RangeAllocator::new(10 * P, 3, Fit::FirstFit), Err(AllocError::InvalidConfig { .. })));
        assert!(matches!(RangeAllocator::new(10 * P, 0, Fit::FirstFit), Err(AllocError::InvalidConfig { .. })));
        assert!(matches!(RangeAllocator::new(10 * P + 1, P, Fit::FirstFit), Err(AllocError::InvalidConfig { .. })));
    }

    #[test]
    fn alloc_rounds_and_frees() {
        let mut a = RangeAllocator::new(10 * P, P, Fit::FirstFit).unwrap();
        let r = a.alloc(1).unwrap();
        assert_eq!(r, Range { start: 0, len: P });
        let r2 = a.alloc(P + 1).unwrap();
        assert_eq!(r2, Range { start: P, len: 2 * P });
        assert_eq!(r2.end(), 3 * P);
        assert_eq!(a.used(), 3 * P);
        assert_eq!(a.live_count(), 2);
        assert_eq!(a.find(P + 5), Some(r2));
        assert_eq!(a.find(5 * P), None);
        assert_eq!(a.free(P).unwrap(), r2);
        assert_eq!(a.used(), P);
        assert_eq!(a.live().collect::<Vec<_>>(), vec![r]);
        assert_eq!(a.capacity(), 10 * P);
        assert_eq!(a.align(), P);
        assert_eq!(a.fit(), Fit::FirstFit);
    }

    #[test]
    fn exact_fit_and_full_arena() {
        let mut a = RangeAllocator::new(4 * P, P, Fit::BestFit).unwrap();
        let r = a.alloc(4 * P).unwrap();
        assert_eq!(r, Range { start: 0, len: 4 * P });
        assert_eq!(a.free_bytes(), 0);
        assert_eq!(a.alloc(1), Err(AllocError::OutOfMemory { requested: P, available: 0, largest_free: 0 }));
        a.free(0).unwrap();
        assert_eq!(a.fragmentation().ratio, 1.0);
        assert_eq!(a.free_extents().collect::<Vec<_>>(), vec![(0, 4 * P)]);
    }

    #[test]
    fn oom_reports_scattered_space() {
        let mut a = RangeAllocator::new(4 * P, P, Fit::FirstFit).unwrap();
        let rs: Vec<_> = (0..4).map(|_| a.alloc(P).unwrap()).collect();
        a.free(rs[0].start).unwrap();
        a.free(rs[2].start).unwrap();
        assert_eq!(
            a.alloc(2 * P),
            Err(AllocError::OutOfMemory { requested: 2 * P, available: 2 * P, largest_free: P })
        );
        let f = a.fragmentation();
        assert_eq!(f.free_ranges, 2);
        assert!((f.ratio - 0.5).abs() < 1e-12);
        assert!(matches!(a.alloc(u64::MAX), Err(AllocError::OutOfMemory { requested: u64::MAX, .. })));
    }

    #[test]
    fn zero_size_is_invalid() {
        let mut a = RangeAllocator::new(4 * P, P, Fit::FirstFit).unwrap();
        assert!(matches!(a.alloc(0), Err(AllocError::InvalidSize { size: 0, .. })));
    }

    #[test]
    fn free_errors() {
        let mut a = RangeAllocator::new(8 * P, P, Fit::FirstFit).unwrap();
        let r = a.alloc(2 * P).unwrap();
        assert_eq!(a.free(8 * P), Err(AllocError::InvalidAddress { addr: 8 * P }));
        assert_eq!(a.free(1), Err(AllocError::Unaligned { addr: 1, align: P }));
        // Inside a live range but not its start.
        assert_eq!(a.free(P), Err(AllocError::InvalidAddress { addr: P }));
        // Never allocated.
        assert_eq!(a.free(4 * P), Err(AllocError::DoubleFree { addr: 4 * P }));
        a.free(r.start).unwrap();
        // Already freed.
        assert_eq!(a.free(r.start), Err(AllocError::DoubleFree { addr: 0 }));
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn best_fit_prefers_the_smallest_hole() {
        let mut a = RangeAllocator::new(10 * P, P, Fit::BestFit).unwrap();
        let r: Vec<_> = [3, 1, 1, 1, 4].iter().map(|&n| a.alloc(n * P).unwrap()).collect();
        a.free(r[0].start).unwrap(); // hole of 3 at 0
        a.free(r[2].start).unwrap(); // hole of 1 at 4
        assert_eq!(a.alloc(P).unwrap().start, 4 * P);
        let mut f = RangeAllocator::new(10 * P, P, Fit::FirstFit).unwrap();
        let r: Vec<_> = [3, 1, 1, 1, 4].iter().map(|&n| f.alloc(n * P).unwrap()).collect();
        f.free(r[0].start).unwrap();
        f.free(r[2].start).unwrap();
        assert_eq!(f.alloc(P).unwrap().start, 0);
    }

    #[test]
    fn zero_capacity() {
        let mut a = RangeAllocator::new(0, P, Fit::FirstFit).unwrap();
        assert!(matches!(a.alloc(1), Err(AllocError::OutOfMemory { .. })));
        assert_eq!(a.free(0), Err(AllocError::InvalidAddress { addr: 0 }));
        assert_eq!(a.fragmentation().ratio, 1.0);
    }
}
