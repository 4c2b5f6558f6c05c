//! The agent's API: calls on any region of the cluster, wherever its home and its pages are. A region whose
//! home is this node is served by this node's fabric; another's goes to its home, or straight to the node
//! that has its pages when a location hint says so (`super::forwarding`).

use std::ops::Range;
use std::time::{Duration, Instant};

use tokio::sync::OwnedRwLockReadGuard;
use vfabric_allocator::Location;

use super::acting;
use super::agent_lease::{AgentLease, LeaseKind};
use super::forwarding::{routed, Route};
use super::lane_use::pages_of;
use super::replication::{Kept, Replication};
use super::shared::{in_place, Agent};
use crate::directory::{Mode, RegionHandle as Region};
use crate::error::FabricError;
use crate::proto::convert::unexpected;
use crate::proto::message::{Message, WireRegion};

impl Agent {
    /// Allocates a region whose home is `node` (this one or a peer), placed on `device` of that node if given,
    /// and kept on the cluster's `network.replicas` nodes.
    pub async fn alloc(&self, node: u16, size: u64, device: Option<Location>) -> Result<Region, FabricError> {
        self.alloc_direct(node, size, Kept::on(device), Replication::default()).await
    }

    /// [`Agent::alloc`] of a region kept as `keep` says: a number of nodes (with 2, its home and a standby copy
    /// in another node's host memory, which takes over when the home dies, callers then reaching the region
    /// there with the same handle; `0` takes `network.replicas`), or a [`Replication`], which may also let the
    /// standby lag behind (writes then return before it has them).
    pub async fn alloc_replicated(
        &self,
        node: u16,
        size: u64,
        device: Option<Location>,
        keep: impl Into<Replication>,
    ) -> Result<Region, FabricError> {
        self.alloc_direct(node, size, Kept::on(device), keep.into()).await
    }

    /// [`Agent::alloc_replicated`] of a region placed as `kept` says: its device at `node`, how its pages are
    /// stored (packed on the storage tier, or, for a lossy compression, also in host memory: see
    /// `Compression`) and its eviction priority. The region keeps them wherever it goes: its standbys, the copy
    /// that takes over from a dead home, and a migration to another node store and evict its pages the same way.
    pub async fn alloc_with(
        &self,
        node: u16,
        size: u64,
        kept: Kept,
        keep: impl Into<Replication>,
    ) -> Result<Region, FabricError> {
        self.alloc_direct(node, size, kept, keep.into()).await
    }

    /// Frees a region at its home (and its pages wherever they moved); a replicated region whose home died is
    /// freed where its standby took over.
    pub async fn free(&self, region: &Region) -> Result<(), FabricError> {
        let home = region.addr.node().0;
        let freed = if self.is_me(home) {
            self.free_at_home(region).await
        } else {
            match self.call(home, &Message::Free { region: WireRegion::from(region) }, &[]).await {
                Ok(Message::Done) => Ok(()),
                Ok(other) => Err(unexpected(home, &other)),
                Err(e @ FabricError::PeerDead { .. }) => self.free_taken_over(region, e).await,
                Err(e) => Err(e),
            }
        };
        self.forget_hint(region);
        super::shared::lock(&self.shared.lossless).remove(&region.addr);
        freed
    }

    /// Frees the copy that took over from `region`'s dead home (following copies that took over from copies
    /// whose nodes died in turn); `dead` when there is none.
    async fn free_taken_over(&self, region: &Region, mut dead: FabricError) -> Result<(), FabricError> {
        let mut at = *region;
        for _ in 0..self.shared.peers.len() {
            let Some(copy) = self.fail_over(&at).await else { return Err(dead) };
            // A copy that took over here is a region of this node: freed with its standbys and its entries.
            let freed = match self.is_me(copy.addr.node().0) {
                true => self.free_at_home(&copy).await,
                false => self.free_direct(&copy).await,
            };
            match freed {
                Err(e @ FabricError::PeerDead { .. }) => (at, dead) = (copy, e),
                freed => return freed,
            }
        }
        Err(dead)
    }

