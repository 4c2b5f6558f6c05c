//! How a region's pages are stored when they leave the GPU: the names the directory, the device layer, the
//! storage tier and the configuration share (the codecs themselves live with the I/O that runs them).

use serde::{Deserialize, Serialize};

/// How a region's pages are packed when they leave the GPU. Off by default.
///
/// - Lossless (`Lz4`, `Zstd`): pages are stored packed on the storage tier only, and only when that saves at
///   least one 4 KiB block, so incompressible data (bf16 weights) is stored as it is, at the cost of one probe of
///   its first block.
/// - Lossy (`Fp8*`, `Int8*`): the region declares its pages an array of bf16 or fp32 values. A page leaving the
///   GPU is packed there by a kernel into one-byte codes with one fp32 scale per group of
///   [`LOSSY_GROUP`] values, and stays packed in host memory and on the storage tier; it is expanded on its way
///   back to a GPU. Values change: [`Lossy::error_bound`] says by how much at most. Such a region is leased
///   only on its home node's GPUs (a lease in host memory would see codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Compression {
    /// Pages are stored as they are.
    #[default]
    #[serde(rename = "none")]
    None,
    /// LZ4 block compression (several GB/s per core each way): removes repeats (zeros, padding, masks).
    #[serde(rename = "lz4")]
    Lz4,
    /// zstd at level 1 (slower, a few hundred MB/s per core packing): also shrinks dense floating-point data a
    /// little, by coding its exponents' skew.
    #[serde(rename = "zstd")]
    Zstd,
    /// bf16 values as fp8 (e4m3) codes: 1.97x smaller.
    #[serde(rename = "fp8-bf16")]
    Fp8Bf16,
    /// fp32 values as fp8 (e4m3) codes: 3.94x smaller.
    #[serde(rename = "fp8-f32")]
    Fp8F32,
    /// bf16 values as int8 codes: 1.97x smaller.
    #[serde(rename = "int8-bf16")]
    Int8Bf16,
    /// fp32 values as int8 codes: 3.94x smaller.
    #[serde(rename = "int8-f32")]
    Int8F32,
}

/// Every compression, in the order of its wire number ([`Compression::number`]).
pub const COMPRESSIONS: [Compression; 7] = [
    Compression::None,
    Compression::Lz4,
    Compression::Zstd,
    Compression::Fp8Bf16,
    Compression::Fp8F32,
    Compression::Int8Bf16,
    Compression::Int8F32,
];

/// Bytes of a block of the compressed tier ([`crate::Location::Compressed`]): a page compressed there takes a
/// run of blocks as long as its packed form, so a page must save at least one to go there.
pub const COMPRESSED_BLOCK: u64 = 4096;

/// Values per scale in a lossy page.
pub const LOSSY_GROUP: usize = 256;

/// A group whose largest magnitude is at most this (2^-100) is stored as zeros: scaling values that small to
/// the codes' range would overflow fp32.
pub const LOSSY_TINY: f32 = f32::from_bits(0x0d80_0000);

/// The one-byte codes of a lossy compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossyCode {
    /// fp8 e4m3 (largest value 448): about two significant decimal digits at any magnitude within a group.
    Fp8E4m3,
    /// int8 (-127..=127): a uniform step of a group's largest magnitude over 127.
    Int8,
}

/// The values a lossy region's pages hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Element {
    /// bfloat16.
    Bf16,
    /// IEEE fp32.
    F32,
}

impl Element {
    /// Bytes a value takes.
    pub fn bytes(self) -> usize {
        match self {
            Element::Bf16 => 2,
            Element::F32 => 4,
        }
    }
}

/// Bytes of one slot of a packed tier ([`crate::Location::Packed`]) that holds pages of `page_bytes` of
/// `element` values: the longest packed page of those values (a byte per value and a scale per group: 0.508 of
/// a bf16 page, 0.254 of a fp32 one), rounded up to whole 4 KiB blocks so that each slot can be written to and
/// read from the storage tier directly. A tier of bf16 slots also holds fp32 pages (in half a slot each).
pub fn packed_slot_len(page_bytes: u64, element: Element) -> u64 {
    const BLOCK: u64 = 4096;
    let longest = Lossy { code: LossyCode::Int8, element }.packed_len(page_bytes);
    longest.div_ceil(BLOCK) * BLOCK
}

/// A lossy compression: its codes and the values it packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lossy {
    /// The codes.
    pub code: LossyCode,
    /// The values.
    pub element: Element,
}

impl Lossy {
    /// The largest code's value: a group's largest magnitude is scaled to it.
    pub fn top(self) -> f32 {
        match self.code {
            LossyCode::Fp8E4m3 => 448.0,
            LossyCode::Int8 => 127.0,
        }
    }

    /// Whether pages of `page_bytes` can be packed: whole groups of values.
    pub fn fits(self, page_bytes: u64) -> bool {
        page_bytes > 0 && page_bytes % (LOSSY_GROUP * self.element.bytes()) as u64 == 0
    }

    /// Bytes a packed page of `page_bytes` takes: a code per value, then a fp32 scale per group.
    pub fn packed_len(self, page_bytes: u64) -> u64 {
        let n = page_bytes / self.element.bytes() as u64;
        n + 4 * n.div_ceil(LOSSY_GROUP as u64)
    }

