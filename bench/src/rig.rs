//! The benchmark rig: one arena per location holding a source region (lower half, filled with verifiable data
//! whose page hashes are known) and a destination region (upper half), movers by SM budget, and the plain-copy
//! baseline of the same machine.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use vfabric::pattern::{self, shuffled};
use vfabric_transport::cuda::{BaselineCopier, CudaNode, PlainCopy};
use vfabric_transport::{
    Arena, ArenaSpec, DeviceLayer, EngineChoice, Location, Mover, MoverConfig, PageBatch, PageMove, TransferReport,
};
use xxhash_rust::xxh3::xxh3_64;

/// A move between two locations, one way or both ways at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the first to the second.
    One(Location, Location),
    /// Both ways at once.
    Both(Location, Location),
}

impl Direction {
    /// The (source, destination) pairs it moves.
    pub fn legs(self) -> Vec<(Location, Location)> {
        match self {
            Direction::One(a, b) => vec![(a, b)],
            Direction::Both(a, b) => vec![(a, b), (b, a)],
        }
    }

    /// Locations it touches.
    pub fn locations(self) -> [Location; 2] {
        match self {
            Direction::One(a, b) | Direction::Both(a, b) => [a, b],
        }
    }
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Direction::One(a, b) => write!(f, "{a}->{b}"),
            Direction::Both(a, b) => write!(f, "{a}<->{b}"),
        }
    }
}

/// A location named in a direction.
fn loc(s: &str) -> Result<Location, String> {
    s.parse().map_err(|e: vfabric_allocator::ParseLocationError| e.to_string())
}

impl std::str::FromStr for Direction {
    type Err = String;
    /// `gpu0>gpu1`, `gpu0->host`, `gpu0<>gpu1`, `gpu0<->gpu1`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.replace("<->", "<>").replace("->", ">");
        if let Some((a, b)) = t.split_once("<>") {
            return Ok(Direction::Both(loc(a)?, loc(b)?));
        }
        if let Some((a, b)) = t.split_once('>') {
            return Ok(Direction::One(loc(a)?, loc(b)?));
        }
        Err(format!("`{s}` is not a direction: write gpu0>gpu1, gpu0<>gpu1, gpu0>host or host>gpu0"))
    }
}

/// How pages are laid out in a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Consecutive frames to consecutive frames.
    Contiguous,
    /// Random frames of the source region to random frames of the destination region.
    Scattered,
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "contiguous" | "c" => Ok(Layout::Contiguous),
            "scattered" | "s" => Ok(Layout::Scattered),
            _ => Err(format!("`{s}`: use contiguous or scattered")),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Contiguous => "contiguous",
            Layout::Scattered => "scattered",
        })
    }
}

fn seed_of(l: Location) -> u64 {
    match l {
        Location::Gpu(g) => 0x100 + u64::from(g),
        Location::Host => 0x1FF,
        Location::Storage => 0x2FF,
        Location::Packed(e) => 0x3FF + 0x100 * e.bytes() as u64,
        Location::Compressed => 0x7FF,
    }
}

/// Where the plain-copy baseline comes from.
enum Baseline {
    Cuda(BaselineCopier),
    Memcpy,
}

/// Arenas, data and movers for one benchmark run.
pub struct Rig {
    layer: Arc<dyn DeviceLayer>,
    region: u64,
    arenas: BTreeMap<Location, Arc<dyn Arena>>,
    hashes: HashMap<(Location, u64), Vec<u64>>,
    baseline: Baseline,
    movers: HashMap<MoverConfig, Arc<dyn Mover>>,
}

/// What one run of a set of batches took.
pub struct Timing {
    /// Device time of the slowest leg (legs run concurrently), seconds.
    pub device: f64,
    /// Host wall time from the first submit to the last completion, seconds.
    pub wall: f64,
    /// Host time from the first submit to each leg's completion (seen in submission order), seconds.
    pub done: Vec<f64>,
    /// The legs' reports.
    pub reports: Vec<TransferReport>,
}

