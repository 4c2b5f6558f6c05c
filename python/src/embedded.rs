//! The embedded fabric: the fabric of one node running inside this process (`vfabric.Fabric`).

use std::ops::Range;

use vfabric::{
    ClusterConfig, DeviceKind, Fabric, FabricError, Lease, LeasePtr, Location, Mode, Placement, Region, Reservation,
    TenantId,
};

use crate::backend::{AllocArgs, Backend, HeldLease, HeldReservation};

/// [`Backend`] over [`vfabric::Fabric`].
pub struct Embedded {
    fabric: Fabric,
}

impl Embedded {
    /// Starts the fabric `config` describes (the node of index 0).
    pub fn start(config: &ClusterConfig) -> Result<Embedded, FabricError> {
        Ok(Embedded { fabric: Fabric::embedded(config)? })
    }

    /// One line about the device layer.
    pub fn describe(&self) -> String {
        self.fabric.describe()
    }
}

impl Backend for Embedded {
    fn page_size(&self) -> u64 {
        self.fabric.page_size()
    }

    fn devices(&self) -> Vec<Location> {
        self.fabric.devices()
    }

    fn device_kind(&self) -> DeviceKind {
        self.fabric.device_kind()
    }

    fn alloc(&self, size: u64, args: &AllocArgs) -> Result<Region, FabricError> {
        if args.replication.replicas > 1 {
            return Err(FabricError::Unavailable(
                "an embedded fabric is one node: a region kept on several nodes needs their agents (vfabric.connect())"
                    .into(),
            ));
        }
        // `keep` is for attached clients: an embedded fabric's regions live as long as the process.
        let placement = Placement {
            device: args.device,
            priority: args.priority,
            tenant: args.tenant,
            reservation: args.reservation,
            compression: args.compression,
        };
        self.fabric.alloc(size, placement)
    }

    fn reserve(&self, device: Location, bytes: u64, tenant: TenantId) -> Result<Box<dyn HeldReservation>, FabricError> {
        Ok(Box::new(self.fabric.reserve(device, bytes, tenant)?))
    }

    fn free(&self, region: &Region) -> Result<(), FabricError> {
        self.fabric.free(region)
    }

    fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        self.fabric.write(region, offset, data)
    }

    fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.fabric.read(region, offset, buf)
    }

    fn acquire(
        &self,
        region: &Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<Box<dyn HeldLease>, FabricError> {
        let lease = self.fabric.acquire(region, range, device, mode)?;
        Ok(Box::new(EmbeddedLease { fabric: self.fabric.clone(), lease }))
    }

    /// The embedded fabric prefetches on its own when acquires walk a region in order; asked for a range, it
    /// brings the pages there as a read lease would, and lets them go (they stay on the device until evicted).
    fn prefetch(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError> {
        self.fabric.prefetch(region, range, device)
    }

    fn write_back(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError> {
        self.fabric.write_back(region, range, device)
    }

    fn migrate(&self, region: &Region, device: Location) -> Result<(), FabricError> {
        self.fabric.migrate(region, device)
    }

    fn stats_json(&self) -> Result<String, FabricError> {
        serde_json::to_string(&self.fabric.stats()).map_err(|_| FabricError::Internal("the stats do not serialise"))
    }

    fn synchronize(&self, device: Location) -> Result<(), FabricError> {
        self.fabric.synchronize(device)
    }
}

/// A lease of the embedded fabric, with the fabric that releases it.
struct EmbeddedLease {
    fabric: Fabric,
    lease: Lease,
}

impl HeldLease for EmbeddedLease {
    fn device(&self) -> Location {
        self.lease.device()
    }

    fn mode(&self) -> Mode {
        self.lease.mode()
    }

    fn offset(&self) -> u64 {
        self.lease.offset()
    }

    fn len(&self) -> u64 {
        self.lease.len()
    }

    fn ptr(&self) -> &LeasePtr {
        self.lease.ptr()
    }

    fn release(self: Box<Self>) -> Result<(), FabricError> {
        self.fabric.release(self.lease)
    }
}

impl HeldReservation for Reservation {
    fn id(&self) -> u64 {
        Reservation::id(self)
    }

    fn device(&self) -> Location {
        self.location()
    }

    fn bytes(&self) -> Result<u64, FabricError> {
        Reservation::bytes(self)
    }

    fn release(self: Box<Self>) -> Result<(), FabricError> {
        // Dropping it gives it back.
        Ok(())
    }
}
