//! Errors of the device layer and of the movers.
//!
//! Every CUDA call's result is turned into [`DeviceError::Cuda`], naming the call, so a log line says what the
//! driver refused and not only the code.

use vfabric_allocator::Location;

/// An error from the device layer: opening the driver, creating arenas, reading and writing them.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The CUDA driver library (`libcuda.so.1`) could not be loaded: there is no GPU driver on this machine.
    #[error("no CUDA driver on this machine (libcuda.so / libcuda.so.1 could not be loaded)")]
    DriverMissing,
    /// A CUDA driver call returned an error.
    #[error("{call} failed: {name} ({code}): {description}")]
    Cuda {
        /// The driver function that failed, e.g. `cuMemCreate`.
        call: &'static str,
        /// The numeric `CUresult`.
        code: u32,
        /// The `CUresult`'s name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The driver's description of the error.
        description: String,
    },
    /// The driver loaded but reports no GPU.
    #[error("the CUDA driver reports no GPU on this machine")]
    NoGpu,
    /// A GPU index that this node does not have.
    #[error("GPU {gpu} does not exist: this node has {count} GPU(s)")]
    NoSuchGpu {
        /// The index asked for.
        gpu: u16,
        /// How many GPUs the node has.
        count: usize,
    },
    /// The GPU or driver lacks a feature the fabric needs.
    #[error("GPU {gpu} does not support {feature}")]
    Unsupported {
        /// The GPU's index.
        gpu: u16,
        /// What is missing, e.g. "virtual memory management".
        feature: &'static str,
    },
    /// An arena asked for where no arena can be: the storage tier is a file, read and written by its own I/O.
    #[error("{0} has no arena (its pages are moved by file I/O)")]
    NoArena(Location),
    /// A driver entry point is missing: the driver is older than the fabric needs.
    #[error("the CUDA driver has no {0}: it is older than vfabric needs (CUDA 12.8 or newer)")]
    MissingSymbol(&'static str),
    /// An access outside an arena.
    #[error("{offset:#x}+{len:#x} is outside the {location} arena of {arena_len:#x} bytes")]
    OutOfBounds {
        /// Where the arena lives.
        location: Location,
        /// Start of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Size of the arena.
        arena_len: u64,
    },
    /// A device ran out of memory for an arena.
    #[error("{location} has no room for an arena of {requested} bytes ({detail})")]
    OutOfDeviceMemory {
        /// Where the arena was asked for.
        location: Location,
        /// Its size in bytes.
        requested: u64,
        /// What the driver or the emulated device said.
        detail: String,
    },
    /// An argument that can never be valid (zero-sized arena, chunk size not a power of two, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Host memory for the emulated device or a staging buffer could not be allocated.
    #[error("could not allocate {bytes} bytes of host memory")]
    HostAllocFailed {
        /// The size asked for.
        bytes: u64,
    },
    /// The arena cannot be shared with another process (its memory was not made exportable).
    #[error("the {0} arena cannot be shared with another process")]
    NotShareable(Location),
    /// An operating-system call failed (file descriptors of exported chunks).
    #[error("{call} failed: {source}")]
    Os {
        /// The call that failed.
        call: &'static str,
        /// The error it returned.
        #[source]
        source: std::io::Error,
    },
    /// NCCL's library could not be loaded (libnccl.so.2).
    #[error("NCCL is not available on this machine (libnccl.so.2 could not be loaded)")]
    NcclMissing,
    /// An NCCL call failed.
    #[error("{call} failed: {status}")]
    Nccl {
        /// The call that failed.
        call: &'static str,
        /// What NCCL returned.
        status: String,
    },
    /// A channel's other end did not do its part in time: the channel's work was aborted.
    #[error("{what} did not complete within {after:?} (the other end never did its part): the channel is aborted")]
    ChannelTimeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        after: std::time::Duration,
    },
    /// A channel failed earlier and was aborted: every later call on it is refused.
    #[error("the channel failed earlier and was aborted: join a new one")]
    ChannelBroken,
}

/// Which side of a page batch an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The source arena.
    Source,
    /// The destination arena.
    Destination,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Source => "source",
            Side::Destination => "destination",
        })
    }
}

/// An error from a mover: a batch that cannot be moved, or a device failure while moving it.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// The page size is zero, not a multiple of 16 bytes, or too large for the kernel's 32-bit words.
    #[error("page size {0} bytes is not usable: it must be a non-zero multiple of 16 bytes, at most 2 GiB")]
    BadPageSize(u64),
    /// A frame beyond the end of its arena.
    #[error("{side} frame {frame} is outside its arena of {frames} frames of this page size")]
    FrameOutOfRange {
        /// Which arena.
        side: Side,
        /// The frame index.
        frame: u32,
        /// How many frames of the batch's page size the arena holds.
        frames: u64,
    },
    /// Two pages of one batch would be written to the same destination frame.
    #[error("destination frame {0} appears twice in one batch")]
    DuplicateDestination(u32),
    /// Source and destination are the same arena and a frame is both read and written.
    #[error("frame {0} is both a source and a destination in a batch within one arena")]
    OverlappingFrames(u32),
    /// The chosen engine cannot move between these locations.
    #[error("the {engine} engine cannot move {from} -> {to}: {reason}")]
    EngineUnavailable {
        /// The engine asked for.
        engine: crate::device::engine::Engine,
        /// Source location.
        from: Location,
        /// Destination location.
        to: Location,
        /// Why not.
        reason: &'static str,
    },
    /// An arena handed to a mover of another device layer (an emulated arena to the CUDA mover, say).
    #[error("the arena at {0} does not belong to this mover's device layer")]
    ForeignArena(Location),
    /// A coded move whose pages do not hold whole groups of the lossy format's values.
    #[error("pages of {page} bytes do not hold whole groups of {group} {element:?} values: they cannot be packed")]
    NotPackable {
        /// The page size.
        page: u64,
        /// Values per group.
        group: usize,
        /// The values.
        element: vfabric_allocator::Element,
    },
    /// The mover's worker is gone (the emulated device's copy thread stopped).
    #[error("the mover's worker stopped before the transfer completed")]
    WorkerGone,
    /// The device failed while moving.
    #[error(transparent)]
    Device(#[from] DeviceError),
}
