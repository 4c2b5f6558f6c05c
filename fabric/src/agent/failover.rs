//! A standby's side of replicated regions (`super::backups`): keeping copies for other homes, taking their
//! writes, and taking over when a home dies; and a caller's side: finding the copy that took over.

use std::time::{Duration, Instant};

use vfabric_allocator::TenantId;

use super::acting;
use super::backups::Standby;
use super::replication::{Kept, REPLICA_PIECE};
use super::serve_pages::home_region;
use super::shared::{in_place, Agent};
use crate::directory::{Placement, RegionHandle as Region};
use crate::error::{FabricError, ProtocolError};
use crate::proto::chunk::{receive, Payload};
use crate::proto::convert::unexpected;
use crate::proto::message::{ErrorKind, Message, WireRegion};
use crate::proto::quic::QuicChunks;

impl Agent {
    /// `Standby` from `peer`: a copy of `region`, one of the peer's own regions (its users name it `origin`)
    /// kept on `replicas` nodes, in this node's host memory, under the name of the region's `tenant`, stored and
    /// evicted as `kept` says (the same copy when asked again: the first answer may have been lost).
    pub(crate) async fn keep_standby(
        &self,
        peer: u16,
        (region, origin): (&WireRegion, &WireRegion),
        replicas: u8,
        (tenant, kept): (u32, Kept),
    ) -> Result<Message, FabricError> {
        let (home, origin) = (Region::from(region), Region::from(origin));
        if home.addr.node().0 != peer {
            return Err(FabricError::PermissionDenied(format!(
                "node {peer} asked for a standby of {home}, not its own"
            )));
        }
        if let Some((copy, _)) = self.shared.backups.copy_of(&home) {
            return Ok(Message::Allocated { region: WireRegion::from(&copy) });
        }
        // A copy that took over from a dead home asks for standbys of its own: a node that kept another copy of
        // the same region gives it (the new home sends the whole region to it), once etcd says the asking copy
        // is the one that took over from that copy's home.
        if let Some((kept, standby)) = self.shared.backups.copy_of(&origin) {
            if !self.took_over(&standby.home, &home).await {
                return Err(FabricError::Unavailable(format!(
                    "node {} keeps {kept} for {}, which {home} did not take over: no standby of {home} here",
                    self.node(),
                    standby.home
                )));
            }
        }
        match self.shared.backups.rehome(home, origin, replicas) {
            Ok(Some(copy)) => {
                tracing::info!(region = %home, copy = %copy, "a standby copy of a dead home's region now keeps the copy that took over");
                return Ok(Message::Allocated { region: WireRegion::from(&copy) });
            }
            Ok(None) => {}
            Err(copy) => {
                return Err(FabricError::Unavailable(format!(
                    "node {} keeps {copy} for {origin}, which took over or is being written: no standby of {home} here",
                    self.node()
                )))
            }
        }
        let Kept { device, compression, priority } = kept;
        let placement = Placement { device, tenant: TenantId(tenant), compression, priority, ..Placement::default() };
        let copy = in_place(|| self.shared.fabric.alloc(home.len, placement))?;
        self.shared.backups.keep(home, origin, copy, replicas);
        Ok(Message::Allocated { region: WireRegion::from(&copy) })
    }

    /// `Replicate` from `peer`: a write of its region's bytes to the copy kept here. The payload is taken whole
    /// (at most [`REPLICA_PIECE`], and only as its bytes arrive) and written only if the copy has not taken
    /// over meanwhile and took no later exchange: a home's write delayed past the takeover (a partition that
    /// healed), or past a newer one, never lands.
    pub(crate) async fn take_replica(
        &self,
        peer: u16,
        (copy, seq, offset, len): (&WireRegion, u64, u64, u64),
        recv: &mut quinn::RecvStream,
    ) -> Result<Message, FabricError> {
        let copy = home_region(self, copy)?;
        let standby = match self.shared.backups.standby(&copy) {
            Some(s) if s.home.addr.node().0 == peer => s,
            _ => return Err(FabricError::InvalidAddress(format!("{copy} is no standby copy of node {peer}'s"))),
        };
        if len > REPLICA_PIECE {
            return Err(ProtocolError::BadField { field: "replicate.len", value: len }.into());
        }
        {
            let state = standby.state.lock().await;
            if state.retired {
                return Err(FabricError::InvalidAddress(format!("{copy} keeps another home's region now")));
            }
            if state.promoted {
                return Err(FabricError::Moved { to: copy });
            }
        }
        let mut data = Vec::new();
        receive(&mut QuicChunks::new(recv), Payload::new(len, self.shared.net.chunk.bytes()), |at, pieces| {
            data.truncate(at as usize);
            pieces.iter().for_each(|p| data.extend_from_slice(p));
            Ok::<(), FabricError>(())
        })
        .await?;
        let mut state = standby.state.lock().await;
        // Re-homed while the payload arrived (`Backups::rehome`): it belongs to the copy that took over now.
        if state.retired {
            return Err(FabricError::InvalidAddress(format!("{copy} keeps another home's region now")));
        }
        if state.promoted {
            return Err(FabricError::Moved { to: copy });
        }
        if seq <= state.seq {
            return Err(FabricError::Unavailable(format!(
                "exchange {seq} of {} arrived after exchange {}: not taken",
                standby.home, state.seq
            )));
        }
        state.seq = seq;
        if !data.is_empty() {
            in_place(|| self.shared.fabric.write(&copy, offset, &data))?;
        }
        Ok(Message::Done)
    }

