//! The three-tier walks of `vfabric-bench pager`: a region several times the GPU budget and host memory
//! together, so that its pages live on the storage tier and come up through host memory as the walk reaches
//! them (prefetched ahead of it in order), beside the storage tier's raw reads of the same number of pages on
//! the same drive in the same run: the slowest tier's ceiling.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use serde_json::json;
use vfabric::config::StorageSection;
use vfabric::{ByteSize, ClusterConfig, Fabric, FabricError, Mode, Placement};
use vfabric_allocator::Element;
use vfabric_transport::storage::{AlignedBuffer, Compression, StorageFile, StorageSpec};
use vfabric_transport::{Backend, Location};

use crate::walk::{populate, walk, WalkRow};

/// What the three-tier walks are over.
pub struct TierOptions {
    /// The region as a multiple of the GPU budget.
    pub oversub: u64,
    /// Host memory as a multiple of the GPU budget.
    pub host: u64,
    /// Pages per step of each walk.
    pub chunks: Vec<u64>,
}

/// The three-tier walks and their ceiling.
pub struct Tiers {
    /// One row per walk ("three tiers").
    pub rows: Vec<WalkRow>,
    /// The JSON of the part.
    pub json: serde_json::Value,
    /// The Markdown of the part.
    pub markdown: String,
}

/// The memory of a bench's node.
pub(crate) struct Memory {
    /// Bytes of GPU 0.
    pub budget: u64,
    /// Bytes of host memory.
    pub host: u64,
    /// A packed tier: the values its slots are sized for, and its bytes.
    pub packed: Option<(Element, u64)>,
}

/// A fabric on GPU 0 alone (whatever GPUs the configuration's node names), with `memory`'s bytes of it, of host
/// memory and of a packed tier, and a storage tier of `storage` bytes in `dir`.
pub(crate) fn fabric(base: &ClusterConfig, memory: Memory, dir: &Path, storage: u64) -> Result<Fabric, String> {
    let mut cfg = base.clone();
    if let Some(n) = cfg.nodes.first_mut() {
        n.gpus = Some(vec![0]);
    }
    let Memory { budget, host, packed } = memory;
    cfg.memory.gpu_budget = Some(ByteSize(budget));
    cfg.memory.host_arena = ByteSize(host);
    match packed {
        Some((Element::Bf16, bytes)) => cfg.memory.packed_arena = ByteSize(bytes),
        Some((Element::F32, bytes)) => cfg.memory.packed_f32_arena = ByteSize(bytes),
        None => {}
    }
    if cfg.device.backend != Backend::Cuda {
        cfg.device.emulated_gpu_memory = ByteSize(cfg.device.emulated_gpu_memory.bytes().max(budget * 2));
    }
    let depth = cfg.storage.as_ref().map_or(64, |s| s.depth);
    cfg.storage = Some(StorageSection { path: dir.join("vfabric-pager-bench.tier"), size: ByteSize(storage), depth });
    Fabric::embedded(&cfg).map_err(|e| e.to_string())
}

/// The storage tier's own reads of `pages` pages in order, `batch` a call, at `depth` (after writing them,
/// untimed): GB/s.
fn raw_reads(dir: &Path, pages: u64, page_size: u64, batch: u64, depth: u32) -> Result<f64, String> {
    let spec = StorageSpec { path: dir.join("vfabric-pager-raw.tier"), bytes: pages * page_size, page_size, depth };
    let tier = StorageFile::create(&spec).map_err(|e| e.to_string())?;
    let mut buf = AlignedBuffer::new((batch * page_size) as usize).ok_or("no memory for the raw reads")?;
    let data = vfabric::pattern::bytes(3, 0, buf.len());
    buf.copy_from_slice(&data);
    let calls: Vec<Vec<u64>> = (0..pages).collect::<Vec<_>>().chunks(batch as usize).map(<[u64]>::to_vec).collect();
    for call in &calls {
        let p: Vec<(u64, &[u8])> = call
            .iter()
            .enumerate()
            .map(|(k, &s)| (s, &buf[k * page_size as usize..(k + 1) * page_size as usize]))
            .collect();
        tier.write(&p, Compression::None).map_err(|e| e.to_string())?;
    }
    let t = Instant::now();
    for call in &calls {
        let mut p: Vec<(u64, &mut [u8])> = call.iter().copied().zip(buf.chunks_mut(page_size as usize)).collect();
        tier.read(&mut p).map_err(|e| e.to_string())?;
    }
    Ok((pages * page_size) as f64 / t.elapsed().as_secs_f64() / 1e9)
}

