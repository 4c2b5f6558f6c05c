//! Regions: allocating and freeing them, looking them (and their pages) up, and checking the byte ranges and
//! leases that calls on them name.

use vfabric_allocator::{AllocClass, Element, GlobalAddr, Location, TenantId};

use super::error::{DirectoryError, LeaseHeld};
use super::lease::Mode;
use super::page::{Copy, DevIdx, PageEntry, PageRef};
use super::page_table::PageTable;
use super::region::{packing, Placement, Priority, RegionEntry, RegionHandle};
use super::stage::{Stage, Step};
use super::state::Directory;

impl Directory {
    /// Allocates a region of `size` bytes (rounded up to whole pages). No memory is taken until pages are
    /// written or acquired.
    pub fn alloc(&mut self, size: u64, placement: Placement) -> Result<RegionHandle, DirectoryError> {
        if size == 0 {
            return Err(DirectoryError::ZeroSize);
        }
        let ps = self.page_size();
        let pages = size.div_ceil(ps);
        if pages > u64::from(u32::MAX) {
            return Err(DirectoryError::TooManyPages { size });
        }
        let home = match placement.device {
            Some(Location::Storage) => return Err(DirectoryError::StorageTier("is no region's home")),
            Some(Location::Packed(_)) => return Err(DirectoryError::PackedTier("is no region's home")),
            Some(Location::Compressed) => return Err(DirectoryError::CompressedTier("is no region's home")),
            Some(Location::Host) => self.host_memory_for(placement.compression),
            Some(l) => self.dev(l)?,
            // On a node without GPUs, host memory (the region's).
            None => self.pick_gpu().unwrap_or_else(|| self.host_memory_for(placement.compression)),
        };
        let range = self.space.alloc(pages * ps).map_err(DirectoryError::AddressSpaceExhausted)?;
        let addr = GlobalAddr::new(self.cfg.node, range.start).map_err(DirectoryError::AddressSpaceExhausted)?;
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.regions.push(None);
                self.generations.push(u64::from(self.cfg.epoch) << 32);
                (self.regions.len() - 1) as u32
            }
        };
        // The low 32 bits count the slot's regions (wrapping within them); the high ones stay the epoch.
        let g = &mut self.generations[slot as usize];
        *g = (u64::from(self.cfg.epoch) << 32) | u64::from((*g as u32).wrapping_add(1));
        let handle =
            RegionHandle { slot, generation: self.generations[slot as usize], addr, len: pages * ps, page_size: ps };
        self.regions[slot as usize] =
            Some(RegionEntry { handle, placement, home, pages: PageTable::new(pages as usize), stream: None });
        Ok(handle)
    }

    /// The GPU with the most frames available to ordinary allocations, if the node has one.
    fn pick_gpu(&self) -> Option<DevIdx> {
        self.devs
            .iter()
            .enumerate()
            .filter(|(_, d)| d.is_gpu())
            .max_by_key(|(i, d)| (d.frames.available(AllocClass::Normal), std::cmp::Reverse(*i)))
            .map(|(i, _)| i as DevIdx)
    }

    /// Every live region.
    pub fn regions(&self) -> impl Iterator<Item = &RegionEntry> {
        self.regions.iter().flatten()
    }

    /// The live region `h` names.
    pub fn region(&self, h: &RegionHandle) -> Result<&RegionEntry, DirectoryError> {
        if h.generation >> 32 != u64::from(self.cfg.epoch) {
            return Err(DirectoryError::StaleHandle(*h));
        }
        match self.regions.get(h.slot as usize) {
            // The whole handle must match: one that crossed a wire may name a slot with other bounds.
            Some(Some(r)) if r.handle == *h => Ok(r),
            Some(_) if self.generations[h.slot as usize] >= h.generation => Err(DirectoryError::UseAfterFree(*h)),
            _ => Err(DirectoryError::UnknownRegion(*h)),
        }
    }

    /// The device new pages of a live region go to (its placement's, or where a migration moved it): host memory
    /// for a lossy region that lives in the packed tier, as its placement would name it.
    pub fn home_of(&self, h: &RegionHandle) -> Result<Location, DirectoryError> {
        Ok(match self.loc(self.region(h)?.home) {
            Location::Packed(_) => Location::Host,
            l => l,
        })
    }

    /// The entry of a page of a live region.
    pub(super) fn page(&self, p: PageRef) -> &PageEntry {
        // Callers hold a PageRef only for live regions (taken from `users` or a checked handle).
        &self.regions[p.slot as usize].as_ref().expect("live region").pages[p.page as usize]
    }

    /// The entry of a page of a live region, to change.
    pub(super) fn page_mut(&mut self, p: PageRef) -> &mut PageEntry {
        &mut self.regions[p.slot as usize].as_mut().expect("live region").pages[p.page as usize]
    }

    /// The eviction priority of a page's region.
    pub(super) fn priority_of(&self, p: PageRef) -> Priority {
        self.regions[p.slot as usize].as_ref().map_or(Priority::Normal, |r| r.placement.priority)
    }

    /// The host memory a region's pages go to when they leave a GPU (and a region placed in host memory lives
    /// in): for a lossy region, the packed tier whose slots are sized for its values or else the one of bf16
    /// slots (which hold either), where the node has one; else host memory.
    pub(super) fn host_of(&self, slot: u32) -> DevIdx {
        let compression = self.regions.get(slot as usize).and_then(Option::as_ref).map(|r| r.placement.compression);
        self.host_memory_for(compression.unwrap_or_default())
    }

    /// [`Directory::host_of`] for a region stored with `compression`.
    fn host_memory_for(&self, compression: vfabric_allocator::Compression) -> DevIdx {
        let tier = |e| self.devs.iter().position(|d| d.location == Location::Packed(e)).map(|i| i as DevIdx);
        compression.lossy().and_then(|l| tier(l.element).or_else(|| tier(Element::Bf16))).unwrap_or(self.host)
    }

    /// Whether a device is host memory (pages as they are, or packed).
    pub(super) fn is_host_memory(&self, dev: DevIdx) -> bool {
        self.loc(dev).is_host_memory()
    }

    /// The tenant a region's frames are charged to.
    pub(super) fn tenant_of(&self, slot: u32) -> TenantId {
        self.regions[slot as usize].as_ref().map_or(TenantId::default(), |r| r.placement.tenant)
    }

    /// Adds to `stage` the copy of a page of region `slot` from frame `src` of `from` to frame `dst` of `to`,
    /// packed as the region's compression asks for that move ([`packing`]).
    pub(super) fn copy_page(&self, stage: &mut Stage, slot: u32, from: Location, to: Location, src: u32, dst: u32) {
        let compression = self.regions.get(slot as usize).and_then(Option::as_ref).map(|r| r.placement.compression);
        stage.copy_packed(from, to, src, dst, packing(compression.unwrap_or_default(), from, to));
    }

    /// Frees a region and every frame its pages hold. Refused while any of its pages is leased; waits for a
    /// prefetch of its pages.
    pub fn free(&mut self, h: &RegionHandle) -> Result<Step<()>, DirectoryError> {
        let r = match self.region(h) {
            Ok(r) => r,
            Err(DirectoryError::UseAfterFree(h)) => return Err(DirectoryError::DoubleFree(h)),
            Err(e) => return Err(e),
        };
        if let Some((i, p)) = r.pages.touched().find(|(_, p)| p.leased()) {
            return Err(self.leased_error(h, i as u64, p));
        }
        if self.in_flight.iter().any(|f| f.slot == h.slot) {
            return Ok(Step::Wait);
        }
        let copies: Vec<Copy> = r.pages.touched().flat_map(|(_, p)| p.copies().collect::<Vec<_>>()).collect();
        for c in copies {
            self.release_frame(c);
        }
        let addr = h.addr.offset();
        self.regions[h.slot as usize] = None;
        self.free_slots.push(h.slot);
        self.space.free(addr).map_err(DirectoryError::FreeRange)?;
        Ok(Step::Done(()))
    }

    /// The error for a call refused because page `page` of `h` is leased (`p` is its entry).
    pub(super) fn leased_error(&self, h: &RegionHandle, page: u64, p: &PageEntry) -> DirectoryError {
        let held = if p.write_leased {
            let on = self.leases.values().find(|l| l.slot == h.slot && l.mode == Mode::Write).map(|l| self.loc(l.dev));
            LeaseHeld::Writing(on)
        } else {
            LeaseHeld::Reading(p.read_leases)
        };
        DirectoryError::LeasedElsewhere { region: *h, page, held }
    }

    /// Checks a byte range of a region; returns its first page and page count.
    pub(super) fn span(&self, h: &RegionHandle, offset: u64, len: u64) -> Result<(u32, u32), DirectoryError> {
        let r = self.region(h)?;
        let end = offset.checked_add(len);
        if len == 0 || end.is_none_or(|e| e > r.handle.len) {
            return Err(DirectoryError::OutOfBounds { offset, len, region_len: r.handle.len });
        }
        let ps = self.page_size();
        let first = offset / ps;
        let last = (offset + len).div_ceil(ps);
        Ok((first as u32, (last - first) as u32))
    }
}
