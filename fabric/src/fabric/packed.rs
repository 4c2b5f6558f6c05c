//! Host reads and writes of a lossy region's pages where they sit packed (host memory, the storage tier): the
//! page is expanded on the CPU with the same codec the GPU packs with, and a write packs it again.

use vfabric_allocator::Lossy;
use vfabric_transport::device::lossy;
use vfabric_transport::Arena;

use crate::error::FabricError;

/// A page of `page_size` bytes expanded from its packed form `packed`.
pub(crate) fn expand(l: Lossy, packed: &[u8], page_size: u64) -> Vec<u8> {
    let mut page = vec![0u8; page_size as usize];
    lossy::unpack(l, packed, &mut page);
    page
}

/// Reads the packed page at byte `at` of `arena`.
fn read_packed(arena: &dyn Arena, at: u64, l: Lossy, page_size: u64) -> Result<Vec<u8>, FabricError> {
    let mut packed = vec![0u8; l.packed_len(page_size) as usize];
    arena.read(at, &mut packed)?;
    Ok(packed)
}

/// Fills `out` from `page_offset` of the packed page at byte `at` of `arena`.
pub(crate) fn read(
    arena: &dyn Arena,
    at: u64,
    l: Lossy,
    page_size: u64,
    page_offset: u64,
    out: &mut [u8],
) -> Result<(), FabricError> {
    let page = expand(l, &read_packed(arena, at, l, page_size)?, page_size);
    out.copy_from_slice(&page[page_offset as usize..page_offset as usize + out.len()]);
    Ok(())
}

/// Writes `pieces` (one after the other) at `page_offset` of the packed page at byte `at` of `arena`: expands
/// it, writes them, and packs it again (values of the page the write does not cover go through the codec once
/// more; packing what was expanded changes them by at most the declared bound again).
pub(crate) fn write(
    arena: &dyn Arena,
    at: u64,
    l: Lossy,
    page_size: u64,
    page_offset: u64,
    pieces: &[&[u8]],
) -> Result<(), FabricError> {
    let mut page = expand(l, &read_packed(arena, at, l, page_size)?, page_size);
    let mut o = page_offset as usize;
    for p in pieces {
        page[o..o + p.len()].copy_from_slice(p);
        o += p.len();
    }
    let mut packed = vec![0u8; l.packed_len(page_size) as usize];
    lossy::pack(l, &page, &mut packed);
    arena.write(at, &packed)?;
    Ok(())
}
