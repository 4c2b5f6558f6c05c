//! Model-based test of the directory: random sequences of alloc / write / read / acquire / release / migrate /
//! compact / free from several simulated devices, with the stages' copies carried out on simulated memory (one
//! token per frame) and some stages failing, checked against a plain reference model. Acquires that walk a
//! region in order leave a prefetch in flight across the operations that follow, its copies made either when it
//! starts or when it is settled (both are what a device may do), so an operation that disturbs its pages
//! without waiting for it shows up as wrong bytes; a caller's prefetch and write-back hints do the same. Checked:
//! - every read (host read, or the bytes under a lease) sees the last released write;
//! - no page is lost (every page of every live region reads back right after every operation);
//! - no leased page is ever moved or evicted (a lease's frames keep its bytes until it is released);
//! - the directory's own tables stay consistent (`check_invariants`).
//!
//! The storage tier's frames keep the checksum written with each page, and some operations corrupt a stored page
//! (its token changes, its sum does not, as on a bad drive): a stage that reads it fails its checksum and is
//! aborted, reads of that page fail with the corruption (or find a right copy elsewhere), and no read ever sees
//! the corrupted token; every other page reads right.

use std::collections::{HashMap, HashSet, VecDeque};

use proptest::prelude::*;
use vfabric::directory::{
    AcquireRequest, Directory, DirectoryConfig, DirectoryError, LeaseGrant, Mode, Placement, ReadSource, RegionHandle,
    Stage, StageKind, Step, HINT_DEPTH, PREFETCH_DEPTH, STAGING_DEPTH,
};
use vfabric_allocator::{Compression, Element, PageSize};
use vfabric_transport::storage::StorageError;
use vfabric_transport::Location;
use xxhash_rust::xxh3::xxh3_64;

const PAGE: u64 = 64 << 10;
const DEVICES: [(Location, u64); 3] =
    [(Location::Gpu(0), 8 * PAGE), (Location::Gpu(1), 6 * PAGE), (Location::Host, 40 * PAGE)];

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        pages: u32,
        device: usize,
    },
    Free {
        region: usize,
    },
    Write {
        region: usize,
        page: u32,
        pages: u32,
    },
    Read {
        region: usize,
        page: u32,
        pages: u32,
    },
    Acquire {
        region: usize,
        page: u32,
        pages: u32,
        device: usize,
        write: bool,
    },
    Release {
        lease: usize,
    },
    Migrate {
        region: usize,
        device: usize,
    },
    Compact {
        device: usize,
        frames: u32,
    },
    /// Acquires `steps` ranges of `pages` in order from `page`, releasing each but the last.
    Walk {
        region: usize,
        page: u32,
        pages: u32,
        device: usize,
        steps: u32,
    },
    /// A caller's hint: prefetch a range to a GPU, or write back what only that GPU holds of it.
    Hint {
        region: usize,
        page: u32,
        pages: u32,
        device: usize,
        write_back: bool,
    },
    /// Sets `pages` of a device aside (any of the node's but the compressed tier, picked by `device` modulo their
    /// count: GPUs, host memory, packed tiers, the storage tier); regions allocated while it lasts (with an odd
    /// page count) draw on it, and evictions to its device take its frames.
    Reserve {
        device: usize,
        pages: u32,
    },
    /// Gives a reservation back.
    Unreserve {
        index: usize,
    },
    /// The prefetch in flight completes.
    Settle,
    /// A bad drive changes a page's copy on the storage tier (if it has one) without its checksum.
    Corrupt {
        region: usize,
        page: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1u32..6, 0usize..3).prop_map(|(pages, device)| Op::Alloc { pages, device }),
        1 => (0usize..8).prop_map(|region| Op::Free { region }),
        4 => (0usize..8, 0u32..6, 1u32..4).prop_map(|(region, page, pages)| Op::Write { region, page, pages }),
        3 => (0usize..8, 0u32..6, 1u32..4).prop_map(|(region, page, pages)| Op::Read { region, page, pages }),
        4 => (0usize..8, 0u32..6, 1u32..4, 0usize..3, any::<bool>())
            .prop_map(|(region, page, pages, device, write)| Op::Acquire { region, page, pages, device, write }),
        3 => (0usize..8).prop_map(|lease| Op::Release { lease }),
        1 => (0usize..8, 0usize..3).prop_map(|(region, device)| Op::Migrate { region, device }),
        1 => (0usize..2, 1u32..6).prop_map(|(device, frames)| Op::Compact { device, frames }),
        2 => (0usize..8, 0u32..6, 1u32..3, 0usize..2, 2u32..6)
            .prop_map(|(region, page, pages, device, steps)| Op::Walk { region, page, pages, device, steps }),
        2 => (0usize..8, 0u32..6, 1u32..4, 0usize..2, any::<bool>())
            .prop_map(|(region, page, pages, device, write_back)| Op::Hint { region, page, pages, device, write_back }),
        1 => (0usize..6, 1u32..5).prop_map(|(device, pages)| Op::Reserve { device, pages }),
        1 => (0usize..4).prop_map(|index| Op::Unreserve { index }),
        1 => Just(Op::Settle),
        1 => (0usize..8, 0u32..6).prop_map(|(region, page)| Op::Corrupt { region, page }),
    ]
}

/// Why a simulated operation failed: the directory refused it, one of its stages' copies failed (simulated), or
/// a page read from the storage tier failed its checksum (a stage's copy, or a host read).
#[derive(Debug)]
enum SimError {
    Dir(DirectoryError),
    CopyFailed,
    Corrupt(StorageError),
}

impl From<DirectoryError> for SimError {
    fn from(e: DirectoryError) -> Self {
        SimError::Dir(e)
    }
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Dir(e) => write!(f, "{e}"),
            SimError::CopyFailed => write!(f, "simulated copy failure"),
            SimError::Corrupt(e) => write!(f, "{e}"),
        }
    }
}

/// Simulated device memory: one token per frame.
struct Sim {
    dir: Directory,
    mem: HashMap<(Location, u32), u64>,
    /// The reference: the last released token of every page of every live region.
    model: HashMap<(u32, u64, u32), u64>,
    regions: Vec<RegionHandle>,
    leases: Vec<(LeaseGrant, RegionHandle, Vec<u64>)>,
    reservations: Vec<u64>,
    /// Per reservation held: its device, the pages it set aside, and how many frames pages may have taken from
    /// it (landed on its device, or in flight there: pages of regions naming it, and pages evictions moved
    /// there); never less than the frames it no longer holds.
    reserved: HashMap<u64, (Location, u64, u64)>,
    /// Stages aborted (copies failed): only they give frames back to a reservation.
    aborts: u64,
    next_token: u64,
    stages: u64,
    fail_every: u64,
    /// The prefetches in flight, oldest first: the stage, whether it fails, and whether its copies are still
    /// to be made.
    prefetch: VecDeque<(Stage, bool, bool)>,
    /// Fetch stages run (an acquire's own), and pages prefetched.
    fetches: u64,
    /// Pages copied by eviction stages (the only copy of a page going to host memory).
    evicted: u64,
    /// Pages moved within a device to join free frames into runs.
    compacted: u64,
    prefetched: u64,
    /// Pages prefetched from the storage tier (into host memory, on their way to a GPU).
    staged: u64,
    /// Pages moved into the compressed tier.
    packed: u64,
    /// Whether some regions are lossy (the node has a packed tier).
    lossy: bool,
    /// Whether the node has a packed tier of fp32 slots.
    f32_tier: bool,
    /// The checksum written with each storage frame's token.
    sums: HashMap<u32, u64>,
    /// Pages whose copy on the storage tier was corrupted since they were last written: only their reads (and
    /// the operations that bring them up) may fail with the corruption.
    lost: HashSet<(u32, u64, u32)>,
    /// Stages failed (and aborted) because a page they read from the storage tier failed its checksum.
    corruptions: u64,
}

/// The host memory frames a stage brought pages to from a GPU, which the fabric packs for the compressed tier:
/// those of evictions, write-backs and migrations.
fn arrivals(stage: &Stage) -> Vec<u32> {
    if !matches!(stage.kind, StageKind::Evict | StageKind::WriteBack | StageKind::Migrate) {
        return Vec::new();
    }
    let from_gpu = |b: &&vfabric::directory::StageBatch| matches!(b.from, Location::Gpu(_)) && b.to == Location::Host;
    stage.batches.iter().filter(from_gpu).flat_map(|b| b.moves.iter().map(|m| m.dst)).collect()
}

/// The frames a stage takes and fills: its copies' destinations and its zero-fills (none for a compaction, which
/// moves pages into frames already free without taking them).
fn landings(stage: &Stage) -> Vec<(Location, u32)> {
    if stage.kind == StageKind::Compact {
        return Vec::new();
    }
    let copies = stage.batches.iter().flat_map(|b| b.moves.iter().map(move |m| (b.to, m.dst)));
    copies.chain(stage.zero.iter().copied()).collect()
}

