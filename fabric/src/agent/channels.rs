//! The table of channels between this node's GPUs and peers' (NCCL communicators of two ranks), which carry
//! leases' pages GPU to GPU: the ones this node joined to reach a home (rank 0, made here, by peer and GPU; a
//! join that failed is remembered, with why, and tried again after [`RETRY_AFTER`]), and the ones peers joined
//! to reach this node (rank 1, by peer and the peer's name for it). A channel is used by one lease at a time
//! (its lock): NCCL pairs sends and receives in the order they are posted, so two leases interleaved on one
//! channel would swap pages. Joining is `super::channel_join`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vfabric_transport::PeerChannel;

/// One end of a channel, used by one lease at a time.
pub(crate) type SharedChannel = Arc<tokio::sync::Mutex<Box<dyn PeerChannel>>>;
/// What keeps joins to one peer from one GPU one at a time.
type JoinLock = Arc<tokio::sync::Mutex<()>>;
/// A channel's end held by one lease (movable to the thread that waits on it).
pub(crate) type OwnedChannel = tokio::sync::OwnedMutexGuard<Box<dyn PeerChannel>>;

/// How long after a failed join a new one is tried.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(60);
/// Channels one peer may hold into this node (a join past it replaces its oldest).
const PER_PEER: usize = 16;

/// The bytes a channel moves in `timeout` at the least: a channel whose peer is alive moves far more.
pub(crate) fn exchange_timeout(bytes: u64) -> Duration {
    Duration::from_secs(30) + Duration::from_secs(bytes / (100 << 20))
}

/// A channel a peer joined to reach this node: its end here, the GPU it is on, the peer's GPU at the other end,
/// and when it was joined.
struct Inbound {
    channel: SharedChannel,
    gpu: u16,
    their_gpu: u16,
    at: Instant,
}

/// A channel this node joined to reach a peer's GPUs, or why it could not.
enum Outbound {
    Ready { link: u64, channel: SharedChannel },
    Failed { why: String, at: Instant },
}

/// A channel to a home, ready for a lease: its link and its end here.
pub(crate) struct Link {
    pub(crate) link: u64,
    pub(crate) channel: SharedChannel,
}

/// This node's channels, both ways.
#[derive(Default)]
pub(crate) struct Channels {
    /// To homes, by (peer, this node's GPU).
    outbound: Mutex<HashMap<(u16, u16), Outbound>>,
    /// From peers, by (peer, the peer's link).
    inbound: Mutex<HashMap<(u16, u64), Inbound>>,
    /// One join at a time for each peer and GPU of this node (two at once would both wait for the peer).
    joining: Mutex<HashMap<(u16, u16), JoinLock>>,
    /// Peers whose join into this node is running: one at a time each (a join holds a thread for up to 30 s).
    joining_from: Mutex<std::collections::HashSet<u16>>,
}

/// A peer's join into this node, running: let go of its place when it ends.
pub(crate) struct JoinFrom<'a> {
    channels: &'a Channels,
    peer: u16,
}

impl Drop for JoinFrom<'_> {
    fn drop(&mut self) {
        lock(&self.channels.joining_from).remove(&self.peer);
    }
}

