//! `vfabric-bench pager`: a region several times a GPU's budget walked by acquire/release, in order and at
//! random, each acquired page read on the GPU by a device copy; beside the same walk over a region that stays
//! resident (a budget large enough), in the same run. Also: the latency of acquiring a resident page, the
//! directory's memory per page, and compaction of a fragmented arena into one free run.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde_json::json;
use vfabric::pattern;
use vfabric::{ByteSize, Mode, Placement};
use vfabric_transport::{DeviceKind, Location};
use xxhash_rust::xxh3::xxh3_64;

use crate::common::ConfigArgs;
use crate::report;
use crate::tiers::{self, TierOptions};
use crate::walk::{fabric, populate, progress, walk};

/// Options of `vfabric-bench pager`.
#[derive(Args, Debug, Clone)]
pub struct PagerArgs {
    /// The configuration and device layer.
    #[command(flatten)]
    pub target: ConfigArgs,
    /// GPU budget of the oversubscribed walk (default: 4GiB on GPUs, 128MiB on the emulated device).
    #[arg(long)]
    pub budget: Option<ByteSize>,
    /// Region size as a multiple of the budget.
    #[arg(long, default_value_t = 4)]
    pub oversub: u64,
    /// Pages acquired per step of the walk.
    #[arg(long, value_delimiter = ',', default_values = ["1", "32"])]
    pub chunks: Vec<u64>,
    /// Acquires timed for the resident-page latency.
    #[arg(long, default_value_t = 20000)]
    pub latency_samples: usize,
    /// Arena to fragment and compact (default: 8GiB on GPUs, 64MiB on the emulated device); 0 skips it.
    #[arg(long)]
    pub compact_arena: Option<ByteSize>,
    /// A folder for a storage tier's file (on the drive to measure): adds walks over three tiers, a region
    /// `--tiers-oversub` times the GPU budget with host memory of `--tiers-host`, beside the tier's raw reads.
    #[arg(long)]
    pub storage_dir: Option<PathBuf>,
    /// Region size of the three-tier walks as a multiple of the GPU budget.
    #[arg(long, default_value_t = 8)]
    pub tiers_oversub: u64,
    /// Host memory of the three-tier walks as a multiple of the GPU budget.
    #[arg(long, default_value_t = 2)]
    pub tiers_host: u64,
    /// Results folder.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: pager-DEVICE-TIME).
    #[arg(long)]
    pub name: Option<String>,
}

