//! Leases on other nodes' pages: the home leases its copy (in host memory; a lossy region's on its GPU) for
//! this node and sends the pages, which land in a private region on this node's device (the copy), leased
//! here; a `Write` lease's pages go back at release. Copies are kept after release ([`super::replicas`]) and
//! reused while the home's version is unchanged. Where an NCCL channel joins this node's GPU and the home's,
//! the pages cross it instead (`super::channel_lease`), and by QUIC when it fails.

use std::ops::Range;

use vfabric_allocator::Location;

use super::agent_lease::{AgentLease, CopyInFill, RemoteLease, RequestInFlight};
use super::calls::ReadInto;
use super::channel_lease::{Asked, ByChannel};
use super::lane_use::LaneUse;
use super::page_route::{PageRoute, RouteChoice};
use super::replicas::{Replica, ReplicaKey};
use super::shared::{in_place, Agent};
use crate::directory::{Mode, Placement, RegionHandle as Region};
use crate::error::FabricError;
use crate::proto::convert::unexpected;
use crate::proto::message::{Message, WireRegion};

impl Agent {
    /// Acquires `range` of a peer's region (its home region: the pages are there) on `device` of this node,
    /// over `lane`.
    pub(crate) async fn acquire_remote(
        &self,
        region: Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
        lane: LaneUse,
    ) -> Result<AgentLease, FabricError> {
        let (region, home) = (&region, region.addr.node().0);
        let len = range.end.checked_sub(range.start).filter(|&l| l > 0 && range.end <= region.len).ok_or(
            FabricError::OutOfBounds {
                offset: range.start,
                len: range.end.saturating_sub(range.start),
                region_len: region.len,
            },
        )?;
        let ps = region.page_size.max(1);
        let first = range.start / ps;
        let pages = (range.start + len).div_ceil(ps) - first;
        let key: ReplicaKey = (region.addr.raw(), region.generation, first, pages, device);
        let full = pages * ps;
        // Over a channel GPU to GPU when one joins the two ends (joined now if that is all NCCL lacks), by QUIC
        // otherwise or when the channel fails.
        let route = match self.route_for_lease(home, device).await {
            (route, Some(link)) => {
                let Location::Gpu(gpu) = device else { unreachable!("channels are joined for GPUs only") };
                let asked = Asked { region, range: range.clone(), first, pages, gpu, mode };
                match self.acquire_by_channel(home, asked, (link, &route), &lane).await {
                    Ok(l) => return Ok(l),
                    Err(ByChannel::Refused(e)) => return Err(e),
                    Err(ByChannel::Failed(e)) => {
                        tracing::warn!(home, error = %e, "a lease over an NCCL channel failed: its pages come by QUIC");
                        let why = format!("a lease over the NCCL channel with node {home} failed: {e}");
                        RouteChoice { route: PageRoute::Quic, why }
                    }
                }
            }
            (route, None) => route,
        };
        let f = &self.shared.fabric;
        // The copy the pages go into, straight from the wire: one from an earlier lease (taken out of the cache
        // while this lease uses it; its version tells the home whether to send the pages at all), or a new one.
        let cached = self.replicas().take(&key);
        let (copy, cached) = match cached {
            Some(r) => (r.copy, Some(r.version)),
            None => (in_place(|| self.alloc_private(full, Placement::on(device)))?, None),
        };
        // Freed on every way out but the lease, a caller dropping this call at an await included.
        let filling = CopyInFill::new(self, copy);
        let msg = Message::Acquire {
            region: WireRegion::from(region),
            offset: range.start,
            len,
            device: device.into(),
            mode: mode.into(),
            cached,
        };
        let expect = |m: &Message| if matches!(m, Message::Granted { unchanged: true, .. }) { 0 } else { full };
        let into = ReadInto::Region { copy: &copy, offset: first * ps };
        let request = self.request_id();
        let asked = RequestInFlight::new(self, home, lane.lane, request);
        let (id, version, moved) = match self.call_read_as(request, home, &lane, &msg, into, expect).await {
            Ok(Message::Granted { lease, first_page, pages: n, version, unchanged })
                if first_page == first && n == pages && (cached.is_some() || !unchanged) =>
            {
                (lease, version, if unchanged { 0 } else { full })
            }
            // Whatever arrived of the pages is not to be trusted: the copy goes (`filling`).
            Ok(m) => return Err(unexpected(home, &m)),
            Err(e) => {
                // A refusal is the home's answer: it granted nothing, and there is nothing to abandon.
                if matches!(e, FabricError::Remote { .. }) {
                    asked.claim();
                }
                return Err(e);
            }
        };
        // From here on the grant is the lease's, or released below.
        asked.claim();
        match in_place(|| f.acquire(&copy, 0..full, device, mode)) {
            Ok(l) => {
                // Counted once the lease is made: a copy kept from an earlier lease and still current moved
                // nothing.
                self.count_route(home, &route, moved);
                Ok(RemoteLease::granted(self, (home, lane.lane, id, mode), (key, version, pages), filling.keep(), l))
            }
            Err(e) => {
                drop(filling);
                let _ = self.call_on(home, &lane, &Message::Release { lease: id }, &[]).await;
                Err(e)
            }
        }
    }

