//! One file's cache entry, [`InodeCache`]: its I/O lock, its folios in an
//! ordered map with the index of the dirty ones, the writeback lock that
//! serialises writeback with truncation, its dirty accounting and its
//! writeback error sequence.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::io_lock::InodeIo;
use crate::lock_order::{Level, Ordered};

use super::bits::BlockBits;
use super::folio::{Folio, FolioState};
use super::Accounting;

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
    pub(super) folios: RwLock<BTreeMap<u64, Arc<Folio>>>,
    /// The keys of the folios with dirty blocks, so writeback and the
    /// dirty-block scans visit only those: an fdatasync of one dirty block
    /// in a large cached file used to test every folio's lock (a third of
    /// seed 001's CPU at 4,096 folios per file). Changed only under the
    /// folio's write lock, with its dirty bits: every folio with dirty
    /// blocks has its key here. A key may outlive its folio (`remove_range`
    /// leaves it) until writeback drops it. Lock order: a folio's lock,
    /// then this.
    dirty_keys: Mutex<BTreeSet<u64>>,
    pub(super) folio_count: AtomicUsize,
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
    pub(super) writeback_lock: Mutex<()>,
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
    pub(super) stream_start_pos: AtomicU64,
    pub(super) stream_recycled_pos: AtomicU64,
    /// The stream has passed the dirty limit, or came round to the file's
    /// start from one that had (`PageCache::recycle_behind_stream`).
    pub(super) stream_long: AtomicBool,
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

/// The keys of the folios overlapping `[start, end)`.
pub(super) fn keys_overlapping(
    folios: &BTreeMap<u64, Arc<Folio>>,
    start: u64,
    end: u64,
) -> Vec<u64> {
    let first_key = first_key_overlapping(folios, start);
    folios.range(first_key..end.max(first_key)).map(|(&key, _)| key).collect()
}

impl InodeCache {
    /// The entry of file `ino`, with no folio yet.
    pub(super) fn new(ino: u64, accounting: Arc<Accounting>, block_bytes: u64) -> Self {
        debug_assert!(block_bytes.is_power_of_two(), "blocks of {block_bytes} bytes");
        Self {
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
            accounting,
            block_bytes,
        }
    }

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
        super::test_hooks::run_fill_judging_hook();
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
        debug_assert_eq!(block_bytes, self.block_bytes, "inode {}: another block size", self.ino);
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
            // Bits are cleared after they were set and counted, under the
            // folio's lock: the count never goes below what is dirty.
            let before = self.dirty_bytes.fetch_sub(bytes, Ordering::AcqRel);
            debug_assert!(before >= bytes, "inode {}: {bytes} dirty bytes of {before}", self.ino);
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
        let before = self.folio_count.fetch_sub(removed.len(), Ordering::AcqRel);
        debug_assert!(before >= removed.len(), "inode {}: folio count below zero", self.ino);
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
                let before = self.folio_count.fetch_sub(1, Ordering::AcqRel);
                debug_assert!(before > 0, "inode {}: folio count below zero", self.ino);
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::test_cache as cache;

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
