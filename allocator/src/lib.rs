//! Allocation logic of the vfabric GPU memory fabric.
//!
//! vfabric pools the memory of many GPUs, hosts and NVMe devices into one address space.
//! This crate holds the bookkeeping that decides where data lives:
//!
//! - [`addr`]: [`NodeId`], fabric-wide [`GlobalAddr`]esses (node in the high 16 bits,
//!   offset in the low 48) and validated [`PageSize`]s.
//! - [`extent`]: [`FreeExtents`], the coalescing free-space set every allocator here is
//!   built on, and the [`Fragmentation`] summary.
//! - [`range`]: [`RangeAllocator`], aligned virtual ranges of a node's address space.
//! - [`frames`]: [`FrameArena`], a device's physical memory as page-sized frames, with
//!   headroom for the fabric's own use, leases that pin frames, and compaction plans.
//! - [`compression`]: [`Compression`], how a region's pages are packed when they leave the GPU ([`Lossy`] when
//!   their values may change).
//! - [`tenant`]: [`TenantId`] and [`Tier`], the names quotas and errors share.
//! - [`quota`]: the per-tenant [`QuotaBook`].
//! - [`error`]: [`AllocError`], the single error type.
//!
//! # Why it is pure
//!
//! Nothing here performs I/O, touches a device, spawns a thread or uses `unsafe`: numbers
//! go in, numbers come out. The caller (the `vfabric` crate) owns the real memory and the
//! copies; this crate only says which frames to use and which pages to move. That keeps
//! every policy decision deterministic and testable in microseconds, including by the
//! property tests that compare each allocator with a naive model, and lets one copy of the
//! logic serve the live fabric, the emulated device and the benchmarks alike.
//!
//! Every fallible operation returns a [`Result`] and leaves its allocator unchanged on
//! error; nothing reachable from the public API panics.
//!
//! # Example
//!
//! ```
//! use vfabric_allocator::{
//!     AllocClass, FrameArena, FrameArenaConfig, PageSize, QuotaBook, TenantId, Tier,
//! };
//!
//! // A 141 GB GPU run as an 8 GiB one, in 2 MiB frames, 15% kept for the fabric's own use.
//! let cfg = FrameArenaConfig::new(Tier::Gpu, PageSize::MIB_2, 141_000_000_000)
//!     .with_budget(8 << 30);
//! let mut arena = FrameArena::new(cfg)?;
//! assert_eq!(arena.frames(), 4096);
//! assert_eq!(arena.reserved_frames(), 615); // ceil(4096 * 15 / 100)
//!
//! let mut quotas = QuotaBook::new();
//! let tenant = TenantId(1);
//! quotas.set_limit(tenant, Tier::Gpu, Some(1 << 30));
//!
//! let pages = arena.alloc(16, tenant, AllocClass::Normal, &mut quotas)?;
//! assert!(pages.is_contiguous());
//! assert_eq!(quotas.used(tenant, Tier::Gpu), 32 << 20);
//!
//! arena.free(pages.frames(), &mut quotas)?;
//! assert_eq!(quotas.used(tenant, Tier::Gpu), 0);
//! # Ok::<(), vfabric_allocator::AllocError>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod addr;
pub mod compression;
pub mod error;
pub mod extent;
pub mod fit;
pub mod frames;
pub mod location;
pub mod page_move;
pub mod quota;
pub mod range;
pub mod tenant;

pub use addr::{GlobalAddr, NodeId, PageSize, MAX_OFFSET, OFFSET_BITS};
pub use compression::{
    packed_slot_len, Compression, Element, Lossy, LossyCode, ParseCompressionError, COMPRESSED_BLOCK, COMPRESSIONS,
    LOSSY_GROUP, LOSSY_TINY,
};
pub use error::AllocError;
pub use extent::{Fragmentation, FreeExtents};
pub use fit::Fit;
pub use frames::{
    AllocClass, CompactionPlan, FrameAlloc, FrameArena, FrameArenaConfig, FrameMove, FrameRun, FrameState,
    DEFAULT_HEADROOM_PERCENT,
};
pub use location::{Location, ParseLocationError};
pub use page_move::PageMove;
pub use quota::QuotaBook;
pub use range::{Range, RangeAllocator};
pub use tenant::{TenantId, Tier};
