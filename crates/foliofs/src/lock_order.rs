//! The lock order, checked at run time in debug builds. Each thread keeps
//! the levels of the ordered locks it holds; taking a lock whose level is
//! below one it holds is a deadlock waiting to happen, and panics there,
//! naming both, instead of hanging one run in a thousand. Release builds
//! keep nothing.
//!
//! The ordered locks, in the order they are taken (ARCHITECTURE.md, "Locks"):
//! the volume's write gate, a file's I/O lock, its writeback lock, the rename mutex, the checkpoint
//! mutex, the metadata shards (in ascending shard index), the space mutex,
//! the journal's mutex. The cache's folio map, folio locks and dirty index
//! sit between the writeback lock and the rename mutex and are not tracked
//! here. Locks of one unindexed level (two files' I/O locks) are not
//! ordered against each other by this check; indexed ones (the shards) must
//! be taken in ascending index, and never twice.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Tries of a taken lock before its taker sleeps: with the pause doubling
/// to 64 spins, about 5 us on the bench VM.
const SPIN_ROUNDS: u32 = 24;

/// How often a lock was found taken and how long its takers waited: the
/// contention the benches print (`Volume::lock_waits`), counted in release
/// builds too. A lock that is free costs one try and no clock read.
#[derive(Debug, Default)]
pub struct Contention {
    waits: AtomicU64,
    wait_ns: AtomicU64,
}

impl Contention {
    /// `try_lock`, or, when it finds the lock taken, tries again for a
    /// few microseconds before waiting in `lock`; the wait is timed.
    ///
    /// Why spin first: the metadata's critical sections last a microsecond
    /// or two, and a waiter put to sleep waits for the scheduler to give it
    /// a CPU back, on a loaded 2-CPU machine half a millisecond (two jobs
    /// creating files met 432 times in 80,000 creates and waited 189 ms).
    pub fn lock<G>(&self, try_lock: impl Fn() -> Option<G>, lock: impl FnOnce() -> G) -> G {
        if let Some(guard) = try_lock() {
            return guard;
        }
        let started = Instant::now();
        for round in 0..SPIN_ROUNDS {
            for _ in 0..(1 << round.min(6)) {
                std::hint::spin_loop();
            }
            if let Some(guard) = try_lock() {
                self.note_wait(started);
                return guard;
            }
        }
        let guard = lock();
        self.note_wait(started);
        guard
    }

    fn note_wait(&self, started: Instant) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.wait_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// (waits, nanoseconds waited) so far.
    pub fn totals(&self) -> (u64, u64) {
        (self.waits.load(Ordering::Relaxed), self.wait_ns.load(Ordering::Relaxed))
    }
}

/// An ordered lock's place in the order: a lower level is taken first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// A slot of the volume's write gate (`vfs::freeze`): taken at the
    /// start of a changing operation, all of them by a freeze.
    Freeze = 0,
    /// `io_lock::InodeIo`, shared or exclusive.
    InodeIo = 1,
    /// `cache::InodeCache`'s writeback lock.
    Writeback = 2,
    /// `meta::MetaStore`'s rename mutex: renames that move a directory to
    /// another parent, one at a time (the VFS's s_vfs_rename_mutex).
    Rename = 3,
    /// `meta::MetaStore`'s checkpoint mutex.
    Checkpoint = 4,
    /// A metadata shard's lock, read or written; indexed by shard.
    Metadata = 5,
    /// `meta::MetaStore`'s metadata index (format 3): read under a shard's
    /// lock to bring an inode into memory, changed by a checkpoint after
    /// its cut.
    MetadataIndex = 6,
    /// `meta::MetaStore`'s space mutex (allocator and pending frees).
    Space = 7,
    /// `journal::Journal`'s mutex.
    Journal = 8,
}

