//! fsyncs from several threads share a journal group, as jbd2 batches
//! synchronous handles.
//!
//! Group commit alone shares a group only among syncs that reach the commit
//! while another group is being written. Two threads that each write a
//! small file and fsync it never do: each writes its data while the other's
//! group is in flight, then leads a group of its own, so every fsync costs
//! a flush and a FUA write (`bench metadata --jobs 2`: 3.00 device requests
//! per file, as with one job). So a sync announces itself before it writes
//! its data back ([`Journal::announce_sync`]) and arrives when its records
//! are appended; a sync about to lead a group while others are on their way
//! waits for them, at most as long as a group takes to write (its recent
//! average, capped at `BATCH_WAIT_MAX`), and the group then covers them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Condvar;

use super::{Inner, Journal};

/// The longest a sync waits for others (jbd2's default `max_batch_time`
/// is 15 ms): a slow disk's group write.
const BATCH_WAIT_MAX: Duration = Duration::from_millis(10);

/// Syncs on their way to the commit, and how long groups take to write.
pub(super) struct SyncBatch {
    /// Syncs announced whose records are not all appended yet.
    on_the_way: AtomicUsize,
    /// Signalled (under the journal's mutex) when one arrives.
    arrived: Condvar,
    /// Recent group writes (flush + FUA), a moving average in nanoseconds.
    group_write_ns: AtomicU64,
    /// The longest wait: `BATCH_WAIT_MAX` (tests raise it).
    wait_max_ns: AtomicU64,
    /// Leaders that began to wait for syncs on their way, and its signal:
    /// a test waits on it to know that a leader waits, instead of sleeping
    /// and hoping.
    #[cfg(test)]
    waits_begun: (std::sync::Mutex<u64>, std::sync::Condvar),
}

impl Default for SyncBatch {
    fn default() -> Self {
        Self {
            on_the_way: AtomicUsize::new(0),
            arrived: Condvar::new(),
            group_write_ns: AtomicU64::new(0),
            wait_max_ns: AtomicU64::new(BATCH_WAIT_MAX.as_nanos() as u64),
            #[cfg(test)]
            waits_begun: Default::default(),
        }
    }
}

impl SyncBatch {
    /// Folds one group's write time into the average (weight 1/4).
    pub(super) fn note_group_write(&self, elapsed: Duration) {
        let sample = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let average = self.group_write_ns.load(Ordering::Relaxed);
        let updated = if average == 0 { sample } else { average - average / 4 + sample / 4 };
        // A moving average stays between the old average and the sample.
        debug_assert!(updated >= average.min(sample) && updated <= average.max(sample));
        self.group_write_ns.store(updated, Ordering::Relaxed);
    }

    /// Waits as if groups took `elapsed` to write, even past
    /// `BATCH_WAIT_MAX` (tests that need a wait longer than a memory
    /// device's group write, and longer than a loaded machine's stall).
    #[cfg(test)]
    pub(super) fn assume_group_write(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.group_write_ns.store(nanos, Ordering::Relaxed);
        self.wait_max_ns.store(nanos, Ordering::Relaxed);
    }

    /// A leader begins to wait (tests).
    #[cfg(test)]
    fn note_wait_begun(&self) {
        let (begun, signal) = &self.waits_begun;
        *begun.lock().unwrap() += 1;
        signal.notify_all();
    }

    /// Waits until `count` leaders in all have begun to wait for syncs on
    /// their way, failing the test after `within`.
    #[cfg(test)]
    pub(super) fn await_waits_begun(&self, count: u64, within: Duration) {
        let (begun, signal) = &self.waits_begun;
        let begun = begun.lock().unwrap();
        let (begun, timeout) =
            signal.wait_timeout_while(begun, within, |begun| *begun < count).unwrap();
        assert!(
            !timeout.timed_out(),
            "{} leaders began to wait in {within:?}, not {count}",
            *begun
        );
    }

    /// How many leaders have begun to wait for syncs on their way (tests).
    #[cfg(test)]
    pub(super) fn waits_begun(&self) -> u64 {
        *self.waits_begun.0.lock().unwrap()
    }

    fn wait_limit(&self) -> Duration {
        let average = self.group_write_ns.load(Ordering::Relaxed);
        Duration::from_nanos(average.min(self.wait_max_ns.load(Ordering::Relaxed)))
    }

    /// Wakes syncs waiting for others: a group just written may hold
    /// their records. The caller holds the journal's mutex.
    pub(super) fn notify_group_written(&self) {
        self.arrived.notify_all();
    }

    pub(super) fn on_the_way(&self) -> usize {
        self.on_the_way.load(Ordering::Acquire)
    }
}

/// A sync on its way to the commit; arrives when dropped, if not before.
#[must_use = "a sync announced arrives when this drops"]
pub struct SyncOnTheWay<'a> {
    journal: &'a Journal,
    arrived: bool,
}

impl SyncOnTheWay<'_> {
    /// Its records are appended: a leader waiting for it may go.
    pub fn arrive(mut self) {
        self.arrive_once();
    }

    fn arrive_once(&mut self) {
        if std::mem::replace(&mut self.arrived, true) {
            return;
        }
        let batch = &self.journal.batch;
        // Under the mutex the waiting leader holds between its check and
        // its wait, so the signal cannot fall between the two.
        let _inner = self.journal.inner();
        let before = batch.on_the_way.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a sync arrived that was never announced");
        batch.arrived.notify_all();
    }
}

