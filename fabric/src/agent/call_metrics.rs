//! The latencies an agent observes as calls happen, as Prometheus histograms: its local clients' requests and
//! its calls to peers (exposed at `/metrics` beside the figures of [`super::metrics`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use prometheus::{HistogramOpts, HistogramVec, Registry};

/// Latency buckets, in seconds: 5 us to 10 s (a local acquire of pages in place takes microseconds, a remote
/// call of megabytes milliseconds).
const BUCKETS: &[f64] = &[
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];

/// The latencies an agent observes as calls happen, while its metrics are served.
pub(crate) struct CallMetrics {
    /// Whether calls are timed: only while a metrics endpoint serves them (`Agent::serve_metrics`), so that an
    /// agent without `[metrics]` pays one load per call and nothing more.
    on: AtomicBool,
    registry: Registry,
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
        CallMetrics { on: AtomicBool::new(false), registry, local, peer }
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
