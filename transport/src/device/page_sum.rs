//! Page checksums that a GPU computes where the page is (the `vf_page_sums` kernel of `kernels/page_sum.cu`) and
//! the CPU checks against: pages that cross a wire GPU to GPU (NCCL) are summed at both ends without leaving
//! device memory.
//!
//! Word `i` of a page (8 bytes, little-endian) counts `mix(w + (i + 1) * GOLDEN)`, `mix` being splitmix64's
//! finalizer, and the page's sum is the wrapping sum of its words' counts. A sum is indifferent to the order it is
//! added in (what lets every thread of the kernel add its part at once), while the word's position inside the mix
//! makes a moved, swapped or changed word change it.

/// The multiplier that gives each word's position its weight.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's finalizer.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The sum of one page; `page.len()` must be a multiple of 16 bytes (the kernel reads 16 at a time), as every
/// page size of the fabric is. Bytes past the last whole 16 are not counted.
pub fn page_sum(page: &[u8]) -> u64 {
    let whole = page.len() / 16 * 16;
    page[..whole].chunks_exact(8).enumerate().fold(0u64, |acc, (i, w)| {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        acc.wrapping_add(mix(w.wrapping_add((i as u64 + 1).wrapping_mul(GOLDEN))))
    })
}

/// The first page whose sum differs between `expected` and `got` (same length), if any.
pub fn first_mismatch(expected: &[u64], got: &[u64]) -> Option<usize> {
    if expected.len() != got.len() {
        return Some(expected.len().min(got.len()));
    }
    expected.iter().zip(got).position(|(a, b)| a != b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_changed_moved_or_swapped_word_changes_the_sum() {
        let page: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let sum = page_sum(&page);
        assert_eq!(sum, page_sum(&page.clone()), "the same bytes give the same sum");
        let mut flipped = page.clone();
        flipped[40_000] ^= 1;
        assert_ne!(page_sum(&flipped), sum, "one bit");
        let mut swapped = page.clone();
        let (a, b) = (swapped[..8].to_vec(), swapped[8..16].to_vec());
        swapped[..8].copy_from_slice(&b);
        swapped[8..16].copy_from_slice(&a);
        assert_ne!(page_sum(&swapped), sum, "two words swapped");
        // Zeros sum to something else than nothing: a page that never arrived (zeros) does not pass for one.
        assert_ne!(page_sum(&[0u8; 4096]), 0);
        assert_ne!(page_sum(&[0u8; 4096]), page_sum(&[0u8; 8192]), "a page of zeros of another length");
    }

    #[test]
    fn mismatches_are_found_by_page() {
        assert_eq!(first_mismatch(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_mismatch(&[1, 2, 3], &[1, 5, 3]), Some(1));
        assert_eq!(first_mismatch(&[1, 2, 3], &[1, 2]), Some(2));
    }
}