fn key(r: &RegionHandle, page: u32) -> (u32, u64, u32) {
    (0, r.addr.raw(), page)
}

impl Sim {
    /// Carries a stage out, or (every `fail_every`-th stage) fails it the way a broken copy would: the
    /// destination frames get garbage, and the stage is aborted.
    fn run(&mut self, stage: Stage) -> Result<(), SimError> {
        let fail = self.next_fails();
        let corrupt = self.copy(&stage, fail);
        if stage.kind == StageKind::Fetch {
            self.fetches += 1;
        }
        if stage.kind == StageKind::Evict {
            self.evicted += stage.pages() as u64;
        }
        if stage.kind == StageKind::Compact {
            self.compacted += stage.pages() as u64;
        }
        if let Some(e) = corrupt {
            self.corruptions += 1;
            self.aborts += 1;
            self.dir.abort(stage);
            return Err(SimError::Corrupt(e));
        }
        if fail {
            self.aborts += 1;
            self.dir.abort(stage);
            return Err(SimError::CopyFailed);
        }
        let arrived = arrivals(&stage);
        let landed = landings(&stage);
        let kind = stage.kind;
        self.dir.commit(stage);
        self.count_taken(kind, &landed, None);
        self.pack_arrivals(arrived);
        Ok(())
    }

    /// Counts the frames of `landed` (a stage of `kind`, committed or started) that may have come out of a
    /// reservation: on its device, an eviction's (its tenant's reservation there lends them), or a page's of a
    /// region naming it (`region`'s, or else the one whose copy is now there).
    fn count_taken(&mut self, kind: StageKind, landed: &[(Location, u32)], region: Option<RegionHandle>) {
        for &(loc, frame) in landed {
            let owner = || {
                let dev = self.dir.dev(loc).ok()?;
                let mut all =
                    self.regions.iter().copied().flat_map(|h| (0..(h.len / PAGE) as usize).map(move |p| (h, p)));
                let holds = |&(h, p): &(RegionHandle, usize)| {
                    self.dir.region(&h).is_ok_and(|r| r.pages[p].copy_on(dev).is_some_and(|c| c.frame == frame))
                };
                region.or_else(|| all.find(holds).map(|(h, _)| h))
            };
            let named = if kind == StageKind::Evict {
                None
            } else {
                owner().and_then(|h| self.dir.region(&h).ok().and_then(|r| r.placement.reservation))
            };
            for (id, r) in self.reserved.iter_mut() {
                if r.0 == loc && (kind == StageKind::Evict || named == Some(*id)) {
                    r.2 += 1;
                }
            }
        }
    }

    /// What the fabric does after a stage commits: the pages of lossless regions that an eviction, write-back
    /// or migration brought to host memory from a GPU move into the compressed tier, each in a run of a length
    /// its token draws (1 to 15 blocks of a page's 16; 0 and 16 stand for pages that do not shrink), making
    /// room there first when no run is free.
    fn pack_arrivals(&mut self, frames: Vec<u32>) {
        for frame in frames {
            let Some((page, _)) = self.dir.compressible(frame) else { continue };
            let v = self.mem.get(&(Location::Host, frame)).copied().unwrap_or(0xDEAD);
            let blocks = (v % 17) as u32;
            if blocks == 0 || blocks >= self.dir.page_blocks() {
                continue;
            }
            let start = match self.dir.compressed_fit(blocks) {
                Some(s) => s,
                None => match self.drive(|d| d.step_compressed_room(blocks)) {
                    Ok(true) => self.dir.compressed_fit(blocks).expect("room was made"),
                    Ok(false) | Err(SimError::CopyFailed) => continue,
                    Err(e) => panic!("making room in the compressed tier: {e}"),
                },
            };
            // Making room may have moved the page itself.
            if self.dir.compressible(frame).map(|c| c.0) != Some(page) {
                continue;
            }
            self.put((Location::Compressed, start), v);
            self.dir.place_compressed(frame, page, start, blocks).expect("placing a page in the compressed tier");
            self.packed += 1;
        }
    }

    fn next_fails(&mut self) -> bool {
        self.stages += 1;
        self.fail_every > 0 && self.stages % self.fail_every == 0
    }

    /// Writes a token to a frame; on the storage tier with its checksum, as the fabric's file I/O does.
    fn put(&mut self, at: (Location, u32), v: u64) {
        self.mem.insert(at, v);
        if at.0 == Location::Storage {
            self.sums.insert(at.1, xxh3_64(&v.to_le_bytes()));
        }
    }

    /// The token a frame holds; read from the storage tier, checked against the sum written with it.
    fn fetch(&self, at: (Location, u32)) -> Result<u64, StorageError> {
        let v = self.mem.get(&at).copied().unwrap_or(0xDEAD);
        match self.sums.get(&at.1) {
            Some(&expected) if at.0 == Location::Storage => {
                let found = xxh3_64(&v.to_le_bytes());
                match found == expected {
                    true => Ok(v),
                    false => Err(StorageError::Corrupt { slot: u64::from(at.1), expected, found }),
                }
            }
            _ => Ok(v),
        }
    }

    /// The stage's copies and fills, or garbage in its frames when it fails, or when a page it reads from the
    /// storage tier fails its checksum (which is returned: the stage fails with it).
    fn copy(&mut self, stage: &Stage, fail: bool) -> Option<StorageError> {
        let corrupt = stage
            .batches
            .iter()
            .filter(|b| b.from == Location::Storage)
            .flat_map(|b| b.moves.iter().map(|m| (b.from, m.src)))
            .find_map(|at| self.fetch(at).err());
        let fail = fail || corrupt.is_some();
        let mut writes = Vec::new();
        for b in &stage.batches {
            // The storage tier is reached through host memory only (or the packed tier): the fabric's file I/O
            // reads and writes host frames (or slots).
            let ends = [b.from, b.to];
            let storage = ends.contains(&Location::Storage);
            assert!(
                !storage || ends.iter().any(|l| l.is_host_memory()),
                "a {:?} stage copies between {} and {}",
                stage.kind,
                b.from,
                b.to
            );
            // Pages landing on the storage tier are packed as their region asks; otherwise only a lossy region's,
            // between a GPU and host memory, and with a packed tier only to and from it (never host frames).
            let gpu = ends.iter().any(|l| matches!(l, Location::Gpu(_)));
            let packed = ends.iter().copied().find(|l| l.is_packed());
            let into_packed = if self.lossy { packed.is_some() } else { ends.contains(&Location::Host) };
            assert!(b.to == Location::Storage || b.compression == Compression::None || (gpu && into_packed), "{b:?}");
            // Only a lossy region's pages reach a packed tier (coming up from the storage tier they are copied as
            // they are stored, whose tier `check` asks of the directory): the one of its values' slots.
            if let (Some(tier), false) = (packed, storage) {
                let want = self.packed_tier_of(b.compression);
                assert!(want == Some(tier), "{b:?}: pages in {tier}, not {want:?}");
            }
            for m in &b.moves {
                let v = if fail { 0xBAD } else { self.mem.get(&(b.from, m.src)).copied().unwrap_or(0xDEAD) };
                writes.push(((b.to, m.dst), v));
            }
        }
        for &(loc, f) in &stage.zero {
            writes.push(((loc, f), if fail { 0xBAD } else { 0 }));
        }
        for (k, v) in writes {
            self.put(k, v);
        }
        corrupt
    }

    /// Starts the prefetches the directory asks for after an acquire, each copying now or at settle time.
    fn prefetch(&mut self, h: &RegionHandle, device: Location) {
        loop {
            match self.drive(|d| d.step_prefetch(h, device)) {
                Ok(Some(stage)) => {
                    // At most PREFETCH_DEPTH stages into the device, and STAGING_DEPTH into host memory (pages
                    // coming up from storage) for a GPU's walk.
                    let to = stage.batches.first().map(|b| b.to);
                    let into = |d: Location| {
                        self.prefetch.iter().filter(|p| p.0.batches.first().map(|b| b.to) == Some(d)).count()
                    };
                    if to == Some(device) {
                        assert!(into(device) < PREFETCH_DEPTH, "more prefetches in flight than allowed");
                    } else {
                        let up = to.filter(|l| l.is_host_memory());
                        let up = up.unwrap_or_else(|| panic!("a prefetch for {device} goes to {to:?}"));
                        assert!(into(up) < STAGING_DEPTH, "more stages from storage than allowed");
                    }
                    self.start(stage, *h);
                }
                Ok(None) | Err(SimError::Dir(DirectoryError::OutOfMemory { .. })) => return,
                Err(SimError::CopyFailed) => return,
                Err(SimError::Corrupt(_)) if self.lost_in(h, 0, u32::MAX) => return,
                Err(e) => panic!("prefetch: {e}"),
            }
        }
    }

