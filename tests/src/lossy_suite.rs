//! Lossy regions, on any device layer: coded moves give the CPU codec's bytes exactly, and a region stored
//! lossily comes back within its declared bound from every tier.

use std::sync::Arc;

use vfabric::{ClusterConfig, Compression, FabricError, Mode, Placement};
use vfabric_allocator::{Element, Lossy, LOSSY_GROUP, LOSSY_TINY};
use vfabric_transport::device::lossy;
use vfabric_transport::{
    Arena, Coding, DeviceLayer, EngineChoice, Location, MoveError, MoverConfig, PageBatch, PageMove,
};

use crate::device_suite::{arena, Scale};
use crate::fabric_rig::{fabric, frames_of, gpus, read_through_lease, with_storage};

/// Every lossy compression.
pub const LOSSY: [Compression; 4] =
    [Compression::Fp8Bf16, Compression::Fp8F32, Compression::Int8Bf16, Compression::Int8F32];

/// `bytes` of `element` values shaped like a model's state: magnitudes over six decades, so that groups hold
/// values far below their largest, some exact zeros, both signs; and now and then a group whose values are all
/// tiny (at most [`LOSSY_TINY`], stored as zeros) or just above it, or subnormal, where a scale's inverse would
/// overflow.
pub fn values(element: Element, bytes: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = vec![0u8; bytes];
    for (i, v) in out.chunks_exact_mut(element.bytes()).enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mag = match (i / LOSSY_GROUP) % 61 {
            5 => LOSSY_TINY,
            7 => LOSSY_TINY * 4.0,
            9 => 1e-39, // subnormal in fp32 and bf16
            _ => 10f32.powi((x % 6) as i32 - 4),
        };
        let f = if i % 997 == 3 { 0.0 } else { mag * (((x >> 12) % 2001) as f32 / 1000.0 - 1.0) };
        match element {
            Element::Bf16 => v.copy_from_slice(&lossy::f32_to_bf16(f).to_le_bytes()),
            Element::F32 => v.copy_from_slice(&f.to_le_bytes()),
        }
    }
    out
}

fn check_bound(l: Lossy, written: &[u8], back: &[u8], what: &str) {
    let (worst, n) = lossy::worst_error(l, written, back);
    assert!(n > 0, "{what}: nothing compared");
    assert!(worst <= 1.0, "{what}: a value changed by {worst}x its declared bound");
}

