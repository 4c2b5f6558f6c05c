//! Page payloads: each chunk is a fixed header, then the raw bytes, on any byte stream (a QUIC stream between
//! agents, a node's Unix socket to its local clients).
//!
//! Page data never goes through the control codec ([`super::codec`]): a request or response frame announces how
//! many bytes follow ([`Payload`]), and they follow as chunks. Every chunk carries the xxh3-64 of its payload,
//! checked on arrival, so a page that changed on the way is never written into an arena:
//!
//! ```text
//! | offset: u64 BE | packed: 1 bit, len: 31 bits BE | xxh3-64 of payload: u64 BE | payload: len bytes |
//! ```
//!
//! A packed chunk's payload is `| zstd: 1 bit, raw length: 31 bits BE | LZ4 block or zstd frame |`
//! ([`pack_chunk`]): a sender that compresses (`network.compression`, or a region's own lossless codec) packs a
//! chunk that shrinks by an eighth with LZ4 or (over 4 KiB) a sixteenth with zstd (a chunk of 16 KiB or more
//! only once its first 4 KiB do), and sends the others as they are. Its checksum covers the bytes on the wire; unpacking
//! (checked decoding) must give exactly the raw length, which counts against the payload as a raw chunk's
//! length does (so a peer cannot make the receiver take more than the payload it agreed to). A chunk of one
//! byte repeated is packed as `| raw length | the byte |`, whatever the codec.
//!
//! Receivers take chunks through [`ChunkRead`]: [`StreamChunks`] over any tokio `AsyncRead` (a staging buffer
//! per chunk), and `proto::quic::QuicChunks` over a quinn stream (the payload stays in quinn's receive buffers
//! until it is known good). [`receive`] is the one loop that checks each chunk's place against the payload it
//! belongs to and hands it on.

use std::cell::RefCell;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use vfabric_allocator::Compression;
use vfabric_transport::storage::{uniform, Packer};
use xxhash_rust::xxh3::xxh3_64;

/// offset (u64 BE), packed flag and length (u32 BE), xxh3-64 of the payload (u64 BE)
pub const CHUNK_HEADER_LEN: usize = 20;

/// The largest payload a header describes (its length has 31 bits; the top one says packed).
pub const MAX_CHUNK_LEN: u32 = u32::MAX >> 1;

/// The header bit of a packed chunk.
const PACKED: u32 = 1 << 31;

/// The header in front of every chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Where the payload belongs, counted as the stream's protocol says (from the first byte of a call's payload).
    pub offset: u64,
    /// The payload's length in bytes.
    pub len: u32,
    /// The xxh3-64 of the payload.
    pub checksum: u64,
    /// Whether the payload is packed ([`pack_chunk`]).
    pub packed: bool,
}

impl ChunkHeader {
    /// The header for `payload` at `offset`.
    ///
    /// A header describes at most [`MAX_CHUNK_LEN`] bytes; for a longer payload `len` saturates there and the
    /// header matches no payload ([`write_chunk`] refuses such payloads).
    pub fn for_payload(offset: u64, payload: &[u8]) -> ChunkHeader {
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX).min(MAX_CHUNK_LEN);
        ChunkHeader { offset, len, checksum: xxh3_64(payload), packed: false }
    }

    /// The header for a packed payload ([`pack_chunk`]'s) at `offset`.
    pub fn for_packed(offset: u64, packed: &[u8]) -> ChunkHeader {
        ChunkHeader { packed: true, ..ChunkHeader::for_payload(offset, packed) }
    }

    /// The header's wire form.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[0..8].copy_from_slice(&self.offset.to_be_bytes());
        let len = (self.len & MAX_CHUNK_LEN) | if self.packed { PACKED } else { 0 };
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[12..20].copy_from_slice(&self.checksum.to_be_bytes());
        b
    }

    /// A header from its wire form. Every 20 bytes decode; the checksum is what catches a wrong one.
    pub fn decode(b: &[u8; CHUNK_HEADER_LEN]) -> ChunkHeader {
        let word = |r: std::ops::Range<usize>| b[r].iter().fold(0u64, |v, &x| v << 8 | u64::from(x));
        let len = word(8..12) as u32;
        ChunkHeader { offset: word(0..8), len: len & MAX_CHUNK_LEN, checksum: word(12..20), packed: len & PACKED != 0 }
    }

    /// Checks the checksum `found` of the payload that arrived for this header.
    pub fn verify(&self, found: u64) -> Result<(), ChunkError> {
        match found == self.checksum {
            true => Ok(()),
            false => Err(ChunkError::Checksum { offset: self.offset, expected: self.checksum, found }),
        }
    }
}

