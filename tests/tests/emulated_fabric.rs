//! The fabric conformance suite on the emulated device (what CI runs).

use vfabric::{ByteSize, ClusterConfig};
use vfabric_transport::Backend;

/// Two emulated GPUs of 32 MiB arenas (16 pages of 2 MiB), 128 MiB of host memory.
fn config() -> ClusterConfig {
    let mut c = ClusterConfig::embedded_local();
    c.device.backend = Backend::Emulated;
    c.memory.gpu_budget = Some(ByteSize(32 << 20));
    c.memory.host_arena = ByteSize(128 << 20);
    c
}

vfabric_tests::fabric_suite_tests!(config());

/// A tenant's quotas from `[[tenant]]` hold from the start, as `set_quota`'s do.
#[test]
fn tenant_quotas_come_from_the_configuration() {
    use vfabric::{Fabric, FabricError, Mode, Placement, TenantId};
    let mut c = config();
    c.tenants.push(vfabric::config::TenantSection {
        id: 7,
        gpu: Some(ByteSize(2 << 20)),
        host: None,
        storage: None,
        uids: Vec::new(),
    });
    let f = Fabric::embedded(&c).expect("fabric");
    let g = vfabric::Location::Gpu(0);
    let q =
        f.alloc(4 << 20, Placement { device: Some(g), tenant: TenantId(7), ..Placement::default() }).expect("alloc");
    let err = f.acquire(&q, 0..4 << 20, g, Mode::Read).expect_err("two pages: over the quota of one");
    assert!(matches!(err, FabricError::QuotaExceeded { .. }), "{err}");
    f.acquire(&q, 0..2 << 20, g, Mode::Read).map(|l| f.release(l)).expect("within quota").expect("release");
    let other = f.alloc(4 << 20, Placement::on(g)).expect("alloc");
    f.acquire(&other, 0..4 << 20, g, Mode::Read)
        .map(|l| f.release(l))
        .expect("tenant 0 is unlimited")
        .expect("release");
}

/// A GPU budget larger than the GPU is refused at start, saying both sizes, rather than shrunk quietly.
#[test]
fn a_gpu_budget_past_the_gpu_is_refused() {
    let mut c = config();
    c.device.emulated_gpu_memory = ByteSize(64 << 20);
    c.memory.gpu_budget = Some(ByteSize(1 << 30));
    let err = vfabric::Fabric::embedded(&c).map(|_| ()).expect_err("1 GiB of a 64 MiB GPU");
    let text = err.to_string();
    assert!(text.contains("gpu_budget 1GiB") && text.contains("64MiB"), "{text}");
}

/// A handle kept from an earlier run of a node is refused by the next one, even where a new region has the
/// same address, slot and size: it never reads or writes someone else's bytes.
#[test]
fn a_handle_from_an_earlier_run_is_stale() {
    use vfabric::{Fabric, FabricError, Placement};
    let g = vfabric::Location::Gpu(0);
    let first = Fabric::embedded(&config()).expect("fabric");
    let old = first.alloc(4 << 20, Placement::on(g)).expect("alloc");
    first.write(&old, 0, &[1u8; 4096]).expect("write");
    drop(first);
    let second = Fabric::embedded(&config()).expect("fabric again");
    let new = second.alloc(4 << 20, Placement::on(g)).expect("alloc");
    second.write(&new, 0, &[2u8; 4096]).expect("write");
    assert_eq!((old.addr, old.len), (new.addr, new.len), "the same place and size");
    let mut buf = [0u8; 4096];
    match second.read(&old, 0, &mut buf) {
        Err(FabricError::UseAfterFree(why)) => assert!(why.contains("earlier run"), "{why}"),
        other => panic!("a stale handle read: {other:?}"),
    }
    assert!(matches!(second.write(&old, 0, &[3u8; 16]), Err(FabricError::UseAfterFree(_))));
    assert!(second.free(&old).is_err());
    second.read(&new, 0, &mut buf).expect("read");
    assert_eq!(buf, [2u8; 4096], "the new region is untouched");
}

