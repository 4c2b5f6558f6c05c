//! `vfabric-bench sweep`: the grid that nixlbench and Mooncake's transfer-engine bench run, block size x batch x
//! requests in flight x read/write, between two locations. An initiator on this node moves blocks to (write) or
//! from (read) a target:
//!
//! - another location of this node (`gpu0/host`, `host/gpu0`, `gpu0/gpu1`): the fabric's mover, a batch being one
//!   submission of scattered pages (block = page size), beside one plain copy of the same bytes (`cuMemcpy*` on
//!   CUDA, `memcpy` on the emulated device);
//! - the host memory or a GPU of a peer node (`host/peer:host`, `host/peer:gpu0`): an agent started in this
//!   process on loopback, the home of a region there; a batch is that many block-sized reads or writes at
//!   scattered offsets posted at once, done when all are; beside iperf3 TCP on the same path.
//!
//! What moves is checked: between locations of a node, every page of each case's last round; to a peer, every
//! block a read case reads (against what the region holds), and 64 blocks of each write case read back after it
//! (write cases alternate between two fills, so a write that never landed shows). Each case reports GB/s, its
//! ratio to the baseline and the batches' latency.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use serde::Serialize;
use serde_json::json;
use vfabric::ByteSize;
use vfabric_transport::{open, DeviceKind, EngineChoice, Location, OpenOptions};

use crate::common::ConfigArgs;
use crate::report;
use crate::stats::percentile;
use crate::sweep_cases::{local_case, Case, Measured, Op, Pair, Target};
use crate::sweep_peer::peer_cases;

/// Options of `vfabric-bench sweep`.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// The configuration and device layer.
    #[command(flatten)]
    pub target: ConfigArgs,
    /// Initiator/target pairs: `gpu0/host`, `host/gpu0`, `gpu0/gpu1` (this node), `host/peer:host`,
    /// `host/peer:gpu0` (a peer node's memory). Default: gpu0/host, and host/peer:host.
    #[arg(long, value_delimiter = ',')]
    pub pairs: Vec<Pair>,
    /// Block sizes (powers of two, 4KiB..2MiB; between locations of this node, the page size of the move).
    #[arg(long, value_delimiter = ',', default_values = ["64KiB", "2MiB"])]
    pub blocks: Vec<ByteSize>,
    /// Blocks per batch (posted together; a batch is done when all its blocks are).
    #[arg(long, value_delimiter = ',', default_values = ["1", "16"])]
    pub batch: Vec<usize>,
    /// Batches in flight at once.
    #[arg(long, value_delimiter = ',', default_values = ["1", "4"])]
    pub in_flight: Vec<usize>,
    /// Operations: `read` (target to initiator), `write` (initiator to target).
    #[arg(long, value_delimiter = ',', default_values = ["read", "write"])]
    pub ops: Vec<Op>,
    /// Bytes moved per case (default: 1GiB on a GPU, 32MiB on the emulated device, 256MiB with `--cluster`).
    #[arg(long)]
    pub total: Option<ByteSize>,
    /// Seconds of the iperf3 baseline of the peer pairs (0 skips it).
    #[arg(long, default_value_t = 3)]
    pub iperf_seconds: u64,
    /// QUIC packet size (UDP payload bytes) between the agents of the peer pairs (default: the configuration's
    /// `network.mtu`; loopback carries up to 16383).
    #[arg(long)]
    pub mtu: Option<u16>,
    /// Bulk connections (lanes) between the agents of the peer pairs (default: the configuration's).
    #[arg(long)]
    pub lanes: Option<u16>,
    /// Results folder.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: sweep-TIME; with `--cluster`, sweep-cluster).
    #[arg(long)]
    pub name: Option<String>,
    /// Run as one rank of a job started by a launcher (`mpirun -np N vfabric-bench sweep --cluster CONFIG`):
    /// every rank's agent starts from the launcher's environment (`VFABRIC_RENDEZVOUS`, certificates from
    /// `vfabric cluster init --ranks N`), each measures the peer pairs against the next rank, all at once, and
    /// rank 0 writes the aggregate. `--out` must be a folder every rank sees.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
}

