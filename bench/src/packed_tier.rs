//! The packed tier part of `vfabric-bench lossy`: a lossy region larger than a GPU's budget and host memory
//! together, written from the host and then walked on the GPU in order, on nodes alike but for how their host
//! memory keeps its packed pages: in whole frames of host memory (the baseline), in the slots of a packed tier
//! of bf16 pages (about half a page), or, for a region of fp32 values, in a tier of fp32 slots (about a quarter),
//! each of the same bytes. All spill to a storage tier. Reports the pages host memory holds, the bytes read from
//! the storage tier, and the walk's GB/s of values, and checks sampled pages against their bound.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use vfabric::{ByteSize, ClusterConfig, FabricError, Placement};
use vfabric_allocator::{Compression, Element};
use vfabric_transport::device::lossy;
use vfabric_transport::Location;

use crate::compression;
use crate::tiers;

/// One node's walk.
#[derive(Debug, Clone, Serialize)]
pub struct TierRow {
    /// The region's compression.
    pub codec: String,
    /// Where host memory holds its pages: "host frames", "bf16 slots" or "fp32 slots".
    pub setup: &'static str,
    /// Bytes of host memory holding the region's packed pages.
    pub host_bytes: u64,
    /// Pages host memory held once the region was written.
    pub held: u64,
    /// `held` over the pages `host_bytes` would hold as they are.
    pub held_per_page: f64,
    /// Pages of the region.
    pub pages: u64,
    /// Bytes read from the storage tier during the walk.
    pub from_storage: u64,
    /// Seconds the walk took.
    pub seconds: f64,
    /// Values walked per second, GB/s of page bytes.
    pub walk_gb_s: f64,
    /// The largest error of the sampled pages over its declared bound (at most 1 when the bound holds).
    pub worst_over_bound: f64,
}

/// Host reads and writes of a region whose pages sit in host memory.
#[derive(Debug, Clone, Serialize)]
pub struct HostReadRow {
    /// The lossy region's compression.
    pub codec: String,
    /// Bytes of each region read in one call.
    pub bytes: u64,
    /// A plain region's pages, in host frames: GB/s (the baseline).
    pub plain_gb_s: f64,
    /// The lossy region's pages, in its packed tier, expanded on the CPU: GB/s of values.
    pub lossy_gb_s: f64,
    /// Writing the plain region's pages again, in host frames: GB/s (the baseline).
    pub plain_write_gb_s: f64,
    /// Writing the lossy region's pages again, packed on the CPU into its packed tier: GB/s of values.
    pub lossy_write_gb_s: f64,
}

/// The walks and their Markdown.
pub struct TierPart {
    /// For each region: host frames, then the packed tiers.
    pub rows: Vec<TierRow>,
    /// Host reads of each lossy region beside a plain one.
    pub reads: Vec<HostReadRow>,
    /// The part's Markdown.
    pub markdown: String,
}

