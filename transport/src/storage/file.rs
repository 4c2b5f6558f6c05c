//! `StorageFile`: a file of page-sized slots the fabric creates, sizes, and removes, read and written with
//! O_DIRECT through io_uring, the xxh3-64 of every slot's bytes recorded when written and checked when read. A
//! page written with compression that saves at least a block is stored packed at the start of its slot, through
//! a staging buffer the tier keeps and reuses; only its blocks are written and read back, and its checksum is of
//! those bytes, checked before they are expanded.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use xxhash_rust::xxh3::xxh3_64;

use vfabric_allocator::Compression;

use super::buffer::{AlignedBuffer, DIRECT_ALIGN};
use super::codec::{blocks, threads, Packer};
use super::error::StorageError;
use super::ring::{Op, Request, Ring};
use super::rings::{Rings, Taken};

/// The first bytes of a tier's file: a file that starts with them is a tier of an earlier run (reset, never
/// trusted); one that does not is somebody else's (left alone).
const MAGIC: &[u8; 8] = b"VFABTIER";
/// The header block before the first slot.
const HEADER: u64 = DIRECT_ALIGN as u64;
/// Most rings (callers with requests in flight at once) a tier has: the fabric's evictions beside its
/// prefetch's staging windows.
const RINGS: usize = 4;

/// What a storage tier is: where, how large, in pages of what size, and how many requests it keeps in flight.
#[derive(Debug, Clone)]
pub struct StorageSpec {
    /// The file (created; a tier's file from an earlier run is reset, one in use by a live tier refused).
    pub path: PathBuf,
    /// Bytes of pages (a whole number of pages).
    pub bytes: u64,
    /// The page size (a multiple of 4096).
    pub page_size: u64,
    /// Requests in flight at once.
    pub depth: u32,
}

/// A storage tier's file (see the module's docs), held with an exclusive advisory lock (`flock`) while it lives,
/// so that a second tier at the same path, in this process or another, is refused rather than resetting it.
/// Removed when dropped (before the lock goes with the file's descriptor).
pub struct StorageFile {
    file: Flock<File>,
    path: PathBuf,
    page_size: u64,
    slots: u64,
    depth: u32,
    io: Rings<Io>,
    /// Per slot, the page it holds, if it holds one.
    held: Mutex<Vec<Option<Held>>>,
}

/// What a slot holds: the checksum of the bytes it stores (its page, or its packed form), and the length and
/// codec of its packed form when it is stored packed.
#[derive(Debug, Clone, Copy)]
struct Held {
    sum: u64,
    packed: Option<(u32, Compression)>,
}

/// A ring and the memory packed pages pass through, used by one batch at a time.
struct Io {
    ring: Ring,
    /// One packer per thread a batch packs or unpacks its pages on (see [`threads`]), kept for the next batch.
    packers: Vec<Packer>,
    /// Staging for packed pages, one page-sized place per page of a request; grown to the largest request.
    staging: Option<AlignedBuffer>,
}

/// Staging with room for `pages` pages of `page_size` bytes, grown when it has less.
fn staging(
    held: &mut Option<AlignedBuffer>,
    pages: usize,
    page_size: usize,
) -> Result<&mut AlignedBuffer, StorageError> {
    let need = pages.max(1) * page_size;
    if held.as_ref().is_none_or(|b| b.len() < need) {
        *held = None;
        *held = Some(AlignedBuffer::new(need).ok_or_else(|| {
            StorageError::InvalidSpec(format!("cannot allocate {need} bytes of staging for packed pages"))
        })?);
    }
    Ok(held.as_mut().expect("just made"))
}

impl Io {
    fn new(depth: u32) -> Result<Io, StorageError> {
        Ok(Io { ring: Ring::new(depth)?, packers: vec![Packer::default()], staging: None })
    }

    /// The first `n` packers (at least one), made as needed.
    fn packers(packers: &mut Vec<Packer>, n: usize) -> &mut [Packer] {
        if packers.len() < n.max(1) {
            packers.resize_with(n.max(1), Packer::default);
        }
        &mut packers[..n.max(1)]
    }
}

