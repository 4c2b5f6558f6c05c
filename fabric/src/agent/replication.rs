//! A home's side of its replicated regions (`super::backups`): placing their standby copies, copying each
//! write to them before it is acknowledged, and serving the regions on its own only while the standbys answer.

use std::future::Future;
use std::ops::Range;
use std::time::{Duration, Instant};

use vfabric_allocator::{Compression, Location};

use super::acting;
use super::backups::{serves_alone, HomeEntry, Standbys};
use super::shared::{in_place, Agent};
use crate::config::{MAX_REPLICAS, MAX_REPLICAS_WITHOUT_ETCD};
use crate::directory::{Placement, Priority, RegionHandle as Region};
use crate::error::FabricError;
use crate::proto::convert::{self, unexpected};
use crate::proto::message::{ErrorKind, Message, WireRegion};

/// Bytes of a range sent to a standby per call (bounds the home's buffer and the standby's).
pub(crate) const REPLICA_PIECE: u64 = 16 << 20;

/// What of a region's placement holds on whichever node keeps it: where the home puts its pages, how they are
/// stored and how soon they are evicted. `Alloc` carries it to the node that will be the region's home, and a
/// migration to another node and every standby copy keep the region's own (a tenant's name travels with the
/// call; a reservation holds on its own node only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Kept {
    /// The device of the home node its pages go to (`None`: where the home chooses).
    pub device: Option<Location>,
    /// How its pages are stored (packed on the storage tier; a lossy compression also in host memory).
    pub compression: Compression,
    /// How soon its pages are evicted beside others.
    pub priority: Priority,
}

impl Kept {
    /// A region placed on `device`, its pages stored as they are, at the default priority.
    pub fn on(device: Option<Location>) -> Self {
        Kept { device, ..Kept::default() }
    }

    /// From a request's numbers (`Alloc`, `Standby`): an unknown compression or priority is a bad field.
    pub(crate) fn from_wire(device: Option<Location>, compression: u8, priority: u8) -> Result<Self, FabricError> {
        Ok(Kept { device, compression: convert::compression(compression)?, priority: convert::priority(priority)? })
    }
}

/// How a region is kept across nodes: on how many, and how far behind its home the others may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replication {
    /// Nodes that keep its released writes, its home included: `1` its home only, `2` also a standby copy in
    /// another node's host memory that takes over when the home dies, up to `config::MAX_REPLICAS` with
    /// `[membership]` (etcd settles which standby takes over); `0` takes `network.replicas`.
    pub replicas: u8,
    /// How far behind its home the standby may be: `Some(Duration::ZERO)` not at all (a write returns once
    /// the standby has it); more lets writes return at once, their bytes following in the background within
    /// about a quarter of it, a write waiting when the standby is this far behind (a home that dies loses at
    /// most this much of its acknowledged writes); `None` takes `network.replica_lag_ms`.
    pub lag: Option<Duration>,
}

impl From<u8> for Replication {
    /// Kept on `replicas` nodes, the standby as far behind as `network.replica_lag_ms` lets it.
    fn from(replicas: u8) -> Replication {
        Replication { replicas, lag: None }
    }
}

impl Replication {
    /// Kept on `replicas` nodes, synchronously.
    pub fn sync(replicas: u8) -> Replication {
        Replication { replicas, lag: Some(Duration::ZERO) }
    }

    /// Kept on `replicas` nodes, the standby at most `lag` behind.
    pub fn lagging(replicas: u8, lag: Duration) -> Replication {
        Replication { replicas, lag: Some(lag) }
    }

    /// The lag in whole milliseconds, as an `Alloc` carries it (saturating).
    pub(crate) fn lag_ms(&self) -> Option<u32> {
        self.lag.map(|l| u32::try_from(l.as_millis()).unwrap_or(u32::MAX))
    }
}

/// Why an exchange with the standbys failed.
enum Failure {
    /// Standby `i`'s node answered that it keeps no such copy.
    Gone(usize),
    /// Anything else.
    Failed(FabricError),
}

impl Agent {
    /// Allocates a region of this node placed as `kept` says, kept as `keep` says (defaults from the cluster's
    /// `[network]`): with N replicas, a standby copy goes to each of the next N - 1 nodes of the cluster's list that answer. Refused, with nothing
    /// left allocated, when no node takes the copy.
    pub(crate) async fn alloc_at_home(&self, size: u64, kept: Kept, keep: Replication) -> Result<Region, FabricError> {
        let Kept { device, compression, priority } = kept;
        self.alloc_placed(size, Placement { device, compression, priority, ..Placement::default() }, keep).await
    }

