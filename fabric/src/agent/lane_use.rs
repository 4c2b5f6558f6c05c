//! Which lane a call takes: bulk transfers keep off the latency lane, and a call takes the least busy lane.
//!
//! A call holds its lane ([`LaneUse`]) until it ends, so the lanes' loads count the calls in flight on each. A
//! call takes the least busy lane it may take, the lowest of those as little busy: calls one after another all
//! take the same lane, and only calls at the same time spread over the lanes. Taking the lanes in turn instead
//! cost every call the wake-up of a thread (and a core) that had been idle since the round before (measured in
//! docs/benchmarks.md).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::NetworkSection;
use crate::error::NetworkError;

/// Calls moving this many bytes of pages or more are bulk transfers: they keep off the latency lane
/// ([`lanes_for`]), and are made and served off a lane's thread (`super::lanes`), whose one core also reads
/// and decrypts every packet of its lane. Smaller calls are bound by latency.
pub(crate) const BULK: u64 = 256 << 10;

/// The lanes a call that moves `bytes` of pages may take: every lane, but the latency lane (lane 0, when the
/// cluster has one: `network.latency_lane`) only for calls under [`BULK`].
pub(crate) fn lanes_for(net: &NetworkSection, bytes: u64) -> Range<usize> {
    let all = usize::from(net.connections());
    match bytes >= BULK && net.latency_lane {
        true => 1..all,
        false => 0..all,
    }
}

/// The bytes of the whole pages of `page_size` that `len` bytes from `offset` touch: what an acquire moves.
pub(crate) fn pages_of(page_size: u64, offset: u64, len: u64) -> u64 {
    let ps = page_size.max(1);
    let first = offset / ps;
    let end = offset.saturating_add(len).div_ceil(ps);
    end.saturating_sub(first).saturating_mul(ps)
}

/// A call's hold on a lane to a node: counted in that lane's load until dropped.
pub(crate) struct LaneUse {
    /// The lane.
    pub(crate) lane: usize,
    load: Arc<AtomicUsize>,
}

impl LaneUse {
    /// Holds `lane` whatever its load (a call that must take that lane).
    fn enter(lane: usize, load: &Arc<AtomicUsize>) -> LaneUse {
        load.fetch_add(1, Ordering::AcqRel);
        LaneUse { lane, load: Arc::clone(load) }
    }

    /// Holds `lane` if its load is still `seen`.
    fn enter_if(lane: usize, load: &Arc<AtomicUsize>, seen: usize) -> Option<LaneUse> {
        load.compare_exchange(seen, seen + 1, Ordering::AcqRel, Ordering::Acquire).ok()?;
        Some(LaneUse { lane, load: Arc::clone(load) })
    }
}

impl Drop for LaneUse {
    fn drop(&mut self) {
        self.load.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One transfer counted in flight to a peer while it lives.
pub(crate) struct InFlight<'a> {
    counter: &'a AtomicUsize,
    /// Transfers in flight when this one entered, itself included.
    pub(crate) count: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The loads of every lane to every node, and the long transfers in flight to each.
pub(crate) struct LaneLoads {
    net: NetworkSection,
    /// Calls in flight on each lane to each node (by node, then lane).
    lanes: Vec<Vec<Arc<AtomicUsize>>>,
    /// Reads and writes in flight to each node: a long call takes the lanes the others leave.
    transfers: Vec<AtomicUsize>,
}

impl LaneLoads {
    /// Idle lanes to `nodes` nodes, as `net` lays them out.
    pub(crate) fn new(net: &NetworkSection, nodes: usize) -> LaneLoads {
        let lanes = usize::from(net.connections());
        LaneLoads {
            net: net.clone(),
            lanes: (0..nodes).map(|_| (0..lanes).map(|_| Arc::new(AtomicUsize::new(0))).collect()).collect(),
            transfers: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    fn of(&self, node: u16) -> Result<&[Arc<AtomicUsize>], NetworkError> {
        let lanes = usize::from(self.net.connections());
        self.lanes.get(usize::from(node)).map(Vec::as_slice).ok_or(NetworkError::NoSuchLane { node, lane: 0, lanes })
    }

    /// The least busy lane to `node` (the lowest of those as little busy) for a call that moves `bytes` of
    /// pages, held for the call until the guard is dropped.
    pub(crate) fn take(&self, node: u16, bytes: u64) -> Result<LaneUse, NetworkError> {
        self.take_n(node, 1, bytes)?.pop().ok_or(NetworkError::NoLane { node, bytes })
    }

    /// The `n` least busy lanes to `node` (at most each lane that [`lanes_for`] gives once) for calls that
    /// move `bytes` of pages each, each held until its guard is dropped.
    pub(crate) fn take_n(&self, node: u16, n: usize, bytes: u64) -> Result<Vec<LaneUse>, NetworkError> {
        let loads = self.of(node)?;
        let usable = lanes_for(&self.net, bytes);
        if usable.is_empty() || usable.end > loads.len() {
            return Err(NetworkError::NoLane { node, bytes });
        }
        let mut taken: Vec<LaneUse> = Vec::with_capacity(n.min(usable.len()));
        while taken.len() < n.min(usable.len()) {
            let free = usable.clone().filter(|l| taken.iter().all(|t| t.lane != *l));
            let Some((lane, load)) = free.map(|l| (l, loads[l].load(Ordering::Acquire))).min_by_key(|&(l, v)| (v, l))
            else {
                break;
            };
            // Taken only if no other call took it meanwhile (else look again): calls that start together, such
            // as the streams of one connection that end together, then spread instead of all taking one lane.
            if let Some(held) = LaneUse::enter_if(lane, &loads[lane], load) {
                taken.push(held);
            }
        }
        Ok(taken)
    }

    /// Lane `lane` to `node`, held whatever its load (a lease's release goes over the lane it was granted on).
    pub(crate) fn hold(&self, node: u16, lane: usize) -> Result<LaneUse, NetworkError> {
        let loads = self.of(node)?;
        let load = loads.get(lane).ok_or(NetworkError::NoSuchLane { node, lane, lanes: loads.len() })?;
        Ok(LaneUse::enter(lane, load))
    }

    /// How a transfer of `len` bytes to or from peer `node` is split: the lanes its parts take (the least busy
    /// of those [`lanes_for`] gives), each held until its part's call ends, the bytes per part, and the count of
    /// transfers in flight to the peer, this one included, for as long as the transfer holds it. Each lane's
    /// connection is driven by its own tasks, on a core at a time, so a call alone uses several cores at once;
    /// with others in flight it takes its share of the lanes (one when there are as many transfers as lanes:
    /// more, smaller calls would only add per-call work), and no part is under `min_part` bytes.
    pub(crate) fn stripes(
        &self,
        node: u16,
        len: usize,
        min_part: usize,
    ) -> Result<(Vec<LaneUse>, usize, InFlight<'_>), NetworkError> {
        self.of(node)?;
        let lanes = lanes_for(&self.net, len as u64).len();
        let counter = &self.transfers[usize::from(node)];
        let in_flight = InFlight { counter, count: counter.fetch_add(1, Ordering::AcqRel) + 1 };
        let parts = (lanes / in_flight.count).min(len / min_part).max(1);
        let lanes = self.take_n(node, parts, len as u64)?;
        let part = len.div_ceil(lanes.len().max(1)).max(1);
        Ok((lanes, part, in_flight))
    }
}
