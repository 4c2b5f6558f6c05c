//! What a running agent says about itself (`vfabric status`, the `Status` call of a local client or a peer): its
//! fabric's figures, its peers as it sees them, and its replicated regions.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use vfabric_allocator::{TenantId, Tier};

use super::shared::Agent;
use crate::directory::ReservationInfo;
use crate::error::FabricError;
use crate::fabric::Stats;
use crate::proto::convert::unexpected;
use crate::proto::message::Message;

/// How long a peer's ping may take before the status leaves its round trip out.
const PING_WAIT: Duration = Duration::from_millis(500);

/// A node's agent, as `vfabric status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct AgentStatus {
    /// The cluster's name.
    pub cluster: String,
    /// This node's id and name.
    pub node: u16,
    /// This node's name.
    pub name: String,
    /// Where it listens for peers.
    pub address: String,
    /// Seconds since it started.
    pub uptime_s: f64,
    /// The fabric's page size (the figures count frames of it).
    pub page_size: u64,
    /// The fabric's figures: per device and tier, the directory, the bytes moved, the waits.
    pub fabric: Stats,
    /// The other nodes, as this one sees them.
    pub peers: Vec<PeerStatus>,
    /// This node's replicated regions and the standby copies it keeps.
    pub replication: ReplicationStatus,
    /// The regions of this node by tenant (the operator's are tenant 0), with what each uses of its quotas.
    pub tenants: Vec<TenantStatus>,
    /// The reservations held on this node (capacity set aside for a tenant's task).
    pub reservations: Vec<ReservationInfo>,
}

/// A tenant at a node: its regions there and what it uses of each tier.
#[derive(Debug, Clone, Serialize)]
pub struct TenantStatus {
    /// The tenant (0: the operator's, or unnamed).
    pub tenant: u32,
    /// Its regions at this node.
    pub regions: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Per tier (`gpu`, `host`, `storage`): bytes used here, and the quota (`None`: none).
    pub tiers: Vec<(String, u64, Option<u64>)>,
    /// Leases held now on its regions here, and the bytes they cover.
    pub leases: usize,
    /// The bytes those leases cover.
    pub leased_bytes: u64,
}

/// The QUIC link to a peer, over its open lanes, counted since each lane's connection was made.
#[derive(Debug, Clone, Serialize)]
pub struct LinkStatus {
    /// Lanes with an open connection.
    pub lanes_open: usize,
    /// UDP payload bytes sent.
    pub sent_bytes: u64,
    /// UDP payload bytes received.
    pub received_bytes: u64,
    /// Packets declared lost (and resent) by this end.
    pub lost_packets: u64,
    /// Times this end cut its congestion window.
    pub congestion_events: u64,
    /// The largest smoothed round-trip time among the lanes, in microseconds.
    pub rtt_us: u64,
}

/// A peer as an agent sees it.
#[derive(Debug, Clone, Serialize)]
pub struct PeerStatus {
    /// Its node id.
    pub node: u16,
    /// Its name.
    pub name: String,
    /// Where it listens, if known.
    pub address: Option<String>,
    /// `alive`, `never heard from` (not taken for dead yet: a peer gets `dead_after_ms` after this node
    /// starts), or why it is taken for dead (worded as `PeerDead` words it).
    pub state: String,
    /// Milliseconds since it last answered or called (`None`: never).
    pub last_seen_ms: Option<u64>,
    /// A ping's round trip now, in microseconds (`None`: not answered within half a second, or not alive).
    pub rtt_us: Option<u64>,
    /// The link to it (`None`: no lane is open).
    pub link: Option<LinkStatus>,
    /// Pages moved to and from it since this agent started, by route.
    pub routes: Vec<RouteStatus>,
}

/// A peer's moves of pages by one route.
#[derive(Debug, Clone, Serialize)]
pub struct RouteStatus {
    /// `mover`, `mapped`, `nccl` or `quic` (`super::page_route::PageRoute`).
    pub route: String,
    /// Why it was taken, the last time (for `quic`: why no faster route was open).
    pub why: String,
    /// Moves that took it.
    pub moves: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Replicated regions at a node.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicationStatus {
    /// Regions of this node kept on other nodes too.
    pub homed: usize,
    /// Standby copies kept here for other nodes' regions.
    pub kept: usize,
    /// How far behind the standbys of this node's asynchronous regions are, in milliseconds.
    pub lag_ms: f64,
}

impl Agent {
    /// What this agent says about itself: its fabric's figures, its peers (pinged, those alive), its replicas.
    pub async fn status(&self) -> AgentStatus {
        self.status_of(true).await
    }

