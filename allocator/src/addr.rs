//! Node ids, fabric-wide addresses and page sizes.
//!
//! A [`GlobalAddr`] packs the home node into the high 16 bits and the offset inside that
//! node's arena into the low 48 bits. 48 bits (256 TiB) is far beyond any single node's
//! memory, and keeping the whole address in one `u64` lets it travel in wire headers and
//! page tables without a second word.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::AllocError;

/// Number of low bits of a [`GlobalAddr`] that hold the offset.
pub const OFFSET_BITS: u32 = 48;

/// The largest offset a [`GlobalAddr`] can hold (`2^48 - 1`).
pub const MAX_OFFSET: u64 = (1u64 << OFFSET_BITS) - 1;

/// Identifies one node (host) of the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u16);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// A fabric-wide address: home node in the high 16 bits, offset in the low 48.
///
/// Ordering compares the raw value, so addresses sort by node and then by offset.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GlobalAddr(u64);

impl GlobalAddr {
    /// Number of low bits that hold the offset (same as the module-level [`OFFSET_BITS`]).
    pub const OFFSET_BITS: u32 = OFFSET_BITS;

    /// The largest representable offset (same as the module-level [`MAX_OFFSET`]).
    pub const MAX_OFFSET: u64 = MAX_OFFSET;

    /// Builds the address of `offset` on `node`.
    ///
    /// Fails with [`AllocError::InvalidAddress`] if `offset` does not fit in 48 bits:
    /// silently truncating it would alias another address.
    pub fn new(node: NodeId, offset: u64) -> Result<Self, AllocError> {
        if offset > MAX_OFFSET {
            return Err(AllocError::InvalidAddress { addr: offset });
        }
        Ok(Self((u64::from(node.0) << OFFSET_BITS) | offset))
    }

    /// Reinterprets a raw value (e.g. from a wire header). Every `u64` is a valid address.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw packed value.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The home node.
    pub const fn node(self) -> NodeId {
        // The shift leaves only the top 16 bits, so the cast cannot lose anything.
        NodeId((self.0 >> OFFSET_BITS) as u16)
    }

    /// The offset inside the home node's arena.
    pub const fn offset(self) -> u64 {
        self.0 & MAX_OFFSET
    }

    /// The address `bytes` further on the same node, or `None` if the offset would overflow
    /// 48 bits. A plain `u64` add would carry into the node bits and point at another node.
    pub fn checked_add(self, bytes: u64) -> Option<GlobalAddr> {
        let offset = self.offset().checked_add(bytes)?;
        if offset > MAX_OFFSET {
            return None;
        }
        Some(Self((self.0 & !MAX_OFFSET) | offset))
    }
}

impl fmt::Display for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}:0x{:x}", self.node().0, self.offset())
    }
}

// Debug shows the decoded form: a raw 0x0003_0000_0000_1000 is unreadable in logs.
impl fmt::Debug for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GlobalAddr({self})")
    }
}

/// The size of one page (and so of one physical frame): a power of two from 64 KiB to 2 MiB.
///
/// The bounds come from the hardware: 64 KiB is the smallest granule GPU virtual memory
/// maps efficiently, 2 MiB is the large-page size. Serialises as a plain number of bytes and
/// is validated when deserialised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct PageSize(u32);

impl PageSize {
    /// 64 KiB, the smallest page size.
    pub const KIB_64: PageSize = PageSize(64 * 1024);

    /// 2 MiB, the largest page size and the default.
    pub const MIB_2: PageSize = PageSize(2 * 1024 * 1024);

    /// 4 KiB: not a page size a region may take ([`PageSize::new`] refuses it), but the frame of the compressed
    /// tier's arena, whose frames are blocks ([`crate::COMPRESSED_BLOCK`]) so that quotas charge the bytes a
    /// compressed page takes.
    pub const BLOCK: PageSize = PageSize(crate::compression::COMPRESSED_BLOCK as u32);

    /// Validates `bytes` as a page size: a power of two from 64 KiB to 2 MiB inclusive.
    pub fn new(bytes: u64) -> Result<Self, AllocError> {
        let min = u64::from(Self::KIB_64.0);
        let max = u64::from(Self::MIB_2.0);
        if !bytes.is_power_of_two() || bytes < min || bytes > max {
            return Err(AllocError::InvalidPageSize { bytes });
        }
        // Bounded by 2 MiB above, so it fits in u32.
        u32::try_from(bytes).map(Self).map_err(|_| AllocError::InvalidPageSize { bytes })
    }

