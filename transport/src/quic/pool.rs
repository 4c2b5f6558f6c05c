//! Reusable payload buffers for page chunks.
//!
//! A sender fills a buffer and hands it to quinn as [`Bytes`] (the fabric's `proto::quic::send_chunk`); quinn keeps it until the
//! peer has acknowledged it and then drops it. A buffer from a [`BufferPool`] goes back to the pool at that
//! point instead of to the allocator, so a steady stream of chunks neither allocates nor faults in fresh pages
//! (freshly mapped 1 MiB buffers cost a page fault and a zeroing per 4 KiB page).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// A pool of payload buffers, shared by its clones; keeps at most `keep` idle buffers.
#[derive(Clone)]
pub struct BufferPool {
    idle: Arc<Mutex<Vec<Vec<u8>>>>,
    keep: usize,
}

impl BufferPool {
    /// A pool that keeps up to `keep` idle buffers.
    pub fn new(keep: usize) -> BufferPool {
        BufferPool { idle: Arc::new(Mutex::new(Vec::new())), keep }
    }

    /// A buffer of exactly `len` bytes. Its contents are unspecified (a reused buffer keeps old bytes): the
    /// caller fills all of it.
    pub fn take(&self, len: usize) -> PoolBuf {
        let reused = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut buf = reused.unwrap_or_default();
        // Only growth is zero-filled; a buffer at least this long is just shortened.
        buf.resize(len, 0);
        PoolBuf { buf, pool: self.clone() }
    }

    /// A buffer holding a copy of `data`.
    pub fn copy_of(&self, data: &[u8]) -> PoolBuf {
        let mut b = self.take(data.len());
        b.as_mut().copy_from_slice(data);
        b
    }

    /// How many idle buffers the pool holds.
    pub fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A buffer from a [`BufferPool`]; it goes back to the pool when dropped (also after [`PoolBuf::into_bytes`],
/// once the last `Bytes` of it is dropped).
pub struct PoolBuf {
    buf: Vec<u8>,
    pool: BufferPool,
}

impl PoolBuf {
    /// The buffer as `Bytes`, without a copy.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PoolBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl AsMut<[u8]> for PoolBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        let mut idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.pool.keep {
            idle.push(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_the_last_bytes_is_dropped() {
        let pool = BufferPool::new(2);
        let b = pool.copy_of(b"page");
        let bytes = b.into_bytes();
        let clone = bytes.clone();
        assert_eq!(&bytes[..], b"page");
        drop(bytes);
        assert_eq!(pool.idle(), 0, "a Bytes of it is still alive");
        drop(clone);
        assert_eq!(pool.idle(), 1);
        // Reused, at the asked-for length whatever it held before.
        let again = pool.take(2);
        assert_eq!(again.as_ref().len(), 2);
        assert_eq!(pool.idle(), 0);
        let longer = pool.take(10);
        assert_eq!(longer.as_ref().len(), 10);
    }

    #[test]
    fn the_pool_keeps_at_most_its_limit() {
        let pool = BufferPool::new(1);
        let (a, b) = (pool.take(8), pool.take(8));
        drop(a);
        drop(b);
        assert_eq!(pool.idle(), 1);
    }
}
