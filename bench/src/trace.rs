//! `vfabric-bench trace FILE`: a PyTorch allocator trace replayed through the fabric's [`TensorPool`], beside
//! the trace's own caching-allocator figures.
//!
//! The file is what `bench/scripts/capture_trace.py` writes from `torch.cuda.memory._snapshot()` after
//! `_record_memory_history()`: `{"events": [[action, addr, size], ...], "torch": {...}}`, one device, events in
//! order. `alloc` and `free_completed` are the program's tensors (replayed: every `alloc` becomes a pool
//! allocation of the same size, its `free_completed` frees it); `segment_alloc`/`segment_free` and
//! `segment_map`/`segment_unmap` are the caching allocator's own reservations, which give its peak reserved.
//! The figure of merit is peak reserved / peak allocated: the memory held beyond what the tensors need.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde_json::json;
use vfabric::units::ByteSize;
use vfabric::{Fabric, Location, PoolConfig, TensorPool};

use crate::common::ConfigArgs;
use crate::report;

/// `vfabric-bench trace`.
#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// The trace (JSON from bench/scripts/capture_trace.py).
    pub file: PathBuf,
    /// The configuration and device layer (its page size is the pool's).
    #[command(flatten)]
    pub target: ConfigArgs,
    /// Slab size of the pool (default: the pool's own, 32 MiB).
    #[arg(long)]
    pub slab: Option<ByteSize>,
    /// Results folder.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: trace-DEVICE-TIME).
    #[arg(long)]
    pub name: Option<String>,
}

/// One event of the trace.
struct Event {
    action: String,
    addr: u64,
    size: u64,
}

fn load(file: &PathBuf) -> Result<(Vec<Event>, serde_json::Value), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let events = doc["events"].as_array().ok_or(format!("{}: no `events` list", file.display()))?;
    let mut out = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let bad = || format!("{}: event {i} is not [action, addr, size]: {e}", file.display());
        let a = e.as_array().filter(|a| a.len() == 3).ok_or_else(bad)?;
        let action = a[0].as_str().ok_or_else(bad)?.to_string();
        let (addr, size) = (a[1].as_u64().ok_or_else(bad)?, a[2].as_u64().ok_or_else(bad)?);
        out.push(Event { action, addr, size });
    }
    Ok((out, doc["torch"].clone()))
}

/// The trace's own figures: peak allocated (its tensors) and peak reserved (its segments).
fn torch_peaks(events: &[Event]) -> (u64, u64) {
    let (mut alloc, mut reserved, mut peak_alloc, mut peak_reserved) = (0i128, 0i128, 0i128, 0i128);
    for e in events {
        match e.action.as_str() {
            "alloc" => alloc += i128::from(e.size),
            "free_completed" => alloc -= i128::from(e.size),
            "segment_alloc" | "segment_map" => reserved += i128::from(e.size),
            "segment_free" | "segment_unmap" => reserved -= i128::from(e.size),
            _ => {}
        }
        peak_alloc = peak_alloc.max(alloc);
        peak_reserved = peak_reserved.max(reserved);
    }
    (peak_alloc.max(0) as u64, peak_reserved.max(0) as u64)
}

