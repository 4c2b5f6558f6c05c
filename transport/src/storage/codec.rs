//! Packing pages for the storage tier: an LZ4 block or a zstd frame, kept only when it saves at least one block
//! of the file (so an incompressible page is written as it is, after a probe of its first block).
//!
//! A page of one byte repeated (a page of zeros, the commonest) packs to that byte alone, whatever the codec:
//! LZ4 would pack it well but expand it slowly (a match one byte back, copied a byte at a time: under 0.5 GB/s
//! a core, where filling a page runs at memory speed), and no one-byte LZ4 block or zstd frame stands for a page
//! (the one-byte LZ4 block, `[0]`, stands for no bytes), so the two never meet.

use std::sync::OnceLock;

use vfabric_allocator::Compression;

use super::buffer::DIRECT_ALIGN;

/// How much of a page is compressed first to tell whether the rest is worth it.
const PROBE: usize = DIRECT_ALIGN;

/// The zstd level pages are packed at: the fastest of the ordinary levels.
const ZSTD_LEVEL: i32 = 1;

/// Most threads one call packs or unpacks its pages on.
const MOST_THREADS: usize = 8;

/// Threads to pack or unpack `pages` pages of one call on: one for a couple of pages (a thread costs more than
/// it saves there), else as many as there are pages, up to the cores and [`MOST_THREADS`]. The cores are asked
/// once: asking reads cgroup files, too slow for every call.
pub(super) fn threads(pages: usize) -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    if pages <= 2 {
        return 1;
    }
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    pages.min(cores).clamp(1, MOST_THREADS)
}

/// Packs pages the way the tier stores them, and unpacks them; holds the scratch memory and the zstd contexts
/// it reuses from page to page.
#[derive(Default)]
pub struct Packer {
    scratch: Vec<u8>,
    zstd: Option<zstd::bulk::Compressor<'static>>,
    unzstd: Option<zstd::bulk::Decompressor<'static>>,
}

