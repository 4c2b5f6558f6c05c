//! The compressed tier part of `vfabric-bench lossy` (the lossless side of the compression module): a region
//! stored with LZ4, larger than a GPU's budget and host memory together, written from the host and walked on the
//! GPU in order, on two nodes of the same memory: one whose host memory is all whole frames and whose region is
//! stored as it is (the baseline), one with part of that memory as a compressed tier. Per kind of data (random
//! bytes, which never shrink; bf16 weights; GELU activations; sparse pages): the pages memory holds, the write's
//! and the walk's GB/s, and the bytes read from the storage tier. Every page is checked after the walk.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use vfabric::{ByteSize, ClusterConfig, Compression, FabricError, Placement};
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
    /// Pages of the region.
    pub pages: u64,
    /// Pages host memory and the compressed tier held once the region was written.
    pub held: u64,
    /// Pages moved into the compressed tier, and the bytes they take there.
    pub compressed: u64,
    pub compressed_bytes: u64,
    /// Seconds callers waited for packing (and the evictions that made room in the tier), writing and walking.
    pub pack_seconds: f64,
    /// GB/s of the write from the host (pages going down through the tiers as it goes).
    pub write_gb_s: f64,
    /// GB/s of the walk on the GPU.
    pub walk_gb_s: f64,
    /// Bytes read from the storage tier during the walk.
    pub from_storage: u64,
}

/// The kinds of data walked.
const KINDS: [&str; 4] = [
    "random bytes",
    "bf16 weights, N(0, 0.02)",
    "bf16 activations, GELU(N(0, 1))",
    "sparse: zeros, a number every 4 KiB",
];

/// Writes, walks and checks a region of `pages` pages of `data` on a node with a GPU budget of `budget`, `frames`
/// bytes of host frames and a compressed tier of `tier` bytes (none when 0, and the region stored as it is).
fn one(
    base: &ClusterConfig,
    setup: &'static str,
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
    let compression = if tier > 0 { Compression::Lz4 } else { Compression::None };
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
    let (walk_s, from_storage) = tiers::walk_leases(&f, &r, pages, budget).map_err(e)?;
    let pack_seconds = f.stats().stalls.since(&stalls).pack_ns as f64 / 1e9;
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
        pages,
        held,
        compressed: wrote.compressed / ps,
        compressed_bytes: wrote.compressed_bytes,
        pack_seconds,
        write_gb_s: (pages * ps) as f64 / write_s / 1e9,
        walk_gb_s: (pages * ps) as f64 / walk_s / 1e9,
        from_storage,
    })
}

/// Runs the three nodes over every kind: a GPU budget of `budget` and `host` bytes of host frames (the
/// baseline); the same memory, half of it a compressed tier; the baseline's frames and a tier of half their
/// bytes beside them (for pages that never shrink, what packing costs). The region is the budget and three
/// times `host`.
pub fn run(
    base: &ClusterConfig,
    budget: u64,
    host: u64,
    ps: u64,
    dir: &Path,
) -> Result<(Vec<CompressedRow>, String), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let pages = (budget + 3 * host) / ps;
    let tier = host / 2 / ps * ps;
    let mut rows = Vec::new();
    for (i, kind) in KINDS.into_iter().enumerate() {
        let data = compression::synthetic(kind, (64 * ps) as usize, 31 + i as u64);
        for (setup, frames, t) in
            [("host frames", host, 0), ("half a tier", host - tier, tier), ("frames and a tier", host, tier)]
        {
            eprintln!("compressed tier, {kind}, {setup}: a region of {}", ByteSize(pages * ps));
            rows.push(one(base, setup, (budget, frames, t, pages, ps), (kind, &data), dir)?);
        }
    }
    // In memory: a region the GPU and the baseline's frames hold together below their watermarks, so that no
    // storage I/O blurs what packing costs pages that never shrink (each probed as it arrives in host memory,
    // then left in its frame).
    let small = (budget + host) * 3 / 5 / ps;
    let mut in_memory = Vec::new();
    for (i, kind) in KINDS[..2].iter().enumerate() {
        let data = compression::synthetic(kind, (64 * ps) as usize, 41 + i as u64);
        for (setup, t) in [("host frames", 0), ("frames and a tier", tier)] {
            eprintln!("compressed tier, {kind}, {setup}, in memory: a region of {}", ByteSize(small * ps));
            in_memory.push(one(base, setup, (budget, host, t, small, ps), (kind, &data), dir)?);
        }
    }
    let mut md = format!(
        "\n## The compressed tier (lossless)\n\n- a region of {} = the GPU budget {} + 3x the {} of memory beside it, \
         written from the host (pages going down as it goes) and walked on gpu0 in order, 8 pages a lease; that \
         memory all host frames with the region stored as it is (the baseline), or half of it ({}) a compressed \
         tier with the region stored with LZ4 (half a tier), or the baseline's frames with a tier of that size \
         beside them (frames and a tier); all spill to a storage tier in `{}`; every page read back and \
         compared\n\n| data | memory | pages held | into the tier | their bytes | packing s | write GB/s | walk GB/s \
         | read from storage |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        ByteSize(pages * ps),
        ByteSize(budget),
        ByteSize(host),
        ByteSize(tier),
        dir.display()
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} |",
            r.data,
            r.setup,
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
        "\n| data | node | pages held vs frames | write vs frames | walk vs frames |\n|---|---|---:|---:|---:|"
    );
    for three in rows.chunks(3) {
        let a = &three[0];
        for b in &three[1..] {
            let _ = writeln!(
                md,
                "| {} | {} | {:.2}x | {:.2}x | {:.2}x |",
                a.data,
                b.setup,
                b.held as f64 / a.held.max(1) as f64,
                b.write_gb_s / a.write_gb_s,
                b.walk_gb_s / a.walk_gb_s
            );
        }
    }
    let _ = writeln!(
        md,
        "\n### In memory: pages that never shrink\n\n- a region of {} = 3/5 of the GPU budget and the host frames \
         together, written and walked as above, on the baseline beside frames and a tier, whose evictions to host \
         memory probe each page for the tier\n\n| data | node | packing s | write GB/s | walk GB/s | read from \
         storage | write vs frames | walk vs frames |\n|---|---|---:|---:|---:|---:|---:|---:|",
        ByteSize(small * ps)
    );
    for two in in_memory.chunks(2) {
        for r in two {
            let _ = writeln!(
                md,
                "| {} | {} | {:.3} | {:.2} | {:.2} | {} | {:.2}x | {:.2}x |",
                r.data,
                r.setup,
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
