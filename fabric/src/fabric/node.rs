//! What a node's fabric holds: the directory behind its lock, the arenas, the mover, the counters. Shared by
//! the fabric and its leases (a lease lets go of its pages when dropped).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vfabric_transport::storage::StorageFile;
use vfabric_transport::{Arena, DeviceError, DeviceLayer, Mover};

use super::copying::Copying;
use super::probe_skip::ProbeSkips;
use super::stalls::StallCounters;
use super::traffic::Counters;
use crate::directory::{Directory, Stage};

/// What the fabric's lock guards.
pub(crate) struct State {
    pub(crate) dir: Directory,
    /// The prefetch stages whose copies are in flight, oldest first (the directory knows they are pending;
    /// their transfers live here). Dropped before the arenas: dropping a transfer waits for it.
    pub(crate) prefetch: VecDeque<InFlight>,
    /// Frames of host memory that committed stages brought lossless regions' pages to from a GPU (or a host
    /// write filled whole), to be packed for the compressed tier when the call is done (`stages.rs`).
    pub(crate) arrived: Vec<u32>,
    /// Which regions' pages are not worth looking at for the compressed tier for now.
    pub(crate) probes: ProbeSkips,
    /// Stages whose copies passed `copy_deadline`, oldest first: nothing plans a stage until they finish
    /// (`stalled.rs`).
    pub(crate) parked: Vec<InFlight>,
    /// Releases and given-back reservations kept while a stage is parked.
    pub(crate) deferred: Vec<Deferred>,
    /// How long a stage's copies may take before they are reported stalled (`device.copy_deadline_ms`).
    pub(crate) copy_deadline: Duration,
}

/// A change to the directory kept while a stage is parked, applied once none is.
pub(crate) enum Deferred {
    /// A reservation given back (an aborted stage gives frames back to its reservation).
    Unreserve(u64),
    /// A region freed for a caller that has gone (a local client that left).
    Free(crate::directory::RegionHandle),
}

impl State {
    /// Gives a reservation back now, or once no stage is parked (`stalled.rs`); a failure is logged (its holder
    /// has gone).
    pub(crate) fn unreserve_or_defer(&mut self, id: u64) {
        if !self.parked.is_empty() {
            return self.deferred.push(Deferred::Unreserve(id));
        }
        if let Err(e) = self.dir.unreserve(id) {
            tracing::warn!(id, error = %e, "giving back a reservation failed");
        }
    }
}

pub(crate) struct InFlight {
    pub(crate) stage: Stage,
    pub(crate) copies: Vec<Copying>,
    /// When its copies started.
    pub(crate) started: Instant,
}

impl Drop for State {
    fn drop(&mut self) {
        // A parked stage's copies may never finish, and dropping them waits for them: those still running are
        // left so, with the arenas they hold (a device that stopped answering keeps its memory until the process
        // ends); those that finished go, and their arenas with them.
        for p in self.parked.drain(..) {
            for mut c in p.copies {
                if c.is_complete() {
                    drop(c);
                } else {
                    std::mem::forget(c);
                }
            }
        }
        // Those in flight get their deadline too before being left the same way.
        for p in self.prefetch.drain(..) {
            let mut copies = p.copies;
            if !super::copying::all_done_by(&mut copies, p.started + self.copy_deadline) {
                tracing::error!("dropping the fabric: a prefetch's copies passed their deadline and are left running");
                std::mem::forget(copies);
            }
        }
    }
}

pub(crate) struct Inner {
    pub(crate) state: Mutex<State>,
    pub(crate) layer: Arc<dyn DeviceLayer>,
    pub(crate) arenas: Vec<Arc<dyn Arena>>,
    pub(crate) mover: Arc<dyn Mover>,
    pub(crate) page_size: u64,
    pub(crate) counters: Counters,
    pub(crate) stalls: StallCounters,
    pub(crate) fallback: Option<DeviceError>,
    /// The storage tier, when the node has one (its pages move by file I/O, not by the mover). Shared with the
    /// threads a prefetch's reads run on: its file goes when the last of them does.
    pub(crate) storage: Option<Arc<StorageFile>>,
    /// The largest piece one host write places at once (see `Fabric::write`).
    pub(crate) write_piece: u64,
}

pub(crate) fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while the directory was held (a bug) leaves it as the last commit left it: consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    /// The arena of `location`.
    pub(crate) fn arena(
        &self,
        dir: &Directory,
        location: vfabric_allocator::Location,
    ) -> Result<&Arc<dyn Arena>, crate::error::FabricError> {
        let i = dir.dev(location)?;
        // The storage tier, last of the directory's devices, has no arena.
        self.arenas.get(usize::from(i)).ok_or(crate::error::FabricError::Device(DeviceError::NoArena(location)))
    }
}
