//! The storage tier's I/O: a file of page-sized slots below host memory (an NVMe drive's filesystem), read and
//! written with O_DIRECT through io_uring (`ring`), many requests in flight, on a ring per caller at once
//! (`rings`), every page's checksum recorded when it is written and checked when it is read (`file`), from
//! block-aligned memory (`buffer`; page-aligned arena frames serve too). Pages of regions that ask for
//! compression are stored packed (`codec`: LZ4 or Zstandard, kept only when it saves a block). The fabric
//! creates the file, reserves its space, and removes it, holding an exclusive lock on it meanwhile; a tier's
//! file left by a crashed run (its lock gone with it) is reset, never trusted, one a live tier holds is refused,
//! and a file that is not a tier's is never overwritten. Every failure is a [`StorageError`] naming
//! its file or slot.

mod buffer;
mod codec;
mod error;
mod file;
mod ring;
mod rings;

pub use buffer::{AlignedBuffer, DIRECT_ALIGN};
pub use codec::{uniform, unpack, Packer};
pub use error::StorageError;
pub use file::{StorageFile, StorageSpec};
pub use vfabric_allocator::Compression;
