//! `vfabric-bench status`: how long a running agent takes to answer `vfabric status` and a Prometheus scrape
//! while it serves many regions, beside the floor under both: a ping's round trip on the same Unix socket.
//!
//! An agent starts in this process (local clients on a Unix socket, metrics on a loopback port); a local client
//! allocates `--regions` regions of one page (`--page-size`) and writes each, a lease is held on every tenth,
//! then `--samples` status calls, pings on the socket and scrapes of `/metrics` are timed, in turn.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use vfabric::agent::{Agent, LocalClient};
use vfabric::config::NodeSection;
use vfabric::ByteSize;
use vfabric_transport::quic::ClusterCa;

use crate::common::ConfigArgs;
use crate::report;
use crate::stats::percentile;

/// `vfabric-bench status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The configuration and device layer.
    #[command(flatten)]
    pub target: ConfigArgs,
    /// Regions the agent serves while it is asked.
    #[arg(long, default_value_t = 1000)]
    pub regions: usize,
    /// The fabric's page size here (each region takes a page): small, so that many regions fit any arena.
    #[arg(long, default_value = "64KiB")]
    pub page_size: ByteSize,
    /// Status calls, pings and scrapes timed (each).
    #[arg(long, default_value_t = 200)]
    pub samples: usize,
    /// Results folder.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: status-DEVICE-TIME).
    #[arg(long)]
    pub name: Option<String>,
}

/// Latencies of one kind of call, in microseconds, with their distribution's curve (`stats::cdf`).
fn summary(mut us: Vec<f64>) -> serde_json::Value {
    let (p50, p99) = (percentile(&mut us, 0.5), percentile(&mut us, 0.99));
    serde_json::json!({ "n": us.len(), "p50_us": p50, "p99_us": p99, "max_us": us.last().copied().unwrap_or(0.0),
                        "cdf_us": crate::stats::cdf(&mut us) })
}

/// One scrape of `http://addr/metrics`: its body's length.
fn scrape(addr: std::net::SocketAddr) -> Result<usize, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connecting to the metrics endpoint: {e}"))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).map_err(|e| e.to_string())?;
    if !body.starts_with(b"HTTP/1.") || !body.windows(4).any(|w| w == b" 200") {
        return Err(format!("the metrics endpoint answered: {}", String::from_utf8_lossy(&body[..body.len().min(80)])));
    }
    Ok(body.len())
}

/// Runs the scenario and writes its JSON and Markdown.
pub fn run(args: &StatusArgs, command_line: &str) -> Result<(), String> {
    if args.regions == 0 || args.samples == 0 {
        return Err("--regions and --samples must be at least 1".into());
    }
    let mut cfg = args.target.load()?;
    cfg.memory.page_size = args.page_size;
    cfg.nodes = vec![NodeSection { name: "bench".into(), gpus: None, address: None, tenant: None }];
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let rt = rt.map_err(|e| e.to_string())?;
    let identity =
        ClusterCa::generate(&cfg.cluster.name).and_then(|ca| ca.issue("bench")).map_err(|e| e.to_string())?;
    let socket = std::env::temp_dir().join(format!("vfabric-bench-status-{}.sock", std::process::id()));
    let agent = rt.block_on(async {
        let agent = Agent::start(&cfg, "bench", &identity, "127.0.0.1:0".parse().ok()).await?;
        agent.serve_local(&socket).await?;
        Ok::<_, vfabric::FabricError>(agent)
    });
    let agent = agent.map_err(|e| e.to_string())?;
    let result = rt.block_on(measure(args, &agent, &socket, command_line));
    rt.block_on(agent.shutdown());
    let _ = std::fs::remove_file(&socket);
    result
}

