//! The fabric conformance suite: what the embedded fabric must do on any device layer, byte for byte. Run on the
//! emulated device in CI (`tests/emulated_fabric.rs`) and on GPUs (`tests/gpu.rs`).
//!
//! Each check takes a cluster configuration (its device backend and budgets decide where it runs) and panics
//! with a message that names the case when the fabric misbehaves.

use vfabric::{ClusterConfig, Compression, Fabric, FabricError, Lease, LeasePtr, Mode, Placement, Region};
use vfabric_allocator::{TenantId, Tier};
use vfabric_transport::{EngineChoice, Location};

use crate::fabric_rig::{fabric, frames_of, gpus, read_through_lease, with_storage, write_pattern};
use crate::pattern;

/// Where the storage checks put their tier's file: `VFABRIC_TEST_DIR` when set, else the build's scratch folder
/// (`built`, cargo's `CARGO_TARGET_TMPDIR`) where it exists, else the system's temporary folder: the GPU machine
/// runs test executables built on another machine, whose folders it does not have.
pub fn scratch_dir(built: &str) -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("VFABRIC_TEST_DIR") {
        return dir.into();
    }
    let built = std::path::Path::new(built);
    if built.is_dir() {
        built.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn check_region(f: &Fabric, r: &Region, seed: u64, what: &str) {
    let mut buf = vec![0u8; r.len as usize];
    f.read(r, 0, &mut buf).expect("read");
    if let Some(at) = pattern::first_mismatch(seed, 0, &buf) {
        panic!("{what}: byte {at} of the region differs");
    }
}

/// A region larger than a GPU is written (the GPU fills up and pages go to host memory), read back, acquired
/// piece by piece on every GPU (evicted pages come back, others leave), and every byte is right, both through
/// host reads and in the device copies the leases point to.
pub fn eviction_and_fetch_keep_every_byte(cfg: &ClusterConfig) {
    let f = fabric(cfg);
    let g = gpus(&f);
    let ps = f.page_size();
    let pages = frames_of(&f, g[0]) * 3 / 2;
    let r = f.alloc(pages * ps, Placement::on(g[0])).expect("alloc");
    write_pattern(&f, &r, 41);
    let t = f.traffic();
    assert!(t.evicted > 0, "writing more than the GPU holds evicted pages: {t:?}");
    check_region(&f, &r, 41, "after the write");
    let step = (frames_of(&f, g[0]) / 3).max(1) * ps;
    for &dev in &g {
        let mut off = 0;
        while off < r.len {
            let end = (off + step).min(r.len);
            let lease = f.acquire(&r, off..end, dev, Mode::Read).expect("acquire");
            assert!(matches!(lease.ptr(), LeasePtr::Contiguous { .. }), "one run on an unfragmented device");
            let got = read_through_lease(&f, &lease);
            assert_eq!(pattern::first_mismatch(41, off, &got), None, "{dev}: leased pages at {off:#x}");
            f.release(lease).expect("release");
            off = end;
        }
    }
    let t2 = f.traffic().since(&t);
    assert!(t2.fetched > 0, "acquiring evicted pages fetched them: {t2:?}");
    check_region(&f, &r, 41, "after the acquires");
    f.free(&r).expect("free");
}

/// A walk in order, page by page, over a region three times a GPU: pages arrive by prefetch while the walk
/// holds its lease, and every lease sees the right bytes. Halfway, a host write lands on pages the prefetch may
/// be bringing, and a write lease takes a page ahead: the walk must see both (a prefetched copy made before
/// them would be stale).
pub fn sequential_walks_prefetch_every_byte(cfg: &ClusterConfig) {
    let f = fabric(cfg);
    let g = gpus(&f)[0];
    let ps = f.page_size();
    let pages = frames_of(&f, g) * 3;
    let r = f.alloc(pages * ps, Placement::on(Location::Host)).expect("alloc");
    write_pattern(&f, &r, 43);
    let t = f.traffic();
    let half = pages / 2;
    let mut expect = pattern::bytes(43, 0, (pages * ps) as usize);
    for p in 0..pages {
        if p == half {
            // Pages just ahead of the walk: some may be in flight now.
            let new = pattern::bytes(44, 0, (2 * ps) as usize);
            f.write(&r, (p + 1) * ps, &new).expect("host write ahead of the walk");
            expect[((p + 1) * ps) as usize..((p + 3) * ps) as usize].copy_from_slice(&new);
            let lease = f.acquire(&r, (p + 4) * ps..(p + 5) * ps, gpus(&f)[gpus(&f).len() - 1], Mode::Write);
            let lease = lease.expect("write lease ahead of the walk");
            let LeasePtr::Contiguous { ptr, .. } = *lease.ptr() else { panic!("one page is one run") };
            f.fill_device(lease.device(), ptr, ps, 0x5A).expect("device memset through the lease");
            f.release(lease).expect("release");
            expect[((p + 4) * ps) as usize..((p + 5) * ps) as usize].fill(0x5A);
        }
        let lease = f.acquire(&r, p * ps..(p + 1) * ps, g, Mode::Read).expect("acquire");
        let got = read_through_lease(&f, &lease);
        let want = &expect[(p * ps) as usize..((p + 1) * ps) as usize];
        assert!(got == want, "{g}: page {p} of the walk holds the wrong bytes");
        f.release(lease).expect("release");
    }
    let t2 = f.traffic().since(&t);
    assert!(t2.prefetched * 2 > t2.fetched, "most of the walk arrived by prefetch: {t2:?}");
    let mut buf = vec![0u8; (pages * ps) as usize];
    f.read(&r, 0, &mut buf).expect("read");
    assert!(buf == expect, "the region after the walk");
    f.free(&r).expect("free");
}

/// A caller's hints: a write-back copies what a kernel wrote on the GPU to host memory while the caller goes on,
/// so evicting those pages later copies nothing and loses nothing; a prefetch of a range brings it back in one
/// run before the acquire that wants it, which finds the pages in place. Bytes checked through host reads and
/// lease pointers.
pub fn hints_write_back_and_prefetch_every_byte(cfg: &ClusterConfig) {
    let f = fabric(cfg);
    let g = gpus(&f)[0];
    let ps = f.page_size();
    let a = f.alloc(4 * ps, Placement::on(g)).expect("alloc");
    write_pattern(&f, &a, 47);
    let lease = f.acquire(&a, 0..4 * ps, g, Mode::Write).expect("write lease");
    let LeasePtr::Contiguous { ptr, .. } = *lease.ptr() else { panic!("four pages on an empty GPU are one run") };
    f.fill_device(g, ptr, 4 * ps, 0x6B).expect("the kernel's write");
    f.release(lease).expect("release");
    let t = f.traffic();
    f.write_back(&a, 0..4 * ps, g).expect("write back");
    // An acquire of the pages waits for the copies; the pages stay on the GPU.
    let lease = f.acquire(&a, 0..4 * ps, g, Mode::Read).expect("acquire after the write-back");
    assert!(read_through_lease(&f, &lease).iter().all(|&b| b == 0x6B), "the GPU copy after the write-back");
    f.release(lease).expect("release");
    let t2 = f.traffic().since(&t);
    assert_eq!((t2.written_back, t2.fetched), (4 * ps, 0), "written back once, nothing fetched: {t2:?}");
    // Host reads take the host copy: the kernel's bytes are there.
    let mut buf = vec![0u8; (4 * ps) as usize];
    f.read(&a, 0, &mut buf).expect("read");
    assert!(buf.iter().all(|&b| b == 0x6B), "the host copy holds what the kernel wrote");
    // Another region takes the whole GPU: the written-back pages leave it without a copy.
    let usable = f.stats().directory.devices.iter().find(|d| d.location == g).map(|d| d.frames).unwrap() as u64;
    let b = f.alloc(usable * ps, Placement::on(g)).expect("alloc");
    let t = f.traffic();
    let lease = (1..=usable).rev().find_map(|n| f.acquire(&b, 0..n * ps, g, Mode::Write).ok()).expect("a write lease");
    assert!(lease.len() >= 4 * ps, "the lease took the written-back pages' frames");
    f.release(lease).expect("release");
    let t2 = f.traffic().since(&t);
    assert_eq!(t2.evicted, 0, "clean pages are dropped, not copied: {t2:?}");
    f.free(&b).expect("free");
    // A prefetch brings them back; the acquire finds them in place, in one run, with the kernel's bytes.
    let t = f.traffic();
    f.prefetch(&a, 0..4 * ps, g).expect("prefetch");
    let lease = f.acquire(&a, 0..4 * ps, g, Mode::Read).expect("acquire after the prefetch");
    assert!(matches!(lease.ptr(), LeasePtr::Contiguous { .. }), "one run");
    assert!(read_through_lease(&f, &lease).iter().all(|&b| b == 0x6B), "the prefetched copy");
    f.release(lease).expect("release");
    let t2 = f.traffic().since(&t);
    assert_eq!((t2.prefetched, t2.fetched), (4 * ps, 4 * ps), "fetched once, by the prefetch: {t2:?}");
    f.free(&a).expect("free");
}

/// A page that compresses: zeros but for its number at two places.
fn sparse_page(page: u64, ps: u64) -> Vec<u8> {
    let mut b = vec![0u8; ps as usize];
    b[..8].copy_from_slice(&page.to_le_bytes());
    b[ps as usize / 2..ps as usize / 2 + 8].copy_from_slice(&(page * 7 + 61).to_le_bytes());
    b
}

/// Regions that ask for LZ4 spill through host memory to the storage tier: pages that shrink are stored packed,
/// the others as they are; the tier's file holds them in fewer bytes than their pages, and every byte comes
/// back, through host reads and under leases on the GPU.
pub fn compressed_storage_keeps_every_byte(cfg: &ClusterConfig, dir: &std::path::Path) {
    let (cfg, path) = with_storage(cfg, &dir.join("storage-compressed.tier"), 160);
    let ps = cfg.memory.page_size.bytes();
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    let n = frames_of(&f, g) + 8 + 12;
    assert!(n <= 140, "the suite's GPU budget is small enough for the tier: {n} pages a region");
    let lz4 = Placement { device: Some(g), compression: Compression::Lz4, ..Placement::default() };
    let sparse = f.alloc(n * ps, lz4).expect("alloc");
    let dense = f.alloc(n * ps, lz4).expect("alloc");
    for p in 0..n {
        f.write(&sparse, p * ps, &sparse_page(p, ps)).expect("write");
    }
    write_pattern(&f, &dense, 67);
    let st = f.stats().storage.expect("the node has a storage tier");
    assert!(st.pages >= n, "both regions spilled to storage: {st:?}");
    assert!(st.file_bytes * 2 < st.page_bytes, "packed pages take less of the file: {st:?}");
    check_region(&f, &dense, 67, "incompressible pages after the storage tier");
    let mut buf = vec![0u8; ps as usize];
    for p in 0..n {
        f.read(&sparse, p * ps, &mut buf).expect("read");
        assert!(buf == sparse_page(p, ps), "page {p} of the compressed region read back");
    }
    // Every page comes to the GPU, a few at a time (the others going back down).
    for p in (0..n).step_by(4) {
        let end = (p + 4).min(n);
        let lease = f.acquire(&sparse, p * ps..end * ps, g, Mode::Read).expect("acquire");
        let got = read_through_lease(&f, &lease);
        for (k, page) in got.chunks(ps as usize).enumerate() {
            assert!(
                page == sparse_page(p + k as u64, ps),
                "{g}: leased page {} of the compressed region",
                p + k as u64
            );
        }
        f.release(lease).expect("release");
    }
    assert!(f.traffic().from_storage > 0, "stored pages came back: {:?}", f.traffic());
    f.free(&sparse).expect("free");
    f.free(&dense).expect("free");
    let st = f.stats().storage.expect("the node has a storage tier");
    assert_eq!((st.pages, st.file_bytes), (0, 0), "freed pages leave the tier's figures");
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
}

/// A reservation sets capacity aside now (evicting what must leave): others cannot take it, a region naming
/// it can, it refuses at once what cannot be had and what a quota forbids, and dropping it gives back the rest.
pub fn reservations_hold_capacity(cfg: &ClusterConfig) {
    let f = fabric(cfg);
    let g = gpus(&f)[0];
    let ps = f.page_size();
    let probe = f.alloc(frames_of(&f, g) * ps, Placement::on(g)).expect("alloc");
    // What one region can hold on the GPU: its ordinary frames.
    let cap = (1..=frames_of(&f, g))
        .rev()
        .find(|&n| f.acquire(&probe, 0..n * ps, g, Mode::Read).map(|l| f.release(l)).is_ok())
        .expect("some");
    f.free(&probe).expect("free");
    let x = f.alloc(cap * ps, Placement::on(g)).expect("alloc");
    write_pattern(&f, &x, 59);
    let r = f.reserve(g, 4 * ps, TenantId(0)).expect("reserve: pages of x leave to make room");
    assert_eq!(r.bytes().expect("bytes"), 4 * ps);
    check_region(&f, &x, 59, "the pages the reservation evicted");
    // Others get what is left, not the reservation.
    let y = f.alloc(cap * ps, Placement::on(g)).expect("alloc");
    let err = f.acquire(&y, 0..(cap - 3) * ps, g, Mode::Read).expect_err("the reservation is not theirs");
    assert!(matches!(err, FabricError::OutOfMemory { .. }), "{err}");
    f.acquire(&y, 0..(cap - 4) * ps, g, Mode::Read).map(|l| f.release(l)).expect("the rest").expect("release");
    // A region naming it takes its frames.
    let z = f
        .alloc(4 * ps, Placement { device: Some(g), reservation: Some(r.id()), ..Placement::default() })
        .expect("alloc");
    let lz = f.acquire(&z, 0..4 * ps, g, Mode::Write).expect("the reservation's frames");
    assert_eq!(r.bytes().expect("bytes"), 0, "used by the region that names it");
    f.release(lz).expect("release");
    drop(r);
    // More than can be had with a lease pinning frames: refused at once, nothing taken.
    let lease = f.acquire(&y, 0..2 * ps, g, Mode::Read).expect("a lease pins two frames");
    match f.reserve(g, (cap - 1) * ps, TenantId(0)) {
        Err(FabricError::Directory(e)) => assert!(e.to_string().contains("can be had"), "{e}"),
        other => panic!("expected a refusal: {other:?}"),
    }
    f.release(lease).expect("release");
    f.set_quota(TenantId(9), Tier::Gpu, Some(ps));
    assert!(matches!(f.reserve(g, 2 * ps, TenantId(9)), Err(FabricError::QuotaExceeded { .. })));
    // Dropped, a reservation's frames are everyone's again.
    drop(f.reserve(g, (cap - 2) * ps, TenantId(0)).expect("reserve most of the GPU"));
    f.acquire(&y, 0..cap * ps, g, Mode::Read).map(|l| f.release(l)).expect("all of it again").expect("release");
    check_region(&f, &x, 59, "after it all");
}

/// A fragmented GPU is compacted so a lease gets one run of frames, and the pages compaction moved keep their
/// bytes; when a leased frame sits in every window the lease gets one pointer per page instead, and those
/// pointers hold the right bytes too.
pub fn compaction_and_page_lists(cfg: &ClusterConfig) {
    // No watermark eviction and no headroom, so the fragmentation the test makes stays as made.
    let mut cfg = cfg.clone();
    cfg.memory.high_watermark_percent = 100;
    cfg.memory.low_watermark_percent = 100;
    cfg.memory.headroom_percent = 0;
    let f = fabric(&cfg);
    let g0 = gpus(&f)[0];
    let ps = f.page_size();
    let frames = frames_of(&f, g0);
    // Fill most of the GPU with one-page regions, then free every other one.
    let count = frames / 2;
    let mut small = Vec::new();
    for i in 0..count {
        let r = f.alloc(ps, Placement::on(g0)).expect("alloc");
        f.write(&r, 0, &pattern::bytes(100 + i, 0, ps as usize)).expect("write");
        small.push((r, 100 + i));
    }
    let mut kept = Vec::new();
    for (i, (r, seed)) in small.into_iter().enumerate() {
        if i % 2 == 0 {
            f.free(&r).expect("free");
        } else {
            kept.push((r, seed));
        }
    }
    let before = f.stats().directory.devices[0].largest_free_run;
    let need = (before + 2) as u64;
    let big = f.alloc(need * ps, Placement::on(Location::Host)).expect("alloc");
    write_pattern(&f, &big, 7);
    let lease = f.acquire(&big, 0..need * ps, g0, Mode::Read).expect("acquire");
    assert!(matches!(lease.ptr(), LeasePtr::Contiguous { .. }), "compaction made one run: {:?}", lease.ptr());
    assert!(f.traffic().compacted > 0, "a compaction ran");
    assert_eq!(pattern::first_mismatch(7, 0, &read_through_lease(&f, &lease)), None, "the leased run");
    f.release(lease).expect("release");
    for (r, seed) in &kept {
        check_region(&f, r, *seed, "a page compaction moved");
    }
    // Pin one page in every window of `need` frames (lease every kept region), then ask again.
    let pins: Vec<Lease> = kept.iter().map(|(r, _)| f.acquire(r, 0..ps, g0, Mode::Read).expect("pin")).collect();
    match f.acquire(&big, 0..need * ps, g0, Mode::Read) {
        Ok(lease) => {
            assert_eq!(pattern::first_mismatch(7, 0, &read_through_lease(&f, &lease)), None, "page list lease");
            f.release(lease).expect("release");
        }
        Err(FabricError::OutOfMemory { .. }) => {}
        Err(e) => panic!("acquire with pinned frames: {e}"),
    }
    for (p, (_, seed)) in pins.into_iter().zip(&kept) {
        assert_eq!(pattern::first_mismatch(*seed, 0, &read_through_lease(&f, &p)), None, "pinned page kept its bytes");
        f.release(p).expect("release");
    }
}

/// A device memset and a device copy through a lease's pointer act on the region's bytes: a write lease's
/// changes are the region's after release; a read lease's pages can be copied on the device and hold the data.
pub fn kernels_through_lease_pointers(cfg: &ClusterConfig) {
    let f = fabric(cfg);
    let g = gpus(&f);
    let dev = *g.last().expect("a GPU");
    let ps = f.page_size();
    let r = f.alloc(8 * ps, Placement::on(g[0])).expect("alloc");
    write_pattern(&f, &r, 9);
    // Read lease on `dev`: copy its pages with the device's mover into a scratch arena, check them.
    let lease = f.acquire(&r, 0..8 * ps, dev, Mode::Read).expect("acquire");
    let scratch = f.scratch_arena(dev, 8 * ps).expect("scratch");
    lease.pages().copy_to(&scratch, EngineChoice::SmKernel).expect("copy");
    let mut got = vec![0u8; (8 * ps) as usize];
    scratch.read(0, &mut got).expect("read scratch");
    assert_eq!(pattern::first_mismatch(9, 0, &got), None, "a device copy from the lease's pages");
    f.release(lease).expect("release");
    // Write lease: memset pages 2..4 through the pointer, release, read back through the fabric.
    let lease = f.acquire(&r, 2 * ps..4 * ps, dev, Mode::Write).expect("acquire write");
    let base = match lease.ptr() {
        LeasePtr::Contiguous { ptr, .. } => *ptr,
        LeasePtr::Pages(v) => v[0],
    };
    f.fill_device(dev, base, ps, 0x5A).expect("memset page 2 through the lease");
    f.release(lease).expect("release");
    let mut page = vec![0u8; ps as usize];
    f.read(&r, 2 * ps, &mut page).expect("read");
    assert!(page.iter().all(|&b| b == 0x5A), "the memset through the lease is the region's bytes now");
    f.read(&r, 3 * ps, &mut page).expect("read");
    assert_eq!(pattern::first_mismatch(9, 3 * ps, &page), None, "page 3 was leased but not written");
    f.read(&r, 0, &mut page).expect("read");
    assert_eq!(pattern::first_mismatch(9, 0, &page), None, "page 0 untouched");
}

/// Replicas are invalidated by writes: pages read on two GPUs (replicated), then written from the host or
/// through a write lease, read back new everywhere.
pub fn replicas_are_invalidated_on_write(cfg: &ClusterConfig) {
    let f = fabric(cfg);
    let g = gpus(&f);
    let ps = f.page_size();
    let r = f.alloc(4 * ps, Placement::on(g[0])).expect("alloc");
    write_pattern(&f, &r, 1);
    for &d in &g {
        let l = f.acquire(&r, 0..4 * ps, d, Mode::Read).expect("replicate");
        f.release(l).expect("release");
    }
    let held: Vec<Lease> = g.iter().map(|&d| f.acquire(&r, 0..ps, d, Mode::Read).expect("read lease")).collect();
    let err = f.acquire(&r, 0..ps, g[0], Mode::Write).expect_err("write while read-leased");
    assert!(matches!(err, FabricError::LeasedElsewhere { .. }), "{err}");
    let err = f.write(&r, 0, &[1, 2, 3]).expect_err("host write while read-leased");
    assert!(matches!(err, FabricError::LeasedElsewhere { .. }), "{err}");
    drop(held); // dropping releases
    f.write(&r, 0, &pattern::bytes(2, 0, ps as usize)).expect("write page 0");
    for &d in &g {
        let l = f.acquire(&r, 0..2 * ps, d, Mode::Read).expect("read again");
        let got = read_through_lease(&f, &l);
        assert_eq!(pattern::first_mismatch(2, 0, &got[..ps as usize]), None, "{d}: page 0 has the new bytes");
        assert_eq!(pattern::first_mismatch(1, ps, &got[ps as usize..]), None, "{d}: page 1 the old ones");
        f.release(l).expect("release");
    }
    // A write lease on the last GPU drops every other copy; the others fetch the new version.
    let last = *g.last().expect("gpu");
    let w = f.acquire(&r, ps..2 * ps, last, Mode::Write).expect("write lease");
    w.write(0, &pattern::bytes(3, 0, ps as usize)).expect("write through lease");
    let err = f.acquire(&r, ps..2 * ps, g[0], Mode::Read).expect_err("read while write-leased");
    assert!(matches!(err, FabricError::LeasedElsewhere { .. }), "{err}");
    f.release(w).expect("release");
    let l = f.acquire(&r, ps..2 * ps, g[0], Mode::Read).expect("read new version");
    assert_eq!(pattern::first_mismatch(3, 0, &read_through_lease(&f, &l)), None, "new version on another GPU");
    f.release(l).expect("release");
}

/// Every error case of the API is a typed error, and a failed call leaves other regions as they were.
pub fn errors_are_typed_and_harmless(cfg: &ClusterConfig) {
    let f = fabric(cfg);
    let g0 = gpus(&f)[0];
    let ps = f.page_size();
    let keep = f.alloc(2 * ps, Placement::on(g0)).expect("alloc");
    write_pattern(&f, &keep, 5);
    let r = f.alloc(2 * ps, Placement::on(g0)).expect("alloc");
    assert!(matches!(f.alloc(0, Placement::default()), Err(FabricError::InvalidSize(_))));
    assert!(matches!(f.alloc(ps, Placement::on(Location::Gpu(99))), Err(FabricError::DeviceUnavailable(_))));
    assert!(matches!(f.write(&r, 2 * ps - 1, &[0, 0]), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(f.read(&r, 3 * ps, &mut [0]), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(f.acquire(&r, 0..3 * ps, g0, Mode::Read), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(f.acquire(&r, ps..0, g0, Mode::Read), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(f.acquire(&r, 0..ps, Location::Gpu(99), Mode::Read), Err(FabricError::DeviceUnavailable(_))));
    let whole = frames_of(&f, g0) + 1;
    let huge = f.alloc(whole * ps, Placement::on(Location::Host)).expect("alloc");
    assert!(matches!(f.acquire(&huge, 0..whole * ps, g0, Mode::Read), Err(FabricError::OutOfMemory { .. })));
    f.free(&huge).expect("free");
    let w = f.acquire(&r, 0..ps, g0, Mode::Write).expect("write lease");
    assert!(matches!(f.free(&r), Err(FabricError::LeasedElsewhere { .. })), "free while leased");
    assert!(matches!(f.migrate(&r, Location::Host), Err(FabricError::LeasedElsewhere { .. })));
    f.release(w).expect("release");
    f.free(&r).expect("free");
    assert!(matches!(f.free(&r), Err(FabricError::DoubleFree(_))));
    assert!(matches!(f.write(&r, 0, &[1]), Err(FabricError::UseAfterFree(_))));
    assert!(matches!(f.acquire(&r, 0..ps, g0, Mode::Read), Err(FabricError::UseAfterFree(_))));
    // Quotas: tenant 7 may hold one page of GPU memory.
    f.set_quota(TenantId(7), Tier::Gpu, Some(ps));
    let q =
        f.alloc(2 * ps, Placement { device: Some(g0), tenant: TenantId(7), ..Placement::default() }).expect("alloc");
    let err = f.acquire(&q, 0..2 * ps, g0, Mode::Read).expect_err("over quota");
    assert!(matches!(err, FabricError::QuotaExceeded { .. }), "{err}");
    f.acquire(&q, 0..ps, g0, Mode::Read).map(|l| f.release(l)).expect("within quota").expect("release");
    check_region(&f, &keep, 5, "a region untouched by the failed calls");
}

/// Declares one `#[test]` per check of the suite, each on the configuration `$config` returns.
#[macro_export]
macro_rules! fabric_suite_tests {
    ($config:expr) => {
        #[test]
        fn eviction_and_fetch_keep_every_byte() {
            $crate::fabric_suite::eviction_and_fetch_keep_every_byte(&$config);
        }

        #[test]
        fn sequential_walks_prefetch_every_byte() {
            $crate::fabric_suite::sequential_walks_prefetch_every_byte(&$config);
        }

        #[test]
        fn hints_write_back_and_prefetch_every_byte() {
            $crate::fabric_suite::hints_write_back_and_prefetch_every_byte(&$config);
        }

        #[test]
        fn storage_tier_keeps_every_byte() {
            $crate::storage_suite::storage_tier_keeps_every_byte(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn a_full_storage_tier_is_out_of_memory() {
            $crate::storage_suite::a_full_storage_tier_is_out_of_memory(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn a_tier_file_is_reset_when_stale_and_refused_when_live() {
            $crate::storage_suite::a_tier_file_is_reset_when_stale_and_refused_when_live(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn walks_over_the_storage_tier_drop_what_they_passed() {
            $crate::tiers_suite::walks_over_the_storage_tier_drop_what_they_passed(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn compressed_storage_keeps_every_byte() {
            $crate::fabric_suite::compressed_storage_keeps_every_byte(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn lossy_pages_keep_their_bound() {
            $crate::lossy_suite::lossy_pages_keep_their_bound(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn the_packed_tier_holds_lossy_pages_in_half_the_bytes() {
            $crate::lossy_suite::the_packed_tier_holds_lossy_pages_in_half_the_bytes(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn the_fp32_tier_holds_fp32_pages_in_a_quarter_of_the_bytes() {
            $crate::lossy_suite::the_fp32_tier_holds_fp32_pages_in_a_quarter_of_the_bytes(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn the_compressed_tier_holds_pages_by_their_packed_length() {
            $crate::compressed_suite::the_compressed_tier_holds_pages_by_their_packed_length(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn pages_that_never_shrink_are_skipped_until_they_shrink() {
            $crate::compressed_suite::pages_that_never_shrink_are_skipped_until_they_shrink(
                &$config,
                &$crate::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR")),
            );
        }

        #[test]
        fn reservations_hold_capacity() {
            $crate::fabric_suite::reservations_hold_capacity(&$config);
        }

        #[test]
        fn compaction_and_page_lists() {
            $crate::fabric_suite::compaction_and_page_lists(&$config);
        }

        #[test]
        fn kernels_through_lease_pointers() {
            $crate::fabric_suite::kernels_through_lease_pointers(&$config);
        }

        #[test]
        fn replicas_are_invalidated_on_write() {
            $crate::fabric_suite::replicas_are_invalidated_on_write(&$config);
        }

        #[test]
        fn errors_are_typed_and_harmless() {
            $crate::fabric_suite::errors_are_typed_and_harmless(&$config);
        }
    };
}
