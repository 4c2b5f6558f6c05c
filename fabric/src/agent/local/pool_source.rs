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

    fn take(&self, bytes: u64, device: Location) -> Result<(Region, LocalLease, u64), FabricError> {
        let region = self.alloc(bytes, &AllocOptions { device: Some(device), ..AllocOptions::default() })?;
        let lease = match self.acquire(&region, 0..bytes, device, Mode::Write) {
            Ok(l) => l,
            Err(e) => {
                let _ = self.free(&region);
                return Err(e);
            }
        };
        match lease.ptr() {
            LeasePtr::Contiguous { ptr, .. } => {
                let ptr = *ptr;
                Ok((region, lease, ptr))
            }
            LeasePtr::Pages(_) => {
                let _ = self.release(lease);
                let _ = self.free(&region);
                Err(FabricError::OutOfMemory { location: device, needed: bytes, available: 0 })
            }
        }
    }

    fn give_back(&self, region: Region, lease: LocalLease) -> Result<(), FabricError> {
        self.release(lease)?;
        self.free(&region)
    }
}
