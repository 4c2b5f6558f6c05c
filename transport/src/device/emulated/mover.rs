//! The emulated mover: one worker thread per queue, copying with `memcpy` (and packing with the CPU's lossy codec).

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::arena::EmulatedArena;
use crate::device::arena::Arena;
use crate::device::batch::{KernelLayout, PageBatch, Plan};
use crate::device::engine::{Engine, EngineChoice};
use crate::device::error::{DeviceError, MoveError};
use crate::device::lossy;
use crate::device::mover::{prepare, prepare_coded, Coding, Execution, Mover, MoverConfig, Pending, Transfer, Way};
use vfabric_allocator::Location;

type Job = Box<dyn FnOnce() + Send>;

/// One queue: a thread that runs jobs in order.
struct Worker {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn spawn(name: String) -> Result<Self, DeviceError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .map_err(|e| DeviceError::Os { call: "spawning a mover thread", source: e })?;
        Ok(Worker { tx: Some(tx), thread: Some(thread) })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Moves pages between emulated arenas.
pub struct EmulatedMover {
    config: MoverConfig,
    workers: HashMap<(u16, Way), Mutex<Worker>>,
    gpus: usize,
    /// Bytes a second of a GPU <-> host queue (0: unpaced).
    host_link: u64,
}

impl EmulatedMover {
    pub(crate) fn new(gpus: usize, config: MoverConfig) -> Result<Self, DeviceError> {
        config.validate().map_err(|e| DeviceError::InvalidArgument(e.to_string()))?;
        let mut workers = HashMap::new();
        for g in 0..gpus.max(1) as u16 {
            for (way, name) in [(Way::Inbound, "in"), (Way::Outbound, "out"), (Way::Within, "within")] {
                workers.insert((g, way), Mutex::new(Worker::spawn(format!("vf-emu-gpu{g}-{name}"))?));
            }
        }
        Ok(EmulatedMover { config, workers, gpus, host_link: 0 })
    }

    /// Paces batches between a GPU and host memory to `bytes_per_s` (each queue, so each way): a batch takes at
    /// least its bytes over that rate, as on a PCIe link. 0 leaves them unpaced.
    pub(crate) fn with_host_link(mut self, bytes_per_s: u64) -> Self {
        self.host_link = bytes_per_s;
        self
    }
}

/// How long a batch of `bytes` between `from` and `to` takes at least on a host link of `rate` bytes a second.
fn paced(from: Location, to: Location, bytes: u64, rate: u64) -> Duration {
    let over_link = from.is_host_memory() != to.is_host_memory();
    if rate == 0 || !over_link {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(bytes as f64 / rate as f64)
}

/// Copies what the copy engine would: each run in one piece.
fn run_copy_engine(src: &EmulatedArena, dst: &EmulatedArena, plan: &Plan) {
    for r in plan.runs() {
        // SAFETY: the plan was checked against both arenas' lengths, and a batch within one arena never reads
        // a frame it writes.
        unsafe { EmulatedArena::copy(src, r.src_offset, dst, r.dst_offset, r.len) };
    }
}

/// Copies what `vf_page_copy` would, chunk by chunk in the kernel's item order.
fn run_kernel(src: &EmulatedArena, dst: &EmulatedArena, page: u64, layout: &KernelLayout) {
    let chunk = u64::from(layout.words_per_chunk) * 16;
    let cpp = u64::from(layout.chunks_per_page);
    for item in 0..layout.items {
        let (p, c) = ((item / cpp) as usize, item % cpp);
        let s = u64::from(layout.src_frames[p]) * page + c * chunk;
        let d = u64::from(layout.dst_frames[p]) * page + c * chunk;
        // SAFETY: as in `run_copy_engine`.
        unsafe { EmulatedArena::copy(src, s, dst, d, chunk) };
    }
}

/// Packs or expands each page of the plan, as `vf_lossy_pack` / `vf_lossy_unpack` would; false when an arena
/// has no host address (every emulated arena has one).
fn run_codec(src: &EmulatedArena, dst: &EmulatedArena, plan: &Plan, coding: Coding) -> bool {
    let layout = plan.kernel_layout(1);
    let page = plan.page_size() as usize;
    let (src_stride, dst_stride) =
        (src.location().frame_bytes(plan.page_size()) as usize, dst.location().frame_bytes(plan.page_size()) as usize);
    let (Some(s), Some(d)) = (src.host_ptr(), dst.host_ptr()) else { return false };
    for (&sf, &df) in layout.src_frames.iter().zip(&layout.dst_frames) {
        // A packed page is shorter than a page, and its frame (a slot of the packed tier) may be too.
        let (from_len, to_len) = match coding {
            Coding::Pack(l) => (page, l.packed_len(plan.page_size()) as usize),
            Coding::Unpack(l) => (l.packed_len(plan.page_size()) as usize, page),
        };
        // SAFETY: the plan was checked against the frames each arena holds at its stride, and the packed side's
        // frames hold a packed page (`prepare_coded`); a batch names each destination frame once, and a batch
        // within one arena never reads a frame it writes: the two do not overlap.
        let (from, to) = unsafe {
            (
                std::slice::from_raw_parts(s.add(sf as usize * src_stride), from_len),
                std::slice::from_raw_parts_mut(d.add(df as usize * dst_stride), to_len),
            )
        };
        match coding {
            Coding::Pack(l) => lossy::pack(l, from, to),
            Coding::Unpack(l) => lossy::unpack(l, from, to),
        }
    }
    true
}

type Slot = Arc<(Mutex<Option<Result<Duration, MoveError>>>, Condvar)>;

/// What a queued batch does.
#[derive(Clone, Copy)]
enum Work {
    /// Copies, with this engine.
    Copy(Engine),
    /// Packs or expands.
    Code(Coding),
}

const OURS: fn(&dyn Arena) -> bool = |a| a.as_any().is::<EmulatedArena>();

impl EmulatedMover {
    /// Queues `plan` on its execution's worker.
    fn queue(
        &self,
        src: &Arc<dyn Arena>,
        dst: &Arc<dyn Arena>,
        plan: Plan,
        exec: Execution,
        work: Work,
    ) -> Result<Transfer, MoveError> {
        let worker = self
            .workers
            .get(&(exec.gpu, exec.way))
            .ok_or(DeviceError::NoSuchGpu { gpu: exec.gpu, count: self.gpus })?;
        let slot: Slot = Arc::new((Mutex::new(None), Condvar::new()));
        let (s, d, job_slot, job_plan) = (Arc::clone(src), Arc::clone(dst), Arc::clone(&slot), plan.clone());
        let blocks = exec.blocks;
        let least = paced(src.location(), dst.location(), plan.bytes(), self.host_link);
        let job: Job = Box::new(move || {
            let t = Instant::now();
            let (sa, da) =
                match (s.as_any().downcast_ref::<EmulatedArena>(), d.as_any().downcast_ref::<EmulatedArena>()) {
                    (Some(a), Some(b)) => (a, b),
                    _ => return,
                };
            match work {
                Work::Copy(Engine::CopyEngine) => run_copy_engine(sa, da, &job_plan),
                Work::Copy(Engine::SmKernel) => {
                    run_kernel(sa, da, job_plan.page_size(), &job_plan.kernel_layout(blocks))
                }
                Work::Code(c) => {
                    if !run_codec(sa, da, &job_plan, c) {
                        let (m, cv) = &*job_slot;
                        let gone = DeviceError::InvalidArgument("an emulated arena without a host address".into());
                        *m.lock().unwrap_or_else(|p| p.into_inner()) = Some(Err(gone.into()));
                        cv.notify_all();
                        return;
                    }
                }
            }
            let (m, cv) = &*job_slot;
            // The queue is busy for as long as the link would be (the next batch on it waits, as on a stream).
            if let Some(rest) = least.checked_sub(t.elapsed()) {
                std::thread::sleep(rest);
            }
            *m.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ok(t.elapsed()));
            cv.notify_all();
        });
        let sent = worker.lock().unwrap_or_else(|p| p.into_inner()).tx.as_ref().map(|tx| tx.send(job).is_ok());
        if sent != Some(true) {
            return Err(MoveError::WorkerGone);
        }
        Ok(Transfer::new(Box::new(EmulatedPending { slot, done: false }), exec, &plan))
    }
}

impl Mover for EmulatedMover {
    fn submit(
        &self,
        src: &Arc<dyn Arena>,
        dst: &Arc<dyn Arena>,
        batch: &PageBatch,
        engine: EngineChoice,
    ) -> Result<Transfer, MoveError> {
        let (plan, exec) = prepare(src.as_ref(), dst.as_ref(), batch, engine, &self.config, OURS)?;
        self.queue(src, dst, plan, exec, Work::Copy(exec.engine))
    }

