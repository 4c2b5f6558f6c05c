//! Arenas shared with the node's other processes: what an exported arena is made of, so that another process
//! can map the same memory ([`crate::DeviceLayer::import_arena`]).
//!
//! The descriptors travel apart from the description (over a Unix socket, with `SCM_RIGHTS`), in the order of
//! [`ArenaShare::pieces`].

use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};
use vfabric_allocator::Location;

/// How an exported arena's memory is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShareKind {
    /// CUDA VMM physical chunks, one POSIX file descriptor each, mapped back to back into one range.
    GpuChunks,
    /// One shared memory file ([`super::shared_memory::SharedHostMemory`]); on CUDA also registered with the
    /// driver, so copy engines and kernels reach it.
    HostFile,
}

/// What another process needs, besides the descriptors, to map an arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaShare {
    /// Where the memory lives.
    pub location: Location,
    /// The arena's size in bytes.
    pub len: u64,
    /// How it is shared.
    pub kind: ShareKind,
    /// The size of each piece (chunk or file) in bytes, in mapping order; one descriptor each.
    pub pieces: Vec<u64>,
}

/// An arena's description and a new descriptor for each of its pieces.
#[derive(Debug)]
pub struct ExportedArena {
    /// The description.
    pub share: ArenaShare,
    /// One descriptor per piece, in the order of [`ArenaShare::pieces`].
    pub fds: Vec<OwnedFd>,
}

impl ArenaShare {
    /// Checks that the pieces add up to the arena and that one descriptor came for each.
    pub fn check(&self, fds: usize) -> Result<(), super::error::DeviceError> {
        let sum = self.pieces.iter().try_fold(0u64, |a, &p| a.checked_add(p));
        if self.pieces.is_empty() || sum != Some(self.len) || fds != self.pieces.len() {
            return Err(super::error::DeviceError::InvalidArgument(format!(
                "a shared {} arena of {} bytes in pieces {:?} with {fds} descriptor(s)",
                self.location, self.len, self.pieces
            )));
        }
        if self.kind == ShareKind::HostFile && self.pieces.len() != 1 {
            return Err(super::error::DeviceError::InvalidArgument("a shared host file comes in one piece".into()));
        }
        Ok(())
    }
}
