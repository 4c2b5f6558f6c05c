//! A node's local clients: processes on the node that use its agent over a Unix socket instead of running an
//! agent of their own. Same frames as between agents ([`crate::proto`]), one request at a time per
//! connection, after a `Hello` the agent answers with its node id; page payloads as checksummed chunks (the
//! same 20-byte header as on QUIC streams). A client's calls reach every region of the cluster: the agent
//! forwards them to the regions' homes.

use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Mutex;
use vfabric_transport::quic::{ChunkHeader, CHUNK_HEADER_LEN};
use vfabric_transport::Location;
use xxhash_rust::xxh3::xxh3_64;

use super::wire::error_kind;
use super::Agent;
use crate::error::FabricError;
use crate::fabric::Region;
use crate::proto::{read_frame, write_frame, CodecError, Message, WireRegion};

/// Largest payload chunk on the socket.
const MAX_CHUNK: u64 = 16 << 20;

async fn write_chunk(s: &mut UnixStream, offset: u64, payload: &[u8]) -> std::io::Result<()> {
    s.write_all(&ChunkHeader::for_payload(offset, payload).encode()).await?;
    s.write_all(payload).await
}

/// Reads one chunk into `buf`; `Err` names what was wrong (a bad checksum included).
async fn read_chunk(s: &mut UnixStream, buf: &mut Vec<u8>) -> Result<u64, String> {
    let mut h = [0u8; CHUNK_HEADER_LEN];
    s.read_exact(&mut h).await.map_err(|e| format!("chunk header: {e}"))?;
    let h = ChunkHeader::decode(&h);
    if u64::from(h.len) > MAX_CHUNK {
        return Err(format!("a chunk of {} bytes (at most {MAX_CHUNK})", h.len));
    }
    buf.resize(h.len as usize, 0);
    s.read_exact(buf).await.map_err(|e| format!("chunk payload: {e}"))?;
    let found = xxh3_64(buf);
    if found != h.checksum {
        return Err(format!("chunk at {:#x}: checksum {found:#x}, expected {:#x}", h.offset, h.checksum));
    }
    Ok(h.offset)
}

impl Agent {
    /// Serves local clients on a Unix socket at `path` (a stale socket file there is replaced) until the
    /// agent shuts down.
    pub async fn serve_local(&self, path: &Path) -> Result<PathBuf, FabricError> {
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(FabricError::Network(format!("{} is served by a running agent", path.display())));
            }
            std::fs::remove_file(path).map_err(|e| FabricError::Network(format!("{}: {e}", path.display())))?;
        }
        let listener =
            UnixListener::bind(path).map_err(|e| FabricError::Network(format!("{}: {e}", path.display())))?;
        let agent = self.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let a = agent.clone();
                tokio::spawn(async move {
                    if let Err(why) = a.serve_client(stream).await {
                        tracing::warn!(reason = why, "closing a local client's connection");
                    }
                });
            }
        });
        self.tasks().push(task);
        Ok(path.to_path_buf())
    }

    /// One client connection: requests one after the other. `Err` carries why the connection is closed.
    async fn serve_client(&self, mut s: UnixStream) -> Result<(), String> {
        let max = self.max_frame();
        match read_frame(&mut s, max).await {
            Ok(Some(Message::Hello { protocol, .. })) if protocol == crate::proto::PROTOCOL_VERSION => {
                let welcome = Message::Welcome { node: self.node(), protocol };
                write_frame(&mut s, &welcome, max).await.map_err(|e| e.to_string())?;
            }
            Ok(Some(m)) => return Err(format!("first message `{}`, not a hello of this protocol", m.name())),
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("bad hello: {e}")),
        }
        loop {
            let msg = match read_frame(&mut s, max).await {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("bad request frame: {e}")),
            };
            let reply = match msg {
                Message::Ping { nonce } => Ok(Message::Pong { nonce }),
                Message::Alloc { size, device } => self
                    .alloc(self.node(), size, device.map(Location::from))
                    .await
                    .map(|r| Message::Allocated { region: WireRegion::from(&r) }),
                Message::Free { region } => self.free(&Region::from(&region)).await.map(|()| Message::Done),
                Message::Write { region, offset, len } => {
                    // Chunk by chunk, each verified before it is written: no buffer of the claimed size.
                    let r = Region::from(&region);
                    let (mut got, mut buf, mut result) = (0u64, Vec::new(), Ok(Message::Done));
                    while got < len {
                        let at = read_chunk(&mut s, &mut buf).await?;
                        let end = at.checked_add(buf.len() as u64).filter(|&e| e <= len && !buf.is_empty());
                        let Some(_) = end else { return Err(format!("a write chunk at +{at:#x} outside the write")) };
                        got += buf.len() as u64;
                        if result.is_ok() {
                            if let Err(e) = self.write(&r, offset.saturating_add(at), &buf).await {
                                result = Err(e);
                            }
                        }
                    }
                    result
                }
                Message::Read { region, offset, len } => {
                    self.answer_read(&mut s, &Region::from(&region), offset, len).await?;
                    continue;
                }
                other => return Err(format!("`{}` is not a local request", other.name())),
            };
            let answer = match reply {
                Ok(m) => m,
                Err(e) => Message::Error { kind: error_kind(&e), message: e.to_string() },
            };
            write_frame(&mut s, &answer, max).await.map_err(|e| e.to_string())?;
        }
    }

    /// `Data` then the bytes, 1 MiB at a time (the first piece read before answering, so that a refused read
    /// gets an error; a later failure closes the connection).
    async fn answer_read(&self, s: &mut UnixStream, r: &Region, offset: u64, len: u64) -> Result<(), String> {
        let max = self.max_frame();
        let mut piece = Vec::new();
        let mut at = 0u64;
        while at < len || at == 0 {
            let n = (1u64 << 20).min(len - at);
            piece.resize(n as usize, 0);
            if let Err(e) = self.read(r, offset.saturating_add(at), &mut piece).await {
                if at > 0 {
                    return Err(format!("a read failed midway: {e}"));
                }
                let answer = Message::Error { kind: error_kind(&e), message: e.to_string() };
                return write_frame(s, &answer, max).await.map_err(|e| e.to_string());
            }
            if at == 0 {
                write_frame(s, &Message::Data { len }, max).await.map_err(|e| e.to_string())?;
            }
            write_chunk(s, at, &piece).await.map_err(|e| e.to_string())?;
            at += n;
            if len == 0 {
                break;
            }
        }
        Ok(())
    }
}

