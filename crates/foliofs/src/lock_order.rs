//! The lock order, checked at run time in debug builds. Each thread keeps
//! the levels of the ordered locks it holds; taking a lock whose level is
//! below one it holds is a deadlock waiting to happen, and panics there,
//! naming both, instead of hanging one run in a thousand. Release builds
//! keep nothing.
//!
//! The ordered locks, in the order they are taken (ARCHITECTURE.md, "Locks"):
//! a file's I/O lock, its writeback lock, the checkpoint mutex, the
//! metadata lock, the journal's mutex. The cache's folio map, folio locks
//! and dirty index sit between the writeback lock and the checkpoint mutex
//! and are not tracked here. Locks of one level (two files' I/O locks) are
//! not ordered against each other by this check.

use std::ops::{Deref, DerefMut};

/// An ordered lock's place in the order: a lower level is taken first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `io_lock::InodeIo`, shared or exclusive.
    InodeIo = 1,
    /// `cache::InodeCache`'s writeback lock.
    Writeback = 2,
    /// `meta::MetaStore`'s checkpoint mutex.
    Checkpoint = 3,
    /// `meta::MetaStore`'s `RwLock<MetaState>`, read or written.
    Metadata = 4,
    /// `journal::Journal`'s mutex.
    Journal = 5,
}

#[cfg(debug_assertions)]
thread_local! {
    static HELD: std::cell::RefCell<Vec<Level>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// This thread's claim on a lock of `level`, from before it waits for the
/// lock until the lock is let go.
#[must_use]
pub struct Held {
    #[cfg(debug_assertions)]
    level: Level,
}

impl Held {
    /// Before a thread waits for a lock of `level`: panics (debug builds)
    /// if it holds a lock of a later level.
    pub fn before_waiting(level: Level) -> Self {
        #[cfg(debug_assertions)]
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            let later = held.iter().copied().filter(|taken| *taken > level).max();
            assert!(
                later.is_none(),
                "lock order: taking the {level:?} lock while holding the {later:?} lock \
                 (held: {held:?}); ARCHITECTURE.md gives the order"
            );
            held.push(level);
        });
        Self {
            #[cfg(debug_assertions)]
            level,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            let at = held.iter().rposition(|taken| *taken == self.level);
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

    /// The guard itself, for what needs it (a condition variable's wait,
    /// which lets the lock go and takes it back at the same level).
    pub fn guard_mut(&mut self) -> &mut G {
        &mut self.guard
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
    #[should_panic(expected = "taking the InodeIo lock while holding the Some(Metadata) lock")]
    fn a_lock_taken_below_one_held_panics() {
        let _meta = Held::before_waiting(Level::Metadata);
        let _io = Held::before_waiting(Level::InodeIo);
    }
}
