//! Page bytes through the local socket, for clients that have not mapped the node's memory: a `Write`'s
//! chunks taken and a `Read` answered, with the same checksummed chunks as between agents.

use tokio::net::UnixStream;

use super::{CHUNK, MAX_CHUNK};
use crate::agent::shared::Agent;
use crate::directory::RegionHandle as Region;
use crate::error::FabricError;
use crate::proto::chunk::{write_chunk, ChunkError, ChunkRead, Payload, StreamChunks};
use crate::proto::codec::write_frame;
use crate::proto::convert::refusal;
use crate::proto::message::Message;

impl Agent {
    /// Takes a write's chunks, each verified before it is written (no buffer of the claimed size): the call's
    /// result, or `Err` when the connection must close (a bad chunk leaves the stream out of step).
    pub(super) async fn take_write(
        &self,
        s: &mut UnixStream,
        r: &Region,
        offset: u64,
        len: u64,
    ) -> Result<Result<Message, FabricError>, FabricError> {
        // Chunk by chunk: each goes to the region (maybe a peer's) once verified; after a failed write the rest
        // of the payload is still taken, to keep the stream in step, and the first failure is the answer.
        let mut src = StreamChunks::new(s, MAX_CHUNK);
        let mut payload = Payload::new(len, MAX_CHUNK);
        let mut result = Ok(Message::Done);
        while !payload.is_complete() {
            let header = src.next_header().await?.ok_or(ChunkError::Short { got: 0, want: len })?;
            let at = payload.place(&header)?;
            let bytes = src.next_payload(&header).await?.concat();
            if result.is_ok() {
                result = self.write(r, offset.saturating_add(at), &bytes).await.map(|()| Message::Done);
            }
        }
        Ok(result)
    }

    /// `Data` then the bytes, a chunk at a time (the first piece read before answering, so that a refused read
    /// gets an error; a later failure closes the connection).
    pub(super) async fn answer_read(
        &self,
        s: &mut UnixStream,
        r: &Region,
        offset: u64,
        len: u64,
    ) -> Result<(), FabricError> {
        let max = self.max_frame();
        let mut piece = Vec::new();
        let mut at = 0u64;
        while at < len || at == 0 {
            let n = (CHUNK as u64).min(len - at);
            piece.resize(n as usize, 0);
            if let Err(e) = self.read(r, offset.saturating_add(at), &mut piece).await {
                if at > 0 {
                    return Err(e);
                }
                return Ok(write_frame(s, &refusal(&e), max).await?);
            }
            if at == 0 {
                write_frame(s, &Message::Data { len }, max).await?;
            }
            write_chunk(s, at, &piece).await?;
            at += n;
            if len == 0 {
                break;
            }
        }
        Ok(())
    }
}
