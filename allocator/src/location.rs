//! Where memory lives on one node.

use serde::{Deserialize, Serialize};

/// A memory location of one node: one of its GPUs, its pinned host memory, or its storage tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Location {
    /// GPU `n` of the node, numbered as the driver numbers them (CUDA ordinal).
    Gpu(u16),
    /// Pinned host memory, mapped for every GPU of the node.
    Host,
    /// The storage tier below host memory (a file on an NVMe drive): pages evicted from host memory go there.
    /// It holds pages, not leases: nothing computes on it, and pages come back through host memory.
    Storage,
}

impl Location {
    /// The GPU index, if this is a GPU.
    pub fn gpu(self) -> Option<u16> {
        match self {
            Location::Gpu(g) => Some(g),
            Location::Host | Location::Storage => None,
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Gpu(g) => write!(f, "gpu{g}"),
            Location::Host => f.write_str("host"),
            Location::Storage => f.write_str("storage"),
        }
    }
}

/// A string that names no location (see [`Location`]'s `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a location: use gpuN, N, host or storage")]
pub struct ParseLocationError(pub String);

impl std::str::FromStr for Location {
    type Err = ParseLocationError;
    /// Parses `gpu0`, `gpu1`, ..., `0`, `1`, ..., `host` / `h` and `storage` / `nvme`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        if t == "host" || t == "h" {
            return Ok(Location::Host);
        }
        if t == "storage" || t == "nvme" {
            return Ok(Location::Storage);
        }
        let digits = t.strip_prefix("gpu").unwrap_or(&t);
        digits.parse::<u16>().map(Location::Gpu).map_err(|_| ParseLocationError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("gpu1".parse::<Location>(), Ok(Location::Gpu(1)));
        assert_eq!("0".parse::<Location>(), Ok(Location::Gpu(0)));
        assert_eq!("Host".parse::<Location>(), Ok(Location::Host));
        assert_eq!("nvme".parse::<Location>(), Ok(Location::Storage));
        assert_eq!(Location::Storage.to_string(), "storage");
        assert_eq!("gpux".parse::<Location>(), Err(ParseLocationError("gpux".into())));
        assert_eq!(Location::Gpu(3).to_string(), "gpu3");
        assert_eq!(Location::Host.gpu(), None);
    }
}
