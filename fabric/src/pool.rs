//! A pool of one device's memory for many allocations of any size, as a tensor allocator needs: small ones
//! packed inside slabs of pages, large ones in regions of their own, every block at a device pointer that stays
//! put while it lives. The regions come from a [`PoolSource`]: the fabric in this process, or (through an
//! attached client) the node's agent.
//!
//! A region takes whole pages (64 KiB to 2 MiB), so a region per tensor would hold a 2 MiB page for a 4-byte
//! tensor. The pool instead takes regions of `slab_bytes` and hands out ranges of them (512-byte aligned,
//! best fit, neighbours merged on free: the allocator crate's [`RangeAllocator`]); an allocation of
//! `large_bytes` or more gets a region of its own, rounded to whole pages. Each slab and large region is held
//! under a write lease for as long as it is in the pool, which keeps its pages on the device at fixed
//! addresses (what a caller of a CUDA allocator expects); a slab that empties is given back at once, except one
//! kept for the next allocation. A freed large region is kept too, up to `cache_bytes` of them (and a fortieth of
//! the bytes allocated), for the next
//! allocation of the same rounded size (a training step frees and asks again for the same activations): taking
//! and giving back a region costs tens of microseconds, reusing one nothing. The kept regions go back when an
//! allocation would otherwise find the device full.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use vfabric_allocator::{AllocError, Fit, Location, RangeAllocator};

use crate::directory::{Mode, Placement};
use crate::error::FabricError;
use crate::fabric::{Fabric, Lease, LeasePtr, Region};
use crate::proto::message::ErrorKind;

/// Where a pool takes its regions: the fabric in this process, or the node's agent through an attached client
/// (so the ranks of a node allocate from the memory their agent owns). A source offers the four calls below;
/// taking a region under a write lease in one run of frames, and giving it back, are written once on top.
pub trait PoolSource {
    /// What holds a region's pages at their addresses.
    type Lease;
    /// The page size of the regions.
    fn page_size(&self) -> u64;
    /// A new region of `bytes` placed on `device`.
    fn alloc_region(&self, bytes: u64, device: Location) -> Result<Region, FabricError>;
    /// A write lease on the whole region on `device`.
    fn lease_region(&self, region: &Region, device: Location) -> Result<Self::Lease, FabricError>;
    /// Where the lease's pages are, in this process.
    fn lease_ptr(lease: &Self::Lease) -> &LeasePtr;
    /// Releases a lease.
    fn release_lease(&self, lease: Self::Lease) -> Result<(), FabricError>;
    /// Frees a region.
    fn free_region(&self, region: &Region) -> Result<(), FabricError>;

    /// A region of `bytes` on `device` under a write lease, and the device address of its first byte in this
    /// process (its pages in one run of frames; a device too fragmented for one is full for the pool).
    fn take(&self, bytes: u64, device: Location) -> Result<(Region, Self::Lease, u64), FabricError> {
        let region = self.alloc_region(bytes, device)?;
        let lease = match self.lease_region(&region, device) {
            Ok(l) => l,
            Err(e) => {
                let _ = self.free_region(&region);
                return Err(e);
            }
        };
        match Self::lease_ptr(&lease) {
            LeasePtr::Contiguous { ptr, .. } => {
                let ptr = *ptr;
                Ok((region, lease, ptr))
            }
            LeasePtr::Pages(_) => {
                let _ = self.release_lease(lease);
                let _ = self.free_region(&region);
                Err(FabricError::OutOfMemory { location: device, needed: bytes, available: 0 })
            }
        }
    }

    /// Releases the lease and frees the region.
    fn give_back(&self, region: Region, lease: Self::Lease) -> Result<(), FabricError> {
        self.release_lease(lease)?;
        self.free_region(&region)
    }
}