/// Coded moves between every GPU and host memory, both ways, on scattered frames, into pages of host memory
/// and into slots of both packed tiers (frames shorter than a page): packing on the device gives exactly the CPU
/// codec's bytes (and leaves the rest of each destination frame alone), expanding gives exactly the CPU's
/// expansion; pages that hold no whole groups are refused with a typed error, and so are a plain copy into a
/// packed tier and bf16 pages packed into fp32 slots (a quarter of a page: too short for them).
pub fn coded_moves_match_the_cpu(layer: &dyn DeviceLayer, scale: Scale) {
    let mover = layer.mover(MoverConfig::default()).expect("mover");
    let page = 2u64 << 20;
    let frames = (scale.arena_bytes / page).min(16) as u32;
    let bytes = u64::from(frames) * page;
    let moves: Vec<PageMove> = (0..frames / 2).map(|i| PageMove { src: i * 2, dst: frames - 1 - i }).collect();
    let batch = PageBatch::from_moves(page, moves.clone());
    let ps = page as usize;
    for side in [Location::Host, Location::Packed(Element::Bf16), Location::Packed(Element::F32)] {
        let stride = side.frame_bytes(page) as usize;
        let host = arena(layer, side, u64::from(frames) * stride as u64, bytes);
        for gpu in layer.gpus().iter().map(|g| Location::Gpu(g.index)) {
            let dev: Arc<dyn Arena> = arena(layer, gpu, bytes, bytes);
            for c in LOSSY {
                let l = c.lossy().expect("lossy");
                if (stride as u64) < l.packed_len(page) {
                    match mover.submit_coded(&dev, &host, &batch, Coding::Pack(l)) {
                        Err(MoveError::EngineUnavailable { .. }) => continue,
                        other => panic!("{gpu} -> {side} {c}: packed into slots too short for it: {other:?}"),
                    }
                }
                let data = values(l.element, bytes as usize, 7 + c.number() as u64);
                dev.write(0, &data).expect("write the values");
                host.fill(0, host.len(), 0xEE).expect("poison");
                let what = format!("{gpu} -> {side} {c}");
                mover.submit_coded(&dev, &host, &batch, Coding::Pack(l)).expect("submit").wait().expect("pack");
                let mut got = vec![0u8; host.len() as usize];
                host.read(0, &mut got).expect("read packed");
                let n = l.packed_len(page) as usize;
                let mut want = vec![0xEEu8; ps];
                for m in &moves {
                    let src = &data[m.src as usize * ps..][..ps];
                    lossy::pack(l, src, &mut want);
                    let at = m.dst as usize * stride;
                    assert!(got[at..at + n] == want[..n], "{what}: packed frame {} differs from the CPU's", m.dst);
                    assert!(got[at + n..at + stride].iter().all(|&b| b == 0xEE), "{what}: past the packed bytes");
                }
                // Back to the GPU, expanded, into the frames the pages came from (cleared first).
                dev.fill(0, bytes, 0).expect("clear");
                let home =
                    PageBatch::from_moves(page, moves.iter().map(|m| PageMove { src: m.dst, dst: m.src }).collect());
                mover.submit_coded(&host, &dev, &home, Coding::Unpack(l)).expect("submit").wait().expect("unpack");
                let mut got = vec![0u8; bytes as usize];
                dev.read(0, &mut got).expect("read expanded");
                let mut page_back = vec![0u8; ps];
                for m in &moves {
                    let packed = &want_packed(l, &data[m.src as usize * ps..][..ps]);
                    lossy::unpack(l, packed, &mut page_back);
                    let at = m.src as usize * ps;
                    assert!(got[at..at + ps] == page_back[..], "{what}: expanded frame {} differs", m.src);
                    check_bound(l, &data[at..at + ps], &got[at..at + ps], &what);
                }
            }
            let odd = PageBatch::from_moves(4112, vec![PageMove { src: 0, dst: 0 }]);
            let l = Compression::Fp8Bf16.lossy().expect("lossy");
            match mover.submit_coded(&dev, &host, &odd, Coding::Pack(l)) {
                Err(MoveError::NotPackable { page: 4112, .. }) => {}
                other => panic!("{gpu}: pages of 4112 bytes packed: {other:?}"),
            }
            if side.is_packed() {
                match mover.submit(&dev, &host, &batch, EngineChoice::Auto) {
                    Err(MoveError::EngineUnavailable { .. }) => {}
                    other => panic!("{gpu}: whole pages copied into the packed tier's slots: {other:?}"),
                }
            }
        }
    }
}

fn want_packed(l: Lossy, page: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; l.packed_len(page.len() as u64) as usize];
    lossy::pack(l, page, &mut out);
    out
}

/// Regions stored lossily (fp8 codes of bf16 values, int8 codes of fp32 values) spill through host memory to
/// the storage tier packed: the tier's file holds them in at most 1/1.9 (1/3.8) of their pages' bytes; every
/// value read back from host memory and the storage tier, and under leases on the GPU after coming back up, is
/// within the declared bound of what was written; a host write into a packed page keeps the bound; a lease in
/// host memory is refused.
pub fn lossy_pages_keep_their_bound(cfg: &ClusterConfig, dir: &std::path::Path) {
    let (cfg, path) = with_storage(cfg, &dir.join("storage-lossy.tier"), 160);
    let ps = cfg.memory.page_size.bytes();
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    let n = frames_of(&f, g) + 8 + 12;
    for (c, ratio) in [(Compression::Fp8Bf16, 1.9), (Compression::Int8F32, 3.8)] {
        let l = c.lossy().expect("lossy");
        let r = f.alloc(n * ps, Placement { device: Some(g), compression: c, ..Placement::default() }).expect("alloc");
        let mut data = values(l.element, (n * ps) as usize, 31);
        for (p, page) in data.chunks(ps as usize).enumerate() {
            f.write(&r, p as u64 * ps, page).expect("write");
        }
        let st = f.stats().storage.expect("the node has a storage tier");
        assert!(st.pages >= 12, "{c}: pages spilled to storage: {st:?}");
        assert!(st.file_bytes as f64 * ratio <= st.page_bytes as f64, "{c}: packed pages on the tier: {st:?}");
        let mut back = vec![0u8; data.len()];
        f.read(&r, 0, &mut back).expect("read");
        check_bound(l, &data, &back, &format!("{c}: host read"));
        let changed = data.chunks(ps as usize).zip(back.chunks(ps as usize)).filter(|(a, b)| a != b).count();
        assert!(changed >= 20, "{c}: only {changed} pages went through the codec");
        // Whole groups written from the host into page 1 (packed in host memory or on the tier by now).
        let group = LOSSY_GROUP * l.element.bytes();
        let at = ps as usize + 3 * group;
        let new = values(l.element, 8 * group, 99);
        f.write(&r, at as u64, &new).expect("write into a packed page");
        data[at..at + new.len()].copy_from_slice(&new);
        f.read(&r, 0, &mut back).expect("read");
        check_bound(l, &data, &back, &format!("{c}: after a host write into a packed page"));
        for p in (0..n).step_by(4) {
            let end = (p + 4).min(n);
            let lease = f.acquire(&r, p * ps..end * ps, g, Mode::Read).expect("acquire");
            let got = read_through_lease(&f, &lease);
            let want = &data[(p * ps) as usize..(end * ps) as usize];
            check_bound(l, want, &got, &format!("{c}: {g} lease of pages {p}..{end}"));
            f.release(lease).expect("release");
        }
        match f.acquire(&r, 0..ps, Location::Host, Mode::Read) {
            Err(e @ FabricError::Directory(_)) => assert!(e.to_string().contains("lossily"), "{e}"),
            other => panic!("{c}: a host lease of packed pages: {other:?}"),
        }
        f.free(&r).expect("free");
    }
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
}

