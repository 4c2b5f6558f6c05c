//! QUIC between nodes: quinn with mutual TLS from a cluster CA, and checksummed page payloads on streams.
//!
//! - [`ca`]: the cluster's certificate authority ([`ClusterCa`]) and each node's certificate and key
//!   ([`NodeIdentity`]), made with rcgen, saved as PEM.
//! - [`endpoint`](mod@endpoint): one quinn [`Endpoint`](quinn::Endpoint) per node that both listens and dials
//!   ([`endpoint()`]), TLS 1.3 on ring, every peer's certificate checked against the cluster CA in both
//!   directions; [`connect`] dials a node by name and [`peer_name`] says who is on the other end. The transport
//!   settings ([`QuicSettings`]) pin the MTU per cluster.
//! - [`socket`]: the endpoint's UDP socket ([`socket::CappedGsoSocket`]), quinn's with segmentation-offload
//!   batches kept within one UDP datagram, so packets above 6,550 bytes keep GSO.
//! - [`runtime`]: [`PinnedRuntime`], a quinn runtime that keeps an endpoint's drivers, timers and socket on
//!   one Tokio runtime whichever runtime its users call from.
//! - [`pool`]: reusable payload buffers ([`BufferPool`]) that return from quinn once their bytes are
//!   acknowledged.
//!
//! Accepting is plain quinn:
//!
//! ```no_run
//! # async fn serve(identity: vfabric_transport::quic::NodeIdentity) -> Result<(), vfabric_transport::quic::QuicError> {
//! use vfabric_transport::quic::{endpoint, peer_name, QuicSettings};
//!
//! let ep = endpoint("0.0.0.0:7400".parse().unwrap(), &identity, &QuicSettings::default())?;
//! while let Some(incoming) = ep.accept().await {
//!     // Resolves once the client's certificate has been verified; refused clients give an error here.
//!     let conn = incoming.await?;
//!     let node = peer_name(&conn);
//!     // ... conn.accept_bi().await ...
//! #   let _ = node;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! and dialing is [`connect`]`(&ep, addr, "n1")`, which returns once both certificates have been checked.

pub mod ca;
pub mod endpoint;
mod error;
pub mod pool;
pub mod runtime;
pub mod socket;
mod x509;

pub use ca::{validate_node_name, ClusterCa, NodeIdentity};
pub use endpoint::{
    certificate_node_name, certificate_tenant, connect, endpoint, endpoint_pinned, peer_name, peer_tenant,
    QuicSettings, DEFAULT_MTU, MAX_MTU, MIN_MTU,
};
pub use error::QuicError;
pub use pool::{BufferPool, PoolBuf};
pub use runtime::PinnedRuntime;
