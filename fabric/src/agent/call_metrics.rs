//! The latencies an agent observes as calls happen, as Prometheus histograms: its local clients' requests and
//! its calls to peers (exposed at `/metrics` beside the figures of [`super::metrics`]).

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, Registry};

/// Latency buckets, in seconds: 5 us to 10 s (a local acquire of pages in place takes microseconds, a remote
/// call of megabytes milliseconds).
const BUCKETS: &[f64] = &[
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0,
];

/// The latencies an agent observes as calls happen.
pub(crate) struct CallMetrics {
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
        CallMetrics { registry, local, peer }
    }

    /// A local client's request `call` answered after `took`.
    pub(crate) fn local_call(&self, call: &str, took: Duration) {
        self.local.with_label_values(&[call]).observe(took.as_secs_f64());
    }

    /// A call `call` to a peer done (answered or failed) after `took`.
    pub(crate) fn peer_call(&self, call: &str, took: Duration) {
        self.peer.with_label_values(&[call]).observe(took.as_secs_f64());
    }

    /// The histograms as they stand.
    pub(crate) fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }
}
