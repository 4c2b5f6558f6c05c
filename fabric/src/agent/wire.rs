//! Conversions between the fabric's types and their forms on the wire ([`crate::proto`]).

use vfabric_allocator::GlobalAddr;
use vfabric_transport::Location;

use crate::directory::{Mode, RegionHandle};
use crate::error::FabricError;
use crate::proto::{ErrorKind, WireLocation, WireMode, WireRegion};

impl From<&RegionHandle> for WireRegion {
    fn from(r: &RegionHandle) -> Self {
        WireRegion { addr: r.addr.raw(), len: r.len, page_size: r.page_size, slot: r.slot, generation: r.generation }
    }
}

impl From<&WireRegion> for RegionHandle {
    fn from(w: &WireRegion) -> Self {
        // Only a name: the home checks slot, generation and bounds before it uses one.
        RegionHandle {
            slot: w.slot,
            generation: w.generation,
            addr: GlobalAddr::from_raw(w.addr),
            len: w.len,
            page_size: w.page_size,
        }
    }
}

impl From<Location> for WireLocation {
    fn from(l: Location) -> Self {
        match l {
            Location::Gpu(g) => WireLocation::Gpu(g),
            Location::Host => WireLocation::Host,
        }
    }
}

impl From<WireLocation> for Location {
    fn from(l: WireLocation) -> Self {
        match l {
            WireLocation::Gpu(g) => Location::Gpu(g),
            WireLocation::Host => Location::Host,
        }
    }
}

impl From<Mode> for WireMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Read => WireMode::Read,
            Mode::Write => WireMode::Write,
        }
    }
}

impl From<WireMode> for Mode {
    fn from(m: WireMode) -> Self {
        match m {
            WireMode::Read => Mode::Read,
            WireMode::Write => Mode::Write,
        }
    }
}

/// The kind a failed call reports to the peer that asked for it.
pub(crate) fn error_kind(e: &FabricError) -> ErrorKind {
    match e {
        FabricError::OutOfMemory { .. } => ErrorKind::OutOfMemory,
        FabricError::QuotaExceeded { .. } => ErrorKind::QuotaExceeded,
        FabricError::InvalidAddress(_) | FabricError::InvalidSize(_) => ErrorKind::InvalidAddress,
        FabricError::OutOfBounds { .. } => ErrorKind::OutOfBounds,
        FabricError::DoubleFree(_) => ErrorKind::DoubleFree,
        FabricError::UseAfterFree(_) => ErrorKind::UseAfterFree,
        FabricError::LeasedElsewhere { .. } => ErrorKind::LeasedElsewhere,
        FabricError::DeviceUnavailable(_) => ErrorKind::DeviceUnavailable,
        FabricError::UnknownLease(_) => ErrorKind::UnknownLease,
        FabricError::PeerDead { .. } => ErrorKind::PeerDead,
        FabricError::Protocol(_) => ErrorKind::Protocol,
        FabricError::Checksum(_) => ErrorKind::Checksum,
        // Forwarded from a region's home: its kind stands.
        FabricError::Remote { kind, .. } => *kind,
        _ => ErrorKind::Internal,
    }
}

/// A page chunk that failed on arrival, as the fabric's error: a bad checksum stays a checksum error (with
/// `context`, e.g. the sender, in front), anything else is the network's.
pub(crate) fn chunk_error(e: vfabric_transport::quic::QuicError, context: &str) -> FabricError {
    match e {
        vfabric_transport::quic::QuicError::Checksum { .. } => FabricError::Checksum(format!("{context}{e}")),
        other => FabricError::Network(other.to_string()),
    }
}
