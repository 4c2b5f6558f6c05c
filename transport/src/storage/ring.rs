//! Page reads and writes through io_uring: a batch goes in as up to a ring's depth of requests at once, and
//! every completion is collected before the batch returns, failed or not, so the ring never holds a stale one.

use std::os::fd::RawFd;

use io_uring::{opcode, types, IoUring};

use super::error::StorageError;

/// One page's request: its slot (for errors), the file offset, and the buffer.
pub(super) struct Request {
    pub(super) slot: u64,
    pub(super) offset: u64,
    pub(super) ptr: *mut u8,
    pub(super) len: u32,
}

/// Reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Read,
    Write,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// An io_uring of a fixed depth over one file.
pub(super) struct Ring {
    ring: IoUring,
    depth: usize,
}

impl Ring {
    pub(super) fn new(depth: u32) -> Result<Ring, StorageError> {
        let ring = IoUring::new(depth).map_err(|source| StorageError::Ring { what: "setting up the ring", source })?;
        Ok(Ring { ring, depth: depth as usize })
    }

    /// Runs every request, `depth` in flight at a time. Returns per request `Ok(())` or its error (a failed
    /// request does not stop the others: their pages may still be good), or the ring's own failure.
    ///
    /// # Safety
    /// Every request's buffer must stay valid, and for reads writable, until this returns.
    pub(super) unsafe fn run(
        &mut self,
        fd: RawFd,
        op: Op,
        requests: &[Request],
    ) -> Result<Vec<Result<(), StorageError>>, StorageError> {
        let mut results: Vec<Result<(), StorageError>> = Vec::with_capacity(requests.len());
        for (base, chunk) in requests.chunks(self.depth).enumerate().map(|(i, c)| (i * self.depth, c)) {
            for (i, r) in chunk.iter().enumerate() {
                let entry = match op {
                    Op::Read => opcode::Read::new(types::Fd(fd), r.ptr, r.len).offset(r.offset).build(),
                    Op::Write => opcode::Write::new(types::Fd(fd), r.ptr as *const u8, r.len).offset(r.offset).build(),
                }
                .user_data((base + i) as u64);
                // SAFETY: the caller keeps the buffers valid until this returns; the chunk fits the ring (it is
                // at most the ring's depth and the ring is empty between chunks).
                unsafe { self.ring.submission().push(&entry) }.map_err(|_| StorageError::Ring {
                    what: "queueing a request",
                    source: std::io::Error::other("submission queue full"),
                })?;
            }
            let mut outcome: Vec<Option<i32>> = vec![None; chunk.len()];
            let mut done = 0;
            while done < chunk.len() {
                match self.ring.submit_and_wait(chunk.len() - done) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(source) => return Err(StorageError::Ring { what: "submitting requests", source }),
                }
                for cqe in self.ring.completion() {
                    let i = cqe.user_data() as usize - base;
                    if let Some(slot) = outcome.get_mut(i) {
                        if slot.replace(cqe.result()).is_none() {
                            done += 1;
                        }
                    }
                }
            }
            for (r, res) in chunk.iter().zip(outcome) {
                let res = res.unwrap_or(-libc_eio());
                results.push(if res < 0 {
                    Err(StorageError::Io {
                        slot: r.slot,
                        op: op.name(),
                        source: std::io::Error::from_raw_os_error(-res),
                    })
                } else if res as u32 != r.len {
                    Err(StorageError::Short { slot: r.slot, op: op.name(), got: res as usize, want: u64::from(r.len) })
                } else {
                    Ok(())
                });
            }
        }
        Ok(results)
    }
}

/// EIO, for a completion that never came (not expected: the loop waits for every one).
fn libc_eio() -> i32 {
    nix::errno::Errno::EIO as i32
}