    /// Starts a stage that stays in flight (of region `h`): its copies are made now or when it settles, and may
    /// fail.
    fn start(&mut self, stage: Stage, h: RegionHandle) {
        self.count_taken(stage.kind, &landings(&stage), Some(h));
        let mut fail = self.next_fails();
        let late = self.stages % 2 == 0;
        self.prefetched += stage.pages() as u64;
        self.staged +=
            stage.batches.iter().filter(|b| b.from == Location::Storage).map(|b| b.moves.len() as u64).sum::<u64>();
        if !late && self.copy(&stage, fail).is_some() {
            self.corruptions += 1;
            fail = true;
        }
        self.prefetch.push_back((stage, fail, late));
    }

    /// A caller's prefetch or write-back hint on pages `page..page + pages` (clipped to the region).
    fn hint(&mut self, h: RegionHandle, page: u32, pages: u32, device: usize, write_back: bool) {
        let n = (h.len / PAGE) as u32;
        let (page, pages) = (page % n, pages.min(n - page % n));
        let (at, len, loc) = (u64::from(page) * PAGE, u64::from(pages) * PAGE, DEVICES[device].0);
        let step = if write_back {
            self.drive(|d| d.step_write_back(&h, at, len, loc))
        } else {
            self.drive(|d| d.step_prefetch_range(&h, at, len, loc))
        };
        match step {
            Ok(Some(stage)) => {
                assert!(self.prefetch.len() < HINT_DEPTH, "more stages in flight than allowed");
                assert_eq!(stage.kind, if write_back { StageKind::WriteBack } else { StageKind::Prefetch });
                self.start(stage, h);
            }
            Ok(None) | Err(SimError::Dir(DirectoryError::OutOfMemory { .. })) | Err(SimError::CopyFailed) => {}
            Err(SimError::Corrupt(_)) if self.lost_in(&h, page, pages) => {}
            Err(e) => panic!("hint: {e}"),
        }
    }

    /// A stage in flight completes (or fails): not always the oldest, as the fabric commits whichever lands
    /// first.
    fn settle(&mut self) {
        if self.prefetch.is_empty() {
            return;
        }
        let i = (self.stages as usize * 7 + self.next_token as usize) % self.prefetch.len();
        let Some((stage, mut fail, late)) = self.prefetch.remove(i) else { return };
        if late && self.copy(&stage, fail).is_some() {
            self.corruptions += 1;
            fail = true;
        }
        if fail {
            self.aborts += 1;
            self.dir.abort(stage);
        } else {
            let arrived = arrivals(&stage);
            self.dir.commit(stage);
            self.pack_arrivals(arrived);
        }
    }

