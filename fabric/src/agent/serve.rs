//! The serving half of the agent: accepts peers' connections, checks who they are, and answers their requests
//! on the regions whose home is this node.

use std::sync::Arc;
use std::time::Instant;

use vfabric_transport::quic;

use super::wire::error_kind;
use super::{blocking, Shared};
use crate::directory::Placement;
use crate::error::FabricError;
use crate::fabric::Region;
use crate::proto::{read_frame, write_frame, ErrorKind, Message, WireRegion, PROTOCOL_VERSION};

/// Why a connection is closed (the code the peer sees; the reason goes with it and into our log).
const CLOSE_PROTOCOL: u32 = 1;
const CLOSE_UNKNOWN_PEER: u32 = 2;

/// Accepts connections until the endpoint closes.
pub(super) async fn accept_loop(shared: Arc<Shared>) {
    while let Some(incoming) = shared.endpoint.accept().await {
        let s = Arc::clone(&shared);
        tokio::spawn(async move {
            let from = incoming.remote_address();
            match incoming.await {
                Ok(conn) => serve_connection(s, conn).await,
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
        Ok(Some(Message::Hello { cluster, node: n, protocol }))
            if cluster == shared.cluster && n == node && protocol == PROTOCOL_VERSION =>
        {
            let welcome = Message::Welcome { node: shared.node, protocol: PROTOCOL_VERSION };
            if write_frame(&mut send, &welcome, max).await.is_err() || send.finish().is_err() {
                return;
            }
        }
        Ok(Some(Message::Hello { cluster, node: n, protocol })) => {
            let why = format!(
                "hello from `{name}` claims cluster `{cluster}` node {n} protocol {protocol}; expected `{}` node {node} protocol {PROTOCOL_VERSION}",
                shared.cluster
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
            if let Err(why) = serve_stream(&s, node, send, recv).await {
                close(&c, CLOSE_PROTOCOL, &why);
            }
        });
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
    shared: &Shared,
    peer: u16,
    mut send: quinn::SendStream,
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
    let chunk = shared.net.chunk.bytes();
    let reply = match msg {
        Message::Ping { nonce } => Ok(Message::Pong { nonce }),
        Message::Alloc { size, device } => {
            let f = shared.fabric.clone();
            let placement = device.map(|d| Placement::on(d.into())).unwrap_or_default();
            blocking(move || f.alloc(size, placement))
                .await
                .map(|r| Message::Allocated { region: WireRegion::from(&r) })
        }
        Message::Free { region } => match home_region(shared, &region) {
            Ok(r) => {
                let f = shared.fabric.clone();
                blocking(move || f.free(&r)).await.map(|()| Message::Done)
            }
            Err(e) => Err(e),
        },
        Message::Write { region, offset, len } => receive_write(shared, &region, offset, len, &mut recv, chunk).await,
        Message::Read { region, offset, len } => {
            return send_read(shared, &region, offset, len, &mut send, chunk).await;
        }
        other => Err(FabricError::Protocol(format!("`{}` is not served yet", other.name()))),
    };
    let answer = match reply {
        Ok(m) => m,
        Err(FabricError::Protocol(why)) => return Err(why),
        Err(e) => Message::Error { kind: error_kind(&e), message: e.to_string() },
    };
    // The requester may have gone; nothing to do about it here.
    let _ = write_frame(&mut send, &answer, max).await;
    let _ = send.finish();
    Ok(())
}

/// A region named by a peer, which must live here.
fn home_region(shared: &Shared, w: &WireRegion) -> Result<Region, FabricError> {
    let r = Region::from(w);
    if r.addr.node().0 != shared.node {
        return Err(FabricError::InvalidAddress(format!("{r} does not live on node {}", shared.node)));
    }
    Ok(r)
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
    let r = home_region(shared, region)?;
    let end = offset.checked_add(len).filter(|&e| e <= r.len).ok_or(FabricError::OutOfBounds {
        offset,
        len,
        region_len: r.len,
    })?;
    let mut got = 0u64;
    let mut buf = Vec::new();
    loop {
        let at = match quic::read_chunk(recv, max_chunk, &mut buf).await {
            Ok(Some(at)) => at,
            Ok(None) => break,
            Err(quic::QuicError::Checksum { offset: o, expected, found }) => {
                return Err(FabricError::Checksum(format!(
                    "chunk at {o:#x}: checksum {found:#x}, expected {expected:#x}; nothing of it was written"
                )))
            }
            Err(e) => return Err(FabricError::Network(e.to_string())),
        };
        // Chunk offsets count from the start of the write.
        let start = offset.checked_add(at).filter(|s| s + buf.len() as u64 <= end);
        let Some(start) = start else {
            return Err(FabricError::Protocol(format!("a write chunk at +{at:#x} runs past the write's {len} bytes")));
        };
        got += buf.len() as u64;
        // In place on this worker (the agent runs on a multi-threaded runtime): no thread hop, no copy.
        tokio::task::block_in_place(|| shared.fabric.write(&r, start, &buf))?;
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
    let checked = home_region(shared, region).and_then(|r| {
        offset.checked_add(len).filter(|&e| e <= r.len && len > 0).map(|_| r).ok_or(FabricError::OutOfBounds {
            offset,
            len,
            region_len: r.len,
        })
    });
    let r = match checked {
        Ok(r) => r,
        Err(e) => {
            let _ = write_frame(send, &Message::Error { kind: error_kind(&e), message: e.to_string() }, max).await;
            let _ = send.finish();
            return Ok(());
        }
    };
    // Read the first piece before answering, so that a refused read gets an error, not a truncated stream.
    let mut at = offset;
    let mut first = true;
    let mut piece = Vec::new();
    while at < offset + len {
        let n = chunk.min(offset + len - at);
        piece.resize(n as usize, 0);
        let read = tokio::task::block_in_place(|| shared.fabric.read(&r, at, &mut piece));
        match read {
            Ok(()) => {}
            Err(e) if first => {
                let kind = error_kind(&e);
                let _ = write_frame(send, &Message::Error { kind, message: e.to_string() }, max).await;
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
        if quic::write_chunk(send, at, &piece).await.is_err() {
            return Ok(());
        }
        at += n;
    }
    let _ = send.finish();
    Ok(())
}
