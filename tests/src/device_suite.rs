//! The device conformance suite: what every backend of the device layer must do, byte for byte.
//!
//! Each check takes a [`DeviceLayer`] and panics (it is test code) with a message that names the case when the
//! layer misbehaves. The same checks run on the emulated device in CI and on the H200s.

use std::any::Any;
use std::sync::Arc;

use vfabric_transport::{
    Arena, ArenaSpec, DeviceError, DeviceLayer, EngineChoice, Location, MoveError, Mover, MoverConfig, PageBatch,
    PageMove,
};

use crate::pattern::{self, shuffled};

/// Sizes the suite works with: small on the emulated device, larger on GPUs.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Bytes of each arena the suite creates.
    pub arena_bytes: u64,
}

impl Scale {
    /// For the emulated device in CI.
    pub const SMALL: Scale = Scale { arena_bytes: 16 << 20 };
    /// For GPUs: large enough that scattered pages span several chunks of a 64 MiB-chunk arena.
    pub const GPU: Scale = Scale { arena_bytes: 512 << 20 };
}

/// The locations the suite moves between: every GPU and the host.
pub fn locations(layer: &dyn DeviceLayer) -> Vec<Location> {
    let mut v: Vec<Location> = layer.gpus().iter().map(|g| Location::Gpu(g.index)).collect();
    v.push(Location::Host);
    v
}

pub(crate) fn arena(layer: &dyn DeviceLayer, location: Location, bytes: u64, chunk: u64) -> Arc<dyn Arena> {
    layer
        .create_arena(&ArenaSpec { location, bytes, chunk_bytes: chunk })
        .unwrap_or_else(|e| panic!("creating a {bytes}-byte arena at {location}: {e}"))
}

fn write_pattern(a: &dyn Arena, seed: u64) {
    let step = 16 << 20;
    let mut off = 0;
    while off < a.len() {
        let len = step.min(a.len() - off);
        a.write(off, &pattern::bytes(seed, off, len as usize)).expect("writing the pattern");
        off += len;
    }
}

/// Arenas are created, written, read back, filled and released; bad accesses are typed errors; creating and
/// dropping many arenas does not leak (the last one still fits).
pub fn arena_lifecycle(layer: &dyn DeviceLayer, scale: Scale) {
    for loc in locations(layer) {
        // Chunks smaller than the arena, so reads and writes cross chunk boundaries on GPUs.
        let a = arena(layer, loc, scale.arena_bytes, scale.arena_bytes / 4);
        assert_eq!(a.location(), loc);
        assert!(a.len() >= scale.arena_bytes);
        write_pattern(a.as_ref(), 7);
        let mut back = vec![0u8; a.len() as usize];
        a.read(0, &mut back).expect("read back");
        assert_eq!(pattern::first_mismatch(7, 0, &back), None, "{loc}: arena reads back what was written");
        a.fill(4096, 8192, 0xAB).expect("fill");
        let mut small = vec![0u8; 8192];
        a.read(4096, &mut small).expect("read filled");
        assert!(small.iter().all(|&b| b == 0xAB), "{loc}: fill");
        let end = a.len();
        assert!(matches!(a.read(end - 4, &mut [0u8; 8]), Err(DeviceError::OutOfBounds { .. })), "{loc}: read past end");
        assert!(matches!(a.write(end, &[1]), Err(DeviceError::OutOfBounds { .. })), "{loc}: write past end");
        assert!(matches!(a.fill(u64::MAX, 2, 0), Err(DeviceError::OutOfBounds { .. })), "{loc}: overflowing fill");
        assert!(a.device_ptr() != 0);
    }
    for _ in 0..8 {
        let a = arena(layer, Location::Gpu(0), scale.arena_bytes, scale.arena_bytes);
        drop(a);
    }
    assert!(matches!(layer.create_arena(&ArenaSpec::new(Location::Gpu(0), 0)), Err(DeviceError::InvalidArgument(_))));
}