impl StorageFile {
    /// Creates the tier's file at `spec.path`, its space reserved up front (so a full disk is an error now, not
    /// a failed eviction later). A tier's file left by an earlier run is reset; one a live tier holds (its lock
    /// taken) is refused with [`StorageError::InUse`] and left as it is; any other file there is refused.
    pub fn create(spec: &StorageSpec) -> Result<StorageFile, StorageError> {
        let ps = spec.page_size;
        if ps == 0 || ps % DIRECT_ALIGN as u64 != 0 || ps > u64::from(u32::MAX) {
            return Err(StorageError::InvalidSpec(format!(
                "page size {ps} is not a multiple of {DIRECT_ALIGN} below 4 GiB"
            )));
        }
        if spec.bytes == 0 || spec.bytes % ps != 0 {
            return Err(StorageError::InvalidSpec(format!(
                "{} bytes are not a whole number of {ps}-byte pages",
                spec.bytes
            )));
        }
        if spec.depth == 0 || !spec.depth.is_power_of_two() || spec.depth > 4096 {
            return Err(StorageError::InvalidSpec(format!("depth {} is not a power of two up to 4096", spec.depth)));
        }
        let path = spec.path.clone();
        let file_err = |what: &'static str| {
            let path = path.clone();
            move |source| StorageError::File { path, what, source }
        };
        let earlier = check_not_foreign(&path)?;
        let file = open_locked(&path)?;
        // The lock is ours: a tier's file there is one whose process has ended. Nothing of it is kept.
        if earlier {
            tracing::warn!(path = %path.display(), "a storage tier's file from an earlier run: reset, its pages not trusted");
        }
        file.set_len(0).map_err(file_err("resetting it"))?;
        let tier = StorageFile {
            file,
            path: path.clone(),
            page_size: ps,
            slots: spec.bytes / ps,
            depth: spec.depth,
            io: Rings::new(Io::new(spec.depth)?, RINGS),
            held: Mutex::new(vec![None; (spec.bytes / ps) as usize]),
        };
        // From here on, dropping `tier` removes the file.
        nix::fcntl::posix_fallocate(&*tier.file, 0, (HEADER + spec.bytes) as i64).map_err(|e| StorageError::File {
            path: path.clone(),
            what: "reserving its space",
            source: e.into(),
        })?;
        let mut header = AlignedBuffer::new(HEADER as usize).expect("a 4 KiB buffer");
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&ps.to_le_bytes());
        header[16..24].copy_from_slice(&tier.slots.to_le_bytes());
        header[24..28].copy_from_slice(&std::process::id().to_le_bytes());
        tier.file.write_all_at(&header, 0).map_err(file_err("writing its header"))?;
        Ok(tier)
    }

    /// The page size.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Slots (pages the tier holds).
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where slot `slot`'s page starts in the file (after a 4 KiB header).
    pub fn slot_offset(&self, slot: u64) -> u64 {
        HEADER + slot * self.page_size
    }

    /// Writes pages: each `(slot, page)` one page, all in flight together (up to the depth), each packed with
    /// `compression` where that saves a block. On error, the slots whose write failed hold no page; the others
    /// hold theirs.
    pub fn write(&self, pages: &[(u64, &[u8])], compression: Compression) -> Result<(), StorageError> {
        let ps = self.page_size as usize;
        let mut requests = Vec::with_capacity(pages.len());
        let mut held = Vec::with_capacity(pages.len());
        let lossy = compression.lossy().map(|l| l.packed_len(self.page_size) as usize).filter(|&n| n <= ps);
        for &(slot, page) in pages {
            // A lossy page's buffer may be a slot of the packed tier, as long as its packed bytes' blocks.
            let least = lossy.map_or(ps, blocks);
            let mut r = self.request(slot, page.as_ptr() as *mut u8, page.len(), least)?;
            match lossy {
                // A lossy page was packed on its way out of the GPU, at the start of its buffer: only those
                // bytes are written, checksummed and read back.
                Some(n) => {
                    r.len = blocks(n) as u32;
                    held.push(Held { sum: xxh3_64(&page[..n]), packed: Some((n as u32, compression)) });
                }
                // Checksummed below, packed or not.
                None => held.push(Held { sum: 0, packed: None }),
            }
            requests.push(r);
        }
        self.check_distinct(&requests)?;
        // A failed write leaves nothing to read back: forget each slot's page before its write starts.
        {
            let mut table = self.lock_held();
            for r in &requests {
                table[r.slot as usize] = None;
            }
        }
        let mut io = self.take_io()?;
        let Io { ring, packers, staging: held_staging } = &mut *io;
        if lossy.is_none() && compression != Compression::None {
            let staging = staging(held_staging, pages.len(), ps)?;
            pack_all(Io::packers(packers, threads(pages.len())), compression, pages, ps, staging, &mut held);
            for (place, (r, h)) in staging.chunks_mut(ps).zip(requests.iter_mut().zip(&held)) {
                if let Some((n, _)) = h.packed {
                    r.ptr = place.as_mut_ptr();
                    r.len = blocks(n as usize) as u32;
                }
            }
        } else if lossy.is_none() {
            for (&(_, page), h) in pages.iter().zip(&mut held) {
                h.sum = xxh3_64(page);
            }
        }
        self.write_requests(ring, &requests, held)
    }

    /// Writes pages already packed with a lossless `compression` (the compressed tier's runs, moving down a
    /// tier as they are): each `(slot, packed bytes, xxh3-64 of them)`, all in flight together. The checksum is
    /// the one the caller recorded when it packed them, not computed here: bytes changed since are caught when
    /// read back, never stored as right. Refused (`InvalidSpec`) for a codec that is not lossless or packed
    /// bytes that save no block; on a write error, as [`StorageFile::write`].
    pub fn write_packed(&self, pages: &[(u64, &[u8], u64)], compression: Compression) -> Result<(), StorageError> {
        let ps = self.page_size as usize;
        if !compression.is_lossless() {
            return Err(StorageError::InvalidSpec(format!("{compression} is not a lossless codec")));
        }
        if let Some((slot, ..)) = pages.iter().find(|(_, b, _)| b.is_empty() || blocks(b.len()) >= ps) {
            return Err(StorageError::InvalidSpec(format!("slot {slot}: packed bytes that save no block")));
        }
        let mut io = self.take_io()?;
        let Io { ring, staging: held_staging, .. } = &mut *io;
        let staging = staging(held_staging, pages.len(), ps)?;
        let mut requests = Vec::with_capacity(pages.len());
        let mut held = Vec::with_capacity(pages.len());
        for (k, &(slot, packed, sum)) in pages.iter().enumerate() {
            let place = &mut staging[k * ps..(k + 1) * ps];
            let mut r = self.request(slot, place.as_mut_ptr(), ps, ps)?;
            stage_packed(place, packed, &mut r);
            requests.push(r);
            held.push(Held { sum, packed: Some((packed.len() as u32, compression)) });
        }
        self.check_distinct(&requests)?;
        {
            let mut table = self.lock_held();
            for r in &requests {
                table[r.slot as usize] = None;
            }
        }
        self.write_requests(ring, &requests, held)
    }

    /// Writes `requests` (their bytes in place) and records each written slot's `held`; the first error.
    fn write_requests(&self, ring: &mut Ring, requests: &[Request], held: Vec<Held>) -> Result<(), StorageError> {
        // SAFETY: the pages are borrowed until this returns, and the staging is held by the lock; a write only
        // reads them.
        let results = unsafe { ring.run(self.file.as_raw_fd(), Op::Write, requests, |_| {})? };
        let mut table = self.lock_held();
        let mut first = None;
        for ((r, h), res) in requests.iter().zip(held).zip(results) {
            match res {
                Ok(()) => table[r.slot as usize] = Some(h),
                Err(e) => first = first.or(Some(e)),
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Reads pages into the buffers, all in flight together, and checks each against the checksum its write
    /// recorded: a page that comes back different or short, or packed bytes that do not unpack to a page, is
    /// an error naming its slot, never wrong bytes taken for right ones.
    pub fn read(&self, pages: &mut [(u64, &mut [u8])]) -> Result<(), StorageError> {
        self.read_each(pages, |_| {})
    }

    /// [`StorageFile::read`], calling `arrived(k)` as soon as page `k` has arrived and passed its checks, while
    /// the ring reads the next ones: a caller can start moving it on (to a GPU) before the batch is done. A page
    /// that fails its checks is not announced, and the call returns its error.
    pub fn read_each(
        &self,
        pages: &mut [(u64, &mut [u8])],
        mut arrived: impl FnMut(usize),
    ) -> Result<(), StorageError> {
        let ps = self.page_size as usize;
        let mut requests = Vec::with_capacity(pages.len());
        let mut held = Vec::with_capacity(pages.len());
        {
            let table = self.lock_held();
            for (slot, buf) in pages.iter_mut() {
                let h = table.get(*slot as usize).copied().flatten().ok_or(StorageError::NeverWritten { slot: *slot });
                // A lossy page comes back packed: its buffer needs only its blocks (a slot of the packed tier).
                let least = match h {
                    Ok(Held { packed: Some((n, c)), .. }) if c.is_lossy() => blocks(n as usize),
                    _ => ps,
                };
                let r = self.request(*slot, buf.as_mut_ptr(), buf.len(), least)?;
                held.push(h?);
                requests.push(r);
            }
        }
        self.check_distinct(&requests)?;
        let mut io = self.take_io()?;
        let Io { ring, packers, staging: held_staging } = &mut *io;
        let staged = |h: &Held| h.packed.is_some_and(|(_, c)| !c.is_lossy());
        let mut staging = if held.iter().any(staged) { Some(staging(held_staging, pages.len(), ps)?) } else { None };
        for (k, (r, h)) in requests.iter_mut().zip(&held).enumerate() {
            match (h.packed, staging.as_deref_mut()) {
                // Lossy pages come back packed, as they were written, into the start of the caller's buffer.
                (Some((n, c)), _) if c.is_lossy() => r.len = blocks(n as usize) as u32,
                (Some((n, _)), Some(staging)) => {
                    r.ptr = staging[k * ps..].as_mut_ptr();
                    r.len = blocks(n as usize) as u32;
                }
                _ => {}
            }
        }
        // Each page is checked as it arrives, while the ring reads the next ones.
        let mut verdicts: Vec<Option<Result<(), StorageError>>> = (0..pages.len()).map(|_| None).collect();
        // Raw: the ring writes into the staging while pages already read are checked.
        let staging = Shared(staging.map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()));
        let slots: Vec<u64> = requests.iter().map(|r| r.slot).collect();
        let check = |packer: &mut Packer, k: usize, page: &mut [u8]| -> Result<(), StorageError> {
            let (slot, h) = (slots[k], held[k]);
            // A losslessly packed page, in the staging: its packed bytes are checked before they are expanded.
            let staged = match h.packed {
                // SAFETY: page k's place in the staging (there is one: the page is staged), which its request
                // (completed) read into.
                Some((n, c)) if !c.is_lossy() => {
                    Some((unsafe { std::slice::from_raw_parts(staging.get().add(k * ps), n as usize) }, c))
                }
                _ => None,
            };
            let found = match (staged, h.packed) {
                (Some((packed, _)), _) => xxh3_64(packed),
                (None, Some((n, _))) => xxh3_64(&page[..n as usize]),
                (None, None) => xxh3_64(page),
            };
            if found != h.sum {
                return Err(StorageError::Corrupt { slot, expected: h.sum, found });
            }
            match staged {
                Some((packed, codec)) if !packer.unpack(codec, packed, page) => Err(StorageError::Undecodable { slot }),
                _ => Ok(()),
            }
        };
        let bufs: Vec<(Shared, usize)> = pages.iter_mut().map(|(_, b)| (Shared(b.as_mut_ptr()), b.len())).collect();
        // SAFETY: the buffers are borrowed mutably until this returns, and the staging is held by the lock.
        let page = |k: usize| unsafe { std::slice::from_raw_parts_mut(bufs[k].0.get(), bufs[k].1) };
        let fd = self.file.as_raw_fd();
        let mut take = |k: usize, verdict: Result<(), StorageError>| {
            if verdict.is_ok() {
                arrived(k);
            }
            verdicts[k] = Some(verdict);
        };
        // Expanding is the slow part of reading packed pages: with more than a couple, the pages that arrive go
        // to threads that check and expand them, while this one keeps the ring going and announces the pages
        // they are done with.
        let packers = Io::packers(packers, threads(held.iter().filter(|h| staged(h)).count()));
        // SAFETY (both): the check of page k writes only page k's buffer, which no request in flight uses: its
        // own request read into it (and has completed) or into the staging. Every check ends before this returns.
        let results = match packers {
            [packer] => unsafe { ring.run(fd, Op::Read, &requests, |k| take(k, check(packer, k, page(k)))) },
            packers => {
                let (to_check, checks) = mpsc::channel::<usize>();
                let (to_take, checked) = mpsc::channel();
                let checks = Mutex::new(checks);
                std::thread::scope(|s| {
                    for packer in packers {
                        let (checks, to_take, check, page) = (&checks, to_take.clone(), &check, &page);
                        s.spawn(move || loop {
                            // The lock is held only while waiting for the next page.
                            let Ok(k) = checks.lock().unwrap_or_else(|p| p.into_inner()).recv() else { return };
                            if to_take.send((k, check(packer, k, page(k)))).is_err() {
                                return;
                            }
                        });
                    }
                    drop(to_take);
                    let results = unsafe {
                        ring.run(fd, Op::Read, &requests, |k| {
                            // The threads outlive the ring's run: a page sent is always checked.
                            let _ = to_check.send(k);
                            while let Ok((k, verdict)) = checked.try_recv() {
                                take(k, verdict);
                            }
                        })
                    };
                    // No more pages: the threads finish those they have and end, which ends this loop.
                    drop(to_check);
                    for (k, verdict) in checked {
                        take(k, verdict);
                    }
                    results
                })
            }
        }?;
        for ((res, verdict), r) in results.into_iter().zip(verdicts).zip(&requests) {
            res?;
            // A request that completed in full was checked.
            verdict.unwrap_or(Err(StorageError::Short { slot: r.slot, op: "read", got: 0, want: u64::from(r.len) }))?;
        }
        Ok(())
    }

    /// Bytes the tier's pages take in its file (packed pages in whole blocks), and pages it holds.
    pub fn stored(&self) -> (u64, u64) {
        self.stored_in(0..self.slots)
    }

    /// Bytes the pages of `slots` take in the file, and how many of them hold a page: what a caller that knows
    /// which slots are still in use (a slot's page is not forgotten when its copy is dropped) counts.
    pub fn stored_in(&self, slots: impl IntoIterator<Item = u64>) -> (u64, u64) {
        let table = self.lock_held();
        let ps = self.page_size;
        slots.into_iter().filter_map(|s| table.get(s as usize).copied().flatten()).fold((0, 0), |(bytes, pages), h| {
            (bytes + h.packed.map_or(ps, |(n, _)| blocks(n as usize) as u64), pages + 1)
        })
    }

    /// Forgets a slot's page (its space is free for another).
    pub fn forget(&self, slot: u64) -> Result<(), StorageError> {
        if slot >= self.slots {
            return Err(StorageError::NoSuchSlot { slot, slots: self.slots });
        }
        self.lock_held()[slot as usize] = None;
        Ok(())
    }

    /// A request for `slot` with the buffer at `ptr` of `len` bytes: a page, or at least `least` bytes when
    /// fewer than a page are read or written (a lossy page's packed blocks).
    fn request(&self, slot: u64, ptr: *mut u8, len: usize, least: usize) -> Result<Request, StorageError> {
        if slot >= self.slots {
            return Err(StorageError::NoSuchSlot { slot, slots: self.slots });
        }
        let fits = len as u64 == self.page_size || (len >= least && (least as u64) < self.page_size);
        if !fits || (ptr as usize) % DIRECT_ALIGN != 0 {
            return Err(StorageError::BadBuffer {
                slot,
                addr: ptr as usize,
                len,
                page: self.page_size,
                align: DIRECT_ALIGN,
            });
        }
        Ok(Request { slot, offset: self.slot_offset(slot), ptr, len: len as u32 })
    }

    fn check_distinct(&self, requests: &[Request]) -> Result<(), StorageError> {
        let mut seen = std::collections::HashSet::with_capacity(requests.len());
        match requests.iter().find(|r| !seen.insert(r.slot)) {
            Some(r) => Err(StorageError::DuplicateSlot { slot: r.slot }),
            None => Ok(()),
        }
    }

    fn take_io(&self) -> Result<Taken<'_, Io>, StorageError> {
        self.io.take(|| Io::new(self.depth))
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Vec<Option<Held>>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Memory the threads checking a batch's pages share, each writing only its own pages' (see
/// [`StorageFile::read_each`]).
#[derive(Clone, Copy)]
struct Shared(*mut u8);

// SAFETY: a page's memory is written by the one thread checking that page, after its read completed.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// The pointer (a method, so that closures capture the `Shared`, not the bare pointer).
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// Puts `packed` at the start of `place` (a slot's staging), zero to its last block, and points `r` at it.
fn stage_packed(place: &mut [u8], packed: &[u8], r: &mut Request) {
    stage(place, packed);
    r.ptr = place.as_mut_ptr();
    r.len = blocks(packed.len()) as u32;
}

/// Puts `packed` at the start of `place`, zero to its last block.
fn stage(place: &mut [u8], packed: &[u8]) {
    let n = packed.len();
    place[..n].copy_from_slice(packed);
    place[n..blocks(n)].fill(0);
}

/// Packs each page of `pages` with a `compression` that is not lossy (see [`Packer::pack`]) into its
/// `page_size` place in `staging` (the k-th page into the k-th place) and sets its `held`: the packed bytes'
/// checksum and length, or the page's checksum when it is stored as it is. One thread per packer, the caller's
/// among them, each taking the next page as it finishes one (pages that do not shrink cost only their probe,
/// so fixed shares would leave threads idle).
fn pack_all(
    packers: &mut [Packer],
    compression: Compression,
    pages: &[(u64, &[u8])],
    page_size: usize,
    staging: &mut [u8],
    held: &mut [Held],
) {
    let work = Mutex::new(pages.iter().zip(staging.chunks_mut(page_size)).zip(held.iter_mut()));
    let run = |packer: &mut Packer| loop {
        // The lock is held only to take the next page.
        let next = work.lock().unwrap_or_else(|p| p.into_inner()).next();
        let Some(((&(_, page), place), h)) = next else { return };
        *h = match packer.pack(compression, page) {
            Some(packed) => {
                stage(place, packed);
                Held { sum: xxh3_64(packed), packed: Some((packed.len() as u32, compression)) }
            }
            None => Held { sum: xxh3_64(page), packed: None },
        };
    };
    match packers.split_first_mut() {
        Some((first, [])) => run(first),
        Some((first, rest)) => std::thread::scope(|s| {
            for packer in rest {
                s.spawn(|| run(packer));
            }
            run(first);
        }),
        None => {}
    }
}

impl Drop for StorageFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "removing the storage tier's file failed");
        }
    }
}

