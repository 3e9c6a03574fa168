//! Per-inode I/O exclusion, as the kernel's i_rwsem plus i_dio_count.
//!
//! Direct I/O that may run concurrently holds the lock shared while it maps
//! and submits, counts itself in flight, and lets go before its device
//! requests complete. Work that must run alone (sub-block writes that zero,
//! extending writes, truncate, the simple data path) takes the lock
//! exclusively and then waits for the in-flight count to drain, so no direct
//! I/O submitted earlier is still touching the blocks it changes.
//!
//! The drain may not depend on anyone but the device. Requests are handed
//! to the device before the shared lock is let go, but the device may hold
//! them in a plug (a batch its submitter hands over when it next waits), and
//! that submitter may be the very thread now waiting for the drain, or one
//! blocked behind it on this lock: [`InodeIo::exclusive`] therefore releases
//! every plug before it waits, as the kernel flushes a task's plug before it
//! sleeps. Completions then run on the device's own threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::lock_order::{Level, Ordered};

/// Granularity of the timestamps a data write advances: like the kernel's
/// coarse clock, a file written many times a millisecond updates its mtime
/// once, and the metadata lock is not taken for every write.
const TIMES_GRANULARITY_NS: u64 = 1_000_000;

#[derive(Default)]
pub struct InodeIo {
    lock: RwLock<()>,
    dio_in_flight: AtomicU64,
    drain_lock: Mutex<()>,
    dio_drained: Condvar,
    /// When the file's times were last advanced, in `TIMES_GRANULARITY_NS` ticks.
    times_tick: AtomicU64,
}

/// [`InodeIo::exclusive`]'s guard.
pub type Exclusive<'a> = Ordered<RwLockWriteGuard<'a, ()>>;

impl InodeIo {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn shared(&self) -> Ordered<RwLockReadGuard<'_, ()>> {
        Ordered::lock(Level::InodeIo, || self.lock.read())
    }

    /// The lock held exclusively, with no direct I/O left in flight.
    /// `unplug` hands every request the device holds in a plug to the kernel
    /// (`Device::unplug`); it runs only when there is something to drain.
    pub fn exclusive(&self, unplug: impl FnOnce()) -> Ordered<RwLockWriteGuard<'_, ()>> {
        let guard = Ordered::lock(Level::InodeIo, || self.lock.write());
        // New direct I/O starts only under the shared lock, and reaches the
        // device before that lock is let go, so the count can only fall from
        // here once the plugs are released.
        if self.dio_in_flight.load(Ordering::Acquire) == 0 {
            return guard;
        }
        unplug();
        let mut drain = self.drain_lock.lock();
        while self.dio_in_flight.load(Ordering::Acquire) > 0 {
            self.dio_drained.wait(&mut drain);
        }
        // Direct I/O starts under this lock, held here exclusively: none
        // starts again until the guard goes.
        debug_assert_eq!(self.dio_in_flight.load(Ordering::Acquire), 0);
        guard
    }

    /// Counts one direct I/O as in flight; call under the shared lock.
    pub fn dio_started(&self) {
        // Counted under the lock, so that the exclusive side's drain sees
        // every direct I/O that started before it took the lock.
        debug_assert!(self.lock.is_locked(), "direct I/O started without the inode's I/O lock");
        self.dio_in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// Ends one in-flight direct I/O (from its completion, on any thread).
    pub fn dio_finished(&self) {
        let before = self.dio_in_flight.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "direct I/O finished twice");
        if before == 1 {
            let _drain = self.drain_lock.lock();
            self.dio_drained.notify_all();
        }
    }

    /// Whether some thread holds the lock exclusively (for assertions of
    /// callers that must run alone).
    pub fn is_exclusive(&self) -> bool {
        self.lock.is_locked_exclusive()
    }

    pub fn dio_in_flight(&self) -> u64 {
        self.dio_in_flight.load(Ordering::Acquire)
    }

    /// Whether a write now should advance the file's times: true at most
    /// once per granularity tick.
    pub fn times_due(&self) -> bool {
        let now_ns =
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64);
        let tick = now_ns / TIMES_GRANULARITY_NS;
        self.times_tick.swap(tick, Ordering::Relaxed) != tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn exclusive_waits_for_in_flight_direct_io() {
        let io = Arc::new(InodeIo::new());
        {
            let _shared = io.shared();
            io.dio_started();
        }
        let finisher = {
            let io = Arc::clone(&io);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                io.dio_finished();
            })
        };
        let _exclusive = io.exclusive(|| {});
        assert_eq!(io.dio_in_flight(), 0, "exclusive returned before the drain");
        finisher.join().unwrap();
    }

    /// Direct I/O held back until someone unplugs (as a plugged ring holds
    /// it) drains once `exclusive` has unplugged, and `unplug` is not called
    /// when nothing is in flight.
    #[test]
    fn exclusive_unplugs_before_it_waits() {
        let io = InodeIo::new();
        drop(io.exclusive(|| panic!("nothing in flight: no unplug")));
        {
            let _shared = io.shared();
            io.dio_started();
        }
        let _exclusive = io.exclusive(|| io.dio_finished());
        assert_eq!(io.dio_in_flight(), 0);
    }

    #[test]
    fn times_advance_once_per_tick() {
        let io = InodeIo::new();
        assert!(io.times_due());
        let again: Vec<bool> = (0..100).map(|_| io.times_due()).collect();
        assert!(again.iter().filter(|due| **due).count() <= 2);
        std::thread::sleep(Duration::from_millis(2));
        assert!(io.times_due());
    }
}
