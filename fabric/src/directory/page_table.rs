//! A region's page entries, made a chunk at a time when a page of the chunk is first changed: the directory's
//! memory grows with the pages a region uses, not with its size, so a region far larger than the node (a
//! sparse one, or one reserved ahead) costs 8 bytes per 1,024 pages until it is used.

use std::ops::{Index, IndexMut};

use super::page::PageEntry;

/// Entries per chunk (32 KiB of entries).
const CHUNK: usize = 1024;

/// The entry of every page never changed: no copy, version 0, no lease.
static UNTOUCHED: PageEntry = PageEntry::UNTOUCHED;

/// The entries of a region's pages (see the module's docs).
#[derive(Debug, Clone)]
pub struct PageTable {
    len: usize,
    chunks: Vec<Option<Box<[PageEntry; CHUNK]>>>,
}

impl PageTable {
    /// A table of `len` pages, none touched.
    pub fn new(len: usize) -> Self {
        PageTable { len, chunks: vec![None; len.div_ceil(CHUNK)] }
    }

    /// Pages in the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no page (never: regions are at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Page `i`'s entry, if the region has it.
    pub fn get(&self, i: usize) -> Option<&PageEntry> {
        (i < self.len).then(|| self.chunks[i / CHUNK].as_ref().map_or(&UNTOUCHED, |c| &c[i % CHUNK]))
    }

    /// Every page's entry, in order (untouched ones too: as long as the region).
    pub fn iter(&self) -> impl Iterator<Item = &PageEntry> + '_ {
        (0..self.len).map(move |i| &self[i])
    }

    /// The pages whose chunk has been made, with their index: every page that was ever changed is among them,
    /// so a walk over them sees every copy and every lease, in time proportional to what the region uses.
    pub fn touched(&self) -> impl Iterator<Item = (usize, &PageEntry)> + '_ {
        self.chunks.iter().enumerate().filter_map(|(k, c)| c.as_ref().map(|c| (k, c))).flat_map(move |(k, c)| {
            c.iter().enumerate().map(move |(j, e)| (k * CHUNK + j, e)).filter(move |(i, _)| *i < self.len)
        })
    }

    /// Heap bytes the table takes: the chunk pointers and the chunks made.
    pub fn heap_bytes(&self) -> usize {
        let made = self.chunks.iter().filter(|c| c.is_some()).count();
        self.chunks.len() * std::mem::size_of::<Option<Box<[PageEntry; CHUNK]>>>()
            + made * CHUNK * std::mem::size_of::<PageEntry>()
    }
}

impl Index<usize> for PageTable {
    type Output = PageEntry;

    fn index(&self, i: usize) -> &PageEntry {
        match self.get(i) {
            Some(e) => e,
            None => panic!("page {i} of a region of {} pages", self.len),
        }
    }
}

impl IndexMut<usize> for PageTable {
    /// Page `i`'s entry, to change: its chunk is made now if it was not.
    fn index_mut(&mut self, i: usize) -> &mut PageEntry {
        assert!(i < self.len, "page {i} of a region of {} pages", self.len);
        let chunk = self.chunks[i / CHUNK].get_or_insert_with(|| Box::new([PageEntry::UNTOUCHED; CHUNK]));
        &mut chunk[i % CHUNK]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_made_when_pages_change_and_untouched_pages_read_as_untouched() {
        let mut t = PageTable::new(3 * CHUNK + 5);
        assert_eq!(t.len(), 3 * CHUNK + 5);
        assert_eq!(t.heap_bytes(), 4 * 8, "a pointer per chunk, none made");
        assert_eq!(t[3 * CHUNK + 4].version, 0);
        assert!(t.get(3 * CHUNK + 5).is_none(), "past the end");
        t[CHUNK + 7].version = 9;
        t[3 * CHUNK + 4].read_leases = 1;
        let touched: Vec<usize> = t.touched().filter(|(_, e)| e.version > 0 || e.leased()).map(|(i, _)| i).collect();
        assert_eq!(touched, vec![CHUNK + 7, 3 * CHUNK + 4]);
        // Two chunks made, the last one short: `touched` stops at the region's end.
        assert_eq!(t.touched().count(), CHUNK + 5);
        assert_eq!(t.iter().filter(|e| e.version == 9).count(), 1);
        assert_eq!(t.iter().count(), 3 * CHUNK + 5);
    }
}
