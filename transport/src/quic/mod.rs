//! QUIC between nodes (quinn, mutual TLS from a cluster CA). Being written (issue 4).