/// Why a chunk could not be sent or taken.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    /// The stream failed underneath (reset, closed, I/O error).
    #[error("stream failed: {0}")]
    Io(#[from] std::io::Error),
    /// The peer stopped the stream before taking the payload: it answered early (a refusal), and its answer says
    /// why.
    #[error("the peer stopped the stream before taking the payload")]
    Stopped,
    /// The stream ended inside a chunk.
    #[error("stream ended {got} bytes into a chunk of {len} bytes (its header included) at offset {offset:#x}")]
    Truncated {
        /// The chunk's offset (0 while its header is incomplete).
        offset: u64,
        /// Bytes of the chunk expected, its header included.
        len: u64,
        /// Bytes that arrived.
        got: u64,
    },
    /// A chunk's payload does not match the checksum in its header: nothing of it was used.
    #[error("chunk at offset {offset:#x}: checksum {found:#018x} does not match the header's {expected:#018x}")]
    Checksum {
        /// The chunk's offset, from its header.
        offset: u64,
        /// The checksum in the header.
        expected: u64,
        /// The checksum of the payload that arrived.
        found: u64,
    },
    /// A chunk longer than the receiver takes (or, when writing, longer than a header can describe).
    #[error("chunk of {len} bytes is longer than the {max} bytes allowed")]
    TooLarge {
        /// The chunk's length.
        len: u64,
        /// The largest length allowed.
        max: u64,
    },
    /// A chunk that lies outside the payload it belongs to.
    #[error("a chunk of {len} bytes at {offset:#x} runs past the {payload} bytes of its payload")]
    Outside {
        /// The chunk's offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// The payload's length.
        payload: u64,
    },
    /// A chunk that does not start where the one before it ended: chunks come in order on one stream, so a
    /// gap or an overlap (a byte never written, or written twice) is refused.
    #[error("a chunk at {offset:#x} where the next byte of its payload is {expected:#x}")]
    OutOfOrder {
        /// The chunk's offset.
        offset: u64,
        /// Where the next chunk had to start.
        expected: u64,
    },
    /// A packed chunk whose bytes do not unpack to the raw length it names (or that names none).
    #[error("packed chunk at offset {offset:#x} does not unpack to its {len} bytes")]
    Undecodable {
        /// The chunk's offset.
        offset: u64,
        /// The raw length it names.
        len: u64,
    },
    /// A packed chunk where only raw ones are taken (a node's Unix socket to its local clients).
    #[error("packed chunk at offset {0:#x} where chunks are sent as they are")]
    Packed(u64),
    /// The payload ended before all its bytes arrived.
    #[error("{got} of the payload's {want} bytes arrived")]
    Short {
        /// Bytes that arrived.
        got: u64,
        /// Bytes announced.
        want: u64,
    },
}

/// Writes one checksummed chunk: the header, then `payload` (as it is: local sockets carry no packed chunks).
/// Payloads longer than [`MAX_CHUNK_LEN`] bytes give [`ChunkError::TooLarge`] before anything is written.
pub async fn write_chunk<W: AsyncWrite + Unpin>(w: &mut W, offset: u64, payload: &[u8]) -> Result<(), ChunkError> {
    check_len(payload.len())?;
    w.write_all(&ChunkHeader::for_payload(offset, payload).encode()).await?;
    w.write_all(payload).await?;
    Ok(())
}

/// Refuses a payload a header cannot describe.
pub(crate) fn check_len(len: usize) -> Result<(), ChunkError> {
    match u32::try_from(len) {
        Ok(n) if n <= MAX_CHUNK_LEN => Ok(()),
        _ => Err(ChunkError::TooLarge { len: len as u64, max: u64::from(MAX_CHUNK_LEN) }),
    }
}

/// How much of a chunk is compressed first to tell whether the rest is worth it.
const PROBE: usize = 4096;

/// The top bit of a packed chunk's raw length: a zstd frame follows, not an LZ4 block.
const ZSTD: u32 = 1 << 31;

thread_local! {
    /// The storage tier's packer (its zstd contexts and scratch memory), one per thread that packs chunks.
    static PACKER: RefCell<Packer> = RefCell::new(Packer::default());
}