/// Runs the benchmark and writes its results.
pub fn run(args: &PagerArgs, command_line: &str) -> Result<(), String> {
    let base = args.target.load()?;
    // One small fabric to see what the device layer is.
    let probe = fabric(&base, 4 << 20, 8 << 20)?;
    let emulated = probe.device_kind() == DeviceKind::Emulated;
    if let Some(why) = probe.fallback_reason() {
        eprintln!(
            "no usable GPU ({why}): benchmarking the emulated device (host memory); its figures are memcpy speeds"
        );
    }
    let device = probe.describe();
    eprintln!("{device}");
    drop(probe);
    let ps = base.memory.page().bytes();
    let budget = args.budget.map_or(if emulated { 128 << 20 } else { 4 << 30 }, |b| b.bytes()) / ps * ps;
    let region_bytes = budget * args.oversub.max(1);
    for &c in &args.chunks {
        if c == 0 || (region_bytes / ps) % c != 0 {
            return Err(format!("--chunks {c}: must divide the region's {} pages", region_bytes / ps));
        }
        if c * ps > budget / 2 {
            return Err(format!(
                "--chunks {c}: {c} pages of {} is more than half the GPU budget of {}",
                ByteSize(ps),
                ByteSize(budget)
            ));
        }
    }

    let mut rows = Vec::new();
    // Oversubscribed: the region is `oversub` times the GPU's arena; host memory holds it all.
    let f = fabric(&base, budget, region_bytes + budget)?;
    let r = f.alloc(region_bytes, Placement::on(Location::Gpu(0))).map_err(|e| e.to_string())?;
    let hashes = populate(&f, &r, 77)?;
    let stats = f.stats();
    let meta_per_page = stats.directory.metadata_bytes as f64 / stats.directory.pages.max(1) as f64;
    for &chunk in &args.chunks {
        for random in [false, true] {
            rows.push(walk(&f, &r, &hashes, chunk, random, "oversubscribed")?);
        }
    }
    drop(f);
    // Resident: a budget that holds the whole region under the headroom and the high watermark.
    let f = fabric(&base, region_bytes * 2, region_bytes + budget)?;
    let r = f.alloc(region_bytes, Placement::on(Location::Gpu(0))).map_err(|e| e.to_string())?;
    let hashes = populate(&f, &r, 77)?;
    // One untimed pass brings every page to the GPU in one run.
    let warm = f.acquire(&r, 0..r.len, Location::Gpu(0), Mode::Read).map_err(|e| e.to_string())?;
    f.release(warm).map_err(|e| e.to_string())?;
    for &chunk in &args.chunks {
        for random in [false, true] {
            rows.push(walk(&f, &r, &hashes, chunk, random, "resident")?);
        }
    }

    // Latency of acquiring a resident page (the metadata path): pages already on GPU 0.
    let lat_pages = (budget / ps / 4).clamp(1, 64);
    let small = f.alloc(lat_pages * ps, Placement::on(Location::Gpu(0))).map_err(|e| e.to_string())?;
    f.write(&small, 0, &vec![1u8; (lat_pages * ps) as usize]).map_err(|e| e.to_string())?;
    let l = f.acquire(&small, 0..lat_pages * ps, Location::Gpu(0), Mode::Read).map_err(|e| e.to_string())?;
    f.release(l).map_err(|e| e.to_string())?;
    let mut acq = Vec::with_capacity(args.latency_samples);
    let mut rel = Vec::with_capacity(args.latency_samples);
    for i in 0..args.latency_samples as u64 {
        let p = i % lat_pages;
        let t0 = Instant::now();
        let l = f.acquire(&small, p * ps..(p + 1) * ps, Location::Gpu(0), Mode::Read).map_err(|e| e.to_string())?;
        let t1 = Instant::now();
        f.release(l).map_err(|e| e.to_string())?;
        acq.push((t1 - t0).as_secs_f64());
        rel.push(t1.elapsed().as_secs_f64());
    }
    let pct = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() as f64 - 1.0) * q).round() as usize]
    };
    let (a50, a99, r50, r99) = (pct(&mut acq, 0.5), pct(&mut acq, 0.99), pct(&mut rel, 0.5), pct(&mut rel, 0.99));
    drop(f);

    // Compaction: fill an arena with one-page regions, free every other one, compact into one free run.
    let carena = args.compact_arena.map_or(if emulated { 64 << 20 } else { 8 << 30 }, |b| b.bytes()) / ps * ps;
    let compaction = if carena > 0 {
        let mut c = base.clone();
        c.memory.high_watermark_percent = 100;
        c.memory.low_watermark_percent = 100;
        c.memory.headroom_percent = 0;
        let f = fabric(&c, carena, carena)?;
        let frames = carena / ps;
        let b = progress(frames, format!("fragmenting a {} arena", ByteSize(carena)));
        let mut regions = Vec::new();
        let page = pattern::bytes(5, 0, ps as usize);
        for _ in 0..frames {
            let r = f.alloc(ps, Placement::on(Location::Gpu(0))).map_err(|e| e.to_string())?;
            f.write(&r, 0, &page).map_err(|e| e.to_string())?;
            regions.push(r);
            b.inc(1);
        }
        b.finish_and_clear();
        let mut kept = Vec::new();
        for (i, r) in regions.into_iter().enumerate() {
            if i % 2 == 0 {
                f.free(&r).map_err(|e| e.to_string())?;
            } else {
                kept.push(r);
            }
        }
        let before = f.stats().directory.devices[0].clone();
        let want = (frames / 2) as u32;
        let t = Instant::now();
        let moved = f.compact(Location::Gpu(0), want).map_err(|e| e.to_string())?;
        let secs = t.elapsed().as_secs_f64();
        let after = f.stats().directory.devices[0].clone();
        let mut bad = 0;
        let mut buf = vec![0u8; ps as usize];
        let want_hash = xxh3_64(&page);
        for r in &kept {
            f.read(r, 0, &mut buf).map_err(|e| e.to_string())?;
            if xxh3_64(&buf) != want_hash {
                bad += 1;
            }
        }
        Some(json!({
            "arena": carena, "frames": frames, "largest_free_run_before": before.largest_free_run,
            "free_ranges_before": before.free_ranges, "largest_free_run_after": after.largest_free_run,
            "pages_moved": moved, "bytes_moved": moved * ps, "seconds": secs,
            "gb_s": (moved * ps) as f64 / secs / 1e9, "bad_pages": bad,
        }))
    } else {
        None
    };

    let tiers = match &args.storage_dir {
        Some(dir) => {
            let options =
                TierOptions { oversub: args.tiers_oversub, host: args.tiers_host, chunks: args.chunks.clone() };
            Some(tiers::run(&base, &options, dir, budget, ps)?)
        }
        None => None,
    };

    let (date, stamp) = report::now_stamps();
    let mut md = String::new();
    let _ = writeln!(md, "# vfabric-bench pager, {date}\n");
    let _ = writeln!(md, "- device: {device}");
    let _ = writeln!(md, "- command: `{command_line}`");
    let _ = writeln!(
        md,
        "- region {} = {} x a GPU budget of {}, {} pages; each step acquires pages on gpu0 (Read), copies them on the device into a scratch buffer (the touch), releases; timed from the first acquire to the last release; a second walk in the same order, untimed, verifies every page's device copy (xxh3)",
        ByteSize(region_bytes),
        args.oversub,
        ByteSize(budget),
        ByteSize(ps)
    );
    if emulated {
        let _ = writeln!(
            md,
            "- **emulated device**: host memory stands in for GPUs; these are memcpy speeds, not GPU figures"
        );
    }
    let _ = writeln!(md, "\n## Walks\n");
    let _ = writeln!(md, "| setup | order | pages/step | pages/s | walk GB/s | fetched GB/s | share in acquire | fetched | prefetched | evicted (copied) | gathered on GPU | bad pages |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for w in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.0}% | {} | {} | {} | {} | {} |",
            w.setup,
            w.order,
            w.chunk,
            w.pages_per_s,
            w.walk_gb_s,
            w.fetch_gb_s,
            w.acquire_share * 100.0,
            ByteSize(w.fetched),
            ByteSize(w.prefetched),
            ByteSize(w.evicted),
            ByteSize(w.gathered),
            w.bad_pages
        );
    }
    let _ = writeln!(md, "\nRatio of the oversubscribed walk to the resident one (pages/s):\n");
    for w in rows.iter().filter(|w| w.setup == "oversubscribed") {
        if let Some(res) = rows.iter().find(|x| x.setup == "resident" && x.order == w.order && x.chunk == w.chunk) {
            let _ =
                writeln!(md, "- {} walk, {} page(s) a step: {:.2}", w.order, w.chunk, w.pages_per_s / res.pages_per_s);
        }
    }
    let _ = writeln!(md, "\n## Acquire of a resident page ({} samples, host clock)\n", args.latency_samples);
    let _ = writeln!(md, "- acquire: p50 {:.2} us, p99 {:.2} us", a50 * 1e6, a99 * 1e6);
    let _ = writeln!(md, "- release: p50 {:.2} us, p99 {:.2} us", r50 * 1e6, r99 * 1e6);
    let _ = writeln!(md, "\n## Directory memory\n\n- {meta_per_page:.1} bytes of host memory per page (region of {} pages, with the reverse maps of every frame of every arena counted in)", region_bytes / ps);
    if let Some(c) = &compaction {
        let _ = writeln!(
            md,
            "\n## Compaction\n\n- {} arena, every other page freed (largest free run {} frames, {} free ranges): one free run of {} frames after moving {} pages ({}) in {:.1} ms = {:.1} GB/s; {} bad pages",
            ByteSize(carena),
            c["largest_free_run_before"],
            c["free_ranges_before"],
            c["largest_free_run_after"],
            c["pages_moved"],
            ByteSize(c["bytes_moved"].as_u64().unwrap_or(0)),
            c["seconds"].as_f64().unwrap_or(0.0) * 1e3,
            c["gb_s"].as_f64().unwrap_or(0.0),
            c["bad_pages"]
        );
    }
    if let Some(t) = &tiers {
        md.push_str(&t.markdown);
    }
    let name =
        args.name.clone().unwrap_or_else(|| format!("pager-{}-{stamp}", if emulated { "emulated" } else { "cuda" }));
    let doc = json!({
        "benchmark": "pager", "date": date, "device": device, "command": command_line,
        "region_bytes": region_bytes, "budget": budget, "page_size": ps, "walks": rows,
        "acquire_resident_us": { "p50": a50 * 1e6, "p99": a99 * 1e6, "samples": args.latency_samples },
        "release_us": { "p50": r50 * 1e6, "p99": r99 * 1e6 },
        "directory_bytes_per_page": meta_per_page, "compaction": compaction,
        "three_tiers": tiers.as_ref().map(|t| t.json.clone()),
    });
    let (j, m) = report::write(&args.out, &name, &doc, &md).map_err(|e| format!("writing results: {e}"))?;
    println!("{md}");
    eprintln!("results: {} and {}", j.display(), m.display());
    let bad: u64 = rows.iter().chain(tiers.iter().flat_map(|t| &t.rows)).map(|w| w.bad_pages).sum::<u64>()
        + compaction.as_ref().and_then(|c| c["bad_pages"].as_u64()).unwrap_or(0);
    if bad > 0 {
        return Err(format!("{bad} pages had wrong bytes"));
    }
    Ok(())
}
