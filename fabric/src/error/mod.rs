//! The errors of the fabric's API. Every failing call leaves every other region as it was.
//!
//! [`FabricError`] is what the API returns; failures of the network between nodes have their own type,
//! [`NetworkError`], and those of a job's launch theirs, [`LaunchError`].

mod launch;
mod network;
mod protocol;

pub use launch::LaunchError;
pub use network::NetworkError;
pub use protocol::ProtocolError;

use vfabric_allocator::{TenantId, Tier};
use vfabric_transport::{DeviceError, Location, MoveError};

use crate::directory::DirectoryError;
use crate::directory::RegionHandle;
use crate::proto::chunk::ChunkError;
use crate::proto::codec::CodecError;
use crate::proto::message::ErrorKind;

/// Why a fabric call failed.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// A device has no room: not enough frames even after evicting every page that may be evicted.
    #[error("{location} is out of memory: {needed} frames needed, {available} can be made free")]
    OutOfMemory {
        /// The device.
        location: Location,
        /// Frames the call needed there.
        needed: u64,
        /// Frames that are free or could be freed by eviction.
        available: u64,
    },
    /// A tenant's quota on a tier would be exceeded.
    #[error("tenant {tenant} would exceed its {tier:?} quota: {used} of {limit} bytes used, {requested} more asked")]
    QuotaExceeded {
        /// The tenant.
        tenant: TenantId,
        /// The tier.
        tier: Tier,
        /// Its limit in bytes.
        limit: u64,
        /// Bytes in use.
        used: u64,
        /// Bytes asked for.
        requested: u64,
    },
    /// A region of zero bytes, or of more pages than a region may have.
    #[error("invalid size: {0}")]
    InvalidSize(DirectoryError),
    /// The node's directory cannot do what was asked with the memory it has (its configuration, its address
    /// space, a compaction that cannot work).
    #[error("directory: {0}")]
    Directory(DirectoryError),
    /// An address that names no region of this fabric.
    #[error("no region at {0}")]
    InvalidAddress(String),
    /// A range beyond the end of its region.
    #[error("{offset:#x}+{len:#x} is outside the region of {region_len:#x} bytes")]
    OutOfBounds {
        /// Start of the range.
        offset: u64,
        /// Its length.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// A region freed twice.
    #[error("region {0} was already freed")]
    DoubleFree(String),
    /// A region used after it was freed.
    #[error("region {0} was freed and cannot be used")]
    UseAfterFree(String),
    /// A caller asked for what its tenant may not do or see: another tenant's region (or a handle naming none:
    /// the two are not told apart), another tenant's name on an allocation, or an operator's call.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// What the call needs cannot be reached now: a replicated region's standby copy (its home then serves it
    /// no longer, so that a standby that takes over never leaves two homes), a standby whose home still
    /// answers, or nodes enough for the replicas asked.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A stage's copies (the mover's transfers, the storage tier's I/O) have not finished within
    /// `device.copy_deadline_ms`: the device or the drive stopped answering. The copies stay in flight, their
    /// frames untouched; until they finish, the calls that plan stages (acquires, writes, frees, hints,
    /// migrations, compaction, reservations) fail so at once, while reads, releases and figures go on. Once
    /// they finish the fabric takes them in and goes on.
    #[error(
        "stalled: {what} has not finished after {waited_s:.1} s (device.copy_deadline_ms = {deadline_ms}); calls \
         that move pages fail until it does"
    )]
    Stalled {
        /// The stage: its kind and its batches' pages and devices.
        what: String,
        /// Seconds since its copies started.
        waited_s: f64,
        /// The deadline it passed.
        deadline_ms: u64,
    },
    /// A page is leased in a way that excludes this call (written elsewhere, or read while a write is asked).
    #[error("page {page} of region {region} is leased {how}")]
    LeasedElsewhere {
        /// The region.
        region: String,
        /// The page index in the region.
        page: u64,
        /// "for writing on gpu1", "for reading by 2 leases", ...
        how: String,
    },
    /// A device this node does not have (or that failed).
    #[error("{0} is not available on this node")]
    DeviceUnavailable(Location),
    /// A write through a lease that only allows reading.
    #[error("lease {0} is a read lease: its pages cannot be written through it")]
    ReadOnlyLease(u64),
    /// A lease that is not (or no longer) held.
    #[error("lease {0} is not held")]
    UnknownLease(u64),
    /// The device layer failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A page move failed.
    #[error(transparent)]
    Move(#[from] MoveError),
    /// The configuration is not usable.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A peer has not answered within the cluster's `network.dead_after_ms`, or its connection is gone.
    #[error("node {node} ({name}) is not answering: {why}")]
    PeerDead {
        /// Its node id.
        node: u16,
        /// Its name.
        name: String,
        /// What was seen.
        why: String,
    },
    /// The network failed (binding, connecting, a stream reset, TLS, the local socket).
    #[error("network: {0}")]
    Network(#[from] NetworkError),
    /// A job's launch (its launcher's variables, the rendezvous of its ranks) failed.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The agent was started outside a Tokio runtime.
    #[error("the agent runs inside a tokio runtime (see `Agent::runtime`)")]
    NoRuntime,
    /// A fault of the fabric itself (a bug): what went wrong, for the report.
    #[error("internal error (a bug): {0}")]
    Internal(&'static str),
    /// A peer broke the protocol (a malformed or unexpected message); its connection is closed.
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    /// The storage tier failed: its file (one another live fabric uses is [`StorageError::InUse`]), its I/O, or
    /// a slot that came back wrong which no page of a region holds.
    ///
    /// [`StorageError::InUse`]: vfabric_transport::storage::StorageError::InUse
    #[error("storage tier: {0}")]
    Storage(#[from] vfabric_transport::storage::StorageError),
    /// A page of a region came back from the storage tier corrupt, short, or not at all: the page is not read
    /// as data (the call fails), and every other page and region is as it was.
    #[error("page {page} of region {region}: storage tier: {source}")]
    StoredPage {
        /// The region (its address, as the handle shows it).
        region: String,
        /// The page's index in the region.
        page: u64,
        /// The storage tier's slot that held it.
        slot: u64,
        /// What the tier found.
        source: vfabric_transport::storage::StorageError,
    },
    /// Page bytes arrived with a checksum that does not match: nothing was written.
    #[error("checksum: {0}")]
    Checksum(String),
    /// The region's home node refused the call.
    #[error("node {node} refused: {kind:?}: {message}")]
    Remote {
        /// The home node.
        node: u16,
        /// What kind of failure it reported.
        kind: ErrorKind,
        /// Its message.
        message: String,
    },
    /// The region's home moved its pages (a migration to another node): they are in region `to` now. The agent
    /// follows this itself; a caller sees it only when a region keeps moving faster than calls can follow.
    #[error("the region's pages moved to {to} (node {})", to.addr.node().0)]
    Moved {
        /// Where the pages are now.
        to: RegionHandle,
    },
}

impl FabricError {
    /// Whether the error says page bytes came back different from how they were written (on the storage tier,
    /// or a checksum that does not match), rather than that they could not be moved.
    pub fn is_corrupt(&self) -> bool {
        match self {
            FabricError::Checksum(_) => true,
            FabricError::Storage(e) | FabricError::StoredPage { source: e, .. } => e.is_corrupt(),
            _ => false,
        }
    }
}

impl From<DirectoryError> for FabricError {
    /// The directory's errors as the fabric's API reports them: the same variants where the API has one; sizes
    /// a region cannot have as `InvalidSize`, and the directory's configuration and address-space errors as
    /// `Directory`.
    fn from(e: DirectoryError) -> FabricError {
        match e {
            DirectoryError::OutOfMemory { location, needed, available } => {
                FabricError::OutOfMemory { location, needed, available }
            }

            DirectoryError::QuotaExceeded { tenant, tier, limit, used, requested } => {
                FabricError::QuotaExceeded { tenant, tier, limit, used, requested }
            }
            DirectoryError::UnknownRegion(h) => FabricError::InvalidAddress(h.to_string()),
            DirectoryError::UseAfterFree(h) => FabricError::UseAfterFree(h.to_string()),
            e @ DirectoryError::StaleHandle(_) => FabricError::UseAfterFree(e.to_string()),
            DirectoryError::DoubleFree(h) => FabricError::DoubleFree(h.to_string()),
            DirectoryError::FreeRange(source) => FabricError::InvalidAddress(source.to_string()),
            DirectoryError::OutOfBounds { offset, len, region_len } => {
                FabricError::OutOfBounds { offset, len, region_len }
            }
            DirectoryError::LeasedElsewhere { region, page, held } => {
                FabricError::LeasedElsewhere { region: region.to_string(), page, how: held.to_string() }
            }
            DirectoryError::UnknownLease(id) => FabricError::UnknownLease(id),
            DirectoryError::DeviceUnavailable(location) => FabricError::DeviceUnavailable(location),
            e @ (DirectoryError::ZeroSize | DirectoryError::TooManyPages { .. }) => FabricError::InvalidSize(e),
            e @ (DirectoryError::InvalidWatermarks { .. }
            | DirectoryError::InvalidArena { .. }
            | DirectoryError::TooManyDevices(_)
            | DirectoryError::NoHostArena
            | DirectoryError::StorageTier(_)
            | DirectoryError::PackedTier(_)
            | DirectoryError::CompressedTier(_)
            | DirectoryError::PackedInHost(_)
            | DirectoryError::UnknownReservation(_)
            | DirectoryError::ReservationRefused { .. }
            | DirectoryError::InvalidAddressSpace(_)
            | DirectoryError::AddressSpaceExhausted(_)
            | DirectoryError::CompactionImpossible { .. }
            | DirectoryError::Allocator { .. }) => FabricError::Directory(e),
        }
    }
}

impl From<ChunkError> for FabricError {
    /// A bad checksum stays a checksum error, a chunk that does not fit its payload is the peer's protocol
    /// violation, and a stream that failed underneath is the network's.
    fn from(e: ChunkError) -> FabricError {
        match e {
            ChunkError::Checksum { .. } => FabricError::Checksum(e.to_string()),
            ChunkError::Outside { .. }
            | ChunkError::TooLarge { .. }
            | ChunkError::OutOfOrder { .. }
            | ChunkError::Undecodable { .. }
            | ChunkError::Packed(_)
            | ChunkError::Short { .. } => FabricError::Protocol(ProtocolError::Chunk(e)),
            ChunkError::Io(_) | ChunkError::Stopped | ChunkError::Truncated { .. } => {
                FabricError::Network(NetworkError::Stream(e))
            }
        }
    }
}

impl From<CodecError> for FabricError {
    /// A frame that could not be read because the stream failed is the network's; any other codec error is a
    /// peer that broke the protocol.
    fn from(e: CodecError) -> FabricError {
        match e {
            CodecError::Io(io) => FabricError::Network(NetworkError::Io(io)),
            other => FabricError::Protocol(ProtocolError::Codec(other)),
        }
    }
}

impl From<quinn::ConnectionError> for FabricError {
    fn from(e: quinn::ConnectionError) -> FabricError {
        FabricError::Network(NetworkError::Connection(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::{Directory, DirectoryConfig, LeaseHeld, Placement};

    #[test]
    fn directory_errors_keep_the_fabric_variants_and_messages() {
        let mut dir =
            Directory::new(DirectoryConfig::default(), &[(Location::Gpu(0), 8 << 21), (Location::Host, 8 << 21)])
                .expect("directory");
        let e = FabricError::from(dir.alloc(0, Placement::default()).unwrap_err());
        assert!(matches!(&e, FabricError::InvalidSize(DirectoryError::ZeroSize)), "{e:?}");
        assert_eq!(e.to_string(), "invalid size: a region of 0 bytes");
        let h = dir.alloc(1 << 21, Placement::default()).expect("alloc");
        let e = FabricError::from(DirectoryError::LeasedElsewhere { region: h, page: 3, held: LeaseHeld::Reading(2) });
        assert_eq!(e.to_string(), format!("page 3 of region {h} is leased for reading (2 lease(s))"));
        let e = FabricError::from(DirectoryError::LeasedElsewhere {
            region: h,
            page: 0,
            held: LeaseHeld::Writing(Some(Location::Gpu(1))),
        });
        assert!(matches!(&e, FabricError::LeasedElsewhere { how, .. } if how == "for writing on gpu1"), "{e:?}");
        let e = FabricError::from(dir.version(&h, 1 << 21, 1).unwrap_err());
        assert!(matches!(e, FabricError::OutOfBounds { offset: 0x200000, len: 1, region_len: 0x200000 }), "{e:?}");
        assert!(matches!(dir.free(&h), Ok(crate::directory::Step::Done(()))));
        assert!(matches!(FabricError::from(dir.free(&h).unwrap_err()), FabricError::DoubleFree(_)));
        assert!(matches!(FabricError::from(dir.version(&h, 0, 1).unwrap_err()), FabricError::UseAfterFree(_)));
        assert!(matches!(FabricError::from(dir.release(7).unwrap_err()), FabricError::UnknownLease(7)));
        let e = FabricError::from(dir.dev(Location::Gpu(5)).unwrap_err());
        assert!(matches!(e, FabricError::DeviceUnavailable(Location::Gpu(5))), "{e:?}");
        let bad = DirectoryConfig { low_watermark_percent: 95, ..DirectoryConfig::default() };
        let e = FabricError::from(Directory::new(bad, &[(Location::Host, 8 << 21)]).err().expect("refused"));
        assert!(matches!(&e, FabricError::Directory(d) if d.to_string().contains("watermarks")), "{e:?}");
    }
}
