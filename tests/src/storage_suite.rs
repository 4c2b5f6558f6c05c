//! The storage tier below host memory, on any device layer: pages spill to it and come back byte for byte; a
//! page changed on the disk is an error naming the page, never data; a full tier is a typed lack of memory that
//! harms no region; and a tier's file is the fabric's alone while it runs (one from an earlier run is reset,
//! one a live fabric holds is refused).

use std::os::unix::fs::FileExt;
use std::path::Path;

use vfabric::{ClusterConfig, Fabric, FabricError, Mode, Placement, Region, StorageError};
use vfabric_transport::Location;

use crate::fabric_rig::{fabric, frames_of, gpus, read_through_lease, with_storage, write_pattern};
use crate::pattern;

/// The tier's file header: slot `s` starts at `HEADER + s * page size`.
const HEADER: u64 = 4096;

fn check_region(f: &Fabric, r: &Region, seed: u64, what: &str) {
    let mut buf = vec![0u8; r.len as usize];
    f.read(r, 0, &mut buf).unwrap_or_else(|e| panic!("{what}: reading the region: {e}"));
    if let Some(at) = pattern::first_mismatch(seed, 0, &buf) {
        panic!("{what}: byte {at} of the region differs");
    }
}

/// Whether `e` names page `page` of `r` as having come back corrupt from the storage tier; the slot it names.
fn named_corrupt_page(e: &FabricError, r: &Region, page: u64) -> Option<u64> {
    match e {
        FabricError::StoredPage { region, page: p, slot, source }
            if *region == r.to_string() && *p == page && source.is_corrupt() =>
        {
            Some(*slot)
        }
        _ => None,
    }
}

