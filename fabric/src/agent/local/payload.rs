//! Page bytes through the local socket, for clients that have not mapped the node's memory: a `Write`'s
//! chunks taken and a `Read` answered, with the same checksummed chunks as between agents.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use super::runner::Runner;
use super::{CHUNK, MAX_CHUNK};
use crate::agent::shared::Agent;
use crate::directory::RegionHandle as Region;
use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::proto::chunk::{ChunkError, ChunkHeader, Payload, CHUNK_HEADER_LEN};
use crate::proto::codec::write_frame_blocking as send;
use crate::proto::convert::refusal;
use crate::proto::message::Message;

impl Agent {
    /// Takes a write's chunks, each verified before it is written to `r` (no buffer of the claimed size; with
    /// no region, a refused write's chunks are only taken): the call's result, or `Err` when the connection
    /// must close (a bad chunk leaves the stream out of step).
    pub(super) fn take_write(
        &self,
        s: &mut UnixStream,
        rt: &Runner,
        r: Option<&Region>,
        offset: u64,
        len: u64,
    ) -> Result<Result<Message, FabricError>, FabricError> {
        // Chunk by chunk: each goes to the region (maybe a peer's) once verified; after a failed write the rest
        // of the payload is still taken, to keep the stream in step, and the first failure is the answer.
        let mut payload = Payload::new(len, MAX_CHUNK);
        let mut result = Ok(Message::Done);
        let mut bytes = Vec::new();
        while !payload.is_complete() {
            let mut head = [0u8; CHUNK_HEADER_LEN];
            s.read_exact(&mut head).map_err(NetworkError::Io)?;
            let header = ChunkHeader::decode(&head);
            // Checked against the payload before anything is allocated for it.
            let at = payload.place(&header).map_err(ProtocolError::Chunk)?;
            bytes.clear();
            Read::by_ref(s).take(u64::from(header.len)).read_to_end(&mut bytes).map_err(NetworkError::Io)?;
            if bytes.len() != header.len as usize {
                let short = ChunkError::Short { got: bytes.len() as u64, want: u64::from(header.len) };
                return Err(ProtocolError::Chunk(short).into());
            }
            header.verify(xxhash_rust::xxh3::xxh3_64(&bytes)).map_err(|e| FabricError::Checksum(e.to_string()))?;
            if let (Ok(_), Some(r)) = (&result, r) {
                result = rt.block_on(self.write(r, offset.saturating_add(at), &bytes)).map(|()| Message::Done);
            }
        }
        Ok(result)
    }

    /// `Data` then the bytes, a chunk at a time (the first piece read before answering, so that a refused read
    /// gets an error; a later failure closes the connection).
    pub(super) fn answer_read(
        &self,
        s: &mut UnixStream,
        rt: &Runner,
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
            if let Err(e) = rt.block_on(self.read(r, offset.saturating_add(at), &mut piece)) {
                if at > 0 {
                    return Err(e);
                }
                return Ok(send(s, &refusal(&e), max)?);
            }
            if at == 0 {
                send(s, &Message::Data { len }, max)?;
            }
            let header = ChunkHeader::for_payload(at, &piece).encode();
            s.write_all(&header).and_then(|()| s.write_all(&piece)).map_err(NetworkError::Io)?;
            at += n;
            if len == 0 {
                break;
            }
        }
        Ok(())
    }
}
