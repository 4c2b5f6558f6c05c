//! Pinned staging for the kernel's page index lists. A copy to the GPU from pageable memory may make the host
//! wait for everything queued before it on the stream (the driver stages it through pinned memory of its own),
//! so a kernel launched behind long copies would hold its caller for all of them. From pinned memory the copy
//! is queued and the call returns. Each lane keeps a ring of pinned memory: an upload takes the next free
//! place, and a place is reused only once the copy that read it has run (an event recorded after it says so).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys;

use super::context::GpuContext;
use super::driver::cu;
use super::host::PinnedHostMemory;
use super::stream::{Event, Stream};
use crate::device::error::DeviceError;

/// Bytes of pinned memory per lane: index lists of thousands of pages, many launches deep.
const CAPACITY: usize = 1 << 20;

/// Where uploads go in a ring of `cap` bytes, and which earlier ones are still in flight (oldest first), each
/// with what tells when it has landed. Pure bookkeeping: the caller waits.
#[derive(Debug)]
pub(crate) struct UploadRing<T> {
    cap: usize,
    head: usize,
    live: VecDeque<(Range<usize>, T)>,
}

impl<T> UploadRing<T> {
    pub(crate) fn new(cap: usize) -> Self {
        UploadRing { cap, head: 0, live: VecDeque::new() }
    }

    /// Drops the uploads, oldest first, that `done` says have landed, up to the first that has not.
    pub(crate) fn retire<E>(&mut self, mut done: impl FnMut(&T) -> Result<bool, E>) -> Result<(), E> {
        while let Some((_, t)) = self.live.front() {
            if !done(t)? {
                break;
            }
            self.live.pop_front();
        }
        Ok(())
    }

    /// The place for `len` bytes (`None` when they do not fit the ring), after waiting with `wait` for the
    /// uploads still reading it: oldest first, so those older than the ones in the way are waited for too (a
    /// stream runs them in order, so that costs nothing more).
    pub(crate) fn place<E>(
        &mut self,
        len: usize,
        mut wait: impl FnMut(&T) -> Result<(), E>,
    ) -> Result<Option<Range<usize>>, E> {
        if len == 0 || len > self.cap {
            return Ok(None);
        }
        let start = if self.head + len <= self.cap { self.head } else { 0 };
        let range = start..start + len;
        while self.live.iter().any(|(r, _)| r.start < range.end && range.start < r.end) {
            if let Some((_, t)) = self.live.front() {
                wait(t)?;
            }
            self.live.pop_front();
        }
        Ok(Some(range))
    }

    /// Records the upload now reading `range` (from [`UploadRing::place`]).
    pub(crate) fn push(&mut self, range: Range<usize>, t: T) {
        self.head = range.end;
        self.live.push_back((range, t));
    }

    /// Uploads in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.live.len()
    }
}

/// One lane's pinned staging: memory made with the lane, and the ring over it.
pub(crate) struct IndexStaging {
    mem: PinnedHostMemory,
    ring: UploadRing<Event>,
}

impl IndexStaging {
    /// Made with the mover rather than at the first scattered copy: allocating pinned memory may synchronise the
    /// whole context, which, in the middle of an application's work in the same process, could wait for it.
    pub(crate) fn new(ctx: &Arc<GpuContext>) -> Result<Self, DeviceError> {
        Ok(IndexStaging {
            mem: PinnedHostMemory::alloc(Arc::clone(ctx), CAPACITY as u64)?,
            ring: UploadRing::new(CAPACITY),
        })
    }

    /// Queues a copy of `data` to `dst` on `stream` from pinned memory, returning at once; `false` when the
    /// list is larger than the ring (the caller copies it another way).
    pub(crate) fn upload(
        &mut self,
        ctx: &Arc<GpuContext>,
        stream: &Stream,
        dst: sys::CUdeviceptr,
        data: &[u32],
    ) -> Result<bool, DeviceError> {
        let bytes = std::mem::size_of_val(data);
        self.ring.retire(|e: &Event| e.is_done())?;
        let Some(range) = self.ring.place(bytes, |e: &Event| e.synchronize())? else { return Ok(false) };
        let mem = &self.mem;
        // SAFETY: `range` is inside the `CAPACITY` bytes of `mem` (the ring's size), no copy in flight reads it
        // (the ring waited for those that did), and `data` is `bytes` long.
        let src = unsafe {
            let at = mem.as_ptr().add(range.start);
            std::ptr::copy_nonoverlapping(data.as_ptr() as *const u8, at, bytes);
            at
        };
        // Made before the copy: once the copy is queued, its place must be recorded as read until it has run.
        let landed = Event::new(Arc::clone(ctx), false)?;
        // SAFETY: `dst` holds `bytes` (the caller reserved them in stream order); `src` stays untouched until the
        // event recorded after the copy has passed.
        unsafe { cu!(cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, stream.raw()))? };
        if let Err(e) = landed.record(stream) {
            // Without the event nothing would say when the place is free again: wait for the copy here.
            stream.synchronize()?;
            return Err(e);
        }
        self.ring.push(range, landed);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upload that has landed once the clock passes its number.
    fn ring_over(cap: usize) -> UploadRing<u32> {
        UploadRing::new(cap)
    }

    #[test]
    fn places_follow_each_other_and_wrap() {
        let mut r = ring_over(100);
        let never = |_: &u32| -> Result<(), ()> { panic!("nothing is in the way") };
        let a = r.place(40, never).unwrap().unwrap();
        r.push(a.clone(), 1);
        let b = r.place(40, never).unwrap().unwrap();
        r.push(b.clone(), 2);
        assert_eq!((a, b), (0..40, 40..80));
        // 40 more do not fit at the end: they go to the start, after the first upload has landed.
        let mut waited = Vec::new();
        let c = r.place(40, |t: &u32| -> Result<(), ()> {
            waited.push(*t);
            Ok(())
        });
        assert_eq!(c, Ok(Some(0..40)));
        assert_eq!(waited, vec![1]);
        r.push(0..40, 3);
        assert_eq!(r.in_flight(), 2);
    }

    #[test]
    fn a_place_is_reused_only_after_every_upload_reading_it() {
        let mut r = ring_over(64);
        for i in 0..4u32 {
            let p = r.place(16, |_: &u32| -> Result<(), ()> { panic!("room for four") }).unwrap().unwrap();
            r.push(p, i);
        }
        // A fifth of 32 bytes wraps to the start over the first two: both are waited for, in order.
        let mut waited = Vec::new();
        let p = r.place(32, |t: &u32| -> Result<(), ()> {
            waited.push(*t);
            Ok(())
        });
        assert_eq!(p, Ok(Some(0..32)));
        assert_eq!(waited, vec![0, 1]);
        r.push(0..32, 4);
        // Those that landed go without waiting; the first still running stops the rest.
        r.retire(|t: &u32| -> Result<bool, ()> { Ok(*t == 2) }).unwrap();
        assert_eq!(r.in_flight(), 2);
        assert_eq!(r.place(65, |_: &u32| -> Result<(), ()> { Ok(()) }), Ok(None), "larger than the ring");
        assert_eq!(r.place(0, |_: &u32| -> Result<(), ()> { Ok(()) }), Ok(None));
    }
}