/// One case's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `initiator/target`.
    pub pair: String,
    /// `read` or `write`.
    pub op: Op,
    /// Bytes per block.
    pub block: u64,
    /// Blocks per batch.
    pub batch: usize,
    /// Batches in flight.
    pub in_flight: usize,
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds.
    pub seconds: f64,
    /// GB/s (10^9 bytes a second).
    pub gb_s: f64,
    /// Batch latency, median and 99th percentile, microseconds: to a peer, from a batch's posting to its last
    /// block; between locations of a node, from the round's submission (its batches go together) to the batch's
    /// completion, seen in submission order.
    pub batch_p50_us: f64,
    /// See `batch_p50_us`.
    pub batch_p99_us: f64,
    /// The baseline: its name and GB/s (`None`: it did not run).
    pub baseline: String,
    /// See `baseline`.
    pub baseline_gb_s: Option<f64>,
    /// `gb_s / baseline_gb_s`.
    pub ratio: Option<f64>,
    /// Blocks whose bytes arrived different (what is checked: the module's doc).
    pub bad: u64,
}

fn row(case: &Case, m: &Measured, baseline: &str, baseline_gb_s: Option<f64>) -> Row {
    let mut lat = m.batch_us.clone();
    let gb_s = m.bytes as f64 / m.seconds / 1e9;
    Row {
        pair: case.pair.to_string(),
        op: case.op,
        block: case.block,
        batch: case.batch,
        in_flight: case.in_flight,
        bytes: m.bytes,
        seconds: m.seconds,
        gb_s,
        batch_p50_us: percentile(&mut lat, 0.5),
        batch_p99_us: percentile(&mut lat, 0.99),
        baseline: baseline.to_string(),
        baseline_gb_s,
        ratio: baseline_gb_s.filter(|b| *b > 0.0).map(|b| gb_s / b),
        bad: m.bad,
    }
}

/// Every case of `pair`: blocks x batch x in flight x op.
fn grid(args: &SweepArgs, pair: Pair, blocks: &[u64], total: u64) -> Vec<Case> {
    let mut v = Vec::new();
    for &block in blocks {
        for &batch in &args.batch {
            for &in_flight in &args.in_flight {
                for &op in &args.ops {
                    v.push(Case { pair, op, block, batch, in_flight, total });
                }
            }
        }
    }
    v
}

/// The block sizes, checked, and the batch and in-flight counts checked.
fn checked_blocks(args: &SweepArgs) -> Result<Vec<u64>, String> {
    let blocks: Vec<u64> = args.blocks.iter().map(|b| b.bytes()).collect();
    if let Some(b) = blocks.iter().find(|b| !b.is_power_of_two() || !(4096..=2 << 20).contains(*b)) {
        return Err(format!("--blocks {}: a power of two from 4KiB to 2MiB", ByteSize(*b)));
    }
    if args.batch.contains(&0) || args.in_flight.contains(&0) {
        return Err("--batch and --in-flight: at least 1".into());
    }
    Ok(blocks)
}