impl Packer {
    /// Packs `page` with `compression`: the packed bytes when they take at least one block less than the page
    /// (rounded up to blocks, as O_DIRECT writes them), `None` to store the page as it is.
    pub fn pack(&mut self, compression: Compression, page: &[u8]) -> Option<&[u8]> {
        let room = page.len().checked_sub(DIRECT_ALIGN)?;
        // Lossy pages arrive packed by the GPU: the file stores their packed length as it is.
        // Data that does not shrink in its first block (bf16 weights, random bytes) is stored as it is for the
        // cost of compressing that block, not the page.
        if !compression.is_lossless() || !self.worth_packing(compression, page) {
            return None;
        }
        if let Some(b) = uniform(page) {
            self.scratch.resize(self.scratch.len().max(1), 0);
            self.scratch[0] = b;
            return (blocks(1) < page.len()).then(|| &self.scratch[..1]);
        }
        let n = match compression {
            Compression::Lz4 => {
                // LZ4 writes into a buffer of its worst-case size, larger than a page.
                let need = lz4_flex::block::get_maximum_output_size(page.len());
                if self.scratch.len() < need {
                    self.scratch.resize(need, 0);
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
                // Into at most the page less a block: what does not fit there is not worth storing packed.
                self.zstd.as_mut()?.compress_to_buffer(page, &mut self.scratch[..room]).ok()?
            }
        };
        (blocks(n) < page.len()).then(|| &self.scratch[..n])
    }

    /// [`unpack`], reusing this packer's zstd context instead of making one for the page.
    pub fn unpack(&mut self, compression: Compression, packed: &[u8], page: &mut [u8]) -> bool {
        if compression != Compression::Zstd || packed.len() == 1 {
            return unpack(compression, packed, page);
        }
        if self.unzstd.is_none() {
            self.unzstd = zstd::bulk::Decompressor::new().ok();
        }
        match self.unzstd.as_mut() {
            Some(z) => matches!(z.decompress_to_buffer(packed, page), Ok(n) if n == page.len()),
            None => unpack(compression, packed, page),
        }
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

/// The byte `bytes` repeat, when they are one byte repeated (and not empty). Compared a block at a time (a
/// `memcmp`), stopping at the first block that differs: data whose first block differs costs one comparison.
pub fn uniform(bytes: &[u8]) -> Option<u8> {
    let b = *bytes.first()?;
    let block = [b; PROBE];
    bytes.chunks(PROBE).all(|c| c == &block[..c.len()]).then_some(b)
}

/// Unpacks `packed` (packed with `compression`) into `page`; whether it filled the page exactly (anything else
/// is a corrupt slot). One byte fills any page with itself: callers check the packed bytes' checksum first, as
/// a changed length or byte is caught there.
pub fn unpack(compression: Compression, packed: &[u8], page: &mut [u8]) -> bool {
    if let ([b], true) = (packed, compression.is_lossless()) {
        page.fill(*b);
        return true;
    }
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
            // The same through the packer's own context, twice (the context is reused).
            for _ in 0..2 {
                back.fill(0xFF);
                assert!(p.unpack(c, &packed, &mut back) && back == page, "{c}");
            }
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
    fn a_page_of_one_byte_packs_to_that_byte() {
        let mut p = Packer::default();
        for c in CODECS {
            for (b, len) in [(0u8, 64 << 10), (0xA5, 2 << 20)] {
                let page = vec![b; len];
                assert_eq!(p.pack(c, &page), Some(&[b][..]), "{c}");
                let mut back = vec![!b; len];
                assert!(unpack(c, &[b], &mut back) && back == page, "{c}");
            }
            // One byte different, in the last block: packed by the codec, and back as it was.
            let mut page = vec![0u8; 64 << 10];
            page[(64 << 10) - 1] = 1;
            let packed = p.pack(c, &page).expect("shrinks").to_vec();
            assert!(packed.len() > 1, "{c}");
            let mut back = vec![0xFFu8; page.len()];
            assert!(unpack(c, &packed, &mut back) && back == page, "{c}");
        }
        // Too small to save a block, and no codec: left as it is.
        assert!(p.pack(Compression::Lz4, &[0u8; 4096]).is_none());
        assert!(!unpack(Compression::None, &[0], &mut [1u8; 4096]));
        assert_eq!((uniform(&[]), uniform(&[3, 3, 3]), uniform(&[3, 3, 4])), (None, Some(3), None));
    }

    #[test]
    fn a_couple_of_pages_stay_on_one_thread_and_more_never_exceed_the_cap() {
        assert_eq!((threads(0), threads(1), threads(2)), (1, 1, 1));
        for pages in [3, 9, 1000] {
            let t = threads(pages);
            assert!((1..=MOST_THREADS.min(pages)).contains(&t), "{pages}: {t}");
        }
    }

    #[test]
    fn corrupt_or_short_packed_bytes_are_refused() {
        let page: Vec<u8> = (0..64 << 10).map(|i| (i % 7) as u8).collect();
        let mut p = Packer::default();
        for c in CODECS {
            let packed = p.pack(c, &page).expect("shrinks").to_vec();
            let mut back = vec![0u8; page.len()];
            assert!(!unpack(c, &packed[..packed.len() / 2], &mut back), "{c}");
            assert!(!unpack(c, &noise(300, 5), &mut back), "{c}");
            let mut small = vec![0u8; page.len() / 2];
            assert!(!unpack(c, &packed, &mut small), "{c}");
            let mut q = Packer::default();
            assert!(!q.unpack(c, &packed[..packed.len() / 2], &mut back), "{c}");
            assert!(!q.unpack(c, &noise(300, 5), &mut back), "{c}");
            assert!(!q.unpack(c, &packed, &mut small), "{c}");
            assert!(q.unpack(c, &packed, &mut back) && back == page, "{c}");
            assert!(!unpack(Compression::None, &packed, &mut back));
        }
    }
}
