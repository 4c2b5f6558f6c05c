//! Leases: pins on used frames (a transfer reading them) that keep them from being freed or moved.

use super::arena::FrameArena;
use crate::error::AllocError;

impl FrameArena {
    /// Adds a lease to a used frame and returns its new lease count.
    ///
    /// Errors: [`InvalidAddress`](AllocError::InvalidAddress) outside the arena,
    /// [`DoubleFree`](AllocError::DoubleFree) for a free frame,
    /// [`InvalidSize`](AllocError::InvalidSize) if the count would overflow `u32`.
    pub fn lease(&mut self, frame: u32) -> Result<u32, AllocError> {
        let slot = self.check_frame(frame)?;
        if slot.owner.is_none() {
            return Err(AllocError::DoubleFree { addr: u64::from(frame) });
        }
        let Some(leases) = slot.leases.checked_add(1) else {
            return Err(AllocError::InvalidSize { size: u64::from(u32::MAX), reason: "lease count would overflow" });
        };
        if leases == 1 {
            self.leased += 1;
        }
        if let Some(slot) = self.slots.get_mut(frame as usize) {
            slot.leases = leases;
        }
        Ok(leases)
    }

    /// Releases one lease of a frame and returns its remaining lease count.
    ///
    /// Errors: [`InvalidAddress`](AllocError::InvalidAddress) outside the arena,
    /// [`DoubleFree`](AllocError::DoubleFree) for a free frame,
    /// [`NotLeased`](AllocError::NotLeased) when it holds no lease.
    pub fn unlease(&mut self, frame: u32) -> Result<u32, AllocError> {
        let slot = self.check_frame(frame)?;
        if slot.owner.is_none() {
            return Err(AllocError::DoubleFree { addr: u64::from(frame) });
        }
        if slot.leases == 0 {
            return Err(AllocError::NotLeased { frame });
        }
        let leases = slot.leases - 1;
        if leases == 0 {
            self.leased -= 1;
        }
        if let Some(slot) = self.slots.get_mut(frame as usize) {
            slot.leases = leases;
        }
        Ok(leases)
    }

    /// Outstanding leases on `frame` (0 for free frames and frames outside the arena).
    pub fn lease_count(&self, frame: u32) -> u32 {
        self.slots.get(frame as usize).map_or(0, |s| s.leases)
    }

    /// Frames holding at least one lease.
    pub fn leased_frames(&self) -> u32 {
        self.leased
    }
}