/// `config()` with a storage tier of `slots` pages in the file `name` (in the suite's scratch directory), host
/// memory of `host` pages, no headroom and no GPU watermarks, so that every frame counted below is one the
/// test placed.
fn over_storage(name: &str, host: u64, slots: u64) -> (ClusterConfig, std::path::PathBuf) {
    let dir = vfabric_tests::fabric_suite::scratch_dir(env!("CARGO_TARGET_TMPDIR"));
    let (mut c, path) = vfabric_tests::fabric_rig::with_storage(&config(), &dir.join(name), slots);
    plain(&mut c, host);
    (c, path)
}

/// Host memory of `host` pages, no headroom, and GPUs that evict only what they lack.
fn plain(c: &mut ClusterConfig, host: u64) {
    let ps = c.memory.page_size.bytes();
    c.memory.host_arena = ByteSize(host * ps);
    c.memory.headroom_percent = 0;
    c.memory.high_watermark_percent = 100;
    c.memory.low_watermark_percent = 100;
}

/// A region of `pages` pages of `tenant` on `device`, written with `seed`'s pattern.
fn written(f: &vfabric::Fabric, pages: u64, device: vfabric::Location, tenant: u32, seed: u64) -> vfabric::Region {
    let placement =
        vfabric::Placement { device: Some(device), tenant: vfabric::TenantId(tenant), ..Default::default() };
    let r = f.alloc(pages * f.page_size(), placement).expect("alloc");
    vfabric_tests::fabric_rig::write_pattern(f, &r, seed);
    r
}

/// Whether a region still reads as `seed`'s pattern.
fn intact(f: &vfabric::Fabric, r: &vfabric::Region, seed: u64) -> bool {
    let mut buf = vec![0u8; r.len as usize];
    f.read(r, 0, &mut buf).expect("read");
    vfabric::pattern::first_mismatch(seed, 0, &buf).is_none()
}

/// Per device: the copies it holds and the pages it owns.
fn placement_of_pages(f: &vfabric::Fabric) -> Vec<(vfabric::Location, u64, u64)> {
    f.stats().directory.devices.iter().map(|d| (d.location, d.copies, d.owned)).collect()
}

/// A reservation larger than the GPU could give (leased pages stay) is refused before anything moves, saying
/// what could be had: the free frames and those evicting every unleased page would free. That much can then be
/// reserved (evicting), and no more.
#[test]
fn a_reservation_that_cannot_be_met_moves_nothing() {
    use vfabric::{DirectoryError, Fabric, FabricError, Mode, TenantId};
    let f = Fabric::embedded(&config()).expect("fabric");
    let g = vfabric::Location::Gpu(0);
    let ps = f.page_size();
    let frames = vfabric_tests::fabric_rig::frames_of(&f, g);
    let x = written(&f, 6, g, 0, 71);
    let y = f.alloc(4 * ps, vfabric::Placement::on(g)).expect("alloc");
    let lease = f.acquire(&y, 0..4 * ps, g, Mode::Write).expect("four leased pages");
    let (traffic, pages) = (f.traffic(), placement_of_pages(&f));
    let refused = |bytes: u64| match f.reserve(g, bytes, TenantId(3)) {
        Err(FabricError::Directory(DirectoryError::ReservationRefused { requested, available, .. })) => {
            assert_eq!(requested, bytes);
            available
        }
        other => panic!("reserving {bytes} bytes: expected a refusal, got {other:?}"),
    };
    let can = refused(frames * ps);
    assert!(can >= 6 * ps, "x's six pages may leave: {can} bytes can be had");
    assert!(can + 4 * ps <= frames * ps, "the leased pages stay: {can} bytes can be had");
    assert_eq!(refused(can + ps), can, "the same figure for a request just past it");
    assert_eq!(f.traffic(), traffic, "refusals move nothing");
    assert_eq!(placement_of_pages(&f), pages, "every page is where it was");
    assert!(f.reservations().is_empty());
    let r = f.reserve(g, can, TenantId(3)).expect("what could be had can be had");
    assert_eq!(r.bytes().expect("bytes"), can);
    assert!(f.traffic().evicted > traffic.evicted, "pages of x left to make room");
    assert!(intact(&f, &x, 71), "x's pages kept their bytes");
    f.release(lease).expect("release");
}

