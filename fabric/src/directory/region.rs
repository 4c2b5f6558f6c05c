//! Regions as their users see them (handle, placement, priority) and as the directory keeps them (one entry per
//! page, the device new pages go to, and the walk the last acquires made).

use serde::{Deserialize, Serialize};
use vfabric_allocator::{Compression, GlobalAddr, Location, TenantId};

use super::page::DevIdx;
use super::page_table::PageTable;

/// A region, as its users hold it: its address, size and page size, and a generation that tells a freed
/// region from a later one at the same address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionHandle {
    pub(crate) slot: u32,
    pub(crate) generation: u64,
    /// The region's first global address.
    pub addr: GlobalAddr,
    /// Its length in bytes (a multiple of the page size).
    pub len: u64,
    /// Its page size in bytes.
    pub page_size: u64,
}

impl std::fmt::Display for RegionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.addr)
    }
}

/// How important a region is: eviction takes pages of lower priority first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Evicted first.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Evicted last.
    High,
}

/// Where a new region's pages should live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    /// The device to place pages on; `None` picks the GPU with the most free frames.
    pub device: Option<Location>,
    /// Eviction priority.
    pub priority: Priority,
    /// The tenant whose quotas the region's pages count against.
    pub tenant: TenantId,
    /// A reservation (from `Directory::step_reserve`) whose frames the region's pages take first.
    pub reservation: Option<u64>,
    /// How its pages are stored on the storage tier (off by default).
    pub compression: Compression,
}

impl Placement {
    /// Pages on `device`.
    pub fn on(device: Location) -> Self {
        Placement { device: Some(device), ..Placement::default() }
    }
}

/// A live region.
#[derive(Debug, Clone)]
pub struct RegionEntry {
    /// The handle its users hold.
    pub handle: RegionHandle,
    /// Where its pages should live and how much they matter.
    pub placement: Placement,
    /// The device new pages go to (the placement's, changed by a migration).
    pub home: DevIdx,
    /// One entry per page (made a chunk at a time as pages are used).
    pub pages: PageTable,
    /// The walk the last acquires made.
    pub(super) stream: Option<Stream>,
}

/// The walk the last acquires of a region made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stream {
    /// The device they were on.
    pub(super) dev: DevIdx,
    /// The page after the last one acquired.
    pub(super) next: u32,
    /// How many acquires in a row continued the walk (0 for the first).
    pub(super) streak: u32,
    /// Pages the last acquire took.
    pub(super) len: u32,
}

/// How a page of a region stored with `compression` is packed when it moves from `from` to `to`: onto the storage
/// tier, as the region asks; between a GPU and host memory (or the packed tier), a lossy region's pages are packed
/// leaving the GPU and expanded coming back (so its copies in host memory, the packed tier and on the storage tier
/// are packed); every other move copies the page as it is.
pub(crate) fn packing(compression: Compression, from: Location, to: Location) -> Compression {
    match (from, to) {
        (_, Location::Storage) => compression,
        (Location::Gpu(_), h) | (h, Location::Gpu(_)) if h.is_host_memory() && compression.is_lossy() => compression,
        _ => Compression::None,
    }
}