    fn submit_coded(
        &self,
        src: &Arc<dyn Arena>,
        dst: &Arc<dyn Arena>,
        batch: &PageBatch,
        coding: Coding,
    ) -> Result<Transfer, MoveError> {
        let (plan, exec) = prepare_coded(src.as_ref(), dst.as_ref(), batch, coding, &self.config, OURS)?;
        self.queue(src, dst, plan, exec, Work::Code(coding))
    }

    fn config(&self) -> &MoverConfig {
        &self.config
    }
}

struct EmulatedPending {
    slot: Slot,
    done: bool,
}

impl EmulatedPending {
    fn take(&mut self, block: bool) -> Result<Option<Duration>, MoveError> {
        let (m, cv) = &*self.slot;
        let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.take() {
                self.done = true;
                return r.map(Some);
            }
            if self.done {
                return Ok(None);
            }
            if !block {
                return Ok(None);
            }
            // The worker always fills the slot, unless its job was dropped unrun (mover gone): then the Arc
            // count tells, and waiting would never end.
            if Arc::strong_count(&self.slot) == 1 {
                return Err(MoveError::WorkerGone);
            }
            g = cv.wait_timeout(g, Duration::from_millis(50)).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

impl Pending for EmulatedPending {
    fn wait(&mut self) -> Result<Option<Duration>, MoveError> {
        self.take(true)
    }

    fn poll(&mut self) -> Result<bool, MoveError> {
        if !self.done {
            self.take(false)?;
        }
        Ok(self.done)
    }
}

impl Drop for EmulatedPending {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.take(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_batches_over_the_host_link_are_paced() {
        let (g0, g1, h) = (Location::Gpu(0), Location::Gpu(1), Location::Host);
        assert_eq!(paced(g0, h, 2_000_000, 1_000_000_000), Duration::from_millis(2));
        assert_eq!(paced(h, g1, 500_000, 1_000_000_000), Duration::from_micros(500));
        assert_eq!(paced(g0, g1, 2_000_000, 1_000_000_000), Duration::ZERO, "between GPUs");
        assert_eq!(paced(g0, g0, 2_000_000, 1_000_000_000), Duration::ZERO, "within a GPU");
        assert_eq!(paced(h, h, 2_000_000, 1_000_000_000), Duration::ZERO, "within host memory");
        assert_eq!(paced(g0, h, 2_000_000, 0), Duration::ZERO, "unpaced");
    }
}
