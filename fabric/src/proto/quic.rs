//! The wire on quinn's streams: what quinn does better than a byte stream.
//!
//! Frames and chunk headers go through the generic helpers ([`super::codec`], [`super::chunk`]); a payload
//! is handed to quinn as a [`Bytes`] it keeps until acknowledged ([`send_chunk`]: no copy on the way to the
//! packet), and taken off a stream as quinn's own receive buffers ([`QuicChunks`]: checksummed piece by piece,
//! so a receiver copies the bytes once, to their destination, and only once they are known good).

use bytes::Bytes;
use quinn::{RecvStream, SendStream};
use vfabric_allocator::Compression;
use xxhash_rust::xxh3::Xxh3Default;

use super::chunk::{check_len, pack_chunk, read_chunk_header, ChunkError, ChunkHeader, ChunkRead, CHUNK_HEADER_LEN};
use super::codec::write_frame;
use super::message::Message;

/// Writes one checksummed chunk: the header, then `payload` handed to quinn as it is (kept, not copied, until
/// the peer acknowledged it), or packed with `codec` (`lz4`, `zstd`; `none` sends it as it is) when that saves
/// enough of it ([`pack_chunk`]). A peer that stopped the stream (it answered early) gives
/// [`ChunkError::Stopped`].
pub async fn send_chunk(
    stream: &mut SendStream,
    offset: u64,
    payload: Bytes,
    codec: Compression,
) -> Result<(), ChunkError> {
    check_len(payload.len())?;
    let packed = pack_chunk(&payload, codec);
    let (header, payload) = match packed {
        Some(p) => (ChunkHeader::for_packed(offset, &p), Bytes::from(p)),
        None => (ChunkHeader::for_payload(offset, &payload), payload),
    };
    let mut parts = [Bytes::copy_from_slice(&header.encode()), payload];
    stream.write_all_chunks(&mut parts).await.map_err(|e| match e {
        quinn::WriteError::Stopped(_) => ChunkError::Stopped,
        other => ChunkError::Io(other.into()),
    })
}

/// Answers a call with `msg` and ends the stream. A requester that went away meanwhile is no concern of the
/// answering side, so failures are ignored.
pub async fn answer(send: &mut SendStream, msg: &Message, max_frame: usize) {
    let _ = write_frame(send, msg, max_frame).await;
    let _ = send.finish();
}

/// Why a connection is closed: the application error code its peer sees (the reason goes with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseCode {
    /// The agent shut down.
    Shutdown = 0,
    /// The peer broke the protocol.
    Protocol = 1,
    /// The peer's certificate names no node of the cluster.
    UnknownPeer = 2,
    /// The peer stopped answering heartbeats: declared dead. Its grants to this node end with the connection.
    Dead = 3,
}

/// Closes `conn` with `code` and `reason` (what the peer reads, and what this side logs).
pub fn close(conn: &quinn::Connection, code: CloseCode, reason: &str) {
    tracing::warn!(peer = %conn.remote_address(), reason, "closing a connection");
    conn.close(quinn::VarInt::from_u32(code as u32), reason.as_bytes());
}

/// Ends an answer that failed after its first bytes went out: the requester sees a reset stream (and a short
/// payload), never a truncated one that looks finished.
pub fn abort(send: &mut SendStream) {
    let _ = send.reset(quinn::VarInt::from_u32(super::message::ErrorKind::Internal as u32));
}

/// Chunks from a quinn stream, each payload kept as quinn's receive buffers and verified piece by piece.
pub struct QuicChunks<'a> {
    stream: &'a mut RecvStream,
    parts: Vec<Bytes>,
}

impl<'a> QuicChunks<'a> {
    /// The chunks of `stream`.
    pub fn new(stream: &'a mut RecvStream) -> Self {
        QuicChunks { stream, parts: Vec::new() }
    }
}

impl ChunkRead for QuicChunks<'_> {
    async fn next_header(&mut self) -> Result<Option<ChunkHeader>, ChunkError> {
        read_chunk_header(self.stream).await
    }

    async fn next_payload(&mut self, header: &ChunkHeader) -> Result<Vec<&[u8]>, ChunkError> {
        self.parts.clear();
        let mut hasher = Xxh3Default::new();
        let mut left = header.len as usize;
        while left > 0 {
            let piece = match self.stream.read_chunk(left, true).await {
                Ok(Some(chunk)) => chunk.bytes,
                Ok(None) => {
                    let got = (CHUNK_HEADER_LEN + header.len as usize - left) as u64;
                    let len = (CHUNK_HEADER_LEN as u64) + u64::from(header.len);
                    return Err(ChunkError::Truncated { offset: header.offset, len, got });
                }
                Err(e) => return Err(ChunkError::Io(e.into())),
            };
            hasher.update(&piece);
            left -= piece.len();
            self.parts.push(piece);
        }
        header.verify(hasher.digest())?;
        Ok(self.parts.iter().map(|p| &p[..]).collect())
    }
}