impl Level {
    /// Every level, in the order they are taken.
    pub const ORDER: [Level; 9] = [
        Level::Freeze,
        Level::InodeIo,
        Level::Writeback,
        Level::Rename,
        Level::Checkpoint,
        Level::Metadata,
        Level::MetadataIndex,
        Level::Space,
        Level::Journal,
    ];
}

/// What a thread holds: of each level, how many claims without an index
/// and which indices. Taking and letting go cost a few steps however much
/// is held, so a thread holding every shard (a checkpoint's cut, fsck,
/// 4,096 locks) pays little for the check.
#[cfg(debug_assertions)]
#[derive(Default)]
struct HeldLocks {
    unindexed: [u32; LEVELS],
    indexed: [IndexedClaims; LEVELS],
}

/// The indices held of one level: claims per index, a bit per index held
/// (to find the next highest in a few word reads), and the highest.
#[cfg(debug_assertions)]
#[derive(Default)]
struct IndexedClaims {
    claims: Vec<u16>,
    present: Vec<u64>,
    held: usize,
    highest: Option<usize>,
}

#[cfg(debug_assertions)]
impl IndexedClaims {
    fn push(&mut self, index: usize) {
        if self.claims.len() <= index {
            self.claims.resize(index + 1, 0);
            self.present.resize(index / 64 + 1, 0);
        }
        self.claims[index] += 1;
        self.present[index / 64] |= 1 << (index % 64);
        self.held += 1;
        self.highest = Some(self.highest.map_or(index, |highest| highest.max(index)));
        debug_assert!(self.present[index / 64] & (1 << (index % 64)) != 0);
    }

    fn remove(&mut self, index: usize) -> Option<()> {
        let claims = self.claims.get_mut(index).filter(|claims| **claims > 0)?;
        *claims -= 1;
        self.held -= 1;
        if *claims > 0 {
            return Some(());
        }
        self.present[index / 64] &= !(1 << (index % 64));
        if self.highest == Some(index) {
            self.highest = (0..=index / 64).rev().find_map(|word| {
                let bits = self.present[word];
                (bits != 0).then(|| word * 64 + 63 - bits.leading_zeros() as usize)
            });
            // The next highest held is below the index let go.
            debug_assert!(self.highest.is_none_or(|highest| highest < index));
        }
        // Something is held exactly when there is a highest index held.
        debug_assert_eq!(self.held == 0, self.highest.is_none());
        Some(())
    }
}

#[cfg(debug_assertions)]
const LEVELS: usize = Level::Journal as usize + 1;

#[cfg(debug_assertions)]
impl HeldLocks {
    fn holds(&self, level: usize) -> bool {
        self.unindexed[level] > 0 || self.indexed[level].held > 0
    }

    /// What is held, for a panic's message: each level and its claims.
    fn summary(&self) -> Vec<(Level, usize)> {
        Level::ORDER
            .into_iter()
            .filter(|&level| self.holds(level as usize))
            .map(|level| {
                let indexed = self.indexed[level as usize].held;
                (level, self.unindexed[level as usize] as usize + indexed)
            })
            .collect()
    }

    fn check(&self, level: Level, index: Option<usize>) {
        let later = Level::ORDER
            .into_iter()
            .rev()
            .find(|&later| later > level && self.holds(later as usize));
        if let Some(later) = later {
            panic!(
                "lock order: taking the {level:?} lock while holding the {later:?} lock \
                 (held, with their claims: {:?}); ARCHITECTURE.md gives the order",
                self.summary()
            );
        }
        if let Some(index) = index {
            let above = self.indexed[level as usize].highest.filter(|&highest| highest >= index);
            assert!(
                above.is_none(),
                "lock order: taking {level:?} lock {index} while holding {level:?} lock \
                 {above:?}; locks of one level go in ascending index"
            );
        }
    }

    fn push(&mut self, level: Level, index: Option<usize>) {
        match index {
            None => self.unindexed[level as usize] += 1,
            Some(index) => self.indexed[level as usize].push(index),
        }
    }

