//! Which way a move of pages goes, from what an agent knows of both ends: the node's own mover when the pages
//! are this node's; NCCL between two nodes' GPUs when both have GPUs and NCCL, the GPUs differ and a
//! communicator joins them; QUIC through host memory otherwise. A local client of this node takes its own leg
//! through mapped memory (`local/`). Pure: the agent gathers the facts, [`choose_route`] decides and says why,
//! and the agent counts each move by the route it took ([`RouteCounts`], shown by `vfabric status`).

use std::collections::{HashMap, HashSet};
use std::fmt;

/// A way pages move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageRoute {
    /// The node's own mover (copy engines or kernels, NVLink between its GPUs): the pages are this node's.
    Mover,
    /// Memory mapped into another process of this node (a local client's leases).
    Mapped,
    /// NCCL send and receive between two nodes' GPUs.
    Nccl,
    /// QUIC streams, through host memory at both ends.
    Quic,
}

impl PageRoute {
    /// Its name, as status and the logs print it.
    pub fn name(self) -> &'static str {
        match self {
            PageRoute::Mover => "mover",
            PageRoute::Mapped => "mapped",
            PageRoute::Nccl => "nccl",
            PageRoute::Quic => "quic",
        }
    }
}

impl fmt::Display for PageRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an agent knows of a move's two ends.
#[derive(Debug, Clone, Default)]
pub struct RouteFacts {
    /// The pages are this node's (the region's home is this node).
    pub home_is_me: bool,
    /// The peer's node id.
    pub peer: u16,
    /// This node's end of the move is one of its GPUs.
    pub gpu_here: bool,
    /// The peer's GPUs as the configuration lists them (`Some(empty)`: none; `None`: all of its machine's,
    /// unknown from here).
    pub peer_gpus: Option<Vec<u16>>,
    /// This node's GPUs as the configuration lists them (`None`: all of its machine's).
    pub my_gpus: Option<Vec<u16>>,
    /// The peer listens on one of this machine's addresses (a loopback or the same IP as this node).
    pub same_machine: bool,
    /// NCCL loads on this node.
    pub nccl_here: bool,
    /// This node's configuration keeps leases off NCCL (`network.nccl = false`).
    pub nccl_off: bool,
    /// NCCL_HOSTID names this node's host for NCCL, so two nodes sharing a GPU may still join one communicator
    /// (each as a host of its own, through NCCL's network transport).
    pub host_named: bool,
    /// Why the last join of a communicator with the peer failed (while it is not tried again).
    pub channel_refused: Option<String>,
    /// A communicator joins this node and the peer.
    pub communicator: bool,
}

/// A route and why it was taken (what status and the logs print beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteChoice {
    /// The route.
    pub route: PageRoute,
    /// Why: for QUIC, why no faster route was open.
    pub why: String,
}

/// The route a move with `f` takes (see the module's docs), and why.
pub fn choose_route(f: &RouteFacts) -> RouteChoice {
    let pick = |route, why: String| RouteChoice { route, why };
    if f.home_is_me {
        return pick(PageRoute::Mover, "the pages are this node's".into());
    }
    let peer = f.peer;
    let quic = |why: String| pick(PageRoute::Quic, why);
    if !f.gpu_here {
        return quic("this end is host memory".into());
    }
    if matches!(&f.peer_gpus, Some(g) if g.is_empty()) {
        return quic(format!("node {peer} has no GPU"));
    }
    if !f.nccl_here {
        return quic("NCCL is not available on this node".into());
    }
    if f.nccl_off {
        return quic("network.nccl is off on this node".into());
    }
    // NCCL refuses two ranks of a communicator on one device.
    let shared_gpu = match (&f.my_gpus, &f.peer_gpus) {
        (Some(mine), Some(theirs)) => mine.iter().any(|g| theirs.contains(g)),
        _ => true,
    };
    if f.same_machine && shared_gpu && !f.host_named {
        return quic(format!(
            "node {peer} may use the same GPU on this machine, and NCCL refuses two ranks on one (unless each \
             names its host apart: NCCL_HOSTID)"
        ));
    }
    if let Some(why) = &f.channel_refused {
        return quic(why.clone());
    }
    if !f.communicator {
        return quic(format!("no NCCL communicator joins this node and node {peer}"));
    }
    pick(PageRoute::Nccl, format!("both ends are GPUs joined by a communicator with node {peer}"))
}

/// Moves and bytes per peer and route, with the reason of each route's latest choice.
#[derive(Debug, Default)]
pub struct RouteCounts {
    counts: HashMap<(u16, PageRoute), RouteCount>,
    /// Every reason each peer's route was taken for: a lease's pages coming to a GPU and its release going home
    /// from host memory give two, and alternating between them is no news.
    seen: HashSet<(u16, PageRoute, String)>,
}