/// Runs the sweep and writes its results.
pub fn run(args: &SweepArgs, command_line: &str) -> Result<(), String> {
    if let Some(path) = &args.cluster {
        return run_cluster(args, path, command_line);
    }
    let cfg = args.target.load()?;
    let blocks = checked_blocks(args)?;
    let opened = open(&OpenOptions {
        backend: cfg.device.backend,
        emulated_gpus: cfg.device.emulated_gpus,
        emulated_gpu_memory: cfg.device.emulated_gpu_memory.bytes().max(256 << 20),
        emulated_host_link: cfg.device.emulated_host_link.bytes(),
    })
    .map_err(|e| e.to_string())?;
    if let Some(why) = &opened.fallback_reason {
        eprintln!("no usable GPU ({why}): sweeping the emulated device (host memory); its figures are memcpy speeds");
    }
    let layer = opened.layer;
    let emulated = layer.kind() == DeviceKind::Emulated;
    let device = layer.describe();
    eprintln!("{device}");
    let total = args.total.map_or(if emulated { 32 << 20 } else { 1 << 30 }, |t| t.bytes());
    let pairs = match args.pairs.is_empty() {
        true => vec![
            Pair { initiator: Location::Gpu(0), target: Target::Here(Location::Host) },
            Pair { initiator: Location::Host, target: Target::Peer(Location::Host) },
        ],
        false => args.pairs.clone(),
    };
    let ngpu = layer.gpus().len() as u16;
    for p in &pairs {
        let here = [Some(p.initiator), if let Target::Here(t) = p.target { Some(t) } else { None }];
        if let Some(Location::Gpu(g)) = here.into_iter().flatten().find(|l| l.gpu().is_some_and(|g| g >= ngpu)) {
            return Err(format!("pair {p}: this node has no gpu{g} ({ngpu} GPU(s))"));
        }
    }
    let cases = |pair: Pair| grid(args, pair, &blocks, total);
    // Room for every case's round, and for the bytes a case moves (cycled through when they are more).
    let most = args.batch.iter().max().unwrap_or(&1) * args.in_flight.iter().max().unwrap_or(&1);
    let region = total.max(blocks.iter().max().unwrap_or(&(2 << 20)) * most as u64).next_multiple_of(2 << 20);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for pair in pairs.iter().filter(|p| matches!(p.target, Target::Here(_))) {
        let Target::Here(target) = pair.target else { continue };
        let mut rig = crate::rig::Rig::new(Arc::clone(&layer), &[pair.initiator, target], region, &blocks, &|_| {})?;
        let mover = rig.mover(cfg.mover)?;
        let name = rig.baseline_name(&[(pair.initiator, target)]);
        for case in cases(*pair) {
            eprintln!("{}", case.describe());
            let (m, plain) = local_case(&rig, &mover, &case, target, EngineChoice::Auto)?;
            rows.push(row(&case, &m, &format!("{name}, one copy of a round's bytes"), Some(plain)));
        }
        notes
            .push(format!("{pair}: the fabric's mover, a batch one submission of scattered pages (block = page size)"));
    }
    let peer: Vec<Pair> = pairs.iter().copied().filter(|p| matches!(p.target, Target::Peer(_))).collect();
    if !peer.is_empty() {
        let tcp = crate::remote::iperf3(args.iperf_seconds, None);
        let (tcp_name, tcp_gb_s) = match &tcp {
            Ok(v) => {
                let (streams, gbit) = v.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((1, 0.0));
                (format!("iperf3 TCP on loopback, {streams} stream(s)"), Some(gbit / 8.0))
            }
            Err(why) => {
                notes.push(format!("peer pairs' baseline: iperf3 did not run: {why}"));
                ("iperf3 (did not run)".to_string(), None)
            }
        };
        let all: Vec<Case> = peer.iter().flat_map(|p| cases(*p)).collect();
        let mut net = cfg.clone();
        net.network.mtu = args.mtu.unwrap_or(cfg.network.mtu);
        net.network.lanes = args.lanes.unwrap_or(cfg.network.lanes);
        net.check("--mtu and --lanes").map_err(|e| e.to_string())?;
        notes.push(format!(
            "the peer pairs' agents: {}-byte packets, {} bulk lane(s)",
            net.network.mtu, net.network.lanes
        ));
        for (case, m) in peer_cases(&net, &all, &blocks)? {
            rows.push(row(&case, &m, &tcp_name, tcp_gb_s));
        }
        notes.push(
            "host/peer:...: two agents in this process on 127.0.0.1 (QUIC, mutual TLS, checksummed chunks); a batch \
             is that many block-sized reads or writes at scattered offsets of a region homed at the peer"
                .into(),
        );
    }
    let (_, stamp) = report::now_stamps();
    let name = args.name.clone().unwrap_or_else(|| format!("sweep-{stamp}"));
    write(args, &name, command_line, &device, total, &notes, &rows, json!({}))
}

/// Writes the results (`extra`'s fields added to the JSON) and prints the table; an error if any block arrived
/// wrong.
#[allow(clippy::too_many_arguments)]
fn write(
    args: &SweepArgs,
    name: &str,
    command_line: &str,
    device: &str,
    total: u64,
    notes: &[String],
    rows: &[Row],
    extra: serde_json::Value,
) -> Result<(), String> {
    let bad: u64 = rows.iter().map(|r| r.bad).sum();
    let (date, _) = report::now_stamps();
    let mut md = String::new();
    let _ = writeln!(md, "# vfabric-bench sweep, {date}\n\n`{command_line}`\n\n{device}\n");
    for n in notes {
        let _ = writeln!(md, "- {n}");
    }
    let _ = writeln!(
        md,
        "- {} per case; checked: the last round of each move page by page, every block a peer read returned, 64 \
         blocks of each write to a peer read back\n",
        ByteSize(total)
    );
    let _ = writeln!(
        md,
        "| pair | op | block | batch | in flight | GB/s | baseline GB/s | ratio | batch p50 / p99 (us) | bad |"
    );
    let _ = writeln!(md, "|---|---|---|---:|---:|---:|---:|---:|---|---:|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {:?} | {} | {} | {} | {:.2} | {} | {} | {:.0} / {:.0} | {} |",
            r.pair,
            r.op,
            ByteSize(r.block),
            r.batch,
            r.in_flight,
            r.gb_s,
            r.baseline_gb_s.map_or("-".into(), |b| format!("{b:.2}")),
            r.ratio.map_or("-".into(), |x| format!("{x:.2}")),
            r.batch_p50_us,
            r.batch_p99_us,
            r.bad
        );
    }
    let mut doc = json!({ "scenario": "sweep", "date": date, "command": command_line, "device": device,
                          "total_bytes": total, "notes": notes, "rows": rows });
    if let (Some(d), serde_json::Value::Object(more)) = (doc.as_object_mut(), extra) {
        d.extend(more);
    }
    let (j, m) = report::write(&args.out, name, &doc, &md).map_err(|e| format!("writing results: {e}"))?;
    print!("{md}");
    eprintln!("results: {} and {}", j.display(), m.display());
    match bad {
        0 => Ok(()),
        n => Err(format!("{n} block(s) arrived with other bytes than were sent")),
    }
}