    /// Writes `data` into the region at `offset`, wherever its pages are; for a replicated region, its standby
    /// has the bytes too when this returns.
    pub async fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let end = offset.saturating_add(data.len() as u64);
        routed!(self, Route::new(&self.shared.hints, region), |at| {
            match self.stay_if_here(&at).await {
                Ok(_staying) => self.written(&at, offset..end, self.write_direct(&at, offset, data)).await,
                Err(e) => Err(e),
            }
        })
    }

    /// Reads the region at `offset` into `buf`, wherever its pages are. Every byte that crossed the wire was
    /// checksummed and verified.
    pub async fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        routed!(self, Route::new(&self.shared.hints, region), |at| {
            match self.stay_if_here(&at).await {
                Ok(_staying) => self.read_direct(&at, offset, buf).await,
                Err(e) => Err(e),
            }
        })
    }

    /// Acquires `range` of a region on `device` of this node, wherever the region's home is: when it returns,
    /// the pages are on the device at the lease's pointers until [`Agent::release`]. For another node's region
    /// the home holds the matching lease on its copy meanwhile, so a `Write` lease here excludes every other
    /// lease there, and a `Read` lease excludes writers.
    pub async fn acquire(
        &self,
        region: &Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<AgentLease, FabricError> {
        // Checked against the region as its user knows it: a hosted copy may be longer (another page size).
        if range.end > region.len {
            let len = range.end.saturating_sub(range.start);
            return Err(FabricError::OutOfBounds { offset: range.start, len, region_len: region.len });
        }
        routed!(self, Route::new(&self.shared.hints, region), |at| self
            .acquire_at(&at, range.clone(), device, mode)
            .await)
    }

    /// [`Agent::acquire`] on the region that has the pages (this node's, or a peer's: then it is that peer's
    /// home region, and the pages come from there).
    async fn acquire_at(
        &self,
        region: &Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<AgentLease, FabricError> {
        let home = region.addr.node().0;
        if self.is_me(home) {
            let _staying = self.staying(region).await?;
            let l = in_place(|| self.shared.fabric.acquire(region, range, device, mode))?;
            return Ok(AgentLease { kind: LeaseKind::Local(l) });
        }
        // The pages of the range cross the wire, and come back with a write lease's release on the same lane.
        let bytes = pages_of(region.page_size, range.start, range.end.saturating_sub(range.start));
        let lane = self.take_lane(home, bytes)?;
        let (on, agent, region) = (lane.lane, self.clone(), *region);
        let call = async move { agent.acquire_remote(region, range, device, mode, lane).await };
        self.on_lane(on, bytes, call).await
    }

    /// Releases a lease from [`Agent::acquire`]; a `Write` lease's pages go back to the region's home first.
    pub async fn release(&self, lease: AgentLease) -> Result<(), FabricError> {
        match lease.kind {
            // A write lease's pages reach the region's standbys (when it has any) before the release returns.
            LeaseKind::Local(l) if l.mode() == Mode::Write => {
                let (region, range) = (l.region(), l.offset()..l.offset() + l.len());
                self.written(&region, range, async { in_place(|| self.shared.fabric.release(l)) }).await
            }
            LeaseKind::Local(l) => in_place(|| self.shared.fabric.release(l)),
            LeaseKind::Remote(r) => self.release_remote(r).await,
        }
    }

    /// Moves a region to `device` of its home node (a migration at the home: pages on the home's other GPUs
    /// move there over NVLink, those that do not fit go to host memory); pages that had moved to another node
    /// come back. The same as [`Agent::migrate_to`] the home.
    pub async fn migrate(&self, region: &Region, device: Location) -> Result<(), FabricError> {
        self.migrate_to(region, region.addr.node().0, device).await
    }

    /// Moves a region's pages to `device` of node `node`, any node of the cluster. The region keeps its address
    /// and its home: the home copies the pages there (checksummed on the wire like every page), frees its own
    /// copy and forwards later calls; callers learn the new place once and go there directly after (a location
    /// hint, corrected when it goes stale). Fails, leaving the region where it was, while a lease is held on it.
    pub async fn migrate_to(&self, region: &Region, node: u16, device: Location) -> Result<(), FabricError> {
        acting::operator_only("a migration")?;
        let home = region.addr.node().0;
        let moved = if self.is_me(home) {
            self.migrate_at_home(region, node, device).await.map(|_| ())
        } else {
            let msg = Message::MigrateTo { region: WireRegion::from(region), node, device: device.into() };
            match self.call(home, &msg, &[]).await {
                // The home answers with where the pages are now.
                Err(FabricError::Moved { .. }) => Ok(()),
                Ok(other) => Err(unexpected(home, &other)),
                Err(e) => Err(e),
            }
        };
        // Whatever this node knew of the region's place may be stale now: ask the home next time.
        self.forget_hint(region);
        moved
    }

    /// Runs `work` (calls on this agent) acting for `tenant` at every node they reach: they may touch only that
    /// tenant's regions (another tenant's, and a handle naming none, are `PermissionDenied` alike), allocate
    /// under its name, and make none of the operator's calls (migrations). A tenant's local clients act this
    /// way; a Rust caller serving tenants of its own does it with this.
    pub async fn acting_for<F: std::future::Future>(&self, tenant: vfabric_allocator::TenantId, work: F) -> F::Output {
        acting::acting_for(Some(tenant), work).await
    }

    /// Round trip to a peer's agent.
    pub async fn ping(&self, node: u16) -> Result<Duration, FabricError> {
        let t = Instant::now();
        let nonce = t.elapsed().as_nanos() as u64 ^ 0x5eed;
        let lane = self.take_lane(node, 0)?;
        let on = lane.lane;
        let (agent, ping) = (self.clone(), Message::Ping { nonce });
        match self.on_lane(on, 0, async move { agent.call_on(node, &lane, &ping, &[]).await }).await? {
            Message::Pong { nonce: n } if n == nonce => Ok(t.elapsed()),
            other => Err(unexpected(node, &other)),
        }
    }

    /// For a call on `region` when it is a region of this node: the guard that keeps it here meanwhile.
    async fn stay_if_here(&self, region: &Region) -> Result<Option<OwnedRwLockReadGuard<Option<Region>>>, FabricError> {
        match self.is_me(region.addr.node().0) {
            true => self.staying(region).await.map(Some),
            false => Ok(None),
        }
    }

    fn forget_hint(&self, region: &Region) {
        self.shared.hints.lock().unwrap_or_else(|p| p.into_inner()).remove(region);
    }
}
