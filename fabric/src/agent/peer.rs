//! A peer as this agent sees it: where its lanes listen, its connections, and when it was last heard from.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::backups::may_take_over;

/// A peer of this node.
pub(crate) struct Peer {
    /// Its name (its certificate's).
    pub(crate) name: String,
    /// Where its lane 0 listens (lane `i` listens on the port `i` above).
    pub(crate) addr: Option<SocketAddr>,
    /// One connection per lane, dialled on first use.
    pub(crate) conns: Vec<Option<quinn::Connection>>,
    /// When it last answered or called.
    pub(crate) last_seen: Option<Instant>,
    /// Whether it is a member of the cluster now, as etcd says (`super::membership`); `None` without
    /// `[membership]`, where every listed node is one.
    pub(crate) member: Option<bool>,
    /// Whether it closed its connections because it shut down (and has not been heard from since).
    pub(crate) left: bool,
    /// The tenant it belongs to, as the configuration says (`[[node]] tenant`; its certificate says so too).
    pub(crate) tenant: Option<u32>,
    /// Its GPUs, as the configuration lists them (`[[node]] gpus`; `None`: all of its machine's, or a node that
    /// joined unlisted).
    pub(crate) gpus: Option<Vec<u16>>,
}

impl Peer {
    /// Where lane `lane` of this peer listens.
    pub(crate) fn lane_addr(&self, lane: usize) -> Option<SocketAddr> {
        let a = self.addr?;
        let port = a.port().checked_add(u16::try_from(lane).ok()?)?;
        Some(SocketAddr::new(a.ip(), port))
    }

    /// Its open connection on `lane`, if any.
    pub(crate) fn open(&self, lane: usize) -> Option<&quinn::Connection> {
        self.conns.get(lane)?.as_ref().filter(|c| c.close_reason().is_none())
    }

    /// Whether it answered within `dead_after` (or, never heard from, whether the agent started that recently:
    /// a peer gets the grace period after start).
    pub(crate) fn alive(&self, dead_after: Duration, started: Instant) -> bool {
        self.member != Some(false)
            && !self.left
            && !may_take_over(self.last_seen.unwrap_or(started).elapsed(), dead_after)
    }

    /// Why it is taken for dead (when [`Peer::alive`] says so).
    pub(crate) fn why_dead(&self, dead_after: Duration) -> String {
        match (self.member, self.left) {
            (Some(false), _) => "not a member of the cluster (etcd)".to_string(),
            (_, true) => "it shut down".to_string(),
            _ => format!("no heartbeat for {} ms", dead_after.as_millis()),
        }
    }
}
