//! The `vfabric` command.

mod status_view;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vfabric::ClusterConfig;
use vfabric_transport::Backend;

#[derive(Parser)]
#[command(
    name = "vfabric",
    version,
    about = "A distributed GPU memory fabric: one address space over every GPU, host and drive"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a region into GPU memory, move it GPU -> GPU -> host -> GPU, verify every byte, show how fast.
    /// Runs on the emulated device (and says so) where there is no GPU.
    Demo {
        /// Cluster configuration (default: the embedded cluster-configs/local.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Device layer, overriding the configuration: auto, cuda or emulated.
        #[arg(long)]
        device: Option<Backend>,
    },
    /// Show the devices of this node and the arenas the configuration would create on them.
    Info {
        /// Cluster configuration (default: the embedded cluster-configs/local.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Device layer, overriding the configuration: auto, cuda or emulated.
        #[arg(long)]
        device: Option<Backend>,
    },
    /// Ask a running agent how a node is (through an agent's Unix socket on this machine, and over QUIC for a
    /// node elsewhere): per device and tier the memory used, leased and free and how fragmented, regions and
    /// leases, bytes moved, peers with their state and round trip, replicas.
    Status {
        /// Cluster configuration (a node's socket is `<temp dir>/vfabric-<cluster>-<node>.sock`).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The node whose status (default: the configuration's only node). Its own agent answers if it runs on
        /// this machine; otherwise one that does asks it over QUIC.
        #[arg(long)]
        node: Option<String>,
        /// Ask this node's agent (on this machine), which asks `--node`'s over QUIC when that is another node.
        #[arg(long, conflicts_with = "socket")]
        via: Option<String>,
        /// The socket of the agent to ask, instead of the configuration's.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Print the status as JSON (for scripts).
        #[arg(long)]
        json: bool,
        /// Print it again every this many seconds, with the bytes moved as rates since the last print.
        #[arg(long)]
        watch: Option<f64>,
    },
    /// Check a cluster configuration file and print it with every default filled in.
    CheckConfig {
        /// The file.
        path: PathBuf,
    },
    /// Cluster set-up.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Run a node's agent until SIGTERM or Ctrl-C: its fabric, and QUIC to the other nodes.
    Agent {
        /// Cluster configuration.
        #[arg(long)]
        config: PathBuf,
        /// The node to run (a `[[node]]` name of the configuration; with `[membership]`, also a node the list
        /// leaves out, whose certificate `vfabric cluster add-node` made).
        #[arg(long)]
        node: String,
        /// Where to listen for peers (`ip:port`), instead of the node's `[[node]]` address: what a node the list
        /// leaves out needs.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Device layer, overriding the configuration: auto, cuda or emulated.
        #[arg(long)]
        device: Option<Backend>,
        /// Worker threads: 1 runs the agent on one thread; 0 (default) picks one thread on machines of two
        /// cores or fewer and every core above that. With more than one, the latency lane gets a thread of its
        /// own (the bulk lanes run on the workers).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Where to serve Prometheus metrics (`ip:port`, at `/metrics`), instead of `[metrics] listen`.
        #[arg(long)]
        metrics: Option<std::net::SocketAddr>,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Run this node's agent briefly and check every other node: allocate a region there, write it, read it
    /// back and compare every byte. Prints one line per peer; fails if any peer fails.
    Probe {
        /// Cluster configuration.
        #[arg(long)]
        config: PathBuf,
        /// The node to run as.
        #[arg(long)]
        node: String,
        /// Bytes written to and read from each peer.
        #[arg(long, default_value = "8MiB")]
        bytes: vfabric::ByteSize,
        /// Device layer, overriding the configuration: auto, cuda or emulated.
        #[arg(long)]
        device: Option<Backend>,
    },
    /// Create the cluster's CA and a certificate for every node, in the configuration's `network.certs` folder
    /// (or `--out`). Refuses to overwrite an existing CA.
    Init {
        /// Cluster configuration.
        #[arg(long)]
        config: PathBuf,
        /// Folder to write (default: the configuration's `network.certs`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also issue certificates for the ranks of a job of this many (`rank0`..), for jobs under mpirun.
        #[arg(long)]
        ranks: Option<u16>,
    },
    /// Issue a certificate for a node the configuration does not list, with the cluster's CA (its
    /// `network.certs` folder must hold `ca-key.pem`), so that it can join a cluster kept in etcd
    /// (`[membership]`): then start it with `vfabric agent --node NAME --listen IP:PORT`.
    AddNode {
        /// Cluster configuration.
        #[arg(long)]
        config: PathBuf,
        /// The new node's name (a DNS name, as `[[node]]` names are).
        #[arg(long)]
        name: String,
        /// The tenant the node belongs to (a `[[tenant]]` id), written into its certificate.
        #[arg(long)]
        tenant: Option<u32>,
    },
}