/// `m`'s guard, also after a panic while it was held.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Channels {
    /// The lock that keeps joins to `peer` from this node's `gpu` one at a time.
    pub(crate) fn join_lock(&self, peer: u16, gpu: u16) -> JoinLock {
        Arc::clone(lock(&self.joining).entry((peer, gpu)).or_default())
    }

    /// A place for `peer`'s join into this node, unless one of its joins is running already.
    pub(crate) fn join_from(&self, peer: u16) -> Option<JoinFrom<'_>> {
        lock(&self.joining_from).insert(peer).then_some(JoinFrom { channels: self, peer })
    }

    /// The channel to `peer` from `gpu` as known now: ready, failed lately (why), or `None` (join one).
    pub(crate) fn to(&self, peer: u16, gpu: u16) -> Option<Result<Link, String>> {
        match lock(&self.outbound).get(&(peer, gpu)) {
            Some(Outbound::Ready { link, channel }) => Some(Ok(Link { link: *link, channel: Arc::clone(channel) })),
            Some(Outbound::Failed { why, at }) if at.elapsed() < RETRY_AFTER => Some(Err(why.clone())),
            _ => None,
        }
    }

    /// Whether `link` is still the channel from `gpu` to `peer` (not retired since it was taken).
    pub(crate) fn current(&self, peer: u16, gpu: u16, link: u64) -> bool {
        matches!(lock(&self.outbound).get(&(peer, gpu)), Some(Outbound::Ready { link: l, .. }) if *l == link)
    }

    /// Whether a channel joins this node's `gpu` and `peer` now.
    pub(crate) fn ready(&self, peer: u16, gpu: u16) -> bool {
        matches!(lock(&self.outbound).get(&(peer, gpu)), Some(Outbound::Ready { .. }))
    }

    /// Why the last join with `peer` from `gpu` failed, while it is not tried again.
    pub(crate) fn refused(&self, peer: u16, gpu: u16) -> Option<String> {
        self.to(peer, gpu).and_then(Result::err)
    }

    /// Keeps a channel joined to `peer` from `gpu`.
    pub(crate) fn joined(&self, peer: u16, gpu: u16, link: &Link) {
        let ready = Outbound::Ready { link: link.link, channel: Arc::clone(&link.channel) };
        lock(&self.outbound).insert((peer, gpu), ready);
    }

    /// Remembers why a channel to `peer` from `gpu` could not be joined, or failed: the next lease goes by QUIC
    /// and a join is tried again after [`RETRY_AFTER`]. `link`: only if the channel there is still that one.
    pub(crate) fn failed(&self, peer: u16, gpu: u16, link: Option<u64>, why: String) {
        let mut out = lock(&self.outbound);
        let current = match out.get(&(peer, gpu)) {
            Some(Outbound::Ready { link: l, .. }) => Some(*l),
            _ => None,
        };
        if link.is_none() || link == current {
            out.insert((peer, gpu), Outbound::Failed { why, at: Instant::now() });
        }
    }

    /// Keeps a channel `peer` joined as `link` from its GPU `their_gpu`: it replaces the one that peer joined
    /// from that GPU before (the peer retired it), and the peer's oldest goes when it holds [`PER_PEER`].
    pub(crate) fn accept(&self, peer: u16, link: u64, their_gpu: u16, channel: Box<dyn PeerChannel>, gpu: u16) {
        let mut inbound = lock(&self.inbound);
        inbound.retain(|(p, _), c| !(*p == peer && c.their_gpu == their_gpu));
        let theirs: Vec<(u64, Instant)> =
            inbound.iter().filter(|((p, _), _)| *p == peer).map(|((_, l), c)| (*l, c.at)).collect();
        if theirs.len() >= PER_PEER {
            if let Some((oldest, _)) = theirs.iter().min_by_key(|(_, at)| *at) {
                inbound.remove(&(peer, *oldest));
            }
        }
        let channel = Arc::new(tokio::sync::Mutex::new(channel));
        inbound.insert((peer, link), Inbound { channel, gpu, their_gpu, at: Instant::now() });
    }

    /// The channel `peer` joined as `link`, and the GPU of this end.
    pub(crate) fn from(&self, peer: u16, link: u64) -> Option<(SharedChannel, u16)> {
        lock(&self.inbound).get(&(peer, link)).map(|c| (Arc::clone(&c.channel), c.gpu))
    }

    /// Forgets a channel `peer` joined, which failed (it was aborted).
    pub(crate) fn forget(&self, peer: u16, link: u64) {
        lock(&self.inbound).remove(&(peer, link));
    }
}
