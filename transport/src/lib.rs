//! vfabric-transport: everything that moves bytes, in three parts.
//!
//! - The **device layer** ([`device`]): a node's GPUs and pinned host memory as [`Arena`]s that are created once
//!   and mapped once, behind the [`DeviceLayer`] trait, with two backends: [`cuda`] (CUDA driver API through
//!   cudarc, VMM arenas) and [`emulated`] (host memory, for machines without a GPU). Its movers copy batches of
//!   pages ([`PageBatch`]) between frames of two arenas by the copy engine or the SM gather/scatter kernel
//!   (`kernels/page_copy.cu`), asynchronously, with a [`Transfer`] to wait on.
//! - The **network** ([`quic`]): QUIC between nodes with mutual TLS, certificates from a cluster CA.
//! - **Storage** ([`storage`]): the tier below host memory, pages in a file read and written with O_DIRECT
//!   through io_uring, checksummed.
//!
//! Nothing here panics on a machine without a driver: opening CUDA returns [`DeviceError::DriverMissing`].

#![deny(missing_docs)]

pub mod device;
pub mod quic;
pub mod storage;

pub use device::arena::{Arena, ArenaSpec};
pub use device::batch::{CopyRun, PageBatch, Plan};
pub use device::engine::{Engine, EngineChoice, KernelSide, ParseEngineChoiceError};
pub use device::error::{DeviceError, MoveError, Side};
pub use device::layer::{DeviceKind, DeviceLayer, GpuInfo};
pub use device::mover::{Coding, Mover, MoverConfig, MoverConfigError, Transfer, TransferReport};
pub use device::open::{open, Backend, OpenOptions, Opened, ParseBackendError};
pub use device::page_sum::page_sum;
pub use device::peer_channel::{ChannelId, PeerChannel, PeerTransfer};
pub use device::share::{ArenaShare, ExportedArena, ShareKind};
pub use device::shared_memory::SharedHostMemory;
pub use device::{cuda, emulated};
pub use vfabric_allocator::{Location, PageMove};
