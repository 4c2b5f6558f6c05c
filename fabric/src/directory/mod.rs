//! The directory: which copies of which page live in which frame of which device, and the coherence rules
//! between them. Pure (sans-IO), like quinn-proto: calls take requests and return either a result or a
//! [`Stage`] of copies that the caller (the fabric's I/O layer, or a test's simulated memory) performs and then
//! commits. Nothing here touches memory.
//!
//! Coherence is single writer / multiple readers with invalidation. Every copy of a page holds the same
//! version: a `Read` acquire may replicate a page to another device; a `Write` acquire (or a write from a host
//! buffer) drops every other copy; the release of a write lease bumps the version. A page that was never
//! written has no copy and reads as zeros.
//!
//! Memory is managed per device by the allocator's [`FrameArena`](vfabric_allocator::FrameArena): when a device
//! passes its high watermark, unleased copies go to host memory in LRU order (lowest priority first) until it is
//! under the low watermark; a copy that exists elsewhere too is simply dropped. A lease wants its pages in one run
//! of frames so a kernel gets one pointer; when the device is too fragmented for that, compaction moves unleased
//! pages within the device first, and only when that cannot work does the lease get one pointer per page. Leased
//! frames are never moved, freed or evicted.
//!
//! The files, in the order a call meets them:
//! - `config`: [`DirectoryConfig`], how memory is managed;
//! - `state`: the [`Directory`] and its tables, its constructor, device lookup;
//! - `region`, `page`, `page_table`, `lease`, `stage`: the vocabulary (regions and their handles, pages and their
//!   copies, a region's page entries made as its pages are used,
//!   leases, the stages of copies a call asks for and the [`Step`] every step returns);
//! - `alloc`: allocating, freeing and looking up regions, checking ranges;
//! - `residency`: taking, freeing and pinning frames, the eviction order (`lru`);
//! - `evict`: watermarks and eviction stages;
//! - `acquire`, `prefetch`, `hints`, `host_io`, `migrate`, `compact`: the calls that plan stages (`hints`: a
//!   caller's own prefetches and write-backs);
//! - `compressed`: moving host memory's copies of lossless regions' pages into the compressed tier by their
//!   packed length, and making room there;
//! - `commit`: committing or aborting a stage;
//! - `stats`, `invariants`: figures, and the consistency checks tests run;
//! - `error`: [`DirectoryError`].

mod acquire;
mod alloc;
mod commit;
mod compact;
mod compressed;
mod config;
mod error;
mod evict;
mod hints;
mod host_io;
mod invariants;
mod lease;
mod lru;
mod migrate;
mod page;
mod page_table;
mod prefetch;
mod region;
mod reserve;
mod residency;
mod stage;
mod state;
mod stats;

pub use acquire::AcquireRequest;
pub use config::DirectoryConfig;
pub use error::{DirectoryError, LeaseHeld};
pub use hints::HINT_DEPTH;
pub use host_io::{ReadPiece, ReadSource, WriteTarget};
pub use invariants::InvariantError;
pub use lease::{LeaseFrames, LeaseGrant, Mode};
pub use page::{Copy, DevIdx, PageEntry, PageRef};
pub use page_table::PageTable;
pub use prefetch::{PREFETCH_DEPTH, STAGING_DEPTH};
pub use region::{Placement, Priority, RegionEntry, RegionHandle};
pub use reserve::ReservationInfo;
pub use stage::{Stage, StageBatch, StageKind, Step};
pub use state::Directory;
pub use stats::{DeviceStats, DirectoryStats};