/// Pages a GPU evicts take the frames their tenant reserved in host memory (and those evicted on to the storage
/// tier, its slots reserved there); another tenant's evictions never take them: its pages make room by going
/// on to the storage tier, or, with none, are out of memory.
#[test]
fn evictions_draw_on_their_tenants_reservations() {
    use vfabric::{Fabric, FabricError, Location, Mode, Placement, TenantId, Tier};
    let (c, _path) = over_storage("reserved-evictions.tier", 16, 32);
    let f = Fabric::embedded(&c).expect("fabric");
    let (g, ps) = (Location::Gpu(0), f.page_size());
    let (a, b) = (TenantId(1), TenantId(2));
    let a_old = written(&f, 2, Location::Host, a.0, 81);
    let r_host = f.reserve(Location::Host, 6 * ps, a).expect("reserve host memory");
    let r_storage = f.reserve(Location::Storage, 4 * ps, a).expect("reserve the storage tier");
    let b_host = written(&f, 8, Location::Host, b.0, 82);
    let a_gpu = written(&f, 2, g, a.0, 83);
    let before = f.traffic();
    // B's lease takes the whole GPU: A's two pages go to host memory, which only A's reservation has room in.
    let on = |t: TenantId| Placement { device: Some(g), tenant: t, ..Placement::default() };
    let b_gpu = f.alloc(16 * ps, on(b)).expect("alloc");
    f.acquire(&b_gpu, 0..16 * ps, g, Mode::Write).map(|l| f.release(l)).expect("the whole GPU").expect("release");
    assert_eq!(r_host.bytes().expect("bytes"), 4 * ps, "A's evicted pages took two of its reserved frames");
    assert_eq!(f.quota(a, Tier::Host).0, 8 * ps, "A's host memory: its region and its reservation, as before");
    assert_eq!(f.traffic().since(&before).to_storage, 0, "nothing had to go to the storage tier");
    // B's next lease evicts B's pages to host memory, which is full: host memory's pages go to the storage
    // tier (A's into its reserved slots), never into A's reserved frames.
    let b_next = f.alloc(16 * ps, on(b)).expect("alloc");
    f.acquire(&b_next, 0..16 * ps, g, Mode::Write)
        .map(|l| f.release(l))
        .expect("B's pages make room")
        .expect("release");
    assert_eq!(r_host.bytes().expect("bytes"), 4 * ps, "B's evictions took none of A's reserved frames");
    assert_eq!(r_storage.bytes().expect("bytes"), 0, "A's four pages on the storage tier took its reserved slots");
    assert_eq!(f.quota(a, Tier::Nvme).0, 4 * ps, "and no other slots");
    assert!(f.quota(b, Tier::Nvme).0 > 0, "B's pages went to the storage tier instead");
    for (r, seed) in [(&a_old, 81), (&b_host, 82), (&a_gpu, 83)] {
        assert!(intact(&f, r, seed), "every page kept its bytes");
    }
    // Without a storage tier, B's evictions find host memory full (A's reservation is not theirs to take).
    let mut c = config();
    plain(&mut c, 16);
    let f = Fabric::embedded(&c).expect("fabric");
    let r_host = f.reserve(Location::Host, 8 * ps, a).expect("reserve host memory");
    written(&f, 8, Location::Host, b.0, 84);
    let b_gpu = f.alloc(16 * ps, on(b)).expect("alloc");
    f.acquire(&b_gpu, 0..16 * ps, g, Mode::Write).map(|l| f.release(l)).expect("the whole GPU").expect("release");
    let b_next = f.alloc(16 * ps, on(b)).expect("alloc");
    let err = f.acquire(&b_next, 0..16 * ps, g, Mode::Write).expect_err("host memory is full for B");
    assert!(matches!(err, FabricError::OutOfMemory { location: Location::Host, .. }), "{err}");
    assert_eq!(r_host.bytes().expect("bytes"), 8 * ps, "A's reservation is whole");
}