fn cluster_init(config: &std::path::Path, out: Option<PathBuf>, ranks: Option<u16>) -> Result<(), String> {
    use vfabric_transport::quic::ClusterCa;
    let cfg = ClusterConfig::from_file(config).map_err(|e| e.to_string())?;
    let dir = out.unwrap_or_else(|| PathBuf::from(&cfg.network.certs));
    if dir.join("ca.pem").exists() {
        return Err(format!("{} already holds a cluster CA; remove it first to make a new one", dir.display()));
    }
    // Everything is made in memory first, then written into a folder of its own beside `dir` and moved into
    // `dir` file by file: a failure leaves no CA behind to block the next try.
    let ca = ClusterCa::generate(&cfg.cluster.name).map_err(|e| e.to_string())?;
    let ranks = (0..ranks.unwrap_or(0)).map(vfabric::agent::rank_name);
    let mut ids = Vec::new();
    for (name, tenant) in cfg.nodes.iter().map(|n| (n.name.clone(), n.tenant)).chain(ranks.map(|r| (r, None))) {
        ids.push(ca.issue_for(&name, tenant).map_err(|e| format!("node {name}: {e}"))?);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let staging = dir.join(format!(".vfabric-init-{}", std::process::id()));
    let written = (|| -> Result<Vec<PathBuf>, String> {
        ca.save(&staging).map_err(|e| e.to_string())?;
        for id in &ids {
            id.save(&staging).map_err(|e| format!("node {}: {e}", id.name))?;
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&staging)
            .map_err(|e| format!("{}: {e}", staging.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        // The CA's certificate last: its presence is what marks a folder as initialised.
        files.sort_by_key(|f| f.file_name().is_some_and(|n| n == "ca.pem"));
        let mut moved = Vec::new();
        for f in files {
            let to = dir.join(f.file_name().unwrap_or_default());
            if let Err(e) = std::fs::rename(&f, &to) {
                for m in &moved {
                    let _ = std::fs::remove_file(m);
                }
                return Err(format!("moving {} into {}: {e}", f.display(), dir.display()));
            }
            moved.push(to);
        }
        Ok(moved)
    })();
    let _ = std::fs::remove_dir_all(&staging);
    written?;
    for id in &ids {
        println!("certificate for {} in {}", id.name, dir.display());
    }
    println!("cluster CA of {} in {} (keep ca-key.pem private)", cfg.cluster.name, dir.display());
    Ok(())
}

fn status(
    config: Option<PathBuf>,
    node: Option<String>,
    via: Option<String>,
    socket: Option<PathBuf>,
    json: bool,
    watch: Option<f64>,
) -> Result<(), String> {
    let watch = match watch {
        Some(s) if s.is_finite() && s >= 0.1 => Some(std::time::Duration::from_secs_f64(s)),
        Some(s) => return Err(format!("--watch {s}: seconds, at least 0.1")),
        None => None,
    };
    // A socket named and no configuration: that agent's own status (checked to be `--node`'s, if named).
    if let (Some(socket), None) = (&socket, &config) {
        return status_view::run(socket, None, node.as_deref(), json, watch);
    }
    let cfg = load(config, None)?;
    let sock = |name: &str| vfabric::agent::default_socket(&cfg.cluster.name, name);
    let node = match (node, cfg.nodes.as_slice()) {
        (Some(n), _) => n,
        (None, [only]) => only.name.clone(),
        (None, _) => return Err("the configuration has several nodes: say which with --node".into()),
    };
    let id = cfg.node_index(&node).map_err(|e| e.to_string())?;
    // Whose agent to ask: the one named, the node's own if it runs here, else any of the cluster's that runs
    // here, which asks the node's over QUIC.
    let socket = match (socket, via) {
        (Some(s), _) => s,
        (None, Some(v)) => {
            cfg.node_index(&v).map_err(|e| e.to_string())?;
            sock(&v)
        }
        (None, None) if sock(&node).exists() => sock(&node),
        (None, None) => match cfg.nodes.iter().find(|n| sock(&n.name).exists()) {
            Some(here) => {
                eprintln!(
                    "node {node}'s agent has no socket on this machine: asking node {}'s agent here, which asks \
                     node {node}'s over QUIC",
                    here.name
                );
                sock(&here.name)
            }
            // Say where the node's own would be.
            None => sock(&node),
        },
    };
    status_view::run(&socket, Some(id), Some(&node), json, watch)
}

fn add_node(config: &std::path::Path, name: &str, tenant: Option<u32>) -> Result<(), String> {
    use vfabric_transport::quic::ClusterCa;
    let cfg = ClusterConfig::from_file(config).map_err(|e| e.to_string())?;
    if cfg.node_index(name).is_ok() {
        return Err(format!(
            "node {name} is listed in {}: `vfabric cluster init` made its certificate",
            config.display()
        ));
    }
    if let Some(t) = tenant.filter(|t| !cfg.tenants.iter().any(|s| s.id == *t)) {
        return Err(format!("tenant {t} is not listed in {} ([[tenant]])", config.display()));
    }
    let dir = PathBuf::from(&cfg.network.certs);
    if dir.join(format!("{name}.pem")).exists() {
        return Err(format!("{} already holds a certificate for {name}", dir.display()));
    }
    let ca = ClusterCa::load(&dir).map_err(|e| format!("the cluster CA in {}: {e}", dir.display()))?;
    let id = ca.issue_for(name, tenant).map_err(|e| format!("node {name}: {e}"))?;
    id.save(&dir).map_err(|e| format!("node {name}: {e}"))?;
    println!(
        "certificate for {name} in {} (start it with `vfabric agent --node {name} --listen IP:PORT`)",
        dir.display()
    );
    if cfg.membership.is_none() {
        println!("note: without [membership] (etcd), only nodes listed in [[node]] are reached");
    }
    Ok(())
}

fn run_agent(
    cfg: ClusterConfig,
    node: String,
    listen: Option<std::net::SocketAddr>,
    threads: usize,
    metrics: Option<std::net::SocketAddr>,
) -> Result<(), String> {
    let rt = vfabric::agent::Agent::runtime(threads).map_err(|e| e.to_string())?;
    let drain = cfg.network.drain;
    rt.block_on(async move {
        let agent =
            vfabric::agent::Agent::start_from_config_at(&cfg, &node, listen).await.map_err(|e| e.to_string())?;
        let socket = vfabric::agent::default_socket(&cfg.cluster.name, &node);
        let socket = agent.serve_local(&socket).await.map_err(|e| e.to_string())?;
        let metrics = match metrics.or(cfg.metrics.as_ref().map(|m| m.listen)) {
            Some(addr) => Some(agent.serve_metrics(addr).map_err(|e| e.to_string())?),
            None => None,
        };
        let metrics_at = metrics.as_ref().map(|m| format!(", metrics at http://{}/metrics", m.local_addr()));
        println!(
            "agent {node} (node {}) listening on {}, local clients on {}{}",
            agent.node(),
            agent.local_addr(),
            socket.display(),
            metrics_at.unwrap_or_default()
        );
        wait_for_stop().await?;
        drop(metrics);
        if drain {
            println!("stopping: handing this node's regions to the others (network.drain)");
            let d = agent.leave().await;
            println!(
                "handed over every replicated region and {} more ({} copied); {} stayed and are lost with this node",
                d.copied,
                vfabric::ByteSize(d.bytes),
                d.kept.len()
            );
        } else {
            println!("stopping");
            agent.shutdown().await;
        }
        let _ = std::fs::remove_file(&socket);
        Ok(())
    })
}

/// The probe's two passes over a peer's region.
#[derive(Clone, Copy)]
enum Pass {
    Write,
    Read,
}

/// Bytes the probe writes or reads at a time.
const PROBE_PIECE: u64 = 64 << 20;

fn probe(cfg: ClusterConfig, node: String, bytes: u64) -> Result<(), String> {
    let rt = vfabric::agent::Agent::runtime(0).map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let agent = vfabric::agent::Agent::start_from_config(&cfg, &node).await.map_err(|e| e.to_string())?;
        let seed = u64::from(agent.node()) + 1;
        let mut failed = 0;
        for (i, peer) in cfg.nodes.iter().enumerate() {
            let i = i as u16;
            if i == agent.node() {
                continue;
            }
            let t = std::time::Instant::now();
            // Written and read back a piece at a time: this process holds one piece, however large the probe.
            let check = async {
                let r = agent.alloc(i, bytes, None).await?;
                let passes = async {
                    let mut same = true;
                    for pass in [Pass::Write, Pass::Read] {
                        let mut off = 0;
                        while off < bytes && same {
                            let n = PROBE_PIECE.min(bytes - off);
                            let data = vfabric::pattern::bytes(seed, off, n as usize);
                            match pass {
                                Pass::Write => agent.write(&r, off, &data).await?,
                                Pass::Read => {
                                    let mut back = vec![0u8; data.len()];
                                    agent.read(&r, off, &mut back).await?;
                                    same = back == data;
                                }
                            }
                            off += n;
                        }
                    }
                    Ok::<bool, vfabric::FabricError>(same)
                };
                // The region goes whatever happened: a failed probe leaves nothing behind on the peer.
                let same = passes.await;
                let freed = agent.free(&r).await;
                let same = same?;
                freed?;
                Ok::<bool, vfabric::FabricError>(same)
            };
            match check.await {
                Ok(true) => {
                    let s = t.elapsed().as_secs_f64();
                    println!(
                        "peer {}: ok, {} written and read back, every byte equal, {:.1} ms ({:.2} Gbit/s)",
                        peer.name,
                        vfabric::ByteSize(bytes),
                        s * 1e3,
                        2.0 * bytes as f64 * 8.0 / s / 1e9
                    );
                }
                Ok(false) => {
                    failed += 1;
                    println!("peer {}: FAILED: the bytes read back differ", peer.name);
                }
                Err(e) => {
                    failed += 1;
                    println!("peer {}: FAILED: {e}", peer.name);
                }
            }
        }
        agent.shutdown().await;
        if failed > 0 {
            Err(format!("{failed} peer(s) failed"))
        } else {
            Ok(())
        }
    })
}

/// SIGTERM or Ctrl-C.
async fn wait_for_stop() -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    tokio::select! {
        _ = term.recv() => Ok(()),
        r = tokio::signal::ctrl_c() => r.map_err(|e| e.to_string()),
    }
}

