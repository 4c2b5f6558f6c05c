//! Calls to a peer: one request per bidirectional QUIC stream (the request frame, its payload as checksummed
//! chunks, the answer frame, the answer's payload), on a lane the call holds, bounded by the peer's liveness;
//! and where a call's work runs (a lane's thread, or the runtime that started the agent).

use std::future::Future;

use super::acting;
use super::lane_use::{LaneUse, BULK};
use super::shared::{in_place, Agent};
use crate::directory::RegionHandle as Region;
use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::proto::chunk::{copy_pieces, receive, ChunkError, Payload};
use crate::proto::codec::{read_frame, write_frame};
use crate::proto::convert::reply_or_error;
use crate::proto::message::Message;
use crate::proto::quic::{send_chunk, QuicChunks};
use tracing::Instrument;

/// Where the chunks of a read's answer go.
pub(crate) enum ReadInto<'a> {
    /// A buffer whose first byte is the peer region's byte `offset`.
    Buf { buf: &'a mut [u8], offset: u64 },
    /// A region of this node (a copy of a peer's pages) whose first byte is the peer region's byte `offset`.
    Region { copy: &'a Region, offset: u64 },
}

impl ReadInto<'_> {
    /// The peer region's bytes that fit: the first one's offset, and how many.
    fn span(&self) -> (u64, u64) {
        match self {
            ReadInto::Buf { buf, offset } => (*offset, buf.len() as u64),
            ReadInto::Region { copy, offset } => (*offset, copy.len),
        }
    }
}

impl Agent {
    /// The least busy lane to `node` for a call that moves `bytes` of pages, held until dropped.
    pub(crate) fn take_lane(&self, node: u16, bytes: u64) -> Result<LaneUse, FabricError> {
        self.peer(node)?;
        Ok(self.shared.loads.take(node, bytes)?)
    }

    /// Lane `lane` to `node`, held whatever its load (a lease's release goes over the lane it was granted on).
    pub(crate) fn hold_lane(&self, node: u16, lane: usize) -> Result<LaneUse, FabricError> {
        self.peer(node)?;
        Ok(self.shared.loads.hold(node, lane)?)
    }

    /// One request to `node`: the frame, then `payload` as checksummed chunks; returns the answer.
    pub(crate) async fn call(&self, node: u16, msg: &Message, payload: &[u8]) -> Result<Message, FabricError> {
        self.call_on(node, &self.take_lane(node, payload.len() as u64)?, msg, payload).await
    }

