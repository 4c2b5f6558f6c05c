//! What a node's fabric holds: the directory behind its lock, the arenas, the mover, the counters. Shared by
//! the fabric and its leases (a lease lets go of its pages when dropped).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

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
}

pub(crate) struct InFlight {
    pub(crate) stage: Stage,
    pub(crate) copies: Vec<Copying>,
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
