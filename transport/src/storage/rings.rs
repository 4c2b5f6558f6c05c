//! The tier's rings, shared by its callers: a caller takes one for its whole batch and gives it back, so callers
//! at once (evictions beside a prefetch's reads, the prefetch's windows beside each other) each keep their own
//! requests in flight instead of queueing for a single ring. A batch still ends with its ring drained; the
//! device stays busy through one caller's drain on another's requests.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::error::StorageError;

/// Rings shared by the callers of one tier: made as callers need them, at most `limit`; past that a caller
/// waits for one to come back.
pub(super) struct Rings<T> {
    free: Mutex<(Vec<T>, usize)>,
    returned: Condvar,
    limit: usize,
}

/// A ring taken from [`Rings`], given back when dropped.
pub(super) struct Taken<'a, T> {
    rings: &'a Rings<T>,
    ring: Option<T>,
}

impl<T> Rings<T> {
    /// Rings of which `first` is the first (made by the caller, so that setting one up fails early), at most
    /// `limit` in all.
    pub(super) fn new(first: T, limit: usize) -> Rings<T> {
        Rings { free: Mutex::new((vec![first], 1)), returned: Condvar::new(), limit: limit.max(1) }
    }

    /// A ring for one batch: a free one, a new one from `make` while fewer than the limit exist, or the next
    /// one given back.
    pub(super) fn take(&self, make: impl FnOnce() -> Result<T, StorageError>) -> Result<Taken<'_, T>, StorageError> {
        let mut free = self.lock();
        loop {
            if let Some(ring) = free.0.pop() {
                return Ok(Taken { rings: self, ring: Some(ring) });
            }
            if free.1 < self.limit {
                free.1 += 1;
                drop(free);
                return match make() {
                    Ok(ring) => Ok(Taken { rings: self, ring: Some(ring) }),
                    Err(e) => {
                        self.lock().1 -= 1;
                        Err(e)
                    }
                };
            }
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// How many rings exist.
    #[cfg(test)]
    fn made(&self) -> usize {
        self.lock().1
    }

    fn lock(&self) -> MutexGuard<'_, (Vec<T>, usize)> {
        // A panic while a ring was out leaves it drained (`Ring::run` collects every completion first).
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T> Deref for Taken<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.ring.as_ref().expect("held until dropped")
    }
}

impl<T> DerefMut for Taken<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.ring.as_mut().expect("held until dropped")
    }
}

impl<T> Drop for Taken<'_, T> {
    fn drop(&mut self) {
        if let Some(ring) = self.ring.take() {
            self.rings.lock().0.push(ring);
            self.rings.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn callers_at_once_get_rings_of_their_own_up_to_the_limit() {
        let rings = Rings::new(0u32, 2);
        let a = rings.take(|| Ok(1)).unwrap();
        let b = rings.take(|| Ok(2)).unwrap();
        assert_eq!((*a, *b, rings.made()), (0, 2, 2));
        drop(a);
        let c = rings.take(|| panic!("a free ring is reused")).unwrap();
        assert_eq!(*c, 0);
    }

    #[test]
    fn a_ring_that_cannot_be_made_is_an_error_and_leaves_room_for_another() {
        let rings = Rings::new(0u32, 2);
        let _a = rings.take(|| Ok(1)).unwrap();
        let e = rings.take(|| Err(StorageError::InvalidSpec("no ring".into())));
        assert!(e.is_err());
        assert_eq!(rings.made(), 1);
        assert_eq!(*rings.take(|| Ok(5)).unwrap(), 5);
    }

    #[test]
    fn past_the_limit_a_caller_waits_for_a_ring_to_come_back() {
        let rings = Arc::new(Rings::new(7u32, 1));
        let held = rings.take(|| panic!("the limit is one")).unwrap();
        let waiter = {
            let rings = Arc::clone(&rings);
            std::thread::spawn(move || *rings.take(|| panic!("the limit is one")).unwrap())
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished(), "no ring is free");
        drop(held);
        assert_eq!(waiter.join().unwrap(), 7);
    }
}
