//! The one error type of the QUIC layer.

/// An error from the QUIC layer: certificates, TLS and endpoint configuration, connections.
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
}
