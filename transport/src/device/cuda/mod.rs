//! The CUDA backend, in cudarc's layers: [`driver`] checks raw calls (the result layer); [`context`], [`vmm`],
//! [`host`], [`stream`] and [`module`] are safe RAII types over them; [`GpuArena`], [`HostArena`], [`CudaNode`]
//! and [`CudaMover`] implement the device layer's traits.
//!
//! The driver is loaded at run time (cudarc's `dynamic-loading`), so this compiles and links on machines
//! without CUDA; [`CudaNode::open`] returns
//! [`DriverMissing`](crate::device::error::DeviceError::DriverMissing) there instead of panicking.

pub mod arena;
pub mod baseline;
pub mod context;
pub mod driver;
pub(crate) mod gpus;
pub mod host;
pub mod module;
pub mod mover;
pub mod nccl;
pub mod node;
mod staging;
pub mod stream;
pub mod vmm;

pub use arena::{GpuArena, HostArena};
pub use baseline::{BaselineCopier, PlainCopy};
pub use context::GpuContext;
pub use driver::{driver_present, nccl_present};
pub use mover::CudaMover;
pub use node::CudaNode;