/// `vfabric-bench trace`.
pub fn run(args: &TraceArgs, command_line: &str) -> Result<(), String> {
    let (events, torch) = load(&args.file)?;
    let (torch_alloc, torch_reserved) = torch_peaks(&events);
    if torch_alloc == 0 {
        return Err(format!("{}: the trace allocates nothing", args.file.display()));
    }
    let mut cfg = args.target.load()?;
    // A GPU budget that holds the trace's tensors with room for the pool's slabs and the fabric's headroom.
    let budget = (torch_alloc + torch_alloc / 2 + (256 << 20)).div_ceil(2 << 20) * (2 << 20);
    cfg.memory.gpu_budget = Some(ByteSize(budget));
    cfg.device.emulated_gpu_memory = ByteSize(cfg.device.emulated_gpu_memory.bytes().max(budget * 2));
    let fabric = Fabric::embedded(&cfg).map_err(|e| e.to_string())?;
    if let Some(why) = fabric.fallback_reason() {
        eprintln!("no usable GPU ({why}): replaying on the emulated device (host memory)");
    }
    let device = fabric.describe();
    eprintln!("{device}; {} events, the trace's peak allocated {}", events.len(), ByteSize(torch_alloc));
    let mut pcfg = PoolConfig::new(&fabric, Location::Gpu(0));
    if let Some(s) = args.slab {
        pcfg.slab_bytes = s.bytes();
        pcfg.large_bytes = s.bytes() / 4;
    }
    let mut pool = TensorPool::new(fabric.clone(), pcfg).map_err(|e| e.to_string())?;
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut allocs, mut frees, mut skipped) = (0u64, 0u64, 0u64);
    let t = Instant::now();
    for e in &events {
        match e.action.as_str() {
            "alloc" if e.size > 0 => {
                let ptr = pool.alloc(e.size).map_err(|err| format!("allocation {allocs} ({} bytes): {err}", e.size))?;
                if live.insert(e.addr, ptr).is_some() {
                    return Err(format!("the trace allocates {:#x} twice", e.addr));
                }
                allocs += 1;
            }
            "free_completed" => match live.remove(&e.addr) {
                Some(ptr) => {
                    pool.free(ptr).map_err(|err| err.to_string())?;
                    frees += 1;
                }
                // A block allocated before the recording began.
                None => skipped += 1,
            },
            _ => {}
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    let s = pool.stats();
    drop(pool);
    let ratio = |r: u64, a: u64| if a > 0 { r as f64 / a as f64 } else { 0.0 };
    let (date, stamp) = report::now_stamps();
    let mut md = format!("# vfabric-bench trace ({date})\n\n{device}\n\n`{command_line}`\n\n");
    let _ = writeln!(
        md,
        "- trace: `{}`, {} events: {allocs} allocations and {frees} frees replayed ({skipped} frees of blocks from before the recording skipped), {:.2} us per call",
        args.file.display(),
        events.len(),
        seconds * 1e6 / (allocs + frees).max(1) as f64
    );
    let _ = writeln!(
        md,
        "- pool: slabs of {}, regions of their own from {}, {}-byte alignment, page {}; {} large allocations served by a kept region\n",
        ByteSize(pcfg.slab_bytes),
        ByteSize(pcfg.large_bytes),
        pcfg.align,
        ByteSize(fabric.page_size()),
        s.cache_hits
    );
    let _ = writeln!(md, "| allocator | peak allocated | peak reserved | reserved / allocated |");
    let _ = writeln!(md, "|---|---|---|---|");
    let _ = writeln!(
        md,
        "| PyTorch's caching allocator (the trace) | {} | {} | {:.3} |",
        ByteSize(torch_alloc),
        ByteSize(torch_reserved),
        ratio(torch_reserved, torch_alloc)
    );
    let _ = writeln!(
        md,
        "| vfabric's pool (replayed) | {} | {} | **{:.3}** |",
        ByteSize(s.peak_allocated),
        ByteSize(s.peak_reserved),
        ratio(s.peak_reserved, s.peak_allocated)
    );
    let name = args.name.clone().unwrap_or_else(|| format!("trace-{}-{stamp}", fabric.device_kind()));
    let doc = json!({
        "benchmark": "trace", "date": date, "device": device, "command": command_line,
        "file": args.file.display().to_string(), "events": events.len(), "allocations": allocs, "frees": frees,
        "skipped_frees": skipped, "us_per_call": seconds * 1e6 / (allocs + frees).max(1) as f64,
        "torch": { "peak_allocated": torch_alloc, "peak_reserved": torch_reserved, "ratio": ratio(torch_reserved, torch_alloc), "reported": torch },
        "pool": { "peak_allocated": s.peak_allocated, "peak_reserved": s.peak_reserved, "ratio": ratio(s.peak_reserved, s.peak_allocated),
                  "slab_bytes": pcfg.slab_bytes, "large_bytes": pcfg.large_bytes, "page_size": fabric.page_size(),
                  "cache_bytes": pcfg.cache_bytes, "cache_hits": s.cache_hits },
    });
    let (j, m) = report::write(&args.out, &name, &doc, &md).map_err(|e| format!("writing results: {e}"))?;
    println!("{md}");
    eprintln!("results: {} and {}", j.display(), m.display());
    Ok(())
}
