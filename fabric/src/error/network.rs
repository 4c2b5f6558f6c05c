//! How the network between nodes (and the local socket to a node's agent) fails.

use std::net::SocketAddr;
use std::path::PathBuf;

use vfabric_transport::quic::QuicError;

use crate::proto::chunk::ChunkError;

/// Why a call could not reach its peer, or its bytes could not cross.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The cluster's membership service (etcd, `[membership]`) could not be reached or refused a call.
    #[error("membership: etcd at {endpoints}: {message}")]
    Membership {
        /// The endpoints tried.
        endpoints: String,
        /// What failed.
        message: String,
    },
    /// Binding a lane's socket failed.
    #[error("binding {addr}: {source}")]
    Bind {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: QuicError,
    },
    /// The metrics endpoint (`[metrics] listen`) could not listen.
    #[error("serving metrics on {addr}: {message}")]
    MetricsListen {
        /// Where.
        addr: SocketAddr,
        /// Why.
        message: String,
    },
    /// The lanes take consecutive ports from the node's, and there is none left for this one.
    #[error("lane {lane}: no port above {base}")]
    NoPortForLane {
        /// The lane.
        lane: usize,
        /// The node's port.
        base: u16,
    },
    /// The node has no address to listen on.
    #[error("node `{name}` has no address in the configuration and none was given")]
    NoBindAddress {
        /// The node.
        name: String,
    },
    /// A peer's address is not known (not configured, not set).
    #[error("node {node} ({name}) has no known address")]
    NoPeerAddress {
        /// Its id.
        node: u16,
        /// Its name.
        name: String,
    },
    /// Dialling a peer failed (unreachable, or its certificate was refused either way).
    #[error("connecting to {name} at {addr}: {source}")]
    Connect {
        /// The peer's name.
        name: String,
        /// Where it was dialled.
        addr: SocketAddr,
        /// Why.
        source: QuicError,
    },
    /// A connection failed or closed.
    #[error(transparent)]
    Connection(#[from] quinn::ConnectionError),
    /// A stream could not be finished (it was reset or stopped).
    #[error("finishing a stream: {0}")]
    Finish(#[from] quinn::ClosedStream),
    /// A call's payload stream failed underneath.
    #[error("payload: {0}")]
    Stream(ChunkError),
    /// Reading or writing a stream or socket failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A lane that does not exist.
    #[error("lane {lane} of node {node}: there are {lanes} lanes")]
    NoSuchLane {
        /// The peer.
        node: u16,
        /// The lane asked for.
        lane: usize,
        /// The lanes there are.
        lanes: usize,
    },
    /// No lane may carry a call of this size (the cluster's lanes allow none).
    #[error("node {node}: no lane for a call of {bytes} bytes")]
    NoLane {
        /// The peer.
        node: u16,
        /// The call's bytes of pages.
        bytes: u64,
    },
    /// Work handed to another thread ended without an answer (the agent is shutting down, or it panicked).
    #[error("{what} ended without an answer: {source}")]
    Cancelled {
        /// What the work was.
        what: &'static str,
        /// The task's end.
        source: tokio::task::JoinError,
    },
    /// A lane that has no thread of its own.
    #[error("lane {lane}: there are {threads} lane threads")]
    NoLaneThread {
        /// The lane.
        lane: usize,
        /// The lane threads there are.
        threads: usize,
    },
    /// The lane threads could not start.
    #[error("starting the lane threads: {0}")]
    LaneThreads(std::io::Error),
    /// A node's certificate could not be loaded.
    #[error("loading {node}'s certificate: {source}")]
    Certificate {
        /// The node.
        node: String,
        /// Why.
        source: QuicError,
    },
    /// The local socket (to or of a node's agent) failed.
    #[error("{}: {source}", path.display())]
    Socket {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Another agent serves the local socket already.
    #[error("{} is served by a running agent", path.display())]
    SocketInUse {
        /// The socket's path.
        path: PathBuf,
    },
    /// The agent closed a local client's connection.
    #[error("the agent closed the connection")]
    AgentClosed,
    /// The agent serves as many local clients as it may (`network.max_local_clients`).
    #[error("the agent serves {most} local clients already (network.max_local_clients): try again later")]
    TooManyClients {
        /// The limit.
        most: usize,
    },
}
