//! What one local client holds at its node's agent: its mapped leases and the regions it asked to be freed when
//! it goes. When the connection ends, however it ends (the client exited, was killed, or broke the protocol),
//! its leases are released and those regions freed, so no page stays pinned by a process that is gone.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use vfabric_allocator::Location;

use super::runner::Runner;
use super::AllocOptions;
use crate::agent::agent_lease::AgentLease;
use crate::agent::shared::{in_place, Agent};
use crate::agent::Replication;
use crate::directory::{Mode, Placement, RegionHandle as Region};
use crate::error::{FabricError, NetworkError};
use crate::fabric::{LeasePtr, Reservation};
use crate::proto::codec::write_frame_blocking as send;
use crate::proto::mapped::{send_fds, FDS_PER_MESSAGE};
use crate::proto::message::{Message, WireArena, WirePages, WireRegion};
use vfabric_allocator::TenantId;

/// One client's leases (by the ids it was given) and its regions that end with it.
#[derive(Default)]
pub(super) struct Session {
    leases: HashMap<u64, AgentLease>,
    next_lease: u64,
    owned: HashSet<Region>,
    /// Prefetch hints being carried out for this client.
    prefetching: Arc<AtomicUsize>,
    /// Its reservations, by the ids it was given (`reserve.rs`); given back when the session ends.
    pub(super) reservations: HashMap<u64, Reservation>,
    pub(super) next_reservation: u64,
    /// The tenant its calls are checked against (`tenancy.rs`); `None` for the node's operator.
    pub(super) tenant: Option<TenantId>,
}

/// Prefetch hints one client may have in flight; more are dropped (they are hints), so a client cannot pile up
/// work in the agent.
const PREFETCHES_IN_FLIGHT: usize = 4;

impl Agent {
    /// Answers `Attach`: the arenas' descriptions, then their descriptors.
    pub(super) fn attach_client(&self, s: &mut UnixStream) -> Result<(), FabricError> {
        let fabric = self.fabric();
        let exported = match fabric.export_arenas() {
            Ok(e) => e,
            Err(e) => return Ok(send(s, &crate::proto::convert::refusal(&e), self.max_frame())?),
        };
        let arenas = exported.iter().map(|e| WireArena::from(&e.share)).collect();
        let cuda = fabric.device_kind() == vfabric_transport::DeviceKind::Cuda;
        send(s, &Message::Attached { page_size: fabric.page_size(), cuda, arenas }, self.max_frame())?;
        let fds: Vec<_> = exported.iter().flat_map(|e| e.fds.iter().map(AsFd::as_fd)).collect();
        for batch in fds.chunks(FDS_PER_MESSAGE) {
            send_fds(s.as_fd(), batch).map_err(NetworkError::Io)?;
        }
        Ok(())
    }

    /// `AllocWith`: a region at this node; it ends with the client unless `keep`.
    pub(super) fn alloc_for(
        &self,
        rt: &Runner,
        session: &mut Session,
        size: u64,
        options: AllocOptions,
    ) -> Result<Message, FabricError> {
        let AllocOptions { device, priority, tenant, keep, compression, reservation, replication } = options;
        let reservation = reservation.map(|id| session.reservation(id)).transpose()?;
        let placement = Placement { device, priority, tenant, reservation, compression };
        // The cluster's `network.replicas` applies to a client's regions too, unless the client chose; a
        // tenant's standby copies are the tenant's (`place_standbys`).
        let replicas = if replication.replicas == 0 { self.shared.net.replicas } else { replication.replicas };
        let region = if replicas > 1 {
            rt.block_on(self.alloc_placed(size, placement, replication))?
        } else {
            in_place(|| self.fabric().alloc(size, placement))?
        };
        if !keep {
            session.owned.insert(region);
        }
        Ok(Message::Allocated { region: WireRegion::from(&region) })
    }

    /// `Free`: the region goes, and no longer ends with the client.
    pub(super) async fn free_for(&self, session: &mut Session, region: &Region) -> Result<Message, FabricError> {
        self.free(region).await?;
        session.owned.remove(region);
        Ok(Message::Done)
    }

