//! The three-tier walks of `vfabric-bench pager`: a region several times the GPU budget and host memory
//! together, so that its pages live on the storage tier and come up through host memory as the walk reaches
//! them (prefetched ahead of it in order), beside the storage tier's raw reads of the same number of pages on
//! the same drive in the same run: the slowest tier's ceiling. Each walk reports its GB/s per tier (onto the
//! GPU, from and to the storage tier, by the fabric's counters), the bytes the kernel says were read from the
//! drive, and its ratios to the ceiling: of the whole walk (pages served by the GPU and host memory too), and of
//! the drive's bytes alone, the one that says how close the walk came to the drive.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use serde_json::json;
use vfabric::config::StorageSection;
use vfabric::{ByteSize, ClusterConfig, Fabric, FabricError, Mode, Placement};
use vfabric_allocator::Element;
use vfabric_transport::storage::{AlignedBuffer, Compression, StorageFile, StorageSpec};
use vfabric_transport::{Backend, Location};

use crate::walk::{drive_io, drive_since, populate, walk, WalkRow};

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
/// untimed): GB/s, and the bytes the kernel says were read from the drive meanwhile (none where it does not say).
fn raw_reads(dir: &Path, pages: u64, page_size: u64, batch: u64, depth: u32) -> Result<(f64, Option<u64>), String> {
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
    let drive_before = drive_io();
    let t = Instant::now();
    for call in &calls {
        let mut p: Vec<(u64, &mut [u8])> = call.iter().copied().zip(buf.chunks_mut(page_size as usize)).collect();
        tier.read(&mut p).map_err(|e| e.to_string())?;
    }
    let gb_s = (pages * page_size) as f64 / t.elapsed().as_secs_f64() / 1e9;
    Ok((gb_s, drive_since(drive_before, drive_io()).0))
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
    let (raw, raw_drive) = raw_reads(dir, region_bytes / ps, ps, 64, depth)?;
    let raw_bytes = region_bytes / ps * ps;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n## Three tiers\n\n- region {} = {} x the GPU budget, host memory {}, {} of it on the storage tier after writing (in `{}`, depth {depth}); the storage tier's own reads of {} pages in order, 64 a call, in the same run: **{raw:.2} GB/s** (the ceiling; the kernel counted {} read from the drive for its {})",
        ByteSize(region_bytes),
        args.oversub,
        ByteSize(host),
        ByteSize(stored),
        dir.display(),
        region_bytes / ps,
        raw_drive.map_or("nothing".to_string(), |b| ByteSize(b).to_string()),
        ByteSize(raw_bytes)
    );
    let _ = writeln!(md, "- GB/s are bytes over the walk's time: walked; fetched onto the GPU (from host memory); read from and written to the storage tier (the fabric's counters); \"read from drive\" is what the kernel counted (`/proc/self/io`); \"walk / raw\" compares the walk's GB/s to the ceiling, \"drive / raw\" the drive's bytes alone\n");
    let _ = writeln!(md, "| order | pages/step | walk GB/s | onto GPU GB/s | storage read GB/s | storage write GB/s | from storage | read from drive | prefetched | walk / raw | drive / raw | share in acquire | bad pages |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut walks = Vec::new();
    for w in &rows {
        let drive_gb_s = w.drive_read.map(|b| b as f64 / w.seconds / 1e9);
        let (walk_to_raw, drive_to_raw) = (w.walk_gb_s / raw, drive_gb_s.map(|g| g / raw));
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {:.2} | {} | {:.0}% | {} |",
            w.order,
            w.chunk,
            w.walk_gb_s,
            w.to_gpu_gb_s,
            w.from_storage_gb_s,
            w.to_storage_gb_s,
            ByteSize(w.from_storage),
            w.drive_read.map_or("n/a".to_string(), |b| ByteSize(b).to_string()),
            ByteSize(w.prefetched),
            walk_to_raw,
            drive_to_raw.map_or("n/a".to_string(), |r| format!("{r:.2}")),
            w.acquire_share * 100.0,
            w.bad_pages
        );
        let mut j = serde_json::to_value(w).map_err(|e| e.to_string())?;
        if let Some(o) = j.as_object_mut() {
            o.insert("drive_read_gb_s".into(), json!(drive_gb_s));
            o.insert("walk_to_raw".into(), json!(walk_to_raw));
            o.insert("drive_to_raw".into(), json!(drive_to_raw));
        }
        walks.push(j);
    }
    let json = json!({
        "region_bytes": region_bytes, "host_bytes": host, "stored_bytes": stored, "depth": depth,
        "raw_storage_read_gb_s": raw, "raw_read_bytes": raw_bytes, "raw_drive_read_bytes": raw_drive,
        "walks": walks,
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
