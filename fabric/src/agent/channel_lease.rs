//! Leases on other nodes' pages whose pages come GPU to GPU over a channel (NCCL): the requester's side of
//! `Message::AcquireBy`. The copy is leased on this node's GPU first (its frames are where the pages land), the
//! home answers with the pieces and the pages' sums, and the pages arrive into the copy's frames; each page is
//! summed where it landed and checked against the home's sums before the lease is handed out. The channel is
//! held from the request to the last check (see `super::channels`).

use std::ops::Range;

use vfabric_allocator::Location;

use super::agent_lease::{AgentLease, CopyInFill, RemoteLease, RequestInFlight};
use super::calls::ReadInto;
use super::channel_pieces::{fit, page_addresses, runs_of, spans};
use super::channels::{exchange_timeout, Link, OwnedChannel};
use super::lane_use::LaneUse;
use super::page_route::RouteChoice;
use super::replicas::ReplicaKey;
use super::shared::{in_place, Agent};
use crate::directory::{Mode, Placement, RegionHandle as Region};
use crate::error::{FabricError, ProtocolError};
use crate::fabric::Lease;
use crate::proto::convert::unexpected;
use crate::proto::message::{ErrorKind, Message, WireRegion};
use vfabric_transport::device::page_sum::first_mismatch;
use vfabric_transport::PeerTransfer;

/// Why a lease by channel did not happen: the home's answer (the caller gets it), or the channel's failure (the
/// lease goes by QUIC instead).
pub(crate) enum ByChannel {
    Refused(FabricError),
    Failed(FabricError),
}

/// A lease asked of a home: the region, the range's pages, and where and how.
pub(crate) struct Asked<'a> {
    pub(crate) region: &'a Region,
    pub(crate) range: Range<u64>,
    pub(crate) first: u64,
    pub(crate) pages: u64,
    pub(crate) gpu: u16,
    pub(crate) mode: Mode,
}

/// A channel held by a lease from its request until its receive is posted: dropped before (the caller gave up
/// the acquire, or the home answered out of turn) it aborts this end and retires the channel, since the home may
/// have posted sends that nothing here will ever pair (every later call on it is refused, and leases go by QUIC
/// until a new channel is joined).
struct InTurn<'a> {
    agent: &'a Agent,
    home: u16,
    gpu: u16,
    link: u64,
    channel: Option<OwnedChannel>,
}

impl InTurn<'_> {
    /// The channel, still in step: the receive goes on it now.
    fn keep(mut self) -> OwnedChannel {
        self.channel.take().expect("held until kept")
    }

    /// Retires the channel now, for `why`.
    fn retire(mut self, why: &str) {
        self.abort(why);
    }

    fn abort(&mut self, why: &str) {
        if let Some(mut ch) = self.channel.take() {
            ch.abort();
            self.agent.channel_failed(self.home, self.gpu, self.link, why);
        }
    }
}

impl Drop for InTurn<'_> {
    fn drop(&mut self) {
        self.abort("a lease gave up while the home may have been sending");
    }
}

/// The most pages one lease moves over a channel: their sums must fit in one control frame (`network.max_frame`,
/// 9 bytes a page at most); a longer lease goes by QUIC.
fn most_pages(max_frame: usize) -> u64 {
    (max_frame / 16) as u64
}

