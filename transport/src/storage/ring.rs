//! Page reads and writes through io_uring: a batch keeps up to a ring's depth of requests in flight, a new one
//! going in as each completes, and every completion is collected before the batch returns, failed or not, so
//! the ring never holds a stale one.

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

    /// Runs every request, keeping up to `depth` in flight: each completion makes room for the next request, so
    /// the device never waits for the slowest of a group. Returns per request `Ok(())` or its error (a failed
    /// request does not stop the others: their pages may still be good), or the ring's own failure (after
    /// every request it queued has completed, so no buffer is touched once this returns).
    ///
    /// `done(i)` runs for each request `i` that completed in full, once the requests that can take its place
    /// are on their way: work on a finished page (checking its checksum) overlaps the device's work on the
    /// next ones instead of waiting for the whole batch.
    ///
    /// # Safety
    /// Every request's buffer must stay valid, and for reads writable, until this returns; `done(i)` may read
    /// request `i`'s buffer, not write another's.
    pub(super) unsafe fn run(
        &mut self,
        fd: RawFd,
        op: Op,
        requests: &[Request],
        mut done: impl FnMut(usize),
    ) -> Result<Vec<Result<(), StorageError>>, StorageError> {
        let mut outcome: Vec<Option<i32>> = vec![None; requests.len()];
        let (mut queued, mut completed, mut in_flight) = (0usize, 0usize, 0usize);
        let mut failure = None;
        let mut finished = Vec::with_capacity(self.depth);
        while completed < requests.len() {
            // SAFETY: as this function's (the caller keeps the buffers valid until it returns).
            let pushed = unsafe { self.queue(fd, op, requests, &mut queued, in_flight, &mut failure) };
            in_flight += pushed;
            if failure.is_some() && in_flight == 0 {
                break;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if retry(&e) => continue,
                Err(source) => {
                    if in_flight == 0 {
                        return Err(failure.unwrap_or(StorageError::Ring { what: "submitting requests", source }));
                    }
                    // Nothing more is queued, but the requests the kernel holds still read or write their
                    // buffers: they are waited for, however long that takes, before this returns.
                    failure.get_or_insert(StorageError::Ring { what: "submitting requests", source });
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                if let Some(slot) = outcome.get_mut(i) {
                    if slot.replace(cqe.result()).is_none() {
                        completed += 1;
                        in_flight -= 1;
                        if cqe.result() >= 0 && cqe.result() as u32 == requests[i].len {
                            finished.push(i);
                        }
                    }
                }
            }
            if !finished.is_empty() {
                // Refill the ring before the work on the finished pages, so the device has it meanwhile.
                // SAFETY: as above.
                let pushed = unsafe { self.queue(fd, op, requests, &mut queued, in_flight, &mut failure) };
                in_flight += pushed;
                if pushed > 0 {
                    if let Err(e) = self.ring.submit() {
                        if !retry(&e) {
                            failure.get_or_insert(StorageError::Ring { what: "submitting requests", source: e });
                        }
                    }
                }
                for i in finished.drain(..) {
                    done(i);
                }
            }
            if failure.is_some() && in_flight == 0 {
                break;
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(requests
            .iter()
            .zip(outcome)
            .map(|(r, res)| {
                let res = res.unwrap_or(-libc_eio());
                if res < 0 {
                    Err(StorageError::Io {
                        slot: r.slot,
                        op: op.name(),
                        source: std::io::Error::from_raw_os_error(-res),
                    })
                } else if res as u32 != r.len {
                    Err(StorageError::Short { slot: r.slot, op: op.name(), got: res as usize, want: u64::from(r.len) })
                } else {
                    Ok(())
                }
            })
            .collect())
    }

    /// Puts requests from `queued` on the submission queue while fewer than `depth` are in flight (and nothing
    /// failed); returns how many went in.
    ///
    /// # Safety
    /// As [`Ring::run`]'s: the buffers stay valid until every queued request has completed.
    unsafe fn queue(
        &mut self,
        fd: RawFd,
        op: Op,
        requests: &[Request],
        queued: &mut usize,
        in_flight: usize,
        failure: &mut Option<StorageError>,
    ) -> usize {
        let mut pushed = 0;
        while failure.is_none() && *queued < requests.len() && in_flight + pushed < self.depth {
            let r = &requests[*queued];
            let entry = match op {
                Op::Read => opcode::Read::new(types::Fd(fd), r.ptr, r.len).offset(r.offset).build(),
                Op::Write => opcode::Write::new(types::Fd(fd), r.ptr as *const u8, r.len).offset(r.offset).build(),
            }
            .user_data(*queued as u64);
            // SAFETY: the caller keeps the buffers valid until every queued request has completed; at most
            // `depth` are queued or in flight, the ring's size.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                *failure = Some(StorageError::Ring {
                    what: "queueing a request",
                    source: std::io::Error::other("submission queue full"),
                });
                break;
            }
            *queued += 1;
            pushed += 1;
        }
        pushed
    }
}

/// Whether a failed `io_uring_enter` is worth trying again at once: interrupted, or the kernel short of room
/// for completions for now.
fn retry(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Interrupted
        || matches!(e.raw_os_error(), Some(code) if code == nix::errno::Errno::EAGAIN as i32 || code == nix::errno::Errno::EBUSY as i32)
}

/// EIO, for a completion that never came (not expected: the loop waits for every one).
fn libc_eio() -> i32 {
    nix::errno::Errno::EIO as i32
}