    fn drive<T>(
        &mut self,
        mut f: impl FnMut(&mut Directory) -> Result<Step<T>, DirectoryError>,
    ) -> Result<T, SimError> {
        for _ in 0..1000 {
            match f(&mut self.dir)? {
                Step::Done(t) => return Ok(t),
                Step::Stage(s) => self.run(s)?,
                Step::Wait => {
                    assert!(!self.prefetch.is_empty(), "the directory waits for a prefetch that is not in flight");
                    self.settle();
                }
            }
        }
        panic!("an operation staged 1000 times without finishing");
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    /// A host read of one page: from the storage tier, checked against its sum (failing with the corruption).
    fn read_page(&mut self, r: &RegionHandle, page: u32) -> Result<u64, SimError> {
        let pieces = self.dir.plan_read(r, u64::from(page) * PAGE, PAGE)?;
        match pieces[0].source {
            ReadSource::Zero => Ok(0),
            ReadSource::At(loc, f) => self.fetch((loc, f)).map_err(SimError::Corrupt),
        }
    }

    /// Whether a page of `page..page + pages` of `h` (clipped to it) had its stored copy corrupted.
    fn lost_in(&self, h: &RegionHandle, page: u32, pages: u32) -> bool {
        let n = (h.len / PAGE) as u32;
        let (page, pages) = (page % n, pages.min(n - page % n));
        (page..page + pages).any(|p| self.lost.contains(&key(h, p)))
    }

    /// Corrupts page `page` of `h`'s copy on the storage tier, if it has one: its token changes, its sum stays.
    fn corrupt(&mut self, h: &RegionHandle, page: u32) {
        let Ok(storage) = self.dir.dev(Location::Storage) else { return };
        let page = page % (h.len / PAGE) as u32;
        let copy = self.dir.region(h).expect("live region").pages[page as usize].copy_on(storage);
        let Some(c) = copy else { return };
        let at = (Location::Storage, c.frame);
        let v = self.mem.get(&at).copied().unwrap_or(0xDEAD);
        // Never a token any write makes (they are small), so a read that returned it would be caught.
        self.mem.insert(at, v ^ (1 << 62));
        self.lost.insert(key(h, page));
    }

    fn apply(&mut self, op: &Op) {
        let pick = |v: usize, n: usize| if n == 0 { None } else { Some(v % n) };
        match *op {
            Op::Alloc { pages, device } => {
                let reservation = self.reservations.last().copied().filter(|_| pages % 2 == 1);
                let compression = match pages % 3 {
                    0 => Compression::Lz4,
                    1 if self.lossy && pages % 2 == 1 => Compression::Int8F32,
                    1 if self.lossy => Compression::Fp8Bf16,
                    _ => Compression::None,
                };
                let p = Placement { reservation, compression, ..Placement::on(DEVICES[device].0) };
                if let Ok(h) = self.dir.alloc(u64::from(pages) * PAGE, p) {
                    for i in 0..pages {
                        self.model.insert(key(&h, i), 0);
                    }
                    self.regions.push(h);
                }
            }
            Op::Free { region } => {
                let Some(i) = pick(region, self.regions.len()) else { return };
                let h = self.regions[i];
                match self.drive(|d| d.free(&h)) {
                    Ok(()) => {
                        self.regions.remove(i);
                        self.model.retain(|k, _| k.1 != h.addr.raw());
                        self.lost.retain(|k| k.1 != h.addr.raw());
                        assert!(matches!(self.dir.free(&h), Err(DirectoryError::DoubleFree(_))), "double free");
                        assert!(
                            matches!(self.dir.plan_read(&h, 0, 1), Err(DirectoryError::UseAfterFree(_))),
                            "use after free"
                        );
                    }
                    Err(SimError::Dir(DirectoryError::LeasedElsewhere { .. })) => {
                        assert!(self.leases.iter().any(|l| l.1 == h), "refused to free a region nobody leases");
                    }
                    Err(e) => panic!("free: {e}"),
                }
            }
            Op::Write { region, page, pages } => {
                let Some(i) = pick(region, self.regions.len()) else { return };
                let h = self.regions[i];
                let n = (h.len / PAGE) as u32;
                let (page, pages) = (page % n, pages.min(n - page % n));
                let t0 = self.token();
                let got = self.drive(|d| d.step_write(&h, u64::from(page) * PAGE, u64::from(pages) * PAGE));
                match got {
                    Ok(targets) => {
                        for (j, t) in targets.iter().enumerate() {
                            self.put((t.location, t.frame), t0 * 100 + j as u64);
                            self.model.insert(key(&h, page + j as u32), t0 * 100 + j as u64);
                            self.lost.remove(&key(&h, page + j as u32));
                        }
                    }
                    Err(SimError::Dir(DirectoryError::LeasedElsewhere { .. } | DirectoryError::OutOfMemory { .. })) => {
                    }
                    Err(SimError::CopyFailed) => {}
                    // The stored pages of the range come up to host memory first (the write may cover part of
                    // them): a corrupted one fails the write.
                    Err(SimError::Corrupt(_)) if self.lost_in(&h, page, pages) => {}
                    Err(e) => panic!("write: {e}"),
                }
            }
            Op::Read { region, page, pages } => {
                let Some(i) = pick(region, self.regions.len()) else { return };
                let h = self.regions[i];
                let n = (h.len / PAGE) as u32;
                let (page, pages) = (page % n, pages.min(n - page % n));
                for p in page..page + pages {
                    match self.read_page(&h, p) {
                        Ok(v) => assert_eq!(v, self.model[&key(&h, p)], "host read of page {p} of {h}"),
                        Err(SimError::Dir(DirectoryError::LeasedElsewhere { .. })) => {}
                        Err(SimError::Corrupt(e)) => {
                            assert!(self.lost.contains(&key(&h, p)), "page {p} of {h}, never corrupted: {e}")
                        }
                        Err(e) => panic!("read: {e}"),
                    }
                }
            }
            Op::Acquire { region, page, pages, device, write } => {
                let Some(i) = pick(region, self.regions.len()) else { return };
                self.acquire(self.regions[i], page, pages, device, write);
            }
            Op::Walk { region, page, pages, device, steps } => {
                let Some(i) = pick(region, self.regions.len()) else { return };
                let h = self.regions[i];
                let n = (h.len / PAGE) as u32;
                let mut at = page % n;
                for step in 0..steps {
                    if at >= n || !self.acquire(h, at, pages, device, false) {
                        break;
                    }
                    at += pages;
                    if step + 1 < steps {
                        let (grant, _, _) = self.leases.pop().expect("just granted");
                        self.dir.release(grant.id).expect("release");
                    }
                }
            }
            Op::Hint { region, page, pages, device, write_back } => {
                let Some(i) = pick(region, self.regions.len()) else { return };
                self.hint(self.regions[i], page, pages, device, write_back);
            }
            Op::Reserve { device, pages } => {
                let locs: Vec<Location> =
                    self.dir.locations().into_iter().filter(|l| *l != Location::Compressed).collect();
                let loc = locs[device % locs.len()];
                match self.drive(|d| d.step_reserve(loc, u64::from(pages) * PAGE, Default::default())) {
                    Ok(id) => {
                        assert_eq!(self.dir.reserved(id).unwrap(), u64::from(pages) * PAGE);
                        self.reservations.push(id);
                        self.reserved.insert(id, (loc, u64::from(pages), 0));
                    }
                    Err(SimError::Dir(
                        DirectoryError::ReservationRefused { .. } | DirectoryError::OutOfMemory { .. },
                    ))
                    | Err(SimError::CopyFailed) => {}
                    Err(e) => panic!("reserve: {e}"),
                }
            }
            Op::Unreserve { index } => {
                let Some(i) = pick(index, self.reservations.len()) else { return };
                let id = self.reservations.remove(i);
                self.reserved.remove(&id);
                self.dir.unreserve(id).expect("unreserve");
                assert!(matches!(self.dir.unreserve(id), Err(DirectoryError::UnknownReservation(_))));
            }
            Op::Settle => self.settle(),
            Op::Corrupt { region, page } => {
                let Some(i) = pick(region, self.regions.len()) else { return };
                let h = self.regions[i];
                self.corrupt(&h, page);
            }
            Op::Release { lease } => {
                let Some(i) = pick(lease, self.leases.len()) else { return };
                let (grant, h, written) = self.leases.remove(i);
                self.dir.release(grant.id).expect("release");
                assert!(matches!(self.dir.release(grant.id), Err(DirectoryError::UnknownLease(_))));
                if grant.mode == Mode::Write {
                    for (j, v) in written.iter().enumerate() {
                        self.model.insert(key(&h, grant.first_page + j as u32), *v);
                        self.lost.remove(&key(&h, grant.first_page + j as u32));
                    }
                }
            }
            Op::Migrate { region, device } => {
                let Some(i) = pick(region, self.regions.len()) else { return };
                let h = self.regions[i];
                match self.drive(|d| d.step_migrate(&h, DEVICES[device].0)) {
                    Ok(())
                    | Err(SimError::Dir(DirectoryError::LeasedElsewhere { .. } | DirectoryError::OutOfMemory { .. })) =>
                        {}
                    Err(SimError::CopyFailed) => {}
                    Err(SimError::Corrupt(_)) if self.lost_in(&h, 0, u32::MAX) => {}
                    Err(e) => panic!("migrate: {e}"),
                }
            }
            Op::Compact { device, frames } => match self.drive(|d| d.plan_compaction(DEVICES[device].0, frames)) {
                // Refusals the fabric reports as out of memory or as an invalid size (the allocator's other
                // refusals), and simulated copy failures.
                Ok(())
                | Err(SimError::Dir(
                    DirectoryError::OutOfMemory { .. }
                    | DirectoryError::CompactionImpossible { .. }
                    | DirectoryError::Allocator { .. },
                ))
                | Err(SimError::CopyFailed) => {}
                Err(e) => panic!("compact: {e}"),
            },
        }
    }

    /// Per reservation held: the frames it holds and the pages that may have taken its frames so far.
    fn reservation_marks(&self) -> HashMap<u64, (u64, u64)> {
        let held = |id: u64| self.dir.reserved(id).expect("a reservation held") / PAGE;
        self.reserved.iter().map(|(&id, r)| (id, (held(id), r.2))).collect()
    }

    /// Acquires pages `page..page + pages` (clipped to the region) on a device and checks the leased bytes;
    /// then starts the prefetch the directory asks for. Whether it was granted.
    fn acquire(&mut self, h: RegionHandle, page: u32, pages: u32, device: usize, write: bool) -> bool {
        let n = (h.len / PAGE) as u32;
        let (page, pages) = (page % n, pages.min(n - page % n));
        let mode = if write { Mode::Write } else { Mode::Read };
        let mut req = AcquireRequest::new(h, u64::from(page) * PAGE, u64::from(pages) * PAGE, DEVICES[device].0, mode);
        match self.drive(|d| d.step_acquire(&mut req)) {
            Ok(grant) => {
                let frames = grant.frames.frames();
                let mut expect = Vec::new();
                for (j, f) in frames.iter().enumerate() {
                    let got = self.mem.get(&(grant.device, *f)).copied().unwrap_or(0xDEAD);
                    assert_eq!(
                        got,
                        self.model[&key(&h, page + j as u32)],
                        "leased bytes of page {} of {h}",
                        page + j as u32
                    );
                    expect.push(got);
                }
                if write {
                    // The "kernel" writes every page through the lease.
                    let t0 = self.token();
                    for (j, f) in frames.iter().enumerate() {
                        self.mem.insert((grant.device, *f), t0 * 100 + j as u64);
                        expect[j] = t0 * 100 + j as u64;
                    }
                }
                self.leases.push((grant, h, expect));
                self.prefetch(&h, DEVICES[device].0);
                true
            }
            Err(SimError::Dir(DirectoryError::LeasedElsewhere { .. } | DirectoryError::OutOfMemory { .. })) => false,
            // A lossy region's pages in host memory are codes.
            Err(SimError::Dir(DirectoryError::PackedInHost(_))) if self.lossy => false,
            Err(SimError::CopyFailed) => false,
            // Only a range with a corrupted page fails with the corruption: other pages are unaffected.
            Err(SimError::Corrupt(_)) if self.lost_in(&h, page, pages) => false,
            Err(e) => panic!("acquire: {e}"),
        }
    }

    /// The packed tier a region stored with `compression` keeps its pages in (the one of its values' slots where
    /// the node has it, else the tier of bf16 slots), if any.
    fn packed_tier_of(&self, compression: Compression) -> Option<Location> {
        match compression.lossy()?.element {
            Element::F32 if self.f32_tier => Some(Location::Packed(Element::F32)),
            _ => Some(Location::Packed(Element::Bf16)),
        }
    }

    fn check(&mut self, after: &Op) {
        if let Err(e) = self.dir.check_invariants() {
            panic!("after {after:?}: {e}");
        }
        // A reservation never holds more than it set aside, and what it no longer holds pages took.
        for (&id, &(loc, pages, taken)) in &self.reserved {
            let held = self.dir.reserved(id).expect("a reservation held") / PAGE;
            assert!(held <= pages, "after {after:?}: reservation {id} on {loc} holds {held} of its {pages} pages");
            assert!(
                pages - held <= taken,
                "after {after:?}: reservation {id} on {loc} gave {} frames for {taken} pages that took them",
                pages - held
            );
        }
        // Every copy in a packed tier is a lossy region's, in the tier of its values.
        let tiers: Vec<(u8, Location)> = [Element::Bf16, Element::F32]
            .into_iter()
            .filter_map(|e| self.dir.dev(Location::Packed(e)).ok().map(|d| (d, Location::Packed(e))))
            .collect();
        for h in &self.regions {
            let r = self.dir.region(h).expect("live region");
            let want = self.packed_tier_of(r.placement.compression);
            for p in 0..(h.len / PAGE) as usize {
                for c in r.pages[p].copies() {
                    if let Some(&(_, tier)) = tiers.iter().find(|t| t.0 == c.dev) {
                        assert_eq!(Some(tier), want, "after {after:?}: page {p} of {h} in {tier}");
                    }
                }
            }
        }
        // Leased bytes stay put.
        for (grant, h, expect) in &self.leases {
            for (j, f) in grant.frames.frames().iter().enumerate() {
                let got = self.mem.get(&(grant.device, *f)).copied().unwrap_or(0xDEAD);
                assert_eq!(
                    got,
                    expect[j],
                    "after {after:?}: lease {} on {h} lost page {}",
                    grant.id,
                    grant.first_page + j as u32
                );
            }
        }
        // No page is lost.
        let write_leased: Vec<(u64, u32)> = self
            .leases
            .iter()
            .filter(|l| l.0.mode == Mode::Write)
            .flat_map(|l| (0..l.2.len() as u32).map(move |j| (l.1.addr.raw(), l.0.first_page + j)))
            .collect();
        for h in self.regions.clone() {
            for p in 0..(h.len / PAGE) as u32 {
                if write_leased.contains(&(h.addr.raw(), p)) {
                    continue;
                }
                match self.read_page(&h, p) {
                    Ok(v) => assert_eq!(v, self.model[&key(&h, p)], "after {after:?}: page {p} of {h}"),
                    Err(SimError::Corrupt(_)) if self.lost.contains(&key(&h, p)) => {}
                    Err(e) => panic!("after {after:?}: reading page {p} of {h}: {e}"),
                }
            }
        }
    }
}

fn sim(fail_every: u64) -> Sim {
    sim_with(fail_every, 90, 75)
}

/// The same GPUs with a small host memory and a storage tier below it: host memory fills and spills to storage.
const WITH_STORAGE: [(Location, u64); 4] = [
    (Location::Gpu(0), 8 * PAGE),
    (Location::Gpu(1), 6 * PAGE),
    (Location::Host, 10 * PAGE),
    (Location::Storage, 48 * PAGE),
];

/// The same with packed tiers beside a smaller host memory: some regions are lossy (of bf16 or fp32 values), and
/// their pages leaving a GPU go to the slots of the packed tier of their values (10 bf16 slots, 8 fp32 ones),
/// never to host memory's frames.
fn with_packed() -> [(Location, u64); 6] {
    let (bf16, f32) = (Location::Packed(Element::Bf16), Location::Packed(Element::F32));
    [
        (Location::Gpu(0), 8 * PAGE),
        (Location::Gpu(1), 6 * PAGE),
        (Location::Host, 6 * PAGE),
        (bf16, 10 * bf16.frame_bytes(PAGE)),
        (f32, 8 * f32.frame_bytes(PAGE)),
        (Location::Storage, 48 * PAGE),
    ]
}

/// The same GPUs with a compressed tier of 6 pages' bytes (96 blocks) between host memory and storage: the
/// pages of lossless regions (a third of them) that leave a GPU move there by their packed length.
const WITH_COMPRESSED: [(Location, u64); 5] = [
    (Location::Gpu(0), 8 * PAGE),
    (Location::Gpu(1), 6 * PAGE),
    (Location::Host, 10 * PAGE),
    (Location::Compressed, 6 * PAGE),
    (Location::Storage, 48 * PAGE),
];

/// Only the packed tier of bf16 slots: lossy regions of fp32 values take its slots too.
fn with_bf16_slots() -> Vec<(Location, u64)> {
    with_packed().into_iter().filter(|d| d.0 != Location::Packed(Element::F32)).collect()
}

fn sim_with(fail_every: u64, high: u8, low: u8) -> Sim {
    sim_on(&DEVICES, fail_every, high, low)
}

fn sim_on(devices: &[(Location, u64)], fail_every: u64, high: u8, low: u8) -> Sim {
    let cfg = DirectoryConfig {
        page_size: PageSize::KIB_64,
        headroom_percent: 0,
        high_watermark_percent: high,
        low_watermark_percent: low,
        ..DirectoryConfig::default()
    };
    Sim {
        dir: Directory::new(cfg, devices).expect("directory"),
        mem: HashMap::new(),
        model: HashMap::new(),
        regions: Vec::new(),
        leases: Vec::new(),
        reservations: Vec::new(),
        reserved: HashMap::new(),
        aborts: 0,
        next_token: 0,
        stages: 0,
        fail_every,
        prefetch: VecDeque::new(),
        fetches: 0,
        evicted: 0,
        compacted: 0,
        prefetched: 0,
        staged: 0,
        packed: 0,
        lossy: devices.iter().any(|d| d.0.is_packed()),
        f32_tier: devices.iter().any(|d| d.0 == Location::Packed(Element::F32)),
        sums: HashMap::new(),
        lost: HashSet::new(),
        corruptions: 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn directory_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..80), fail_every in prop_oneof![Just(0u64), 3u64..9]) {
        run_model(sim(fail_every), &ops)?;
    }

