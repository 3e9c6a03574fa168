//! A folio: a power-of-two run of a file's blocks, aligned to its size, with
//! per-block uptodate, dirty and mapped bits.
//!
//! - uptodate: the block's bytes in memory are the file's bytes.
//! - dirty: the block must be written back (always uptodate and mapped).
//! - mapped: the block has space on disk or a delayed reservation, so a
//!   write to it needs no trip to the allocator (cleared only by dropping
//!   the folio, which every operation that unmaps blocks does first).
//! - copy_reserved: the block is dirty over shared blocks (a clone's), and
//!   one free block is promised to the copy its writeback makes; dropping
//!   the folio unwritten gives the promise back.
//!
//! Lock order: folios of one file in ascending offset, and never while
//! holding the metadata lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::bits::BlockBits;
use super::pool::FolioMemory;
use super::Accounting;

pub struct FolioState {
    pub data: FolioMemory,
    pub uptodate: BlockBits,
    pub dirty: BlockBits,
    pub mapped: BlockBits,
    pub copy_reserved: BlockBits,
}

pub struct Folio {
    pos: u64,
    bytes: usize,
    block_bytes: usize,
    state: RwLock<FolioState>,
    /// Set on every access, cleared by the CLOCK hand: a second chance.
    referenced: AtomicBool,
    /// Dropped behind: its memory goes back to the system, not the pool.
    release_memory: AtomicBool,
    accounting: Arc<Accounting>,
}

impl Folio {
    pub(super) fn new(
        pos: u64,
        bytes: usize,
        block_bytes: usize,
        data: FolioMemory,
        accounting: Arc<Accounting>,
    ) -> Self {
        assert!(
            bytes.is_power_of_two() && bytes >= block_bytes && pos.is_multiple_of(bytes as u64)
        );
        assert_eq!(data.len(), bytes);
        let block_count = bytes / block_bytes;
        accounting.live_folios.fetch_add(1, Ordering::Relaxed);
        let state = FolioState {
            data,
            uptodate: BlockBits::new(block_count),
            dirty: BlockBits::new(block_count),
            mapped: BlockBits::new(block_count),
            copy_reserved: BlockBits::new(block_count),
        };
        Self {
            pos,
            bytes,
            block_bytes,
            state: RwLock::new(state),
            referenced: AtomicBool::new(true),
            release_memory: AtomicBool::new(false),
            accounting,
        }
    }

    /// File offset of the first byte.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    pub fn end(&self) -> u64 {
        self.pos + self.bytes as u64
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    pub fn block_count(&self) -> usize {
        self.bytes / self.block_bytes
    }

    /// The folio's blocks that `[start, end)` (file offsets) touches, as
    /// `(first, count)`; the range is clipped to the folio.
    pub fn blocks_of(&self, start: u64, end: u64) -> (usize, usize) {
        // Clamped at both ends: writeback re-dirties every failed range in
        // every folio of its batch, so a range may lie wholly before or after
        // this folio (it underflowed then; found by tests/faults.rs).
        let start = start.clamp(self.pos, self.end()) - self.pos;
        let end = end.clamp(self.pos, self.end()) - self.pos;
        if start >= end {
            return (0, 0);
        }
        let first = start as usize / self.block_bytes;
        let last = (end as usize).div_ceil(self.block_bytes);
        (first, last - first)
    }

    pub fn read(&self) -> RwLockReadGuard<'_, FolioState> {
        self.referenced.store(true, Ordering::Relaxed);
        self.state.read()
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, FolioState> {
        self.referenced.store(true, Ordering::Relaxed);
        self.state.write()
    }

    pub(super) fn try_read(&self) -> Option<RwLockReadGuard<'_, FolioState>> {
        self.state.try_read()
    }

    /// When the last reference goes, the memory is released
    /// ([`super::BufferPool::give_for_release`]).
    pub(super) fn release_memory_when_dropped(&self) {
        self.release_memory.store(true, Ordering::Relaxed);
    }

    /// The CLOCK hand passes: true if the folio was used since last time.
    pub(super) fn take_referenced(&self) -> bool {
        self.referenced.swap(false, Ordering::Relaxed)
    }
}

impl Drop for Folio {
    fn drop(&mut self) {
        self.accounting.cached_bytes.fetch_sub(self.bytes as u64, Ordering::Relaxed);
        self.accounting.live_folios.fetch_sub(1, Ordering::Relaxed);
        let promised_blocks = self.state.get_mut().copy_reserved.count_set() as u64;
        if promised_blocks > 0 {
            (self.accounting.give_back_reserved)(promised_blocks);
        }
        let empty = FolioMemory::whole(crate::dev::AlignedBuf::zeroed(0));
        let data = std::mem::replace(&mut self.state.get_mut().data, empty);
        if *self.release_memory.get_mut() {
            self.accounting.pool.give_for_release(data);
        } else {
            self.accounting.pool.give(data);
        }
    }
}

impl std::fmt::Debug for Folio {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "Folio({}+{})", self.pos, self.bytes)
    }
}
