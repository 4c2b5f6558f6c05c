//! The agent's side of the local socket.

use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use vfabric_allocator::Location;

use super::{CHUNK, MAX_CHUNK};
use crate::agent::shared::Agent;
use crate::directory::RegionHandle as Region;
use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::proto::chunk::{write_chunk, ChunkError, ChunkRead, Payload, StreamChunks};
use crate::proto::codec::{read_frame, write_frame, PROTOCOL_VERSION};
use crate::proto::convert::refusal;
use crate::proto::message::{Message, WireRegion};

impl Agent {
    /// Serves local clients on a Unix socket at `path` (a stale socket file there is replaced) until the
    /// agent shuts down.
    pub async fn serve_local(&self, path: &Path) -> Result<PathBuf, FabricError> {
        let failed = |source| NetworkError::Socket { path: path.to_path_buf(), source };
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(NetworkError::SocketInUse { path: path.to_path_buf() }.into());
            }
            std::fs::remove_file(path).map_err(failed)?;
        }
        let listener = UnixListener::bind(path).map_err(failed)?;
        let agent = self.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let a = agent.clone();
                tokio::spawn(async move {
                    if let Err(e) = a.serve_client(stream).await {
                        tracing::warn!(error = %e, "closing a local client's connection");
                    }
                });
            }
        });
        self.tasks().push(task);
        Ok(path.to_path_buf())
    }

    /// One client connection: requests one after the other. `Err` says why the connection is closed.
    async fn serve_client(&self, mut s: UnixStream) -> Result<(), FabricError> {
        let max = self.max_frame();
        match read_frame(&mut s, max).await? {
            Some(Message::Hello { protocol, .. }) if protocol == PROTOCOL_VERSION => {
                write_frame(&mut s, &Message::Welcome { node: self.node(), protocol }, max).await?;
            }
            Some(m) => return Err(ProtocolError::NotHello(m.name()).into()),
            None => return Ok(()),
        }
        while let Some(msg) = read_frame(&mut s, max).await? {
            let reply = match msg {
                Message::Ping { nonce } => Ok(Message::Pong { nonce }),
                Message::Alloc { size, device } => self
                    .alloc(self.node(), size, device.map(Location::from))
                    .await
                    .map(|r| Message::Allocated { region: WireRegion::from(&r) }),
                Message::Free { region } => self.free(&Region::from(&region)).await.map(|()| Message::Done),
                Message::Write { region, offset, len } => self.take_write(&mut s, &Region::from(&region), offset, len).await?,
                Message::Read { region, offset, len } => {
                    self.answer_read(&mut s, &Region::from(&region), offset, len).await?;
                    continue;
                }
                other => return Err(ProtocolError::NotServed(other.name()).into()),
            };
            let answer = match reply {
                Ok(m) => m,
                Err(e) => refusal(&e),
            };
            write_frame(&mut s, &answer, max).await?;
        }
        Ok(())
    }

    /// Takes a write's chunks, each verified before it is written (no buffer of the claimed size): the call's
    /// result, or `Err` when the connection must close (a bad chunk leaves the stream out of step).
    async fn take_write(
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
    async fn answer_read(&self, s: &mut UnixStream, r: &Region, offset: u64, len: u64) -> Result<(), FabricError> {
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
