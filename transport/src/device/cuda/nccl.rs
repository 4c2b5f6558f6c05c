//! NCCL communicators between GPUs of different processes (or nodes): a rank's end of a communicator on one GPU,
//! joined by every rank with the same [`NcclId`], and point-to-point transfers between device addresses through
//! it (`ncclSend`/`ncclRecv` in one group, on a stream of its own). Raw device addresses, not cudarc's safe
//! slices: the pages live in the node's VMM arenas.
//!
//! NCCL refuses two ranks of one communicator on the same GPU; a single rank may send to itself when the
//! matching receive is in the same group (what the one-GPU test uses). cudarc loads the library on first use
//! and panics when it is missing, so every entry checks [`super::driver::nccl_present`] first.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::nccl::{result, sys};

use super::context::GpuContext;
use super::driver::nccl_present;
use super::stream::Stream;
use crate::device::error::DeviceError;

/// A communicator's identity: made by one rank, handed to the others (over the agents' connection), 128 bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct NcclId(pub [u8; 128]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclId({:02x?}..)", &self.0[..8])
    }
}

/// NCCL's error, as a [`DeviceError`].
fn failed(call: &'static str) -> impl Fn(result::NcclError) -> DeviceError {
    move |e| DeviceError::Nccl { call, status: format!("{:?}", e.0) }
}

/// Refuses when NCCL cannot be loaded.
fn loaded() -> Result<(), DeviceError> {
    if nccl_present() {
        Ok(())
    } else {
        Err(DeviceError::NcclMissing)
    }
}

impl NcclId {
    /// A new identity (`ncclGetUniqueId`: it names this process's bootstrap address, which the other ranks dial).
    pub fn new() -> Result<NcclId, DeviceError> {
        loaded()?;
        let id = result::get_uniqueid().map_err(failed("ncclGetUniqueId"))?;
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }
}

/// The version of the NCCL library loaded (e.g. 22803 for 2.28.3).
pub fn nccl_version() -> Result<i32, DeviceError> {
    loaded()?;
    result::get_nccl_version().map_err(failed("ncclGetVersion"))
}

/// One rank's end of a communicator, on one GPU, with a stream of its own. Dropping it destroys the
/// communicator, or aborts it after a failed exchange (the other ranks' transfers with it then never complete:
/// they must abort theirs too).
pub struct PeerComm {
    comm: sys::ncclComm_t,
    stream: Stream,
    rank: usize,
    ranks: usize,
    /// An exchange failed: the communicator may hold work that never completes, so it is aborted, not destroyed.
    failed: bool,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not concurrent; every call
// here takes `&mut self`, or `&self` only for reads of plain fields.
unsafe impl Send for PeerComm {}

/// A transfer of one rank: `len` bytes at the device address `ptr`, to or from rank `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTransfer {
    /// The device address (on the communicator's GPU).
    pub ptr: u64,
    /// Bytes.
    pub len: usize,
    /// The other rank.
    pub peer: usize,
}

impl PeerComm {
    /// Joins the communicator `id` as rank `rank` of `ranks`, on `ctx`'s GPU. Blocks until every rank has joined
    /// (run it off any async runtime's workers).
    pub fn join(ctx: Arc<GpuContext>, id: &NcclId, rank: usize, ranks: usize) -> Result<PeerComm, DeviceError> {
        loaded()?;
        if ranks == 0 || rank >= ranks || ranks > i32::MAX as usize {
            return Err(DeviceError::InvalidArgument(format!("rank {rank} of {ranks}")));
        }
        let stream = Stream::new(ctx)?;
        stream.context().bind()?;
        let id = sys::ncclUniqueId { internal: id.0.map(|b| b as std::ffi::c_char) };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out pointer; the GPU's context is current, as NCCL takes the current device.
        unsafe { result::comm_init_rank(&mut comm, ranks as i32, id, rank as i32) }
            .map_err(failed("ncclCommInitRank"))?;
        Ok(PeerComm { comm, stream, rank, ranks, failed: false })
    }

    /// This end's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Sends `sends` and receives `recvs` in one group, and waits until all have landed (blocking: until every
    /// peer has posted its matching calls). Each send needs its matching receive on its peer (NCCL pairs them in
    /// the order posted).
    ///
    /// # Safety
    ///
    /// Every transfer's `ptr..ptr + len` must be device memory of the communicator's GPU, mapped until this
    /// returns, that nothing else reads (a send) or touches (a receive) meanwhile: NCCL reads and writes it
    /// as told.
    pub unsafe fn exchange(&mut self, sends: &[PeerTransfer], recvs: &[PeerTransfer]) -> Result<(), DeviceError> {
        if let Some(t) = sends.iter().chain(recvs).find(|t| t.peer >= self.ranks || t.ptr == 0) {
            return Err(DeviceError::InvalidArgument(format!("a transfer with rank {} of {}", t.peer, self.ranks)));
        }
        self.stream.context().bind()?;
        let stream = self.stream.raw() as sys::cudaStream_t;
        let u8s = sys::ncclDataType_t::ncclUint8;
        result::group_start().map_err(failed("ncclGroupStart"))?;
        let mut posted = Ok(());
        for t in sends {
            // SAFETY: the caller vouches for the address (this function's contract); the communicator is live.
            let r = unsafe { result::send(t.ptr as *const c_void, t.len, u8s, t.peer as i32, self.comm, stream) };
            posted = posted.and(r.map(|_| ()).map_err(failed("ncclSend")));
        }
        for t in recvs {
            // SAFETY: as above.
            let r = unsafe { result::recv(t.ptr as *mut c_void, t.len, u8s, t.peer as i32, self.comm, stream) };
            posted = posted.and(r.map(|_| ()).map_err(failed("ncclRecv")));
        }
        // The group is closed whatever was posted, so that NCCL's group state is left clean; and the stream is
        // waited for whatever the group end said, so that nothing it launched still uses the memory after this
        // returns.
        let ended = result::group_end().map(|_| ()).map_err(failed("ncclGroupEnd"));
        let waited = self.stream.synchronize();
        let outcome = posted.and(ended).and(waited);
        self.failed |= outcome.is_err();
        outcome
    }
}

impl Drop for PeerComm {
    fn drop(&mut self) {
        // SAFETY: the communicator is live and nothing else uses it (we own it). Destroying waits for its work;
        // after a failure that work may never complete, so it is aborted instead.
        let (call, r) = match self.failed {
            true => ("ncclCommAbort", unsafe { result::comm_abort(self.comm) }),
            false => ("ncclCommDestroy", unsafe { result::comm_destroy(self.comm) }),
        };
        if let Err(e) = r {
            tracing::warn!(call, error = ?e, "letting an NCCL communicator go failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_nccl_every_entry_is_a_typed_error() {
        // On a machine without libnccl (CI's), a typed error; with it, an identity of 128 bytes.
        match NcclId::new() {
            Err(DeviceError::NcclMissing) => {
                assert!(!nccl_present());
                assert!(matches!(nccl_version(), Err(DeviceError::NcclMissing)));
            }
            Ok(id) => assert!(nccl_present() && id.0.iter().any(|&b| b != 0)),
            Err(e) => panic!("{e}"),
        }
    }
}
