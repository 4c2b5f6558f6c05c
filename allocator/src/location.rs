//! Where memory lives on one node.

use serde::{Deserialize, Serialize};

use crate::compression::packed_slot_len;

/// A memory location of one node: one of its GPUs, its pinned host memory, or its storage tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Location {
    /// GPU `n` of the node, numbered as the driver numbers them (CUDA ordinal).
    Gpu(u16),
    /// Pinned host memory, mapped for every GPU of the node.
    Host,
    /// The storage tier below host memory (a file on an NVMe drive): pages evicted from host memory go there.
    /// It holds pages, not leases: nothing computes on it, and pages come back through host memory.
    Storage,
    /// Pinned host memory that holds lossy regions' pages packed, each in a slot of
    /// [`packed_slot_len`] bytes rather than a whole page's frame: the host tier of those regions, holding about
    /// twice the pages host memory would. It holds pages, not leases (they are codes, not values).
    Packed,
}

impl Location {
    /// The GPU index, if this is a GPU.
    pub fn gpu(self) -> Option<u16> {
        match self {
            Location::Gpu(g) => Some(g),
            Location::Host | Location::Storage | Location::Packed => None,
        }
    }

    /// Whether it is host memory (pages as they are, or packed).
    pub fn is_host_memory(self) -> bool {
        matches!(self, Location::Host | Location::Packed)
    }

    /// Bytes between one frame of a page of `page_bytes` and the next: a page, or in the packed tier a slot.
    pub fn frame_bytes(self, page_bytes: u64) -> u64 {
        match self {
            Location::Packed => packed_slot_len(page_bytes),
            _ => page_bytes,
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Gpu(g) => write!(f, "gpu{g}"),
            Location::Host => f.write_str("host"),
            Location::Storage => f.write_str("storage"),
            Location::Packed => f.write_str("packed"),
        }
    }
}

/// A string that names no location (see [`Location`]'s `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a location: use gpuN, N, host, storage or packed")]
pub struct ParseLocationError(pub String);

impl std::str::FromStr for Location {
    type Err = ParseLocationError;
    /// Parses `gpu0`, `gpu1`, ..., `0`, `1`, ..., `host` / `h`, `storage` / `nvme` and `packed`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        if t == "host" || t == "h" {
            return Ok(Location::Host);
        }
        if t == "storage" || t == "nvme" {
            return Ok(Location::Storage);
        }
        if t == "packed" {
            return Ok(Location::Packed);
        }
        let digits = t.strip_prefix("gpu").unwrap_or(&t);
        digits.parse::<u16>().map(Location::Gpu).map_err(|_| ParseLocationError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("gpu1".parse::<Location>(), Ok(Location::Gpu(1)));
        assert_eq!("0".parse::<Location>(), Ok(Location::Gpu(0)));
        assert_eq!("Host".parse::<Location>(), Ok(Location::Host));
        assert_eq!("nvme".parse::<Location>(), Ok(Location::Storage));
        assert_eq!(Location::Storage.to_string(), "storage");
        assert_eq!("gpux".parse::<Location>(), Err(ParseLocationError("gpux".into())));
        assert_eq!(Location::Gpu(3).to_string(), "gpu3");
        assert_eq!(Location::Host.gpu(), None);
        assert_eq!("packed".parse::<Location>(), Ok(Location::Packed));
        assert_eq!(Location::Packed.to_string(), "packed");
        assert!(Location::Packed.is_host_memory() && !Location::Storage.is_host_memory());
        assert_eq!(Location::Host.frame_bytes(1 << 21), 1 << 21);
        assert_eq!(Location::Packed.frame_bytes(1 << 21), (1 << 20) + (16 << 10));
    }
}