/// Arenas bigger than a GPU, and GPUs the node does not have, are typed errors that leave other arenas intact.
pub fn arena_errors(layer: &dyn DeviceLayer, scale: Scale) {
    let keep = arena(layer, Location::Gpu(0), scale.arena_bytes, scale.arena_bytes);
    write_pattern(keep.as_ref(), 3);
    let total = layer.gpus()[0].total_memory;
    let too_big = layer.create_arena(&ArenaSpec { location: Location::Gpu(0), bytes: total * 2, chunk_bytes: 1 << 30 });
    assert!(matches!(too_big, Err(DeviceError::OutOfDeviceMemory { .. })), "arena of twice the GPU: {too_big:?}");
    let n = layer.gpus().len() as u16;
    assert!(matches!(
        layer.create_arena(&ArenaSpec::new(Location::Gpu(n), 1 << 20)),
        Err(DeviceError::NoSuchGpu { .. })
    ));
    let mut back = vec![0u8; keep.len() as usize];
    keep.read(0, &mut back).expect("read");
    assert_eq!(pattern::first_mismatch(3, 0, &back), None, "a failed arena creation disturbed another arena");
}

/// How a batch's frames are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Consecutive frames to consecutive frames.
    Contiguous,
    /// Every page to a shuffled frame, from a shuffled frame.
    Scattered,
}

/// A batch of `pages` pages of `page` bytes within arenas of `frames` frames.
pub fn batch(page: u64, pages: u32, frames: u32, layout: Layout, seed: u64) -> PageBatch {
    match layout {
        Layout::Contiguous => PageBatch::contiguous(page, 0, frames - pages, pages),
        Layout::Scattered => {
            let s = shuffled(frames, seed);
            let d = shuffled(frames, seed ^ 0x5555);
            PageBatch::from_moves(page, (0..pages as usize).map(|i| PageMove { src: s[i], dst: d[i] }).collect())
        }
    }
}

/// Checks that `dst` holds, for every move of `batch`, the source pattern of its source frame, and that frames
/// outside the batch still hold `poison`. Reads the whole arena once.
pub fn verify_batch(dst: &dyn Arena, batch: &PageBatch, seed: u64, poison: u8, what: &str) {
    let page = batch.page_size();
    let frames = (dst.len() / page) as usize;
    let mut src_of: Vec<Option<u32>> = vec![None; frames];
    for m in batch.moves() {
        src_of[m.dst as usize] = Some(m.src);
    }
    let mut all = vec![0u8; frames * page as usize];
    dst.read(0, &mut all).expect("read back");
    for (f, bytes) in all.chunks_exact(page as usize).enumerate() {
        match src_of[f] {
            Some(src) => {
                if let Some(at) = pattern::first_mismatch(seed, u64::from(src) * page, bytes) {
                    panic!("{what}: page from frame {src} to frame {f} differs at byte {at}");
                }
            }
            None => assert!(bytes.iter().all(|&b| b == poison), "{what}: frame {f} outside the batch was written"),
        }
    }
}

/// Every engine moves pages between every pair of locations (and within one GPU), contiguous and scattered, in
/// 64 KiB and 2 MiB pages, and every byte arrives where it should and nowhere else.
pub fn moves_by_every_engine(layer: &dyn DeviceLayer, scale: Scale) {
    let mover = layer.mover(MoverConfig::default()).expect("mover");
    let locs = locations(layer);
    let bytes = scale.arena_bytes;
    let arenas: Vec<Arc<dyn Arena>> = locs.iter().map(|&l| arena(layer, l, bytes, bytes / 2)).collect();
    let seed = 0xF00D;
    for (i, src) in arenas.iter().enumerate() {
        write_pattern(src.as_ref(), seed);
        for (j, dst) in arenas.iter().enumerate() {
            let same = i == j;
            // Within one arena the source pattern must stay intact, so moves there go to a second arena of the
            // same location.
            let dst = if same { arena(layer, locs[j], bytes, bytes) } else { Arc::clone(dst) };
            for engine in [EngineChoice::CopyEngine, EngineChoice::SmKernel, EngineChoice::Auto] {
                if engine == EngineChoice::SmKernel && locs[i] == Location::Host && locs[j] == Location::Host {
                    continue;
                }
                for page in [64u64 << 10, 2 << 20] {
                    for layout in [Layout::Contiguous, Layout::Scattered] {
                        let frames = (bytes / page) as u32;
                        let b = batch(page, frames / 2, frames, layout, seed + page);
                        dst.fill(0, dst.len(), 0xEE).expect("poison");
                        let what = format!("{} -> {} {engine} {}KiB {layout:?}", locs[i], locs[j], page >> 10);
                        let t = mover.submit(src, &dst, &b, engine).unwrap_or_else(|e| panic!("{what}: submit: {e}"));
                        let r = t.wait().unwrap_or_else(|e| panic!("{what}: wait: {e}"));
                        assert_eq!(r.bytes, b.bytes(), "{what}");
                        if engine != EngineChoice::Auto {
                            assert_eq!(Some(r.engine), to_engine(engine), "{what}: engine used");
                        }
                        verify_batch(dst.as_ref(), &b, seed, 0xEE, &what);
                    }
                }
            }
        }
        // Leave the source pattern intact for the next source.
        let mut probe = vec![0u8; 4096];
        src.read(0, &mut probe).expect("read source");
        assert_eq!(pattern::first_mismatch(seed, 0, &probe), None, "{}: the source was modified", locs[i]);
    }
}

