//! `Reservation`: capacity set aside on a device before a task starts (see the directory's `reserve`), given
//! back when dropped; and tenants' quotas.

use std::sync::Arc;

use vfabric_allocator::{Location, TenantId, Tier};

use super::node::{lock, Inner};
use super::Fabric;
use crate::directory::ReservationInfo;
use crate::error::FabricError;

/// Capacity of one device held for a tenant until dropped. Regions whose `Placement::reservation` is
/// [`Reservation::id`] take its frames as their pages arrive on that device, and so do the tenant's pages that
/// evictions move there; what is left returns when it is dropped.
pub struct Reservation {
    inner: Arc<Inner>,
    id: u64,
    location: Location,
}

impl Reservation {
    /// What a region's placement names to draw on it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The device it holds memory of.
    pub fn location(&self) -> Location {
        self.location
    }

    /// Bytes it still holds (what regions naming it have not taken yet).
    pub fn bytes(&self) -> Result<u64, FabricError> {
        Ok(lock(&self.inner.state).dir.reserved(self.id)?)
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation").field("id", &self.id).field("location", &self.location).finish()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.inner.state).unreserve_or_defer(self.id);
    }
}

impl Fabric {
    /// Sets aside `bytes` (whole pages) of `location` for `tenant` now, evicting other pages to make room as an
    /// acquire would, so that a task started after it cannot fail midway for want of that memory. Refused at
    /// once, before anything moves, with the bytes that can be had (those free and those evicting every page that
    /// may leave would free), when that is less (`Directory(ReservationRefused)`), and with `QuotaExceeded` past
    /// the tenant's quota. The tenant's pages evicted to that device (host memory, the storage tier) take the
    /// reservation's frames as they arrive; no other tenant's take them.
    pub fn reserve(&self, location: Location, bytes: u64, tenant: TenantId) -> Result<Reservation, FabricError> {
        let mut st = self.state()?;
        let id = self.drive(&mut st, |d| d.step_reserve(location, bytes, tenant))?;
        Ok(Reservation { inner: Arc::clone(&self.inner), id, location })
    }

    /// Every reservation held on this node: id, device, tenant and the bytes it still holds.
    pub fn reservations(&self) -> Vec<ReservationInfo> {
        lock(&self.inner.state).dir.reservations()
    }

    /// The leases held on this node now, by the tenant of their regions: how many, and their bytes.
    pub fn leases_by_tenant(&self) -> Vec<(TenantId, usize, u64)> {
        lock(&self.inner.state).dir.leases_by_tenant()
    }
}

impl Fabric {
    /// What a tenant uses on a tier of this node, and its quota there (bytes; `None` for no limit).
    pub fn quota(&self, tenant: TenantId, tier: Tier) -> (u64, Option<u64>) {
        let state = lock(&self.inner.state);
        (state.dir.quotas().used(tenant, tier), state.dir.quotas().limit(tenant, tier))
    }

    /// Sets a tenant's quota on a tier (bytes; `None` for no limit).
    pub fn set_quota(&self, tenant: TenantId, tier: Tier, limit: Option<u64>) {
        lock(&self.inner.state).dir.quotas_mut().set_limit(tenant, tier, limit);
    }
}
