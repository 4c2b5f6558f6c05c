//! What every part of an agent shares: [`Agent`] itself (a handle, cheap to clone) and the state behind it.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Mutex;
use vfabric_transport::quic::BufferPool;

use super::backups::Backups;
use super::forwarding::{Hints, Moves};
use super::lane_use::LaneLoads;
use super::lanes::Lanes;
use super::peer::Peer;
use super::replicas::ReplicaCache;
use crate::config::NetworkSection;
use crate::directory::{Placement, RegionHandle as Region};
use crate::error::FabricError;
use crate::fabric::{Fabric, Lease};

/// One node's agent (cheap to clone; every clone drives the same agent).
#[derive(Clone)]
pub struct Agent {
    pub(crate) shared: Arc<Shared>,
}

/// The state of one agent.
pub(crate) struct Shared {
    pub(crate) cluster: String,
    pub(crate) node: u16,
    pub(crate) fabric: Fabric,
    /// One endpoint (UDP socket) per lane, on consecutive ports; lane 0's is the node's address.
    pub(crate) endpoints: Vec<quinn::Endpoint>,
    /// The latency lane's thread, when the agent runs on a multi-threaded runtime (`super::lanes`).
    pub(crate) lanes: Option<Lanes>,
    /// The runtime that started the agent: long work served on a lane's thread runs there instead.
    pub(crate) main: tokio::runtime::Handle,
    /// The task that holds the lane threads' stop (on the runtime that started the agent, so that they stop
    /// with it, or at `Agent::shutdown`).
    pub(crate) lane_stop: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(crate) net: NetworkSection,
    pub(crate) started: Instant,
    pub(crate) peers: Vec<Mutex<Peer>>,
    /// Calls in flight on each lane to each node, and long transfers to each.
    pub(crate) loads: LaneLoads,
    pub(crate) tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Leases peers hold on regions whose home is this node, by the id they were given.
    pub(crate) grants: std::sync::Mutex<std::collections::HashMap<u64, RemoteGrant>>,
    pub(crate) next_grant: std::sync::atomic::AtomicU64,
    /// Requests peers abandoned before this node granted them anything (`Message::Abandon` arrived first), the
    /// latest [`ABANDONED_KEPT`]: a grant for one of them is let go at once. Taken under `grants`' lock.
    pub(crate) abandoned: std::sync::Mutex<std::collections::VecDeque<(u16, u64)>>,
    /// The count in the ids of this node's calls to peers (`Message::Traced`).
    pub(crate) next_request: std::sync::atomic::AtomicU64,
    /// Copies of other nodes' pages kept after their leases ended.
    pub(crate) replicas: std::sync::Mutex<ReplicaCache>,
    /// Every region that holds a copy of another node's pages for a lease here (in use, or kept in `replicas`):
    /// private to this node, which no caller names and a leaving node does not hand over.
    pub(crate) private: std::sync::Mutex<std::collections::HashSet<Region>>,
    /// Other nodes' regions this node allocated with a lossless compression, and that compression: what it
    /// writes to them crosses the wire packed with it, as their homes' answers do, whatever
    /// `network.compression` says.
    pub(crate) lossless:
        std::sync::Mutex<std::collections::HashMap<vfabric_allocator::GlobalAddr, vfabric_allocator::Compression>>,
    /// Forwarding entries of this node's regions whose pages moved to another node.
    pub(crate) moves: Moves,
    /// Payload buffers for the chunks this agent sends (back from quinn once acknowledged).
    pub(crate) buffers: BufferPool,
    /// Where the pages of other nodes' regions were last found.
    pub(crate) hints: Hints,
    /// This node's replicated regions, and the standby copies it keeps for other homes.
    pub(crate) backups: Backups,
    /// Whether the cluster keeps its membership in etcd (`[membership]`).
    #[cfg(feature = "etcd")]
    pub(crate) membership: bool,
    /// This node's registration in etcd, with `[membership]`.
    #[cfg(feature = "etcd")]
    pub(crate) registration: Mutex<Option<super::standing::Registration>>,
    /// This node's standing in etcd (`None` without `[membership]`).
    #[cfg(feature = "etcd")]
    pub(crate) standing: std::sync::Mutex<Option<super::standing::Standing>>,
    /// The cluster's tenants: which local users act as which (`local/tenancy.rs`).
    pub(crate) tenants: Vec<crate::config::TenantSection>,
    /// The latencies of the calls it serves and makes (`[metrics]`).
    pub(crate) metrics: super::call_metrics::CallMetrics,
    /// Moves of pages to and from each peer, by the route they took (`super::page_route`).
    pub(crate) routes: std::sync::Mutex<super::page_route::RouteCounts>,
    /// Channels between this node's GPUs and peers' (`super::channels`).
    pub(crate) channels: super::channels::Channels,
}

/// How many abandoned requests an agent remembers (a request is abandoned before its grant only while it is
/// being served: a few per lane).
pub(crate) const ABANDONED_KEPT: usize = 1024;

/// A lease a peer holds here: the peer, the connection it came over (the lease ends when that connection
/// closes), and the local lease on the home's copy (host memory, or a lossy region's GPU) that keeps the pages'
/// coherence while the peer holds it.
pub(crate) struct RemoteGrant {
    pub(crate) peer: u16,
    pub(crate) connection: usize,
    /// The peer's id of the request that was granted (`Message::Traced`), which an `Abandon` names.
    pub(crate) request: Option<u64>,
    pub(crate) lease: Lease,
    /// Held while a channel still sends from the lease's pages (`super::serve_channel`): whoever ends the lease
    /// waits for it first ([`RemoteGrant::sent`]), so that its frames are not reused under the send.
    pub(crate) sending: Option<Arc<Mutex<()>>>,
}