    /// `AcquireMapped`: a lease held for the client, answered with where its pages are in the device's arena.
    pub(super) async fn acquire_mapped(
        &self,
        session: &mut Session,
        region: &Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<Message, FabricError> {
        let first = range.start - range.start % region.page_size.max(1);
        let lease = self.acquire(region, range, device, mode).await?;
        let local = lease.local().ok_or(FabricError::Internal("a granted lease without local pages"))?;
        let fabric = self.fabric();
        let pages = match local.ptr() {
            LeasePtr::Contiguous { ptr, len } => {
                WirePages::Run { offset: fabric.arena_offset(device, *ptr)?, len: *len }
            }
            LeasePtr::Pages(ptrs) => {
                WirePages::Pages(ptrs.iter().map(|&p| fabric.arena_offset(device, p)).collect::<Result<_, _>>()?)
            }
        };
        session.next_lease += 1;
        let id = session.next_lease;
        session.leases.insert(id, lease);
        Ok(Message::Mapped { lease: id, first, pages })
    }

    /// `Release` of one of the client's leases (only its own: ids are per connection).
    pub(super) async fn release_for(&self, session: &mut Session, lease: u64) -> Result<Message, FabricError> {
        let l = session.leases.remove(&lease).ok_or(FabricError::UnknownLease(lease))?;
        self.release(l).await?;
        Ok(Message::Done)
    }

    /// `WriteBack`: the copies to host memory of the pages only `device` holds, started on the node's fabric
    /// for a region that lives here. A region of another node keeps its pages on its home, which writes them
    /// back as it evicts: the hint has nothing to do here.
    pub(super) fn write_back_for(
        &self,
        region: &Region,
        range: Range<u64>,
        device: Location,
    ) -> Result<Message, FabricError> {
        if !self.is_me(region.addr.node().0) {
            return Ok(Message::Done);
        }
        self.fabric().write_back(region, range, device).map(|()| Message::Done)
    }

    /// `Prefetch`: for a region that lives here, the fabric's own prefetch of the range (copies started, not
    /// waited for); for another node's, a read lease taken and dropped in the background. Either way the pages
    /// are on `device` when the client asks; answered at once. A prefetch that fails (evicted pages with no room, a freed region) only
    /// logs: it was a hint; so does one beyond [`PREFETCHES_IN_FLIGHT`].
    pub(super) fn prefetch_for(
        &self,
        session: &Session,
        rt: &Runner,
        region: Region,
        range: Range<u64>,
        device: Location,
    ) {
        if self.is_me(region.addr.node().0) {
            // Here the fabric starts the copies itself and returns: no lease, no thread.
            if let Err(e) = self.fabric().prefetch(&region, range, device) {
                tracing::debug!(error = %e, "a prefetch hint was not taken");
            }
            return;
        }
        let count = Arc::clone(&session.prefetching);
        if count.fetch_add(1, Ordering::AcqRel) >= PREFETCHES_IN_FLIGHT {
            count.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!("a prefetch hint dropped: {PREFETCHES_IN_FLIGHT} already in flight for this client");
            return;
        }
        let agent = self.clone();
        rt.spawn(async move {
            let _done = Decrement(count);
            match agent.acquire(&region, range, device, Mode::Read).await {
                Ok(l) => {
                    if let Err(e) = agent.release(l).await {
                        tracing::debug!(error = %e, "releasing a prefetch's lease failed");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "a prefetch hint was not taken"),
            }
        });
    }

    /// The client is gone: its leases are released and its regions that end with it freed.
    pub(super) async fn end_session(&self, session: Session) {
        let (leases, owned) = (session.leases.len(), session.owned.len());
        // Its reservations go first: what they hold is free again for whatever comes next.
        drop(session.reservations);
        for (_, lease) in session.leases {
            if let Err(e) = self.release(lease).await {
                tracing::warn!(error = %e, "releasing a departed local client's lease failed");
            }
        }
        for region in session.owned {
            match self.free(&region).await {
                Ok(()) | Err(FabricError::UseAfterFree(_)) | Err(FabricError::DoubleFree(_)) => {}
                // This node's copies are stalled: the region goes once they land (nobody is left to retry).
                Err(FabricError::Stalled { .. }) if self.is_me(region.addr.node().0) => {
                    if let Err(e) = self.fabric().free_or_defer(&region) {
                        tracing::warn!(error = %e, "freeing a departed local client's region failed");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "freeing a departed local client's region failed"),
            }
        }
        if leases + owned > 0 {
            tracing::info!(leases, regions = owned, "a local client left: its leases released, its regions freed");
        }
    }
}

/// Counts a prefetch out when its task ends, however it ends.
struct Decrement(Arc<AtomicUsize>);

impl Drop for Decrement {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A local client's allocation options as its `AllocWith` message carries them, checked.
pub(super) fn alloc_options(
    device: Option<Location>,
    priority: u8,
    tenant: u32,
    keep: bool,
    compression: u8,
    reservation: Option<u64>,
) -> Result<AllocOptions, FabricError> {
    let priority = crate::proto::convert::priority(priority)?;
    let compression = crate::proto::convert::compression(compression)?;
    Ok(AllocOptions {
        device,
        priority,
        tenant: TenantId(tenant),
        keep,
        compression,
        reservation,
        replication: Replication::default(),
    })
}
