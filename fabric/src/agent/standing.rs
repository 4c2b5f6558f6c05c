//! This node's membership in etcd, as state: its registration (client and lease) and its standing (when its
//! lease was last renewed). `super::membership` does the work.

use std::time::{Duration, Instant};

use etcd_client::Client;

/// This node's registration: its client and lease (revoked when the agent stops).
pub(crate) struct Registration {
    /// The client (cheap to clone).
    pub(crate) client: Client,
    /// The lease its key lives by.
    pub(crate) lease: i64,
}

/// This node's standing in etcd: when its lease was last renewed, and for how long a renewal holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Standing {
    /// When the last renewal that etcd confirmed was sent.
    pub(crate) renewed: Instant,
    /// The lease's time to live.
    pub(crate) ttl: Duration,
}

impl Standing {
    /// Whether this node may still count itself a member: within half of its lease's time to live of its last
    /// renewal (etcd lets the lease go at the whole of it, and the others then count it out).
    pub(crate) fn current(&self) -> bool {
        self.renewed.elapsed() < self.ttl / 2
    }
}
