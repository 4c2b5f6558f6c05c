//! The directory itself: its tables (devices, regions, leases, prefetches in flight), its constructor, and the
//! lookup of devices by location.

use std::collections::{HashMap, VecDeque};

use vfabric_allocator::{
    Fit, FrameArena, FrameArenaConfig, Location, PageSize, QuotaBook, RangeAllocator, TenantId, Tier, COMPRESSED_BLOCK,
    MAX_OFFSET,
};

use super::config::DirectoryConfig;
use super::error::DirectoryError;
use super::lease::LeaseRecord;
use super::lru::Lru;
use super::page::{Copy, DevIdx, PageRef};
use super::region::RegionEntry;

/// One device's frames and the pages in them.
pub(super) struct DeviceState {
    pub(super) location: Location,
    pub(super) frames: FrameArena,
    /// The page whose copy is in each frame.
    pub(super) users: Vec<Option<PageRef>>,
    /// Eviction order of the frames whose copy is not pinned by a lease.
    pub(super) lru: Lru,
    /// Frames of a GPU holding a copy a prefetch brought that no lease has taken since: evicted only when
    /// nothing else can go, so that a caller streaming through more than the device holds does not evict what
    /// it is about to use (prefetched and waiting) in favour of what it has just used.
    pub(super) fresh: Vec<bool>,
    /// In the compressed tier, the blocks of the run each copy takes, at the run's first frame (0 elsewhere);
    /// empty on every other device, whose copies take one frame each.
    pub(super) spans: Vec<u16>,
}

impl DeviceState {
    /// Whether it is a GPU (not the host, not the storage tier).
    pub(super) fn is_gpu(&self) -> bool {
        matches!(self.location, Location::Gpu(_))
    }
}

/// A stage in flight across later calls: a prefetch or a write-back. Every frame it names is pinned until it
/// commits or aborts, so that no compaction moves them and no eviction frees them: the frames it took (no page
/// points to them yet), the copies it moves into them, and the copies on other devices it reads.
#[derive(Debug, Clone)]
pub(super) struct InFlight {
    pub(super) slot: u32,
    /// The pages it covers (those already in place are not copied).
    pub(super) pages: std::ops::Range<u32>,
    /// Per page copied: the page, the frame it took, and the page's copy on the device that moves there (into
    /// the run), if it had one.
    pub(super) moves: Vec<(u32, Copy, Option<Copy>)>,
    /// Copies on other devices the stage reads, which must stay where they are until it lands (a prefetch's
    /// sources, a write-back's device copies).
    pub(super) sources: Vec<Copy>,
}

/// A reservation's frames, pinned and holding no page.
#[derive(Debug, Clone, Default)]
pub(super) struct Reservations {
    pub(super) held: HashMap<u64, (DevIdx, Vec<u32>, TenantId)>,
    pub(super) next: u64,
}

/// The directory of one node.
pub struct Directory {
    pub(super) cfg: DirectoryConfig,
    pub(super) devs: Vec<DeviceState>,
    pub(super) host: DevIdx,
    /// The storage tier, if the node has one: host memory's evictions go there.
    pub(super) storage: Option<DevIdx>,
    /// The compressed tier, if the node has one: lossless regions' pages go there from host memory's frames
    /// when they shrink (see `compressed.rs`).
    pub(super) compressed: Option<DevIdx>,
    pub(super) regions: Vec<Option<RegionEntry>>,
    pub(super) generations: Vec<u64>,
    pub(super) free_slots: Vec<u32>,
    pub(super) space: RangeAllocator,
    pub(super) quotas: QuotaBook,
    pub(super) leases: HashMap<u64, LeaseRecord>,
    pub(super) next_lease: u64,
    /// Reservations and the frames they hold.
    pub(super) reservations: Reservations,
    /// Stages in flight across calls, oldest first: prefetches (`prefetch.rs`) and write-backs (`hints.rs`).
    pub(super) in_flight: VecDeque<InFlight>,
    /// Host memory's high and low watermarks (percent of its ordinary frames) when the node has a storage tier.
    pub(super) host_watermarks: (u8, u8),
}

