//! Folio memory: page-aligned buffers (so writeback and readahead can hand
//! folio memory straight to O_DIRECT requests), recycled by size so that a
//! cache that evicts and refills does not fault fresh pages in every time.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::dev::AlignedBuf;

/// Size classes: powers of two from 512 B to 64 MiB.
const CLASS_COUNT: usize = 18;
const SMALLEST_CLASS_SHIFT: u32 = 9;

pub struct BufferPool {
    free: Mutex<PoolState>,
    kept_bytes_max: u64,
    /// Buffers handed out from the pool, and freshly allocated.
    reused: AtomicU64,
    allocated: AtomicU64,
}

struct PoolState {
    classes: Vec<Vec<AlignedBuf>>,
    kept_bytes: u64,
}

impl BufferPool {
    pub fn new(kept_bytes_max: u64) -> Self {
        let classes = (0..CLASS_COUNT).map(|_| Vec::new()).collect();
        Self {
            free: Mutex::new(PoolState { classes, kept_bytes: 0 }),
            kept_bytes_max,
            reused: AtomicU64::new(0),
            allocated: AtomicU64::new(0),
        }
    }

    fn class_of(bytes: usize) -> Option<usize> {
        if !bytes.is_power_of_two() {
            return None;
        }
        let class = bytes.trailing_zeros().checked_sub(SMALLEST_CLASS_SHIFT)? as usize;
        (class < CLASS_COUNT).then_some(class)
    }

    /// A buffer of `bytes` (a power of two). Its contents are unspecified:
    /// the folio's uptodate bits say which bytes mean anything.
    pub fn take(&self, bytes: usize) -> AlignedBuf {
        if let Some(class) = Self::class_of(bytes) {
            let mut state = self.free.lock();
            if let Some(buffer) = state.classes[class].pop() {
                state.kept_bytes -= bytes as u64;
                self.reused.fetch_add(1, Ordering::Relaxed);
                return buffer;
            }
        }
        self.allocated.fetch_add(1, Ordering::Relaxed);
        AlignedBuf::zeroed(bytes)
    }

    /// Returns a buffer for reuse. When the pool is full, buffers of the
    /// class holding the most bytes make room for it (so the pool follows
    /// the folio sizes in use), or it is freed.
    pub fn give(&self, buffer: AlignedBuf) {
        let Some(class) = Self::class_of(buffer.len()) else { return };
        let bytes = buffer.len() as u64;
        if bytes > self.kept_bytes_max {
            return;
        }
        let mut freed = Vec::new();
        let mut state = self.free.lock();
        while state.kept_bytes + bytes > self.kept_bytes_max {
            let fullest = (0..CLASS_COUNT)
                .filter(|&other| other != class)
                .max_by_key(|&other| state.classes[other].len() << other)
                .filter(|&other| !state.classes[other].is_empty());
            let Some(fullest) = fullest else { return };
            let evicted = state.classes[fullest].pop().expect("non-empty class");
            state.kept_bytes -= evicted.len() as u64;
            freed.push(evicted);
        }
        state.kept_bytes += bytes;
        state.classes[class].push(buffer);
        drop(state);
        // Freed outside the lock: returning memory to the system is slow.
        drop(freed);
    }

    /// Buffers handed out (reused from the pool, freshly allocated).
    pub fn handed_out(&self) -> (u64, u64) {
        (self.reused.load(Ordering::Relaxed), self.allocated.load(Ordering::Relaxed))
    }

    pub fn kept_bytes(&self) -> u64 {
        self.free.lock().kept_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycles_by_size_up_to_its_limit() {
        let pool = BufferPool::new(8192);
        let first = pool.take(4096);
        let address = first.as_ptr() as usize;
        pool.give(first);
        assert_eq!(pool.kept_bytes(), 4096);
        assert_eq!(pool.take(4096).as_ptr() as usize, address, "the same buffer comes back");
        pool.give(AlignedBuf::zeroed(4096));
        pool.give(AlignedBuf::zeroed(4096));
        pool.give(AlignedBuf::zeroed(4096));
        assert_eq!(pool.kept_bytes(), 8192, "over the limit a buffer of its own size is freed");
        pool.give(AlignedBuf::zeroed(8192));
        assert_eq!(pool.kept_bytes(), 8192, "other sizes make room");
        assert_eq!(pool.take(8192).len(), 8192);
        assert_eq!(pool.handed_out(), (2, 1));
        assert_eq!(pool.take(2048).len(), 2048);
    }
}
