//! The cluster's members kept in etcd (`[membership]`): this node registers under a lease it keeps alive, and
//! watches the others register, leave (their lease revoked at shutdown) and die (their lease expired). A member
//! that goes is dead for this node at once (calls on its regions fail with `PeerDead`, and fail over where they
//! have standbys) instead of after `network.dead_after_ms` of silence; one that comes is reached at the address
//! it registered. Heartbeats still watch the members: etcd says who is in the cluster, heartbeats whether this
//! node can reach them.
//!
//! A node not listed in `[[node]]` joins too: before it starts, it claims a node id for its name in etcd
//! (`/vfabric/<cluster>/ids/<name>`, and `/vfabric/<cluster>/nodes/<id>` naming it, both created in one
//! transaction and kept: a node that restarts finds its id again), and it registers as `<id>@<address>`, which
//! is how the others learn its id.
//!
//! The takeovers of replicated regions are settled here too: a standby copy takes over from its dead home only
//! if it is the first to claim the home's region in etcd (`/vfabric/<cluster>/takeovers/<region>`, created
//! once and kept), so that of several standbys exactly one does, and the others send callers to it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};

use super::shared::{lock, Agent};
use super::standing::{Registration, Standing};
use crate::config::MembershipSection;
use crate::directory::RegionHandle as Region;
use crate::error::{FabricError, NetworkError};
use crate::proto::message::WireRegion;

/// Where the members of cluster `cluster` register.
pub fn members_prefix(cluster: &str) -> String {
    format!("/vfabric/{cluster}/members/")
}

/// A client of the etcd that `m` names, and how to word its errors.
async fn connect(m: &MembershipSection) -> Result<(Client, impl Fn(etcd_client::Error) -> NetworkError), FabricError> {
    let endpoints = m.etcd.join(", ");
    let failed =
        move |e: etcd_client::Error| NetworkError::Membership { endpoints: endpoints.clone(), message: e.to_string() };
    let options =
        ConnectOptions::new().with_connect_timeout(Duration::from_secs(5)).with_timeout(Duration::from_secs(5));
    let client = Client::connect(&m.etcd, Some(options)).await.map_err(&failed)?;
    Ok((client, failed))
}

/// The node id of `name`, a node that `[[node]]` does not list, in cluster `cluster`: the one etcd keeps for
/// the name, or else the lowest free one from `first` (the listed nodes' ids come before) below
/// `m.max_nodes`, claimed for good.
pub(crate) async fn claim_node_id(
    m: &MembershipSection,
    cluster: &str,
    name: &str,
    first: u16,
) -> Result<u16, FabricError> {
    let (mut client, failed) = connect(m).await?;
    let by_name = format!("/vfabric/{cluster}/ids/{name}");
    for id in first..m.max_nodes {
        let got = client.get(by_name.clone(), None).await.map_err(&failed)?;
        if let Some(kv) = got.kvs().first() {
            return kv.value_str().ok().and_then(|v| v.parse().ok()).ok_or_else(|| {
                NetworkError::Membership {
                    endpoints: m.etcd.join(", "),
                    message: format!("{by_name} holds no node id"),
                }
                .into()
            });
        }
        let by_id = format!("/vfabric/{cluster}/nodes/{id}");
        let unclaimed = |key: &str| Compare::create_revision(key, CompareOp::Equal, 0);
        let claim = Txn::new()
            .when([unclaimed(&by_id), unclaimed(&by_name)])
            .and_then([TxnOp::put(by_id.clone(), name, None), TxnOp::put(by_name.clone(), id.to_string(), None)]);
        if client.txn(claim).await.map_err(&failed)?.succeeded() {
            tracing::info!(name, id, "claimed a node id in etcd");
            return Ok(id);
        }
        // Another node holds this id, or this name got one meanwhile (asked again at the top).
    }
    Err(NetworkError::Membership {
        endpoints: m.etcd.join(", "),
        message: format!("every node id below membership.max_nodes ({}) is taken", m.max_nodes),
    }
    .into())
}