/// Whether `e` says the device is full, here or as the agent answered.
pub fn is_out_of_memory(e: &FabricError) -> bool {
    matches!(e, FabricError::OutOfMemory { .. } | FabricError::Remote { kind: ErrorKind::OutOfMemory, .. })
}

impl PoolSource for Fabric {
    type Lease = Lease;

    fn page_size(&self) -> u64 {
        Fabric::page_size(self)
    }

    fn alloc_region(&self, bytes: u64, device: Location) -> Result<Region, FabricError> {
        self.alloc(bytes, Placement::on(device))
    }

    fn lease_region(&self, region: &Region, device: Location) -> Result<Lease, FabricError> {
        self.acquire(region, 0..region.len, device, Mode::Write)
    }

    fn lease_ptr(lease: &Lease) -> &LeasePtr {
        lease.ptr()
    }

    fn release_lease(&self, lease: Lease) -> Result<(), FabricError> {
        self.release(lease)
    }

    fn free_region(&self, region: &Region) -> Result<(), FabricError> {
        self.free(region)
    }
}

/// How a [`TensorPool`] takes memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// The device.
    pub device: Location,
    /// Bytes of each slab (a multiple of the page size).
    pub slab_bytes: u64,
    /// Allocations of this many bytes or more get a region of their own.
    pub large_bytes: u64,
    /// Alignment (and rounding) of allocations inside slabs: a power of two.
    pub align: u64,
    /// Bytes of freed large regions kept for reuse.
    pub cache_bytes: u64,
}

impl PoolConfig {
    /// Slabs of 32 MiB (or 16 pages, if more), allocations of a quarter slab or more in regions of their own,
    /// 512-byte alignment (what PyTorch's caching allocator rounds to), up to 512 MiB of freed large regions kept.
    pub fn new(source: &impl PoolSource, device: Location) -> Self {
        let ps = source.page_size();
        let slab_bytes = (32u64 << 20).max(16 * ps).div_ceil(ps) * ps;
        PoolConfig { device, slab_bytes, large_bytes: slab_bytes / 4, align: 512, cache_bytes: 512 << 20 }
    }
}

/// What the pool holds and hands out, now and at its peaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    /// Bytes asked for by the live allocations.
    pub allocated: u64,
    /// Bytes of the regions the pool holds (slabs and large regions).
    pub reserved: u64,
    /// The most `allocated` has been.
    pub peak_allocated: u64,
    /// The most `reserved` has been.
    pub peak_reserved: u64,
    /// Slabs held.
    pub slabs: usize,
    /// Large regions held.
    pub large: usize,
    /// Allocations made since the pool began.
    pub allocations: u64,
    /// Large regions kept after their blocks were freed, and their bytes (part of `reserved`).
    pub cached: usize,
    /// Bytes of the kept large regions.
    pub cached_bytes: u64,
    /// Large allocations served by a kept region.
    pub cache_hits: u64,
}

/// A region held under a write lease, at a fixed device pointer.
struct Held<L> {
    region: Region,
    lease: L,
    ptr: u64,
}

struct Slab<L> {
    held: Held<L>,
    ranges: RangeAllocator,
}

/// One device's memory for many allocations; see the module's docs. Not thread-safe by itself: callers from
/// several threads put it behind a lock.
pub struct TensorPool<S: PoolSource = Fabric> {
    source: S,
    config: PoolConfig,
    /// Slabs by their first device address.
    slabs: BTreeMap<u64, Slab<S::Lease>>,
    /// Large regions by their device address.
    large: HashMap<u64, Held<S::Lease>>,
    /// Freed large regions kept for reuse, by size.
    cache: BTreeMap<u64, Vec<Held<S::Lease>>>,
    /// The bytes asked for by each live allocation, by its address.
    sizes: HashMap<u64, u64>,
    stats: PoolStats,
}

