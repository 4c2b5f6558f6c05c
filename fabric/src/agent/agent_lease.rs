//! What a lease through the agent is ([`AgentLease`]): a lease of this node's fabric, or a lease on another
//! node's pages (a copy here, and the home's grant, let go at the home when it is dropped unreleased); and the
//! guards an acquire of a peer's pages holds while it runs (the request, until the lease holds its grant; the
//! copy, until the pages are in). The acquires that make remote leases are `super::remote_lease` (QUIC) and
//! `super::channel_lease` (an NCCL channel).

use super::replicas::ReplicaKey;
use super::shared::{in_place, Agent};
use crate::directory::{Mode, RegionHandle as Region};
use crate::fabric::{Lease, LeasePtr};
use crate::proto::message::Message;

/// A lease from `Agent::acquire`: device pointers on this node, whatever the region's home.
///
/// For a region of another node, the home leases its copy (host memory, or a lossy region's GPU) for the
/// holder (so its other users see the usual lease conflicts) and sends the pages; they land in a private region on this node's device, leased
/// here. `Agent::release` sends a `Write` lease's bytes back before the home lets go. Dropping a lease
/// instead of releasing it lets go at the home too, but a `Write` lease's changes are then lost.
pub struct AgentLease {
    pub(crate) kind: LeaseKind,
}

pub(crate) enum LeaseKind {
    Local(Lease),
    Remote(RemoteLease),
}

pub(crate) struct RemoteLease {
    pub(super) agent: Agent,
    pub(super) home: u16,
    /// The lane the lease was granted over: it is released over the same connection (the home ends a lease
    /// when the connection it came over closes).
    pub(super) lane: usize,
    pub(super) id: u64,
    pub(super) mode: Mode,
    /// Where the copy goes back in the replica cache, and the home's version of the range.
    pub(super) key: ReplicaKey,
    pub(super) version: u64,
    pub(super) pages: u64,
    /// The private region on this node that holds the pages, and its lease.
    pub(super) copy: Region,
    pub(super) local: Option<Lease>,
    pub(super) released: bool,
}

impl AgentLease {
    fn lease(&self) -> Option<&Lease> {
        match &self.kind {
            LeaseKind::Local(l) => Some(l),
            LeaseKind::Remote(r) => r.local.as_ref(),
        }
    }

    /// Device pointers to the leased pages on this node.
    pub fn ptr(&self) -> Option<&LeasePtr> {
        self.lease().map(Lease::ptr)
    }

    /// The local lease (its device, frames and pointers).
    pub fn local(&self) -> Option<&Lease> {
        self.lease()
    }

    /// The node the region lives at.
    pub fn home(&self, agent: &Agent) -> u16 {
        match &self.kind {
            LeaseKind::Local(_) => agent.node(),
            LeaseKind::Remote(r) => r.home,
        }
    }
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Not released: let go at the home (in the background: drop cannot wait) and free the copy here.
        drop(self.local.take());
        let (agent, home, lane, id, copy) = (self.agent.clone(), self.home, self.lane, self.id, self.copy);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let release = async {
                    agent.call_on(home, &agent.hold_lane(home, lane)?, &Message::Release { lease: id }, &[]).await
                };
                if let Err(e) = release.await {
                    tracing::warn!(home, lease = id, error = %e, "releasing a dropped remote lease failed");
                }
                let _ = in_place(|| agent.free_private(&copy));
            });
        }
    }
}

/// An acquire's request to the home until its lease is made: a caller that drops the acquire before (a timeout
/// around it, a cancelled task) tells the home it abandoned the request (`Message::Abandon`), so that whatever
/// the home granted it, or is about to, ends now rather than when the connection closes (it would keep the
/// home's writers out until then).
pub(super) struct RequestInFlight<'a> {
    agent: &'a Agent,
    home: u16,
    lane: usize,
    request: u64,
    claimed: bool,
}

impl<'a> RequestInFlight<'a> {
    /// Request `request` of `home`, over `lane`, in flight.
    pub(super) fn new(agent: &'a Agent, home: u16, lane: usize, request: u64) -> Self {
        RequestInFlight { agent, home, lane, request, claimed: false }
    }

    /// The lease holds the grant now (or the caller released it itself).
    pub(super) fn claim(mut self) {
        self.claimed = true;
    }
}

impl Drop for RequestInFlight<'_> {
    fn drop(&mut self) {
        if self.claimed {
            return;
        }
        let (agent, home, lane, request) = (self.agent.clone(), self.home, self.lane, self.request);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let abandon = async {
                    agent.call_on(home, &agent.hold_lane(home, lane)?, &Message::Abandon { request }, &[]).await
                };
                if let Err(e) = abandon.await {
                    tracing::debug!(home, request, error = %e, "telling the home an acquire was abandoned");
                }
            });
        }
    }
}

/// This node's copy of a peer's pages while an acquire fills it: freed when dropped before [`CopyInFill::keep`].
pub(super) struct CopyInFill<'a> {
    agent: &'a Agent,
    copy: Region,
    kept: bool,
}

impl<'a> CopyInFill<'a> {
    /// `copy`, being filled.
    pub(super) fn new(agent: &'a Agent, copy: Region) -> Self {
        CopyInFill { agent, copy, kept: false }
    }

    /// The copy, now the lease's to free.
    pub(super) fn keep(mut self) -> Region {
        self.kept = true;
        self.copy
    }
}

impl Drop for CopyInFill<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let _ = self.agent.free_private(&self.copy);
        }
    }
}

impl RemoteLease {
    /// A lease on `home`'s pages granted as `id` over `lane`: the range's replica key, version and pages, and the
    /// copy here that holds them, leased as `local`.
    pub(super) fn granted(
        agent: &Agent,
        (home, lane, id, mode): (u16, usize, u64, Mode),
        (key, version, pages): (ReplicaKey, u64, u64),
        copy: Region,
        local: Lease,
    ) -> AgentLease {
        let remote = RemoteLease {
            agent: agent.clone(),
            home,
            lane,
            id,
            mode,
            key,
            version,
            pages,
            copy,
            local: Some(local),
            released: false,
        };
        AgentLease { kind: LeaseKind::Remote(remote) }
    }
}