    /// Releases a lease on a peer's pages: a `Write` lease's pages go back to the home first; the copy is kept
    /// for the next lease of the range.
    pub(crate) async fn release_remote(&self, mut r: RemoteLease) -> Result<(), FabricError> {
        r.released = true;
        let (f, copy, local, mode) = (&self.shared.fabric, r.copy, r.local.take(), r.mode);
        let bytes = in_place(|| {
            if let Some(l) = local {
                f.release(l)?;
            }
            let mut v = Vec::new();
            if mode == Mode::Write {
                v = vec![0u8; copy.len as usize];
                f.read(&copy, 0, &mut v)?;
            }
            Ok(v)
        });
        let (home, id) = (r.home, r.id);
        let released = match bytes {
            Ok(bytes) => match self.hold_lane(home, r.lane) {
                Ok(lane) => {
                    let release = Message::Release { lease: id };
                    let agent = self.clone();
                    let call = async move { agent.call_on(home, &lane, &release, &bytes).await };
                    self.on_lane(r.lane, copy.len * u64::from(mode == Mode::Write), call).await
                }
                Err(e) => Err(e),
            },
            Err(e) => {
                if let Ok(lane) = self.hold_lane(home, r.lane) {
                    let _ = self.call_on(home, &lane, &Message::Release { lease: id }, &[]).await;
                }
                Err(e)
            }
        };
        match released {
            Ok(Message::Done) => {
                if mode == Mode::Write {
                    // The pages went home from host memory (read out of the copy).
                    let route = self.route_to(home, Location::Host).await;
                    self.count_route(home, &route, copy.len);
                }
                let version = version_after_release(r.version, r.pages, mode == Mode::Write);
                self.keep_replica(r.key, Replica { copy, version });
                Ok(())
            }
            other => {
                let _ = in_place(|| self.free_private(&copy));
                match other {
                    Ok(m) => Err(unexpected(home, &m)),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Keeps a copy for the next lease of the same range, freeing the copies that no longer fit.
    fn keep_replica(&self, key: ReplicaKey, replica: Replica) {
        let dropped = self.replicas().keep(key, replica);
        for r in dropped {
            if let Err(e) = in_place(|| self.free_private(&r)) {
                tracing::warn!(region = %r, error = %e, "freeing a dropped replica failed");
            }
        }
    }
}

/// The version of a leased range of `pages` pages, granted at `version`, once its lease is released: a write
/// lease's release moves each page's version on by one at the home (the range's version is their sum), a read
/// lease's changes nothing. The copy kept after a release carries it (`fabric/tests/lease_model.rs` checks
/// that a copy kept so is current exactly when the home's version matches).
pub fn version_after_release(version: u64, pages: u64, write: bool) -> u64 {
    if write {
        version.wrapping_add(pages)
    } else {
        version
    }
}