    /// The most a value `x` of a group whose largest magnitude is `group_max` may change through one packing
    /// and expanding (rounding to the element type on the way back included): for fp8, half a step of e4m3
    /// (1/16 of the value) or, below e4m3's normal range, half its smallest step (`group_max` / 448 x 2^-10);
    /// for int8, half a step (`group_max` / 254); a group whose largest magnitude is at most [`LOSSY_TINY`]
    /// comes back as zeros. A host write into part of a group packs the group's other values once more, with
    /// the group's new scale: their error can reach this bound again.
    ///
    /// Values that are not finite are not kept: with fp8 a NaN stays NaN, with int8 it comes back as the
    /// group's largest negative value; an infinity makes the rest of its group NaN.
    pub fn error_bound(self, x: f32, group_max: f32) -> f32 {
        if group_max <= LOSSY_TINY {
            return group_max;
        }
        let scale = group_max / self.top();
        // Rounding the expanded value to bf16 adds half of bf16's step (2^-8 of the value); fp32 adds nothing
        // worth naming, but float rounding of the scale itself adds a few of fp32's steps.
        let back = match self.element {
            Element::Bf16 => 2f32.powi(-8) * (x.abs() + scale * self.top() / 16.0),
            Element::F32 => 1e-6 * group_max,
        };
        let code = match self.code {
            LossyCode::Fp8E4m3 => x.abs() / 16.0 + scale * 2f32.powi(-10),
            LossyCode::Int8 => scale / 2.0,
        };
        (code + back) * (1.0 + 1e-5)
    }
}

impl Compression {
    /// Its lossy form, if it is lossy.
    pub fn lossy(self) -> Option<Lossy> {
        let (code, element) = match self {
            Compression::Fp8Bf16 => (LossyCode::Fp8E4m3, Element::Bf16),
            Compression::Fp8F32 => (LossyCode::Fp8E4m3, Element::F32),
            Compression::Int8Bf16 => (LossyCode::Int8, Element::Bf16),
            Compression::Int8F32 => (LossyCode::Int8, Element::F32),
            Compression::None | Compression::Lz4 | Compression::Zstd => return None,
        };
        Some(Lossy { code, element })
    }

    /// Whether pages change through it.
    pub fn is_lossy(self) -> bool {
        self.lossy().is_some()
    }

    /// Whether it packs pages without changing them (`lz4`, `zstd`).
    pub fn is_lossless(self) -> bool {
        matches!(self, Compression::Lz4 | Compression::Zstd)
    }

    /// Its number on the wire.
    pub fn number(self) -> u8 {
        COMPRESSIONS.iter().position(|c| *c == self).unwrap_or(0) as u8
    }

    /// The compression numbered `n` on the wire.
    pub fn from_number(n: u8) -> Option<Compression> {
        COMPRESSIONS.get(usize::from(n)).copied()
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Fp8Bf16 => "fp8-bf16",
            Compression::Fp8F32 => "fp8-f32",
            Compression::Int8Bf16 => "int8-bf16",
            Compression::Int8F32 => "int8-f32",
        })
    }
}

/// A string that names no compression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a compression: use none, lz4, zstd, fp8-bf16, fp8-f32, int8-bf16 or int8-f32")]
pub struct ParseCompressionError(pub String);

impl std::str::FromStr for Compression {
    type Err = ParseCompressionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.to_ascii_lowercase();
        if matches!(s.as_str(), "off" | "") {
            return Ok(Compression::None);
        }
        COMPRESSIONS.iter().find(|c| c.to_string() == s).copied().ok_or(ParseCompressionError(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_round_trip() {
        for c in COMPRESSIONS {
            assert_eq!(c.to_string().parse::<Compression>(), Ok(c));
            assert_eq!(Compression::from_number(c.number()), Some(c));
        }
        assert_eq!("LZ4".parse::<Compression>(), Ok(Compression::Lz4));
        assert_eq!("off".parse::<Compression>(), Ok(Compression::None));
        assert!("zip".parse::<Compression>().is_err());
        assert_eq!(Compression::from_number(COMPRESSIONS.len() as u8), None);
    }

    #[test]
    fn lossy_pages_shrink_by_their_declared_ratio() {
        let fp8 = Compression::Fp8Bf16.lossy().unwrap();
        assert_eq!(fp8.packed_len(2 << 20), (1 << 20) + (16 << 10));
        assert!((2u64 << 20) as f64 / fp8.packed_len(2 << 20) as f64 >= 1.9);
        let int8 = Compression::Int8F32.lossy().unwrap();
        assert_eq!(int8.packed_len(64 << 10), (16 << 10) + 256);
        assert!(fp8.fits(64 << 10) && !fp8.fits(1000) && !fp8.fits(0));
        assert!(Compression::Zstd.lossy().is_none() && !Compression::None.is_lossy());
    }

    #[test]
    fn slots_hold_the_longest_packed_page_of_their_values_in_whole_blocks() {
        assert_eq!(packed_slot_len(2 << 20, Element::Bf16), (1 << 20) + (16 << 10));
        assert_eq!(packed_slot_len(2 << 20, Element::F32), (512 << 10) + (8 << 10));
        // 16 KiB of codes and 256 bytes of scales take five blocks.
        assert_eq!(packed_slot_len(64 << 10, Element::F32), 20 << 10);
        for c in COMPRESSIONS.iter().filter_map(|c| c.lossy()) {
            assert!(c.packed_len(2 << 20) <= packed_slot_len(2 << 20, c.element), "{c:?}");
        }
    }
}
