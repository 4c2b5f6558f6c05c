//! Leases whose pages cross a channel GPU to GPU, as the home serves them (`Message::AcquireBy`): the range is
//! leased on the GPU of this end of the channel, each page summed there, `ChannelGranted` says how the pages come
//! (pieces that fit both ends' memory, and the sums) and the pages follow over the channel. The channel is held
//! from the sums to the last send, so leases on one channel never interleave.

use std::sync::Arc;

use vfabric_transport::{Location, PeerTransfer};

use super::channel_pieces::{page_addresses, pieces, runs_of, spans};
use super::channels::exchange_timeout;
use super::serve_pages::{lease_for_peer, let_go, record_grant};
use super::shared::Agent;
use crate::error::{FabricError, ProtocolError};
use crate::proto::codec::write_frame;
use crate::proto::convert::refusal;
use crate::proto::message::{Message, WireMode, WireRegion};
use crate::proto::quic::{abort, answer};

/// What a peer's `AcquireBy` asks.
pub(crate) struct AcquireBy<'a> {
    pub(crate) link: u64,
    pub(crate) region: &'a WireRegion,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) mode: WireMode,
    pub(crate) cached: Option<u64>,
    pub(crate) runs: &'a [u32],
}

/// Serves `peer`'s `AcquireBy` (see the module's docs). A refusal before the grant is an `Error` answer; a
/// channel that fails while the pages cross is aborted and forgotten here (the peer's end fails too, and its
/// lease with it).
pub(crate) async fn grant_by_channel(
    agent: &Agent,
    (peer, connection, request): (u16, usize, Option<u64>),
    ask: AcquireBy<'_>,
    send: &mut quinn::SendStream,
) -> Result<(), ProtocolError> {
    let max = agent.max_frame();
    let Some((channel, gpu)) = agent.shared.channels.from(peer, ask.link) else {
        let e = FabricError::Unavailable(format!("no channel {} from node {peer} joins this node", ask.link));
        answer(send, &refusal(&e), max).await;
        return Ok(());
    };
    let f = &agent.shared.fabric;
    let asked = (ask.region, ask.offset, ask.len, ask.mode);
    let (version, lease) = match lease_for_peer(agent, asked, |_| Ok(Location::Gpu(gpu))).await {
        Ok(v) => v,
        Err(e) => {
            answer(send, &refusal(&e), max).await;
            return Ok(());
        }
    };
    let ps = f.page_size();
    let (pages, first_page) = (lease.len() / ps, lease.offset() / ps);
    let unchanged = ask.cached == Some(version);
    let addrs = page_addresses(lease.ptr(), ps);
    let cut = match pieces(&runs_of(&addrs, ps), ask.runs, pages) {
        Ok(p) => p,
        Err(why) => {
            drop(lease);
            let e = ProtocolError::BadField { field: "AcquireBy.runs", value: ask.runs.len() as u64 };
            tracing::warn!(peer, %why, "a peer's runs do not describe its lease");
            answer(send, &refusal(&FabricError::Protocol(e)), max).await;
            return Ok(());
        }
    };
    // From the sums to the last send, the channel is this lease's; the waits run on a thread of their own (a
    // single-threaded runtime must keep driving the connection meanwhile).
    let ch = channel.lock_owned().await;
    let (ch, sums) = match unchanged {
        true => (ch, Ok(Vec::new())),
        false => {
            let a = addrs.clone();
            let summed = tokio::task::spawn_blocking(move || {
                let mut ch = ch;
                // SAFETY: the addresses are the lease's pages on the channel's GPU; the lease is held by this
                // call (not yet granted, so no one else can end it) until the sums are in.
                let r = unsafe { ch.page_sums(&a, ps) };
                (ch, r)
            });
            match summed.await {
                Ok(done) => done,
                Err(_) => return Ok(()),
            }
        }
    };
    let sums = match sums {
        Ok(s) => s,
        Err(e) => {
            // This end of the channel failed (an earlier exchange broke it): the peer joins anew.
            drop(lease);
            drop(ch);
            agent.shared.channels.forget(peer, ask.link);
            let e = FabricError::Unavailable(format!("channel {} from node {peer} failed here: {e}", ask.link));
            answer(send, &refusal(&e), max).await;
            return Ok(());
        }
    };
    let id = agent.shared.next_grant.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let granted =
        Message::ChannelGranted { lease: id, first_page, pages, version, unchanged, pieces: cut.clone(), sums };
    // Whoever ends the lease while its pages are being sent (the peer's release or abandon, its connection
    // closing) waits for the send to end first.
    let busy = Arc::new(tokio::sync::Mutex::new(()));
    let sending = Arc::clone(&busy).lock_owned().await;
    if !record_grant(agent, (peer, connection, request), id, (lease, Some(busy))) {
        abort(send);
        return Ok(());
    }
    if write_frame(send, &granted, max).await.is_err() {
        drop(sending);
        let_go(agent, id);
        return Ok(());
    }
    let _ = send.finish();
    if unchanged {
        return Ok(());
    }
    // This end is rank 1 of the channel; the requester, rank 0, made it.
    let sends: Vec<PeerTransfer> =
        spans(&cut).map(|(first, n)| PeerTransfer { ptr: addrs[first], len: n * ps as usize, peer: 0 }).collect();
    let timeout = exchange_timeout(pages * ps);
    let sent = tokio::task::spawn_blocking(move || {
        let mut ch = ch;
        // SAFETY: each piece lies within one run of the lease's frames (`pieces`), on the channel's GPU; the
        // lease stays granted until the send ends (`sending`, dropped after it).
        let r = unsafe { ch.exchange(&sends, &[], timeout) };
        if r.is_err() {
            ch.abort();
        }
        drop(sending);
        r
    });
    if let Ok(Err(e)) = sent.await {
        tracing::warn!(peer, link = ask.link, lease = id, error = %e, "sending a lease's pages over a channel failed");
        agent.shared.channels.forget(peer, ask.link);
        let_go(agent, id);
    }
    Ok(())
}
