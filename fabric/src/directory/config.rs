//! How the directory manages memory: the node, page size, headroom, placement fit, watermarks and readahead.

use vfabric_allocator::{Fit, NodeId, PageSize};

/// How the directory manages memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectoryConfig {
    /// This node's id: the high 16 bits of the addresses of regions allocated here.
    pub node: NodeId,
    /// The page size of every region of this node.
    pub page_size: PageSize,
    /// Share of each device's frames only the fabric's own moves may use.
    pub headroom_percent: u8,
    /// How frames are placed.
    pub fit: Fit,
    /// Eviction starts when a GPU's used frames would pass this share of its ordinary frames (host memory over a
    /// storage tier has its own: `Directory::set_host_watermarks`)...
    pub high_watermark_percent: u8,
    /// ...and goes on until they are at or under this share.
    pub low_watermark_percent: u8,
    /// How far ahead of a walk in order pages are prefetched (0: no prefetch): once two acquires in a row
    /// continue a walk, [`Directory::step_prefetch`](crate::directory::Directory::step_prefetch) keeps up to this
    /// many pages (or the last acquire's size, when larger) after it on its device, fetching the next half-window
    /// when fewer remain.
    pub readahead_pages: u32,
    /// This directory's incarnation: the high 32 bits of every region generation it hands out, so that a handle
    /// from an earlier run of the node (same address, slot and size) is refused as stale instead of naming a
    /// region of this one. The fabric draws it at random when it starts.
    pub epoch: u32,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            node: NodeId(0),
            page_size: PageSize::MIB_2,
            headroom_percent: 15,
            fit: Fit::FirstFit,
            high_watermark_percent: 90,
            low_watermark_percent: 75,
            readahead_pages: 32,
            epoch: 0,
        }
    }
}

impl DirectoryConfig {
    /// Host memory's high watermark over a storage tier unless set otherwise (percent of its ordinary frames):
    /// its least used pages go to the storage tier once those frames are all used...
    pub const HOST_HIGH_WATERMARK_PERCENT: u8 = 100;
    /// ...in one batch, until they are at or under this share: a tenth of host memory is free for the pages that
    /// arrive next (a GPU's evictions, pages read back from the storage tier) without each waiting on the drive.
    pub const HOST_LOW_WATERMARK_PERCENT: u8 = 90;
}