    #[test]
    fn with_a_packed_tier_the_directory_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..80), fail_every in prop_oneof![Just(0u64), 3u64..9], bf16_slots_only in any::<bool>()) {
        let devices = if bf16_slots_only { with_bf16_slots() } else { with_packed().to_vec() };
        run_model(sim_on(&devices, fail_every, 90, 75), &ops)?;
    }

    #[test]
    fn with_a_compressed_tier_the_directory_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..80), fail_every in prop_oneof![Just(0u64), 3u64..9], storage in any::<bool>()) {
        let devices: Vec<_> = WITH_COMPRESSED.into_iter().filter(|d| storage || d.0 != Location::Storage).collect();
        run_model(sim_on(&devices, fail_every, 90, 75), &ops)?;
    }

    #[test]
    fn with_a_storage_tier_the_directory_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..80), fail_every in prop_oneof![Just(0u64), 3u64..9]) {
        run_model(sim_on(&WITH_STORAGE, fail_every, 90, 75), &ops)?;
    }
}

/// [`op`]s among which one in five corrupts a stored page.
fn corrupting_op() -> impl Strategy<Value = Op> {
    prop_oneof![4 => op(), 1 => (0usize..8, 0u32..6).prop_map(|(region, page)| Op::Corrupt { region, page })]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// From a region whose first pages went down to the storage tier, with stored pages often corrupted: no read
    /// or lease sees a corrupted token, only the corrupted pages fail (with the corruption), and the stages that
    /// read them are aborted leaving the directory consistent.
    #[test]
    fn with_a_storage_tier_corrupted_pages_never_read_back_wrong(ops in proptest::collection::vec(corrupting_op(), 1..80), fail_every in prop_oneof![Just(0u64), 3u64..9]) {
        let (mut s, _) = spilled(24, 3);
        s.fail_every = fail_every;
        run_model(s, &ops)?;
    }
}

/// Applies `ops`, checking the model after each, then releases and frees everything and checks every frame
/// came back.
fn run_model(mut s: Sim, ops: &[Op]) -> Result<(), TestCaseError> {
    {
        for op in ops {
            let before = s.reservation_marks();
            let aborts = s.aborts;
            s.apply(op);
            s.check(op);
            // Within one operation, a reservation gives out no more frames than pages took, and gains frames
            // only when a stage aborted (its frames back from the pages that would have taken them).
            for (id, (held, taken)) in s.reservation_marks() {
                let Some(&(held0, taken0)) = before.get(&id) else { continue };
                prop_assert!(
                    held0.saturating_sub(held) <= taken - taken0,
                    "{:?}: reservation {} went from {} to {} frames for {} pages that took them",
                    op,
                    id,
                    held0,
                    held,
                    taken - taken0
                );
                prop_assert!(
                    held <= held0 || s.aborts > aborts,
                    "{:?}: reservation {} grew: {} to {}",
                    op,
                    id,
                    held0,
                    held
                );
            }
        }
        for (grant, _, _) in std::mem::take(&mut s.leases) {
            s.dir.release(grant.id).expect("release");
        }
        for h in std::mem::take(&mut s.regions) {
            s.drive(|d| d.free(&h)).expect("free");
        }
        for id in std::mem::take(&mut s.reservations) {
            s.dir.unreserve(id).expect("unreserve");
        }
        while !s.prefetch.is_empty() {
            s.settle();
        }
        let st = s.dir.stats();
        prop_assert_eq!(st.regions, 0);
        prop_assert!(st.devices.iter().all(|d| d.used == 0), "every frame back: {:?}", st.devices);
    }
    Ok(())
}

/// Allocates a region of `pages` pages placed as `placement`, writes it 3 pages at a time, and walks it two
/// pages at a time on GPU 0 then GPU 1 (every fifth acquire for writing), checking the model after each step.
fn write_and_walk_both_gpus(s: &mut Sim, pages: u32, placement: Placement) {
    let h = s.dir.alloc(u64::from(pages) * PAGE, placement).expect("alloc");
    for p in 0..pages {
        s.model.insert(key(&h, p), 0);
    }
    s.regions.push(h);
    let w = Op::Write { region: 0, page: 0, pages: 3 };
    for start in (0..pages).step_by(3) {
        s.apply(&Op::Write { region: 0, page: start, pages: 3 });
        s.check(&w);
    }
    for round in 0..2 {
        for p in 0..pages {
            let op = Op::Acquire { region: 0, page: p, pages: 2, device: round, write: p % 5 == 0 };
            s.apply(&op);
            s.check(&op);
            s.apply(&Op::Release { lease: 0 });
            s.check(&op);
        }
    }
}

/// A region larger than a GPU is written whole (pages beyond the GPU spill to host memory), read back, and
/// acquired piece by piece on the GPU (fetching and evicting as it goes).
#[test]
fn oversubscribed_region_round_trips() {
    let mut s = sim(0);
    write_and_walk_both_gpus(&mut s, 30, Placement::on(Location::Gpu(0)));
    let st = s.dir.stats();
    assert!(st.devices[0].used <= 8 && st.devices[1].used <= 6, "{st:?}");
}

