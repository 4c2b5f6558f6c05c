//! The state of a held lease shared by the Python `Lease` and every tensor made from it, and the rule that keeps
//! those tensors valid: an array or tensor made from a lease (through DLPack) must never outlive the lease's
//! memory.
//!
//! Each exported tensor holds a [`ViewGuard`], which counts it as alive in the lease's [`LeaseState`] and keeps
//! that state alive. So:
//! - `release()` with tensors alive fails ([`ReleaseError::InUse`]) and the lease stays held;
//! - when the Python `Lease` object goes away, the state lives on while tensors do, and the last one to go
//!   releases the lease ([`LeaseState`]'s `Drop`);
//! - before a lease is released, the backend waits for the work queued on its device, so kernels still
//!   reading or writing the pages finish before the pages can move.
//!
//! Tensors die on whatever thread their consumer frees them, with or without the GIL: nothing here touches
//! Python.

use std::sync::{Arc, Mutex, MutexGuard};

use vfabric::FabricError;

use crate::backend::{Backend, HeldLease};

/// A lease and the tensors alive that were made from it.
pub struct LeaseState {
    backend: Arc<dyn Backend>,
    held: Mutex<Held>,
}

struct Held {
    /// `None` once released.
    lease: Option<Box<dyn HeldLease>>,
    /// Exported tensors not yet deleted.
    views: usize,
}

/// Why a release did not happen.
pub enum ReleaseError {
    /// The lease was already released.
    Released,
    /// This many tensors made from it are alive.
    InUse(usize),
    /// The fabric refused.
    Fabric(FabricError),
}

impl LeaseState {
    /// The state of `lease`, just granted by `backend`.
    pub fn new(backend: Arc<dyn Backend>, lease: Box<dyn HeldLease>) -> Arc<LeaseState> {
        Arc::new(LeaseState { backend, held: Mutex::new(Held { lease: Some(lease), views: 0 }) })
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // The lock guards two plain fields that no code leaves half-updated: a panic elsewhere cannot poison
        // their meaning.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one more tensor alive, if the lease is still held.
    pub fn export(self: &Arc<Self>) -> Option<ViewGuard> {
        let mut held = self.held();
        held.lease.as_ref()?;
        held.views += 1;
        Some(ViewGuard { state: Arc::clone(self) })
    }

    /// Tensors made from the lease and still alive.
    pub fn views(&self) -> usize {
        self.held().views
    }

    /// Whether the lease is still held.
    pub fn is_held(&self) -> bool {
        self.held().lease.is_some()
    }

    /// Releases the lease unless tensors made from it are alive, first waiting for the work queued on its
    /// device when `wait` (the caller otherwise knows that work is done). Blocks (call it without the GIL).
    pub fn release(&self, wait: bool) -> Result<(), ReleaseError> {
        let lease = {
            let mut held = self.held();
            if held.views > 0 {
                return Err(ReleaseError::InUse(held.views));
            }
            held.lease.take().ok_or(ReleaseError::Released)?
        };
        // No tensor can be made from it any more (it is taken); kernels queued on its pages finish first.
        if let Err(e) = if wait { self.backend.synchronize(lease.device()) } else { Ok(()) } {
            self.held().lease = Some(lease);
            return Err(ReleaseError::Fabric(e));
        }
        lease.release().map_err(ReleaseError::Fabric)
    }
}

impl Drop for LeaseState {
    /// The `Lease` object and every tensor made from it are gone: release the lease if it is still held.
    fn drop(&mut self) {
        let Some(lease) = self.held().lease.take() else { return };
        let device = lease.device();
        if let Err(e) = self.backend.synchronize(device) {
            tracing::warn!(%device, error = %e, "waiting for the GPU before releasing a dropped lease failed");
        }
        if let Err(e) = lease.release() {
            tracing::warn!(%device, error = %e, "releasing a dropped lease failed");
        }
    }
}

/// One exported tensor alive: dropped by the tensor's DLPack deleter.
pub struct ViewGuard {
    state: Arc<LeaseState>,
}

impl Drop for ViewGuard {
    fn drop(&mut self) {
        self.state.held().views -= 1;
        // Dropping `state` next may be the last reference, which releases the lease.
    }
}