/// Writes, walks and checks the region on one node.
/// Writes, walks and checks a region of `pages` pages on a node with a GPU budget of `budget` bytes whose host
/// memory for the region (`memory` bytes) is whole frames (`held_in` host memory) or a packed tier's slots.
#[allow(clippy::too_many_arguments)]
fn one(
    base: &ClusterConfig,
    (setup, held_in): (&'static str, Location),
    (budget, memory, pages): (u64, u64, u64),
    ps: u64,
    c: Compression,
    values: &[u8],
    dir: &Path,
) -> Result<TierRow, String> {
    let e = |e: FabricError| format!("{c}, {setup}: {e}");
    let l = c.lossy().ok_or("not a lossy codec")?;
    // Host memory of one page beside a packed tier.
    let sizes = match held_in {
        Location::Packed(element) => tiers::Memory { budget, host: ps, packed: Some((element, memory)) },
        _ => tiers::Memory { budget, host: memory, packed: None },
    };
    // The storage tier holds every page, and room for evictions in flight.
    let f = tiers::fabric(base, sizes, dir, (pages + budget / ps) * ps)?;
    let gpu = Location::Gpu(0);
    let r = f.alloc(pages * ps, Placement { device: Some(gpu), compression: c, ..Placement::default() }).map_err(e)?;
    let sample = values.len() as u64 / ps;
    let source = |p: u64| &values[((p % sample) * ps) as usize..((p % sample + 1) * ps) as usize];
    for p in 0..pages {
        f.write(&r, p * ps, source(p)).map_err(e)?;
    }
    let held = f.stats().directory.devices.iter().find(|d| d.location == held_in).map_or(0, |d| u64::from(d.used));
    let (seconds, from_storage) = tiers::walk_leases(&f, &r, pages, budget, vfabric::Mode::Read).map_err(e)?;
    let mut worst = 0f64;
    let mut back = vec![0u8; ps as usize];
    for p in (0..pages).step_by(((pages / 32).max(1)) as usize) {
        f.read(&r, p * ps, &mut back).map_err(e)?;
        worst = worst.max(lossy::worst_error(l, source(p), &back).0);
    }
    f.free(&r).map_err(e)?;
    Ok(TierRow {
        codec: c.to_string(),
        setup,
        host_bytes: memory,
        held,
        held_per_page: held as f64 / (memory / ps) as f64,
        pages,
        from_storage,
        seconds,
        walk_gb_s: (pages * ps) as f64 / seconds / 1e9,
        worst_over_bound: worst,
    })
}

/// The regions walked: fp8 codes of bf16 weights, then of fp32 Adam moments; each region holds the GPU's budget
/// and this many times host memory's bytes (more than the tier of its values' slots holds).
const REGIONS: [(Compression, &str, u64); 2] = [
    (Compression::Fp8Bf16, "bf16 weights, N(0, 0.02)", 2),
    (Compression::Fp8F32, "fp32 Adam first moment, N(0, 1e-4)", 5),
];

/// Runs every node: a GPU budget of `budget` bytes and `host` bytes of host memory for the region (whole
/// frames, or a packed tier of the same bytes beside a host memory of one page), pages of `ps`.
pub fn run(base: &ClusterConfig, budget: u64, host: u64, ps: u64, dir: &Path) -> Result<TierPart, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut rows = Vec::new();
    let mut md = String::from("\n## The packed tiers\n");
    for (i, (c, kind, times)) in REGIONS.into_iter().enumerate() {
        let element = c.lossy().map_or(Element::Bf16, |l| l.element);
        let values = compression::synthetic(kind, (64 * ps) as usize, 5 + i as u64);
        let pages = (budget + times * host) / ps;
        let mut setups = vec![("host frames", Location::Host), ("bf16 slots", Location::Packed(Element::Bf16))];
        if element == Element::F32 {
            setups.push(("fp32 slots", Location::Packed(Element::F32)));
        }
        let at = rows.len();
        for setup in setups {
            eprintln!(
                "{c}, {}: a region of {} over a GPU budget of {}",
                setup.0,
                ByteSize(pages * ps),
                ByteSize(budget)
            );
            rows.push(one(base, setup, (budget, host, pages), ps, c, &values, dir)?);
        }
        section(&mut md, (c, kind), (budget, host, pages, ps), dir, &rows[at..]);
    }
    // Host reads of a region of a quarter of host memory's bytes, at most 1 GiB, at least 32 pages (its own
    // node's host memory and packed tier hold it whole).
    let bytes = (host / 4).min(1 << 30).max(32 * ps) / ps * ps;
    let mut reads = Vec::new();
    for (i, (c, kind, _)) in REGIONS.into_iter().enumerate() {
        let values = compression::synthetic(kind, (64 * ps) as usize, 5 + i as u64);
        reads.push(host_reads(base, (ps, bytes), c, &values, dir)?);
    }
    let _ = writeln!(
        md,
        "\n### Host reads and writes of pages in host memory\n\n- a region of {} written from the host over a GPU \
         budget of 4 pages, then read whole in one call and written whole again in one call (best of 3 each): a \
         plain region in host frames (the baseline) beside a lossy one in its packed tier, expanded and packed on \
         the CPU on up to 8 threads\n\n| codec | read: plain GB/s | lossy GB/s | lossy / plain | write: plain GB/s \
         | lossy GB/s | lossy / plain |\n|---|---:|---:|---:|---:|---:|---:|",
        ByteSize(bytes)
    );
    for r in &reads {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.codec,
            r.plain_gb_s,
            r.lossy_gb_s,
            r.lossy_gb_s / r.plain_gb_s,
            r.plain_write_gb_s,
            r.lossy_write_gb_s,
            r.lossy_write_gb_s / r.plain_write_gb_s
        );
    }
    Ok(TierPart { rows, reads, markdown: md })
}

