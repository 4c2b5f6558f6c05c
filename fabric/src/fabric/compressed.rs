//! The compressed tier's bytes: packing lossless regions' pages that arrived in host memory's frames into runs of
//! blocks (the directory's `place_compressed` says where), and expanding them on their way out, into a GPU's
//! or host memory's frames or onto the storage tier. Both run on the CPU, on several threads for many pages.
//!
//! A run holds a header and the packed page: `[packed length: u32][codec: u8][0; 3][xxh3-64 of the packed
//! bytes: u64][packed bytes]`, little-endian, from its first block. The checksum is checked before a page is
//! expanded, so a run changed in memory is an error naming its block, never wrong bytes.

use std::sync::Arc;

use vfabric_allocator::{Compression, PageMove, COMPRESSED_BLOCK};
use vfabric_transport::storage::{self, AlignedBuffer, Packer, StorageFile};
use vfabric_transport::Arena;
use xxhash_rust::xxh3::xxh3_64;

use super::copying::Copying;
use super::packed::on_threads;
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

/// Expands the run starting at block `start` of the compressed tier's `arena` into `page`.
pub(crate) fn expand(arena: &dyn Arena, start: u32, page: &mut [u8]) -> Result<(), FabricError> {
    let at = u64::from(start) * COMPRESSED_BLOCK;
    let mut header = [0u8; HEADER];
    arena.read(at, &mut header)?;
    let corrupt = |what: &str| FabricError::Checksum(format!("block {start} of the compressed tier: {what}"));
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as u64;
    let compression = Compression::from_number(header[4]).filter(|c| c.is_lossless());
    let (Some(compression), true) = (compression, HEADER as u64 + len < page.len() as u64) else {
        return Err(corrupt("its header names no packed page"));
    };
    if at + HEADER as u64 + len > arena.len() {
        return Err(corrupt("its packed page runs past the tier"));
    }
    let mut packed = vec![0u8; len as usize];
    arena.read(at + HEADER as u64, &mut packed)?;
    let sum = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
    if xxh3_64(&packed) != sum {
        return Err(corrupt("its packed page does not match its checksum"));
    }
    if !storage::unpack(compression, &packed, page) {
        return Err(corrupt("its packed page does not expand to a page"));
    }
    Ok(())
}

/// Pages a batch out of the compressed tier expands at a time (each into a buffer of its own, unless it goes
/// straight into a frame of host memory).
const EXPAND_CHUNK: usize = 64;

/// Expands the runs of a batch out of the compressed tier (`src` block, `dst` frame): into `dst`'s frames (host
/// memory's straight into them, a GPU's through a buffer), or with `storage` onto its slots, packed again with
/// `compression` there. On several threads for many pages.
pub(crate) fn expand_batch(
    tier: &Arc<dyn Arena>,
    dst: Option<&Arc<dyn Arena>>,
    storage: Option<&StorageFile>,
    page_size: u64,
    moves: &[PageMove],
    compression: Compression,
) -> Result<Copying, FabricError> {
    let ps = page_size as usize;
    // Host memory's frames (a page each) take the pages where they expand.
    let frames = dst.filter(|d| d.location() == vfabric_allocator::Location::Host).and_then(|d| d.host_ptr());
    if let (Some(dst), Some(base)) = (dst, frames) {
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
            if let Some(dst) = dst {
                dst.write(u64::from(m.dst) * dst.location().frame_bytes(page_size), &buf[..])?;
            }
            Ok(())
        })?;
        if let Some(storage) = storage {
            let writes: Vec<(u64, &[u8])> = pages.iter().map(|(m, b)| (u64::from(m.dst), &b[..])).collect();
            storage.write(&writes, compression)?;
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
/// in place: a page that does not shrink costs the probe of its first block, on the calling thread.
pub(crate) fn pack_all(host: &dyn Arena, page_size: u64, pages: &mut [Packing]) -> Result<(), FabricError> {
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
    // The probes first, here: a block each, too little to be worth a thread; then the pages that passed, on
    // several threads.
    let mut worth: Vec<&mut Packing> = PACKER.with(|k| {
        let mut k = k.borrow_mut();
        pages.iter_mut().filter(|p| k.worth_packing(p.compression, page(p.frame))).collect()
    });
    let bytes = worth.len() * ps;
    on_threads(&mut worth, bytes, |p| {
        p.run = PACKER.with(|k| pack(&mut k.borrow_mut(), p.compression, page(p.frame)));
        Ok(())
    })
}
