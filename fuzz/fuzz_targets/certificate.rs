//! A peer's certificate as the agent reads it after the TLS handshake: any bytes give a node name or `None`,
//! never a panic, and a name given is one the configuration could hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vfabric_transport::quic::{certificate_node_name, validate_node_name};

fuzz_target!(|data: &[u8]| {
    if let Some(name) = certificate_node_name(data) {
        assert!(validate_node_name(&name).is_ok(), "{name:?}");
    }
});
