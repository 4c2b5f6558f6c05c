//! Moving batches of pages between arenas: the engines, the policy that picks one, and completions.
//!
//! Two engines move pages. The copy engine (DMA, `cuMemcpyAsync` / `cuMemcpyBatchAsync`) leaves the SMs to the
//! job's own kernels and reaches the link's rate on long contiguous runs, but pays a cost per call, so
//! page-sized copies fall short of the link, the more so the smaller the page (docs/benchmarks.md has the
//! H200 figures). The SM gather/scatter kernel reaches the link at any page size but occupies the SMs it is
//! given while it runs. [`choose_engine`] picks per batch; [`MoverConfig`] bounds the SMs the kernel may take.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use vfabric_allocator::{Location, Lossy, LOSSY_GROUP};

use super::arena::Arena;
use super::batch::{PageBatch, Plan};
use super::engine::{Engine, EngineChoice, KernelSide};
use super::error::MoveError;

/// How a mover runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct MoverConfig {
    /// Blocks (one per SM) the kernel may take. On the H200s 16 blocks of 1024 threads pull as fast over
    /// NVLink as every SM does (docs/benchmarks.md), so the default leaves the rest to the job.
    pub sm_blocks: u32,
    /// Blocks the kernel takes for moves to or from host memory: PCIe is saturated by far fewer SMs than NVLink
    /// (on the H200s two blocks moved as much over PCIe as every SM did: docs/benchmarks.md).
    pub host_sm_blocks: u32,
    /// Threads per block (at most 1024).
    pub threads_per_block: u32,
    /// Which GPU runs the kernel between two GPUs.
    pub kernel_side: KernelSide,
    /// Batches of at most this many contiguous runs go to the copy engine under [`EngineChoice::Auto`].
    pub copy_engine_max_runs: usize,
    /// Batches between two GPUs whose runs average at least this many bytes go to the copy engine under
    /// [`EngineChoice::Auto`].
    pub copy_engine_min_run_bytes: u64,
    /// The same for batches to or from host memory. Over PCIe the copy engine keeps up with the kernel at far
    /// shorter runs: on the H200s it matched the kernel on scattered 2 MiB pages but fell well behind it on
    /// 64 KiB pages (docs/benchmarks.md).
    pub host_copy_engine_min_run_bytes: u64,
    /// The kernel's batches of at most this many pages take their page index lists as launch parameters
    /// instead of a copy to the device before the launch, which a small batch cannot hide (at most
    /// [`MAX_SHORT_LAUNCH_PAGES`]; 0 always copies them).
    pub short_launch_pages: u32,
}

/// The most pages whose index lists fit a launch's parameters (4 KiB on every CUDA version, with the others).
pub const MAX_SHORT_LAUNCH_PAGES: u32 = 480;

impl Default for MoverConfig {
    fn default() -> Self {
        MoverConfig {
            sm_blocks: 16,
            host_sm_blocks: 4,
            threads_per_block: 1024,
            kernel_side: KernelSide::Auto,
            copy_engine_max_runs: 4,
            copy_engine_min_run_bytes: 64 << 20,
            host_copy_engine_min_run_bytes: 1 << 20,
            short_launch_pages: MAX_SHORT_LAUNCH_PAGES,
        }
    }
}

impl MoverConfig {
    /// Checks the values a mover cannot run with.
    pub fn validate(&self) -> Result<(), MoverConfigError> {
        if self.sm_blocks == 0 || self.host_sm_blocks == 0 {
            return Err(MoverConfigError::NoBlocks { sm_blocks: self.sm_blocks, host_sm_blocks: self.host_sm_blocks });
        }
        if self.threads_per_block == 0 || self.threads_per_block > 1024 {
            return Err(MoverConfigError::ThreadsPerBlock(self.threads_per_block));
        }
        if self.short_launch_pages > MAX_SHORT_LAUNCH_PAGES {
            return Err(MoverConfigError::ShortLaunchPages(self.short_launch_pages));
        }
        Ok(())
    }
}

