//! Migration: moving a region's pages to another device for good.

use vfabric_allocator::{AllocClass, Location};

use super::error::DirectoryError;
use super::page::{Copy, PageRef};
use super::region::RegionHandle;
use super::stage::{Stage, StageKind, Step, Update};
use super::state::Directory;

impl Directory {
    /// One step of migrating a region to `device`: new pages will be placed there, and every page with a copy
    /// on another GPU moves there (a copy already there becomes the owner without moving; copies on the other
    /// GPUs are dropped). Pages only in host memory stay there until used. When the device cannot hold them
    /// all, the rest go to host memory, so the region leaves the other GPUs either way. Refused while any page
    /// is leased.
    pub fn step_migrate(&mut self, h: &RegionHandle, device: Location) -> Result<Step<()>, DirectoryError> {
        let dev = self.dev(device)?;
        if Some(dev) == self.storage {
            return Err(DirectoryError::StorageTier("is no region's home"));
        }
        if self.loc(dev).is_packed() {
            return Err(DirectoryError::PackedTier("is no region's home"));
        }
        if Some(dev) == self.compressed {
            return Err(DirectoryError::CompressedTier("is no region's home"));
        }
        let slot = h.slot;
        // A lossy region in host memory lives in the packed tier, where the node has one.
        let dev = if dev == self.host { self.host_of(slot) } else { dev };
        let pages = {
            let r = self.region(h)?;
            if let Some((i, p)) = r.pages.touched().find(|(_, p)| p.leased()) {
                return Err(self.leased_error(h, i as u64, p));
            }
            // Only pages ever used can have copies.
            r.pages.touched().filter(|(_, p)| p.owner().is_some()).map(|(i, _)| i as u32).collect::<Vec<u32>>()
        };
        if !self.in_flight.is_empty() {
            // Copies it drops may be a prefetch's sources.
            return Ok(Step::Wait);
        }
        if let Some(r) = self.regions[slot as usize].as_mut() {
            r.home = dev;
        }
        // Pages with a copy on another GPU, and the copy to move (the owner if it is on a GPU).
        let mut remaining: Vec<(u32, Copy)> = Vec::new();
        for i in pages {
            let page = PageRef { slot, page: i };
            let e = self.page(page);
            let elsewhere: Vec<Copy> =
                e.copies().filter(|c| c.dev != dev && self.devs[usize::from(c.dev)].is_gpu()).collect();
            if elsewhere.is_empty() {
                continue;
            }
            if e.copy_on(dev).is_some() {
                // Already here: make it the owner and let the other GPUs' copies go.
                self.page_mut(page).promote(dev);
                for c in elsewhere {
                    self.drop_copy(page, c);
                }
            } else {
                remaining.push((i, elsewhere[0]));
            }
        }
        if remaining.is_empty() {
            return Ok(Step::Done(()));
        }
        let keep = |p: PageRef| p.slot == slot;
        let want = remaining.len() as u32;
        let mut target = dev;
        if self.devs[usize::from(dev)].is_gpu() {
            let evict = self.eviction_need(dev, want);
            if evict > 0 {
                let stage = self.plan_evict(dev, evict, &keep)?;
                if !stage.updates.is_empty() {
                    return Ok(Step::Stage(stage));
                }
            }
            if self.available(dev) == 0 {
                target = self.host_of(slot);
            }
        }
        let (count, class) = if target == dev && self.devs[usize::from(dev)].is_gpu() {
            (want.min(self.available(dev)), AllocClass::Normal)
        } else {
            (want, AllocClass::Reserved)
        };
        let tenant = self.tenant_of(slot);
        let frames = self.take(target, count, tenant, class)?;
        let mut stage = Stage::new(StageKind::Migrate);
        let to = self.loc(target);
        for (&(i, old), &f) in remaining.iter().zip(&frames) {
            let page = PageRef { slot, page: i };
            let new = Copy { dev: target, frame: f };
            stage.taken.push(new);
            if target != dev && self.page(page).copy_on(target).is_some() {
                // Going to host memory, which already holds a copy: nothing to move, just let this one go.
                stage.taken.pop();
                self.untake(new);
                stage.updates.push(Update::Drop { page, copy: old });
                continue;
            }
            self.copy_page(&mut stage, slot, self.loc(old.dev), to, old.frame, f);
            stage.updates.push(Update::Relocate { page, old, new });
        }
        Ok(Step::Stage(stage))
    }
}
