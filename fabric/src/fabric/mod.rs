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
//!
//! The files: `node` (what the fabric holds, shared with its leases), `lease` ([`Lease`], [`LeasePtr`],
//! [`LeasedPages`]: the bytes under a lease), `traffic` ([`Traffic`]: what moved), `parts` (payloads in pieces).

mod copying;
mod lease;
mod node;
mod packed;
mod parts;
mod placement;
mod plan;
mod reservation;
mod stalls;
mod stats;
mod traffic;

pub use lease::{Lease, LeasePtr, LeasedPages};
pub use plan::NodePlan;
pub use reservation::Reservation;
pub use stalls::Stalls;
pub use stats::{Stats, StorageUsage};
pub use traffic::Traffic;

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vfabric_allocator::{Location, NodeId, TenantId, Tier};
use vfabric_transport::storage::{AlignedBuffer, StorageFile, StorageSpec};
use vfabric_transport::{Arena, ArenaSpec, DeviceError, DeviceKind, ExportedArena, PageBatch};

use copying::Copying;
use node::{lock, InFlight, Inner, State};
use parts::slice_parts;
use stalls::StallCounters;
use traffic::Counters;

use crate::config::ClusterConfig;
use crate::directory::{
    AcquireRequest, Directory, DirectoryConfig, DirectoryError, LeaseFrames, Mode, Placement, ReadSource, RegionHandle,
    Stage, StageKind, Step, PREFETCH_DEPTH, STAGING_DEPTH,
};
use crate::error::FabricError;

/// A region of the fabric's address space: a name, not memory (where its pages live is the directory's
/// business). Cheap to copy; using it after [`Fabric::free`] is an error, never a crash.
pub type Region = RegionHandle;