/// A lossless region three times a GPU, written and walked on both GPUs over a compressed tier and a storage
/// tier: its pages leave the GPUs for host memory and move on into the compressed tier by their packed length
/// (whose full runs make room by evicting to the storage tier), come back from there and from storage, and
/// every read sees the last write; the compressed tier is empty once the region is freed.
#[test]
fn lossless_pages_go_through_the_compressed_tier() {
    let mut s = sim_on(&WITH_COMPRESSED, 0, 90, 75);
    let lz4 = Placement { compression: Compression::Lz4, ..Placement::on(Location::Gpu(0)) };
    write_and_walk_both_gpus(&mut s, 24, lz4);
    let tier = s.dir.dev(Location::Compressed).expect("compressed tier");
    let held = s.dir.stats().devices[usize::from(tier)].copies;
    assert!(s.packed >= 8 && held > 0, "{} pages packed, {held} held in the compressed tier", s.packed);
    let op = Op::Free { region: 0 };
    s.apply(&op);
    s.check(&op);
    assert_eq!(s.dir.stats().devices[usize::from(tier)].used, 0, "a freed region left blocks in the compressed tier");
}

/// A lease wants one run of frames: a fragmented device is compacted first, and with a leased frame in every
/// window the lease gets one pointer per page instead.
#[test]
fn leases_get_one_run_through_compaction_or_fall_back_to_pages() {
    let mut s = sim_with(0, 100, 100);
    // Fill GPU 0 (8 frames) with 8 one-page regions, then free every other one: 4 free frames, none adjacent.
    let mut hs = Vec::new();
    for _ in 0..8 {
        let h = s.dir.alloc(PAGE, Placement::on(Location::Gpu(0))).expect("alloc");
        s.model.insert(key(&h, 0), 0);
        s.regions.push(h);
        hs.push(h);
    }
    for i in 0..8 {
        s.apply(&Op::Write { region: i, page: 0, pages: 1 });
    }
    assert_eq!(s.dir.stats().devices[0].used, 8);
    for i in [6usize, 4, 2, 0] {
        s.apply(&Op::Free { region: i });
    }
    let st = s.dir.stats();
    assert_eq!((st.devices[0].used, st.devices[0].largest_free_run), (4, 1), "{st:?}");
    let big = s.dir.alloc(3 * PAGE, Placement::on(Location::Host)).expect("alloc");
    for p in 0..3 {
        s.model.insert(key(&big, p), 0);
    }
    s.regions.push(big);
    let idx = s.regions.len() - 1;
    s.apply(&Op::Write { region: idx, page: 0, pages: 3 });
    let acquire = Op::Acquire { region: idx, page: 0, pages: 3, device: 0, write: false };
    s.apply(&acquire);
    s.check(&acquire);
    let (grant, _, _) = s.leases.last().expect("granted");
    assert!(
        matches!(grant.frames, vfabric::directory::LeaseFrames::Run { len: 3, .. }),
        "compacted into a run: {grant:?}"
    );
    s.apply(&Op::Release { lease: 0 });
    // Now pin one frame in every window: lease each of the 4 one-page regions still there... they hold frames
    // spread over the device; ask for a run longer than any leased-free window.
    for i in 0..4 {
        s.apply(&Op::Acquire { region: i, page: 0, pages: 1, device: 0, write: false });
    }
    let pinned = s.leases.len();
    let acquire = Op::Acquire { region: idx, page: 0, pages: 3, device: 0, write: false };
    s.apply(&acquire);
    s.check(&acquire);
    if s.leases.len() > pinned {
        let (grant, _, _) = s.leases.last().expect("granted");
        let frames = grant.frames.frames();
        assert_eq!(frames.len(), 3);
    }
}

/// A full device gives a lease its run by emptying one window of frames, whose pages are written back and only
/// dropped, not by evicting the least recently used pages wherever they lie and then moving others within the
/// device to join the holes.
#[test]
fn a_full_device_empties_one_window_for_a_run() {
    let mut s = sim_with(0, 100, 100);
    // Eight one-page regions written on the host, each leased once on GPU 0 (8 frames): the GPU holds a copy of
    // each, the host's copy stays, so every GPU copy can simply be dropped.
    for i in 0..8 {
        let h = s.dir.alloc(PAGE, Placement::on(Location::Host)).expect("alloc");
        s.model.insert(key(&h, 0), 0);
        s.regions.push(h);
        s.apply(&Op::Write { region: i, page: 0, pages: 1 });
    }
    let touch = |s: &mut Sim, i: usize| {
        let op = Op::Acquire { region: i, page: 0, pages: 1, device: 0, write: false };
        s.apply(&op);
        s.check(&op);
        let last = s.leases.len() - 1;
        s.apply(&Op::Release { lease: last });
    };
    for i in 0..8 {
        touch(&mut s, i);
    }
    // Used again in another order: the least recently used frames are now every other one.
    for i in [1, 3, 5, 7] {
        touch(&mut s, i);
    }
    let st = s.dir.stats();
    assert_eq!((st.devices[0].used, st.devices[0].largest_free_run), (8, 0), "{st:?}");
    let big = s.dir.alloc(3 * PAGE, Placement::on(Location::Host)).expect("alloc");
    for p in 0..3 {
        s.model.insert(key(&big, p), 0);
    }
    s.regions.push(big);
    s.apply(&Op::Write { region: 8, page: 0, pages: 3 });
    let acquire = Op::Acquire { region: 8, page: 0, pages: 3, device: 0, write: false };
    s.apply(&acquire);
    s.check(&acquire);
    let (grant, _, _) = s.leases.last().expect("granted");
    assert!(matches!(grant.frames, vfabric::directory::LeaseFrames::Run { len: 3, .. }), "one run: {grant:?}");
    assert_eq!(s.compacted, 0, "no page moved within the device");
    // Three pages left the GPU (dropped: their host copies stayed), the other five are still there.
    assert_eq!(s.dir.stats().devices[0].used, 8);
    for i in 0..8 {
        let op = Op::Read { region: i, page: 0, pages: 1 };
        s.apply(&op);
        s.check(&op);
    }
}

/// A walk in order prefetches: after the first two acquires, every page arrives by prefetch (once), none by an
/// acquire's own fetch, and every page still holds the right bytes. Half the copies are made late, so an
/// acquire granted before its prefetch settled would see the wrong bytes.
#[test]
fn sequential_walks_prefetch() {
    let mut s = sim(0);
    let pages = 30u32;
    let h = s.dir.alloc(u64::from(pages) * PAGE, Placement::on(Location::Host)).expect("alloc");
    for p in 0..pages {
        s.model.insert(key(&h, p), 0);
    }
    s.regions.push(h);
    s.apply(&Op::Write { region: 0, page: 0, pages: 3 });
    for start in (3..pages).step_by(3) {
        s.apply(&Op::Write { region: 0, page: start, pages: 3 });
    }
    let (fetches, prefetched) = (s.fetches, s.prefetched);
    for p in 0..pages {
        let op = Op::Acquire { region: 0, page: p, pages: 1, device: 0, write: false };
        s.apply(&op);
        s.check(&op);
        s.apply(&Op::Release { lease: 0 });
    }
    assert_eq!(s.fetches - fetches, 2, "acquires that fetched their own pages");
    assert_eq!(s.prefetched - prefetched, u64::from(pages) - 2, "pages prefetched");
}

/// Regression (found by the model test): a host write whose first stage gave never-written pages frames and
/// whose later stage failed left those pages with whatever their frames held; they must still read as zeros.
#[test]
fn a_failed_write_leaves_new_pages_reading_zero() {
    use Op::*;
    let ops = [
        Alloc { pages: 3, device: 0 },
        Acquire { region: 0, page: 2, pages: 1, device: 2, write: false },
        Acquire { region: 0, page: 2, pages: 1, device: 1, write: false },
        Alloc { pages: 4, device: 2 },
        Alloc { pages: 5, device: 1 },
        Write { region: 2, page: 2, pages: 2 },
        Write { region: 0, page: 0, pages: 1 },
        Acquire { region: 2, page: 2, pages: 1, device: 2, write: false },
        Alloc { pages: 1, device: 0 },
        Write { region: 0, page: 1, pages: 1 },
        Acquire { region: 0, page: 3, pages: 1, device: 2, write: false },
        Write { region: 1, page: 0, pages: 1 },
        Alloc { pages: 1, device: 0 },
        Acquire { region: 0, page: 0, pages: 1, device: 1, write: false },
        Acquire { region: 2, page: 3, pages: 1, device: 0, write: false },
        Acquire { region: 3, page: 0, pages: 1, device: 0, write: false },
        Alloc { pages: 1, device: 0 },
        Acquire { region: 7, page: 0, pages: 3, device: 1, write: false },
        Alloc { pages: 1, device: 2 },
        Write { region: 4, page: 0, pages: 1 },
        Write { region: 2, page: 5, pages: 2 },
    ];
    let mut s = sim(8);
    for op in &ops {
        s.apply(op);
        s.check(op);
    }
}

