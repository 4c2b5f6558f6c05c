//! The one error type every allocator in this crate returns.
//!
//! The allocators are deliberately unit-agnostic: a [`RangeAllocator`](crate::RangeAllocator)
//! counts bytes, a [`FrameArena`](crate::FrameArena) counts frames, and a bare
//! [`FreeExtents`](crate::FreeExtents) counts whatever its owner says. Each variant therefore
//! documents its numbers as "units of the allocator that raised it" instead of pretending to
//! be bytes everywhere.

use crate::tenant::{TenantId, Tier};

/// Why an allocation, free, lease or compaction request was refused.
///
/// Every failing operation in this crate leaves the allocator exactly as it was before the
/// call, so a caller may retry, fall back to another tier or report the error without any
/// cleanup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// No free extent can satisfy the request.
    ///
    /// All three numbers are in the unit of the allocator that raised it: bytes for a
    /// [`RangeAllocator`](crate::RangeAllocator), frames for a
    /// [`FrameArena`](crate::FrameArena), abstract units for
    /// [`FreeExtents`](crate::FreeExtents).
    #[error(
        "out of memory: requested {requested} units, {available} available, \
         largest free extent {largest_free}"
    )]
    OutOfMemory {
        /// Units asked for, after any rounding the allocator applies.
        requested: u64,
        /// Units the request's class could use in total (possibly scattered).
        available: u64,
        /// Length of the largest free extent, i.e. the largest contiguous request that
        /// could have succeeded (ignoring any headroom reservation).
        largest_free: u64,
    },

    /// Charging the request to the tenant would exceed its limit on that tier.
    ///
    /// All numbers are bytes.
    #[error(
        "quota exceeded for tenant {tenant} on tier {tier}: limit {limit} bytes, \
         {used} used, {requested} requested"
    )]
    QuotaExceeded {
        /// The tenant that would be charged.
        tenant: TenantId,
        /// The memory tier the charge is for.
        tier: Tier,
        /// The tenant's limit on that tier, in bytes.
        limit: u64,
        /// Bytes the tenant already uses on that tier.
        used: u64,
        /// Bytes the refused request asked for.
        requested: u64,
    },

    /// The address (or frame id, or unit) is outside the allocator, or does not name the
    /// start of anything the allocator handed out.
    #[error("invalid address {addr:#x}: outside the allocator or not the start of a live allocation")]
    InvalidAddress {
        /// The offending address, in the allocator's unit.
        addr: u64,
    },

    /// The address is not a multiple of the allocator's alignment.
    #[error("address {addr:#x} is not aligned to {align:#x}")]
    Unaligned {
        /// The offending address.
        addr: u64,
        /// The alignment it should have had.
        align: u64,
    },

    /// The address is already free: a double free, or a use of memory after its free.
    #[error("address {addr:#x} is already free (double free or use after free)")]
    DoubleFree {
        /// The first offending address, in the allocator's unit.
        addr: u64,
    },

    /// The requested size (or another numeric parameter) is unusable.
    #[error("invalid size {size}: {reason}")]
    InvalidSize {
        /// The offending value.
        size: u64,
        /// Why it is unusable.
        reason: &'static str,
    },

    /// A page size that is not a power of two between 64 KiB and 2 MiB.
    #[error("invalid page size {bytes} bytes: must be a power of two from 64 KiB to 2 MiB")]
    InvalidPageSize {
        /// The refused page size, in bytes.
        bytes: u64,
    },

    /// No compaction can produce the requested contiguous free run.
    #[error("cannot compact a free run of {frames} frames: {reason}")]
    CompactionImpossible {
        /// The run length that was asked for, in frames.
        frames: u64,
        /// Why no plan exists.
        reason: &'static str,
    },

    /// The frame is leased (pinned, e.g. by an in-flight transfer) and may not be freed or
    /// moved until every lease is released.
    #[error("frame {frame} is leased and cannot be freed or moved")]
    FrameLeased {
        /// The leased frame.
        frame: u32,
    },

    /// An unlease of a frame that holds no lease.
    #[error("frame {frame} is not leased")]
    NotLeased {
        /// The frame.
        frame: u32,
    },

    /// The unit at `addr` is already in use, so an exact placement cannot take it.
    #[error("address {addr:#x} is already in use")]
    InUse {
        /// The first used unit in the requested range, in the allocator's unit.
        addr: u64,
    },

    /// A constructor was given a configuration that cannot describe a working allocator.
    #[error("invalid allocator configuration: {reason}")]
    InvalidConfig {
        /// What is wrong with it.
        reason: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_readable() {
        let e = AllocError::OutOfMemory { requested: 4, available: 3, largest_free: 2 };
        assert_eq!(e.to_string(), "out of memory: requested 4 units, 3 available, largest free extent 2");
        let e = AllocError::QuotaExceeded { tenant: TenantId(7), tier: Tier::Gpu, limit: 100, used: 90, requested: 20 };
        assert_eq!(e.to_string(), "quota exceeded for tenant 7 on tier gpu: limit 100 bytes, 90 used, 20 requested");
        assert_eq!(
            AllocError::Unaligned { addr: 0x1001, align: 0x1000 }.to_string(),
            "address 0x1001 is not aligned to 0x1000"
        );
        assert_eq!(
            AllocError::InvalidPageSize { bytes: 3 }.to_string(),
            "invalid page size 3 bytes: must be a power of two from 64 KiB to 2 MiB"
        );
        assert_eq!(AllocError::FrameLeased { frame: 9 }.to_string(), "frame 9 is leased and cannot be freed or moved");
    }
}