impl Agent {
    /// Registers this node in etcd under a lease kept alive, takes the members there now, and follows their
    /// changes from then on.
    pub(crate) async fn join_cluster(&self, m: &MembershipSection) -> Result<(), FabricError> {
        let (mut client, failed) = connect(m).await?;
        let lease = client.lease_grant(i64::from(m.lease_ttl_s), None).await.map_err(&failed)?.id();
        let prefix = members_prefix(&self.shared.cluster);
        let me = self.peer(self.node())?.lock().await.name.clone();
        let put = PutOptions::new().with_lease(lease);
        let value = format!("{}@{}", self.node(), self.local_addr());
        client.put(format!("{prefix}{me}"), value, Some(put)).await.map_err(&failed)?;
        // The members now: every other node is none until etcd lists it.
        let now = client.get(prefix.clone(), Some(GetOptions::new().with_prefix())).await.map_err(&failed)?;
        for p in &self.shared.peers {
            p.lock().await.member = Some(false);
        }
        for kv in now.kvs() {
            if let (Ok(key), Ok(addr)) = (kv.key_str(), kv.value_str()) {
                self.member_joined(key.trim_start_matches(&prefix), addr).await;
            }
        }
        let from = now.header().map_or(0, |h| h.revision()) + 1;
        let watch = WatchOptions::new().with_prefix().with_start_revision(from);
        let (watcher, mut changes) = client.watch(prefix.clone(), Some(watch)).await.map_err(&failed)?;
        let agent = self.clone();
        let following = tokio::spawn(async move {
            let _watcher = watcher;
            loop {
                match changes.message().await {
                    Ok(Some(resp)) => {
                        for event in resp.events() {
                            let Some(kv) = event.kv() else { continue };
                            let Ok(name) = kv.key_str().map(|k| k.trim_start_matches(&prefix).to_string()) else {
                                continue;
                            };
                            match event.event_type() {
                                EventType::Put => agent.member_joined(&name, kv.value_str().unwrap_or("")).await,
                                EventType::Delete => agent.member_left(&name).await,
                            }
                        }
                    }
                    Ok(None) => break tracing::warn!("etcd ended the watch of the cluster's members"),
                    Err(e) => break tracing::warn!(error = %e, "watching the cluster's members failed"),
                }
            }
        });
        let ttl = Duration::from_secs(u64::from(m.lease_ttl_s));
        *lock(&self.shared.standing) = Some(Standing { renewed: Instant::now(), ttl });
        let keeping = tokio::spawn(keep_alive(self.clone(), client.clone(), lease, m.lease_ttl_s));
        self.tasks().extend([following, keeping]);
        *self.shared.registration.lock().await = Some(Registration { client, lease });
        tracing::info!(lease, "registered in etcd as a member of the cluster");
        Ok(())
    }

    /// Gives up this node's membership (its lease revoked): the others see it go at once.
    pub(crate) async fn leave_cluster(&self) {
        // No longer sure of its membership from now on: its replicated regions stop being served here before
        // the others may take over.
        *lock(&self.shared.standing) = None;
        if let Some(mut r) = self.shared.registration.lock().await.take() {
            if let Err(e) = r.client.lease_revoke(r.lease).await {
                tracing::warn!(error = %e, "revoking this node's membership failed: it ends when its lease expires");
            }
        }
    }

    /// Node `name` registered as `value`: `<id>@<address>`.
    async fn member_joined(&self, name: &str, value: &str) {
        let parsed = value
            .split_once('@')
            .and_then(|(id, addr)| Some((id.parse::<u16>().ok()?, addr.parse::<SocketAddr>().ok()?)));
        let Some((node, addr)) = parsed else {
            return tracing::warn!(name, value, "a member registered as something other than <id>@<address>");
        };
        if self.is_me(node) {
            return;
        }
        let Ok(peer) = self.peer(node) else {
            return tracing::warn!(name, node, "a member's node id is past this node's slots (membership.max_nodes)");
        };
        let mut p = peer.lock().await;
        // A node the configuration does not list takes its slot by name; a listed one must be the list's.
        if p.name.is_empty() {
            p.name = name.to_string();
        } else if p.name != name {
            return tracing::warn!(name, node, listed = %p.name, "a member registered under another node's id");
        }
        if p.addr != Some(addr) {
            p.conns.iter_mut().for_each(|c| *c = None);
        }
        let joined = p.member != Some(true);
        (p.addr, p.member, p.last_seen) = (Some(addr), Some(true), Some(Instant::now()));
        if joined {
            tracing::info!(node, name, %addr, "a node joined the cluster");
        }
    }

    /// Node `name` is no member any more.
    async fn member_left(&self, name: &str) {
        let Some(node) = self.node_named(name).await.filter(|&n| !self.is_me(n)) else { return };
        let Ok(peer) = self.peer(node) else { return };
        peer.lock().await.member = Some(false);
        tracing::info!(node, name, "a node left the cluster");
    }

    /// Whether this node may count itself a member (always, without `[membership]`; never once it left).
    pub(crate) fn holds_membership(&self) -> bool {
        match lock(&self.shared.standing).as_ref() {
            Some(s) => s.current(),
            None => !self.shared.membership,
        }
    }

