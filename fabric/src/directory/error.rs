//! Why a directory call failed. Every failing call leaves the directory as it was (a step that already staged
//! copies has had them committed or aborted by its caller).

use vfabric_allocator::{AllocError, Location, TenantId, Tier};

use super::region::RegionHandle;

/// Why a directory call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    // ---------------------------------------------------------------- configuration
    /// The watermarks cannot work: the low one must not pass the high one, nor the high one 100%.
    #[error("watermarks low {low}% high {high}%: need low <= high <= 100")]
    InvalidWatermarks {
        /// The low watermark, in percent.
        low: u8,
        /// The high watermark, in percent.
        high: u8,
    },
    /// A device's arena cannot be managed with this page size and headroom (the allocator says why).
    #[error("{location}: {source}")]
    InvalidArena {
        /// The device.
        location: Location,
        /// The allocator's reason.
        source: AllocError,
    },
    /// More devices than a device index can name.
    #[error("{0} devices: the directory manages at most 255")]
    TooManyDevices(usize),
    /// A call that names the storage tier where only a GPU or host memory can be: the storage tier holds
    /// pages evicted from host memory, and they come back through host memory.
    #[error("the storage tier {0}: lease, place or prefetch pages on a GPU or in host memory")]
    StorageTier(&'static str),
    /// A call that names the packed tier where only a GPU or host memory can be: it holds lossy regions' pages,
    /// which go there by themselves when they leave a GPU.
    #[error("the packed tier {0}: lossy regions' pages go there by themselves, leaving a GPU; lease, place or prefetch pages on a GPU or in host memory")]
    PackedTier(&'static str),
    /// A call that names the compressed tier where only a GPU or host memory can be, or a copy it cannot take:
    /// it holds lossless regions' pages, which go there by themselves when they shrink.
    #[error("the compressed tier {0}: lossless regions' pages go there by themselves from host memory; lease, place or prefetch pages on a GPU or in host memory")]
    CompressedTier(&'static str),
    /// A lease in host memory on a region whose pages are packed there (a lossy compression): its bytes there
    /// are codes, not values. (A lease from another node is served from its home's GPU, which expands them; a
    /// home without GPUs refuses it with this.)
    #[error("region {0} is stored lossily: its pages are packed in host memory, which leases them neither in host memory nor, on a node without GPUs, to other nodes: lease them on a GPU (host reads and writes expand them)")]
    PackedInHost(RegionHandle),
    /// A reservation that cannot be met, even after evicting every page that may leave: refused before
    /// anything moves.
    #[error("cannot reserve {requested} bytes of {location}: {available} bytes can be had")]
    ReservationRefused {
        /// The device.
        location: Location,
        /// Bytes asked for.
        requested: u64,
        /// Bytes that could be had there: those free, and those that evicting every copy that may leave (not
        /// leased, in flight or reserved; the only copy of a page where the tier below has room) would free.
        available: u64,
    },
    /// A reservation id that names no reservation (given back already, or never made).
    #[error("no reservation {0}")]
    UnknownReservation(u64),
    /// No device is the host: evictions need somewhere to go.
    #[error("the directory needs a host arena")]
    NoHostArena,
    /// The node's address space cannot be laid out in pages of this size (the allocator says why).
    #[error("the node's address space: {0}")]
    InvalidAddressSpace(AllocError),

    // ---------------------------------------------------------------- regions
    /// A region of 0 bytes.
    #[error("a region of 0 bytes")]
    ZeroSize,
    /// A region of more pages than a page index can name.
    #[error("{size} bytes is more than 2^32 pages")]
    TooManyPages {
        /// The size asked for, in bytes.
        size: u64,
    },
    /// The node's address space has no range left for a region of this size.
    #[error("no room in the node's address space: {0}")]
    AddressSpaceExhausted(AllocError),
    /// A handle that names no region of this directory.
    #[error("no region at {0}")]
    UnknownRegion(RegionHandle),
    /// A handle from an earlier run of this node (another epoch): whatever it named is gone.
    #[error("region {0} is from an earlier run of its home node: it was freed when that run ended")]
    StaleHandle(RegionHandle),
    /// A region used after it was freed.
    #[error("region {0} was freed and cannot be used")]
    UseAfterFree(RegionHandle),
    /// A region freed twice.
    #[error("region {0} was already freed")]
    DoubleFree(RegionHandle),
    /// Giving a freed region's addresses back failed (the address space does not know the range).
    #[error("freeing the addresses of a region: {0}")]
    FreeRange(AllocError),
    /// A range beyond the end of its region (or empty).
    #[error("{offset:#x}+{len:#x} is outside the region of {region_len:#x} bytes")]
    OutOfBounds {
        /// Start of the range.
        offset: u64,
        /// Its length.
        len: u64,
        /// The region's length.
        region_len: u64,
    },

    // ---------------------------------------------------------------- leases
    /// A page is leased in a way that excludes this call.
    #[error("page {page} of region {region} is leased {held}")]
    LeasedElsewhere {
        /// The region.
        region: RegionHandle,
        /// The page index in the region.
        page: u64,
        /// How it is leased.
        held: LeaseHeld,
    },
    /// A lease that is not (or no longer) held.
    #[error("lease {0} is not held")]
    UnknownLease(u64),

    // ---------------------------------------------------------------- devices and frames
    /// A device this directory does not manage.
    #[error("{0} is not available on this node")]
    DeviceUnavailable(Location),
    /// A device has no room: not enough frames even after evicting every page that may be evicted.
    #[error("{location} is out of memory: {needed} frames needed, {available} can be made free")]
    OutOfMemory {
        /// The device.
        location: Location,
        /// Frames the call needed there.
        needed: u64,
        /// Frames that are free or could be freed by eviction.
        available: u64,
    },
    /// A tenant's quota on a tier would be exceeded.
    #[error("tenant {tenant} would exceed its {tier:?} quota: {used} of {limit} bytes used, {requested} more asked")]
    QuotaExceeded {
        /// The tenant.
        tenant: TenantId,
        /// The tier.
        tier: Tier,
        /// Its limit in bytes.
        limit: u64,
        /// Bytes in use.
        used: u64,
        /// Bytes asked for.
        requested: u64,
    },
    /// No compaction of a device can leave the run of free frames asked for.
    #[error("{location}: cannot compact a free run of {frames} frames: {reason}")]
    CompactionImpossible {
        /// The device.
        location: Location,
        /// The run asked for, in frames.
        frames: u64,
        /// Why no plan exists.
        reason: &'static str,
    },
    /// A device's frame allocator refused a request for another reason (the allocator says why).
    #[error("{location}: {source}")]
    Allocator {
        /// The device.
        location: Location,
        /// The allocator's error.
        source: AllocError,
    },
}

/// How a page is leased, when that refuses a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseHeld {
    /// Leased for writing, on this device when the directory knows which.
    Writing(Option<Location>),
    /// Leased for reading by this many leases.
    Reading(u32),
}

impl std::fmt::Display for LeaseHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseHeld::Writing(Some(on)) => write!(f, "for writing on {on}"),
            LeaseHeld::Writing(None) => write!(f, "for writing"),
            LeaseHeld::Reading(n) => write!(f, "for reading ({n} lease(s))"),
        }
    }
}

impl DirectoryError {
    /// Maps an allocator error met while placing pages on `location`.
    pub(crate) fn from_alloc(e: AllocError, location: Location) -> DirectoryError {
        match e {
            AllocError::QuotaExceeded { tenant, tier, limit, used, requested } => {
                DirectoryError::QuotaExceeded { tenant, tier, limit, used, requested }
            }
            AllocError::OutOfMemory { requested, available, .. } => {
                DirectoryError::OutOfMemory { location, needed: requested, available }
            }
            AllocError::CompactionImpossible { frames, reason } => {
                DirectoryError::CompactionImpossible { location, frames, reason }
            }
            source => DirectoryError::Allocator { location, source },
        }
    }
}
