//! Batches of pages to move, and the plans that engines execute for them.
//!
//! A batch names frames (page-sized slots, counted from an arena's first byte) rather than addresses, so one
//! batch is valid for any pair of arenas large enough for it. Planning is pure: it checks the batch against
//! both arenas, coalesces it into contiguous runs for the copy engine, and lays out the page index lists and
//! chunking for the SM kernel. Both backends execute the same plans.

use vfabric_allocator::PageMove;

use crate::device::error::{MoveError, Side};

/// A set of pages of one size to move between two arenas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageBatch {
    page_size: u64,
    moves: Vec<PageMove>,
}

/// The largest page size the SM kernel's 32-bit word counts allow.
pub const MAX_PAGE_SIZE: u64 = 1 << 31;

impl PageBatch {
    /// An empty batch of pages of `page_size` bytes.
    pub fn new(page_size: u64) -> Self {
        PageBatch { page_size, moves: Vec::new() }
    }

    /// A batch from a list of moves.
    pub fn from_moves(page_size: u64, moves: Vec<PageMove>) -> Self {
        PageBatch { page_size, moves }
    }

    /// `pages` pages from consecutive frames starting at `src` to consecutive frames starting at `dst`.
    pub fn contiguous(page_size: u64, src: u32, dst: u32, pages: u32) -> Self {
        let moves = (0..pages).map(|i| PageMove { src: src + i, dst: dst + i }).collect();
        PageBatch { page_size, moves }
    }

    /// Adds one page.
    pub fn push(&mut self, src: u32, dst: u32) {
        self.moves.push(PageMove { src, dst });
    }

    /// The page size in bytes.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The pages, in the order given.
    pub fn moves(&self) -> &[PageMove] {
        &self.moves
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.moves.len()
    }

    /// Whether the batch has no pages.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }

    /// Bytes the batch moves.
    pub fn bytes(&self) -> u64 {
        self.moves.len() as u64 * self.page_size
    }

    /// Checks the batch against a source arena of `src_len` bytes and a destination of `dst_len` bytes
    /// (`same_arena` when both are one arena), and coalesces it into a plan.
    ///
    /// Rejects: a page size that is zero, not a multiple of 16 bytes or above [`MAX_PAGE_SIZE`]; a frame past
    /// the end of its arena; a destination frame named twice; within one arena, a frame that is both read and
    /// written (the result would depend on the order the engine happens to copy in).
    pub fn plan(&self, src_len: u64, dst_len: u64, same_arena: bool) -> Result<Plan, MoveError> {
        let ps = self.page_size;
        if ps == 0 || ps % 16 != 0 || ps > MAX_PAGE_SIZE {
            return Err(MoveError::BadPageSize(ps));
        }
        let (src_frames, dst_frames) = (src_len / ps, dst_len / ps);
        for m in &self.moves {
            if u64::from(m.src) >= src_frames {
                return Err(MoveError::FrameOutOfRange { side: Side::Source, frame: m.src, frames: src_frames });
            }
            if u64::from(m.dst) >= dst_frames {
                return Err(MoveError::FrameOutOfRange { side: Side::Destination, frame: m.dst, frames: dst_frames });
            }
        }
        let mut dsts: Vec<u32> = self.moves.iter().map(|m| m.dst).collect();
        dsts.sort_unstable();
        if let Some(w) = dsts.windows(2).find(|w| w[0] == w[1]) {
            return Err(MoveError::DuplicateDestination(w[0]));
        }
        if same_arena {
            if let Some(m) = self.moves.iter().find(|m| dsts.binary_search(&m.src).is_ok()) {
                return Err(MoveError::OverlappingFrames(m.src));
            }
        }
        Ok(Plan { page_size: ps, runs: coalesce(ps, &self.moves), pages: self.moves.len() })
    }
}

/// A contiguous byte range to copy: what one copy-engine call moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRun {
    /// Offset in the source arena.
    pub src_offset: u64,
    /// Offset in the destination arena.
    pub dst_offset: u64,
    /// Bytes.
    pub len: u64,
}

/// A checked batch, coalesced into runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    page_size: u64,
    runs: Vec<CopyRun>,
    pages: usize,
}

