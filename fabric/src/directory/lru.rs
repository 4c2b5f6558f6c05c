//! Eviction order of one device: a doubly linked list of frames per priority, threaded through arrays indexed
//! by frame, so touching, removing and appending a frame are O(1) and take [`Lru::BYTES_PER_FRAME`] bytes a frame,
//! a fraction of what a B-tree of (priority, stamp, frame) keys takes. The directory's memory per page is one of
//! the pager benchmark's targets (docs/benchmarks.md, "The fabric under oversubscription"), and every frame of
//! every arena pays for its eviction links whether it is used or not.

use super::region::Priority;

const NIL: u32 = u32::MAX;
const OUT: u8 = u8::MAX;

/// Frames holding an unpinned copy, least recently used first, lowest priority first.
#[derive(Debug, Clone)]
pub(crate) struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    /// The frame's priority list, or `OUT` when it is in none.
    list: Vec<u8>,
    head: [u32; 3],
    tail: [u32; 3],
    len: usize,
}

fn rank(p: Priority) -> usize {
    match p {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
    }
}

impl Lru {
    pub(crate) fn new(frames: usize) -> Self {
        Lru {
            prev: vec![NIL; frames],
            next: vec![NIL; frames],
            list: vec![OUT; frames],
            head: [NIL; 3],
            tail: [NIL; 3],
            len: 0,
        }
    }

    pub(crate) fn contains(&self, frame: u32) -> bool {
        self.list[frame as usize] != OUT
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `frame` as the most recently used of its priority (moving it there if it is already listed).
    pub(crate) fn touch(&mut self, frame: u32, prio: Priority) {
        self.remove(frame);
        let l = rank(prio);
        let f = frame as usize;
        self.list[f] = l as u8;
        self.prev[f] = self.tail[l];
        self.next[f] = NIL;
        match self.tail[l] {
            NIL => self.head[l] = frame,
            t => self.next[t as usize] = frame,
        }
        self.tail[l] = frame;
        self.len += 1;
    }

    /// Takes `frame` out of the order (a no-op when it is not in it).
    pub(crate) fn remove(&mut self, frame: u32) {
        let f = frame as usize;
        let l = self.list[f];
        if l == OUT {
            return;
        }
        let l = usize::from(l);
        let (p, n) = (self.prev[f], self.next[f]);
        match p {
            NIL => self.head[l] = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail[l] = p,
            n => self.prev[n as usize] = p,
        }
        self.list[f] = OUT;
        self.len -= 1;
    }

    /// Puts `new` where `old` is in the order and takes `old` out (a page that moved between frames keeps its
    /// recency). `new` must not be listed; when `old` is not, nothing changes.
    pub(crate) fn replace(&mut self, old: u32, new: u32) {
        let (o, n) = (old as usize, new as usize);
        let l = self.list[o];
        if l == OUT || self.list[n] != OUT {
            return;
        }
        let (p, x) = (self.prev[o], self.next[o]);
        self.prev[n] = p;
        self.next[n] = x;
        self.list[n] = l;
        match p {
            NIL => self.head[usize::from(l)] = new,
            p => self.next[p as usize] = new,
        }
        match x {
            NIL => self.tail[usize::from(l)] = new,
            x => self.prev[x as usize] = new,
        }
        self.prev[o] = NIL;
        self.next[o] = NIL;
        self.list[o] = OUT;
    }

    /// The priority a listed frame was touched with.
    pub(crate) fn priority(&self, frame: u32) -> Option<Priority> {
        match self.list[frame as usize] {
            0 => Some(Priority::Low),
            1 => Some(Priority::Normal),
            2 => Some(Priority::High),
            _ => None,
        }
    }

    /// Frames in eviction order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..3).flat_map(move |l| {
            let mut cur = self.head[l];
            std::iter::from_fn(move || {
                if cur == NIL {
                    return None;
                }
                let f = cur;
                cur = self.next[f as usize];
                Some(f)
            })
        })
    }

    /// Bytes it takes per frame.
    pub(crate) const BYTES_PER_FRAME: usize = 2 * std::mem::size_of::<u32>() + 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_entries_stay_small() {
        assert!(std::mem::size_of::<super::super::page::PageEntry>() <= 32);
    }

    #[test]
    fn order_is_priority_then_recency() {
        let mut l = Lru::new(8);
        l.touch(3, Priority::Normal);
        l.touch(1, Priority::High);
        l.touch(5, Priority::Normal);
        l.touch(2, Priority::Low);
        l.touch(3, Priority::Normal); // 3 becomes the most recent normal
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![2, 5, 3, 1]);
        l.remove(5);
        l.remove(5);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![2, 3, 1]);
        assert_eq!(l.len(), 3);
        assert!(l.contains(3) && !l.contains(5));
        assert_eq!(l.priority(1), Some(Priority::High));
        l.replace(3, 6); // 6 takes 3's place
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![2, 6, 1]);
        l.replace(2, 7); // at a head and tail
        l.replace(1, 0);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![7, 6, 0]);
        assert_eq!((l.len(), l.priority(7), l.contains(2)), (3, Some(Priority::Low), false));
        l.replace(5, 4); // not listed: nothing changes
        assert!(!l.contains(4));
        l.remove(7);
        l.remove(6);
        l.remove(0);
        assert_eq!(l.iter().count(), 0);
        assert_eq!(l.len(), 0);
    }
}
