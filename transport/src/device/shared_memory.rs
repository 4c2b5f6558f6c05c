//! Host memory that the node's processes share: an anonymous memory file (`memfd`) mapped `MAP_SHARED`.
//!
//! Arenas in host memory (the emulated device's, and the CUDA host tier, which registers it with the driver)
//! live in such a file so that the agent can hand its descriptor to a local client over the Unix socket: the
//! client maps the same pages and sees every byte the agent's movers write, with no copy. A new file reads as
//! zeros and takes memory only as its pages are touched, as `alloc_zeroed` would.

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{madvise, mmap, munmap, MapFlags, MmapAdvise, ProtFlags};

use super::error::DeviceError;

/// A mapping of a shared memory file, unmapped on drop (the memory lives while any process maps it or holds
/// its descriptor).
#[derive(Debug)]
pub struct SharedHostMemory {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain memory owned by this value; concurrent access to the same bytes is the arenas'
// callers' to avoid, as for any arena.
unsafe impl Send for SharedHostMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedHostMemory {}

fn os(call: &'static str) -> impl FnOnce(nix::errno::Errno) -> DeviceError {
    move |e| DeviceError::Os { call, source: std::io::Error::from(e) }
}

impl SharedHostMemory {
    /// Creates a file of `len` bytes named `name` (shown in `/proc/PID/maps` as `/memfd:NAME`) and maps it.
    pub fn create(name: &str, len: u64) -> Result<Self, DeviceError> {
        let size =
            usize::try_from(len).ok().and_then(NonZeroUsize::new).ok_or(DeviceError::HostAllocFailed { bytes: len })?;
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC).map_err(os("memfd_create"))?;
        let off = i64::try_from(len).map_err(|_| DeviceError::HostAllocFailed { bytes: len })?;
        nix::unistd::ftruncate(&fd, off).map_err(|e| match e {
            nix::errno::Errno::ENOMEM | nix::errno::Errno::ENOSPC | nix::errno::Errno::EFBIG => {
                DeviceError::HostAllocFailed { bytes: len }
            }
            e => os("ftruncate")(e),
        })?;
        Self::map_fd(fd, size)
    }