/// A node with a packed tier: a lossy region's pages leaving a GPU go there rather than to host memory, each in
/// a slot of about half a page (the tier holds more than 1.7 pages per page of its bytes); full, it spills to the
/// storage tier, and pages come back up through it. Every value read back (host reads, leases on the GPU, after
/// a host write into a packed page, after the region moved to host memory) is within the declared bound. A
/// region stored as it is keeps to host memory; the packed tier takes no lease and is no region's home.
pub fn the_packed_tier_holds_lossy_pages_in_half_the_bytes(cfg: &ClusterConfig, dir: &std::path::Path) {
    let (mut cfg, path) = with_storage(cfg, &dir.join("storage-packed.tier"), 160);
    let ps = cfg.memory.page_size.bytes();
    cfg.memory.packed_arena = vfabric::ByteSize(8 * ps);
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    let used = |loc: Location| f.stats().directory.devices.iter().find(|d| d.location == loc).map_or(0, |d| d.used);
    let packed = Location::Packed(Element::Bf16);
    let slots = frames_of(&f, packed);
    assert!(slots as f64 >= 1.7 * 8.0, "{slots} slots in 8 pages' bytes");
    let c = Compression::Fp8Bf16;
    let l = c.lossy().expect("lossy");
    let n = frames_of(&f, g) + slots + 12;
    let r = f.alloc(n * ps, Placement { device: Some(g), compression: c, ..Placement::default() }).expect("alloc");
    let mut data = values(l.element, (n * ps) as usize, 41);
    for (p, page) in data.chunks(ps as usize).enumerate() {
        f.write(&r, p as u64 * ps, page).expect("write");
    }
    assert_eq!(used(Location::Host), 0, "a lossy region's pages took frames of host memory");
    assert!(u64::from(used(packed)) > 8, "{} pages in the packed tier", used(packed));
    let st = f.stats().storage.expect("the node has a storage tier");
    assert!(st.pages >= 12, "pages spilled from the packed tier to storage: {st:?}");
    let mut back = vec![0u8; data.len()];
    f.read(&r, 0, &mut back).expect("read");
    check_bound(l, &data, &back, "host read");
    let group = LOSSY_GROUP * l.element.bytes();
    // Page 0 went down first: it is in the packed tier or on the storage tier.
    let at = 5 * group;
    let new = values(l.element, 4 * group, 7);
    f.write(&r, at as u64, &new).expect("write into a packed page");
    data[at..at + new.len()].copy_from_slice(&new);
    for p in (0..n).step_by(4) {
        let end = (p + 4).min(n);
        let lease = f.acquire(&r, p * ps..end * ps, g, Mode::Read).expect("acquire");
        let got = read_through_lease(&f, &lease);
        check_bound(l, &data[(p * ps) as usize..(end * ps) as usize], &got, &format!("{g} lease of pages {p}..{end}"));
        f.release(lease).expect("release");
    }
    // Moved to host memory: into the packed tier.
    f.migrate(&r, Location::Host).expect("migrate to host memory");
    assert_eq!(used(Location::Host), 0, "a lossy region moved into frames of host memory");
    f.read(&r, 0, &mut back).expect("read");
    check_bound(l, &data, &back, "host read after the move to host memory");
    match f.acquire(&r, 0..ps, packed, Mode::Read) {
        Err(e @ FabricError::Directory(_)) => assert!(e.to_string().contains("packed tier"), "{e}"),
        other => panic!("a lease in the packed tier: {other:?}"),
    }
    match f.alloc(ps, Placement { device: Some(packed), compression: c, ..Placement::default() }) {
        Err(e @ FabricError::Directory(_)) => assert!(e.to_string().contains("packed tier"), "{e}"),
        other => panic!("a region placed in the packed tier: {other:?}"),
    }
    f.free(&r).expect("free");
    assert_eq!(used(packed), 0, "freed, the region left pages in the packed tier");
    // A region stored as it is: its pages leaving the GPU take frames of host memory.
    let plain = f.alloc((frames_of(&f, g) + 4) * ps, Placement::on(g)).expect("alloc");
    crate::fabric_rig::write_pattern(&f, &plain, 5);
    assert!(used(Location::Host) > 0 && used(packed) == 0, "pages stored as they are in the packed tier");
    f.free(&plain).expect("free");
    // Without a tier of fp32 slots, fp32 values' pages take bf16 slots (half of each unused).
    let r = f
        .alloc(
            (frames_of(&f, g) + 4) * ps,
            Placement { device: Some(g), compression: Compression::Int8F32, ..Placement::default() },
        )
        .expect("alloc");
    let data = values(Element::F32, ((frames_of(&f, g) + 4) * ps) as usize, 47);
    f.write(&r, 0, &data).expect("write");
    assert!(used(Location::Host) == 0 && used(packed) >= 4, "fp32 pages kept out of the bf16 slots");
    f.read(&r, 0, &mut back[..data.len()]).expect("read");
    check_bound(Compression::Int8F32.lossy().expect("lossy"), &data, &back[..data.len()], "fp32 pages in bf16 slots");
    f.free(&r).expect("free");
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
    // A packed tier much smaller than host memory, under a GPU of two pages: one host write far larger than
    // both goes in pieces that fit the tier, not host memory.
    cfg.memory.gpu_budget = Some(vfabric::ByteSize(2 * ps));
    cfg.memory.host_arena = vfabric::ByteSize(32 * ps);
    cfg.memory.packed_arena = vfabric::ByteSize(4 * ps);
    let f = fabric(&cfg);
    let n = frames_of(&f, g) + frames_of(&f, packed) + 12;
    let r = f.alloc(n * ps, Placement { device: Some(g), compression: c, ..Placement::default() }).expect("alloc");
    let data = values(l.element, (n * ps) as usize, 43);
    f.write(&r, 0, &data).expect("one write of more than the GPU and the packed tier hold");
    f.read(&r, 0, &mut back[..data.len()]).expect("read");
    check_bound(l, &data, &back[..data.len()], "one large write");
    f.free(&r).expect("free");
}

