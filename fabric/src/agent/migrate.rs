//! Regions of this node that move: to another device of this node, or to another node's device while keeping
//! their address and their home (the home keeps a forwarding entry, `super::forwarding`). Each step holds the
//! region's guard there, so no write lands in pages being copied away.

use tokio::sync::OwnedRwLockReadGuard;
use vfabric_allocator::Location;

use super::acting;
use super::replication::{Kept, Replication};
use super::shared::{in_place, Agent};
use crate::directory::RegionHandle as Region;
use crate::error::FabricError;
use crate::proto::convert::unexpected;
use crate::proto::message::{Message, WireRegion};

impl Agent {
    /// See [`Moves::staying`]; a replicated region is served only while its standbys answer
    /// ([`Agent::check_home`]).
    pub(crate) async fn staying(&self, region: &Region) -> Result<OwnedRwLockReadGuard<Option<Region>>, FabricError> {
        self.may_touch(region)?;
        self.check_home(region).await?;
        self.shared.moves.staying(region).await
    }

    /// Frees a region of this node: its hosted copy too when it moved, and its standby copies when it is
    /// replicated (when it is itself a standby copy, it is one no longer).
    pub(crate) async fn free_at_home(&self, region: &Region) -> Result<(), FabricError> {
        self.may_touch(region)?;
        self.free_pages_at_home(region).await?;
        self.free_standbys(region).await;
        self.shared.backups.forget_copy(region);
        Ok(())
    }

    async fn free_pages_at_home(&self, region: &Region) -> Result<(), FabricError> {
        let mut entry = self.shared.moves.entry(region).write_owned().await;
        match *entry {
            None => in_place(|| self.shared.fabric.free(region))?,
            Some(to) => self.free_direct(&to).await?,
        }
        // Callers that waited on this entry now go to the fabric, which says the region is gone.
        *entry = None;
        self.shared.moves.forget(region);
        Ok(())
    }

    /// Moves a region of this node to `device` of `node`; returns the region that has the pages now (the region
    /// itself when they stayed on this node). Undone when any step fails, so the region is left where it was.
    pub(crate) async fn migrate_at_home(
        &self,
        region: &Region,
        node: u16,
        device: Location,
    ) -> Result<Region, FabricError> {
        self.peer_or_self(node)?;
        if !self.is_me(node) && self.shared.backups.homed(region).is_some() {
            return Err(FabricError::Unavailable(format!(
                "{region} is replicated: it stays on its home (moving a replicated region to another node is not \
                 supported yet)"
            )));
        }
        let mut entry = self.shared.moves.entry(region).write_owned().await;
        let before = *entry;
        let now = match before {
            // The pages are here: they move under this region's guard.
            None => self.move_pages(region, node, device).await?,
            // They are on another node (or in another region here): that copy's own home moves them, under its
            // guard for that copy, so writes that reach it through hints wait there and then follow it.
            Some(current) => self.migrate_hosted(&current, node, device).await?,
        };
        if now != *region {
            tracing::info!(region = %region, node, device = %device, "a region's pages moved to another node");
        }
        *entry = (now != *region).then_some(now);
        drop(entry);
        // The copy that had the pages forwarded to the new one while this entry still named it; now that it
        // names the new one, the old copy's entry may go. Only this node's own entries keep forwarding for
        // good, so a region that moves often leaves none behind.
        if let Some(old) = before.filter(|&old| old != now) {
            self.unforward(&old, &now).await;
        }
        Ok(now)
    }

    /// Has the node of `copy` (a copy that held one of this node's regions' pages and moved them on to `to`)
    /// drop its forwarding entry (`Moves::unforward`). A failure is logged: the entry only stays.
    async fn unforward(&self, copy: &Region, to: &Region) {
        let at = copy.addr.node().0;
        if self.is_me(at) {
            return self.shared.moves.unforward(copy, to).await;
        }
        let msg = Message::Unforward { region: WireRegion::from(copy), to: WireRegion::from(to) };
        match self.call(at, &msg, &[]).await {
            Ok(Message::Done) => {}
            Ok(other) => tracing::warn!(node = at, copy = %copy, error = %unexpected(at, &other), "unforward"),
            Err(e) => tracing::warn!(node = at, copy = %copy, error = %e, "the forwarding entry of a copy stays"),
        }
    }

    /// Moves the pages of `region`, which are here: a migration on this node, or a copy into a new region on
    /// `node` and this copy freed.
    async fn move_pages(&self, region: &Region, node: u16, device: Location) -> Result<Region, FabricError> {
        if self.is_me(node) {
            in_place(|| self.shared.fabric.migrate(region, device))?;
            return Ok(*region);
        }
        // The region must be live before anything is allocated for it.
        self.shared.fabric.version(region, 0..1)?;
        // The pages leave through host memory here (`copy_direct` reads them into a buffer).
        let route = self.route_to(node, Location::Host).await;
        // The copy is the region's tenant's, so that its calls are taken where the pages go.
        let tenant = self.shared.fabric.tenant_of(region)?;
        // Stored and evicted as the region is (a lossy region stays lossy where it goes).
        let p = self.shared.fabric.placement_of(region)?;
        let kept = Kept { device: Some(device), compression: p.compression, priority: p.priority };
        let alloc = self.alloc_direct(node, region.len, kept, Replication::sync(1));
        let fresh = acting::acting_for(Some(tenant), alloc).await?;
        let moved = async {
            self.copy_direct(region, &fresh, region.len).await?;
            in_place(|| self.shared.fabric.free(region))
        };
        if let Err(e) = moved.await {
            if let Err(undo) = self.free_direct(&fresh).await {
                tracing::warn!(region = %fresh, error = %undo, "freeing the copy of a failed migration failed");
            }
            return Err(e);
        }
        self.count_route(node, &route, region.len);
        Ok(fresh)
    }

    /// Asks the home of `current` (a copy that has a region's pages) to move it; returns where they are now.
    async fn migrate_hosted(&self, current: &Region, node: u16, device: Location) -> Result<Region, FabricError> {
        let at = current.addr.node().0;
        if self.is_me(at) {
            return Box::pin(self.migrate_at_home(current, node, device)).await;
        }
        let msg = Message::MigrateTo { region: WireRegion::from(current), node, device: device.into() };
        match self.call(at, &msg, &[]).await {
            // `MigrateTo` is answered with where the pages are now.
            Err(FabricError::Moved { to }) => Ok(to),
            Ok(other) => Err(unexpected(at, &other)),
            Err(e) => Err(e),
        }
    }

    /// Whether the current call may touch `region`, a region of this node (a call made for a tenant: only that
    /// tenant's; `super::acting`).
    pub(crate) fn may_touch(&self, region: &Region) -> Result<(), FabricError> {
        if acting::tenant().is_none() {
            return Ok(());
        }
        acting::may_touch(region, self.shared.fabric.tenant_of(region).ok())
    }

    fn peer_or_self(&self, node: u16) -> Result<(), FabricError> {
        if self.is_me(node) {
            return Ok(());
        }
        self.peer(node).map(|_| ())
    }
}