    /// [`Agent::call`] on a lane the caller holds.
    pub(crate) async fn call_on(
        &self,
        node: u16,
        lane: &LaneUse,
        msg: &Message,
        payload: &[u8],
    ) -> Result<Message, FabricError> {
        let id = self.request_id();
        let work = async {
            let conn = self.connection(node, lane.lane, matches!(msg, Message::Ping { .. })).await?;
            let exchange = async {
                let (mut send, mut recv) = conn.open_bi().await?;
                self.open_request(&mut send, id, msg).await?;
                let chunk = self.shared.net.chunk.bytes() as usize;
                let packs = match msg {
                    Message::Write { region, .. } => self.packs_pages_of(&Region::from(region)),
                    _ => self.packs(),
                };
                let mut stopped = false;
                for (i, piece) in payload.chunks(chunk).enumerate() {
                    let bytes = self.shared.buffers.copy_of(piece).into_bytes();
                    match send_chunk(&mut send, (i * chunk) as u64, bytes, packs).await {
                        Ok(()) => {}
                        // The peer answered before taking the payload (a refusal: the region moved, is out of
                        // bounds, ...) and stopped the stream: its answer says why.
                        Err(ChunkError::Stopped) => {
                            stopped = true;
                            break;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                if !stopped {
                    send.finish().map_err(NetworkError::Finish)?;
                }
                let reply = read_frame(&mut recv, self.max_frame()).await?;
                self.heard_from(node).await;
                tracing::debug!(answer = reply.as_ref().map_or("nothing", Message::name), "answered");
                match (reply_or_error(node, reply), stopped) {
                    // A success for a payload that did not all arrive would be a peer's bug: never take it.
                    (Ok(_), true) => Err(NetworkError::Stream(ChunkError::Stopped).into()),
                    (r, _) => r,
                }
            };
            match exchange.await {
                Err(e) => Err(self.after_failure(node, &conn, e).await),
                answered => answered,
            }
        };
        let started = self.shared.metrics.start();
        let answer = self.bounded(node, work.instrument(call_span(id, node, msg))).await;
        self.shared.metrics.peer_call(msg.name(), started);
        answer
    }

    /// A read request to `node` on `lane`: the answer, then its chunks, each verified and put where `into`
    /// says; `expect` says from the answer how many bytes follow.
    pub(crate) async fn call_read(
        &self,
        node: u16,
        lane: &LaneUse,
        msg: &Message,
        into: ReadInto<'_>,
        expect: impl Fn(&Message) -> u64,
    ) -> Result<Message, FabricError> {
        self.call_read_as(self.request_id(), node, lane, msg, into, expect).await
    }

    /// [`Agent::call_read`] as request `id` (from [`Agent::request_id`]: the caller may need it to abandon the
    /// request).
    pub(crate) async fn call_read_as(
        &self,
        id: u64,
        node: u16,
        lane: &LaneUse,
        msg: &Message,
        mut into: ReadInto<'_>,
        expect: impl Fn(&Message) -> u64,
    ) -> Result<Message, FabricError> {
        let max_chunk = self.shared.net.chunk.bytes();
        let work = async {
            let conn = self.connection(node, lane.lane, false).await?;
            let exchange = async {
                let (mut send, mut recv) = conn.open_bi().await?;
                self.open_request(&mut send, id, msg).await?;
                send.finish().map_err(NetworkError::Finish)?;
                let reply = reply_or_error(node, read_frame(&mut recv, self.max_frame()).await?)?;
                let (offset, room) = into.span();
                let want = expect(&reply);
                if want > room {
                    return Err(ProtocolError::Oversized { node, want, room }.into());
                }
                // A bad chunk fails the whole call, so the caller never takes bytes from it. The payload stays in
                // quinn's receive buffers until its checksum is known good; then each piece is copied once.
                let mut src = QuicChunks::new(&mut recv);
                receive(&mut src, Payload::at(offset, want, max_chunk), |at, pieces| match &mut into {
                    ReadInto::Buf { buf, .. } => {
                        copy_pieces(&mut buf[at as usize..], pieces);
                        Ok(())
                    }
                    ReadInto::Region { copy, .. } => in_place(|| self.shared.fabric.write_parts(copy, at, pieces)),
                })
                .await
                .map_err(|e| match e {
                    FabricError::Checksum(why) => FabricError::Checksum(format!("from node {node}: {why}")),
                    e => e,
                })?;
                self.heard_from(node).await;
                tracing::debug!(answer = reply.name(), bytes = want, "answered");
                Ok(reply)
            };
            match exchange.await {
                Err(e) => Err(self.after_failure(node, &conn, e).await),
                answered => answered,
            }
        };
        let started = self.shared.metrics.start();
        let answer = self.bounded(node, work.instrument(call_span(id, node, msg))).await;
        self.shared.metrics.peer_call(msg.name(), started);
        answer
    }

    /// Writes request `msg` on a new stream, after its id (`Traced`) and, when the call acts for a tenant,
    /// `OnBehalf`.
    async fn open_request(&self, send: &mut quinn::SendStream, id: u64, msg: &Message) -> Result<(), FabricError> {
        write_frame(send, &Message::Traced { id }, self.max_frame()).await?;
        if let Some(t) = acting::tenant() {
            write_frame(send, &Message::OnBehalf { tenant: t.0 }, self.max_frame()).await?;
        }
        Ok(write_frame(send, msg, self.max_frame()).await?)
    }

    /// Runs a call's `work`, which moves `bytes` of pages, on `lane`'s thread when it has one, where that
    /// lane's connections are driven (`super::lanes`): a call bound by latency then makes no hops between
    /// threads until its answer is in. In place otherwise, and for a call of [`BULK`] bytes or more (which the
    /// latency lane never carries): its copies and checksums would hold up the thread that decrypts the lane's
    /// packets.
    pub(crate) async fn on_lane<T, F>(&self, lane: usize, bytes: u64, work: F) -> Result<T, FabricError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, FabricError>> + Send + 'static,
    {
        match &self.shared.lanes {
            Some(lanes) if bytes < BULK && lanes.runtime(lane).is_some() => lanes.run(lane, acting::carry(work)).await,
            _ => work.await,
        }
    }

    /// Runs long `work` (a migration: whole regions copied, several calls) on the runtime that started the
    /// agent when called on a lane's thread, so that the lane's connections and its other calls keep moving
    /// meanwhile; in place anywhere else. Once started it runs to its end, also when the caller goes: a
    /// migration cut off halfway would leave its new copy behind.
    pub(crate) async fn off_lanes<T, F>(&self, work: F) -> Result<T, FabricError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, FabricError>> + Send + 'static,
    {
        match &self.shared.lanes {
            Some(lanes) if lanes.is_lane_thread() => self
                .shared
                .main
                .spawn(acting::carry(work))
                .await
                .map_err(|source| NetworkError::Cancelled { what: "work moved off a lane's thread", source })?,
            _ => work.await,
        }
    }
}

/// The span of call `id` to `node`: its logs, here and (span `served`) at the peer, carry the id.
fn call_span(id: u64, node: u16, msg: &Message) -> tracing::Span {
    tracing::debug_span!("call", id = %format_args!("{id:016x}"), node, request = msg.name())
}
