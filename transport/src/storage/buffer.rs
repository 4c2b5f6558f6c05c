//! Memory O_DIRECT can read into and write from: block-aligned, zeroed when made.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The alignment O_DIRECT buffers, offsets and lengths keep here (the largest logical block size in use).
pub const DIRECT_ALIGN: usize = 4096;

/// A zeroed buffer of `len` bytes aligned to [`DIRECT_ALIGN`] (page-aligned arena frames serve as well).
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation; `&AlignedBuffer` only reads it.
unsafe impl Send for AlignedBuffer {}
// SAFETY: as above.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// A zeroed buffer; `None` when `len` is zero or the allocation fails.
    pub fn new(len: usize) -> Option<AlignedBuffer> {
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(AlignedBuffer { ptr, len })
    }
}

impl Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` initialised bytes this buffer owns.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout (which `new` checked).
        unsafe { dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, DIRECT_ALIGN)) }
    }
}
