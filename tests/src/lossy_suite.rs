//! Lossy regions, on any device layer: coded moves give the CPU codec's bytes exactly, and a region stored
//! lossily comes back within its declared bound from every tier.

use std::sync::Arc;

use vfabric::{ClusterConfig, Compression, FabricError, Mode, Placement};
use vfabric_allocator::{Element, Lossy, LOSSY_GROUP, LOSSY_TINY};
use vfabric_transport::device::lossy;
use vfabric_transport::{Arena, Coding, DeviceLayer, Location, MoveError, MoverConfig, PageBatch, PageMove};

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

/// Coded moves between every GPU and host memory, both ways, on scattered frames: packing on the device gives
/// exactly the CPU codec's bytes (and leaves the rest of each destination frame alone), expanding gives exactly
/// the CPU's expansion; pages that hold no whole groups are refused with a typed error.
pub fn coded_moves_match_the_cpu(layer: &dyn DeviceLayer, scale: Scale) {
    let mover = layer.mover(MoverConfig::default()).expect("mover");
    let page = 2u64 << 20;
    let frames = (scale.arena_bytes / page).min(16) as u32;
    let bytes = u64::from(frames) * page;
    let host = arena(layer, Location::Host, bytes, bytes);
    let moves: Vec<PageMove> = (0..frames / 2).map(|i| PageMove { src: i * 2, dst: frames - 1 - i }).collect();
    let batch = PageBatch::from_moves(page, moves.clone());
    let ps = page as usize;
    for gpu in layer.gpus().iter().map(|g| Location::Gpu(g.index)) {
        let dev: Arc<dyn Arena> = arena(layer, gpu, bytes, bytes);
        for c in LOSSY {
            let l = c.lossy().expect("lossy");
            let data = values(l.element, bytes as usize, 7 + c.number() as u64);
            dev.write(0, &data).expect("write the values");
            host.fill(0, bytes, 0xEE).expect("poison");
            let what = format!("{gpu} {c}");
            mover.submit_coded(&dev, &host, &batch, Coding::Pack(l)).expect("submit").wait().expect("pack");
            let mut got = vec![0u8; bytes as usize];
            host.read(0, &mut got).expect("read packed");
            let n = l.packed_len(page) as usize;
            let mut want = vec![0xEEu8; ps];
            for m in &moves {
                let src = &data[m.src as usize * ps..][..ps];
                lossy::pack(l, src, &mut want);
                let at = m.dst as usize * ps;
                assert!(got[at..at + n] == want[..n], "{what}: packed frame {} differs from the CPU's", m.dst);
                assert!(got[at + n..at + ps].iter().all(|&b| b == 0xEE), "{what}: past the packed bytes");
            }
            // Back to the GPU, expanded, into the frames the pages came from (cleared first).
            dev.fill(0, bytes, 0).expect("clear");
            let home = PageBatch::from_moves(page, moves.iter().map(|m| PageMove { src: m.dst, dst: m.src }).collect());
            mover.submit_coded(&host, &dev, &home, Coding::Unpack(l)).expect("submit").wait().expect("unpack");
            dev.read(0, &mut got).expect("read expanded");
            let mut page_back = vec![0u8; ps];
            for m in &moves {
                let packed = &want_packed(l, &data[m.src as usize * ps..][..ps]);
                lossy::unpack(l, packed, &mut page_back);
                let at = m.src as usize * ps;
                assert!(got[at..at + ps] == page_back[..], "{what}: expanded frame {} differs from the CPU's", m.src);
                check_bound(l, &data[at..at + ps], &got[at..at + ps], &what);
            }
        }
        let odd = PageBatch::from_moves(4112, vec![PageMove { src: 0, dst: 0 }]);
        let l = Compression::Fp8Bf16.lossy().expect("lossy");
        match mover.submit_coded(&dev, &host, &odd, Coding::Pack(l)) {
            Err(MoveError::NotPackable { page: 4112, .. }) => {}
            other => panic!("{gpu}: pages of 4112 bytes packed: {other:?}"),
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
