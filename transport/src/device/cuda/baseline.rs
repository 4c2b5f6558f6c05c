//! The plain copy that benchmarks put beside the movers: one `cuMemcpyPeerAsync` or `cuMemcpyAsync` call of the
//! same bytes, timed with events on its own stream.

use std::sync::Arc;
use std::time::Duration;

use super::context::GpuContext;
use super::driver::cu;
use super::node::CudaNode;
use super::stream::{Event, Stream};
use crate::device::arena::{check_bounds, Arena};
use crate::device::error::DeviceError;
use vfabric_allocator::Location;

/// One contiguous copy between two arenas.
#[derive(Debug, Clone, Copy)]
pub struct PlainCopy {
    /// Source offset.
    pub src_offset: u64,
    /// Destination offset.
    pub dst_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// Issues plain copies on streams of its own, one per GPU.
pub struct BaselineCopier {
    streams: Vec<Stream>,
    node_contexts: Vec<Arc<GpuContext>>,
}

impl BaselineCopier {
    /// Streams on every GPU of `node`.
    pub fn new(node: &CudaNode) -> Result<Self, DeviceError> {
        let mut streams = Vec::new();
        let mut node_contexts = Vec::new();
        let mut g = 0u16;
        while let Ok(ctx) = node.context(g) {
            streams.push(Stream::new(Arc::clone(ctx))?);
            node_contexts.push(Arc::clone(ctx));
            g += 1;
        }
        Ok(BaselineCopier { streams, node_contexts })
    }

    /// Copies each `(src, dst, copy)` concurrently, each as one driver call on the stream of the GPU that
    /// takes part (the source GPU for GPU-to-GPU), and returns the device time from the first start to the last
    /// end, measured on the first copy's GPU (the other streams wait on its start and it waits on their ends).
    pub fn copy(&self, copies: &[(&dyn Arena, &dyn Arena, PlainCopy)]) -> Result<Duration, DeviceError> {
        let first = copies.first().ok_or_else(|| DeviceError::InvalidArgument("no copies".into()))?;
        let gpu_of = |src: &dyn Arena, dst: &dyn Arena| src.location().gpu().or(dst.location().gpu()).unwrap_or(0);
        let g0 = usize::from(gpu_of(first.0, first.1));
        let lead = self.streams.get(g0).ok_or(DeviceError::NoSuchGpu { gpu: g0 as u16, count: self.streams.len() })?;
        let ctx0 = &self.node_contexts[g0];
        ctx0.bind()?;
        let start = Event::new(Arc::clone(ctx0), true)?;
        let end = Event::new(Arc::clone(ctx0), true)?;
        start.record(lead)?;
        let mut joins = Vec::new();
        for (src, dst, c) in copies {
            check_bounds(src.location(), src.len(), c.src_offset, c.len)?;
            check_bounds(dst.location(), dst.len(), c.dst_offset, c.len)?;
            let g = usize::from(gpu_of(*src, *dst));
            let s = self.streams.get(g).ok_or(DeviceError::NoSuchGpu { gpu: g as u16, count: self.streams.len() })?;
            let ctx = &self.node_contexts[g];
            ctx.bind()?;
            s.wait_for(&start)?;
            let (sp, dp) = (src.device_ptr() + c.src_offset, dst.device_ptr() + c.dst_offset);
            match (src.location(), dst.location()) {
                (Location::Gpu(a), Location::Gpu(b)) if a != b => {
                    let (ca, cb) = (&self.node_contexts[usize::from(a)], &self.node_contexts[usize::from(b)]);
                    // SAFETY: both ranges are inside mapped arenas (checked); the contexts are live.
                    unsafe { cu!(cuMemcpyPeerAsync(dp, cb.raw(), sp, ca.raw(), c.len as usize, s.raw()))? };
                }
                // SAFETY: as above.
                _ => unsafe { cu!(cuMemcpyAsync(dp, sp, c.len as usize, s.raw()))? },
            }
            let done = Event::new(Arc::clone(ctx), false)?;
            done.record(s)?;
            joins.push(done);
        }
        ctx0.bind()?;
        for j in &joins {
            lead.wait_for(j)?;
        }
        end.record(lead)?;
        end.synchronize()?;
        end.elapsed_since(&start)
    }
}
