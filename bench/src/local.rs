//! `vfabric-bench local`: a node's agent and local clients in processes of their own, beside the same work in
//! the agent's process.
//!
//! - Latency: acquire and release of a resident page by a client in another process (its pages mapped at
//!   attach, a lease a few numbers on the Unix socket), beside the same calls on the fabric in this process and
//!   beside the socket's own round trip (a ping through the agent's thread: the floor under any call).
//! - Throughput between two processes of one GPU: one process writes a region on the GPU through its mapping;
//!   another acquires it there and copies its pages device to device into a buffer of its own, then releases
//!   (acquire + copy + release, wall clock), beside the same process's plain device copy of the same bytes
//!   between two buffers of its own (submit + wait, wall clock), by the same mover.
//!
//! The clients are this binary run again (`local --client ...`): they print one JSON line each.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clap::Args;
use serde_json::json;
use vfabric::agent::Agent;
use vfabric::config::NodeSection;
use vfabric::proto::message::WireRegion;
use vfabric::units::ByteSize;
use vfabric::{AttachedClient, DeviceKind, EngineChoice, Location, Mode, Region};
use vfabric_transport::quic::ClusterCa;
use vfabric_transport::PageBatch;

use crate::common::ConfigArgs;
use crate::report;
use crate::stats::{cdf, percentile};

/// `vfabric-bench local`.
#[derive(Args, Debug, Clone)]
pub struct LocalArgs {
    /// The configuration and device layer.
    #[command(flatten)]
    pub target: ConfigArgs,
    /// Acquire/release pairs timed per process.
    #[arg(long, default_value_t = 20000)]
    pub samples: usize,
    /// Region sizes handed between the two processes (default: 64MiB,256MiB,1GiB on GPUs, 16MiB,64MiB on the
    /// emulated device).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<ByteSize>,
    /// The agent's host tier (every client maps it, and on CUDA registers it, at attach: the attach time grows
    /// with it).
    #[arg(long, default_value = "2GiB")]
    pub host_arena: ByteSize,
    /// Rounds timed per size (the median is reported).
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// Results folder.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: local-DEVICE-TIME).
    #[arg(long)]
    pub name: Option<String>,
    /// Internal: run as a client process of the agent at this socket.
    #[arg(long, hide = true)]
    pub client: Option<PathBuf>,
    /// Internal: the client's part (`latency`, `write`, `copy`) and its region.
    #[arg(long, hide = true)]
    pub part: Option<String>,
    /// Internal: the region, as five numbers.
    #[arg(long, hide = true)]
    pub region: Option<String>,
}

fn region_arg(r: &Region) -> String {
    let w = WireRegion::from(r);
    format!("{},{},{},{},{}", w.addr, w.len, w.page_size, w.slot, w.generation)
}

fn parse_region(s: &str) -> Result<Region, String> {
    let v: Vec<u64> = s.split(',').map(str::parse).collect::<Result<_, _>>().map_err(|e| format!("--region: {e}"))?;
    match v[..] {
        [addr, len, page_size, slot, generation] => {
            Ok(Region::from(&WireRegion { addr, len, page_size, slot: slot as u32, generation }))
        }
        _ => Err("--region takes five numbers".into()),
    }
}

/// p50, p99 and the distribution's curve (`stats::cdf`) of `samples` (seconds), in microseconds.
fn us(samples: &mut [f64]) -> serde_json::Value {
    let curve: Vec<f64> = cdf(samples).iter().map(|s| s * 1e6).collect();
    json!({ "p50": percentile(samples, 0.5) * 1e6, "p99": percentile(samples, 0.99) * 1e6, "samples": samples.len(),
            "cdf": curve })
}