impl Agent {
    /// Leases `asked` of `home` with its pages coming over `link` (see the module's docs).
    pub(crate) async fn acquire_by_channel(
        &self,
        home: u16,
        asked: Asked<'_>,
        (link, route): (Link, &RouteChoice),
        lane: &LaneUse,
    ) -> Result<AgentLease, ByChannel> {
        let (region, device, mode) = (asked.region, Location::Gpu(asked.gpu), asked.mode);
        let f = &self.shared.fabric;
        let ps = region.page_size.max(1);
        let (first, pages) = (asked.first, asked.pages);
        if pages > most_pages(self.max_frame()) {
            let why = format!("{pages} pages are more than one lease moves over a channel");
            return Err(ByChannel::Failed(FabricError::Unavailable(why)));
        }
        let full = pages * ps;
        let key: ReplicaKey = (region.addr.raw(), region.generation, first, pages, device);
        let cached = self.replicas().take(&key);
        let (copy, cached) = match cached {
            Some(r) => (r.copy, Some(r.version)),
            None => (in_place(|| self.alloc_private(full, Placement::on(device))).map_err(ByChannel::Failed)?, None),
        };
        let filling = CopyInFill::new(self, copy);
        // The pages land in the copy's frames on the GPU: leased for writing while they do.
        let local = in_place(|| f.acquire(&copy, 0..full, device, Mode::Write)).map_err(ByChannel::Failed)?;
        let addrs = page_addresses(local.ptr(), ps);
        let runs = runs_of(&addrs, ps);
        let msg = Message::AcquireBy {
            link: link.link,
            region: WireRegion::from(region),
            offset: asked.range.start,
            len: asked.range.end - asked.range.start,
            mode: mode.into(),
            cached,
            runs: runs.clone(),
        };
        let held = link.channel.lock_owned().await;
        // A lease before this one may have retired the channel while this one waited for it.
        if !self.shared.channels.current(home, asked.gpu, link.link) {
            let why = format!("the NCCL channel with node {home} was retired");
            return Err(ByChannel::Failed(FabricError::Unavailable(why)));
        }
        let turn = InTurn { agent: self, home, gpu: asked.gpu, link: link.link, channel: Some(held) };
        let request = self.request_id();
        let in_flight = RequestInFlight::new(self, home, lane.lane, request);
        let answer = self.call_read_as(request, home, lane, &msg, ReadInto::Buf { buf: &mut [], offset: 0 }, |_| 0);
        let (id, version, unchanged, pieces, sums) = match answer.await {
            Ok(Message::ChannelGranted { lease, first_page, pages: n, version, unchanged, pieces, sums })
                if first_page == first && n == pages && (cached.is_some() || !unchanged) =>
            {
                (lease, version, unchanged, pieces, sums)
            }
            Ok(m) => {
                // The home may be sending already (`turn` retires the channel as it goes).
                return Err(ByChannel::Failed(unexpected(home, &m)));
            }
            // The home knows no such channel (it restarted, or let a failed one go), or its end failed: join
            // anew, later.
            Err(e @ FabricError::Remote { kind: ErrorKind::Unavailable | ErrorKind::Internal, .. }) => {
                in_flight.claim();
                turn.retire(&e.to_string());
                return Err(ByChannel::Failed(e));
            }
            // The home could not place the range on its GPU (its pages would be served from host memory by
            // QUIC): the channel is fine, this lease goes by QUIC.
            Err(e @ FabricError::Remote { kind: ErrorKind::OutOfMemory | ErrorKind::DeviceUnavailable, .. }) => {
                in_flight.claim();
                drop(turn.keep());
                return Err(ByChannel::Failed(e));
            }
            // The home's answer about the region (out of bounds, leased elsewhere, freed, ...): the caller's.
            Err(e @ FabricError::Remote { .. }) => {
                in_flight.claim();
                drop(turn.keep());
                return Err(ByChannel::Refused(e));
            }
            // The call failed on the way (the home may be sending already: `turn` retires the channel).
            Err(e) => return Err(ByChannel::Failed(e)),
        };
        in_flight.claim();
        // From here on the grant is ours: every failure releases it at the home.
        let ch = turn.keep();
        let landed = match unchanged {
            true => Ok(local),
            // On a thread of its own (a single-threaded runtime must keep driving the connection meanwhile),
            // holding the channel and the copy's lease, which stay until the receive is done even if this call
            // is dropped meanwhile.
            false => {
                let (agent, gpu, l) = (self.clone(), asked.gpu, link.link);
                let addrs = addrs.clone();
                let landing = tokio::task::spawn_blocking(move || {
                    let mut ch = ch;
                    let r = land(&mut **ch, (&addrs, ps), &runs, (&pieces, &sums), pages);
                    if let Err(e) = &r {
                        ch.abort();
                        agent.channel_failed(home, gpu, l, &e.to_string());
                    }
                    r.map(|()| local)
                });
                landing.await.unwrap_or(Err(FabricError::Internal("a channel's receiving thread failed")))
            }
        };
        let local = match landed {
            Ok(l) => l,
            Err(e) => {
                let _ = self.call_on(home, lane, &Message::Release { lease: id }, &[]).await;
                return Err(ByChannel::Failed(e));
            }
        };
        // A read lease is handed out as one: the written copy is the pages' current bytes here.
        let local = match mode {
            Mode::Write => Ok(local),
            Mode::Read => in_place(|| {
                f.release(local)?;
                f.acquire(&copy, 0..full, device, Mode::Read)
            }),
        };
        let local: Lease = match local {
            Ok(l) => l,
            Err(e) => {
                let _ = self.call_on(home, lane, &Message::Release { lease: id }, &[]).await;
                return Err(ByChannel::Failed(e));
            }
        };
        self.count_route(home, route, if unchanged { 0 } else { full });
        Ok(RemoteLease::granted(self, (home, lane.lane, id, mode), (key, version, pages), filling.keep(), local))
    }
}

/// Receives a lease's pages into `addrs` over the channel in `pieces`, and checks each page's sum against the
/// home's. Any failure leaves the channel out of step (the home's sends unpaired, or paired with the wrong
/// receive: the home's pages are leased while they are summed and sent, so a sum that differs says the pairing
/// slipped), so the caller retires it.
fn land(
    ch: &mut dyn vfabric_transport::PeerChannel,
    (addrs, ps): (&[u64], u64),
    runs: &[u32],
    (pieces, sums): (&[u32], &[u64]),
    pages: u64,
) -> Result<(), FabricError> {
    let refused = |why: String| {
        tracing::warn!(%why, "a home's grant over a channel does not fit this end");
        FabricError::Protocol(ProtocolError::BadField { field: "ChannelGranted.pieces", value: pages })
    };
    fit(pieces, runs, pages).map_err(refused)?;
    if sums.len() as u64 != pages {
        return Err(refused(format!("{} sums for {pages} pages", sums.len())));
    }
    // The home is rank 1 of the channel this end made.
    let recvs: Vec<PeerTransfer> =
        spans(pieces).map(|(first, n)| PeerTransfer { ptr: addrs[first], len: n * ps as usize, peer: 1 }).collect();
    // SAFETY: each piece lies within one run of the copy's frames (`fit`), on the channel's GPU, leased for
    // writing by the caller (the lease travels with this call) and touched by nothing else until it returns.
    unsafe { ch.exchange(&[], &recvs, exchange_timeout(pages * ps)) }?;
    // SAFETY: as above; the receive is done.
    let here = unsafe { ch.page_sums(addrs, ps) }?;
    match first_mismatch(sums, &here) {
        None => Ok(()),
        Some(p) => Err(FabricError::Checksum(format!("page {p} of a lease came over the channel with another sum"))),
    }
}