impl Plan {
    /// The page size in bytes.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Contiguous runs, in source order: consecutive pages whose source and destination frames both follow
    /// each other form one run.
    pub fn runs(&self) -> &[CopyRun] {
        &self.runs
    }

    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Bytes to move.
    pub fn bytes(&self) -> u64 {
        self.pages as u64 * self.page_size
    }

    /// The layout the SM kernel runs with `blocks` blocks: page index lists and chunking.
    pub fn kernel_layout(&self, blocks: u32) -> KernelLayout {
        let chunk = chunk_bytes(self.page_size, self.bytes(), blocks);
        let chunks_per_page = (self.page_size / chunk) as u32;
        let mut src_frames = Vec::with_capacity(self.pages);
        let mut dst_frames = Vec::with_capacity(self.pages);
        for r in &self.runs {
            let (s, d) = (r.src_offset / self.page_size, r.dst_offset / self.page_size);
            for i in 0..r.len / self.page_size {
                // Frames were checked against the arenas' frame counts, which came from u32 frame indices.
                src_frames.push((s + i) as u32);
                dst_frames.push((d + i) as u32);
            }
        }
        let items = self.pages as u64 * u64::from(chunks_per_page);
        KernelLayout {
            src_frames,
            dst_frames,
            chunks_per_page,
            words_per_chunk: (chunk / 16) as u32,
            items,
            grid: (items.min(u64::from(blocks.max(1)))) as u32,
        }
    }
}

/// What the SM gather/scatter kernel is launched with (see `kernels/page_copy.cu`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLayout {
    /// Source frame of each page.
    pub src_frames: Vec<u32>,
    /// Destination frame of each page.
    pub dst_frames: Vec<u32>,
    /// Chunks each page is split into; one block copies one chunk at a time.
    pub chunks_per_page: u32,
    /// 16-byte words per chunk.
    pub words_per_chunk: u32,
    /// Chunks in all (pages x chunks per page).
    pub items: u64,
    /// Blocks to launch: the SM budget, or fewer when there are fewer chunks.
    pub grid: u32,
}

/// Chunk size for the kernel: a power-of-two divisor of the page of at least 64 KiB (or the whole page when it
/// is smaller), and small enough that every block gets about four chunks, so a batch of a few large pages still
/// spreads over the whole grid. Larger chunks keep each block streaming longer, which on the H200s moved 2 MiB
/// pages markedly faster than 64 KiB chunks did (docs/benchmarks.md).
fn chunk_bytes(page: u64, total: u64, blocks: u32) -> u64 {
    const MIN_CHUNK: u64 = 64 << 10;
    if page <= MIN_CHUNK || !page.is_power_of_two() {
        return page;
    }
    let per_block = total / (4 * u64::from(blocks.max(1)));
    let mut chunk = MIN_CHUNK;
    while chunk * 2 <= page && chunk * 2 <= per_block {
        chunk *= 2;
    }
    chunk
}

