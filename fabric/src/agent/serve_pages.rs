//! The requests that move pages, as the home serves them: writes and releases bring chunks in (each verified
//! before a byte of it is written), reads and grants send them out (from pooled buffers quinn sends without
//! another copy).

use super::shared::{in_place, Agent, RemoteGrant};
use crate::directory::{Mode, RegionHandle as Region};
use crate::error::{FabricError, ProtocolError};
use crate::fabric::Lease;
use crate::proto::chunk::{copy_pieces, receive, Payload};
use crate::proto::codec::write_frame;
use crate::proto::convert::refusal;
use crate::proto::message::{Message, WireMode, WireRegion};
use crate::proto::quic::{abort, answer, send_chunk, QuicChunks};

/// A region named by a peer, which must live here.
pub(crate) fn home_region(agent: &Agent, w: &WireRegion) -> Result<Region, FabricError> {
    let r = Region::from(w);
    if !agent.is_me(r.addr.node().0) {
        return Err(FabricError::InvalidAddress(format!("{r} does not live on node {}", agent.node())));
    }
    Ok(r)
}

/// A region named by a peer, which must live here and have its pages here; with the guard that keeps them here
/// while the request runs (a region whose pages moved gives `Moved`), and the range's end, checked.
async fn staying_here(
    agent: &Agent,
    w: &WireRegion,
    offset: u64,
    len: u64,
) -> Result<(Region, tokio::sync::OwnedRwLockReadGuard<Option<Region>>, u64), FabricError> {
    let r = home_region(agent, w)?;
    let guard = agent.staying(&r).await?;
    let end = offset.checked_add(len).filter(|&e| e <= r.len);
    let end = end.ok_or(FabricError::OutOfBounds { offset, len, region_len: r.len })?;
    Ok((r, guard, end))
}

/// Leases a range for a peer: the home's copy is leased in the same mode on `Fabric::serving_device` (host
/// memory; a lossy region's home GPU, which expands its pages), so coherence with everyone else here follows
/// the usual lease rules, then `Granted` and the pages go back. The requester's copy, when
/// it has one at the version it names, is current while the version is unchanged: then no pages are sent (the
/// lease still is: it keeps writers out while the requester uses its copy).
pub(crate) async fn grant(
    agent: &Agent,
    (peer, connection, request): (u16, usize, Option<u64>),
    (region, offset, len, mode, cached): (&WireRegion, u64, u64, WireMode, Option<u64>),
    send: &mut quinn::SendStream,
) -> Result<(), ProtocolError> {
    let (f, max) = (&agent.shared.fabric, agent.max_frame());
    let (version, lease) = match lease_for_peer(agent, (region, offset, len, mode), |r| f.serving_device(r)).await {
        Ok(v) => v,
        Err(e) => {
            answer(send, &refusal(&e), max).await;
            return Ok(());
        }
    };
    let ps = f.page_size();
    let pages = lease.len() / ps;
    let first_page = lease.offset() / ps;
    let packs = agent.packs_pages_of(&lease.region());
    let unchanged = cached == Some(version);
    let id = agent.shared.next_grant.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let granted = Message::Granted { lease: id, first_page, pages, version, unchanged };
    // The pages, straight from the leased frames, each piece read into a pooled buffer that quinn then sends
    // without another copy; chunk offsets count from the region's start.
    let piece_len = ps.min(agent.shared.net.chunk.bytes().max(1));
    let (start, total, pages_of_lease) = (lease.offset(), lease.len(), lease.pages());
    // Recorded before the answer goes: the peer may release the lease as soon as its pages are in.
    if !record_grant(agent, (peer, connection, request), id, (lease, None)) {
        abort(send);
        return Ok(());
    }
    let sent = async {
        write_frame(send, &granted, max).await.map_err(|_| ())?;
        let mut at = 0;
        while at < total && !unchanged {
            let mut piece = agent.shared.buffers.take(piece_len.min(total - at) as usize);
            // A copy from a GPU (a lossy region's lease) blocks: off the runtime's worker, as every fabric call.
            if in_place(|| pages_of_lease.read(at, piece.as_mut())).is_err() {
                abort(send);
                return Err(());
            }
            let n = piece.as_ref().len() as u64;
            send_chunk(send, start + at, piece.into_bytes(), packs).await.map_err(|_| ())?;
            at += n;
        }
        Ok(())
    };
    if sent.await.is_ok() {
        let _ = send.finish();
    } else {
        // The caller's call failed (or was dropped) before the pages were in: it holds no lease, and this one
        // ends now instead of when the connection closes (it would keep the home's writers out until then).
        let_go(agent, id);
    }
    Ok(())
}

