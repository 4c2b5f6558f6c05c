//! The compressed tier part of `vfabric-bench lossy` (the lossless side of the compression module): a region
//! stored with LZ4 or zstd, larger than a GPU's budget and host memory together, written from the host and walked
//! on the GPU in order, on two nodes of the same memory: one whose host memory is all whole frames and whose region is
//! stored as it is (the baseline), one with part of that memory as a compressed tier. Per kind of data (random
//! bytes, which never shrink; bf16 weights; GELU activations; sparse pages; zeros; and a trained model's tensors
//! when given): the pages memory holds, the write's and the walk's GB/s, and the bytes read from the storage
//! tier. Every page is checked after the walk.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use vfabric::{ByteSize, ClusterConfig, Compression, FabricError, Mode, Placement};
use vfabric_transport::Location;

use crate::compression;
use crate::tiers;

/// One node's write and walk.
#[derive(Debug, Clone, Serialize)]
pub struct CompressedRow {
    /// What the pages hold.
    pub data: String,
    /// "host frames" (the baseline), "half a tier" (the same memory, half of it a compressed tier) or "frames and
    /// a tier" (the baseline's frames and a compressed tier of half their bytes beside them).
    pub setup: &'static str,
    /// The region's codec: "none" for the baseline, "lz4" or "zstd" with a tier.
    pub codec: String,
    /// Pages of the region.
    pub pages: u64,
    /// Pages host memory and the compressed tier held once the region was written.
    pub held: u64,
    /// Pages moved into the compressed tier, and the bytes they take there.
    pub compressed: u64,
    /// Pages left in host memory's frames without a probe (their region's recent pages did not shrink), writing
    /// and walking.
    pub skipped: u64,
    pub compressed_bytes: u64,
    /// Seconds callers waited for packing (and the evictions that made room in the tier), writing and walking.
    pub pack_seconds: f64,
    /// GB/s of the write from the host (pages going down through the tiers as it goes).
    pub write_gb_s: f64,
    /// GB/s of the walk on the GPU (the median of `walks_gb_s`).
    pub walk_gb_s: f64,
    /// GB/s of each walk, in order.
    pub walks_gb_s: Vec<f64>,
    /// Bytes read from the storage tier during a walk (on average).
    pub from_storage: u64,
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Two runs of one node as one row: their walks together (the median of them all), the mean of their writes.
fn merged(a: CompressedRow, b: CompressedRow) -> CompressedRow {
    let mut walks_gb_s = a.walks_gb_s;
    walks_gb_s.extend(b.walks_gb_s);
    CompressedRow {
        walk_gb_s: median(&walks_gb_s),
        walks_gb_s,
        write_gb_s: (a.write_gb_s + b.write_gb_s) / 2.0,
        pack_seconds: a.pack_seconds + b.pack_seconds,
        skipped: a.skipped + b.skipped,
        from_storage: (a.from_storage + b.from_storage) / 2,
        ..a
    }
}

/// Walks of each node in memory, each of its two runs.
const IN_MEMORY_WALKS: usize = 5;

/// The kinds of data walked.
const KINDS: [&str; 5] = [
    "random bytes",
    "bf16 weights, N(0, 0.02)",
    "bf16 activations, GELU(N(0, 1))",
    "sparse: zeros, a number every 4 KiB",
    "zeros",
];

/// Writes, walks `walks` times with leases in `mode` and checks a region of `pages` pages of `data` on a node with
/// a GPU budget of `budget`, `frames` bytes of host frames and a compressed tier of `tier` bytes (none when 0, and
/// the region stored as it is), the region stored with `codec` when there is a tier.
fn one(
    base: &ClusterConfig,
    (setup, codec, walks, mode): (&'static str, Compression, usize, Mode),
    (budget, frames, tier, pages, ps): (u64, u64, u64, u64, u64),
    (kind, data): (&str, &[u8]),
    dir: &Path,
) -> Result<CompressedRow, String> {
    let e = |e: FabricError| format!("{kind}, {setup}: {e}");
    let mut cfg = base.clone();
    cfg.memory.compressed_arena = ByteSize(tier);
    let sizes = tiers::Memory { budget, host: frames, packed: None };
    let f = tiers::fabric(&cfg, sizes, dir, (pages + budget / ps) * ps)?;
    let gpu = Location::Gpu(0);
    let compression = if tier > 0 { codec } else { Compression::None };
    let r = f.alloc(pages * ps, Placement { device: Some(gpu), compression, ..Placement::default() }).map_err(e)?;
    let sample = data.len() as u64 / ps;
    let source = |p: u64| &data[((p % sample) * ps) as usize..((p % sample + 1) * ps) as usize];
    let (before, stalls) = (f.traffic(), f.stats().stalls);
    let t = Instant::now();
    for p in 0..pages {
        f.write(&r, p * ps, source(p)).map_err(e)?;
    }
    let write_s = t.elapsed().as_secs_f64();
    let wrote = f.traffic().since(&before);
    let devices = f.stats().directory.devices;
    let held = devices.iter().filter(|d| d.location.is_host_memory()).map(|d| d.copies).sum();
    let (mut walks_gb_s, mut from_storage) = (Vec::with_capacity(walks), 0);
    for _ in 0..walks.max(1) {
        let (walk_s, read) = tiers::walk_leases(&f, &r, pages, budget, mode).map_err(e)?;
        walks_gb_s.push((pages * ps) as f64 / walk_s / 1e9);
        from_storage += read;
    }
    let pack_seconds = f.stats().stalls.since(&stalls).pack_ns as f64 / 1e9;
    let skipped = f.traffic().since(&before).compress_skipped / ps;
    let mut back = vec![0u8; ps as usize];
    for p in 0..pages {
        f.read(&r, p * ps, &mut back).map_err(e)?;
        if back != source(p) {
            return Err(format!("{kind}, {setup}: page {p} came back changed"));
        }
    }
    f.free(&r).map_err(e)?;
    Ok(CompressedRow {
        data: kind.to_owned(),
        setup,
        codec: compression.to_string(),
        pages,
        held,
        compressed: wrote.compressed / ps,
        skipped,
        compressed_bytes: wrote.compressed_bytes,
        pack_seconds,
        write_gb_s: (pages * ps) as f64 / write_s / 1e9,
        walk_gb_s: median(&walks_gb_s),
        from_storage: from_storage / walks_gb_s.len() as u64,
        walks_gb_s,
    })
}

/// Runs the nodes over every kind: a GPU budget of `budget` and `host` bytes of host frames (the baseline); then
/// for each lossless codec of `codecs`, the same memory, half of it a compressed tier, and the baseline's frames
/// and a tier of half their bytes beside them (for pages that never shrink, what packing costs). The region is
/// the budget and three times `host`. `tensors` (name, bytes) are walked beside the synthetic kinds (with
/// `synthetic`), each at least a page. The comparison in memory runs LZ4.
pub fn run(
    base: &ClusterConfig,
    (budget, host, ps): (u64, u64, u64),
    codecs: &[Compression],
    dir: &Path,
    tensors: &[(String, Vec<u8>)],
    synthetic: bool,
) -> Result<(Vec<CompressedRow>, String), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let pages = (budget + 3 * host) / ps;
    let tier = host / 2 / ps * ps;
    let mut rows = Vec::new();
    let kinds = if synthetic { &KINDS[..] } else { &[] };
    let synthetic =
        kinds.iter().enumerate().map(|(i, &k)| (k, compression::synthetic(k, (64 * ps) as usize, 31 + i as u64)));
    let trained = tensors.iter().filter(|(_, d)| d.len() as u64 >= ps).map(|(n, d)| (n.as_str(), d.clone()));
    if let Some(c) = codecs.iter().find(|c| !c.is_lossless()) {
        return Err(format!("the compressed tier takes lossless codecs (lz4, zstd), not {c}"));
    }
    let mut setups = vec![("host frames", Compression::None, host, 0)];
    for &c in codecs {
        setups.extend([("half a tier", c, host - tier, tier), ("frames and a tier", c, host, tier)]);
    }
    for (kind, data) in synthetic.chain(trained) {
        for &(setup, c, frames, t) in &setups {
            eprintln!("compressed tier, {kind}, {setup} ({c}): a region of {}", ByteSize(pages * ps));
            let sizes = (budget, frames, t, pages, ps);
            rows.push(one(base, (setup, c, 1, Mode::Read), sizes, (kind, &data), dir)?);
        }
    }
    // In memory: a region the GPU and the baseline's frames hold together below their watermarks, so that no
    // storage I/O blurs what packing costs pages that never shrink (probed as they arrive in host memory until
    // their region's pages are skipped, then left in their frames). Walked with write leases, so that every
    // page leaves the GPU as a copy to host memory on every walk (a read lease's would be a drop: the page
    // keeps its copy there). A walk takes tens of milliseconds: each node walks IN_MEMORY_WALKS times, twice,
    // the baseline first and then second.
    let small = (budget + host) * 3 / 5 / ps;
    let mut in_memory = Vec::new();
    for (i, kind) in KINDS[..2].iter().enumerate() {
        let data = compression::synthetic(kind, (64 * ps) as usize, 41 + i as u64);
        let mut runs: Vec<Vec<CompressedRow>> = vec![Vec::new(), Vec::new()];
        for order in [[0, 1], [1, 0]] {
            for k in order {
                let (setup, t) = [("host frames", 0), ("frames and a tier", tier)][k];
                eprintln!("compressed tier, {kind}, {setup}, in memory: a region of {}", ByteSize(small * ps));
                let sizes = (budget, host, t, small, ps);
                let how = (setup, Compression::Lz4, IN_MEMORY_WALKS, Mode::Write);
                runs[k].push(one(base, how, sizes, (kind, &data), dir)?);
            }
        }
        for mut two in runs {
            let b = two.pop().expect("two runs");
            in_memory.push(merged(two.pop().expect("two runs"), b));
        }
    }
    let mut md = format!(
        "\n## The compressed tier (lossless)\n\n- a region of {} = the GPU budget {} + 3x the {} of memory beside it, \
         written from the host (pages going down as it goes) and walked on gpu0 in order, 8 pages a lease; that \
         memory all host frames with the region stored as it is (the baseline), or half of it ({}) a compressed \
         tier with the region stored with the codec (half a tier), or the baseline's frames with a tier of that \
         size beside them (frames and a tier); all spill to a storage tier in `{}`; every page read back and \
         compared\n\n| data | memory | codec | pages held | into the tier | their bytes | packing s | write GB/s \
         | walk GB/s | read from storage |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        ByteSize(pages * ps),
        ByteSize(budget),
        ByteSize(host),
        ByteSize(tier),
        dir.display()
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} |",
            r.data,
            r.setup,
            r.codec,
            r.held,
            r.compressed,
            ByteSize(r.compressed_bytes),
            r.pack_seconds,
            r.write_gb_s,
            r.walk_gb_s,
            ByteSize(r.from_storage)
        );
    }
    let _ = writeln!(
        md,
        "\n| data | node | codec | pages held vs frames | into the tier: page bytes / their bytes | write vs frames \
         | walk vs frames |\n|---|---|---|---:|---:|---:|---:|"
    );
    for kind in rows.chunks(setups.len()) {
        let a = &kind[0];
        for b in &kind[1..] {
            let into = match b.compressed_bytes {
                0 => "-".to_owned(),
                n => format!("{:.2}", (b.compressed * ps) as f64 / n as f64),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.2}x | {into} | {:.2}x | {:.2}x |",
                a.data,
                b.setup,
                b.codec,
                b.held as f64 / a.held.max(1) as f64,
                b.write_gb_s / a.write_gb_s,
                b.walk_gb_s / a.walk_gb_s
            );
        }
    }
    let _ = writeln!(
        md,
        "\n### In memory: pages that never shrink\n\n- a region of {} = 3/5 of the GPU budget and the host frames \
         together, written as above and walked with write leases (every page leaves the GPU as a copy on every \
         walk), on the baseline beside frames and a tier, whose evictions to host memory probe each page for the \
         tier until its region's pages keep failing the probe (then one page in up to 1,025); each node run twice (the baseline first, then second), {} walks a run: the median walk, the \
         mean write\n\n| data | node | not probed | packing s | write GB/s | walk GB/s | read from storage | write \
         vs frames | walk vs frames |\n|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ByteSize(small * ps),
        IN_MEMORY_WALKS
    );
    for two in in_memory.chunks(2) {
        for r in two {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.3} | {:.2} | {:.2} | {} | {:.2}x | {:.2}x |",
                r.data,
                r.setup,
                r.skipped,
                r.pack_seconds,
                r.write_gb_s,
                r.walk_gb_s,
                ByteSize(r.from_storage),
                r.write_gb_s / two[0].write_gb_s,
                r.walk_gb_s / two[0].walk_gb_s
            );
        }
    }
    rows.extend(in_memory);
    Ok((rows, md))
}