    /// The page size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0 as u64
    }

    /// How many pages `len` bytes need (rounded up; 0 for 0).
    pub const fn pages_for(self, len: u64) -> u64 {
        len.div_ceil(self.bytes())
    }

    /// Rounds `len` up to a whole number of pages, or `None` if that overflows `u64`.
    pub const fn checked_align_up(self, len: u64) -> Option<u64> {
        len.checked_next_multiple_of(self.bytes())
    }

    /// Rounds `len` up to a whole number of pages.
    ///
    /// Lengths within one page of `u64::MAX` cannot be rounded up; they saturate to the
    /// largest page-aligned `u64`, which is *smaller* than `len`. Use
    /// [`checked_align_up`](Self::checked_align_up) where such lengths can occur.
    pub const fn align_up(self, len: u64) -> u64 {
        match self.checked_align_up(len) {
            Some(v) => v,
            // The largest multiple of the page size: all bits but the low ones.
            None => !(self.bytes() - 1),
        }
    }

    /// Whether `x` is a multiple of the page size.
    pub const fn is_aligned(self, x: u64) -> bool {
        x & (self.bytes() - 1) == 0
    }
}

impl Default for PageSize {
    fn default() -> Self {
        Self::MIB_2
    }
}

impl TryFrom<u64> for PageSize {
    type Error = AllocError;

    fn try_from(bytes: u64) -> Result<Self, Self::Error> {
        Self::new(bytes)
    }
}

impl From<PageSize> for u64 {
    fn from(p: PageSize) -> u64 {
        p.bytes()
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bytes();
        if b >= 1024 * 1024 {
            write!(f, "{} MiB", b / (1024 * 1024))
        } else {
            write!(f, "{} KiB", b / 1024)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_node_and_offset() {
        let a = GlobalAddr::new(NodeId(3), 0x1000).unwrap();
        assert_eq!(a.raw(), (3u64 << 48) | 0x1000);
        assert_eq!(a.node(), NodeId(3));
        assert_eq!(a.offset(), 0x1000);
        assert_eq!(GlobalAddr::from_raw(a.raw()), a);
        assert_eq!(a.to_string(), "n3:0x1000");
        assert_eq!(format!("{a:?}"), "GlobalAddr(n3:0x1000)");
        assert_eq!(NodeId(3).to_string(), "n3");
    }

    #[test]
    fn extreme_nodes_and_offsets() {
        let a = GlobalAddr::new(NodeId(u16::MAX), MAX_OFFSET).unwrap();
        assert_eq!(a.raw(), u64::MAX);
        assert_eq!(a.node(), NodeId(u16::MAX));
        assert_eq!(a.offset(), MAX_OFFSET);
        let z = GlobalAddr::new(NodeId(0), 0).unwrap();
        assert_eq!(z.raw(), 0);
        assert_eq!(GlobalAddr::OFFSET_BITS, 48);
        assert_eq!(GlobalAddr::MAX_OFFSET, 0xffff_ffff_ffff);
    }

    #[test]
    fn offset_overflowing_48_bits_is_rejected() {
        assert_eq!(
            GlobalAddr::new(NodeId(1), MAX_OFFSET + 1),
            Err(AllocError::InvalidAddress { addr: MAX_OFFSET + 1 })
        );
        assert!(GlobalAddr::new(NodeId(1), u64::MAX).is_err());
    }

    #[test]
    fn checked_add_never_carries_into_the_node() {
        let a = GlobalAddr::new(NodeId(2), MAX_OFFSET - 10).unwrap();
        assert_eq!(a.checked_add(10).unwrap().offset(), MAX_OFFSET);
        assert_eq!(a.checked_add(10).unwrap().node(), NodeId(2));
        assert_eq!(a.checked_add(11), None);
        assert_eq!(a.checked_add(u64::MAX), None);
        assert_eq!(a.checked_add(0), Some(a));
    }

    #[test]
    fn page_size_bounds() {
        assert_eq!(PageSize::new(64 * 1024).unwrap(), PageSize::KIB_64);
        assert_eq!(PageSize::new(2 * 1024 * 1024).unwrap(), PageSize::MIB_2);
        assert_eq!(PageSize::new(128 * 1024).unwrap().bytes(), 128 * 1024);
        for bad in [0, 1, 4096, 32 * 1024, 64 * 1024 + 1, 96 * 1024, 4 * 1024 * 1024, u64::MAX, 1 << 40] {
            assert_eq!(PageSize::new(bad), Err(AllocError::InvalidPageSize { bytes: bad }));
        }
        assert_eq!(PageSize::default(), PageSize::MIB_2);
        assert_eq!(PageSize::KIB_64.to_string(), "64 KiB");
        assert_eq!(PageSize::MIB_2.to_string(), "2 MiB");
    }

    #[test]
    fn page_arithmetic() {
        let p = PageSize::KIB_64;
        assert_eq!(p.pages_for(0), 0);
        assert_eq!(p.pages_for(1), 1);
        assert_eq!(p.pages_for(65536), 1);
        assert_eq!(p.pages_for(65537), 2);
        assert_eq!(p.align_up(0), 0);
        assert_eq!(p.align_up(1), 65536);
        assert_eq!(p.align_up(65536), 65536);
        assert_eq!(p.checked_align_up(u64::MAX), None);
        assert_eq!(p.align_up(u64::MAX), u64::MAX - 65535);
        assert!(p.is_aligned(0));
        assert!(p.is_aligned(3 * 65536));
        assert!(!p.is_aligned(65536 + 4096));
    }
}
