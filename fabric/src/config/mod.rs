//! Cluster configuration: the TOML files under `cluster-configs/`.
//!
//! Every section but `[cluster]` may be left out; each field has a default that runs on one machine. Unknown
//! fields are errors, so a misspelt knob is reported instead of silently ignored.

use std::path::Path;

use serde::{Deserialize, Serialize};
use vfabric_allocator::Compression;
use vfabric_transport::{Backend, MoverConfig};

use crate::units::ByteSize;

mod memory;
pub use memory::MemorySection;

/// The configuration `vfabric demo` and the benchmarks use when given none: `cluster-configs/local.toml`.
pub const EMBEDDED_LOCAL: &str = include_str!("../../../cluster-configs/local.toml");

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML for a cluster configuration.
    #[error("{origin}: {message}")]
    Parse {
        /// The file or "embedded local.toml".
        origin: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The values are inconsistent.
    #[error("{origin}: {message}")]
    Invalid {
        /// The file or "embedded local.toml".
        origin: String,
        /// What is wrong.
        message: String,
    },
}

/// A whole cluster configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `[cluster]`.
    pub cluster: ClusterSection,
    /// `[device]`.
    #[serde(default)]
    pub device: DeviceSection,
    /// `[memory]`.
    #[serde(default)]
    pub memory: MemorySection,
    /// `[mover]`: see [`MoverConfig`].
    #[serde(default)]
    pub mover: MoverConfig,
    /// `[network]`: how agents reach each other.
    #[serde(default)]
    pub network: NetworkSection,
    /// `[storage]`: the tier below host memory; none when absent.
    #[serde(default)]
    pub storage: Option<StorageSection>,
    /// `[[tenant]]`: byte quotas per tenant and tier (tenants not listed are unlimited).
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantSection>,
    /// `[membership]`: which nodes are in the cluster now, kept in etcd; none when absent (every node listed
    /// is a member, its liveness told by heartbeats alone).
    #[serde(default)]
    pub membership: Option<MembershipSection>,
    /// `[metrics]`: where the agent serves its metrics; none when absent.
    #[serde(default)]
    pub metrics: Option<MetricsSection>,
    /// `[[node]]`: the nodes of the cluster.
    #[serde(default, rename = "node")]
    pub nodes: Vec<NodeSection>,
}

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// The cluster's name, shown in reports.
    pub name: String,
}

/// `[storage]`: the storage tier below host memory, a file on a fast drive (NVMe) that host memory's least used
/// pages go to when it is full. The fabric creates the file, reserves its space, and removes it when it stops;
/// a tier's file left by a crashed run is reset, and a file at the path that is not a tier's is refused. With
/// several nodes in the configuration, each node's file is the path with `.` and the node's name appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    /// The tier's file (its filesystem must support O_DIRECT: tmpfs does not).
    pub path: std::path::PathBuf,
    /// Its size: a whole number of pages.
    pub size: ByteSize,
    /// Reads and writes in flight at once (a power of two up to 4096).
    #[serde(default = "default_storage_depth")]
    pub depth: u32,
}

fn default_storage_depth() -> u32 {
    64
}

impl StorageSection {
    /// Node `node`'s file: the path itself for a one-node configuration, else the path with `.` and the node's
    /// name appended.
    pub fn path_of(&self, config: &ClusterConfig, node: u16) -> std::path::PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        match config.nodes.get(usize::from(node)) {
            Some(n) if config.nodes.len() > 1 => name.push(format!(".{}", n.name)),
            Some(_) => return self.path.clone(),
            // A node that joined without being listed (`[membership]`).
            None => name.push(format!(".node{node}")),
        }
        name.into()
    }
}

/// `[[tenant]]`: a tenant's byte quotas on each node, per tier (absent: unlimited there). Regions are charged to
/// the tenant their placement names; a call past a quota is `QuotaExceeded`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    /// The tenant's id (what `Placement::tenant` and the Python `alloc(tenant=...)` name).
    pub id: u32,
    /// Bytes of GPU memory, all GPUs of a node together.
    pub gpu: Option<ByteSize>,
    /// Bytes of host memory.
    pub host: Option<ByteSize>,
    /// Bytes of the storage tier.
    pub storage: Option<ByteSize>,
    /// Unix users whose local clients act as this tenant: the node's agent admits them (its socket then opens
    /// to every user; their credentials decide), charges what they allocate to this tenant, and refuses them
    /// other tenants' regions and the operator's calls (mapping the node's memory, migrations, the node's
    /// figures). The agent's own user stays the operator, acting for any tenant.
    #[serde(default)]
    pub uids: Vec<u32>,
}