/// Sorts the moves by source frame and merges neighbours into runs.
fn coalesce(page_size: u64, moves: &[PageMove]) -> Vec<CopyRun> {
    let mut sorted = moves.to_vec();
    sorted.sort_unstable_by_key(|m| m.src);
    let mut runs: Vec<CopyRun> = Vec::new();
    for m in sorted {
        let (s, d) = (u64::from(m.src) * page_size, u64::from(m.dst) * page_size);
        match runs.last_mut() {
            Some(r) if r.src_offset + r.len == s && r.dst_offset + r.len == d => r.len += page_size,
            _ => runs.push(CopyRun { src_offset: s, dst_offset: d, len: page_size }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: u64 = 64 << 10;

    #[test]
    fn contiguous_batch_is_one_run() {
        let plan = PageBatch::contiguous(P, 4, 10, 8).plan(64 * P, 64 * P, false).unwrap();
        assert_eq!(plan.runs(), &[CopyRun { src_offset: 4 * P, dst_offset: 10 * P, len: 8 * P }]);
        assert_eq!(plan.bytes(), 8 * P);
    }

    #[test]
    fn scattered_pages_stay_separate_and_sorted() {
        let b = PageBatch::from_moves(
            P,
            vec![PageMove { src: 5, dst: 1 }, PageMove { src: 2, dst: 7 }, PageMove { src: 3, dst: 8 }],
        );
        let plan = b.plan(16 * P, 16 * P, false).unwrap();
        assert_eq!(
            plan.runs(),
            &[
                CopyRun { src_offset: 2 * P, dst_offset: 7 * P, len: 2 * P },
                CopyRun { src_offset: 5 * P, dst_offset: P, len: P }
            ]
        );
    }

    #[test]
    fn rejects_bad_batches() {
        let ok_len = 8 * P;
        assert!(matches!(
            PageBatch::contiguous(0, 0, 0, 1).plan(ok_len, ok_len, false),
            Err(MoveError::BadPageSize(0))
        ));
        assert!(matches!(
            PageBatch::contiguous(24, 0, 0, 1).plan(ok_len, ok_len, false),
            Err(MoveError::BadPageSize(24))
        ));
        assert!(matches!(
            PageBatch::contiguous(P, 7, 0, 2).plan(ok_len, ok_len, false),
            Err(MoveError::FrameOutOfRange { side: Side::Source, frame: 8, frames: 8 })
        ));
        assert!(matches!(
            PageBatch::contiguous(P, 0, 7, 2).plan(ok_len, ok_len, false),
            Err(MoveError::FrameOutOfRange { side: Side::Destination, .. })
        ));
        let dup = PageBatch::from_moves(P, vec![PageMove { src: 0, dst: 3 }, PageMove { src: 1, dst: 3 }]);
        assert!(matches!(dup.plan(ok_len, ok_len, false), Err(MoveError::DuplicateDestination(3))));
        let overlap = PageBatch::contiguous(P, 0, 1, 2);
        assert!(overlap.plan(ok_len, ok_len, false).is_ok());
        assert!(matches!(overlap.plan(ok_len, ok_len, true), Err(MoveError::OverlappingFrames(1))));
    }

    #[test]
    fn chunking_spreads_large_pages() {
        // 1 GiB of 2 MiB pages over 16 blocks: whole pages per chunk.
        assert_eq!(chunk_bytes(2 << 20, 1 << 30, 16), 2 << 20);
        // Two 2 MiB pages over 16 blocks: 64 KiB chunks so every block works.
        assert_eq!(chunk_bytes(2 << 20, 4 << 20, 16), 64 << 10);
        assert_eq!(chunk_bytes(64 << 10, 1 << 30, 16), 64 << 10);
        assert_eq!(chunk_bytes(4096, 1 << 20, 16), 4096);
        let layout = PageBatch::contiguous(2 << 20, 0, 0, 2).plan(8 << 20, 8 << 20, false).unwrap().kernel_layout(16);
        assert_eq!(layout.chunks_per_page, 32);
        assert_eq!(layout.items, 64);
        assert_eq!(layout.grid, 16);
        assert_eq!(u64::from(layout.words_per_chunk) * 16 * u64::from(layout.chunks_per_page), 2 << 20);
    }

    proptest! {
        /// Runs cover exactly the pages of the batch, and the kernel layout lists every page once.
        #[test]
        fn plans_cover_every_page(frames in proptest::sample::subsequence((0u32..64).collect::<Vec<_>>(), 0..64), shift in 0u32..64, blocks in 1u32..40) {
            let moves: Vec<PageMove> = frames.iter().map(|&f| PageMove { src: f, dst: (f + shift) % 64 }).collect();
            let b = PageBatch::from_moves(P, moves.clone());
            let plan = b.plan(64 * P, 64 * P, false).unwrap();
            let mut from_runs: Vec<(u64, u64)> = plan.runs().iter()
                .flat_map(|r| (0..r.len / P).map(move |i| (r.src_offset / P + i, r.dst_offset / P + i)))
                .collect();
            let mut want: Vec<(u64, u64)> = moves.iter().map(|m| (u64::from(m.src), u64::from(m.dst))).collect();
            from_runs.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(&from_runs, &want);
            let l = plan.kernel_layout(blocks);
            let mut from_layout: Vec<(u64, u64)> = l.src_frames.iter().zip(&l.dst_frames).map(|(&s, &d)| (u64::from(s), u64::from(d))).collect();
            from_layout.sort_unstable();
            prop_assert_eq!(from_layout, want);
            prop_assert!(l.grid <= blocks.max(1));
            prop_assert_eq!(u64::from(l.words_per_chunk) * 16 * u64::from(l.chunks_per_page), P);
        }
    }
}
