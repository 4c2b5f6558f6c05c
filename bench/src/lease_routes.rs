//! `vfabric-bench lease-routes`: leases of a peer's pages onto this node's GPU by each route the agents can
//! take, in one run: by QUIC through host memory at both ends (`network.nccl = false` here), and GPU to GPU over
//! an NCCL channel joined between the two agents; beside NCCL's own send/recv of the same bytes between two
//! processes (`nccl_baseline.py`, run by this command). Each lease's bytes are checked where they landed. This
//! end runs one agent of a cluster configuration against the peer's agent started separately (`vfabric agent`):
//! `scripts/remote-bench-procs.sh config ... lease-routes`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use clap::Args;
use serde_json::json;
use vfabric::agent::Agent;
use vfabric::{ByteSize, ClusterConfig, Mode};
use vfabric_transport::Location;

use crate::report;

/// Options of `vfabric-bench lease-routes`.
#[derive(Args, Debug, Clone)]
pub struct LeaseRoutesArgs {
    /// The cluster configuration both agents run.
    #[arg(long)]
    pub cluster: PathBuf,
    /// This end's node.
    #[arg(long)]
    pub node: String,
    /// The peer's node: the home of the region.
    #[arg(long)]
    pub peer: String,
    /// Where the region lives at its home.
    #[arg(long, default_value = "gpu0")]
    pub home_device: Location,
    /// Where this end's leases put the pages (a GPU of this node).
    #[arg(long, default_value = "gpu0")]
    pub device: Location,
    /// Bytes per lease.
    #[arg(long, value_delimiter = ',', default_values = ["2MiB", "64MiB", "1GiB"])]
    pub sizes: Vec<ByteSize>,
    /// Leases timed per size and route (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// The NCCL baseline script (its lines `nccl [one-gpu ]send/recv N B X GB/s`); `none` skips it.
    #[arg(long, default_value = "bench/scripts/nccl_baseline.py")]
    pub nccl_baseline: String,
    /// Folder for the JSON and Markdown reports.
    #[arg(long, default_value = "bench/results/lease-routes")]
    pub out: PathBuf,
    /// Base name of the report files.
    #[arg(long, default_value = "lease-routes")]
    pub name: String,
}

/// One size by one route.
struct Row {
    route: String,
    why: String,
    size: u64,
    gb_s: f64,
    p50_ms: f64,
}

/// Leases `size` bytes of `region` (at the peer) onto `device` `iters` times, each after a write at the home so
/// that the pages move every time; checks the first and last page that landed. Median GB/s and ms.
async fn leases(
    a: &Agent,
    region: &vfabric::Region,
    (size, device): (u64, Location),
    iters: usize,
) -> Result<(f64, f64), String> {
    let page = region.page_size;
    let expect = |off: u64, len: usize| vfabric::pattern::bytes(7, off, len);
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters + 1 {
        // The same bytes again: the range's version moves on, so the pages are sent again.
        a.write(region, 0, &expect(0, 16)).await.map_err(|e| e.to_string())?;
        let t = Instant::now();
        let l = a.acquire(region, 0..size, device, Mode::Read).await.map_err(|e| e.to_string())?;
        let secs = t.elapsed().as_secs_f64();
        let local = l.local().ok_or("a lease without its local pages")?;
        for p in [0, size / page - 1] {
            let ptr = match local.ptr() {
                vfabric::LeasePtr::Contiguous { ptr, .. } => ptr + p * page,
                vfabric::LeasePtr::Pages(v) => v[p as usize],
            };
            let mut got = vec![0u8; page as usize];
            a.fabric().read_device(device, ptr, &mut got).map_err(|e| e.to_string())?;
            if got != expect(p * page, page as usize) {
                return Err(format!("page {p} of a {} lease landed with other bytes", ByteSize(size)));
            }
        }
        a.release(l).await.map_err(|e| e.to_string())?;
        if i > 0 {
            times.push(secs); // the first one joins the channel and warms up
        }
    }
    times.sort_by(f64::total_cmp);
    let mid = times[times.len() / 2];
    Ok((size as f64 / mid / 1e9, mid * 1e3))
}

/// The peer's route and its reason, as this agent's status says.
async fn route_of(a: &Agent, peer: u16) -> (String, String) {
    let s = a.status().await;
    let r = s.peers.iter().find(|p| p.node == peer).and_then(|p| p.routes.iter().max_by_key(|r| r.bytes));
    r.map_or(("none".into(), String::new()), |r| (r.route.clone(), r.why.clone()))
}