/// `[device]`: which device layer runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeviceSection {
    /// `auto` (CUDA if a GPU is there, else emulated), `cuda` or `emulated`.
    pub backend: Backend,
    /// GPUs the emulated device has.
    pub emulated_gpus: u16,
    /// Memory of each emulated GPU.
    pub emulated_gpu_memory: ByteSize,
    /// Bytes a second each way between an emulated GPU and host memory (its PCIe link), so that copies there
    /// take the time they would on a GPU machine, scaled: schedules then meet the waits they meet there. "0"
    /// (the default): as fast as memory copies go.
    pub emulated_host_link: ByteSize,
    /// How long the fabric waits for a stage's copies (a GPU's, or the storage tier's reads behind a prefetch)
    /// before it reports them stalled: the call fails with `Stalled`, and the calls that move pages fail so at
    /// once until the copies finish (the fabric then takes them in and goes on). Longer than any stage takes
    /// on a working device: a stage moves at most a call's pages, seconds at the slowest tier.
    pub copy_deadline_ms: u64,
}

impl Default for DeviceSection {
    fn default() -> Self {
        DeviceSection {
            backend: Backend::Auto,
            emulated_gpus: 2,
            emulated_gpu_memory: ByteSize(1 << 30),
            emulated_host_link: ByteSize(0),
            copy_deadline_ms: 120_000,
        }
    }
}

/// The longest `device.copy_deadline_ms`: a day (a stage that takes longer is a device that stopped).
pub const MAX_COPY_DEADLINE_MS: u64 = 86_400_000;

/// The largest `network.socket_buffer`: the kernel takes an int and doubles it.
pub const MAX_SOCKET_BUFFER: u64 = 1 << 30;

/// The most lanes for bulk transfers (`network.lanes`) between two nodes (the latency lane comes on top).
pub const MAX_LANES: u16 = 32;

