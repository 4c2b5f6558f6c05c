//! One node's memory as the fabric manages it: an arena per GPU and one of pinned host memory, each with its
//! frame allocator, the node's tenant quotas, and a mover.
//!
//! This is the layer the directory (coherence, leases, eviction) is built on: it hands out frames, moves pages
//! between frames of any two locations, and keeps every other page where it was when a call fails.

use std::sync::Arc;

use vfabric_allocator::{AllocClass, AllocError, FrameArena, FrameArenaConfig, FrameState, QuotaBook, TenantId, Tier};
use vfabric_transport::{
    open, Arena, ArenaSpec, DeviceError, DeviceLayer, EngineChoice, Location, MoveError, Mover, OpenOptions, PageBatch,
    PageMove, TransferReport,
};

use crate::config::ClusterConfig;

/// Why a node-memory operation failed. The operation changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The device layer failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A move failed.
    #[error(transparent)]
    Move(#[from] MoveError),
    /// Frames could not be allocated or freed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A location this node does not have.
    #[error("this node has no {0}")]
    NoSuchLocation(Location),
    /// The configuration names a GPU the node does not have.
    #[error("the configuration names GPU {gpu}, but this node has {count}")]
    ConfiguredGpuMissing {
        /// The GPU named.
        gpu: u16,
        /// How many the node has.
        count: usize,
    },
    /// A write or read of page data of the wrong length.
    #[error("page data of {got} bytes for {pages} pages of {page_size} bytes")]
    DataLength {
        /// Bytes given.
        got: usize,
        /// Pages addressed.
        pages: usize,
        /// Page size.
        page_size: u64,
    },
}

/// One location's memory: its arena and the frames in it.
pub struct DeviceMemory {
    /// Where it is.
    pub location: Location,
    /// The mapped memory.
    pub arena: Arc<dyn Arena>,
    /// Which frames of it are in use.
    pub frames: FrameArena,
}

/// A node's GPUs and host memory, as arenas of frames, and the mover between them.
pub struct NodeMemory {
    layer: Arc<dyn DeviceLayer>,
    fallback: Option<DeviceError>,
    mover: Arc<dyn Mover>,
    devices: Vec<DeviceMemory>,
    quotas: QuotaBook,
    page_size: u64,
}

impl NodeMemory {
    /// Opens the device layer the configuration asks for and creates every arena (once, mapped once).
    pub fn open(cfg: &ClusterConfig) -> Result<Self, NodeError> {
        let opened = open(&OpenOptions {
            backend: cfg.device.backend,
            emulated_gpus: cfg.device.emulated_gpus,
            emulated_gpu_memory: cfg.device.emulated_gpu_memory.bytes(),
        })?;
        let layer = opened.layer;
        let page = cfg.memory.page();
        let page_size = page.bytes();
        let all: Vec<u16> = layer.gpus().iter().map(|g| g.index).collect();
        let gpus = match cfg.nodes.first().and_then(|n| n.gpus.clone()) {
            Some(wanted) => {
                for &g in &wanted {
                    if !all.contains(&g) {
                        return Err(NodeError::ConfiguredGpuMissing { gpu: g, count: all.len() });
                    }
                }
                wanted
            }
            None => all,
        };
        let mut devices = Vec::new();
        let mut locations: Vec<(Location, u64)> = Vec::new();
        for &g in &gpus {
            let total = layer.gpus()[usize::from(g)].total_memory;
            locations.push((Location::Gpu(g), cfg.memory.gpu_arena_bytes(total)));
        }
        locations.push((Location::Host, cfg.memory.host_arena.bytes()));
        for (location, bytes) in locations {
            let bytes = bytes / page_size * page_size;
            let arena =
                layer.create_arena(&ArenaSpec { location, bytes, chunk_bytes: cfg.memory.chunk_size.bytes() })?;
            let tier = if location == Location::Host { Tier::Host } else { Tier::Gpu };
            let frames = FrameArena::new(
                FrameArenaConfig::new(tier, page, arena.len())
                    .with_budget(bytes)
                    .with_headroom(cfg.memory.headroom_percent)
                    .with_fit(cfg.memory.fit),
            )?;
            devices.push(DeviceMemory { location, arena, frames });
        }
        let mover = layer.mover(cfg.mover)?;
        Ok(NodeMemory { layer, fallback: opened.fallback_reason, mover, devices, quotas: QuotaBook::new(), page_size })
    }

    /// The device layer.
    pub fn layer(&self) -> &Arc<dyn DeviceLayer> {
        &self.layer
    }

    /// Why the emulated device runs although CUDA was wanted (`backend = "auto"` on a machine without a usable
    /// GPU), if it does.
    pub fn fallback_reason(&self) -> Option<&DeviceError> {
        self.fallback.as_ref()
    }

    /// The mover.
    pub fn mover(&self) -> &Arc<dyn Mover> {
        &self.mover
    }

    /// The page size of this node's frames.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Every location, GPUs first.
    pub fn locations(&self) -> Vec<Location> {
        self.devices.iter().map(|d| d.location).collect()
    }

    /// One location's memory.
    pub fn device(&self, location: Location) -> Result<&DeviceMemory, NodeError> {
        self.devices.iter().find(|d| d.location == location).ok_or(NodeError::NoSuchLocation(location))
    }

