//! A stage's copies under way: a mover's transfer (between arenas), or a storage tier's file I/O (between host
//! memory frames and storage slots). io_uring keeps many pages in flight either way. The file I/O runs on a
//! thread of its own, as a GPU's copies run on the device: a prefetch's reads go on while the walk that asked
//! for them does, and a call waits for a stage's I/O with the same deadline as for its GPU copies
//! ([`all_done_by`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use vfabric_allocator::{Compression, Location, PageMove};
use vfabric_transport::storage::StorageFile;
use vfabric_transport::{Arena, Coding, EngineChoice, Mover, PageBatch, Transfer};

use crate::directory::{Copy as DirCopy, Directory, RegionHandle};
use crate::error::FabricError;

/// One batch of a stage, under way or done.
pub(crate) enum Copying {
    /// Copies a mover runs.
    Mover(Transfer),
    /// File I/O that already ran, with the bytes it moved.
    Done(u64),
    /// File I/O running on a thread of its own.
    Behind(Reader),
}

/// A thread doing a stage's file reads, waited for however its copy ends: dropped (a stage aborted, a fabric
/// going away) it joins the thread, since the thread writes frames the stage took and holds the tier's file.
pub(crate) struct Reader(Option<std::thread::JoinHandle<Result<u64, FabricError>>>);

impl Reader {
    fn is_finished(&self) -> bool {
        self.0.as_ref().is_none_or(|h| h.is_finished())
    }