/// The fabric of one node, in this process.
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<Inner>,
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
        let plan = NodePlan::for_node(config, node)?;
        let layer = Arc::clone(&plan.layer);
        let page = config.memory.page();
        let ps = page.bytes();
        let mut devices = plan.arenas.clone();
        // The smallest host memory, in bytes of pages (a packed tier's slots hold a page each): a host write's
        // pieces are sized so that each fits in whichever its region's pages land in.
        let host_bytes =
            devices.iter().filter(|d| d.0.is_host_memory()).map(|d| d.1 / d.0.frame_bytes(ps) * ps).min().unwrap_or(0);
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
        let storage = match (&config.storage, plan.storage) {
            (Some(s), Some(bytes)) => {
                let spec = StorageSpec { path: s.path_of(config, node), bytes, page_size: ps, depth: s.depth };
                let file = StorageFile::create(&spec)?;
                tracing::info!(path = %spec.path.display(), bytes = spec.bytes, "storage tier ready");
                devices.push((Location::Storage, spec.bytes));
                Some(Arc::new(file))
            }
            _ => None,
        };
        let dir = Directory::new(
            DirectoryConfig {
                node: NodeId(node),
                page_size: page,
                headroom_percent: config.memory.headroom_percent,
                fit: config.memory.fit,
                high_watermark_percent: config.memory.high_watermark_percent,
                low_watermark_percent: config.memory.low_watermark_percent,
                readahead_pages: (config.memory.readahead.bytes() / ps).min(u64::from(u32::MAX)) as u32,
                epoch: epoch(),
            },
            &devices,
        )?;
        let mut dir = dir;
        for t in &config.tenants {
            for (tier, limit) in [(Tier::Gpu, t.gpu), (Tier::Host, t.host), (Tier::Nvme, t.storage)] {
                if let Some(limit) = limit {
                    dir.quotas_mut().set_limit(TenantId(t.id), tier, Some(limit.bytes()));
                }
            }
        }
        let mover = layer.mover(config.mover)?;
        Ok(Fabric {
            inner: Arc::new(Inner {
                state: Mutex::new(State { dir, prefetch: VecDeque::new() }),
                layer,
                arenas,
                mover,
                page_size: ps,
                counters: Counters::default(),
                stalls: StallCounters::default(),
                fallback: plan.fallback,
                write_piece: match storage {
                    Some(_) => (host_bytes / 4 / ps).max(1) * ps,
                    None => u64::MAX,
                },
                storage,
            }),
        })
    }

    /// Describes the node's arenas and hands out new descriptors of their memory, for a local client to map
    /// (the agent passes them over its Unix socket): one per device, in the order of [`Fabric::devices`].
    pub fn export_arenas(&self) -> Result<Vec<ExportedArena>, FabricError> {
        Ok(self.inner.arenas.iter().map(|a| a.export()).collect::<Result<_, _>>()?)
    }

    /// Where device address `ptr` (of a lease on `location`) is in that device's arena, in bytes from its start.
    pub fn arena_offset(&self, location: Location, ptr: u64) -> Result<u64, FabricError> {
        let base = self.inner.arena(&lock(&self.inner.state).dir, location)?.device_ptr();
        ptr.checked_sub(base).ok_or(FabricError::Internal("a lease's pointer below its arena"))
    }

    /// Waits until the work this process queued on `location` (its kernels and copies on any stream, PyTorch's
    /// among them) is done: call it before releasing a lease that such work was using.
    pub fn synchronize(&self, location: Location) -> Result<(), FabricError> {
        Ok(self.inner.layer.synchronize(location)?)
    }

    /// One line that says what the device layer is (backend and GPUs), for logs and reports.
    pub fn describe(&self) -> String {
        self.inner.layer.describe()
    }

    /// Which device layer runs: CUDA, or the emulated device.
    pub fn device_kind(&self) -> DeviceKind {
        self.inner.layer.kind()
    }

    /// Whether NCCL's library can be loaded on this node.
    pub fn nccl_available(&self) -> bool {
        self.inner.layer.nccl_available()
    }

    /// Copies `buf.len()` bytes at device address `ptr` on `location` into `buf`: what a kernel reading through a
    /// lease's pointer sees. The range must lie within the fabric's arena there. For checks and tools.
    pub fn read_device(&self, location: Location, ptr: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let (arena, offset) = self.at_device(location, ptr, buf.len() as u64)?;
        Ok(arena.read(offset, buf)?)
    }

    /// Sets `len` bytes at device address `ptr` on `location` to `byte` (a device memset, as a kernel writing
    /// through a lease's pointer would). The range must lie within the fabric's arena there.
    pub fn fill_device(&self, location: Location, ptr: u64, len: u64, byte: u8) -> Result<(), FabricError> {
        let (arena, offset) = self.at_device(location, ptr, len)?;
        Ok(arena.fill(offset, len, byte)?)
    }

    /// The arena of `location` and the offset in it of device address `ptr`, checked for `len` bytes.
    fn at_device(&self, location: Location, ptr: u64, len: u64) -> Result<(Arc<dyn Arena>, u64), FabricError> {
        let arena = Arc::clone(self.arena_at(&lock(&self.inner.state).dir, location)?);
        let offset =
            ptr.checked_sub(arena.device_ptr()).filter(|o| o.checked_add(len).is_some_and(|e| e <= arena.len()));
        let offset = offset.ok_or(FabricError::OutOfBounds { offset: ptr, len, region_len: arena.len() })?;
        Ok((arena, offset))
    }

    /// Memory of `bytes` on `location` outside the fabric's arenas, created once and mapped for every GPU of the
    /// node as they are: for a caller's own buffers, such as the target of [`LeasedPages::copy_to`].
    pub fn scratch_arena(&self, location: Location, bytes: u64) -> Result<Arc<dyn Arena>, FabricError> {
        Ok(self.inner.layer.create_arena(&ArenaSpec::new(location, bytes))?)
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

    /// Allocates a region of `size` bytes (rounded up to whole pages). `placement` picks the device its pages
    /// go to (a hint; by default the GPU with the most free memory). No memory is taken until pages are
    /// written or acquired; a region may be larger than any GPU, or than the node: the directory's record of
    /// it grows with the pages it uses (8 bytes per 1,024 pages until then). The limit is the node's address
    /// space, 256 TiB for all its regions together (48 bits of every global address), in at most 2^32 pages a
    /// region: past it, a typed error (`AddressSpaceExhausted`, `TooManyPages`).
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
    /// evicted). Refused while any page of the range is leased. With a storage tier, a write of more than a
    /// quarter of host memory (or of a packed tier's pages, when smaller) goes in pieces of that size, each
    /// placed in turn while the ones before it move down a tier (a write can then be larger than GPUs and host
    /// memory together); a failure midway leaves the pieces before it written, and of the failed piece any part.
    pub fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let piece = self.inner.write_piece as usize;
        if data.len() <= piece {
            return self.write_parts(region, offset, &[data]);
        }
        for (i, chunk) in data.chunks(piece).enumerate() {
            self.write_parts(region, offset + (i * piece) as u64, &[chunk])?;
        }
        Ok(())
    }

    /// [`Fabric::write`] of `parts` one after the other (a payload that arrived in pieces, such as a QUIC
    /// chunk in quinn's receive buffers): each piece is copied once, to its place, without gathering them
    /// first where the pages live in host memory.
    pub fn write_parts(&self, region: &Region, offset: u64, parts: &[&[u8]]) -> Result<(), FabricError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut st = lock(&self.inner.state);
        let targets = self.drive(&mut st, |d| d.step_write(region, offset, len))?;
        let lossy = st.dir.region(region)?.placement.compression.lossy();
        let ps = self.inner.page_size;
        // Pages packed in host memory are packed again together at the end (on several cores).
        let (mut pieces, mut repackings) = (Vec::new(), Vec::new());
        for t in targets {
            let arena = self.arena_at(&st.dir, t.location)?;
            slice_parts(parts, t.buf_offset, t.len, &mut pieces);
            let at = u64::from(t.frame) * t.location.frame_bytes(ps);
            match lossy {
                Some(_) if t.location.is_host_memory() => repackings.push(packed::Repacking {
                    arena: arena.as_ref(),
                    at,
                    page_offset: t.page_offset,
                    pieces: pieces.clone(),
                }),
                _ => arena.write_parts(at + t.page_offset, &pieces)?,
            }
        }
        if let Some(l) = lossy.filter(|_| !repackings.is_empty()) {
            packed::write_all(l, ps, repackings)?;
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
        let lossy = dir.region(region)?.placement.compression.lossy();
        let ps = self.inner.page_size;
        // Pages packed in host memory are expanded together at the end (on several cores); the pieces cover
        // `buf` in order, so each takes its own slice of it.
        let (mut expansions, mut rest, mut rest_at) = (Vec::new(), &mut buf[..], 0);
        for p in pieces {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((p.buf_offset - rest_at) as usize);
            let (out, tail) = tail.split_at_mut(p.len as usize);
            (rest, rest_at) = (tail, p.buf_offset + p.len);
            match p.source {
                ReadSource::Zero => out.fill(0),
                ReadSource::At(Location::Storage, slot) => {
                    let storage = self
                        .inner
                        .storage
                        .as_ref()
                        .ok_or(FabricError::Internal("a read names a storage tier this node has not"))?;
                    let mut page = AlignedBuffer::new(self.inner.page_size as usize)
                        .ok_or(FabricError::Internal("no memory for a page read from the storage tier"))?;
                    storage.read(&mut [(u64::from(slot), &mut page[..])])?;
                    let expanded;
                    let page: &[u8] = match lossy {
                        Some(l) => {
                            expanded = packed::expand(l, &page, ps);
                            &expanded
                        }
                        None => &page,
                    };
                    out.copy_from_slice(&page[p.page_offset as usize..(p.page_offset + p.len) as usize]);
                    self.inner.counters.from_storage.fetch_add(self.inner.page_size, Ordering::Relaxed);
                }
                ReadSource::At(loc, frame) => {
                    let arena = self.arena_at(dir, loc)?;
                    let at = u64::from(frame) * loc.frame_bytes(ps);
                    match lossy {
                        Some(_) if loc.is_host_memory() => expansions.push(packed::Expansion {
                            arena: arena.as_ref(),
                            at,
                            page_offset: p.page_offset,
                            out,
                        }),
                        _ => arena.read(at + p.page_offset, out)?,
                    }
                }
            }
        }
        if let Some(l) = lossy.filter(|_| !expansions.is_empty()) {
            packed::read_all(l, ps, expansions)?;
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
        let len = range_len(region, &range)?;
        let mut req = AcquireRequest::new(*region, range.start, len, device, mode);
        let mut st = lock(&self.inner.state);
        self.settle_if_done(&mut st);
        let grant = self.drive(&mut st, |d| d.step_acquire(&mut req))?;
        let dev = st.dir.dev(device)?;
        self.prefetch_walk(&mut st, region, device);
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

    /// Starts bringing bytes `range` of a region to `device` and returns: an acquire of the range there later
    /// finds its pages in place, in one run (or waits for the copies still running). For callers that know
    /// what they will want next (a layer's weights while the layer before computes); walks in order are
    /// prefetched without asking. Pages in place, on their way, leased for writing or never written are left
    /// as they are. Room is made as an acquire makes it (evictions run before this returns), never by evicting
    /// the range's own pages; when there is no room, nothing starts. At most 128 prefetches and write-backs are
    /// in flight: past that, this waits for one to land.
    pub fn prefetch(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError> {
        self.hint(region, range, |d, at, len| d.step_prefetch_range(region, at, len, device))
    }

    /// Starts copying the pages of bytes `range` of a region whose only copy is on `device` to host memory, and
    /// returns: once the copies land, evicting those pages from the device is a drop instead of a copy in
    /// someone's acquire. For callers that have finished writing pages they will not need again soon (a
    /// layer's optimizer states after its step). The device copies stay, and are the ones leases get; the
    /// GPU work that wrote them must be complete (a lease's release is the point). Pages under a write lease
    /// are skipped. A later acquire or free of the range waits for the copies. At most 128 prefetches
    /// and write-backs are in flight: past that, this waits for one to land.
    pub fn write_back(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError> {
        self.hint(region, range, |d, at, len| d.step_write_back(region, at, len, device))
    }

    /// Runs a hint's directory step (given the range's start and length) and starts the stage it asks for,
    /// left in flight.
    fn hint(
        &self,
        region: &Region,
        range: Range<u64>,
        mut step: impl FnMut(&mut Directory, u64, u64) -> Result<Step<Option<Stage>>, DirectoryError>,
    ) -> Result<(), FabricError> {
        let len = range_len(region, &range)?;
        let mut st = lock(&self.inner.state);
        self.settle_if_done(&mut st);
        match self.drive(&mut st, |d| step(d, range.start, len))? {
            Some(stage) => self.launch(&mut st, stage),
            None => Ok(()),
        }
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
        let in_use = lock(&self.inner.state).dir.frames_in_use(Location::Storage);
        let storage = self.inner.storage.as_ref().map(|s| {
            // The slots whose copies the directory still has: a dropped copy's slot keeps its bytes until reused.
            let (file_bytes, pages) = s.stored_in(in_use.into_iter().map(u64::from));
            StorageUsage { pages, page_bytes: pages * s.page_size(), file_bytes }
        });
        Stats {
            directory: lock(&self.inner.state).dir.stats(),
            traffic: self.inner.counters.snapshot(),
            stalls: self.inner.stalls.snapshot(),
            storage,
        }
    }

    /// Bytes moved since start.
    pub fn traffic(&self) -> Traffic {
        self.inner.counters.snapshot()
    }

    fn arena_at(&self, dir: &Directory, location: Location) -> Result<&Arc<dyn Arena>, FabricError> {
        self.inner.arena(dir, location)
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
                Step::Stage(stage) => match self.carry_out(&st.dir, &stage) {
                    Ok(()) => st.dir.commit(stage),
                    Err(e) => {
                        st.dir.abort(stage);
                        return Err(e);
                    }
                },
                Step::Wait => {
                    if st.prefetch.is_empty() {
                        return Err(FabricError::Internal(
                            "the directory waits for a prefetch the fabric does not have",
                        ));
                    }
                    let t = Instant::now();
                    self.settle_some(st);
                    self.inner.stalls.in_flight(t.elapsed());
                }
            }
        }
        Err(FabricError::Internal("the directory asked for a million stages without finishing"))
    }

    /// Starts a stage's copies and waits for them, counting the wait.
    fn carry_out(&self, dir: &Directory, stage: &Stage) -> Result<(), FabricError> {
        let t = Instant::now();
        let done = self.start(dir, stage).and_then(|c| self.finish(stage, c));
        self.inner.stalls.stage(stage.kind, t.elapsed());
        done
    }

    /// Starts the prefetches the directory asks for after an acquire of `region` on `device`, if any. Failures
    /// only cost the prefetch: the acquire that wants the pages later fetches them itself.
    fn prefetch_walk(&self, st: &mut State, region: &Region, device: Location) {
        for _ in 0..PREFETCH_DEPTH + STAGING_DEPTH {
            let stage = match self.drive(st, |d| d.step_prefetch(region, device)) {
                Ok(Some(stage)) => stage,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(%region, %device, error = %e, "making room for a prefetch failed");
                    return;
                }
            };
            if let Err(e) = self.launch(st, stage) {
                tracing::warn!(%region, %device, error = %e, "starting a prefetch failed");
                return;
            }
        }
    }

    /// Starts a stage that stays in flight across calls (a prefetch or a write-back); aborts it if a copy
    /// cannot start.
    fn launch(&self, st: &mut State, stage: Stage) -> Result<(), FabricError> {
        let t = Instant::now();
        let started = self.start(&st.dir, &stage);
        self.inner.stalls.launch(t.elapsed());
        match started {
            Ok(copies) => {
                st.prefetch.push_back(InFlight { stage, copies });
                Ok(())
            }
            Err(e) => {
                st.dir.abort(stage);
                Err(e)
            }
        }
    }

    /// Commits the stage in flight at `i` once its copies have arrived (or, when a copy failed, aborts it: its
    /// pages stay where they were).
    fn settle(&self, st: &mut State, i: usize) {
        let Some(p) = st.prefetch.remove(i) else { return };
        match self.finish(&p.stage, p.copies) {
            Ok(()) => st.dir.commit(p.stage),
            Err(e) => {
                tracing::warn!(error = %e, pages = p.stage.pages(), "a prefetch failed; its pages stay where they were");
                st.dir.abort(p.stage);
            }
        }
    }

    /// Commits every stage in flight whose copies have all arrived (or failed), without blocking; returns how
    /// many. Stages in flight never share a page or a frame, so they commit in any order: a write-back still
    /// running does not hold up the prefetch an acquire waits for.
    fn settle_if_done(&self, st: &mut State) -> usize {
        let mut settled = 0;
        let mut i = 0;
        while i < st.prefetch.len() {
            if st.prefetch[i].copies.iter_mut().any(|t| !t.is_complete()) {
                i += 1;
            } else {
                self.settle(st, i);
                settled += 1;
            }
        }
        settled
    }

    /// Blocks until at least one stage in flight has landed, and commits every one that has: what a call the
    /// directory told to wait needs. Polls (the copies run on the device; a poll is one query per transfer).
    fn settle_some(&self, st: &mut State) {
        while !st.prefetch.is_empty() && self.settle_if_done(st) == 0 {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }

    /// Zero-fills a stage's new pages and starts its copies (all batches at once).
    fn start(&self, dir: &Directory, stage: &Stage) -> Result<Vec<Copying>, FabricError> {
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
            // A packed tier's slot of zeros is a packed page of zeros (codes and scales 0).
            let stride = loc.frame_bytes(ps);
            self.arena_at(dir, loc)?.fill(u64::from(start) * stride, u64::from(len) * stride, 0)?;
        }
        let mut copies = Vec::with_capacity(stage.batches.len());
        for b in &stage.batches {
            if copying::is_storage(b.from, b.to) {
                let storage = self
                    .inner
                    .storage
                    .as_ref()
                    .ok_or(FabricError::Internal("a stage names a storage tier this node has not"))?;
                let to_storage = b.to == Location::Storage;
                // Host memory, or the packed tier, on the other side.
                let host = self.arena_at(dir, if to_storage { b.from } else { b.to })?;
                if stage.kind == StageKind::Prefetch && !to_storage {
                    // A prefetch stays in flight across calls: its reads run on a thread of their own.
                    copies.push(copying::storage_reads_behind(storage, host, ps, b.moves.clone())?);
                } else {
                    copies.push(copying::storage_batch(storage, host, ps, &b.moves, to_storage, b.compression)?);
                }
                continue;
            }
            let batch = PageBatch::from_moves(ps, b.moves.clone());
            let (src, dst) = (self.arena_at(dir, b.from)?, self.arena_at(dir, b.to)?);
            copies.push(copying::mover_batch(self.inner.mover.as_ref(), src, dst, &batch, b.compression)?);
        }
        Ok(copies)
    }

    /// Waits for a stage's copies and counts the bytes.
    fn finish(&self, stage: &Stage, copies: Vec<Copying>) -> Result<(), FabricError> {
        let ps = self.inner.page_size;
        let c = &self.inner.counters;
        let counter = match stage.kind {
            StageKind::Evict => &c.evicted,
            StageKind::Compact => &c.compacted,
            StageKind::Fetch | StageKind::Prefetch => &c.fetched,
            StageKind::Migrate => &c.migrated,
            StageKind::WriteBack => &c.written_back,
        };
        // Every copy is waited for, failed or not, before the stage can be aborted and its frames reused.
        let waited: Vec<Result<u64, FabricError>> = copies.into_iter().map(Copying::wait).collect();
        for (t, b) in waited.into_iter().zip(&stage.batches) {
            let bytes = t?;
            if b.to == Location::Storage {
                c.to_storage.fetch_add(bytes, Ordering::Relaxed);
            } else if b.from == Location::Storage {
                c.from_storage.fetch_add(bytes, Ordering::Relaxed);
            }
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

/// The length of `range` of a region, or the error for a range that ends before it starts.
pub(crate) fn range_len(region: &Region, range: &Range<u64>) -> Result<u64, FabricError> {
    range.end.checked_sub(range.start).ok_or(FabricError::OutOfBounds {
        offset: range.start,
        len: 0,
        region_len: region.len,
    })
}

/// A fresh directory epoch: different from one start of the fabric to the next (the time, the process and an
/// address mixed by xxh3), so handles of an earlier run are told apart; not a secret.
fn epoch() -> u32 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let here = &now as *const u128 as usize;
    let mut seed = [0u8; 32];
    seed[..16].copy_from_slice(&now.to_le_bytes());
    seed[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    seed[24..].copy_from_slice(&(here as u64).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&seed) as u32
}
