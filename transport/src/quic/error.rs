//! The one error type of the QUIC layer.

/// An error from the QUIC layer: certificates, TLS and endpoint configuration, connections and chunk streams.
#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    /// Generating, parsing, loading or saving a certificate or key failed.
    #[error("certificate: {0}")]
    Certificate(String),
    /// rustls refused a configuration (e.g. a key that does not match its certificate).
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// Settings that cannot work, with the reason (e.g. an MTU out of range).
    #[error("invalid QUIC settings: {0}")]
    Config(String),
    /// An I/O error: binding the socket, reading or writing certificate files.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// quinn refused to start a connection (e.g. a peer name that is not a valid DNS name).
    #[error("cannot connect: {0}")]
    Connect(String),
    /// A connection failed or was closed, including handshakes where either side refused the other's
    /// certificate.
    #[error("connection failed: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// Writing to a stream failed.
    #[error("stream write failed: {0}")]
    Write(#[from] quinn::WriteError),
    /// Reading from a stream failed, or the stream ended inside a chunk.
    #[error("stream read failed: {0}")]
    Read(String),
    /// A chunk's payload does not match the checksum in its header.
    #[error("chunk at offset {offset:#x}: checksum {found:#018x} does not match the header's {expected:#018x}")]
    Checksum {
        /// The chunk's offset, from its header.
        offset: u64,
        /// The checksum in the header.
        expected: u64,
        /// The checksum of the payload that arrived.
        found: u64,
    },
    /// A chunk longer than the reader accepts (or, when writing, longer than a header can describe).
    #[error("chunk of {len} bytes is longer than the {max} bytes allowed")]
    ChunkTooLarge {
        /// The chunk's length.
        len: u64,
        /// The largest length allowed.
        max: u64,
    },
}