/// A [`MoverConfig`] that no mover can run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoverConfigError {
    /// The kernel would have no block to run on.
    #[error("mover.sm_blocks ({sm_blocks}) and mover.host_sm_blocks ({host_sm_blocks}) must be at least 1")]
    NoBlocks {
        /// The configured `sm_blocks`.
        sm_blocks: u32,
        /// The configured `host_sm_blocks`.
        host_sm_blocks: u32,
    },
    /// More threads per block than CUDA allows, or none.
    #[error("mover.threads_per_block ({0}) must be 1..=1024")]
    ThreadsPerBlock(u32),
    /// More pages than a launch's parameters hold.
    #[error("mover.short_launch_pages ({0}) must be at most {MAX_SHORT_LAUNCH_PAGES}")]
    ShortLaunchPages(u32),
}

/// The engine [`EngineChoice::Auto`] takes for a plan.
///
/// A few long runs go to the copy engine: one long copy reaches the link (a little faster than the kernel) and
/// leaves the SMs free. Many short runs go to the kernel, whose rate does not depend on the run length: on
/// scattered 2 MiB pages over NVLink it beat even one batched copy-engine call (docs/benchmarks.md). To or from host memory the copy engine wins from runs of about 1 MiB
/// ([`MoverConfig::host_copy_engine_min_run_bytes`]). Host-to-host moves always take the copy engine (no GPU is
/// involved to run a kernel).
pub fn choose_engine(plan: &Plan, from: Location, to: Location, config: &MoverConfig) -> Engine {
    let runs = plan.runs().len().max(1);
    if from.is_host_memory() && to.is_host_memory() {
        return Engine::CopyEngine;
    }
    let min_run = if from.is_host_memory() || to.is_host_memory() {
        config.host_copy_engine_min_run_bytes
    } else {
        config.copy_engine_min_run_bytes
    };
    if runs <= config.copy_engine_max_runs || plan.bytes() / runs as u64 >= min_run {
        Engine::CopyEngine
    } else {
        Engine::SmKernel
    }
}

/// Which way a move goes as seen from the GPU that executes it: each GPU has one queue (stream) per way, so a
/// GPU sending and receiving at once runs both concurrently, and moves within it never wait behind either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Way {
    /// The executing GPU is the destination (fetches, pulls).
    Inbound,
    /// The executing GPU is the source (evictions, write-backs, pushes).
    Outbound,
    /// Source and destination are the executing GPU (compaction, pages gathered into a lease's run): copies at
    /// the memory's speed that a caller usually waits for, so they have a queue of their own instead of
    /// waiting behind gigabytes of write-backs queued at PCIe speed.
    Within,
}

/// Where and how a batch runs: the engine, the GPU whose queue it goes on, and which of its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Execution {
    /// The engine.
    pub engine: Engine,
    /// The GPU that issues the copy or runs the kernel.
    pub gpu: u16,
    /// Which of that GPU's queues.
    pub way: Way,
    /// Blocks (SMs) the kernel takes, if the engine is the kernel.
    pub blocks: u32,
}

/// Decides the engine and the executing GPU for a move from `from` to `to`.
pub fn plan_execution(
    plan: &Plan,
    from: Location,
    to: Location,
    choice: EngineChoice,
    config: &MoverConfig,
) -> Result<Execution, MoveError> {
    let engine = match choice {
        EngineChoice::Auto => choose_engine(plan, from, to, config),
        EngineChoice::CopyEngine => Engine::CopyEngine,
        EngineChoice::SmKernel => Engine::SmKernel,
    };
    let pull = match config.kernel_side {
        KernelSide::Pull => true,
        KernelSide::Push => false,
        KernelSide::Auto => config.sm_blocks >= 16,
    };
    let (gpu, way) = match (from, to) {
        (Location::Gpu(a), Location::Gpu(b)) if a == b => (a, Way::Within),
        (Location::Gpu(a), Location::Gpu(b)) => match engine {
            Engine::SmKernel if pull => (b, Way::Inbound),
            _ => (a, Way::Outbound),
        },
        (Location::Storage, _) | (_, Location::Storage) => {
            return Err(MoveError::EngineUnavailable {
                engine,
                from,
                to,
                reason: "the storage tier has no arena: its pages move by file I/O, not by a mover",
            });
        }
        (Location::Gpu(a), _) => (a, Way::Outbound),
        (_, Location::Gpu(b)) => (b, Way::Inbound),
        _ => {
            if engine == Engine::SmKernel {
                return Err(MoveError::EngineUnavailable {
                    engine,
                    from,
                    to,
                    reason: "no GPU takes part in a host-to-host move",
                });
            }
            (0, Way::Outbound)
        }
    };
    let blocks = if from.is_host_memory() || to.is_host_memory() {
        config.sm_blocks.min(config.host_sm_blocks)
    } else {
        config.sm_blocks
    };
    Ok(Execution { engine, gpu, way, blocks })
}