    fn join(mut self) -> Result<u64, FabricError> {
        match self.0.take() {
            Some(h) => h.join().map_err(|_| FabricError::Internal("a stage's copies on a thread panicked"))?,
            None => Err(FabricError::Internal("a stage's copies on a thread were waited for twice")),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}

impl Copying {
    /// Whether it has finished (a failed transfer counts as finished: waiting reports its error).
    pub(crate) fn is_complete(&mut self) -> bool {
        match self {
            Copying::Mover(t) => !matches!(t.is_complete(), Ok(false)),
            Copying::Done(_) => true,
            Copying::Behind(r) => r.is_finished(),
        }
    }

    /// Waits for it; the bytes moved.
    pub(crate) fn wait(self) -> Result<u64, FabricError> {
        match self {
            Copying::Mover(t) => Ok(t.wait()?.bytes),
            Copying::Done(bytes) => Ok(bytes),
            Copying::Behind(r) => r.join(),
        }
    }
}

/// Runs the page moves of a batch between host memory (`host`, the host tier's arena or the packed tier's) and
/// the storage tier: `to_storage` writes host frames to storage slots (`src` frame, `dst` slot), otherwise reads
/// slots into host frames (`src` slot, `dst` frame). A frame is its arena's [`Location::frame_bytes`]: a page,
/// or a slot of the packed tier holding a packed page. Pages written are packed with `compression` where that
/// saves space. Every page is checksummed on the way down and checked on the way up.
pub(crate) fn storage_batch(
    storage: &StorageFile,
    host: &Arc<dyn Arena>,
    page_size: u64,
    moves: &[PageMove],
    to_storage: bool,
    compression: Compression,
) -> Result<Copying, FabricError> {
    let base = host.host_ptr().ok_or(FabricError::Internal("the host tier's arena has no host address"))?;
    let stride = host.location().frame_bytes(page_size);
    let frame = |f: u32| -> Result<*mut u8, FabricError> {
        let at = u64::from(f) * stride;
        if at + stride > host.len() {
            return Err(FabricError::Internal("a storage move names a host frame past the arena"));
        }
        // SAFETY: `at + stride` is inside the arena (checked), which lives as long as `host`.
        Ok(unsafe { base.add(at as usize) })
    };
    let ps = stride as usize;
    if to_storage {
        let mut pages: Vec<(u64, &[u8])> = Vec::with_capacity(moves.len());
        for m in moves {
            // SAFETY: the directory took the frame for this stage's source page: nothing writes it while the
            // stage runs (its copy is pinned by the stage, or it is the page's only copy, unleased).
            pages.push((u64::from(m.dst), unsafe { std::slice::from_raw_parts(frame(m.src)?, ps) }));
        }
        storage.write(&pages, compression)?;
    } else {
        let mut pages: Vec<(u64, &mut [u8])> = Vec::with_capacity(moves.len());
        for m in moves {
            // SAFETY: the stage took the destination frame: no page uses it, nothing else reads or writes it, and
            // the directory names each frame once in a stage.
            pages.push((u64::from(m.src), unsafe { std::slice::from_raw_parts_mut(frame(m.dst)?, ps) }));
        }
        storage.read(&mut pages)?;
    }
    Ok(Copying::Done(moves.len() as u64 * page_size))
}

/// [`storage_batch`] on a thread of its own.
pub(crate) fn storage_behind(
    storage: &Arc<StorageFile>,
    host: &Arc<dyn Arena>,
    page_size: u64,
    moves: Vec<PageMove>,
    to_storage: bool,
    compression: Compression,
) -> Result<Copying, FabricError> {
    let (storage, host) = (Arc::clone(storage), Arc::clone(host));
    let name = if to_storage { "vfabric-storage-write" } else { "vfabric-storage-read" };
    behind(name, move || storage_batch(&storage, &host, page_size, &moves, to_storage, compression)?.wait())
}

/// Runs a batch's copies (`copy`, the bytes it moved) on a thread of its own, for a stage that stays in flight.
/// The frames it writes were taken by the stage and the copies it reads are pinned by it until it is settled,
/// which waits for the thread.
pub(crate) fn behind(
    name: &str,
    copy: impl FnOnce() -> Result<u64, FabricError> + Send + 'static,
) -> Result<Copying, FabricError> {
    let handle = std::thread::Builder::new().name(name.into()).spawn(copy).map_err(|e| {
        FabricError::Storage(vfabric_transport::storage::StorageError::Ring {
            what: "starting a copy thread",
            source: e,
        })
    })?;
    Ok(Copying::Behind(Reader(Some(handle))))
}

/// Starts a batch between two arenas on the mover: copied, or packed or expanded when it carries a lossy
/// compression (packed leaving a GPU, expanded arriving on one; see the directory's `StageBatch`).
pub(crate) fn mover_batch(
    mover: &dyn Mover,
    src: &Arc<dyn Arena>,
    dst: &Arc<dyn Arena>,
    batch: &PageBatch,
    compression: Compression,
) -> Result<Copying, FabricError> {
    let transfer = match (compression.lossy(), src.location(), dst.location()) {
        (Some(l), Location::Gpu(_), h) if h.is_host_memory() => mover.submit_coded(src, dst, batch, Coding::Pack(l))?,
        (Some(l), h, Location::Gpu(_)) if h.is_host_memory() => {
            mover.submit_coded(src, dst, batch, Coding::Unpack(l))?
        }
        _ => mover.submit(src, dst, batch, EngineChoice::Auto)?,
    };
    Ok(Copying::Mover(transfer))
}

/// A failed call's error as its caller gets it: a storage tier's read of a slot that failed (its page came back
/// corrupt, short, or not at all) names the page the slot holds, by its region and index in it, as the
/// directory has them (the stage that read it, not yet committed or aborted, changed nothing there); any other
/// error as it is. A slot no page holds leaves the tier's error as it is.
pub(crate) fn naming_stored_page(dir: &Directory, e: FabricError) -> FabricError {
    let FabricError::Storage(source) = e else { return e };
    let page = source.failed_read_slot().and_then(|slot| Some((slot, stored_page(dir, slot)?)));
    match page {
        Some((slot, (region, page))) => FabricError::StoredPage { region: region.to_string(), page, slot, source },
        None => FabricError::Storage(source),
    }
}

/// The region and page index of the page with a copy in the storage tier's slot `slot`. A walk over every
/// region's pages: only a failed read pays for it.
fn stored_page(dir: &Directory, slot: u64) -> Option<(RegionHandle, u64)> {
    let at = DirCopy { dev: dir.dev(Location::Storage).ok()?, frame: u32::try_from(slot).ok()? };
    dir.regions().find_map(|r| {
        let (page, _) = r.pages.touched().find(|(_, e)| e.copies().any(|c| c == at))?;
        Some((r.handle, page as u64))
    })
}

/// Polls `copies` until all have finished (true) or `deadline` passes (false). Yields for the first
/// milliseconds (most stages finish in microseconds to milliseconds: a sleep's granularity would show in every
/// acquire), then sleeps in steps of at most a millisecond.
pub(crate) fn all_done_by(copies: &mut [Copying], deadline: Instant) -> bool {
    let start = Instant::now();
    loop {
        if copies.iter_mut().all(Copying::is_complete) {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let waited = now - start;
        if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep((waited / 16).clamp(Duration::from_micros(20), Duration::from_millis(1)));
        }
    }
}

/// Whether a batch between `from` and `to` is the storage tier's (file I/O) rather than a mover's.
pub(crate) fn is_storage(from: Location, to: Location) -> bool {
    from == Location::Storage || to == Location::Storage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_on_a_thread_is_waited_for_until_its_deadline_and_no_longer() {
        let slow = || {
            std::thread::sleep(Duration::from_millis(400));
            Ok(7)
        };
        let mut copies = vec![behind("vfabric-test", slow).expect("a thread")];
        assert!(!all_done_by(&mut copies, Instant::now() + Duration::from_millis(50)), "400 ms of work in 50");
        assert!(all_done_by(&mut copies, Instant::now() + Duration::from_secs(60)), "then it finishes");
        assert_eq!(copies.pop().map(Copying::wait).transpose().expect("its result"), Some(7));
    }
}
