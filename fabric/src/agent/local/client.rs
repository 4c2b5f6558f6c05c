//! A process's side of the local socket: [`LocalClient`].

use std::path::{Path, PathBuf};

use tokio::net::UnixStream;
use tokio::sync::Mutex;
use vfabric_allocator::Location;

use super::{CHUNK, MAX_CHUNK};
use crate::directory::RegionHandle as Region;
use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::proto::chunk::{copy_pieces, receive, write_chunk, Payload, StreamChunks};
use crate::proto::codec::{read_frame, write_frame, DEFAULT_MAX_FRAME};
use crate::proto::message::{Message, WireRegion};

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
            .map_err(|source| NetworkError::Socket { path: path.to_path_buf(), source })?;
        let max_frame = DEFAULT_MAX_FRAME;
        let hello = super::client_hello();
        write_frame(&mut stream, &hello, max_frame).await?;
        match read_frame(&mut stream, max_frame).await? {
            Some(Message::Welcome { node, .. }) => Ok(LocalClient { stream: Mutex::new(stream), max_frame, node }),
            other => {
                let answer = other.as_ref().map_or("nothing", Message::name);
                Err(ProtocolError::Unexpected { node: u16::MAX, answer }.into())
            }
        }
    }

    /// The node of the agent this client talks to.
    pub fn node(&self) -> u16 {
        self.node
    }

    /// One call: the request, its payload, the answer, and the answer's payload into `into` (a read's buffer).
    async fn call(&self, msg: &Message, payload: &[u8], into: Option<&mut [u8]>) -> Result<Message, FabricError> {
        let mut s = self.stream.lock().await;
        write_frame(&mut *s, msg, self.max_frame).await?;
        for (i, piece) in payload.chunks(CHUNK).enumerate() {
            write_chunk(&mut *s, (i * CHUNK) as u64, piece).await?;
        }
        let reply = read_frame(&mut *s, self.max_frame).await?.ok_or(NetworkError::AgentClosed)?;
        match (reply, into) {
            (Message::Error { kind, message }, _) => Err(FabricError::Remote { node: self.node, kind, message }),
            (Message::Data { len }, Some(buf)) if len == buf.len() as u64 => {
                let mut src = StreamChunks::new(&mut *s, MAX_CHUNK);
                receive::<_, FabricError>(&mut src, Payload::new(len, MAX_CHUNK), |at, pieces| {
                    copy_pieces(&mut buf[at as usize..], pieces);
                    Ok(())
                })
                .await?;
                Ok(Message::Data { len })
            }
            (m, _) => Ok(m),
        }
    }

    /// `msg`'s answer, which must be what `want` takes.
    async fn expect<T>(
        &self,
        msg: &Message,
        payload: &[u8],
        want: impl Fn(Message) -> Option<T>,
    ) -> Result<T, FabricError> {
        let reply = self.call(msg, payload, None).await?;
        let answer = reply.name();
        want(reply).ok_or(ProtocolError::Unexpected { node: self.node, answer }.into())
    }

    /// Allocates a region whose home is the agent's node, kept on the cluster's `network.replicas` nodes.
    pub async fn alloc(&self, size: u64, device: Option<Location>) -> Result<Region, FabricError> {
        self.alloc_replicated(size, device, 0).await
    }

    /// Allocates a region whose home is the agent's node, kept on `replicas` nodes (its home, and a standby
    /// copy on another node that takes over if the home dies; `0`: the cluster's `network.replicas`).
    pub async fn alloc_replicated(
        &self,
        size: u64,
        device: Option<Location>,
        replicas: u8,
    ) -> Result<Region, FabricError> {
        let msg = Message::Alloc {
            size,
            device: device.map(Into::into),
            replicas,
            lag_ms: None,
            compression: 0,
            priority: 1,
        };
        self.expect(&msg, &[], |m| match m {
            Message::Allocated { region } => Some(Region::from(&region)),
            _ => None,
        })
        .await
    }

    /// Writes into a region of the cluster at `offset`.
    pub async fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let msg = Message::Write { region: WireRegion::from(region), offset, len: data.len() as u64 };
        self.expect(&msg, data, |m| matches!(m, Message::Done).then_some(())).await
    }

    /// Reads a region of the cluster at `offset` into `buf`.
    pub async fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let msg = Message::Read { region: WireRegion::from(region), offset, len: buf.len() as u64 };
        match self.call(&msg, &[], Some(buf)).await? {
            Message::Data { .. } => Ok(()),
            other => Err(ProtocolError::Unexpected { node: self.node, answer: other.name() }.into()),
        }
    }

    /// Frees a region of the cluster.
    pub async fn free(&self, region: &Region) -> Result<(), FabricError> {
        let msg = Message::Free { region: WireRegion::from(region) };
        self.expect(&msg, &[], |m| matches!(m, Message::Done).then_some(())).await
    }

    /// A round trip to the agent and back that does nothing: the floor under every call on the socket.
    pub async fn ping(&self) -> Result<(), FabricError> {
        let nonce = 0x7666_6162; // echoed back
        self.expect(&Message::Ping { nonce }, &[], |m| {
            matches!(m, Message::Pong { nonce: n } if n == nonce).then_some(())
        })
        .await
    }

    /// What the agent says about itself (`agent::AgentStatus`), as JSON: its fabric's figures, its peers, its
    /// replicated regions (what `vfabric status` prints). The operator's call.
    pub async fn status(&self) -> Result<String, FabricError> {
        self.status_of(None).await
    }

    /// [`LocalClient::status`] of node `node` (`None`: the agent's own), which the agent asks over QUIC when it is
    /// a peer: `PeerDead` if that peer does not answer.
    pub async fn status_of(&self, node: Option<u16>) -> Result<String, FabricError> {
        self.expect(&Message::Status { node }, &[], |m| match m {
            Message::Figures { json } => Some(json.clone()),
            _ => None,
        })
        .await
    }
}

/// Where `vfabric agent` serves local clients by default: `<temp dir>/vfabric-<cluster>-<node>.sock`.
pub fn default_socket(cluster: &str, node: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vfabric-{cluster}-{node}.sock"))
}
