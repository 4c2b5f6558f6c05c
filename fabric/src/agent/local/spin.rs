//! Waiting for the other side of the local socket: a short spin before the blocking read.
//!
//! A local call is a few microseconds of work between two reads; what dominates its latency is waking the
//! thread that sleeps in `read` (a few microseconds each way on a quiet host, tens on a busy virtual machine).
//! Polling the socket for a short while first lets back-to-back calls (an acquire, then its release) skip those
//! wake-ups, at the price of that while's CPU. Only on hosts with cores to spare: on two cores the spinning side
//! would take the core the other side needs to answer.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::sys::socket::{recv, MsgFlags};

/// How long to poll before blocking: `VFABRIC_LOCAL_SPIN_US` microseconds, else 50 on hosts of more than four
/// cores and none on smaller ones.
pub(super) fn budget() -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default = if cores > 4 { 50 } else { 0 };
    let us = std::env::var("VFABRIC_LOCAL_SPIN_US").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    Duration::from_micros(us)
}

/// Polls `sock` until a byte is there to read (or the stream ended, or failed) or `budget` passes; the read
/// that follows then finds its bytes at once, or blocks as it would have.
pub(super) fn until_readable(sock: BorrowedFd<'_>, budget: Duration) {
    if budget.is_zero() {
        return;
    }
    let start = Instant::now();
    let mut byte = [0u8; 1];
    loop {
        match recv(sock.as_raw_fd(), &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Err(nix::errno::Errno::EAGAIN) => {}
            // Data, the end of the stream, or an error: the read says which.
            _ => return,
        }
        if start.elapsed() >= budget {
            return;
        }
        std::hint::spin_loop();
    }
}
