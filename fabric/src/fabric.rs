//! The fabric as a Rust program on one node uses it: regions in one address space over the node's GPUs and
//! host memory, placed on any GPU, evicted to host memory when a GPU is full and fetched back on use, with
//! leases that give a kernel device pointers.
//!
//! [`Fabric`] is the I/O half of the directory (`crate::directory`, which is pure): it carries out the stages
//! of copies the directory asks for through the node's mover, commits them, and hands out [`Lease`]s. Calls are
//! serialised on the directory's lock; copies run while it is held, so one call's evictions and fetches never
//! interleave with another's. The one exception is prefetch: after an acquire that continues a walk in order,
//! the copies of the pages it will want next start and the call returns; they complete while the caller works
//! with its lease, and the next call that needs them (or that could disturb them) waits for them first.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use vfabric_allocator::NodeId;
use vfabric_transport::{
    open, Arena, ArenaSpec, DeviceError, DeviceLayer, EngineChoice, Location, Mover, OpenOptions, PageBatch, Transfer,
};

use crate::config::ClusterConfig;
use crate::directory::{
    AcquireRequest, DevIdx, Directory, DirectoryConfig, DirectoryError, DirectoryStats, LeaseFrames, Mode, Placement,
    ReadSource, RegionHandle, Stage, StageKind, Step, PREFETCH_DEPTH,
};
use crate::error::FabricError;

/// A region of the fabric's address space: a name, not memory (where its pages live is the directory's
/// business). Cheap to copy; using it after [`Fabric::free`] is an error, never a crash.
pub type Region = RegionHandle;

/// Bytes the fabric moved, by why it moved them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    /// Pages brought to a device for a lease (from host memory, a peer, or zero-filled).
    pub fetched: u64,
    /// The part of `fetched` prefetched ahead of a walk in order (copied while the caller worked).
    pub prefetched: u64,
    /// Pages sent to host memory to make room.
    pub evicted: u64,
    /// Pages moved within a device to make a run of frames (compaction, or pages gathered into a lease's run).
    pub compacted: u64,
    /// Pages moved by migrations.
    pub migrated: u64,
    /// Bytes written from and read into host buffers.
    pub host_io: u64,
    /// Stages of copies carried out.
    pub stages: u64,
}

impl Traffic {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            fetched: self.fetched - earlier.fetched,
            prefetched: self.prefetched - earlier.prefetched,
            evicted: self.evicted - earlier.evicted,
            compacted: self.compacted - earlier.compacted,
            migrated: self.migrated - earlier.migrated,
            host_io: self.host_io - earlier.host_io,
            stages: self.stages - earlier.stages,
        }
    }
}

#[derive(Default)]
struct Counters {
    fetched: AtomicU64,
    prefetched: AtomicU64,
    evicted: AtomicU64,
    compacted: AtomicU64,
    migrated: AtomicU64,
    host_io: AtomicU64,
    stages: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> Traffic {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Traffic {
            fetched: l(&self.fetched),
            prefetched: l(&self.prefetched),
            evicted: l(&self.evicted),
            compacted: l(&self.compacted),
            migrated: l(&self.migrated),
            host_io: l(&self.host_io),
            stages: l(&self.stages),
        }
    }
}

/// Figures about the fabric.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    /// The directory's figures.
    pub directory: DirectoryStats,
    /// Bytes moved since start.
    pub traffic: Traffic,
}

/// What the fabric's lock guards.
struct State {
    dir: Directory,
    /// The prefetch stages whose copies are in flight, oldest first (the directory knows they are pending;
    /// their transfers live here). Dropped before the arenas: dropping a transfer waits for it.
    prefetch: VecDeque<InFlight>,
}

struct InFlight {
    stage: Stage,
    copies: Vec<Transfer>,
}

struct Inner {
    state: Mutex<State>,
    layer: Arc<dyn DeviceLayer>,
    arenas: Vec<Arc<dyn Arena>>,
    mover: Arc<dyn Mover>,
    page_size: u64,
    counters: Counters,
    fallback: Option<DeviceError>,
}

