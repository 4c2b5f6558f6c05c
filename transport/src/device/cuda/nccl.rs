//! NCCL communicators between GPUs of different processes (or nodes): one end of a [`PeerChannel`] on one GPU,
//! joined by every rank with the same [`ChannelId`], moving bytes between raw device addresses
//! (`ncclSend`/`ncclRecv` in one group, on a stream of its own) and summing pages where they lie (the
//! `vf_page_sums` kernel). Raw device addresses, not cudarc's safe slices: the pages live in the node's VMM
//! arenas.
//!
//! Communicators are non-blocking (`blocking = 0`): joining and every exchange are polled against a deadline,
//! and one that passes it is aborted (`ncclCommAbort`, which also ends NCCL kernels still waiting for the other
//! end), so a peer that dies or never posts its half costs a bounded wait, never a hung thread. NCCL refuses two
//! ranks of one communicator on one GPU of one host; two processes on one GPU join when each names a different
//! host (`NCCL_HOSTID`), through NCCL's network transport. cudarc loads the library on first use and panics when
//! it is missing, so every entry checks [`super::driver::nccl_present`] first.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys as cu_sys;
use cudarc::nccl::{result, sys};

use super::context::GpuContext;
use super::driver::{cu, nccl_present};
use super::module::{Kernel, Module};
use super::stream::Stream;
use crate::device::error::DeviceError;
use crate::device::peer_channel::{ChannelId, PeerChannel, PeerTransfer};

/// The page checksum kernel, built from `kernels/page_sum.cu` with `nvcc -ptx -arch=compute_90` on the GPU
/// machine.
pub const PAGE_SUM_PTX: &str = include_str!("../../../kernels/page_sum.ptx");

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

/// A new identity (`ncclGetUniqueId`: it names this process's bootstrap address, which the other ranks dial).
pub fn new_channel_id() -> Result<ChannelId, DeviceError> {
    loaded()?;
    let id = result::get_uniqueid().map_err(failed("ncclGetUniqueId"))?;
    Ok(ChannelId(id.internal.map(|c| c as u8)))
}

/// The version of the NCCL library loaded (e.g. 22809 for 2.28.9).
pub fn nccl_version() -> Result<i32, DeviceError> {
    loaded()?;
    result::get_nccl_version().map_err(failed("ncclGetVersion"))
}

/// A communicator's configuration as `NCCL_CONFIG_INITIALIZER` makes it, non-blocking. NCCL reads as much of it
/// as its own version knows (the size comes first), so a newer layout than the library's is fine.
fn non_blocking_config(version: i32) -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: version as u32,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

