//! The compressed tier's bytes: packing lossless regions' pages that arrived in host memory's frames into runs of
//! blocks (the directory's `place_compressed` says where), expanding them on their way up, into a GPU's or host
//! memory's frames, and storing them as they are on the storage tier on their way down. Packing and expanding
//! run on the CPU, on several threads for many pages.
//!
//! A run holds a header and the packed page: `[packed length: u32][codec: u8][0; 3][xxh3-64 of the packed
//! bytes: u64][packed bytes]`, little-endian, from its first block. The checksum is checked before a page is
//! expanded, so a run changed in memory is an error naming its block, never wrong bytes; a run that goes to the
//! storage tier takes its checksum with it, checked when it is read back.

use std::sync::Arc;

use vfabric_allocator::{Compression, PageMove, COMPRESSED_BLOCK};
use vfabric_transport::storage::{self, AlignedBuffer, Packer, StorageFile};
use vfabric_transport::Arena;
use xxhash_rust::xxh3::xxh3_64;

use super::copying::Copying;
use super::packed::on_threads;
use super::probe_skip::ProbeSkips;
use crate::directory::PageRef;
use crate::error::FabricError;

/// Bytes of a run's header.
const HEADER: usize = 16;

/// The run of `page` packed with `compression` (header and packed bytes, whole blocks), when it takes fewer
/// blocks than the page; `None` to leave the page where it is.
pub(crate) fn pack(packer: &mut Packer, compression: Compression, page: &[u8]) -> Option<Vec<u8>> {
    let packed = packer.pack(compression, page)?;
    let block = COMPRESSED_BLOCK as usize;
    let len = (HEADER + packed.len()).div_ceil(block) * block;
    if len >= page.len() {
        return None;
    }
    let mut run = vec![0u8; len];
    run[..4].copy_from_slice(&(packed.len() as u32).to_le_bytes());
    run[4] = compression.number();
    run[8..16].copy_from_slice(&xxh3_64(packed).to_le_bytes());
    run[HEADER..HEADER + packed.len()].copy_from_slice(packed);
    Some(run)
}

/// A run as its header describes it: the packed page, its codec, and the checksum recorded when it was packed.
pub(crate) struct Run {
    pub packed: Vec<u8>,
    pub compression: Compression,
    pub sum: u64,
}

/// Reads the run starting at block `start` of the compressed tier's `arena`, holding a page of `page_size`
/// bytes; its checksum is not checked here.
pub(crate) fn read_run(arena: &dyn Arena, start: u32, page_size: u64) -> Result<Run, FabricError> {
    let at = u64::from(start) * COMPRESSED_BLOCK;
    let mut header = [0u8; HEADER];
    arena.read(at, &mut header)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as u64;
    let compression = Compression::from_number(header[4]).filter(|c| c.is_lossless());
    // A run is shorter than its page by a block at least (else the page stays in its frame).
    let (Some(compression), true) =
        (compression, len > 0 && HEADER as u64 + len <= page_size.saturating_sub(COMPRESSED_BLOCK))
    else {
        return Err(corrupt(start, "its header names no packed page"));
    };
    if at + HEADER as u64 + len > arena.len() {
        return Err(corrupt(start, "its packed page runs past the tier"));
    }
    let mut packed = vec![0u8; len as usize];
    arena.read(at + HEADER as u64, &mut packed)?;
    let sum = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
    Ok(Run { packed, compression, sum })
}

/// A run found changed: an error naming its first block.
fn corrupt(start: u32, what: &str) -> FabricError {
    FabricError::Checksum(format!("block {start} of the compressed tier: {what}"))
}

/// Expands the run starting at block `start` of the compressed tier's `arena` into `page`.
pub(crate) fn expand(arena: &dyn Arena, start: u32, page: &mut [u8]) -> Result<(), FabricError> {
    let run = read_run(arena, start, page.len() as u64)?;
    if xxh3_64(&run.packed) != run.sum {
        return Err(corrupt(start, "its packed page does not match its checksum"));
    }
    if !storage::unpack(run.compression, &run.packed, page) {
        return Err(corrupt(start, "its packed page does not expand to a page"));
    }
    Ok(())
}

/// Pages a batch out of the compressed tier expands (each into a buffer of its own, unless it goes straight into
/// a frame of host memory) or stores at a time.
const EXPAND_CHUNK: usize = 64;