/// One peer's moves by one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCount {
    /// The route.
    pub route: PageRoute,
    /// Why it was taken, the last time.
    pub why: String,
    /// Moves that took it.
    pub moves: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl RouteCounts {
    /// Counts a move of `bytes` to or from `peer` by `choice`; whether it is the first by that route to that peer
    /// for that reason (worth a line in the log).
    pub fn count(&mut self, peer: u16, choice: &RouteChoice, bytes: u64) -> bool {
        let c = self.counts.entry((peer, choice.route)).or_insert_with(|| RouteCount {
            route: choice.route,
            why: String::new(),
            moves: 0,
            bytes: 0,
        });
        c.moves += 1;
        c.bytes += bytes;
        if c.why != choice.why {
            c.why.clone_from(&choice.why);
        }
        self.seen.insert((peer, choice.route, choice.why.clone()))
    }

    /// `peer`'s moves by each route, in route order.
    pub fn of(&self, peer: u16) -> Vec<RouteCount> {
        let mut v: Vec<RouteCount> =
            self.counts.iter().filter(|((p, _), _)| *p == peer).map(|(_, c)| c.clone()).collect();
        v.sort_by_key(|c| c.route);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Facts under which NCCL is the route: two GPUs on two machines, a communicator between them.
    fn nccl_ready() -> RouteFacts {
        RouteFacts {
            home_is_me: false,
            peer: 1,
            gpu_here: true,
            peer_gpus: Some(vec![0]),
            my_gpus: Some(vec![0]),
            same_machine: false,
            nccl_here: true,
            nccl_off: false,
            host_named: false,
            channel_refused: None,
            communicator: true,
        }
    }

    #[test]
    fn each_fact_decides_the_route_and_says_why() {
        assert_eq!(choose_route(&nccl_ready()).route, PageRoute::Nccl);
        let mover = choose_route(&RouteFacts { home_is_me: true, ..nccl_ready() });
        assert_eq!(mover.route, PageRoute::Mover);
        // Each missing fact falls back to QUIC, naming what was missing.
        let refused = Some("joining an NCCL channel with node 1 failed: timed out".to_string());
        let cases: [(RouteFacts, &str); 8] = [
            (RouteFacts { nccl_off: true, ..nccl_ready() }, "network.nccl is off"),
            (RouteFacts { gpu_here: false, ..nccl_ready() }, "host memory"),
            (RouteFacts { peer_gpus: Some(vec![]), ..nccl_ready() }, "node 1 has no GPU"),
            (RouteFacts { nccl_here: false, ..nccl_ready() }, "NCCL is not available on this node"),
            (RouteFacts { same_machine: true, ..nccl_ready() }, "same GPU"),
            (RouteFacts { same_machine: true, peer_gpus: None, my_gpus: Some(vec![1]), ..nccl_ready() }, "same GPU"),
            (RouteFacts { communicator: false, ..nccl_ready() }, "no NCCL communicator"),
            (RouteFacts { channel_refused: refused, ..nccl_ready() }, "failed: timed out"),
        ];
        for (facts, why) in cases {
            let c = choose_route(&facts);
            assert_eq!(c.route, PageRoute::Quic, "{facts:?}");
            assert!(c.why.contains(why), "{facts:?}: {}", c.why);
        }
        // Two GPUs of one machine, each node its own: NCCL.
        let two = RouteFacts { same_machine: true, my_gpus: Some(vec![0]), peer_gpus: Some(vec![1]), ..nccl_ready() };
        assert_eq!(choose_route(&two).route, PageRoute::Nccl);
        // Two nodes on one GPU, each naming its host apart (NCCL_HOSTID): NCCL too.
        let named = RouteFacts { same_machine: true, host_named: true, ..nccl_ready() };
        assert_eq!(choose_route(&named).route, PageRoute::Nccl);
    }

    #[test]
    fn moves_are_counted_per_peer_and_route() {
        let mut c = RouteCounts::default();
        let quic = choose_route(&RouteFacts { peer: 1, nccl_here: false, gpu_here: true, ..Default::default() });
        assert!(c.count(1, &quic, 100), "the first move by a route is news");
        assert!(!c.count(1, &quic, 50), "the same route for the same reason is not");
        let host = choose_route(&RouteFacts { peer: 1, ..Default::default() });
        assert!(c.count(1, &host, 10), "a new reason is news");
        assert!(!c.count(1, &quic, 1) && !c.count(1, &host, 1), "reasons seen before are not");
        assert_eq!(c.of(1)[0].why, host.why, "the last reason is the one shown");
        c.count(1, &host, 0);
        assert!(c.count(2, &quic, 1));
        let n1 = c.of(1);
        assert_eq!(n1.len(), 1);
        assert_eq!((n1[0].route, n1[0].moves, n1[0].bytes), (PageRoute::Quic, 6, 162));
        assert_eq!(n1[0].why, host.why);
        assert_eq!(c.of(2)[0].moves, 1);
        assert!(c.of(3).is_empty());
    }
}
