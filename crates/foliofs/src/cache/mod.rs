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
#[allow(unsafe_code)]
mod pool;
mod throttle;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use rustc_hash::FxHashMap;

pub use bits::BlockBits;
pub use folio::{Folio, FolioState};
pub use pool::BufferPool;
use pool::FolioMemory;
pub use throttle::{DirtyLimits, DirtyThrottle};

pub use crate::io_lock::Exclusive as IoExclusive;
use crate::io_lock::InodeIo;
use crate::lock_order::{Level, Ordered};
use crate::options::{DirtyMode, VolumeOptions};

/// Folios far ahead of a long stream that one write examines for
/// recycling (`PageCache::recycle_behind_stream`).
const AHEAD_FOLIOS_EXAMINED_MAX: usize = 16;

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

/// A writeback error sequence, as the kernel's errseq_t: every failure
/// advances it; each handle remembers the value it last saw, so its next
/// fsync reports a failure that happened since, exactly once.
#[derive(Default)]
struct ErrSeq {
    sequence: u64,
    /// Some handle has reported the latest failure.
    seen: bool,
    message: String,
}

/// Bits of `InodeCache::bypass_writes` that count the writes in flight.
const BYPASS_IN_FLIGHT_BITS: u32 = 24;
const BYPASS_IN_FLIGHT_MASK: u64 = (1 << BYPASS_IN_FLIGHT_BITS) - 1;

/// What a fill saw of the writes bypassing the cache when it began.
#[derive(Clone, Copy, Debug)]
pub struct FillTicket {
    bypass_writes: u64,
}

/// A file's writeback lock, held ([`InodeCache::lock_writeback`]).
pub type WritebackGuard<'a> = Ordered<MutexGuard<'a, ()>>;

pub struct InodeCache {
    pub ino: u64,
    pub io: InodeIo,
    folios: RwLock<BTreeMap<u64, Arc<Folio>>>,
    /// The keys of the folios with dirty blocks, so writeback and the
    /// dirty-block scans visit only those: an fdatasync of one dirty block
    /// in a large cached file used to test every folio's lock (a third of
    /// seed 001's CPU at 4,096 folios per file). Changed only under the
    /// folio's write lock, with its dirty bits: every folio with dirty
    /// blocks has its key here. A key may outlive its folio (`remove_range`
    /// leaves it) until writeback drops it. Lock order: a folio's lock,
    /// then this.
    dirty_keys: Mutex<BTreeSet<u64>>,
    folio_count: AtomicUsize,
    dirty_bytes: AtomicU64,
    /// When the file last went from clean to dirty (`Accounting::now_ms`),
    /// as the kernel's `dirtied_when`: later writes do not move it, so a
    /// file written to all the time still expires. Never reset to 0 when
    /// the file comes clean (a reset could overtake the next dirtying and
    /// leave a dirty file with no age): the age counts only while
    /// `dirty_bytes` is above 0, and each clean-to-dirty step sets it anew.
    dirtied_at_ms: AtomicU64,
    /// Held by writeback of this file and by everything that drops its
    /// folios (truncate, invalidation), so folios under writeback stay put.
    writeback_lock: Mutex<()>,
    errors: Mutex<ErrSeq>,
    /// The writes that bypass this cache (direct writes), as one word so a
    /// fill judges them with a single load: the low `BYPASS_IN_FLIGHT_BITS`
    /// count the writes in flight, the bits above count the writes
    /// finished. A write's end moves both in one `fetch_add`, so no fill
    /// can see it neither in flight nor finished (generic/451's stale
    /// read: a completion that ran between two separate loads).
    bypass_writes: AtomicU64,
    /// Where the next buffered write would continue a sequential stream,
    /// and the folio size the last write asked for (writers hold the I/O
    /// lock exclusively, so these need no more than atomics).
    write_next_pos: AtomicU64,
    write_folio_bytes: AtomicU64,
    /// Where the current sequential write stream began, and how far behind
    /// it folios have been recycled (`PageCache::recycle_behind_stream`).
    stream_start_pos: AtomicU64,
    stream_recycled_pos: AtomicU64,
    /// The stream has passed the dirty limit, or came round to the file's
    /// start from one that had (`PageCache::recycle_behind_stream`).
    stream_long: AtomicBool,
    /// The folio being filled that background writeback last left alone,
    /// and since when (`Self::folio_being_filled`).
    spared_filling: Mutex<Option<(u64, Instant)>>,
    /// Some handle opened with drop-behind: another cache holds the file's
    /// pages, so its folios are dropped once written back.
    drop_behind: AtomicBool,
    accounting: Arc<Accounting>,
    block_bytes: u64,
}

/// The key of the first folio overlapping `[start, ..)`: the one containing
/// `start` if any, else `start` itself.
fn first_key_overlapping(folios: &BTreeMap<u64, Arc<Folio>>, start: u64) -> u64 {
    folios
        .range(..=start)
        .next_back()
        .filter(|(_, folio)| folio.end() > start)
        .map_or(start, |(&key, _)| key)
}

/// The largest power of two up to `bytes` (at least `block`) whose range
/// aligned to it around `pos` overlaps no folio and ends by `end_limit`
/// (which the block containing `pos` may pass).
fn fitting_bytes(
    folios: &BTreeMap<u64, Arc<Folio>>,
    pos: u64,
    mut bytes: u64,
    block: u64,
    end_limit: u64,
) -> u64 {
    let next_start = folios.range(pos..).next().map_or(u64::MAX, |(&key, _)| key);
    let previous_end = folios.range(..pos).next_back().map_or(0, |(_, folio)| folio.end());
    let end_limit = end_limit.max(pos - pos % block + block);
    loop {
        let start = pos - pos % bytes;
        let end = start + bytes;
        let fits = start >= previous_end && end <= next_start && end <= end_limit;
        if fits || bytes <= block {
            return bytes;
        }
        bytes /= 2;
    }
}

/// The keys of the folios overlapping `[start, end)`.
fn keys_overlapping(folios: &BTreeMap<u64, Arc<Folio>>, start: u64, end: u64) -> Vec<u64> {
    let first_key = first_key_overlapping(folios, start);
    folios.range(first_key..end.max(first_key)).map(|(&key, _)| key).collect()
}

