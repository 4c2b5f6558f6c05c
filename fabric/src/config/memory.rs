//! `[memory]`: how each node's memory is laid out (arenas, tiers, page size, watermarks), and its checks.

use serde::{Deserialize, Serialize};
use vfabric_allocator::{Element, Fit, Location, PageSize};

use crate::directory::DirectoryConfig;
use crate::units::ByteSize;

/// `[memory]`: how each node's memory is laid out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySection {
    /// Default page size of regions (64 KiB .. 2 MiB).
    pub page_size: ByteSize,
    /// Bytes of each GPU the fabric takes (its arena). Default: 80% of the GPU's memory, leaving the rest to the
    /// job's own allocations.
    pub gpu_budget: Option<ByteSize>,
    /// Share of each arena (percent) that only the fabric's own moves may use, so evictions and compaction
    /// always find frames.
    pub headroom_percent: u8,
    /// Pinned host memory per node (the tier GPUs evict to).
    pub host_arena: ByteSize,
    /// Pinned host memory per node for lossy regions' pages, packed in slots of about half a page (a packed
    /// tier: their host memory, holding twice the pages), for regions of bf16 values and, on a node without
    /// `packed_f32_arena`, of fp32 values too. `0`, the default: none, and those pages take whole frames of
    /// `host_arena`.
    pub packed_arena: ByteSize,
    /// Pinned host memory per node for the pages of lossy regions of fp32 values, packed in slots of about a
    /// quarter of a page (four times the pages). `0`, the default: none, and those pages go to `packed_arena`'s
    /// slots (half of each unused) or, without it, to whole frames of `host_arena`.
    pub packed_f32_arena: ByteSize,
    /// Pinned host memory per node for the pages of lossless regions (`compression = "lz4"` or `"zstd"`) that
    /// shrink, each in a run of 4 KiB blocks as long as its packed form (a compressed tier). Such a page reaches
    /// `host_arena` from a GPU as it is, is packed on the CPU there, and moves to this tier when that saves at
    /// least a block; evicted from it to the storage tier, least recently used first. `0`, the default: none.
    pub compressed_arena: ByteSize,
    /// Size of the physical chunks arenas are made of.
    pub chunk_size: ByteSize,
    /// How frames are placed: `first-fit` or `best-fit`.
    pub fit: Fit,
    /// Eviction starts when a GPU's used frames would pass this share (percent) of its ordinary frames...
    pub high_watermark_percent: u8,
    /// ...and goes on until they are at or under this share.
    pub low_watermark_percent: u8,
    /// On a node with a storage tier, host memory's least used pages go there in one batch when its used frames
    /// would pass this share (percent) of its ordinary frames (those outside `headroom_percent`)...
    pub host_high_watermark_percent: u8,
    /// ...until they are at or under this share. (Without a storage tier host memory fills up: nothing is below
    /// it.)
    pub host_low_watermark_percent: u8,
    /// How far ahead of a walk in order pages are prefetched, in bytes (`0` turns prefetch off).
    pub readahead: ByteSize,
}

impl Default for MemorySection {
    fn default() -> Self {
        MemorySection {
            page_size: ByteSize(2 << 20),
            gpu_budget: None,
            headroom_percent: 15,
            host_arena: ByteSize(1 << 30),
            packed_arena: ByteSize(0),
            packed_f32_arena: ByteSize(0),
            compressed_arena: ByteSize(0),
            chunk_size: ByteSize(1 << 30),
            fit: Fit::FirstFit,
            high_watermark_percent: 90,
            low_watermark_percent: 75,
            host_high_watermark_percent: DirectoryConfig::HOST_HIGH_WATERMARK_PERCENT,
            host_low_watermark_percent: DirectoryConfig::HOST_LOW_WATERMARK_PERCENT,
            readahead: ByteSize(64 << 20),
        }
    }
}

impl MemorySection {
    /// The page size, checked.
    pub fn page(&self) -> PageSize {
        // Validated in `ClusterConfig::validate`; the default stands in should a caller build one by hand.
        PageSize::new(self.page_size.bytes()).unwrap_or_default()
    }

    /// The packed tiers' sizes, by their option's name and the values their slots are sized for.
    pub fn packed_arenas(&self) -> [(&'static str, u64, Element); 2] {
        [
            ("packed_arena", self.packed_arena.bytes(), Element::Bf16),
            ("packed_f32_arena", self.packed_f32_arena.bytes(), Element::F32),
        ]
    }

    /// The arena size for a GPU of `total` bytes.
    pub fn gpu_arena_bytes(&self, total: u64) -> u64 {
        match self.gpu_budget {
            Some(b) => b.bytes().min(total),
            None => total / 5 * 4,
        }
    }

    /// Checks the section: a page size of 64 KiB to 2 MiB, watermarks (the GPUs' and host memory's) and headroom
    /// in range, a chunk size of a power of two, and every arena at least a page (a packed tier a slot); the
    /// message names the field.
    pub(super) fn check(&self) -> Result<(), String> {
        PageSize::new(self.page_size.bytes()).map_err(|e| format!("memory.page_size: {e}"))?;
        if self.headroom_percent >= 100 {
            return Err(format!("memory.headroom_percent is {}: it must be below 100", self.headroom_percent));
        }
        if self.low_watermark_percent > self.high_watermark_percent || self.high_watermark_percent > 100 {
            return Err(format!(
            "memory.low_watermark_percent ({}) must be at most memory.high_watermark_percent ({}), which is at most 100",
            self.low_watermark_percent, self.high_watermark_percent
        ));
        }
        let (high, low) = (self.host_high_watermark_percent, self.host_low_watermark_percent);
        if low > high || high > 100 {
            return Err(format!(
                "memory.host_low_watermark_percent ({low}) must be at most memory.host_high_watermark_percent \
                 ({high}), which is at most 100"
            ));
        }
        let chunk = self.chunk_size.bytes();
        if !chunk.is_power_of_two() || chunk < (2 << 20) {
            return Err(format!("memory.chunk_size {} must be a power of two of at least 2MiB", self.chunk_size));
        }
        if let Some(b) = self.gpu_budget {
            if b.bytes() < self.page_size.bytes() {
                return Err(format!("memory.gpu_budget {b} is smaller than one page ({})", self.page_size));
            }
        }
        if self.host_arena.bytes() < self.page_size.bytes() {
            return Err(format!("memory.host_arena {} is smaller than one page", self.host_arena));
        }
        for (name, bytes, element) in self.packed_arenas() {
            let slot = Location::Packed(element).frame_bytes(self.page_size.bytes());
            if bytes > 0 && bytes < slot {
                return Err(format!(
                    "memory.{name} {} is smaller than one slot ({}); 0 turns that packed tier off",
                    ByteSize(bytes),
                    ByteSize(slot)
                ));
            }
        }
        let c = self.compressed_arena.bytes();
        if c > 0 && c < self.page_size.bytes() {
            return Err(format!(
                "memory.compressed_arena {} is smaller than one page ({}); 0 turns the compressed tier off",
                self.compressed_arena, self.page_size
            ));
        }
        Ok(())
    }
}