impl Rig {
    /// Creates an arena of twice `region` bytes at each of `locations` and fills each source region with data
    /// whose hashes are kept for pages of each size in `pages`. `progress` is called with bytes written.
    pub fn new(
        layer: Arc<dyn DeviceLayer>,
        locations: &[Location],
        region: u64,
        pages: &[u64],
        progress: &dyn Fn(u64),
    ) -> Result<Rig, String> {
        let mut arenas = BTreeMap::new();
        let mut hashes = HashMap::new();
        let chunk: u64 = (64u64 << 20).min(region);
        for &loc in locations {
            let a = layer
                .create_arena(&ArenaSpec { location: loc, bytes: 2 * region, chunk_bytes: 1 << 30 })
                .map_err(|e| format!("arena at {loc}: {e}"))?;
            let seed = seed_of(loc);
            let mut buf = vec![0u8; chunk as usize];
            let mut off = 0;
            while off < region {
                let len = chunk.min(region - off) as usize;
                pattern::fill(seed, off, &mut buf[..len]);
                a.write(off, &buf[..len]).map_err(|e| format!("writing {loc}: {e}"))?;
                for &p in pages {
                    let v: &mut Vec<u64> = hashes.entry((loc, p)).or_default();
                    v.extend(buf[..len].chunks_exact(p as usize).map(xxh3_64));
                }
                off += len as u64;
                progress(len as u64);
            }
            arenas.insert(loc, a);
        }
        let baseline = match layer.as_any().downcast_ref::<CudaNode>() {
            Some(node) => Baseline::Cuda(BaselineCopier::new(node).map_err(|e| e.to_string())?),
            None => Baseline::Memcpy,
        };
        Ok(Rig { layer, region, arenas, hashes, baseline, movers: HashMap::new() })
    }

    /// Bytes of each source region (and of each destination region).
    pub fn region(&self) -> u64 {
        self.region
    }

    /// A mover for `cfg` (cached).
    pub fn mover(&mut self, cfg: MoverConfig) -> Result<Arc<dyn Mover>, String> {
        if let Some(m) = self.movers.get(&cfg) {
            return Ok(Arc::clone(m));
        }
        let m = self.layer.mover(cfg).map_err(|e| e.to_string())?;
        self.movers.insert(cfg, Arc::clone(&m));
        Ok(m)
    }

    /// The batch for one leg: `bytes` of `page`-sized pages from the source region of `from` to the destination
    /// region of `to`.
    pub fn batch(&self, from: Location, to: Location, bytes: u64, page: u64, layout: Layout) -> PageBatch {
        let half = (self.region / page) as u32;
        let n = (bytes / page) as u32;
        match layout {
            Layout::Contiguous => PageBatch::contiguous(page, 0, half, n),
            Layout::Scattered => {
                let s = shuffled(half, seed_of(from) * 31 + page);
                let d = shuffled(half, seed_of(to) * 17 + page + 1);
                PageBatch::from_moves(page, (0..n as usize).map(|i| PageMove { src: s[i], dst: half + d[i] }).collect())
            }
        }
    }