/// `payload` packed for the wire with `codec` (`lz4` or `zstd`; any other packs nothing): `| raw length: u32 BE
/// | LZ4 block |` when that saves an eighth of it, `| raw length with its top bit set | zstd frame |` when zstd
/// saves a sixteenth (it shrinks dense floats by a little, where LZ4 finds nothing). The first 4 KiB of a
/// payload of 16 KiB or more must shrink first, so data that does not (random bytes; bf16 weights under LZ4)
/// costs one small compression. A payload of one byte repeated (zeros) is `| raw length | the byte |`: LZ4
/// would expand it a byte at a time, and no LZ4 block or zstd frame of one byte stands for any bytes.
pub fn pack_chunk(payload: &[u8], codec: Compression) -> Option<Vec<u8>> {
    let raw = u32::try_from(payload.len()).ok().filter(|&n| n <= MAX_CHUNK_LEN)?;
    match codec {
        Compression::Lz4 => pack_lz4(payload, raw),
        Compression::Zstd => pack_zstd(payload, raw),
        _ => None,
    }
}

/// [`pack_chunk`] with zstd, through the storage tier's packer (the same level and probe; it packs pieces
/// longer than a 4 KiB block, where it saves a block).
fn pack_zstd(payload: &[u8], raw: u32) -> Option<Vec<u8>> {
    let mut out = raw.to_be_bytes().to_vec();
    if let Some(b) = uniform(payload).filter(|_| payload.len() >= 8) {
        out.push(b);
        return Some(out);
    }
    PACKER.with(|p| {
        let mut p = p.borrow_mut();
        let packed = p.pack(Compression::Zstd, payload)?;
        if packed.len() * 16 > payload.len() * 15 {
            return None;
        }
        out[..4].copy_from_slice(&(raw | ZSTD).to_be_bytes());
        out.extend_from_slice(packed);
        Some(out)
    })
}

/// [`pack_chunk`] with LZ4.
fn pack_lz4(payload: &[u8], raw: u32) -> Option<Vec<u8>> {
    if payload.len() >= 4 * PROBE && lz4_flex::block::compress(&payload[..PROBE]).len() * 8 > PROBE * 7 {
        return None;
    }
    if let Some(b) = uniform(payload).filter(|_| payload.len() >= 8) {
        let mut out = raw.to_be_bytes().to_vec();
        out.push(b);
        return Some(out);
    }
    let mut out = vec![0u8; 4 + lz4_flex::block::get_maximum_output_size(payload.len())];
    out[..4].copy_from_slice(&raw.to_be_bytes());
    let n = lz4_flex::block::compress_into(payload, &mut out[4..]).ok()?;
    out.truncate(4 + n);
    // The chunk waits in quinn's send buffer until acknowledged: it must hold its packed size, not the
    // worst case it was packed into.
    out.shrink_to_fit();
    (out.len() * 8 <= payload.len() * 7).then_some(out)
}

/// The raw length a packed payload names (its first 4 bytes gathered from `pieces`).
fn raw_len(pieces: &[&[u8]]) -> Option<u32> {
    let mut b = [0u8; 4];
    let mut got = 0;
    for p in pieces {
        let take = (4 - got).min(p.len());
        b[got..got + take].copy_from_slice(&p[..take]);
        got += take;
        if got == 4 {
            return Some(u32::from_be_bytes(b));
        }
    }
    None
}

/// Reads the next chunk's header; `Ok(None)` at a clean end of stream before one. The payload follows.
pub async fn read_chunk_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<ChunkHeader>, ChunkError> {
    let mut raw = [0u8; CHUNK_HEADER_LEN];
    let mut got = 0;
    while got < raw.len() {
        match r.read(&mut raw[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => return Err(ChunkError::Truncated { offset: 0, len: CHUNK_HEADER_LEN as u64, got: got as u64 }),
            n => got += n,
        }
    }
    Ok(Some(ChunkHeader::decode(&raw)))
}

/// Reads the payload `header` announced into `dst` (exactly `header.len` bytes long) and verifies it. On
/// [`ChunkError::Checksum`] `dst` holds the bytes as they arrived: a caller that must never expose a bad chunk
/// reads into a staging buffer first (as [`StreamChunks`] does).
pub async fn read_chunk_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    header: &ChunkHeader,
    dst: &mut [u8],
) -> Result<(), ChunkError> {
    if dst.len() as u64 != u64::from(header.len) {
        return Err(ChunkError::Outside {
            offset: header.offset,
            len: u64::from(header.len),
            payload: dst.len() as u64,
        });
    }
    let mut got = 0;
    while got < dst.len() {
        match r.read(&mut dst[got..]).await? {
            0 => {
                let len = CHUNK_HEADER_LEN as u64 + u64::from(header.len);
                return Err(ChunkError::Truncated { offset: header.offset, len, got: (CHUNK_HEADER_LEN + got) as u64 });
            }
            n => got += n,
        }
    }
    header.verify(xxh3_64(dst))
}

