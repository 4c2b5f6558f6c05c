//! The emulated device: host memory standing in for GPUs, behind the same traits as CUDA.
//!
//! It exists so the fabric runs and is tested on machines without a GPU (CI among them). It is not a simulator
//! of GPU speed: its movers copy with `memcpy` on worker threads, one per queue, so completions are really
//! asynchronous and ordered per queue as on the GPU. Both engines run the same plans as on CUDA: the copy
//! engine copies the coalesced runs; the "kernel" walks the kernel's page index lists chunk by chunk, exactly as
//! `vf_page_copy` does, so index and chunking mistakes show up here too.

mod arena;
mod mover;

pub use arena::EmulatedArena;
pub use mover::EmulatedMover;

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::DeviceError;
use crate::hal::{Arena, ArenaSpec, DeviceKind, DeviceLayer, GpuInfo};
use vfabric_allocator::Location;
use crate::mover::{Mover, MoverConfig};

/// A node of emulated GPUs, each with a fixed amount of (host) memory.
pub struct EmulatedNode {
    gpus: Vec<GpuInfo>,
    used: Arc<Vec<AtomicU64>>,
}

impl EmulatedNode {
    /// The emulated "allocation granularity", as on Hopper.
    pub const GRANULARITY: u64 = 2 << 20;

    /// A node with `gpus` emulated GPUs of `memory` bytes each.
    pub fn new(gpus: u16, memory: u64) -> Self {
        let infos = (0..gpus)
            .map(|i| GpuInfo {
                index: i,
                name: "emulated GPU (host memory)".into(),
                total_memory: memory,
                multiprocessors: 0,
                granularity: Self::GRANULARITY,
                fd_export: false,
            })
            .collect();
        EmulatedNode { gpus: infos, used: Arc::new((0..gpus).map(|_| AtomicU64::new(0)).collect()) }
    }
}

impl DeviceLayer for EmulatedNode {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Emulated
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    fn nccl_available(&self) -> bool {
        false
    }

    fn create_arena(&self, spec: &ArenaSpec) -> Result<Arc<dyn Arena>, DeviceError> {
        if spec.bytes == 0 {
            return Err(DeviceError::InvalidArgument("an arena of 0 bytes".into()));
        }
        let bytes = spec.bytes.div_ceil(Self::GRANULARITY) * Self::GRANULARITY;
        let charge = match spec.location {
            Location::Gpu(g) => {
                let info =
                    self.gpus.get(usize::from(g)).ok_or(DeviceError::NoSuchGpu { gpu: g, count: self.gpus.len() })?;
                let used = &self.used[usize::from(g)];
                let mut cur = used.load(Ordering::Acquire);
                loop {
                    if cur + bytes > info.total_memory {
                        return Err(DeviceError::OutOfDeviceMemory {
                            location: spec.location,
                            requested: bytes,
                            detail: format!("{} of {} bytes of the emulated GPU in use", cur, info.total_memory),
                        });
                    }
                    match used.compare_exchange(cur, cur + bytes, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => break,
                        Err(now) => cur = now,
                    }
                }
                Some((Arc::clone(&self.used), usize::from(g), bytes))
            }
            Location::Host => None,
        };
        match EmulatedArena::new(spec.location, bytes, charge.clone()) {
            Ok(a) => Ok(Arc::new(a)),
            Err(e) => {
                if let Some((used, g, b)) = charge {
                    used[g].fetch_sub(b, Ordering::AcqRel);
                }
                Err(e)
            }
        }
    }

    fn mover(&self, config: MoverConfig) -> Result<Arc<dyn Mover>, DeviceError> {
        Ok(Arc::new(EmulatedMover::new(self.gpus.len(), config)?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
