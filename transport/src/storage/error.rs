//! What can go wrong with a storage tier: its file, its spec, a request, or a page that came back wrong.

use std::path::PathBuf;

/// An error of the storage tier. Every one names what it is about (the file, the slot), and none leaves the tier
/// in a state other requests could not use.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The tier's size, page size or path cannot make a tier.
    #[error("invalid storage tier: {0}")]
    InvalidSpec(String),
    /// A file is at the path that this fabric did not make: it is left alone.
    #[error("{path}: the file exists and is not a vfabric storage tier (refusing to overwrite it)")]
    Foreign {
        /// The file.
        path: PathBuf,
    },
    /// The file is a tier that another live storage tier holds (its exclusive lock is taken): another fabric
    /// on this machine, or in this process, uses it. It is left alone; a tier left by a process that ended
    /// (its lock went with it) is reset instead.
    #[error("storage file {path} is in use by another process")]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// Opening, sizing or removing the file failed.
    #[error("{path}: {what}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The step that failed.
        what: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// Setting up io_uring, or submitting to it, failed.
    #[error("io_uring: {what}: {source}")]
    Ring {
        /// The step that failed.
        what: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A slot past the tier's end.
    #[error("slot {slot} is past the tier's last slot ({slots} slots)")]
    NoSuchSlot {
        /// The slot asked for.
        slot: u64,
        /// Slots the tier has.
        slots: u64,
    },
    /// A buffer O_DIRECT cannot use: not one page long, or not aligned to the device's blocks.
    #[error("slot {slot}: buffer of {len} bytes at {addr:#x}: O_DIRECT needs {page} bytes at a multiple of {align}")]
    BadBuffer {
        /// The slot it was for.
        slot: u64,
        /// Its address.
        addr: usize,
        /// Its length.
        len: usize,
        /// The page size.
        page: u64,
        /// The alignment needed.
        align: usize,
    },
    /// A slot was named twice in one request.
    #[error("slot {slot} is named twice in one request")]
    DuplicateSlot {
        /// The slot.
        slot: u64,
    },
    /// A read of a slot never written (or written by a write that failed).
    #[error("slot {slot} holds no page")]
    NeverWritten {
        /// The slot.
        slot: u64,
    },
    /// The kernel failed one request.
    #[error("slot {slot}: {op} failed: {source}")]
    Io {
        /// The slot.
        slot: u64,
        /// "read" or "write".
        op: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A read or write moved fewer bytes than a page.
    #[error("slot {slot}: {op} moved {got} of {want} bytes")]
    Short {
        /// The slot.
        slot: u64,
        /// "read" or "write".
        op: &'static str,
        /// Bytes moved.
        got: usize,
        /// Bytes wanted.
        want: u64,
    },
    /// The page read back is not the page written: its checksum differs.
    #[error("slot {slot}: the page read back is corrupt (xxh3 {found:#018x}, written {expected:#018x})")]
    Corrupt {
        /// The slot.
        slot: u64,
        /// The checksum recorded when it was written.
        expected: u64,
        /// The checksum of what came back.
        found: u64,
    },
    /// A compressed page read back does not decompress to a page: the slot is corrupt.
    #[error("slot {slot}: the compressed page read back is corrupt (it does not decompress to one page)")]
    Undecodable {
        /// The slot.
        slot: u64,
    },
}

impl StorageError {
    /// Whether the error says a page came back different from how it was written (rather than that it could
    /// not be read).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, StorageError::Corrupt { .. } | StorageError::Undecodable { .. })
    }

    /// The slot whose read failed, when the error is about one slot's page coming back (corrupt, short, not
    /// at all, or holding no page): what a caller that knows which page the slot holds names it by. `None` for
    /// errors of the tier, of a write, or of a malformed request.
    pub fn failed_read_slot(&self) -> Option<u64> {
        match *self {
            StorageError::Corrupt { slot, .. }
            | StorageError::Undecodable { slot }
            | StorageError::NeverWritten { slot }
            | StorageError::Short { slot, op: "read", .. }
            | StorageError::Io { slot, op: "read", .. } => Some(slot),
            _ => None,
        }
    }
}
