//! Where memory lives on one node.

use serde::{Deserialize, Serialize};

use crate::compression::{packed_slot_len, Element, COMPRESSED_BLOCK};

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
    /// Pinned host memory that holds lossy regions' pages packed, each in a slot of [`packed_slot_len`] bytes
    /// for pages of the element's values rather than a whole page's frame: the host tier of those regions,
    /// holding about twice (bf16 slots) or four times (fp32 slots) the pages host memory would. A tier of bf16
    /// slots also takes pages of fp32 values. It holds pages, not leases (they are codes, not values).
    Packed(Element),
    /// Pinned host memory that holds lossless regions' pages compressed, each in a run of
    /// [`COMPRESSED_BLOCK`]-byte blocks as long as its packed form: pages of a region stored with `lz4` or `zstd`
    /// come here from host memory's frames when they arrive there from a GPU and shrink by at least a block. It
    /// holds pages, not leases; they are expanded on the CPU on their way out.
    Compressed,
}

impl Location {
    /// The GPU index, if this is a GPU.
    pub fn gpu(self) -> Option<u16> {
        match self {
            Location::Gpu(g) => Some(g),
            Location::Host | Location::Storage | Location::Packed(_) | Location::Compressed => None,
        }
    }

    /// Whether it is host memory (pages as they are, packed or compressed).
    pub fn is_host_memory(self) -> bool {
        matches!(self, Location::Host | Location::Packed(_) | Location::Compressed)
    }

    /// Whether it holds pages only, never a lease, a placement or a prefetch: the storage tier, the packed tiers
    /// and the compressed tier (pages go there by themselves).
    pub fn holds_pages_only(self) -> bool {
        matches!(self, Location::Storage | Location::Packed(_) | Location::Compressed)
    }

    /// Whether it is a packed tier (of either slot size).
    pub fn is_packed(self) -> bool {
        matches!(self, Location::Packed(_))
    }

    /// Bytes between one frame of a page of `page_bytes` and the next: a page, in a packed tier a slot, in the
    /// compressed tier a block (a page there takes a run of them).
    pub fn frame_bytes(self, page_bytes: u64) -> u64 {
        match self {
            Location::Packed(e) => packed_slot_len(page_bytes, e),
            Location::Compressed => COMPRESSED_BLOCK,
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
            Location::Packed(Element::Bf16) => f.write_str("packed"),
            Location::Packed(Element::F32) => f.write_str("packed-f32"),
            Location::Compressed => f.write_str("compressed"),
        }
    }
}

/// A string that names no location (see [`Location`]'s `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a location: use gpuN, N, host, storage, packed, packed-f32 or compressed")]
pub struct ParseLocationError(pub String);

impl std::str::FromStr for Location {
    type Err = ParseLocationError;
    /// Parses `gpu0`, `gpu1`, ..., `0`, `1`, ..., `host` / `h`, `storage` / `nvme`, `packed` / `packed-bf16` and
    /// `packed-f32`, and `compressed`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        if t == "host" || t == "h" {
            return Ok(Location::Host);
        }
        if t == "storage" || t == "nvme" {
            return Ok(Location::Storage);
        }
        if t == "packed" || t == "packed-bf16" {
            return Ok(Location::Packed(Element::Bf16));
        }
        if t == "packed-f32" {
            return Ok(Location::Packed(Element::F32));
        }
        if t == "compressed" {
            return Ok(Location::Compressed);
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
        let (bf16, f32) = (Location::Packed(Element::Bf16), Location::Packed(Element::F32));
        assert_eq!("packed".parse::<Location>(), Ok(bf16));
        assert_eq!("packed-bf16".parse::<Location>(), Ok(bf16));
        for l in [bf16, f32] {
            assert_eq!(l.to_string().parse::<Location>(), Ok(l));
            assert!(l.is_host_memory() && l.is_packed());
        }
        assert_eq!(bf16.to_string(), "packed");
        assert!(!Location::Storage.is_host_memory() && !Location::Host.is_packed());
        assert_eq!(Location::Host.frame_bytes(1 << 21), 1 << 21);
        assert_eq!(bf16.frame_bytes(1 << 21), (1 << 20) + (16 << 10));
        assert_eq!(f32.frame_bytes(1 << 21), (512 << 10) + (8 << 10));
        let c = Location::Compressed;
        assert_eq!("compressed".parse::<Location>(), Ok(c));
        assert_eq!(c.to_string(), "compressed");
        assert!(c.is_host_memory() && !c.is_packed() && c.holds_pages_only());
        assert_eq!(c.frame_bytes(1 << 21), 4096);
        assert!(!Location::Host.holds_pages_only() && Location::Storage.holds_pages_only());
        assert!(bf16.holds_pages_only() && !Location::Gpu(0).holds_pages_only());
    }
}
