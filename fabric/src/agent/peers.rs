//! This node's peers: their connections (one per lane, dialled and greeted on first use), whether they are
//! alive, and what their links have done.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use vfabric_transport::quic;

use super::link::LinkStats;
use super::shared::Agent;
use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::proto::codec::{read_frame, write_frame, PROTOCOL_VERSION};
use crate::proto::message::Message;

impl Agent {
    /// Sets where peer `node` listens (when the configuration does not say, as in tests that bind port 0).
    pub async fn set_peer_addr(&self, node: u16, addr: SocketAddr) -> Result<(), FabricError> {
        let mut p = self.peer(node)?.lock().await;
        p.addr = Some(addr);
        p.conns.iter_mut().for_each(|c| *c = None);
        // Its grace period before heartbeats may call it dead starts now.
        p.last_seen = Some(Instant::now());
        Ok(())
    }

    /// Whether peer `node` answered within `network.dead_after_ms` (always true for this node).
    pub async fn is_alive(&self, node: u16) -> Result<bool, FabricError> {
        if self.is_me(node) {
            return Ok(true);
        }
        let p = self.peer(node)?.lock().await;
        Ok(p.alive(self.dead_after(), self.shared.started))
    }

    /// Whether etcd counts peer `node` a member of the cluster (`None` without `[membership]`).
    pub(crate) async fn is_member(&self, node: u16) -> Option<bool> {
        match self.is_me(node) {
            true => Some(true),
            false => self.peer(node).ok()?.lock().await.member,
        }
    }

    /// Whether peer `node` is gone with everything it kept: etcd counts it out, or it shut down (and has not
    /// been heard from since).
    pub(crate) async fn is_gone(&self, node: u16) -> bool {
        if self.is_me(node) {
            return false;
        }
        match self.peer(node) {
            Ok(p) => {
                let p = p.lock().await;
                p.member == Some(false) || p.left
            }
            Err(_) => true,
        }
    }

    /// Whether this node may count itself a member: always, without etcd support built in.
    #[cfg(not(feature = "etcd"))]
    pub(crate) fn holds_membership(&self) -> bool {
        true
    }

    /// Whether the cluster keeps its membership in etcd (`[membership]`).
    pub(crate) fn in_etcd(&self) -> bool {
        #[cfg(feature = "etcd")]
        return self.shared.membership;
        #[cfg(not(feature = "etcd"))]
        false
    }

    /// The lanes to peer `node` that have an open connection, by number (each is dialled on first use).
    pub async fn open_lanes(&self, node: u16) -> Result<Vec<usize>, FabricError> {
        let p = self.peer(node)?.lock().await;
        Ok((0..p.conns.len()).filter(|&lane| p.open(lane).is_some()).collect())
    }

    /// Counters of the QUIC connections to peer `node` (packets, losses, congestion, flow-control stalls), summed
    /// over its open lanes: take them before and after a transfer and compare with [`LinkStats::since`].
    pub async fn link_stats(&self, node: u16) -> Result<LinkStats, FabricError> {
        let p = self.peer(node)?.lock().await;
        let mut stats = LinkStats::default();
        for c in (0..p.conns.len()).filter_map(|lane| p.open(lane)) {
            stats.add(&c.stats());
        }
        Ok(stats)
    }

    pub(crate) fn dead_after(&self) -> Duration {
        Duration::from_millis(self.shared.net.dead_after_ms)
    }

    pub(crate) async fn heard_from(&self, node: u16) {
        if let Ok(p) = self.peer(node) {
            let mut p = p.lock().await;
            (p.last_seen, p.left) = (Some(Instant::now()), false);
        }
    }

    /// `e`, a call's failure on `conn` to `node`: `PeerDead` when the peer closed the connection because it
    /// shut down (it is then taken for gone until it is heard from again: its regions fail over at once, with
    /// no wait for the heartbeats), else `e`.
    pub(crate) async fn after_failure(&self, node: u16, conn: &quinn::Connection, e: FabricError) -> FabricError {
        match self.peer(node) {
            Ok(p) if closed_by_shutdown(conn) => {
                let mut p = p.lock().await;
                p.left = true;
                FabricError::PeerDead { node, name: p.name.clone(), why: "it shut down".into() }
            }
            _ => e,
        }
    }

