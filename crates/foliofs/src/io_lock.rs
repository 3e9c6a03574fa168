//! Per-inode I/O exclusion, as the kernel's i_rwsem plus i_dio_count.
//!
//! Direct I/O that may run concurrently holds the lock shared while it maps
//! and submits, counts itself in flight, and lets go before its device
//! requests complete. Work that must run alone (sub-block writes that zero,
//! extending writes, truncate, the simple data path) takes the lock
//! exclusively and then waits for the in-flight count to drain, so no direct
//! I/O submitted earlier is still touching the blocks it changes.

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

#[derive(Default)]
pub struct InodeIo {
    lock: RwLock<()>,
    dio_in_flight: Mutex<u64>,
    dio_drained: Condvar,
}

impl InodeIo {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.read()
    }

    /// The lock held exclusively, with no direct I/O left in flight.
    pub fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        let guard = self.lock.write();
        let mut in_flight = self.dio_in_flight.lock();
        while *in_flight > 0 {
            self.dio_drained.wait(&mut in_flight);
        }
        guard
    }

    /// Counts one direct I/O as in flight; call under the shared lock.
    pub fn dio_started(&self) {
        *self.dio_in_flight.lock() += 1;
    }

    /// Ends one in-flight direct I/O (from its completion, on any thread).
    pub fn dio_finished(&self) {
        let mut in_flight = self.dio_in_flight.lock();
        assert!(*in_flight > 0, "direct I/O finished twice");
        *in_flight -= 1;
        if *in_flight == 0 {
            self.dio_drained.notify_all();
        }
    }

    pub fn dio_in_flight(&self) -> u64 {
        *self.dio_in_flight.lock()
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
        let _exclusive = io.exclusive();
        assert_eq!(io.dio_in_flight(), 0, "exclusive returned before the drain");
        finisher.join().unwrap();
    }
}
