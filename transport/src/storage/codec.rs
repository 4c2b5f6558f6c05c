//! Packing pages for the storage tier: an LZ4 block or a zstd frame, kept only when it saves at least one block
//! of the file (so an incompressible page is written as it is, after a probe of its first block).

use vfabric_allocator::Compression;

use super::buffer::DIRECT_ALIGN;

/// How much of a page is compressed first to tell whether the rest is worth it.
const PROBE: usize = DIRECT_ALIGN;

/// The zstd level pages are packed at: the fastest of the ordinary levels.
const ZSTD_LEVEL: i32 = 1;

/// Packs pages the way the tier stores them; holds the scratch memory and the zstd context it reuses from
/// page to page.
#[derive(Default)]
pub struct Packer {
    scratch: Vec<u8>,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

impl Packer {
    /// Packs `page` with `compression`: the packed bytes when they take at least one block less than the page
    /// (rounded up to blocks, as O_DIRECT writes them), `None` to store the page as it is.
    pub fn pack(&mut self, compression: Compression, page: &[u8]) -> Option<&[u8]> {
        let room = page.len().checked_sub(DIRECT_ALIGN)?;
        let n = match compression {
            // Lossy pages arrive packed by the GPU: the file stores their packed length as it is.
            _ if compression.is_lossy() => return None,
            Compression::None => return None,
            Compression::Lz4 => {
                // LZ4 writes into a buffer of its worst-case size, larger than a page.
                let need = lz4_flex::block::get_maximum_output_size(page.len());
                if self.scratch.len() < need {
                    self.scratch.resize(need, 0);
                }
                // Data that does not shrink in its first block (bf16 weights, random bytes) is stored as it is
                // for the cost of compressing that block, not the page.
                if !self.worth_packing(compression, page) {
                    return None;
                }
                lz4_flex::block::compress_into(page, &mut self.scratch).ok()?
            }
            _ => {
                if self.zstd.is_none() {
                    self.zstd = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?);
                }
                if self.scratch.len() < page.len() {
                    self.scratch.resize(page.len(), 0);
                }
                if !self.worth_packing(compression, page) {
                    return None;
                }
                // Into at most the page less a block: what does not fit there is not worth storing packed.
                self.zstd.as_mut()?.compress_to_buffer(page, &mut self.scratch[..room]).ok()?
            }
        };
        (blocks(n) < page.len()).then(|| &self.scratch[..n])
    }

    /// Whether `page` is worth packing with a lossless `compression`: its first block shrinks by an eighth
    /// (LZ4) or a sixteenth (zstd, which shrinks dense floats by a little). Pages under four blocks always are.
    /// The cost of one block's compression, so that data that does not shrink (bf16 weights, random bytes) is
    /// told at once; [`Packer::pack`] asks it first.
    pub fn worth_packing(&mut self, compression: Compression, page: &[u8]) -> bool {
        if page.len() < 4 * PROBE {
            return true;
        }
        if self.scratch.len() < lz4_flex::block::get_maximum_output_size(PROBE) {
            self.scratch.resize(lz4_flex::block::get_maximum_output_size(PROBE), 0);
        }
        let probe = &page[..PROBE];
        match compression {
            Compression::Lz4 => {
                lz4_flex::block::compress_into(probe, &mut self.scratch).is_ok_and(|n| n * 8 <= PROBE * 7)
            }
            Compression::Zstd => {
                if self.zstd.is_none() {
                    self.zstd = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
                }
                let Some(z) = self.zstd.as_mut() else { return false };
                z.compress_to_buffer(probe, &mut self.scratch[..PROBE]).is_ok_and(|n| n * 16 <= PROBE * 15)
            }
            _ => false,
        }
    }
}

/// Unpacks `packed` (packed with `compression`) into `page`; whether it filled the page exactly (anything else
/// is a corrupt slot).
pub fn unpack(compression: Compression, packed: &[u8], page: &mut [u8]) -> bool {
    match compression {
        Compression::Lz4 => matches!(lz4_flex::block::decompress_into(packed, page), Ok(n) if n == page.len()),
        Compression::Zstd => matches!(zstd::bulk::decompress_to_buffer(packed, page), Ok(n) if n == page.len()),
        _ => false,
    }
}

/// `n` bytes rounded up to whole O_DIRECT blocks.
pub(super) fn blocks(n: usize) -> usize {
    n.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODECS: [Compression; 2] = [Compression::Lz4, Compression::Zstd];

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
        for c in CODECS {
            let packed = p.pack(c, &page).expect("zeros shrink").to_vec();
            assert!(blocks(packed.len()) <= DIRECT_ALIGN, "{c}");
            let mut back = vec![0xFFu8; page.len()];
            assert!(unpack(c, &packed, &mut back), "{c}");
            assert_eq!(back, page, "{c}");
        }
    }

    #[test]
    fn incompressible_pages_stay_raw() {
        let page = noise(64 << 10, 7);
        let mut p = Packer::default();
        for c in CODECS {
            assert!(p.pack(c, &page).is_none(), "{c}");
            // Compressible at the start only: the probe passes, the page as a whole saves no block.
            let mut tail = noise(64 << 10, 9);
            tail[..PROBE].fill(0);
            assert!(p.pack(c, &tail).is_none(), "{c}");
        }
        assert!(p.pack(Compression::None, &vec![0u8; 64 << 10]).is_none());
    }

    #[test]
    fn corrupt_or_short_packed_bytes_are_refused() {
        let page = vec![7u8; 64 << 10];
        let mut p = Packer::default();
        for c in CODECS {
            let packed = p.pack(c, &page).expect("shrinks").to_vec();
            let mut back = vec![0u8; page.len()];
            assert!(!unpack(c, &packed[..packed.len() / 2], &mut back), "{c}");
            assert!(!unpack(c, &noise(300, 5), &mut back), "{c}");
            let mut small = vec![0u8; page.len() / 2];
            assert!(!unpack(c, &packed, &mut small), "{c}");
            assert!(!unpack(Compression::None, &packed, &mut back));
        }
    }
}
