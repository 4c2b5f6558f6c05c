//! The serving half of the agent: accepts peers' connections, checks who they are, and answers their requests
//! on the regions whose home is this node.

use std::sync::Arc;
use std::time::Instant;

use vfabric_transport::quic;

use super::wire::{chunk_error, error_kind};
use super::{in_place, pages_of, Agent, RemoteGrant, Shared, BULK};
use crate::directory::{Mode, Placement};
use crate::error::FabricError;
use crate::fabric::{Lease, Region};
use crate::proto::{read_frame, write_frame, ErrorKind, Message, WireMode, WireRegion, PROTOCOL_VERSION};
use vfabric_transport::Location;

/// Why a connection is closed (the code the peer sees; the reason goes with it and into our log).
const CLOSE_PROTOCOL: u32 = 1;
const CLOSE_UNKNOWN_PEER: u32 = 2;

/// Accepts connections on lane `lane`'s endpoint until it closes.
pub(super) async fn accept_loop(shared: Arc<Shared>, lane: usize) {
    let Some(endpoint) = shared.endpoints.get(lane).cloned() else { return };
    while let Some(incoming) = endpoint.accept().await {
        let s = Arc::clone(&shared);
        tokio::spawn(async move {
            let from = incoming.remote_address();
            match incoming.await {
                Ok(conn) => serve_connection(s, conn).await,
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

fn close(conn: &quinn::Connection, code: u32, reason: &str) {
    tracing::warn!(peer = %conn.remote_address(), reason, "closing a connection");
    conn.close(quinn::VarInt::from_u32(code), reason.as_bytes());
}

/// Serves one peer: its `Hello` first, then one request per bidirectional stream.
async fn serve_connection(shared: Arc<Shared>, conn: quinn::Connection) {
    let max = shared.net.max_frame.bytes() as usize;
    let Some(name) = quic::peer_name(&conn) else {
        return close(&conn, CLOSE_UNKNOWN_PEER, "no node name in the peer's certificate");
    };
    let Some(node) = find_peer(&shared, &name).await else {
        return close(&conn, CLOSE_UNKNOWN_PEER, &format!("`{name}` is not a node of cluster {}", shared.cluster));
    };
    let Ok((mut send, mut recv)) = conn.accept_bi().await else { return };
    match read_frame(&mut recv, max).await {
        Ok(Some(Message::Hello { cluster, node: n, protocol, lanes, latency_lane }))
            if cluster == shared.cluster
                && n == node
                && protocol == PROTOCOL_VERSION
                && (lanes, latency_lane) == (shared.net.lanes, shared.net.latency_lane) =>
        {
            let welcome = Message::Welcome { node: shared.node, protocol: PROTOCOL_VERSION };
            if write_frame(&mut send, &welcome, max).await.is_err() || send.finish().is_err() {
                return;
            }
        }
        Ok(Some(Message::Hello { cluster, node: n, protocol, lanes, latency_lane })) => {
            let why = format!(
                "hello from `{name}` claims cluster `{cluster}` node {n} protocol {protocol}, {lanes} lanes, latency \
                 lane {latency_lane}; expected `{}` node {node} protocol {PROTOCOL_VERSION}, {} lanes, latency lane {} \
                 (network.lanes and network.latency_lane must be the same on every node)",
                shared.cluster, shared.net.lanes, shared.net.latency_lane
            );
            return close(&conn, CLOSE_PROTOCOL, &why);
        }
        Ok(Some(other)) => {
            return close(&conn, CLOSE_PROTOCOL, &format!("first message `{}`, not hello", other.name()))
        }
        Ok(None) => return close(&conn, CLOSE_PROTOCOL, "stream ended before hello"),
        Err(e) => return close(&conn, CLOSE_PROTOCOL, &format!("bad hello: {e}")),
    }
    tracing::debug!(peer = %name, node, "peer connected");
    while let Ok((send, recv)) = conn.accept_bi().await {
        let (s, c) = (Arc::clone(&shared), conn.clone());
        tokio::spawn(async move {
            if let Err(why) = serve_stream(&s, (node, c.stable_id()), send, recv).await {
                close(&c, CLOSE_PROTOCOL, &why);
            }
        });
    }
    // The leases granted over this connection end with it (the peer releases each over the connection it came
    // by; its other lanes' connections keep theirs).
    let gone: Vec<Lease> = {
        let mut leases = shared.remote_leases.lock().unwrap_or_else(|p| p.into_inner());
        let id = conn.stable_id();
        let ids: Vec<u64> = leases.iter().filter(|(_, g)| g.connection == id).map(|(k, _)| *k).collect();
        ids.into_iter().filter_map(|k| leases.remove(&k)).map(|g| g.lease).collect()
    };
    if !gone.is_empty() {
        tracing::warn!(peer = %name, leases = gone.len(), "connection closed: releasing the leases it held");
        let _ = in_place(|| gone.into_iter().try_for_each(|l| shared.fabric.release(l)));
    }
}

async fn find_peer(shared: &Shared, name: &str) -> Option<u16> {
    for (i, p) in shared.peers.iter().enumerate() {
        let mut p = p.lock().await;
        if p.name == name {
            p.last_seen = Some(Instant::now());
            return Some(i as u16);
        }
    }
    None
}

/// Answers one request. `Err` carries a protocol violation: the caller closes the connection with it.
async fn serve_stream(
    shared: &Arc<Shared>,
    (peer, connection): (u16, usize),
    send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), String> {
    let max = shared.net.max_frame.bytes() as usize;
    let msg = match read_frame(&mut recv, max).await {
        Ok(Some(m)) => m,
        Ok(None) => return Ok(()),
        Err(e) => return Err(format!("bad request frame: {e}")),
    };
    if !msg.is_request() || matches!(msg, Message::Hello { .. }) {
        return Err(format!("unexpected `{}` as a request", msg.name()));
    }
    if let Ok(p) = shared.peers.get(usize::from(peer)).ok_or(()) {
        p.lock().await.last_seen = Some(Instant::now());
    }
    if pages_moved(shared, peer, &msg) < BULK {
        return answer(shared, (peer, connection), msg, send, recv).await;
    }
    // A bulk transfer, which peers send on the bulk lanes; one that arrives on the latency lane anyway (a peer's
    // choice: ours never send one there) is answered off that lane's thread, which keeps decrypting its packets.
    let answered = as_agent(shared)
        .off_lanes(move |a| async move { Ok(answer(&a.shared, (peer, connection), msg, send, recv).await) })
        .await;
    answered.unwrap_or_else(|e| {
        // The runtime that started the agent is going away: so is the agent, and the stream with it.
        tracing::debug!(error = %e, "a bulk request ended unanswered");
        Ok(())
    })
}

/// The bytes of pages that request `msg` of `peer` moves, either way.
fn pages_moved(shared: &Shared, peer: u16, msg: &Message) -> u64 {
    match msg {
        Message::Write { len, .. } | Message::Read { len, .. } => *len,
        // An acquire moves whole pages.
        Message::Acquire { region, offset, len, .. } => pages_of(region.page_size, *offset, *len),
        // A write lease's pages come back with its release.
        Message::Release { lease } => shared
            .remote_leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(lease)
            .filter(|g| g.peer == peer && g.lease.mode() == Mode::Write)
            .map_or(0, |g| g.lease.len()),
        _ => 0,
    }
}

/// Answers request `msg`, read from `recv`; the answer goes to `send`. `Err` as for [`serve_stream`].
async fn answer(
    shared: &Arc<Shared>,
    (peer, connection): (u16, usize),
    msg: Message,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), String> {
    let max = shared.net.max_frame.bytes() as usize;
    let chunk = shared.net.chunk.bytes();
    let reply = match msg {
        Message::Ping { nonce } => Ok(Message::Pong { nonce }),
        Message::Alloc { size, device } => {
            let placement = device.map(|d| Placement::on(d.into())).unwrap_or_default();
            in_place(|| shared.fabric.alloc(size, placement))
                .map(|r| Message::Allocated { region: WireRegion::from(&r) })
        }
        Message::Free { region } => match home_region(shared, &region) {
            Ok(r) => as_agent(shared).free_at_home(&r).await.map(|()| Message::Done),
            Err(e) => Err(e),
        },
        Message::Write { region, offset, len } => receive_write(shared, &region, offset, len, &mut recv, chunk).await,
        Message::Read { region, offset, len } => {
            return send_read(shared, &region, offset, len, &mut send, chunk).await;
        }
        Message::Acquire { region, offset, len, device: _, mode, cached } => {
            return grant(shared, (peer, connection), (&region, offset, len, mode, cached), &mut send, chunk).await;
        }
        Message::Release { lease } => take_back(shared, peer, lease, &mut recv, chunk).await,
        // Migrations copy whole regions: off the lane's thread, which keeps serving meanwhile.
        Message::Migrate { region, device } => match home_region(shared, &region) {
            Ok(r) => as_agent(shared)
                .off_lanes(move |a| async move { a.migrate_at_home(&r, a.node(), device.into()).await })
                .await
                .map(|_| Message::Done),
            Err(e) => Err(e),
        },
        Message::MigrateTo { region, node, device } => match home_region(shared, &region) {
            Ok(r) => as_agent(shared)
                .off_lanes(move |a| async move { a.migrate_at_home(&r, node, device.into()).await })
                .await
                .map(|to| Message::Moved { to: WireRegion::from(&to) }),
            Err(e) => Err(e),
        },
        Message::Unforward { region, to } => match home_region(shared, &region) {
            Ok(r) => {
                shared.moves.unforward(&r, &Region::from(&to)).await;
                Ok(Message::Done)
            }
            Err(e) => Err(e),
        },
        other => Err(FabricError::Protocol(format!("`{}` is not served yet", other.name()))),
    };
    let answer = match reply {
        Ok(m) => m,
        Err(FabricError::Protocol(why)) => return Err(why),
        Err(e) => refusal(&e),
    };
    // The requester may have gone; nothing to do about it here.
    let _ = write_frame(&mut send, &answer, max).await;
    let _ = send.finish();
    Ok(())
}

/// Leases a range for a peer: the home's host copy is leased in the same mode (so coherence with everyone
/// else here follows the usual lease rules), then `Granted` and the pages go back.
/// The requester's copy, when it has one at the version it names, is current while the version is unchanged:
/// then no pages are sent (the lease still is: it keeps writers out while the requester uses its copy).
async fn grant(
    shared: &Shared,
    (peer, connection): (u16, usize),
    (region, offset, len, mode, cached): (&WireRegion, u64, u64, WireMode, Option<u64>),
    send: &mut quinn::SendStream,
    chunk: u64,
) -> Result<(), String> {
    let max = shared.net.max_frame.bytes() as usize;
    let refuse = async |send: &mut quinn::SendStream, e: FabricError| {
        let _ = write_frame(send, &refusal(&e), max).await;
        let _ = send.finish();
    };
    // Once leased, the region cannot move (a migration frees the old copy, which a lease prevents).
    let leased = staying_here(shared, region).await.and_then(|(r, _staying)| {
        let end = offset.checked_add(len).ok_or(FabricError::OutOfBounds { offset, len, region_len: r.len })?;
        in_place(|| shared.fabric.acquire(&r, offset..end, Location::Host, Mode::from(mode)))
    });
    let lease = match leased {
        Ok(l) => l,
        Err(e) => {
            refuse(send, e).await;
            return Ok(());
        }
    };
    let ps = shared.fabric.page_size();
    let first_page = lease.offset() / ps;
    let frames = lease.frames().to_vec();
    let r = Region::from(region);
    let version = match shared.fabric.version(&r, lease.offset()..lease.offset() + lease.len()) {
        Ok(v) => v,
        Err(e) => {
            drop(lease);
            refuse(send, e).await;
            return Ok(());
        }
    };
    let unchanged = cached == Some(version);
    let host = match shared.fabric.arena(Location::Host) {
        Ok(a) => a,
        Err(e) => {
            refuse(send, e).await;
            return Ok(());
        }
    };
    let id = shared.next_remote_lease.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    shared.remote_leases.lock().unwrap_or_else(|p| p.into_inner()).insert(id, RemoteGrant { peer, connection, lease });
    let granted = Message::Granted { lease: id, first_page, pages: frames.len() as u64, version, unchanged };
    if write_frame(send, &granted, max).await.is_err() || unchanged {
        let _ = send.finish();
        return Ok(());
    }
    // The pages, straight from the leased host frames (a write lease here makes `Fabric::read` refuse), each
    // piece read into a pooled buffer that quinn then sends without another copy.
    let piece_len = ps.min(chunk.max(1));
    for (i, &f) in frames.iter().enumerate() {
        let mut at = 0;
        while at < ps {
            let mut piece = shared.buffers.take(piece_len.min(ps - at) as usize);
            if host.read(u64::from(f) * ps + at, piece.as_mut()).is_err() {
                let _ = send.reset(quinn::VarInt::from_u32(ErrorKind::Internal as u32));
                return Ok(());
            }
            let n = piece.as_ref().len() as u64;
            if quic::write_chunk(send, (first_page + i as u64) * ps + at, piece.into_bytes()).await.is_err() {
                return Ok(());
            }
            at += n;
        }
    }
    let _ = send.finish();
    Ok(())
}

/// Ends a peer's lease; a write lease's pages come first (chunk offsets count from the lease's first byte)
/// and go into the leased host frames before the lease is let go.
async fn take_back(
    shared: &Shared,
    peer: u16,
    id: u64,
    recv: &mut quinn::RecvStream,
    max_chunk: u64,
) -> Result<Message, FabricError> {
    let held = {
        let mut leases = shared.remote_leases.lock().unwrap_or_else(|p| p.into_inner());
        match leases.get(&id) {
            Some(g) if g.peer == peer => leases.remove(&id).map(|g| g.lease),
            _ => None,
        }
    };
    let lease = held.ok_or(FabricError::UnknownLease(id))?;
    let ps = shared.fabric.page_size();
    let host = shared.fabric.arena(Location::Host)?;
    // All of a write-back arrives (each chunk verified) before any of it is written: a release that fails
    // midway leaves the pages as they were before the lease.
    // Each chunk is read straight into its place in `data`.
    let mut data = vec![0u8; if lease.mode() == Mode::Write { lease.len() as usize } else { 0 }];
    let mut got = 0u64;
    let mut failed = None;
    let chunk_failed = |e| chunk_error(e, "");
    loop {
        let header = match quic::read_chunk_header(recv).await {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                failed = Some(chunk_failed(e));
                break;
            }
        };
        let (at, len) = (header.offset, u64::from(header.len));
        let Some(end) = at.checked_add(len).filter(|&e| e <= data.len() as u64 && len <= max_chunk) else {
            failed = Some(FabricError::Protocol(format!("release of lease {id} brought {len} bytes at +{at:#x}")));
            break;
        };
        if let Err(e) = quic::read_chunk_payload(recv, &header, &mut data[at as usize..end as usize]).await {
            failed = Some(chunk_failed(e));
            break;
        }
        got += len;
    }
    if failed.is_none() && got != data.len() as u64 {
        failed = Some(FabricError::Protocol(format!("release of lease {id} brought {got} of {} bytes", data.len())));
    }
    if failed.is_none() && lease.mode() == Mode::Write {
        for (page, &frame) in lease.frames().iter().enumerate() {
            // `data` is exactly the lease's pages (checked above), so each page is there.
            if let Some(bytes) = data.get(page * ps as usize..(page + 1) * ps as usize) {
                host.write(u64::from(frame) * ps, bytes)?;
            }
        }
    }
    // The lease ends either way.
    in_place(|| shared.fabric.release(lease))?;
    match failed {
        Some(FabricError::Protocol(why)) => Err(FabricError::Protocol(why)),
        Some(e) => Err(e),
        None => Ok(Message::Done),
    }
}

/// A region named by a peer, which must live here.
fn home_region(shared: &Shared, w: &WireRegion) -> Result<Region, FabricError> {
    let r = Region::from(w);
    if r.addr.node().0 != shared.node {
        return Err(FabricError::InvalidAddress(format!("{r} does not live on node {}", shared.node)));
    }
    Ok(r)
}

/// A region named by a peer, which must live here and have its pages here; with the guard that keeps them here
/// while the request runs (a region whose pages moved gives `Moved`).
async fn staying_here(
    shared: &Shared,
    w: &WireRegion,
) -> Result<(Region, tokio::sync::OwnedRwLockReadGuard<Option<Region>>), FabricError> {
    let r = home_region(shared, w)?;
    Ok((r, shared.moves.staying(&r).await?))
}

/// The agent serving these requests, for the calls that reach other nodes themselves (a migration, a free).
fn as_agent(shared: &Arc<Shared>) -> Agent {
    Agent { shared: Arc::clone(shared) }
}

/// The answer to a request that failed: `Moved` for a region whose pages are elsewhere, else the error.
fn refusal(e: &FabricError) -> Message {
    match e {
        FabricError::Moved { to } => Message::Moved { to: WireRegion::from(to) },
        e => Message::Error { kind: error_kind(e), message: e.to_string() },
    }
}

/// Takes a write's chunks off the stream, checks each one's checksum and place, and writes them. A bad chunk
/// fails the call before anything of it is written (the chunks before it are).
async fn receive_write(
    shared: &Shared,
    region: &WireRegion,
    offset: u64,
    len: u64,
    recv: &mut quinn::RecvStream,
    max_chunk: u64,
) -> Result<Message, FabricError> {
    let (r, _staying) = staying_here(shared, region).await?;
    let end = offset.checked_add(len).filter(|&e| e <= r.len).ok_or(FabricError::OutOfBounds {
        offset,
        len,
        region_len: r.len,
    })?;
    let mut got = 0u64;
    let mut parts = Vec::new();
    let network = |e: quic::QuicError| FabricError::Network(e.to_string());
    while let Some(header) = quic::read_chunk_header(recv).await.map_err(network)? {
        // Chunk offsets count from the start of the write.
        let chunk_len = u64::from(header.len);
        let start = offset
            .checked_add(header.offset)
            .filter(|s| chunk_len <= max_chunk && s.checked_add(chunk_len).is_some_and(|e| e <= end));
        let Some(start) = start else {
            return Err(FabricError::Protocol(format!(
                "a write chunk of {chunk_len} bytes at +{:#x} runs past the write's {len} bytes (or above {max_chunk})",
                header.offset
            )));
        };
        // The payload stays in quinn's receive buffers until its checksum is known good; then each piece is
        // copied once, to its place.
        match quic::read_chunk_parts(recv, &header, &mut parts).await {
            Ok(()) => {}
            Err(quic::QuicError::Checksum { offset: o, expected, found }) => {
                return Err(FabricError::Checksum(format!(
                    "chunk at {o:#x}: checksum {found:#x}, expected {expected:#x}; nothing of it was written"
                )))
            }
            Err(e) => return Err(network(e)),
        }
        got += chunk_len;
        let pieces: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        // In place on this worker: no thread hop.
        in_place(|| shared.fabric.write_parts(&r, start, &pieces))?;
    }
    if got != len {
        return Err(FabricError::Protocol(format!("a write of {len} bytes brought {got}")));
    }
    Ok(Message::Done)
}

/// Answers a read: `Data` then the bytes in checksummed chunks (chunk offsets count from the region's start).
async fn send_read(
    shared: &Shared,
    region: &WireRegion,
    offset: u64,
    len: u64,
    send: &mut quinn::SendStream,
    chunk: u64,
) -> Result<(), String> {
    let max = shared.net.max_frame.bytes() as usize;
    let checked = staying_here(shared, region).await.and_then(|(r, staying)| {
        match offset.checked_add(len).filter(|&e| e <= r.len && len > 0) {
            Some(_) => Ok((r, staying)),
            None => Err(FabricError::OutOfBounds { offset, len, region_len: r.len }),
        }
    });
    let (r, _staying) = match checked {
        Ok(found) => found,
        Err(e) => {
            let _ = write_frame(send, &refusal(&e), max).await;
            let _ = send.finish();
            return Ok(());
        }
    };
    // Read the first piece before answering, so that a refused read gets an error, not a truncated stream.
    // Each piece is read into a pooled buffer that quinn then sends without another copy.
    let mut at = offset;
    let mut first = true;
    while at < offset + len {
        let n = chunk.min(offset + len - at);
        let mut piece = shared.buffers.take(n as usize);
        let read = in_place(|| shared.fabric.read(&r, at, piece.as_mut()));
        match read {
            Ok(()) => {}
            Err(e) if first => {
                let _ = write_frame(send, &refusal(&e), max).await;
                let _ = send.finish();
                return Ok(());
            }
            Err(e) => {
                // Mid-stream: the requester sees a reset stream and a short read.
                tracing::warn!(error = %e, "a read failed midway");
                let _ = send.reset(quinn::VarInt::from_u32(ErrorKind::Internal as u32));
                return Ok(());
            }
        };
        if first {
            if write_frame(send, &Message::Data { len }, max).await.is_err() {
                return Ok(());
            }
            first = false;
        }
        if quic::write_chunk(send, at, piece.into_bytes()).await.is_err() {
            return Ok(());
        }
        at += n;
    }
    let _ = send.finish();
    Ok(())
}
