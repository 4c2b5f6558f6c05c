//! How a peer (another node's agent, or a local client) breaks the protocol.

use crate::proto::chunk::ChunkError;
use crate::proto::codec::CodecError;

/// A message or payload that the protocol does not allow where it came; the connection it came over is closed
/// with this as the reason.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// A frame that is not one well-formed message of this protocol.
    #[error(transparent)]
    Codec(CodecError),
    /// A payload chunk that does not belong to its payload (outside it, too long, or the payload cut short).
    #[error(transparent)]
    Chunk(ChunkError),
    /// The peer ended a call's stream without answering.
    #[error("node {node} closed the stream without answering")]
    NoAnswer {
        /// The peer.
        node: u16,
    },
    /// The peer answered with a message that does not answer the request.
    #[error("node {node} answered with an unexpected `{answer}`")]
    Unexpected {
        /// The peer.
        node: u16,
        /// The message it answered with.
        answer: &'static str,
    },
    /// The peer announced more payload than the call has room for.
    #[error("node {node} announced {want} bytes for {room} of room")]
    Oversized {
        /// The peer.
        node: u16,
        /// Bytes announced.
        want: u64,
        /// Bytes the call takes.
        room: u64,
    },
    /// A field whose value the protocol does not define.
    #[error("`{field}` = {value} is not defined")]
    BadField {
        /// The field.
        field: &'static str,
        /// The value sent.
        value: u64,
    },
    /// A message that is not a request this side serves.
    #[error("`{0}` is not a request this side serves")]
    NotServed(&'static str),
    /// A connection whose first message is not a hello.
    #[error("first message `{0}`, not hello")]
    NotHello(&'static str),
    /// A connection that ended before its hello.
    #[error("stream ended before hello")]
    NoHello,
    /// A hello from a node of another cluster, another protocol or another lane layout.
    #[error(
        "hello from `{name}` claims cluster `{cluster}` node {node} protocol {protocol}, {lanes} lanes, latency lane \
         {latency_lane}; expected `{want_cluster}` node {want_node} protocol {want_protocol}, {want_lanes} lanes, \
         latency lane {want_latency_lane} (network.lanes and network.latency_lane must be the same on every node)"
    )]
    HelloMismatch {
        /// The peer's certificate's name.
        name: String,
        /// The cluster it claims.
        cluster: String,
        /// The node id it claims.
        node: u16,
        /// Its protocol version.
        protocol: u16,
        /// Its `network.lanes`.
        lanes: u16,
        /// Its `network.latency_lane`.
        latency_lane: bool,
        /// This node's cluster.
        want_cluster: String,
        /// The node id its certificate names.
        want_node: u16,
        /// This node's protocol version.
        want_protocol: u16,
        /// This node's `network.lanes`.
        want_lanes: u16,
        /// This node's `network.latency_lane`.
        want_latency_lane: bool,
    },
    /// A peer whose certificate names no node.
    #[error("no node name in the peer's certificate")]
    NoNodeName,
    /// A peer whose certificate binds it to a tenant that cannot be read, or to another than the configuration's.
    #[error("the certificate of `{name}` names a tenant that is no tenant id, or not tenant {listed:?} of the configuration")]
    BadTenant {
        /// The name in its certificate.
        name: String,
        /// The tenant the configuration gives the node.
        listed: Option<u32>,
    },
    /// A peer whose certificate names a node that is not in the cluster.
    #[error("`{name}` is not a node of cluster {cluster}")]
    UnknownNode {
        /// The name in its certificate.
        name: String,
        /// This node's cluster.
        cluster: String,
    },
}