async fn measure(args: &StatusArgs, agent: &Agent, socket: &std::path::Path, command_line: &str) -> Result<(), String> {
    let e = |e: vfabric::FabricError| e.to_string();
    let fabric = agent.fabric();
    if let Some(why) = fabric.fallback_reason() {
        eprintln!("no usable GPU ({why}): the emulated device stands in");
    }
    let device = fabric.describe();
    let metrics = agent.serve_metrics("127.0.0.1:0".parse().map_err(|_| "address")?).map_err(e)?;
    let client = LocalClient::connect(socket).await.map_err(e)?;
    let page = fabric.page_size();
    let t = Instant::now();
    let mut leases = Vec::new();
    for i in 0..args.regions {
        let r = client.alloc(page, None).await.map_err(e)?;
        client.write(&r, 0, &[i as u8; 4096]).await.map_err(e)?;
        if i % 10 == 0 {
            leases.push(fabric.acquire(&r, 0..page, vfabric::Location::Host, vfabric::Mode::Read).map_err(e)?);
        }
    }
    eprintln!("{} regions allocated and written in {:.2} s", args.regions, t.elapsed().as_secs_f64());
    let (mut status_us, mut ping_us, mut scrape_us) = (Vec::new(), Vec::new(), Vec::new());
    let (mut status_bytes, mut scrape_bytes) = (0, 0);
    // The agent counts what this run made (and nothing else runs on it).
    let said: serde_json::Value =
        serde_json::from_str(&client.status().await.map_err(e)?).map_err(|e| e.to_string())?;
    let counted = said["fabric"]["directory"]["regions"].as_u64().unwrap_or(0);
    if counted != args.regions as u64 {
        return Err(format!("the agent counts {counted} regions, not the {} made", args.regions));
    }
    let addr = metrics.local_addr();
    for _ in 0..args.samples {
        let t = Instant::now();
        status_bytes = client.status().await.map_err(e)?.len();
        status_us.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        client.ping().await.map_err(e)?;
        ping_us.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        scrape_bytes = tokio::task::spawn_blocking(move || scrape(addr)).await.map_err(|e| e.to_string())??;
        scrape_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(leases);
    let (status, ping, scrape) = (summary(status_us), summary(ping_us), summary(scrape_us));
    let p50 = |v: &serde_json::Value| v["p50_us"].as_f64().unwrap_or(0.0);
    let ratio = |v: &serde_json::Value| if p50(&ping) > 0.0 { p50(v) / p50(&ping) } else { 0.0 };
    let (date, stamp) = report::now_stamps();
    let kind = if fabric.device_kind() == vfabric::DeviceKind::Emulated { "emulated" } else { "cuda" };
    let doc = serde_json::json!({
        "scenario": "status",
        "date": date,
        "command": command_line,
        "device": device,
        "regions": args.regions,
        "leases": args.regions.div_ceil(10),
        "status": status, "status_bytes": status_bytes,
        "scrape": scrape, "scrape_bytes": scrape_bytes,
        "ping": ping,
        "status_vs_ping": ratio(&status),
        "scrape_vs_ping": ratio(&scrape),
    });
    let md = format!(
        "# vfabric-bench status, {date}\n\n`{command_line}`\n\n{device}\n\nAn agent serving {} regions ({} leases \
         held), asked {} times each through its Unix socket and its metrics endpoint.\n\n\
         | call | p50 us | p99 us | answer bytes | p50 / ping |\n|---|---:|---:|---:|---:|\n\
         | `vfabric status` (Status on the socket) | {:.0} | {:.0} | {status_bytes} | {:.1} |\n\
         | Prometheus scrape (`/metrics`, HTTP) | {:.0} | {:.0} | {scrape_bytes} | {:.1} |\n\
         | ping on the socket (the floor) | {:.0} | {:.0} | - | 1.0 |\n",
        args.regions,
        args.regions.div_ceil(10),
        args.samples,
        p50(&status),
        status["p99_us"].as_f64().unwrap_or(0.0),
        ratio(&status),
        p50(&scrape),
        scrape["p99_us"].as_f64().unwrap_or(0.0),
        ratio(&scrape),
        p50(&ping),
        ping["p99_us"].as_f64().unwrap_or(0.0),
    );
    print!("{md}");
    let name = args.name.clone().unwrap_or_else(|| format!("status-{kind}-{stamp}"));
    let (j, m) = report::write(&args.out, &name, &doc, &md).map_err(|e| format!("writing results: {e}"))?;
    eprintln!("wrote {} and {}", j.display(), m.display());
    Ok(())
}