impl InodeCache {
    /// The file's writeback lock: held by writeback and by everything
    /// that drops its folios; after the I/O lock in the lock order.
    pub fn lock_writeback(&self) -> WritebackGuard<'_> {
        Ordered::lock(Level::Writeback, || self.writeback_lock.lock())
    }

    /// The writeback lock if it is free: for a writeback that already holds
    /// other files' writeback locks (files of one level are not ordered
    /// against each other, so it must not wait).
    pub fn try_lock_writeback(&self) -> Option<WritebackGuard<'_>> {
        Ordered::try_lock(Level::Writeback, || self.writeback_lock.try_lock())
    }

    /// Counts a write that bypasses the cache as in flight, before it
    /// reads the extent map or touches the device.
    pub fn bypass_write_started(&self) {
        let before = self.bypass_writes.fetch_add(1, Ordering::AcqRel);
        assert!(before & BYPASS_IN_FLIGHT_MASK < BYPASS_IN_FLIGHT_MASK, "bypass writes overflow");
    }

    /// Ends a write that bypasses the cache, after its device requests
    /// completed and its range was dropped from the cache, whether or not
    /// it succeeded: one step that lowers the in-flight count and raises
    /// the finished count.
    pub fn bypass_write_finished(&self) {
        let finished_one = (1u64 << BYPASS_IN_FLIGHT_BITS) - 1;
        let before = self.bypass_writes.fetch_add(finished_one, Ordering::AcqRel);
        assert!(before & BYPASS_IN_FLIGHT_MASK > 0, "bypass write finished twice");
    }

    /// What a buffered fill notes before it reads the extent map and the
    /// device; `fill_may_cache` judges it afterwards.
    pub fn fill_began(&self) -> FillTicket {
        FillTicket { bypass_writes: self.bypass_writes.load(Ordering::Acquire) }
    }

    /// Whether the bytes a fill read since `ticket` may be marked uptodate:
    /// only if no write bypassing the cache was in flight when it began and
    /// none started or finished since (one load decides both).
    pub fn fill_may_cache(&self, ticket: FillTicket) -> bool {
        #[cfg(test)]
        test_hooks::run_fill_judging_hook();
        let now = self.bypass_writes.load(Ordering::Acquire);
        now == ticket.bypass_writes && ticket.bypass_writes & BYPASS_IN_FLIGHT_MASK == 0
    }

    /// The folio size a buffered write of `length` bytes at `pos` asks for
    /// where it finds no folio: the write's length, or, when the write
    /// continues where the previous one on this file ended, twice what that
    /// one asked for (as readahead grows its window, and as the kernel grows
    /// folio orders for a file that proves sequential). `folio_for` rounds
    /// and clamps it.
    pub fn write_folio_bytes(&self, pos: u64, length: u64, folio_max_bytes: u64) -> u64 {
        let previous = self.write_folio_bytes.load(Ordering::Relaxed);
        let sequential = self.write_next_pos.load(Ordering::Relaxed) == pos;
        let wanted = if sequential { length.max(previous.saturating_mul(2)) } else { length };
        let wanted = wanted.min(folio_max_bytes);
        if !sequential {
            self.stream_start_pos.store(pos, Ordering::Relaxed);
            self.stream_recycled_pos.store(pos, Ordering::Relaxed);
            // A long stream that starts over from the file's start (a file
            // rewritten pass after pass) stays long.
            let came_round = pos == 0 && self.stream_long.load(Ordering::Relaxed);
            self.stream_long.store(came_round, Ordering::Relaxed);
        }
        self.write_folio_bytes.store(wanted, Ordering::Relaxed);
        self.write_next_pos.store(pos.saturating_add(length), Ordering::Relaxed);
        wanted
    }

    /// Where the folio that the last buffered write ended inside starts, for
    /// background writeback to leave alone: writeback read-locks the folios
    /// it writes, so taking one a sequential writer is half-way through
    /// stalls the writer's next write for the whole batch (on the bench VM,
    /// 80-100 ms each time, 1.4 s of a 6 s stream; with nothing dirtied
    /// meanwhile, the flusher then slept while the device idled). One folio
    /// is left alone for at most `spare_max` from the first time it was, so
    /// a slow appender's tail still reaches the disk; with `spare_max` zero,
    /// none is.
    pub fn folio_being_filled(&self, spare_max: Duration) -> Option<u64> {
        if spare_max.is_zero() {
            return None;
        }
        let next = self.write_next_pos.load(Ordering::Relaxed);
        let filling = {
            let folios = self.folios.read();
            let (&key, folio) = folios.range(..next).next_back()?;
            if folio.end() <= next {
                return None;
            }
            key
        };
        let now = Instant::now();
        let mut spared = self.spared_filling.lock();
        match *spared {
            Some((key, since)) if key == filling => {
                (now.duration_since(since) < spare_max).then_some(filling)
            }
            _ => {
                *spared = Some((filling, now));
                Some(filling)
            }
        }
    }

    pub fn has_folios(&self) -> bool {
        self.folio_count.load(Ordering::Acquire) > 0
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes.load(Ordering::Relaxed)
    }

    /// How long the file has had dirty data (since it last went from clean
    /// to dirty); None while it is clean.
    pub fn dirty_age(&self) -> Option<Duration> {
        if self.dirty_bytes.load(Ordering::Acquire) == 0 {
            return None;
        }
        let since_ms = self.dirtied_at_ms.load(Ordering::Acquire);
        Some(Duration::from_millis(self.accounting.now_ms().saturating_sub(since_ms)))
    }

    /// The folio containing file offset `pos`, if cached.
    pub fn folio_at(&self, pos: u64) -> Option<Arc<Folio>> {
        let folios = self.folios.read();
        let (_, folio) = folios.range(..=pos).next_back()?;
        (folio.end() > pos).then(|| Arc::clone(folio))
    }

    /// The first block in `[start, end)` (`start` block-aligned) whose
    /// cached dirty bit is `dirty`, going folio by folio. Blocks with no
    /// folio, and those of folios `skip` names (folios the caller holds
    /// locked), count as clean.
    pub fn first_block_with_dirty(
        &self,
        start: u64,
        end: u64,
        block_bytes: u64,
        dirty: bool,
        skip: impl Fn(&Folio) -> bool,
    ) -> Option<u64> {
        let mut at = start;
        // Looking for dirty blocks, only folios with some need a look.
        let folios = if dirty {
            let map = self.folios.read();
            let first_key = first_key_overlapping(&map, start);
            let keys = self.dirty_keys_in(first_key, end);
            keys.iter().filter_map(|key| map.get(key).map(Arc::clone)).collect()
        } else {
            self.folios_in(start, end)
        };
        for folio in folios {
            if folio.pos() > at {
                // A gap with no folio: clean blocks.
                if !dirty {
                    return Some(at);
                }
                at = folio.pos();
            }
            if skip(&folio) {
                if !dirty {
                    return Some(at);
                }
                at = folio.end();
                continue;
            }
            let state = folio.read();
            while at < folio.end().min(end) {
                let (index, _) = folio.blocks_of(at, at + 1);
                if state.dirty.get(index) == dirty {
                    return Some(at);
                }
                at += block_bytes;
            }
        }
        (at < end && !dirty).then_some(at)
    }

    /// The folios overlapping `[start, end)`, in order.
    pub fn folios_in(&self, start: u64, end: u64) -> Vec<Arc<Folio>> {
        if start >= end {
            return Vec::new();
        }
        let folios = self.folios.read();
        let first_key = first_key_overlapping(&folios, start);
        folios.range(first_key..end).map(|(_, folio)| Arc::clone(folio)).collect()
    }

    /// Dirty folios from the one containing `start` on, in order, up to
    /// `bytes_max` of folios (at least one) or `end`.
    pub fn dirty_folios_from(&self, start: u64, end: u64, bytes_max: usize) -> Vec<Arc<Folio>> {
        let folios = self.folios.read();
        let first_key = first_key_overlapping(&folios, start);
        let mut batch = Vec::new();
        let mut bytes = 0;
        // The writeback checks each folio under its lock anyway: one dirtied
        // or cleaned since is handled there or by the next writeback.
        for key in self.dirty_keys_in(first_key, end) {
            if bytes >= bytes_max {
                break;
            }
            match folios.get(&key) {
                Some(folio) => {
                    bytes += folio.bytes();
                    batch.push(Arc::clone(folio));
                }
                // Left by `remove_range`. No folio can take the key while
                // the map is read-locked here, so none is lost.
                None => {
                    self.dirty_keys.lock().remove(&key);
                }
            }
        }
        batch
    }

    /// Writeback found `folio` clean under its write lock: drops its key if
    /// one is left (by a folio removed dirty at the same place). The folio is
    /// in the map, since writeback holds `writeback_lock`.
    pub fn note_clean(&self, folio: &Folio, state: &FolioState) {
        if state.dirty.is_empty() {
            self.note_dirty_state(folio, state);
        }
    }

    /// The keys of folios with dirty blocks in `[first_key, end)`, in order.
    fn dirty_keys_in(&self, first_key: u64, end: u64) -> Vec<u64> {
        self.dirty_keys.lock().range(first_key..end.max(first_key)).copied().collect()
    }

    /// Keeps [`Self::dirty_keys`] in step after `folio`'s dirty bits
    /// changed (the caller holds its write lock).
    fn note_dirty_state(&self, folio: &Folio, state: &FolioState) {
        let mut keys = self.dirty_keys.lock();
        if state.dirty.is_empty() {
            keys.remove(&folio.pos());
        } else {
            keys.insert(folio.pos());
        }
    }

    /// Marks blocks dirty. They must be uptodate (writeback writes whole
    /// blocks from memory) and mapped (their space reserved, so writeback
    /// cannot meet ENOSPC): ARCHITECTURE.md's invariant, asserted here.
    pub fn mark_dirty(&self, folio: &Folio, state: &mut FolioState, first: usize, count: usize) {
        assert!(
            state.uptodate.all_set(first, count) && state.mapped.all_set(first, count),
            "inode {}: blocks {first}..{} marked dirty while not uptodate and mapped",
            self.ino,
            first + count
        );
        let was_clean = state.dirty.is_empty();
        let newly = state.dirty.set_range(first, count);
        if was_clean && newly > 0 {
            self.note_dirty_state(folio, state);
        }
        self.account_dirty(newly as i64);
    }

    /// Clears and returns a folio's dirty bits, for writeback.
    pub fn take_dirty(&self, folio: &Folio, state: &mut FolioState) -> BlockBits {
        let taken = state.dirty.take();
        if !taken.is_empty() {
            self.note_dirty_state(folio, state);
        }
        self.account_dirty(-(taken.count_set() as i64));
        taken
    }

    /// Marks blocks dirty again after their writeback failed.
    pub fn redirty(&self, folio: &Folio, state: &mut FolioState, blocks: &BlockBits) {
        let newly = state.dirty.union_with(blocks);
        if newly > 0 {
            self.note_dirty_state(folio, state);
        }
        self.account_dirty(newly as i64);
    }

    fn account_dirty(&self, blocks: i64) {
        if blocks == 0 {
            return;
        }
        let bytes = blocks.unsigned_abs() * self.block_bytes;
        if blocks > 0 {
            if self.dirty_bytes.fetch_add(bytes, Ordering::AcqRel) == 0 {
                self.dirtied_at_ms.store(self.accounting.now_ms(), Ordering::Release);
            }
            self.accounting.dirty_bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.dirty_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.accounting.dirty_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Drops the folios overlapping `[start, end)`, dirty or not (the caller
    /// wrote back what must survive, and holds `writeback_lock`). Folios
    /// still referenced elsewhere free their memory when the last user lets go.
    pub fn remove_range(&self, start: u64, end: u64) -> usize {
        let removed: Vec<Arc<Folio>> = {
            let mut folios = self.folios.write();
            let keys = keys_overlapping(&folios, start, end);
            keys.iter().filter_map(|key| folios.remove(key)).collect()
        };
        for folio in &removed {
            // Only the bits: its key stays in `dirty_keys`, since a new folio
            // may already have taken that key and been dirtied; writeback
            // drops keys that name no folio or a clean one.
            let taken = folio.write().dirty.take();
            self.account_dirty(-(taken.count_set() as i64));
        }
        self.folio_count.fetch_sub(removed.len(), Ordering::AcqRel);
        removed.len()
    }

    /// Drops clean folios overlapping `[start, end)` that nobody is using:
    /// what a direct write does after completing, so a buffered read that
    /// raced with it cannot keep stale bytes.
    pub fn remove_clean_range(&self, start: u64, end: u64) {
        self.remove_idle_clean(start, end, u64::MAX, false);
    }

    /// Drop-behind: as [`Self::remove_clean_range`], but only the folios
    /// that end by `folio_end_max` (a read keeps the folio it ended inside),
    /// and their memory goes back to the system rather than to the pool
    /// beyond a little kept for the next readahead: memory kept for reuse is
    /// still resident, a second copy by another name.
    pub fn drop_behind_range(&self, start: u64, end: u64, folio_end_max: u64) {
        self.remove_idle_clean(start, end, folio_end_max, true);
    }

    fn remove_idle_clean(&self, start: u64, end: u64, folio_end_max: u64, release: bool) {
        let mut folios = self.folios.write();
        for key in keys_overlapping(&folios, start, end) {
            let idle_and_clean = folios.get(&key).is_some_and(|folio| {
                folio.end() <= folio_end_max
                    && Arc::strong_count(folio) == 1
                    && folio.try_read().is_some_and(|state| state.dirty.is_empty())
            });
            if idle_and_clean {
                if let Some(folio) = folios.remove(&key) {
                    if release {
                        folio.release_memory_when_dropped();
                    }
                }
                self.folio_count.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// From now on the file's folios are dropped once written back.
    pub fn set_drop_behind(&self) {
        self.drop_behind.store(true, Ordering::Relaxed);
    }

    pub fn drops_behind(&self) -> bool {
        self.drop_behind.load(Ordering::Relaxed)
    }

    /// Records a failed writeback.
    pub fn record_error(&self, message: String) {
        let mut errors = self.errors.lock();
        errors.sequence += 1;
        errors.seen = false;
        errors.message = message;
    }

    /// The value a new handle starts from: a failure nobody has reported yet
    /// is still reported to it.
    pub fn error_sample(&self) -> u64 {
        let errors = self.errors.lock();
        if errors.seen || errors.sequence == 0 {
            errors.sequence
        } else {
            errors.sequence - 1
        }
    }

    /// A failure since `seen` (which advances): its message, once per handle.
    pub fn check_error(&self, seen: &AtomicU64) -> Option<String> {
        let mut errors = self.errors.lock();
        if seen.swap(errors.sequence, Ordering::AcqRel) == errors.sequence {
            return None;
        }
        errors.seen = true;
        Some(errors.message.clone())
    }
}

struct FlusherState {
    wake: bool,
    stop: bool,
}

/// Why the flusher runs a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlusherRound {
    /// Dirty data passed the background threshold, or memory ran short:
    /// every dirty file is written back.
    Woken,
    /// The interval passed: the files dirty for `dirty_expire` are.
    Interval,
}

/// Shards of the cache's file table: opens, closes and new folios of
/// unrelated files take different locks (on 2 CPUs, two threads creating
/// small files waited on the one map's lock more than on anything else).
const CACHE_SHARDS: usize = 64;

/// The shard of file `ino` (Fibonacci hashing, as the metadata's shards).
fn cache_shard_of(ino: u64) -> usize {
    (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CACHE_SHARDS.trailing_zeros())) as usize
}

/// One shard of the file table, on cache lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct CacheShard {
    inodes: Mutex<FxHashMap<u64, Arc<InodeCache>>>,
    /// The shard's folios, in CLOCK order; entries of dropped folios are
    /// discarded as the hand meets them.
    clock: Mutex<VecDeque<(Weak<InodeCache>, Weak<Folio>)>>,
    /// The clock's length past which the next folio compacts it (changed
    /// under the clock's lock).
    clock_compact_len: AtomicUsize,
    /// Entries compactions scanned, for the test that bounds them.
    #[cfg(test)]
    clock_entries_scanned: AtomicUsize,
}

pub struct PageCache {
    policy: CachePolicy,
    shards: Box<[CacheShard]>,
    /// Where the next eviction starts: shards take turns.
    clock_hand: AtomicUsize,
    accounting: Arc<Accounting>,
    flusher: Mutex<FlusherState>,
    flusher_wake: Condvar,
    /// Signalled when writeback made progress (throttled writers wait on it).
    progress: Condvar,
    /// Writers' pacing by the measured writeback bandwidth.
    throttle: DirtyThrottle,
}

impl PageCache {
    /// A cache that gives the copy reservations of folios it drops back
    /// through `give_back_reserved`.
    pub fn new(policy: CachePolicy, give_back_reserved: GiveBackReserved) -> Self {
        let accounting = Arc::new(Accounting {
            cached_bytes: AtomicU64::new(0),
            live_folios: AtomicUsize::new(0),
            dirty_bytes: AtomicU64::new(0),
            pool: BufferPool::new(policy.cache_bytes),
            memory_unit_bytes: policy.memory_unit_bytes as usize,
            epoch: Instant::now(),
            give_back_reserved,
        });
        Self {
            policy,
            shards: (0..CACHE_SHARDS).map(|_| CacheShard::default()).collect(),
            clock_hand: AtomicUsize::new(0),
            accounting,
            flusher: Mutex::new(FlusherState { wake: false, stop: false }),
            flusher_wake: Condvar::new(),
            progress: Condvar::new(),
            throttle: DirtyThrottle::new(policy.dirty_limits()),
        }
    }

    pub fn policy(&self) -> &CachePolicy {
        &self.policy
    }

    pub fn cached_bytes(&self) -> u64 {
        self.accounting.cached_bytes.load(Ordering::Relaxed)
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.accounting.dirty_bytes.load(Ordering::Relaxed)
    }

    /// Folios alive: in a file's map, or dropped from it but still in use.
    pub fn folio_count(&self) -> u64 {
        self.accounting.live_folios.load(Ordering::Relaxed) as u64
    }

    /// Memory behind the folios: slabs of small folios (in use or free),
    /// buffers of large ones, and freed buffers kept for reuse.
    pub fn memory_bytes(&self) -> u64 {
        self.accounting.pool.memory_bytes()
    }

    /// Folio buffers reused from the pool and freshly allocated so far.
    pub fn buffers_handed_out(&self) -> (u64, u64) {
        self.accounting.pool.handed_out()
    }

    /// The file's cache entry, created on first use. One per inode, so every
    /// handle shares the same I/O lock and folios.
    pub fn inode(&self, ino: u64) -> Arc<InodeCache> {
        let mut inodes = self.shard(ino).inodes.lock();
        let entry = inodes.entry(ino).or_insert_with(|| {
            Arc::new(InodeCache {
                ino,
                io: InodeIo::new(),
                folios: RwLock::new(BTreeMap::new()),
                dirty_keys: Mutex::new(BTreeSet::new()),
                folio_count: AtomicUsize::new(0),
                dirty_bytes: AtomicU64::new(0),
                dirtied_at_ms: AtomicU64::new(0),
                writeback_lock: Mutex::new(()),
                errors: Mutex::new(ErrSeq::default()),
                bypass_writes: AtomicU64::new(0),
                // No write yet: nothing continues a stream.
                write_next_pos: AtomicU64::new(u64::MAX),
                write_folio_bytes: AtomicU64::new(0),
                stream_start_pos: AtomicU64::new(0),
                stream_recycled_pos: AtomicU64::new(0),
                stream_long: AtomicBool::new(false),
                spared_filling: Mutex::new(None),
                drop_behind: AtomicBool::new(false),
                accounting: Arc::clone(&self.accounting),
                block_bytes: self.policy.block_bytes,
            })
        });
        Arc::clone(entry)
    }

    /// The entry of `ino` if it exists.
    pub fn existing_inode(&self, ino: u64) -> Option<Arc<InodeCache>> {
        self.shard(ino).inodes.lock().get(&ino).cloned()
    }

    /// Forgets the entry of `ino` if nothing uses it (no handle, no I/O, no
    /// folio) but the map and the `held_by_caller` references of a caller
    /// about to let go.
    pub fn release_inode(&self, ino: u64, held_by_caller: usize) {
        let mut inodes = self.shard(ino).inodes.lock();
        let idle = inodes.get(&ino).is_some_and(|entry| {
            Arc::strong_count(entry) == 1 + held_by_caller && !entry.has_folios()
        });
        if idle {
            inodes.remove(&ino);
        }
    }

    /// Drops every folio of a freed file (its data has nowhere to go).
    pub fn discard_inode(&self, ino: u64) {
        if let Some(entry) = self.existing_inode(ino) {
            let _writeback = entry.lock_writeback();
            entry.remove_range(0, u64::MAX);
        }
        self.release_inode(ino, 0);
    }

    /// Entries with dirty data, or with a writeback in progress (whose dirty
    /// bits it has already taken), for the flusher and syncfs: syncfs must
    /// wait for such a writeback, or it returns before that data is durable.
    pub fn dirty_inodes(&self) -> Vec<Arc<InodeCache>> {
        let mut dirty = Vec::new();
        for shard in self.shards.iter() {
            dirty.extend(
                shard
                    .inodes
                    .lock()
                    .values()
                    .filter(|entry| entry.dirty_bytes() > 0 || entry.writeback_lock.is_locked())
                    .cloned(),
            );
        }
        dirty
    }

    fn shard(&self, ino: u64) -> &CacheShard {
        &self.shards[cache_shard_of(ino)]
    }

    /// The folio containing `pos`, or a new one: the largest power of two up
    /// to `bytes_wanted` (at least a block, at most `folio_max`) whose
    /// aligned range overlaps no cached folio and ends by `end_limit` (which
    /// the block containing `pos` may pass). Evicts first if memory is short.
    pub fn folio_for(
        &self,
        inode: &Arc<InodeCache>,
        pos: u64,
        bytes_wanted: u64,
        end_limit: u64,
    ) -> Arc<Folio> {
        if let Some(folio) = inode.folio_at(pos) {
            return folio;
        }
        let block = self.policy.block_bytes;
        let mut bytes = bytes_wanted.clamp(block, self.policy.folio_max_bytes);
        bytes = if bytes.is_power_of_two() { bytes } else { bytes.next_power_of_two() / 2 };
        // Room for the folio that fits now (a streaming writer asks for far
        // more than fits between its earlier folios), not for the ask.
        bytes = fitting_bytes(&inode.folios.read(), pos, bytes, block, end_limit);
        self.make_room(bytes);
        let folio = {
            let mut folios = inode.folios.write();
            if let Some((_, folio)) = folios.range(..=pos).next_back() {
                if folio.end() > pos {
                    return Arc::clone(folio);
                }
            }
            // Folios may have come meanwhile: fit again (it only shrinks).
            bytes = fitting_bytes(&folios, pos, bytes, block, end_limit);
            let start = pos - pos % bytes;
            // A folio of one block gets its memory as it is written (see
            // `folio`): most of a small file's block is never written.
            let data = if bytes == block && block > self.policy.memory_unit_bytes {
                FolioMemory::empty()
            } else {
                self.accounting.pool.take(bytes as usize)
            };
            self.accounting.cached_bytes.fetch_add(bytes, Ordering::Relaxed);
            let folio = Arc::new(Folio::new(
                start,
                bytes as usize,
                block as usize,
                data,
                Arc::clone(&self.accounting),
            ));
            folios.insert(start, Arc::clone(&folio));
            inode.folio_count.fetch_add(1, Ordering::AcqRel);
            folio
        };
        let shard = self.shard(inode.ino);
        let mut clock = shard.clock.lock();
        clock.push_back((Arc::downgrade(inode), Arc::downgrade(&folio)));
        // Entries of dropped folios go when the hand meets them, which only
        // happens under memory pressure: compact now and then instead. Not
        // again until the clock has grown by what is left, so compaction
        // costs O(1) a folio even when the live folios of one file (all in
        // its inode's shard) are far more than a shard's share: compacting
        // whenever the clock passed twice that share scanned all 131,072
        // live entries of a 512 MiB file's 4 KiB folios for every new one,
        // and random 4 KiB writes through the mount ran at 7,700 IOPS.
        let live_per_shard = self.accounting.live_folios.load(Ordering::Relaxed) / CACHE_SHARDS;
        let compact_len =
            shard.clock_compact_len.load(Ordering::Relaxed).max(2 * live_per_shard + 1024);
        if clock.len() > compact_len {
            #[cfg(test)]
            shard.clock_entries_scanned.fetch_add(clock.len(), Ordering::Relaxed);
            clock.retain(|(_, folio)| folio.strong_count() > 0);
            shard.clock_compact_len.store(2 * clock.len() + 1024, Ordering::Relaxed);
        }
        drop(clock);
        folio
    }

    /// Drop-behind for a long sequential writer (a stream that began more
    /// than `dirty_limit` bytes before `pos`): about to write `bytes`, it
    /// first drops as many bytes of its own clean, idle folios lying more
    /// than `dirty_limit` behind it, oldest first, so their memory (through
    /// the pool) becomes its next folios instead of fresh memory. One for
    /// one, so freed memory never piles up in the pool (past its limit it
    /// would be freed, and faulted in fresh again). As many again come from
    /// the file's clean folios more than `dirty_limit` ahead of it, from the
    /// far end: a stream that came round again (a file rewritten from its
    /// start, as fio's time-based jobs do) finds the last pass's tail cached
    /// there, the file's oldest data, which otherwise stayed until the cache
    /// was full while every new folio took fresh memory (on the bench VM the
    /// writeback job faulted in its whole 1 GiB cache that way). Such a
    /// stream stays long from its first write, so the tail goes first.
    ///
    /// A stream larger than the dirty limit is throttled to the device
    /// anyway; growing the cache with it first-touches fresh memory for
    /// every folio (the kernel clearing pages in the writer's path was most
    /// of its CPU, and on a VM fresh memory faulted in at 0.3 GB/s), and
    /// pushes out what other files cache, for data already on disk. The
    /// stream's last `dirty_limit` bytes stay cached, as does every smaller
    /// file. The writer holds the file's I/O lock.
    pub fn recycle_behind_stream(&self, inode: &InodeCache, pos: u64, bytes: u64) {
        let keep_bytes = self.policy.dirty_limit_bytes;
        let start = inode.stream_start_pos.load(Ordering::Relaxed);
        // Behind it: from where the last write stopped, to `dirty_limit`
        // behind it (nothing while the stream is shorter than that).
        let from = inode.stream_recycled_pos.load(Ordering::Relaxed);
        let end = pos.saturating_sub(keep_bytes).max(start);
        if end > start {
            inode.stream_long.store(true, Ordering::Relaxed);
        } else if !inode.stream_long.load(Ordering::Relaxed) {
            return;
        }
        let ahead_from = pos.saturating_add(bytes).saturating_add(keep_bytes);
        if from >= end && inode.folios.read().range(ahead_from..).next().is_none() {
            return;
        }
        let idle_and_clean = |folio: &Arc<Folio>| {
            Arc::strong_count(folio) == 1
                && folio.try_read().is_some_and(|state| state.dirty.is_empty())
        };
        let mut recycled = Vec::new();
        let mut folios = inode.folios.write();
        let mut behind_bytes = 0;
        let mut reached = from;
        for key in keys_overlapping(&folios, from, end) {
            let folio = &folios[&key];
            // Stops at the first folio still dirty, under writeback or in
            // use: the next write resumes there.
            if behind_bytes >= bytes || folio.end() > end || !idle_and_clean(folio) {
                reached = key.max(from);
                break;
            }
            reached = folio.end();
            behind_bytes += folio.bytes() as u64;
            recycled.extend(folios.remove(&key));
        }
        let mut ahead_bytes = 0;
        let ahead: Vec<u64> = folios
            .range(ahead_from..)
            .rev()
            .take(AHEAD_FOLIOS_EXAMINED_MAX)
            .filter(|(_, folio)| idle_and_clean(folio))
            .map(|(&key, _)| key)
            .collect();
        for key in ahead {
            if ahead_bytes >= bytes {
                break;
            }
            let folio = folios.remove(&key).expect("listed under the map's lock");
            ahead_bytes += folio.bytes() as u64;
            recycled.push(folio);
        }
        drop(folios);
        inode.folio_count.fetch_sub(recycled.len(), Ordering::AcqRel);
        inode.stream_recycled_pos.store(reached, Ordering::Relaxed);
        // Dropped outside the map's lock: each gives its memory to the pool.
        drop(recycled);
    }

    /// Evicts clean, idle folios (CLOCK: a used folio gets a second chance)
    /// until `bytes` more fit under `cache_bytes`, or a full sweep found
    /// nothing more to evict. Dirty folios stay: the flusher cleans them.
    fn make_room(&self, bytes: u64) {
        if self.cached_bytes() + bytes <= self.policy.cache_bytes {
            return;
        }
        // Shard by shard from the hand, each shard's CLOCK as one cache's.
        let first = self.clock_hand.fetch_add(1, Ordering::Relaxed);
        for step in 0..CACHE_SHARDS {
            if self.cached_bytes() + bytes <= self.policy.cache_bytes {
                break;
            }
            let shard = &self.shards[(first + step) % CACHE_SHARDS];
            let mut clock = shard.clock.lock();
            let mut budget = clock.len() * 2;
            while self.cached_bytes() + bytes > self.policy.cache_bytes && budget > 0 {
                budget -= 1;
                let Some((inode, folio)) = clock.pop_front() else { break };
                let (Some(inode_strong), Some(folio_strong)) = (inode.upgrade(), folio.upgrade())
                else {
                    continue;
                };
                if folio_strong.take_referenced() || !self.try_evict(&inode_strong, &folio_strong) {
                    clock.push_back((inode, folio));
                    continue;
                }
                drop(folio_strong);
                if !inode_strong.has_folios() {
                    drop(inode_strong);
                    self.release_inode_from_clock(&inode);
                }
            }
        }
        if self.dirty_bytes() > 0 && self.cached_bytes() + bytes > self.policy.cache_bytes {
            self.wake_flusher();
        }
    }

    fn release_inode_from_clock(&self, inode: &Weak<InodeCache>) {
        if let Some(entry) = inode.upgrade() {
            let ino = entry.ino;
            drop(entry);
            self.release_inode(ino, 0);
        }
    }

    /// Removes `folio` from its file if it is clean and only the map (and
    /// the caller) hold it.
    fn try_evict(&self, inode: &InodeCache, folio: &Arc<Folio>) -> bool {
        let Some(mut folios) = inode.folios.try_write() else { return false };
        let in_map = folios.get(&folio.pos()).is_some_and(|cached| Arc::ptr_eq(cached, folio));
        let idle = in_map && Arc::strong_count(folio) == 2;
        if !idle || !folio.try_read().is_some_and(|state| state.dirty.is_empty()) {
            return false;
        }
        folios.remove(&folio.pos());
        inode.folio_count.fetch_sub(1, Ordering::AcqRel);
        true
    }

    /// Dirty data passed the background threshold or memory is short: the
    /// flusher should run now rather than at its next interval.
    pub fn wake_flusher(&self) {
        let mut flusher = self.flusher.lock();
        if !flusher.wake {
            flusher.wake = true;
            self.flusher_wake.notify_all();
        }
    }

    /// What the flusher does between rounds: waits for a wake-up or the
    /// interval (None: only wake-ups). Returns why it should run, or None
    /// when it should stop.
    pub fn flusher_wait(&self, interval: Option<Duration>) -> Option<FlusherRound> {
        let mut flusher = self.flusher.lock();
        if !flusher.wake && !flusher.stop {
            match interval {
                Some(interval) => {
                    self.flusher_wake.wait_for(&mut flusher, interval);
                }
                None => self.flusher_wake.wait(&mut flusher),
            }
        }
        if flusher.stop {
            return None;
        }
        let woken = std::mem::take(&mut flusher.wake);
        Some(if woken { FlusherRound::Woken } else { FlusherRound::Interval })
    }

    /// The files with data dirty for at least `dirty_expire` (the
    /// flusher's interval pass writes back only these).
    pub fn expired_dirty_inodes(&self) -> Vec<Arc<InodeCache>> {
        let expire = self.policy.dirty_expire;
        let mut inodes = self.dirty_inodes();
        inodes.retain(|entry| entry.dirty_age().is_some_and(|age| age >= expire));
        inodes
    }

    pub fn stop_flusher(&self) {
        let mut flusher = self.flusher.lock();
        flusher.stop = true;
        self.flusher_wake.notify_all();
    }

    pub fn over_background_threshold(&self) -> bool {
        self.dirty_bytes() > self.policy.dirty_background_bytes
    }

    pub fn over_dirty_limit(&self) -> bool {
        self.dirty_bytes() > self.policy.dirty_limit_bytes
    }

    /// Writeback's bandwidth estimate and the writers' pacing clock.
    pub fn throttle(&self) -> &DirtyThrottle {
        &self.throttle
    }

    /// How long a writer that just dirtied `bytes` sleeps now (see
    /// [`DirtyThrottle::pause_for`]).
    pub fn throttle_pause(&self, bytes: u64) -> Duration {
        let (limits, dirty) = (self.policy.dirty_limits(), self.dirty_bytes());
        // Below the freerun ceiling (nearly every write) no clock is read.
        if dirty <= limits.freerun_bytes() {
            return Duration::ZERO;
        }
        self.throttle.pause_for(limits, dirty, bytes, Instant::now())
    }

    /// Writeback finished a round: wake throttled writers.
    pub fn note_progress(&self) {
        let _flusher = self.flusher.lock();
        self.progress.notify_all();
    }

    /// A throttled writer waits for writeback progress (bounded, so a stuck
    /// device slows writers down instead of hanging them).
    pub fn wait_for_progress(&self, timeout: Duration) {
        let mut flusher: MutexGuard<'_, FlusherState> = self.flusher.lock();
        self.progress.wait_for(&mut flusher, timeout);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(cache_bytes: u64) -> PageCache {
        let options =
            VolumeOptions { cache_bytes, folio_max_bytes: 64 << 10, ..Default::default() };
        PageCache::new(CachePolicy::new(&options, 4096), Arc::new(|_| {}))
    }

    /// One file's live folios all sit in its inode's shard, far more than
    /// a shard's share of the cache: compacting the shard's clock must
    /// still cost O(1) a new folio, not a scan of all of them each time.
    #[test]
    fn the_clock_of_one_large_file_is_compacted_in_amortised_constant_time() {
        const FOLIOS: usize = 20_000;
        let cache = cache(256 << 20);
        let inode = cache.inode(3);
        for index in 0..FOLIOS as u64 {
            drop(cache.folio_for(&inode, index * 4096, 4096, u64::MAX));
        }
        assert_eq!(inode.folios_in(0, u64::MAX).len(), FOLIOS);
        let scanned = cache.shard(3).clock_entries_scanned.load(Ordering::Relaxed);
        assert!(scanned <= 4 * FOLIOS, "compactions scanned {scanned} entries for {FOLIOS} folios");
        inode.remove_range(0, u64::MAX);
    }

    /// A folio of one block holds only what was written of it: its memory
    /// grows in powers of two from the unit and keeps its bytes, and
    /// reads and device writes see zeros past it. Larger folios, and every
    /// folio when the device's logical block is the block, get all of
    /// their memory at once.
    #[test]
    fn a_folio_of_one_block_holds_only_what_was_written_of_it() {
        let cache = cache(64 << 20);
        let inode = cache.inode(3);
        let folio = cache.folio_for(&inode, 0, 1000, u64::MAX);
        assert_eq!(folio.bytes(), 4096);
        let mut state = folio.write();
        assert_eq!(state.memory_bytes(), 0);
        folio.bytes_mut(&mut state, 0, 700).fill(7);
        assert_eq!(state.memory_bytes(), 1024);
        folio.bytes_mut(&mut state, 1500, 1600).fill(9);
        assert_eq!(state.memory_bytes(), 2048);
        let mut expected = vec![0u8; 4096];
        expected[..700].fill(7);
        expected[1500..1600].fill(9);
        let mut out = vec![1u8; 4096];
        state.copy_out(0, &mut out);
        assert!(out == expected, "memory, then zeros");
        let mut past = vec![1u8; 1000];
        state.copy_out(3000, &mut past);
        assert!(past.iter().all(|&byte| byte == 0), "wholly past the memory");
        let slices: Vec<&[u8]> = state.io_slices(512, 3584).collect();
        let lengths: Vec<usize> = slices.iter().map(|slice| slice.len()).collect();
        assert_eq!(lengths, [1536, 2048], "the memory held, then zeros");
        assert!(slices.concat() == expected[512..]);
        assert_eq!(state.in_memory(1024, 2048).map(<[u8]>::len), Some(1024));
        assert!(state.in_memory(1024, 2049).is_none(), "past the memory");
        state.zero(600, 4096);
        expected[600..].fill(0);
        state.copy_out(0, &mut out);
        assert!(out == expected);
        folio.bytes_mut(&mut state, 0, 4096);
        assert_eq!(state.memory_bytes(), 4096);
        drop(state);
        let large = cache.folio_for(&inode, 65536, 16384, u64::MAX);
        assert_eq!((large.bytes(), large.read().memory_bytes()), (16384, 16384));
        inode.remove_range(0, u64::MAX);

        let options = VolumeOptions { cache_bytes: 64 << 20, ..Default::default() };
        let policy = CachePolicy::new(&options, 4096).for_device(4096);
        let whole_blocks = PageCache::new(policy, Arc::new(|_| {}));
        let inode = whole_blocks.inode(3);
        let folio = whole_blocks.folio_for(&inode, 0, 1000, u64::MAX);
        assert_eq!(folio.read().memory_bytes(), 4096, "the device's block is the unit");
        inode.remove_range(0, u64::MAX);
    }

    #[test]
    fn folios_are_aligned_and_never_overlap() {
        let cache = cache(64 << 20);
        let inode = cache.inode(7);
        let big = cache.folio_for(&inode, 70_000, 64 << 10, u64::MAX);
        assert_eq!((big.pos(), big.bytes()), (65536, 65536));
        // Just before it: a 64 KiB folio at 0 would fit exactly.
        let before = cache.folio_for(&inode, 100, 64 << 10, u64::MAX);
        assert_eq!((before.pos(), before.bytes()), (0, 65536));
        let inside = cache.folio_for(&inode, 5000, 4096, u64::MAX);
        assert!(Arc::ptr_eq(&inside, &before), "5000 is inside the folio at 0");
        // A one-block gap between two folios gets a one-block folio.
        inode.remove_range(0, 1);
        let left = cache.folio_for(&inode, 0, 4096, u64::MAX);
        let right = cache.folio_for(&inode, 8192, 4096, u64::MAX);
        let gap = cache.folio_for(&inode, 4096, 64 << 10, u64::MAX);
        assert_eq!((left.bytes(), right.bytes(), gap.pos(), gap.bytes()), (4096, 4096, 4096, 4096));
        let end_limited = cache.folio_for(&inode, 1 << 20, 64 << 10, (1 << 20) + 8192);
        assert_eq!(end_limited.bytes(), 8192);
        drop((before, inside));
        assert_eq!(cache.cached_bytes(), 65536 + 3 * 4096 + 8192);
        assert_eq!(inode.folios_in(0, u64::MAX).len(), 5);
    }

    /// Writeback and the dirty-block scans find dirty folios through
    /// `dirty_keys`: it must name each dirty folio, and drop clean ones.
    #[test]
    fn the_dirty_index_names_the_dirty_folios_only() {
        const FOLIO: u64 = 64 << 10;
        let cache = cache(16 << 20);
        let inode = cache.inode(1);
        let dirty_at = |pos: u64| {
            let folio = cache.folio_for(&inode, pos, FOLIO, u64::MAX);
            let mut state = folio.write();
            state.uptodate.set_range(0, 16);
            state.mapped.set_range(0, 16);
            inode.mark_dirty(&folio, &mut state, 3, 1);
        };
        let listed = || -> Vec<u64> {
            inode.dirty_folios_from(0, u64::MAX, usize::MAX).iter().map(|f| f.pos()).collect()
        };
        for index in 0..64 {
            drop(cache.folio_for(&inode, index * FOLIO, FOLIO, u64::MAX));
        }
        dirty_at(40 * FOLIO);
        dirty_at(7 * FOLIO);
        assert_eq!(listed(), [7 * FOLIO, 40 * FOLIO]);
        let block = 4096;
        let first = inode.first_block_with_dirty(0, u64::MAX, block, true, |_| false);
        assert_eq!(first, Some(7 * FOLIO + 3 * block));
        // Written back: no longer listed.
        let folio = inode.folio_at(7 * FOLIO).unwrap();
        inode.take_dirty(&folio, &mut folio.write());
        assert_eq!(listed(), [40 * FOLIO]);
        // Removed while dirty, then a new folio at the same place dirtied:
        // the new one is listed, and nothing of the old one.
        inode.remove_range(40 * FOLIO, 41 * FOLIO);
        assert_eq!(listed(), Vec::<u64>::new());
        dirty_at(40 * FOLIO);
        assert_eq!(listed(), [40 * FOLIO]);
        assert_eq!(inode.dirty_bytes(), block);
        inode.remove_range(0, u64::MAX);
    }

    #[test]
    fn eviction_spares_dirty_and_busy_folios() {
        let cache = cache(128 << 10);
        let inode = cache.inode(1);
        let dirty = cache.folio_for(&inode, 0, 64 << 10, u64::MAX);
        {
            let mut state = dirty.write();
            state.uptodate.set_range(0, 16);
            state.mapped.set_range(0, 16);
            inode.mark_dirty(&dirty, &mut state, 0, 16);
        }
        assert_eq!(cache.dirty_bytes(), 64 << 10);
        drop(dirty);
        let busy = cache.folio_for(&inode, 65536, 64 << 10, u64::MAX);
        // Full: the next folio can evict neither the dirty nor the busy one.
        let _third = cache.folio_for(&inode, 131072, 64 << 10, u64::MAX);
        assert_eq!(inode.folios_in(0, u64::MAX).len(), 3);
        drop(busy);
        let _fourth = cache.folio_for(&inode, 196608, 64 << 10, u64::MAX);
        let left: Vec<u64> = inode.folios_in(0, u64::MAX).iter().map(|folio| folio.pos()).collect();
        assert!(left.contains(&0), "the dirty folio stays");
        assert!(!left.contains(&65536), "the idle clean folio went: {left:?}");
        inode.remove_range(0, u64::MAX);
        assert_eq!(cache.dirty_bytes(), 0, "dropping dirty folios un-accounts them");
    }

    #[test]
    fn a_large_ask_that_fits_small_evicts_only_for_what_fits() {
        let cache = cache(72 << 10);
        let inode = cache.inode(5);
        let small = cache.folio_for(&inode, 0, 4096, u64::MAX);
        let large = cache.folio_for(&inode, 65536, 64 << 10, u64::MAX);
        drop((small, large));
        // A streaming writer at 4096 asks for 64 KiB; 4 KiB fits there, and
        // 68 KiB + 4 KiB is within the limit: nothing is evicted.
        let between = cache.folio_for(&inode, 4096, 64 << 10, u64::MAX);
        assert_eq!((between.pos(), between.bytes()), (4096, 4096));
        let cached: Vec<(u64, usize)> =
            inode.folios_in(0, u64::MAX).iter().map(|folio| (folio.pos(), folio.bytes())).collect();
        assert_eq!(cached, vec![(0, 4096), (4096, 4096), (65536, 65536)]);
    }

    #[test]
    fn errors_reach_each_handle_once() {
        let cache = cache(1 << 20);
        let inode = cache.inode(3);
        let first = AtomicU64::new(inode.error_sample());
        inode.record_error("EIO at 4096".into());
        let opened_later = AtomicU64::new(inode.error_sample());
        assert_eq!(inode.check_error(&first).as_deref(), Some("EIO at 4096"));
        assert_eq!(inode.check_error(&first), None, "once per handle");
        assert!(inode.check_error(&opened_later).is_some(), "unseen failures reach new handles");
        let opened_after_seen = AtomicU64::new(inode.error_sample());
        assert_eq!(inode.check_error(&opened_after_seen), None);
    }
}