/// NCCL send/recv between two processes, by size (GB/s), from the baseline script's lines.
fn nccl_baseline(script: &str, sizes: &[u64]) -> Result<Vec<(u64, f64)>, String> {
    let mut cmd = Command::new("python3");
    cmd.arg(script).args(sizes.iter().map(u64::to_string)).env("NCCL_NVLS_ENABLE", "0");
    let out = cmd.output().map_err(|e| format!("python3 {script}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let found: Vec<(u64, f64)> = text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let at = w.iter().position(|&x| x == "send/recv")?;
            Some((w.get(at + 1)?.parse().ok()?, w.get(at + 3)?.parse().ok()?))
        })
        .collect();
    if found.is_empty() {
        return Err(format!("{script} gave no figures: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(found)
}

/// Runs `vfabric-bench lease-routes`.
pub fn run(args: &LeaseRoutesArgs, command_line: &str) -> Result<(), String> {
    let base = ClusterConfig::from_file(&args.cluster).map_err(|e| e.to_string())?;
    let peer = base.node_index(&args.peer).map_err(|e| e.to_string())?;
    let sizes: Vec<u64> = args.sizes.iter().map(|s| s.bytes()).collect();
    let largest = sizes.iter().copied().max().unwrap_or(2 << 20);
    let rt = Agent::runtime(0).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let mut device = String::new();
    for nccl in [false, true] {
        let mut cfg = base.clone();
        cfg.network.nccl = nccl;
        rt.block_on(async {
            let a = Agent::start_from_config(&cfg, &args.node).await.map_err(|e| e.to_string())?;
            device = a.fabric().describe();
            let region = a.alloc(peer, largest, Some(args.home_device)).await.map_err(|e| e.to_string())?;
            let chunk = 64u64 << 20;
            for off in (0..largest).step_by(chunk as usize) {
                let n = chunk.min(largest - off) as usize;
                a.write(&region, off, &vfabric::pattern::bytes(7, off, n)).await.map_err(|e| e.to_string())?;
            }
            for &size in &sizes {
                eprintln!(
                    "lease-routes: {} leases by {}",
                    ByteSize(size),
                    if nccl { "NCCL if it joins" } else { "QUIC" }
                );
                let (gb_s, p50_ms) = leases(&a, &region, (size, args.device), args.iters).await?;
                let (route, why) = route_of(&a, peer).await;
                eprintln!("  {route}: {gb_s:.2} GB/s, {p50_ms:.2} ms ({why})");
                rows.push(Row { route, why, size, gb_s, p50_ms });
            }
            a.free(&region).await.map_err(|e| e.to_string())?;
            a.shutdown().await;
            Ok::<(), String>(())
        })?;
    }
    let baseline = match args.nccl_baseline.as_str() {
        "none" => Ok(Vec::new()),
        script => nccl_baseline(script, &sizes),
    };
    let base_of = |size: u64| baseline.as_ref().ok().and_then(|b| b.iter().find(|(s, _)| *s == size).map(|b| b.1));
    let mut md = format!(
        "# Leases of a peer's pages by route\n\n`{command_line}`\n\n{device}\n\nEach lease: `acquire(Read)` of the \
         range onto {} here from its home's {} (the pages sent anew each time: the home's version moved on), \
         median of {} after one to warm up; the first and last page checked where they landed. Baseline: NCCL \
         send/recv of the same bytes between two processes (`{}`){}.\n\n| route | bytes | GB/s | ms | x NCCL \
         send/recv | why |\n|---|---|---|---|---|---|\n",
        args.device,
        args.home_device,
        args.iters,
        args.nccl_baseline,
        match &baseline {
            Ok(_) => String::new(),
            Err(e) => format!(": not run ({e})"),
        }
    );
    for r in &rows {
        let ratio = base_of(r.size).map_or("-".to_string(), |b| format!("{:.2}", r.gb_s / b));
        md.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {} | {} |\n",
            r.route,
            ByteSize(r.size),
            r.gb_s,
            r.p50_ms,
            ratio,
            r.why
        ));
    }
    if let Ok(b) = &baseline {
        for (s, g) in b {
            md.push_str(&format!("| NCCL send/recv (baseline) | {} | {g:.2} | | 1.00 | |\n", ByteSize(*s)));
        }
    }
    let (date, _) = report::now_stamps();
    let json = json!({
        "benchmark": "lease-routes",
        "date": date,
        "command": command_line,
        "device": device,
        "rows": rows.iter().map(|r| json!({
            "route": r.route, "why": r.why, "bytes": r.size, "gb_s": r.gb_s, "p50_ms": r.p50_ms,
            "x_nccl": base_of(r.size).map(|b| r.gb_s / b),
        })).collect::<Vec<_>>(),
        "nccl_baseline": baseline.as_ref().map(|b| b.iter().map(|(s, g)| json!({"bytes": s, "gb_s": g})).collect::<Vec<_>>()).unwrap_or_default(),
        "nccl_baseline_error": baseline.as_ref().err(),
    });
    let (j, m) =
        report::write(&args.out, &args.name, &report::with_provenance(&json), &md).map_err(|e| e.to_string())?;
    println!("{md}");
    eprintln!("wrote {} and {}", j.display(), m.display());
    Ok(())
}
