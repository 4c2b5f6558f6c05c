//! The compressed tier, on any device layer: a lossless region's pages that shrink leave a GPU for host memory
//! and move on into runs of blocks as long as their packed form; incompressible pages stay whole in host
//! memory; every byte comes back from every tier.

use vfabric::{ByteSize, ClusterConfig, Compression, FabricError, Mode, Placement};
use vfabric_transport::Location;

use crate::fabric_rig::{fabric, frames_of, gpus, read_through_lease, with_storage};

/// A page of `len` bytes: every fourth page (`p % 4 == 3`) random bytes, which no codec shrinks; the others a
/// short repeating pattern and their last eighth random, packing to about an eighth.
fn page_bytes(p: u64, len: usize, seed: u64) -> Vec<u8> {
    let mut x = (seed << 20) ^ (p + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let quiet = if p % 4 == 3 { 0 } else { len - len / 8 };
    (0..len)
        .map(|i| {
            if i >= quiet {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            } else {
                (i % 251) as u8 ^ p as u8
            }
        })
        .collect()
}

/// A node with a compressed tier of 8 pages' bytes over a GPU budget of 16 pages, host memory of 8 and a
/// storage tier: written through a GPU, an `lz4` region's compressible pages end in the compressed tier (more
/// than twice the pages its bytes hold whole; past it, they go on to the storage tier), its incompressible ones
/// stay whole; a region stored as it is never goes there. Every byte comes back: host reads, leases on the
/// GPU, after host writes into pages wherever they are (whole pages written into host memory are packed as
/// pages from a GPU are). The tier takes no lease and is no region's home, and a
/// freed region leaves it empty.
pub fn the_compressed_tier_holds_pages_by_their_packed_length(cfg: &ClusterConfig, dir: &std::path::Path) {
    let (mut cfg, path) = with_storage(cfg, &dir.join("storage-compressed-tier.tier"), 200);
    let ps = cfg.memory.page_size.bytes();
    cfg.memory.compressed_arena = ByteSize(8 * ps);
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    let dev = |loc: Location| f.stats().directory.devices.into_iter().find(|d| d.location == loc).expect("device");
    let n = frames_of(&f, g) + 60;
    let write_all = |r: &vfabric::Region, seed: u64| -> Vec<u8> {
        let mut data = Vec::with_capacity((n * ps) as usize);
        for p in 0..n {
            let page = page_bytes(p, ps as usize, seed);
            f.write(r, p * ps, &page).expect("write");
            data.extend_from_slice(&page);
        }
        data
    };
    // Stored as it is: no page goes to the compressed tier.
    let plain = f.alloc(n * ps, Placement::on(g)).expect("alloc");
    write_all(&plain, 1);
    assert_eq!(dev(Location::Compressed).copies, 0, "a region stored as it is went to the compressed tier");
    f.free(&plain).expect("free");

    let before = f.traffic();
    let lz4 = Placement { device: Some(g), compression: Compression::Lz4, ..Placement::default() };
    let r = f.alloc(n * ps, lz4).expect("alloc");
    let mut data = write_all(&r, 2);
    let t = f.traffic().since(&before);
    let c = dev(Location::Compressed);
    assert!(c.copies >= 16, "{} pages in the compressed tier of 8 pages' bytes: {t:?}", c.copies);
    assert!(t.compressed > 0 && t.compressed < t.compress_tried, "incompressible pages were tried: {t:?}");
    assert!(t.compressed_bytes * 3 < t.compressed, "packed to about an eighth: {t:?}");
    assert!(f.stats().storage.expect("storage").pages > 0, "pages spilled past the compressed tier");
    let mut back = vec![0u8; data.len()];
    f.read(&r, 0, &mut back).expect("read");
    assert!(back == data, "a host read of the region differs");
    // A write into every page, wherever it is (the compressed tier takes none: its pages come up first).
    for p in 0..n {
        let at = (p * ps + 100 + p) as usize;
        let new = [p as u8 ^ 0x5A; 64];
        f.write(&r, at as u64, &new).expect("write into a page");
        data[at..at + new.len()].copy_from_slice(&new);
    }
    for p in (0..n).step_by(4) {
        let end = (p + 4).min(n);
        let lease = f.acquire(&r, p * ps..end * ps, g, Mode::Read).expect("acquire");
        let got = read_through_lease(&f, &lease);
        assert!(got == data[(p * ps) as usize..(end * ps) as usize], "{g}: a lease on pages {p}..{end} differs");
        f.release(lease).expect("release");
    }
    f.read(&r, 0, &mut back).expect("read");
    assert!(back == data, "a host read after the writes and leases differs");
    // Whole pages written from the host (those in the tier come up to host memory first) go back into it.
    let before = f.traffic();
    for p in 0..n {
        let page = &data[(p * ps) as usize..((p + 1) * ps) as usize];
        f.write(&r, p * ps, page).expect("write a whole page");
    }
    let t = f.traffic().since(&before);
    assert!(t.compressed > 0, "whole pages written into host memory were not packed: {t:?}");
    f.read(&r, 0, &mut back).expect("read");
    assert!(back == data, "a host read after whole pages were written differs");
    match f.acquire(&r, 0..ps, Location::Compressed, Mode::Read) {
        Err(e @ FabricError::Directory(_)) => assert!(e.to_string().contains("compressed tier"), "{e}"),
        other => panic!("a lease in the compressed tier: {other:?}"),
    }
    match f.alloc(ps, Placement { device: Some(Location::Compressed), ..lz4 }) {
        Err(e @ FabricError::Directory(_)) => assert!(e.to_string().contains("compressed tier"), "{e}"),
        other => panic!("a region placed in the compressed tier: {other:?}"),
    }
    f.free(&r).expect("free");
    let c = dev(Location::Compressed);
    assert_eq!((c.copies, c.used), (0, 0), "a freed region left blocks in the compressed tier");
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
}

/// A node with a compressed tier as above: an `lz4` region of random bytes, written through a GPU, is looked at
/// for its first pages only (the rest stay in host memory without a probe); rewritten with pages that shrink, it
/// is looked at again within the skip and its pages move into the tier. Every byte comes back.
pub fn pages_that_never_shrink_are_skipped_until_they_shrink(cfg: &ClusterConfig, dir: &std::path::Path) {
    let (mut cfg, path) = with_storage(cfg, &dir.join("storage-probe-skip.tier"), 200);
    let ps = cfg.memory.page_size.bytes();
    cfg.memory.compressed_arena = ByteSize(8 * ps);
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    let n = frames_of(&f, g) + 60;
    let lz4 = Placement { device: Some(g), compression: Compression::Lz4, ..Placement::default() };
    let r = f.alloc(n * ps, lz4).expect("alloc");
    let write_all = |noise: bool| -> Vec<u8> {
        let mut data = Vec::with_capacity((n * ps) as usize);
        for p in 0..n {
            // Page 3 of every four is random bytes throughout.
            let page = page_bytes(if noise { 4 * p + 3 } else { 4 * p }, ps as usize, 5);
            f.write(&r, p * ps, &page).expect("write");
            data.extend_from_slice(&page);
        }
        data
    };
    let before = f.traffic();
    let data = write_all(true);
    let t = f.traffic().since(&before);
    let looked = t.compress_tried - t.compress_skipped;
    assert!(t.compress_skipped > 0 && t.compressed == 0, "random pages were packed or none skipped: {t:?}");
    assert!(looked * 2 < t.compress_tried, "most random pages were still looked at: {t:?}");
    let mut back = vec![0u8; data.len()];
    f.read(&r, 0, &mut back).expect("read");
    assert!(back == data, "a host read of the random pages differs");

    // Rewritten with pages that shrink: walks on the GPU evict them to host memory until one is looked at again.
    let data = write_all(false);
    for walk in 0.. {
        if f.traffic().since(&before).compressed > 0 {
            break;
        }
        assert!(walk < 8, "pages that shrink were never looked at again: {:?}", f.traffic().since(&before));
        for p in 0..n {
            let lease = f.acquire(&r, p * ps..(p + 1) * ps, g, Mode::Read).expect("acquire");
            f.release(lease).expect("release");
        }
    }
    f.read(&r, 0, &mut back).expect("read");
    assert!(back == data, "a host read of the rewritten pages differs");
    f.free(&r).expect("free");
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
}
