//! `vfabric-bench remote`: pages moved between two agents over QUIC (mutual TLS, every chunk checksummed),
//! writes to and reads from a region whose home is the other agent, for several page sizes, requests in
//! flight and packet sizes; beside `iperf3` TCP on the same path in the same run; and the latency of one
//! remote read (p50/p99). Both agents run in this process, on loopback.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use serde_json::json;
use vfabric::agent::Agent;
use vfabric::config::NodeSection;
use vfabric::{ByteSize, ClusterConfig, Compression};
use vfabric_transport::quic::ClusterCa;
use vfabric_transport::Location;

use crate::common::ConfigArgs;
use crate::region_codecs::CodecWire;
use crate::report;

/// Options of `vfabric-bench remote`.
#[derive(Args, Debug, Clone)]
pub struct RemoteArgs {
    /// The configuration and device layer (each agent gets its memory settings).
    #[command(flatten)]
    pub target: ConfigArgs,
    /// QUIC packet sizes (UDP payload bytes) to run, one pair of agents each.
    #[arg(long, value_delimiter = ',', default_values = ["1452", "6500"])]
    pub mtus: Vec<u16>,
    /// Bytes per request: the page size of the region (64KiB..2MiB, a power of two).
    #[arg(long, value_delimiter = ',', default_values = ["2MiB", "64KiB"])]
    pub sizes: Vec<ByteSize>,
    /// Requests in flight at once (each on its own QUIC stream).
    #[arg(long, value_delimiter = ',', default_values = ["1", "4"])]
    pub streams: Vec<usize>,
    /// Bytes moved per case and direction.
    #[arg(long, default_value = "512MiB")]
    pub total: ByteSize,
    /// Remote reads timed one at a time for the latency figures.
    #[arg(long, default_value_t = 1000)]
    pub latency_samples: usize,
    /// Seconds of the iperf3 baseline (0 skips it).
    #[arg(long, default_value_t = 3)]
    pub iperf_seconds: u64,
    /// Run only this end, as node `--node` of this cluster configuration, against the agent of node `--peer`
    /// started separately (`vfabric agent`): two processes, on loopback or across network namespaces. The
    /// packet size is the configuration's and `--sizes` are request sizes within its pages.
    #[arg(long, requires_all = ["node", "peer"])]
    pub cluster: Option<PathBuf>,
    /// This end's node (with `--cluster`).
    #[arg(long)]
    pub node: Option<String>,
    /// The peer's node, home of the region (with `--cluster`).
    #[arg(long)]
    pub peer: Option<String>,
    /// Where an `iperf3 -s` already listens on the peer's side (port 5201); default: one started here on
    /// loopback.
    #[arg(long)]
    pub iperf_server: Option<String>,
    /// Where the region's pages live at its home: `host`, or a GPU of the home node such as `gpu1` (then writes
    /// end in host -> GPU copies there and reads start with GPU -> host copies).
    #[arg(long, default_value = "host")]
    pub home_device: Location,
    /// Where this end's acquires put the pages (a device of this node).
    #[arg(long, default_value = "gpu0")]
    pub acquire_device: Location,
    /// QUIC flow-control window, of a stream and of a connection, of the agents started here (default: the
    /// configuration's).
    #[arg(long)]
    pub stream_window: Option<ByteSize>,
    /// Worker threads of this process's runtime (1: one thread). 0 (default): with `--cluster`, the agent's
    /// own choice (`Agent::runtime`: one thread on two cores or fewer); else every core, at least 4 (both
    /// in-process agents and the requests share them).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// QUIC connections for bulk transfers between the two agents started here, each on a socket of its own,
    /// beside the latency lane (default: the configuration's `network.lanes`). With `--cluster` the
    /// configuration says, for both ends.
    #[arg(long)]
    pub lanes: Option<u16>,
    /// Skip the cost of serving metrics (the first packet and request size, the most requests in flight, with
    /// both agents' Prometheus endpoints served and without, alternating).
    #[arg(long)]
    pub no_metrics_cost: bool,
    /// Sparse pages (zeros but for a number every 4 KiB, as zeroed buffers and masks are) instead of random
    /// bytes: what `network.compression = "lz4"` in the configuration packs.
    #[arg(long)]
    pub sparse: bool,
    /// Pages of a trained model's tensors (a folder of raw tensors, one per file, as `train_offload.py
    /// --dump-tensors` writes them): a request of each file in turn, a region's worth at most.
    #[arg(long, conflicts_with = "sparse")]
    pub tensors: Option<PathBuf>,
    /// With `--tensors`: that file's pages only (e.g. `weights.bf16`).
    #[arg(long, requires = "tensors")]
    pub tensor: Option<String>,
    /// After the other cases, a region allocated with each of these codecs (`none`, `lz4`, `zstd`), written and
    /// read in alternating rounds: pages packed on the wire beside unpacked ones in the same run, whatever
    /// `network.compression` says.
    #[arg(long, value_delimiter = ',')]
    pub region_codecs: Vec<Compression>,
    /// Rounds of `--region-codecs`.
    #[arg(long, default_value_t = 3)]
    pub codec_rounds: usize,
    /// Results folder.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: remote-TIME).
    #[arg(long)]
    pub name: Option<String>,
}