    /// Fills the destination regions of `legs` with a byte no source page holds everywhere.
    pub fn poison(&self, legs: &[(Location, Location)]) -> Result<(), String> {
        for (_, to) in legs {
            let a = &self.arenas[to];
            a.fill(self.region, self.region, 0xEE).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Submits every leg at once, waits for all, and returns the timing.
    pub fn run(
        &self,
        mover: &Arc<dyn Mover>,
        legs: &[(Location, Location, PageBatch)],
        engine: EngineChoice,
    ) -> Result<Timing, String> {
        let t = Instant::now();
        let mut pending = Vec::new();
        for (from, to, b) in legs {
            pending.push(
                mover
                    .submit(&self.arenas[from], &self.arenas[to], b, engine)
                    .map_err(|e| format!("{from}->{to}: {e}"))?,
            );
        }
        let mut reports = Vec::new();
        let mut done = Vec::new();
        for p in pending {
            reports.push(p.wait().map_err(|e| e.to_string())?);
            done.push(t.elapsed().as_secs_f64());
        }
        let wall = t.elapsed().as_secs_f64();
        let device = reports.iter().filter_map(|r| r.device_time).map(|d| d.as_secs_f64()).fold(0.0, f64::max);
        Ok(Timing { device: if device > 0.0 { device } else { wall }, wall, done, reports })
    }

    /// Checks every page of `batch` at `to` against the hash of its source page at `from`; returns the number of
    /// pages that differ.
    pub fn verify(&self, from: Location, to: Location, batch: &PageBatch) -> Result<usize, String> {
        let page = batch.page_size();
        let want = self.hashes.get(&(from, page)).ok_or("no hashes for this page size")?;
        let arena = &self.arenas[&to];
        let mut moves: Vec<PageMove> = batch.moves().to_vec();
        moves.sort_unstable_by_key(|m| m.dst);
        let span = (64u64 << 20).max(page);
        let mut buf = vec![0u8; span as usize];
        let mut bad = 0;
        let mut i = 0;
        while i < moves.len() {
            let start = u64::from(moves[i].dst) * page;
            let end = (start + span).min(arena.len());
            let len = (end - start) as usize;
            arena.read(start, &mut buf[..len]).map_err(|e| e.to_string())?;
            while i < moves.len() && u64::from(moves[i].dst) * page + page <= end {
                let o = (u64::from(moves[i].dst) * page - start) as usize;
                if xxh3_64(&buf[o..o + page as usize]) != want[moves[i].src as usize] {
                    bad += 1;
                }
                i += 1;
            }
        }
        Ok(bad)
    }

    /// Times one plain copy of `bytes` per leg (all legs at once), as the baseline: a single
    /// `cuMemcpyPeerAsync`/`cuMemcpyAsync` on CUDA, `memcpy` on the emulated device. Seconds.
    pub fn baseline(&self, legs: &[(Location, Location)], bytes: u64) -> Result<f64, String> {
        match &self.baseline {
            Baseline::Cuda(c) => {
                let copies: Vec<(&dyn Arena, &dyn Arena, PlainCopy)> = legs
                    .iter()
                    .map(|(f, t)| {
                        (
                            self.arenas[f].as_ref(),
                            self.arenas[t].as_ref(),
                            PlainCopy { src_offset: 0, dst_offset: self.region, len: bytes },
                        )
                    })
                    .collect();
                c.copy(&copies).map(|d| d.as_secs_f64()).map_err(|e| e.to_string())
            }
            Baseline::Memcpy => {
                // On the emulated device an arena's device pointer is its host address.
                let ptrs: Vec<(usize, usize)> = legs
                    .iter()
                    .map(|(f, t)| {
                        (self.arenas[f].device_ptr() as usize, (self.arenas[t].device_ptr() + self.region) as usize)
                    })
                    .collect();
                let t = Instant::now();
                std::thread::scope(|s| {
                    for &(src, dst) in &ptrs {
                        s.spawn(move || {
                            // SAFETY: emulated arenas are host memory owned by the rig for its whole life; the
                            // source region and each destination region are `bytes <= region` long and disjoint.
                            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes as usize) };
                        });
                    }
                });
                Ok(t.elapsed().as_secs_f64())
            }
        }
    }

    /// What the baseline is called.
    pub fn baseline_name(&self, legs: &[(Location, Location)]) -> &'static str {
        match self.baseline {
            Baseline::Memcpy => "memcpy",
            Baseline::Cuda(_) => {
                if legs.iter().all(|(a, b)| a.gpu().is_some() && b.gpu().is_some() && a != b) {
                    "cuMemcpyPeerAsync"
                } else {
                    "cuMemcpyAsync"
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_parse() {
        assert_eq!("gpu0>gpu1".parse(), Ok(Direction::One(Location::Gpu(0), Location::Gpu(1))));
        assert_eq!("gpu0<->gpu1".parse(), Ok(Direction::Both(Location::Gpu(0), Location::Gpu(1))));
        assert_eq!("host->gpu0".parse(), Ok(Direction::One(Location::Host, Location::Gpu(0))));
        assert!("gpu0".parse::<Direction>().is_err());
        assert_eq!(Direction::Both(Location::Gpu(0), Location::Host).to_string(), "gpu0<->host");
    }
}