/// A tenant's host and storage quotas from `[[tenant]]` hold as its GPU quota does. A's pages that a GPU
/// evicts for B's lease while A is at its host quota make room there by sending A's own pages on to the storage
/// tier (within A's storage quota): B's pages stay where they were.
#[test]
fn host_and_storage_quotas_come_from_the_configuration() {
    use vfabric::{Fabric, Location, Mode, Placement, TenantId, Tier};
    let (mut c, _path) = over_storage("tenant-quotas.tier", 16, 32);
    let ps = c.memory.page_size.bytes();
    let limits = (Some(ByteSize(4 * ps)), Some(ByteSize(8 * ps)));
    c.tenants.push(vfabric::config::TenantSection {
        id: 3,
        gpu: None,
        host: limits.0,
        storage: limits.1,
        uids: vec![],
    });
    let f = Fabric::embedded(&c).expect("fabric");
    let (a, b, g) = (TenantId(3), TenantId(4), Location::Gpu(0));
    assert_eq!(f.quota(a, Tier::Host).1, Some(4 * ps));
    assert_eq!(f.quota(a, Tier::Nvme).1, Some(8 * ps));
    let b_host = written(&f, 4, Location::Host, b.0, 91);
    let a_host = written(&f, 4, Location::Host, a.0, 92);
    assert_eq!(f.quota(a, Tier::Host).0, 4 * ps, "A is at its host quota");
    let over = f.alloc(ps, Placement { device: Some(Location::Host), tenant: a, ..Placement::default() });
    let err = f.write(&over.expect("alloc"), 0, &[1]).expect_err("a fifth page of host memory");
    assert!(matches!(err, vfabric::FabricError::QuotaExceeded { tier: Tier::Host, .. }), "{err}");
    let a_gpu = written(&f, 4, g, a.0, 93);
    let before = f.traffic();
    let b_gpu = f.alloc(16 * ps, Placement { device: Some(g), tenant: b, ..Placement::default() }).expect("alloc");
    f.acquire(&b_gpu, 0..16 * ps, g, Mode::Write).map(|l| f.release(l)).expect("A's pages make room").expect("release");
    assert_eq!(f.quota(a, Tier::Host).0, 4 * ps, "A's GPU pages in host memory, at its quota");
    assert_eq!(f.quota(a, Tier::Nvme).0, 4 * ps, "A's host pages went to the storage tier");
    assert_eq!(f.quota(b, Tier::Nvme).0, 0, "B's host pages stayed where they were");
    assert_eq!(f.traffic().since(&before).to_storage, 4 * ps, "only A's pages went to the storage tier");
    for (r, seed) in [(&b_host, 91), (&a_host, 92), (&a_gpu, 93)] {
        assert!(intact(&f, r, seed), "every page kept its bytes");
    }
}

/// With no storage tier, pages whose tenant is at its host quota stay on the GPU, and another tenant's lease
/// evicts other pages instead of failing with that quota; when nothing else can leave, it is out of memory.
#[test]
fn another_tenants_quota_never_fails_a_lease() {
    use vfabric::{Fabric, FabricError, Location, Mode, Placement, TenantId, Tier};
    let mut c = config();
    plain(&mut c, 64);
    let ps = c.memory.page_size.bytes();
    c.tenants.push(vfabric::config::TenantSection {
        id: 5,
        gpu: None,
        host: Some(ByteSize(2 * ps)),
        storage: None,
        uids: vec![],
    });
    let f = Fabric::embedded(&c).expect("fabric");
    let (a, b, g) = (TenantId(5), TenantId(6), Location::Gpu(0));
    written(&f, 2, Location::Host, a.0, 101);
    let a_gpu = written(&f, 4, g, a.0, 102);
    let b_old = written(&f, 8, g, b.0, 103);
    let on = Placement { device: Some(g), tenant: b, ..Placement::default() };
    let b_new = f.alloc(8 * ps, on).expect("alloc");
    f.acquire(&b_new, 0..8 * ps, g, Mode::Write).map(|l| f.release(l)).expect("B's own pages leave").expect("release");
    assert_eq!(f.quota(a, Tier::Gpu).0, 4 * ps, "A's pages stayed on the GPU");
    assert_eq!(f.quota(a, Tier::Host).0, 2 * ps, "within A's host quota");
    let all = f.alloc(16 * ps, on).expect("alloc");
    let err = f.acquire(&all, 0..16 * ps, g, Mode::Write).expect_err("A's pages cannot leave");
    assert!(matches!(err, FabricError::OutOfMemory { .. }), "B is out of memory, not over A's quota: {err}");
    assert!(intact(&f, &a_gpu, 102) && intact(&f, &b_old, 103), "every page kept its bytes");
}