/// Records `lease` as grant `id` of `peer`'s request, unless the peer abandoned the request already: then the
/// lease ends now, and `false` says that the answer goes to no one.
pub(crate) fn record_grant(
    agent: &Agent,
    (peer, connection, request): (u16, usize, Option<u64>),
    id: u64,
    (lease, sending): (Lease, Option<std::sync::Arc<tokio::sync::Mutex<()>>>),
) -> bool {
    let abandoned = {
        let mut grants = agent.grants();
        let mut gone = agent.shared.abandoned.lock().unwrap_or_else(|p| p.into_inner());
        match gone.iter().position(|&(p, r)| p == peer && Some(r) == request) {
            Some(at) => {
                gone.remove(at);
                Some(lease)
            }
            None => {
                grants.insert(id, RemoteGrant { peer, connection, request, lease, sending });
                None
            }
        }
    };
    match abandoned {
        Some(lease) => {
            if let Err(e) = in_place(|| agent.shared.fabric.release(lease)) {
                tracing::warn!(lease = id, error = %e, "releasing the lease of an abandoned request");
            }
            false
        }
        None => true,
    }
}

/// Ends grant `id`, whose pages did not reach the peer: the peer holds no lease.
pub(crate) fn let_go(agent: &Agent, id: u64) {
    let unsent = agent.grants().remove(&id);
    if let Some(Err(e)) = unsent.map(|g| in_place(|| agent.shared.fabric.release(g.lease))) {
        tracing::warn!(lease = id, error = %e, "releasing a lease whose pages did not go");
    }
}

/// Leases a range of a region of this node for a peer, on the device `device` names for it, in the peer's
/// mode; with the range's version.
pub(crate) async fn lease_for_peer(
    agent: &Agent,
    (region, offset, len, mode): (&WireRegion, u64, u64, WireMode),
    device: impl FnOnce(&Region) -> Result<vfabric_transport::Location, FabricError>,
) -> Result<(u64, Lease), FabricError> {
    let f = &agent.shared.fabric;
    // Once leased, the region cannot move (a migration frees the old copy, which a lease prevents).
    let (r, _staying, end) = staying_here(agent, region, offset, len).await?;
    let lease = in_place(|| f.acquire(&r, offset..end, device(&r)?, Mode::from(mode)))?;
    let range = lease.offset()..lease.offset() + lease.len();
    Ok((f.version(&lease.region(), range)?, lease))
}

/// Lets go of what request `request` of `peer` was granted (the peer abandoned it before taking the answer),
/// or, when it was granted nothing yet, remembers it, so that its grant is let go as it is made.
pub(crate) fn abandon(agent: &Agent, peer: u16, request: u64) {
    let leases: Vec<_> = {
        let mut grants = agent.grants();
        let ids: Vec<u64> =
            grants.iter().filter(|(_, g)| g.peer == peer && g.request == Some(request)).map(|(k, _)| *k).collect();
        if ids.is_empty() {
            let mut gone = agent.shared.abandoned.lock().unwrap_or_else(|p| p.into_inner());
            if gone.len() >= super::shared::ABANDONED_KEPT {
                gone.pop_front();
            }
            gone.push_back((peer, request));
        }
        ids.into_iter().filter_map(|k| grants.remove(&k)).collect()
    };
    for grant in leases {
        let release = |lease| {
            if let Err(e) = in_place(|| agent.shared.fabric.release(lease)) {
                tracing::warn!(peer, request, error = %e, "releasing the lease of an abandoned request");
            }
        };
        match grant.sending {
            None => release(grant.lease),
            // A channel still sends from its pages: let go once the send ends.
            Some(_) => {
                let a = agent.clone();
                tokio::spawn(async move {
                    let lease = grant.sent().await;
                    if let Err(e) = in_place(|| a.shared.fabric.release(lease)) {
                        tracing::warn!(peer, request, error = %e, "releasing the lease of an abandoned request");
                    }
                });
            }
        }
    }
}

