//! Frames: how one [`Message`] crosses a byte stream.
//!
//! A frame is a fixed 12-byte header followed by the bincode body (standard config: little-endian varints):
//!
//! ```text
//! offset  0: magic "VFAB"          4 bytes   tells a vfabric peer from anything else that connects
//! offset  4: protocol version      u16 BE    refused unless it is PROTOCOL_VERSION
//! offset  6: flags                 u16 BE    none defined yet: must be 0, so they can mean something later
//! offset  8: body length           u32 BE    checked against the reader's limit before the body is read
//! offset 12: body                  bincode   exactly one Message, no trailing bytes
//! ```
//!
//! The header is fixed-size and big-endian so a human with a packet capture can read it; the body is bincode
//! because it is compact and derives from the types. Every check on the header happens before any of the body
//! is buffered, so a peer cannot make us hold more than `max` bytes for a frame we are going to refuse.

use std::io;

use bincode::config::{Configuration, Limit};
use bincode::error::DecodeError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::message::Message;

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"VFAB";

/// The protocol version this build speaks; a frame carrying any other is refused. 11: a packed chunk of one
/// byte repeated is that byte alone. 10: `Alloc` and `Standby` carry the region's compression and priority. 9: a chunk may be packed (LZ4, the top bit of its length). 8: `Status` names
/// the node asked about, and peers answer it; `Standby` carries the region's tenant. 7: a caller abandons a
/// request (`Abandon`). 5: `Alloc` carries the region's replicas, and the standby messages follow. 2: `Hello`
/// carries the sender's lane layout (the latency lane moved every other lane one port up).
pub const PROTOCOL_VERSION: u16 = 13;

/// The frame header: magic (4) + version (u16 big-endian) + flags (u16 BE, must be 0) + body length (u32 BE).
pub const FRAME_HEADER_LEN: usize = 12;

/// The default limit on a frame's body, in bytes. Control messages are a few dozen bytes; the limit only has to
/// leave room for long error messages while bounding what a peer can make us buffer.
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;

/// Why a frame could not be encoded, read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The frame does not start with [`MAGIC`]: the peer is not speaking this protocol (or the stream is out of
    /// step, e.g. a payload was not fully consumed).
    #[error("not a vfabric frame: magic {found:02x?}")]
    BadMagic {
        /// The four bytes found where the magic should be.
        found: [u8; 4],
    },
    /// The frame carries a protocol version this build does not speak.
    #[error("protocol version {found} is not supported (this side speaks {supported})")]
    UnsupportedVersion {
        /// The version in the frame.
        found: u16,
        /// The version this side speaks ([`PROTOCOL_VERSION`]).
        supported: u16,
    },
    /// The frame sets flags; none are defined, so a peer setting them expects something we cannot do.
    #[error("frame flags {0:#06x} are set; none are defined")]
    BadFlags(u16),
    /// The body is longer than the limit (when reading: refused from the header alone; when encoding: the
    /// message is too big to send).
    #[error("frame body of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The body length.
        len: usize,
        /// The limit it exceeds.
        max: usize,
    },
    /// The body is not one well-formed [`Message`]: bincode could not decode it, or bytes were left after it.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// bincode could not encode the message.
    #[error("cannot encode message: {0}")]
    Encode(String),
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame: {have} of {need} bytes")]
    Truncated {
        /// The bytes of the frame received, header included.
        have: usize,
        /// The bytes needed: the header's length while the header is incomplete, else header plus body.
        need: usize,
    },
    /// Reading or writing the stream failed.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

impl CodecError {
    /// An equivalent error, for a decoder that keeps answering with the error that stopped it.
    /// (`io::Error` is not `Clone`, so neither is this; the I/O case keeps its kind and text.)
    fn duplicate(&self) -> CodecError {
        match self {
            CodecError::BadMagic { found } => CodecError::BadMagic { found: *found },
            CodecError::UnsupportedVersion { found, supported } => {
                CodecError::UnsupportedVersion { found: *found, supported: *supported }
            }
            CodecError::BadFlags(flags) => CodecError::BadFlags(*flags),
            CodecError::TooLarge { len, max } => CodecError::TooLarge { len: *len, max: *max },
            CodecError::Malformed(why) => CodecError::Malformed(why.clone()),
            CodecError::Encode(why) => CodecError::Encode(why.clone()),
            CodecError::Truncated { have, need } => CodecError::Truncated { have: *have, need: *need },
            CodecError::Io(e) => CodecError::Io(io::Error::new(e.kind(), e.to_string())),
        }
    }
}

