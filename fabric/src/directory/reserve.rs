//! Reservations: capacity set aside on one device before a task starts, so that the task cannot fail midway
//! for want of it. A reservation takes its frames at once (evicting to make room, as an acquire would) and
//! pins them, holding no page: nothing else can take, evict or move them. A region whose placement names the
//! reservation draws on those frames as its pages arrive on that device; dropping the reservation returns the
//! rest. A reservation that cannot be met is refused at once, saying what is available.

use vfabric_allocator::{AllocClass, Location, TenantId};

use super::error::DirectoryError;
use super::page::{Copy, DevIdx};
use super::stage::Step;
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
    /// set aside, `Stage` when pages must be evicted first, `Wait` while a prefetch is in flight. Refused with
    /// [`DirectoryError::ReservationRefused`] when evicting every page that may leave would still not make
    /// room, and with the tenant's `QuotaExceeded` when the quota would not allow it.
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
        let total = u64::from(self.devs[usize::from(dev)].frames.frames());
        if n > total {
            return Err(DirectoryError::ReservationRefused {
                location,
                requested: bytes,
                available: self.free_bytes(dev),
            });
        }
        let n = n as u32;
        if !self.in_flight.is_empty() {
            // Evicting beside a stage in flight could take its sources.
            return Ok(Step::Wait);
        }
        let avail = self.available(dev);
        if avail < n {
            let stage = self.plan_evict(dev, n - avail, &|_| false)?;
            if !stage.updates.is_empty() {
                return Ok(Step::Stage(stage));
            }
            return Err(DirectoryError::ReservationRefused {
                location,
                requested: bytes,
                available: self.free_bytes(dev),
            });
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

    /// Lets `n` frames of the reservation region `slot` names go, when it holds frames of `dev`: called just
    /// before the region's pages take frames there, so that they take those.
    pub(super) fn draw_reservation(&mut self, slot: u32, dev: DevIdx, n: u32) {
        let Some(id) = self.regions.get(slot as usize).and_then(|r| r.as_ref()).and_then(|r| r.placement.reservation)
        else {
            return;
        };
        let Some((d, frames, _)) = self.reservations.held.get_mut(&id) else { return };
        if *d != dev {
            return;
        }
        let keep = frames.len().saturating_sub(n as usize);
        let drawn: Vec<u32> = frames.drain(keep..).collect();
        for f in drawn {
            self.free_reserved(dev, f);
        }
    }

    fn free_reserved(&mut self, dev: DevIdx, frame: u32) {
        let c = Copy { dev, frame };
        self.unpin(c);
        self.untake(c);
    }

    fn free_bytes(&self, dev: DevIdx) -> u64 {
        u64::from(self.available(dev)) * self.page_size()
    }
}