/// A node with both packed tiers: a region of fp32 values keeps its pages that leave the GPU in slots of about a
/// quarter of a page (more than 3 pages per page of the tier's bytes), a region of bf16 values in the tier of
/// half-page slots; the fp32 pages spill to the storage tier and come back within their bound, under leases
/// and host reads. The tier of fp32 slots takes no lease and is no region's home. On a node with only that
/// tier, bf16 values' pages (too long for its slots) take frames of host memory.
pub fn the_fp32_tier_holds_fp32_pages_in_a_quarter_of_the_bytes(cfg: &ClusterConfig, dir: &std::path::Path) {
    let (mut cfg, path) = with_storage(cfg, &dir.join("storage-packed-f32.tier"), 160);
    let ps = cfg.memory.page_size.bytes();
    cfg.memory.packed_arena = vfabric::ByteSize(4 * ps);
    cfg.memory.packed_f32_arena = vfabric::ByteSize(4 * ps);
    let (half, quarter) = (Location::Packed(Element::Bf16), Location::Packed(Element::F32));
    let f = fabric(&cfg);
    let g = gpus(&f)[0];
    let used = |loc: Location| f.stats().directory.devices.iter().find(|d| d.location == loc).map_or(0, |d| d.used);
    let slots = frames_of(&f, quarter);
    assert!(slots as f64 >= 3.0 * 4.0, "{slots} fp32 slots in 4 pages' bytes");
    let placed = |c: Compression| Placement { device: Some(g), compression: c, ..Placement::default() };
    for c in [Compression::Int8F32, Compression::Fp8F32] {
        let l = c.lossy().expect("lossy");
        let n = frames_of(&f, g) + slots + 8;
        let r = f.alloc(n * ps, placed(c)).expect("alloc");
        let data = values(l.element, (n * ps) as usize, 53 + c.number() as u64);
        f.write(&r, 0, &data).expect("write");
        assert_eq!((used(Location::Host), used(half)), (0, 0), "{c}: pages outside the fp32 slots");
        assert!(u64::from(used(quarter)) > 2 * 4, "{c}: {} pages in the fp32 slots", used(quarter));
        assert!(f.stats().storage.expect("a storage tier").pages >= 8, "{c}: nothing spilled to storage");
        let mut back = vec![0u8; data.len()];
        f.read(&r, 0, &mut back).expect("read");
        check_bound(l, &data, &back, &format!("{c} host read"));
        // One read of many packed pages (expanded on several threads) gives what reads of a page each, and a
        // read across pages from the middle of one, give.
        let mut one_by_one = vec![0u8; data.len()];
        for (p, page) in one_by_one.chunks_mut(ps as usize).enumerate() {
            f.read(&r, p as u64 * ps, page).expect("read a page");
        }
        assert!(one_by_one == back, "{c}: a read of many pages differs from reads of one");
        // Over a MiB, so that it is expanded on several threads too.
        let len = ((2 << 20) / ps + 2).min(n / 2) as usize * ps as usize;
        let mut across = vec![0u8; len];
        for page in (0..n - 1 - len as u64 / ps).step_by(3) {
            let at = (page * ps + ps / 2 + 6) as usize;
            f.read(&r, at as u64, &mut across).expect("read across pages");
            assert!(across[..] == back[at..at + len], "{c}: a read across pages from {at} differs");
        }
        for p in (0..n).step_by(4) {
            let end = (p + 4).min(n);
            let lease = f.acquire(&r, p * ps..end * ps, g, Mode::Read).expect("acquire");
            let got = read_through_lease(&f, &lease);
            check_bound(l, &data[(p * ps) as usize..(end * ps) as usize], &got, &format!("{c} lease of {p}..{end}"));
            f.release(lease).expect("release");
        }
        // One write over a MiB into pages packed in host memory (packed again on several threads), from the
        // middle of one page to the middle of another (whole groups, so that the bound of what it wrote is
        // that of its own values): what it wrote reads back within its bound, and pages it did not touch are
        // unchanged.
        f.read(&r, 0, &mut back).expect("read");
        let group = LOSSY_GROUP * l.element.bytes();
        let (at, len) = (ps as usize + 3 * group, (2 << 20) + 5 * group);
        let new = values(l.element, len, 67);
        f.write(&r, at as u64, &new).expect("one write over many packed pages");
        let mut after = vec![0u8; back.len()];
        f.read(&r, 0, &mut after).expect("read");
        check_bound(l, &new, &after[at..at + len], &format!("{c}: one write over many pages"));
        let untouched = |p: usize| (p + 1) * (ps as usize) <= at || p * (ps as usize) >= at + len;
        for p in (0..n as usize).filter(|&p| untouched(p)) {
            let page = p * ps as usize..(p + 1) * ps as usize;
            assert!(after[page.clone()] == back[page], "{c}: page {p}, outside the write, changed");
        }
        f.free(&r).expect("free");
        assert_eq!(used(quarter), 0, "{c}: freed, the region left pages in the fp32 slots");
    }
    let r = f.alloc((frames_of(&f, g) + 2) * ps, placed(Compression::Fp8Bf16)).expect("alloc");
    let data = values(Element::Bf16, ((frames_of(&f, g) + 2) * ps) as usize, 59);
    f.write(&r, 0, &data).expect("write");
    assert!(used(quarter) == 0 && used(half) >= 2, "bf16 pages outside the bf16 slots");
    match f.acquire(&r, 0..ps, quarter, Mode::Read) {
        Err(e @ FabricError::Directory(_)) => assert!(e.to_string().contains("packed tier"), "{e}"),
        other => panic!("a lease in the fp32 slots: {other:?}"),
    }
    match f.alloc(ps, Placement { device: Some(quarter), ..placed(Compression::Fp8F32) }) {
        Err(e @ FabricError::Directory(_)) => assert!(e.to_string().contains("packed tier"), "{e}"),
        other => panic!("a region placed in the fp32 slots: {other:?}"),
    }
    f.free(&r).expect("free");
    drop(f);
    assert!(!path.exists(), "the fabric removes its storage file");
    cfg.memory.packed_arena = vfabric::ByteSize(0);
    let f = fabric(&cfg);
    let used = |loc: Location| f.stats().directory.devices.iter().find(|d| d.location == loc).map_or(0, |d| d.used);
    let r = f.alloc((frames_of(&f, g) + 2) * ps, placed(Compression::Int8Bf16)).expect("alloc");
    f.write(&r, 0, &values(Element::Bf16, ((frames_of(&f, g) + 2) * ps) as usize, 61)).expect("write");
    assert!(used(quarter) == 0 && used(Location::Host) >= 2, "bf16 pages in the fp32 slots, or lost");
    f.free(&r).expect("free");
}
