//! An attached client as a [`PoolSource`]: a tensor pool of a local process whose regions are its node's
//! agent's, leased into the process's mapping (regions allocated without `keep`, so they go with the client).

use vfabric_allocator::Location;

use super::attached::{AllocOptions, AttachedClient};
use super::mapped_lease::LocalLease;
use crate::directory::{Mode, RegionHandle as Region};
use crate::error::FabricError;
use crate::fabric::LeasePtr;
use crate::pool::PoolSource;

impl PoolSource for AttachedClient {
    type Lease = LocalLease;

    fn page_size(&self) -> u64 {
        AttachedClient::page_size(self)
    }

    fn alloc_region(&self, bytes: u64, device: Location) -> Result<Region, FabricError> {
        self.alloc(bytes, &AllocOptions { device: Some(device), ..AllocOptions::default() })
    }

    fn lease_region(&self, region: &Region, device: Location) -> Result<LocalLease, FabricError> {
        self.acquire(region, 0..region.len, device, Mode::Write)
    }

    fn lease_ptr(lease: &LocalLease) -> &LeasePtr {
        lease.ptr()
    }

    fn release_lease(&self, lease: LocalLease) -> Result<(), FabricError> {
        self.release(lease)
    }

    fn free_region(&self, region: &Region) -> Result<(), FabricError> {
        self.free(region)
    }
}
