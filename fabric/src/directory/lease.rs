//! Leases: what a lease allows, where its pages are on its device, and how the directory records one.

use serde::{Deserialize, Serialize};
use vfabric_allocator::Location;

use super::page::DevIdx;

/// What a lease allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// Read the pages; other readers may hold them too, possibly on other devices (replicas).
    Read,
    /// Read and write the pages; every other copy is invalidated, and the release publishes a new version.
    Write,
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

#[derive(Debug, Clone)]
pub(super) struct LeaseRecord {
    pub(super) slot: u32,
    pub(super) first_page: u32,
    pub(super) dev: DevIdx,
    pub(super) mode: Mode,
    pub(super) frames: Vec<u32>,
}