/// Host memory over a storage tier, pushed past its high watermark, sends its least used pages to the storage
/// tier in one batch, down to its low watermark, and the next pages find room; without a storage tier it fills
/// up, moving nothing, and then refuses.
#[test]
fn host_memory_spills_to_storage_in_batches() {
    use vfabric::{Fabric, FabricError, Location};
    let host_used =
        |f: &Fabric| f.stats().directory.devices.iter().find(|d| d.location == Location::Host).map_or(0, |d| d.used);
    let (mut c, _path) = over_storage("host-batches.tier", 20, 32);
    c.memory.headroom_percent = 15;
    let ps = c.memory.page_size.bytes();
    let f = Fabric::embedded(&c).expect("fabric");
    let frames = vfabric_tests::fabric_rig::frames_of(&f, Location::Host);
    let ordinary = frames - (frames * u64::from(c.memory.headroom_percent)).div_ceil(100);
    let d = vfabric::config::MemorySection::default();
    let high = ordinary * u64::from(d.host_high_watermark_percent) / 100;
    let low = ordinary * u64::from(d.host_low_watermark_percent) / 100;
    assert!(low < high && high < frames, "the defaults leave a batch to test: {low} < {high} < {frames}");
    let h = f.alloc(frames * ps, vfabric::Placement::on(Location::Host)).expect("alloc");
    let mut batch = None;
    for p in 0..frames {
        let (used, stored) = (u64::from(host_used(&f)), f.traffic().to_storage / ps);
        f.write(&h, p * ps, &vfabric::pattern::bytes(111, p * ps, ps as usize)).expect("write");
        let (now, sent) = (u64::from(host_used(&f)), f.traffic().to_storage / ps - stored);
        match batch {
            None if sent == 0 => assert_eq!(now, used + 1, "page {p}: a frame more, nothing moved"),
            None => {
                assert!(used + 1 > high, "page {p} went past the high watermark ({used} of {high} frames used)");
                assert!(sent > 1, "page {p}: {sent} page(s) went to the storage tier in one batch");
                assert!(now <= low, "page {p}: {now} frames used after the batch, low watermark {low}");
                batch = Some(p);
            }
            Some(b) if p == b + 1 => assert_eq!(sent, 0, "page {p}: the batch made room"),
            Some(_) => {}
        }
    }
    assert!(batch.is_some(), "host memory spilled");
    assert!(intact(&f, &h, 111), "every page kept its bytes");
    // No storage tier: host memory fills up to its ordinary frames, one a page, and then refuses.
    let mut c = config();
    plain(&mut c, 20);
    c.memory.headroom_percent = 15;
    let f = Fabric::embedded(&c).expect("fabric");
    let h = f.alloc(frames * ps, vfabric::Placement::on(Location::Host)).expect("alloc");
    for p in 0..ordinary {
        f.write(&h, p * ps, &[1]).expect("write");
        assert_eq!(u64::from(host_used(&f)), p + 1, "page {p}: a frame more");
    }
    assert_eq!(f.traffic().evicted, 0, "nothing moved");
    let err = f.write(&h, ordinary * ps, &[1]).expect_err("host memory is full");
    assert!(matches!(err, FabricError::OutOfMemory { location: Location::Host, .. }), "{err}");
}