/// The checks every mover makes before it queues anything: both arenas belong to it (`ours`), the batch fits
/// both, and where it runs.
pub(crate) fn prepare(
    src: &dyn Arena,
    dst: &dyn Arena,
    batch: &PageBatch,
    engine: EngineChoice,
    config: &MoverConfig,
    ours: fn(&dyn Arena) -> bool,
) -> Result<(Plan, Execution), MoveError> {
    if let Some(a) = [src, dst].into_iter().find(|a| a.location().is_packed()) {
        return Err(MoveError::EngineUnavailable {
            engine: Engine::CopyEngine,
            from: src.location(),
            to: dst.location(),
            reason: if a.location() == src.location() {
                "the packed tier's pages are expanded on their way out (a coded move)"
            } else {
                "pages go into the packed tier packed (a coded move)"
            },
        });
    }
    plan_checked(src, dst, batch, engine, config, ours)
}

/// [`prepare`] without its refusal of the packed tier: each arena's frames are its location's
/// [`Location::frame_bytes`] apart, and the batch is checked against how many of them it holds.
fn plan_checked(
    src: &dyn Arena,
    dst: &dyn Arena,
    batch: &PageBatch,
    engine: EngineChoice,
    config: &MoverConfig,
    ours: fn(&dyn Arena) -> bool,
) -> Result<(Plan, Execution), MoveError> {
    for a in [src, dst] {
        if !ours(a) {
            return Err(MoveError::ForeignArena(a.location()));
        }
    }
    let same = src.device_ptr() == dst.device_ptr();
    let ps = batch.page_size();
    // The frames each arena holds, as the bytes of as many whole pages (what the batch's check counts in).
    let span = |a: &dyn Arena| match a.location().frame_bytes(ps) {
        0 => 0,
        stride => a.len() / stride * ps,
    };
    let plan = batch.plan(span(src), span(dst), same)?;
    let exec = plan_execution(&plan, src.location(), dst.location(), engine, config)?;
    Ok((plan, exec))
}

/// Moves batches of pages between arenas of one device layer.
pub trait Mover: Send + Sync {
    /// Starts moving `batch` from `src` to `dst` and returns at once; the returned [`Transfer`] completes when
    /// every page has arrived. Batches submitted to the same pair of locations complete in submission order.
    fn submit(
        &self,
        src: &Arc<dyn Arena>,
        dst: &Arc<dyn Arena>,
        batch: &PageBatch,
        engine: EngineChoice,
    ) -> Result<Transfer, MoveError>;

    /// Starts moving `batch` from `src` to `dst` as [`Mover::submit`] does, and changes each page on the way
    /// (see [`Coding`]). The GPU at either end runs it with a kernel; two host arenas are refused.
    fn submit_coded(
        &self,
        src: &Arc<dyn Arena>,
        dst: &Arc<dyn Arena>,
        batch: &PageBatch,
        coding: Coding,
    ) -> Result<Transfer, MoveError>;

    /// The configuration this mover runs with.
    fn config(&self) -> &MoverConfig;
}

/// What a coded move ([`Mover::submit_coded`]) does to each page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// Packs the page into the lossy format (`kernels/page_codec.cu`, [`crate::device::lossy`]) at the start of
    /// its destination frame (a page of host memory, or a slot of the packed tier); the rest of it is left alone.
    Pack(Lossy),
    /// Expands a page packed so back into its values.
    Unpack(Lossy),
}

