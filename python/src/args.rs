//! Arguments as Python passes them (device names, modes, priorities, sizes), checked and turned into the Rust
//! API's types. Every bad value is a `ValueError` that names the argument and what it accepts.

use pyo3::prelude::*;
use vfabric::{Compression, Location, Mode, Priority};

use crate::errors::value_error;

/// A device name: `"gpu0"`, `"gpu1"`, ..., or `"host"`.
pub fn location(name: &str) -> PyResult<Location> {
    name.parse::<Location>().map_err(|_| value_error(format!("unknown device {name:?}: use \"gpuN\" or \"host\"")))
}

/// A device's name, as `location` reads it back.
pub fn location_name(location: Location) -> String {
    location.to_string()
}

/// A lease's mode: `"r"` (or `"read"`) or `"w"` (or `"write"`).
pub fn mode(name: &str) -> PyResult<Mode> {
    match name {
        "r" | "read" => Ok(Mode::Read),
        "w" | "write" => Ok(Mode::Write),
        _ => Err(value_error(format!("unknown mode {name:?}: use \"r\" or \"w\""))),
    }
}

/// A mode's short name.
pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Read => "r",
        Mode::Write => "w",
    }
}

/// An eviction priority: `"low"`, `"normal"` or `"high"`.
pub fn priority(name: &str) -> PyResult<Priority> {
    match name {
        "low" => Ok(Priority::Low),
        "normal" => Ok(Priority::Normal),
        "high" => Ok(Priority::High),
        _ => Err(value_error(format!("unknown priority {name:?}: use \"low\", \"normal\" or \"high\""))),
    }
}

/// A compression by name.
pub fn compression(name: &str) -> PyResult<Compression> {
    name.parse().map_err(|_: vfabric::ParseCompressionError| {
        let names: Vec<String> = vfabric::COMPRESSIONS.iter().map(|c| format!("{:?}", c.to_string())).collect();
        value_error(format!("unknown compression {name:?}: use {}", names.join(", ")))
    })
}

/// A size or offset, which may not be negative.
pub fn non_negative(value: i64, what: &str) -> PyResult<u64> {
    u64::try_from(value).map_err(|_| value_error(format!("{what} must not be negative (got {value})")))
}

/// A tenant id (a 32-bit unsigned integer).
pub fn tenant(value: i64) -> PyResult<vfabric::TenantId> {
    u32::try_from(value)
        .map(vfabric::TenantId)
        .map_err(|_| value_error(format!("tenant must be in 0..={} (got {value})", u32::MAX)))
}

/// `replicas` (nodes that keep a region, 0 for the cluster's default) and `replica_lag` (seconds its standby may
/// be behind; `None` for the cluster's default).
pub fn replication(replicas: i64, replica_lag: Option<f64>) -> PyResult<vfabric::agent::Replication> {
    let most = vfabric::config::MAX_REPLICAS;
    let replicas = u8::try_from(replicas)
        .ok()
        .filter(|&r| r <= most)
        .ok_or_else(|| value_error(format!("replicas must be in 0..={most} (got {replicas})")))?;
    let lag = match replica_lag {
        None => None,
        Some(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => Some(std::time::Duration::from_secs_f64(s)),
        Some(s) => return Err(value_error(format!("replica_lag must be seconds between 0 and 86400 (got {s})"))),
    };
    Ok(vfabric::agent::Replication { replicas, lag })
}
