//! The agent: one node's daemon. It runs the node's [`Fabric`] and answers, over QUIC with mutual TLS, for the
//! regions whose home is this node; its own callers reach other nodes' regions through it.
//!
//! Every region's global address names its home node (the high 16 bits): the home holds the region's directory
//! entries for its whole life. A call on a region goes to the fabric in this process when the region's home is
//! this node, and to the home's agent otherwise, one QUIC stream per call: one request frame ([`crate::proto`]),
//! page payloads as checksummed chunks ([`vfabric_transport::quic::chunk`]), one response frame.
//!
//! Peers: the cluster configuration lists every node (static membership); a node's certificate names it, and
//! a connection whose certificate names no node of the cluster, or whose first message is not a matching
//! `Hello`, is closed with the reason logged. Heartbeats mark a silent peer dead after `network.dead_after_ms`;
//! calls on its regions then fail with [`FabricError::PeerDead`] instead of hanging.

mod lanes;
pub mod launch;
mod link;
pub mod local;
mod moves;
mod serve;
mod wire;

pub use launch::{rank_name, JobRank};
pub use link::LinkStats;
pub use local::{default_socket, LocalClient};

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use vfabric_transport::quic::{self, NodeIdentity, QuicSettings};
use vfabric_transport::Location;

use crate::config::{ClusterConfig, NetworkSection};
use crate::directory::{Mode, Placement};
use crate::error::FabricError;
use crate::fabric::{Fabric, Lease, LeasePtr, Region};
use crate::proto::{read_frame, write_frame, Message, WireRegion, PROTOCOL_VERSION};

/// Calls moving this many bytes of pages or more are bulk transfers: they keep off the latency lane
/// ([`lanes_for`]), and are made and served off a lane's thread ([`lanes`]), whose one core also reads and
/// decrypts every packet of its lane. Smaller calls are bound by latency.
const BULK: u64 = 256 << 10;

/// The lanes a call that moves `bytes` of pages may take: every lane, but the latency lane (lane 0, when the
/// cluster has one: `network.latency_lane`) only for calls under [`BULK`]. Calls one after another take it
/// (the least busy lane, the lowest of those), and no bulk transfer sits in its queues; on a multi-threaded
/// runtime it runs on a thread of its own ([`lanes`]).
fn lanes_for(net: &NetworkSection, bytes: u64) -> std::ops::Range<usize> {
    let all = usize::from(net.connections());
    match bytes >= BULK && net.latency_lane {
        true => 1..all,
        false => 0..all,
    }
}

/// The bytes of the whole pages of `page_size` that `len` bytes from `offset` touch: what an acquire moves.
fn pages_of(page_size: u64, offset: u64, len: u64) -> u64 {
    let ps = page_size.max(1);
    let first = offset / ps;
    let end = offset.saturating_add(len).div_ceil(ps);
    end.saturating_sub(first).saturating_mul(ps)
}

/// A peer as this agent sees it.
struct Peer {
    name: String,
    /// Where its lane 0 listens (lane `i` listens on the port `i` above).
    addr: Option<SocketAddr>,
    /// One connection per lane, dialled on first use.
    conns: Vec<Option<quinn::Connection>>,
    last_seen: Option<Instant>,
}

impl Peer {
    /// Where lane `lane` of this peer listens.
    fn lane_addr(&self, lane: usize) -> Option<SocketAddr> {
        let a = self.addr?;
        let port = a.port().checked_add(u16::try_from(lane).ok()?)?;
        Some(SocketAddr::new(a.ip(), port))
    }
}

/// A call's hold on a lane to a node: counted in that lane's load until dropped.
///
/// A call takes the least busy lane it may take ([`lanes_for`]: bulk transfers leave the latency lane alone),
/// the lowest of those as little busy: calls one after another all take lane 0, and only calls at the same time
/// spread over the lanes. Taking the lanes in turn instead cost every call the wake-up of a thread (and a core)
/// that had been idle since the round before: measured on the H200 host with a thread per lane, a 64 KiB
/// acquire one at a time took 238-288 us over 4 lanes in turn and 158-178 over 1 lane (docs/benchmarks.md).
struct LaneUse {
    lane: usize,
    load: Arc<std::sync::atomic::AtomicUsize>,
}

impl LaneUse {
    /// Holds `lane` whatever its load (a call that must take that lane).
    fn enter(lane: usize, load: &Arc<std::sync::atomic::AtomicUsize>) -> LaneUse {
        load.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        LaneUse { lane, load: Arc::clone(load) }
    }

    /// Holds `lane` if its load is still `seen`.
    fn enter_if(lane: usize, load: &Arc<std::sync::atomic::AtomicUsize>, seen: usize) -> Option<LaneUse> {
        use std::sync::atomic::Ordering;
        load.compare_exchange(seen, seen + 1, Ordering::AcqRel, Ordering::Acquire).ok()?;
        Some(LaneUse { lane, load: Arc::clone(load) })
    }
}

