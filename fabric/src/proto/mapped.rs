//! What a local client needs to map the node's memory: the arenas' descriptions
//! ([`WireArena`](super::message::WireArena)) as the device layer takes them, and the passing of the arenas' file
//! descriptors over the Unix socket.
//!
//! After the [`Attached`](super::Message::Attached) frame, the agent sends the descriptors of every arena's
//! pieces, in order, in `SCM_RIGHTS` messages of at most [`FDS_PER_MESSAGE`] each, every message carrying one
//! data byte (`SCM_RIGHTS` needs at least one). The client takes them with `recvmsg`, never with a plain read,
//! which would drop the descriptors.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use vfabric_transport::{ArenaShare, ShareKind};

use super::message::{WireArena, WireShareKind};

/// Descriptors per `SCM_RIGHTS` message (the kernel takes at most 253).
pub const FDS_PER_MESSAGE: usize = 128;

impl From<&ArenaShare> for WireArena {
    fn from(s: &ArenaShare) -> Self {
        WireArena {
            location: s.location.into(),
            len: s.len,
            kind: match s.kind {
                ShareKind::GpuChunks => WireShareKind::GpuChunks,
                ShareKind::HostFile => WireShareKind::HostFile,
            },
            pieces: s.pieces.clone(),
        }
    }
}

impl From<&WireArena> for ArenaShare {
    fn from(w: &WireArena) -> Self {
        ArenaShare {
            location: w.location.into(),
            len: w.len,
            kind: match w.kind {
                WireShareKind::GpuChunks => ShareKind::GpuChunks,
                WireShareKind::HostFile => ShareKind::HostFile,
            },
            pieces: w.pieces.clone(),
        }
    }
}

/// Sends `fds` on the socket `sock` as one `SCM_RIGHTS` message (at most [`FDS_PER_MESSAGE`]) with one byte.
/// A non-blocking socket may answer `WouldBlock`, before anything was sent.
pub fn send_fds(sock: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let byte = [0u8];
    let sent = sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(&byte)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if sent != 1 {
        return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "sent no byte with the descriptors"));
    }
    Ok(())
}

/// Receives one `SCM_RIGHTS` message of at most `max` descriptors from the blocking socket `sock`. Errors when
/// the stream ended or the message held no descriptors; descriptors beyond `max` are closed by the kernel
/// (the message is then reported truncated, also an error).
pub fn recv_fds(sock: BorrowedFd<'_>, max: usize) -> std::io::Result<Vec<OwnedFd>> {
    let mut byte = [0u8];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = vec![0u8; nix::sys::socket::cmsg_space::<RawFd>() * max.max(1)];
    let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(got) = c {
            // SAFETY: the kernel installed these descriptors in this process for this message; nothing else owns
            // them.
            fds.extend(got.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let bad = |why: &str| Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string()));
    if msg.bytes == 0 {
        return bad("the agent closed the socket before sending the arenas' descriptors");
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return bad("more descriptors came than announced");
    }
    if fds.is_empty() {
        return bad("a message without the descriptors it should carry");
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_cross_a_socket_pair_and_still_name_their_files() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut files: Vec<std::fs::File> = (0..3).map(|_| tempfile_in_tmp()).collect();
        for (i, f) in files.iter_mut().enumerate() {
            f.write_all(format!("file {i}").as_bytes()).unwrap();
        }
        let fds: Vec<BorrowedFd> = files.iter().map(AsFd::as_fd).collect();
        send_fds(a.as_fd(), &fds).unwrap();
        let got = recv_fds(b.as_fd(), 3).unwrap();
        assert_eq!(got.len(), 3);
        for (i, fd) in got.into_iter().enumerate() {
            let mut f = std::fs::File::from(fd);
            f.rewind().unwrap();
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            assert_eq!(s, format!("file {i}"));
        }
        // More than announced: an error, not descriptors leaked into the process unnoticed.
        send_fds(a.as_fd(), &fds).unwrap();
        assert!(recv_fds(b.as_fd(), 1).is_err());
        // A plain byte without descriptors: an error.
        (&a).write_all(&[0]).unwrap();
        assert!(recv_fds(b.as_fd(), 3).is_err());
        drop(a);
        assert!(recv_fds(b.as_fd(), 3).is_err(), "end of stream");
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("vfabric-fd-test-{}-{}", std::process::id(), rand_suffix()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }
}
