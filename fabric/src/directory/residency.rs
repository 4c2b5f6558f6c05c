//! Which frame holds which copy: taking and freeing frames, pinning them under leases, and keeping the
//! eviction order of the unpinned ones.

use vfabric_allocator::{AllocClass, FrameRun, TenantId};

use super::error::DirectoryError;
use super::page::{Copy, DevIdx, PageRef};
use super::region::Priority;
use super::state::Directory;

impl Directory {
    /// Takes `n` frames of `dev` for `tenant` (scattered where the arena must), charging its quota.
    pub(super) fn take(
        &mut self,
        dev: DevIdx,
        n: u32,
        tenant: TenantId,
        class: AllocClass,
    ) -> Result<Vec<u32>, DirectoryError> {
        let d = &mut self.devs[usize::from(dev)];
        let loc = d.location;
        d.frames
            .alloc(n, tenant, class, &mut self.quotas)
            .map(|a| a.frames().collect())
            .map_err(|e| DirectoryError::from_alloc(e, loc))
    }

    /// Takes the run of `n` frames at `start` on `dev` for `tenant`.
    pub(super) fn take_run(&mut self, dev: DevIdx, start: u32, n: u32, tenant: TenantId) -> Result<(), DirectoryError> {
        let d = &mut self.devs[usize::from(dev)];
        let loc = d.location;
        d.frames
            .alloc_at(FrameRun { start, len: n }, tenant, AllocClass::Normal, &mut self.quotas)
            .map(|_| ())
            .map_err(|e| DirectoryError::from_alloc(e, loc))
    }

    /// Gives a frame taken for a copy back to its arena (and its tenant's quota): in the compressed tier, the
    /// run of blocks the copy takes.
    pub(super) fn untake(&mut self, c: Copy) {
        let d = &mut self.devs[usize::from(c.dev)];
        let blocks = match d.spans.get_mut(c.frame as usize) {
            Some(s) => u32::from(std::mem::take(s)).max(1),
            None => 1,
        };
        if let Err(e) = d.frames.free(c.frame..c.frame + blocks, &mut self.quotas) {
            tracing::error!(location = %d.location, frame = c.frame, error = %e, "freeing a frame the directory took failed");
        }
    }

    fn lru_insert(&mut self, c: Copy, prio: Priority) {
        self.devs[usize::from(c.dev)].lru.touch(c.frame, prio);
    }

    fn lru_remove(&mut self, c: Copy) {
        self.devs[usize::from(c.dev)].lru.remove(c.frame);
    }

    /// Marks a copy as just used.
    pub(super) fn touch(&mut self, c: Copy) {
        let lru = &mut self.devs[usize::from(c.dev)].lru;
        if let Some(p) = lru.priority(c.frame) {
            lru.touch(c.frame, p);
        }
    }

    /// Records that `c`'s frame holds a copy of `page`, and puts it in the eviction order.
    pub(super) fn set_user(&mut self, c: Copy, page: PageRef) {
        let prio = self.priority_of(page);
        self.devs[usize::from(c.dev)].users[c.frame as usize] = Some(page);
        self.lru_insert(c, prio);
    }

    /// Frees the frame of a copy that no page points to any more.
    pub(super) fn release_frame(&mut self, c: Copy) {
        self.lru_remove(c);
        self.devs[usize::from(c.dev)].users[c.frame as usize] = None;
        self.devs[usize::from(c.dev)].fresh[c.frame as usize] = false;
        self.untake(c);
    }

    /// Pins a copy's frame (a lease, or a prefetch in flight): it leaves the eviction order and cannot move.
    pub(super) fn pin(&mut self, c: Copy) {
        self.lru_remove(c);
        let d = &mut self.devs[usize::from(c.dev)];
        if let Err(e) = d.frames.lease(c.frame) {
            tracing::error!(location = %d.location, frame = c.frame, error = %e, "pinning a leased frame failed");
        }
    }

    /// Drops one pin of a copy's frame; the last one puts it back in the eviction order.
    pub(super) fn unpin(&mut self, c: Copy) {
        let d = &mut self.devs[usize::from(c.dev)];
        match d.frames.unlease(c.frame) {
            Ok(0) => {
                if let Some(p) = d.users[c.frame as usize] {
                    let prio = self.priority_of(p);
                    self.lru_insert(c, prio);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::error!(location = %d.location, frame = c.frame, error = %e, "unpinning failed"),
        }
    }

    /// Frames of `dev` that ordinary allocations may still take.
    pub(super) fn available(&self, dev: DevIdx) -> u32 {
        self.devs[usize::from(dev)].frames.available(AllocClass::Normal)
    }

    /// Removes one copy of a page, promoting a sharer (a GPU's first) when it was the owner.
    pub(super) fn drop_copy(&mut self, page: PageRef, copy: Copy) {
        let devs = &self.devs;
        if let Some(r) = self.regions[page.slot as usize].as_mut() {
            r.pages[page.page as usize].remove(copy, |d| devs[usize::from(d)].is_gpu());
        }
        self.release_frame(copy);
    }
}
