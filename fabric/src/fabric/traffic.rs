//! What the fabric counts: the bytes it moved, by why it moved them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the fabric moved, by why it moved them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    /// Pages brought to a device for a lease (from host memory, a peer, or zero-filled).
    pub fetched: u64,
    /// The part of `fetched` prefetched ahead of a walk in order (copied while the caller worked).
    pub prefetched: u64,
    /// The part of `prefetched` read from the storage tier (staged into host memory ahead of the walk, on their
    /// way to its device).
    pub prefetched_from_storage: u64,
    /// Pages sent to host memory to make room.
    pub evicted: u64,
    /// Pages copied to host memory ahead of their eviction, on a caller's hint (write-back).
    pub written_back: u64,
    /// Pages written to the storage tier (host memory's evictions; part of `evicted`).
    pub to_storage: u64,
    /// Pages read back from the storage tier (part of `fetched`, or host reads).
    pub from_storage: u64,
    /// Pages moved within a device to make a run of frames (compaction, or pages gathered into a lease's run).
    pub compacted: u64,
    /// Pages moved by migrations.
    pub migrated: u64,
    /// Bytes written from and read into host buffers.
    pub host_io: u64,
    /// Bytes of lossless regions' pages packed on arriving in host memory from a GPU, for the compressed tier.
    pub compress_tried: u64,
    /// The part of `compress_tried` left in host memory without a look: pages of regions whose recent pages
    /// did not shrink.
    pub compress_skipped: u64,
    /// The part of `compress_tried` that shrank by a block and moved into the compressed tier (page bytes)...
    pub compressed: u64,
    /// ...and the bytes it takes there (runs of blocks).
    pub compressed_bytes: u64,
    /// Stages of copies carried out.
    pub stages: u64,
}

impl Traffic {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            fetched: self.fetched - earlier.fetched,
            prefetched: self.prefetched - earlier.prefetched,
            prefetched_from_storage: self.prefetched_from_storage - earlier.prefetched_from_storage,
            evicted: self.evicted - earlier.evicted,
            written_back: self.written_back - earlier.written_back,
            to_storage: self.to_storage - earlier.to_storage,
            from_storage: self.from_storage - earlier.from_storage,
            compacted: self.compacted - earlier.compacted,
            migrated: self.migrated - earlier.migrated,
            host_io: self.host_io - earlier.host_io,
            compress_tried: self.compress_tried - earlier.compress_tried,
            compress_skipped: self.compress_skipped - earlier.compress_skipped,
            compressed: self.compressed - earlier.compressed,
            compressed_bytes: self.compressed_bytes - earlier.compressed_bytes,
            stages: self.stages - earlier.stages,
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) fetched: AtomicU64,
    pub(crate) prefetched: AtomicU64,
    pub(crate) prefetched_from_storage: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) written_back: AtomicU64,
    pub(crate) to_storage: AtomicU64,
    pub(crate) from_storage: AtomicU64,
    pub(crate) compacted: AtomicU64,
    pub(crate) migrated: AtomicU64,
    pub(crate) host_io: AtomicU64,
    pub(crate) compress_tried: AtomicU64,
    pub(crate) compress_skipped: AtomicU64,
    pub(crate) compressed: AtomicU64,
    pub(crate) compressed_bytes: AtomicU64,
    pub(crate) stages: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Traffic {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Traffic {
            fetched: l(&self.fetched),
            prefetched: l(&self.prefetched),
            prefetched_from_storage: l(&self.prefetched_from_storage),
            evicted: l(&self.evicted),
            written_back: l(&self.written_back),
            to_storage: l(&self.to_storage),
            from_storage: l(&self.from_storage),
            compacted: l(&self.compacted),
            migrated: l(&self.migrated),
            host_io: l(&self.host_io),
            compress_tried: l(&self.compress_tried),
            compress_skipped: l(&self.compress_skipped),
            compressed: l(&self.compressed),
            compressed_bytes: l(&self.compressed_bytes),
            stages: l(&self.stages),
        }
    }
}