/// `[network]`: QUIC between agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSection {
    /// UDP payload size of QUIC packets; the minimum MTU is pinned to it. 1452 is safe everywhere; links with
    /// jumbo frames (MTU 9000) take 8952 (IPv6) or 8972 (IPv4); loopback takes up to 16383, quinn 0.11's
    /// largest. Larger packets cost less CPU per byte.
    pub mtu: u16,
    /// Folder with the cluster CA and the nodes' certificates (`vfabric cluster init` writes it); relative
    /// paths are relative to the working directory.
    pub certs: String,
    /// Interval between heartbeats to each peer, in milliseconds.
    pub heartbeat_ms: u64,
    /// A peer not heard from for this long (milliseconds) is dead: calls on its pages fail instead of hanging.
    pub dead_after_ms: u64,
    /// Bytes of page payload per checksummed chunk on the wire.
    pub chunk: ByteSize,
    /// How this node packs the page payload it sends to other nodes: `"none"` (the default) or `"lz4"`, which
    /// sends a chunk packed when it (and first its first 4 KiB) shrinks by an eighth (zeroed buffers,
    /// masks, padding; dense floating point goes as it is, for the cost of compressing 4 KiB). Every node takes
    /// packed chunks whatever its own setting.
    pub compression: Compression,
    /// Whether the pages of a region allocated with zstd cross the wire packed with zstd (in 0.74-0.94 of their
    /// bytes on a trained model's tensors, but at zstd's pace, a few hundred MB/s a core: worth it on links of
    /// about 10 Gbit/s or slower) instead of LZ4 (the default: at the link's speed, dense data as it is).
    pub wire_zstd: bool,
    /// Largest control frame accepted, in bytes.
    pub max_frame: ByteSize,
    /// QUIC flow-control window of one stream (one call), bytes.
    pub stream_window: ByteSize,
    /// QUIC flow-control window of a connection (all calls to one peer on one lane), bytes. Keep it within
    /// the socket's receive buffer (on Linux twice the smaller of `socket_buffer` and `net.core.rmem_max`): a receiver
    /// that falls behind then slows its sender by flow control instead of dropping packets (the agent warns at
    /// start when it is not).
    pub connection_window: ByteSize,
    /// Bytes of other nodes' pages an agent keeps after their leases end, so that acquiring them again costs
    /// a version check instead of a transfer when they have not changed (`0` keeps none).
    pub replica_cache: ByteSize,
    /// QUIC connections for bulk transfers between each pair of nodes, each on a UDP socket (and so a core) of
    /// its own: a node listens on its address's port and the ports after it, one for each of these and one
    /// for the latency lane ([`NetworkSection::connections`]); a call takes the least busy lane it may take.
    /// One connection tops out at 10-13 Gbit/s (its packets are built, encrypted and read on one core); hosts
    /// with many cores gain from 4-8. The same for every node of a cluster (a peer with other lanes is
    /// refused at its hello).
    pub lanes: u16,
    /// Send and receive buffer asked for each QUIC socket (the kernel caps it at `net.core.rmem_max`);
    /// `0` keeps the system's default, which drops packets while a busy receiver copies a chunk.
    pub socket_buffer: ByteSize,
    /// One more connection per pair of nodes, the latency lane, beside the `lanes`: calls that move less than
    /// 256 KiB of pages take it first, bulk transfers never. On a multi-threaded runtime it runs on a thread of
    /// its own (its endpoint, its connections, the calls made and served on it). It is lane 0, on the node's
    /// port; the `lanes` take the ports after it. The same for every node of a cluster.
    pub latency_lane: bool,
    /// Local clients (processes of the node on the agent's Unix socket) served at once: each has a thread and
    /// buffers of its own, so past this a new one is refused (it reads why) instead of growing the agent.
    pub max_local_clients: u32,
    /// Nodes that hold each region's released writes, its home included, unless the region asks otherwise:
    /// `1` keeps them on the home only; `2` also keeps a standby copy in the host memory of the next node of
    /// the list that answers, which takes over as the region's home when the home dies; up to
    /// [`MAX_REPLICAS`], a standby copy on each of the next nodes that answer. More than 2 needs
    /// `[membership]`: which standby takes over from a dead home is settled in etcd.
    pub replicas: u8,
    /// How far (ms) a replicated region's standby may lag its home unless the region says otherwise
    /// (`agent::Replication`): `0`, the default, none (a write returns once the standby has it); more lets
    /// writes return at once (a home that dies loses what its standby lacked: at most this much).
    pub replica_lag_ms: u32,
    /// Whether `vfabric agent`, told to stop (SIGTERM, Ctrl-C), first hands its regions to other nodes, which
    /// serve them from then on under the same handles (`Agent::leave`). Off, its regions without a standby go
    /// with it (what a job that ends wants: its ranks stop together).
    pub drain: bool,
    /// Whether leases of peers' pages onto this node's GPUs may cross GPU to GPU over NCCL: a channel (an NCCL
    /// communicator of two ranks) joined with the peer over this connection the first time, when both nodes
    /// have GPUs and NCCL loads here. Off, or when a channel cannot be joined (the reason shows in `vfabric
    /// status`), they go by QUIC through host memory. Two nodes sharing one GPU join only when each process
    /// names its host apart for NCCL (`NCCL_HOSTID`).
    pub nccl: bool,
}

/// The most nodes a region's writes are kept on (its home and three standbys).
pub const MAX_REPLICAS: u8 = 4;

/// The most nodes a region's writes are kept on without `[membership]` (its home and one standby): with more
/// standbys, which one takes over needs an arbiter that every node agrees on, etcd.
pub const MAX_REPLICAS_WITHOUT_ETCD: u8 = 2;

impl Default for NetworkSection {
    fn default() -> Self {
        NetworkSection {
            mtu: 1452,
            certs: "certs".into(),
            heartbeat_ms: 250,
            dead_after_ms: 2000,
            chunk: ByteSize(1 << 20),
            compression: Compression::None,
            wire_zstd: false,
            max_frame: ByteSize(1 << 20),
            replica_cache: ByteSize(256 << 20),
            stream_window: ByteSize(8 << 20),
            connection_window: ByteSize(8 << 20),
            lanes: 1,
            socket_buffer: ByteSize(4 << 20),
            latency_lane: true,
            max_local_clients: 1024,
            replicas: 1,
            replica_lag_ms: 0,
            drain: true,
            nccl: true,
        }
    }
}

