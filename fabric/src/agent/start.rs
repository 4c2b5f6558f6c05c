//! Starting and stopping an agent: its fabric, one QUIC endpoint per lane, the lane threads, the serving
//! tasks and the heartbeats.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use vfabric_transport::quic::{self, NodeIdentity, QuicSettings};

use super::forwarding::Moves;
use super::lane_use::LaneLoads;
use super::lanes::Lanes;
use super::peer::Peer;
use super::replicas::ReplicaCache;
use super::serve::accept_loop;
use super::shared::{Agent, Shared};
use crate::config::ClusterConfig;
use crate::error::{FabricError, NetworkError};
use crate::fabric::Fabric;
use crate::proto::quic::CloseCode;

/// Most worker threads per core an agent's runtime takes: more only cost memory and scheduling.
pub const MAX_THREADS_PER_CORE: usize = 8;

impl Agent {
    /// Starts node `name` of `config`: its fabric, its QUIC endpoint on `bind` (default: the node's configured
    /// address), the task that serves peers, and heartbeats. Runs inside a tokio runtime: [`Agent::runtime`]
    /// makes one.
    pub async fn start(
        config: &ClusterConfig,
        name: &str,
        identity: &NodeIdentity,
        bind: Option<SocketAddr>,
    ) -> Result<Agent, FabricError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(FabricError::NoRuntime);
        }
        // A configuration made or changed in code gets the checks a file gets (lanes, ports, windows, ...).
        config.check(&format!("the configuration of cluster `{}`", config.cluster.name))?;
        let node = node_id(config, name).await?;
        let net = config.network.clone();
        let bind = match bind {
            Some(b) => b,
            None => configured_addr(config, node)?.ok_or(NetworkError::NoBindAddress { name: name.to_string() })?,
        };
        let cfg = config.clone();
        let fabric = tokio::task::spawn_blocking(move || Fabric::for_node(&cfg, node))
            .await
            .map_err(|source| NetworkError::Cancelled { what: "starting the fabric", source })??;
        // Bound only once the fabric is up: peers' handshakes wait for the accept loop, and would time out.
        let settings = QuicSettings {
            mtu: net.mtu,
            stream_window: net.stream_window.bytes(),
            connection_window: net.connection_window.bytes(),
            socket_buffer: usize::try_from(net.socket_buffer.bytes()).unwrap_or(usize::MAX),
            ..QuicSettings::default()
        };
        // On a multi-threaded runtime the latency lane gets a thread of its own (see `super::lanes`).
        let threaded = tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
        let (lanes, lane_stop) = match threaded && net.latency_lane {
            true => Lanes::start(1, name).map(|(l, stop)| (Some(l), Some(stop))).map_err(NetworkError::LaneThreads)?,
            false => (None, None),
        };
        let connections = usize::from(net.connections());
        let endpoints = bind_lanes(bind, connections, identity, &settings, lanes.as_ref())?;
        let mut peers = Vec::new();
        // The listed nodes, then (with `[membership]`) slots for nodes that join without being listed, named
        // once they register (this node's own slot at once).
        for i in 0..config.node_slots() {
            let listed = config.nodes.get(i);
            let own = (i == usize::from(node)).then(|| name.to_string());
            peers.push(Mutex::new(Peer {
                name: listed.map(|n| n.name.clone()).or(own).unwrap_or_default(),
                addr: configured_addr(config, i as u16)?,
                conns: vec![None; connections],
                last_seen: None,
                member: None,
                left: false,
                tenant: listed.and_then(|n| n.tenant),
                gpus: listed.and_then(|n| n.gpus.clone()),
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
        let shared = Arc::new(Shared {
            cluster: config.cluster.name.clone(),
            node,
            fabric,
            endpoints,
            lanes,
            main: tokio::runtime::Handle::current(),
            lane_stop: std::sync::Mutex::new(lane_stop),
            started: Instant::now(),
            loads: LaneLoads::new(&net, config.node_slots()),
            peers,
            tasks: std::sync::Mutex::new(Vec::new()),
            grants: std::sync::Mutex::new(std::collections::HashMap::new()),
            next_grant: std::sync::atomic::AtomicU64::new(1),
            abandoned: std::sync::Mutex::new(std::collections::VecDeque::new()),
            next_request: std::sync::atomic::AtomicU64::new(1),
            replicas: std::sync::Mutex::new(ReplicaCache::new(net.replica_cache.bytes())),
            private: std::sync::Mutex::new(std::collections::HashSet::new()),
            lossless: std::sync::Mutex::new(std::collections::HashMap::new()),
            moves: Moves::default(),
            backups: Default::default(),
            #[cfg(feature = "etcd")]
            membership: config.membership.is_some(),
            #[cfg(feature = "etcd")]
            registration: Mutex::new(None),
            #[cfg(feature = "etcd")]
            standing: std::sync::Mutex::new(None),
            hints: std::sync::Mutex::new(std::collections::HashMap::new()),
            // Enough for the chunks in flight on every lane at the default windows (64 x 1 MiB).
            buffers: quic::BufferPool::new(64),
            net,
            tenants: config.tenants.clone(),
            metrics: super::call_metrics::CallMetrics::new(),
            routes: Default::default(),
            channels: Default::default(),
        });
        let agent = Agent { shared };
        let serving = (0..agent.shared.endpoints.len())
            .map(|lane| {
                let accepting = accept_loop(Arc::clone(&agent.shared), lane);
                match agent.shared.lanes.as_ref().and_then(|l| l.runtime(lane)) {
                    Some(rt) => rt.handle().spawn(accepting),
                    None => tokio::spawn(accepting),
                }
            })
            .collect::<Vec<_>>();
        let beating = tokio::spawn(heartbeat_loop(agent.clone()));
        agent.tasks().extend(serving.into_iter().chain([beating]));
        if let Some(m) = &config.membership {
            if let Err(e) = join_cluster(&agent, m).await {
                agent.shutdown().await;
                return Err(e);
            }
        }
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
    /// workers, page copies run in line; on two cores that measured faster than two workers per agent
    /// (docs/benchmarks.md). On a multi-threaded runtime the latency lane also gets a thread of its own.
    pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let most = MAX_THREADS_PER_CORE * cores;
        if threads > most {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{threads} worker threads: at most {most} ({MAX_THREADS_PER_CORE} per core of this machine's {cores})"),
            ));
        }
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
        Self::start_from_config_at(config, name, None).await
    }

    /// [`Agent::start_from_config`], listening on `bind` (default: the node's configured address; a node that
    /// joins a cluster with `[membership]` without being listed in `[[node]]` has none, and needs one).
    pub async fn start_from_config_at(
        config: &ClusterConfig,
        name: &str,
        bind: Option<SocketAddr>,
    ) -> Result<Agent, FabricError> {
        // A name that is no node's is the configuration's question, not a missing certificate's (with
        // `[membership]`, any node with a certificate may join).
        if config.membership.is_none() {
            config.node_index(name)?;
        }
        let identity = NodeIdentity::load(Path::new(&config.network.certs), name)
            .map_err(|source| NetworkError::Certificate { node: name.to_string(), source })?;
        Self::start(config, name, &identity, bind).await
    }

    /// Closes every connection (peers' calls in flight fail with a closed-connection error), stops serving
    /// and waits up to a second for the endpoint to go idle.
    pub async fn shutdown(&self) {
        // Replicated regions go to their standbys first (for a few seconds at most: a standby that does not
        // answer takes over when it finds this node gone).
        let _ = tokio::time::timeout(Duration::from_secs(5), self.hand_over_all()).await;
        // Out of the cluster: the others see this node go at once.
        #[cfg(feature = "etcd")]
        self.leave_cluster().await;
        let tasks: Vec<_> = self.tasks().drain(..).collect();
        for t in &tasks {
            t.abort();
        }
        for e in &self.shared.endpoints {
            e.close(quinn::VarInt::from_u32(CloseCode::Shutdown as u32), b"shutdown");
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
}

/// Registers `agent` in the cluster's membership service.
#[cfg(feature = "etcd")]
async fn join_cluster(agent: &Agent, m: &crate::config::MembershipSection) -> Result<(), FabricError> {
    agent.join_cluster(m).await
}

/// Without etcd support built in, `[membership]` is refused with how to get it.
#[cfg(not(feature = "etcd"))]
async fn join_cluster(_: &Agent, m: &crate::config::MembershipSection) -> Result<(), FabricError> {
    Err(NetworkError::Membership {
        endpoints: m.etcd.join(", "),
        message: "this build has no etcd support: build vfabric with `--features etcd` (it needs protoc, Debian's \
                  protobuf-compiler)"
            .into(),
    }
    .into())
}

/// Pings every peer with an address (and, with `[membership]`, that is a member) each `network.heartbeat_ms`;
/// an answer marks it alive.
async fn heartbeat_loop(agent: Agent) {
    let period = Duration::from_millis(agent.shared.net.heartbeat_ms);
    // The first beat after one period (the peers' grace periods start with the agent), not at once: a test
    // that turns heartbeats off by a long period then sees no call it did not make.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for node in 0..agent.shared.peers.len() as u16 {
            // Nodes with no address, and nodes etcd says are not members, are not pinged.
            let skip = {
                let p = agent.shared.peers[usize::from(node)].lock().await;
                p.addr.is_none() || p.member == Some(false)
            };
            if agent.is_me(node) || skip {
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
    threads: Option<&Lanes>,
) -> Result<Vec<quinn::Endpoint>, NetworkError> {
    let at = |port: u16| SocketAddr::new(bind.ip(), port);
    // Lane `lane`'s endpoint, on its thread when it has one.
    let endpoint = |lane: usize, addr: SocketAddr| {
        match threads.and_then(|t| t.runtime(lane)) {
            Some(rt) => quic::endpoint_pinned(addr, identity, settings, rt.clone()),
            None => quic::endpoint(addr, identity, settings),
        }
        .map_err(|source| NetworkError::Bind { addr, source })
    };
    let attempts = if bind.port() == 0 && lanes > 1 { 64 } else { 1 };
    let mut last = None;
    for _ in 0..attempts {
        let first = endpoint(0, bind)?;
        let base = first.local_addr()?.port();
        let mut endpoints = vec![first];
        for lane in 1..lanes {
            let Some(port) = u16::try_from(lane).ok().and_then(|l| base.checked_add(l)) else {
                last = Some(NetworkError::NoPortForLane { lane, base });
                break;
            };
            match endpoint(lane, at(port)) {
                Ok(e) => endpoints.push(e),
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        if endpoints.len() == lanes {
            return Ok(endpoints);
        }
    }
    Err(last.unwrap_or(NetworkError::NoPortForLane { lane: lanes, base: bind.port() }))
}

/// The node id of `name`: its place in `[[node]]`, or, for a node the list leaves out that joins through etcd
/// (`[membership]`), the id etcd keeps for its name.
async fn node_id(config: &ClusterConfig, name: &str) -> Result<u16, FabricError> {
    match (config.node_index(name), &config.membership) {
        (Ok(node), _) => Ok(node),
        #[cfg(feature = "etcd")]
        (Err(_), Some(m)) => {
            quic::validate_node_name(name)
                .map_err(|source| NetworkError::Certificate { node: name.to_string(), source })?;
            super::membership::claim_node_id(m, &config.cluster.name, name, config.nodes.len() as u16).await
        }
        (Err(e), _) => Err(e.into()),
    }
}

/// The address node `node` listens on, as the configuration says (checked when the configuration was).
fn configured_addr(config: &ClusterConfig, node: u16) -> Result<Option<SocketAddr>, FabricError> {
    match config.nodes.get(usize::from(node)).and_then(|n| n.address.as_deref()) {
        None => Ok(None),
        Some(a) => {
            a.parse().map(Some).map_err(|_| FabricError::InvalidAddress(format!("address `{a}` of node {node}")))
        }
    }
}
