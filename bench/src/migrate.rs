//! `vfabric-bench migrate`: pages moved between GPUs and host memory, per engine, beside one plain copy of the
//! same bytes from this binary (and PyTorch's and NCCL's figures when the device run measured them).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::json;
use vfabric::ByteSize;
use vfabric_transport::{open, DeviceKind, EngineChoice, KernelSide, Location, MoverConfig, OpenOptions};

use crate::baselines::External;
use crate::common::ConfigArgs;
use crate::report;
use crate::rig::{Direction, Layout, Rig};
use crate::stats::Summary;

/// Options of `vfabric-bench migrate`.
#[derive(Args, Debug, Clone)]
pub struct MigrateArgs {
    /// The configuration and device layer.
    #[command(flatten)]
    pub target: ConfigArgs,
    /// Bytes per direction in the main cases (default: 1GiB on GPUs, 64MiB on the emulated device).
    #[arg(long)]
    pub size: Option<ByteSize>,
    /// Page sizes.
    #[arg(long, value_delimiter = ',', default_values = ["2MiB", "64KiB"])]
    pub pages: Vec<ByteSize>,
    /// Layouts: contiguous, scattered.
    #[arg(long, value_delimiter = ',', default_values = ["contiguous", "scattered"])]
    pub layouts: Vec<Layout>,
    /// Engines: copy, kernel, auto (the mover's own choice).
    #[arg(long, value_delimiter = ',', default_values = ["copy", "kernel", "auto"])]
    pub engines: Vec<EngineChoice>,
    /// Directions, e.g. gpu0>gpu1,gpu1>gpu0,gpu0<>gpu1,gpu0>host,host>gpu0 (default: all of these that exist).
    #[arg(long, value_delimiter = ',')]
    pub directions: Vec<Direction>,
    /// Timed runs per case (the median is reported).
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Untimed runs before them (the first one is verified byte for byte).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Also sweep sizes from 64KiB up to --size.
    #[arg(long)]
    pub sweep: bool,
    /// Also sweep the kernel's SM budget (blocks), pull and push.
    #[arg(long)]
    pub sm_sweep: bool,
    /// Leave out the main cases (run only the sweeps asked for).
    #[arg(long)]
    pub skip_main: bool,
    /// Results folder (JSON and Markdown).
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: migrate-DEVICE-TIME).
    #[arg(long)]
    pub name: Option<String>,
    /// probe.json from torch_ceilings.py of the same device run.
    #[arg(long)]
    pub torch_json: Option<PathBuf>,
    /// Output of nccl_baseline.py of the same device run.
    #[arg(long)]
    pub nccl_log: Option<PathBuf>,
}

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What table the row belongs to: main, sm-sweep, size-sweep.
    pub suite: &'static str,
    /// e.g. gpu0->gpu1.
    pub direction: String,
    /// Bytes per page.
    pub page: u64,
    /// contiguous or scattered.
    pub layout: Layout,
    /// The engine asked for.
    pub engine: String,
    /// The engine the mover used.
    pub engine_used: String,
    /// Kernel blocks (SMs) the move took (0 for the copy engine).
    pub blocks: u32,
    /// Kernel side asked for.
    pub side: String,
    /// Bytes per direction.
    pub bytes: u64,
    /// Contiguous runs per direction.
    pub runs: usize,
    /// Device time, seconds.
    pub time: Summary,
    /// Bytes moved (all directions) over the median device time, GB/s.
    pub gb_s: f64,
    /// Host wall time median, seconds.
    pub wall_median: f64,
    /// The plain-copy baseline, GB/s.
    pub baseline_gb_s: f64,
    /// Which call the baseline made.
    pub baseline: &'static str,
    /// gb_s / baseline_gb_s.
    pub ratio: f64,
    /// PyTorch's copy of the same bytes (same run), GB/s.
    pub torch_gb_s: Option<f64>,
    /// NCCL send/recv of the same bytes (same run), GB/s.
    pub nccl_gb_s: Option<f64>,
    /// Pages whose bytes differed after the first run.
    pub bad_pages: usize,
}

