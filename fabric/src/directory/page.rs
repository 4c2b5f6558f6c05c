//! Pages and their copies: which device and frame each copy of a page is in, and the directory entry of a page
//! (its owner copy, read-only replicas, version and lease counts).

/// Index of a device (location) in the directory: GPUs in order, then the host.
pub type DevIdx = u8;

/// One copy of a page: which device and which frame of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Copy {
    /// The device.
    pub dev: DevIdx,
    /// The frame.
    pub frame: u32,
}

/// A page of a region, by slot and page index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageRef {
    /// The region's slot.
    pub slot: u32,
    /// The page's index in the region.
    pub page: u32,
}

/// The directory entry of one page (32 bytes; checked by a test). All copies hold the same version: a write drops
/// every other copy.
#[derive(Debug, Clone)]
pub struct PageEntry {
    /// The copy the page lives in (`NO_COPY` until the page is first written or acquired: it reads as zeros).
    owner: Copy,
    /// Read-only replicas of the owner's bytes. Most pages have none, so the list costs one pointer in the
    /// entry (a `Vec` would take three) and is allocated only for pages that are replicated.
    #[allow(clippy::box_collection)]
    sharers: Option<Box<Vec<Copy>>>,
    /// Bumped by every write and every release of a write lease.
    pub version: u64,
    /// Read leases held on the page.
    pub read_leases: u32,
    /// Whether a write lease is held (then no read lease is).
    pub write_leased: bool,
}

const NO_COPY: Copy = Copy { dev: DevIdx::MAX, frame: u32::MAX };

impl Default for PageEntry {
    fn default() -> Self {
        PageEntry::UNTOUCHED
    }
}

impl PageEntry {
    /// A page never written or acquired: no copy (it reads as zeros), version 0, no lease.
    pub const UNTOUCHED: PageEntry =
        PageEntry { owner: NO_COPY, sharers: None, version: 0, read_leases: 0, write_leased: false };

    /// The owner copy, if the page has one.
    pub fn owner(&self) -> Option<Copy> {
        (self.owner != NO_COPY).then_some(self.owner)
    }

    /// The replicas.
    pub fn sharers(&self) -> &[Copy] {
        self.sharers.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Every copy, the owner first.
    pub fn copies(&self) -> impl Iterator<Item = Copy> + '_ {
        self.owner().into_iter().chain(self.sharers().iter().copied())
    }

    /// The copy on `dev`, if any.
    pub fn copy_on(&self, dev: DevIdx) -> Option<Copy> {
        self.copies().find(|c| c.dev == dev)
    }

    /// Whether the owner's bytes exist nowhere else: evicting the owner then means copying it.
    pub fn dirty(&self) -> bool {
        self.owner().is_some() && self.sharers().is_empty()
    }

    /// Whether any lease is held.
    pub fn leased(&self) -> bool {
        self.read_leases > 0 || self.write_leased
    }

    /// Heap bytes of the replica list.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.sharers
            .as_ref()
            .map_or(0, |v| std::mem::size_of::<Vec<Copy>>() + v.capacity() * std::mem::size_of::<Copy>())
    }

    /// Adds a copy: the owner when there is none, a replica otherwise.
    pub(crate) fn add(&mut self, copy: Copy) {
        if self.owner == NO_COPY {
            self.owner = copy;
        } else {
            self.sharers.get_or_insert_with(Default::default).push(copy);
        }
    }

    /// Puts `new` where `old` was (owner or replica).
    pub(crate) fn replace(&mut self, old: Copy, new: Copy) {
        if self.owner == old {
            self.owner = new;
        } else if let Some(s) = self.sharers.as_mut().and_then(|v| v.iter_mut().find(|s| **s == old)) {
            *s = new;
        }
    }

    /// Removes a copy; when it was the owner, a replica on a GPU (`gpu` says which devices are GPUs; else any)
    /// takes its place.
    pub(crate) fn remove(&mut self, copy: Copy, gpu: impl Fn(DevIdx) -> bool) {
        if self.owner == copy {
            self.owner = match self.sharers.as_mut() {
                Some(v) if !v.is_empty() => {
                    let i = v.iter().position(|s| gpu(s.dev)).unwrap_or(0);
                    v.swap_remove(i)
                }
                _ => NO_COPY,
            };
        } else if let Some(v) = self.sharers.as_mut() {
            v.retain(|s| *s != copy);
        }
        if self.sharers.as_ref().is_some_and(|v| v.is_empty()) {
            self.sharers = None;
        }
    }

    /// Makes `copy` the only copy (the caller frees the others' frames).
    pub(crate) fn keep_only(&mut self, copy: Copy) {
        self.owner = copy;
        self.sharers = None;
    }

    /// Takes every replica out (the caller frees their frames).
    pub(crate) fn take_sharers(&mut self) -> Vec<Copy> {
        self.sharers.take().map(|b| *b).unwrap_or_default()
    }

    /// Makes the replica on `dev` the owner and the old owner a replica; false when there is none on `dev`.
    pub(crate) fn promote(&mut self, dev: DevIdx) -> bool {
        let owner = self.owner;
        match self.sharers.as_mut().and_then(|v| v.iter_mut().find(|s| s.dev == dev)) {
            Some(s) => {
                self.owner = std::mem::replace(s, owner);
                true
            }
            None => false,
        }
    }
}
