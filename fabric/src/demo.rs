//! `vfabric demo`: the README's first command.
//!
//! Runs the embedded fabric on this node's GPUs (or the emulated device, saying so): allocates a region half as
//! large again as GPU 0's arena, writes it (the GPU fills up and pages spill to host memory), reads it back,
//! acquires it piece by piece on GPU 0 (fetching evicted pages, evicting others), migrates it to GPU 1, writes
//! through a lease there, and verifies every byte after every step, on the device copies the leases point to as
//! well as through host reads. Then, with a storage tier (the configuration's, or a file it makes in the working
//! or temporary directory), a region larger than the GPU and host memory together goes down to the storage tier
//! as it is written and comes back to the GPU through host memory, verified the same way; one page of it is
//! followed on the way (where its copies are, as the directory says, and every copy's bytes read back). Prints
//! a table of what moved where and how fast.

use std::io::Write;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use vfabric_transport::{DeviceKind, Location};
use xxhash_rust::xxh3::xxh3_64;

use crate::config::{ClusterConfig, StorageSection};
use crate::error::FabricError;
use crate::fabric::{Fabric, Lease, Region, Traffic};
use crate::pattern;
use crate::units::ByteSize;
use crate::{Mode, Placement};

/// What the demo did, step by step.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The device layer it ran on.
    pub device: DeviceKind,
    /// Bytes in the region.
    pub region_bytes: u64,
    /// One row per step.
    pub steps: Vec<DemoStep>,
    /// The page of the three-tier region the demo followed (without a storage tier, none).
    pub trail: Option<PageTrail>,
}

/// One page followed through the three-tier steps: where its copies were each time they changed, and at the
/// end of each step.
#[derive(Debug, Clone)]
pub struct PageTrail {
    /// The region.
    pub region: Region,
    /// The page's index in it.
    pub page: u64,
    /// The xxh3 of the bytes written to it.
    pub hash: u64,
    /// What the directory said, in order.
    pub sightings: Vec<Sighting>,
}

/// Where a followed page's copies were at one moment.
#[derive(Debug, Clone)]
pub struct Sighting {
    /// When ("writing the region, after 16MiB").
    pub when: String,
    /// The locations of its copies, the owner's first (as [`Fabric::page_copies`] lists them).
    pub copies: Vec<Location>,
    /// Whether every copy, read back where it is, hashed to the page's hash (and it had one).
    pub verified: bool,
}

impl PageTrail {
    /// The places the page went through, by its nearest copy (a GPU's before host memory's before the storage
    /// tier's): one entry per change.
    pub fn path(&self) -> Vec<Location> {
        let mut path: Vec<Location> = Vec::new();
        for s in &self.sightings {
            let Some(&here) = s.copies.iter().min_by_key(|l| tier_rank(**l)) else { continue };
            if path.last() != Some(&here) {
                path.push(here);
            }
        }
        path
    }

    /// Whether every sighting found every copy of the page with the bytes written to it.
    pub fn verified(&self) -> bool {
        !self.sightings.is_empty() && self.sightings.iter().all(|s| s.verified)
    }

    /// Looks where the page's copies are now and reads each back; records a sighting when they moved since
    /// the last one, or always with `step_end`. Counts no traffic and moves nothing.
    fn look(&mut self, fabric: &Fabric, when: impl FnOnce() -> String, step_end: bool) -> Result<(), FabricError> {
        let offset = self.page * fabric.page_size();
        let copies = fabric.page_copies(&self.region, offset)?;
        if !step_end && self.sightings.last().is_some_and(|s| s.copies == copies) {
            return Ok(());
        }
        let mut buf = vec![0u8; fabric.page_size() as usize];
        let mut verified = !copies.is_empty();
        for &at in &copies {
            fabric.read_copy(&self.region, offset, at, &mut buf)?;
            verified &= xxh3_64(&buf) == self.hash;
        }
        self.sightings.push(Sighting { when: when(), copies, verified });
        Ok(())
    }

    fn print(&self, out: &mut dyn Write) {
        let _ = writeln!(
            out,
            "\nfollowing page {} of region {} (every copy read back where it is):",
            self.page, self.region
        );
        for s in &self.sightings {
            let check = if s.verified { format!("xxh3 {:#018x}", self.hash) } else { "WRONG BYTES".to_string() };
            let _ = writeln!(out, "  {:<38} {:<22} {check}", s.when, copies_text(&s.copies));
        }
        let path = self.path().iter().map(ToString::to_string).collect::<Vec<_>>().join(" -> ");
        let verdict = if self.verified() {
            format!("xxh3 {:#018x} at every step, verified", self.hash)
        } else {
            "DATA MISMATCH: see above".to_string()
        };
        let _ = writeln!(out, "page {} of region {}: {path}, {verdict}", self.page, self.region);
    }
}

