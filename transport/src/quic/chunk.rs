//! Page payloads on QUIC streams: each chunk is a fixed header, then the raw bytes.
//!
//! Page data never goes through the control codec: a sender writes chunks with [`write_chunk`] (header, then the
//! payload buffer handed to quinn as it is) and finishes the stream; a receiver calls [`read_chunk`] until it
//! returns `Ok(None)`, or [`read_chunk_header`] and then [`read_chunk_payload`] to put each payload straight where
//! it belongs, or [`read_chunk_parts`] to take it as quinn's own buffers, verified before a byte is copied. Every chunk carries the xxh3-64 of its payload, checked on arrival, so a page that
//! changed on the way is never written into an arena.
//!
//! ```text
//! | offset: u64 BE | len: u32 BE | xxh3-64 of payload: u64 BE | payload: len bytes |
//! ```

use bytes::Bytes;
use quinn::{ReadExactError, RecvStream, SendStream};
use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use super::QuicError;

/// offset (u64 BE), length (u32 BE), xxh3-64 of the payload (u64 BE)
pub const CHUNK_HEADER_LEN: usize = 20;

/// The header in front of every chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Where the payload belongs, in whatever space the stream's protocol says (e.g. a byte offset in an arena).
    pub offset: u64,
    /// The payload's length in bytes.
    pub len: u32,
    /// The xxh3-64 of the payload.
    pub checksum: u64,
}

impl ChunkHeader {
    /// The header for `payload` at `offset`.
    ///
    /// A header describes at most `u32::MAX` bytes; for a longer payload `len` saturates at `u32::MAX` and the
    /// header matches no payload ([`write_chunk`] refuses such payloads).
    pub fn for_payload(offset: u64, payload: &[u8]) -> ChunkHeader {
        ChunkHeader { offset, len: u32::try_from(payload.len()).unwrap_or(u32::MAX), checksum: xxh3_64(payload) }
    }

    /// The header's wire form.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[0..8].copy_from_slice(&self.offset.to_be_bytes());
        b[8..12].copy_from_slice(&self.len.to_be_bytes());
        b[12..20].copy_from_slice(&self.checksum.to_be_bytes());
        b
    }

    /// A header from its wire form. Every 20 bytes decode; the checksum is what catches a wrong one.
    pub fn decode(b: &[u8; CHUNK_HEADER_LEN]) -> ChunkHeader {
        let mut offset = [0u8; 8];
        let mut len = [0u8; 4];
        let mut checksum = [0u8; 8];
        offset.copy_from_slice(&b[0..8]);
        len.copy_from_slice(&b[8..12]);
        checksum.copy_from_slice(&b[12..20]);
        ChunkHeader {
            offset: u64::from_be_bytes(offset),
            len: u32::from_be_bytes(len),
            checksum: u64::from_be_bytes(checksum),
        }
    }
}

/// Writes one checksummed chunk: the header, then `payload` handed to quinn as it is. quinn keeps the buffer
/// (reference-counted, never copied) until the peer has acknowledged it, so a sender that fills a fresh buffer
/// and moves it in here copies each byte once on its way to the packet.
///
/// Payloads longer than `u32::MAX` bytes give [`QuicError::ChunkTooLarge`] before anything is written.
pub async fn write_chunk(stream: &mut SendStream, offset: u64, payload: Bytes) -> Result<(), QuicError> {
    if u32::try_from(payload.len()).is_err() {
        return Err(QuicError::ChunkTooLarge { len: payload.len() as u64, max: u64::from(u32::MAX) });
    }
    let header = ChunkHeader::for_payload(offset, &payload);
    let mut parts = [Bytes::copy_from_slice(&header.encode()), payload];
    stream.write_all_chunks(&mut parts).await?;
    Ok(())
}

/// Reads the next chunk's header; `Ok(None)` at a clean end of stream (finish) before one. The payload follows:
/// take it with [`read_chunk_payload`].
pub async fn read_chunk_header(stream: &mut RecvStream) -> Result<Option<ChunkHeader>, QuicError> {
    let mut raw = [0u8; CHUNK_HEADER_LEN];
    match stream.read_exact(&mut raw).await {
        Ok(()) => Ok(Some(ChunkHeader::decode(&raw))),
        Err(ReadExactError::FinishedEarly(0)) => Ok(None),
        Err(ReadExactError::FinishedEarly(n)) => {
            Err(QuicError::Read(format!("stream finished {n} bytes into a {CHUNK_HEADER_LEN}-byte chunk header")))
        }
        Err(ReadExactError::ReadError(e)) => Err(QuicError::Read(e.to_string())),
    }
}