/// The chunks a receiver takes off a stream, each verified before anyone sees its bytes.
pub trait ChunkRead {
    /// The next chunk's header; `None` at a clean end of stream before one.
    fn next_header(&mut self) -> impl std::future::Future<Output = Result<Option<ChunkHeader>, ChunkError>>;
    /// The payload `header` announced, verified, as pieces in order.
    fn next_payload(
        &mut self,
        header: &ChunkHeader,
    ) -> impl std::future::Future<Output = Result<Vec<&[u8]>, ChunkError>>;
}

/// Chunks from any tokio `AsyncRead`, each payload read into a staging buffer of this reader and verified there.
pub struct StreamChunks<'a, R> {
    stream: &'a mut R,
    max: u64,
    buf: Vec<u8>,
}

impl<'a, R: AsyncRead + Unpin> StreamChunks<'a, R> {
    /// Chunks of at most `max` bytes from `stream`.
    pub fn new(stream: &'a mut R, max: u64) -> Self {
        StreamChunks { stream, max, buf: Vec::new() }
    }
}

impl<R: AsyncRead + Unpin> ChunkRead for StreamChunks<'_, R> {
    async fn next_header(&mut self) -> Result<Option<ChunkHeader>, ChunkError> {
        read_chunk_header(self.stream).await
    }

    async fn next_payload(&mut self, header: &ChunkHeader) -> Result<Vec<&[u8]>, ChunkError> {
        let len = u64::from(header.len);
        if len > self.max {
            return Err(ChunkError::TooLarge { len, max: self.max });
        }
        self.buf.resize(header.len as usize, 0);
        read_chunk_payload(self.stream, header, &mut self.buf).await?;
        Ok(vec![&self.buf[..]])
    }
}

/// The payload of one call: `len` bytes as chunks of at most `max_chunk` bytes, whose offsets count from `base`
/// (0 for a write's or a release's payload, which count from their first byte; the region's offset of the
/// first byte for a read's or an acquire's, which count from the region's start). Checks where each chunk goes
/// and that all of it arrives.
#[derive(Debug, Clone, Copy)]
pub struct Payload {
    base: u64,
    len: u64,
    max_chunk: u64,
    got: u64,
}

impl Payload {
    /// A payload of `len` bytes in chunks of at most `max_chunk`, offsets counted from its first byte.
    pub fn new(len: u64, max_chunk: u64) -> Payload {
        Payload::at(0, len, max_chunk)
    }

    /// A payload whose first byte has offset `base`.
    pub fn at(base: u64, len: u64, max_chunk: u64) -> Payload {
        Payload { base, len, max_chunk, got: 0 }
    }

    /// Where the chunk `header` announces goes (its place from the payload's first byte), counting its bytes as
    /// arrived; [`ChunkError::Outside`] or [`ChunkError::TooLarge`] for one that does not belong, and
    /// [`ChunkError::OutOfOrder`] for one that does not start where the last ended (so that every byte of a
    /// complete payload arrived exactly once).
    /// A packed chunk is refused here ([`ChunkError::Packed`]): [`receive`] places one by its raw length.
    pub fn place(&mut self, header: &ChunkHeader) -> Result<u64, ChunkError> {
        if header.packed {
            return Err(ChunkError::Packed(header.offset));
        }
        self.place_at(header.offset, u64::from(header.len))
    }

    /// [`Payload::place`] of `len` bytes at `offset`.
    fn place_at(&mut self, offset: u64, len: u64) -> Result<u64, ChunkError> {
        if len > self.max_chunk {
            return Err(ChunkError::TooLarge { len, max: self.max_chunk });
        }
        let start = offset.checked_sub(self.base);
        let Some(start) = start.filter(|s| s.checked_add(len).is_some_and(|end| end <= self.len)) else {
            return Err(ChunkError::Outside { offset, len, payload: self.len });
        };
        if start != self.got {
            return Err(ChunkError::OutOfOrder { offset, expected: self.base + self.got });
        }
        self.got += len;
        Ok(start)
    }

