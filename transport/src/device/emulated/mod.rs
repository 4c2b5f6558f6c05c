//! The emulated device: host memory standing in for GPUs, behind the same traits as CUDA.
//!
//! It exists so the fabric runs and is tested on machines without a GPU (CI among them). It is not a simulator
//! of GPU speed: its movers copy with `memcpy` on worker threads, one per queue, so completions are really
//! asynchronous and ordered per queue as on the GPU. Both engines run the same plans as on CUDA: the copy
//! engine copies the coalesced runs; the "kernel" walks the kernel's page index lists chunk by chunk, exactly as
//! `vf_page_copy` does, so index and chunking mistakes show up here too.

mod arena;
mod mover;
pub(crate) mod node;

pub use arena::EmulatedArena;
pub use mover::EmulatedMover;
pub use node::EmulatedNode;
