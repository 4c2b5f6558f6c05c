//! The route of each move of pages to or from a peer: the facts gathered from this agent's state (its GPUs and
//! its peers' as the configuration lists them, where they listen, whether NCCL loads here), the choice
//! ([`super::page_route::choose_route`]), and the move counted by it, with a line in the log the first time a
//! peer's route is taken for a reason.

use vfabric_transport::Location;

use super::channels::Link;
use super::page_route::{choose_route, PageRoute, RouteChoice, RouteFacts};
use super::shared::Agent;

impl Agent {
    /// The route a move of pages between this node's `device` and `peer` (the home of the pages, or where they
    /// go) takes now.
    pub(crate) async fn route_to(&self, peer: u16, device: Location) -> RouteChoice {
        choose_route(&self.route_facts(peer, device).await)
    }

    /// The route of a lease's pages from `peer` to this node's `device`, joining a channel first when it is all
    /// that NCCL lacks (then the channel comes with the route).
    pub(crate) async fn route_for_lease(&self, peer: u16, device: Location) -> (RouteChoice, Option<Link>) {
        let mut facts = self.route_facts(peer, device).await;
        let (Location::Gpu(gpu), None) = (device, &facts.channel_refused) else {
            return (choose_route(&facts), None);
        };
        let wanted = choose_route(&RouteFacts { communicator: true, ..facts.clone() }).route == PageRoute::Nccl;
        if !wanted {
            return (choose_route(&facts), None);
        }
        match self.channel_to(peer, gpu).await {
            Ok(link) => {
                facts.communicator = true;
                (choose_route(&facts), Some(link))
            }
            Err(why) => {
                facts.channel_refused = Some(why);
                (choose_route(&facts), None)
            }
        }
    }

    /// What this agent knows of a move between its `device` and `peer`.
    async fn route_facts(&self, peer: u16, device: Location) -> RouteFacts {
        let here = self.gpus_and_ip(self.node()).await;
        let there = self.gpus_and_ip(peer).await;
        let same_machine = match (here.1, there.1) {
            (Some(mine), Some(theirs)) => theirs.is_loopback() || theirs == mine,
            _ => false,
        };
        let gpu = match device {
            Location::Gpu(g) => Some(g),
            _ => None,
        };
        RouteFacts {
            home_is_me: self.is_me(peer),
            peer,
            gpu_here: gpu.is_some(),
            peer_gpus: there.0,
            my_gpus: here.0,
            same_machine,
            nccl_here: self.shared.fabric.nccl_available(),
            nccl_off: !self.shared.net.nccl,
            host_named: std::env::var_os("NCCL_HOSTID").is_some_and(|v| !v.is_empty()),
            channel_refused: gpu.and_then(|g| self.shared.channels.refused(peer, g)),
            communicator: gpu.is_some_and(|g| self.shared.channels.ready(peer, g)),
        }
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
