//! Joining channels between this node's GPUs and peers' (`super::channels` keeps them): the node that wants a
//! peer's pages makes the channel, joins it as rank 0 and asks the peer to join it as rank 1
//! (`Message::ChannelJoin` over their QUIC connection); both joins run at once, each waiting for the other.

use std::time::Duration;

use vfabric_transport::{ChannelId, Location};

use super::channels::Link;
use super::shared::Agent;
use crate::error::{FabricError, ProtocolError};
use crate::proto::convert::unexpected;
use crate::proto::message::Message;

/// How long a join waits for the other end.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

impl Agent {
    /// The channel from this node's `gpu` to `peer`, joined now when there is none (`Err`: why there is none,
    /// for the route's reason).
    pub(crate) async fn channel_to(&self, peer: u16, gpu: u16) -> Result<Link, String> {
        let channels = &self.shared.channels;
        if let Some(known) = channels.to(peer, gpu) {
            return known;
        }
        let one = channels.join_lock(peer, gpu);
        let _one = one.lock().await;
        if let Some(known) = channels.to(peer, gpu) {
            return known;
        }
        match self.join_channel(peer, gpu).await {
            Ok(link) => {
                tracing::info!(peer, gpu, link = link.link, "joined an NCCL channel: leases' pages move GPU to GPU");
                channels.joined(peer, gpu, &link);
                Ok(link)
            }
            Err(e) => {
                let why = format!("joining an NCCL channel with node {peer} failed: {e}");
                tracing::warn!(peer, gpu, error = %e, "joining an NCCL channel failed: leases' pages go by QUIC");
                channels.failed(peer, gpu, None, why.clone());
                Err(why)
            }
        }
    }

    /// Forgets a channel to `peer` that failed mid-lease (it was aborted, or cannot be trusted to pair what comes
    /// next), so that leases go by QUIC until a join is tried again.
    pub(crate) fn channel_failed(&self, peer: u16, gpu: u16, link: u64, why: &str) {
        let why = format!("the NCCL channel with node {peer} failed: {why}");
        self.shared.channels.failed(peer, gpu, Some(link), why);
    }

    /// Makes a channel, joins it here as rank 0 and has `peer` join it as rank 1 (both at once: each waits for
    /// the other).
    async fn join_channel(&self, peer: u16, gpu: u16) -> Result<Link, FabricError> {
        let f = self.shared.fabric.clone();
        let id = f.channel_id()?;
        let link = self.request_id();
        let msg = Message::ChannelJoin { link, id: id.0.to_vec(), gpu };
        let here = tokio::task::spawn_blocking(move || f.join_channel(gpu, &id, (0, 2), JOIN_TIMEOUT));
        // If the peer refuses, this end's join times out on its own thread and goes.
        match self.call(peer, &msg, &[]).await? {
            Message::Done => {}
            m => return Err(unexpected(peer, &m)),
        }
        let channel = here.await.map_err(|_| FabricError::Internal("a channel's join thread failed"))??;
        Ok(Link { link, channel: std::sync::Arc::new(tokio::sync::Mutex::new(channel)) })
    }

    /// Joins, as rank 1, the channel `peer` made (`Message::ChannelJoin`), on this node's first GPU.
    pub(crate) async fn join_peer_channel(
        &self,
        peer: u16,
        (link, their_gpu): (u64, u16),
        id: &[u8],
    ) -> Result<Message, FabricError> {
        let id = ChannelId::from_bytes(id)
            .ok_or(ProtocolError::BadField { field: "ChannelJoin.id's length", value: id.len() as u64 })?;
        let Some(_place) = self.shared.channels.join_from(peer) else {
            return Err(FabricError::Unavailable(format!("a join of node {peer} is running already")));
        };
        let f = self.shared.fabric.clone();
        let gpu = f.devices().into_iter().find_map(|l| match l {
            Location::Gpu(g) => Some(g),
            _ => None,
        });
        let gpu = gpu.ok_or_else(|| FabricError::Unavailable("this node has no GPU for a channel".into()))?;
        let channel = tokio::task::spawn_blocking(move || f.join_channel(gpu, &id, (1, 2), JOIN_TIMEOUT))
            .await
            .map_err(|_| FabricError::Internal("a channel's join thread failed"))?
            // No NCCL here, or the join failed: the peer's pages go by QUIC, and it says why.
            .map_err(|e| FabricError::Unavailable(format!("node {} cannot join the channel: {e}", self.node())))?;
        self.shared.channels.accept(peer, link, their_gpu, channel, gpu);
        tracing::info!(peer, link, gpu, "a peer joined an NCCL channel: its leases' pages move GPU to GPU");
        Ok(Message::Done)
    }
}