    /// Whether every byte arrived.
    pub fn is_complete(&self) -> bool {
        self.got >= self.len
    }

    /// [`ChunkError::Short`] unless every byte arrived.
    pub fn finish(&self) -> Result<(), ChunkError> {
        match self.got == self.len {
            true => Ok(()),
            false => Err(ChunkError::Short { got: self.got, want: self.len }),
        }
    }
}

/// Copies `pieces` (a chunk's payload), one after the other, to the start of `dst`.
pub fn copy_pieces(dst: &mut [u8], pieces: &[&[u8]]) {
    let mut to = 0;
    for p in pieces {
        dst[to..to + p.len()].copy_from_slice(p);
        to += p.len();
    }
}

/// Takes the chunks of `payload` from `src` until all of it arrived, handing each verified chunk to `put` with
/// its offset in the payload. A bad chunk, one outside the payload, or a stream that ends first fails the call;
/// `put` then saw only the good chunks before it. Nothing past the payload is read, so a stream may carry the
/// next frame after it.
pub async fn receive<S: ChunkRead, E: From<ChunkError>>(
    src: &mut S,
    mut payload: Payload,
    mut put: impl FnMut(u64, &[&[u8]]) -> Result<(), E>,
) -> Result<(), E> {
    let (mut packed, mut unpacked) = (Vec::new(), Vec::new());
    while !payload.is_complete() {
        let Some(header) = src.next_header().await? else { break };
        if !header.packed {
            let at = payload.place(&header)?;
            let pieces = src.next_payload(&header).await?;
            put(at, &pieces)?;
            continue;
        }
        // The wire bytes (a packed chunk is never longer than the raw one it stands for, and its length), then
        // its raw length counted against the payload before anything is unpacked.
        if u64::from(header.len) > payload.max_chunk + 4 {
            return Err(ChunkError::TooLarge { len: u64::from(header.len), max: payload.max_chunk + 4 }.into());
        }
        let pieces = src.next_payload(&header).await?;
        let undecodable = |len| ChunkError::Undecodable { offset: header.offset, len };
        let head = raw_len(&pieces).ok_or(undecodable(0))?;
        let raw = head & !ZSTD;
        let at = payload.place_at(header.offset, u64::from(raw))?;
        packed.clear();
        for p in &pieces {
            packed.extend_from_slice(p);
        }
        unpacked.resize(raw as usize, 0);
        let unpacked_whole = match &packed[4..] {
            [b] if raw > 0 && head & ZSTD == 0 => {
                unpacked.fill(*b);
                true
            }
            // No zstd frame is one byte (the packer would take it for a byte repeated).
            [_] if head & ZSTD != 0 => false,
            zstd if head & ZSTD != 0 => PACKER.with(|p| p.borrow_mut().unpack(Compression::Zstd, zstd, &mut unpacked)),
            lz4 => matches!(lz4_flex::block::decompress_into(lz4, &mut unpacked), Ok(n) if n == raw as usize),
        };
        if !unpacked_whole {
            return Err(undecodable(u64::from(raw)).into());
        }
        put(at, &[&unpacked[..]])?;
    }
    Ok(payload.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_big_endian() {
        let h = ChunkHeader {
            offset: 0x0102_0304_0506_0708,
            len: 0x090a_0b0c,
            checksum: 0x0d0e_0f10_1112_1314,
            packed: false,
        };
        let b = h.encode();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]);
        assert_eq!(ChunkHeader::decode(&b), h);
    }

    #[test]
    fn for_payload_checksums_the_payload() {
        let h = ChunkHeader::for_payload(4096, b"page");
        assert_eq!(h, ChunkHeader { offset: 4096, len: 4, checksum: xxh3_64(b"page"), packed: false });
        assert_ne!(ChunkHeader::for_payload(0, b"pagf").checksum, h.checksum);
        assert_eq!(ChunkHeader::for_payload(0, &[]).len, 0);
    }

    #[test]
    fn a_payload_takes_only_its_own_chunks() {
        let mut p = Payload::new(100, 64);
        let h = |offset, len| ChunkHeader { offset, len, checksum: 0, packed: false };
        assert!(matches!(p.place(&h(0, 65)), Err(ChunkError::TooLarge { len: 65, max: 64 })));
        assert!(matches!(p.place(&h(90, 11)), Err(ChunkError::Outside { .. })));
        assert!(matches!(p.place(&h(u64::MAX, 2)), Err(ChunkError::Outside { .. })));
        assert_eq!(p.place(&h(0, 64)).unwrap(), 0);
        assert!(!p.is_complete());
        assert!(matches!(p.finish(), Err(ChunkError::Short { got: 64, want: 100 })));
        assert_eq!(p.place(&h(64, 36)).unwrap(), 64);
        assert!(p.is_complete() && p.finish().is_ok());
        let mut p = Payload::at(4096, 100, 64);
        assert!(matches!(p.place(&h(4000, 10)), Err(ChunkError::Outside { .. })));
        // In order only: a gap or a chunk sent twice would leave bytes unwritten in a payload that looks whole.
        assert!(matches!(p.place(&h(4096 + 40, 60)), Err(ChunkError::OutOfOrder { expected: 4096, .. })));
        assert_eq!(p.place(&h(4096, 40)).unwrap(), 0);
        assert!(matches!(p.place(&h(4096, 40)), Err(ChunkError::OutOfOrder { expected: 4136, .. })));
        assert_eq!(p.place(&h(4096 + 40, 60)).unwrap(), 40);
        assert!(p.is_complete() && p.finish().is_ok());
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(f)
    }

    #[test]
    fn chunks_cross_a_byte_stream_verified() {
        run(async {
            let (mut a, mut b) = tokio::io::duplex(1 << 16);
            let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
            let send = async {
                for (i, piece) in data.chunks(1024).enumerate() {
                    write_chunk(&mut a, (i * 1024) as u64, piece).await.expect("write");
                }
                // A corrupted chunk after the payload: the receiver that stops at the payload's end never reads it.
                let mut bad = ChunkHeader::for_payload(0, b"xyz");
                bad.checksum ^= 1;
                a.write_all(&bad.encode()).await.expect("header");
                a.write_all(b"xyz").await.expect("payload");
            };
            let mut back = vec![0u8; data.len()];
            let take = async {
                let mut src = StreamChunks::new(&mut b, 1024);
                receive::<_, ChunkError>(&mut src, Payload::new(3000, 1024), |at, pieces| {
                    let bytes = pieces.concat();
                    back[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
                    Ok(())
                })
                .await
                .expect("payload");
                let h = src.next_header().await.expect("header").expect("a chunk");
                src.next_payload(&h).await.map(|_| ())
            };
            let ((), bad) = tokio::join!(send, take);
            assert_eq!(back, data);
            assert!(matches!(bad, Err(ChunkError::Checksum { offset: 0, .. })), "{bad:?}");
        });
    }

    #[test]
    fn a_stream_that_ends_inside_a_chunk_is_truncated() {
        run(async {
            let (mut a, mut b) = tokio::io::duplex(1 << 16);
            a.write_all(&ChunkHeader::for_payload(0, b"abcdef").encode()).await.expect("header");
            a.write_all(b"abc").await.expect("part");
            drop(a);
            let mut src = StreamChunks::new(&mut b, 64);
            let r = receive::<_, ChunkError>(&mut src, Payload::new(16, 64), |_, _| Ok(())).await;
            assert!(matches!(r, Err(ChunkError::Truncated { offset: 0, len: 26, got: 23 })), "{r:?}");
        });
    }

    #[test]
    fn packed_chunks_unpack_into_place_beside_raw_ones() {
        run(async {
            let (mut a, mut b) = tokio::io::duplex(1 << 20);
            let mut sparse = vec![0u8; 64 << 10];
            sparse[100] = 7;
            sparse[40_000] = 9;
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let dense: Vec<u8> = (0..64 << 10)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert!(pack_chunk(&dense, Compression::Lz4).is_none(), "dense bytes do not shrink: sent as they are");
            let packed = pack_chunk(&sparse, Compression::Lz4).expect("sparse bytes shrink");
            assert!(packed.len() < 1024, "{} bytes", packed.len());
            a.write_all(&ChunkHeader::for_packed(0, &packed).encode()).await.expect("header");
            a.write_all(&packed).await.expect("payload");
            write_chunk(&mut a, 64 << 10, &dense).await.expect("raw");
            // A chunk of one byte repeated: the byte alone.
            let ones = pack_chunk(&[0xA5; 64 << 10], Compression::Lz4).expect("one byte repeated shrinks");
            assert_eq!(ones, [0, 1, 0, 0, 0xA5]);
            a.write_all(&ChunkHeader::for_packed(128 << 10, &ones).encode()).await.expect("header");
            a.write_all(&ones).await.expect("payload");
            let mut back = vec![0u8; 192 << 10];
            let mut src = StreamChunks::new(&mut b, 64 << 10);
            receive::<_, ChunkError>(&mut src, Payload::new(192 << 10, 64 << 10), |at, pieces| {
                copy_pieces(&mut back[at as usize..], pieces);
                Ok(())
            })
            .await
            .expect("payload");
            assert!(back[..64 << 10] == sparse[..] && back[64 << 10..128 << 10] == dense[..]);
            assert!(back[128 << 10..].iter().all(|&b| b == 0xA5));
        });
    }

    /// Sends one packed chunk of `packed` (its checksum right) and receives it into a payload of 64 KiB chunks.
    fn receive_packed(packed: &[u8]) -> Result<(), ChunkError> {
        run(async {
            let (mut a, mut b) = tokio::io::duplex(1 << 20);
            a.write_all(&ChunkHeader::for_packed(0, packed).encode()).await.expect("header");
            a.write_all(packed).await.expect("payload");
            drop(a);
            let mut src = StreamChunks::new(&mut b, 1 << 20);
            receive::<_, ChunkError>(&mut src, Payload::new(1 << 20, 64 << 10), |_, _| Ok(())).await
        })
    }

    #[test]
    fn bad_packed_chunks_are_refused_before_they_take_memory() {
        let mut sparse = vec![0u8; 64 << 10];
        sparse[5000] = 1;
        let good = pack_chunk(&sparse, Compression::Lz4).expect("sparse bytes shrink");
        // More raw bytes than a chunk may hold: refused before anything is unpacked.
        let mut big = good.clone();
        big[..4].copy_from_slice(&(1u32 << 30).to_be_bytes());
        assert!(matches!(receive_packed(&big), Err(ChunkError::TooLarge { .. })));
        // A raw length the block does not unpack to, bytes that are no LZ4 block, no length at all.
        let mut short = good.clone();
        short[..4].copy_from_slice(&(1000u32).to_be_bytes());
        assert!(matches!(receive_packed(&short), Err(ChunkError::Undecodable { len: 1000, .. })));
        let mut garbage = good[..4].to_vec();
        garbage.extend_from_slice(&[0xff; 64]);
        assert!(matches!(receive_packed(&garbage), Err(ChunkError::Undecodable { .. })));
        assert!(matches!(receive_packed(&[1, 2]), Err(ChunkError::Undecodable { len: 0, .. })));
        // The same for a zstd frame (the raw length's top bit set).
        let zstd = pack_chunk(&crate::pattern::skewed(1, 64 << 10), Compression::Zstd).expect("zstd shrinks it");
        assert_eq!(zstd[0] & 0x80, 0x80, "the zstd bit");
        let mut short = zstd.clone();
        short[..4].copy_from_slice(&(1000u32 | ZSTD).to_be_bytes());
        assert!(matches!(receive_packed(&short), Err(ChunkError::Undecodable { len: 1000, .. })));
        let mut garbage = zstd[..4].to_vec();
        garbage.extend_from_slice(&[0xff; 64]);
        assert!(matches!(receive_packed(&garbage), Err(ChunkError::Undecodable { .. })));
        let mut one = zstd[..4].to_vec();
        one.push(0);
        assert!(matches!(receive_packed(&one), Err(ChunkError::Undecodable { .. })), "no zstd frame is one byte");
        let mut huge = zstd.clone();
        huge[..4].copy_from_slice(&(MAX_CHUNK_LEN | ZSTD).to_be_bytes());
        assert!(matches!(receive_packed(&huge), Err(ChunkError::TooLarge { .. })));
        // Where only raw chunks are taken (a local client's socket), a packed one is refused.
        let mut p = Payload::new(1 << 20, 64 << 10);
        assert!(matches!(p.place(&ChunkHeader::for_packed(0, &good)), Err(ChunkError::Packed(0))));
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(
            offset in any::<u64>(),
            len in 0..=MAX_CHUNK_LEN,
            checksum in any::<u64>(),
            packed in any::<bool>(),
        ) {
            let h = ChunkHeader { offset, len, checksum, packed };
            prop_assert_eq!(ChunkHeader::decode(&h.encode()), h);
        }
    }
}
