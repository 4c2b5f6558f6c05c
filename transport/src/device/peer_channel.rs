//! Channels between one of this node's GPUs and a GPU of another process, on this machine or another: each end
//! joins with the same [`ChannelId`] (one end makes it and hands it over the agents' connection) and then moves
//! bytes between raw device addresses of the two ends ([`PeerChannel::exchange`]), and sums pages where they lie
//! ([`PeerChannel::page_sums`], the same sums as [`super::page_sum`]) so that what crossed is checked without
//! leaving device memory. The CUDA backend's channels are NCCL communicators ([`super::cuda::nccl`]); a backend
//! without them refuses to make one ([`super::layer::DeviceLayer::join_channel`]).

use std::time::Duration;

use super::error::DeviceError;

/// A channel's identity: made by one end, handed to the others, 128 bytes (NCCL's unique id: it names the
/// bootstrap address of the end that made it, which the others dial).
#[derive(Clone, PartialEq, Eq)]
pub struct ChannelId(pub [u8; 128]);

impl std::fmt::Debug for ChannelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChannelId({:02x?}..)", &self.0[..8])
    }
}

impl ChannelId {
    /// The identity in `bytes`, which must be exactly 128 long (what a peer sent).
    pub fn from_bytes(bytes: &[u8]) -> Option<ChannelId> {
        Some(ChannelId(bytes.try_into().ok()?))
    }
}

/// A transfer of one end: `len` bytes at the device address `ptr`, to or from rank `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTransfer {
    /// The device address (on the channel's GPU).
    pub ptr: u64,
    /// Bytes.
    pub len: usize,
    /// The other end's rank.
    pub peer: usize,
}

/// One end of a channel, on one GPU of this node.
pub trait PeerChannel: Send {
    /// The GPU this end is on.
    fn gpu(&self) -> u16;

    /// This end's rank.
    fn rank(&self) -> usize;

    /// Sends `sends` and receives `recvs` (each send needs its matching receive at its peer, paired in the order
    /// posted) and waits until all have landed, or until `timeout` has passed: then the channel is broken (its
    /// work aborted, every later call refused) and the error says so. A broken channel stays broken: join anew.
    ///
    /// # Safety
    ///
    /// Every transfer's `ptr..ptr + len` must be device memory of the channel's GPU, mapped until this returns,
    /// that nothing else reads (a send) or touches (a receive) meanwhile.
    unsafe fn exchange(
        &mut self,
        sends: &[PeerTransfer],
        recvs: &[PeerTransfer],
        timeout: Duration,
    ) -> Result<(), DeviceError>;

    /// Aborts the channel now (its work ends, every later call is refused): what an end does when it can no
    /// longer tell whether the other end's calls pair with its own.
    fn abort(&mut self);

    /// The sum of each page of `page_len` bytes at the device addresses `pages` (a multiple of 16 bytes), as
    /// [`super::page_sum::page_sum`] gives for the same bytes.
    ///
    /// # Safety
    ///
    /// Every `page..page + page_len` must be device memory of the channel's GPU, mapped until this returns, that
    /// nothing writes meanwhile.
    unsafe fn page_sums(&mut self, pages: &[u64], page_len: u64) -> Result<Vec<u64>, DeviceError>;
}
