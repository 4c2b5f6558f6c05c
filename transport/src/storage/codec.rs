//! Packing pages for the storage tier: an LZ4 block, kept only when it saves at least one block of the file
//! (so an incompressible page is written as it is, after a probe of its first block).

use vfabric_allocator::Compression;

use super::buffer::DIRECT_ALIGN;

/// How much of a page is compressed first to tell whether the rest is worth it.
const PROBE: usize = DIRECT_ALIGN;

/// Packs pages the way the tier stores them; holds the scratch memory LZ4 writes into (a buffer of its
/// worst-case size, larger than a page), reused from page to page.
#[derive(Default)]
pub struct Packer {
    scratch: Vec<u8>,
}

impl Packer {
    /// Packs `page` with `compression`: the packed bytes when they take at least one block less than the page
    /// (rounded up to blocks, as O_DIRECT writes them), `None` to store the page as it is.
    pub fn pack(&mut self, compression: Compression, page: &[u8]) -> Option<&[u8]> {
        match compression {
            Compression::None => None,
            Compression::Lz4 => {
                let need = lz4_flex::block::get_maximum_output_size(page.len());
                if self.scratch.len() < need {
                    self.scratch.resize(need, 0);
                }
                // Data that does not shrink in its first block (bf16 weights, random bytes) is stored as it is
                // for the cost of compressing that block, not the page.
                if page.len() >= 4 * PROBE {
                    let n = lz4_flex::block::compress_into(&page[..PROBE], &mut self.scratch).ok()?;
                    if n * 8 > PROBE * 7 {
                        return None;
                    }
                }
                let n = lz4_flex::block::compress_into(page, &mut self.scratch).ok()?;
                (blocks(n) < page.len()).then(|| &self.scratch[..n])
            }
        }
    }
}

/// Unpacks `packed` into `page`; whether it filled the page exactly (anything else is a corrupt slot).
pub fn unpack(packed: &[u8], page: &mut [u8]) -> bool {
    matches!(lz4_flex::block::decompress_into(packed, page), Ok(n) if n == page.len())
}

/// `n` bytes rounded up to whole O_DIRECT blocks.
pub(super) fn blocks(n: usize) -> usize {
    n.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn compressible_pages_pack_and_unpack() {
        let mut page = vec![0u8; 64 << 10];
        page[1000..1100].copy_from_slice(&noise(100, 3));
        let mut p = Packer::default();
        let packed = p.pack(Compression::Lz4, &page).expect("zeros shrink").to_vec();
        assert!(blocks(packed.len()) <= DIRECT_ALIGN);
        let mut back = vec![0xFFu8; page.len()];
        assert!(unpack(&packed, &mut back));
        assert_eq!(back, page);
    }

    #[test]
    fn incompressible_pages_stay_raw() {
        let page = noise(64 << 10, 7);
        let mut p = Packer::default();
        assert!(p.pack(Compression::Lz4, &page).is_none());
        assert!(p.pack(Compression::None, &vec![0u8; 64 << 10]).is_none());
        // Compressible at the start only: the probe passes, the page as a whole saves no block.
        let mut tail = noise(64 << 10, 9);
        tail[..PROBE].fill(0);
        assert!(p.pack(Compression::Lz4, &tail).is_none());
    }

    #[test]
    fn corrupt_or_short_packed_bytes_are_refused() {
        let page = vec![7u8; 64 << 10];
        let mut p = Packer::default();
        let packed = p.pack(Compression::Lz4, &page).expect("shrinks").to_vec();
        let mut back = vec![0u8; page.len()];
        assert!(!unpack(&packed[..packed.len() / 2], &mut back));
        assert!(!unpack(&noise(300, 5), &mut back));
        let mut small = vec![0u8; page.len() / 2];
        assert!(!unpack(&packed, &mut small));
    }
}