    /// Takes over as the home of `region` (a region this node keeps a standby copy of, or the region that one
    /// took over from) with the copy kept here, once this node too finds the copy's home dead; returns the
    /// copy, which is the region from now on.
    /// A home that shuts down hands its region over (`asked_by` its own node): the standby then takes over at
    /// once, the home having stopped serving it.
    pub(crate) async fn take_over(&self, region: &Region, asked_by: u16) -> Result<Region, FabricError> {
        let Some((copy, standby)) = self.shared.backups.copy_of(region) else {
            return Err(FabricError::InvalidAddress(format!("node {} keeps no copy of {region}", self.node())));
        };
        let (home, node) = (standby.home, standby.home.addr.node().0);
        let mut state = standby.state.lock().await;
        if state.retired {
            // The copy became the standby of the copy that took over from `home` meanwhile: callers go there.
            return match self.shared.backups.standby(&copy) {
                Some(now) => Ok(now.home),
                None => Err(FabricError::InvalidAddress(format!("node {} keeps no copy of {region}", self.node()))),
            };
        }
        if !state.promoted && asked_by == node {
            if let Some(first) = self.settle_takeover(&home, &copy).await? {
                return Ok(first);
            }
            state.promoted = true;
            tracing::info!(region = %home, copy = %copy, node, "took over a region its home handed over");
            self.adopt_later(copy, &standby, node);
        }
        if !state.promoted {
            // With membership in etcd, only a member takes over, and only from a home that etcd counts out too: a
            // home cut off from this node alone still serves.
            if !self.holds_membership() || self.is_member(node).await == Some(true) {
                return Err(FabricError::Unavailable(format!(
                    "{home}'s home, node {node}, is still a member of the cluster, or node {} is not sure it is one",
                    self.node()
                )));
            }
            if !matches!(self.is_alive(node).await, Ok(false)) {
                return Err(FabricError::Unavailable(format!(
                    "{home}'s home, node {node}, still answers node {}",
                    self.node()
                )));
            }
            if let Some(first) = self.settle_takeover(&home, &copy).await? {
                return Ok(first);
            }
            state.promoted = true;
            tracing::warn!(region = %home, copy = %copy, node, "took over a region whose home died");
            self.adopt_later(copy, &standby, node);
        }
        Ok(copy)
    }

    /// Whether etcd says `copy` took over from `home` (never without `[membership]`, where a region has one
    /// standby, so no node keeps a second copy to give).
    async fn took_over(&self, home: &Region, copy: &Region) -> bool {
        #[cfg(feature = "etcd")]
        if self.in_etcd() {
            return matches!(self.claimed_by(home).await, Ok(Some(c)) if c == *copy);
        }
        let _ = (home, copy);
        false
    }

    /// With `[membership]`, settles in etcd whether `copy`, this node's standby copy of `home`, takes over from
    /// it: `None` when it does (or the cluster keeps no membership, where a region has one standby only), else
    /// the copy that claimed it first, which callers are sent to. This node's copy stays: the one that claimed
    /// first may yet make it its standby, and until its own standbys have the region it is the region's only
    /// other whole copy.
    async fn settle_takeover(&self, home: &Region, copy: &Region) -> Result<Option<Region>, FabricError> {
        if !self.in_etcd() {
            return Ok(None);
        }
        #[cfg(feature = "etcd")]
        let first = self.claim_takeover(home, copy).await?;
        #[cfg(not(feature = "etcd"))]
        let first: Option<Region> = None;
        if let Some(first) = first {
            tracing::info!(region = %home, copy = %copy, first = %first, "another copy took over first");
        }
        Ok(first)
    }

    /// Makes `copy`, which just took over as `standby` from its home `old_home`, a region of this node: one kept
    /// alone (a region its leaving home handed over, `Agent::drain`), or one that gets a standby of its own, in
    /// the background (callers reach it meanwhile; its writes wait for the new standby to have the whole
    /// region). Either way it stays in the table of copies, promoted, where callers that name the region as
    /// its users know it find it.
    fn adopt_later(&self, copy: Region, standby: &Standby, old_home: u16) {
        if standby.replicas <= 1 {
            return;
        }
        let (agent, origin, replicas) = (self.clone(), standby.origin, standby.replicas);
        tokio::spawn(async move { agent.adopt(copy, origin, old_home, replicas).await });
    }

    /// The copy that serves `region` now that its home is dead: the nodes after the home are asked in the
    /// cluster's order, for up to `network.dead_after_ms` and two heartbeats while one of them still hears the
    /// home. `None` when no node has a copy (the region was not replicated).
    pub(crate) async fn fail_over(&self, region: &Region) -> Option<Region> {
        let home = region.addr.node().0;
        let nodes = self.shared.peers.len() as u16;
        let period = Duration::from_millis(self.shared.net.heartbeat_ms);
        let until = Instant::now() + self.dead_after() + 2 * period;
        loop {
            let mut hears_home = false;
            for step in 1..nodes {
                let node = (home + step) % nodes;
                let asked = if self.is_me(node) {
                    self.take_over(region, self.node()).await
                } else if matches!(self.is_alive(node).await, Ok(true)) {
                    // The fabric's own call, whoever the caller acts for.
                    let ask = Message::Failover { region: WireRegion::from(region) };
                    match acting::as_node(self.call(node, &ask, &[])).await {
                        Err(FabricError::Moved { to }) => Ok(to),
                        Ok(other) => Err(unexpected(node, &other)),
                        Err(e) => Err(e),
                    }
                } else {
                    continue;
                };
                match asked {
                    Ok(copy) => {
                        tracing::info!(region = %region, copy = %copy, "a region's standby took over from its dead home");
                        return Some(copy);
                    }
                    Err(FabricError::Unavailable(_))
                    | Err(FabricError::Remote { kind: ErrorKind::Unavailable, .. }) => hears_home = true,
                    Err(e) => tracing::debug!(region = %region, node, error = %e, "no copy to fail over to"),
                }
            }
            if !hears_home || Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(period).await;
        }
    }
}