    /// [`Agent::alloc_at_home`] with the whole placement (priority, compression, reservation; the tenant is
    /// the one the call acts for, if any).
    pub(crate) async fn alloc_placed(
        &self,
        size: u64,
        mut placement: Placement,
        keep: Replication,
    ) -> Result<Region, FabricError> {
        let net = &self.shared.net;
        let replicas = if keep.replicas == 0 { net.replicas } else { keep.replicas };
        let lag = keep.lag.unwrap_or(Duration::from_millis(u64::from(net.replica_lag_ms)));
        let lag = (!lag.is_zero()).then_some(lag);
        if replicas > MAX_REPLICAS {
            return Err(FabricError::Unavailable(format!(
                "{replicas} replicas asked: a region is kept on at most {MAX_REPLICAS} nodes"
            )));
        }
        if replicas > MAX_REPLICAS_WITHOUT_ETCD && !self.in_etcd() {
            return Err(FabricError::Unavailable(format!(
                "{replicas} replicas asked: more than {MAX_REPLICAS_WITHOUT_ETCD} needs the cluster's membership in \
                 etcd ([membership]), which settles which standby takes over"
            )));
        }
        // A call made for a tenant allocates under its name (its standby copies too: `place_standbys`).
        if let Some(tenant) = acting::tenant() {
            placement.tenant = tenant;
        }
        let region = in_place(|| self.shared.fabric.alloc(size, placement))?;
        if replicas <= 1 {
            return Ok(region);
        }
        match self.place_standbys((&region, &region), replicas, usize::from(replicas - 1), &[]).await {
            Ok(copies) => {
                tracing::debug!(region = %region, ?copies, "a replicated region and its standby copies");
                self.shared.backups.add_homed(region, copies, None, (replicas, lag));
                Ok(region)
            }
            Err(e) => {
                if let Err(undo) = in_place(|| self.shared.fabric.free(&region)) {
                    tracing::warn!(region = %region, error = %undo, "freeing a region whose standbys failed");
                }
                Err(e)
            }
        }
    }

    /// Asks the nodes after this one, in the cluster's order (but those in `exclude`), for `want` standby
    /// copies of `region`, a region kept on `replicas` nodes; all of them, or none (those placed are freed
    /// again) and why.
    pub(crate) async fn place_standbys(
        &self,
        pair: (&Region, &Region),
        replicas: u8,
        want: usize,
        exclude: &[u16],
    ) -> Result<Vec<Region>, FabricError> {
        let (copies, refusals) = self.place_some(pair, replicas, want, exclude).await;
        if copies.len() == want {
            return Ok(copies);
        }
        for copy in &copies {
            if let Err(e) = self.free_direct(copy).await {
                tracing::warn!(copy = %copy, error = %e, "freeing a standby copy of a refused region failed");
            }
        }
        let why = if refusals.is_empty() { "the cluster has no other node".to_string() } else { refusals.join("; ") };
        Err(FabricError::Unavailable(format!("{want} standby copies wanted, {} placed: {why}", copies.len())))
    }

    /// [`Agent::place_standbys`], keeping what it could place: the copies, and why the other nodes took none.
    async fn place_some(
        &self,
        (region, origin): (&Region, &Region),
        replicas: u8,
        want: usize,
        exclude: &[u16],
    ) -> (Vec<Region>, Vec<String>) {
        let nodes = self.shared.peers.len() as u16;
        // The copies are the region's tenant's, as the region is, and stored and evicted as it is.
        let (tenant, compression, priority) = match self.shared.fabric.placement_of(region) {
            Ok(p) => (p.tenant, p.compression, p.priority),
            Err(e) => return (Vec::new(), vec![format!("{region}: {e}")]),
        };
        let (mut copies, mut refusals) = (Vec::new(), Vec::new());
        for step in 1..nodes {
            if copies.len() == want {
                break;
            }
            let node = (self.node() + step) % nodes;
            if exclude.contains(&node) {
                continue;
            }
            // A tenant's node keeps nothing of other tenants' (nor of the operator's).
            let tenants_node = match self.peer(node) {
                Ok(p) => p.lock().await.tenant.is_some(),
                Err(_) => true,
            };
            if tenants_node {
                continue;
            }
            if !matches!(self.is_alive(node).await, Ok(true)) {
                // (Slots of nodes that never joined are no nodes to mention.)
                if self.peer(node).is_ok_and(|p| p.try_lock().map_or(true, |p| !p.name.is_empty())) {
                    refusals.push(format!("node {node} is not answering"));
                }
                continue;
            }
            let msg = Message::Standby {
                region: WireRegion::from(region),
                origin: WireRegion::from(origin),
                replicas,
                tenant: tenant.0,
                compression: compression.number(),
                priority: convert::priority_number(priority),
            };
            // The fabric's own call, for a tenant's region as for any: the node makes it.
            match acting::as_node(self.call(node, &msg, &[])).await {
                Ok(Message::Allocated { region: copy }) => copies.push(Region::from(&copy)),
                Ok(other) => refusals.push(unexpected(node, &other).to_string()),
                Err(e) => refusals.push(format!("node {node}: {e}")),
            }
        }
        (copies, refusals)
    }