/// A GPU's evictions into host memory over a storage tier that is at its high watermark spill a batch, down to
/// the low watermark, rather than filling the headroom or sending only the page each needs: the next eviction
/// finds room.
#[test]
fn a_gpus_evictions_spill_host_memory_in_batches() {
    use vfabric::{Fabric, Location, Mode, Placement};
    let (mut c, _path) = over_storage("gpu-batches.tier", 20, 32);
    c.memory.headroom_percent = 15;
    let f = Fabric::embedded(&c).expect("fabric");
    let (g, ps) = (Location::Gpu(0), f.page_size());
    let ordinary = |l: Location| {
        let frames = vfabric_tests::fabric_rig::frames_of(&f, l);
        frames - (frames * u64::from(c.memory.headroom_percent)).div_ceil(100)
    };
    let d = vfabric::config::MemorySection::default();
    let high = ordinary(Location::Host) * u64::from(d.host_high_watermark_percent) / 100;
    let low = ordinary(Location::Host) * u64::from(d.host_low_watermark_percent) / 100;
    assert!(high - low > 1, "the defaults leave a batch to test");
    let host = written(&f, high, Location::Host, 0, 121);
    let gpu = written(&f, ordinary(g), g, 0, 122);
    assert_eq!(f.traffic().evicted, 0, "host memory at its high watermark and the GPU full, nothing moved yet");
    for step in 0..2u64 {
        let before = f.traffic();
        let one = f.alloc(ps, Placement::on(g)).expect("alloc");
        f.acquire(&one, 0..ps, g, Mode::Write).map(|l| f.release(l)).expect("a page").expect("release");
        let sent = f.traffic().since(&before).to_storage / ps;
        if step == 0 {
            assert_eq!(sent, high - low, "host memory went down to its low watermark for one page");
        } else {
            assert_eq!(sent, 0, "the batch made room for the next page");
        }
    }
    assert!(intact(&f, &host, 121) && intact(&f, &gpu, 122), "every page kept its bytes");
}

/// An acquire of a region naming a GPU reservation that must evict first (past the GPU's high watermark) draws
/// the reservation by exactly the pages it takes, though it is planned again after the eviction stage.
#[test]
fn an_acquire_that_evicts_first_draws_its_reservation_once() {
    use vfabric::{Fabric, Location, Mode, Placement, TenantId};
    let mut c = config();
    plain(&mut c, 64);
    // 16 frames: past 8 used, a GPU evicts down to 4.
    c.memory.high_watermark_percent = 50;
    c.memory.low_watermark_percent = 25;
    let f = Fabric::embedded(&c).expect("fabric");
    let (g, ps) = (Location::Gpu(0), f.page_size());
    let x = written(&f, 2, g, 0, 91);
    let r = f.reserve(g, 8 * ps, TenantId(0)).expect("reserve half the GPU");
    let z = f.alloc(4 * ps, Placement { device: Some(g), reservation: Some(r.id()), ..Placement::default() });
    let z = z.expect("alloc");
    let before = f.traffic();
    let lease = f.acquire(&z, 0..4 * ps, g, Mode::Write).expect("the reservation's frames");
    assert!(f.traffic().since(&before).evicted > 0, "x's pages left the GPU first (the acquire was retried)");
    assert_eq!(r.bytes().expect("bytes"), 4 * ps, "drawn by the four pages z took, once");
    f.release(lease).expect("release");
    // Acquired again, its pages already on the GPU: they take nothing more from the reservation.
    for mode in [Mode::Read, Mode::Write] {
        let again = f.acquire(&z, 0..4 * ps, g, mode).expect("again");
        f.release(again).expect("release");
        assert_eq!(r.bytes().expect("bytes"), 4 * ps, "pages already there draw nothing ({mode:?})");
    }
    assert!(intact(&f, &x, 91), "x's pages kept their bytes");
    drop(r);
    assert_eq!(
        f.stats().directory.devices.iter().find(|d| d.location == g).map(|d| d.used),
        Some(4),
        "z's four pages, the rest of the reservation given back"
    );
}
