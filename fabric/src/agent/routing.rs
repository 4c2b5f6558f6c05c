//! The route of each move of pages to or from a peer: the facts gathered from this agent's state (its GPUs and
//! its peers' as the configuration lists them, where they listen, whether NCCL loads here), the choice
//! ([`super::page_route::choose_route`]), and the move counted by it, with a line in the log the first time a
//! peer's route is taken for a reason.

use vfabric_transport::Location;

use super::page_route::{choose_route, RouteChoice, RouteFacts};
use super::shared::Agent;

impl Agent {
    /// The route a move of pages between this node's `device` and `peer` (the home of the pages, or where they
    /// go) takes now.
    pub(crate) async fn route_to(&self, peer: u16, device: Location) -> RouteChoice {
        let here = self.gpus_and_ip(self.node()).await;
        let there = self.gpus_and_ip(peer).await;
        let same_machine = match (here.1, there.1) {
            (Some(mine), Some(theirs)) => theirs.is_loopback() || theirs == mine,
            _ => false,
        };
        choose_route(&RouteFacts {
            home_is_me: self.is_me(peer),
            peer,
            gpu_here: matches!(device, Location::Gpu(_)),
            peer_gpus: there.0,
            my_gpus: here.0,
            same_machine,
            nccl_here: self.shared.fabric.nccl_available(),
            // No communicator joins two agents yet: every move between GPUs of two nodes falls back to QUIC.
            communicator: false,
        })
    }

    /// `node`'s GPUs as the configuration lists them, and the address it listens on.
    async fn gpus_and_ip(&self, node: u16) -> (Option<Vec<u16>>, Option<std::net::IpAddr>) {
        match self.peer(node) {
            Ok(p) => {
                let p = p.lock().await;
                (p.gpus.clone(), p.addr.map(|a| a.ip()))
            }
            Err(_) => (None, None),
        }
    }

    /// Counts a move of `bytes` to or from `peer` by `choice`; logs the route the first time it is taken to a
    /// peer for a reason.
    pub(crate) fn count_route(&self, peer: u16, choice: &RouteChoice, bytes: u64) {
        let news = self.shared.routes.lock().unwrap_or_else(|p| p.into_inner()).count(peer, choice, bytes);
        if news {
            tracing::info!(peer, route = %choice.route, why = %choice.why, "pages move by this route");
        } else {
            tracing::debug!(peer, route = %choice.route, bytes, "pages moved");
        }
    }
}