impl Directory {
    /// A directory over `devices` (location and arena size in bytes); exactly one must be the host, and at most
    /// one the storage tier, one packed tier of each slot size (whose frames are
    /// slots of [`Location::frame_bytes`], not pages) and one compressed tier (whose frames are blocks of
    /// [`COMPRESSED_BLOCK`], a page taking a run of them).
    pub fn new(cfg: DirectoryConfig, devices: &[(Location, u64)]) -> Result<Self, DirectoryError> {
        check_watermarks(cfg.high_watermark_percent, cfg.low_watermark_percent)?;
        let mut devs = Vec::new();
        for &(location, bytes) in devices {
            let tier = match location {
                Location::Gpu(_) => Tier::Gpu,
                // A slot of the packed tier counts against a tenant's host memory as a page does.
                Location::Host | Location::Packed(_) | Location::Compressed => Tier::Host,
                Location::Storage => Tier::Nvme,
            };
            // The arena counts frames of a page: as many as the device holds at its own frame size. The
            // compressed tier's count blocks, and charge quotas the bytes of the blocks a page takes.
            let ps = cfg.page_size.bytes();
            let (frame_size, bytes) = match location {
                Location::Compressed => (PageSize::BLOCK, bytes / COMPRESSED_BLOCK * COMPRESSED_BLOCK),
                _ => (cfg.page_size, bytes / location.frame_bytes(ps) * ps),
            };
            let frames = FrameArena::new(
                FrameArenaConfig::new(tier, frame_size, bytes).with_headroom(cfg.headroom_percent).with_fit(cfg.fit),
            )
            .map_err(|source| DirectoryError::InvalidArena { location, source })?;
            let n = frames.frames() as usize;
            if location == Location::Compressed && ps / COMPRESSED_BLOCK > u64::from(u16::MAX) {
                return Err(DirectoryError::InvalidArena {
                    location,
                    source: vfabric_allocator::AllocError::InvalidSize {
                        size: ps,
                        reason: "a page of the compressed tier takes at most 65,535 blocks",
                    },
                });
            }
            let spans = if location == Location::Compressed { vec![0; n] } else { Vec::new() };
            devs.push(DeviceState {
                location,
                frames,
                users: vec![None; n],
                lru: Lru::new(n),
                fresh: vec![false; n],
                spans,
            });
        }
        if devs.len() > usize::from(DevIdx::MAX) {
            return Err(DirectoryError::TooManyDevices(devs.len()));
        }
        let host = devs.iter().position(|d| d.location == Location::Host).ok_or(DirectoryError::NoHostArena)? as DevIdx;
        let storage = devs.iter().position(|d| d.location == Location::Storage).map(|i| i as DevIdx);
        let compressed = devs.iter().position(|d| d.location == Location::Compressed).map(|i| i as DevIdx);
        let ps = cfg.page_size.bytes();
        let space = RangeAllocator::new((MAX_OFFSET + 1) / ps * ps, ps, Fit::FirstFit)
            .map_err(DirectoryError::InvalidAddressSpace)?;
        Ok(Directory {
            cfg,
            devs,
            host,
            storage,
            compressed,
            regions: Vec::new(),
            generations: Vec::new(),
            free_slots: Vec::new(),
            space,
            quotas: QuotaBook::new(),
            leases: HashMap::new(),
            next_lease: 1,
            reservations: Default::default(),
            in_flight: VecDeque::new(),
            host_watermarks: (
                DirectoryConfig::HOST_HIGH_WATERMARK_PERCENT,
                DirectoryConfig::HOST_LOW_WATERMARK_PERCENT,
            ),
        })
    }

    /// The page size.
    pub fn page_size(&self) -> u64 {
        self.cfg.page_size.bytes()
    }

    /// The devices, in index order.
    pub fn locations(&self) -> Vec<Location> {
        self.devs.iter().map(|d| d.location).collect()
    }

    /// The index of a device.
    pub fn dev(&self, location: Location) -> Result<DevIdx, DirectoryError> {
        self.devs
            .iter()
            .position(|d| d.location == location)
            .map(|i| i as DevIdx)
            .ok_or(DirectoryError::DeviceUnavailable(location))
    }

    /// The location of a device.
    pub(super) fn loc(&self, dev: DevIdx) -> Location {
        self.devs[usize::from(dev)].location
    }

    /// Sets host memory's watermarks over a storage tier (percent of its ordinary frames; by default
    /// [`DirectoryConfig::HOST_HIGH_WATERMARK_PERCENT`] and [`DirectoryConfig::HOST_LOW_WATERMARK_PERCENT`]): once
    /// a call would take its used frames past `high`, its least used pages go to the storage tier in one batch
    /// until they are at or under `low`. Without a storage tier host memory has no watermarks (nothing is below
    /// it: it fills up). Refused unless `low <= high <= 100`.
    pub fn set_host_watermarks(&mut self, high: u8, low: u8) -> Result<(), DirectoryError> {
        check_watermarks(high, low)?;
        self.host_watermarks = (high, low);
        Ok(())
    }

    /// Host memory's watermarks over a storage tier: high, low (percent of its ordinary frames).
    pub fn host_watermarks(&self) -> (u8, u8) {
        self.host_watermarks
    }

    /// The tenant quotas, to read.
    pub fn quotas(&self) -> &QuotaBook {
        &self.quotas
    }

    /// The tenant quotas.
    pub fn quotas_mut(&mut self) -> &mut QuotaBook {
        &mut self.quotas
    }
}

/// Refuses watermarks that cannot work: the low one past the high one, or the high one past 100%.
fn check_watermarks(high: u8, low: u8) -> Result<(), DirectoryError> {
    if low > high || high > 100 {
        return Err(DirectoryError::InvalidWatermarks { low, high });
    }
    Ok(())
}