impl NetworkSection {
    /// QUIC connections (and ports from each node's) per pair of nodes: the `lanes` and the latency lane.
    pub fn connections(&self) -> u16 {
        self.lanes.saturating_add(u16::from(self.latency_lane))
    }
}

/// `[membership]`: the cluster's members kept in etcd. Each agent registers its node under a lease it keeps
/// alive (`/vfabric/<cluster>/members/<node>`, its address as the value) and watches the others: a node that
/// starts joins the running cluster, and one that stops (its lease revoked) or dies (its lease expired) is gone
/// for every node at once, its regions failing over where they have standbys. A node listed in `[[node]]` has
/// its place in the list as its id; one that is not (started with `vfabric agent --listen`, its certificate
/// from `vfabric cluster add-node`) takes an id that etcd keeps for its name; a listed node that never started
/// is no member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembershipSection {
    /// etcd's client URLs (`http://host:2379`).
    pub etcd: Vec<String>,
    /// Seconds a member stays one without renewing its lease (etcd's own floor applies; at least 1).
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl_s: u32,
    /// Most nodes the cluster may have, those not listed in `[[node]]` included (each takes a node id below it).
    #[serde(default = "default_max_nodes")]
    pub max_nodes: u16,
}

fn default_lease_ttl() -> u32 {
    2
}

fn default_max_nodes() -> u16 {
    64
}

/// `[metrics]`: the agent serves its figures (tiers, moves, waits, peers, replicas, tenants, call latencies) in
/// Prometheus text exposition at `http://LISTEN/metrics` (`vfabric agent --metrics ADDR` overrides it per node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// The address and port to serve on, e.g. `"127.0.0.1:9464"` (port 0: any free one, said in the log).
    pub listen: std::net::SocketAddr,
}

/// The most node ids `[membership] max_nodes` may allow (each is a peer this node keeps a slot for).
pub const MAX_NODES: u16 = 4096;

/// `[[node]]`: one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// The node's name (`vfabric agent --node NAME`).
    pub name: String,
    /// The GPUs of the node the fabric uses (default: all).
    #[serde(default)]
    pub gpus: Option<Vec<u16>>,
    /// Where its agent listens for peers (`ip:port`); needed only when the cluster has several nodes.
    #[serde(default)]
    pub address: Option<String>,
    /// The tenant (a `[[tenant]]` id) the node belongs to, which `cluster init` writes into its certificate:
    /// other nodes take every call it makes as that tenant's, whatever it says it acts for.
    #[serde(default)]
    pub tenant: Option<u32>,
}