    fn remove(&mut self, level: Level, index: Option<usize>) {
        const NEVER_TAKEN: &str = "a lock released that this thread never took";
        match index {
            None => {
                let count = &mut self.unindexed[level as usize];
                *count = count.checked_sub(1).expect(NEVER_TAKEN);
            }
            Some(index) => self.indexed[level as usize].remove(index).expect(NEVER_TAKEN),
        }
    }
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: std::cell::RefCell<HeldLocks> = std::cell::RefCell::new(HeldLocks::default());
}

/// This thread's claim on a lock of `level`, from before it waits for the
/// lock until the lock is let go.
#[must_use]
pub struct Held {
    #[cfg(debug_assertions)]
    level: Level,
    #[cfg(debug_assertions)]
    index: Option<usize>,
}

impl Held {
    /// Before a thread waits for a lock of `level`: panics (debug builds)
    /// if it holds a lock of a later level.
    pub fn before_waiting(level: Level) -> Self {
        Self::claim(level, None)
    }

    /// Before a thread waits for lock `index` of an indexed `level`: panics
    /// (debug builds) if it holds a lock of a later level, or one of the
    /// same level at `index` or above.
    pub fn before_waiting_at(level: Level, index: usize) -> Self {
        Self::claim(level, Some(index))
    }

    /// Records a lock taken without waiting (a successful try), which the
    /// order does not constrain.
    fn claim_unchecked(#[allow(unused_variables)] level: Level, index: Option<usize>) -> Self {
        #[cfg(debug_assertions)]
        HELD.with(|held| held.borrow_mut().push(level, index));
        #[cfg(not(debug_assertions))]
        let _ = index;
        Self {
            #[cfg(debug_assertions)]
            level,
            #[cfg(debug_assertions)]
            index,
        }
    }

    fn claim(level: Level, index: Option<usize>) -> Self {
        #[cfg(debug_assertions)]
        HELD.with(|held| held.borrow().check(level, index));
        Self::claim_unchecked(level, index)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        HELD.with(|held| held.borrow_mut().remove(self.level, self.index));
    }
}

/// A lock guard with its claim: the guard lets the lock go first, then
/// the claim ends.
pub struct Ordered<G> {
    guard: G,
    _held: Held,
}

impl<G> Ordered<G> {
    /// Takes a lock of `level` with `lock`, checking the order first.
    pub fn lock(level: Level, lock: impl FnOnce() -> G) -> Self {
        let held = Held::before_waiting(level);
        Self { guard: lock(), _held: held }
    }

    /// Takes lock `index` of an indexed `level` with `lock`, checking the
    /// order first.
    pub fn lock_at(level: Level, index: usize, lock: impl FnOnce() -> G) -> Self {
        let held = Held::before_waiting_at(level, index);
        Self { guard: lock(), _held: held }
    }

    /// Tries a lock of an unindexed `level` without waiting (no order to
    /// check: a try cannot deadlock); None, claiming nothing, when it is
    /// taken.
    pub fn try_lock(level: Level, lock: impl FnOnce() -> Option<G>) -> Option<Self> {
        let guard = lock()?;
        Some(Self { guard, _held: Held::claim_unchecked(level, None) })
    }

    /// The guard itself, for what needs it (a condition variable's wait,
    /// which lets the lock go and takes it back at the same level).
    pub fn guard_mut(&mut self) -> &mut G {
        &mut self.guard
    }

    /// The same claim over what `map` makes of the guard (a mapped guard
    /// of one part of the locked data); None when `map` finds nothing.
    pub fn try_map<H>(self, map: impl FnOnce(G) -> Result<H, G>) -> Option<Ordered<H>> {
        let Self { guard, _held } = self;
        map(guard).ok().map(|guard| Ordered { guard, _held })
    }
}

