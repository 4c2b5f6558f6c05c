//! The emulated node: GPUs of host memory, each with a fixed capacity that arenas are charged against.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vfabric_allocator::Location;

use super::arena::EmulatedArena;
use super::mover::EmulatedMover;
use crate::device::arena::{Arena, ArenaSpec};
use crate::device::error::DeviceError;
use crate::device::layer::{DeviceKind, DeviceLayer, GpuInfo};
use crate::device::mover::{Mover, MoverConfig};
use crate::device::share::ArenaShare;
use std::os::fd::OwnedFd;

/// A node of emulated GPUs, each with a fixed amount of (host) memory.
pub struct EmulatedNode {
    gpus: Vec<GpuInfo>,
    used: Arc<Vec<AtomicU64>>,
    /// Bytes a second each way between a GPU and host memory (0: unpaced).
    host_link: u64,
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
        EmulatedNode { gpus: infos, used: Arc::new((0..gpus).map(|_| AtomicU64::new(0)).collect()), host_link: 0 }
    }

    /// The same node with its movers' copies between a GPU and host memory paced to `bytes_per_s` each way (a
    /// PCIe link, scaled to what this machine's memory copies can beat); 0 leaves them unpaced.
    pub fn with_host_link(mut self, bytes_per_s: u64) -> Self {
        self.host_link = bytes_per_s;
        self
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
            Location::Host | Location::Packed(_) | Location::Compressed => None,
            Location::Storage => return Err(DeviceError::NoArena(Location::Storage)),
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
        Ok(Arc::new(EmulatedMover::new(self.gpus.len(), config)?.with_host_link(self.host_link)))
    }

    fn import_arena(&self, share: &ArenaShare, fds: Vec<OwnedFd>) -> Result<Arc<dyn Arena>, DeviceError> {
        if let Location::Gpu(g) = share.location {
            self.gpus.get(usize::from(g)).ok_or(DeviceError::NoSuchGpu { gpu: g, count: self.gpus.len() })?;
        }
        Ok(Arc::new(EmulatedArena::import(share, fds)?))
    }

    fn synchronize(&self, _location: Location) -> Result<(), DeviceError> {
        // The emulated device's copies run on the mover's threads, which their callers wait for; a client
        // process queues no work of its own.
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The `Arena` trait's default `write_parts`, checked on the arenas of this node (the trait's own file may not
    // depend on a backend).
    /// An arena that keeps the trait's own `write_parts` (gather, then one write), counting its writes.
    #[derive(Debug)]
    struct Gathering {
        inner: Arc<dyn Arena>,
        writes: std::sync::atomic::AtomicUsize,
    }

    impl Arena for Gathering {
        fn location(&self) -> Location {
            self.inner.location()
        }
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn device_ptr(&self) -> u64 {
            self.inner.device_ptr()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
            self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.write(offset, data)
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), DeviceError> {
            self.inner.read(offset, out)
        }
        fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), DeviceError> {
            self.inner.fill(offset, len, byte)
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn parts_land_one_after_the_other() {
        let node = EmulatedNode::new(1, 8 << 20);
        let spec = |location| ArenaSpec { location, bytes: 2 << 20, chunk_bytes: 2 << 20 };
        let host = node.create_arena(&spec(Location::Host)).unwrap();
        let gathering = Gathering { inner: node.create_arena(&spec(Location::Gpu(0))).unwrap(), writes: 0.into() };
        let parts: [&[u8]; 4] = [b"abc", b"", b"defgh", b"ij"];
        for arena in [&*host, &gathering as &dyn Arena] {
            arena.write_parts(100, &parts).unwrap();
            let mut back = [0u8; 12];
            arena.read(99, &mut back).unwrap();
            assert_eq!(&back, b"\0abcdefghij\0");
            // Past the end: refused, and nothing of it written.
            let end = arena.len() - 4;
            let r = arena.write_parts(end, &parts);
            assert!(matches!(r, Err(DeviceError::OutOfBounds { .. })), "{r:?}");
            let mut tail = [1u8; 4];
            arena.read(end, &mut tail).unwrap();
            assert_eq!(tail, [0; 4]);
        }
        // The gathered pieces went to the device in one copy.
        assert_eq!(gathering.writes.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
