//! Reservations: capacity set aside on one device before a task starts, so that the task cannot fail midway
//! for want of it. A reservation takes its frames at once (evicting to make room, as an acquire would) and
//! pins them, holding no page: nothing else can take, evict or move them. A region whose placement names the
//! reservation draws on those frames as its pages arrive on that device; dropping the reservation returns the
//! rest. A reservation that cannot be met is refused at once, before anything moves, saying what could be had.
//! An eviction that moves a tenant's page to a device where the tenant holds a reservation takes one of its
//! frames; no other tenant's does.

use std::collections::HashMap;

use vfabric_allocator::{AllocClass, Location, TenantId};

use super::error::DirectoryError;
use super::page::{Copy, DevIdx};
use super::stage::{Drawn, Stage, Step};
use super::state::Directory;

/// A reservation as [`Directory::reservations`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReservationInfo {
    /// Its id.
    pub id: u64,
    /// The device it holds frames of.
    pub location: Location,
    /// The tenant it holds them for.
    pub tenant: TenantId,
    /// The bytes it still holds (what allocations naming it have not used yet).
    pub bytes: u64,
}

impl Directory {
    /// One step of reserving `bytes` (whole pages) of `location` for `tenant`: `Done(id)` once the frames are
    /// set aside, `Stage` when pages must be evicted first, `Wait` while a stage is in flight. Refused before
    /// anything moves: with [`DirectoryError::ReservationRefused`], saying what could be had, when the frames
    /// free there and those that evicting every page that may leave would free are too few; and with the
    /// tenant's `QuotaExceeded` when its quota there would not allow it.
    pub fn step_reserve(
        &mut self,
        location: Location,
        bytes: u64,
        tenant: TenantId,
    ) -> Result<Step<u64>, DirectoryError> {
        let dev = self.dev(location)?;
        if Some(dev) == self.compressed {
            return Err(DirectoryError::CompressedTier("takes no reservations: its pages take runs of any length"));
        }
        if bytes == 0 {
            return Err(DirectoryError::ZeroSize);
        }
        let n = bytes.div_ceil(self.page_size());
        let d = &self.devs[usize::from(dev)];
        let tier = d.frames.tier();
        let charge = n.saturating_mul(d.frames.frame_size().bytes());
        if !self.quotas.can_charge(tenant, tier, charge) {
            return Err(DirectoryError::QuotaExceeded {
                tenant,
                tier,
                limit: self.quotas.limit(tenant, tier).unwrap_or(u64::MAX),
                used: self.quotas.used(tenant, tier),
                requested: charge,
            });
        }
        let ps = self.page_size();
        let refused = move |available: u32| DirectoryError::ReservationRefused {
            location,
            requested: bytes,
            available: u64::from(available) * ps,
        };
        if n > u64::from(d.frames.frames() - d.frames.reserved_frames()) {
            return Err(refused(self.obtainable(dev)));
        }
        let n = n as u32;
        if !self.in_flight.is_empty() {
            // Evicting beside a stage in flight could take its sources; and what it pins comes free as it lands.
            return Ok(Step::Wait);
        }
        let avail = self.available(dev);
        if avail < n {
            // Refused before anything moves: evicting pages only to refuse would cost other tenants their pages
            // for nothing.
            let can = self.obtainable(dev);
            if can < n {
                return Err(refused(can));
            }
            let stage = self.plan_evict_exactly(dev, n - avail, &|_| false)?;
            if !stage.updates.is_empty() {
                return Ok(Step::Stage(stage));
            }
            // The count was too hopeful (it does not look at quotas below): what is free is what can be had.
            return Err(refused(self.available(dev)));
        }
        let frames = self.take(dev, n, tenant, AllocClass::Normal)?;
        for &f in &frames {
            self.pin(Copy { dev, frame: f });
        }
        let r = &mut self.reservations;
        r.next += 1;
        r.held.insert(r.next, (dev, frames, tenant));
        Ok(Step::Done(r.next))
    }