/// How far a tier is from a kernel: GPUs, then host memory (plain, compressed or packed), then storage.
fn tier_rank(l: Location) -> u8 {
    match l {
        Location::Gpu(_) => 0,
        Location::Storage => 2,
        _ => 1,
    }
}

/// "gpu0", "gpu0 + host + storage" (nearest first), or "nowhere" for a page without a copy.
fn copies_text(copies: &[Location]) -> String {
    if copies.is_empty() {
        return "nowhere".to_string();
    }
    let mut sorted = copies.to_vec();
    sorted.sort_by_key(|l| tier_rank(*l));
    sorted.iter().map(ToString::to_string).collect::<Vec<_>>().join(" + ")
}

/// One step.
#[derive(Debug, Clone)]
pub struct DemoStep {
    /// What the step did.
    pub what: String,
    /// Bytes the fabric moved during it, by kind.
    pub traffic: Traffic,
    /// Wall time of the step's fabric calls (verification not included), seconds.
    pub seconds: f64,
    /// Bytes the step handled (written, read, acquired, migrated).
    pub bytes: u64,
    /// Pages checked after it, and how many matched.
    pub checked: (u64, u64),
}

impl DemoReport {
    /// Whether every check of every step matched, the followed page's too.
    pub fn all_verified(&self) -> bool {
        self.steps.iter().all(|s| s.checked.0 == s.checked.1) && self.trail.as_ref().is_none_or(PageTrail::verified)
    }
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let b = ProgressBar::new(len);
    b.set_style(
        ProgressStyle::with_template("  {msg:<34} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    b.set_message(what.to_string());
    b
}

/// The demo's data and its page hashes, version by version.
struct Truth {
    page: u64,
    hashes: Vec<u64>,
}

impl Truth {
    fn bytes(&self, seed: u64, offset: u64, len: usize) -> Vec<u8> {
        pattern::bytes(seed, offset, len)
    }
}

/// Checks the device copies under a lease against the expected page hashes.
fn check_lease(lease: &Lease, truth: &Truth) -> Result<(u64, u64), FabricError> {
    let first = lease.offset() / truth.page;
    let mut buf = vec![0u8; truth.page as usize];
    let mut ok = 0;
    let pages = lease.pages();
    for i in 0..lease.frames().len() {
        pages.read(i as u64 * truth.page, &mut buf)?;
        if xxh3_64(&buf) == truth.hashes[first as usize + i] {
            ok += 1;
        }
    }
    Ok((lease.frames().len() as u64, ok))
}

/// Reads the whole region through the fabric (host reads) and checks every page.
fn check_region(fabric: &Fabric, region: &Region, truth: &Truth) -> Result<(u64, u64), FabricError> {
    let mut buf = vec![0u8; truth.page as usize];
    let mut ok = 0;
    let pages = region.len / truth.page;
    for p in 0..pages {
        fabric.read(region, p * truth.page, &mut buf)?;
        if xxh3_64(&buf) == truth.hashes[p as usize] {
            ok += 1;
        }
    }
    Ok((pages, ok))
}

/// Writes the region from host buffers of the pattern `seed`, `chunk` bytes a call, recording each page's hash.
fn write_region(
    fabric: &Fabric,
    region: &Region,
    truth: &mut Truth,
    seed: u64,
    what: String,
    mut follow: Option<&mut PageTrail>,
) -> Result<DemoStep, FabricError> {
    let page = truth.page;
    let pages = region.len / page;
    let chunk_pages = (16u64 << 20).div_ceil(page).max(1);
    truth.hashes.clear();
    let t0 = fabric.traffic();
    let mut busy = 0.0;
    let b = bar(pages, &format!("writing {}", ByteSize(region.len)));
    let mut p = 0;
    while p < pages {
        let n = chunk_pages.min(pages - p);
        let data = truth.bytes(seed, p * page, (n * page) as usize);
        truth.hashes.extend(data.chunks_exact(page as usize).map(xxh3_64));
        let t = Instant::now();
        fabric.write(region, p * page, &data)?;
        busy += t.elapsed().as_secs_f64();
        p += n;
        b.inc(n);
        if let Some(f) = follow.as_deref_mut().filter(|f| f.page < p) {
            f.hash = truth.hashes[f.page as usize];
            f.look(fabric, || format!("writing the region, after {}", ByteSize(p * page)), false)?;
        }
    }
    b.finish_and_clear();
    let checked = check_region(fabric, region, truth)?;
    let traffic = fabric.traffic().since(&t0);
    if let Some(f) = follow {
        f.look(fabric, || "written, every page checked".to_string(), true)?;
    }
    Ok(DemoStep { what, traffic, seconds: busy, bytes: region.len, checked })
}

/// Acquires the whole region on `device`, `piece` bytes at a time, timed from the first acquire to the last
/// release with nothing else in between (prefetches may overlap only the walk itself); then walks it again to
/// check every lease's bytes on the device. A followed page is looked at after each piece of the timed walk
/// (the looks' time taken out) and at the end.
fn acquire_all(
    fabric: &Fabric,
    region: &Region,
    device: Location,
    piece: u64,
    truth: &Truth,
    mut follow: Option<&mut PageTrail>,
) -> Result<DemoStep, FabricError> {
    let label = format!("acquire all on {device}, {} at a time", ByteSize(piece));
    let pieces: Vec<(u64, u64)> =
        (0..region.len).step_by(piece as usize).map(|off| (off, (off + piece).min(region.len))).collect();
    let t0 = fabric.traffic();
    let b = bar(region.len / truth.page, &label);
    let start = Instant::now();
    let mut looking = 0.0;
    for &(off, end) in &pieces {
        let lease = fabric.acquire(region, off..end, device, Mode::Read)?;
        fabric.release(lease)?;
        b.inc((end - off) / truth.page);
        if let Some(f) = follow.as_deref_mut() {
            let t = Instant::now();
            f.look(fabric, || format!("acquiring it on {device}, after {}", ByteSize(end)), false)?;
            looking += t.elapsed().as_secs_f64();
        }
    }
    let seconds = start.elapsed().as_secs_f64() - looking;
    let traffic = fabric.traffic().since(&t0);
    b.finish_and_clear();
    let b = bar(region.len / truth.page, &format!("checking: {label}"));
    let mut checked = (0, 0);
    for &(off, end) in &pieces {
        let lease = fabric.acquire(region, off..end, device, Mode::Read)?;
        let (n, ok) = check_lease(&lease, truth)?;
        checked = (checked.0 + n, checked.1 + ok);
        fabric.release(lease)?;
        b.inc((end - off) / truth.page);
    }
    b.finish_and_clear();
    if let Some(f) = follow {
        f.look(fabric, || "acquired and checked, every piece".to_string(), true)?;
    }
    Ok(DemoStep { what: label, traffic, seconds, bytes: region.len, checked })
}

/// Starts the fabric with a storage tier: the configuration's, or else a file of twice the host arena (at most
/// 4 GiB) in the working directory or, failing that, the temporary one (the first whose filesystem takes O_DIRECT). Without
/// either, the fabric runs without one and the demo says so. Whether it has one.
fn start(cfg: &ClusterConfig, out: &mut dyn Write) -> Result<(Fabric, bool), FabricError> {
    if cfg.storage.is_some() {
        return Ok((Fabric::embedded(cfg)?, true));
    }
    let dirs = [std::env::current_dir().ok(), Some(std::env::temp_dir())];
    for dir in dirs.into_iter().flatten() {
        let mut c = cfg.clone();
        let size = ByteSize(cfg.memory.host_arena.bytes().saturating_mul(2).min(4 << 30));
        let path = dir.join(format!("vfabric-demo-{}.tier", std::process::id()));
        c.storage = Some(StorageSection { path, size, depth: 64 });
        match Fabric::embedded(&c) {
            Ok(f) => return Ok((f, true)),
            Err(FabricError::Storage(e)) => {
                let _ = writeln!(out, "no storage tier in {}: {e}", dir.display());
            }
            Err(e) => return Err(e),
        }
    }
    let _ = writeln!(out, "running without a storage tier (give one with [storage] in the configuration)");
    Ok((Fabric::embedded(cfg)?, false))
}

/// Runs the demo on `cfg`, writing progress and the table to `out` (progress bars go to the terminal only).
pub fn run(cfg: &ClusterConfig, out: &mut dyn Write) -> Result<DemoReport, FabricError> {
    let _ = writeln!(out, "vfabric demo: cluster `{}`", cfg.cluster.name);
    let (fabric, tiered) = start(cfg, out)?;
    if let Some(why) = fabric.fallback_reason() {
        let _ = writeln!(out, "no usable GPU ({why}): running on the emulated device (host memory stands in for GPUs)");
    }
    let _ = writeln!(out, "{}", fabric.describe());
    let page = fabric.page_size();
    let stats = fabric.stats();
    for d in &stats.directory.devices {
        let _ = writeln!(
            out,
            "  {}: {} ({} pages of {})",
            d.location,
            ByteSize(u64::from(d.frames) * d.location.frame_bytes(page)),
            d.frames,
            ByteSize(page)
        );
    }
    let frames_of =
        |loc: Location| stats.directory.devices.iter().find(|d| d.location == loc).map_or(0, |d| u64::from(d.frames));
    let gpus: Vec<Location> = fabric.devices().into_iter().filter(|l| matches!(l, Location::Gpu(_))).collect();
    let g0 = *gpus.first().ok_or(FabricError::DeviceUnavailable(Location::Gpu(0)))?;
    let g1 = gpus.get(1).copied().unwrap_or(g0);
    let (gpu_frames, host_frames) = (frames_of(g0), frames_of(Location::Host));
    // Half as large again as GPU 0's arena, and no more than host memory can hold.
    let pages = (gpu_frames * 3 / 2).min(host_frames * 9 / 10).max(1);
    let region_bytes = pages * page;
    let region = fabric.alloc(region_bytes, Placement::on(g0))?;
    let _ = writeln!(out, "region {} of {} ({pages} pages), placed on {g0}", region, ByteSize(region_bytes));

    let mut steps = Vec::new();
    let mut truth = Truth { page, hashes: Vec::with_capacity(pages as usize) };
    let seed = 0xDE30;

    // 1. Write it from host buffers: the GPU fills up, pages spill to host memory.
    let what = format!("write {} from host into {g0}", ByteSize(region_bytes));
    steps.push(write_region(&fabric, &region, &mut truth, seed, what, None)?);

    // 2. Acquire it on GPU 0, a quarter of the GPU at a time: evicted pages come back, others leave.
    let quarter = (gpu_frames / 4).max(1) * page;
    steps.push(acquire_all(&fabric, &region, g0, quarter, &truth, None)?);

    // 3. Migrate it to GPU 1: its pages on GPU 0 move over (NVLink on the H200s); the rest stay in host memory.
    let t0 = fabric.traffic();
    let t = Instant::now();
    fabric.migrate(&region, g1)?;
    let secs = t.elapsed().as_secs_f64();
    let traffic = fabric.traffic().since(&t0);
    let checked = check_region(&fabric, &region, &truth)?;
    steps.push(DemoStep { what: format!("migrate to {g1}"), traffic, seconds: secs, bytes: traffic.migrated, checked });
    steps.push(acquire_all(&fabric, &region, g1, quarter, &truth, None)?);

    // 4. Write through a lease on GPU 1 (as a kernel would), release: the new bytes are the region's, and the
    //    old copies elsewhere are gone.
    let n = (quarter / page).min(pages);
    let t0 = fabric.traffic();
    let t = Instant::now();
    let lease = fabric.acquire(&region, 0..n * page, g1, Mode::Write)?;
    let mut secs = t.elapsed().as_secs_f64();
    for i in 0..lease.frames().len() {
        let data = truth.bytes(seed ^ 0xFFFF, i as u64 * page, page as usize);
        truth.hashes[i] = xxh3_64(&data);
        lease.write(i as u64 * page, &data)?;
    }
    let t = Instant::now();
    fabric.release(lease)?;
    secs += t.elapsed().as_secs_f64();
    let traffic = fabric.traffic().since(&t0);
    let checked = check_region(&fabric, &region, &truth)?;
    steps.push(DemoStep {
        what: format!("write {} through a lease on {g1}", ByteSize(n * page)),
        traffic,
        seconds: secs,
        bytes: n * page,
        checked,
    });
    fabric.free(&region)?;

    // 5. Three tiers: a region larger than GPU 0 and host memory together goes down to the storage tier as it
    //    is written (checksummed there), and comes back through host memory to the GPU, every byte verified.
    //    Its first page is followed: written first, it is the first to leave the GPU and then host memory.
    let mut trail = None;
    if tiered {
        let pages = gpu_frames + host_frames + (frames_of(Location::Storage) / 2).min(host_frames / 2).max(1);
        let region = fabric.alloc(pages * page, Placement::on(g0))?;
        let mut follow = PageTrail { region, page: 0, hash: 0, sightings: Vec::new() };
        let what = format!("write {} into {g0}: GPU, host, storage", ByteSize(pages * page));
        steps.push(write_region(&fabric, &region, &mut truth, seed ^ 0x7137, what, Some(&mut follow))?);
        steps.push(acquire_all(&fabric, &region, g0, quarter, &truth, Some(&mut follow))?);
        // Last, the page on the GPU again, for a lease: its device copy is what a kernel would read.
        let lease = fabric.acquire(&region, 0..page, g0, Mode::Read)?;
        let on_device = check_lease(&lease, &truth);
        let looked = follow.look(&fabric, || format!("acquired alone on {g0}, lease read"), true);
        fabric.release(lease)?;
        looked?;
        if let Some(s) = follow.sightings.last_mut() {
            s.verified &= on_device? == (1, 1);
        }
        fabric.free(&region)?;
        trail = Some(follow);
    }

    let report = DemoReport { device: fabric.device_kind(), region_bytes, steps, trail };
    if let Some(t) = &report.trail {
        t.print(out);
    }
    print_table(&report, out);
    Ok(report)
}

fn print_table(r: &DemoReport, out: &mut dyn Write) {
    let _ = writeln!(out);
    let _ = writeln!(out, "| step | fetched | evicted | migrated | to / from storage | time | GB/s | pages verified |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for s in &r.steps {
        let moved = s.traffic.fetched + s.traffic.evicted + s.traffic.migrated + s.traffic.compacted;
        let base = s.bytes.max(moved);
        let gbs = if s.seconds > 0.0 { base as f64 / s.seconds / 1e9 } else { 0.0 };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} / {} | {:.1} ms | {:.1} | {}/{} |",
            s.what,
            ByteSize(s.traffic.fetched),
            ByteSize(s.traffic.evicted),
            ByteSize(s.traffic.migrated),
            ByteSize(s.traffic.to_storage),
            ByteSize(s.traffic.from_storage),
            s.seconds * 1e3,
            gbs,
            s.checked.1,
            s.checked.0
        );
    }
    let _ = writeln!(out);
    if r.device == DeviceKind::Emulated {
        let _ = writeln!(out, "(emulated device: times are host memcpy, not GPU figures)");
    }
    let verdict =
        if r.all_verified() { "every byte verified after every step" } else { "DATA MISMATCH: see the table" };
    let _ = writeln!(out, "{verdict}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_runs_on_the_emulated_device_and_verifies_every_byte() {
        let mut cfg = ClusterConfig::embedded_local();
        cfg.device.backend = vfabric_transport::Backend::Emulated;
        cfg.memory.gpu_budget = Some(ByteSize(32 << 20));
        cfg.memory.host_arena = ByteSize(64 << 20);
        // On the build's disk (O_DIRECT; a temporary directory may be tmpfs).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/demo-test.tier");
        cfg.storage = Some(StorageSection { path: path.clone(), size: ByteSize(128 << 20), depth: 16 });
        let mut out = Vec::new();
        let r = run(&cfg, &mut out).expect("demo");
        let text = String::from_utf8_lossy(&out);
        assert!(r.all_verified(), "{text}");
        assert_eq!(r.device, DeviceKind::Emulated);
        assert!(r.region_bytes > 32 << 20, "larger than the GPU");
        let evicted: u64 = r.steps.iter().map(|s| s.traffic.evicted).sum();
        let fetched: u64 = r.steps.iter().map(|s| s.traffic.fetched).sum();
        let migrated: u64 = r.steps.iter().map(|s| s.traffic.migrated).sum();
        assert!(evicted > 0 && fetched > 0 && migrated > 0, "{text}");
        let down: u64 = r.steps.iter().map(|s| s.traffic.to_storage).sum();
        let up: u64 = r.steps.iter().map(|s| s.traffic.from_storage).sum();
        assert!(down > 0 && up > 0, "pages went down to storage and came back: {text}");
        assert!(!path.exists(), "the demo's fabric removed its storage file");
        assert!(text.contains("every byte verified"), "{text}");
        assert!(text.contains("emulated device"), "{text}");
        // The followed page went down every tier and came back, every copy of it checked at every sighting.
        let trail = r.trail.as_ref().expect("a storage tier, so a followed page");
        assert!(trail.verified(), "{text}");
        let path = trail.path();
        let at = |l: Location, from: usize| path[from..].iter().position(|p| *p == l).map(|i| i + from);
        let gpu = at(Location::Gpu(0), 0).expect("first on gpu0");
        let host = at(Location::Host, gpu).expect("then in host memory");
        let storage = at(Location::Storage, host).expect("then on the storage tier");
        assert!(at(Location::Gpu(0), storage).is_some(), "back on gpu0: {path:?}");
        assert_eq!(path.last(), Some(&Location::Gpu(0)), "{text}");
        let line = format!("page 0 of region {}: gpu0 -> host -> storage -> gpu0", trail.region);
        assert!(text.contains(&line) && text.contains("at every step, verified"), "{text}");
    }
}