impl Drop for LaneUse {
    fn drop(&mut self) {
        self.load.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

struct Shared {
    cluster: String,
    node: u16,
    fabric: Fabric,
    /// One endpoint (UDP socket) per lane, on consecutive ports; lane 0's is the node's address.
    endpoints: Vec<quinn::Endpoint>,
    /// The latency lane's thread, when the agent runs on a multi-threaded runtime ([`lanes`]).
    lanes: Option<lanes::Lanes>,
    /// The runtime that started the agent: long work served on a lane's thread runs there instead.
    main: tokio::runtime::Handle,
    /// The task that holds the lane threads' stop (on the runtime that started the agent, so that they stop
    /// with it, or at [`Agent::shutdown`]).
    lane_stop: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    net: NetworkSection,
    started: Instant,
    peers: Vec<Mutex<Peer>>,
    /// Reads and writes in flight to each node (by node index): a long call takes the lanes the others leave.
    transfers: Vec<std::sync::atomic::AtomicUsize>,
    /// Calls in flight on each lane to each node (by node, then lane): see [`LaneUse`].
    lane_load: Vec<Vec<Arc<std::sync::atomic::AtomicUsize>>>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Leases peers hold on regions whose home is this node: the lease id they were given, the peer, the
    /// connection it came over (the lease ends when that connection closes), and the local lease on the host
    /// copy that keeps the pages' coherence while they hold it.
    remote_leases: std::sync::Mutex<std::collections::HashMap<u64, RemoteGrant>>,
    next_remote_lease: std::sync::atomic::AtomicU64,
    replicas: std::sync::Mutex<ReplicaCache>,
    /// Forwarding entries of this node's regions whose pages moved to another node.
    moves: moves::Moves,
    /// Payload buffers for the chunks this agent sends (back from quinn once acknowledged).
    buffers: quic::BufferPool,
    /// Location hints: where the pages of other nodes' regions were last found (region -> hosted copy).
    hints: std::sync::Mutex<std::collections::HashMap<Region, Region>>,
}

/// A lease a peer holds here (see `Shared::remote_leases`).
struct RemoteGrant {
    peer: u16,
    connection: usize,
    lease: Lease,
}

/// Copies of other nodes' pages kept after their leases end, each at the version the home gave it: the next
/// acquire of the same range sends the version, and when it is still current the home sends no pages (the
/// lease still goes through the home, which keeps writers out while the copy is in use). Bounded by
/// `network.replica_cache` bytes, least recently used dropped first.
#[derive(Default)]
struct ReplicaCache {
    entries: std::collections::HashMap<ReplicaKey, Replica>,
    bytes: u64,
    tick: u64,
}

/// A region (address and generation), a page range and the device of this node the copy is on.
type ReplicaKey = (u64, u64, u64, u64, Location);

struct Replica {
    shadow: Region,
    version: u64,
    last_used: u64,
}

/// A lease from [`Agent::acquire`]: device pointers on this node, whatever the region's home.
///
/// For a region of another node, the home leases its host copy for the holder (so its other users see the
/// usual lease conflicts) and sends the pages; they land in a private region on this node's device, leased
/// here. [`Agent::release`] sends a `Write` lease's bytes back before the home lets go. Dropping a lease
/// instead of releasing it lets go at the home too, but a `Write` lease's changes are then lost.
pub struct AgentLease {
    kind: LeaseKind,
}

enum LeaseKind {
    Local(Lease),
    Remote(RemoteLease),
}

struct RemoteLease {
    agent: Agent,
    home: u16,
    /// The lane the lease was granted over: it is released over the same connection (the home ends a lease
    /// when the connection it came over closes).
    lane: usize,
    id: u64,
    mode: Mode,
    /// Where the copy goes back in the replica cache, and the home's version of the range.
    key: ReplicaKey,
    version: u64,
    pages: u64,
    /// The private region on this node that holds the pages, and its lease.
    shadow: Region,
    local: Option<Lease>,
    released: bool,
}

impl AgentLease {
    fn lease(&self) -> Option<&Lease> {
        match &self.kind {
            LeaseKind::Local(l) => Some(l),
            LeaseKind::Remote(r) => r.local.as_ref(),
        }
    }

    /// Device pointers to the leased pages on this node.
    pub fn ptr(&self) -> Option<&LeasePtr> {
        self.lease().map(Lease::ptr)
    }

    /// The local lease (its device, frames and pointers).
    pub fn local(&self) -> Option<&Lease> {
        self.lease()
    }

    /// The node the region lives at.
    pub fn home(&self, agent: &Agent) -> u16 {
        match &self.kind {
            LeaseKind::Local(_) => agent.node(),
            LeaseKind::Remote(r) => r.home,
        }
    }
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Not released: let go at the home (in the background: drop cannot wait) and free the copy here.
        drop(self.local.take());
        let (agent, home, lane, id, shadow) = (self.agent.clone(), self.home, self.lane, self.id, self.shadow);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let release = async {
                    agent.call_on(home, &agent.hold_lane(home, lane)?, &Message::Release { lease: id }, &[]).await
                };
                if let Err(e) = release.await {
                    tracing::warn!(home, lease = id, error = %e, "releasing a dropped remote lease failed");
                }
                let _ = agent.free(&shadow).await;
            });
        }
    }
}

/// One node's agent (cheap to clone; every clone drives the same agent).
#[derive(Clone)]
pub struct Agent {
    shared: Arc<Shared>,
}