/// A process's handle on its node's agent, over the agent's Unix socket.
pub struct LocalClient {
    stream: Mutex<UnixStream>,
    max_frame: usize,
    node: u16,
}

impl LocalClient {
    /// Connects to the agent serving `path`.
    pub async fn connect(path: &Path) -> Result<LocalClient, FabricError> {
        let mut stream = UnixStream::connect(path)
            .await
            .map_err(|e| FabricError::Network(format!("connecting to the agent at {}: {e}", path.display())))?;
        let max_frame = crate::proto::DEFAULT_MAX_FRAME;
        let protocol = crate::proto::PROTOCOL_VERSION;
        let hello = Message::Hello { cluster: String::new(), node: u16::MAX, protocol, lanes: 0, latency_lane: false };
        let codec = |e: CodecError| FabricError::Protocol(e.to_string());
        write_frame(&mut stream, &hello, max_frame).await.map_err(codec)?;
        match read_frame(&mut stream, max_frame).await.map_err(codec)? {
            Some(Message::Welcome { node, .. }) => Ok(LocalClient { stream: Mutex::new(stream), max_frame, node }),
            other => Err(FabricError::Protocol(format!("the agent answered hello with {other:?}"))),
        }
    }

    /// The node of the agent this client talks to.
    pub fn node(&self) -> u16 {
        self.node
    }

    async fn call(&self, msg: &Message, payload: &[u8], into: Option<&mut [u8]>) -> Result<Message, FabricError> {
        let mut s = self.stream.lock().await;
        let codec = |e: CodecError| FabricError::Protocol(e.to_string());
        let io = |e: std::io::Error| FabricError::Network(e.to_string());
        write_frame(&mut *s, msg, self.max_frame).await.map_err(codec)?;
        for (i, piece) in payload.chunks(1 << 20).enumerate() {
            write_chunk(&mut s, (i << 20) as u64, piece).await.map_err(io)?;
        }
        let reply = read_frame(&mut *s, self.max_frame)
            .await
            .map_err(codec)?
            .ok_or_else(|| FabricError::Network("the agent closed the connection".into()))?;
        match (reply, into) {
            (Message::Error { kind, message }, _) => Err(FabricError::Remote { node: self.node, kind, message }),
            (Message::Data { len }, Some(buf)) if len == buf.len() as u64 => {
                let mut got = 0u64;
                let mut chunk = Vec::new();
                while got < len {
                    let at = read_chunk(&mut s, &mut chunk).await.map_err(FabricError::Checksum)?;
                    let end = at.checked_add(chunk.len() as u64).filter(|&e| e <= len && !chunk.is_empty());
                    let end =
                        end.ok_or_else(|| FabricError::Protocol(format!("a chunk at +{at:#x} outside the read")))?;
                    buf[at as usize..end as usize].copy_from_slice(&chunk);
                    got += chunk.len() as u64;
                }
                Ok(Message::Data { len })
            }
            (m, _) => Ok(m),
        }
    }

    /// Allocates a region whose home is the agent's node.
    pub async fn alloc(&self, size: u64, device: Option<Location>) -> Result<Region, FabricError> {
        match self.call(&Message::Alloc { size, device: device.map(Into::into) }, &[], None).await? {
            Message::Allocated { region } => Ok(Region::from(&region)),
            other => Err(FabricError::Protocol(format!("the agent answered alloc with `{}`", other.name()))),
        }
    }

    /// Writes into a region of the cluster at `offset`.
    pub async fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let msg = Message::Write { region: WireRegion::from(region), offset, len: data.len() as u64 };
        match self.call(&msg, data, None).await? {
            Message::Done => Ok(()),
            other => Err(FabricError::Protocol(format!("the agent answered write with `{}`", other.name()))),
        }
    }

    /// Reads a region of the cluster at `offset` into `buf`.
    pub async fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let msg = Message::Read { region: WireRegion::from(region), offset, len: buf.len() as u64 };
        match self.call(&msg, &[], Some(buf)).await? {
            Message::Data { .. } => Ok(()),
            other => Err(FabricError::Protocol(format!("the agent answered read with `{}`", other.name()))),
        }
    }

    /// Frees a region of the cluster.
    pub async fn free(&self, region: &Region) -> Result<(), FabricError> {
        match self.call(&Message::Free { region: WireRegion::from(region) }, &[], None).await? {
            Message::Done => Ok(()),
            other => Err(FabricError::Protocol(format!("the agent answered free with `{}`", other.name()))),
        }
    }
}

/// Where `vfabric agent` serves local clients by default: `<temp dir>/vfabric-<cluster>-<node>.sock`.
pub fn default_socket(cluster: &str, node: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vfabric-{cluster}-{node}.sock"))
}
