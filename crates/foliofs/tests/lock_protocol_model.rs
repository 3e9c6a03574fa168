//! A model of the metadata's locking protocol, checked under many thread
//! interleavings with shuttle (a randomized scheduler that runs each
//! iteration's threads one step at a time, and reports a deadlock as a
//! panic).
//!
//! The model is small and keeps only what the protocol's promises rest on
//! (`meta::store`, `meta::checkpoint`, docs/format.md "Log order"):
//! - a transaction write-locks the shards of the inodes it names, in
//!   ascending index; before changing a shard it pays that shard's debt to
//!   a checkpoint in progress; its records reach the log (a mutex that
//!   hands out lsns) before it lets the shards go;
//! - a checkpoint (one at a time) read-locks every shard, takes the log's
//!   end as its cut, marks every shard owed and lets them all go; then it
//!   encodes each shard still owed under that shard's read lock.
//!
//! What is checked, every iteration:
//! - no interleaving deadlocks (shuttle fails the test if one does);
//! - each inode's records are in the log in the order they changed it:
//!   replaying the whole log from the start, every record finds the value
//!   it changed;
//! - the checkpoint is the state at its cut: transfers between inodes of
//!   different shards keep a sum, and the checkpoint's sum is that sum; the
//!   checkpoint with the log after its cut replayed is the final state.
//!
//! Three variants with a step of the protocol left out must fail, so the
//! checks are known to catch what they are for.

use std::sync::Arc;

use shuttle::sync::atomic::{AtomicBool, Ordering};
use shuttle::sync::{Mutex, RwLock};
use shuttle::thread;

const SHARDS: usize = 4;
const INODES: usize = 8;
/// Every inode starts with this value; transfers keep the sum.
const START: i64 = 100;

fn shard_of(ino: usize) -> usize {
    ino % SHARDS
}

/// A record: inode, the value it found, the value it left.
#[derive(Clone, Copy, Debug)]
struct Record {
    ino: usize,
    before: i64,
    after: i64,
}

/// What the variants leave out.
#[derive(Clone, Copy, PartialEq)]
enum Protocol {
    Whole,
    /// Shards locked in the order the transaction names them.
    LocksInNamedOrder,
    /// Writers change an owed shard without encoding it first.
    WritersSkipTheDebt,
    /// Records appended after the shards are let go.
    AppendsAfterUnlock,
}

struct Shard {
    /// This shard's inodes' values (by inode number; others unused).
    values: [i64; INODES],
}

struct Store {
    protocol: Protocol,
    shards: Vec<RwLock<Shard>>,
    owed: Vec<AtomicBool>,
    /// Each shard's values as of the checkpoint's cut, once encoded.
    parts: Mutex<Vec<Option<[i64; INODES]>>>,
    log: Mutex<Vec<Record>>,
    checkpoint_lock: Mutex<()>,
}

impl Store {
    fn new(protocol: Protocol) -> Self {
        Self {
            protocol,
            shards: (0..SHARDS).map(|_| RwLock::new(Shard { values: [START; INODES] })).collect(),
            owed: (0..SHARDS).map(|_| AtomicBool::new(false)).collect(),
            parts: Mutex::new(vec![None; SHARDS]),
            log: Mutex::new(Vec::new()),
            checkpoint_lock: Mutex::new(()),
        }
    }

    fn pay_debt(&self, index: usize, shard: &Shard) {
        if self.owed[index].swap(false, Ordering::SeqCst) {
            self.parts.lock().unwrap()[index] = Some(shard.values);
        }
    }

    /// Moves `amount` from inode `from` to inode `to` in one transaction.
    fn transfer(&self, from: usize, to: usize, amount: i64) {
        let mut named = vec![shard_of(from), shard_of(to)];
        if self.protocol != Protocol::LocksInNamedOrder {
            named.sort_unstable();
        }
        named.dedup();
        let mut guards: Vec<(usize, _)> =
            named.iter().map(|&index| (index, self.shards[index].write().unwrap())).collect();
        if self.protocol != Protocol::WritersSkipTheDebt {
            for (index, guard) in &guards {
                self.pay_debt(*index, guard);
            }
        }
        let mut records = Vec::new();
        for (ino, delta) in [(from, -amount), (to, amount)] {
            let (_, guard) = guards
                .iter_mut()
                .find(|(index, _)| *index == shard_of(ino))
                .expect("the inode's shard is locked");
            let before = guard.values[ino];
            guard.values[ino] = before + delta;
            records.push(Record { ino, before, after: before + delta });
        }
        if self.protocol == Protocol::AppendsAfterUnlock {
            drop(guards);
            thread::yield_now();
            self.log.lock().unwrap().extend(records);
            return;
        }
        // In the log before the shards are let go.
        self.log.lock().unwrap().extend(records);
        drop(guards);
    }