    /// The node whose certificate names it `name`, marked as heard from.
    pub(crate) async fn find_peer(&self, name: &str) -> Option<u16> {
        for (i, p) in self.shared.peers.iter().enumerate() {
            let mut p = p.lock().await;
            if p.name == name {
                p.last_seen = Some(Instant::now());
                return Some(i as u16);
            }
        }
        None
    }

    /// The connection to peer `node` on `lane`, dialled from this node's endpoint of the same lane and greeted
    /// on first use (and again after it closed). `probe` (pings) dials even a peer thought dead: that is how one
    /// that comes back is seen again.
    pub(crate) async fn connection(
        &self,
        node: u16,
        lane: usize,
        probe: bool,
    ) -> Result<quinn::Connection, FabricError> {
        if self.is_me(node) {
            return Err(FabricError::InvalidAddress(format!("node {node} is this node")));
        }
        let mut p = self.peer(node)?.lock().await;
        // A connection the peer closed because it shut down: it is gone (until heard from again).
        if p.conns.iter().flatten().any(closed_by_shutdown) {
            p.left = true;
            p.conns.iter_mut().for_each(|c| *c = None);
        }
        if !probe && !p.alive(self.dead_after(), self.shared.started) {
            return Err(FabricError::PeerDead { node, name: p.name.clone(), why: p.why_dead(self.dead_after()) });
        }
        let lanes = p.conns.len();
        let Some(endpoint) = self.shared.endpoints.get(lane).filter(|_| lane < lanes) else {
            return Err(NetworkError::NoSuchLane { node, lane, lanes }.into());
        };
        if let Some(c) = p.open(lane) {
            return Ok(c.clone());
        }
        let name = p.name.clone();
        let addr = p.lane_addr(lane).ok_or_else(|| NetworkError::NoPeerAddress { node, name: name.clone() })?;
        // The dial runs without the peer's lock: two nodes dialling each other at once each need the other to
        // look them up (and serve their hello) before either dial ends.
        drop(p);
        let dead_after = self.dead_after();
        let dialled = tokio::time::timeout(dead_after, self.dial(node, endpoint, addr, &name)).await.map_err(|_| {
            FabricError::PeerDead {
                node,
                name: name.clone(),
                why: format!("no answer to hello within {} ms", dead_after.as_millis()),
            }
        })?;
        // A node whose endpoint refuses connections is shutting down: gone, as when it closes one it had.
        let conn = match dialled {
            Err(e) if refused(&e) => {
                self.peer(node)?.lock().await.left = true;
                return Err(FabricError::PeerDead { node, name, why: "it shut down (it refuses connections)".into() });
            }
            dialled => dialled?,
        };
        let mut p = self.peer(node)?.lock().await;
        p.last_seen = Some(Instant::now());
        // Another call on this lane may have dialled meanwhile: keep the connection already in use (leases may
        // have been granted over it, and they end with it), close this one.
        if let Some(c) = p.open(lane) {
            conn.close(quinn::VarInt::from_u32(0), b"a connection on this lane exists");
            return Ok(c.clone());
        }
        p.conns[lane] = Some(conn.clone());
        Ok(conn)
    }