/// The fabric of one node, in this process.
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<Inner>,
}

/// Where a lease's pages are on its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeasePtr {
    /// One device pointer over the whole range (the pages sit in one run of frames, in order).
    Contiguous {
        /// Device pointer to the first page.
        ptr: u64,
        /// Bytes (whole pages).
        len: u64,
    },
    /// One device pointer per page, in page order (the device was too fragmented for one run).
    Pages(Vec<u64>),
}

/// The right to use a range of a region on one device. Its pages stay on that device, at these addresses,
/// until it is released ([`Fabric::release`], or dropping it). A `Write` lease's changes become the region's
/// bytes when it is released.
pub struct Lease {
    inner: Arc<Inner>,
    id: u64,
    region: Region,
    device: Location,
    mode: Mode,
    first_page: u32,
    frames: Vec<u32>,
    ptr: LeasePtr,
    released: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("region", &self.region)
            .field("device", &self.device)
            .field("mode", &self.mode)
            .field("ptr", &self.ptr)
            .finish()
    }
}

impl Lease {
    /// Device pointers to the leased pages.
    pub fn ptr(&self) -> &LeasePtr {
        &self.ptr
    }

    /// The device.
    pub fn device(&self) -> Location {
        self.device
    }

    /// Read or write.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The region.
    pub fn region(&self) -> Region {
        self.region
    }

    /// Offset in the region of the first leased byte (the lease covers whole pages).
    pub fn offset(&self) -> u64 {
        u64::from(self.first_page) * self.region.page_size
    }

    /// Bytes covered (whole pages).
    pub fn len(&self) -> u64 {
        self.frames.len() as u64 * self.region.page_size
    }

