//! The Python exceptions: one class per kind of failure of the fabric, all under `vfabric.FabricError`
//! (itself a `RuntimeError`), and the mapping from the Rust errors to them.
//!
//! The mapping is an exhaustive `match` over [`FabricError`]: a variant added to the Rust API stops this crate
//! from compiling until it is given a class. Errors a remote node reported arrive as
//! [`RustError::Remote`] and are raised by their [`ErrorKind`], as the same class a local failure would be.
//! Bad arguments (an unknown device name, a negative size) are `ValueError`s, raised by `args`.

use std::ffi::CString;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use pyo3::PyTypeInfo;
use vfabric::proto::ErrorKind;
use vfabric::{DirectoryError, FabricError as RustError};

/// Makes the class `vfabric.<name>` once per interpreter.
fn class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    doc: &str,
    base: Bound<'py, PyType>,
) -> Bound<'py, PyType> {
    cell.get_or_init(py, || {
        let qualified = CString::new(format!("vfabric.{name}")).expect("class names have no NUL");
        let doc = CString::new(doc).expect("docstrings have no NUL");
        PyErr::new_type(py, &qualified, Some(&doc), Some(&base), None).expect("creating an exception class")
    })
    .bind(py)
    .clone()
}

/// Declares the exception classes: `FabricError` (a `RuntimeError`) and its subclasses, each a Rust type of the
/// same name whose `err` makes a Python exception of that class.
macro_rules! exceptions {
    ($($name:ident($base:ident) => $doc:literal;)*) => {
        $(
            #[doc = $doc]
            pub struct $name;

            impl $name {
                /// The Python class.
                pub fn type_object(py: Python<'_>) -> Bound<'_, PyType> {
                    static CELL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
                    class(py, &CELL, stringify!($name), $doc, $base::type_object(py))
                }

                /// An exception of this class carrying `message`.
                #[allow(dead_code)] // The base class is only ever raised through its subclasses.
                pub fn err(message: impl Into<String>) -> PyErr {
                    let message: String = message.into();
                    Python::attach(|py| PyErr::from_type(Self::type_object(py), (message,)))
                }
            }
        )*

        /// Adds every exception class to the module.
        pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            $( m.add(stringify!($name), $name::type_object(m.py()))?; )*
            Ok(())
        }
    };
}

exceptions! {
    FabricError(PyRuntimeError) => "Base class of every error the fabric raises.";
    OutOfMemory(FabricError) => "A device has no room, even after evicting every page that may be evicted.";
    QuotaExceeded(FabricError) => "A tenant's quota on a tier would be exceeded.";
    InvalidSize(FabricError) => "A region of zero bytes, or of more pages than a region may have.";
    OutOfBounds(FabricError) => "A byte range beyond the end of its region or of its lease.";
    InvalidAddress(FabricError) => "A region handle that names no region of the fabric.";
    UseAfterFree(FabricError) => "A region used after it was freed.";
    PermissionDenied(FabricError) => "The caller's tenant may not do this: another tenant's region, another tenant's name, or an operator's call.";
    DoubleFree(FabricError) => "A region freed twice.";
    LeasedElsewhere(FabricError) => "Pages leased in a way that excludes this call (written elsewhere, or read while a write is asked).";
    DeviceUnavailable(FabricError) => "A device this node does not have, or that failed.";
    ReadOnlyLease(FabricError) => "A write through a lease that only allows reading.";
    UnknownLease(FabricError) => "A lease that is not, or no longer, held.";
    PeerDead(FabricError) => "A node the call depends on stopped answering.";
    Unavailable(FabricError) => "What the call needs cannot be reached now: a replicated region's standby copy, or nodes enough for its replicas.";
    Stalled(FabricError) => "The node's copies (a GPU's, a drive's) stopped making progress: calls that move pages fail until they finish.";
    NetworkError(FabricError) => "The network failed: binding, connecting, a stream, TLS, the local socket.";
    ProtocolError(FabricError) => "A peer (or the node's agent) broke the protocol.";
    ChecksumError(FabricError) => "Page bytes arrived with a checksum that does not match: nothing was written.";
    ConfigError(FabricError) => "The cluster configuration is not usable, or a setting the call needs is missing.";
    DeviceError(FabricError) => "The device layer failed (a CUDA call, a page move).";
    LaunchError(FabricError) => "A job's launch (its launcher's variables, the rendezvous of its ranks) failed.";
    RegionMoved(FabricError) => "The region's pages moved to another node faster than the call could follow them.";
    InternalError(FabricError) => "A fault of the fabric itself (a bug).";
    LeaseInUse(FabricError) => "A lease released while arrays or tensors made from it are still alive.";
    NotContiguous(FabricError) => "A view over pages of a lease that do not sit one after the other on the device.";
}