impl Drop for SyncOnTheWay<'_> {
    fn drop(&mut self) {
        self.arrive_once();
    }
}

impl Journal {
    /// As `SyncBatch::assume_group_write`, for tests outside the journal.
    #[cfg(test)]
    pub(crate) fn assume_group_write(&self, elapsed: Duration) {
        self.batch.assume_group_write(elapsed);
    }

    /// Announces a sync that is about to write its data back and commit.
    pub fn announce_sync(&self) -> SyncOnTheWay<'_> {
        self.batch.on_the_way.fetch_add(1, Ordering::AcqRel);
        SyncOnTheWay { journal: self, arrived: false }
    }

    /// Before leading a group for a sync: waits while other syncs are on
    /// their way, up to the wait limit, unless a leader starts or `lsn`
    /// becomes durable meanwhile. True if it waited (the caller looks
    /// again).
    pub(super) fn wait_for_syncs_on_the_way(
        &self,
        inner: &mut parking_lot::MutexGuard<'_, Inner>,
        lsn: u64,
    ) -> bool {
        if self.batch.on_the_way() == 0 {
            return false;
        }
        debug_assert!(!inner.leader_active, "a sync waits to lead while another leads");
        let deadline = Instant::now() + self.batch.wait_limit();
        #[cfg(test)]
        self.batch.note_wait_begun();
        while self.batch.on_the_way() > 0 && !inner.leader_active && inner.durable_lsn < lsn {
            if self.batch.arrived.wait_until(inner, deadline).timed_out() {
                break;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::tests::{transaction, Fixture};

    /// A sync about to lead a group waits for another on its way, and one
    /// group (one FUA write) then makes both durable; the other's commit
    /// then writes nothing.
    #[test]
    fn a_sync_leading_a_group_waits_for_one_on_its_way() {
        let fixture = Fixture::new();
        let (journal, _) = fixture.open();
        journal.batch.assume_group_write(Duration::from_secs(30));
        let fua_before = fixture.device.stats().fua_writes;
        let on_its_way = journal.announce_sync();
        let leader = journal.announce_sync();
        let leader_lsn = journal.append(&transaction(1, 1));
        std::thread::scope(|scope| {
            let leading = scope.spawn(|| {
                leader.arrive();
                journal.commit_sync(leader_lsn).expect("commit");
            });
            // The leader begins to wait (a leader that did not would never
            // signal this, and the test fails at the deadline), holding
            // back its group: nothing is written until the other arrives.
            journal.batch.await_waits_begun(1, Duration::from_secs(20));
            assert!(!leading.is_finished(), "the leader did not wait");
            assert_eq!(fixture.device.stats().fua_writes, fua_before);
            let other_lsn = journal.append(&transaction(2, 1));
            on_its_way.arrive();
            leading.join().expect("leader");
            assert!(journal.durable_lsn() >= other_lsn, "the group left the other's record out");
            journal.commit_sync(other_lsn).expect("commit");
        });
        assert_eq!(fixture.device.stats().fua_writes, fua_before + 1, "one group for both");
        assert_eq!(journal.batch.waits_begun(), 1, "the leader waited once");
    }

    /// With no other sync on its way a sync commits at once, its own
    /// announcement having arrived; one dropped on an error path (never
    /// arriving explicitly) releases a waiting leader too.
    #[test]
    fn a_sync_waits_only_for_others_and_a_dropped_one_arrives() {
        let fixture = Fixture::new();
        let (journal, _) = fixture.open();
        journal.batch.assume_group_write(Duration::from_secs(30));
        let alone = journal.announce_sync();
        let lsn = journal.append(&transaction(1, 1));
        alone.arrive();
        let started = Instant::now();
        journal.commit_sync(lsn).expect("commit");
        assert!(started.elapsed() < Duration::from_secs(10), "waited with nobody on the way");
        assert_eq!(journal.batch.waits_begun(), 0, "waited with nobody on the way");

        let failing = journal.announce_sync();
        let lsn = journal.append(&transaction(2, 1));
        std::thread::scope(|scope| {
            let leading = scope.spawn(|| journal.commit_sync(lsn).expect("commit"));
            // It waits for the one on its way (failing at the deadline if
            // it never does), and only its drop lets the leader go.
            journal.batch.await_waits_begun(1, Duration::from_secs(20));
            assert!(!leading.is_finished(), "the leader did not wait");
            drop(failing);
            leading.join().expect("leader");
        });
        assert_eq!(journal.batch.on_the_way(), 0);
        assert_eq!(journal.batch.waits_begun(), 1, "the leader waited once");
    }

    /// The wait is bounded: a sync on its way that never arrives (a long
    /// writeback) delays a leader by the recent group write time, no more.
    #[test]
    fn a_leader_waits_at_most_a_group_write() {
        let fixture = Fixture::new();
        let (journal, _) = fixture.open();
        journal.batch.assume_group_write(Duration::from_millis(200));
        let _stuck = journal.announce_sync();
        let lsn = journal.append(&transaction(1, 1));
        let started = Instant::now();
        journal.commit_sync(lsn).expect("commit");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(150), "did not wait: {waited:?}");
        assert!(journal.durable_lsn() >= lsn);
        // Plain commits (the background commit, checkpoints) never wait.
        journal.batch.assume_group_write(Duration::from_secs(30));
        let lsn = journal.append(&transaction(2, 1));
        let started = Instant::now();
        journal.commit(lsn).expect("commit");
        assert!(started.elapsed() < Duration::from_secs(10), "a plain commit waited");
    }
}