/// With a storage tier below a small host memory: a region larger than a GPU and host memory together spills
/// to storage as it is written, reads back right, and comes back to the GPU through host memory piece by piece
/// (prefetched from the storage tier ahead of the walk).
/// Then every slot's bytes change on the disk behind the fabric's back: each page of the region acquired on its
/// own either comes back right (it was in memory) or fails with an error naming that page of that region and
/// its slot, and putting that slot's bytes back makes the page come back right; a region leased meanwhile is
/// untouched. `dir` holds the tier's file (a filesystem with O_DIRECT).
pub fn storage_tier_keeps_every_byte(cfg: &ClusterConfig, dir: &Path) {
    let (cfg, path) = with_storage(cfg, &dir.join("storage-suite.tier"), 64);
    let ps = cfg.memory.page_size.bytes();
    cfg.check("the suite's storage configuration").expect("valid");
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    let pages = frames_of(&f, g) + 8 + 12;
    let r = f.alloc(pages * ps, Placement::on(g)).expect("alloc");
    write_pattern(&f, &r, 53);
    let t = f.traffic();
    assert!(t.to_storage >= 12 * ps, "pages went to storage: {t:?}");
    check_region(&f, &r, 53, "after spilling to storage");
    // A host write into a page kept only on the storage tier (the first pages written went down first) lands,
    // and so does one putting the bytes back.
    let mut piece = vec![0u8; 4096];
    for seed in [54, 53] {
        f.write(&r, 128, &pattern::bytes(seed, 128, 4096)).expect("a write into a stored page");
        f.read(&r, 128, &mut piece).expect("read");
        assert_eq!(pattern::first_mismatch(seed, 128, &piece), None, "a host write into a stored page");
    }
    check_region(&f, &r, 53, "after writes into a stored page");
    let before = f.traffic();
    let step = 4 * ps;
    let mut off = 0;
    while off < r.len {
        let end = (off + step).min(r.len);
        let lease = f.acquire(&r, off..end, g, Mode::Read).expect("acquire");
        let got = read_through_lease(&f, &lease);
        assert_eq!(pattern::first_mismatch(53, off, &got), None, "{g}: leased pages at {off:#x}");
        f.release(lease).expect("release");
        off = end;
    }
    let walk = f.traffic().since(&before);
    assert!(walk.from_storage > 0, "stored pages came back: {walk:?}");
    // A walk in order: its prefetch staged stored pages from the storage tier ahead of the acquires.
    assert!(walk.prefetched_from_storage > 0, "prefetch brought stored pages up ahead of the walk: {walk:?}");
    // Host writes over pages owned by their stored copy with replicas above it (a GPU's, host memory's) land.
    write_pattern(&f, &r, 53);
    check_region(&f, &r, 53, "after writing over pages with copies on several tiers");
    // Another region, leased on the GPU while the storage tier goes bad: its pages stay there, right.
    let other = f.alloc(2 * ps, Placement::on(g)).expect("alloc");
    write_pattern(&f, &other, 57);
    let held = f.acquire(&other, 0..2 * ps, g, Mode::Read).expect("a lease on the other region");
    // Every slot's bytes change on disk (what was there kept, to be put back).
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("the tier's file");
    let at = |slot: u64| HEADER + slot * ps + 100;
    let mut kept = Vec::new();
    for slot in 0..64u64 {
        let mut was = [0u8; 7];
        file.read_exact_at(&mut was, at(slot)).expect("read");
        kept.push(was);
        file.write_all_at(b"garbage", at(slot)).expect("write");
    }
    file.sync_all().expect("sync");
    let mut refused = 0;
    for p in 0..pages {
        let lease = match f.acquire(&r, p * ps..(p + 1) * ps, g, Mode::Read) {
            Ok(lease) => lease,
            Err(e) => {
                let slot = named_corrupt_page(&e, &r, p)
                    .unwrap_or_else(|| panic!("acquiring page {p} of {r} from a corrupt tier: {e:?}"));
                assert!(slot < 64, "{e}");
                let text = e.to_string();
                assert!(text.contains(&format!("page {p} of region {r}")) && text.contains("corrupt"), "{text}");
                // The slot named is the page's: with its bytes back, the page comes back right.
                file.write_all_at(&kept[slot as usize], at(slot)).expect("write");
                file.sync_all().expect("sync");
                refused += 1;
                f.acquire(&r, p * ps..(p + 1) * ps, g, Mode::Read)
                    .unwrap_or_else(|e| panic!("page {p} with slot {slot}'s bytes back: {e}"))
            }
        };
        let got = read_through_lease(&f, &lease);
        assert_eq!(pattern::first_mismatch(53, p * ps, &got), None, "{g}: page {p} after the tier went bad");
        f.release(lease).expect("release");
    }
    assert!(refused > 0, "some of the region's pages were on the storage tier");
    assert_eq!(pattern::first_mismatch(57, 0, &read_through_lease(&f, &held)), None, "the other region's lease");
    f.release(held).expect("release");
    check_region(&f, &other, 57, "the other region after the tier went bad");
    // Host reads of a page changed on disk are refused too, page by page: a page read from memory is right, one
    // read from the storage tier an error naming that page.
    for slot in 0..64u64 {
        file.write_all_at(b"garbage", at(slot)).expect("write");
    }
    file.sync_all().expect("sync");
    let (mut buf, mut refused) = (vec![0u8; ps as usize], 0);
    for p in 0..pages {
        let read = f.read(&r, p * ps, &mut buf);
        refused += usize::from(read.is_err());
        match read {
            Ok(()) => assert_eq!(pattern::first_mismatch(53, p * ps, &buf), None, "a host read of page {p}"),
            Err(e) => assert!(named_corrupt_page(&e, &r, p).is_some(), "a host read of page {p}: {e:?}"),
        }
    }
    assert!(refused > 0, "some of the region's pages were read from the storage tier");
    f.free(&r).expect("free");
    f.free(&other).expect("free");
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
}

/// GPU, host memory and the storage tier filled with one region's pages: one more region's pages can neither be
/// written nor acquired, each call refused as out of memory on the storage tier (the last tier, which had to
/// take what host memory gave up), and the full region reads back whole afterwards, from every tier.
pub fn a_full_storage_tier_is_out_of_memory(cfg: &ClusterConfig, dir: &Path) {
    let (cfg, path) = with_storage(cfg, &dir.join("storage-full.tier"), 16);
    let ps = cfg.memory.page_size.bytes();
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    let slots = frames_of(&f, Location::Storage);
    assert_eq!(slots, 16, "the tier's slots are frames of the directory");
    let all = frames_of(&f, g) + frames_of(&f, Location::Host) + slots;
    let full = f.alloc(all * ps, Placement::on(g)).expect("alloc");
    // Page by page: the pages that fit stay; the first that does not is out of memory.
    let mut written = 0;
    while written < all {
        let p = written;
        match f.write(&full, p * ps, &pattern::bytes(71, p * ps, ps as usize)) {
            Ok(()) => written += 1,
            Err(FabricError::OutOfMemory { .. }) => break,
            Err(e) => panic!("writing page {p} of {all}: {e}"),
        }
    }
    let stored = f.stats().storage.expect("a storage tier").pages;
    assert_eq!(stored, slots, "the region's pages fill the storage tier ({written} of {all} written)");
    let more = f.alloc(2 * ps, Placement::on(g)).expect("alloc: address space, no memory yet");
    let out_of_storage = |e: &FabricError| matches!(e, FabricError::OutOfMemory { location: Location::Storage, .. });
    let e = f.write(&more, 0, &pattern::bytes(72, 0, ps as usize)).expect_err("a write with every tier full");
    assert!(out_of_storage(&e), "{e:?}");
    assert!(e.to_string().contains("storage is out of memory"), "{e}");
    let e = f.acquire(&more, 0..2 * ps, g, Mode::Write).map(|_| ()).expect_err("a lease with every tier full");
    assert!(out_of_storage(&e), "{e:?}");
    // Nothing of the region already there was lost, and the refused region holds nothing.
    let mut buf = vec![0u8; (written * ps) as usize];
    f.read(&full, 0, &mut buf).expect("read");
    assert_eq!(pattern::first_mismatch(71, 0, &buf), None, "the full region after the refusals");
    let mut none = vec![1u8; (2 * ps) as usize];
    f.read(&more, 0, &mut none).expect("read");
    assert!(none.iter().all(|&b| b == 0), "the refused region's pages were never written");
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
}