    /// Frames of `dev` a reservation could have: those ordinary allocations may take now, and those evicting
    /// every copy that may leave would free. A copy may leave when it is not pinned (so neither leased, read or
    /// written by a stage in flight, nor reserved) and either the page has another copy or the tier below has
    /// room for it (free frames, or frames its own evictions would free). Quotas below are not counted.
    pub(super) fn obtainable(&self, dev: DevIdx) -> u32 {
        let d = &self.devs[usize::from(dev)];
        let normal = d.frames.frames() - d.frames.reserved_frames();
        let stuck = d.frames.used_frames().saturating_sub(self.freeable(dev, 2));
        normal.saturating_sub(stuck)
    }

    /// Frames of `dev` that evicting every copy that may leave would free, looking `depth` tiers further down
    /// for room for only copies.
    fn freeable(&self, dev: DevIdx, depth: u8) -> u32 {
        let d = &self.devs[usize::from(dev)];
        let mut freed = 0u32;
        let mut down: HashMap<DevIdx, u32> = HashMap::new();
        for f in d.lru.iter() {
            let Some(page) = d.users[f as usize] else { continue };
            if self.page(page).copies().count() > 1 {
                freed += 1;
            } else if let Some(b) = self.below(dev, page.slot) {
                *down.entry(b).or_default() += 1;
            }
        }
        for (b, n) in down {
            // Evictions may take the headroom below.
            let mut room = self.devs[usize::from(b)].frames.free_frames();
            if depth > 0 {
                room = room.saturating_add(self.freeable(b, depth - 1));
            }
            freed += n.min(room);
        }
        freed
    }

    /// Every reservation held: its id, device, tenant and the bytes it still holds, by id.
    pub fn reservations(&self) -> Vec<ReservationInfo> {
        let mut out: Vec<ReservationInfo> = self
            .reservations
            .held
            .iter()
            .map(|(&id, (dev, frames, tenant))| ReservationInfo {
                id,
                location: self.loc(*dev),
                tenant: *tenant,
                bytes: frames.len() as u64 * self.page_size(),
            })
            .collect();
        out.sort_by_key(|r| r.id);
        out
    }

    /// Gives back what is left of reservation `id`.
    pub fn unreserve(&mut self, id: u64) -> Result<(), DirectoryError> {
        let (dev, frames, _) = self.reservations.held.remove(&id).ok_or(DirectoryError::UnknownReservation(id))?;
        for f in frames {
            self.free_reserved(dev, f);
        }
        Ok(())
    }

    /// Bytes reservation `id` still holds.
    pub fn reserved(&self, id: u64) -> Result<u64, DirectoryError> {
        let (_, frames, _) = self.reservations.held.get(&id).ok_or(DirectoryError::UnknownReservation(id))?;
        Ok(frames.len() as u64 * self.page_size())
    }

    /// Frames of `dev` that reservations hold.
    pub(super) fn reserved_frames(&self, dev: DevIdx) -> u32 {
        self.reservations.held.values().filter(|(d, _, _)| *d == dev).map(|(_, f, _)| f.len() as u32).sum()
    }

    /// Lets up to `n` frames of the reservation region `slot` names go, when it holds frames of `dev`: called
    /// just before a call plans room for the region's pages there and takes their frames, so that they take
    /// those. What it returns must reach [`Directory::settle_draw`] before the call returns, so that frames the
    /// call does not take go back (a call retried after the stage it returned draws again).
    pub(super) fn draw_reservation(&mut self, slot: u32, dev: DevIdx, n: u32) -> Option<Drawn> {
        let id = self.regions.get(slot as usize).and_then(|r| r.as_ref()).and_then(|r| r.placement.reservation)?;
        let (d, frames, _) = self.reservations.held.get_mut(&id)?;
        if *d != dev {
            return None;
        }
        let keep = frames.len().saturating_sub(n as usize);
        let drawn: Vec<u32> = frames.drain(keep..).collect();
        let count = drawn.len() as u32;
        for f in drawn {
            self.free_reserved(dev, f);
        }
        (count > 0).then_some(Drawn { id, dev, frames: count })
    }

