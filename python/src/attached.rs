//! A node's agent this process is attached to (`vfabric.connect`): the node's memory is mapped into this
//! process, so leases give pointers valid here, while the agent owns the regions and decides where pages live.

use std::ops::Range;
use std::path::PathBuf;

use vfabric::{
    AllocOptions, AttachedClient, DeviceKind, FabricError, HostAgentLaunch, JobRank, JoinOptions, LeasePtr, LocalLease,
    Location, Mode, Region, TenantId,
};

use crate::backend::{AllocArgs, Backend, HeldLease, HeldReservation};

/// [`Backend`] over [`vfabric::AttachedClient`].
pub struct Attached {
    client: AttachedClient,
}

impl Attached {
    /// Attaches as a rank of the job the launcher's variables describe, if any, to the agent at `socket` (or
    /// `VFABRIC_SOCKET`, or the job's socket), starting it as `launch` says when this is local rank 0 of a job
    /// on one host and none runs (`AttachedClient::join`).
    pub fn join(socket: Option<PathBuf>, launch: HostAgentLaunch) -> Result<Attached, FabricError> {
        let options = JoinOptions { socket, launch, ..JoinOptions::default() };
        Ok(Attached { client: AttachedClient::join(JobRank::from_env().ok(), &options)? })
    }

    /// Whether this process runs its host's agent (it started it as local rank 0 of a job).
    pub fn hosts_agent(&self) -> bool {
        self.client.hosts_agent()
    }

    /// The agent's node.
    pub fn node(&self) -> u16 {
        self.client.node()
    }
}

impl Backend for Attached {
    fn page_size(&self) -> u64 {
        self.client.page_size()
    }

    fn devices(&self) -> Vec<Location> {
        self.client.devices()
    }

    fn device_kind(&self) -> DeviceKind {
        self.client.device_kind()
    }

    fn attached(&self) -> Option<AttachedClient> {
        Some(self.client.clone())
    }

    fn default_device(&self) -> Location {
        let first = self.devices().into_iter().find(|d| matches!(d, Location::Gpu(_))).unwrap_or(Location::Host);
        self.client.default_device().unwrap_or(first)
    }

    fn alloc(&self, size: u64, args: &AllocArgs) -> Result<Region, FabricError> {
        let options = AllocOptions {
            device: args.device,
            priority: args.priority,
            tenant: args.tenant,
            keep: args.keep,
            compression: args.compression,
            reservation: args.reservation,
            replication: args.replication,
        };
        self.client.alloc(size, &options)
    }

    fn reserve(&self, device: Location, bytes: u64, tenant: TenantId) -> Result<Box<dyn HeldReservation>, FabricError> {
        let (id, _) = self.client.reserve(device, bytes, tenant)?;
        Ok(Box::new(ClientReservation { client: self.client.clone(), id, device, released: false }))
    }

    fn free(&self, region: &Region) -> Result<(), FabricError> {
        self.client.free(region)
    }

    fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        self.client.write(region, offset, data)
    }

    fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.client.read(region, offset, buf)
    }

    fn acquire(
        &self,
        region: &Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<Box<dyn HeldLease>, FabricError> {
        let lease = self.client.acquire(region, range, device, mode)?;
        Ok(Box::new(AttachedLease { client: self.client.clone(), lease }))
    }

    fn prefetch(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError> {
        self.client.prefetch(region, range, device)
    }

    fn write_back(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError> {
        self.client.write_back(region, range, device)
    }

    fn migrate(&self, region: &Region, device: Location) -> Result<(), FabricError> {
        self.client.migrate(region, device)
    }

    fn stats_json(&self) -> Result<String, FabricError> {
        self.client.stats_json()
    }

    fn synchronize(&self, device: Location) -> Result<(), FabricError> {
        self.client.synchronize(device)
    }
}

/// A lease the agent granted, with the client that releases it.
struct AttachedLease {
    client: AttachedClient,
    lease: LocalLease,
}

impl HeldLease for AttachedLease {
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
        self.client.release(self.lease)
    }
}

/// One of this client's reservations at the agent; given back when released or dropped (and by the agent when
/// the connection ends).
struct ClientReservation {
    client: AttachedClient,
    id: u64,
    device: Location,
    released: bool,
}

impl HeldReservation for ClientReservation {
    fn id(&self) -> u64 {
        self.id
    }

    fn device(&self) -> Location {
        self.device
    }

    fn bytes(&self) -> Result<u64, FabricError> {
        self.client.reserved(self.id)
    }

    fn release(mut self: Box<Self>) -> Result<(), FabricError> {
        self.released = true;
        self.client.unreserve(self.id)
    }
}

impl Drop for ClientReservation {
    fn drop(&mut self) {
        if !self.released {
            if let Err(e) = self.client.unreserve(self.id) {
                tracing::debug!(id = self.id, error = %e, "giving back a reservation at the agent failed");
            }
        }
    }
}
