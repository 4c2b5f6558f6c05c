//! Conversions between the fabric's types and their forms on the wire, errors included: what a refusal says
//! ([`refusal`]) and what an answer means to the caller ([`reply_or_error`]).

use vfabric_allocator::{Compression, Element, GlobalAddr, Location};

use super::message::{ErrorKind, Message, WireLocation, WireMode, WireRegion};
use crate::directory::{DirectoryError, Mode, Priority, RegionHandle};
use crate::error::{FabricError, ProtocolError};

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

/// A compression by its number on the wire (`Compression::number`); an unknown one is a bad field.
pub(crate) fn compression(number: u8) -> Result<Compression, FabricError> {
    Compression::from_number(number)
        .ok_or_else(|| ProtocolError::BadField { field: "compression", value: u64::from(number) }.into())
}

/// A priority by its number on the wire (0 low, 1 normal, 2 high); another is a bad field.
pub(crate) fn priority(number: u8) -> Result<Priority, FabricError> {
    match number {
        0 => Ok(Priority::Low),
        1 => Ok(Priority::Normal),
        2 => Ok(Priority::High),
        p => Err(ProtocolError::BadField { field: "priority", value: u64::from(p) }.into()),
    }
}

/// A priority's number on the wire.
pub(crate) fn priority_number(p: Priority) -> u8 {
    match p {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
    }
}

impl From<Location> for WireLocation {
    fn from(l: Location) -> Self {
        match l {
            Location::Gpu(g) => WireLocation::Gpu(g),
            Location::Host => WireLocation::Host,
            Location::Storage => WireLocation::Storage,
            Location::Packed(Element::Bf16) => WireLocation::Packed,
            Location::Packed(Element::F32) => WireLocation::PackedF32,
            Location::Compressed => WireLocation::Compressed,
        }
    }
}

impl From<WireLocation> for Location {
    fn from(l: WireLocation) -> Self {
        match l {
            WireLocation::Gpu(g) => Location::Gpu(g),
            WireLocation::Host => Location::Host,
            WireLocation::Storage => Location::Storage,
            WireLocation::Packed => Location::Packed(Element::Bf16),
            WireLocation::PackedF32 => Location::Packed(Element::F32),
            WireLocation::Compressed => Location::Compressed,
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
        // A reservation that cannot be met: the memory is not there.
        FabricError::Directory(DirectoryError::ReservationRefused { .. }) => ErrorKind::OutOfMemory,
        // Kinds as peers have always been told them: sizes and the directory's refusals are invalid addresses.
        FabricError::InvalidAddress(_) | FabricError::InvalidSize(_) | FabricError::Directory(_) => {
            ErrorKind::InvalidAddress
        }
        FabricError::OutOfBounds { .. } => ErrorKind::OutOfBounds,
        FabricError::DoubleFree(_) => ErrorKind::DoubleFree,
        FabricError::UseAfterFree(_) => ErrorKind::UseAfterFree,
        FabricError::PermissionDenied(_) => ErrorKind::PermissionDenied,
        FabricError::Unavailable(_) => ErrorKind::Unavailable,
        FabricError::Stalled { .. } => ErrorKind::Stalled,
        FabricError::LeasedElsewhere { .. } => ErrorKind::LeasedElsewhere,
        FabricError::DeviceUnavailable(_) => ErrorKind::DeviceUnavailable,
        FabricError::UnknownLease(_) => ErrorKind::UnknownLease,
        FabricError::PeerDead { .. } => ErrorKind::PeerDead,
        FabricError::Protocol(_) => ErrorKind::Protocol,
        FabricError::Checksum(_) => ErrorKind::Checksum,
        // A page that came back from the storage tier different from how it was written, named or not.
        FabricError::Storage(_) | FabricError::StoredPage { .. } if e.is_corrupt() => ErrorKind::Checksum,
        // Forwarded from a region's home: its kind stands.
        FabricError::Remote { kind, .. } => *kind,
        _ => ErrorKind::Internal,
    }
}

/// The answer to a request that failed: `Moved` for a region whose pages are elsewhere, else the error.
pub(crate) fn refusal(e: &FabricError) -> Message {
    match e {
        FabricError::Moved { to } => Message::Moved { to: WireRegion::from(to) },
        e => Message::Error { kind: error_kind(e), message: e.to_string() },
    }
}

/// What `node`'s answer means to the caller: an error it reported, where the region moved, the answer, or a
/// stream that ended without one.
pub(crate) fn reply_or_error(node: u16, reply: Option<Message>) -> Result<Message, FabricError> {
    match reply {
        Some(Message::Error { kind, message }) => Err(FabricError::Remote { node, kind, message }),
        Some(Message::Moved { to }) => Err(FabricError::Moved { to: RegionHandle::from(&to) }),
        Some(m) => Ok(m),
        None => Err(ProtocolError::NoAnswer { node }.into()),
    }
}

/// `node` answered with a message that does not answer the request.
pub(crate) fn unexpected(node: u16, m: &Message) -> FabricError {
    ProtocolError::Unexpected { node, answer: m.name() }.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressions_and_priorities_come_by_number_and_an_unknown_one_is_a_bad_field() {
        for c in vfabric_allocator::COMPRESSIONS {
            assert_eq!(compression(c.number()).expect("known"), c);
        }
        for p in [Priority::Low, Priority::Normal, Priority::High] {
            assert_eq!(priority(priority_number(p)).expect("known"), p);
        }
        assert!(matches!(priority(3), Err(FabricError::Protocol(ProtocolError::BadField { field: "priority", .. }))));
        let n = vfabric_allocator::COMPRESSIONS.len() as u8;
        match compression(n) {
            Err(FabricError::Protocol(ProtocolError::BadField { field: "compression", value })) => {
                assert_eq!(value, u64::from(n))
            }
            other => panic!("compression {n}: {other:?}"),
        }
    }
}