/// Expands the runs of a batch out of the compressed tier (`src` block, `dst` frame) into `dst`'s frames (host
/// memory's straight into them, a GPU's through a buffer). On several threads for many pages.
pub(crate) fn expand_batch(
    tier: &Arc<dyn Arena>,
    dst: &Arc<dyn Arena>,
    page_size: u64,
    moves: &[PageMove],
) -> Result<Copying, FabricError> {
    let ps = page_size as usize;
    // Host memory's frames (a page each) take the pages where they expand.
    let frames = Some(dst).filter(|d| d.location() == vfabric_allocator::Location::Host).and_then(|d| d.host_ptr());
    if let Some(base) = frames {
        if moves.iter().any(|m| (u64::from(m.dst) + 1) * page_size > dst.len()) {
            return Err(FabricError::Internal("an expansion names a frame past host memory"));
        }
        let base = base as usize;
        let mut jobs: Vec<PageMove> = moves.to_vec();
        on_threads(&mut jobs, moves.len() * ps, |m| {
            // SAFETY: the frame is inside the arena (checked above), which outlives the call; the stage took it,
            // so nothing else reads or writes it, and the directory names each frame once in a stage.
            let page = unsafe { std::slice::from_raw_parts_mut((base as *mut u8).add(m.dst as usize * ps), ps) };
            expand(tier.as_ref(), m.src, page)
        })?;
        return Ok(Copying::Done(moves.len() as u64 * page_size));
    }
    for chunk in moves.chunks(EXPAND_CHUNK) {
        let mut pages: Vec<(PageMove, AlignedBuffer)> = Vec::with_capacity(chunk.len());
        for m in chunk {
            let buf = AlignedBuffer::new(ps).ok_or(FabricError::Internal("no memory to expand a compressed page"))?;
            pages.push((*m, buf));
        }
        on_threads(&mut pages, chunk.len() * ps, |(m, buf)| {
            expand(tier.as_ref(), m.src, &mut buf[..])?;
            dst.write(u64::from(m.dst) * dst.location().frame_bytes(page_size), &buf[..])?;
            Ok(())
        })?;
    }
    Ok(Copying::Done(moves.len() as u64 * page_size))
}

/// Stores the runs of a batch out of the compressed tier (`src` block, `dst` slot) on the storage tier as they
/// are packed, with the checksums they were packed with (a run changed in memory since fails when read back).
pub(crate) fn store_batch(
    tier: &dyn Arena,
    storage: &StorageFile,
    page_size: u64,
    moves: &[PageMove],
) -> Result<Copying, FabricError> {
    for chunk in moves.chunks(EXPAND_CHUNK) {
        let read = |m: &PageMove| Ok::<_, FabricError>((u64::from(m.dst), read_run(tier, m.src, page_size)?));
        let runs: Vec<(u64, Run)> = chunk.iter().map(read).collect::<Result<_, _>>()?;
        // A region's pages share a codec; the tier's runs are written a codec at a time.
        let mut codecs: Vec<Compression> = Vec::new();
        for (_, r) in &runs {
            if !codecs.contains(&r.compression) {
                codecs.push(r.compression);
            }
        }
        for codec in codecs {
            let writes: Vec<(u64, &[u8], u64)> =
                runs.iter().filter(|(_, r)| r.compression == codec).map(|(s, r)| (*s, &r.packed[..], r.sum)).collect();
            storage.write_packed(&writes, codec)?;
        }
    }
    Ok(Copying::Done(moves.len() as u64 * page_size))
}

/// A page of host memory to pack: its frame, the page whose copy it holds, its region's compression, and the
/// run it packs to.
pub(crate) struct Packing {
    pub frame: u32,
    pub page: PageRef,
    pub compression: Compression,
    pub run: Option<Vec<u8>>,
}

/// Packs each of `pages` from host memory's `host` arena (a run for those that shrink by a block), reading each
/// in place: a page that does not shrink costs the probe of its first block, on the calling thread, unless
/// `skips` says its region's pages are not worth looking at for now. Returns the pages skipped.
pub(crate) fn pack_all(
    host: &dyn Arena,
    page_size: u64,
    pages: &mut [Packing],
    skips: &mut ProbeSkips,
) -> Result<u64, FabricError> {
    let ps = page_size as usize;
    let base = host.host_ptr().ok_or(FabricError::Internal("host memory's arena has no host address"))?;
    if pages.iter().any(|p| (u64::from(p.frame) + 1) * page_size > host.len()) {
        return Err(FabricError::Internal("a page to pack names a frame past host memory"));
    }
    thread_local! {
        // Each thread's packer keeps its scratch memory and zstd context from page to page.
        static PACKER: std::cell::RefCell<Packer> = std::cell::RefCell::new(Packer::default());
    }
    let base = base as usize;
    // SAFETY: the frame is inside the arena (checked above), which outlives the call. The caller holds the
    // directory's lock and the frame's copy is unpinned: no stage in flight writes it (a stage writes only frames
    // it took, pinned) and no lease maps it, so nothing changes its bytes while they are read.
    let page = |frame: u32| unsafe { std::slice::from_raw_parts((base as *const u8).add(frame as usize * ps), ps) };
    // The probes first, here, in the order the pages arrived: a block each, too little to be worth a thread;
    // then the pages that passed, on several threads.
    let mut skipped = 0;
    let mut worth: Vec<&mut Packing> = PACKER.with(|k| {
        let mut k = k.borrow_mut();
        let mut look = |p: &&mut Packing| {
            if !skips.try_page(p.page.slot) {
                skipped += 1;
                return false;
            }
            let worth = k.worth_packing(p.compression, page(p.frame));
            if !worth {
                skips.record(p.page.slot, false);
            }
            worth
        };
        pages.iter_mut().filter(|p| look(p)).collect()
    });
    let bytes = worth.len() * ps;
    on_threads(&mut worth, bytes, |p| {
        p.run = PACKER.with(|k| pack(&mut k.borrow_mut(), p.compression, page(p.frame)));
        Ok(())
    })?;
    for p in &worth {
        skips.record(p.page.slot, p.run.is_some());
    }
    Ok(skipped)
}