impl Agent {
    /// Starts node `name` of `config`: its fabric, its QUIC endpoint on `bind` (default: the node's configured
    /// address), the task that serves peers, and heartbeats. Runs inside a tokio runtime: [`Agent::runtime`] makes one.
    pub async fn start(
        config: &ClusterConfig,
        name: &str,
        identity: &NodeIdentity,
        bind: Option<SocketAddr>,
    ) -> Result<Agent, FabricError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(FabricError::Network("the agent runs inside a tokio runtime (see `Agent::runtime`)".into()));
        }
        // A configuration made or changed in code gets the checks a file gets (lanes, ports, windows, ...).
        config.check(&format!("the configuration of cluster `{}`", config.cluster.name))?;
        let node = config.node_index(name)?;
        let net = config.network.clone();
        let bind = match bind {
            Some(b) => b,
            None => configured_addr(config, node)?.ok_or_else(|| {
                FabricError::Network(format!("node `{name}` has no address in the configuration and none was given"))
            })?,
        };
        let cfg = config.clone();
        let fabric = tokio::task::spawn_blocking(move || Fabric::for_node(&cfg, node))
            .await
            .map_err(|e| FabricError::Network(format!("starting the fabric: {e}")))??;
        // Bound only once the fabric is up: peers' handshakes wait for the accept loop, and would time out.
        let settings = QuicSettings {
            mtu: net.mtu,
            stream_window: net.stream_window.bytes(),
            connection_window: net.connection_window.bytes(),
            socket_buffer: usize::try_from(net.socket_buffer.bytes()).unwrap_or(usize::MAX),
            ..QuicSettings::default()
        };
        // On a multi-threaded runtime the latency lane gets a thread of its own (see `lanes`).
        let threaded = tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
        let (lanes, lane_stop) = match threaded && net.latency_lane {
            true => lanes::Lanes::start(1, name)
                .map(|(l, stop)| (Some(l), Some(stop)))
                .map_err(|e| FabricError::Network(format!("starting the lane threads: {e}")))?,
            false => (None, None),
        };
        let endpoints = bind_lanes(bind, usize::from(net.connections()), identity, &settings, lanes.as_ref())?;
        let mut peers = Vec::new();
        for i in 0..config.nodes.len() as u16 {
            let addr = configured_addr(config, i)?;
            peers.push(Mutex::new(Peer {
                name: config.nodes[usize::from(i)].name.clone(),
                addr,
                conns: vec![None; usize::from(net.connections())],
                last_seen: None,
            }));
        }
        // Nothing fails after this: the lane threads live until the runtime that started the agent ends (or
        // the agent shuts down). Until here, a failure drops their stop, and they end.
        let lane_stop = lane_stop.map(|stop| {
            tokio::spawn(async move {
                let _stop = stop;
                std::future::pending::<()>().await
            })
        });
        let lanes_n = usize::from(net.connections());
        let shared = Arc::new(Shared {
            cluster: config.cluster.name.clone(),
            node,
            fabric,
            endpoints,
            lanes,
            main: tokio::runtime::Handle::current(),
            lane_stop: std::sync::Mutex::new(lane_stop),
            net,
            started: Instant::now(),
            transfers: (0..config.nodes.len()).map(|_| std::sync::atomic::AtomicUsize::new(0)).collect(),
            lane_load: (0..config.nodes.len())
                .map(|_| (0..lanes_n).map(|_| Arc::new(std::sync::atomic::AtomicUsize::new(0))).collect())
                .collect(),
            peers,
            tasks: std::sync::Mutex::new(Vec::new()),
            remote_leases: std::sync::Mutex::new(std::collections::HashMap::new()),
            next_remote_lease: std::sync::atomic::AtomicU64::new(1),
            replicas: std::sync::Mutex::new(ReplicaCache::default()),
            moves: moves::Moves::default(),
            hints: std::sync::Mutex::new(std::collections::HashMap::new()),
            // Enough for the chunks in flight on every lane at the default windows (64 x 1 MiB).
            buffers: quic::BufferPool::new(64),
        });
        let agent = Agent { shared };
        let serving = (0..agent.shared.endpoints.len())
            .map(|lane| {
                let accepting = serve::accept_loop(Arc::clone(&agent.shared), lane);
                match agent.shared.lanes.as_ref().and_then(|l| l.runtime(lane)) {
                    Some(rt) => rt.handle().spawn(accepting),
                    None => tokio::spawn(accepting),
                }
            })
            .collect::<Vec<_>>();
        let beating = tokio::spawn(heartbeat_loop(agent.clone()));
        agent.tasks().extend(serving.into_iter().chain([beating]));
        tracing::info!(
            node,
            name,
            addr = %agent.local_addr(),
            lanes = agent.shared.net.lanes,
            latency_lane = agent.shared.net.latency_lane,
            lane_threads = agent.lane_threads(),
            "agent started"
        );
        Ok(agent)
    }

    /// A runtime for an agent: `threads` workers, or with 0 the machine's choice: one thread on a machine of two
    /// cores or fewer, every core above that. One thread is a current-thread runtime: no wake-ups between
    /// workers, page copies run in line. Measured on a 2-core machine with two agents on loopback, one thread
    /// each moved 12-15 Gbit/s against 9-10 with two workers each (docs/benchmarks.md). On a multi-threaded
    /// runtime the latency lane also gets a thread of its own (the `lanes` module).
    pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match threads {
            0 if cores <= 2 => Agent::runtime(1),
            1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
            0 => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
            n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
        }
    }

    /// Starts node `name` with the identity `vfabric cluster init` wrote into the configuration's
    /// `network.certs` folder.
    pub async fn start_from_config(config: &ClusterConfig, name: &str) -> Result<Agent, FabricError> {
        let identity = NodeIdentity::load(Path::new(&config.network.certs), name)
            .map_err(|e| FabricError::Network(format!("loading {name}'s certificate: {e}")))?;
        Self::start(config, name, &identity, None).await
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, Vec<tokio::task::JoinHandle<()>>> {
        self.shared.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many threads of their own the lanes run on: one, the latency lane's, when the agent was started on a
    /// multi-threaded runtime and the cluster has a latency lane (`network.latency_lane`), else none (see the
    /// `lanes` module).
    pub fn lane_threads(&self) -> usize {
        self.shared.lanes.as_ref().map_or(0, |l| l.len())
    }

    /// How many regions of this node have their pages on another node (or in another region here) and so
    /// keep a forwarding entry: the regions that moved away. A copy that moved on keeps one only until its
    /// region's home names the new copy (or for good, when that message was lost: it is best effort).
    pub fn forwarding_entries(&self) -> usize {
        self.shared.moves.forwarding()
    }

    /// This node's id (the home id in the addresses of the regions it allocates).
    pub fn node(&self) -> u16 {
        self.shared.node
    }

    /// The address the agent listens on (its lane 0; lane `i` listens on the port `i` above).
    pub fn local_addr(&self) -> SocketAddr {
        let unknown = || SocketAddr::from(([0, 0, 0, 0], 0));
        self.shared.endpoints.first().and_then(|e| e.local_addr().ok()).unwrap_or_else(unknown)
    }

    /// The fabric of this node.
    pub fn fabric(&self) -> &Fabric {
        &self.shared.fabric
    }

    /// Sets where peer `node` listens (when the configuration does not say, as in tests that bind port 0).
    pub async fn set_peer_addr(&self, node: u16, addr: SocketAddr) -> Result<(), FabricError> {
        let mut p = self.peer(node)?.lock().await;
        p.addr = Some(addr);
        p.conns.iter_mut().for_each(|c| *c = None);
        // Its grace period before heartbeats may call it dead starts now.
        p.last_seen = Some(Instant::now());
        Ok(())
    }

    fn peer(&self, node: u16) -> Result<&Mutex<Peer>, FabricError> {
        self.shared.peers.get(usize::from(node)).ok_or_else(|| {
            FabricError::InvalidAddress(format!("node {node} is not in cluster {}", self.shared.cluster))
        })
    }

    /// Allocates a region whose home is `node` (this one or a peer), placed on `device` of that node if given.
    pub async fn alloc(&self, node: u16, size: u64, device: Option<Location>) -> Result<Region, FabricError> {
        if node == self.shared.node {
            let placement = device.map(Placement::on).unwrap_or_default();
            return in_place(|| self.shared.fabric.alloc(size, placement));
        }
        let msg = Message::Alloc { size, device: device.map(Into::into) };
        match self.call(node, &msg, &[]).await? {
            Message::Allocated { region } => Ok(Region::from(&region)),
            other => Err(unexpected(node, &other)),
        }
    }

    /// Frees a region at its home (and its pages wherever they moved).
    pub async fn free(&self, region: &Region) -> Result<(), FabricError> {
        let home = region.addr.node().0;
        let freed = if home == self.shared.node {
            self.free_at_home(region).await
        } else {
            match self.call(home, &Message::Free { region: WireRegion::from(region) }, &[]).await {
                Ok(Message::Done) => Ok(()),
                Ok(other) => Err(unexpected(home, &other)),
                Err(e) => Err(e),
            }
        };
        self.hints().remove(region);
        freed
    }

    /// Writes `data` into the region at `offset`, wherever its pages are.
    pub async fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let mut route = moves::Route::new(self, region);
        loop {
            let at = route.target();
            let r = async {
                let _staying = self.stay_if_here(&at).await?;
                self.write_direct(&at, offset, data).await
            };
            if let Some(r) = route.settle(r.await) {
                return r;
            }
        }
    }

    /// Reads the region at `offset` into `buf`, wherever its pages are. Every byte that crossed the wire was
    /// checksummed and verified.
    pub async fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let mut route = moves::Route::new(self, region);
        loop {
            let at = route.target();
            let r = async {
                let _staying = self.stay_if_here(&at).await?;
                self.read_direct(&at, offset, buf).await
            };
            if let Some(r) = route.settle(r.await) {
                return r;
            }
        }
    }

    /// For a call on `region` when it is a region of this node: the guard that keeps it here meanwhile.
    async fn stay_if_here(
        &self,
        region: &Region,
    ) -> Result<Option<tokio::sync::OwnedRwLockReadGuard<Option<Region>>>, FabricError> {
        if region.addr.node().0 == self.shared.node {
            self.staying(region).await.map(Some)
        } else {
            Ok(None)
        }
    }

    /// Acquires `range` of a region on `device` of this node, wherever the region's home is: when it returns,
    /// the pages are on the device at the lease's pointers until [`Agent::release`]. For another node's region
    /// the home holds the matching lease on its copy meanwhile, so a `Write` lease here excludes every other
    /// lease there, and a `Read` lease excludes writers.
    pub async fn acquire(
        &self,
        region: &Region,
        range: std::ops::Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<AgentLease, FabricError> {
        // Checked against the region as its user knows it: a hosted copy may be longer (another page size).
        if range.end > region.len {
            let len = range.end.saturating_sub(range.start);
            return Err(FabricError::OutOfBounds { offset: range.start, len, region_len: region.len });
        }
        let mut route = moves::Route::new(self, region);
        loop {
            let at = route.target();
            if let Some(r) = route.settle(self.acquire_at(&at, range.clone(), device, mode).await) {
                return r;
            }
        }
    }

    /// [`Agent::acquire`] on the region that has the pages (this node's, or a peer's: then it is that peer's
    /// home region, and the pages come from there).
    async fn acquire_at(
        &self,
        region: &Region,
        range: std::ops::Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<AgentLease, FabricError> {
        let home = region.addr.node().0;
        if home == self.shared.node {
            let _staying = self.staying(region).await?;
            let l = in_place(|| self.shared.fabric.acquire(region, range, device, mode))?;
            return Ok(AgentLease { kind: LeaseKind::Local(l) });
        }
        // The pages of the range cross the wire, and come back with a write lease's release on the same lane.
        let bytes = pages_of(region.page_size, range.start, range.end.saturating_sub(range.start));
        let lane = self.take_lane(home, bytes)?;
        let region = *region;
        self.on_lane(lane.lane, bytes, move |agent| async move {
            agent.acquire_remote(region, range, device, mode, lane).await
        })
        .await
    }

    /// [`Agent::acquire_at`] a peer's region, over `lane`.
    async fn acquire_remote(
        &self,
        region: Region,
        range: std::ops::Range<u64>,
        device: Location,
        mode: Mode,
        lane: LaneUse,
    ) -> Result<AgentLease, FabricError> {
        let (region, home) = (&region, region.addr.node().0);
        let len = range.end.checked_sub(range.start).filter(|&l| l > 0 && range.end <= region.len).ok_or(
            FabricError::OutOfBounds {
                offset: range.start,
                len: range.end.saturating_sub(range.start),
                region_len: region.len,
            },
        )?;
        let ps = region.page_size.max(1);
        let first = range.start / ps;
        let pages = (range.start + len).div_ceil(ps) - first;
        let key: ReplicaKey = (region.addr.raw(), region.generation, first, pages, device);
        let full = pages * ps;
        let f = &self.shared.fabric;
        // The copy the pages go into, straight from the wire: one from an earlier lease (taken out of the cache
        // while this lease uses it; its version tells the home whether to send the pages at all), or a new one.
        let cached = {
            let mut c = self.replicas();
            let taken = c.entries.remove(&key);
            if let Some(r) = &taken {
                c.bytes -= r.shadow.len;
            }
            taken.map(|r| (r.shadow, r.version))
        };
        let (shadow, cached) = match cached {
            Some((shadow, version)) => (shadow, Some(version)),
            None => (in_place(|| f.alloc(full, Placement::on(device)))?, None),
        };
        // Freed on every way out but the lease, a caller dropping this call at an await included.
        let filling = CopyInFill { fabric: f, copy: shadow, kept: false };
        let msg = Message::Acquire {
            region: WireRegion::from(region),
            offset: range.start,
            len,
            device: device.into(),
            mode: mode.into(),
            cached,
        };
        let expect = |m: &Message| if matches!(m, Message::Granted { unchanged: true, .. }) { 0 } else { full };
        let into = ReadInto::Region { copy: &shadow, offset: first * ps };
        let reply = self.call_read_some(home, &lane, &msg, into, expect).await;
        let (id, version) = match reply {
            Ok(Message::Granted { lease, first_page, pages: n, version, unchanged })
                if first_page == first && n == pages && (cached.is_some() || !unchanged) =>
            {
                (lease, version)
            }
            // Whatever arrived of the pages is not to be trusted: the copy goes (`filling`).
            other => {
                return Err(match other {
                    Ok(m) => unexpected(home, &m),
                    Err(e) => e,
                });
            }
        };
        match in_place(|| f.acquire(&shadow, 0..full, device, mode)) {
            Ok(l) => Ok(AgentLease {
                kind: LeaseKind::Remote(RemoteLease {
                    agent: self.clone(),
                    home,
                    lane: lane.lane,
                    id,
                    mode,
                    key,
                    version,
                    pages,
                    shadow: filling.keep(),
                    local: Some(l),
                    released: false,
                }),
            }),
            Err(e) => {
                drop(filling);
                let _ = self.call_on(home, &lane, &Message::Release { lease: id }, &[]).await;
                Err(e)
            }
        }
    }

    fn replicas(&self) -> std::sync::MutexGuard<'_, ReplicaCache> {
        self.shared.replicas.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a copy for the next lease of the same range (or frees it when the cache is off or it does not
    /// fit), dropping the least recently used copies beyond the cache's size.
    fn keep_replica(&self, key: ReplicaKey, shadow: Region, version: u64) {
        let cap = self.shared.net.replica_cache.bytes();
        let mut dropped = Vec::new();
        {
            let mut c = self.replicas();
            if shadow.len > cap {
                dropped.push(shadow);
            } else {
                c.tick += 1;
                let tick = c.tick;
                if let Some(old) = c.entries.insert(key, Replica { shadow, version, last_used: tick }) {
                    c.bytes -= old.shadow.len;
                    dropped.push(old.shadow);
                }
                c.bytes += shadow.len;
                while c.bytes > cap {
                    let Some((&k, _)) = c.entries.iter().min_by_key(|(_, r)| r.last_used) else { break };
                    if let Some(r) = c.entries.remove(&k) {
                        c.bytes -= r.shadow.len;
                        dropped.push(r.shadow);
                    }
                }
            }
        }
        for r in dropped {
            if let Err(e) = in_place(|| self.shared.fabric.free(&r)) {
                tracing::warn!(region = %r, error = %e, "freeing a dropped replica failed");
            }
        }
    }

    /// Releases a lease from [`Agent::acquire`]; a `Write` lease's pages go back to the region's home first.
    pub async fn release(&self, lease: AgentLease) -> Result<(), FabricError> {
        let mut r = match lease.kind {
            LeaseKind::Local(l) => return in_place(|| self.shared.fabric.release(l)),
            LeaseKind::Remote(r) => r,
        };
        r.released = true;
        let (f, shadow, local, mode) = (&self.shared.fabric, r.shadow, r.local.take(), r.mode);
        let bytes = in_place(|| {
            if let Some(l) = local {
                f.release(l)?;
            }
            let mut v = Vec::new();
            if mode == Mode::Write {
                v = vec![0u8; shadow.len as usize];
                f.read(&shadow, 0, &mut v)?;
            }
            Ok(v)
        });
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                let _ = in_place(|| f.free(&shadow));
                if let Ok(lane) = self.hold_lane(r.home, r.lane) {
                    let _ = self.call_on(r.home, &lane, &Message::Release { lease: r.id }, &[]).await;
                }
                return Err(e);
            }
        };
        let (home, lease_id) = (r.home, r.id);
        let released = match self.hold_lane(home, r.lane) {
            Ok(lane) => {
                let release = Message::Release { lease: lease_id };
                self.on_lane(r.lane, bytes.len() as u64, move |agent| async move {
                    agent.call_on(home, &lane, &release, &bytes).await
                })
                .await
            }
            Err(e) => Err(e),
        };
        match released {
            Ok(Message::Done) => {
                // A write lease's release bumps each of its pages' versions once at the home.
                let version = if mode == Mode::Write { r.version.wrapping_add(r.pages) } else { r.version };
                self.keep_replica(r.key, shadow, version);
                Ok(())
            }
            other => {
                let _ = in_place(|| f.free(&shadow));
                match other {
                    Ok(m) => Err(unexpected(r.home, &m)),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Moves a region to `device` of its home node (a migration at the home: pages on the home's other GPUs
    /// move there over NVLink, those that do not fit go to host memory); pages that had moved to another node
    /// come back. The same as [`Agent::migrate_to`] the home.
    pub async fn migrate(&self, region: &Region, device: Location) -> Result<(), FabricError> {
        self.migrate_to(region, region.addr.node().0, device).await
    }

    /// Moves a region's pages to `device` of node `node`, any node of the cluster. The region keeps its address
    /// and its home: the home copies the pages there (checksummed on the wire like every page), frees its own
    /// copy and forwards later calls; callers learn the new place once and go there directly after (a location
    /// hint, corrected when it goes stale). Fails, leaving the region where it was, while a lease is held on it.
    pub async fn migrate_to(&self, region: &Region, node: u16, device: Location) -> Result<(), FabricError> {
        let home = region.addr.node().0;
        let moved = if home == self.shared.node {
            self.migrate_at_home(region, node, device).await.map(|_| ())
        } else {
            let msg = Message::MigrateTo { region: WireRegion::from(region), node, device: device.into() };
            match self.call(home, &msg, &[]).await {
                // The home answers with where the pages are now.
                Err(FabricError::Moved { .. }) => Ok(()),
                Ok(other) => Err(unexpected(home, &other)),
                Err(e) => Err(e),
            }
        };
        // Whatever this node knew of the region's place may be stale now: ask the home next time.
        self.hints().remove(region);
        moved
    }

    /// The lanes to peer `node` that have an open connection, by number (each is dialled on first use).
    pub async fn open_lanes(&self, node: u16) -> Result<Vec<usize>, FabricError> {
        let p = self.peer(node)?.lock().await;
        let open = p.conns.iter().enumerate().filter(|(_, c)| c.as_ref().is_some_and(|c| c.close_reason().is_none()));
        Ok(open.map(|(lane, _)| lane).collect())
    }

    /// Counters of the QUIC connections to peer `node` (packets, losses, congestion, flow-control stalls), summed
    /// over its open lanes: take them before and after a transfer and compare with [`LinkStats::since`].
    pub async fn link_stats(&self, node: u16) -> Result<LinkStats, FabricError> {
        let p = self.peer(node)?.lock().await;
        let mut stats = LinkStats::default();
        for c in p.conns.iter().flatten().filter(|c| c.close_reason().is_none()) {
            stats.add(&c.stats());
        }
        Ok(stats)
    }

    /// Round trip to a peer's agent.
    pub async fn ping(&self, node: u16) -> Result<Duration, FabricError> {
        let t = Instant::now();
        let nonce = t.elapsed().as_nanos() as u64 ^ 0x5eed;
        let lane = self.take_lane(node, 0)?;
        let ping = Message::Ping { nonce };
        match self
            .on_lane(lane.lane, 0, move |agent| async move { agent.call_on(node, &lane, &ping, &[]).await })
            .await?
        {
            Message::Pong { nonce: n } if n == nonce => Ok(t.elapsed()),
            other => Err(unexpected(node, &other)),
        }
    }

    /// Whether peer `node` answered within `network.dead_after_ms` (always true for this node).
    pub async fn is_alive(&self, node: u16) -> Result<bool, FabricError> {
        if node == self.shared.node {
            return Ok(true);
        }
        let p = self.peer(node)?.lock().await;
        Ok(self.alive(&p))
    }

    fn alive(&self, p: &Peer) -> bool {
        let dead_after = Duration::from_millis(self.shared.net.dead_after_ms);
        match p.last_seen {
            Some(t) => t.elapsed() < dead_after,
            // Never heard from: give it the grace period after start.
            None => self.shared.started.elapsed() < dead_after,
        }
    }

    /// Closes every connection (peers' calls in flight fail with a closed-connection error), stops serving
    /// and waits up to a second for the endpoint to go idle.
    pub async fn shutdown(&self) {
        let tasks: Vec<_> = self.tasks().drain(..).collect();
        for t in &tasks {
            t.abort();
        }
        for e in &self.shared.endpoints {
            e.close(quinn::VarInt::from_u32(0), b"shutdown");
        }
        let idle = async {
            for e in &self.shared.endpoints {
                e.wait_idle().await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), idle).await;
        // The endpoints are idle (or had their second): their threads may go. They end on their own, unjoined.
        if let Some(t) = self.shared.lane_stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
        tracing::info!(node = self.shared.node, "agent stopped");
    }

    /// The least busy lane to `node` (the lowest of those as little busy) for a call that moves `bytes` of
    /// pages, held for the call until the guard is dropped.
    fn take_lane(&self, node: u16, bytes: u64) -> Result<LaneUse, FabricError> {
        self.take_lanes(node, 1, bytes)?.pop().ok_or_else(|| FabricError::Network(format!("node {node}: no lanes")))
    }

    /// The `n` least busy lanes to `node` (at most each lane that [`lanes_for`] gives once) for calls that
    /// move `bytes` of pages each, each held until its guard is dropped.
    fn take_lanes(&self, node: u16, n: usize, bytes: u64) -> Result<Vec<LaneUse>, FabricError> {
        let loads = self.lane_loads(node)?;
        let usable = lanes_for(&self.shared.net, bytes);
        if usable.is_empty() || usable.end > loads.len() {
            return Err(FabricError::Network(format!("node {node}: no lane for a call of {bytes} bytes")));
        }
        let mut taken: Vec<LaneUse> = Vec::with_capacity(n.min(usable.len()));
        while taken.len() < n.min(usable.len()) {
            let free = usable.clone().filter(|l| taken.iter().all(|t| t.lane != *l));
            let Some((lane, load)) =
                free.map(|l| (l, loads[l].load(std::sync::atomic::Ordering::Acquire))).min_by_key(|&(l, v)| (v, l))
            else {
                break;
            };
            // Taken only if no other call took it meanwhile (else look again): calls that start together, such
            // as the streams of one connection that end together, then spread instead of all taking one lane.
            if let Some(held) = LaneUse::enter_if(lane, &loads[lane], load) {
                taken.push(held);
            }
        }
        Ok(taken)
    }

    /// Lane `lane` to `node`, held whatever its load (a lease's release goes over the lane it was granted on).
    fn hold_lane(&self, node: u16, lane: usize) -> Result<LaneUse, FabricError> {
        let loads = self.lane_loads(node)?;
        let load = loads.get(lane).ok_or_else(|| {
            FabricError::Network(format!("lane {lane} of node {node}: there are {} lanes", loads.len()))
        })?;
        Ok(LaneUse::enter(lane, load))
    }

    fn lane_loads(&self, node: u16) -> Result<&[Arc<std::sync::atomic::AtomicUsize>], FabricError> {
        self.shared.lane_load.get(usize::from(node)).map(Vec::as_slice).ok_or_else(|| {
            FabricError::InvalidAddress(format!("node {node} is not in cluster {}", self.shared.cluster))
        })
    }

    /// The connection to peer `node` on `lane`, dialled from this node's endpoint of
    /// the same lane and greeted on first use (and again after it closed). `probe` (pings) dials even a peer
    /// thought dead: that is how one that comes back is seen again.
    async fn connection(&self, node: u16, lane: usize, probe: bool) -> Result<quinn::Connection, FabricError> {
        if node == self.shared.node {
            return Err(FabricError::InvalidAddress(format!("node {node} is this node")));
        }
        let p = self.peer(node)?.lock().await;
        if !probe && !self.alive(&p) {
            return Err(FabricError::PeerDead {
                node,
                name: p.name.clone(),
                why: format!("no heartbeat for {} ms", self.shared.net.dead_after_ms),
            });
        }
        let (Some(endpoint), true) = (self.shared.endpoints.get(lane), lane < p.conns.len()) else {
            return Err(FabricError::Network(format!("lane {lane} of node {node}: there are {} lanes", p.conns.len())));
        };
        if let Some(c) = p.conns[lane].as_ref().filter(|c| c.close_reason().is_none()) {
            return Ok(c.clone());
        }
        let name = p.name.clone();
        let addr = p
            .lane_addr(lane)
            .ok_or_else(|| FabricError::Network(format!("node {node} ({name}) has no known address")))?;
        // The dial runs without the peer's lock: two nodes dialling each other at once each need the other to
        // look them up (and serve their hello) before either dial ends.
        drop(p);
        let dead_after = Duration::from_millis(self.shared.net.dead_after_ms);
        let dial = async {
            let conn = quic::connect(endpoint, addr, &name)
                .await
                .map_err(|e| FabricError::Network(format!("connecting to {name} at {addr}: {e}")))?;
            let (mut send, mut recv) = conn.open_bi().await.map_err(net)?;
            let hello = Message::Hello {
                cluster: self.shared.cluster.clone(),
                node: self.shared.node,
                protocol: PROTOCOL_VERSION,
                lanes: self.shared.net.lanes,
                latency_lane: self.shared.net.latency_lane,
            };
            let max = self.max_frame();
            write_frame(&mut send, &hello, max).await.map_err(proto)?;
            send.finish().map_err(|e| FabricError::Network(e.to_string()))?;
            match read_frame(&mut recv, max).await.map_err(proto)? {
                Some(Message::Welcome { node: n, .. }) if n == node => Ok(conn),
                Some(Message::Error { kind, message }) => Err(FabricError::Remote { node, kind, message }),
                other => Err(FabricError::Protocol(format!("node {node} answered hello with {other:?}"))),
            }
        };
        let conn = tokio::time::timeout(dead_after, dial).await.map_err(|_| FabricError::PeerDead {
            node,
            name: name.clone(),
            why: format!("no answer to hello within {} ms", dead_after.as_millis()),
        })??;
        let mut p = self.peer(node)?.lock().await;
        p.last_seen = Some(Instant::now());
        // Another call on this lane may have dialled meanwhile: keep the connection already in use (leases may
        // have been granted over it, and they end with it), close this one.
        if let Some(c) = p.conns[lane].as_ref().filter(|c| c.close_reason().is_none()) {
            conn.close(quinn::VarInt::from_u32(0), b"a connection on this lane exists");
            return Ok(c.clone());
        }
        p.conns[lane] = Some(conn.clone());
        Ok(conn)
    }

    /// Runs a call's `work`, which moves `bytes` of pages, on `lane`'s thread when it has one, where that
    /// lane's connections are driven ([`lanes`]): a call bound by latency then makes no hops between threads
    /// until its answer is in. In place otherwise, and for a call of [`BULK`] bytes or more (which the latency
    /// lane never carries): its copies and checksums would hold up the thread that decrypts the lane's packets.
    async fn on_lane<T, F>(&self, lane: usize, bytes: u64, work: impl FnOnce(Agent) -> F) -> Result<T, FabricError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, FabricError>> + Send + 'static,
    {
        match &self.shared.lanes {
            Some(lanes) if bytes < BULK && lanes.runtime(lane).is_some() => lanes.run(lane, work(self.clone())).await,
            _ => work(self.clone()).await,
        }
    }

    /// Runs long `work` (a migration: whole regions copied, several calls) on the runtime that started the
    /// agent when called on a lane's thread, so that the lane's connections and its other calls keep moving
    /// meanwhile; in place anywhere else. Once started it runs to its end, also when the caller goes: a
    /// migration cut off halfway would leave its new copy behind.
    async fn off_lanes<T, F>(&self, work: impl FnOnce(Agent) -> F) -> Result<T, FabricError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, FabricError>> + Send + 'static,
    {
        match &self.shared.lanes {
            Some(lanes) if lanes.is_lane_thread() => self
                .shared
                .main
                .spawn(work(self.clone()))
                .await
                .map_err(|e| FabricError::Network(format!("the work ended without an answer: {e}")))?,
            _ => work(self.clone()).await,
        }
    }

    fn max_frame(&self) -> usize {
        self.shared.net.max_frame.bytes() as usize
    }

    /// One request to `node`: the frame, then `payload` as checksummed chunks; returns the response frame.
    async fn call(&self, node: u16, msg: &Message, payload: &[u8]) -> Result<Message, FabricError> {
        self.call_on(node, &self.take_lane(node, payload.len() as u64)?, msg, payload).await
    }

    /// [`Agent::call`] on a lane the caller holds.
    async fn call_on(&self, node: u16, lane: &LaneUse, msg: &Message, payload: &[u8]) -> Result<Message, FabricError> {
        let work = async {
            let conn = self.connection(node, lane.lane, matches!(msg, Message::Ping { .. })).await?;
            let (mut send, mut recv) = conn.open_bi().await.map_err(net)?;
            write_frame(&mut send, msg, self.max_frame()).await.map_err(proto)?;
            let chunk = self.shared.net.chunk.bytes() as usize;
            let mut stopped = None;
            for (i, piece) in payload.chunks(chunk).enumerate() {
                let bytes = self.shared.buffers.copy_of(piece).into_bytes();
                match quic::write_chunk(&mut send, (i * chunk) as u64, bytes).await {
                    Ok(()) => {}
                    // The peer answered before taking the payload (a refusal: the region moved, is out of
                    // bounds, ...) and stopped the stream: its answer says why.
                    Err(e @ quic::QuicError::Write(quinn::WriteError::Stopped(_))) => {
                        stopped = Some(e);
                        break;
                    }
                    Err(e) => return Err(FabricError::Network(e.to_string())),
                }
            }
            if stopped.is_none() {
                send.finish().map_err(|e| FabricError::Network(e.to_string()))?;
            }
            let reply = read_frame(&mut recv, self.max_frame()).await.map_err(proto)?;
            self.heard_from(node).await;
            match (reply_or_error(node, reply), stopped) {
                // A success for a payload that did not all arrive would be a peer's bug: never take it.
                (Ok(_), Some(e)) => Err(FabricError::Network(e.to_string())),
                (r, _) => r,
            }
        };
        self.bounded(node, work).await
    }

    /// A read request to `node` on `lane`: the response frame, then the chunks, each verified and put where
    /// `into` says; `expect` says from the reply how many bytes must follow.
    async fn call_read_some(
        &self,
        node: u16,
        lane: &LaneUse,
        msg: &Message,
        mut into: ReadInto<'_>,
        expect: impl Fn(&Message) -> u64,
    ) -> Result<Message, FabricError> {
        let max_chunk = self.shared.net.chunk.bytes();
        let work = async {
            let conn = self.connection(node, lane.lane, false).await?;
            let (mut send, mut recv) = conn.open_bi().await.map_err(net)?;
            write_frame(&mut send, msg, self.max_frame()).await.map_err(proto)?;
            send.finish().map_err(|e| FabricError::Network(e.to_string()))?;
            let reply = reply_or_error(node, read_frame(&mut recv, self.max_frame()).await.map_err(proto)?)?;
            // A bad chunk fails the whole call, so the caller never takes bytes from it.
            let chunk_failed = |e| wire::chunk_error(e, &format!("from node {node}: "));
            let (offset, room) = into.span();
            let mut got = 0u64;
            let mut parts = Vec::new();
            while let Some(header) = quic::read_chunk_header(&mut recv).await.map_err(chunk_failed)? {
                let (at, len) = (header.offset, u64::from(header.len));
                let start = at
                    .checked_sub(offset)
                    .filter(|s| s.checked_add(len).is_some_and(|e| e <= room) && len <= max_chunk);
                let Some(start) = start else {
                    return Err(FabricError::Protocol(format!(
                        "node {node} sent {len} bytes at {at:#x}, outside the read"
                    )));
                };
                match &mut into {
                    ReadInto::Buf { buf, .. } => {
                        let dst = &mut buf[start as usize..(start + len) as usize];
                        quic::read_chunk_payload(&mut recv, &header, dst).await.map_err(chunk_failed)?;
                    }
                    // The payload stays in quinn's receive buffers until its checksum is known good; then each
                    // piece is copied once, into the copy.
                    ReadInto::Region { copy, .. } => {
                        quic::read_chunk_parts(&mut recv, &header, &mut parts).await.map_err(chunk_failed)?;
                        let pieces: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
                        in_place(|| self.shared.fabric.write_parts(copy, start, &pieces))?;
                    }
                }
                got += len;
            }
            if got != expect(&reply) {
                return Err(FabricError::Protocol(format!("node {node} sent {got} of {} bytes", expect(&reply))));
            }
            self.heard_from(node).await;
            Ok(reply)
        };
        self.bounded(node, work).await
    }

    /// Runs a call, failing with `PeerDead` when the peer stays silent for `network.dead_after_ms`.
    async fn bounded<T>(
        &self,
        node: u16,
        work: impl std::future::Future<Output = Result<T, FabricError>>,
    ) -> Result<T, FabricError> {
        // Bulk transfers may take longer than a heartbeat period; what bounds them is the connection: quinn's
        // idle timeout closes it when the peer stops acknowledging.
        let limit = Duration::from_millis(self.shared.net.dead_after_ms).max(Duration::from_secs(60));
        match tokio::time::timeout(limit, work).await {
            Ok(r) => r,
            Err(_) => {
                let name = self.peer(node)?.lock().await.name.clone();
                Err(FabricError::PeerDead { node, name, why: format!("no answer within {} ms", limit.as_millis()) })
            }
        }
    }

    async fn heard_from(&self, node: u16) {
        if let Ok(p) = self.peer(node) {
            p.lock().await.last_seen = Some(Instant::now());
        }
    }
}

/// Pings every peer with an address each `network.heartbeat_ms`; an answer marks it alive.
async fn heartbeat_loop(agent: Agent) {
    let period = Duration::from_millis(agent.shared.net.heartbeat_ms);
    // The first beat after one period (the peers' grace periods start with the agent), not at once: a test
    // that turns heartbeats off by a long period then sees no call it did not make.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for node in 0..agent.shared.peers.len() as u16 {
            if node == agent.shared.node || agent.shared.peers[usize::from(node)].lock().await.addr.is_none() {
                continue;
            }
            let a = agent.clone();
            tokio::spawn(async move {
                if let Ok(Err(e)) = tokio::time::timeout(period * 2, a.ping(node)).await {
                    tracing::debug!(node, error = %e, "heartbeat failed");
                }
            });
        }
    }
}

/// One endpoint per lane on consecutive ports from `bind`'s. With port 0 the system picks lane 0's port and the
/// next `lanes - 1` must be free too; taken ones make it try again elsewhere.
fn bind_lanes(
    bind: SocketAddr,
    lanes: usize,
    identity: &NodeIdentity,
    settings: &QuicSettings,
    threads: Option<&lanes::Lanes>,
) -> Result<Vec<quinn::Endpoint>, FabricError> {
    let at = |port: u16| SocketAddr::new(bind.ip(), port);
    // Lane `lane`'s endpoint, on its thread when it has one.
    let endpoint = |lane: usize, addr: SocketAddr| match threads.and_then(|t| t.runtime(lane)) {
        Some(rt) => quic::endpoint_pinned(addr, identity, settings, rt.clone()),
        None => quic::endpoint(addr, identity, settings),
    };
    let failed = |e: quic::QuicError| FabricError::Network(format!("binding {bind}: {e}"));
    let attempts = if bind.port() == 0 && lanes > 1 { 64 } else { 1 };
    let mut last = None;
    for _ in 0..attempts {
        let first = endpoint(0, bind).map_err(failed)?;
        let base = first.local_addr().map_err(|e| FabricError::Network(e.to_string()))?.port();
        let mut endpoints = vec![first];
        for lane in 1..lanes {
            let Some(port) = u16::try_from(lane).ok().and_then(|l| base.checked_add(l)) else {
                last = Some(FabricError::Network(format!("lane {lane}: no port above {base}")));
                break;
            };
            match endpoint(lane, at(port)) {
                Ok(e) => endpoints.push(e),
                Err(e) => {
                    last = Some(FabricError::Network(format!("binding lane {lane} at {}: {e}", at(port))));
                    break;
                }
            }
        }
        if endpoints.len() == lanes {
            return Ok(endpoints);
        }
    }
    Err(last.unwrap_or_else(|| FabricError::Network(format!("binding {lanes} lanes from {bind}"))))
}

fn configured_addr(config: &ClusterConfig, node: u16) -> Result<Option<SocketAddr>, FabricError> {
    match config.nodes.get(usize::from(node)).and_then(|n| n.address.as_deref()) {
        None => Ok(None),
        Some(a) => a.parse().map(Some).map_err(|e| FabricError::Network(format!("address `{a}`: {e}"))),
    }
}

/// This node's copy of a peer's pages while an acquire fills it: freed when dropped before [`CopyInFill::keep`].
struct CopyInFill<'a> {
    fabric: &'a crate::fabric::Fabric,
    copy: Region,
    kept: bool,
}

impl CopyInFill<'_> {
    /// The copy, now the lease's to free.
    fn keep(mut self) -> Region {
        self.kept = true;
        self.copy
    }
}

impl Drop for CopyInFill<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let _ = self.fabric.free(&self.copy);
        }
    }
}

