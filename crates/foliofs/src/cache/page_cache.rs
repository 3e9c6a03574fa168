//! The cache of a volume's files, [`PageCache`]: each file's entry in a
//! sharded table, new folios sized to fit, CLOCK eviction of clean folios
//! within the memory limit, drop-behind of long sequential writers, and
//! the flusher's wake-ups and the writers' throttle.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use rustc_hash::FxHashMap;

use super::folio::Folio;
use super::inode_cache::{keys_overlapping, InodeCache};
use super::pool::{BufferPool, FolioMemory};
use super::{Accounting, CachePolicy, DirtyThrottle, GiveBackReserved};

/// Folios far ahead of a long stream that one write examines for
/// recycling (`PageCache::recycle_behind_stream`).
const AHEAD_FOLIOS_EXAMINED_MAX: usize = 16;

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
    debug_assert!(
        bytes.is_power_of_two() && block.is_power_of_two() && bytes >= block,
        "a folio of {bytes} bytes asked for on blocks of {block}"
    );
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
// `cache_shard_of` takes the hash's top bits: a power of two of shards.
const _: () = assert!(CACHE_SHARDS.is_power_of_two());

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
        assert!(
            policy.block_bytes.is_power_of_two() && policy.folio_max_bytes >= policy.block_bytes,
            "blocks of {} bytes, folios up to {}",
            policy.block_bytes,
            policy.folio_max_bytes
        );
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
            Arc::new(InodeCache::new(ino, Arc::clone(&self.accounting), self.policy.block_bytes))
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
            // No folio holds `pos`, and every folio is block-aligned, so the
            // block around `pos` fits if nothing larger does: the new folio
            // overlaps none (ARCHITECTURE.md: folios never overlap).
            debug_assert!(
                bytes <= self.policy.folio_max_bytes && start <= pos && pos - start < bytes,
                "a folio of {bytes} bytes at {start} for {pos}"
            );
            debug_assert!(
                folios.range(..start).next_back().is_none_or(|(_, before)| before.end() <= start),
                "a new folio at {start} overlaps the one before it"
            );
            debug_assert!(
                folios.range(start..).next().is_none_or(|(&next, _)| next >= start + bytes),
                "a new folio [{start}, {}) overlaps the one after it",
                start + bytes
            );
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
        let before = inode.folio_count.fetch_sub(recycled.len(), Ordering::AcqRel);
        debug_assert!(before >= recycled.len(), "inode {}: folio count below zero", inode.ino);
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
        let before = inode.folio_count.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "inode {}: folio count below zero", inode.ino);
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::test_cache as cache;
    use crate::options::VolumeOptions;

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
}
