//! The directory's vocabulary: regions, pages, copies, leases, and the stages of copies it asks for.

use serde::{Deserialize, Serialize};
use vfabric_allocator::{GlobalAddr, TenantId};
use vfabric_allocator::{Location, PageMove};

/// Index of a device (location) in the directory: GPUs in order, then the host.
pub type DevIdx = u8;

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
}

impl Placement {
    /// Pages on `device`.
    pub fn on(device: Location) -> Self {
        Placement { device: Some(device), ..Placement::default() }
    }
}

/// What a lease allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// Read the pages; other readers may hold them too, possibly on other devices (replicas).
    Read,
    /// Read and write the pages; every other copy is invalidated, and the release publishes a new version.
    Write,
}

/// One copy of a page: which device and which frame of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Copy {
    /// The device.
    pub dev: DevIdx,
    /// The frame.
    pub frame: u32,
}

/// A page of a region, by slot and page index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageRef {
    /// The region's slot.
    pub slot: u32,
    /// The page's index in the region.
    pub page: u32,
}

/// The directory entry of one page (32 bytes; checked by a test). All copies hold the same version: a write drops every other
/// copy.
#[derive(Debug, Clone)]
pub struct PageEntry {
    /// The copy the page lives in (`NO_COPY` until the page is first written or acquired: it reads as zeros).
    owner: Copy,
    /// Read-only replicas of the owner's bytes. Most pages have none, so the list costs one pointer in the
    /// entry (a `Vec` would take three) and is allocated only for pages that are replicated.
    #[allow(clippy::box_collection)]
    sharers: Option<Box<Vec<Copy>>>,
    /// Bumped by every write and every release of a write lease.
    pub version: u64,
    /// Read leases held on the page.
    pub read_leases: u32,
    /// Whether a write lease is held (then no read lease is).
    pub write_leased: bool,
}

const NO_COPY: Copy = Copy { dev: DevIdx::MAX, frame: u32::MAX };

impl Default for PageEntry {
    fn default() -> Self {
        PageEntry { owner: NO_COPY, sharers: None, version: 0, read_leases: 0, write_leased: false }
    }
}

impl PageEntry {
    /// The owner copy, if the page has one.
    pub fn owner(&self) -> Option<Copy> {
        (self.owner != NO_COPY).then_some(self.owner)
    }

    /// The replicas.
    pub fn sharers(&self) -> &[Copy] {
        self.sharers.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Every copy, the owner first.
    pub fn copies(&self) -> impl Iterator<Item = Copy> + '_ {
        self.owner().into_iter().chain(self.sharers().iter().copied())
    }

    /// The copy on `dev`, if any.
    pub fn copy_on(&self, dev: DevIdx) -> Option<Copy> {
        self.copies().find(|c| c.dev == dev)
    }

    /// Whether the owner's bytes exist nowhere else: evicting the owner then means copying it.
    pub fn dirty(&self) -> bool {
        self.owner().is_some() && self.sharers().is_empty()
    }

    /// Whether any lease is held.
    pub fn leased(&self) -> bool {
        self.read_leases > 0 || self.write_leased
    }

    /// Heap bytes of the replica list.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.sharers
            .as_ref()
            .map_or(0, |v| std::mem::size_of::<Vec<Copy>>() + v.capacity() * std::mem::size_of::<Copy>())
    }

    /// Adds a copy: the owner when there is none, a replica otherwise.
    pub(crate) fn add(&mut self, copy: Copy) {
        if self.owner == NO_COPY {
            self.owner = copy;
        } else {
            self.sharers.get_or_insert_with(Default::default).push(copy);
        }
    }

    /// Puts `new` where `old` was (owner or replica).
    pub(crate) fn replace(&mut self, old: Copy, new: Copy) {
        if self.owner == old {
            self.owner = new;
        } else if let Some(s) = self.sharers.as_mut().and_then(|v| v.iter_mut().find(|s| **s == old)) {
            *s = new;
        }
    }

    /// Removes a copy; when it was the owner, a replica not on `host` (else any) takes its place.
    pub(crate) fn remove(&mut self, copy: Copy, host: DevIdx) {
        if self.owner == copy {
            self.owner = match self.sharers.as_mut() {
                Some(v) if !v.is_empty() => {
                    let i = v.iter().position(|s| s.dev != host).unwrap_or(0);
                    v.swap_remove(i)
                }
                _ => NO_COPY,
            };
        } else if let Some(v) = self.sharers.as_mut() {
            v.retain(|s| *s != copy);
        }
        if self.sharers.as_ref().is_some_and(|v| v.is_empty()) {
            self.sharers = None;
        }
    }

    /// Makes `copy` the only copy (the caller frees the others' frames).
    pub(crate) fn keep_only(&mut self, copy: Copy) {
        self.owner = copy;
        self.sharers = None;
    }

    /// Takes every replica out (the caller frees their frames).
    pub(crate) fn take_sharers(&mut self) -> Vec<Copy> {
        self.sharers.take().map(|b| *b).unwrap_or_default()
    }

    /// Makes the replica on `dev` the owner and the old owner a replica; false when there is none on `dev`.
    pub(crate) fn promote(&mut self, dev: DevIdx) -> bool {
        let owner = self.owner;
        match self.sharers.as_mut().and_then(|v| v.iter_mut().find(|s| s.dev == dev)) {
            Some(s) => {
                self.owner = std::mem::replace(s, owner);
                true
            }
            None => false,
        }
    }
}