impl ClusterConfig {
    /// Parses and checks a configuration; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let cfg: ClusterConfig = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { origin: origin.to_string(), message: e.to_string() })?;
        cfg.validate(origin)?;
        cfg.validate_addresses(origin)?;
        Ok(cfg)
    }

    /// What a file must say that a configuration made in code may leave to its caller: with more than one node,
    /// where each listens (peers dial it), and never port 0 (nobody can dial that).
    fn validate_addresses(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |message: String| ConfigError::Invalid { origin: origin.to_string(), message };
        for n in &self.nodes {
            match n.address.as_ref().and_then(|a| a.parse::<std::net::SocketAddr>().ok()) {
                Some(a) if a.port() == 0 => {
                    return Err(bad(format!("node `{}`: port 0 in `{a}` is not a port its peers can reach", n.name)));
                }
                None if self.nodes.len() > 1 => {
                    return Err(bad(format!(
                        "node `{}` has no address: with more than one node, each needs `address = \"ip:port\"`",
                        n.name
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Checks a configuration made or changed in code as [`ClusterConfig::from_toml`] checks a file; `origin`
    /// names it in errors.
    pub fn check(&self, origin: &str) -> Result<(), ConfigError> {
        self.validate(origin)
    }

    /// Reads a configuration file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// The embedded `cluster-configs/local.toml`.
    pub fn embedded_local() -> Self {
        // The embedded file is checked by a unit test; should it ever fail, the defaults stand in.
        Self::from_toml(EMBEDDED_LOCAL, "embedded local.toml").unwrap_or_else(|_| ClusterConfig {
            cluster: ClusterSection { name: "local".into() },
            device: DeviceSection::default(),
            memory: MemorySection::default(),
            mover: MoverConfig::default(),
            network: NetworkSection::default(),
            storage: None,
            tenants: Vec::new(),
            membership: None,
            metrics: None,
            nodes: vec![NodeSection { name: "local".into(), gpus: None, address: None, tenant: None }],
        })
    }

    /// The slots for peers a node keeps: the listed nodes, or, with `[membership]`, `max_nodes`.
    pub fn node_slots(&self) -> usize {
        self.membership.as_ref().map_or(0, |m| usize::from(m.max_nodes)).max(self.nodes.len())
    }

    /// The index of node `name` (its node id in global addresses).
    pub fn node_index(&self, name: &str) -> Result<u16, ConfigError> {
        self.nodes.iter().position(|n| n.name == name).map(|i| i as u16).ok_or_else(|| ConfigError::Invalid {
            origin: self.cluster.name.clone(),
            message: format!(
                "no node `{name}` (nodes: {})",
                self.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        })
    }

    /// `path`'s configuration, or the embedded one when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        match path {
            Some(p) => Self::from_file(p),
            None => Ok(Self::embedded_local()),
        }
    }

    /// Checks the values: the first problem found, as a [`ConfigError::Invalid`] naming `origin`.
    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |message: String| ConfigError::Invalid { origin: origin.to_string(), message };
        if let Some(m) = &self.membership {
            if m.etcd.is_empty() || m.lease_ttl_s == 0 {
                return Err(bad(
                    "membership needs etcd = [\"http://host:2379\", ...] and a lease_ttl_s of at least 1".into()
                ));
            }
            if usize::from(m.max_nodes) < self.nodes.len() || m.max_nodes > MAX_NODES {
                return Err(bad(format!(
                    "membership.max_nodes is {}: it must hold the {} listed node(s) and be at most {MAX_NODES}",
                    m.max_nodes,
                    self.nodes.len()
                )));
            }
        }
        if self.device.copy_deadline_ms == 0 || self.device.copy_deadline_ms > MAX_COPY_DEADLINE_MS {
            return Err(bad(format!(
                "device.copy_deadline_ms is {}: it must be 1..={MAX_COPY_DEADLINE_MS} (a day; default 120000)",
                self.device.copy_deadline_ms
            )));
        }
        if !matches!(self.network.compression, Compression::None | Compression::Lz4) {
            return Err(bad(format!(
                "network.compression is {}: the wire takes \"none\" or \"lz4\" (zstd packs slower than fast links: \
                 a zstd region's pages cross with zstd when network.wire_zstd = true; a lossy region's values are \
                 chosen per region)",
                self.network.compression
            )));
        }
        let replicas = self.network.replicas;
        if replicas == 0 || replicas > MAX_REPLICAS {
            return Err(bad(format!(
                "network.replicas is {replicas}: it must be 1 to {MAX_REPLICAS} (the home and up to {} standbys)",
                MAX_REPLICAS - 1
            )));
        }
        if replicas > MAX_REPLICAS_WITHOUT_ETCD && self.membership.is_none() {
            return Err(bad(format!(
                "network.replicas is {replicas}: more than {MAX_REPLICAS_WITHOUT_ETCD} needs [membership] (etcd \
                 settles which standby takes over from a dead home)"
            )));
        }
        if usize::from(replicas) > self.nodes.len().max(1) {
            return Err(bad(format!(
                "network.replicas is {replicas}, but the cluster has {} node(s): each copy needs a node of its own",
                self.nodes.len()
            )));
        }
        let m = &self.memory;
        m.check().map_err(bad)?;
        if let Some(s) = &self.storage {
            let ps = m.page_size.bytes();
            if s.path.as_os_str().is_empty() {
                return Err(bad("storage.path is empty".into()));
            }
            if s.size.bytes() < ps || s.size.bytes() % ps != 0 {
                return Err(bad(format!("storage.size {} is not a whole number of pages ({})", s.size, m.page_size)));
            }
            if !s.depth.is_power_of_two() || s.depth > 4096 {
                return Err(bad(format!("storage.depth {} is not a power of two up to 4096", s.depth)));
            }
        }
        let mut ids: Vec<u32> = self.tenants.iter().map(|t| t.id).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("tenant {} is listed twice", w[0])));
        }
        for n in &self.nodes {
            if let Some(t) = n.tenant.filter(|t| ids.binary_search(t).is_err()) {
                return Err(bad(format!("node `{}` belongs to tenant {t}, which no [[tenant]] lists", n.name)));
            }
        }
        let mut uids: Vec<u32> = self.tenants.iter().flat_map(|t| t.uids.iter().copied()).collect();
        uids.sort_unstable();
        if let Some(w) = uids.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("uid {} belongs to more than one tenant", w[0])));
        }
        self.mover.validate().map_err(|e| bad(e.to_string()))?;
        if self.device.emulated_gpus == 0 {
            return Err(bad("device.emulated_gpus must be at least 1".into()));
        }
        let mut names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("node `{}` is listed twice", w[0])));
        }
        if self.nodes.len() > usize::from(u16::MAX) {
            return Err(bad(format!("{} nodes: at most {} fit in a global address", self.nodes.len(), u16::MAX)));
        }
        for n in &self.nodes {
            // The rule `cluster init` issues certificates by, so that every name checked here gets one.
            vfabric_transport::quic::validate_node_name(&n.name)
                .map_err(|e| bad(format!("node `{}`: {e} (it names the node's certificate)", n.name)))?;
            if let Some(a) = &n.address {
                a.parse::<std::net::SocketAddr>()
                    .map_err(|e| bad(format!("node `{}`: address `{a}` is not ip:port ({e})", n.name)))?;
            }
        }
        let net = &self.network;
        let mtus = vfabric_transport::quic::MIN_MTU..=vfabric_transport::quic::MAX_MTU;
        if !mtus.contains(&net.mtu) {
            return Err(bad(format!("network.mtu {} must be within {}..={}", net.mtu, mtus.start(), mtus.end())));
        }
        if net.heartbeat_ms == 0 || net.dead_after_ms <= net.heartbeat_ms {
            return Err(bad(format!(
                "network.dead_after_ms ({}) must exceed network.heartbeat_ms ({}), which must be above 0",
                net.dead_after_ms, net.heartbeat_ms
            )));
        }
        if net.chunk.bytes() == 0 || net.chunk.bytes() > (64 << 20) {
            return Err(bad(format!("network.chunk {} must be within 1B..=64MiB", net.chunk)));
        }
        if net.stream_window.bytes() < (64 << 10) || net.connection_window.bytes() < net.stream_window.bytes() {
            return Err(bad(format!(
                "network.stream_window ({}) must be at least 64KiB and network.connection_window ({}) at least that",
                net.stream_window, net.connection_window
            )));
        }
        if net.socket_buffer.bytes() > MAX_SOCKET_BUFFER {
            // The kernel takes the size as an int and doubles it: past that, it would quietly use its minimum.
            return Err(bad(format!(
                "network.socket_buffer {} must be at most {}",
                net.socket_buffer,
                ByteSize(MAX_SOCKET_BUFFER)
            )));
        }
        if net.max_local_clients == 0 {
            return Err(bad("network.max_local_clients must be at least 1".into()));
        }
        if !(1..=MAX_LANES).contains(&net.lanes) {
            return Err(bad(format!("network.lanes {} must be within 1..={MAX_LANES}", net.lanes)));
        }
        // Each node listens on its port and the `connections - 1` after it: those ranges must exist and not
        // overlap.
        let ports = u32::from(net.connections());
        let mut ranges: Vec<(std::net::IpAddr, u32, &str)> = Vec::new();
        for n in &self.nodes {
            let Some(a) = n.address.as_ref().and_then(|a| a.parse::<std::net::SocketAddr>().ok()) else { continue };
            let (first, last) = (u32::from(a.port()), u32::from(a.port()) + ports - 1);
            if a.port() != 0 && last > u32::from(u16::MAX) {
                return Err(bad(format!(
                    "node `{}`: {ports} ports (lanes and the latency lane) from port {first} run past 65535",
                    n.name
                )));
            }
            if let Some((_, other, name)) =
                ranges.iter().find(|(ip, p, _)| *ip == a.ip() && a.port() != 0 && p.abs_diff(first) < ports)
            {
                return Err(bad(format!(
                    "nodes `{name}` and `{}` listen on {} at ports {other} and {first}: with network.lanes = {} and \
                     the latency lane {} each takes {ports} ports from its own, so they overlap",
                    n.name,
                    a.ip(),
                    net.lanes,
                    if net.latency_lane { "on" } else { "off" },
                )));
            }
            ranges.push((a.ip(), first, &n.name));
        }
        if net.max_frame.bytes() < 4096 {
            return Err(bad(format!("network.max_frame {} must be at least 4KiB", net.max_frame)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
