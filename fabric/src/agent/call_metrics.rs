//! The latencies an agent observes as calls happen, as Prometheus histograms: its local clients' requests and
//! its calls to peers (exposed at `/metrics` beside the figures of [`super::metrics`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use prometheus::{HistogramOpts, HistogramVec, Registry};

/// Latency buckets, in seconds: 5 us to 10 s (a local acquire of pages in place takes microseconds, a remote
/// call of megabytes milliseconds).
const BUCKETS: &[f64] = &[
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];

/// A link's four counters (bytes sent, bytes received, packets lost, congestion events) at the last scrape, and
/// their running totals.
type LinkCounts = ([u64; 4], [u64; 4]);

/// The latencies an agent observes as calls happen, while its metrics are served.
pub(crate) struct CallMetrics {
    /// Whether calls are timed: only while a metrics endpoint serves them (`Agent::serve_metrics`), so that an
    /// agent without `[metrics]` pays one load per call and nothing more.
    on: AtomicBool,
    registry: Registry,
    /// Per peer, the link's counters at the last scrape and their running totals (see [`CallMetrics::link_totals`]).
    links: Mutex<HashMap<u16, LinkCounts>>,
    /// Requests of local clients (its Unix socket), by call, from the request read to the answer sent.
    local: HistogramVec,
    /// Calls to peers, by call, from the stream opened to the answer read (failures included).
    peer: HistogramVec,
}

impl CallMetrics {
    pub(crate) fn new() -> Self {
        let histogram = |name: &str, help: &str| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), &["call"])
                .expect("a valid histogram")
        };
        let local = histogram(
            "vfabric_local_call_seconds",
            "Requests of the node's local clients, from the request read to the answer sent (reads excluded).",
        );
        let peer = histogram("vfabric_peer_call_seconds", "Calls this agent made to other nodes, until answered.");
        let registry = Registry::new();
        for h in [&local, &peer] {
            // Distinct names, registered once on a fresh registry: cannot fail.
            let _ = registry.register(Box::new(h.clone()));
        }
        CallMetrics { on: AtomicBool::new(false), registry, links: Mutex::new(HashMap::new()), local, peer }
    }

    /// Times calls from now on (`true`) or no longer.
    pub(crate) fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// When a call starts: the time, while calls are timed.
    pub(crate) fn start(&self) -> Option<Instant> {
        self.on.load(Ordering::Relaxed).then(Instant::now)
    }

    /// A local client's request `call`, started at `started` ([`CallMetrics::start`]), answered now.
    pub(crate) fn local_call(&self, call: &str, started: Option<Instant>) {
        if let Some(t) = started {
            self.local.with_label_values(&[call]).observe(t.elapsed().as_secs_f64());
        }
    }

    /// A call `call` to a peer, started at `started`, done now (answered or failed).
    pub(crate) fn peer_call(&self, call: &str, started: Option<Instant>) {
        if let Some(t) = started {
            self.peer.with_label_values(&[call]).observe(t.elapsed().as_secs_f64());
        }
    }

    /// Running totals of a link's counters (`raw`: as the peer's open lanes count them now), for counters that
    /// only rise: a lane's counts start again from 0 when it reconnects, so what a scrape adds is the rise since
    /// the last scrape, or, where a count fell, the new count (what moved between that scrape and the reconnect
    /// is not counted).
    pub(crate) fn link_totals(&self, node: u16, raw: [u64; 4]) -> [u64; 4] {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let (last, total) = links.entry(node).or_insert(([0; 4], [0; 4]));
        for i in 0..4 {
            total[i] += if raw[i] >= last[i] { raw[i] - last[i] } else { raw[i] };
        }
        *last = raw;
        *total
    }

    /// The histograms as they stand.
    pub(crate) fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(m: &CallMetrics) -> u64 {
        m.gather().iter().flat_map(|f| f.get_metric()).map(|c| c.get_histogram().get_sample_count()).sum()
    }

    #[test]
    fn link_totals_only_rise_across_reconnects() {
        let m = CallMetrics::new();
        assert_eq!(m.link_totals(1, [100, 50, 0, 0]), [100, 50, 0, 0]);
        assert_eq!(m.link_totals(1, [300, 60, 1, 0]), [300, 60, 1, 0]);
        // A lane reconnected: its counts start again; the totals go on from where they were.
        assert_eq!(m.link_totals(1, [40, 10, 0, 0]), [340, 70, 1, 0]);
        assert_eq!(m.link_totals(1, [90, 10, 0, 2]), [390, 70, 1, 2]);
        assert_eq!(m.link_totals(2, [5, 5, 5, 5]), [5, 5, 5, 5], "each peer on its own");
    }

    #[test]
    fn calls_are_timed_only_while_metrics_are_served() {
        let m = CallMetrics::new();
        m.local_call("acquire", m.start());
        m.peer_call("write", m.start());
        assert_eq!(count(&m), 0, "off by default: an agent without [metrics] times nothing");
        m.set_on(true);
        m.local_call("acquire", m.start());
        m.peer_call("write", m.start());
        assert_eq!(count(&m), 2);
        m.set_on(false);
        m.local_call("acquire", m.start());
        assert_eq!(count(&m), 2);
    }
}