impl RemoteGrant {
    /// The lease, once no channel sends from its pages any more.
    pub(crate) async fn sent(self) -> Lease {
        if let Some(s) = &self.sending {
            drop(s.lock().await);
        }
        self.lease
    }
}

impl Agent {
    /// This node's id (the home id in the addresses of the regions it allocates).
    pub fn node(&self) -> u16 {
        self.shared.node
    }

    /// The fabric of this node.
    pub fn fabric(&self) -> &Fabric {
        &self.shared.fabric
    }

    /// The address the agent listens on (its lane 0; lane `i` listens on the port `i` above).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        let unknown = || std::net::SocketAddr::from(([0, 0, 0, 0], 0));
        self.shared.endpoints.first().and_then(|e| e.local_addr().ok()).unwrap_or_else(unknown)
    }

    /// How many threads of their own the lanes run on: one, the latency lane's, when the agent was started on a
    /// multi-threaded runtime and the cluster has a latency lane (`network.latency_lane`), else none.
    pub fn lane_threads(&self) -> usize {
        self.shared.lanes.as_ref().map_or(0, |l| l.len())
    }

    /// How many regions of this node have their pages on another node (or in another region here) and so
    /// keep a forwarding entry: the regions that moved away. A copy that moved on keeps one only until its
    /// region's home names the new copy (or for good, when that message was lost: it is best effort).
    pub fn forwarding_entries(&self) -> usize {
        self.shared.moves.forwarding()
    }

    /// How many regions of this node are replicated (have standby copies on other nodes), and how many standby
    /// copies this node keeps for other nodes' regions (those that took over from a dead home included).
    pub fn replication(&self) -> (usize, usize) {
        (self.shared.backups.homed_count(), self.shared.backups.kept_count())
    }

    pub(crate) fn tasks(&self) -> std::sync::MutexGuard<'_, Vec<tokio::task::JoinHandle<()>>> {
        self.shared.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn replicas(&self) -> std::sync::MutexGuard<'_, ReplicaCache> {
        self.shared.replicas.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new id for a call to a peer: this node's id in the top 16 bits, a count below.
    pub(crate) fn request_id(&self) -> u64 {
        let n = self.shared.next_request.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        u64::from(self.shared.node) << 48 | n & ((1 << 48) - 1)
    }

    /// Allocates a region for a copy of another node's pages (see `Shared::private`).
    pub(crate) fn alloc_private(&self, size: u64, placement: Placement) -> Result<Region, FabricError> {
        let region = self.shared.fabric.alloc(size, placement)?;
        lock(&self.shared.private).insert(region);
        Ok(region)
    }

    /// Frees a region [`Agent::alloc_private`] made.
    pub(crate) fn free_private(&self, region: &Region) -> Result<(), FabricError> {
        lock(&self.shared.private).remove(region);
        self.shared.fabric.free(region)
    }

    /// Whether `region` holds a copy of another node's pages for a lease here.
    pub(crate) fn is_private(&self, region: &Region) -> bool {
        lock(&self.shared.private).contains(region)
    }

    pub(crate) fn grants(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, RemoteGrant>> {
        self.shared.grants.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn max_frame(&self) -> usize {
        self.shared.net.max_frame.bytes() as usize
    }

    /// How this node packs the page payloads it sends: `network.compression` (`lz4`, or `none`: as they are).
    pub(crate) fn packs(&self) -> vfabric_allocator::Compression {
        self.shared.net.compression
    }

    /// How the pages of `region` this node sends cross the wire: packed when the region's own compression is
    /// lossless (it asked for its pages to be packed wherever they leave a GPU), with LZ4, or with zstd when
    /// `network.wire_zstd` says so (zstd shrinks dense floats a little, at a few hundred MB/s a core: slower
    /// than fast links); else as `network.compression` says. The home knows each of its regions' compression;
    /// another node knows it of the regions it allocated itself.
    pub(crate) fn packs_pages_of(&self, region: &Region) -> vfabric_allocator::Compression {
        use vfabric_allocator::Compression;
        let own = match self.is_me(region.addr.node().0) {
            true => self.shared.fabric.compression_of(region).ok(),
            false => lock(&self.shared.lossless).get(&region.addr).copied(),
        };
        match own {
            Some(Compression::Zstd) if self.shared.net.wire_zstd => Compression::Zstd,
            Some(c) if c.is_lossless() => Compression::Lz4,
            _ => self.packs(),
        }
    }

    /// Whether `node` is this node.
    pub(crate) fn is_me(&self, node: u16) -> bool {
        node == self.shared.node
    }

    pub(crate) fn peer(&self, node: u16) -> Result<&Mutex<Peer>, FabricError> {
        self.shared.peers.get(usize::from(node)).ok_or_else(|| {
            FabricError::InvalidAddress(format!("node {node} is not in cluster {}", self.shared.cluster))
        })
    }
}

/// Runs a fabric call in place on this worker thread (the runtime moves its other tasks elsewhere): no thread
/// hop and no copies of the caller's buffers. On a single-threaded runtime (a lane's thread among them) it
/// simply runs.
pub(crate) fn in_place<T>(f: impl FnOnce() -> Result<T, FabricError>) -> Result<T, FabricError> {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        // Called from a single-threaded runtime (a caller's own): `block_in_place` would panic there.
        Ok(tokio::runtime::RuntimeFlavor::CurrentThread) | Err(_) => f(),
        Ok(_) => tokio::task::block_in_place(f),
    }
}

/// `m`'s guard, also after a panic while it was held (the tables stay usable).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
