//! Walks over a region larger than a GPU's budget, shared by `vfabric-bench pager`'s setups (oversubscribed,
//! resident, three tiers): the region written with verifiable data, then acquired a chunk at a time in order or
//! at random, each chunk touched on the device, timed, and verified by a second walk.

use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use vfabric::pattern::{self, shuffled};
use vfabric::{ByteSize, ClusterConfig, Fabric, Mode};
use vfabric_transport::{Arena, Backend, EngineChoice, Location};
use xxhash_rust::xxh3::xxh3_64;

/// One walk.
#[derive(Debug, Clone, Serialize)]
pub struct WalkRow {
    /// "oversubscribed" or "resident".
    pub setup: &'static str,
    /// "sequential" or "random".
    pub order: &'static str,
    /// Pages per acquire.
    pub chunk: u64,
    /// Pages walked.
    pub pages: u64,
    /// Wall time of the walk, seconds.
    pub seconds: f64,
    /// Pages walked per second.
    pub pages_per_s: f64,
    /// Bytes walked per second, GB/s.
    pub walk_gb_s: f64,
    /// Bytes fetched per second of walk, GB/s (every fetch: a page read from the storage tier counts twice, on
    /// its way into host memory and from there onto the GPU).
    pub fetch_gb_s: f64,
    /// Bytes fetched.
    pub fetched: u64,
    /// Bytes fetched onto the GPU (from host memory): `fetched` less the storage tier's reads, which land in
    /// host memory first. (With a compressed tier, its pages expanded into host memory count here too.)
    pub to_gpu: u64,
    /// `to_gpu` per second of walk, GB/s.
    pub to_gpu_gb_s: f64,
    /// The part of `fetched` prefetched while the walk worked.
    pub prefetched: u64,
    /// Bytes evicted (copied to host; clean pages are dropped without a copy).
    pub evicted: u64,
    /// Bytes moved within the GPU to gather pages into a lease's run of frames.
    pub gathered: u64,
    /// Share of the walk spent in acquire (waiting for fetches, prefetches and evictions).
    pub acquire_share: f64,
    /// Bytes read from the storage tier (pages, as the fabric counts them).
    pub from_storage: u64,
    /// Bytes written to the storage tier (pages, as the fabric counts them).
    pub to_storage: u64,
    /// `from_storage` per second of walk, GB/s.
    pub from_storage_gb_s: f64,
    /// `to_storage` per second of walk, GB/s.
    pub to_storage_gb_s: f64,
    /// Bytes this process read from block devices during the walk, as the kernel counts them
    /// (`/proc/self/io`'s `read_bytes`: the storage tier's O_DIRECT reads, which no page cache serves); none
    /// where the kernel does not say.
    pub drive_read: Option<u64>,
    /// Bytes this process wrote to block devices during the walk (`write_bytes`), likewise.
    pub drive_written: Option<u64>,
    /// Pages whose device copy differed from the region's bytes.
    pub bad_pages: u64,
}

/// Bytes this process has read from and written to block devices, as `/proc/self/io` counts them (every
/// thread's, io_uring's workers too): none where the kernel keeps no such count.
pub(crate) fn drive_io() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    let field = |name: &str| -> Option<u64> {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
    };
    Some((field("read_bytes")?, field("write_bytes")?))
}

