//! Where callers waited inside the fabric: the stages a call had to carry out before it could go on (copies
//! made to make room, an acquire's own fetches), and the stages in flight it had to let land first. The bytes
//! say what moved ([`Traffic`](super::Traffic)); these say what it cost the callers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::directory::StageKind;

/// Time callers spent blocked in the fabric, by what they waited for, in nanoseconds summed over the callers'
/// threads, with the number of waits. Every figure only grows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stalls {
    /// Evictions carried out to make room (copies to host memory or storage, waited for).
    pub evict_ns: u64,
    /// Pages moved within a device to make a run of frames, waited for.
    pub compact_ns: u64,
    /// An acquire's own fetches (the pages not there yet: copies and zero-fills), waited for.
    pub fetch_ns: u64,
    /// Migrations, waited for.
    pub migrate_ns: u64,
    /// Starting hints' and walks' stages that stay in flight (queueing their copies, zero-fills).
    pub launch_ns: u64,
    /// Waiting for stages in flight (prefetches, write-backs) to land before a call could go on.
    pub in_flight_ns: u64,
    /// Packing lossless regions' pages that arrived in host memory for the compressed tier (on the CPU, after
    /// the stage that brought them), and the evictions that made room there (also counted in `evict_ns`).
    pub pack_ns: u64,
    /// Stages carried out while a caller waited (the first four figures' count).
    pub stages: u64,
    /// Waits for stages in flight (the count behind `in_flight_ns`).
    pub in_flight_waits: u64,
}

impl Stalls {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Stalls) -> Stalls {
        Stalls {
            evict_ns: self.evict_ns - earlier.evict_ns,
            compact_ns: self.compact_ns - earlier.compact_ns,
            fetch_ns: self.fetch_ns - earlier.fetch_ns,
            migrate_ns: self.migrate_ns - earlier.migrate_ns,
            launch_ns: self.launch_ns - earlier.launch_ns,
            in_flight_ns: self.in_flight_ns - earlier.in_flight_ns,
            pack_ns: self.pack_ns - earlier.pack_ns,
            stages: self.stages - earlier.stages,
            in_flight_waits: self.in_flight_waits - earlier.in_flight_waits,
        }
    }
}

#[derive(Default)]
pub(crate) struct StallCounters {
    evict_ns: AtomicU64,
    compact_ns: AtomicU64,
    fetch_ns: AtomicU64,
    migrate_ns: AtomicU64,
    launch_ns: AtomicU64,
    in_flight_ns: AtomicU64,
    pack_ns: AtomicU64,
    stages: AtomicU64,
    in_flight_waits: AtomicU64,
}

fn add(a: &AtomicU64, d: Duration) {
    a.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

impl StallCounters {
    /// A stage of `kind` carried out while its caller waited, for `d`.
    pub(crate) fn stage(&self, kind: StageKind, d: Duration) {
        let which = match kind {
            StageKind::Evict => &self.evict_ns,
            StageKind::Compact => &self.compact_ns,
            StageKind::Fetch | StageKind::Prefetch | StageKind::WriteBack => &self.fetch_ns,
            StageKind::Migrate => &self.migrate_ns,
        };
        add(which, d);
        self.stages.fetch_add(1, Ordering::Relaxed);
    }

    /// Stages left in flight, started in `d`.
    pub(crate) fn launch(&self, d: Duration) {
        add(&self.launch_ns, d);
    }

    /// Packing pages for the compressed tier (and making room there), for `d`.
    pub(crate) fn packing(&self, d: Duration) {
        add(&self.pack_ns, d);
    }

    /// A wait of `d` for stages in flight.
    pub(crate) fn in_flight(&self, d: Duration) {
        add(&self.in_flight_ns, d);
        self.in_flight_waits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stalls {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stalls {
            evict_ns: l(&self.evict_ns),
            compact_ns: l(&self.compact_ns),
            fetch_ns: l(&self.fetch_ns),
            migrate_ns: l(&self.migrate_ns),
            launch_ns: l(&self.launch_ns),
            in_flight_ns: l(&self.in_flight_ns),
            pack_ns: l(&self.pack_ns),
            stages: l(&self.stages),
            in_flight_waits: l(&self.in_flight_waits),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_counted_by_what_they_waited_for() {
        let c = StallCounters::default();
        c.stage(StageKind::Evict, Duration::from_micros(3));
        c.stage(StageKind::Compact, Duration::from_micros(5));
        c.stage(StageKind::Fetch, Duration::from_micros(7));
        let before = c.snapshot();
        c.in_flight(Duration::from_micros(11));
        c.launch(Duration::from_micros(13));
        let s = c.snapshot();
        assert_eq!((s.evict_ns, s.compact_ns, s.fetch_ns, s.stages), (3_000, 5_000, 7_000, 3));
        let d = s.since(&before);
        assert_eq!((d.in_flight_ns, d.in_flight_waits, d.launch_ns, d.stages, d.evict_ns), (11_000, 1, 13_000, 0, 0));
    }
}
