//! The compressed tier: lossless regions' pages held in runs of blocks as long as their packed form. A page of a
//! region stored with `lz4` or `zstd` reaches host memory's frames from a GPU as it is (a copy engine's move,
//! at the link's speed); the caller then packs it on the CPU and, when that saves at least a block, moves the
//! copy here ([`Directory::place_compressed`]), freeing the frame. Pages leave the tier expanded on the CPU:
//! to a GPU or host memory when fetched, to the storage tier when evicted (least recently used first, as host
//! memory's pages go).
//!
//! Why a tier beside host memory's frames rather than frames that shrink: the directory plans every copy before
//! its bytes are seen, and a page's packed length is known only once it is packed. Pages therefore land whole
//! in a frame, as any page does, and move here by their packed length once it is known.

use vfabric_allocator::{AllocClass, Compression, FrameRun, Location, COMPRESSED_BLOCK};

use super::error::DirectoryError;
use super::page::{Copy, DevIdx, PageRef};
use super::stage::{Stage, Step};
use super::state::Directory;

impl Directory {
    /// Blocks of the compressed tier a whole page would take: a page must take fewer to go there.
    pub fn page_blocks(&self) -> u32 {
        (self.page_size() / COMPRESSED_BLOCK) as u32
    }

    /// The page whose copy is in host memory's `frame` and the compression to pack it with, when it may move to
    /// the compressed tier:
    /// the node has one, and the frame holds a copy of a page of a lossless region that nothing pins (no lease,
    /// no stage in flight) and that has no copy there yet. `None` otherwise.
    pub fn compressible(&self, frame: u32) -> Option<(PageRef, Compression)> {
        self.compressed?;
        let d = &self.devs[usize::from(self.host)];
        let page = (*d.users.get(frame as usize)?)?;
        let c = self.regions.get(page.slot as usize)?.as_ref()?.placement.compression;
        // A page already there (a migration to host memory brought a copy beside it) keeps the one.
        let there = self.page(page).copies().any(|c| Some(c.dev) == self.compressed);
        (c.is_lossless() && !there && d.lru.contains(frame) && d.frames.lease_count(frame) == 0).then_some((page, c))
    }

    /// Where a run of `blocks` blocks would go in the compressed tier (the first block of the shortest free run
    /// that holds it: short runs fill first, keeping long ones for pages that shrink less); `None` when no free
    /// run is that long ([`Directory::step_compressed_room`] makes one) or the node has no compressed tier.
    pub fn compressed_fit(&self, blocks: u32) -> Option<u32> {
        let frames = &self.devs[usize::from(self.compressed?)].frames;
        if blocks == 0 || frames.available(AllocClass::Reserved) < blocks {
            return None;
        }
        frames.free_runs().filter(|r| r.len >= blocks).min_by_key(|r| r.len).map(|r| r.start)
    }

    /// Moves the copy of `page` in host memory's `frame` to the run of `blocks` blocks at `start` of the
    /// compressed tier (where [`Directory::compressed_fit`] said), and frees the frame. The caller has written
    /// the page's packed form to the run first (under the one lock it holds around the directory, so nothing
    /// took the run since).
    ///
    /// Refused (`CompressedTier`) when the frame holds no copy of `page` that may move
    /// ([`Directory::compressible`]) or `blocks` saves nothing (zero, or a whole page's); the allocator's error
    /// when the run is not free. Nothing changes then.
    pub fn place_compressed(
        &mut self,
        frame: u32,
        page: PageRef,
        start: u32,
        blocks: u32,
    ) -> Result<(), DirectoryError> {
        if self.compressible(frame).map(|c| c.0) != Some(page) {
            return Err(DirectoryError::CompressedTier("takes only unpinned copies of lossless regions' pages"));
        }
        if blocks == 0 || blocks >= self.page_blocks() {
            return Err(DirectoryError::CompressedTier("takes only pages that shrink by a block"));
        }
        let dev = self.compressed_dev()?;
        let old = Copy { dev: self.host, frame };
        let tenant = self.tenant_of(page.slot);
        let d = &mut self.devs[usize::from(dev)];
        d.frames
            .alloc_at(FrameRun { start, len: blocks }, tenant, AllocClass::Reserved, &mut self.quotas)
            .map_err(|e| DirectoryError::from_alloc(e, Location::Compressed))?;
        d.spans[start as usize] = blocks as u16;
        let new = Copy { dev, frame: start };
        self.page_mut(page).replace(old, new);
        self.set_user(new, page);
        self.release_frame(old);
        Ok(())
    }

    /// One step of making room for a run of `blocks` blocks in the compressed tier: `Done(true)` when one is
    /// free, a stage evicting its least recently used pages to the storage tier (as many as free that many
    /// blocks; the caller commits it and asks again), `Done(false)` when none can go (no storage tier, every
    /// page pinned, or a run longer than the tier).
    pub fn step_compressed_room(&mut self, blocks: u32) -> Result<Step<bool>, DirectoryError> {
        let dev = self.compressed_dev()?;
        let d = &self.devs[usize::from(dev)];
        if d.frames.largest_free_run() >= blocks {
            return Ok(Step::Done(true));
        }
        if self.storage.is_none() || blocks > d.frames.frames() {
            return Ok(Step::Done(false));
        }
        // Freed runs join their free neighbours, so the least recently used pages that add up to the run are
        // the first guess; a tier too fragmented for it asks again and evicts the next.
        let mut freed = 0u32;
        let mut count = 0u32;
        for f in d.lru.iter() {
            if freed >= blocks {
                break;
            }
            freed += u32::from(d.spans[f as usize]);
            count += 1;
        }
        let stage: Stage = self.plan_evict(dev, count.max(1), &|_| false)?;
        if stage.updates.is_empty() {
            return Ok(Step::Done(false));
        }
        Ok(Step::Stage(stage))
    }

    /// The blocks of the run a copy takes in the compressed tier (`None` for a copy elsewhere or a block that
    /// starts no run).
    pub fn compressed_span(&self, frame: u32) -> Option<u32> {
        let dev = self.compressed?;
        let s = *self.devs[usize::from(dev)].spans.get(frame as usize)?;
        (s > 0).then_some(u32::from(s))
    }

    /// The compressed tier's index.
    fn compressed_dev(&self) -> Result<DevIdx, DirectoryError> {
        self.compressed.ok_or(DirectoryError::DeviceUnavailable(Location::Compressed))
    }
}
