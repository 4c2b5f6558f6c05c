//! vfabric-transport: everything that moves bytes.
//!
//! - The **device layer** ([`hal`]): a node's GPUs and pinned host memory as [`Arena`]s that are created once
//!   and mapped once, behind the [`DeviceLayer`] trait, with two backends: [`cuda`] (CUDA driver API through
//!   cudarc, VMM arenas) and [`emulated`] (host memory, for machines without a GPU).
//! - **Movers** ([`mover`]): batches of pages ([`PageBatch`]) copied between frames of two arenas by the copy
//!   engine or the SM gather/scatter kernel (`kernels/page_copy.cu`), asynchronously, with a [`Transfer`] to
//!   wait on.
//!
//! Nothing here panics on a machine without a driver: opening CUDA returns [`DeviceError::DriverMissing`].

#![deny(missing_docs)]

pub mod batch;
pub mod cuda;
pub mod emulated;
pub mod error;
pub mod hal;
pub mod mover;
pub mod quic;

pub use batch::{CopyRun, PageBatch, Plan};
pub use error::{DeviceError, MoveError, Side};
pub use hal::{open, Arena, ArenaSpec, Backend, DeviceKind, DeviceLayer, GpuInfo, OpenOptions, Opened};
pub use vfabric_allocator::{Location, PageMove};
pub use mover::{Engine, EngineChoice, KernelSide, Mover, MoverConfig, Transfer, TransferReport};