impl<S: PoolSource> TensorPool<S> {
    /// A pool on `source` as `config` says; it takes no memory until the first allocation.
    pub fn new(source: S, config: PoolConfig) -> Result<TensorPool<S>, FabricError> {
        let ps = source.page_size();
        if config.slab_bytes == 0 || config.slab_bytes % ps != 0 || !config.align.is_power_of_two() {
            return Err(FabricError::InvalidAddress(format!(
                "a pool needs slabs of whole pages of {ps} bytes and a power-of-two alignment: {config:?}"
            )));
        }
        Ok(TensorPool {
            source,
            config,
            slabs: BTreeMap::new(),
            large: HashMap::new(),
            cache: BTreeMap::new(),
            sizes: HashMap::new(),
            stats: PoolStats::default(),
        })
    }

    /// The pool's figures.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// A block of `size` bytes on the pool's device; returns its device address, valid until [`TensorPool::free`].
    pub fn alloc(&mut self, size: u64) -> Result<u64, FabricError> {
        if size == 0 {
            return Err(FabricError::InvalidAddress("an allocation of 0 bytes".into()));
        }
        let ptr = match size >= self.config.large_bytes {
            true => self.alloc_large(size)?,
            false => self.alloc_small(size)?,
        };
        self.sizes.insert(ptr, size);
        self.stats.allocated += size;
        self.stats.allocations += 1;
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
        Ok(ptr)
    }

    /// Gives a block back.
    pub fn free(&mut self, ptr: u64) -> Result<(), FabricError> {
        let size = self
            .sizes
            .remove(&ptr)
            .ok_or_else(|| FabricError::InvalidAddress(format!("{ptr:#x} is not a live block of this pool")))?;
        self.stats.allocated -= size;
        if let Some(held) = self.large.remove(&ptr) {
            self.stats.large -= 1;
            let len = held.region.len;
            // Kept within the configured bytes and a fortieth of what is allocated, so the pool holds at most
            // 2.5% more than its blocks need for them.
            let room = self.config.cache_bytes.min(self.stats.allocated / 40);
            if self.stats.cached_bytes + len <= room {
                self.cache.entry(len).or_default().push(held);
                self.stats.cached += 1;
                self.stats.cached_bytes += len;
                return Ok(());
            }
            return self.give_back(held);
        }
        let (&base, slab) =
            self.slabs.range_mut(..=ptr).next_back().ok_or(FabricError::Internal("a pool block outside its slabs"))?;
        slab.ranges.free(ptr - base).map_err(|_| FabricError::Internal("a pool block its slab does not know"))?;
        if slab.ranges.live_count() == 0 && self.slabs.values().filter(|s| s.ranges.live_count() == 0).count() > 1 {
            // Keep one empty slab for the next allocation; give the others back.
            if let Some(s) = self.slabs.remove(&base) {
                self.stats.slabs -= 1;
                return self.give_back(s.held);
            }
        }
        Ok(())
    }

    fn alloc_small(&mut self, size: u64) -> Result<u64, FabricError> {
        // The slab whose best-fitting hole is the tightest would pack best; the first that fits is close and
        // cheap (slabs are few).
        for (&base, slab) in self.slabs.iter_mut() {
            match slab.ranges.alloc(size) {
                Ok(r) => return Ok(base + r.start),
                Err(AllocError::OutOfMemory { .. }) => continue,
                Err(e) => return Err(FabricError::InvalidAddress(e.to_string())),
            }
        }
        let held = self.hold(self.config.slab_bytes)?;
        let mut ranges = RangeAllocator::new(self.config.slab_bytes, self.config.align, Fit::BestFit)
            .map_err(|e| FabricError::InvalidAddress(e.to_string()))?;
        let r = ranges.alloc(size).map_err(|e| FabricError::InvalidAddress(e.to_string()))?;
        let base = held.ptr;
        self.slabs.insert(base, Slab { held, ranges });
        self.stats.slabs += 1;
        Ok(base + r.start)
    }