    /// Runs `write`, a write of `range` of `region` (a region of this node), and, when the region is
    /// replicated, copies the range to its standbys before returning: a write is acknowledged only once every
    /// standby has it. The region's writes run one at a time meanwhile.
    pub(crate) async fn written<T>(
        &self,
        region: &Region,
        range: Range<u64>,
        write: impl Future<Output = Result<T, FabricError>>,
    ) -> Result<T, FabricError> {
        let Some(entry) = self.shared.backups.homed(region) else { return write.await };
        let mut standbys = entry.lock().await;
        if let Some(to) = standbys.taken_over {
            return Err(FabricError::Moved { to });
        }
        // A write that failed midway may have changed part of the range: the standbys get it all the same.
        let out = write.await;
        standbys.pending.push(range);
        if let Some(lag) = standbys.lag {
            // Asynchronous: acknowledged now while the standby is less than `lag` behind, its bytes sent by a
            // flush in the background.
            let since = *standbys.behind_since.get_or_insert_with(Instant::now);
            if since.elapsed() < lag {
                if !standbys.flushing {
                    standbys.flushing = true;
                    self.flush_later(*region, entry.clone(), lag / 4);
                }
                return out;
            }
        }
        let copied = self.replicate(region, &mut standbys).await;
        let out = out?;
        copied.map(|()| out)
    }

    /// Before a call is served on `region`, a region of this node: when it is replicated and its standbys have
    /// not answered within half of `network.dead_after_ms`, asks them (and sends what they missed). A standby
    /// that took over answers `Moved`, and so does the region from then on; one that cannot be reached makes
    /// the call `Unavailable` rather than let two homes serve the region.
    pub(crate) async fn check_home(&self, region: &Region) -> Result<(), FabricError> {
        let Some(entry) = self.shared.backups.homed(region) else { return Ok(()) };
        let mut standbys = entry.lock().await;
        if let Some(to) = standbys.taken_over {
            return Err(FabricError::Moved { to });
        }
        // With membership in etcd, a home that may have been counted out serves none of its replicated regions:
        // its standby may be taking over.
        if !self.holds_membership() {
            return Err(FabricError::Unavailable(format!(
                "node {} is not sure it is still a member of the cluster: {region} waits",
                self.node()
            )));
        }
        // Writes pending are fine while an asynchronous region's standby is less than its lag behind.
        let current = match (standbys.lag, standbys.behind_since) {
            (Some(lag), Some(since)) => since.elapsed() < lag,
            _ => standbys.pending.is_empty(),
        };
        if serves_alone(standbys.confirmed.map(|t| t.elapsed()), self.dead_after()) && current {
            return Ok(());
        }
        self.replicate(region, &mut standbys).await
    }