/// A tier's file at the configured path with a valid header and pages of an earlier run (one that ended without
/// removing it) is reset when a fabric starts: the new fabric's regions read as zeros where never written and
/// as their own bytes where written, never the old pages; the file holds none of them. While that fabric runs,
/// a second one configured with the same file is refused (the file in use), and the first goes on unharmed.
pub fn a_tier_file_is_reset_when_stale_and_refused_when_live(cfg: &ClusterConfig, dir: &Path) {
    let (cfg, path) = with_storage(cfg, &dir.join("storage-stale.tier"), 32);
    let ps = cfg.memory.page_size.bytes();
    let kept = dir.join("storage-stale.tier.earlier");
    let n = {
        let f = fabric(&cfg);
        let n = frames_of(&f, gpus(&f)[0]) + 8 + 16;
        let r = f.alloc(n * ps, Placement::on(gpus(&f)[0])).expect("alloc");
        write_pattern(&f, &r, 81);
        assert!(f.stats().storage.expect("a storage tier").pages >= 16, "pages went to storage");
        // What a run that ended without removing its file leaves: the file, with its header and pages.
        std::fs::copy(&path, &kept).expect("copy the tier's file");
        n
    };
    std::fs::rename(&kept, &path).expect("the earlier run's file at the configured path");
    let old = std::fs::read(&path).expect("read");
    let f = fabric(&cfg);
    assert_eq!(f.stats().storage.expect("a storage tier").pages, 0, "the tier starts empty");
    let fresh = std::fs::read(&path).expect("read");
    assert!(fresh[HEADER as usize..].iter().all(|&b| b == 0), "none of the earlier run's pages is left in the file");
    assert!(old[HEADER as usize..].iter().any(|&b| b != 0), "the earlier file held pages");
    // The same region as the earlier run's, at the same place: never-written pages read as zeros, on a host
    // read and under a lease, and written pages as what this run wrote, spilling to the tier again.
    let g = gpus(&f)[0];
    let r = f.alloc(n * ps, Placement::on(g)).expect("alloc");
    let mut buf = vec![1u8; r.len as usize];
    f.read(&r, 0, &mut buf).expect("read");
    assert!(buf.iter().all(|&b| b == 0), "a new region reads as zeros, not an earlier run's pages");
    let lease = f.acquire(&r, 0..4 * ps, g, Mode::Read).expect("acquire");
    assert!(read_through_lease(&f, &lease).iter().all(|&b| b == 0), "{g}: a new region's leased pages");
    f.release(lease).expect("release");
    write_pattern(&f, &r, 82);
    assert!(f.stats().storage.expect("a storage tier").pages >= 16, "this run's pages went to storage");
    check_region(&f, &r, 82, "this run's region after spilling");
    // A second fabric on the same file while this one runs: refused, the file untouched.
    let len = std::fs::metadata(&path).expect("the tier's file").len();
    match Fabric::embedded(&cfg) {
        Err(FabricError::Storage(e @ StorageError::InUse { .. })) => {
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()) && text.contains("in use"), "{text}");
        }
        Err(e) => panic!("a second fabric on a live tier's file: {e}"),
        Ok(_) => panic!("a second fabric took a live tier's file"),
    }
    assert_eq!(std::fs::metadata(&path).expect("the tier's file").len(), len, "the live file is not reset");
    check_region(&f, &r, 82, "the live fabric's region after a second fabric was refused");
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
    // Its lock went with it: a fabric starts on the path again.
    drop(fabric(&cfg));
}
