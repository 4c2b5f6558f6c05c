//! What an arena's frames hold and how allocations name them: states, runs of consecutive frames, and the
//! runs one allocation got.

use crate::tenant::TenantId;

/// What a frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameState {
    /// Not allocated.
    Free,
    /// Allocated to a tenant.
    Used {
        /// The tenant whose quota the frame is charged to.
        tenant: TenantId,
    },
}

/// A run of consecutive frames `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrameRun {
    /// First frame.
    pub start: u32,
    /// Number of frames.
    pub len: u32,
}

impl FrameRun {
    /// One past the last frame. Saturates at `u32::MAX`; runs made by a [`FrameArena`]
    /// never do, since frame ids are below the arena's frame count.
    pub const fn end(&self) -> u32 {
        self.start.saturating_add(self.len)
    }

    /// Whether `frame` lies in the run.
    pub const fn contains(&self, frame: u32) -> bool {
        frame >= self.start && frame < self.end()
    }

    /// The frames of the run, in order.
    pub fn iter(&self) -> std::ops::Range<u32> {
        self.start..self.end()
    }
}

impl IntoIterator for FrameRun {
    type Item = u32;
    type IntoIter = std::ops::Range<u32>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The frames handed out by one [`FrameArena::alloc`]: one run when a contiguous extent was
/// available, otherwise the fewest runs that add up to the request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FrameAlloc {
    /// The runs, in address order. They never overlap or touch.
    pub runs: Vec<FrameRun>,
}

impl FrameAlloc {
    /// Every frame, run by run in address order. Page `i` of the allocation is backed by the
    /// `i`-th frame of this iterator.
    pub fn frames(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flat_map(FrameRun::iter)
    }

    /// Number of frames (saturating at `u32::MAX` for hand-built values).
    pub fn len(&self) -> u32 {
        self.runs.iter().fold(0u32, |acc, r| acc.saturating_add(r.len))
    }

    /// Whether it holds no frame.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the frames form a single run.
    pub fn is_contiguous(&self) -> bool {
        self.runs.len() <= 1
    }
}
