//! Byte sizes as people write them in configs and on command lines: `64KiB`, `2MiB`, `1GiB`, `8G`, `4096`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes, parsed from and printed with binary units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// Why a size did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a size: {reason} (write e.g. 4096, 64KiB, 2MiB, 1GiB)")]
pub struct ParseSizeError {
    input: String,
    reason: &'static str,
}

impl ByteSize {
    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = ParseSizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseSizeError { input: s.to_string(), reason };
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(err("no number"));
        }
        let n: u64 = num.parse().map_err(|_| err("number too large"))?;
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(err("unknown unit")),
        };
        n.checked_mul(1u64 << shift).map(ByteSize).ok_or_else(|| err("too large"))
    }
}

impl fmt::Display for ByteSize {
    /// Whole binary units when the size is a multiple of one (`2MiB`), otherwise two decimals (`1.50GiB`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        for (shift, name) in units {
            let unit = 1u64 << shift;
            if self.0 >= unit {
                return if self.0 % unit == 0 {
                    write!(f, "{}{name}", self.0 >> shift)
                } else {
                    write!(f, "{:.2}{name}", self.0 as f64 / unit as f64)
                };
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ByteSizeVisitor)
    }
}

/// Takes a byte count as a non-negative integer or a string such as "8GiB", and says which it wanted otherwise.
struct ByteSizeVisitor;

impl serde::de::Visitor<'_> for ByteSizeVisitor {
    type Value = ByteSize;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a size: bytes as a non-negative integer, or a string such as \"512MiB\" or \"8GiB\"")
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<ByteSize, E> {
        Ok(ByteSize(n))
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<ByteSize, E> {
        u64::try_from(n).map(ByteSize).map_err(|_| E::custom(format!("a size cannot be negative (got {n})")))
    }

    fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<ByteSize, E> {
        Err(E::custom(format!("a size is a whole number of bytes or a string such as \"1536MiB\" (got {x})")))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ByteSize, E> {
        s.parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("64KiB".parse(), Ok(ByteSize(64 << 10)));
        assert_eq!("2 MiB".parse(), Ok(ByteSize(2 << 20)));
        assert_eq!("8G".parse(), Ok(ByteSize(8 << 30)));
        assert_eq!("4096".parse(), Ok(ByteSize(4096)));
        assert!("1.5GiB".parse::<ByteSize>().is_err());
        assert!("GiB".parse::<ByteSize>().is_err());
        assert!("99999999999TiB".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(1 << 30).to_string(), "1GiB");
        assert_eq!(ByteSize(3 << 29).to_string(), "1.50GiB");
        assert_eq!(ByteSize(100).to_string(), "100B");
        assert_eq!("1GiB".parse::<ByteSize>().map(|b| b.to_string()), Ok("1GiB".to_string()));
    }
}