    /// Sends the writes pending on `entry` (asynchronous region `region`) to its standbys `after` from now.
    fn flush_later(&self, region: Region, entry: HomeEntry, after: Duration) {
        let agent = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let mut standbys = entry.lock().await;
            standbys.flushing = false;
            if standbys.taken_over.is_some() || standbys.pending.is_empty() {
                return;
            }
            if let Err(e) = agent.replicate(&region, &mut standbys).await {
                tracing::warn!(region = %region, error = %e, "writes did not reach the standby: the next write past the region's lag waits for them");
            }
        });
    }

    /// How far behind their home the standbys of this node's asynchronous regions are: the age of the oldest
    /// acknowledged write not on its standby yet, over every region (zero when every standby is current).
    pub async fn replication_lag(&self) -> Duration {
        let mut worst = Duration::ZERO;
        for region in self.shared.backups.homed_regions() {
            if let Some(entry) = self.shared.backups.homed(&region) {
                if let Some(since) = entry.lock().await.behind_since {
                    worst = worst.max(since.elapsed());
                }
            }
        }
        worst
    }

    /// Sends every write of this node's replicated regions that a standby does not have yet, now; the first
    /// failure is returned once every region was tried.
    pub async fn flush_replicas(&self) -> Result<(), FabricError> {
        let mut first = Ok(());
        for region in self.shared.backups.homed_regions() {
            let Some(entry) = self.shared.backups.homed(&region) else { continue };
            let mut standbys = entry.lock().await;
            if standbys.taken_over.is_some() || standbys.pending.is_empty() {
                continue;
            }
            if let Err(e) = self.replicate(&region, &mut standbys).await {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Sends the pending ranges of `region` (or, with none, an empty exchange) to every standby; on success
    /// they are all sent and the standbys confirmed, else they stay pending. A standby that cannot take over
    /// (its node answers but keeps no copy: it restarted; or etcd counts its node out) is replaced: a new
    /// standby takes its place, with the whole region; where no node takes one, the region goes on with its
    /// other standbys, if it has any.
    async fn replicate(&self, region: &Region, standbys: &mut Standbys) -> Result<(), FabricError> {
        // Each round replaces (or drops) one standby that was gone: a bound of rounds for new copies that go too.
        for _ in 0..=MAX_REPLICAS {
            let gone = match self.send_pending(region, standbys).await {
                Err(Failure::Gone(i)) => i,
                Err(Failure::Failed(e)) => return Err(e),
                Ok(()) => return Ok(()),
            };
            let lost = standbys.copies[gone];
            let others: Vec<u16> =
                standbys.copies.iter().map(|c| c.addr.node().0).filter(|&n| n != lost.addr.node().0).collect();
            let origin = standbys.origin.unwrap_or(*region);
            match self.place_standbys((region, &origin), standbys.replicas, 1, &others).await {
                Ok(mut placed) => {
                    let copy = placed.remove(0);
                    tracing::warn!(region = %region, lost = %lost, copy = %copy, "a standby copy was gone (its node restarted or left): a new one takes its place");
                    standbys.copies[gone] = copy;
                    standbys.pending.clear();
                    standbys.pending.push(0..region.len);
                }
                // No node takes its place, but other standbys keep the region: it goes on with them (what they
                // lack is sent next), fewer than it asked for.
                Err(e) if standbys.copies.len() > 1 => {
                    tracing::warn!(region = %region, lost = %lost, error = %e, "a standby copy was gone and no node took its place: the region keeps its other standbys");
                    standbys.copies.remove(gone);
                }
                Err(e) => return Err(e),
            }
        }
        Err(FabricError::Unavailable(format!("the standby copies of {region} kept going as they were placed")))
    }

    /// [`Agent::replicate`]'s sending.
    async fn send_pending(&self, region: &Region, standbys: &mut Standbys) -> Result<(), Failure> {
        let sent = Instant::now();
        // With nothing pending, one empty exchange: it asks each standby whether it still is one.
        let mut ranges = standbys.pending.clone();
        if ranges.is_empty() {
            ranges.push(0..0);
        }
        let mut buf = Vec::new();
        for range in ranges {
            let mut at = range.start;
            loop {
                let n = (range.end - at).min(REPLICA_PIECE) as usize;
                buf.resize(n, 0);
                if n > 0 {
                    in_place(|| self.shared.fabric.read(region, at, &mut buf)).map_err(Failure::Failed)?;
                }
                for (i, copy) in standbys.copies.iter().enumerate() {
                    standbys.seq += 1;
                    match self.send_replica(copy, standbys.seq, at, &buf).await {
                        Ok(()) => {}
                        Err(FabricError::Moved { to }) => {
                            tracing::warn!(region = %region, copy = %to, "the standby took over: the region lives there now");
                            standbys.taken_over = Some(to);
                            return Err(Failure::Failed(FabricError::Moved { to }));
                        }
                        Err(FabricError::Remote { kind: ErrorKind::InvalidAddress, .. }) => {
                            return Err(Failure::Gone(i))
                        }
                        // etcd counts the standby's node out (it cannot take over: only members do), or it shut
                        // down: another node takes its place.
                        Err(_) if self.is_gone(copy.addr.node().0).await => return Err(Failure::Gone(i)),
                        Err(e) => return Err(Failure::Failed(e)),
                    }
                }
                at += n as u64;
                if at >= range.end {
                    break;
                }
            }
        }
        standbys.pending.clear();
        standbys.behind_since = None;
        standbys.confirmed = Some(sent);
        Ok(())
    }

    /// One piece of a region's bytes to one of its standby copies.
    async fn send_replica(&self, copy: &Region, seq: u64, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let node = copy.addr.node().0;
        let msg = Message::Replicate { copy: WireRegion::from(copy), seq, offset, len: data.len() as u64 };
        // A tenant's write reaches its standby as the node's own call (replication is the operator's).
        match acting::as_node(self.call(node, &msg, data)).await {
            Ok(Message::Done) => Ok(()),
            Ok(other) => Err(unexpected(node, &other)),
            Err(e @ (FabricError::Moved { .. } | FabricError::Remote { kind: ErrorKind::InvalidAddress, .. })) => {
                Err(e)
            }
            Err(e) => Err(FabricError::Unavailable(format!(
                "the standby copy on node {node} did not answer ({e}): the region's home serves it only while its \
                 standby has every write"
            ))),
        }
    }

    /// Makes `copy`, a standby copy of this node that just took over from its dead home `old_home` (the
    /// region its users name `origin`), a replicated region of this node: a new standby for it on another node, with the whole region, so that
    /// the region survives this node's death too. Without a node to take it, the copy serves alone (logged).
    pub(crate) async fn adopt(&self, copy: Region, origin: Region, old_home: u16, replicas: u8) {
        // Locked from the start: no write is acknowledged before the standbys have the whole region.
        let mut standbys = self.shared.backups.add_adopting(copy, origin, replicas);
        // As many as the nodes left take: a copy with fewer standbys than its region asked for still keeps
        // the region on those it has.
        let want = usize::from(replicas.max(2) - 1);
        let (copies, refusals) = self.place_some((&copy, &origin), replicas, want, &[old_home]).await;
        if copies.len() < want {
            tracing::warn!(region = %copy, placed = copies.len(), want, why = %refusals.join("; "), "a copy that took over has fewer standbys than its region asked for");
        }
        let placed = match copies.is_empty() {
            true => Err(FabricError::Unavailable(format!("no node took a standby: {}", refusals.join("; ")))),
            false => {
                standbys.copies = copies;
                standbys.pending.push(0..copy.len);
                self.replicate(&copy, &mut standbys).await
            }
        };
        match placed {
            Ok(()) => {
                tracing::info!(region = %copy, standby = ?standbys.copies, "a copy that took over has a standby again")
            }
            Err(e) => tracing::warn!(region = %copy, error = %e, "a copy that took over serves without a standby"),
        }
    }

    /// Hands every replicated region of this node over to its standby (this node shuts down): the region's
    /// writes are flushed there, the standby takes over at once, and this node forwards its callers there for as
    /// long as it still answers. A region whose standby cannot be reached stays (it fails over when the
    /// standby finds this node gone).
    pub(crate) async fn hand_over_all(&self) {
        for region in self.shared.backups.homed_regions() {
            let Some(entry) = self.shared.backups.homed(&region) else { continue };
            let mut standbys = entry.lock().await;
            let Some(copy) = standbys.copies.first().copied().filter(|_| standbys.taken_over.is_none()) else {
                continue;
            };
            let node = copy.addr.node().0;
            let handed = match self.replicate(&region, &mut standbys).await {
                Ok(()) => {
                    let ask = Message::Failover { region: WireRegion::from(&region) };
                    acting::as_node(self.call(node, &ask, &[])).await
                }
                Err(e) => Err(e),
            };
            match handed {
                Err(FabricError::Moved { to }) => {
                    tracing::info!(region = %region, copy = %to, "handed a region over to its standby");
                    standbys.taken_over = Some(to);
                }
                Ok(other) => tracing::warn!(region = %region, error = %unexpected(node, &other), "a handover failed"),
                Err(e) => {
                    tracing::warn!(region = %region, error = %e, "a handover failed: the region fails over later")
                }
            }
        }
    }

    /// Frees the standby copies of `region`, a region of this node that was just freed (a copy that cannot be
    /// reached is logged: it goes with its node).
    pub(crate) async fn free_standbys(&self, region: &Region) {
        let Some(entry) = self.shared.backups.remove_homed(region) else { return };
        let copies = std::mem::take(&mut entry.lock().await.copies);
        for copy in copies {
            if let Err(e) = self.free_direct(&copy).await {
                tracing::warn!(region = %region, copy = %copy, error = %e, "freeing a standby copy failed");
            }
        }
    }
}