/// `--cluster`: this process is one rank of a job; rank 0 writes the aggregate.
fn run_cluster(args: &SweepArgs, path: &std::path::Path, command_line: &str) -> Result<(), String> {
    let mut cfg = vfabric::ClusterConfig::from_file(path).map_err(|e| e.to_string())?;
    if let Some(b) = args.target.device {
        cfg.device.backend = b;
    }
    let blocks = checked_blocks(args)?;
    let pairs = match args.pairs.is_empty() {
        true => vec![Pair { initiator: Location::Host, target: Target::Peer(Location::Host) }],
        false => args.pairs.clone(),
    };
    if let Some(p) = pairs.iter().find(|p| !matches!(p.target, Target::Peer(_))) {
        return Err(format!("pair {p}: with --cluster every pair reaches the next rank (host/peer:...)"));
    }
    let total = args.total.map_or(256 << 20, |t| t.bytes());
    let cases: Vec<Case> = pairs.iter().flat_map(|p| grid(args, *p, &blocks, total)).collect();
    let name = args.name.clone().unwrap_or_else(|| "sweep-cluster".into());
    // The ranks' meeting folder: one per job (its rendezvous address), so that two jobs never share one.
    let job: String = std::env::var("VFABRIC_RENDEZVOUS")
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let sync = args.out.join(format!("{name}.sync-{job}"));
    let Some((job, ranks)) = crate::sweep_cluster::run_rank(&cfg, &cases, &sync, args.iperf_seconds)? else {
        return Ok(()); // rank 0 reports
    };
    let mut notes = vec![format!(
        "{} ranks of {} under a launcher, each rank's agent started from its environment; every rank reads from \
         and writes to the next rank's memory (r -> r+1, the last to rank 0), all at once, case by case; a row is \
         the bytes of every rank over the slowest rank's time",
        job.size,
        path.display()
    )];
    let iperf: Result<Vec<f64>, String> = ranks.iter().map(|r| r.iperf_gb_s.clone()).collect();
    let (baseline, baseline_gb_s) = match &iperf {
        Ok(v) => ("iperf3 TCP, every rank to the next at once, 4 streams each".to_string(), Some(v.iter().sum())),
        Err(why) => {
            notes.push(format!("baseline: iperf3 did not run: {why}"));
            ("iperf3 (did not run)".to_string(), None)
        }
    };
    let mut rows = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let mut all = Measured::default();
        for r in &ranks {
            let m = r
                .cases
                .get(i)
                .ok_or_else(|| format!("rank {} sent {} cases of {}", r.rank, r.cases.len(), cases.len()))?;
            all.bytes += m.bytes;
            all.seconds = all.seconds.max(m.seconds);
            all.bad += m.bad;
            all.batch_us.extend(&m.batch_us);
        }
        rows.push(row(case, &all, &baseline, baseline_gb_s));
    }
    let per_rank: Vec<serde_json::Value> = ranks
        .iter()
        .map(|r| {
            json!({ "rank": r.rank, "iperf_gb_s": r.iperf_gb_s.as_ref().ok(),
                    "gb_s": r.cases.iter().map(|m| m.bytes as f64 / m.seconds / 1e9).collect::<Vec<_>>() })
        })
        .collect();
    let device = format!("{} ranks ({:?} device layer, per the configuration)", job.size, cfg.device.backend);
    let extra = json!({ "cluster": { "config": path.display().to_string(), "ranks": job.size, "per_rank": per_rank } });
    write(args, &name, command_line, &device, total, &notes, &rows, extra)
}
