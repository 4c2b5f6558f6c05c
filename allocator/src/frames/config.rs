//! How a frame arena is sized and placed ([`FrameArenaConfig`]), and which allocations may use its headroom
//! ([`AllocClass`]).

use serde::{Deserialize, Serialize};

use crate::addr::PageSize;
use crate::fit::Fit;
use crate::tenant::Tier;

/// The headroom [`FrameArenaConfig::new`] reserves for the fabric's own use, in percent.
pub const DEFAULT_HEADROOM_PERCENT: u8 = 15;

fn default_headroom() -> u8 {
    DEFAULT_HEADROOM_PERCENT
}

/// How a `FrameArena` is sized and how it places frames.
///
/// Deserialisable from a configuration file; `frame_size` (bytes, default 2 MiB),
/// `budget_bytes` (default none), `headroom_percent` (default 15) and `fit` (default
/// `"first-fit"`) may be left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrameArenaConfig {
    /// The tier this arena's memory belongs to; quotas are charged against it.
    pub tier: Tier,
    /// Size of one frame.
    #[serde(default)]
    pub frame_size: PageSize,
    /// Bytes of physical memory in the arena.
    pub capacity_bytes: u64,
    /// Optional cap below the capacity, e.g. to run a 141 GB GPU as an 8 GiB one. A budget
    /// above the capacity has no effect.
    #[serde(default)]
    pub budget_bytes: Option<u64>,
    /// Percentage of frames (rounded up) that only [`AllocClass::Reserved`] allocations may
    /// use. At most 100.
    #[serde(default = "default_headroom")]
    pub headroom_percent: u8,
    /// Placement policy for contiguous runs.
    #[serde(default)]
    pub fit: Fit,
}

impl FrameArenaConfig {
    /// An arena of `capacity_bytes` on `tier` with no budget cap, 15% headroom and first-fit.
    pub fn new(tier: Tier, frame_size: PageSize, capacity_bytes: u64) -> Self {
        Self {
            tier,
            frame_size,
            capacity_bytes,
            budget_bytes: None,
            headroom_percent: DEFAULT_HEADROOM_PERCENT,
            fit: Fit::FirstFit,
        }
    }

    /// The same configuration, capped at `budget_bytes`.
    pub fn with_budget(mut self, budget_bytes: u64) -> Self {
        self.budget_bytes = Some(budget_bytes);
        self
    }

    /// The same configuration with `percent` headroom.
    pub fn with_headroom(mut self, percent: u8) -> Self {
        self.headroom_percent = percent;
        self
    }

    /// The same configuration with another placement policy.
    pub fn with_fit(mut self, fit: Fit) -> Self {
        self.fit = fit;
        self
    }
}

/// Who an allocation is for, which decides whether it may use the headroom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AllocClass {
    /// Ordinary tenant allocations: limited to `frames - reserved_frames` used frames.
    #[default]
    Normal,
    /// The fabric's own use (migration targets, fetches during eviction, compaction): may
    /// use every frame. The headroom exists so these never deadlock behind tenants that
    /// filled the device.
    Reserved,
}