    /// Settles frames a call drew with [`Directory::draw_reservation`], given what the call returns (`result`)
    /// and how to find the stage in it: the stage keeps them (see `Stage::keep_drawn`: given back if it
    /// aborts, or when it commits without having taken them); with no stage (done, waiting, refused) they go
    /// back to the reservation now.
    pub(super) fn settle_draw<T>(
        &mut self,
        drawn: Option<Drawn>,
        mut result: Result<T, DirectoryError>,
        stage: impl FnOnce(&mut T) -> Option<&mut Stage>,
    ) -> Result<T, DirectoryError> {
        let Some(d) = drawn else { return result };
        match result.as_mut().ok().and_then(stage) {
            Some(s) => s.keep_drawn(d),
            None => self.undraw(d),
        }
        result
    }

    /// Gives frames drawn out of a reservation back to it: taken again for its tenant and pinned. Nothing when
    /// the reservation is gone (given back meanwhile: the frames are everyone's).
    pub(super) fn undraw(&mut self, d: Drawn) {
        let Some(&(_, _, tenant)) = self.reservations.held.get(&d.id) else { return };
        // All at once where the arena has them; else one at a time, as many as it has (the frames were free
        // when drawn, so this only comes short when something took them since, which is logged).
        let frames = match self.take(d.dev, d.frames, tenant, AllocClass::Normal) {
            Ok(frames) => frames,
            Err(_) => {
                (0..d.frames).map_while(|_| self.take(d.dev, 1, tenant, AllocClass::Normal).ok()).flatten().collect()
            }
        };
        if frames.len() < d.frames as usize {
            tracing::warn!(
                reservation = d.id,
                location = %self.loc(d.dev),
                lost = d.frames as usize - frames.len(),
                "frames drawn out of a reservation could not all be given back"
            );
        }
        for &f in &frames {
            self.pin(Copy { dev: d.dev, frame: f });
        }
        if let Some((_, held, _)) = self.reservations.held.get_mut(&d.id) {
            held.extend(frames);
        }
    }

    /// Takes one frame out of a reservation of `dev` for a page of region `slot` that an eviction moves there:
    /// out of the reservation the region names when it holds frames of `dev`, else out of the first that its
    /// tenant holds there. The frame stays charged to the reservation's tenant and is no longer pinned: the
    /// page's copy takes it when the stage commits. `None` when no such reservation has a frame left.
    pub(super) fn lend_reserved(&mut self, slot: u32, dev: DevIdx) -> Option<(u64, u32)> {
        let tenant = self.tenant_of(slot);
        let held = &self.reservations.held;
        let has = |id: &u64| held.get(id).is_some_and(|(d, frames, _)| *d == dev && !frames.is_empty());
        let named = self.regions.get(slot as usize).and_then(|r| r.as_ref()).and_then(|r| r.placement.reservation);
        let id = named
            .filter(has)
            .or_else(|| held.iter().filter(|(id, (_, _, t))| *t == tenant && has(id)).map(|(&id, _)| id).min())?;
        let frame = self.reservations.held.get_mut(&id)?.1.pop()?;
        self.unpin(Copy { dev, frame });
        Some((id, frame))
    }

    /// Gives back a frame [`Directory::lend_reserved`] took out of reservation `id`, unused: pinned in the
    /// reservation again, or freed when the reservation is gone.
    pub(super) fn return_lent(&mut self, id: u64, c: Copy) {
        match self.reservations.held.get_mut(&id) {
            Some((_, frames, _)) => {
                frames.push(c.frame);
                self.pin(c);
            }
            None => self.untake(c),
        }
    }

    fn free_reserved(&mut self, dev: DevIdx, frame: u32) {
        let c = Copy { dev, frame };
        self.unpin(c);
        self.untake(c);
    }
}