impl Coding {
    /// The lossy format.
    pub fn lossy(self) -> Lossy {
        match self {
            Coding::Pack(l) | Coding::Unpack(l) => l,
        }
    }
}

/// The checks a mover makes before a coded move: [`prepare`]'s (on the kernel), and pages of whole groups.
pub(crate) fn prepare_coded(
    src: &dyn Arena,
    dst: &dyn Arena,
    batch: &PageBatch,
    coding: Coding,
    config: &MoverConfig,
    ours: fn(&dyn Arena) -> bool,
) -> Result<(Plan, Execution), MoveError> {
    let l = coding.lossy();
    let ps = batch.page_size();
    if !l.fits(ps) {
        return Err(MoveError::NotPackable { page: ps, group: LOSSY_GROUP, element: l.element });
    }
    let (values, packed) = match coding {
        Coding::Pack(_) => (src, dst),
        Coding::Unpack(_) => (dst, src),
    };
    if values.location().is_packed() || packed.location().frame_bytes(ps) < l.packed_len(ps) {
        return Err(MoveError::EngineUnavailable {
            engine: Engine::SmKernel,
            from: src.location(),
            to: dst.location(),
            reason:
                "a coded move takes values from (or to) whole pages, packed pages from (or to) frames that hold them",
        });
    }
    plan_checked(src, dst, batch, EngineChoice::SmKernel, config, ours)
}

/// What a backend returns for a submitted batch: something to wait on.
pub(crate) trait Pending: Send {
    /// Blocks until the move is done; returns the time the device measured for it, if it measures.
    fn wait(&mut self) -> Result<Option<Duration>, MoveError>;
    /// Whether the move is done, without blocking.
    fn poll(&mut self) -> Result<bool, MoveError>;
}

/// A batch in flight. Dropping it waits for the move to finish, so the arenas it keeps alive are never freed
/// under a copy.
pub struct Transfer {
    pending: Box<dyn Pending>,
    execution: Execution,
    bytes: u64,
    pages: usize,
    runs: usize,
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("execution", &self.execution)
            .field("bytes", &self.bytes)
            .field("pages", &self.pages)
            .field("runs", &self.runs)
            .finish_non_exhaustive()
    }
}

/// What a completed transfer did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransferReport {
    /// The engine that moved it.
    pub engine: Engine,
    /// The GPU that ran it.
    pub gpu: u16,
    /// Bytes moved.
    pub bytes: u64,
    /// Pages moved.
    pub pages: usize,
    /// Contiguous runs the pages formed.
    pub runs: usize,
    /// The kernel's SM budget (blocks) for this move; 0 when the copy engine moved the batch.
    pub blocks: u32,
    /// Time between the start and the end of the move as the device measured it (CUDA events on the GPU; the
    /// copy's own duration on the emulated device).
    pub device_time: Option<Duration>,
}

impl TransferReport {
    /// Bytes per second over the device-measured time, in GB/s (10^9 bytes).
    pub fn gb_per_s(&self) -> Option<f64> {
        self.device_time.filter(|t| !t.is_zero()).map(|t| self.bytes as f64 / t.as_secs_f64() / 1e9)
    }
}

impl Transfer {
    pub(crate) fn new(pending: Box<dyn Pending>, execution: Execution, plan: &Plan) -> Self {
        Transfer { pending, execution, bytes: plan.bytes(), pages: plan.pages(), runs: plan.runs().len() }
    }

    /// The engine moving this batch.
    pub fn engine(&self) -> Engine {
        self.execution.engine
    }

    /// Bytes this transfer moves.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether every page has arrived, without blocking.
    pub fn is_complete(&mut self) -> Result<bool, MoveError> {
        self.pending.poll()
    }