/// One rank's end of a communicator, on one GPU, with a stream of its own. Dropping it destroys the
/// communicator, or aborts it after a failure (the other ranks' transfers with it then never complete: they
/// time out and abort theirs).
pub struct PeerComm {
    comm: sys::ncclComm_t,
    stream: Stream,
    sums: Kernel,
    gpu: u16,
    rank: usize,
    ranks: usize,
    /// A call failed: the communicator was aborted (null) or may hold work that never completes.
    broken: bool,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not concurrent; every call
// here takes `&mut self`, or `&self` only for reads of plain fields.
unsafe impl Send for PeerComm {}

impl PeerComm {
    /// Joins the communicator `id` as rank `rank` of `ranks`, on `ctx`'s GPU (ordinal `gpu`), waiting at most
    /// `timeout` for every rank to join (blocking: run it off any async runtime's workers).
    pub fn join(
        ctx: Arc<GpuContext>,
        gpu: u16,
        id: &ChannelId,
        (rank, ranks): (usize, usize),
        timeout: Duration,
    ) -> Result<PeerComm, DeviceError> {
        loaded()?;
        if ranks == 0 || rank >= ranks || ranks > i32::MAX as usize {
            return Err(DeviceError::InvalidArgument(format!("rank {rank} of {ranks}")));
        }
        let stream = Stream::new(Arc::clone(&ctx))?;
        let sums = Module::load_ptx(Arc::clone(&ctx), PAGE_SUM_PTX)?.kernel("vf_page_sums")?;
        stream.context().bind()?;
        let raw_id = sys::ncclUniqueId { internal: id.0.map(|b| b as std::ffi::c_char) };
        let mut config = non_blocking_config(nccl_version()?);
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` and `config` are valid pointers; the GPU's context is current, as NCCL takes the current
        // device.
        unsafe { result::comm_init_rank_config(&mut comm, ranks as i32, raw_id, rank as i32, &mut config) }
            .map_err(failed("ncclCommInitRankConfig"))?;
        let mut c = PeerComm { comm, stream, sums, gpu, rank, ranks, broken: false };
        let deadline = Instant::now() + timeout;
        c.settle("joining the communicator", deadline, timeout)?;
        Ok(c)
    }

    /// Polls the communicator until NCCL has done what it was asked (`ncclCommGetAsyncError` leaves
    /// `ncclInProgress`), aborting it on an error or at `deadline`.
    fn settle(&mut self, what: &'static str, deadline: Instant, timeout: Duration) -> Result<(), DeviceError> {
        let mut polls = 0u32;
        loop {
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: the communicator is live (not aborted: `broken` is checked by every caller first).
            let r = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
            let outcome = r.result().map_err(failed("ncclCommGetAsyncError")).and_then(|_| match state.result() {
                Ok(result::NcclStatus::InProgress) => Ok(false),
                Ok(_) => Ok(true),
                Err(e) => Err(failed(what)(e)),
            });
            match outcome {
                Ok(true) => return Ok(()),
                Ok(false) if Instant::now() < deadline => pause(&mut polls),
                Ok(false) => return Err(self.abort(DeviceError::ChannelTimeout { what, after: timeout })),
                Err(e) => return Err(self.abort(e)),
            }
        }
    }

    /// Waits until the stream has done its work, aborting the communicator at `deadline` (what ends NCCL's
    /// kernels that wait for a peer that never comes).
    fn drain(&mut self, what: &'static str, deadline: Instant, timeout: Duration) -> Result<(), DeviceError> {
        let mut polls = 0u32;
        loop {
            // SAFETY: the stream is live.
            match unsafe { cu_sys::cuStreamQuery(self.stream.raw()) } {
                cu_sys::CUresult::CUDA_SUCCESS => return Ok(()),
                cu_sys::CUresult::CUDA_ERROR_NOT_READY if Instant::now() < deadline => pause(&mut polls),
                cu_sys::CUresult::CUDA_ERROR_NOT_READY => {
                    return Err(self.abort(DeviceError::ChannelTimeout { what, after: timeout }))
                }
                other => return Err(self.abort(super::driver::error("cuStreamQuery", other))),
            }
        }
    }

    /// Aborts the communicator (its kernels end), waits for the stream, and returns `why`.
    fn abort(&mut self, why: DeviceError) -> DeviceError {
        if !self.broken {
            self.broken = true;
            // SAFETY: the communicator is live; aborted once (`broken` is now set and `comm` null).
            if let Err(e) = unsafe { result::comm_abort(self.comm) } {
                tracing::warn!(error = ?e, "aborting an NCCL communicator failed");
            }
            self.comm = std::ptr::null_mut();
            let _ = self.stream.synchronize();
        }
        why
    }

    /// Refuses every call once the communicator has failed.
    fn usable(&self) -> Result<(), DeviceError> {
        if self.broken {
            Err(DeviceError::ChannelBroken)
        } else {
            Ok(())
        }
    }

    /// Ranks in the communicator.
    pub fn ranks(&self) -> usize {
        self.ranks
    }
}

/// Between polls: spins a little (short transfers end within microseconds), then sleeps a little.
fn pause(polls: &mut u32) {
    *polls += 1;
    if *polls < 200 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Threads per block of the page-sum kernel, and the 16-byte words each thread reads at least.
const SUM_THREADS: u32 = 256;
const SUM_WORDS_PER_THREAD: u64 = 16;

impl PeerChannel for PeerComm {
    fn gpu(&self) -> u16 {
        self.gpu
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn abort(&mut self) {
        let _ = PeerComm::abort(self, DeviceError::ChannelBroken);
    }

    unsafe fn exchange(
        &mut self,
        sends: &[PeerTransfer],
        recvs: &[PeerTransfer],
        timeout: Duration,
    ) -> Result<(), DeviceError> {
        self.usable()?;
        if let Some(t) = sends.iter().chain(recvs).find(|t| t.peer >= self.ranks || t.ptr == 0) {
            return Err(DeviceError::InvalidArgument(format!("a transfer with rank {} of {}", t.peer, self.ranks)));
        }
        let deadline = Instant::now() + timeout;
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
        // The group is closed whatever was posted, so that NCCL's group state is left clean; a failure aborts the
        // communicator, whose kernels then end, so nothing still uses the memory after this returns.
        let ended = result::group_end().map(|_| ()).map_err(failed("ncclGroupEnd"));
        if let Err(e) = posted.and(ended) {
            return Err(self.abort(e));
        }
        self.settle("an exchange's launch", deadline, timeout)?;
        self.drain("an exchange", deadline, timeout)
    }

    unsafe fn page_sums(&mut self, pages: &[u64], page_len: u64) -> Result<Vec<u64>, DeviceError> {
        self.usable()?;
        if pages.is_empty() {
            return Ok(Vec::new());
        }
        if page_len == 0 || page_len % 16 != 0 {
            return Err(DeviceError::InvalidArgument(format!("pages of {page_len} bytes: not a multiple of 16")));
        }
        let per_page = (page_len / 16).div_ceil(u64::from(SUM_THREADS) * SUM_WORDS_PER_THREAD).clamp(1, 256);
        let grid = (pages.len() as u64).checked_mul(per_page).filter(|&g| g < i32::MAX as u64);
        let grid = grid.ok_or_else(|| DeviceError::InvalidArgument(format!("{} pages at once", pages.len())))?;
        let bytes = std::mem::size_of_val(pages);
        let mut out = vec![0u64; pages.len()];
        self.stream.context().bind()?;
        let s = self.stream.raw();
        let mut buf: cu_sys::CUdeviceptr = 0;
        // SAFETY: a context is current; `buf` holds both lists (addresses, then sums); the copies read `pages`
        // and write `out`, which outlive the synchronisation below; the kernel's parameters match
        // `vf_page_sums(const u64*, u64, u32, u64*)` and the caller vouches for every page's address.
        unsafe {
            cu!(cuMemAllocAsync(&mut buf, 2 * bytes, s))?;
            let run = (|| {
                cu!(cuMemcpyHtoDAsync_v2(buf, pages.as_ptr() as *const c_void, bytes, s))?;
                cu!(cuMemsetD8Async(buf + bytes as u64, 0, bytes, s))?;
                let (mut p_pages, mut p_len, mut p_per, mut p_sums) =
                    (buf, page_len, per_page as u32, buf + bytes as u64);
                let mut params: [*mut c_void; 4] = [
                    &mut p_pages as *mut u64 as *mut c_void,
                    &mut p_len as *mut u64 as *mut c_void,
                    &mut p_per as *mut u32 as *mut c_void,
                    &mut p_sums as *mut u64 as *mut c_void,
                ];
                self.sums.launch(grid as u32, SUM_THREADS, &self.stream, &mut params)?;
                cu!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut c_void, buf + bytes as u64, bytes, s))
            })();
            let freed = cu!(cuMemFreeAsync(buf, s));
            let waited = self.stream.synchronize();
            run.and(freed).and(waited)?;
        }
        Ok(out)
    }
}

impl Drop for PeerComm {
    fn drop(&mut self) {
        if self.broken {
            return;
        }
        // SAFETY: the communicator is live and nothing else uses it (we own it); its work is done (every exchange
        // drained its stream or aborted).
        if let Err(e) = unsafe { result::comm_destroy(self.comm) } {
            tracing::warn!(error = ?e, "destroying an NCCL communicator failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_nccl_every_entry_is_a_typed_error() {
        // On a machine without libnccl (CI's), a typed error; with it, an identity of 128 bytes.
        match new_channel_id() {
            Err(DeviceError::NcclMissing) => {
                assert!(!nccl_present());
                assert!(matches!(nccl_version(), Err(DeviceError::NcclMissing)));
            }
            Ok(id) => assert!(nccl_present() && id.0.iter().any(|&b| b != 0)),
            Err(e) => panic!("{e}"),
        }
    }
}
