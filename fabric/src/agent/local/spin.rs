//! Waiting for the other side of the local socket: a short spin before the blocking read.
//!
//! [`read_frame_blocking`]: crate::proto::codec::read_frame_blocking
//!
//! A local call is a few microseconds of work between two reads; what dominates its latency is waking the
//! thread that sleeps in `read` (a few microseconds each way on a quiet host, tens on a busy virtual machine).
//! Polling the socket for a short while first lets back-to-back calls (an acquire, then its release) skip those
//! wake-ups, at the price of that while's CPU. Only on hosts with cores to spare: on two cores the spinning side
//! would take the core the other side needs to answer.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};

use crate::proto::codec::{read_frame_body, read_header_blocking, CodecError, FRAME_HEADER_LEN};
use crate::proto::message::Message;

/// How long to poll before blocking: `VFABRIC_LOCAL_SPIN_US` microseconds, else 50 on hosts of more than four
/// cores and none on smaller ones.
pub(super) fn budget() -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default = if cores > 4 { 50 } else { 0 };
    let us = std::env::var("VFABRIC_LOCAL_SPIN_US").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    Duration::from_micros(us)
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