    fn alloc_large(&mut self, size: u64) -> Result<u64, FabricError> {
        let ps = self.source.page_size();
        let bytes = size.div_ceil(ps) * ps;
        let kept = self.cache.get_mut(&bytes).and_then(Vec::pop);
        let held = match kept {
            Some(h) => {
                self.stats.cached -= 1;
                self.stats.cached_bytes -= bytes;
                self.stats.cache_hits += 1;
                h
            }
            None => self.hold(bytes)?,
        };
        let ptr = held.ptr;
        self.large.insert(ptr, held);
        self.stats.large += 1;
        Ok(ptr)
    }

    /// A region of `bytes` on the device under a write lease, in one run of frames; when the device is full,
    /// the kept large regions go back first and it tries again.
    fn hold(&mut self, bytes: u64) -> Result<Held<S::Lease>, FabricError> {
        match self.take_region(bytes) {
            Err(e) if is_out_of_memory(&e) && !self.cache.is_empty() => {
                self.drop_cache()?;
                self.take_region(bytes)
            }
            other => other,
        }
    }

    /// Gives every kept large region back.
    fn drop_cache(&mut self) -> Result<(), FabricError> {
        let kept: Vec<Held<S::Lease>> = std::mem::take(&mut self.cache).into_values().flatten().collect();
        self.stats.cached = 0;
        self.stats.cached_bytes = 0;
        kept.into_iter().try_for_each(|h| self.give_back(h))
    }

    fn take_region(&mut self, bytes: u64) -> Result<Held<S::Lease>, FabricError> {
        let (region, lease, ptr) = self.source.take(bytes, self.config.device)?;
        self.stats.reserved += bytes;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
        Ok(Held { region, lease, ptr })
    }

    fn give_back(&mut self, held: Held<S::Lease>) -> Result<(), FabricError> {
        self.stats.reserved -= held.region.len;
        self.source.give_back(held.region, held.lease)
    }
}

