//! `vfabric-bench storage --to-gpu`: the storage tier's pages on their way to a GPU, two ways, beside the tier's
//! own reads into host memory in the same run: through host memory (a call's pages read into pinned host memory,
//! then copied to the GPU together: the fabric's two hops, a staging stage then a fetch), and straight on (each
//! page's copy to the GPU queued as soon as it has arrived and passed its checks, `StorageFile::read_each`,
//! while the ring reads the next ones).

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use vfabric_transport::storage::{AlignedBuffer, Compression, StorageFile, StorageSpec};
use vfabric_transport::{open, Arena, ArenaSpec, Backend, EngineChoice, Location, MoverConfig, OpenOptions, PageBatch};

use crate::compression;

/// One way of reading the file's pages, all of them in order.
#[derive(Debug, Clone, Serialize)]
pub struct GpuRow {
    /// "to host memory", "to the GPU through host memory" or "to the GPU as each page arrives".
    pub way: &'static str,
    /// Requests in flight.
    pub depth: u32,
    /// Page bytes moved.
    pub bytes: u64,
    /// Page bytes per second, GB/s.
    pub gb_s: f64,
    /// Over the tier's own reads into host memory of the same run.
    pub vs_host: f64,
}

/// The three passes over a file of `size` bytes at `path`, pages of `ps`, at `depth`, one caller, `batch` pages
/// a call. The device layer is the machine's GPU, else the emulated one (saying so).
pub fn passes(path: &Path, size: u64, ps: u64, batch: u64, depth: u32) -> Result<(String, Vec<GpuRow>), String> {
    let slots = size / ps;
    let batch = batch.clamp(1, slots.max(1));
    let opened = open(&OpenOptions {
        backend: Backend::Auto,
        emulated_gpus: 1,
        emulated_gpu_memory: (4 * batch * ps).max(64 << 20),
        emulated_host_link: 0,
    })
    .map_err(|e| e.to_string())?;
    if let Some(why) = &opened.fallback_reason {
        eprintln!("to the GPU: no usable GPU ({why}): the emulated device's copies are memcpy");
    }
    let layer = opened.layer;
    let arena = |location| {
        layer
            .create_arena(&ArenaSpec { location, bytes: batch * ps, chunk_bytes: batch * ps })
            .map_err(|e| e.to_string())
    };
    let (host, gpu) = (arena(Location::Host)?, arena(Location::Gpu(0))?);
    let mover = layer.mover(MoverConfig::default()).map_err(|e| e.to_string())?;
    let base = host.host_ptr().ok_or("the host arena has no host address")?;
    if base as usize % 4096 != 0 {
        return Err(format!(
            "--to-gpu reads the file straight into the device layer's pinned host memory, which O_DIRECT needs \
             aligned to 4 KiB: {}'s is not (run it on a GPU machine)",
            layer.describe()
        ));
    }
    let tier = StorageFile::create(&StorageSpec { path: path.to_owned(), bytes: slots * ps, page_size: ps, depth })
        .map_err(|e| e.to_string())?;
    let mut fill = AlignedBuffer::new((batch * ps) as usize).ok_or("no memory for the pages")?;
    fill.copy_from_slice(&compression::synthetic("random bytes", (batch * ps) as usize, 9));
    let slot_list: Vec<u64> = (0..slots).collect();
    for call in slot_list.chunks(batch as usize) {
        let pages: Vec<(u64, &[u8])> =
            call.iter().enumerate().map(|(i, &s)| (s, &fill[i * ps as usize..][..ps as usize])).collect();
        tier.write(&pages, Compression::None).map_err(|e| e.to_string())?;
    }
    // SAFETY: the host arena holds `batch` pages and lives as long as `host`; each pass reads into it only while
    // no copy from it is in flight (every copy is waited for before the next call).
    let frames = |n: usize| -> Vec<&mut [u8]> {
        (0..n).map(|i| unsafe { std::slice::from_raw_parts_mut(base.add(i * ps as usize), ps as usize) }).collect()
    };
    let mut rows: Vec<GpuRow> = Vec::new();
    for way in ["to host memory", "to the GPU through host memory", "to the GPU as each page arrives"] {
        let t = Instant::now();
        for call in slot_list.chunks(batch as usize) {
            let mut pages: Vec<(u64, &mut [u8])> = call.iter().copied().zip(frames(call.len())).collect();
            match way {
                "to host memory" => tier.read(&mut pages).map_err(|e| e.to_string())?,
                "to the GPU through host memory" => {
                    tier.read(&mut pages).map_err(|e| e.to_string())?;
                    let all = PageBatch::contiguous(ps, 0, 0, call.len() as u32);
                    mover
                        .submit(&host, &gpu, &all, EngineChoice::Auto)
                        .and_then(|t| t.wait())
                        .map_err(|e| e.to_string())?;
                }
                _ => {
                    let mut copies = Vec::with_capacity(call.len());
                    let mut failed = None;
                    let read = tier.read_each(&mut pages, |k| {
                        let one = PageBatch::contiguous(ps, k as u32, k as u32, 1);
                        match mover.submit(&host, &gpu, &one, EngineChoice::CopyEngine) {
                            Ok(t) => copies.push(t),
                            Err(e) => {
                                failed.get_or_insert(e.to_string());
                            }
                        }
                    });
                    for c in copies {
                        c.wait().map_err(|e| e.to_string())?;
                    }
                    read.map_err(|e| e.to_string())?;
                    if let Some(e) = failed {
                        return Err(e);
                    }
                }
            }
        }
        let secs = t.elapsed().as_secs_f64();
        if way != "to host memory" {
            check_gpu(gpu.as_ref(), &fill, ps, (slots - 1) % batch + 1)?;
            gpu.fill(0, gpu.len(), 0).map_err(|e| e.to_string())?;
        }
        let gb_s = (slots * ps) as f64 / secs / 1e9;
        let vs_host = rows.first().map_or(1.0, |h| gb_s / h.gb_s);
        rows.push(GpuRow { way, depth, bytes: slots * ps, gb_s, vs_host });
    }
    drop(tier);
    Ok((layer.describe(), rows))
}

/// The GPU holds the last call's `n` pages: page i of every call is page i of `fill`.
fn check_gpu(gpu: &dyn Arena, fill: &[u8], ps: u64, n: u64) -> Result<(), String> {
    let mut got = vec![0u8; ps as usize];
    for i in 0..n {
        gpu.read(i * ps, &mut got).map_err(|e| e.to_string())?;
        if got[..] != fill[(i * ps) as usize..][..ps as usize] {
            return Err(format!("page {i} of the last call reached the GPU wrong"));
        }
    }
    Ok(())
}
