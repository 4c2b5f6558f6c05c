//! What a region's placement says, asked by the agent: its tenant, how its pages are stored, and where this
//! node leases them to serve them to another node.

use vfabric_allocator::{Compression, Location, TenantId};

use super::{lock, Fabric, Region};
use crate::directory::Placement;
use crate::error::FabricError;

impl Fabric {
    /// Every live region of this node, with the tenant it is charged to.
    pub fn regions(&self) -> Vec<(Region, TenantId)> {
        lock(&self.inner.state).dir.regions().map(|r| (r.handle, r.placement.tenant)).collect()
    }

    /// A live region's placement: what it named, with the device new pages go to now (a migration on this node
    /// moves it).
    pub fn placement_of(&self, region: &Region) -> Result<Placement, FabricError> {
        let st = lock(&self.inner.state);
        let mut p = st.dir.region(region)?.placement;
        p.device = Some(st.dir.home_of(region)?);
        Ok(p)
    }

    /// The tenant a region is charged to (what its placement named).
    pub fn tenant_of(&self, region: &Region) -> Result<TenantId, FabricError> {
        Ok(lock(&self.inner.state).dir.region(region)?.placement.tenant)
    }

    /// Where this node leases a region's pages to serve them to another node (whose lease then reads or writes
    /// them here): host memory; for a lossy region, whose pages host memory holds packed, its home GPU (or this
    /// node's first), where they are expanded, so that they cross the wire as values. A lossy region on a node
    /// without GPUs is served from host memory, which refuses the lease (`PackedInHost`).
    pub fn serving_device(&self, region: &Region) -> Result<Location, FabricError> {
        let st = lock(&self.inner.state);
        if !st.dir.region(region)?.placement.compression.is_lossy() {
            return Ok(Location::Host);
        }
        let gpus = st.dir.locations().into_iter().filter(|l| matches!(l, Location::Gpu(_)));
        Ok(match st.dir.home_of(region)? {
            home @ Location::Gpu(_) => home,
            _ => gpus.into_iter().next().unwrap_or(Location::Host),
        })
    }

    /// How a region's pages are stored (what its placement named): a copy of it on another node, a standby or
    /// the destination of a migration, is stored the same way.
    pub fn compression_of(&self, region: &Region) -> Result<Compression, FabricError> {
        Ok(lock(&self.inner.state).dir.region(region)?.placement.compression)
    }
}
