//! Eviction: the watermarks, how many frames to free before taking more, and the stage that frees them
//! (least recently used and lowest priority first; the only copy of a page goes one tier down: a GPU's to host
//! memory, host memory's to the storage tier when the node has one).

use std::collections::HashMap;

use vfabric_allocator::{AllocClass, Compression};

use super::error::DirectoryError;
use super::page::{Copy, DevIdx, PageRef};
use super::stage::{Stage, StageKind, Update};
use super::state::Directory;

impl Directory {
    /// How many frames to evict from `dev` before `need` more are taken there: enough for them, and, on a GPU
    /// past its high watermark, down to the low watermark.
    pub(super) fn eviction_need(&self, dev: DevIdx, need: u32) -> u32 {
        let d = &self.devs[usize::from(dev)];
        let avail = d.frames.available(AllocClass::Normal);
        let mut evict = need.saturating_sub(avail);
        if d.is_gpu() {
            let (high, low) = self.watermarks(dev);
            let after = u64::from(d.frames.used_frames()) + u64::from(need);
            if after > high {
                evict = evict.max(after.saturating_sub(low).min(u64::from(u32::MAX)) as u32);
            }
        }
        evict
    }

    /// The high and low watermarks of a device, in frames.
    pub(super) fn watermarks(&self, dev: DevIdx) -> (u64, u64) {
        let d = &self.devs[usize::from(dev)];
        let normal = u64::from(d.frames.frames() - d.frames.reserved_frames());
        let pct = |p: u8| normal * u64::from(p) / 100;
        (pct(self.cfg.high_watermark_percent), pct(self.cfg.low_watermark_percent))
    }

    /// Plans evicting up to `count` copies from `dev`, least recently used and lowest priority first, never a
    /// pinned frame and never a page `keep` names. A copy that exists elsewhere too is dropped; the only copy
    /// of a page goes one tier down (a GPU's to host memory, host memory's to storage). When host memory is too
    /// full for a GPU's pages and the node has a storage tier, the stage returned evicts host memory instead
    /// (the caller asks again). Returns an empty stage when nothing can be evicted.
    pub(super) fn plan_evict(
        &mut self,
        dev: DevIdx,
        count: u32,
        keep: &dyn Fn(PageRef) -> bool,
    ) -> Result<Stage, DirectoryError> {
        let mut stage = Stage::new(StageKind::Evict);
        if count == 0 {
            return Ok(stage);
        }
        let candidates: Vec<(u32, PageRef)> = {
            let d = &self.devs[usize::from(dev)];
            let listed = d.lru.iter().filter_map(|f| d.users[f as usize].map(|p| (f, p)));
            // Prefetched copies no lease has taken yet go last, each group in its own order.
            let (mut c, fresh): (Vec<_>, Vec<_>) = listed.partition(|&(f, _)| !d.fresh[f as usize]);
            c.extend(fresh);
            c
        };
        let mut dropped: HashMap<PageRef, u32> = HashMap::new();
        let mut chosen = 0;
        for (frame, page) in candidates {
            if chosen == count {
                break;
            }
            if keep(page) {
                continue;
            }
            let copy = Copy { dev, frame };
            let copies = self.page(page).copies().count() as u32;
            let gone = dropped.get(&page).copied().unwrap_or(0);
            if copies - gone > 1 {
                stage.updates.push(Update::Drop { page, copy });
                *dropped.entry(page).or_default() += 1;
            } else {
                // The only copy goes one tier down: a GPU's to host memory, host memory's to storage.
                let below = if dev == self.host {
                    self.storage
                } else if Some(dev) == self.storage {
                    None // nothing is below the storage tier
                } else {
                    Some(self.host)
                };
                let Some(below) = below else { continue };
                let tenant = self.tenant_of(page.slot);
                let f = match self.take(below, 1, tenant, AllocClass::Reserved) {
                    Ok(f) => f[0],
                    Err(e) => {
                        if !stage.updates.is_empty() {
                            break;
                        }
                        self.abort(stage);
                        if below == self.host && self.storage.is_some() {
                            // Host memory is full: make room there first (its pages go to storage), and the
                            // caller asks again.
                            let cascade = self.plan_evict(self.host, count.saturating_sub(chosen), keep)?;
                            if !cascade.updates.is_empty() {
                                return Ok(cascade);
                            }
                        }
                        return Err(e);
                    }
                };
                let to = Copy { dev: below, frame: f };
                stage.taken.push(to);
                let compression = match self.regions.get(page.slot as usize) {
                    Some(Some(r)) if Some(below) == self.storage => r.placement.compression,
                    _ => Compression::None,
                };
                stage.copy_packed(self.loc(dev), self.loc(below), frame, f, compression);
                stage.updates.push(Update::Relocate { page, old: copy, new: to });
            }
            chosen += 1;
        }
        Ok(stage)
    }
}
