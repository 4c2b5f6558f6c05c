//! The serving half of the agent: accepts peers' connections, checks who they are, and dispatches their
//! requests on the regions whose home is this node (the page-moving ones are in `super::serve_pages`).

use std::sync::Arc;

use vfabric_transport::quic;

use super::acting;
use super::lane_use::{pages_of, BULK};
use super::replication::{Kept, Replication};
use super::serve_channel::{grant_by_channel, AcquireBy};
use super::serve_pages::{abandon, grant, home_region, receive_write, send_read, take_back};
use super::shared::{in_place, Agent, RemoteGrant, Shared};
use crate::directory::{Mode, RegionHandle as Region};
use crate::error::{FabricError, ProtocolError};
use crate::fabric::Lease;
use crate::proto::codec::{read_frame, PROTOCOL_VERSION};
use crate::proto::convert::refusal;
use crate::proto::message::{Message, WireRegion};
use crate::proto::quic::{answer as finish_with, close as quic_close, CloseCode};
use tracing::Instrument;
use vfabric_allocator::{Location, TenantId};

/// Accepts connections on lane `lane`'s endpoint until it closes.
pub(crate) async fn accept_loop(shared: Arc<Shared>, lane: usize) {
    let Some(endpoint) = shared.endpoints.get(lane).cloned() else { return };
    while let Some(incoming) = endpoint.accept().await {
        let agent = Agent { shared: Arc::clone(&shared) };
        tokio::spawn(async move {
            let from = incoming.remote_address();
            match incoming.await {
                Ok(conn) => serve_connection(agent, conn).await,
                // A peer that gave up its own dial (a heartbeat's dial to a node that was not up yet times out and
                // is dropped; its first packets still arrive once this node listens): nothing is wrong here.
                Err(quinn::ConnectionError::ConnectionClosed(c))
                    if c.error_code == quinn::TransportErrorCode::APPLICATION_ERROR =>
                {
                    tracing::debug!(%from, "a peer abandoned a connection attempt during the handshake")
                }
                // A peer without a certificate from the cluster CA ends here.
                Err(e) => tracing::warn!(%from, error = %e, "refused a connection"),
            }
        });
    }
}

fn close(conn: &quinn::Connection, code: CloseCode, why: &ProtocolError) {
    quic_close(conn, code, &why.to_string());
}

/// Serves one peer: its `Hello` first, then one request per bidirectional stream.
async fn serve_connection(agent: Agent, conn: quinn::Connection) {
    let Some(name) = quic::peer_name(&conn) else {
        return close(&conn, CloseCode::UnknownPeer, &ProtocolError::NoNodeName);
    };
    let Some(node) = agent.find_peer(&name).await else {
        let cluster = agent.shared.cluster.clone();
        return close(&conn, CloseCode::UnknownPeer, &ProtocolError::UnknownNode { name, cluster });
    };
    // A node that belongs to a tenant (its certificate and the configuration agree) acts for that tenant only,
    // whatever its requests say.
    let listed = match agent.peer(node) {
        Ok(p) => p.lock().await.tenant,
        Err(_) => None,
    };
    let bound = match quic::peer_tenant(&conn) {
        Some(cert) if listed.is_none() || cert == listed => cert.or(listed).map(TenantId),
        _ => return close(&conn, CloseCode::UnknownPeer, &ProtocolError::BadTenant { name, listed }),
    };
    let Ok((mut send, mut recv)) = conn.accept_bi().await else { return };
    if let Err(why) = greet(&agent, &name, node, &mut send, &mut recv).await {
        return close(&conn, CloseCode::Protocol, &why);
    }
    tracing::debug!(peer = %name, node, "peer connected");
    while let Ok((send, recv)) = conn.accept_bi().await {
        let (a, c) = (agent.clone(), conn.clone());
        tokio::spawn(async move {
            if let Err(why) = serve_stream(&a, (node, c.stable_id()), bound, send, recv).await {
                close(&c, CloseCode::Protocol, &why);
            }
        });
    }
    // The leases granted over this connection end with it (the peer releases each over the connection it came
    // by; its other lanes' connections keep theirs).
    let gone: Vec<RemoteGrant> = {
        let mut grants = agent.grants();
        let id = conn.stable_id();
        let ids: Vec<u64> = grants.iter().filter(|(_, g)| g.connection == id).map(|(k, _)| *k).collect();
        ids.into_iter().filter_map(|k| grants.remove(&k)).collect()
    };
    // Those a channel still sends from, once the send ends.
    let mut leases: Vec<Lease> = Vec::with_capacity(gone.len());
    for g in gone {
        leases.push(g.sent().await);
    }
    let gone = leases;
    if !gone.is_empty() {
        tracing::warn!(peer = %name, leases = gone.len(), "connection closed: releasing the leases it held");
        let _ = in_place(|| gone.into_iter().try_for_each(|l| agent.shared.fabric.release(l)));
    }
}