fn load(config: Option<PathBuf>, device: Option<Backend>) -> Result<ClusterConfig, String> {
    let mut cfg = ClusterConfig::load(config.as_deref()).map_err(|e| e.to_string())?;
    if let Some(b) = device {
        cfg.device.backend = b;
    }
    Ok(cfg)
}

fn main() -> ExitCode {
    vfabric::logging::init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { config, device } => load(config, device).and_then(|cfg| {
            let r = vfabric::demo::run(&cfg, &mut std::io::stdout()).map_err(|e| e.to_string())?;
            if r.all_verified() {
                Ok(())
            } else {
                Err("some pages did not arrive intact".into())
            }
        }),
        Command::Info { config, device } => load(config, device).and_then(|cfg| {
            // The plan, not the fabric: making the arenas would pin the whole host tier first.
            let plan = vfabric::NodePlan::for_node(&cfg, 0).map_err(|e| e.to_string())?;
            if let Some(why) = plan.fallback_reason() {
                println!("no usable GPU ({why}): the emulated device stands in");
            }
            println!("{}", plan.describe());
            println!("NCCL: {}", if plan.nccl_available() { "available" } else { "not found" });
            let ps = plan.page_size;
            let storage = plan.storage.map(|bytes| (vfabric::Location::Storage, bytes));
            for (location, bytes) in plan.arenas.iter().copied().chain(storage) {
                // The storage tier is a file of slots, not an arena; the packed tier's slots are shorter than a page, and
                // the compressed tier's blocks shorter still.
                let (what, unit) = match location {
                    vfabric::Location::Storage => ("file", "slots"),
                    vfabric::Location::Packed(_) => ("arena", "slots"),
                    vfabric::Location::Compressed => ("arena", "blocks"),
                    _ => ("arena", "frames"),
                };
                let frame = location.frame_bytes(ps);
                println!(
                    "  {location}: {what} {} = {} {unit} of {}",
                    vfabric::ByteSize(bytes),
                    bytes / frame,
                    vfabric::ByteSize(frame)
                );
            }
            Ok(())
        }),
        Command::Cluster { command: ClusterCommand::Init { config, out, ranks } } => cluster_init(&config, out, ranks),
        Command::Cluster { command: ClusterCommand::Probe { config, node, bytes, device } } => {
            load(Some(config), device).and_then(|cfg| probe(cfg, node, bytes.bytes()))
        }
        Command::Agent { config, node, listen, device, threads, metrics } => {
            load(Some(config), device).and_then(|cfg| run_agent(cfg, node, listen, threads, metrics))
        }
        Command::Cluster { command: ClusterCommand::AddNode { config, name, tenant } } => {
            add_node(&config, &name, tenant)
        }
        Command::Status { config, node, via, socket, json, watch } => status(config, node, via, socket, json, watch),
        Command::CheckConfig { path } => ClusterConfig::from_file(&path).map_err(|e| e.to_string()).and_then(|cfg| {
            let text = toml_text(&cfg)?;
            println!("{text}");
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn toml_text(cfg: &ClusterConfig) -> Result<String, String> {
    toml::to_string_pretty(cfg).map_err(|e| e.to_string())
}
