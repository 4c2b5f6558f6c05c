//! A node's local clients: processes on the node that use its agent over a Unix socket instead of running an
//! agent of their own. The same frames as between agents ([`crate::proto`]), one request at a time per
//! connection, after a `Hello` the agent answers with its node id; page payloads as the same checksummed chunks
//! ([`crate::proto::chunk`]). A client's calls reach every region of the cluster: the agent forwards them to
//! the regions' homes.

mod client;
mod server;

pub use client::{default_socket, LocalClient};

/// Largest payload chunk on the socket.
const MAX_CHUNK: u64 = 16 << 20;

/// The chunks a local call's payload is cut into.
const CHUNK: usize = 1 << 20;