/// Where the chunks of a read's answer go.
enum ReadInto<'a> {
    /// A buffer whose first byte is the peer region's byte `offset`.
    Buf { buf: &'a mut [u8], offset: u64 },
    /// A region of this node (a copy of a peer's pages) whose first byte is the peer region's byte `offset`.
    Region { copy: &'a Region, offset: u64 },
}

impl ReadInto<'_> {
    /// The peer region's bytes that fit: the first one's offset, and how many.
    fn span(&self) -> (u64, u64) {
        match self {
            ReadInto::Buf { buf, offset } => (*offset, buf.len() as u64),
            ReadInto::Region { copy, offset } => (*offset, copy.len),
        }
    }
}

/// Runs a fabric call in place on this worker thread (the runtime moves its other tasks elsewhere): no thread
/// hop and no copies of the caller's buffers. On a single-threaded runtime (a lane's thread among them) it
/// simply runs.
fn in_place<T>(f: impl FnOnce() -> Result<T, FabricError>) -> Result<T, FabricError> {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        // Called from a single-threaded runtime (a caller's own): `block_in_place` would panic there.
        Ok(tokio::runtime::RuntimeFlavor::CurrentThread) | Err(_) => f(),
        Ok(_) => tokio::task::block_in_place(f),
    }
}

fn reply_or_error(node: u16, reply: Option<Message>) -> Result<Message, FabricError> {
    match reply {
        Some(Message::Error { kind, message }) => Err(FabricError::Remote { node, kind, message }),
        Some(Message::Moved { to }) => Err(FabricError::Moved { to: Region::from(&to) }),
        Some(m) => Ok(m),
        None => Err(FabricError::Protocol(format!("node {node} closed the stream without answering"))),
    }
}

fn unexpected(node: u16, m: &Message) -> FabricError {
    FabricError::Protocol(format!("node {node} answered with an unexpected `{}`", m.name()))
}

fn net(e: quinn::ConnectionError) -> FabricError {
    FabricError::Network(e.to_string())
}

fn proto(e: crate::proto::CodecError) -> FabricError {
    FabricError::Protocol(e.to_string())
}