#[cfg(test)]
mod tests {
    use vfabric_transport::emulated::EmulatedNode;
    use vfabric_transport::storage::StorageSpec;
    use vfabric_transport::{ArenaSpec, DeviceLayer, Location};

    use super::*;

    const PAGE: usize = 64 << 10;

    /// A page that packs to a block or two: zeros but for a few bytes every 4 KiB.
    fn sparse(seed: u8) -> Vec<u8> {
        let mut p = vec![0u8; PAGE];
        for i in (0..PAGE).step_by(4096) {
            p[i] = seed;
            p[i + 1] = (i >> 12) as u8;
        }
        p
    }

    /// A compressed tier holding `pages` packed with LZ4, and the first block of each one's run.
    fn tier_of(pages: &[Vec<u8>]) -> (Arc<dyn Arena>, Vec<u32>) {
        let node = EmulatedNode::new(1, 1 << 30);
        let tier = node.create_arena(&ArenaSpec::new(Location::Compressed, 1 << 20)).expect("arena");
        let mut starts = Vec::new();
        let mut at = 0u32;
        for p in pages {
            let run = pack(&mut Packer::default(), Compression::Lz4, p).expect("shrinks");
            tier.write(u64::from(at) * COMPRESSED_BLOCK, &run).expect("write the run");
            starts.push(at);
            at += (run.len() as u64 / COMPRESSED_BLOCK) as u32;
        }
        (tier, starts)
    }

    /// Flips a byte of the packed page in the run at `start`, `at` bytes past its header.
    fn flip(tier: &dyn Arena, start: u32, at: u64) {
        let at = u64::from(start) * COMPRESSED_BLOCK + HEADER as u64 + at;
        let mut b = [0u8];
        tier.read(at, &mut b).unwrap();
        tier.write(at, &[b[0] ^ 0x10]).unwrap();
    }

    #[test]
    fn runs_expand_to_their_pages_and_a_changed_run_names_its_block() {
        let pages = [sparse(1), sparse(2), sparse(3), sparse(4)];
        let (tier, starts) = tier_of(&pages);
        let mut back = vec![0u8; PAGE];
        for (p, &s) in pages.iter().zip(&starts) {
            expand(tier.as_ref(), s, &mut back).expect("expand");
            assert!(back == *p, "the run at block {s}");
        }
        flip(tier.as_ref(), starts[1], 3);
        // A header naming no codec, or a length no run of a page has (a run saves a block at least).
        tier.write(u64::from(starts[2]) * COMPRESSED_BLOCK + 4, &[0xEE]).unwrap();
        let long = (PAGE as u64 - COMPRESSED_BLOCK - HEADER as u64 + 1) as u32;
        tier.write(u64::from(starts[3]) * COMPRESSED_BLOCK, &long.to_le_bytes()).unwrap();
        for (s, what) in
            [(starts[1], "checksum"), (starts[2], "names no packed page"), (starts[3], "names no packed page")]
        {
            match expand(tier.as_ref(), s, &mut back) {
                Err(e @ FabricError::Checksum(_)) => {
                    assert!(e.to_string().contains(&format!("block {s} ")) && e.to_string().contains(what), "{e}")
                }
                other => panic!("the changed run at block {s}: {other:?}"),
            }
        }
        expand(tier.as_ref(), starts[0], &mut back).expect("the first run is intact");
        assert!(back == pages[0]);
    }

    #[test]
    fn runs_go_to_storage_packed_with_the_checksums_they_were_packed_with() {
        let pages = [sparse(4), sparse(5)];
        let (tier, starts) = tier_of(&pages);
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/unit-scratch");
        std::fs::create_dir_all(&dir).unwrap();
        let spec = StorageSpec {
            path: dir.join("compressed-store.tier"),
            bytes: 4 * PAGE as u64,
            page_size: PAGE as u64,
            depth: 8,
        };
        let storage = StorageFile::create(&spec).expect("storage");
        // The second run changes in memory after it was packed: stored, it fails when read back.
        flip(tier.as_ref(), starts[1], 0);
        let moves = [PageMove { src: starts[0], dst: 2 }, PageMove { src: starts[1], dst: 3 }];
        store_batch(tier.as_ref(), &storage, PAGE as u64, &moves).expect("store").wait().expect("stored");
        let (bytes, held) = storage.stored();
        assert!(held == 2 && bytes <= 2 * 4096, "stored packed: {bytes} bytes in {held} slots");
        let mut back = AlignedBuffer::new(PAGE).unwrap();
        storage.read(&mut [(2, &mut back[..])]).expect("the intact run reads back");
        assert!(back[..] == pages[0][..]);
        match storage.read(&mut [(3, &mut back[..])]) {
            Err(e) => assert!(e.is_corrupt() && e.to_string().contains("slot 3"), "{e}"),
            Ok(()) => panic!("a run changed in memory read back from storage as right"),
        }
    }
}