/// Times `samples` acquire/release pairs through `one`, which returns how long its acquire and its release took.
fn pairs(samples: usize, mut one: impl FnMut() -> Result<(f64, f64), String>) -> Result<serde_json::Value, String> {
    let (mut acq, mut rel, mut both) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..samples + samples / 10 {
        let (a, r) = one()?;
        // The first tenth warms caches and the socket's path, and is not counted.
        if i >= samples / 10 {
            acq.push(a);
            rel.push(r);
            both.push(a + r);
        }
    }
    Ok(json!({ "acquire_us": us(&mut acq), "release_us": us(&mut rel), "pair_us": us(&mut both) }))
}

/// A client process's part; prints its JSON line.
fn client(socket: &Path, part: &str, region: &Region, args: &LocalArgs) -> Result<(), String> {
    let t = Instant::now();
    let c = AttachedClient::attach(socket).map_err(|e| format!("attach: {e}"))?;
    let attach_ms = t.elapsed().as_secs_f64() * 1e3;
    let gpu = Location::Gpu(0);
    let out = match part {
        "latency" => {
            let mut ping = Vec::with_capacity(args.samples);
            for _ in 0..args.samples {
                ping.push(c.ping().map_err(|e| e.to_string())?.as_secs_f64());
            }
            let mut v = pairs(args.samples, || {
                let t = Instant::now();
                let l = c.acquire(region, 0..region.page_size, gpu, Mode::Read).map_err(|e| e.to_string())?;
                let a = t.elapsed().as_secs_f64();
                let t = Instant::now();
                c.release(l).map_err(|e| e.to_string())?;
                Ok((a, t.elapsed().as_secs_f64()))
            })?;
            v["ping_us"] = us(&mut ping);
            v["attach_ms"] = json!(attach_ms);
            v
        }
        "write" => {
            let l = c.acquire(region, 0..region.len, gpu, Mode::Write).map_err(|e| e.to_string())?;
            let data = vfabric::pattern::bytes(region.len, 0, region.len as usize);
            l.write(0, &data).map_err(|e| e.to_string())?;
            c.synchronize(gpu).map_err(|e| e.to_string())?;
            c.release(l).map_err(|e| e.to_string())?;
            json!({ "written": region.len })
        }
        "copy" => copy_rounds(&c, region, args.rounds)?,
        other => return Err(format!("--part {other}?")),
    };
    println!("{out}");
    Ok(())
}

/// The reading process: acquire + copy out + release, beside a plain copy between two buffers of its own; then
/// the copied bytes are checked.
fn copy_rounds(c: &AttachedClient, region: &Region, rounds: usize) -> Result<serde_json::Value, String> {
    let gpu = Location::Gpu(0);
    let e = |e: vfabric::FabricError| e.to_string();
    let dst = c.scratch_arena(gpu, region.len).map_err(e)?;
    let src = c.scratch_arena(gpu, region.len).map_err(e)?;
    let mover = c.mover();
    let batch = PageBatch::contiguous(region.page_size, 0, 0, (region.len / region.page_size) as u32);
    let (mut fabric, mut plain, mut copy_only) = (Vec::new(), Vec::new(), Vec::new());
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    let mut how = String::new();
    for _ in 0..rounds + 1 {
        let t = Instant::now();
        let l = c.acquire(region, 0..region.len, gpu, Mode::Read).map_err(e)?;
        acquire.push(t.elapsed().as_secs_f64());
        let c0 = Instant::now();
        let report = l.copy_to(&dst, EngineChoice::Auto).map_err(e)?;
        copy_only.push(c0.elapsed().as_secs_f64());
        let r0 = Instant::now();
        c.release(l).map_err(e)?;
        release.push(r0.elapsed().as_secs_f64());
        fabric.push(t.elapsed().as_secs_f64());
        how = format!("{:?}, {} run(s) of {} pages", report.engine, report.runs, report.pages);
        let t = Instant::now();
        mover.submit(&src, &dst, &batch, EngineChoice::Auto).and_then(|x| x.wait()).map_err(|e| e.to_string())?;
        plain.push(t.elapsed().as_secs_f64());
    }
    // The first round maps and warms; the median of the rest is the figure.
    let (f, p) = (percentile(&mut fabric[1..], 0.5), percentile(&mut plain[1..], 0.5));
    let copy = percentile(&mut copy_only[1..], 0.5);
    // The last copy was the plain one (zeros over the region's bytes): copy the region once more and check it.
    let l = c.acquire(region, 0..region.len, gpu, Mode::Read).map_err(e)?;
    l.copy_to(&dst, EngineChoice::Auto).map_err(e)?;
    c.release(l).map_err(e)?;
    let mut back = vec![0u8; region.len as usize];
    dst.read(0, &mut back).map_err(|e| e.to_string())?;
    let bad = vfabric::pattern::first_mismatch(region.len, 0, &back);
    Ok(json!({
        "bytes": region.len, "fabric_s": f, "plain_s": p,
        "fabric_gb_s": region.len as f64 / f / 1e9, "plain_gb_s": region.len as f64 / p / 1e9,
        "ratio": p / f, "first_bad_byte": bad, "copy_only_s": copy, "copy": how,
        "acquire_us": percentile(&mut acquire[1..], 0.5) * 1e6, "release_us": percentile(&mut release[1..], 0.5) * 1e6,
    }))
}

