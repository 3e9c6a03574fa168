//! The lock order, checked at run time in debug builds. Each thread keeps
//! the levels of the ordered locks it holds; taking a lock whose level is
//! below one it holds is a deadlock waiting to happen, and panics there,
//! naming both, instead of hanging one run in a thousand. Release builds
//! keep nothing.
//!
//! The ordered locks, in the order they are taken (ARCHITECTURE.md, "Locks"):
//! a file's I/O lock, its writeback lock, the rename mutex, the checkpoint
//! mutex, the metadata shards (in ascending shard index), the space mutex,
//! the journal's mutex. The cache's folio map, folio locks and dirty index
//! sit between the writeback lock and the rename mutex and are not tracked
//! here. Locks of one unindexed level (two files' I/O locks) are not
//! ordered against each other by this check; indexed ones (the shards) must
//! be taken in ascending index, and never twice.

use std::ops::{Deref, DerefMut};

/// An ordered lock's place in the order: a lower level is taken first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
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
    /// `meta::MetaStore`'s space mutex (allocator and pending frees).
    Space = 6,
    /// `journal::Journal`'s mutex.
    Journal = 7,
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: std::cell::RefCell<Vec<(Level, Option<usize>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
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
    fn claim_unchecked(level: Level, index: Option<usize>) -> Self {
        #[cfg(debug_assertions)]
        HELD.with(|held| held.borrow_mut().push((level, index)));
        #[cfg(not(debug_assertions))]
        let _ = (level, index);
        Self {
            #[cfg(debug_assertions)]
            level,
            #[cfg(debug_assertions)]
            index,
        }
    }

    fn claim(#[allow(unused_variables)] level: Level, index: Option<usize>) -> Self {
        #[cfg(debug_assertions)]
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            let later = held.iter().map(|(taken, _)| *taken).filter(|taken| *taken > level).max();
            assert!(
                later.is_none(),
                "lock order: taking the {level:?} lock while holding the {later:?} lock \
                 (held: {held:?}); ARCHITECTURE.md gives the order"
            );
            if let Some(index) = index {
                let above = held
                    .iter()
                    .filter(|(taken, _)| *taken == level)
                    .filter_map(|(_, taken_index)| *taken_index)
                    .filter(|taken_index| *taken_index >= index)
                    .max();
                assert!(
                    above.is_none(),
                    "lock order: taking {level:?} lock {index} while holding {level:?} lock \
                     {above:?} (held: {held:?}); locks of one level go in ascending index"
                );
            }
            held.push((level, index));
        });
        #[cfg(not(debug_assertions))]
        let _ = index;
        Self {
            #[cfg(debug_assertions)]
            level,
            #[cfg(debug_assertions)]
            index,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            let at = held.iter().rposition(|taken| *taken == (self.level, self.index));
            let at = at.expect("a lock released that this thread never took");
            held.remove(at);
        });
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

    /// Tries a lock of `level` without waiting (no order to check: a try
    /// cannot deadlock); None, claiming nothing, when it is taken.
    pub fn try_lock_at(
        level: Level,
        index: usize,
        lock: impl FnOnce() -> Option<G>,
    ) -> Option<Self> {
        let guard = lock()?;
        Some(Self { guard, _held: Held::claim_unchecked(level, Some(index)) })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_order_pass_and_are_forgotten_when_let_go() {
        let io = Held::before_waiting(Level::InodeIo);
        let meta = Held::before_waiting(Level::Metadata);
        let journal = Held::before_waiting(Level::Journal);
        drop(journal);
        drop(meta);
        // Let go of the metadata lock, the writeback lock may be taken.
        let writeback = Held::before_waiting(Level::Writeback);
        drop(writeback);
        drop(io);
        let _meta = Held::before_waiting(Level::Metadata);
    }

    #[test]
    #[cfg(debug_assertions)]
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
        drop(space);
        drop(seven);
        drop(three);
        let _again = Held::before_waiting_at(Level::Metadata, 1);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "taking the InodeIo lock while holding the Some(Metadata) lock")]
    fn a_lock_taken_below_one_held_panics() {
        let _meta = Held::before_waiting(Level::Metadata);
        let _io = Held::before_waiting(Level::InodeIo);
    }
}
