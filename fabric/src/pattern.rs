//! Data that shows where every byte came from: what the demo, the benchmarks and the tests write and check.
//!
//! Each 8-byte word is a hash of its offset in the source arena and a seed, so a page that lands in the wrong
//! frame, a half-copied page or a stale one differs from what is expected, and zeros never pass.

/// The word at byte offset `offset` (a multiple of 8) of data written with `seed`.
pub fn word(seed: u64, offset: u64) -> u64 {
    // splitmix64 of the offset: cheap, and no two nearby offsets give related values.
    let mut z = seed ^ offset.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern for the bytes at `offset..offset+buf.len()` (`offset` and the length are
/// multiples of 8).
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    for (i, chunk) in buf.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&word(seed, offset + 8 * i as u64).to_le_bytes());
    }
}

/// The pattern for `len` bytes at `offset`.
pub fn bytes(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(seed, offset, &mut v);
    v
}

/// Bytes like bf16 weights, `len` of them (a multiple of 8): every second byte (a value's high one, its sign
/// and exponent) one of four values, the others the pattern's. Dense data in which LZ4 finds no repeats and
/// zstd, coding the skew, saves a fifth.
pub fn skewed(seed: u64, len: usize) -> Vec<u8> {
    let mut v = bytes(seed, 0, len);
    for high in v.iter_mut().skip(1).step_by(2) {
        *high = 0x3c + (*high & 3);
    }
    v
}

/// The first byte offset where `got` differs from the pattern of `offset..`, if any.
pub fn first_mismatch(seed: u64, offset: u64, got: &[u8]) -> Option<usize> {
    got.chunks_exact(8)
        .enumerate()
        .find(|(i, c)| **c != word(seed, offset + 8 * *i as u64).to_le_bytes())
        .map(|(i, _)| i * 8)
}

/// A deterministic shuffle of `0..n` (Fisher-Yates over xorshift64): "scattered" frames that are the same on
/// every run, so a failing case can be run again.
pub fn shuffled(n: u32, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_detects_misplaced_data() {
        let a = bytes(1, 0, 64);
        assert_eq!(first_mismatch(1, 0, &a), None);
        assert_eq!(first_mismatch(1, 8, &a), Some(0));
        assert_eq!(first_mismatch(2, 0, &a), Some(0));
        assert_eq!(first_mismatch(1, 0, &[0u8; 64]), Some(0));
    }

    #[test]
    fn shuffles_are_permutations() {
        let mut s = shuffled(1000, 7);
        assert_ne!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!(shuffled(1000, 7), s);
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
    }
}