impl<S: PoolSource> Drop for TensorPool<S> {
    fn drop(&mut self) {
        let held: Vec<Held<S::Lease>> = self
            .slabs
            .split_off(&0)
            .into_values()
            .map(|s| s.held)
            .chain(self.large.drain().map(|(_, h)| h))
            .chain(std::mem::take(&mut self.cache).into_values().flatten())
            .collect();
        for h in held {
            if let Err(e) = self.give_back(h) {
                tracing::warn!(error = %e, "giving a pool's region back failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClusterConfig;
    use crate::units::ByteSize;
    use vfabric_transport::Backend;

    fn fabric() -> Fabric {
        let mut c = ClusterConfig::embedded_local();
        c.device.backend = Backend::Emulated;
        c.memory.page_size = ByteSize(64 << 10);
        c.memory.gpu_budget = Some(ByteSize(64 << 20));
        Fabric::embedded(&c).expect("fabric")
    }

    #[test]
    fn small_blocks_share_slabs_and_large_ones_get_regions() {
        let f = fabric();
        let g = Location::Gpu(0);
        let mut cfg = PoolConfig::new(&f, g);
        cfg.slab_bytes = 1 << 20;
        cfg.large_bytes = 256 << 10;
        cfg.cache_bytes = 0;
        let mut p = TensorPool::new(f.clone(), cfg).expect("pool");
        let small: Vec<u64> = (0..100).map(|i| p.alloc(4 + i * 100).expect("small")).collect();
        let s = p.stats();
        assert_eq!((s.slabs, s.large, s.reserved), (1, 0, 1 << 20), "a hundred small blocks in one slab");
        // Distinct, aligned, non-overlapping, and writable through the fabric's device pointers.
        let mut sorted = small.clone();
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|w| w[1] - w[0] >= 512) && sorted.iter().all(|p| p % 512 == 0));
        let big = p.alloc(300 << 10).expect("large");
        assert_eq!((p.stats().large, p.stats().reserved), (1, (1 << 20) + (320 << 10)), "rounded to whole pages");
        f.fill_device(g, big, 300 << 10, 7).expect("the large block is device memory");
        let mut b = [0u8; 4];
        f.read_device(g, big + (300 << 10) - 4, &mut b).expect("read");
        assert_eq!(b, [7; 4]);
        assert_eq!(p.stats().allocated, (0..100).map(|i| 4 + i * 100).sum::<u64>() + (300 << 10));
        // Frees: the large region goes at once; the slab stays (the one empty slab kept).
        p.free(big).expect("free large");
        for ptr in small {
            p.free(ptr).expect("free small");
        }
        let s = p.stats();
        assert_eq!((s.allocated, s.large, s.slabs, s.reserved), (0, 0, 1, 1 << 20));
        assert_eq!(s.peak_allocated, (0..100).map(|i| 4 + i * 100).sum::<u64>() + (300 << 10));
        assert!(matches!(p.free(12345), Err(FabricError::InvalidAddress(_))), "an unknown block");
        assert!(matches!(p.alloc(0), Err(FabricError::InvalidAddress(_))));
        drop(p);
        assert_eq!(f.stats().directory.regions, 0, "the pool gave every region back");
    }

    #[test]
    fn a_second_empty_slab_is_given_back() {
        let f = fabric();
        let mut cfg = PoolConfig::new(&f, Location::Gpu(0));
        cfg.slab_bytes = 1 << 20;
        cfg.large_bytes = 1 << 20;
        let mut p = TensorPool::new(f.clone(), cfg).expect("pool");
        let a = p.alloc(700 << 10).expect("a");
        let b = p.alloc(700 << 10).expect("b: a second slab");
        assert_eq!(p.stats().slabs, 2);
        p.free(a).expect("free a");
        assert_eq!(p.stats().slabs, 2, "one empty slab is kept");
        p.free(b).expect("free b");
        assert_eq!((p.stats().slabs, p.stats().reserved), (1, 1 << 20), "the second empty one goes");
        assert_eq!(p.stats().peak_reserved, 2 << 20);
    }

    #[test]
    fn freed_large_regions_are_kept_for_the_same_size_and_given_back_when_the_device_is_full() {
        let mut c = ClusterConfig::embedded_local();
        c.device.backend = Backend::Emulated;
        c.memory.page_size = ByteSize(64 << 10);
        c.memory.gpu_budget = Some(ByteSize(512 << 20));
        let f = Fabric::embedded(&c).expect("fabric");
        let mut cfg = PoolConfig::new(&f, Location::Gpu(0));
        cfg.slab_bytes = 1 << 20;
        cfg.large_bytes = 1 << 20;
        cfg.cache_bytes = 40 << 20;
        let mut p = TensorPool::new(f.clone(), cfg).expect("pool");
        // 360 MiB live: up to a fortieth of it (9 MiB) may be kept.
        let live = p.alloc(360 << 20).expect("live");
        let a = p.alloc(8 << 20).expect("a");
        p.free(a).expect("free a");
        assert_eq!((p.stats().cached, p.stats().reserved), (1, 368 << 20), "kept, still reserved");
        let b = p.alloc((8 << 20) - 100).expect("b: the same rounded size");
        assert_eq!((b, p.stats().cache_hits, p.stats().cached), (a, 1, 0), "the kept region, reused");
        p.free(b).expect("free b");
        assert_eq!(p.stats().cached, 1);
        // 360 + 8 kept + 70 MiB is more than the arena's 435 MiB outside its headroom: the kept region goes.
        let big = p.alloc(70 << 20).expect("room made by giving the kept region back");
        assert_eq!((p.stats().cached, p.stats().cached_bytes), (0, 0));
        p.free(big).expect("free big");
        assert_eq!(p.stats().cached, 0, "more than a fortieth of what is allocated: given back");
        p.free(live).expect("free live");
        drop(p);
        assert_eq!(f.stats().directory.regions, 0, "every region went back");
    }
}