fn to_engine(c: EngineChoice) -> Option<vfabric_transport::Engine> {
    match c {
        EngineChoice::CopyEngine => Some(vfabric_transport::Engine::CopyEngine),
        EngineChoice::SmKernel => Some(vfabric_transport::Engine::SmKernel),
        EngineChoice::Auto => None,
    }
}

/// Pages move within one arena (what compaction does) when no frame is both read and written.
pub fn moves_within_one_arena(layer: &dyn DeviceLayer, scale: Scale) {
    let mover = layer.mover(MoverConfig::default()).expect("mover");
    for loc in [Location::Gpu(0), Location::Host] {
        let a = arena(layer, loc, scale.arena_bytes, scale.arena_bytes);
        write_pattern(a.as_ref(), 11);
        let page = 64u64 << 10;
        let frames = (a.len() / page) as u32;
        // The upper half's frames move down into the lower half, scattered.
        let order = shuffled(frames / 2, 5);
        let b = PageBatch::from_moves(
            page,
            (0..frames / 2).map(|i| PageMove { src: frames / 2 + i, dst: order[i as usize] }).collect(),
        );
        let engine = if loc == Location::Host { EngineChoice::CopyEngine } else { EngineChoice::SmKernel };
        mover.submit(&a, &a, &b, engine).expect("submit").wait().expect("wait");
        let mut buf = vec![0u8; page as usize];
        for m in b.moves() {
            a.read(u64::from(m.dst) * page, &mut buf).expect("read");
            assert_eq!(
                pattern::first_mismatch(11, u64::from(m.src) * page, &buf),
                None,
                "{loc}: frame {} -> {}",
                m.src,
                m.dst
            );
        }
    }
}

/// Both directions between two locations at once, and several batches queued back to back, all arrive.
pub fn concurrent_transfers(layer: &dyn DeviceLayer, scale: Scale) {
    let mover = layer.mover(MoverConfig::default()).expect("mover");
    let other = if layer.gpus().len() > 1 { Location::Gpu(1) } else { Location::Host };
    let a = arena(layer, Location::Gpu(0), scale.arena_bytes, scale.arena_bytes);
    let b = arena(layer, other, scale.arena_bytes, scale.arena_bytes);
    let (sa, sb) = (21, 22);
    let page = 2u64 << 20;
    let frames = (scale.arena_bytes / page) as u32;
    let half = frames / 2;
    write_pattern(a.as_ref(), sa);
    write_pattern(b.as_ref(), sb);
    // a's lower half -> b's upper half while b's lower half -> a's upper half.
    let ab = PageBatch::contiguous(page, 0, half, half);
    let ba = PageBatch::contiguous(page, 0, half, half);
    let t1 = mover.submit(&a, &b, &ab, EngineChoice::SmKernel).expect("submit a->b");
    let t2 = mover.submit(&b, &a, &ba, EngineChoice::SmKernel).expect("submit b->a");
    t1.wait().expect("a->b");
    t2.wait().expect("b->a");
    let mut buf = vec![0u8; (u64::from(half) * page) as usize];
    b.read(u64::from(half) * page, &mut buf).expect("read b");
    assert_eq!(pattern::first_mismatch(sa, 0, &buf), None, "a -> b while b -> a");
    a.read(u64::from(half) * page, &mut buf).expect("read a");
    assert_eq!(pattern::first_mismatch(sb, 0, &buf), None, "b -> a while a -> b");
    // Many small batches queued without waiting, then a dropped transfer (drop waits), then all verified.
    let c = arena(layer, other, scale.arena_bytes, scale.arena_bytes);
    let mut pending = Vec::new();
    for i in 0..half {
        pending.push(mover.submit(&a, &c, &PageBatch::contiguous(page, i, i, 1), EngineChoice::Auto).expect("submit"));
    }
    // (a's upper half now holds b's pages, so the dropped one copies a's frame 0 again.)
    let last = PageBatch::from_moves(page, vec![PageMove { src: 0, dst: half }]);
    drop(mover.submit(&a, &c, &last, EngineChoice::Auto).expect("submit"));
    for t in pending {
        t.wait().expect("wait");
    }
    let mut buf = vec![0u8; (u64::from(half) * page) as usize];
    c.read(0, &mut buf).expect("read c");
    assert_eq!(pattern::first_mismatch(sa, 0, &buf), None, "queued single-page batches");
    let mut one = vec![0u8; page as usize];
    c.read(u64::from(half) * page, &mut one).expect("read c");
    assert_eq!(pattern::first_mismatch(sa, 0, &one), None, "a dropped transfer still completes");
}