    /// The status of `node` as JSON (`None`: this agent's): its own, or a peer's, asked over the latency lane
    /// (`vfabric status --node` through this node's agent). A dead peer is `PeerDead` within `dead_after_ms`.
    pub async fn status_json(&self, node: Option<u16>) -> Result<String, FabricError> {
        match node {
            Some(n) if !self.is_me(n) => {
                let lane = self.take_lane(n, 0)?;
                let (agent, ask) = (self.clone(), Message::Status { node: None });
                match self.on_lane(lane.lane, 0, async move { agent.call_on(n, &lane, &ask, &[]).await }).await? {
                    Message::Figures { json } => Ok(json),
                    other => Err(unexpected(n, &other)),
                }
            }
            _ => serde_json::to_string(&self.status().await)
                .map_err(|_| FabricError::Internal("the agent's status could not be written as JSON")),
        }
    }

    /// [`Agent::status`], pinging the live peers for their round trips only with `ping`.
    pub(crate) async fn status_of(&self, ping: bool) -> AgentStatus {
        let dead_after = self.dead_after();
        let mut peers = Vec::new();
        for (i, p) in self.shared.peers.iter().enumerate() {
            let node = i as u16;
            let (name, address, alive, why, last_seen) = {
                let p = p.lock().await;
                let alive = p.alive(dead_after, self.shared.started);
                (p.name.clone(), p.addr.map(|a| a.to_string()), alive, p.why_dead(dead_after), p.last_seen)
            };
            // Slots of nodes that never joined (`[membership] max_nodes`) are no peers.
            if self.is_me(node) || name.is_empty() {
                continue;
            }
            let rtt = match alive && ping {
                true => tokio::time::timeout(PING_WAIT, self.ping(node)).await.ok().and_then(Result::ok),
                false => None,
            };
            peers.push(PeerStatus {
                node,
                name,
                address,
                state: match (alive, last_seen) {
                    (true, Some(_)) => "alive".into(),
                    (true, None) => "never heard from".into(),
                    (false, _) => why,
                },
                last_seen_ms: last_seen.map(|t| t.elapsed().as_millis() as u64),
                rtt_us: rtt.map(|d| d.as_micros() as u64),
                link: match self.link_stats(node).await {
                    Ok(l) if l.lanes_open > 0 => Some(LinkStatus {
                        lanes_open: l.lanes_open,
                        sent_bytes: l.udp_tx_bytes,
                        received_bytes: l.udp_rx_bytes,
                        lost_packets: l.lost_packets,
                        congestion_events: l.congestion_events,
                        rtt_us: l.rtt.as_micros() as u64,
                    }),
                    _ => None,
                },
                routes: self.routes_of(node),
            });
        }
        let (homed, kept) = self.replication();
        let me = match self.peer(self.node()) {
            Ok(p) => p.lock().await.name.clone(),
            Err(_) => String::new(),
        };
        let tenants = self.tenant_status();
        AgentStatus {
            tenants,
            reservations: self.shared.fabric.reservations(),
            cluster: self.shared.cluster.clone(),
            node: self.node(),
            name: me,
            address: self.local_addr().to_string(),
            uptime_s: self.shared.started.elapsed().as_secs_f64(),
            page_size: self.shared.fabric.page_size(),
            fabric: self.shared.fabric.stats(),
            peers,
            replication: ReplicationStatus { homed, kept, lag_ms: self.replication_lag().await.as_secs_f64() * 1e3 },
        }
    }

    /// `node`'s moves by route.
    fn routes_of(&self, node: u16) -> Vec<RouteStatus> {
        let counts = self.shared.routes.lock().unwrap_or_else(|p| p.into_inner()).of(node);
        counts
            .into_iter()
            .map(|c| RouteStatus { route: c.route.name().to_owned(), why: c.why, moves: c.moves, bytes: c.bytes })
            .collect()
    }

    /// The tenants with regions here or a quota in the configuration, the operator first.
    fn tenant_status(&self) -> Vec<TenantStatus> {
        let f = &self.shared.fabric;
        let mut by: BTreeMap<u32, (usize, u64)> = self.shared.tenants.iter().map(|t| (t.id, (0, 0))).collect();
        for (region, tenant) in f.regions() {
            let e = by.entry(tenant.0).or_default();
            (e.0, e.1) = (e.0 + 1, e.1 + region.len);
        }
        let leases: BTreeMap<u32, (usize, u64)> =
            f.leases_by_tenant().into_iter().map(|(t, n, bytes)| (t.0, (n, bytes))).collect();
        let tiers = [("gpu", Tier::Gpu), ("host", Tier::Host), ("storage", Tier::Nvme)];
        by.into_iter()
            .map(|(tenant, (regions, bytes))| TenantStatus {
                tenant,
                regions,
                bytes,
                leases: leases.get(&tenant).map_or(0, |l| l.0),
                leased_bytes: leases.get(&tenant).map_or(0, |l| l.1),
                tiers: tiers
                    .iter()
                    .map(|&(name, tier)| {
                        let (used, limit) = f.quota(TenantId(tenant), tier);
                        (name.to_string(), used, limit)
                    })
                    .collect(),
            })
            .collect()
    }
}