/// A prefetch on a fragmented GPU compacts it first, so its chunk lands in one run and the acquire that reaches
/// it gets one pointer without gathering; a second prefetch is taken while the first is in flight (its frames
/// pinned, which `check_invariants` checks), and every byte is right throughout.
#[test]
fn prefetch_makes_a_run_on_a_fragmented_gpu() {
    use Op::*;
    let mut s = sim_with(0, 100, 100);
    // GPU 0's 8 frames: 8 one-page regions, then every other one freed.
    for _ in 0..8 {
        s.apply(&Alloc { pages: 1, device: 0 });
    }
    for i in 0..8 {
        s.apply(&Write { region: i, page: 0, pages: 1 });
    }
    for i in [7usize, 5, 3, 1] {
        s.apply(&Free { region: i });
    }
    assert_eq!(s.dir.stats().devices[0].largest_free_run, 1);
    s.apply(&Alloc { pages: 12, device: 2 });
    let big = s.regions.len() - 1;
    for p in (0..12).step_by(3) {
        s.apply(&Write { region: big, page: p, pages: 3 });
    }
    let walk = Walk { region: big, page: 0, pages: 1, device: 0, steps: 2 };
    s.apply(&walk);
    s.check(&walk);
    assert_eq!(s.prefetch.len(), 2, "two prefetches in flight");
    assert_eq!(s.prefetched, 4, "two chunks of two pages");
    let lease = s.leases.len() - 1;
    s.apply(&Release { lease });
    let op = Acquire { region: big, page: 2, pages: 2, device: 0, write: false };
    s.apply(&op);
    s.check(&op);
    let (grant, _, _) = s.leases.last().expect("granted");
    assert!(matches!(grant.frames, vfabric::directory::LeaseFrames::Run { len: 2, .. }), "one run: {grant:?}");
}

/// A walk of two pages a step over a region whose pages a random walk left scattered on the GPU: prefetch
/// moves the scattered pages into each chunk's run with the pages it brings, so the walk's leases are runs,
/// and every byte is right (half the copies made late, as a device might).
#[test]
fn prefetch_moves_scattered_pages_into_runs() {
    use Op::*;
    let mut s = sim_with(0, 100, 100);
    s.apply(&Alloc { pages: 16, device: 2 });
    for p in (0..16).step_by(4) {
        s.apply(&Write { region: 0, page: p, pages: 4 });
    }
    for p in [9u32, 5, 13, 6] {
        s.apply(&Acquire { region: 0, page: p, pages: 1, device: 0, write: false });
        s.apply(&Release { lease: 0 });
    }
    let (mut runs, fetches) = (0, s.fetches);
    for p in (0..16).step_by(2) {
        let op = Acquire { region: 0, page: p, pages: 2, device: 0, write: false };
        s.apply(&op);
        s.check(&op);
        let (grant, _, _) = s.leases.last().expect("granted");
        runs += u32::from(matches!(grant.frames, vfabric::directory::LeaseFrames::Run { .. }));
        s.apply(&Release { lease: 0 });
        s.check(&op);
    }
    assert_eq!(runs, 8, "every lease of the walk is one run");
    assert_eq!(s.fetches - fetches, 2, "only the first two acquires fetched or gathered pages themselves");
    assert!(s.prefetched >= 8, "the walk prefetched, moves included: {}", s.prefetched);
    while !s.prefetch.is_empty() {
        s.settle();
    }
    // Again from the start, after scattering a few pages: with a prefetch moving one of them into a run, a
    // one-page acquire of it must wait for the move rather than lease the frame the move is about to free.
    for p in [2u32, 6, 3] {
        s.apply(&Acquire { region: 0, page: p, pages: 1, device: 1, write: true });
        s.apply(&Release { lease: 0 });
        s.apply(&Acquire { region: 0, page: p, pages: 1, device: 0, write: false });
        s.apply(&Release { lease: 0 });
    }
    let walk = Walk { region: 0, page: 0, pages: 2, device: 0, steps: 1 };
    s.apply(&walk);
    s.apply(&Release { lease: 0 });
    let walk = Walk { region: 0, page: 2, pages: 2, device: 0, steps: 1 };
    s.apply(&walk);
    s.check(&walk);
    assert!(!s.prefetch.is_empty(), "a prefetch in flight");
    let op = Acquire { region: 0, page: 6, pages: 1, device: 0, write: false };
    s.apply(&op);
    s.check(&op);
    while !s.prefetch.is_empty() {
        s.settle();
        s.check(&Settle);
    }
}

#[test]
fn written_back_pages_leave_a_full_gpu_without_a_copy() {
    let mut s = sim(0);
    s.apply(&Op::Alloc { pages: 4, device: 0 });
    s.apply(&Op::Acquire { region: 0, page: 0, pages: 4, device: 0, write: true });
    s.apply(&Op::Release { lease: 0 });
    let h = s.regions[0];
    assert!(s.dir.region(&h).unwrap().pages.iter().all(|p| p.dirty()), "written on the GPU: its only copy");
    // A write-back of the whole region: one stage in flight, the GPU copies pinned meanwhile.
    s.apply(&Op::Hint { region: 0, page: 0, pages: 4, device: 0, write_back: true });
    assert_eq!(s.prefetch.len(), 1);
    assert_eq!((s.prefetch[0].0.kind, s.prefetch[0].0.pages()), (StageKind::WriteBack, 4));
    s.check(&Op::Settle);
    // An acquire of the pages waits for it, and finds them in place, with a host copy beside each.
    s.apply(&Op::Acquire { region: 0, page: 0, pages: 4, device: 0, write: false });
    assert!(s.prefetch.is_empty());
    s.apply(&Op::Release { lease: 0 });
    assert!(s.dir.region(&h).unwrap().pages.iter().all(|p| p.copies().count() == 2 && !p.dirty()));
    // Nothing left to write back.
    s.apply(&Op::Hint { region: 0, page: 0, pages: 4, device: 0, write_back: true });
    assert!(s.prefetch.is_empty());
    // Another region fills GPU 0: region 0's pages leave it by dropping the GPU copies, no copy made.
    s.apply(&Op::Alloc { pages: 7, device: 0 });
    s.apply(&Op::Acquire { region: 1, page: 0, pages: 7, device: 0, write: true });
    assert_eq!(s.leases.len(), 1, "the acquire was granted");
    assert_eq!(s.evicted, 0, "written-back pages are dropped, not copied");
    s.check(&Op::Settle);
    // Then a range prefetch brings region 0 back to GPU 1 in one stage, and the acquire finds it in one run.
    s.apply(&Op::Hint { region: 0, page: 0, pages: 4, device: 1, write_back: false });
    assert_eq!((s.prefetch[0].0.kind, s.prefetch[0].0.pages()), (StageKind::Prefetch, 4));
    let fetches = s.fetches;
    s.apply(&Op::Acquire { region: 0, page: 0, pages: 4, device: 1, write: false });
    assert_eq!(s.fetches, fetches, "no fetch of its own");
    assert!(matches!(s.leases[1].0.frames, vfabric::directory::LeaseFrames::Run { len: 4, .. }));
    s.check(&Op::Settle);
}

#[test]
fn a_region_far_beyond_the_node_costs_what_it_uses() {
    // 200 TiB of 64 KiB pages.
    let mut s = sim(0);
    let h = s.dir.alloc(200 << 40, Placement::on(DEVICES[0].0)).expect("a 200 TiB region");
    // 3.3 G pages, whose entries would take 107 GB made up front: a pointer per 1,024 of them, 26 MB.
    let before = s.dir.stats().metadata_bytes;
    assert!(before < 32 << 20, "the directory's tables take {before} bytes");
    // Its last page, written and acquired like any other.
    let last = (h.len / PAGE) as u32 - 1;
    let mut req = AcquireRequest::new(h, u64::from(last) * PAGE, PAGE, DEVICES[0].0, Mode::Write);
    let grant = s.drive(|d| d.step_acquire(&mut req)).expect("acquire the last page");
    s.dir.release(grant.id).expect("release");
    assert_eq!(s.dir.stats().pages, (200u64 << 40) / PAGE);
    assert_eq!(s.dir.stats().unbacked, (200u64 << 40) / PAGE - 1, "one page has a copy");
    s.dir.check_invariants().expect("invariants");
    assert!(matches!(s.dir.free(&h), Ok(Step::Done(()))));
    // Past the limits, typed errors and nothing taken: more pages than a page index names, and more than the
    // node's 256 TiB of address space left.
    assert!(matches!(s.dir.alloc(300 << 40, Placement::default()), Err(DirectoryError::TooManyPages { .. })));
    let again = s.dir.alloc(200 << 40, Placement::default()).expect("the space is free again");
    assert!(matches!(s.dir.alloc(100 << 40, Placement::default()), Err(DirectoryError::AddressSpaceExhausted(_))));
    assert_eq!(s.dir.stats().regions, 1);
    assert!(matches!(s.dir.free(&again), Ok(Step::Done(()))));
}