    /// Maps `len` bytes of a file another process created with [`SharedHostMemory::create`] (its descriptor
    /// received over a Unix socket). The file must be at least that long.
    pub fn map(fd: OwnedFd, len: u64) -> Result<Self, DeviceError> {
        let size = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("a shared mapping of {len} bytes")))?;
        let stat = nix::sys::stat::fstat(&fd).map_err(os("fstat"))?;
        if u64::try_from(stat.st_size).unwrap_or(0) < len {
            return Err(DeviceError::InvalidArgument(format!(
                "the shared memory file holds {} bytes, not the {len} announced",
                stat.st_size
            )));
        }
        Self::map_fd(fd, size)
    }

    fn map_fd(fd: OwnedFd, size: NonZeroUsize) -> Result<Self, DeviceError> {
        // SAFETY: a fresh mapping chosen by the kernel over a file at least `size` long; nothing else aliases it
        // in this process.
        let p = unsafe {
            mmap(None, size, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, fd.as_fd(), 0)
        }
        .map_err(|e| match e {
            nix::errno::Errno::ENOMEM => DeviceError::HostAllocFailed { bytes: size.get() as u64 },
            e => os("mmap")(e),
        })?;
        Ok(SharedHostMemory { ptr: p.cast(), len: size.get(), fd })
    }

    /// Faults every page of the mapping in, writable, from up to `threads` threads at once (a piece each), as
    /// `madvise(MADV_POPULATE_WRITE)` does. Registering memory with the driver faults in what is not yet there,
    /// but on one thread: a 72 GiB host tier took a minute that way, most of it the kernel zeroing and mapping
    /// 4 KiB pages one after the other. Kernels before Linux 5.14 lack the advice: then nothing is done here
    /// and the pages come in as before.
    pub fn populate(&self, threads: usize) -> Result<(), DeviceError> {
        const PIECE_ALIGN: usize = 2 << 20;
        let threads = threads.clamp(1, 64);
        let piece = self.len.div_ceil(threads).div_ceil(PIECE_ALIGN) * PIECE_ALIGN;
        let base = self.ptr.as_ptr() as usize;
        let results: Vec<Result<(), nix::errno::Errno>> = std::thread::scope(|s| {
            let pieces: Vec<_> = (0..self.len)
                .step_by(piece)
                .map(|at| {
                    let n = piece.min(self.len - at);
                    s.spawn(move || {
                        let p = NonNull::new((base + at) as *mut std::ffi::c_void).ok_or(nix::errno::Errno::EINVAL)?;
                        // SAFETY: `p..p+n` lies inside this value's mapping, which outlives the scope; populating
                        // changes no byte.
                        unsafe { madvise(p, n, MmapAdvise::MADV_POPULATE_WRITE) }
                    })
                })
                .collect();
            pieces.into_iter().map(|h| h.join().unwrap_or(Err(nix::errno::Errno::EINTR))).collect()
        });
        match results.into_iter().find(|r| r.is_err()) {
            None => Ok(()),
            // An older kernel: registration faults the pages in itself.
            Some(Err(nix::errno::Errno::EINVAL)) => Ok(()),
            Some(Err(nix::errno::Errno::ENOMEM)) => Err(DeviceError::HostAllocFailed { bytes: self.len as u64 }),
            Some(Err(e)) => Err(os("madvise(MADV_POPULATE_WRITE)")(e)),
            Some(Ok(())) => Ok(()),
        }
    }

    /// A new descriptor of the file, to send to another process.
    pub fn share(&self) -> Result<OwnedFd, DeviceError> {
        self.fd.try_clone().map_err(|source| DeviceError::Os { call: "dup", source })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether it is empty (never: mappings are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SharedHostMemory {
    fn drop(&mut self) {
        // SAFETY: mapped in `map_fd` with this length, unmapped once.
        if let Err(e) = unsafe { munmap(self.ptr.cast(), self.len) } {
            tracing::warn!(error = %e, "unmapping shared host memory failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_of_one_file_see_each_others_writes() {
        let a = SharedHostMemory::create("vfabric-test", 1 << 20).unwrap();
        let b = SharedHostMemory::map(a.share().unwrap(), 1 << 20).unwrap();
        assert_ne!(a.as_ptr(), b.as_ptr());
        // SAFETY: both mappings are 1 MiB long and this test is their only user.
        unsafe {
            assert_eq!(*b.as_ptr().add(12345), 0, "a new file reads as zeros");
            *a.as_ptr().add(12345) = 0x5a;
            assert_eq!(*b.as_ptr().add(12345), 0x5a);
        }
        // A mapping longer than the file is refused, not a SIGBUS later.
        let r = SharedHostMemory::map(a.share().unwrap(), 2 << 20);
        assert!(matches!(r, Err(DeviceError::InvalidArgument(_))), "{r:?}");
    }

    fn allocated(m: &SharedHostMemory) -> u64 {
        nix::sys::stat::fstat(&m.fd).unwrap().st_blocks as u64 * 512
    }

    #[test]
    fn populate_allocates_every_page_and_keeps_the_bytes() {
        // 9 MiB + 4 KiB: pieces of 2 MiB multiples, the last one short.
        let len = (9 << 20) + 4096;
        let m = SharedHostMemory::create("vfabric-test", len).unwrap();
        assert_eq!(allocated(&m), 0, "a new file takes no memory");
        // SAFETY: in bounds; this test is the mapping's only user.
        unsafe { *m.as_ptr().add(5 << 20) = 0x77 };
        m.populate(4).unwrap();
        // On kernels without MADV_POPULATE_WRITE (before 5.14) populate does nothing, by design.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u32>().ok());
        let supported = (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (5, 14);
        if supported {
            assert_eq!(allocated(&m), len, "every page is in memory");
        }
        // SAFETY: as above.
        unsafe {
            assert_eq!(*m.as_ptr().add(5 << 20), 0x77);
            assert_eq!(*m.as_ptr().add(len as usize - 1), 0);
        }
    }
}