/// Pages moved between two devices in one stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageBatch {
    /// Source device.
    pub from: Location,
    /// Destination device.
    pub to: Location,
    /// Frame pairs.
    pub moves: Vec<PageMove>,
}

/// Why a stage exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StageKind {
    /// Pages leave a device to make room.
    Evict,
    /// Pages move within a device so that a run of frames becomes free.
    Compact,
    /// Pages come to a device (from the host, a peer, or zero-filled).
    Fetch,
    /// Pages move to another device for good.
    Migrate,
    /// Pages a walk in order will want next, copied to its device while the caller works: the stage stays in
    /// flight across later calls (see [`super::Directory::step_prefetch`]).
    Prefetch,
}

/// Copies the directory needs before it can go on: the caller performs every batch and zero-fill, then calls
/// [`super::Directory::commit`] (or [`super::Directory::abort`] if a copy failed, which frees the frames the
/// stage took and changes nothing else: a stage only ever copies into frames it took).
#[derive(Debug, Clone)]
pub struct Stage {
    /// Why.
    pub kind: StageKind,
    /// Page copies, at most one batch per pair of devices; they may run concurrently.
    pub batches: Vec<StageBatch>,
    /// Frames to fill with zeros (pages read or written for the first time).
    pub zero: Vec<(Location, u32)>,
    pub(crate) updates: Vec<Update>,
    pub(crate) taken: Vec<Copy>,
}

impl Stage {
    pub(crate) fn new(kind: StageKind) -> Self {
        Stage { kind, batches: Vec::new(), zero: Vec::new(), updates: Vec::new(), taken: Vec::new() }
    }

    pub(crate) fn copy(&mut self, from: Location, to: Location, src: u32, dst: u32) {
        let mv = PageMove { src, dst };
        match self.batches.iter_mut().find(|b| b.from == from && b.to == to) {
            Some(b) => b.moves.push(mv),
            None => self.batches.push(StageBatch { from, to, moves: vec![mv] }),
        }
    }

    /// Pages the stage copies.
    pub fn pages(&self) -> usize {
        self.batches.iter().map(|b| b.moves.len()).sum()
    }

    /// Whether there is nothing to copy or fill (the caller may commit at once).
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.zero.is_empty()
    }
}

/// A metadata change a stage makes when committed.
#[derive(Debug, Clone)]
pub(crate) enum Update {
    /// The copy at `old` now lives at `new` (`new` was taken by the stage); `old`'s frame is freed.
    Relocate { page: PageRef, old: Copy, new: Copy },
    /// Compaction within one device: each (from, to) frame pair moves, as the allocator's plan says.
    Compact { dev: DevIdx, plan: vfabric_allocator::CompactionPlan },
    /// The page gains a copy (taken by the stage); as its owner when it had none.
    Add { page: PageRef, copy: Copy },
    /// The page loses a copy; its frame is freed.
    Drop { page: PageRef, copy: Copy },
}

/// Either the result, or copies to make first.
#[derive(Debug)]
pub enum Step<T> {
    /// Done.
    Done(T),
    /// Perform the stage, commit it, and call again.
    Stage(Stage),
    /// A prefetch is in flight and this call cannot go on beside it: finish that stage (commit, or abort if a
    /// copy failed), then call again.
    Wait,
}

/// Where a lease's pages are on its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseFrames {
    /// One run of consecutive frames, in page order: one pointer covers the whole range.
    Run {
        /// First frame.
        first: u32,
        /// Number of frames.
        len: u32,
    },
    /// One frame per page, in page order (the device was too fragmented, and compaction could not help).
    Pages(Vec<u32>),
}

impl LeaseFrames {
    /// The frame of each page, in order.
    pub fn frames(&self) -> Vec<u32> {
        match self {
            LeaseFrames::Run { first, len } => (*first..*first + *len).collect(),
            LeaseFrames::Pages(v) => v.clone(),
        }
    }
}

/// A granted lease, as the directory records it.
#[derive(Debug, Clone)]
pub struct LeaseGrant {
    /// Its id.
    pub id: u64,
    /// The device.
    pub device: Location,
    /// The frames.
    pub frames: LeaseFrames,
    /// First page of the region it covers.
    pub first_page: u32,
    /// Mode.
    pub mode: Mode,
}

/// Where a host read finds a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSource {
    /// The page was never written: zeros.
    Zero,
    /// A copy at this device and frame.
    At(Location, u32),
}
