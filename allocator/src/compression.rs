//! How a region's pages are stored when they leave the GPU: the name the directory, the storage tier and the
//! configuration share (the codecs themselves live with the I/O that runs them).

use serde::{Deserialize, Serialize};

/// Lossless compression of a region's pages on the storage tier. Off by default: a page is stored compressed
/// only when that saves at least one 4 KiB block, so incompressible data (bf16 weights) is stored as it is, at
/// the cost of one probe of its first block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Pages are stored as they are.
    #[default]
    None,
    /// LZ4 block compression (several GB/s per core each way): removes repeats (zeros, padding, masks).
    Lz4,
    /// zstd at level 1 (slower, a few hundred MB/s per core packing): also shrinks dense floating-point data a
    /// little, by coding its exponents' skew.
    Zstd,
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        })
    }
}

/// A string that names no compression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a compression: use none, lz4 or zstd")]
pub struct ParseCompressionError(pub String);

impl std::str::FromStr for Compression {
    type Err = ParseCompressionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "off" | "" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            _ => Err(ParseCompressionError(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
            assert_eq!(c.to_string().parse::<Compression>(), Ok(c));
        }
        assert_eq!("LZ4".parse::<Compression>(), Ok(Compression::Lz4));
        assert!("zip".parse::<Compression>().is_err());
    }
}
