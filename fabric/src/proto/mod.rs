//! The control protocol between agents (and between a node's clients and its agent): versioned frames carrying
//! bincode messages.
//!
//! One concept per file:
//!
//! - [`message`]: what is said. [`Message`] and the plain wire types it carries ([`WireRegion`],
//!   [`WireLocation`], [`WireMode`], [`ErrorKind`]). They mirror the fabric's own types but stay separate from
//!   them, so the wire format changes only when this module does.
//! - [`codec`]: how it is framed. Every message travels as one frame: a 12-byte header (magic `VFAB`, protocol
//!   version, flags, body length) and a bincode body. The codec is sans-IO at its core ([`encode`],
//!   [`FrameDecoder`]) with thin async helpers over any tokio stream ([`read_frame`], [`write_frame`]), which
//!   is what quinn's streams are.
//!
//! - [`chunk`]: page payloads, as checksummed chunks after a frame, on any byte stream; [`quic`]: what quinn's
//!   streams do better (payloads handed over and taken without a copy) and the answer that ends a stream.
//! - [`mapped`]: what a local client needs to map the node's memory (arenas, a lease's pages, descriptors
//!   passed over the Unix socket).
//! - [`convert`]: the fabric's types to and from their wire forms, errors included.
//!
//! Everything a peer sends is untrusted: the header is checked before the body is buffered, the body length is
//! bounded by the caller's `max`, and decoding never allocates more than a small multiple of the body it was
//! given. Page payloads never pass through this codec; they follow a `Write` request or a `Data` response raw
//! on the same stream.

pub mod chunk;
pub mod codec;
pub mod convert;
pub mod mapped;
pub mod message;
pub mod quic;

pub use chunk::{ChunkError, ChunkHeader, Payload, CHUNK_HEADER_LEN};
pub use codec::{
    encode, read_frame, read_frame_blocking, write_frame, write_frame_blocking, CodecError, FrameDecoder,
    DEFAULT_MAX_FRAME, FRAME_HEADER_LEN, MAGIC, PROTOCOL_VERSION,
};
pub use message::{ErrorKind, Message, WireArena, WireLocation, WireMode, WirePages, WireRegion, WireShareKind};
