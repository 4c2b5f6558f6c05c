//! Figures about the directory: per device, and the host memory its own tables take.

use std::collections::BTreeMap;

use vfabric_allocator::{Location, TenantId};

use super::lru::Lru;
use super::page::PageRef;
use super::state::Directory;

/// Figures about one device.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceStats {
    /// The device.
    pub location: Location,
    /// Frames in its arena.
    pub frames: u32,
    /// Frames holding a copy.
    pub used: u32,
    /// Frames pinned by leases.
    pub leased: u32,
    /// The largest run of free frames.
    pub largest_free_run: u32,
    /// Free ranges.
    pub free_ranges: u64,
    /// Pages whose owner copy is here.
    pub owned: u64,
    /// Copies held (one a frame, except in the compressed tier, where each takes a run of its frames: blocks).
    pub copies: u64,
}

/// Figures about the whole directory.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DirectoryStats {
    /// Live regions.
    pub regions: usize,
    /// Pages of live regions.
    pub pages: u64,
    /// Pages never written (no copy anywhere).
    pub unbacked: u64,
    /// Leases held.
    pub leases: usize,
    /// Per device.
    pub devices: Vec<DeviceStats>,
    /// Host memory the directory's own tables take, in bytes (an estimate from the sizes of its structures).
    pub metadata_bytes: u64,
}

impl Directory {
    /// The frames of `location` that hold a page now (the storage tier's: its slots in use).
    pub fn frames_in_use(&self, location: Location) -> Vec<u32> {
        let Ok(dev) = self.dev(location) else { return Vec::new() };
        let users = &self.devs[usize::from(dev)].users;
        users.iter().enumerate().filter(|(_, u)| u.is_some()).map(|(f, _)| f as u32).collect()
    }

    /// The leases held now, by the tenant of their regions: the tenant, how many, and the bytes they cover.
    pub fn leases_by_tenant(&self) -> Vec<(TenantId, usize, u64)> {
        let mut by: BTreeMap<TenantId, (usize, u64)> = BTreeMap::new();
        for l in self.leases.values() {
            let e = by.entry(self.tenant_of(l.slot)).or_default();
            (e.0, e.1) = (e.0 + 1, e.1 + l.frames.len() as u64 * self.page_size());
        }
        by.into_iter().map(|(t, (n, bytes))| (t, n, bytes)).collect()
    }

    /// Figures about every device and the tables themselves.
    pub fn stats(&self) -> DirectoryStats {
        let mut pages = 0u64;
        let mut unbacked = 0u64;
        let mut owned = vec![0u64; self.devs.len()];
        let mut sharer_bytes = 0u64;
        let mut table_bytes = 0u64;
        for r in self.regions.iter().flatten() {
            pages += r.pages.len() as u64;
            unbacked += r.pages.len() as u64;
            table_bytes += r.pages.heap_bytes() as u64;
            for (_, p) in r.pages.touched() {
                if let Some(o) = p.owner() {
                    owned[usize::from(o.dev)] += 1;
                    unbacked -= 1;
                }
                sharer_bytes += p.heap_bytes() as u64;
            }
        }
        let devices = self
            .devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let f = d.frames.fragmentation();
                DeviceStats {
                    location: d.location,
                    frames: d.frames.frames(),
                    used: d.frames.used_frames(),
                    leased: d.frames.leased_frames(),
                    largest_free_run: d.frames.largest_free_run(),
                    free_ranges: f.free_ranges,
                    owned: owned[i],
                    copies: d.users.iter().filter(|u| u.is_some()).count() as u64,
                }
            })
            .collect();
        // Per region: its page table (chunks of entries made as pages are used) and replica lists; per frame:
        // the reverse map and the eviction order.
        let per_frame = (std::mem::size_of::<Option<PageRef>>() + Lru::BYTES_PER_FRAME) as u64;
        let frames: u64 = self.devs.iter().map(|d| d.users.len() as u64).sum();
        let spans: u64 = self.devs.iter().map(|d| d.spans.len() as u64 * 2).sum();
        let metadata_bytes = table_bytes + sharer_bytes + frames * per_frame + spans;
        DirectoryStats {
            regions: self.regions.iter().flatten().count(),
            pages,
            unbacked,
            leases: self.leases.len(),
            devices,
            metadata_bytes,
        }
    }
}