/// Reads a region of `bytes` held in host memory in one call and writes it again in one call (best of 3 each),
/// plain and stored with `c`: GB/s.
fn host_reads(
    base: &ClusterConfig,
    (ps, bytes): (u64, u64),
    c: Compression,
    values: &[u8],
    dir: &Path,
) -> Result<HostReadRow, String> {
    let l = c.lossy().ok_or("not a lossy codec")?;
    let e = |e: FabricError| format!("host reads, {c}: {e}");
    let slots = bytes / ps + 8;
    let packed = slots * Location::Packed(l.element).frame_bytes(ps);
    let memory = tiers::Memory { budget: 4 * ps, host: bytes + 8 * ps, packed: Some((l.element, packed)) };
    let f = tiers::fabric(base, memory, dir, 8 * ps)?;
    let mut gb_s = Vec::new();
    for compression in [Compression::None, c] {
        let placement = Placement { device: Some(Location::Gpu(0)), compression, ..Placement::default() };
        let r = f.alloc(bytes, placement).map_err(e)?;
        let sample = values.len() as u64 / ps;
        for p in 0..bytes / ps {
            let at = ((p % sample) * ps) as usize;
            f.write(&r, p * ps, &values[at..at + ps as usize]).map_err(e)?;
        }
        let mut back = vec![0u8; bytes as usize];
        let best_of_3 = |call: &mut dyn FnMut() -> Result<(), FabricError>| -> Result<f64, String> {
            let mut best = f64::INFINITY;
            for _ in 0..3 {
                let t = Instant::now();
                call().map_err(e)?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            Ok(best)
        };
        let read = best_of_3(&mut || f.read(&r, 0, &mut back))?;
        // The same values written again in one call, into the pages where they are now.
        let again = back.clone();
        let write = best_of_3(&mut || f.write(&r, 0, &again))?;
        if compression == c && lossy::worst_error(l, &values[..ps as usize], &back[..ps as usize]).0 > 1.0 {
            return Err(format!("host reads, {c}: a value broke its bound"));
        }
        f.free(&r).map_err(e)?;
        gb_s.push((bytes as f64 / read / 1e9, bytes as f64 / write / 1e9));
    }
    Ok(HostReadRow {
        codec: c.to_string(),
        bytes,
        plain_gb_s: gb_s[0].0,
        lossy_gb_s: gb_s[1].0,
        plain_write_gb_s: gb_s[0].1,
        lossy_write_gb_s: gb_s[1].1,
    })
}

/// The Markdown of one region's walks.
fn section(md: &mut String, (c, kind): (Compression, &str), sizes: (u64, u64, u64, u64), dir: &Path, rows: &[TierRow]) {
    let (budget, host, pages, ps) = sizes;
    let slots: Vec<String> = [Element::Bf16, Element::F32]
        .into_iter()
        .map(|e| format!("{}", ByteSize(Location::Packed(e).frame_bytes(ps))))
        .collect();
    let _ = writeln!(
        md,
        "\n### {c}: {kind}\n\n- a region of {} = the GPU budget {} + {}x host memory's {}, written from the host and \
         walked on gpu0 in order, 8 pages a lease (fewer on a budget under 32 pages); host memory holds its packed \
         pages in whole frames (the baseline) or in a packed tier's slots (bf16 slots of {}, fp32 slots of {}); all \
         spill to a storage tier in `{}`; 32 pages read back and checked against the bound\n",
        ByteSize(pages * ps),
        ByteSize(budget),
        (pages * ps - budget) / host,
        ByteSize(host),
        slots[0],
        slots[1],
        dir.display()
    );
    let _ = writeln!(
        md,
        "| host memory | pages held | per page of memory | read from storage | walk GB/s | worst / bound |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {} | {:.2} | {:.3} |",
            r.setup,
            r.held,
            r.held_per_page,
            ByteSize(r.from_storage),
            r.walk_gb_s,
            r.worst_over_bound
        );
    }
    let frames = &rows[0];
    for r in &rows[1..] {
        let _ = writeln!(
            md,
            "\n{} over host frames: {:.2}x the pages held, {:.2}x the walk's speed",
            r.setup,
            r.held as f64 / frames.held.max(1) as f64,
            r.walk_gb_s / frames.walk_gb_s
        );
    }
}
