//! Where memory lives on one node.

use serde::{Deserialize, Serialize};

/// A memory location of one node: one of its GPUs, or its pinned host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Location {
    /// GPU `n` of the node, numbered as the driver numbers them (CUDA ordinal).
    Gpu(u16),
    /// Pinned host memory, mapped for every GPU of the node.
    Host,
}

impl Location {
    /// The GPU index, if this is a GPU.
    pub fn gpu(self) -> Option<u16> {
        match self {
            Location::Gpu(g) => Some(g),
            Location::Host => None,
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Gpu(g) => write!(f, "gpu{g}"),
            Location::Host => f.write_str("host"),
        }
    }
}

/// A string that names no location (see [`Location`]'s `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a location: use gpuN, N or host")]
pub struct ParseLocationError(pub String);

impl std::str::FromStr for Location {
    type Err = ParseLocationError;
    /// Parses `gpu0`, `gpu1`, ..., `0`, `1`, ... and `host` / `h`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        if t == "host" || t == "h" {
            return Ok(Location::Host);
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
        assert_eq!("gpux".parse::<Location>(), Err(ParseLocationError("gpux".into())));
        assert_eq!(Location::Gpu(3).to_string(), "gpu3");
        assert_eq!(Location::Host.gpu(), None);
    }
}
