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
//! Memory: a folio holds its first `memory_bytes()` bytes in memory and
//! every byte past them is zero. A folio of one block starts with none and
//! grows to what is written (a power of two of at least the device's
//! logical block), so a 1 KiB file on 4 KiB blocks takes 1 KiB of memory,
//! not a page: on a VM every fresh page is a fault the host serves, and
//! small files are most of a build tree. Larger folios get all their
//! memory at once (a stream would copy what it grew through).
//!
//! Lock order: folios of one file in ascending offset, and never while
//! holding the metadata lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::bits::BlockBits;
use super::pool::FolioMemory;
use super::Accounting;
use crate::dev::AlignedBuf;

pub struct FolioState {
    /// The folio's first bytes; the rest are zero (see the module's text).
    data: FolioMemory,
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
        assert!(data.len() <= bytes, "{} bytes of memory for a folio of {bytes}", data.len());
        debug_assert!(block_bytes.is_power_of_two(), "blocks of {block_bytes} bytes");
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
        // this folio (it underflowed then; found by tests/faults/random.rs).
        let start = start.clamp(self.pos, self.end()) - self.pos;
        let end = end.clamp(self.pos, self.end()) - self.pos;
        if start >= end {
            return (0, 0);
        }
        let first = start as usize / self.block_bytes;
        let last = (end as usize).div_ceil(self.block_bytes);
        debug_assert!(first < last && last <= self.block_count(), "blocks past the folio");
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

    /// `[start, end)` of the folio to write, its memory grown to cover them
    /// first: to a power of two of at least the memory unit, the bytes it
    /// gains zeroed (they were zero past the old memory).
    pub fn bytes_mut<'s>(
        &self,
        state: &'s mut FolioState,
        start: usize,
        end: usize,
    ) -> &'s mut [u8] {
        assert!(start <= end && end <= self.bytes, "[{start}, {end}) of a folio of {}", self.bytes);
        let held = state.data.len();
        if end > held {
            let grown_bytes =
                end.next_power_of_two().max(self.accounting.memory_unit_bytes).min(self.bytes);
            let mut grown = self.accounting.pool.take(grown_bytes);
            grown[..held].copy_from_slice(&state.data);
            grown[held..].fill(0);
            let old = std::mem::replace(&mut state.data, grown);
            if held > 0 {
                self.accounting.pool.give(old);
            }
        }
        debug_assert!(
            end <= state.data.len() && state.data.len() <= self.bytes,
            "memory of {} bytes for [{start}, {end}) of a folio of {}",
            state.data.len(),
            self.bytes
        );
        &mut state.data[start..end]
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
        let live_before = self.accounting.live_folios.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(live_before > 0, "more folios dropped than made");
        let promised_blocks = self.state.get_mut().copy_reserved.count_set() as u64;
        if promised_blocks > 0 {
            (self.accounting.give_back_reserved)(promised_blocks);
        }
        let data = std::mem::replace(&mut self.state.get_mut().data, FolioMemory::empty());
        if *self.release_memory.get_mut() {
            self.accounting.pool.give_for_release(data);
        } else {
            self.accounting.pool.give(data);
        }
    }
}

impl FolioState {
    /// Bytes from the folio's start held in memory; past them all are zero.
    pub fn memory_bytes(&self) -> usize {
        self.data.len()
    }

    /// `[start, end)` of the folio, if memory holds all of it.
    pub fn in_memory(&self, start: usize, end: usize) -> Option<&[u8]> {
        self.data.get(start..end)
    }

    /// Copies the folio's bytes from `start` into `out`.
    pub fn copy_out(&self, start: usize, out: &mut [u8]) {
        let held = self.data.len().clamp(start, start + out.len()) - start;
        if held > 0 {
            out[..held].copy_from_slice(&self.data[start..start + held]);
        }
        out[held..].fill(0);
    }

    /// Zeroes `[start, end)` of the folio (what memory holds of it: the
    /// rest is zero already).
    pub fn zero(&mut self, start: usize, end: usize) {
        let held = self.data.len();
        if start < held {
            self.data[start..end.min(held)].fill(0);
        }
    }

    /// The buffers holding `[start, start + length)` of the folio, for a
    /// vectored device write: its memory, then zeros (each a multiple of
    /// the memory unit, so O_DIRECT takes them).
    pub fn io_slices(&self, start: usize, length: usize) -> impl Iterator<Item = &[u8]> {
        let end = start + length;
        let held_end = self.data.len().clamp(start, end);
        let memory = (held_end > start).then(|| &self.data[start..held_end]);
        let zeros = zero_bytes();
        let zero_slices = (held_end..end)
            .step_by(zeros.len())
            .map(move |from| &zeros[..(end - from).min(zeros.len())]);
        memory.into_iter().chain(zero_slices)
    }
}

/// Zeros for the device writes of the part of a folio past its memory,
/// aligned for O_DIRECT; as long as the largest block, so one slice covers
/// what a folio of one block lacks.
fn zero_bytes() -> &'static [u8] {
    const ZERO_BYTES: usize = 64 << 10;
    static ZEROS: OnceLock<AlignedBuf> = OnceLock::new();
    ZEROS.get_or_init(|| AlignedBuf::zeroed(ZERO_BYTES))
}

impl std::fmt::Debug for Folio {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "Folio({}+{})", self.pos, self.bytes)
    }
}