/// What `drive_io` counted between `before` and `after`.
pub(crate) fn drive_since(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> (Option<u64>, Option<u64>) {
    match (before, after) {
        (Some(b), Some(a)) => (Some(a.0.saturating_sub(b.0)), Some(a.1.saturating_sub(b.1))),
        _ => (None, None),
    }
}

pub(crate) fn progress(len: u64, msg: String) -> ProgressBar {
    let b = ProgressBar::new(len);
    b.set_style(
        ProgressStyle::with_template("{msg:<48} [{bar:30}] {pos}/{len} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    b.set_message(msg);
    b
}

/// A fabric whose GPU 0 has `budget` bytes and host memory room for `host` bytes.
pub(crate) fn fabric(base: &ClusterConfig, budget: u64, host: u64) -> Result<Fabric, String> {
    let mut cfg = base.clone();
    cfg.memory.gpu_budget = Some(ByteSize(budget));
    cfg.memory.host_arena = ByteSize(host);
    if cfg.device.backend != Backend::Cuda {
        cfg.device.emulated_gpu_memory = ByteSize(cfg.device.emulated_gpu_memory.bytes().max(budget * 2));
    }
    Fabric::embedded(&cfg).map_err(|e| e.to_string())
}

/// Writes the region with verifiable data; returns each page's hash.
pub(crate) fn populate(f: &Fabric, r: &vfabric::Region, seed: u64) -> Result<Vec<u64>, String> {
    let ps = f.page_size();
    let chunk = (64u64 << 20).max(ps);
    let b = progress(r.len / ps, format!("writing a {} region", ByteSize(r.len)));
    let mut hashes = Vec::new();
    let mut off = 0;
    while off < r.len {
        let n = chunk.min(r.len - off);
        let data = pattern::bytes(seed, off, n as usize);
        hashes.extend(data.chunks_exact(ps as usize).map(xxh3_64));
        f.write(r, off, &data).map_err(|e| e.to_string())?;
        off += n;
        b.inc(n / ps);
    }
    b.finish_and_clear();
    Ok(hashes)
}

/// Walks the region twice in the same order: acquire `chunk` pages on GPU 0, copy them on the device into a
/// scratch arena (the "kernel" that touches them), release. The first walk is timed from its first acquire to
/// its last release, with nothing else in between (prefetches overlap only the walk's own work). The second
/// walk, untimed, checks every page's device copy against the region's hashes.
pub(crate) fn walk(
    f: &Fabric,
    r: &vfabric::Region,
    hashes: &[u64],
    chunk: u64,
    random: bool,
    setup: &'static str,
) -> Result<WalkRow, String> {
    let ps = f.page_size();
    let pages = r.len / ps;
    let g0 = Location::Gpu(0);
    let scratch: Arc<dyn Arena> = f.scratch_arena(g0, chunk * ps).map_err(|e| e.to_string())?;
    let steps = pages / chunk;
    let order: Vec<u64> =
        if random { shuffled(steps as u32, 0xF00D).into_iter().map(u64::from).collect() } else { (0..steps).collect() };
    let what = format!("{setup} {} walk, {chunk} page(s) a step", if random { "random" } else { "sequential" });
    // One step: acquire, touch, release; returns the time spent in acquire.
    let step = |s: u64| -> Result<f64, String> {
        let t0 = Instant::now();
        let lease = f.acquire(r, s * chunk * ps..(s + 1) * chunk * ps, g0, Mode::Read).map_err(|e| e.to_string())?;
        let in_acquire = t0.elapsed().as_secs_f64();
        lease.pages().copy_to(&scratch, EngineChoice::Auto).map_err(|e| e.to_string())?;
        f.release(lease).map_err(|e| e.to_string())?;
        Ok(in_acquire)
    };
    let before = f.traffic();
    let drive_before = drive_io();
    let b = progress(steps, what.clone());
    let mut acquire_time = 0.0;
    let start = Instant::now();
    for (i, &s) in order.iter().enumerate() {
        acquire_time += step(s)?;
        if i % 64 == 63 {
            b.inc(64);
        }
    }
    let walk_time = start.elapsed().as_secs_f64();
    let t = f.traffic().since(&before);
    let (drive_read, drive_written) = drive_since(drive_before, drive_io());
    b.finish_and_clear();
    let b = progress(steps, format!("verifying: {what}"));
    let mut bad = 0;
    let mut buf = vec![0u8; (chunk * ps) as usize];
    for &s in &order {
        step(s)?;
        scratch.read(0, &mut buf).map_err(|e| e.to_string())?;
        for (i, page) in buf.chunks_exact(ps as usize).enumerate() {
            if xxh3_64(page) != hashes[(s * chunk) as usize + i] {
                bad += 1;
            }
        }
        b.inc(1);
    }
    b.finish_and_clear();
    let walked = steps * chunk;
    let to_gpu = t.fetched.saturating_sub(t.from_storage);
    let per_s = |bytes: u64| bytes as f64 / walk_time / 1e9;
    Ok(WalkRow {
        setup,
        order: if random { "random" } else { "sequential" },
        chunk,
        pages: walked,
        seconds: walk_time,
        pages_per_s: walked as f64 / walk_time,
        walk_gb_s: (walked * ps) as f64 / walk_time / 1e9,
        fetch_gb_s: per_s(t.fetched),
        fetched: t.fetched,
        to_gpu,
        to_gpu_gb_s: per_s(to_gpu),
        prefetched: t.prefetched,
        evicted: t.evicted,
        gathered: t.compacted,
        acquire_share: acquire_time / walk_time,
        from_storage: t.from_storage,
        to_storage: t.to_storage,
        from_storage_gb_s: per_s(t.from_storage),
        to_storage_gb_s: per_s(t.to_storage),
        drive_read,
        drive_written,
        bad_pages: bad,
    })
}
