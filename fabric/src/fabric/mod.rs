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

mod compressed;
mod copying;
mod lease;
mod node;
mod packed;
mod parts;
mod placement;
mod plan;
mod probe_skip;
mod reservation;
mod stages;
mod stalled;
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
use vfabric_transport::{Arena, ArenaSpec, ChannelId, DeviceError, DeviceKind, ExportedArena, PeerChannel};

use node::{lock, Inner, State};
use parts::slice_parts;
use stalls::StallCounters;
use traffic::Counters;

use crate::config::ClusterConfig;
use crate::directory::{
    AcquireRequest, Directory, DirectoryConfig, DirectoryError, LeaseFrames, Mode, Placement, ReadSource, RegionHandle,
    Stage, Step,
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
        // pieces are sized so that each fits in whichever its region's pages land in (never the compressed tier,
        // which pages reach only from host memory's frames).
        let host_bytes = devices
            .iter()
            .filter(|d| d.0.is_host_memory() && d.0 != Location::Compressed)
            .map(|d| d.1 / d.0.frame_bytes(ps) * ps)
            .min()
            .unwrap_or(0);
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
        let memory = &config.memory;
        dir.set_host_watermarks(memory.host_high_watermark_percent, memory.host_low_watermark_percent)?;
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
                state: Mutex::new(State {
                    dir,
                    prefetch: VecDeque::new(),
                    arrived: Vec::new(),
                    probes: Default::default(),
                    parked: Vec::new(),
                    deferred: Vec::new(),
                    copy_deadline: std::time::Duration::from_millis(config.device.copy_deadline_ms),
                }),
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

    /// A new identity for a channel between one of this node's GPUs and another process's (NCCL), which the
    /// other end joins too ([`Fabric::join_channel`]).
    pub fn channel_id(&self) -> Result<ChannelId, FabricError> {
        Ok(self.inner.layer.channel_id()?)
    }

    /// Joins channel `id` as rank `rank.0` of `rank.1` on GPU `gpu`, waiting at most `timeout` for the other
    /// ends (blocking).
    pub fn join_channel(
        &self,
        gpu: u16,
        id: &ChannelId,
        rank: (usize, usize),
        timeout: std::time::Duration,
    ) -> Result<Box<dyn PeerChannel>, FabricError> {
        Ok(self.inner.layer.join_channel(gpu, id, rank, timeout)?)
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
        let mut st = self.state()?;
        let freed = self.drive(&mut st, |d| d.free(region));
        // Even when freeing failed late (the slot may already be free for the next region).
        st.probes.forget(region.slot);
        freed
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
        let mut st = self.state()?;
        let targets = self.drive(&mut st, |d| d.step_write(region, offset, len))?;
        let lossy = st.dir.region(region)?.placement.compression.lossy();
        let ps = self.inner.page_size;
        // Pages packed in host memory are packed again together at the end (on several cores).
        let (mut pieces, mut repackings) = (Vec::new(), Vec::new());
        for t in targets {
            let arena = self.arena_at(&st.dir, t.location)?;
            slice_parts(parts, t.buf_offset, t.len, &mut pieces);
            // A whole page written into host memory's frames is packed for the compressed tier once it is there
            // (a page written in part is left whole: the next small write would have to bring it up again).
            if t.location == Location::Host && t.len == ps {
                st.arrived.push(t.frame);
            }
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
        self.pack_arrivals(&mut st);
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
                    storage.read(&mut [(u64::from(slot), &mut page[..])]).map_err(|source| {
                        let (region, page) = (region.to_string(), (offset + p.buf_offset) / ps);
                        FabricError::StoredPage { region, page, slot: u64::from(slot), source }
                    })?;
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
                ReadSource::At(Location::Compressed, start) => {
                    let mut page = vec![0u8; ps as usize];
                    compressed::expand(self.arena_at(dir, Location::Compressed)?.as_ref(), start, &mut page)?;
                    out.copy_from_slice(&page[p.page_offset as usize..(p.page_offset + p.len) as usize]);
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
        let mut st = self.state()?;
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
        let mut st = self.state()?;
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
        let mut st = self.state()?;
        self.drive(&mut st, |d| d.step_migrate(region, device))
    }

    /// Moves unleased pages within `device` so that a run of `frames` free frames exists (what an acquire does
    /// on its own when a device is too fragmented). Returns the pages moved.
    pub fn compact(&self, device: Location, frames: u32) -> Result<u64, FabricError> {
        let before = self.inner.counters.compacted.load(Ordering::Relaxed);
        let mut st = self.state()?;
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
        let mut st = lock(&self.inner.state);
        // Stalled copies that have finished since are taken in first: the figures say what holds now.
        let _ = self.unpark(&mut st);
        Stats {
            stalled: self.stalled_now(&st),
            directory: st.dir.stats(),
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
