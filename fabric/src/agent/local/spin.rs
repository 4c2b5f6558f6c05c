//! Waiting for the other side of the local socket: a spin before the blocking read.
//!
//! [`read_frame_blocking`]: crate::proto::codec::read_frame_blocking
//!
//! A local call is a few microseconds of work between two reads; what dominates its latency is waking the
//! thread that sleeps in `read` (a few microseconds each way on a quiet host, tens on a busy virtual machine).
//! Polling the socket for a while first lets the next call skip that wake-up, at the price of that while's CPU.
//! The agent's thread polls for as long as its client's last pause between calls, and a half more (an acquire,
//! a copy through the lease, its release: the window follows the copy), within [`MIN_WINDOW`] and the maximum;
//! a client polls for its answer up to the maximum. Only on hosts with cores to spare: on two cores the
//! spinning side would take the core the other side needs to answer.

/// The least the agent's thread polls after an answer.
pub(super) const MIN_WINDOW: Duration = Duration::from_micros(50);

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};

use crate::proto::codec::{read_frame_body, read_header_blocking, CodecError, FRAME_HEADER_LEN};
use crate::proto::message::Message;

/// The longest a side polls before blocking: `VFABRIC_LOCAL_SPIN_US` microseconds, else 1000 on hosts of more
/// than four cores and none on smaller ones.
pub(super) fn budget() -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default = if cores > 4 { 1000 } else { 0 };
    let us = std::env::var("VFABRIC_LOCAL_SPIN_US").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    Duration::from_micros(us)
}

/// How long the agent's thread polls for its client's next call: its last pause and a half more, within
/// [`MIN_WINDOW`] and `max`; a pause longer than `max` (a client that calls now and then) gets the least.
pub(super) fn window(last_pause: Duration, max: Duration) -> Duration {
    match last_pause <= max {
        true => (last_pause + last_pause / 2).clamp(MIN_WINDOW.min(max), max),
        false => MIN_WINDOW.min(max),
    }
}

/// Reads one frame from `sock`, exactly (as [`read_frame_blocking`]), polling for its header for up to
/// `budget` before blocking: the polling reads take the header itself, so a frame that arrives within the
/// budget costs no more calls into the kernel than a blocking read would.
pub(super) fn read_frame(sock: &mut UnixStream, max: usize, budget: Duration) -> Result<Option<Message>, CodecError> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    let mut got = 0;
    if !budget.is_zero() {
        let start = Instant::now();
        while got < FRAME_HEADER_LEN {
            match recv(sock.as_raw_fd(), &mut head[got..], MsgFlags::MSG_DONTWAIT) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(CodecError::Truncated { have: got, need: FRAME_HEADER_LEN }),
                Ok(n) => got += n,
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {
                    if start.elapsed() >= budget {
                        break;
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(CodecError::Io(e.into())),
            }
        }
    }
    match read_header_blocking(sock, &mut head, got)? {
        true => read_frame_body(sock, &head, max).map(Some),
        false => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_the_clients_pauses_within_its_bounds() {
        let us = Duration::from_micros;
        let max = us(1000);
        assert_eq!(window(us(10), max), MIN_WINDOW, "short pauses: the least");
        assert_eq!(window(us(500), max), us(750), "a copy between calls: its length and a half");
        assert_eq!(window(us(900), max), max, "capped");
        assert_eq!(window(us(5000), max), MIN_WINDOW, "a client that calls now and then");
        assert_eq!(window(us(500), Duration::ZERO), Duration::ZERO, "no polling on small hosts");
    }
}