/// A Rust error as the Python exception of its kind, with the Rust message.
pub fn to_py(e: RustError) -> PyErr {
    let message = e.to_string();
    match e {
        RustError::OutOfMemory { .. } => OutOfMemory::err(message),
        RustError::QuotaExceeded { .. } => QuotaExceeded::err(message),
        RustError::InvalidSize(_) => InvalidSize::err(message),
        RustError::Directory(d) => directory(&d, message),
        RustError::InvalidAddress(_) => InvalidAddress::err(message),
        RustError::OutOfBounds { .. } => OutOfBounds::err(message),
        RustError::DoubleFree(_) => DoubleFree::err(message),
        RustError::UseAfterFree(_) => UseAfterFree::err(message),
        RustError::PermissionDenied(_) => PermissionDenied::err(message),
        RustError::LeasedElsewhere { .. } => LeasedElsewhere::err(message),
        RustError::DeviceUnavailable(_) => DeviceUnavailable::err(message),
        RustError::ReadOnlyLease(_) => ReadOnlyLease::err(message),
        RustError::UnknownLease(_) => UnknownLease::err(message),
        RustError::Device(_) | RustError::Move(_) => DeviceError::err(message),
        RustError::Config(_) => ConfigError::err(message),
        RustError::PeerDead { .. } => PeerDead::err(message),
        RustError::Unavailable(_) => Unavailable::err(message),
        RustError::Stalled { .. } => Stalled::err(message),
        RustError::Network(_) => NetworkError::err(message),
        RustError::Launch(_) => LaunchError::err(message),
        RustError::NoRuntime | RustError::Internal(_) => InternalError::err(message),
        RustError::Protocol(_) => ProtocolError::err(message),
        RustError::Checksum(_) => ChecksumError::err(message),
        // Pages that came back from the storage tier different from how they were written (the message names
        // the page, its region and slot where one held it) are checksum errors; the tier's other failures the
        // device layer's.
        RustError::Storage(_) | RustError::StoredPage { .. } if e.is_corrupt() => ChecksumError::err(message),
        RustError::Storage(_) | RustError::StoredPage { .. } => DeviceError::err(message),
        RustError::Remote { kind, .. } => remote(kind, message),
        RustError::Moved { .. } => RegionMoved::err(message),
    }
}

/// The directory's own errors: its configuration checks are the configuration's fault, a full address space or
/// an impossible compaction is a lack of memory, and an allocator failure underneath is a bug.
fn directory(e: &DirectoryError, message: String) -> PyErr {
    match e {
        DirectoryError::AddressSpaceExhausted(_)
        | DirectoryError::CompactionImpossible { .. }
        | DirectoryError::ReservationRefused { .. } => OutOfMemory::err(message),
        // A reservation this caller does not hold: a name that names nothing.
        DirectoryError::UnknownReservation(_) => InvalidAddress::err(message),
        // The storage tier named where a GPU or host memory must be: as a device that cannot serve.
        DirectoryError::StorageTier(_)
        | DirectoryError::PackedTier(_)
        | DirectoryError::CompressedTier(_)
        | DirectoryError::PackedInHost(_) => DeviceUnavailable::err(message),
        DirectoryError::InvalidWatermarks { .. }
        | DirectoryError::InvalidArena { .. }
        | DirectoryError::TooManyDevices(_)
        | DirectoryError::NoHostArena
        | DirectoryError::InvalidAddressSpace(_) => ConfigError::err(message),
        _ => InternalError::err(message),
    }
}

/// An error a region's home node reported, by the kind it sent.
fn remote(kind: ErrorKind, message: String) -> PyErr {
    match kind {
        ErrorKind::OutOfMemory => OutOfMemory::err(message),
        ErrorKind::QuotaExceeded => QuotaExceeded::err(message),
        ErrorKind::InvalidAddress => InvalidAddress::err(message),
        ErrorKind::OutOfBounds => OutOfBounds::err(message),
        ErrorKind::DoubleFree => DoubleFree::err(message),
        ErrorKind::UseAfterFree => UseAfterFree::err(message),
        ErrorKind::PermissionDenied => PermissionDenied::err(message),
        ErrorKind::LeasedElsewhere => LeasedElsewhere::err(message),
        ErrorKind::DeviceUnavailable => DeviceUnavailable::err(message),
        ErrorKind::UnknownLease => UnknownLease::err(message),
        ErrorKind::PeerDead => PeerDead::err(message),
        ErrorKind::Unavailable => Unavailable::err(message),
        ErrorKind::Stalled => Stalled::err(message),
        ErrorKind::Protocol => ProtocolError::err(message),
        ErrorKind::Checksum => ChecksumError::err(message),
        ErrorKind::Internal => InternalError::err(message),
    }
}

/// A `ValueError` (bad arguments: an unknown device, a negative size, a shape that does not fit).
pub fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}