    /// Whether it covers nothing (never: leases cover at least one page).
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The frames of the device's arena that hold the pages, in page order (for tools that move them with the
    /// node's mover, such as the benchmarks).
    pub fn frames(&self) -> &[u32] {
        &self.frames
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.released {
            let r = lock(&self.inner.state).dir.release(self.id);
            if let Err(e) = r {
                tracing::warn!(lease = self.id, error = %e, "releasing a dropped lease failed");
            }
        }
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while the directory was held (a bug) leaves it as the last commit left it: consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fabric {
    /// Runs the fabric of one node in this process, on the devices the configuration names: the node's GPUs
    /// (each with an arena of the configured budget) and pinned host memory. With `backend = "auto"` and no
    /// usable GPU it runs on the emulated device ([`Fabric::fallback_reason`] says why).
    pub fn embedded(config: &ClusterConfig) -> Result<Fabric, FabricError> {
        Self::for_node(config, 0)
    }

    /// The fabric of node `node` (its index in the configuration's `[[node]]` list, and the home id in the
    /// global addresses of the regions it allocates), on the devices that node's section names.
    pub fn for_node(config: &ClusterConfig, node: u16) -> Result<Fabric, FabricError> {
        let opened = open(&OpenOptions {
            backend: config.device.backend,
            emulated_gpus: config.device.emulated_gpus,
            emulated_gpu_memory: config.device.emulated_gpu_memory.bytes(),
        })?;
        let layer = opened.layer;
        let page = config.memory.page();
        let ps = page.bytes();
        let all: Vec<u16> = layer.gpus().iter().map(|g| g.index).collect();
        let gpus = match config.nodes.get(usize::from(node)).and_then(|n| n.gpus.clone()) {
            Some(wanted) => {
                if let Some(&g) = wanted.iter().find(|g| !all.contains(g)) {
                    return Err(FabricError::DeviceUnavailable(Location::Gpu(g)));
                }
                wanted
            }
            None => all,
        };
        let mut devices = Vec::new();
        for &g in &gpus {
            let total = layer.gpus()[usize::from(g)].total_memory;
            devices.push((Location::Gpu(g), config.memory.gpu_arena_bytes(total) / ps * ps));
        }
        devices.push((Location::Host, config.memory.host_arena.bytes() / ps * ps));
        let mut arenas = Vec::new();
        for &(location, bytes) in &devices {
            let t = Instant::now();
            arenas.push(layer.create_arena(&ArenaSpec {
                location,
                bytes,
                chunk_bytes: config.memory.chunk_size.bytes(),
            })?);
            tracing::info!(%location, bytes, ms = t.elapsed().as_secs_f64() * 1e3, "arena ready");
        }
        let dir = Directory::new(
            DirectoryConfig {
                node: NodeId(node),
                page_size: page,
                headroom_percent: config.memory.headroom_percent,
                fit: config.memory.fit,
                high_watermark_percent: config.memory.high_watermark_percent,
                low_watermark_percent: config.memory.low_watermark_percent,
                readahead_pages: (config.memory.readahead.bytes() / ps).min(u64::from(u32::MAX)) as u32,
            },
            &devices,
        )?;
        let mover = layer.mover(config.mover)?;
        Ok(Fabric {
            inner: Arc::new(Inner {
                state: Mutex::new(State { dir, prefetch: VecDeque::new() }),
                layer,
                arenas,
                mover,
                page_size: ps,
                counters: Counters::default(),
                fallback: opened.fallback_reason,
            }),
        })
    }

    /// The device layer.
    pub fn layer(&self) -> &Arc<dyn DeviceLayer> {
        &self.inner.layer
    }

    /// Why the emulated device runs although CUDA was wanted, if it does.
    pub fn fallback_reason(&self) -> Option<&DeviceError> {
        self.inner.fallback.as_ref()
    }

    /// The page size of this node's regions.
    pub fn page_size(&self) -> u64 {
        self.inner.page_size
    }

    /// The devices: the GPUs, then the host.
    pub fn devices(&self) -> Vec<Location> {
        lock(&self.inner.state).dir.locations()
    }

    /// The arena of a device (for tools that move leased pages with the node's mover).
    pub fn arena(&self, location: Location) -> Result<Arc<dyn Arena>, FabricError> {
        let i = lock(&self.inner.state).dir.dev(location)?;
        Ok(Arc::clone(&self.inner.arenas[usize::from(i)]))
    }

    /// The node's mover.
    pub fn mover(&self) -> &Arc<dyn Mover> {
        &self.inner.mover
    }

    /// Allocates a region of `size` bytes (rounded up to whole pages). `placement` picks the device its pages
    /// go to (a hint; by default the GPU with the most free memory). No memory is taken until pages are
    /// written or acquired; a region may be larger than any GPU.
    pub fn alloc(&self, size: u64, placement: Placement) -> Result<Region, FabricError> {
        Ok(lock(&self.inner.state).dir.alloc(size, placement)?)
    }

    /// Frees a region and all its memory. Refused while any of its pages is leased.
    pub fn free(&self, region: &Region) -> Result<(), FabricError> {
        let mut st = lock(&self.inner.state);
        self.drive(&mut st, |d| d.free(region))
    }

    /// Writes `data` into the region at `offset`. Pages never written get memory on the region's device
    /// (evicting other pages to host memory to make room, or landing in host memory when nothing can be
    /// evicted). Refused while any page of the range is leased.
    pub fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        self.write_parts(region, offset, &[data])
    }

    /// [`Fabric::write`] of `parts` one after the other (a payload that arrived in pieces, such as a QUIC
    /// chunk in quinn's receive buffers): each piece is copied once, to its place, without gathering them
    /// first where the pages live in host memory.
    pub fn write_parts(&self, region: &Region, offset: u64, parts: &[&[u8]]) -> Result<(), FabricError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut st = lock(&self.inner.state);
        let targets = self.drive(&mut st, |d| d.step_write(region, offset, len))?;
        let mut pieces = Vec::new();
        for t in targets {
            let arena = self.arena_at(&st.dir, t.location)?;
            slice_parts(parts, t.buf_offset, t.len, &mut pieces);
            arena.write_parts(u64::from(t.frame) * self.inner.page_size + t.page_offset, &pieces)?;
        }
        self.inner.counters.host_io.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the region at `offset` into `buf` (pages never written read as zeros). Refused while a page of the
    /// range is leased for writing.
    pub fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        // A prefetch in flight only copies from pages' existing copies into frames no page uses yet: reading
        // beside it is safe.
        let mut st = lock(&self.inner.state);
        let dir = &mut st.dir;
        let pieces = dir.plan_read(region, offset, buf.len() as u64)?;
        for p in pieces {
            let out = &mut buf[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
            match p.source {
                ReadSource::Zero => out.fill(0),
                ReadSource::At(loc, frame) => {
                    let arena = self.arena_at(dir, loc)?;
                    arena.read(u64::from(frame) * self.inner.page_size + p.page_offset, out)?;
                }
            }
        }
        self.inner.counters.host_io.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Acquires the pages covering `range` of a region on `device`: when it returns, they are there, and stay
    /// there at the lease's addresses until it is released. `Read` may replicate pages (other devices keep their
    /// copies); `Write` makes the device's copy the only one. Pages not yet there are fetched (from a peer GPU
    /// over NVLink before host memory), evicting other pages to make room, and compacting the device when it is
    /// too fragmented for one run of frames. When the acquire continues a walk of the region in order, the
    /// copies of the pages after it start before it returns (see the module's docs).
    pub fn acquire(
        &self,
        region: &Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<Lease, FabricError> {
        let len = range.end.checked_sub(range.start).ok_or(FabricError::OutOfBounds {
            offset: range.start,
            len: 0,
            region_len: region.len,
        })?;
        let mut req = AcquireRequest::new(*region, range.start, len, device, mode);
        let mut st = lock(&self.inner.state);
        self.settle_if_done(&mut st);
        let grant = self.drive(&mut st, |d| d.step_acquire(&mut req))?;
        let dev = st.dir.dev(device)?;
        self.prefetch(&mut st, region, device);
        drop(st);
        let base = self.inner.arenas[usize::from(dev)].device_ptr();
        let ps = self.inner.page_size;
        let frames = grant.frames.frames();
        let ptr = match &grant.frames {
            LeaseFrames::Run { first, len } => {
                LeasePtr::Contiguous { ptr: base + u64::from(*first) * ps, len: u64::from(*len) * ps }
            }
            LeaseFrames::Pages(v) => LeasePtr::Pages(v.iter().map(|&f| base + u64::from(f) * ps).collect()),
        };
        Ok(Lease {
            inner: Arc::clone(&self.inner),
            id: grant.id,
            region: *region,
            device,
            mode,
            first_page: grant.first_page,
            frames,
            ptr,
            released: false,
        })
    }

    /// Releases a lease (dropping it does the same, logging instead of returning an error).
    pub fn release(&self, mut lease: Lease) -> Result<(), FabricError> {
        lease.released = true;
        Ok(lock(&self.inner.state).dir.release(lease.id)?)
    }

    /// Moves a region to `device`: new pages go there, and pages on other GPUs move there (those that do not fit
    /// go to host memory). Refused while any page is leased.
    pub fn migrate(&self, region: &Region, device: Location) -> Result<(), FabricError> {
        let mut st = lock(&self.inner.state);
        self.drive(&mut st, |d| d.step_migrate(region, device))
    }

    /// Moves unleased pages within `device` so that a run of `frames` free frames exists (what an acquire does
    /// on its own when a device is too fragmented). Returns the pages moved.
    pub fn compact(&self, device: Location, frames: u32) -> Result<u64, FabricError> {
        let before = self.inner.counters.compacted.load(Ordering::Relaxed);
        let mut st = lock(&self.inner.state);
        self.drive(&mut st, |d| d.plan_compaction(device, frames))?;
        Ok((self.inner.counters.compacted.load(Ordering::Relaxed) - before) / self.inner.page_size)
    }

    /// The version of a byte range of a region: it changes whenever a write to one of its pages is released,
    /// so a copy of the range made at one version is current exactly while the version stays the same.
    pub fn version(&self, region: &Region, range: Range<u64>) -> Result<u64, FabricError> {
        let len = range.end.saturating_sub(range.start);
        Ok(lock(&self.inner.state).dir.version(region, range.start, len)?)
    }

    /// Figures about the directory and the bytes moved.
    pub fn stats(&self) -> Stats {
        Stats { directory: lock(&self.inner.state).dir.stats(), traffic: self.inner.counters.snapshot() }
    }

    /// Bytes moved since start.
    pub fn traffic(&self) -> Traffic {
        self.inner.counters.snapshot()
    }

    /// Sets a tenant's quota on a tier (bytes; `None` for no limit).
    pub fn set_quota(&self, tenant: vfabric_allocator::TenantId, tier: vfabric_allocator::Tier, limit: Option<u64>) {
        lock(&self.inner.state).dir.quotas_mut().set_limit(tenant, tier, limit);
    }

    fn arena_at(&self, dir: &Directory, location: Location) -> Result<&Arc<dyn Arena>, FabricError> {
        let i: DevIdx = dir.dev(location)?;
        Ok(&self.inner.arenas[usize::from(i)])
    }

    /// Runs a directory call to completion, carrying out each stage it asks for (and finishing the prefetch
    /// in flight when it has to wait for it).
    fn drive<T>(
        &self,
        st: &mut State,
        mut step: impl FnMut(&mut Directory) -> Result<Step<T>, DirectoryError>,
    ) -> Result<T, FabricError> {
        // Each stage frees, moves or fills at least one frame; a bound only guards against a directory bug.
        for _ in 0..1_000_000 {
            match step(&mut st.dir)? {
                Step::Done(t) => return Ok(t),
                Step::Stage(stage) => match self.start(&st.dir, &stage).and_then(|c| self.finish(&stage, c)) {
                    Ok(()) => st.dir.commit(stage),
                    Err(e) => {
                        st.dir.abort(stage);
                        return Err(e);
                    }
                },
                Step::Wait => {
                    if st.prefetch.is_empty() {
                        return Err(FabricError::InvalidSize(
                            "the directory waits for a prefetch the fabric does not have".into(),
                        ));
                    }
                    self.settle(st);
                }
            }
        }
        Err(FabricError::InvalidSize("the directory asked for a million stages without finishing".into()))
    }

    /// Starts the prefetches the directory asks for after an acquire of `region` on `device`, if any. Failures
    /// only cost the prefetch: the acquire that wants the pages later fetches them itself.
    fn prefetch(&self, st: &mut State, region: &Region, device: Location) {
        for _ in 0..PREFETCH_DEPTH {
            let stage = match self.drive(st, |d| d.step_prefetch(region, device)) {
                Ok(Some(stage)) => stage,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(%region, %device, error = %e, "making room for a prefetch failed");
                    return;
                }
            };
            match self.start(&st.dir, &stage) {
                Ok(copies) => st.prefetch.push_back(InFlight { stage, copies }),
                Err(e) => {
                    tracing::warn!(%region, %device, error = %e, "starting a prefetch failed");
                    st.dir.abort(stage);
                    return;
                }
            }
        }
    }

    /// Waits for the oldest prefetch in flight, if any, and commits it (or, when a copy failed, aborts it: its
    /// pages stay where they were).
    fn settle(&self, st: &mut State) {
        let Some(p) = st.prefetch.pop_front() else { return };
        match self.finish(&p.stage, p.copies) {
            Ok(()) => st.dir.commit(p.stage),
            Err(e) => {
                tracing::warn!(error = %e, pages = p.stage.pages(), "a prefetch failed; its pages stay where they were");
                st.dir.abort(p.stage);
            }
        }
    }

    /// Commits the prefetches whose copies have all arrived, oldest first (without blocking).
    fn settle_if_done(&self, st: &mut State) {
        while let Some(p) = st.prefetch.front_mut() {
            if p.copies.iter_mut().any(|t| matches!(t.is_complete(), Ok(false))) {
                return;
            }
            self.settle(st);
        }
    }

    /// Zero-fills a stage's new pages and starts its copies (all batches at once).
    fn start(&self, dir: &Directory, stage: &Stage) -> Result<Vec<Transfer>, FabricError> {
        let ps = self.inner.page_size;
        // One fill per run of consecutive frames: a fill waits for the device, so per-page fills would cost a
        // synchronisation each.
        let mut zero = stage.zero.clone();
        zero.sort_unstable();
        let mut runs: Vec<(Location, u32, u32)> = Vec::new();
        for (loc, frame) in zero {
            match runs.last_mut() {
                Some((l, start, len)) if *l == loc && *start + *len == frame => *len += 1,
                _ => runs.push((loc, frame, 1)),
            }
        }
        for (loc, start, len) in runs {
            self.arena_at(dir, loc)?.fill(u64::from(start) * ps, u64::from(len) * ps, 0)?;
        }
        let mut copies = Vec::with_capacity(stage.batches.len());
        for b in &stage.batches {
            let batch = PageBatch::from_moves(ps, b.moves.clone());
            let (src, dst) = (self.arena_at(dir, b.from)?, self.arena_at(dir, b.to)?);
            copies.push(self.inner.mover.submit(src, dst, &batch, EngineChoice::Auto)?);
        }
        Ok(copies)
    }

    /// Waits for a stage's copies and counts the bytes.
    fn finish(&self, stage: &Stage, copies: Vec<Transfer>) -> Result<(), FabricError> {
        let ps = self.inner.page_size;
        let c = &self.inner.counters;
        let counter = match stage.kind {
            StageKind::Evict => &c.evicted,
            StageKind::Compact => &c.compacted,
            StageKind::Fetch | StageKind::Prefetch => &c.fetched,
            StageKind::Migrate => &c.migrated,
        };
        for (t, b) in copies.into_iter().zip(&stage.batches) {
            let bytes = t.wait()?.bytes;
            // Pages moved within one device (into a run of frames) count as compaction, whatever the stage.
            let which = if b.from == b.to { &c.compacted } else { counter };
            which.fetch_add(bytes, Ordering::Relaxed);
            if stage.kind == StageKind::Prefetch && b.from != b.to {
                c.prefetched.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        counter.fetch_add(stage.zero.len() as u64 * ps, Ordering::Relaxed);
        c.stages.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The bytes `start..start + len` of `parts` taken one after the other, as slices of the parts, into `out`
/// (cleared first). The range must lie within the parts.
fn slice_parts<'a>(parts: &[&'a [u8]], start: u64, len: u64, out: &mut Vec<&'a [u8]>) {
    out.clear();
    let (mut skip, mut want) = (start as usize, len as usize);
    for p in parts {
        if want == 0 {
            break;
        }
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        let take = (p.len() - skip).min(want);
        out.push(&p[skip..skip + take]);
        want -= take;
        skip = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::slice_parts;
    use proptest::prelude::*;

    proptest! {
        /// Any range of the parts, taken as slices, is the same range of the parts put together.
        #[test]
        fn slices_of_parts_are_the_range(lens in proptest::collection::vec(0usize..40, 1..8), a in 0usize..300, b in 0usize..300) {
            let parts: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (i * 50 + j) as u8).collect()).collect();
            let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let whole = parts.concat();
            let (lo, hi) = (a.min(b).min(whole.len()), a.max(b).min(whole.len()));
            let mut out = Vec::new();
            slice_parts(&refs, lo as u64, (hi - lo) as u64, &mut out);
            prop_assert_eq!(out.concat(), whole[lo..hi].to_vec());
            prop_assert!(out.iter().all(|s| !s.is_empty()) || hi == lo);
        }
    }
}