/// Ends a peer's lease; a write lease's pages come first (chunk offsets count from the lease's first byte)
/// and go into the leased frames before the lease is let go.
pub(crate) async fn take_back(
    agent: &Agent,
    peer: u16,
    id: u64,
    recv: &mut quinn::RecvStream,
) -> Result<Message, FabricError> {
    let held = {
        let mut grants = agent.grants();
        match grants.get(&id) {
            Some(g) if g.peer == peer => grants.remove(&id),
            _ => None,
        }
    };
    // A lease a channel still sends from ends once the send does.
    let lease = held.ok_or(FabricError::UnknownLease(id))?.sent().await;
    // All of a write-back arrives (each chunk verified) before any of it is written: a release that fails
    // midway leaves the pages as they were before the lease.
    let mut data = vec![0u8; if lease.mode() == Mode::Write { lease.len() as usize } else { 0 }];
    let payload = Payload::new(data.len() as u64, agent.shared.net.chunk.bytes());
    let arrived = receive(&mut QuicChunks::new(recv), payload, |at, pieces| {
        copy_pieces(&mut data[at as usize..], pieces);
        Ok::<(), FabricError>(())
    })
    .await;
    let (region, range, mode) = (lease.region(), lease.offset()..lease.offset() + lease.len(), lease.mode());
    let finish = async {
        let written = arrived.and_then(|()| match mode {
            Mode::Write => in_place(|| lease.write(0, &data)),
            Mode::Read => Ok(()),
        });
        // The lease ends either way.
        in_place(|| agent.shared.fabric.release(lease))?;
        written
    };
    // A write lease's pages reach the region's standbys (when it has any) before the release is answered.
    match mode {
        Mode::Write => agent.written(&region, range, finish).await?,
        Mode::Read => finish.await?,
    }
    Ok(Message::Done)
}

/// Takes a write's chunks off the stream, checks each one's checksum and place, and writes them. A bad chunk
/// fails the call before anything of it is written (the chunks before it are).
pub(crate) async fn receive_write(
    agent: &Agent,
    region: &WireRegion,
    offset: u64,
    len: u64,
    recv: &mut quinn::RecvStream,
) -> Result<Message, FabricError> {
    let (r, _staying, _) = staying_here(agent, region, offset, len).await?;
    // The payload stays in quinn's receive buffers until its checksum is known good; then each piece is copied
    // once, to its place, in place on this worker (no thread hop). Chunk offsets count from the write's start.
    let payload = Payload::new(len, agent.shared.net.chunk.bytes());
    let mut chunks = QuicChunks::new(recv);
    let arrived = receive(&mut chunks, payload, |at, pieces| {
        in_place(|| agent.shared.fabric.write_parts(&r, offset + at, pieces))
    });
    // For a replicated region, the standbys have the bytes before the write is answered.
    agent.written(&r, offset..offset + len, arrived).await?;
    Ok(Message::Done)
}

/// Answers a read: `Data` then the bytes in checksummed chunks (chunk offsets count from the region's start).
pub(crate) async fn send_read(
    agent: &Agent,
    region: &WireRegion,
    offset: u64,
    len: u64,
    send: &mut quinn::SendStream,
) -> Result<(), ProtocolError> {
    let max = agent.max_frame();
    let checked = match len {
        0 => Err(FabricError::OutOfBounds { offset, len, region_len: Region::from(region).len }),
        _ => staying_here(agent, region, offset, len).await,
    };
    let (r, _staying, end) = match checked {
        Ok(found) => found,
        Err(e) => {
            answer(send, &refusal(&e), max).await;
            return Ok(());
        }
    };
    // The first piece is read before answering, so that a refused read gets an error, not a truncated stream.
    // Each piece is read into a pooled buffer that quinn then sends without another copy.
    let chunk = agent.shared.net.chunk.bytes();
    let packs = agent.packs_pages_of(&r);
    let mut at = offset;
    while at < end {
        let mut piece = agent.shared.buffers.take(chunk.min(end - at) as usize);
        match in_place(|| agent.shared.fabric.read(&r, at, piece.as_mut())) {
            Ok(()) => {}
            Err(e) if at == offset => {
                answer(send, &refusal(&e), max).await;
                return Ok(());
            }
            Err(e) => {
                // Mid-stream: the requester sees a reset stream and a short read.
                tracing::warn!(error = %e, "a read failed midway");
                abort(send);
                return Ok(());
            }
        }
        if at == offset && write_frame(send, &Message::Data { len }, max).await.is_err() {
            return Ok(());
        }
        let n = piece.as_ref().len() as u64;
        if send_chunk(send, at, piece.into_bytes(), packs).await.is_err() {
            return Ok(());
        }
        at += n;
    }
    let _ = send.finish();
    Ok(())
}
