//! The agent: one node's daemon. It runs the node's [`Fabric`](crate::Fabric) and answers, over QUIC with
//! mutual TLS, for the regions whose home is this node; its own callers reach other nodes' regions through it.
//!
//! Every region's global address names its home node (the high 16 bits): the home holds the region's directory
//! entries for its whole life. A call on a region goes to the fabric in this process when the region's home is
//! this node, and to the home's agent otherwise, one QUIC stream per call: one request frame, page payloads as
//! checksummed chunks, one response frame ([`crate::proto`]).
//!
//! Peers: the cluster configuration lists every node (which of them are members now is every one, or, with
//! `[membership]`, etcd's word: `membership`); a node's certificate names it, and a connection whose
//! certificate names no node of the cluster, or whose first message is not a matching `Hello`, is closed with
//! the reason logged. Heartbeats mark a silent peer dead after `network.dead_after_ms`; calls on its regions
//! then fail with [`FabricError::PeerDead`](crate::FabricError::PeerDead) instead of hanging, and a replicated
//! region's standby takes over (`replication`, `failover`).
//!
//! The files, by role, from the bottom up:
//! - state: `shared` ([`Agent`] and what it holds), `peer` (one peer), `lane_use` (which lane a call takes),
//!   `lanes` (the latency lane's thread), `replicas` (copies of other nodes' pages), `forwarding` (regions that
//!   moved, and the hints that find them), `backups` (replicated regions and standby copies), `acting` (whom
//!   a call acts for), `standing` (this node's membership in etcd), `link` ([`LinkStats`]);
//! - the client side of the wire: `peers` (dialling, hello, liveness), `calls` (one request and its answer),
//!   `direct` (a call on the node a region's address names);
//! - what the agent does: `replication` (a home's writes reach its standbys), `failover` (a standby takes
//!   over from a dead home), `drain` (a leaving node hands its regions over), `migrate` (regions that move),
//!   `agent_lease` ([`AgentLease`]), `remote_lease` (leases on other nodes' pages, by QUIC), `page_route` and
//!   `routing` (which way a move goes, and its counts), `channels`, `channel_join`, `channel_pieces` and
//!   `channel_lease` (NCCL channels between this node's GPUs and peers', and leases whose pages cross them),
//!   `client` (the API), `serve`, `serve_pages` and `serve_channel` (answering peers), `start` (starting and stopping),
//!   `membership` (members kept in etcd), `status` (what an agent says about itself), `local` (a node's local clients, over a Unix socket), `launch` (jobs
//!   under `mpirun` or Slurm).

mod acting;
mod agent_lease;
mod backups;
mod call_metrics;
mod calls;
mod channel_join;
mod channel_lease;
mod channel_pieces;
mod channels;
mod client;
mod direct;
mod drain;
mod failover;
mod forwarding;
mod lane_use;
mod lanes;
pub mod launch;
mod link;
pub mod local;
#[cfg(feature = "etcd")]
mod membership;
pub mod metrics;
mod metrics_server;
mod migrate;
pub mod page_route;
mod peer;
mod peers;
mod remote_lease;
mod replicas;
mod replication;
mod routing;
mod serve;
mod serve_channel;
mod serve_pages;
mod shared;
#[cfg(feature = "etcd")]
mod standing;
mod start;
mod status;

pub use agent_lease::AgentLease;
pub use backups::{may_take_over, serves_alone};
pub use drain::Drained;
pub use launch::{rank_name, JobRank};
pub use link::LinkStats;
pub use local::{
    default_socket, job_socket, serve_host_agent, AllocOptions, AttachedClient, HostAgentLaunch, JoinOptions,
    LocalClient, LocalLease, HOST_AGENT_SOCKET,
};
#[cfg(feature = "etcd")]
pub use membership::{members_prefix, region_text, takeover_key};
pub use metrics_server::MetricsServer;
pub use remote_lease::version_after_release;
pub use replication::{Kept, Replication};
pub use shared::Agent;
pub use status::{AgentStatus, PeerStatus, ReplicationStatus, RouteStatus, TenantStatus};