/// Everything one run measures.
#[derive(Debug, Default)]
struct Results {
    rows: Vec<Row>,
    latency: Vec<Latency>,
    moves: Vec<Move>,
    codecs: Vec<CodecWire>,
}

/// One throughput case.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// QUIC packet size.
    pub mtu: u16,
    /// "write" (push to the home) or "read" (pull from it).
    pub op: &'static str,
    /// Bytes per request.
    pub size: u64,
    /// Requests in flight.
    pub streams: usize,
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds.
    pub seconds: f64,
    /// Gbit/s of page payload.
    pub gbit_s: f64,
    /// Requests whose bytes came back different (reads only).
    pub bad: u64,
    /// QUIC packets this end declared lost during the case (it sends the pages of writes; a read's losses are
    /// counted by the home, and show here as `wire_bytes` above the payload).
    pub lost_packets: u64,
    /// UDP payload bytes this end sent and received during the case (headers, acknowledgements, resent packets
    /// and the pages).
    pub wire_bytes: u64,
    /// Flow-control stalls: frames either end sent saying it ran out of credit (the receiver fell behind).
    pub blocked_frames: u64,
}

/// A whole region moved to this node and back (`Agent::migrate_to`).
#[derive(Debug, Clone, Serialize)]
pub struct Move {
    /// QUIC packet size.
    pub mtu: u16,
    /// The region's page size.
    pub page: u64,
    /// The region's bytes.
    pub bytes: u64,
    /// Gbit/s of the move from the home's device to this node's.
    pub there_gbit_s: f64,
    /// Gbit/s of the move back.
    pub back_gbit_s: f64,
}

/// Remote read latency of one size.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// QUIC packet size.
    pub mtu: u16,
    /// Bytes read.
    pub size: u64,
    /// The region's page size: requests smaller than a page acquire the whole page, so after the first range of
    /// a page the acquires below find this node's copy of it current.
    pub page: u64,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// `acquire(Read)` of the same size onto GPU 0 of this node (pages from the home), median, microseconds.
    pub acquire_p50_us: f64,
    /// Its 99th percentile, microseconds.
    pub acquire_p99_us: f64,
    /// The same acquire again, this node's copy still current (no pages sent), median, microseconds.
    pub acquire_current_p50_us: f64,
    /// Its 99th percentile, microseconds.
    pub acquire_current_p99_us: f64,
    /// Ranges acquired (twice each).
    pub acquire_samples: usize,
    /// A bare call (`Agent::ping`: one request, one answer, no payload), median, microseconds: the floor under
    /// every remote operation.
    pub ping_p50_us: f64,
    /// Its 99th percentile, microseconds.
    pub ping_p99_us: f64,
    /// The reads' distribution, microseconds at every hundredth of it (`stats::cdf`).
    pub read_cdf_us: Vec<f64>,
    /// The new-copy acquires' distribution, the same way.
    pub acquire_cdf_us: Vec<f64>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The connections between two agents of `net`, for the report.
