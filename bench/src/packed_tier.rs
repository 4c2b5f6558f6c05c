//! The packed tier part of `vfabric-bench lossy`: a lossy region larger than a GPU's budget and host memory
//! together, written from the host and then walked on the GPU in order, on two nodes alike but for how their
//! host memory keeps its packed pages: in whole frames of host memory (the baseline), or in the slots of a
//! packed tier of the same bytes. Both spill to a storage tier. Reports the pages host memory holds, the bytes
//! read from the storage tier, and the walk's GB/s of values, and checks sampled pages against their bound.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use vfabric::{ByteSize, ClusterConfig, FabricError, Mode, Placement};
use vfabric_allocator::{Compression, Element};
use vfabric_transport::device::lossy;
use vfabric_transport::Location;

use crate::compression;
use crate::tiers;

/// One node's walk.
#[derive(Debug, Clone, Serialize)]
pub struct TierRow {
    /// "host frames" or "packed tier".
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

/// The two walks and their Markdown.
pub struct TierPart {
    /// Host frames, then the packed tier.
    pub rows: Vec<TierRow>,
    /// The part's Markdown.
    pub markdown: String,
}

/// Writes, walks and checks the region on one node.
#[allow(clippy::too_many_arguments)]
fn one(
    base: &ClusterConfig,
    setup: &'static str,
    (budget, host, packed): (u64, u64, u64),
    ps: u64,
    c: Compression,
    values: &[u8],
    dir: &Path,
) -> Result<TierRow, String> {
    let e = |e: FabricError| format!("{setup}: {e}");
    let l = c.lossy().ok_or("not a lossy codec")?;
    let memory = host.max(packed);
    let pages = (budget + 2 * memory) / ps;
    // The storage tier holds every page, and room for evictions in flight.
    let f = tiers::fabric(base, (budget, host, packed), dir, (pages + budget / ps) * ps)?;
    let gpu = Location::Gpu(0);
    let r = f.alloc(pages * ps, Placement { device: Some(gpu), compression: c, ..Placement::default() }).map_err(e)?;
    let sample = values.len() as u64 / ps;
    let source = |p: u64| &values[((p % sample) * ps) as usize..((p % sample + 1) * ps) as usize];
    for p in 0..pages {
        f.write(&r, p * ps, source(p)).map_err(e)?;
    }
    let where_held = if packed > 0 { Location::Packed } else { Location::Host };
    let held = f.stats().directory.devices.iter().find(|d| d.location == where_held).map_or(0, |d| u64::from(d.used));
    let before = f.traffic();
    let t = Instant::now();
    // Leases of 8 pages, or a quarter of a small budget.
    let step = (budget / ps / 4).clamp(1, 8);
    for p in (0..pages).step_by(step as usize) {
        let end = (p + step).min(pages);
        let lease = f.acquire(&r, p * ps..end * ps, gpu, Mode::Read).map_err(e)?;
        f.release(lease).map_err(e)?;
    }
    let seconds = t.elapsed().as_secs_f64();
    let from_storage = f.traffic().since(&before).from_storage;
    let mut worst = 0f64;
    let mut back = vec![0u8; ps as usize];
    for p in (0..pages).step_by(((pages / 32).max(1)) as usize) {
        f.read(&r, p * ps, &mut back).map_err(e)?;
        worst = worst.max(lossy::worst_error(l, source(p), &back).0);
    }
    f.free(&r).map_err(e)?;
    Ok(TierRow {
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

/// Runs both nodes: a GPU budget of `budget` bytes and `host` bytes of host memory (whole frames, then a packed
/// tier of the same bytes beside a host memory of one page), pages of `ps`, fp8 codes of bf16 weights.
pub fn run(base: &ClusterConfig, budget: u64, host: u64, ps: u64, dir: &Path) -> Result<TierPart, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let c = Compression::Fp8Bf16;
    let kind = "bf16 weights, N(0, 0.02)";
    debug_assert!(c.lossy().is_some_and(|l| l.element == Element::Bf16));
    let values = compression::synthetic(kind, (64 * ps) as usize, 5);
    let mut rows = Vec::new();
    for (setup, sizes) in [("host frames", (budget, host, 0)), ("packed tier", (budget, ps, host))] {
        eprintln!(
            "{setup}: a lossy region of {} over a GPU budget of {}",
            ByteSize(budget + 2 * host),
            ByteSize(budget)
        );
        rows.push(one(base, setup, sizes, ps, c, &values, dir)?);
    }
    let mut md = String::new();
    let (frames, packed) = (&rows[0], &rows[1]);
    let _ = writeln!(
        md,
        "\n## The packed tier\n\n- a {c} region of {kind}, {} = the GPU budget {} + twice host memory's {}, written \
         from the host and walked on gpu0 in order, 8 pages a lease (fewer on a budget under 32 pages); host memory holds its packed pages in whole \
         frames (the baseline) or in the packed tier's slots of {}; both spill to a storage tier in `{}`; 32 pages \
         read back and checked against the bound\n",
        ByteSize(frames.pages * ps),
        ByteSize(budget),
        ByteSize(host),
        ByteSize(Location::Packed.frame_bytes(ps)),
        dir.display()
    );
    let _ = writeln!(
        md,
        "| host memory | pages held | per page of memory | read from storage | walk GB/s | worst / bound |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for r in &rows {
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
    let _ = writeln!(
        md,
        "\nthe packed tier over host frames: {:.2}x the pages held, {:.2}x the walk's speed",
        packed.held as f64 / frames.held.max(1) as f64,
        packed.walk_gb_s / frames.walk_gb_s
    );
    Ok(TierPart { rows, markdown: md })
}