/// The largest body a frame can describe: its length field is a u32, whatever limit the caller asks for.
fn effective_max(max: usize) -> usize {
    max.min(u32::MAX as usize)
}

fn header(body_len: u32) -> [u8; FRAME_HEADER_LEN] {
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    // h[6..8]: flags, none defined.
    h[8..12].copy_from_slice(&body_len.to_be_bytes());
    h
}

/// Checks a header and returns the body length it announces.
fn parse_header(h: &[u8; FRAME_HEADER_LEN], max: usize) -> Result<usize, CodecError> {
    let found = [h[0], h[1], h[2], h[3]];
    if found != MAGIC {
        return Err(CodecError::BadMagic { found });
    }
    let version = u16::from_be_bytes([h[4], h[5]]);
    if version != PROTOCOL_VERSION {
        return Err(CodecError::UnsupportedVersion { found: version, supported: PROTOCOL_VERSION });
    }
    let flags = u16::from_be_bytes([h[6], h[7]]);
    if flags != 0 {
        return Err(CodecError::BadFlags(flags));
    }
    let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let max = effective_max(max);
    if len > max {
        return Err(CodecError::TooLarge { len, max });
    }
    Ok(len)
}

fn decode_limited<const N: usize>(body: &[u8]) -> Result<(Message, usize), DecodeError> {
    let config: Configuration<_, _, Limit<N>> = bincode::config::standard().with_limit::<N>();
    bincode::decode_from_slice(body, config)
}

/// Decodes a whole body into exactly one message.
fn decode_body(body: &[u8]) -> Result<Message, CodecError> {
    // bincode allocates a string's buffer from its length prefix *before* reading its bytes, so a 20-byte body
    // claiming a 2^60-byte string would abort the process. Its decode limit is checked first; the limit is a const
    // generic, so pick the smallest of a few steps that still covers the body: a valid message never reads more
    // than its body, and a lying prefix can make us allocate at most 16 times the body (and never over 4 GiB).
    let n = body.len();
    let decoded = if n <= 1 << 12 {
        decode_limited::<{ 1 << 12 }>(body)
    } else if n <= 1 << 16 {
        decode_limited::<{ 1 << 16 }>(body)
    } else if n <= 1 << 20 {
        decode_limited::<{ 1 << 20 }>(body)
    } else if n <= 1 << 24 {
        decode_limited::<{ 1 << 24 }>(body)
    } else if n <= 1 << 28 {
        decode_limited::<{ 1 << 28 }>(body)
    } else {
        decode_limited::<{ u32::MAX as usize }>(body)
    };
    let (msg, used) = decoded.map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != body.len() {
        // Trailing bytes mean the sender and we disagree on the message's layout; guessing which part is right
        // would be worse than refusing.
        return Err(CodecError::Malformed(format!(
            "{} trailing bytes after a {} message of {used} bytes",
            body.len() - used,
            msg.name()
        )));
    }
    Ok(msg)
}

