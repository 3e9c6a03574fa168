//! The folio cache: each file's cached data as folios (power-of-two runs of
//! blocks, block size up to `folio_max`) in an ordered map, with per-block
//! uptodate and dirty bits, a memory limit enforced by CLOCK eviction of
//! clean folios, and dirty accounting that wakes the flusher and throttles
//! writers. Memory only: the I/O paths (`buffered`, `writeback`) decide what
//! to read and write; this module does no I/O.
//!
//! Each cached or open file has one [`InodeCache`]: its I/O lock, its folios,
//! the writeback lock that serialises writeback with truncation, and its
//! writeback error sequence.

mod bits;
mod folio;
mod inode_cache;
mod page_cache;
#[allow(unsafe_code)]
mod pool;
mod throttle;

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use bits::BlockBits;
pub use folio::{Folio, FolioState};
pub use inode_cache::{InodeCache, WritebackGuard};
pub use page_cache::{FlusherRound, PageCache};
pub use pool::BufferPool;
pub use throttle::{DirtyLimits, DirtyThrottle};

pub use crate::io_lock::Exclusive as IoExclusive;
use crate::options::{DirtyMode, VolumeOptions};

/// Volume-wide counters every folio and inode reports to.
pub struct Accounting {
    pub(crate) cached_bytes: AtomicU64,
    /// Folios alive (in a map or still referenced).
    pub(crate) live_folios: AtomicUsize,
    dirty_bytes: AtomicU64,
    pub(crate) pool: BufferPool,
    /// The least memory a folio holds when it holds any (`CachePolicy`).
    pub(crate) memory_unit_bytes: usize,
    /// What files' dirty ages count from.
    epoch: Instant,
    /// Gives free space back the blocks promised to copies of shared
    /// blocks (`FolioState::copy_reserved`) when a folio holding such
    /// promises is dropped before its writeback made the copies.
    pub(crate) give_back_reserved: GiveBackReserved,
}

/// How the cache returns reserved blocks to free space without naming the
/// allocator: called with a block count.
pub type GiveBackReserved = Arc<dyn Fn(u64) + Send + Sync>;

impl Accounting {
    /// Milliseconds since the cache began, from 1 (0 is never a time).
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }
}

/// The smallest slab piece (`pool`'s smallest class).
const MEMORY_UNIT_BYTES_MIN: u64 = 512;

/// The cache's policies, from the volume options and the block size.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    pub block_bytes: u64,
    pub folio_max_bytes: u64,
    pub dirty_mode: DirtyMode,
    pub cache_bytes: u64,
    pub dirty_background_bytes: u64,
    pub dirty_limit_bytes: u64,
    /// How long data may stay dirty before the flusher's interval pass
    /// writes its file back (the kernel's dirty_expire_centisecs).
    pub dirty_expire: Duration,
    /// The least memory a folio of one block holds when it holds any: the
    /// device's logical block, at least the smallest slab piece (512 B), so
    /// a direct write takes every buffer of it.
    pub memory_unit_bytes: u64,
}

impl CachePolicy {
    pub fn new(options: &VolumeOptions, block_bytes: u64) -> Self {
        Self {
            block_bytes,
            // A folio holds at least one block.
            folio_max_bytes: options.folio_max_bytes.max(block_bytes),
            dirty_mode: options.dirty,
            cache_bytes: options.cache_bytes,
            dirty_background_bytes: options.dirty_background_limit_bytes(),
            dirty_limit_bytes: options.dirty_limit_bytes(),
            dirty_expire: Duration::from_millis(options.dirty_expire_ms),
            memory_unit_bytes: MEMORY_UNIT_BYTES_MIN,
        }
    }

    /// The policy for a device of `logical_block_bytes`.
    pub fn for_device(mut self, logical_block_bytes: u64) -> Self {
        self.memory_unit_bytes = logical_block_bytes.max(MEMORY_UNIT_BYTES_MIN);
        self
    }

    /// Where pacing of writers starts and stops.
    pub fn dirty_limits(&self) -> DirtyLimits {
        DirtyLimits {
            background_bytes: self.dirty_background_bytes,
            limit_bytes: self.dirty_limit_bytes,
        }
    }
}

/// A cache of `cache_bytes` over 4 KiB blocks, folios up to 64 KiB, for
/// the tests of the cache's files.
#[cfg(test)]
fn test_cache(cache_bytes: u64) -> PageCache {
    let options = VolumeOptions { cache_bytes, folio_max_bytes: 64 << 10, ..Default::default() };
    PageCache::new(CachePolicy::new(&options, 4096), Arc::new(|_| {}))
}

/// Hooks that let a test force an interleaving.
#[cfg(test)]
pub mod test_hooks {
    use std::cell::RefCell;

    type Hook = Box<dyn FnOnce()>;

    thread_local! {
        static FILL_JUDGING: RefCell<Option<Hook>> = RefCell::new(None);
    }

    /// Runs `hook` once, on this thread, when the next fill it makes has
    /// read the device and is about to judge whether to keep the bytes.
    pub fn set_fill_judging_hook(hook: impl FnOnce() + 'static) {
        FILL_JUDGING.with(|slot| *slot.borrow_mut() = Some(Box::new(hook)));
    }

    pub(super) fn run_fill_judging_hook() {
        let hook = FILL_JUDGING.with(|slot| slot.borrow_mut().take());
        if let Some(hook) = hook {
            hook();
        }
    }
}