    /// Dials `node` at `addr` and greets it: this node's `Hello`, its `Welcome`.
    async fn dial(
        &self,
        node: u16,
        endpoint: &quinn::Endpoint,
        addr: SocketAddr,
        name: &str,
    ) -> Result<quinn::Connection, FabricError> {
        let conn = quic::connect(endpoint, addr, name).await.map_err(|source| NetworkError::Connect {
            name: name.to_string(),
            addr,
            source,
        })?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let hello = Message::Hello {
            cluster: self.shared.cluster.clone(),
            node: self.shared.node,
            protocol: PROTOCOL_VERSION,
            lanes: self.shared.net.lanes,
            latency_lane: self.shared.net.latency_lane,
        };
        write_frame(&mut send, &hello, self.max_frame()).await?;
        send.finish().map_err(NetworkError::Finish)?;
        match read_frame(&mut recv, self.max_frame()).await? {
            Some(Message::Welcome { node: n, .. }) if n == node => Ok(conn),
            Some(Message::Error { kind, message }) => Err(FabricError::Remote { node, kind, message }),
            other => {
                Err(ProtocolError::Unexpected { node, answer: other.as_ref().map_or("nothing", Message::name) }.into())
            }
        }
    }

    /// Runs a call, failing with `PeerDead` as soon as the heartbeats declare the peer dead (within
    /// `network.dead_after_ms` and a heartbeat of its last answer: a peer that crashed or froze does not close
    /// its connections, which would otherwise hold the call until QUIC's idle timeout), or when the call takes
    /// longer than `dead_after_ms` and at least a minute (bulk transfers may take longer than a heartbeat
    /// period, and a peer that answers its heartbeats is working on them).
    pub(crate) async fn bounded<T>(
        &self,
        node: u16,
        work: impl std::future::Future<Output = Result<T, FabricError>>,
    ) -> Result<T, FabricError> {
        let limit = self.dead_after().max(Duration::from_secs(60));
        let period = Duration::from_millis(self.shared.net.heartbeat_ms);
        // A call to a peer already thought dead (a heartbeat's ping, which is how one that comes back is seen
        // again) has only the time limit.
        let watch = matches!(self.is_alive(node).await, Ok(true));
        let declared_dead = async {
            if !watch {
                return std::future::pending().await;
            }
            loop {
                tokio::time::sleep(period).await;
                if matches!(self.is_alive(node).await, Ok(false)) {
                    return;
                }
            }
        };
        let why = tokio::select! {
            r = tokio::time::timeout(limit, work) => match r {
                // Another call to the same peer may have declared it dead first and closed the connections this
                // one shared: its network error then says only "locally closed", and the cause is the death.
                Ok(Err(FabricError::Network(e))) if watch && matches!(self.is_alive(node).await, Ok(false)) => {
                    format!("no heartbeat for {} ms while the call was in flight ({e})", self.shared.net.dead_after_ms)
                }
                Ok(r) => return r,
                Err(_) => format!("no answer within {} ms", limit.as_millis()),
            },
            () = declared_dead => format!("no heartbeat for {} ms while the call was in flight", self.shared.net.dead_after_ms),
        };
        // The call was dropped midway: a grant the peer made for it would stay held there with nobody to release
        // it. Closing the connections ends them all (the peer releases a connection's grants when it closes),
        // and the next call dials afresh.
        let mut p = self.peer(node)?.lock().await;
        for c in p.conns.iter_mut() {
            if let Some(c) = c.take() {
                crate::proto::quic::close(&c, crate::proto::quic::CloseCode::Dead, "declared dead mid-call");
            }
        }
        Err(FabricError::PeerDead { node, name: p.name.clone(), why })
    }
}

/// Whether the peer closed `conn` because it shut down.
fn closed_by_shutdown(conn: &quinn::Connection) -> bool {
    let shutdown = quinn::VarInt::from_u32(crate::proto::quic::CloseCode::Shutdown as u32);
    matches!(conn.close_reason(), Some(quinn::ConnectionError::ApplicationClosed(c)) if c.error_code == shutdown)
}

/// Whether a dial failed because the peer's endpoint refused the connection (what a closed endpoint answers).
fn refused(e: &FabricError) -> bool {
    matches!(
        e,
        FabricError::Network(NetworkError::Connect {
            source: quic::QuicError::Connection(quinn::ConnectionError::ConnectionClosed(c)),
            ..
        }) if c.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED
    )
}