    /// Claims, in etcd, the takeover of `home` (a region whose home died) for `copy`, this node's standby copy
    /// of it: `Ok(None)` when this node is the first to claim it, else the copy that claimed it first. Kept in
    /// etcd for good: a copy that lost cannot claim it later (after the winner dies, the winner's own
    /// standbys take over from it, under the winner's region).
    pub(crate) async fn claim_takeover(&self, home: &Region, copy: &Region) -> Result<Option<Region>, FabricError> {
        let Some(mut client) = self.shared.registration.lock().await.as_ref().map(|r| r.client.clone()) else {
            return Err(FabricError::Unavailable(format!(
                "node {} is no member of the cluster now: it cannot claim {home}",
                self.node()
            )));
        };
        let failed = |e: etcd_client::Error| {
            FabricError::Unavailable(format!("claiming the takeover of {home} in etcd failed: {e}"))
        };
        let key = takeover_key(&self.shared.cluster, home);
        let claim = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), region_text(copy), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let answer = client.txn(claim).await.map_err(failed)?;
        if answer.succeeded() {
            return Ok(None);
        }
        let first = answer.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(got) => got.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        match first.as_deref().map(String::from_utf8_lossy).as_deref().and_then(region_from_text) {
            Some(winner) if winner == *copy => Ok(None),
            Some(winner) => Ok(Some(winner)),
            None => Err(FabricError::Unavailable(format!("{key} in etcd names no region: {home} is not taken over"))),
        }
    }

    /// The copy that claimed the takeover of `home` in etcd, if one did.
    pub(crate) async fn claimed_by(&self, home: &Region) -> Result<Option<Region>, FabricError> {
        let Some(mut client) = self.shared.registration.lock().await.as_ref().map(|r| r.client.clone()) else {
            return Err(FabricError::Unavailable(format!("node {} is no member of the cluster now", self.node())));
        };
        let key = takeover_key(&self.shared.cluster, home);
        let got = client
            .get(key.clone(), None)
            .await
            .map_err(|e| FabricError::Unavailable(format!("reading {key} in etcd failed: {e}")))?;
        Ok(got.kvs().first().and_then(|kv| kv.value_str().ok()).and_then(region_from_text))
    }

    async fn node_named(&self, name: &str) -> Option<u16> {
        for (i, p) in self.shared.peers.iter().enumerate() {
            if p.lock().await.name == name {
                return Some(i as u16);
            }
        }
        None
    }
}

/// Where etcd keeps which copy took over from `home`, a region of cluster `cluster` whose home died: the
/// copy as [`region_text`] writes it.
pub fn takeover_key(cluster: &str, home: &Region) -> String {
    let h = WireRegion::from(home);
    format!("/vfabric/{cluster}/takeovers/{:x}.{}.{}", h.addr, h.slot, h.generation)
}

/// A region as a takeover's claim names it: `addr len page_size slot generation`.
pub fn region_text(r: &Region) -> String {
    let w = WireRegion::from(r);
    format!("{:x} {} {} {} {}", w.addr, w.len, w.page_size, w.slot, w.generation)
}

/// [`region_text`] read back.
fn region_from_text(text: &str) -> Option<Region> {
    let mut it = text.split(' ');
    let addr = u64::from_str_radix(it.next()?, 16).ok()?;
    let mut num = || it.next()?.parse::<u64>().ok();
    let (len, page_size, slot, generation) = (num()?, num()?, num()?, num()?);
    Some(Region::from(&WireRegion { addr, len, page_size, slot: slot.try_into().ok()?, generation }))
}

/// Renews lease `lease` a few times per `ttl_s`, noting each renewal in `agent`'s standing; a renewal that
/// fails is logged (the node stays a member until the lease expires, and calls on its regions then fail over
/// elsewhere).
async fn keep_alive(agent: Agent, mut client: Client, lease: i64, ttl_s: u32) {
    let every = Duration::from_millis(u64::from(ttl_s) * 1000 / 3).max(Duration::from_millis(100));
    let (mut keeper, mut answers) = match client.lease_keep_alive(lease).await {
        Ok(k) => k,
        Err(e) => return tracing::error!(error = %e, "keeping this node's membership alive failed"),
    };
    loop {
        tokio::time::sleep(every).await;
        let sent = Instant::now();
        let renewed = match keeper.keep_alive().await {
            Ok(()) => answers.message().await.map(|a| a.is_some_and(|a| a.ttl() > 0)),
            Err(e) => Err(e),
        };
        match renewed {
            Ok(true) => {
                if let Some(s) = lock(&agent.shared.standing).as_mut() {
                    s.renewed = sent;
                }
            }
            Ok(false) => tracing::error!(lease, "etcd says this node's membership lease has expired"),
            Err(e) => tracing::warn!(error = %e, "renewing this node's membership failed"),
        }
    }
}
