//! Freezing a volume: every operation that changes what a reader sees
//! (data, sizes, names, attributes, extended attributes) passes a gate at
//! its start and holds it to its end, as the kernel's `sb_start_write`;
//! [`Volume::freeze`] closes the gate, waits for the operations inside to
//! end and keeps new ones waiting until it is let go. A tree snapshot
//! ([`Volume::clone_tree`]) runs frozen, so it is one instant of the volume
//! however many threads write meanwhile: every change answered before it
//! is in the copy, none made after.
//!
//! The gate is one read-write lock per slot, a thread's operations always
//! taking its own slot (a few threads share one), so that unrelated writers
//! on many cores do not meet on one cache line; closing it takes every
//! slot, in ascending order. Background work (writeback, the committer,
//! orphan frees, checkpoints) does not pass the gate: it changes nothing a
//! reader sees, and a freeze waits for it to write back what the frozen
//! operations need. An operation called inside another on the same thread
//! (a path call resolving to an inode call, a clone opening its copy)
//! passes at once, and so do the freezing thread's own operations, which
//! are how a snapshot writes its copy.
//!
//! [`Volume::freeze`]: super::Volume::freeze
//! [`Volume::clone_tree`]: super::Volume::clone_tree

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};
use crate::lock_order::{Level, Ordered};

/// Slots of the gate: enough that the threads of a 16-core machine rarely
/// share one.
const SLOTS: usize = 64;

/// A lock on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct Slot(RwLock<()>);

pub(crate) struct WriteGate {
    slots: Box<[Slot]>,
    /// One freeze at a time: a second freezer waits here, not half-way
    /// through the slots.
    freezer: Mutex<()>,
}

/// Hands each thread its slot, round robin.
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SLOTS;
    /// The gates this thread is inside (an operation's, or its own freeze),
    /// by address, once per entry.
    static INSIDE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

impl Default for WriteGate {
    fn default() -> Self {
        Self { slots: (0..SLOTS).map(|_| Slot::default()).collect(), freezer: Mutex::new(()) }
    }
}

impl WriteGate {
    fn address(&self) -> usize {
        self as *const Self as usize
    }

    fn thread_is_inside(&self) -> bool {
        INSIDE.with(|inside| inside.borrow().contains(&self.address()))
    }

    fn enter(&self) {
        INSIDE.with(|inside| inside.borrow_mut().push(self.address()));
    }

    fn leave(&self) {
        INSIDE.with(|inside| {
            let mut inside = inside.borrow_mut();
            let at = inside.iter().rposition(|&gate| gate == self.address());
            inside.swap_remove(at.expect("left a gate this thread never entered"));
        });
    }

    /// Passes the gate for one changing operation: waits while the volume
    /// is frozen by another thread. Taken before any other lock.
    pub(crate) fn start_write(&self) -> Writing<'_> {
        let slot = if self.thread_is_inside() {
            None
        } else {
            let index = THREAD_SLOT.with(|slot| *slot);
            Some(Ordered::lock(Level::Freeze, || self.slots[index].0.read()))
        };
        self.enter();
        Writing { gate: self, _slot: slot }
    }

    /// Closes the gate: waits for the operations inside to end; until the
    /// value is dropped, other threads' changing operations wait, and this
    /// thread's pass.
    pub(crate) fn freeze(&self) -> Result<Frozen<'_>> {
        if self.thread_is_inside() {
            return Err(Error::invalid(
                "a volume cannot be frozen from inside one of its own operations",
            ));
        }
        let freezer = self.freezer.lock();
        let slots =
            self.slots.iter().map(|slot| Ordered::lock(Level::Freeze, || slot.0.write())).collect();
        self.enter();
        Ok(Frozen { gate: self, _slots: slots, _freezer: freezer })
    }
}

/// An operation inside the gate; it ends when this is dropped.
#[must_use]
pub(crate) struct Writing<'a> {
    gate: &'a WriteGate,
    /// None for an operation inside another of this thread (or its freeze).
    _slot: Option<Ordered<RwLockReadGuard<'a, ()>>>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

/// A frozen volume: other threads' changing operations wait until this is
/// dropped, on the thread that froze it.
#[must_use = "the volume thaws when this is dropped"]
pub struct Frozen<'a> {
    gate: &'a WriteGate,
    _slots: Vec<Ordered<RwLockWriteGuard<'a, ()>>>,
    _freezer: parking_lot::MutexGuard<'a, ()>,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_frozen_gate_holds_other_threads_and_passes_its_own() {
        let gate = WriteGate::default();
        let frozen = gate.freeze().unwrap();
        // The freezing thread's own operations pass, nested too.
        let outer = gate.start_write();
        let inner = gate.start_write();
        drop((inner, outer));
        let (entered, entries) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _writing = gate.start_write();
                entered.send(()).unwrap();
            });
            assert!(entries.recv_timeout(Duration::from_millis(100)).is_err());
            drop(frozen);
            entries.recv_timeout(Duration::from_secs(10)).unwrap();
        });
    }

    #[test]
    fn a_freeze_waits_for_the_operations_inside() {
        let gate = WriteGate::default();
        let (frozen_tx, frozen_rx) = mpsc::channel();
        let writing = gate.start_write();
        assert!(gate.freeze().is_err(), "no freeze from inside an operation");
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _frozen = gate.freeze().unwrap();
                frozen_tx.send(()).unwrap();
            });
            assert!(frozen_rx.recv_timeout(Duration::from_millis(100)).is_err());
            drop(writing);
            frozen_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        });
    }
}