fn lanes_described(net: &vfabric::config::NetworkSection) -> String {
    match net.latency_lane {
        true => format!(
            "{} connection(s) for bulk transfers (lanes) and the latency lane for calls under 256 KiB",
            net.lanes
        ),
        false => format!("{} connection(s) (lanes), no latency lane", net.lanes),
    }
}

/// The two-node cluster the benchmark runs: `n1` is the home of the region `n0` writes and reads.
pub(crate) fn two_nodes(
    base: &ClusterConfig,
    mtu: u16,
    region: u64,
    page: u64,
    window: Option<ByteSize>,
    lanes: Option<u16>,
) -> Result<ClusterConfig, String> {
    let mut c = base.clone();
    vfabric_allocator::PageSize::new(page).map_err(|e| format!("--sizes {}: {e}", ByteSize(page)))?;
    c.memory.page_size = ByteSize(page);
    c.cluster.name = "bench-remote".into();
    c.network.mtu = mtu;
    c.network.chunk = ByteSize(1 << 20);
    // Generous: a 2-core machine runs both agents, so heartbeats may be late under full load.
    c.network.heartbeat_ms = 1000;
    c.network.dead_after_ms = 30_000;
    c.memory.host_arena = ByteSize(c.memory.host_arena.bytes().max(region + (64 << 20)));
    c.nodes = (0..2).map(|i| NodeSection { name: format!("n{i}"), gpus: None, address: None, tenant: None }).collect();
    if let Some(w) = window {
        c.network.stream_window = w;
        c.network.connection_window = w;
    }
    if let Some(l) = lanes {
        c.network.lanes = l;
    }
    Ok(c)
}

pub(crate) async fn start_pair(cfg: &ClusterConfig) -> Result<(Agent, Agent), String> {
    let ca = ClusterCa::generate(&cfg.cluster.name).map_err(|e| e.to_string())?;
    let mut agents = Vec::new();
    for n in &cfg.nodes {
        let id = ca.issue(&n.name).map_err(|e| e.to_string())?;
        let bind = "127.0.0.1:0".parse().map_err(|e: std::net::AddrParseError| e.to_string())?;
        agents.push(Agent::start(cfg, &n.name, &id, Some(bind)).await.map_err(|e| e.to_string())?);
    }
    let (b, a) = (agents.pop().ok_or("no agent")?, agents.pop().ok_or("no agent")?);
    a.set_peer_addr(b.node(), b.local_addr()).await.map_err(|e| e.to_string())?;
    b.set_peer_addr(a.node(), a.local_addr()).await.map_err(|e| e.to_string())?;
    Ok((a, b))
}

/// iperf3 TCP (to `server`, or on loopback with a server started here): Gbit/s received with 1 and 4 streams,
/// or why it did not run.
pub(crate) fn iperf3(seconds: u64, server: Option<&str>) -> Result<Vec<(usize, f64)>, String> {
    if seconds == 0 {
        return Err("skipped (--iperf-seconds 0)".into());
    }
    if let Some(host) = server {
        let mut out = Vec::new();
        for streams in [1usize, 4] {
            let client = Command::new("iperf3")
                .args(["-c", host, "-t", &seconds.to_string(), "-P", &streams.to_string(), "-J"])
                .output()
                .map_err(|e| format!("iperf3 not runnable ({e}); install the Debian package iperf3"))?;
            let v: serde_json::Value =
                serde_json::from_slice(&client.stdout).map_err(|e| format!("iperf3 output: {e}"))?;
            let bps = v["end"]["sum_received"]["bits_per_second"]
                .as_f64()
                .ok_or_else(|| format!("iperf3 gave no result: {}", v["error"]))?;
            out.push((streams, bps / 1e9));
        }
        return Ok(out);
    }
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let mut out = Vec::new();
    for streams in [1usize, 4] {
        let mut server: Child = Command::new("iperf3")
            .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("iperf3 not runnable ({e}); install the Debian package iperf3"))?;
        std::thread::sleep(Duration::from_millis(300));
        let client = Command::new("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-t",
                &seconds.to_string(),
                "-P",
                &streams.to_string(),
                "-J",
            ])
            .output();
        // The server serves one client (-1) and exits; end it by its PID should the client have failed.
        let _ = server.kill();
        let _ = server.wait();
        let client = client.map_err(|e| format!("iperf3 client: {e}"))?;
        let v: serde_json::Value = serde_json::from_slice(&client.stdout).map_err(|e| format!("iperf3 output: {e}"))?;
        let bps = v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .ok_or_else(|| format!("iperf3 gave no result: {}", v["error"]))?;
        out.push((streams, bps / 1e9));
    }
    Ok(out)
}

