//! The compression figures of `vfabric-bench storage`: pages of several kinds of training data packed the way
//! the storage tier packs them (LZ4 or zstd, kept when it saves a 4 KiB block), with the ratio of page bytes to the
//! bytes stored, and pack and unpack speed on one core. Synthetic tensors shaped like a model's state, and any
//! raw tensors the caller dumps into a folder.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use vfabric_transport::storage::{unpack, Compression, Packer, DIRECT_ALIGN};

/// One kind of data, packed page by page.
#[derive(Debug, Clone, Serialize)]
pub struct CodecRow {
    /// What the pages hold.
    pub data: String,
    /// The codec.
    pub codec: String,
    /// Pages packed.
    pub pages: u64,
    /// Page bytes over the bytes the tier stores for them (whole blocks of packed pages, raw pages whole).
    pub ratio: f64,
    /// Share of pages stored packed.
    pub packed_share: f64,
    /// Page bytes packed per second on one core, GB/s (a page stored raw costs its probe).
    pub pack_gb_s: f64,
    /// Page bytes unpacked per second on one core, GB/s (over the packed pages only; none: 0).
    pub unpack_gb_s: f64,
    /// Pages that did not unpack to what was packed.
    pub bad_pages: u64,
}

/// A small, fast generator (xorshift64*): the data's values, not its randomness, is what is measured.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A standard normal sample (Box-Muller).
    fn normal(&mut self) -> f32 {
        let u1 = ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

fn bf16(x: f32) -> [u8; 2] {
    // Round to nearest even, as PyTorch's conversion does.
    let b = x.to_bits();
    let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1));
    ((r >> 16) as u16).to_le_bytes()
}

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// `len` bytes of the synthetic kind `kind` (see [`SYNTHETIC`]).
pub fn synthetic(kind: &str, len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        match kind {
            "bf16 weights, N(0, 0.02)" => out.extend_from_slice(&bf16(rng.normal() * 0.02)),
            "bf16 activations, GELU(N(0, 1))" => out.extend_from_slice(&bf16(gelu(rng.normal()))),
            "fp32 Adam first moment, N(0, 1e-4)" => out.extend_from_slice(&(rng.normal() * 1e-4).to_le_bytes()),
            "fp32 Adam second moment, (N(0, 1e-3))^2" => {
                let g = rng.normal() * 1e-3;
                out.extend_from_slice(&(g * g).to_le_bytes())
            }
            "zeros" => out.extend_from_slice(&0u64.to_le_bytes()),
            "sparse: zeros, a number every 4 KiB" => {
                let at = out.len();
                out.extend_from_slice(&(if at % 4096 == 0 { (at as u64) | 1 } else { 0 }).to_le_bytes())
            }
            _ => out.extend_from_slice(&rng.next().to_le_bytes()),
        }
    }
    out.truncate(len);
    out
}

/// The codecs measured.
pub const CODECS: [Compression; 2] = [Compression::Lz4, Compression::Zstd];

/// The synthetic kinds, from least to most compressible.
pub const SYNTHETIC: [&str; 6] = [
    "random bytes",
    "bf16 weights, N(0, 0.02)",
    "fp32 Adam first moment, N(0, 1e-4)",
    "fp32 Adam second moment, (N(0, 1e-3))^2",
    "bf16 activations, GELU(N(0, 1))",
    "sparse: zeros, a number every 4 KiB",
];

/// Packs and unpacks `data` page by page with `codec` (a last partial page is left out).
pub fn measure(name: &str, data: &[u8], page_size: usize, codec: Compression) -> CodecRow {
    let mut packer = Packer::default();
    let pages: Vec<&[u8]> = data.chunks_exact(page_size).collect();
    let t = Instant::now();
    let mut packed: Vec<Option<Vec<u8>>> = Vec::with_capacity(pages.len());
    for p in &pages {
        packed.push(packer.pack(codec, p).map(<[u8]>::to_vec));
    }
    let pack_s = t.elapsed().as_secs_f64();
    let stored: u64 = packed
        .iter()
        .map(|p| p.as_ref().map_or(page_size, |b| b.len().div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN) as u64)
        .sum();
    let mut out = vec![0u8; page_size];
    let (mut unpack_s, mut unpacked, mut bad) = (0.0, 0u64, 0u64);
    for (p, b) in pages.iter().zip(&packed) {
        let Some(b) = b else { continue };
        let t = Instant::now();
        let ok = unpack(codec, b, &mut out);
        unpack_s += t.elapsed().as_secs_f64();
        unpacked += page_size as u64;
        if !ok || out[..] != p[..] {
            bad += 1;
        }
    }
    let bytes = (pages.len() * page_size) as u64;
    CodecRow {
        data: name.to_owned(),
        codec: codec.to_string(),
        pages: pages.len() as u64,
        ratio: if stored == 0 { 1.0 } else { bytes as f64 / stored as f64 },
        packed_share: packed.iter().filter(|p| p.is_some()).count() as f64 / pages.len().max(1) as f64,
        pack_gb_s: bytes as f64 / pack_s.max(1e-9) / 1e9,
        unpack_gb_s: if unpacked == 0 { 0.0 } else { unpacked as f64 / unpack_s.max(1e-9) / 1e9 },
        bad_pages: bad,
    }
}

/// The files of `dir` as (name, up to `limit` bytes), in name order.
pub fn tensors(dir: &Path, limit: usize) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|p| {
            let mut data = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            data.truncate(limit);
            Ok((p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), data))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_pack_as_their_values_say() {
        let ps = 64 << 10;
        for codec in CODECS {
            let random = measure("random", &synthetic(SYNTHETIC[0], 16 * ps, 1), ps, codec);
            assert_eq!((random.ratio, random.packed_share, random.bad_pages), (1.0, 0.0, 0));
            let sparse = measure("sparse", &synthetic(SYNTHETIC[5], 16 * ps, 1), ps, codec);
            assert!(sparse.ratio > 8.0 && sparse.bad_pages == 0, "{sparse:?}");
        }
        let w = synthetic(SYNTHETIC[1], 4096, 3);
        // bf16 of N(0, 0.02): the high byte is a sign and an exponent near 2^-6.
        assert!(w.chunks(2).all(|b| (b[1] & 0x7F) < 0x40), "weights are small");
    }
}
