//! `vfabric demo`: the README's first command.
//!
//! Opens the node's devices (the GPUs, or the emulated device when there are none, and says so), writes a
//! region of pages into GPU 0's arena, moves it GPU 0 -> GPU 1 -> host -> GPU 0 through the mover, verifies every
//! byte after every move, and prints a table of what moved where and how fast.

use std::io::Write;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use vfabric_allocator::{AllocClass, TenantId};
use vfabric_transport::{DeviceKind, EngineChoice, Location};
use xxhash_rust::xxh3::xxh3_64;

use crate::config::ClusterConfig;
use crate::memory::{NodeError, NodeMemory};
use crate::pattern;
use crate::units::ByteSize;

/// What the demo did, step by step.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The device layer it ran on.
    pub device: DeviceKind,
    /// Pages in the region.
    pub pages: usize,
    /// One row per move.
    pub steps: Vec<DemoStep>,
}

/// One move of the whole region.
#[derive(Debug, Clone)]
pub struct DemoStep {
    /// Where the pages were.
    pub from: Location,
    /// Where they went.
    pub to: Location,
    /// Bytes moved.
    pub bytes: u64,
    /// The engine the mover chose.
    pub engine: vfabric_transport::Engine,
    /// Contiguous runs the pages formed.
    pub runs: usize,
    /// Device time of the move, in seconds.
    pub seconds: f64,
    /// Pages whose bytes matched after the move.
    pub verified: usize,
}

impl DemoReport {
    /// Whether every page of every step arrived intact.
    pub fn all_verified(&self) -> bool {
        self.steps.iter().all(|s| s.verified == self.pages)
    }
}

/// Runs the demo on `cfg`, writing progress and the table to `out` (progress bars go to the terminal only).
pub fn run(cfg: &ClusterConfig, out: &mut dyn Write) -> Result<DemoReport, NodeError> {
    let mut node = NodeMemory::open(cfg)?;
    let layer = node.layer();
    let _ = writeln!(out, "vfabric demo: cluster `{}`", cfg.cluster.name);
    if let Some(why) = node.fallback_reason() {
        let _ = writeln!(out, "no usable GPU ({why}): running on the emulated device (host memory stands in for GPUs)");
    }
    let _ = writeln!(out, "{}", layer.describe());
    let device = layer.kind();
    let page = node.page_size();
    for (loc, _, frames) in node.usage() {
        let _ = writeln!(
            out,
            "  {loc}: arena of {} ({} frames of {})",
            ByteSize(u64::from(frames) * page),
            frames,
            ByteSize(page)
        );
    }
    let gpus: Vec<Location> = node.locations().into_iter().filter(|l| *l != Location::Host).collect();
    let first = gpus.first().copied().ok_or(NodeError::NoSuchLocation(Location::Gpu(0)))?;
    let mut route = vec![first];
    if let Some(second) = gpus.get(1) {
        route.push(*second);
    }
    route.push(Location::Host);
    route.push(first);
    // A region of three quarters of the smallest arena's ordinary frames, so every hop has room.
    let mut pages = u32::MAX;
    for l in &route {
        pages = pages.min(node.available(*l)?);
    }
    let pages = (pages / 4 * 3).max(1);
    let tenant = TenantId(1);
    let mut frames = node.alloc(first, pages, tenant, AllocClass::Normal)?;

    let bar = |len: u64, what: &str| {
        let b = ProgressBar::new(len);
        b.set_style(
            ProgressStyle::with_template("  {msg:<28} [{bar:30}] {pos}/{len}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b.set_message(what.to_string());
        b
    };
    let _ = writeln!(out, "writing a region of {pages} pages ({}) into {first}", ByteSize(u64::from(pages) * page));
    let write_bar = bar(u64::from(pages), "writing pages");
    let mut hashes = Vec::with_capacity(pages as usize);
    let mut buf = vec![0u8; page as usize];
    for (i, &f) in frames.iter().enumerate() {
        pattern::fill(0xDE30, i as u64 * page, &mut buf);
        hashes.push(xxh3_64(&buf));
        node.write_pages(first, &[f], &buf)?;
        write_bar.inc(1);
    }
    write_bar.finish_and_clear();

    let mut steps = Vec::new();
    for hop in route.windows(2) {
        let (from, to) = (hop[0], hop[1]);
        let started = Instant::now();
        let (new_frames, report) = node.migrate(from, &frames, to, EngineChoice::Auto)?;
        frames = new_frames;
        let check_bar = bar(u64::from(pages), &format!("verifying {from} -> {to}"));
        let mut verified = 0;
        for (i, &f) in frames.iter().enumerate() {
            node.read_pages(to, &[f], &mut buf)?;
            if xxh3_64(&buf) == hashes[i] {
                verified += 1;
            }
            check_bar.inc(1);
        }
        check_bar.finish_and_clear();
        let seconds = report.device_time.map_or_else(|| started.elapsed().as_secs_f64(), |d| d.as_secs_f64());
        steps.push(DemoStep {
            from,
            to,
            bytes: report.bytes,
            engine: report.engine,
            runs: report.runs,
            seconds,
            verified,
        });
    }
    node.free(first, &frames)?;

    let report = DemoReport { device, pages: pages as usize, steps };
    print_table(&report, out);
    Ok(report)
}

fn print_table(r: &DemoReport, out: &mut dyn Write) {
    let _ = writeln!(out);
    let _ = writeln!(out, "| move | bytes | engine | runs | time | GB/s | verified |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for s in &r.steps {
        let gbs = if s.seconds > 0.0 { s.bytes as f64 / s.seconds / 1e9 } else { 0.0 };
        let _ = writeln!(
            out,
            "| {} -> {} | {} | {} | {} | {:.3} ms | {:.1} | {}/{} |",
            s.from,
            s.to,
            ByteSize(s.bytes),
            s.engine,
            s.runs,
            s.seconds * 1e3,
            gbs,
            s.verified,
            r.pages
        );
    }
    let _ = writeln!(out);
    if r.device == DeviceKind::Emulated {
        let _ = writeln!(out, "(emulated device: times are host memcpy, not GPU figures)");
    }
    let verdict =
        if r.all_verified() { "every byte verified after every move" } else { "DATA MISMATCH: see the table" };
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
        cfg.memory.host_arena = ByteSize(32 << 20);
        let mut out = Vec::new();
        let r = run(&cfg, &mut out).expect("demo");
        let text = String::from_utf8_lossy(&out);
        assert!(r.all_verified(), "{text}");
        assert_eq!(r.steps.len(), 3, "gpu0 -> gpu1 -> host -> gpu0");
        assert_eq!(r.device, DeviceKind::Emulated);
        assert!(text.contains("every byte verified"), "{text}");
        assert!(text.contains("emulated device"), "{text}");
    }
}