struct Case {
    suite: &'static str,
    dir: Direction,
    page: u64,
    layout: Layout,
    engine: EngineChoice,
    mover: MoverConfig,
    bytes: u64,
}

fn side_name(s: KernelSide) -> &'static str {
    match s {
        KernelSide::Auto => "auto",
        KernelSide::Pull => "pull",
        KernelSide::Push => "push",
    }
}

/// Runs the benchmark and writes its results; returns the rows.
pub fn run(args: &MigrateArgs, command_line: &str) -> Result<Vec<Row>, String> {
    let cfg = args.target.load()?;
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let opened = open(&OpenOptions {
        backend: cfg.device.backend,
        emulated_gpus: cfg.device.emulated_gpus,
        // Room for the rig's arenas whatever --size says.
        emulated_gpu_memory: cfg.device.emulated_gpu_memory.bytes().max(4 * args.size.map_or(64 << 20, |s| s.bytes())),
        emulated_host_link: cfg.device.emulated_host_link.bytes(),
    })
    .map_err(|e| e.to_string())?;
    let layer = opened.layer;
    if let Some(why) = &opened.fallback_reason {
        eprintln!(
            "no usable GPU ({why}): benchmarking the emulated device (host memory); its figures are memcpy speeds"
        );
    }
    let emulated = layer.kind() == DeviceKind::Emulated;
    eprintln!("{}", layer.describe());
    let size = args.size.map_or(if emulated { 64 << 20 } else { 1 << 30 }, |s| s.bytes());
    let pages: Vec<u64> = args.pages.iter().map(|p| p.bytes()).collect();
    for &p in &pages {
        if p == 0 || size % p != 0 || !p.is_power_of_two() {
            return Err(format!("page size {} must be a power of two dividing --size {}", ByteSize(p), ByteSize(size)));
        }
    }
    let ngpu = layer.gpus().len() as u16;
    let (g0, g1) = (Location::Gpu(0), Location::Gpu(1));
    let directions: Vec<Direction> = if args.directions.is_empty() {
        let mut d = Vec::new();
        if ngpu >= 2 {
            d.extend([Direction::One(g0, g1), Direction::One(g1, g0), Direction::Both(g0, g1)]);
        }
        d.extend([Direction::One(g0, Location::Host), Direction::One(Location::Host, g0)]);
        if ngpu < 2 {
            d.push(Direction::Both(g0, Location::Host));
        }
        d
    } else {
        args.directions.clone()
    };
    for d in &directions {
        for l in d.locations() {
            if let Location::Gpu(g) = l {
                if g >= ngpu {
                    return Err(format!("direction {d}: this node has {ngpu} GPU(s)"));
                }
            }
        }
    }
    let mut locations: Vec<Location> = directions.iter().flat_map(|d| d.locations()).collect();
    locations.sort_unstable();
    locations.dedup();

    // The cases.
    let base = cfg.mover;
    let mut cases = Vec::new();
    for &dir in directions.iter().filter(|_| !args.skip_main) {
        for &page in &pages {
            for &layout in &args.layouts {
                for &engine in &args.engines {
                    cases.push(Case { suite: "main", dir, page, layout, engine, mover: base, bytes: size });
                }
            }
        }
    }
    if args.sm_sweep {
        let sms = layer.gpus().iter().map(|g| g.multiprocessors).max().unwrap_or(132).max(1);
        let mut blocks: Vec<u32> = vec![2, 4, 8, 12, 16, 24, 32, 64, sms];
        blocks.retain(|&b| b <= sms.max(64));
        blocks.dedup();
        let mut sweep_dirs = Vec::new();
        if ngpu >= 2 {
            sweep_dirs.extend([Direction::One(g0, g1), Direction::Both(g0, g1)]);
        }
        sweep_dirs.extend([Direction::One(g0, Location::Host), Direction::One(Location::Host, g0)]);
        for dir in sweep_dirs {
            let gpu_to_gpu = dir.locations().iter().all(|l| l.gpu().is_some());
            let sides: &[KernelSide] =
                if gpu_to_gpu { &[KernelSide::Pull, KernelSide::Push] } else { &[KernelSide::Auto] };
            for &page in &pages {
                for &side in sides {
                    for &b in &blocks {
                        let mover = MoverConfig { sm_blocks: b, host_sm_blocks: b, kernel_side: side, ..base };
                        cases.push(Case {
                            suite: "sm-sweep",
                            dir,
                            page,
                            layout: Layout::Scattered,
                            engine: EngineChoice::SmKernel,
                            mover,
                            bytes: size,
                        });
                    }
                }
            }
        }
    }
    if args.sweep {
        let mut sizes = Vec::new();
        let mut s = 64u64 << 10;
        while s <= size {
            sizes.push(s);
            s *= 4;
        }
        if sizes.last() != Some(&size) {
            sizes.push(size);
        }
        let mut sweep_dirs = Vec::new();
        if ngpu >= 2 {
            sweep_dirs.push(Direction::One(g0, g1));
        }
        // Within one GPU (the arena's lower half to its upper half): the fastest link, where a launch's fixed
        // costs weigh most.
        sweep_dirs.extend([
            Direction::One(g0, Location::Host),
            Direction::One(Location::Host, g0),
            Direction::One(g0, g0),
        ]);
        // The kernel's short batches again with their index lists copied to the device before the launch, as
        // before they could be launch parameters: what the parameters save, in the same run.
        let uploaded = MoverConfig { short_launch_pages: 0, ..base };
        for dir in sweep_dirs {
            for &bytes in &sizes {
                for &page in pages.iter().filter(|&&p| p <= bytes) {
                    for layout in [Layout::Contiguous, Layout::Scattered] {
                        let case =
                            |suite, mover| Case { suite, dir, page, layout, engine: EngineChoice::Auto, mover, bytes };
                        cases.push(case("size-sweep", base));
                        let short = bytes / page <= u64::from(base.short_launch_pages);
                        if layout == Layout::Scattered && short && !emulated {
                            cases.push(case("size-sweep-uploaded", uploaded));
                        }
                    }
                }
            }
        }
    }

    // Set up: arenas, data, page hashes.
    let bar = ProgressBar::new(2 * size * locations.len() as u64 / 2);
    bar.set_style(
        ProgressStyle::with_template("{msg:<40} [{bar:30}] {pos}/{len} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(format!("writing {} of test data", ByteSize(size * locations.len() as u64)));
    let mut rig = Rig::new(Arc::clone(&layer), &locations, size, &pages, &|n| bar.inc(n))?;
    bar.finish_and_clear();
    let external = External::load(args.torch_json.as_deref(), args.nccl_log.as_deref());

    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:<60} [{bar:30}] {pos}/{len} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut rows = Vec::new();
    let mut baselines: std::collections::HashMap<(Direction, u64), f64> = std::collections::HashMap::new();
    for c in &cases {
        bar.set_message(format!("{} {} {} {} {}", c.dir, ByteSize(c.bytes), ByteSize(c.page), c.layout, c.engine));
        let legs = c.dir.legs();
        let batches: Vec<_> = legs.iter().map(|&(f, t)| (f, t, rig.batch(f, t, c.bytes, c.page, c.layout))).collect();
        let mover = rig.mover(c.mover)?;
        rig.poison(&legs)?;
        let first = rig.run(&mover, &batches, c.engine)?;
        let mut bad = 0;
        for (f, t, b) in &batches {
            bad += rig.verify(*f, *t, b)?;
        }
        for _ in 1..args.warmup {
            rig.run(&mover, &batches, c.engine)?;
        }
        let mut dev = Vec::new();
        let mut wall = Vec::new();
        for _ in 0..args.iters {
            let t = rig.run(&mover, &batches, c.engine)?;
            dev.push(t.device);
            wall.push(t.wall);
        }
        let time = Summary::of(&dev).ok_or("no samples")?;
        let wall_median = Summary::of(&wall).map_or(0.0, |s| s.median);
        let total = c.bytes * legs.len() as u64;
        let base_gb = match baselines.get(&(c.dir, c.bytes)) {
            Some(&g) => g,
            None => {
                let mut v = Vec::new();
                for i in 0..args.warmup + args.iters {
                    let s = rig.baseline(&legs, c.bytes)?;
                    if i >= args.warmup {
                        v.push(s);
                    }
                }
                let g = Summary::of(&v).map_or(0.0, |s| s.gb_per_s(total));
                baselines.insert((c.dir, c.bytes), g);
                g
            }
        };
        let gb_s = time.gb_per_s(total);
        let (torch, nccl) = match c.dir {
            Direction::One(f, t) => (
                external.torch(f, t, c.bytes),
                if f.gpu().is_some() && t.gpu().is_some() { external.nccl(c.bytes) } else { None },
            ),
            Direction::Both(..) => (None, None),
        };
        rows.push(Row {
            suite: c.suite,
            direction: c.dir.to_string(),
            page: c.page,
            layout: c.layout,
            engine: c.engine.to_string(),
            engine_used: first.reports.first().map_or("-".into(), |r| r.engine.to_string()),
            blocks: first.reports.first().map_or(0, |r| r.blocks),
            side: side_name(c.mover.kernel_side).into(),
            bytes: c.bytes,
            runs: first.reports.first().map_or(0, |r| r.runs),
            time,
            gb_s,
            wall_median,
            baseline_gb_s: base_gb,
            baseline: rig.baseline_name(&legs),
            ratio: if base_gb > 0.0 { gb_s / base_gb } else { 0.0 },
            torch_gb_s: torch,
            nccl_gb_s: nccl,
            bad_pages: bad,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();

    let (date, stamp) = report::now_stamps();
    let device = layer.describe();
    let markdown = markdown(&rows, &date, &device, command_line, emulated, args, size, &external);
    let name = args.name.clone().unwrap_or_else(|| format!("migrate-{}-{stamp}", layer.kind()));
    let json = json!({
        "benchmark": "migrate",
        "date": date,
        "device": device,
        "device_kind": layer.kind(),
        "gpus": layer.gpus(),
        "command": command_line,
        "config": cfg,
        "iters": args.iters,
        "warmup": args.warmup,
        "rows": rows,
    });
    let (j, m) = report::write(&args.out, &name, &json, &markdown).map_err(|e| format!("writing results: {e}"))?;
    println!("{markdown}");
    eprintln!("results: {} and {}", j.display(), m.display());
    let bad: usize = rows.iter().map(|r| r.bad_pages).sum();
    if bad > 0 {
        return Err(format!("{bad} pages arrived with wrong bytes"));
    }
    Ok(rows)
}

fn gbs(x: f64) -> String {
    format!("{x:.1}")
}

fn opt(x: Option<f64>) -> String {
    x.map_or("-".into(), gbs)
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    rows: &[Row],
    date: &str,
    device: &str,
    cmd: &str,
    emulated: bool,
    args: &MigrateArgs,
    size: u64,
    ext: &External,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# vfabric-bench migrate, {date}\n");
    let _ = writeln!(s, "- device: {device}");
    let _ = writeln!(s, "- command: `{cmd}`");
    let _ = writeln!(s, "- median of {} timed runs after {} warm-up runs; time: CUDA events around each batch on GPUs (the copy's own duration on the emulated device); GB/s = 10^9 bytes/s of all directions together; every case's first run verified page by page (xxh3)", args.iters, args.warmup);
    if emulated {
        let _ = writeln!(
            s,
            "- **emulated device**: host memory stands in for GPUs; these are memcpy speeds, not GPU figures"
        );
    }
    if !ext.is_empty() {
        let _ = writeln!(s, "- torch / nccl columns: torch_ceilings.py and nccl_baseline.py from the same device run");
    }
    let _ = writeln!(s);
    let main: Vec<&Row> = rows.iter().filter(|r| r.suite == "main").collect();
    if !main.is_empty() {
        let _ = writeln!(s, "## {} per direction\n", ByteSize(size));
        let _ = writeln!(s, "| direction | page | layout | engine | used | runs | GB/s | baseline GB/s | ratio | torch GB/s | nccl GB/s | bad pages |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in main {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {:.2} | {} | {} | {} |",
                r.direction,
                ByteSize(r.page),
                r.layout,
                r.engine,
                r.engine_used,
                r.runs,
                gbs(r.gb_s),
                gbs(r.baseline_gb_s),
                r.baseline,
                r.ratio,
                opt(r.torch_gb_s),
                opt(r.nccl_gb_s),
                r.bad_pages
            );
        }
        let _ = writeln!(s);
    }
    let sweep: Vec<&Row> = rows.iter().filter(|r| r.suite == "sm-sweep").collect();
    if !sweep.is_empty() {
        let _ = writeln!(s, "## SM budget of the kernel (scattered pages, {})\n", ByteSize(size));
        let _ = writeln!(s, "| direction | page | side | blocks | GB/s | ratio to baseline |");
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for r in &sweep {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {:.2} |",
                r.direction,
                ByteSize(r.page),
                r.side,
                r.blocks,
                gbs(r.gb_s),
                r.ratio
            );
        }
        let _ = writeln!(s);
        let mut groups: Vec<(String, u64)> = sweep.iter().map(|r| (r.direction.clone(), r.page)).collect();
        groups.dedup();
        for (d, p) in groups {
            let g: Vec<&&Row> = sweep.iter().filter(|r| r.direction == d && r.page == p).collect();
            if let Some(best) = g.iter().max_by(|a, b| a.gb_s.total_cmp(&b.gb_s)) {
                let fewest = g.iter().filter(|r| r.gb_s >= 0.9 * best.gb_s).min_by_key(|r| r.blocks);
                if let Some(f) = fewest {
                    let _ =
                        writeln!(
                        s,
                        "- {d}, {}: best {} GB/s ({} blocks, {}); fewest blocks within 90% of it: **{}** ({}, {} GB/s)",
                        ByteSize(p), gbs(best.gb_s), best.blocks, best.side, f.blocks, f.side, gbs(f.gb_s)
                    );
                }
            }
        }
        let _ = writeln!(s);
    }
    for (suite, title) in [
        ("size-sweep", "Size sweep (engine: the mover's choice)"),
        ("size-sweep-uploaded", "Size sweep, short batches with their index lists copied to the device first"),
    ] {
        size_table(&mut s, rows, suite, title);
    }
    s
}

/// The rows of one size sweep as a table.
fn size_table(s: &mut String, rows: &[Row], suite: &str, title: &str) {
    let sizes: Vec<&Row> = rows.iter().filter(|r| r.suite == suite).collect();
    if !sizes.is_empty() {
        let _ = writeln!(s, "## {title}\n");
        let _ = writeln!(s, "| direction | bytes | page | layout | used | median | GB/s | baseline GB/s | ratio |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
        for r in sizes {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {:.1} us | {} | {} | {:.2} |",
                r.direction,
                ByteSize(r.bytes),
                ByteSize(r.page),
                r.layout,
                r.engine_used,
                r.time.median * 1e6,
                gbs(r.gb_s),
                gbs(r.baseline_gb_s),
                r.ratio
            );
        }
        let _ = writeln!(s);
    }
}