/// An arena that belongs to no device layer.
#[derive(Debug)]
struct ForeignArena;

impl Arena for ForeignArena {
    fn location(&self) -> Location {
        Location::Host
    }
    fn len(&self) -> u64 {
        1 << 20
    }
    fn device_ptr(&self) -> u64 {
        4096
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), DeviceError> {
        Ok(())
    }
    fn read(&self, _: u64, _: &mut [u8]) -> Result<(), DeviceError> {
        Ok(())
    }
    fn fill(&self, _: u64, _: u64, _: u8) -> Result<(), DeviceError> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Bad batches are refused with typed errors before anything moves, and leave the arenas as they were.
pub fn batch_errors(layer: &dyn DeviceLayer, scale: Scale) {
    let mover: Arc<dyn Mover> = layer.mover(MoverConfig::default()).expect("mover");
    let a = arena(layer, Location::Gpu(0), scale.arena_bytes, scale.arena_bytes);
    let h = arena(layer, Location::Host, scale.arena_bytes, scale.arena_bytes);
    write_pattern(a.as_ref(), 31);
    h.fill(0, h.len(), 0x11).expect("fill");
    let page = 64u64 << 10;
    let frames = (scale.arena_bytes / page) as u32;
    let auto = EngineChoice::Auto;
    let err = |r: Result<vfabric_transport::Transfer, MoveError>| r.expect_err("the batch should be refused");
    assert!(matches!(
        err(mover.submit(&a, &h, &PageBatch::contiguous(page, frames - 1, 0, 2), auto)),
        MoveError::FrameOutOfRange { .. }
    ));
    assert!(matches!(
        err(mover.submit(&a, &h, &PageBatch::contiguous(page, 0, frames, 1), auto)),
        MoveError::FrameOutOfRange { .. }
    ));
    let dup = PageBatch::from_moves(page, vec![PageMove { src: 0, dst: 1 }, PageMove { src: 2, dst: 1 }]);
    assert!(matches!(err(mover.submit(&a, &h, &dup, auto)), MoveError::DuplicateDestination(1)));
    assert!(matches!(
        err(mover.submit(&a, &a, &PageBatch::contiguous(page, 0, 1, 2), auto)),
        MoveError::OverlappingFrames(_)
    ));
    assert!(matches!(
        err(mover.submit(&a, &h, &PageBatch::contiguous(100, 0, 0, 1), auto)),
        MoveError::BadPageSize(100)
    ));
    let foreign: Arc<dyn Arena> = Arc::new(ForeignArena);
    assert!(matches!(
        err(mover.submit(&foreign, &h, &PageBatch::contiguous(page, 0, 0, 1), auto)),
        MoveError::ForeignArena(_)
    ));
    assert!(matches!(
        err(mover.submit(&a, &foreign, &PageBatch::contiguous(page, 0, 0, 1), auto)),
        MoveError::ForeignArena(_)
    ));
    assert!(matches!(
        err(mover.submit(&h, &h, &PageBatch::contiguous(page, 0, 1, 1), EngineChoice::SmKernel)),
        MoveError::EngineUnavailable { .. }
    ));
    // An empty batch completes at once.
    let r = mover.submit(&a, &h, &PageBatch::new(page), auto).expect("empty batch").wait().expect("wait");
    assert_eq!(r.bytes, 0);
    let mut buf = vec![0u8; scale.arena_bytes as usize];
    a.read(0, &mut buf).expect("read");
    assert_eq!(pattern::first_mismatch(31, 0, &buf), None, "refused batches left the source intact");
    h.read(0, &mut buf).expect("read");
    assert!(buf.iter().all(|&b| b == 0x11), "refused batches wrote nothing");
    assert!(layer.mover(MoverConfig { sm_blocks: 0, ..MoverConfig::default() }).is_err(), "a mover with no blocks");
}
