//! One device's physical memory as page-sized frames: allocation with quotas and headroom,
//! leases that pin frames, and compaction plans.
//!
//! [`FrameArena`] is one type whose methods are grouped by concern: [`arena`] (the frames, allocating and
//! freeing), [`lease`], [`compaction`] and [`query`]; [`config`] sizes it and [`run`] names what it hands out.

pub mod arena;
pub mod compaction;
pub mod config;
pub mod lease;
pub mod query;
pub mod run;
#[cfg(test)]
mod tests;

pub use arena::FrameArena;
pub use compaction::{CompactionPlan, FrameMove};
pub use config::{AllocClass, FrameArenaConfig, DEFAULT_HEADROOM_PERCENT};
pub use run::{FrameAlloc, FrameRun, FrameState};