impl<G: Deref> Deref for Ordered<G> {
    type Target = G::Target;

    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Ordered<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

// The tests check what a thread records, which only debug builds keep: in
// a release build `Held` records nothing and they would pass without
// checking anything, so they are not built there.
#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    /// What this thread holds now, level by level with its claims.
    fn held_now() -> Vec<(Level, usize)> {
        HELD.with(|held| held.borrow().summary())
    }

    #[test]
    fn locks_taken_in_order_pass_and_are_forgotten_when_let_go() {
        assert_eq!(held_now(), []);
        let io = Held::before_waiting(Level::InodeIo);
        let meta = Held::before_waiting(Level::Metadata);
        let journal = Held::before_waiting(Level::Journal);
        assert_eq!(held_now(), [(Level::InodeIo, 1), (Level::Metadata, 1), (Level::Journal, 1)]);
        drop(journal);
        drop(meta);
        assert_eq!(held_now(), [(Level::InodeIo, 1)]);
        // Let go of the metadata lock, the writeback lock may be taken.
        let writeback = Held::before_waiting(Level::Writeback);
        assert_eq!(held_now(), [(Level::InodeIo, 1), (Level::Writeback, 1)]);
        drop(writeback);
        drop(io);
        assert_eq!(held_now(), []);
        let meta = Held::before_waiting(Level::Metadata);
        assert_eq!(held_now(), [(Level::Metadata, 1)]);
        drop(meta);
        assert_eq!(held_now(), []);
    }

    #[test]
    #[should_panic(expected = "taking Metadata lock 3 while holding Metadata lock Some(7)")]
    fn indexed_locks_taken_out_of_order_panic() {
        let _seven = Held::before_waiting_at(Level::Metadata, 7);
        let _three = Held::before_waiting_at(Level::Metadata, 3);
    }

    #[test]
    fn indexed_locks_in_ascending_order_pass() {
        let three = Held::before_waiting_at(Level::Metadata, 3);
        let seven = Held::before_waiting_at(Level::Metadata, 7);
        let space = Held::before_waiting(Level::Space);
        assert_eq!(held_now(), [(Level::Metadata, 2), (Level::Space, 1)]);
        drop(space);
        drop(seven);
        assert_eq!(held_now(), [(Level::Metadata, 1)]);
        // Index 3 is still held: 1 is below it, 4 is not.
        let below = std::panic::catch_unwind(|| drop(Held::before_waiting_at(Level::Metadata, 1)));
        assert!(below.is_err(), "1 is below 3, still held");
        drop(Held::before_waiting_at(Level::Metadata, 4));
        drop(three);
        assert_eq!(held_now(), []);
        let again = Held::before_waiting_at(Level::Metadata, 1);
        assert_eq!(held_now(), [(Level::Metadata, 1)]);
        drop(again);
    }

    /// Letting go of the highest index held lowers the bar to the next one
    /// held, found across words of the bitmap.
    #[test]
    fn letting_go_of_the_highest_index_lowers_the_bar_to_the_next_held() {
        let three = Held::before_waiting_at(Level::Metadata, 3);
        let seventy = Held::before_waiting_at(Level::Metadata, 70);
        let highest = Held::before_waiting_at(Level::Metadata, 4095);
        drop(highest);
        let next = std::panic::catch_unwind(|| drop(Held::before_waiting_at(Level::Metadata, 71)));
        assert!(next.is_ok(), "71 is above every index still held");
        let below = std::panic::catch_unwind(|| drop(Held::before_waiting_at(Level::Metadata, 69)));
        assert!(below.is_err(), "69 is below 70, still held");
        drop(seventy);
        drop(three);
        let _first = Held::before_waiting_at(Level::Metadata, 0);
    }

    #[test]
    #[should_panic(expected = "taking the InodeIo lock while holding the Metadata lock")]
    fn a_lock_taken_below_one_held_panics() {
        let _meta = Held::before_waiting(Level::Metadata);
        let _io = Held::before_waiting(Level::InodeIo);
    }
}