/// The same hand-over in the agent's process: acquire + copy out (by the node's mover) + release, median.
fn in_process_copy(fabric: &vfabric::Fabric, region: &Region, rounds: usize) -> Result<f64, String> {
    let e = |e: vfabric::FabricError| e.to_string();
    let gpu = Location::Gpu(0);
    let dst = fabric.scratch_arena(gpu, region.len).map_err(e)?;
    let mut times = Vec::new();
    for _ in 0..rounds + 1 {
        let t = Instant::now();
        let l = fabric.acquire(region, 0..region.len, gpu, Mode::Read).map_err(e)?;
        l.pages().copy_to(&dst, EngineChoice::Auto).map_err(e)?;
        fabric.release(l).map_err(e)?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(percentile(&mut times[1..], 0.5))
}

/// Runs part `part` of this benchmark in a process of its own and returns its JSON line.
fn run_client(socket: &Path, part: &str, region: &Region, args: &LocalArgs) -> Result<serde_json::Value, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(["local", "--client"]).arg(socket).args(["--part", part, "--region", &region_arg(region)]);
    cmd.args(["--samples", &args.samples.to_string(), "--rounds", &args.rounds.to_string()]);
    let out = cmd.output().map_err(|e| format!("starting the {part} client: {e}"))?;
    if !out.status.success() {
        return Err(format!("the {part} client failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().ok_or(format!("the {part} client printed nothing"))?;
    serde_json::from_str(line).map_err(|e| format!("the {part} client's line `{line}`: {e}"))
}

/// `vfabric-bench local`.
pub fn run(args: &LocalArgs, command_line: &str) -> Result<(), String> {
    if let Some(socket) = &args.client {
        let region = parse_region(args.region.as_deref().ok_or("--client needs --region")?)?;
        return client(socket, args.part.as_deref().unwrap_or(""), &region, args);
    }
    let mut cfg = args.target.load()?;
    cfg.nodes = vec![NodeSection { name: "bench".into(), gpus: Some(vec![0]), address: None, tenant: None }];
    cfg.memory.host_arena = args.host_arena;
    // Multi-threaded, so the agent serves the clients while this thread measures (a current-thread runtime runs
    // only inside `block_on`).
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build();
    let rt = rt.map_err(|e| e.to_string())?;
    let identity =
        ClusterCa::generate(&cfg.cluster.name).and_then(|ca| ca.issue("bench")).map_err(|e| e.to_string())?;
    let socket = std::env::temp_dir().join(format!("vfabric-bench-local-{}.sock", std::process::id()));
    let agent = rt.block_on(async {
        let agent = Agent::start(&cfg, "bench", &identity, "127.0.0.1:0".parse().ok()).await?;
        agent.serve_local(&socket).await?;
        Ok::<_, vfabric::FabricError>(agent)
    });
    let agent = agent.map_err(|e| e.to_string())?;
    let result = {
        // The metrics endpoint the measurement starts reads the agent on its runtime.
        let _runtime = rt.enter();
        measure(args, &agent, &socket, command_line)
    };
    rt.block_on(agent.shutdown());
    let _ = std::fs::remove_file(&socket);
    result
}

fn measure(args: &LocalArgs, agent: &Agent, socket: &Path, command_line: &str) -> Result<(), String> {
    let fabric = agent.fabric();
    let emulated = fabric.device_kind() == DeviceKind::Emulated;
    if let Some(why) = fabric.fallback_reason() {
        eprintln!(
            "no usable GPU ({why}): benchmarking the emulated device (host memory); its figures are memcpy speeds"
        );
    }
    let device = fabric.describe();
    eprintln!("{device}");
    let e = |e: vfabric::FabricError| e.to_string();
    let gpu = Location::Gpu(0);
    let ps = fabric.page_size();
    // Latency: one resident page, in this process and from another.
    let one = fabric.alloc(ps, vfabric::Placement::on(gpu)).map_err(e)?;
    fabric.write(&one, 0, &vec![1u8; ps as usize]).map_err(e)?;
    let in_process = pairs(args.samples, || {
        let t = Instant::now();
        let l = fabric.acquire(&one, 0..ps, gpu, Mode::Read).map_err(e)?;
        let a = t.elapsed().as_secs_f64();
        let t = Instant::now();
        fabric.release(l).map_err(e)?;
        Ok((a, t.elapsed().as_secs_f64()))
    })?;
    eprintln!("in-process acquire/release: {in_process}");
    let mut local = run_client(socket, "latency", &one, args)?;
    eprintln!("local client acquire/release: {local}");
    // The same with the agent's metrics served, which times every call it serves: what `[metrics]` costs.
    let served = agent.serve_metrics(([127, 0, 0, 1], 0).into()).map_err(e)?;
    let timed = run_client(socket, "latency", &one, args)?;
    drop(served);
    eprintln!("local client acquire/release, metrics served: {timed}");
    local["with_metrics"] = timed;
    // Throughput between two processes of GPU 0.
    let sizes: Vec<u64> = match args.sizes.is_empty() {
        true if emulated => vec![16 << 20, 64 << 20],
        true => vec![64 << 20, 256 << 20, 1 << 30],
        false => args.sizes.iter().map(|s| s.bytes()).collect(),
    };
    let mut rows = Vec::new();
    for &bytes in &sizes {
        let bytes = bytes.div_ceil(ps) * ps;
        let r = fabric.alloc(bytes, vfabric::Placement::on(gpu)).map_err(e)?;
        run_client(socket, "write", &r, args)?;
        let mut row = run_client(socket, "copy", &r, args)?;
        row["in_process_s"] = json!(in_process_copy(fabric, &r, args.rounds)?);
        eprintln!("{} between two processes: {row}", ByteSize(bytes));
        if !row["first_bad_byte"].is_null() {
            return Err(format!(
                "{}: the copied bytes differ from the written ones at {}",
                ByteSize(bytes),
                row["first_bad_byte"]
            ));
        }
        rows.push(row);
        fabric.free(&r).map_err(e)?;
    }
    fabric.free(&one).map_err(e)?;
    report_results(args, command_line, &device, emulated, &in_process, &local, &rows)
}

fn report_results(
    args: &LocalArgs,
    command_line: &str,
    device: &str,
    emulated: bool,
    in_process: &serde_json::Value,
    local: &serde_json::Value,
    rows: &[serde_json::Value],
) -> Result<(), String> {
    let (date, stamp) = report::now_stamps();
    let mut md = format!("# vfabric-bench local ({date})\n\n{device}\n\n`{command_line}`\n\n");
    let _ = writeln!(md, "## Acquire and release of a resident page ({} samples, host clock)\n", args.samples);
    let _ = writeln!(md, "| caller | acquire p50 / p99 (us) | release p50 / p99 (us) | pair p50 / p99 (us) |");
    let _ = writeln!(md, "|---|---|---|---|");
    for (who, v) in [("in the agent's process (embedded fabric)", in_process), ("local client, another process", local)]
    {
        let f = |k: &str| {
            format!("{:.2} / {:.2}", v[k]["p50"].as_f64().unwrap_or(0.0), v[k]["p99"].as_f64().unwrap_or(0.0))
        };
        let _ = writeln!(md, "| {who} | {} | {} | {} |", f("acquire_us"), f("release_us"), f("pair_us"));
    }
    let ping = &local["ping_us"];
    let _ = writeln!(
        md,
        "\nThe socket's own round trip through the agent's thread (a ping, nothing done there): p50 {:.2} us, p99 {:.2} us.",
        ping["p50"].as_f64().unwrap_or(0.0),
        ping["p99"].as_f64().unwrap_or(0.0)
    );
    let with = &local["with_metrics"];
    let p50 = |v: &serde_json::Value, k: &str| v[k]["p50"].as_f64().unwrap_or(0.0);
    let _ = writeln!(
        md,
        "With the agent's metrics served (each call it serves timed into a histogram), the same client: acquire \
         p50 {:.2} us ({:.3}x without), release p50 {:.2} us ({:.3}x).",
        p50(with, "acquire_us"),
        p50(with, "acquire_us") / p50(local, "acquire_us").max(1e-9),
        p50(with, "release_us"),
        p50(with, "release_us") / p50(local, "release_us").max(1e-9),
    );
    let _ = writeln!(
        md,
        "Attaching (the agent's arenas mapped into the client; host tier {}): {:.1} ms.",
        args.host_arena,
        local["attach_ms"].as_f64().unwrap_or(0.0)
    );
    let _ = writeln!(md, "\n## Pages between two processes of GPU 0 (median of {} rounds, wall clock)\n", args.rounds);
    let _ = writeln!(
        md,
        "| bytes | acquire + copy + release | acquire / copy / release (us) | plain copy, same bytes | ratio | the same in the agent's process | the lease's copy |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {:.1} GB/s | {:.1} / {:.1} / {:.1} | {:.1} GB/s | {:.3} | {:.1} GB/s | {} |",
            ByteSize(r["bytes"].as_u64().unwrap_or(0)),
            r["fabric_gb_s"].as_f64().unwrap_or(0.0),
            r["acquire_us"].as_f64().unwrap_or(0.0),
            r["copy_only_s"].as_f64().unwrap_or(0.0) * 1e6,
            r["release_us"].as_f64().unwrap_or(0.0),
            r["plain_gb_s"].as_f64().unwrap_or(0.0),
            r["ratio"].as_f64().unwrap_or(0.0),
            r["bytes"].as_f64().unwrap_or(0.0) / r["in_process_s"].as_f64().unwrap_or(f64::INFINITY) / 1e9,
            r["copy"].as_str().unwrap_or("")
        );
    }
    let name =
        args.name.clone().unwrap_or_else(|| format!("local-{}-{stamp}", if emulated { "emulated" } else { "cuda" }));
    let doc = json!({
        "benchmark": "local", "date": date, "device": device, "command": command_line,
        "in_process": in_process, "local_client": local, "two_processes": rows,
    });
    let (j, m) = report::write(&args.out, &name, &doc, &md).map_err(|e| format!("writing results: {e}"))?;
    println!("{md}");
    eprintln!("results: {} and {}", j.display(), m.display());
    Ok(())
}