/// Every case of one packet size and request size, from agent `a` to a region whose home is `peer`.
async fn measure(
    a: &Agent,
    (peer, mtu): (u16, u16),
    size: u64,
    region_bytes: u64,
    args: &RemoteArgs,
    out: &mut Results,
) -> Result<(), String> {
    let region = a.alloc(peer, region_bytes, Some(args.home_device)).await.map_err(|e| e.to_string())?;
    let data =
        std::sync::Arc::new(crate::throughput::payload(payload(args), u64::from(mtu) ^ size, size, region_bytes)?);
    {
        for &streams in &args.streams {
            for write in [true, false] {
                eprintln!(
                    "mtu {mtu}: {} {} in {} requests, {streams} in flight",
                    if write { "write" } else { "read" },
                    ByteSize(args.total.bytes()),
                    ByteSize(size)
                );
                let before = a.link_stats(peer).await.map_err(|e| e.to_string())?;
                let (secs, bad) =
                    crate::throughput::throughput(a, &region, write, size, streams, args.total.bytes(), &data).await?;
                let link = a.link_stats(peer).await.map_err(|e| e.to_string())?.since(&before);
                let bytes = (args.total.bytes() / size).max(1) * size;
                out.rows.push(Row {
                    mtu,
                    op: if write { "write" } else { "read" },
                    size,
                    streams,
                    bytes,
                    seconds: secs,
                    gbit_s: bytes as f64 * 8.0 / secs / 1e9,
                    bad,
                    lost_packets: link.lost_packets,
                    wire_bytes: link.udp_tx_bytes + link.udp_rx_bytes,
                    blocked_frames: link.blocked_frames_sent + link.blocked_frames_received,
                });
            }
        }
        let mut buf = vec![0u8; size as usize];
        let mut samples = Vec::with_capacity(args.latency_samples);
        for i in 0..args.latency_samples as u64 {
            let off = (i % (region_bytes / size).max(1)) * size;
            let t = Instant::now();
            a.read(&region, off, &mut buf).await.map_err(|e| e.to_string())?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        samples.sort_by(|x, y| x.total_cmp(y));
        // Each range twice: the first lease brings the page (a new copy), the second finds the copy
        // current (the home checks the version and sends nothing). Every range is new to the first.
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        let ranges = (args.latency_samples as u64).min((region_bytes / size).max(1));
        for i in 0..ranges {
            let off = i * size;
            for v in [&mut cold, &mut warm] {
                let t = Instant::now();
                let l = a
                    .acquire(&region, off..off + size, args.acquire_device, vfabric::Mode::Read)
                    .await
                    .map_err(|e| e.to_string())?;
                v.push(t.elapsed().as_secs_f64() * 1e6);
                a.release(l).await.map_err(|e| e.to_string())?;
            }
        }
        cold.sort_by(|x, y| x.total_cmp(y));
        warm.sort_by(|x, y| x.total_cmp(y));
        let mut pings = Vec::with_capacity(args.latency_samples);
        for _ in 0..args.latency_samples {
            pings.push(a.ping(peer).await.map_err(|e| e.to_string())?.as_secs_f64() * 1e6);
        }
        pings.sort_by(|x, y| x.total_cmp(y));
        out.latency.push(Latency {
            mtu,
            size,
            page: region.page_size,
            p50_us: pct(&samples, 0.5),
            p99_us: pct(&samples, 0.99),
            acquire_p50_us: pct(&cold, 0.5),
            acquire_p99_us: pct(&cold, 0.99),
            acquire_current_p50_us: pct(&warm, 0.5),
            acquire_current_p99_us: pct(&warm, 0.99),
            acquire_samples: cold.len(),
            ping_p50_us: pct(&pings, 0.5),
            ping_p99_us: pct(&pings, 0.99),
            read_cdf_us: crate::stats::cdf(&mut samples),
            acquire_cdf_us: crate::stats::cdf(&mut cold),
        });
    }
    out.moves.push(move_region(a, &region, peer, mtu, args).await?);
    a.free(&region).await.map_err(|e| e.to_string())?;
    // After the region is gone, so that the codecs' regions have its room.
    if !args.region_codecs.is_empty() {
        let streams = args.streams.iter().copied().max().unwrap_or(1);
        let how = (size, streams, args.total.bytes());
        let home = (peer, args.home_device, mtu);
        let codecs = &args.region_codecs;
        out.codecs
            .extend(crate::region_codecs::measure(a, home, region_bytes, codecs, args.codec_rounds, how, &data).await?);
    }
    Ok(())
}

/// Moves the whole region to this node's `--acquire-device` and back to its home's `--home-device`
/// (`Agent::migrate_to`: the home copies the pages over QUIC, checksummed), each way timed and checked byte for
/// byte afterwards (the read after the first move goes to this node through the location hint).
async fn move_region(
    a: &Agent,
    region: &vfabric::Region,
    peer: u16,
    mtu: u16,
    args: &RemoteArgs,
) -> Result<Move, String> {
    let seed = 0x6d6f7665 ^ u64::from(mtu);
    let len = region.len as usize;
    a.write(region, 0, &vfabric::pattern::bytes(seed, 0, len)).await.map_err(|e| e.to_string())?;
    let mut back = vec![0u8; len];
    let mut timed = Vec::new();
    for (node, device) in [(a.node(), args.acquire_device), (peer, args.home_device)] {
        eprintln!("mtu {mtu}: moving the region ({}) to node {node}'s {device}", ByteSize(region.len));
        let t = Instant::now();
        a.migrate_to(region, node, device).await.map_err(|e| format!("moving to node {node}'s {device}: {e}"))?;
        timed.push(region.len as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9);
        a.read(region, 0, &mut back).await.map_err(|e| e.to_string())?;
        if vfabric::pattern::first_mismatch(seed, 0, &back).is_some() {
            return Err(format!("the region's bytes changed when it moved to node {node}'s {device}"));
        }
    }
    Ok(Move { mtu, page: region.page_size, bytes: region.len, there_gbit_s: timed[0], back_gbit_s: timed[1] })
}

/// Runs the benchmark and writes its results.
pub fn run(args: &RemoteArgs, command_line: &str) -> Result<(), String> {
    crate::region_codecs::check(&args.region_codecs, args.codec_rounds)?;
    let base = args.target.load()?;
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    let threads = match args.threads {
        0 if args.cluster.is_none() => cores.max(4),
        n => n,
    };
    let rt = vfabric::agent::Agent::runtime(threads).map_err(|e| e.to_string())?;
    let sizes: Vec<u64> = args.sizes.iter().map(|s| s.bytes()).collect();
    let max_size = sizes.iter().copied().max().unwrap_or(2 << 20);
    let region_bytes = (256u64 << 20).max(max_size).min(args.total.bytes().max(max_size));
    let mut out = Results::default();
    let mut device = String::new();
    let mut lanes = String::new();
    if let (Some(path), Some(node), Some(peer)) = (&args.cluster, &args.node, &args.peer) {
        // This end only, against a separately started agent.
        let mut cfg = ClusterConfig::from_file(path).map_err(|e| e.to_string())?;
        if let Some(b) = args.target.device {
            cfg.device.backend = b;
        }
        let peer = cfg.node_index(peer).map_err(|e| e.to_string())?;
        if args.lanes.is_some_and(|l| l != cfg.network.lanes) {
            return Err(format!(
                "--lanes: with --cluster both ends take network.lanes ({}) from {}",
                cfg.network.lanes,
                path.display()
            ));
        }
        lanes = lanes_described(&cfg.network);
        let mtu = cfg.network.mtu;
        rt.block_on(async {
            let a = Agent::start_from_config(&cfg, node).await.map_err(|e| e.to_string())?;
            device = a.fabric().describe();
            for &size in &sizes {
                measure(&a, (peer, mtu), size, region_bytes, args, &mut out).await?;
            }
            a.shutdown().await;
            Ok::<(), String>(())
        })?;
    }
    // Otherwise one pair of agents per packet size and page size: a node has one page size, and a request is a
    // page.
    let pairs = if args.cluster.is_some() { Vec::new() } else { args.mtus.clone() };
    let mut metrics = None;
    for (&mtu, &size) in pairs.iter().flat_map(|m| sizes.iter().map(move |s| (m, s))) {
        let cfg = two_nodes(&base, mtu, region_bytes, size, args.stream_window, args.lanes)?;
        lanes = lanes_described(&cfg.network);
        rt.block_on(async {
            let (a, b) = start_pair(&cfg).await?;
            if device.is_empty() {
                device = b.fabric().describe();
            }
            measure(&a, (b.node(), mtu), size, region_bytes, args, &mut out).await?;
            if metrics.is_none() && !args.no_metrics_cost {
                let streams = args.streams.iter().copied().max().unwrap_or(1);
                eprintln!("mtu {mtu}: writes and reads with both agents' metrics served, and without");
                metrics = Some(crate::metrics_cost::measure(&a, &b, size, streams, args.total.bytes()).await?);
            }
            a.shutdown().await;
            b.shutdown().await;
            Ok::<(), String>(())
        })?;
    }
    let Results { rows, latency: lat, moves, codecs } = out;
    let tcp = iperf3(args.iperf_seconds, args.iperf_server.as_deref());
    let tcp1 = tcp.as_ref().ok().and_then(|v| v.iter().find(|(s, _)| *s == 1).map(|x| x.1));

    let (date, stamp) = report::now_stamps();
    let name = args.name.clone().unwrap_or_else(|| format!("remote-{stamp}"));
    // With --cluster, the cluster's file sets it for both ends.
    let net = args.cluster.as_ref().and_then(|p| ClusterConfig::from_file(p).ok()).map_or(base.network, |c| c.network);
    let wire = format!("network.compression: {}; network.wire_zstd: {}", net.compression, net.wire_zstd);
    let mut md = String::new();
    let _ = writeln!(md, "# vfabric-bench remote, {date}\n");
    let _ = writeln!(md, "- command: `{command_line}`");
    let _ = writeln!(md, "- pages: {}; {wire}", crate::throughput::describe(payload(args)));
    let setup = match (&args.cluster, &args.node, &args.peer) {
        (Some(c), Some(n), Some(p)) => {
            format!(
                "this process runs node {n} of {}; the region's home is node {p}, a separate `vfabric agent`",
                c.display()
            )
        }
        _ => "two agents in one process on 127.0.0.1; the region's home is the other agent".to_string(),
    };
    let _ = writeln!(md, "- {setup}; QUIC with mutual TLS (encrypted), {lanes} between the agents, each on a socket of its own, each call on the least busy it may take; page payloads in 1 MiB checksummed (xxh3) chunks; device layer: {device}");
    let _ = writeln!(
        md,
        "- the region's pages live on {} of their home; acquires put them on {} here",
        args.home_device, args.acquire_device
    );
    let _ = writeln!(md, "- machine: {} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    match &tcp {
        Ok(v) => {
            for (s, g) in v {
                let _ = writeln!(
                    md,
                    "- baseline, same run: iperf3 TCP to {}, {s} stream(s): {g:.2} Gbit/s (no encryption)",
                    args.iperf_server.as_deref().unwrap_or("127.0.0.1")
                );
            }
        }
        Err(why) => {
            let _ = writeln!(md, "- baseline: iperf3 did not run: {why}");
        }
    }
    let _ = writeln!(
        md,
        "\n| packet | op | request | in flight | Gbit/s | vs iperf3 (1 stream) | bad | lost packets (this end) | wire bytes / payload | flow-control stalls |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let ratio = tcp1.map_or("-".to_string(), |t| format!("{:.2}", r.gbit_s / t));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2} | {ratio} | {} | {} | {:.3} | {} |",
            r.mtu,
            r.op,
            ByteSize(r.size),
            r.streams,
            r.gbit_s,
            r.bad,
            r.lost_packets,
            r.wire_bytes as f64 / r.bytes.max(1) as f64,
            r.blocked_frames
        );
    }
    if let Some(c) = &metrics {
        let (w, r) = c.ratios();
        let _ = writeln!(
            md,
            "\nWith both agents' metrics served (every call timed into histograms), the same run, {} requests, {} in \
             flight, medians of {} alternating rounds: writes {:.2} Gbit/s against {:.2} without (**{w:.3}x**), \
             reads {:.2} against {:.2} (**{r:.3}x**).",
            ByteSize(c.size),
            c.streams,
            c.rounds,
            c.write_gbit_s.1,
            c.write_gbit_s.0,
            c.read_gbit_s.1,
            c.read_gbit_s.0
        );
    }
    crate::region_codecs::markdown(&mut md, &codecs, &wire);
    // `--latency-samples 0` times none: no table.
    if args.latency_samples > 0 {
        let _ = writeln!(md, "\n## Remote latency ({} samples each, one at a time)\n", args.latency_samples);
        let _ = writeln!(
            md,
            "| packet | size | page | read p50 / p99 | acquire(Read) onto {}, new copy p50 / p99 | again, copy current p50 / p99 | ranges | a bare call (ping) p50 / p99 |",
            args.acquire_device
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for l in &lat {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} / {:.0} us | {:.0} / {:.0} us | {:.0} / {:.0} us | {} | {:.0} / {:.0} us |",
                l.mtu,
                ByteSize(l.size),
                ByteSize(l.page),
                l.p50_us,
                l.p99_us,
                l.acquire_p50_us,
                l.acquire_p99_us,
                l.acquire_current_p50_us,
                l.acquire_current_p99_us,
                l.acquire_samples,
                l.ping_p50_us,
                l.ping_p99_us
            );
        }
        if lat.iter().any(|l| l.size < l.page) {
            let _ = writeln!(
                md,
                "\nRequests smaller than a page acquire the whole page: after the first range of a page, a \"new copy\" \
                 finds this node's copy of the page current. For the latency of a page of that size, give the agents \
                 that page size (`memory.page_size`; `VFABRIC_MEMORY='page_size = \"64KiB\"'` with \
                 scripts/remote-bench-procs.sh)."
            );
        }
    }
    let _ = writeln!(
        md,
        "\n## The whole region moved to this node's {} and back to its home's {} (`migrate_to`, bytes checked after each)\n",
        args.acquire_device, args.home_device
    );
    let _ = writeln!(md, "| packet | page | region | there Gbit/s | back Gbit/s |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for m in &moves {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} |",
            m.mtu,
            ByteSize(m.page),
            ByteSize(m.bytes),
            m.there_gbit_s,
            m.back_gbit_s
        );
    }
    let json = json!({
        "date": date,
        "command": command_line,
        "device": device,
        "rows": rows,
        "latency": lat,
        "moves": moves,
        "region_codecs": codecs,
        "metrics_cost": metrics,
        "iperf3_gbit_s": tcp.as_ref().ok().map(|v| v.iter().map(|(s, g)| json!({"streams": s, "gbit_s": g})).collect::<Vec<_>>()),
        "iperf3_error": tcp.as_ref().err(),
    });
    print!("{md}");
    let (j, m) = report::write(&args.out, &name, &json, &md).map_err(|e| e.to_string())?;
    println!("\nresults: {} and {}", j.display(), m.display());
    if rows.iter().any(|r| r.bad > 0) || codecs.iter().any(|c| c.bad > 0) {
        return Err("some reads came back different from what was written".into());
    }
    Ok(())
}

/// What the requests carry, as `--sparse`, `--tensors` and `--tensor` say.
fn payload(args: &RemoteArgs) -> crate::throughput::Payload<'_> {
    crate::throughput::Payload { sparse: args.sparse, tensors: args.tensors.as_deref(), tensor: args.tensor.as_deref() }
}
