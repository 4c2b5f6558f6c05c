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

/// A piece of a host read whose page sits packed in host memory: the arena and byte of the packed page, the
/// offset in the page, and where its bytes go.
pub(crate) struct Expansion<'a> {
    pub arena: &'a dyn Arena,
    pub at: u64,
    pub page_offset: u64,
    pub out: &'a mut [u8],
}

/// A piece of a host write into a page packed in host memory: the arena and byte of the packed page, the offset
/// in the page, and the bytes that go there (one after the other).
pub(crate) struct Repacking<'a> {
    pub arena: &'a dyn Arena,
    pub at: u64,
    pub page_offset: u64,
    pub pieces: Vec<&'a [u8]>,
}

/// The most threads one host read or write packs or expands pages on.
const CODEC_THREADS: usize = 8;

/// The cores this process may run on, asked once: `available_parallelism` reads the cgroup's quota from its
/// files each time (tens of microseconds, more than a small call's whole work).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `job` on each of `jobs`, on several threads when they are `bytes` of a MiB or more: the codec runs at a
/// few GB/s a core, a fraction of what host memory copies, so a call over many packed pages uses the cores it
/// can. Every thread is joined; the first error is the answer.
pub(crate) fn on_threads<T: Send>(
    jobs: &mut [T],
    bytes: usize,
    job: impl Fn(&mut T) -> Result<(), FabricError> + Sync,
) -> Result<(), FabricError> {
    // Under a MiB a thread's start would cost about what it saves.
    let threads = if bytes < 1 << 20 { 1 } else { cores().min(CODEC_THREADS).min(jobs.len()) };
    if threads <= 1 {
        return jobs.iter_mut().try_for_each(job);
    }
    let per_thread = jobs.len().div_ceil(threads);
    let job = &job;
    std::thread::scope(|s| {
        let mut done = Vec::new();
        let mut running = Vec::new();
        for share in jobs.chunks_mut(per_thread) {
            // No thread to be had (the system's limit) fails the call with an error, not a panic.
            let run = move || share.iter_mut().try_for_each(job);
            match std::thread::Builder::new().name("vfabric-codec".into()).spawn_scoped(s, run) {
                Ok(t) => running.push(t),
                Err(_) => done.push(Err(FabricError::Internal("no thread could be started for the codec"))),
            }
        }
        done.extend(
            running.into_iter().map(|t| {
                t.join().unwrap_or(Err(FabricError::Internal("a thread packing or expanding pages panicked")))
            }),
        );
        done.into_iter().collect()
    })
}

/// Carries out `pieces` ([`read`] each), on several threads when there are several.
pub(crate) fn read_all(l: Lossy, page_size: u64, mut pieces: Vec<Expansion<'_>>) -> Result<(), FabricError> {
    let bytes = pieces.iter().map(|p| p.out.len()).sum();
    on_threads(&mut pieces, bytes, |p| read(p.arena, p.at, l, page_size, p.page_offset, p.out))
}

/// Carries out `pieces` ([`write`] each), on several threads when there are several.
pub(crate) fn write_all(l: Lossy, page_size: u64, mut pieces: Vec<Repacking<'_>>) -> Result<(), FabricError> {
    let bytes = pieces.iter().flat_map(|p| &p.pieces).map(|b| b.len()).sum();
    on_threads(&mut pieces, bytes, |p| write(p.arena, p.at, l, page_size, p.page_offset, &p.pieces))
}

/// Writes `pieces` (one after the other) at `page_offset` of the packed page at byte `at` of `arena`: expands
/// it, writes them, and packs it again (values of the page the write does not cover go through the codec once
/// more; packing what was expanded changes them by at most the declared bound again). A write of the whole page
/// packs it without expanding the old one.
pub(crate) fn write(
    arena: &dyn Arena,
    at: u64,
    l: Lossy,
    page_size: u64,
    page_offset: u64,
    pieces: &[&[u8]],
) -> Result<(), FabricError> {
    let whole = page_offset == 0 && pieces.iter().map(|p| p.len() as u64).sum::<u64>() == page_size;
    let mut page = if whole {
        vec![0u8; page_size as usize]
    } else {
        expand(l, &read_packed(arena, at, l, page_size)?, page_size)
    };
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
