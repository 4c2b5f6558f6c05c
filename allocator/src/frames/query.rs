//! Read-only questions about a frame arena: frame states, counts, fragmentation and configuration.

use super::arena::FrameArena;
use super::config::FrameArenaConfig;
use super::run::{FrameRun, FrameState};
use crate::addr::PageSize;
use crate::extent::Fragmentation;
use crate::tenant::Tier;

impl FrameArena {
    /// What `frame` holds, or `None` if it is outside the arena.
    pub fn state(&self, frame: u32) -> Option<FrameState> {
        self.slots.get(frame as usize).map(|s| match s.owner {
            None => FrameState::Free,
            Some(tenant) => FrameState::Used { tenant },
        })
    }

    /// Number of frames in the arena.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Frames only [`AllocClass::Reserved`] allocations may use.
    pub fn reserved_frames(&self) -> u32 {
        self.reserved
    }

    /// How fragmented the free frames are (units: frames).
    pub fn fragmentation(&self) -> Fragmentation {
        self.free.fragmentation()
    }

    /// Length of the largest free run of frames.
    pub fn largest_free_run(&self) -> u32 {
        self.free.largest() as u32
    }

    /// The free runs in address order.
    pub fn free_runs(&self) -> impl Iterator<Item = FrameRun> + '_ {
        self.free.iter().map(|(s, l)| FrameRun { start: s as u32, len: l as u32 })
    }

    /// The configuration the arena was built from.
    pub fn config(&self) -> &FrameArenaConfig {
        &self.cfg
    }

    /// The tier quotas are charged against.
    pub fn tier(&self) -> Tier {
        self.cfg.tier
    }

    /// Size of one frame.
    pub fn frame_size(&self) -> PageSize {
        self.cfg.frame_size
    }
}
