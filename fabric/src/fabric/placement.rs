//! What a region's placement says, asked by the agent: its tenant, how its pages are stored, and where this
//! node leases them to serve them to another node; and where one page's copies are, with each copy's bytes,
//! for tools that follow a page down the tiers.

use vfabric_allocator::{Compression, Location, TenantId};
use vfabric_transport::storage::AlignedBuffer;

use super::{compressed, lock, packed, Fabric, Region};
use crate::directory::{Copy, Directory, PageEntry, Placement};
use crate::error::FabricError;

impl Fabric {
    /// Every live region of this node, with the tenant it is charged to.
    pub fn regions(&self) -> Vec<(Region, TenantId)> {
        lock(&self.inner.state).dir.regions().map(|r| (r.handle, r.placement.tenant)).collect()
    }

    /// A live region's placement: what it named, with the device new pages go to now (a migration on this node
    /// moves it).
    pub fn placement_of(&self, region: &Region) -> Result<Placement, FabricError> {
        let st = lock(&self.inner.state);
        let mut p = st.dir.region(region)?.placement;
        p.device = Some(st.dir.home_of(region)?);
        Ok(p)
    }

    /// The tenant a region is charged to (what its placement named).
    pub fn tenant_of(&self, region: &Region) -> Result<TenantId, FabricError> {
        Ok(lock(&self.inner.state).dir.region(region)?.placement.tenant)
    }

    /// Where this node leases a region's pages to serve them to another node (whose lease then reads or writes
    /// them here): host memory; for a lossy region, whose pages host memory holds packed, its home GPU (or this
    /// node's first), where they are expanded, so that they cross the wire as values. A lossy region on a node
    /// without GPUs is served from host memory, which refuses the lease (`PackedInHost`).
    pub fn serving_device(&self, region: &Region) -> Result<Location, FabricError> {
        let st = lock(&self.inner.state);
        if !st.dir.region(region)?.placement.compression.is_lossy() {
            return Ok(Location::Host);
        }
        let gpus = st.dir.locations().into_iter().filter(|l| matches!(l, Location::Gpu(_)));
        Ok(match st.dir.home_of(region)? {
            home @ Location::Gpu(_) => home,
            _ => gpus.into_iter().next().unwrap_or(Location::Host),
        })
    }

    /// How a region's pages are stored (what its placement named): a copy of it on another node, a standby or
    /// the destination of a migration, is stored the same way.
    pub fn compression_of(&self, region: &Region) -> Result<Compression, FabricError> {
        Ok(lock(&self.inner.state).dir.region(region)?.placement.compression)
    }

    /// Where the page of a region at byte `offset` has copies now, the owner's first: GPUs, host memory, the
    /// compressed or packed tier, the storage tier (none for a page never written or acquired, which reads as
    /// zeros). A look for tools and demos: it moves nothing and leaves the page's place in the eviction order
    /// as it was; a copy a prefetch is still making is not listed until it has arrived.
    pub fn page_copies(&self, region: &Region, offset: u64) -> Result<Vec<Location>, FabricError> {
        let st = lock(&self.inner.state);
        let locations = st.dir.locations();
        let entry = page_entry(&st.dir, region, offset)?;
        Ok(entry.copies().map(|c| locations[usize::from(c.dev)]).collect())
    }

    /// Reads the copy held on `location` of the page of a region at byte `offset` into `buf` (a page's bytes,
    /// expanded where the copy is stored packed), so that a caller can check that every copy of a page holds the
    /// same bytes. Like [`Fabric::page_copies`], it moves nothing, leaves the eviction order as it was and counts
    /// no traffic. Refused with `DeviceUnavailable` when the page has no copy on `location`, with
    /// `LeasedElsewhere` while the page is leased for writing (its bytes are changing), and with `OutOfBounds`
    /// when `buf` is not a page long.
    pub fn read_copy(
        &self,
        region: &Region,
        offset: u64,
        location: Location,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        let ps = self.inner.page_size;
        if buf.len() as u64 != ps {
            return Err(FabricError::OutOfBounds { offset, len: buf.len() as u64, region_len: region.len });
        }
        let st = lock(&self.inner.state);
        let dir = &st.dir;
        let entry = page_entry(dir, region, offset)?;
        if entry.write_leased {
            let how = "for writing".to_string();
            return Err(FabricError::LeasedElsewhere { region: region.to_string(), page: offset / ps, how });
        }
        let dev = dir.dev(location)?;
        let Copy { frame, .. } = entry.copy_on(dev).ok_or(FabricError::DeviceUnavailable(location))?;
        let lossy = dir.region(region)?.placement.compression.lossy();
        match location {
            Location::Storage => {
                let storage = self
                    .inner
                    .storage
                    .as_ref()
                    .ok_or(FabricError::Internal("a copy names a storage tier this node has not"))?;
                let mut page = AlignedBuffer::new(ps as usize)
                    .ok_or(FabricError::Internal("no memory for a page read from the storage tier"))?;
                storage.read(&mut [(u64::from(frame), &mut page[..])])?;
                match lossy {
                    Some(l) => buf.copy_from_slice(&packed::expand(l, &page, ps)),
                    None => buf.copy_from_slice(&page),
                }
            }
            Location::Compressed => compressed::expand(self.arena_at(dir, location)?.as_ref(), frame, buf)?,
            _ => {
                let arena = self.arena_at(dir, location)?;
                let at = u64::from(frame) * location.frame_bytes(ps);
                match lossy {
                    // Host memory holds a lossy region's pages packed.
                    Some(l) if location.is_host_memory() => {
                        let mut page = vec![0u8; l.packed_len(ps) as usize];
                        arena.read(at, &mut page)?;
                        buf.copy_from_slice(&packed::expand(l, &page, ps));
                    }
                    _ => arena.read(at, buf)?,
                }
            }
        }
        Ok(())
    }
}

/// The directory entry of the page of a live region at byte `offset`.
fn page_entry<'a>(dir: &'a Directory, region: &Region, offset: u64) -> Result<&'a PageEntry, FabricError> {
    let r = dir.region(region)?;
    let i = usize::try_from(offset / dir.page_size()).unwrap_or(usize::MAX);
    r.pages.get(i).ok_or(FabricError::OutOfBounds { offset, len: 1, region_len: region.len })
}