/// Runs the three-tier walks of `args` over a GPU budget of `budget` bytes in pages of `ps`.
pub fn run(base: &ClusterConfig, args: &TierOptions, dir: &Path, budget: u64, ps: u64) -> Result<Tiers, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let region_bytes = budget * args.oversub.max(1);
    let host = budget * args.host.max(1);
    // Room on the drive for every page, and some to spare for evictions in flight.
    let storage = region_bytes + budget;
    let depth = base.storage.as_ref().map_or(64, |s| s.depth);
    eprintln!(
        "three tiers: a {} region over a GPU budget of {}, {} of host memory, the rest on storage in {}",
        ByteSize(region_bytes),
        ByteSize(budget),
        ByteSize(host),
        dir.display()
    );
    let f = fabric(base, Memory { budget, host, packed: None }, dir, storage)?;
    let r = f.alloc(region_bytes, Placement::on(Location::Gpu(0))).map_err(|e| e.to_string())?;
    let hashes = populate(&f, &r, 91)?;
    let stored = f.stats().storage.map_or(0, |s| s.page_bytes);
    let mut rows = Vec::new();
    for &chunk in &args.chunks {
        for random in [false, true] {
            rows.push(walk(&f, &r, &hashes, chunk, random, "three tiers")?);
        }
    }
    drop(f);
    let raw = raw_reads(dir, region_bytes / ps, ps, 64, depth)?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n## Three tiers\n\n- region {} = {} x the GPU budget, host memory {}, {} of it on the storage tier after writing (in `{}`, depth {depth}); the storage tier's own reads of {} pages in order, 64 a call, in the same run: **{raw:.2} GB/s** (the ceiling)\n",
        ByteSize(region_bytes),
        args.oversub,
        ByteSize(host),
        ByteSize(stored),
        dir.display(),
        region_bytes / ps
    );
    let _ = writeln!(md, "| order | pages/step | walk GB/s | / storage reads | from storage | prefetched | to storage | share in acquire | bad pages |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for w in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {} | {} | {} | {:.0}% | {} |",
            w.order,
            w.chunk,
            w.walk_gb_s,
            w.walk_gb_s / raw,
            ByteSize(w.from_storage),
            ByteSize(w.prefetched),
            ByteSize(w.to_storage),
            w.acquire_share * 100.0,
            w.bad_pages
        );
    }
    let json = json!({
        "region_bytes": region_bytes, "host_bytes": host, "stored_bytes": stored, "depth": depth,
        "raw_storage_read_gb_s": raw, "walks": rows,
    });
    Ok(Tiers { rows, json, markdown: md })
}

/// Walks `pages` pages of `r` on GPU 0 in order, a lease in `mode` of 8 pages at a time (a quarter of a budget
/// of `budget` bytes when that is less), released at once: the seconds it took and the bytes read from the
/// storage tier meanwhile. (A read lease leaves the page's copy in host memory where it has one, so its eviction
/// from the GPU is a drop; a write lease makes the GPU's copy the only one, so its eviction is a copy.)
pub(crate) fn walk_leases(
    f: &Fabric,
    r: &vfabric::Region,
    pages: u64,
    budget: u64,
    mode: Mode,
) -> Result<(f64, u64), FabricError> {
    let ps = f.page_size();
    let before = f.traffic();
    let t = Instant::now();
    let step = (budget / ps / 4).clamp(1, 8);
    for p in (0..pages).step_by(step as usize) {
        let end = (p + step).min(pages);
        let lease = f.acquire(r, p * ps..end * ps, Location::Gpu(0), mode)?;
        f.release(lease)?;
    }
    Ok((t.elapsed().as_secs_f64(), f.traffic().since(&before).from_storage))
}
