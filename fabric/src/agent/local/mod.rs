//! A node's local clients: processes on the node (a job's ranks) that use its agent over a Unix socket instead
//! of running an agent of their own. The same frames as between agents ([`crate::proto`]), one request at a
//! time per connection, after a `Hello` the agent answers with its node id. A client's calls reach every region
//! of the cluster: the agent forwards them to the regions' homes.
//!
//! Two clients:
//! - [`AttachedClient`] (`attached`, `mapped_lease`, `connection`): blocking; maps the node's arenas at attach (descriptors
//!   passed with `SCM_RIGHTS`, [`crate::proto::mapped`]), so its leases ([`LocalLease`]) are pointers in its
//!   own address space and no page bytes cross the socket on that path; it is a `PoolSource` too
//!   (`pool_source`), so a process's tensor pool takes its regions from the agent;
//! - [`LocalClient`] (`client`): async; bytes through the socket as checksummed chunks
//!   ([`crate::proto::chunk`]), for processes that do not map the node's memory.
//!
//! A job's ranks find (or start) their host's agent with [`AttachedClient::join`] (`join`, `host_agent`).
//!
//! The agent's side: `server` (who may connect, the requests), `session` (what one client holds, let go when
//! it goes), `payload` (bytes through the socket).

mod attached;
mod client;
mod connection;
mod host_agent;
mod host_process;
mod join;
mod mapped_lease;
mod payload;
mod pool_source;
mod reserve;
mod runner;
mod server;
mod session;
mod spin;
mod tenancy;

pub use attached::{AllocOptions, AttachedClient};
pub use client::{default_socket, LocalClient};
pub use host_process::{serve_host_agent, HostAgentLaunch, HOST_AGENT_SOCKET};
pub use join::{job_socket, JoinOptions};
pub use mapped_lease::LocalLease;

/// The hello a local client opens its connection with: no cluster, no node id of its own (`u16::MAX`), no lanes.
fn client_hello() -> crate::proto::message::Message {
    crate::proto::message::Message::Hello {
        cluster: String::new(),
        node: u16::MAX,
        protocol: crate::proto::codec::PROTOCOL_VERSION,
        lanes: 0,
        latency_lane: false,
    }
}

/// Largest payload chunk on the socket.
const MAX_CHUNK: u64 = 16 << 20;

/// The chunks a local call's payload is cut into.
const CHUNK: usize = 1 << 20;