/// Refuses a file at `path` that is not a tier's; whether one is there (a tier's, of an earlier run or in use).
fn check_not_foreign(path: &Path) -> Result<bool, StorageError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(StorageError::File { path: path.to_owned(), what: "looking at it", source }),
    };
    let meta =
        f.metadata().map_err(|source| StorageError::File { path: path.to_owned(), what: "looking at it", source })?;
    if !meta.is_file() {
        return Err(StorageError::InvalidSpec(format!("{} is not a regular file", path.display())));
    }
    if meta.len() == 0 {
        return Ok(false);
    }
    let mut head = [0u8; 8];
    if f.read_exact(&mut head).is_err() || &head != MAGIC {
        return Err(StorageError::Foreign { path: path.to_owned() });
    }
    Ok(true)
}

/// Opens (creating) the file at `path` for O_DIRECT I/O, unchanged, and takes its exclusive lock without
/// waiting: [`StorageError::InUse`] when a live tier holds it. The lock is released with the descriptor, so a
/// tier whose process ended (crashed or not) leaves none.
fn open_locked(path: &Path) -> Result<Flock<File>, StorageError> {
    let file_err = |what: &'static str| move |source| StorageError::File { path: path.to_owned(), what, source };
    // A tier going away removes its path before its lock goes: a lock taken on a file no longer at the path
    // guards nothing, and the path is opened again. Bounded, in case paths keep being swapped under it.
    for _ in 0..8 {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
            .open(path)
            .map_err(file_err("opening with O_DIRECT"))?;
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(f) => f,
            Err((_, e)) if e == Errno::EWOULDBLOCK => return Err(StorageError::InUse { path: path.to_owned() }),
            Err((_, e)) => return Err(file_err("locking it")(e.into())),
        };
        let ours = file.metadata().map_err(file_err("looking at it"))?;
        match std::fs::metadata(path) {
            Ok(there) if (there.dev(), there.ino()) == (ours.dev(), ours.ino()) => return Ok(file),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(file_err("looking at it")(e)),
        }
    }
    Err(StorageError::InUse { path: path.to_owned() })
}
