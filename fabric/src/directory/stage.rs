//! Stages: the copies the directory asks its caller to make before it can go on, the metadata changes they
//! make when committed, and [`Step`], what every step of a call returns.

use serde::Serialize;
use vfabric_allocator::{CompactionPlan, Compression, Location, PageMove};

use super::page::{Copy, DevIdx, PageRef};

/// Pages moved between two devices in one stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageBatch {
    /// Source device.
    pub from: Location,
    /// Destination device.
    pub to: Location,
    /// Frame pairs.
    pub moves: Vec<PageMove>,
    /// How the batch packs its pages: onto the storage tier, as their region asks; between a GPU and host
    /// memory, a lossy region's pages are packed leaving the GPU and expanded coming back; every other batch
    /// copies them as they are.
    pub compression: Compression,
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
    /// flight across later calls (see [`Directory::step_prefetch`](super::state::Directory::step_prefetch)).
    Prefetch,
    /// Copies of pages that exist only on a GPU, written to host memory while the caller works so that evicting
    /// them later costs nothing (see [`Directory::step_write_back`](super::state::Directory::step_write_back)).
    WriteBack,
}

/// Copies the directory needs before it can go on: the caller performs every batch and zero-fill, then calls
/// [`Directory::commit`](super::state::Directory::commit) (or [`Directory::abort`](super::state::Directory::abort)
/// if a copy failed, which frees the frames the stage took, gives those that came out of reservations back to
/// them, and changes nothing else: a stage only ever copies into frames it took).
#[derive(Debug, Clone)]
pub struct Stage {
    /// Why.
    pub kind: StageKind,
    /// Page copies, at most one batch per pair of devices (and compression); they may run concurrently.
    pub batches: Vec<StageBatch>,
    /// Frames to fill with zeros (pages read or written for the first time).
    pub zero: Vec<(Location, u32)>,
    pub(crate) updates: Vec<Update>,
    pub(crate) taken: Vec<Copy>,
    /// Frames drawn out of reservations for pages that take frames in this stage: given back to them if it
    /// aborts (the frames were taken for the pages, so committing uses them).
    pub(crate) drawn: Vec<Drawn>,
    /// Frames drawn out of reservations by the call that planned this stage but not taken by it (the room it
    /// makes comes first): given back to them when it commits or aborts, since the call draws them again when
    /// it is retried.
    pub(crate) loose: Vec<Drawn>,
    /// Frames of `taken` lent out of reservations (with the reservation's id) to copies an eviction moves:
    /// given back to the reservation, still pinned for it, if the stage aborts.
    pub(crate) lent: Vec<(u64, Copy)>,
}

/// Frames let go of by a reservation for a region's pages: freed, so that the pages can take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drawn {
    /// The reservation.
    pub(crate) id: u64,
    /// Its device.
    pub(crate) dev: DevIdx,
    /// How many.
    pub(crate) frames: u32,
}

impl Stage {
    pub(crate) fn new(kind: StageKind) -> Self {
        Stage {
            kind,
            batches: Vec::new(),
            zero: Vec::new(),
            updates: Vec::new(),
            taken: Vec::new(),
            drawn: Vec::new(),
            loose: Vec::new(),
            lent: Vec::new(),
        }
    }

    /// Records frames the call that planned this stage drew out of a reservation: as many as the stage took on
    /// that device for the pages it brings there (a fetch's or a prefetch's) are its own, the rest loose.
    pub(crate) fn keep_drawn(&mut self, d: Drawn) {
        let took = match self.kind {
            StageKind::Fetch | StageKind::Prefetch => self.taken.iter().filter(|c| c.dev == d.dev).count(),
            _ => 0,
        };
        let used = d.frames.min(u32::try_from(took).unwrap_or(u32::MAX));
        if used > 0 {
            self.drawn.push(Drawn { frames: used, ..d });
        }
        if d.frames > used {
            self.loose.push(Drawn { frames: d.frames - used, ..d });
        }
    }

    pub(crate) fn copy(&mut self, from: Location, to: Location, src: u32, dst: u32) {
        self.copy_packed(from, to, src, dst, Compression::None);
    }

    /// A copy whose page is packed with `compression` where it lands (one batch per pair of devices and
    /// compression).
    pub(crate) fn copy_packed(&mut self, from: Location, to: Location, src: u32, dst: u32, compression: Compression) {
        let mv = PageMove { src, dst };
        match self.batches.iter_mut().find(|b| b.from == from && b.to == to && b.compression == compression) {
            Some(b) => b.moves.push(mv),
            None => self.batches.push(StageBatch { from, to, moves: vec![mv], compression }),
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
    Compact { dev: DevIdx, plan: CompactionPlan },
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

impl<T> Step<T> {
    /// The stage to perform, when it is one.
    pub(crate) fn stage_mut(&mut self) -> Option<&mut Stage> {
        match self {
            Step::Stage(s) => Some(s),
            _ => None,
        }
    }
}
