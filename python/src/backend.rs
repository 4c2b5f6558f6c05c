//! What the Python classes need from a fabric, whichever kind it is: the embedded fabric of this process
//! (`embedded`) or a node's agent this process is attached to. One object-safe trait, so the Python classes
//! hold an `Arc<dyn Backend>` and do not care which one runs.
//!
//! Every method blocks and is called with the GIL released: implementations must not touch Python.

use std::ops::Range;

use vfabric::{Compression, DeviceKind, FabricError, LeasePtr, Location, Mode, Priority, Region, TenantId};

/// How a region is allocated.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllocArgs {
    /// The device its pages go to (`None`: the fabric picks the GPU with the most free memory).
    pub device: Option<Location>,
    /// Eviction priority.
    pub priority: Priority,
    /// The tenant whose quotas it counts against.
    pub tenant: TenantId,
    /// For an attached client: keep the region when the client's connection ends (otherwise it is freed then).
    /// The embedded fabric lives and dies with this process, so it ignores this.
    pub keep: bool,
    /// How its pages are stored on the storage tier.
    pub compression: Compression,
    /// A reservation of this backend ([`HeldReservation::id`]) its pages draw on.
    pub reservation: Option<u64>,
    /// How it is kept across nodes (an attached client's; an embedded fabric is one node).
    pub replication: vfabric::agent::Replication,
}

/// A fabric: the calls the Python API makes.
pub trait Backend: Send + Sync {
    /// The page size of the node's regions.
    fn page_size(&self) -> u64;
    /// The node's devices: the GPUs, then the host.
    fn devices(&self) -> Vec<Location>;
    /// CUDA, or the emulated device.
    fn device_kind(&self) -> DeviceKind;
    /// The device a lease goes to when the caller names none: a rank's local GPU, else the first GPU, else the
    /// host.
    fn default_device(&self) -> Location {
        let devices = self.devices();
        devices.iter().copied().find(|d| matches!(d, Location::Gpu(_))).unwrap_or(Location::Host)
    }
    /// A new region of `size` bytes.
    fn alloc(&self, size: u64, args: &AllocArgs) -> Result<Region, FabricError>;
    /// Frees a region.
    fn free(&self, region: &Region) -> Result<(), FabricError>;
    /// Copies `data` into the region at `offset`.
    fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError>;
    /// Copies the region's bytes at `offset` into `buf`.
    fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError>;
    /// Leases the pages covering `range` on `device`.
    fn acquire(
        &self,
        region: &Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<Box<dyn HeldLease>, FabricError>;
    /// Brings the pages covering `range` to `device` ahead of their use.
    fn prefetch(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError>;
    /// Starts copying the pages of `range` that only `device` holds to host memory, so that evicting them later
    /// costs no copy.
    fn write_back(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError>;
    /// Sets `bytes` of `device` aside for `tenant` now.
    fn reserve(&self, device: Location, bytes: u64, tenant: TenantId) -> Result<Box<dyn HeldReservation>, FabricError>;
    /// Moves a region to `device`.
    fn migrate(&self, region: &Region, device: Location) -> Result<(), FabricError>;
    /// The fabric's figures, as JSON.
    fn stats_json(&self) -> Result<String, FabricError>;
    /// The attachment to the node's agent, for a client (the PyTorch allocator takes its regions there).
    fn attached(&self) -> Option<vfabric::AttachedClient> {
        None
    }
    /// Waits until the work queued on `device` by this process (kernels reading or writing leased pages) is done.
    fn synchronize(&self, device: Location) -> Result<(), FabricError>;
}

/// A lease as a backend grants it: its pages stay where [`HeldLease::ptr`] says until it is released.
pub trait HeldLease: Send + Sync {
    /// The device its pages are on.
    fn device(&self) -> Location;
    /// Read or write.
    fn mode(&self) -> Mode;
    /// The region offset of its first byte (page-aligned).
    fn offset(&self) -> u64;
    /// Bytes covered (whole pages).
    fn len(&self) -> u64;
    /// Where its pages are, as addresses valid in this process.
    fn ptr(&self) -> &LeasePtr;
    /// Releases it (a write lease's changes become the region's bytes).
    fn release(self: Box<Self>) -> Result<(), FabricError>;
}

/// A reservation as a backend grants it: memory of one device held until released (or dropped).
pub trait HeldReservation: Send + Sync {
    /// What an allocation names to draw on it ([`AllocArgs::reservation`]).
    fn id(&self) -> u64;
    /// The device whose memory it holds.
    fn device(&self) -> Location;
    /// Bytes it still holds.
    fn bytes(&self) -> Result<u64, FabricError>;
    /// Gives back what it still holds.
    fn release(self: Box<Self>) -> Result<(), FabricError>;
}