/// Takes the peer's `Hello` and welcomes it, or says why not (the reason the connection closes with).
async fn greet(
    agent: &Agent,
    name: &str,
    node: u16,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Result<(), ProtocolError> {
    let (s, max) = (&agent.shared, agent.max_frame());
    match read_frame(recv, max).await {
        Ok(Some(Message::Hello { cluster, node: n, protocol, lanes, latency_lane }))
            if cluster == s.cluster
                && n == node
                && protocol == PROTOCOL_VERSION
                && (lanes, latency_lane) == (s.net.lanes, s.net.latency_lane) =>
        {
            finish_with(send, &Message::Welcome { node: s.node, protocol: PROTOCOL_VERSION }, max).await;
            Ok(())
        }
        Ok(Some(Message::Hello { cluster, node: n, protocol, lanes, latency_lane })) => {
            Err(ProtocolError::HelloMismatch {
                name: name.to_string(),
                cluster,
                node: n,
                protocol,
                lanes,
                latency_lane,
                want_cluster: s.cluster.clone(),
                want_node: node,
                want_protocol: PROTOCOL_VERSION,
                want_lanes: s.net.lanes,
                want_latency_lane: s.net.latency_lane,
            })
        }
        Ok(Some(other)) => Err(ProtocolError::NotHello(other.name())),
        Ok(None) => Err(ProtocolError::NoHello),
        Err(e) => Err(ProtocolError::Codec(e)),
    }
}

/// Answers one request of a peer that belongs to tenant `bound`, if any. `Err` carries a protocol violation:
/// the caller closes the connection with it.
async fn serve_stream(
    agent: &Agent,
    (peer, connection): (u16, usize),
    bound: Option<TenantId>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), ProtocolError> {
    let mut msg = match read_frame(&mut recv, agent.max_frame()).await {
        Ok(Some(m)) => m,
        Ok(None) => return Ok(()),
        Err(e) => return Err(ProtocolError::Codec(e)),
    };
    // Ahead of the request, its id (`Traced`) and, for a request made for a tenant, `OnBehalf` (answered
    // acting for it): each at most once.
    let (mut tenant, mut id) = (None, None);
    loop {
        match msg {
            Message::OnBehalf { tenant: t } if tenant.is_none() => tenant = Some(TenantId(t)),
            Message::Traced { id: i } if id.is_none() => id = Some(i),
            _ => break,
        }
        msg = match read_frame(&mut recv, agent.max_frame()).await {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(e) => return Err(ProtocolError::Codec(e)),
        };
    }
    if !msg.is_request() || matches!(msg, Message::Hello { .. } | Message::OnBehalf { .. } | Message::Traced { .. }) {
        return Err(ProtocolError::NotServed(msg.name()));
    }
    agent.heard_from(peer).await;
    let span =
        tracing::debug_span!("served", id = %format_args!("{:016x}", id.unwrap_or(0)), peer, request = msg.name());
    // A tenant's node acts for its tenant: for no other, and never for the operator.
    if let Some(b) = bound {
        if tenant.is_some_and(|t| t != b) {
            let why = FabricError::PermissionDenied(format!(
                "node {peer} belongs to tenant {}: it cannot act for tenant {}",
                b.0,
                tenant.map_or(0, |t| t.0)
            ));
            finish_with(&mut send, &refusal(&why), agent.max_frame()).await;
            return Ok(());
        }
        tenant = Some(b);
    }
    let served = async {
        tracing::debug!("serving");
        serve_request(agent, (peer, connection, id), msg, send, recv).await
    };
    acting::acting_for(tenant, served).instrument(span).await
}

/// Answers request `msg`, on the lane's thread when it moves little.
async fn serve_request(
    agent: &Agent,
    (peer, connection, request): (u16, usize, Option<u64>),
    msg: Message,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
) -> Result<(), ProtocolError> {
    if pages_moved(agent, peer, &msg) < BULK {
        return answer(agent, (peer, connection, request), msg, send, recv).await;
    }
    // A bulk transfer, which peers send on the bulk lanes; one that arrives on the latency lane anyway (a peer's
    // choice: ours never send one there) is answered off that lane's thread, which keeps decrypting its packets.
    let a = agent.clone();
    let work = async move { Ok(answer(&a, (peer, connection, request), msg, send, recv).await) };
    agent.off_lanes(work).await.unwrap_or_else(|e| {
        // The runtime that started the agent is going away: so is the agent, and the stream with it.
        tracing::debug!(error = %e, "a bulk request ended unanswered");
        Ok(())
    })
}

/// The bytes of pages that request `msg` of `peer` moves, either way.
fn pages_moved(agent: &Agent, peer: u16, msg: &Message) -> u64 {
    match msg {
        Message::Write { len, .. } | Message::Read { len, .. } | Message::Replicate { len, .. } => *len,
        // An acquire moves whole pages.
        Message::Acquire { region, offset, len, .. } => pages_of(region.page_size, *offset, *len),
        // Its pages cross a channel while a thread waits: never on the latency lane's thread, however few.
        Message::AcquireBy { .. } => u64::MAX,
        // A write lease's pages come back with its release.
        Message::Release { lease } => agent
            .grants()
            .get(lease)
            .filter(|g| g.peer == peer && g.lease.mode() == Mode::Write)
            .map_or(0, |g| g.lease.len()),
        _ => 0,
    }
}

/// Answers request `msg`, read from `recv`; the answer goes to `send`. `Err` as for [`serve_stream`].
async fn answer(
    agent: &Agent,
    (peer, connection, request): (u16, usize, Option<u64>),
    msg: Message,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), ProtocolError> {
    if let Some(Err(refused)) = operator_call(&msg).map(acting::operator_only) {
        finish_with(&mut send, &refusal(&refused), agent.max_frame()).await;
        return Ok(());
    }
    let reply = match msg {
        Message::Ping { nonce } => Ok(Message::Pong { nonce }),
        Message::Alloc { size, device, replicas, lag_ms, compression, priority } => {
            match Kept::from_wire(device.map(Into::into), compression, priority) {
                Ok(k) => agent
                    .alloc_at_home(size, k, Replication { replicas, lag: lag_ms.map(millis) })
                    .await
                    .map(|r| Message::Allocated { region: WireRegion::from(&r) }),
                Err(e) => Err(e),
            }
        }
        Message::Free { region } => match home_region(agent, &region) {
            Ok(r) => agent.free_at_home(&r).await.map(|()| Message::Done),
            Err(e) => Err(e),
        },
        Message::Write { region, offset, len } => receive_write(agent, &region, offset, len, &mut recv).await,
        Message::Read { region, offset, len } => return send_read(agent, &region, offset, len, &mut send).await,
        Message::Acquire { region, offset, len, device: _, mode, cached } => {
            return grant(agent, (peer, connection, request), (&region, offset, len, mode, cached), &mut send).await;
        }
        Message::AcquireBy { link, region, offset, len, mode, cached, runs } => {
            let ask = AcquireBy { link, region: &region, offset, len, mode, cached, runs: &runs };
            return grant_by_channel(agent, (peer, connection, request), ask, &mut send).await;
        }
        Message::ChannelJoin { link, id, gpu } => agent.join_peer_channel(peer, (link, gpu), &id).await,
        Message::Release { lease } => take_back(agent, peer, lease, &mut recv).await,
        Message::Abandon { request } => {
            abandon(agent, peer, request);
            Ok(Message::Done)
        }
        // Migrations copy whole regions: off the lane's thread, which keeps serving meanwhile.
        Message::Migrate { region, device } => {
            migrate(agent, &region, None, device.into()).await.map(|_| Message::Done)
        }
        Message::MigrateTo { region, node, device } => migrate(agent, &region, Some(node), device.into())
            .await
            .map(|to| Message::Moved { to: WireRegion::from(&to) }),
        Message::Unforward { region, to } => match home_region(agent, &region) {
            Ok(r) => {
                agent.shared.moves.unforward(&r, &Region::from(&to)).await;
                Ok(Message::Done)
            }
            Err(e) => Err(e),
        },
        Message::Standby { region, origin, replicas, tenant, compression, priority } => {
            match Kept::from_wire(Some(Location::Host), compression, priority) {
                Ok(k) => agent.keep_standby(peer, (&region, &origin), replicas, (tenant, k)).await,
                Err(e) => Err(e),
            }
        }
        Message::Replicate { copy, seq, offset, len } => {
            agent.take_replica(peer, (&copy, seq, offset, len), &mut recv).await
        }
        // A peer's status for an operator (`vfabric status --node`), off the lane's thread (it pings the peers):
        // this node's only, never relayed further.
        Message::Status { node } => match node {
            Some(n) if !agent.is_me(n) => Err(FabricError::PermissionDenied(format!(
                "node {peer} asked this node for node {n}'s status: a node answers for itself only"
            ))),
            _ => {
                let a = agent.clone();
                agent.off_lanes(async move { a.status_json(None).await }).await.map(|json| Message::Figures { json })
            }
        },
        // Answered with where the region lives now.
        Message::Failover { region } => match agent.take_over(&Region::from(&region), peer).await {
            Ok(to) => Err(FabricError::Moved { to }),
            Err(e) => Err(e),
        },
        other => Err(ProtocolError::NotServed(other.name()).into()),
    };
    let answer = match reply {
        Ok(m) => m,
        Err(FabricError::Protocol(why)) => return Err(why),
        Err(e) => refusal(&e),
    };
    finish_with(&mut send, &answer, agent.max_frame()).await;
    Ok(())
}

/// Moves a region of this node to `device` of `node` (this node when `None`), off the lane's thread.
async fn migrate(
    agent: &Agent,
    region: &WireRegion,
    node: Option<u16>,
    device: vfabric_allocator::Location,
) -> Result<Region, FabricError> {
    let r = home_region(agent, region)?;
    let (a, node) = (agent.clone(), node.unwrap_or(agent.node()));
    agent.off_lanes(async move { a.migrate_at_home(&r, node, device).await }).await
}

/// The operator's calls, which a tenant's may not make: what each is.
fn operator_call(msg: &Message) -> Option<&'static str> {
    match msg {
        Message::Migrate { .. } | Message::MigrateTo { .. } | Message::Unforward { .. } => Some("a migration"),
        Message::Standby { .. } | Message::Replicate { .. } | Message::Failover { .. } => Some("replication"),
        Message::Status { .. } => Some("the node's status"),
        _ => None,
    }
}

/// `ms` milliseconds.
fn millis(ms: u32) -> std::time::Duration {
    std::time::Duration::from_millis(u64::from(ms))
}
