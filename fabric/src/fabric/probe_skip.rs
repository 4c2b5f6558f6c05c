//! When the compressed tier stops looking at a region's pages: a page that arrives in host memory costs a probe
//! (a block compressed on the calling thread, about 4 us for a 2 MiB page) before it is packed, and a region
//! whose pages never shrink (bf16 weights, random bytes) would pay it on every page for nothing. After
//! [`STREAK`] pages of a region in a row fail to shrink, its next pages stay in their frames unlooked at; then
//! one page is tried, and each further failure doubles the pages skipped, up to [`MOST_SKIPPED`]. A page that
//! shrinks resets the region. A region whose data changes is therefore looked at again within
//! [`MOST_SKIPPED`] pages.

use std::collections::HashMap;

/// Pages of a region in a row that fail to shrink before its pages are skipped.
pub(crate) const STREAK: u32 = 8;
/// Most pages skipped between two tries.
pub(crate) const MOST_SKIPPED: u32 = 1024;

/// Per region (by its slot), how its recent pages packed.
#[derive(Debug, Default)]
pub(crate) struct ProbeSkips {
    regions: HashMap<u32, Record>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Record {
    /// Pages in a row that did not shrink.
    failed: u32,
    /// Pages still to skip.
    skip: u32,
    /// Pages the next failure skips.
    next: u32,
}

impl ProbeSkips {
    /// Whether a page of the region in `slot` that arrived in host memory is to be looked at; `false` counts
    /// it as skipped.
    pub(crate) fn try_page(&mut self, slot: u32) -> bool {
        let Some(r) = self.regions.get_mut(&slot) else { return true };
        if r.skip == 0 {
            return true;
        }
        r.skip -= 1;
        false
    }

    /// Records how a page of the region in `slot` that was looked at packed: `shrank` when it moved into the
    /// compressed tier's shorter run.
    pub(crate) fn record(&mut self, slot: u32, shrank: bool) {
        if shrank {
            self.regions.remove(&slot);
            return;
        }
        let r = self.regions.entry(slot).or_default();
        r.failed = r.failed.saturating_add(1);
        if r.failed >= STREAK {
            r.next = r.next.clamp(STREAK, MOST_SKIPPED);
            r.skip = r.next;
            r.next = r.next.saturating_mul(2).min(MOST_SKIPPED);
        }
    }

    /// Forgets the region in `slot` (freed: the slot's next region starts afresh).
    pub(crate) fn forget(&mut self, slot: u32) {
        self.regions.remove(&slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `slot` looked at among the next `pages`, each failing to shrink.
    fn tried_of(s: &mut ProbeSkips, slot: u32, pages: u32) -> u32 {
        (0..pages)
            .filter(|_| {
                let tried = s.try_page(slot);
                if tried {
                    s.record(slot, false);
                }
                tried
            })
            .count() as u32
    }

    #[test]
    fn a_region_that_never_shrinks_is_looked_at_less_and_less() {
        let mut s = ProbeSkips::default();
        // The streak is looked at in full, then one page after 8, 16, 32, ... skipped.
        assert_eq!(tried_of(&mut s, 1, STREAK), STREAK);
        assert!(!s.try_page(1), "the page after the streak is skipped");
        let mut s = ProbeSkips::default();
        let tried = tried_of(&mut s, 1, 100_000);
        // The streak, then one page after each skip of 8, 16, ..., 1024 (2,048 pages with their tries), then
        // one in 1,025.
        let expected = STREAK + 8 + (100_000 - STREAK - 2_048) / (MOST_SKIPPED + 1);
        assert_eq!(tried, expected);
        // Another region is looked at as before.
        assert!(s.try_page(2));
    }

    #[test]
    fn a_page_that_shrinks_resets_its_region() {
        let mut s = ProbeSkips::default();
        tried_of(&mut s, 1, 5_000);
        // The region's data changes: the next page looked at shrinks, and every page is looked at again.
        while !s.try_page(1) {}
        s.record(1, true);
        assert!((0..STREAK).all(|_| s.try_page(1)));
        // Mixed pages (every fourth incompressible) never build a streak.
        let mut s = ProbeSkips::default();
        for p in 0..1_000u32 {
            assert!(s.try_page(3), "page {p} skipped");
            s.record(3, p % 4 != 3);
        }
        // A freed region's slot starts afresh.
        tried_of(&mut s, 4, 100);
        s.forget(4);
        assert!(s.try_page(4));
    }
}