/// Appends one frame holding `msg` to `out`. Refuses messages whose body exceeds `max`.
///
/// On error `out` is left as it was.
pub fn encode(msg: &Message, max: usize, out: &mut Vec<u8>) -> Result<(), CodecError> {
    let start = out.len();
    // Encode straight after a placeholder header rather than into a scratch buffer: one copy fewer, and the
    // length is patched in once known.
    out.extend_from_slice(&header(0));
    let encoded = bincode::encode_into_std_write(msg, out, bincode::config::standard());
    let body_len = out.len() - start - FRAME_HEADER_LEN;
    let max = effective_max(max);
    let checked = match encoded {
        Err(e) => Err(CodecError::Encode(e.to_string())),
        Ok(_) => {
            u32::try_from(body_len).ok().filter(|_| body_len <= max).ok_or(CodecError::TooLarge { len: body_len, max })
        }
    };
    match checked {
        Ok(len) => {
            out[start + 8..start + FRAME_HEADER_LEN].copy_from_slice(&len.to_be_bytes());
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Sans-IO incremental decoder: feed bytes with [`push`](Self::push), take messages with
/// [`next_message`](Self::next_message).
///
/// The header is validated as soon as its 12 bytes are there, so an oversized length (or a wrong magic,
/// version or flags) is refused before the body arrives.
///
/// After an error the decoder stays failed: the stream is out of step and nothing after the bad frame can be
/// trusted. It drops what it buffered, discards further pushes, and every later
/// [`next_message`](Self::next_message) returns the same error again.
#[derive(Debug)]
pub struct FrameDecoder {
    max: usize,
    buf: Vec<u8>,
    /// How much of `buf` has been consumed; compacted lazily so taking a message never moves the rest.
    start: usize,
    failed: Option<CodecError>,
}

impl FrameDecoder {
    /// A decoder that refuses frames whose body exceeds `max` bytes (frame lengths are u32, so at most 4 GiB - 1).
    pub fn new(max: usize) -> Self {
        FrameDecoder { max, buf: Vec::new(), start: 0, failed: None }
    }

    /// Appends bytes received from the peer. Ignored once the decoder has failed.
    ///
    /// The decoder buffers whatever it is given; callers bound memory by taking messages as they push.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        // Move the unconsumed tail to the front only once it is no longer than what was consumed, so each byte
        // is copied O(1) times overall.
        if self.start > 0 && self.start >= self.buf.len() - self.start {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, `Ok(None)` if more bytes are needed, or the error that stops the stream.
    pub fn next_message(&mut self) -> Result<Option<Message>, CodecError> {
        if let Some(e) = &self.failed {
            return Err(e.duplicate());
        }
        let pending = &self.buf[self.start..];
        let Some(head) = pending.first_chunk::<FRAME_HEADER_LEN>() else {
            return Ok(None);
        };
        let len = match parse_header(head, self.max) {
            Ok(len) => len,
            Err(e) => return Err(self.fail(e)),
        };
        let Some(body) = pending.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
            return Ok(None);
        };
        let decoded = decode_body(body);
        self.start += FRAME_HEADER_LEN + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        match decoded {
            Ok(msg) => Ok(Some(msg)),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The bytes pushed and not yet consumed as messages (0 once the decoder has failed).
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    fn fail(&mut self, e: CodecError) -> CodecError {
        self.buf = Vec::new();
        self.start = 0;
        self.failed = Some(e.duplicate());
        e
    }
}

/// Reads into `buf` until it is full or the stream ends; returns how many bytes were read.
async fn read_full<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]).await {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads one frame from any tokio `AsyncRead` (quinn's `RecvStream` is one) and decodes its message.
///
/// Returns `Ok(None)` on a clean end of stream before any byte of a frame, and [`CodecError::Truncated`] if the
/// stream ends inside one. Reads nothing past the frame, so raw payloads that follow it stay in the stream.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> Result<Option<Message>, CodecError> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    let got = read_full(r, &mut head).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < FRAME_HEADER_LEN {
        return Err(CodecError::Truncated { have: got, need: FRAME_HEADER_LEN });
    }
    let len = parse_header(&head, max)?;
    // Grow the body as bytes arrive instead of allocating the announced length up front: a peer that announces
    // `max` and sends nothing costs us nothing.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    (&mut *r).take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(CodecError::Truncated { have: FRAME_HEADER_LEN + body.len(), need: FRAME_HEADER_LEN + len });
    }
    decode_body(&body).map(Some)
}

/// Reads one frame from a blocking reader (a local client's socket), exactly: nothing past the frame is read,
/// so what follows it (descriptors) stays in the socket. `Ok(None)` on a clean end of stream before the frame.
pub fn read_frame_blocking<R: io::Read>(r: &mut R, max: usize) -> Result<Option<Message>, CodecError> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    match read_header_blocking(r, &mut head, 0)? {
        true => read_frame_body(r, &head, max).map(Some),
        false => Ok(None),
    }
}

/// Fills `head` from `got` bytes on; `false` on a clean end of stream before its first byte.
pub fn read_header_blocking<R: io::Read>(
    r: &mut R,
    head: &mut [u8; FRAME_HEADER_LEN],
    mut got: usize,
) -> Result<bool, CodecError> {
    while got < FRAME_HEADER_LEN {
        match io::Read::read(r, &mut head[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(CodecError::Truncated { have: got, need: FRAME_HEADER_LEN }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Checks a frame's header (read by the caller) and reads and decodes its body, exactly.
pub fn read_frame_body<R: io::Read>(
    r: &mut R,
    head: &[u8; FRAME_HEADER_LEN],
    max: usize,
) -> Result<Message, CodecError> {
    let len = parse_header(head, max)?;
    let mut body = Vec::with_capacity(len.min(64 << 10));
    io::Read::read_to_end(&mut io::Read::take(&mut *r, len as u64), &mut body)?;
    if body.len() < len {
        return Err(CodecError::Truncated { have: FRAME_HEADER_LEN + body.len(), need: FRAME_HEADER_LEN + len });
    }
    decode_body(&body)
}

/// Encodes `msg` and writes its frame to a blocking writer (a local client's socket, or the agent's side of it).
pub fn write_frame_blocking<W: io::Write>(w: &mut W, msg: &Message, max: usize) -> Result<(), CodecError> {
    let mut frame = Vec::with_capacity(64);
    encode(msg, max, &mut frame)?;
    w.write_all(&frame)?;
    Ok(())
}

/// Encodes `msg` and writes its frame to any tokio `AsyncWrite` (quinn's `SendStream` is one), then flushes.
///
/// Refuses (before writing anything) a message whose body exceeds `max`. Does not shut the stream down: a
/// `Write` request's payload may follow.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, msg: &Message, max: usize) -> Result<(), CodecError> {
    let mut frame = Vec::new();
    encode(msg, max, &mut frame)?;
    w.write_all(&frame).await?;
    // Flush so a buffered writer does not sit on a request the peer is waiting for.
    w.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::message::{ErrorKind, WireRegion};

    fn frame(msg: &Message) -> Vec<u8> {
        let mut out = Vec::new();
        encode(msg, DEFAULT_MAX_FRAME, &mut out).unwrap();
        out
    }

    fn raw_frame(magic: [u8; 4], version: u16, flags: u16, len: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&magic);
        out.extend_from_slice(&version.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn decode_all(bytes: &[u8], max: usize) -> Result<Option<Message>, CodecError> {
        let mut d = FrameDecoder::new(max);
        d.push(bytes);
        d.next_message()
    }

    #[test]
    fn header_layout_is_as_documented() {
        let bytes = frame(&Message::Ping { nonce: 5 });
        assert_eq!(&bytes[0..4], b"VFAB");
        assert_eq!(&bytes[4..6], &[0, 13], "version 13, big-endian");
        assert_eq!(&bytes[6..8], &[0, 0]);
        let len = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        assert_eq!(len, bytes.len() - FRAME_HEADER_LEN);
        // Ping is variant 1; nonce 5 is a one-byte varint.
        assert_eq!(&bytes[12..], &[1, 5]);
    }

    #[test]
    fn bad_magic_is_refused() {
        let mut bytes = frame(&Message::Done);
        bytes[0..4].copy_from_slice(b"HTTP");
        assert!(
            matches!(decode_all(&bytes, DEFAULT_MAX_FRAME), Err(CodecError::BadMagic { found }) if &found == b"HTTP")
        );
    }

    #[test]
    fn unknown_version_is_refused() {
        for version in [1, PROTOCOL_VERSION + 1] {
            let bytes = raw_frame(MAGIC, version, 0, 1, &[13]);
            assert!(matches!(
                decode_all(&bytes, DEFAULT_MAX_FRAME),
                Err(CodecError::UnsupportedVersion { found, supported: PROTOCOL_VERSION }) if found == version
            ));
        }
    }

    #[test]
    fn nonzero_flags_are_refused() {
        let bytes = raw_frame(MAGIC, PROTOCOL_VERSION, 0x8000, 1, &[13]);
        assert!(matches!(decode_all(&bytes, DEFAULT_MAX_FRAME), Err(CodecError::BadFlags(0x8000))));
    }

    #[test]
    fn oversized_length_is_refused_from_the_header_alone() {
        // Only the header: the body never comes, and the decoder must not wait for it.
        let bytes = raw_frame(MAGIC, PROTOCOL_VERSION, 0, 1025, &[]);
        let mut d = FrameDecoder::new(1024);
        d.push(&bytes[..FRAME_HEADER_LEN - 1]);
        assert!(matches!(d.next_message(), Ok(None)));
        d.push(&bytes[FRAME_HEADER_LEN - 1..]);
        assert!(matches!(d.next_message(), Err(CodecError::TooLarge { len: 1025, max: 1024 })));
    }

    #[test]
    fn garbage_body_is_malformed() {
        // Variant index 200 does not exist.
        let bytes = raw_frame(MAGIC, PROTOCOL_VERSION, 0, 3, &[200, 1, 2]);
        assert!(matches!(decode_all(&bytes, DEFAULT_MAX_FRAME), Err(CodecError::Malformed(_))));
        // An empty body holds no message.
        let bytes = raw_frame(MAGIC, PROTOCOL_VERSION, 0, 0, &[]);
        assert!(matches!(decode_all(&bytes, DEFAULT_MAX_FRAME), Err(CodecError::Malformed(_))));
    }

    #[test]
    fn trailing_bytes_in_the_body_are_malformed() {
        let mut body = bincode::encode_to_vec(Message::Done, bincode::config::standard()).unwrap();
        body.push(0);
        let bytes = raw_frame(MAGIC, PROTOCOL_VERSION, 0, body.len() as u32, &body);
        match decode_all(&bytes, DEFAULT_MAX_FRAME) {
            Err(CodecError::Malformed(why)) => assert!(why.contains("trailing"), "{why}"),
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    #[test]
    fn a_lying_string_length_is_malformed_not_an_allocation() {
        // Hello (variant 0), then a cluster name claiming u64::MAX / 2 bytes (varint marker 253 + u64 LE).
        let mut body = vec![0u8, 253];
        body.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        let bytes = raw_frame(MAGIC, PROTOCOL_VERSION, 0, body.len() as u32, &body);
        assert!(matches!(decode_all(&bytes, DEFAULT_MAX_FRAME), Err(CodecError::Malformed(_))));
        // Same for one just over the body but well within the limit step: bincode runs out of bytes.
        let mut body = vec![0u8, 100];
        body.extend_from_slice(b"short");
        let bytes = raw_frame(MAGIC, PROTOCOL_VERSION, 0, body.len() as u32, &body);
        assert!(matches!(decode_all(&bytes, DEFAULT_MAX_FRAME), Err(CodecError::Malformed(_))));
    }

    #[test]
    fn encode_refuses_a_message_bigger_than_max_and_leaves_out_alone() {
        let msg = Message::Error { kind: ErrorKind::Internal, message: "x".repeat(100) };
        let mut out = vec![1, 2, 3];
        let err = encode(&msg, 64, &mut out).unwrap_err();
        assert!(matches!(err, CodecError::TooLarge { len, max: 64 } if len > 100), "{err:?}");
        assert_eq!(out, vec![1, 2, 3]);
        // The exact body size passes.
        let body_len = bincode::encode_to_vec(&msg, bincode::config::standard()).unwrap().len();
        encode(&msg, body_len, &mut out).unwrap();
        assert_eq!(out.len(), 3 + FRAME_HEADER_LEN + body_len);
        assert!(matches!(encode(&msg, body_len - 1, &mut Vec::new()), Err(CodecError::TooLarge { .. })));
    }

    #[test]
    fn decoder_stays_failed() {
        let mut bytes = frame(&Message::Done);
        bytes[6] = 1;
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&bytes);
        assert!(matches!(d.next_message(), Err(CodecError::BadFlags(0x0100))));
        assert_eq!(d.buffered(), 0);
        d.push(&frame(&Message::Done));
        assert_eq!(d.buffered(), 0);
        assert!(matches!(d.next_message(), Err(CodecError::BadFlags(0x0100))));
    }

    #[test]
    fn decoder_keeps_a_partial_frame_across_compactions() {
        let region = WireRegion { addr: 1, len: 2, page_size: 3, slot: 4, generation: 5 };
        let msg = Message::Free { region };
        let one = frame(&msg);
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        for round in 0..50 {
            // A whole frame and the start of the next: taking the first leaves a consumed prefix and a partial
            // tail, which the next push must keep (moving it to the front) and complete.
            let split = 1 + round % (one.len() - 1);
            let mut bytes = one.clone();
            bytes.extend_from_slice(&one[..split]);
            d.push(&bytes);
            assert_eq!(d.next_message().unwrap(), Some(msg.clone()));
            assert_eq!(d.next_message().unwrap(), None);
            assert_eq!(d.buffered(), split);
            d.push(&one[split..]);
            assert_eq!(d.buffered(), one.len());
            assert_eq!(d.next_message().unwrap(), Some(msg.clone()));
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn max_above_u32_is_clamped() {
        let bytes = raw_frame(MAGIC, PROTOCOL_VERSION, 0, u32::MAX, &[]);
        let mut d = FrameDecoder::new(usize::MAX);
        d.push(&bytes);
        // Accepted header, waiting for a 4 GiB body that is not buffered.
        assert!(matches!(d.next_message(), Ok(None)));
        assert_eq!(effective_max(usize::MAX), u32::MAX as usize);
    }
}