    /// Returns the cut (the lsn replay starts from) and the state there.
    fn checkpoint(&self) -> (usize, [i64; INODES]) {
        let _only_one = self.checkpoint_lock.lock().unwrap();
        let cut = {
            let all: Vec<_> = self.shards.iter().map(|shard| shard.read().unwrap()).collect();
            let cut = self.log.lock().unwrap().len();
            *self.parts.lock().unwrap() = vec![None; SHARDS];
            for owed in &self.owed {
                owed.store(true, Ordering::SeqCst);
            }
            drop(all);
            cut
        };
        for index in 0..SHARDS {
            let shard = self.shards[index].read().unwrap();
            self.pay_debt(index, &shard);
        }
        let parts = self.parts.lock().unwrap();
        let state = std::array::from_fn(|ino| {
            let part = parts[shard_of(ino)].expect("every shard encoded");
            part[ino]
        });
        (cut, state)
    }
}

/// Replays `records` onto `state`, each finding the value it changed.
fn replay(state: &mut [i64; INODES], records: &[Record]) {
    for (lsn, record) in records.iter().enumerate() {
        assert_eq!(
            state[record.ino], record.before,
            "record {lsn} of inode {} found another value: out of order",
            record.ino
        );
        state[record.ino] = record.after;
    }
}

fn one_iteration(protocol: Protocol) {
    let store = Arc::new(Store::new(protocol));
    // Two writers whose transfers cross shards in opposite directions, and
    // a checkpointer.
    let writers: Vec<_> = [(0usize, 5usize), (5, 0)]
        .into_iter()
        .enumerate()
        .map(|(writer, (from, to))| {
            let store = Arc::clone(&store);
            thread::spawn(move || {
                for step in 0..3 {
                    store.transfer(from, to, 1 + writer as i64);
                    store.transfer((from + step) % INODES, (to + 2) % INODES, 1);
                }
            })
        })
        .collect();
    let checkpointer = {
        let store = Arc::clone(&store);
        thread::spawn(move || store.checkpoint())
    };
    for writer in writers {
        writer.join().unwrap();
    }
    let (cut, checkpointed) = checkpointer.join().unwrap();

    let log = store.log.lock().unwrap().clone();
    let mut from_start = [START; INODES];
    replay(&mut from_start, &log);
    let final_state: [i64; INODES] =
        std::array::from_fn(|ino| store.shards[shard_of(ino)].read().unwrap().values[ino]);
    assert_eq!(from_start, final_state, "the whole log replayed is the final state");

    let mut from_checkpoint = checkpointed;
    replay(&mut from_checkpoint, &log[cut..]);
    assert_eq!(from_checkpoint, final_state, "checkpoint and the log after its cut");
    let total = START * INODES as i64;
    assert_eq!(checkpointed.iter().sum::<i64>(), total, "the checkpoint holds half a transaction");
}

const ITERATIONS: usize = 20_000;

#[test]
fn the_protocol_keeps_order_and_consistent_checkpoints_under_random_schedules() {
    shuttle::check_random(|| one_iteration(Protocol::Whole), ITERATIONS);
}

#[test]
fn the_protocol_holds_under_priority_schedules() {
    // PCT: schedules that starve a thread at chosen points, finding
    // bugs that need a few ordered preemptions.
    shuttle::check_pct(|| one_iteration(Protocol::Whole), ITERATIONS, 3);
}

#[test]
#[should_panic(expected = "deadlock")]
fn shards_locked_out_of_order_deadlock_and_the_model_sees_it() {
    shuttle::check_random(|| one_iteration(Protocol::LocksInNamedOrder), ITERATIONS);
}

#[test]
#[should_panic(expected = "out of order")]
fn a_writer_that_skips_the_checkpoint_debt_is_caught() {
    shuttle::check_random(|| one_iteration(Protocol::WritersSkipTheDebt), ITERATIONS);
}

#[test]
#[should_panic(expected = "out of order")]
fn records_appended_after_the_shards_are_let_go_are_caught() {
    shuttle::check_random(|| one_iteration(Protocol::AppendsAfterUnlock), ITERATIONS);
}