/// A storage-tier simulation with one region of `pages` on GPU 0 (larger than it and host memory together),
/// written `step` pages at a time, checked after each write: its later pages went down to storage.
fn spilled(pages: u32, step: u32) -> (Sim, RegionHandle) {
    let mut s = sim_on(&WITH_STORAGE, 0, 90, 75);
    let h = s.dir.alloc(u64::from(pages) * PAGE, Placement::on(Location::Gpu(0))).expect("alloc");
    for p in 0..pages {
        s.model.insert(key(&h, p), 0);
    }
    s.regions.push(h);
    for start in (0..pages).step_by(step as usize) {
        let w = Op::Write { region: 0, page: start, pages: step };
        s.apply(&w);
        s.check(&w);
    }
    (s, h)
}

/// A region larger than a GPU and host memory together: writes spill from the GPU to host memory and from
/// host memory to the storage tier; every page reads back right, and acquires on both GPUs bring stored pages
/// back through host memory (never a copy between storage and a GPU), with write leases among them.
#[test]
fn pages_spill_to_the_storage_tier_and_come_back_through_host_memory() {
    let (mut s, h) = spilled(30, 3);
    let pages = 30u32;
    let stored = |s: &Sim| s.dir.stats().devices[3].owned;
    assert!(stored(&s) >= 12, "pages past GPU 0 and host memory went to storage: {:?}", s.dir.stats().devices);
    let mut max_stored = 0;
    for round in 0..2 {
        for p in 0..pages {
            let op = Op::Acquire { region: 0, page: p, pages: 2, device: round, write: p % 7 == 0 };
            s.apply(&op);
            s.check(&op);
            assert_eq!(s.leases.len(), 1, "{op:?} was granted");
            s.apply(&Op::Release { lease: 0 });
            s.check(&op);
            max_stored = max_stored.max(stored(&s));
        }
    }
    assert!(max_stored > 0);
    // Storage holds pages, not leases; it is no region's home and takes no prefetch.
    let mut req = AcquireRequest::new(h, 0, PAGE, Location::Storage, Mode::Read);
    assert!(matches!(s.dir.step_acquire(&mut req), Err(DirectoryError::StorageTier(_))));
    assert!(matches!(s.dir.alloc(PAGE, Placement::on(Location::Storage)), Err(DirectoryError::StorageTier(_))));
    assert!(matches!(s.dir.step_prefetch_range(&h, 0, PAGE, Location::Storage), Err(DirectoryError::StorageTier(_))));
    s.dir.check_invariants().expect("invariants");
}

/// A page of the storage tier that a bad drive corrupted (its bytes changed, not their checksum): the stages that
/// read it (an acquire's fetch, a walk's prefetch) fail its checksum and are aborted, leaving the directory
/// consistent and the page where it was; its host reads fail with the corruption, never returning the corrupted
/// bytes; every other page reads and leases right; and freeing the region gives every frame back.
#[test]
fn a_corrupted_stored_page_fails_its_reads_and_nothing_else() {
    let (mut s, h) = spilled(30, 3);
    let storage = s.dir.dev(Location::Storage).expect("a storage tier");
    let only_stored = |s: &Sim, p: u32| {
        let e = &s.dir.region(&h).expect("live region").pages[p as usize];
        e.copies().count() == 1 && e.copy_on(storage).is_some()
    };
    let p = (0..30).find(|&p| only_stored(&s, p)).expect("a page only on the storage tier");
    let frame = s.dir.region(&h).unwrap().pages[p as usize].copy_on(storage).unwrap().frame;
    let op = Op::Corrupt { region: 0, page: p };
    s.apply(&op);
    s.check(&op);
    match s.read_page(&h, p) {
        Err(SimError::Corrupt(StorageError::Corrupt { slot, .. })) => assert_eq!(slot, u64::from(frame)),
        other => panic!("a host read of the corrupted page: {other:?}"),
    }
    // Its fetch to a GPU fails the checksum and is aborted: no lease, the page still where it was.
    let op = Op::Acquire { region: 0, page: p, pages: 1, device: 0, write: false };
    s.apply(&op);
    s.check(&op);
    assert!(s.leases.is_empty(), "a lease of the corrupted page");
    assert_eq!(s.corruptions, 1, "stages failed by the corruption");
    assert!(only_stored(&s, p), "the aborted fetch moved the page");
    // Every other page, walked in order on each GPU (prefetching the corrupted page along the way, which fails
    // in turn), is leased with the right bytes.
    for round in 0..2 {
        for q in (0..30).filter(|&q| q != p) {
            let op = Op::Acquire { region: 0, page: q, pages: 1, device: round, write: q % 7 == 0 };
            s.apply(&op);
            s.check(&op);
            assert_eq!(s.leases.len(), 1, "{op:?} was granted");
            s.apply(&Op::Release { lease: 0 });
            s.check(&op);
        }
    }
    assert!(s.corruptions >= 1 && s.lost.contains(&key(&h, p)));
    // The corrupted page still fails, every frame comes back.
    assert!(matches!(s.read_page(&h, p), Err(SimError::Corrupt(_))));
    while !s.prefetch.is_empty() {
        s.settle();
    }
    let op = Op::Free { region: 0 };
    s.apply(&op);
    s.check(&op);
    let st = s.dir.stats();
    assert!(st.regions == 0 && st.devices.iter().all(|d| d.used == 0), "every frame back: {:?}", st.devices);
}

/// A walk in order on a GPU over pages that went down to the storage tier: the prefetch brings each chunk's
/// stored pages to host memory ahead of the walk (file reads while it works), then on to the GPU, and every
/// leased byte is right.
#[test]
fn a_walk_prefetches_stored_pages_through_host_memory() {
    let (mut s, _) = spilled(40, 4);
    let pages = 40u32;
    assert!(s.dir.stats().devices[3].owned >= 20, "most pages went down to storage");
    for start in (0..pages).step_by(2) {
        let op = Op::Acquire { region: 0, page: start, pages: 2, device: 0, write: false };
        s.apply(&op);
        s.check(&op);
        assert_eq!(s.leases.len(), 1, "{op:?} was granted");
        s.apply(&Op::Release { lease: 0 });
    }
    assert!(s.staged >= 10, "stored pages came up ahead of the walk: {} staged", s.staged);
    while !s.prefetch.is_empty() {
        s.settle();
    }
    s.dir.check_invariants().expect("invariants");
}

/// Pages never move within the packed tier (only coded moves reach it): a prefetch to host memory of a lossy
/// region whose pages sit in the tier out of order leaves them where they are rather than gathering them into
/// a run, and the tier is not compacted; slots set aside there are held and given back.
#[test]
fn the_packed_tier_takes_no_runs_and_no_compaction() {
    let mut s = sim_on(&with_packed(), 0, 90, 75);
    s.apply(&Op::Alloc { pages: 4, device: 0 });
    let h = s.regions[0];
    assert!(s.dir.region(&h).unwrap().placement.compression.is_lossy(), "4-page regions are lossy here");
    s.apply(&Op::Acquire { region: 0, page: 0, pages: 4, device: 0, write: true });
    s.apply(&Op::Release { lease: 0 });
    // Written back last page first, each into the next free slot: the region's slots run backwards.
    for p in (0..4).rev() {
        s.apply(&Op::Hint { region: 0, page: p, pages: 1, device: 0, write_back: true });
        s.apply(&Op::Settle);
        s.check(&Op::Settle);
    }
    let packed = s.dir.dev(Location::Packed(Element::Bf16)).unwrap();
    let slots: Vec<u32> = (0..4)
        .map(|i| s.dir.region(&h).unwrap().pages[i].copy_on(packed).expect("a copy in the packed tier").frame)
        .collect();
    assert!(slots.windows(2).all(|w| w[0] > w[1]), "slots {slots:?}");
    match s.dir.step_prefetch_range(&h, 0, 4 * PAGE, Location::Host) {
        Ok(Step::Done(None)) => {}
        Ok(Step::Done(Some(stage))) => panic!("pages moved within the packed tier: {:?}", stage.batches),
        other => panic!("a prefetch to host memory: {other:?}"),
    }
    assert!(matches!(s.dir.plan_compaction(Location::Packed(Element::Bf16), 4), Err(DirectoryError::PackedTier(_))));
    let id = match s.dir.step_reserve(Location::Packed(Element::Bf16), 2 * PAGE, Default::default()) {
        Ok(Step::Done(id)) => id,
        other => panic!("reserving slots of the packed tier: {other:?}"),
    };
    let used =
        |s: &Sim| s.dir.stats().devices.iter().find(|d| d.location == Location::Packed(Element::Bf16)).unwrap().used;
    s.dir.unreserve(id).expect("unreserve");
    assert_eq!(used(&s), 4, "the region's slots, the reservation's given back");
    s.check(&Op::Settle);
}