    /// Blocks until every page has arrived.
    pub fn wait(mut self) -> Result<TransferReport, MoveError> {
        let device_time = self.pending.wait()?;
        Ok(TransferReport {
            engine: self.execution.engine,
            gpu: self.execution.gpu,
            bytes: self.bytes,
            pages: self.pages,
            runs: self.runs,
            blocks: if self.execution.engine == Engine::SmKernel { self.execution.blocks } else { 0 },
            device_time,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(batch: PageBatch) -> Plan {
        batch.plan(1 << 30, 1 << 30, false).unwrap()
    }

    #[test]
    fn auto_picks_copy_engine_for_contiguous_and_kernel_for_scattered() {
        let cfg = MoverConfig::default();
        let contiguous = plan(PageBatch::contiguous(2 << 20, 0, 0, 512));
        assert_eq!(choose_engine(&contiguous, Location::Gpu(0), Location::Gpu(1), &cfg), Engine::CopyEngine);
        let mut scattered = PageBatch::new(64 << 10);
        for i in 0..64 {
            scattered.push(i * 2, i);
        }
        let scattered = plan(scattered);
        assert_eq!(choose_engine(&scattered, Location::Gpu(0), Location::Gpu(1), &cfg), Engine::SmKernel);
        assert_eq!(choose_engine(&scattered, Location::Host, Location::Host, &cfg), Engine::CopyEngine);
        assert_eq!(choose_engine(&scattered, Location::Gpu(0), Location::Host, &cfg), Engine::SmKernel);
        let mut big = PageBatch::new(2 << 20);
        for i in 0..64 {
            big.push(i * 2, i);
        }
        let big = plan(big);
        assert_eq!(choose_engine(&big, Location::Gpu(0), Location::Gpu(1), &cfg), Engine::SmKernel);
        assert_eq!(choose_engine(&big, Location::Gpu(0), Location::Host, &cfg), Engine::CopyEngine);
    }

    #[test]
    fn execution_places_work_on_the_right_gpu_and_queue() {
        let cfg = MoverConfig::default();
        let p = plan(PageBatch::contiguous(64 << 10, 0, 0, 4));
        let k = EngineChoice::SmKernel;
        let e = plan_execution(&p, Location::Gpu(0), Location::Gpu(1), k, &cfg).unwrap();
        assert_eq!((e.gpu, e.way), (1, Way::Inbound), "16 blocks pull on the destination");
        let push = MoverConfig { sm_blocks: 8, ..cfg };
        let e = plan_execution(&p, Location::Gpu(0), Location::Gpu(1), k, &push).unwrap();
        assert_eq!((e.gpu, e.way), (0, Way::Outbound), "8 blocks push from the source");
        let e = plan_execution(&p, Location::Host, Location::Gpu(1), EngineChoice::Auto, &cfg).unwrap();
        assert_eq!((e.engine, e.gpu, e.way), (Engine::CopyEngine, 1, Way::Inbound));
        let e = plan_execution(&p, Location::Gpu(1), Location::Host, EngineChoice::CopyEngine, &cfg).unwrap();
        assert_eq!((e.gpu, e.way), (1, Way::Outbound));
        let e = plan_execution(&p, Location::Gpu(1), Location::Host, k, &cfg).unwrap();
        assert_eq!(e.blocks, 4, "PCIe needs few SMs");
        let e = plan_execution(&p, Location::Gpu(1), Location::Gpu(0), k, &cfg).unwrap();
        assert_eq!(e.blocks, 16);
        for engine in [k, EngineChoice::CopyEngine] {
            let e = plan_execution(&p, Location::Gpu(1), Location::Gpu(1), engine, &cfg).unwrap();
            assert_eq!((e.gpu, e.way), (1, Way::Within), "moves within a GPU queue apart from its PCIe traffic");
        }
        assert!(MoverConfig { host_sm_blocks: 0, ..cfg }.validate().is_err());
        assert!(MoverConfig { threads_per_block: 2048, ..cfg }.validate().is_err());
        assert!(cfg.validate().is_ok());
        assert!(matches!(
            plan_execution(&p, Location::Host, Location::Host, k, &cfg),
            Err(MoveError::EngineUnavailable { .. })
        ));
    }
}
