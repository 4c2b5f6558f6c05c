//! Streams and events.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;

use super::context::GpuContext;
use super::driver::{cu, error};
use crate::device::error::DeviceError;

/// A non-blocking stream of one GPU (it does not synchronise with the legacy default stream).
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    ctx: Arc<GpuContext>,
}

// SAFETY: CUDA streams may be used from any thread; enqueueing is thread-safe in the driver.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream on the context's GPU.
    pub fn new(ctx: Arc<GpuContext>) -> Result<Self, DeviceError> {
        ctx.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer and a context is current.
        unsafe { cu!(cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32))? };
        Ok(Stream { raw, ctx })
    }

    /// The raw handle, for driver calls.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Waits until all work queued on the stream is done.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        // SAFETY: the stream is live.
        unsafe { cu!(cuStreamSynchronize(self.raw)) }
    }

    /// Makes later work on this stream wait for `event` (which may belong to another GPU).
    pub fn wait_for(&self, event: &Event) -> Result<(), DeviceError> {
        // SAFETY: both handles are live.
        unsafe { cu!(cuStreamWaitEvent(self.raw, event.raw, 0)) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: created once, destroyed once; the driver lets queued work finish first.
        if let Err(e) = unsafe { cu!(cuStreamDestroy_v2(self.raw)) } {
            tracing::warn!(error = %e, "destroying a stream failed");
        }
    }
}

/// An event: a marker in a stream that can be waited on and, when timed, measures device time between two.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<GpuContext>,
}

// SAFETY: CUDA events may be recorded, queried and synchronised from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event on the context's GPU; `timed` events can measure elapsed time.
    pub fn new(ctx: Arc<GpuContext>, timed: bool) -> Result<Self, DeviceError> {
        ctx.bind()?;
        let flags =
            if timed { sys::CUevent_flags::CU_EVENT_DEFAULT } else { sys::CUevent_flags::CU_EVENT_DISABLE_TIMING };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer and a context is current.
        unsafe { cu!(cuEventCreate(&mut raw, flags as u32))? };
        Ok(Event { raw, ctx })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<(), DeviceError> {
        // SAFETY: both handles are live.
        unsafe { cu!(cuEventRecord(self.raw, stream.raw)) }
    }

    /// Blocks until the work before the event is done.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        // SAFETY: the event is live.
        unsafe { cu!(cuEventSynchronize(self.raw)) }
    }

    /// Whether the work before the event is done.
    pub fn is_done(&self) -> Result<bool, DeviceError> {
        // SAFETY: the event is live.
        let r = unsafe { sys::cuEventQuery(self.raw) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(error("cuEventQuery", other)),
        }
    }

    /// Device time from `start` to `self`; both must be timed, recorded and complete.
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration, DeviceError> {
        let mut ms: f32 = 0.0;
        // SAFETY: both events are live; the cuda-13000 bindings name the call `_v2`.
        unsafe { cu!(cuEventElapsedTime_v2(&mut ms, start.raw, self.raw))? };
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: created once, destroyed once.
        if let Err(e) = unsafe { cu!(cuEventDestroy_v2(self.raw)) } {
            tracing::warn!(error = %e, "destroying an event failed");
        }
    }
}