    /// The tenant quotas.
    pub fn quotas_mut(&mut self) -> &mut QuotaBook {
        &mut self.quotas
    }

    /// Allocates `n` frames at `location` for `tenant`.
    pub fn alloc(
        &mut self,
        location: Location,
        n: u32,
        tenant: TenantId,
        class: AllocClass,
    ) -> Result<Vec<u32>, NodeError> {
        let quotas = &mut self.quotas;
        let dev =
            self.devices.iter_mut().find(|d| d.location == location).ok_or(NodeError::NoSuchLocation(location))?;
        Ok(dev.frames.alloc(n, tenant, class, quotas)?.frames().collect())
    }

    /// Frees frames at `location`.
    pub fn free(&mut self, location: Location, frames: &[u32]) -> Result<(), NodeError> {
        let quotas = &mut self.quotas;
        let dev =
            self.devices.iter_mut().find(|d| d.location == location).ok_or(NodeError::NoSuchLocation(location))?;
        dev.frames.free(frames.iter().copied(), quotas)?;
        Ok(())
    }

    /// Writes `data` (one page per frame, in order) into `frames` at `location`.
    pub fn write_pages(&self, location: Location, frames: &[u32], data: &[u8]) -> Result<(), NodeError> {
        self.check_len(frames.len(), data.len())?;
        let dev = self.device(location)?;
        for (f, page) in frames.iter().zip(data.chunks_exact(self.page_size as usize)) {
            dev.arena.write(u64::from(*f) * self.page_size, page)?;
        }
        Ok(())
    }

    /// Reads `frames` at `location` into `out` (one page per frame, in order).
    pub fn read_pages(&self, location: Location, frames: &[u32], out: &mut [u8]) -> Result<(), NodeError> {
        self.check_len(frames.len(), out.len())?;
        let dev = self.device(location)?;
        for (f, page) in frames.iter().zip(out.chunks_exact_mut(self.page_size as usize)) {
            dev.arena.read(u64::from(*f) * self.page_size, page)?;
        }
        Ok(())
    }

    fn check_len(&self, pages: usize, got: usize) -> Result<(), NodeError> {
        if got as u64 != pages as u64 * self.page_size {
            return Err(NodeError::DataLength { got, pages, page_size: self.page_size });
        }
        Ok(())
    }

    /// Moves the pages in `frames` at `from` into newly allocated frames at `to`, waits for them, frees the old
    /// frames, and returns the new frames (in the same order) with the transfer's report. The new frames are
    /// charged to the tenant that owned each old one. On any error the pages stay where they were and nothing
    /// is allocated.
    pub fn migrate(
        &mut self,
        from: Location,
        frames: &[u32],
        to: Location,
        engine: EngineChoice,
    ) -> Result<(Vec<u32>, TransferReport), NodeError> {
        if from == to {
            return Err(NodeError::Move(MoveError::OverlappingFrames(frames.first().copied().unwrap_or(0))));
        }
        let src = self.device(from)?;
        let mut tenants = Vec::with_capacity(frames.len());
        for &f in frames {
            match src.frames.state(f) {
                Some(FrameState::Used { tenant }) => tenants.push(tenant),
                _ => return Err(NodeError::Alloc(AllocError::InvalidAddress { addr: u64::from(f) })),
            }
        }
        let src_arena = Arc::clone(&src.arena);
        let dst_arena = Arc::clone(&self.device(to)?.arena);
        // Frames are taken per tenant so each tenant's quota is charged for its own pages.
        let mut targets = vec![0u32; frames.len()];
        let mut taken: Vec<u32> = Vec::new();
        let mut by_tenant: Vec<(TenantId, Vec<usize>)> = Vec::new();
        for (i, t) in tenants.iter().enumerate() {
            match by_tenant.iter_mut().find(|(x, _)| x == t) {
                Some((_, v)) => v.push(i),
                None => by_tenant.push((*t, vec![i])),
            }
        }
        for (tenant, idx) in &by_tenant {
            match self.alloc(to, idx.len() as u32, *tenant, AllocClass::Reserved) {
                Ok(got) => {
                    for (i, f) in idx.iter().zip(&got) {
                        targets[*i] = *f;
                    }
                    taken.extend(got);
                }
                Err(e) => {
                    if !taken.is_empty() {
                        self.free(to, &taken)?;
                    }
                    return Err(e);
                }
            }
        }
        let batch = PageBatch::from_moves(
            self.page_size,
            frames.iter().zip(&targets).map(|(&s, &d)| PageMove { src: s, dst: d }).collect(),
        );
        let report = self.mover.submit(&src_arena, &dst_arena, &batch, engine).and_then(|t| t.wait());
        match report {
            Ok(r) => {
                self.free(from, frames)?;
                Ok((targets, r))
            }
            Err(e) => {
                self.free(to, &targets)?;
                Err(e.into())
            }
        }
    }

    /// Used and free frames per location, for reports.
    pub fn usage(&self) -> Vec<(Location, u32, u32)> {
        self.devices.iter().map(|d| (d.location, d.frames.used_frames(), d.frames.frames())).collect()
    }

    /// Frames of `location` that ordinary allocations may still take.
    pub fn available(&self, location: Location) -> Result<u32, NodeError> {
        Ok(self.device(location)?.frames.available(AllocClass::Normal))
    }
}
