//! Figures about a node's fabric: the directory's, the bytes moved, and what the storage tier holds.

use crate::directory::DirectoryStats;

use super::stalls::Stalls;
use super::traffic::Traffic;

/// Figures about the fabric.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    /// The directory's figures.
    pub directory: DirectoryStats,
    /// Bytes moved since start.
    pub traffic: Traffic,
    /// Time callers waited in the fabric, by what for.
    pub stalls: Stalls,
    /// What the storage tier holds, when the node has one.
    pub storage: Option<StorageUsage>,
    /// While a stage's copies are past their deadline (`device.copy_deadline_ms`), the error the calls that move
    /// pages fail with: which stage, and for how long.
    pub stalled: Option<String>,
}

/// What a storage tier holds: pages, and the bytes they take in its file (pages of regions stored compressed
/// take whole 4 KiB blocks of their packed form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StorageUsage {
    /// Pages held.
    pub pages: u64,
    /// Their bytes as pages.
    pub page_bytes: u64,
    /// The bytes they take in the file.
    pub file_bytes: u64,
}