/// Reads the payload that `header` announced into `dst` (which must be exactly `header.len` bytes long) and
/// verifies its checksum. Straight from quinn's receive buffers into `dst`: a receiver that reads into the
/// bytes' destination copies them once. On [`QuicError::Checksum`] `dst` holds the bytes as they arrived, so a
/// caller that must never expose a bad chunk reads into a staging buffer ([`read_chunk`]).
pub async fn read_chunk_payload(
    stream: &mut RecvStream,
    header: &ChunkHeader,
    dst: &mut [u8],
) -> Result<(), QuicError> {
    if dst.len() as u64 != u64::from(header.len) {
        return Err(QuicError::Read(format!("a {}-byte chunk read into {} bytes of room", header.len, dst.len())));
    }
    match stream.read_exact(dst).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(n)) => {
            return Err(QuicError::Read(format!(
                "stream finished {n} bytes into the {}-byte chunk at offset {:#x}",
                header.len, header.offset
            )))
        }
        Err(ReadExactError::ReadError(e)) => return Err(QuicError::Read(e.to_string())),
    }
    let found = xxh3_64(dst);
    if found != header.checksum {
        return Err(QuicError::Checksum { offset: header.offset, expected: header.checksum, found });
    }
    Ok(())
}

/// Takes the payload that `header` announced off the stream as quinn's receive buffers, without copying it:
/// `parts` (cleared first) gets the pieces in order, one per QUIC frame, together `header.len` bytes. The
/// checksum is verified over the pieces as they come, so a caller copies the bytes once, to their destination,
/// and only when they are known good. On [`QuicError::Checksum`] `parts` holds the bytes as they arrived.
pub async fn read_chunk_parts(
    stream: &mut RecvStream,
    header: &ChunkHeader,
    parts: &mut Vec<Bytes>,
) -> Result<(), QuicError> {
    parts.clear();
    let mut hasher = Xxh3Default::new();
    let mut left = header.len as usize;
    while left > 0 {
        let piece = match stream.read_chunk(left, true).await {
            Ok(Some(chunk)) => chunk.bytes,
            Ok(None) => {
                return Err(QuicError::Read(format!(
                    "stream finished {} bytes into the {}-byte chunk at offset {:#x}",
                    header.len as usize - left,
                    header.len,
                    header.offset
                )))
            }
            Err(e) => return Err(QuicError::Read(e.to_string())),
        };
        hasher.update(&piece);
        left -= piece.len();
        parts.push(piece);
    }
    let found = hasher.digest();
    if found != header.checksum {
        return Err(QuicError::Checksum { offset: header.offset, expected: header.checksum, found });
    }
    Ok(())
}

/// Reads one chunk into `buf` (resized to the chunk's length; refuses chunks longer than `max`), verifies its
/// checksum, returns its offset; Ok(None) at a clean end of stream (finish) before a header.
///
/// After [`QuicError::ChunkTooLarge`] the payload is still on the stream, unread; after any error the stream is
/// out of step and should be stopped. A stream that ends inside a chunk, or is reset, gives [`QuicError::Read`].
pub async fn read_chunk(stream: &mut RecvStream, max: u64, buf: &mut Vec<u8>) -> Result<Option<u64>, QuicError> {
    let Some(header) = read_chunk_header(stream).await? else {
        return Ok(None);
    };
    let len = u64::from(header.len);
    let Some(len_usize) = usize::try_from(header.len).ok().filter(|_| len <= max) else {
        return Err(QuicError::ChunkTooLarge { len, max });
    };
    buf.resize(len_usize, 0);
    read_chunk_payload(stream, &header, buf).await?;
    Ok(Some(header.offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_big_endian() {
        let h = ChunkHeader { offset: 0x0102_0304_0506_0708, len: 0x090a_0b0c, checksum: 0x0d0e_0f10_1112_1314 };
        let b = h.encode();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]);
        assert_eq!(ChunkHeader::decode(&b), h);
    }

    #[test]
    fn for_payload_checksums_the_payload() {
        let h = ChunkHeader::for_payload(4096, b"page");
        assert_eq!(h, ChunkHeader { offset: 4096, len: 4, checksum: xxh3_64(b"page") });
        assert_ne!(ChunkHeader::for_payload(0, b"pagf").checksum, h.checksum);
        assert_eq!(ChunkHeader::for_payload(0, &[]).len, 0);
    }

    proptest! {
        /// The checksum taken piece by piece (as [`read_chunk_parts`] does) is the one-shot checksum of the
        /// whole payload, wherever the pieces split it.
        #[test]
        fn streamed_checksum_matches_one_shot(data in proptest::collection::vec(any::<u8>(), 0..5000), cuts in proptest::collection::vec(0usize..5000, 0..8)) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort_unstable();
            let mut hasher = Xxh3Default::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([data.len()]) {
                hasher.update(&data[at..c]);
                at = c;
            }
            prop_assert_eq!(hasher.digest(), xxh3_64(&data));
        }

        #[test]
        fn encode_decode_round_trip(offset in any::<u64>(), len in any::<u32>(), checksum in any::<u64>()) {
            let h = ChunkHeader { offset, len, checksum };
            prop_assert_eq!(ChunkHeader::decode(&h.encode()), h);
        }
    }
}
