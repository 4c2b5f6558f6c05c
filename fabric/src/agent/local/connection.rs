//! A local client's socket to its agent, blocking: one request and its answer at a time.

use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::spin;

use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::proto::codec::{read_frame_blocking, write_frame_blocking, DEFAULT_MAX_FRAME};
use crate::proto::message::Message;

/// The socket, shared by a client and its leases (a lease releases itself through it when dropped).
pub(super) struct Connection {
    stream: Mutex<UnixStream>,
    node: u16,
    /// How long to poll for an answer before blocking ([`spin`](super::spin)).
    spin: Duration,
}

impl Connection {
    pub(super) fn new(stream: UnixStream, node: u16) -> Self {
        Connection { stream: Mutex::new(stream), node, spin: spin::budget() }
    }

    /// The socket, for a call that sends or takes a payload after its frame.
    pub(super) fn lock(&self) -> MutexGuard<'_, UnixStream> {
        // A call that panicked mid-way left the stream out of step; the next call fails on it, which is the
        // right outcome, so the poison itself is not an error.
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One request and its answer.
    pub(super) fn call(&self, msg: &Message) -> Result<Message, FabricError> {
        let mut s = self.lock();
        send(&mut s, msg)?;
        match spin::read_frame(&mut s, DEFAULT_MAX_FRAME, self.spin)? {
            Some(m) => settle(m, self.node),
            None => Err(NetworkError::AgentClosed.into()),
        }
    }

    /// One request whose answer is `Done`.
    pub(super) fn done(&self, msg: &Message) -> Result<(), FabricError> {
        match self.call(msg)? {
            Message::Done => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The error for an answer that does not answer the request.
    pub(super) fn unexpected(&self, m: &Message) -> FabricError {
        ProtocolError::Unexpected { node: self.node, answer: m.name() }.into()
    }
}

/// Writes one request frame.
pub(super) fn send(s: &mut UnixStream, msg: &Message) -> Result<(), FabricError> {
    Ok(write_frame_blocking(s, msg, DEFAULT_MAX_FRAME)?)
}

/// The answer to a request: an error the agent reported is the call's error.
pub(super) fn answer(s: &mut UnixStream, node: u16) -> Result<Message, FabricError> {
    match read_frame_blocking(s, DEFAULT_MAX_FRAME)? {
        Some(m) => settle(m, node),
        None => Err(NetworkError::AgentClosed.into()),
    }
}

/// An answer, with an error the agent reported as the call's error.
fn settle(m: Message, node: u16) -> Result<Message, FabricError> {
    match m {
        Message::Error { kind, message } => Err(FabricError::Remote { node, kind, message }),
        m => Ok(m),
    }
}

/// One request and its answer.
pub(super) fn exchange(s: &mut UnixStream, node: u16, msg: &Message) -> Result<Message, FabricError> {
    send(s, msg)?;
    answer(s, node)
}
