//! The device layer: a node's GPUs and pinned host memory, and the movers that copy pages between them.
//!
//! - The interface every backend offers the fabric: [`arena`] (memory created once and mapped once),
//!   [`layer`] (a node's devices), [`mover`] (moving batches of pages, and the policy that picks an
//!   [`engine`]), [`batch`] (batches and the plans engines execute), [`error`].
//! - The backends: [`cuda`] (CUDA driver API through cudarc, VMM arenas) and [`emulated`] (host memory, for
//!   machines without a GPU).
//! - [`lossy`]: the lossy page format on the CPU (what the codec kernel does on the GPU); [`page_sum`]: page
//!   checksums on the CPU (what the page-sum kernel does on the GPU).
//! - [`peer_channel`]: channels between this node's GPUs and other processes' (NCCL in the CUDA backend).
//! - Sharing arenas with the node's other processes: [`share`] (what an exported arena is made of) and
//!   [`shared_memory`] (host memory in a shared file).
//! - [`open`]: the choice between the backends, which sits above both.
//!
//! The interface files never name a backend, so each backend depends on the interface and not the other way.

pub mod arena;
pub mod batch;
pub mod cuda;
pub mod emulated;
pub mod engine;
pub mod error;
pub mod layer;
pub mod lossy;
pub mod mover;
pub mod open;
pub mod page_sum;
pub mod peer_channel;
pub mod share;
pub mod shared_memory;
