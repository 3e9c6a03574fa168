//! The journal on its own, over the in-memory fault device: what a commit
//! writes comes back from `load`, the log wraps at the end of its region,
//! a full log says `Full` rather than overwriting what replay needs, and a
//! failed write leaves the journal refusing everything after it.

use super::*;
use crate::dev::fault::{FaultOp, FaultRule};
use crate::dev::{FaultDev, FuaMode};
use crate::format::Timestamp;

const VOLUME_BYTES: u64 = 8 << 20;
/// The smallest journal mkfs makes: a group holds at most 16 KiB.
const JOURNAL_BYTES: u64 = 64 << 10;

pub(super) struct Fixture {
    raw: Arc<FaultDev>,
    pub(super) device: Arc<Device>,
    geometry: JournalGeometry,
}

impl Fixture {
    pub(super) fn new() -> Self {
        let raw = Arc::new(FaultDev::new(VOLUME_BYTES, 512));
        let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
        let superblock = Superblock::layout(
            VOLUME_BYTES,
            4096,
            512,
            Some(JOURNAL_BYTES),
            None,
            [7; 16],
            Timestamp::now(),
        )
        .expect("layout");
        let geometry = JournalGeometry::new(&superblock);
        write_initial_checkpoint(&device, &geometry, 2, &[], 0).expect("initial checkpoint");
        Self { raw, device, geometry }
    }

    /// The journal as a mount would open it now.
    pub(super) fn open(&self) -> (Journal, Loaded) {
        let loaded = load(&self.device, &self.geometry).expect("load");
        let journal =
            Journal::new(Arc::clone(&self.device), self.geometry.clone(), loaded.position);
        (journal, loaded)
    }
}

/// A record whose fields say which transaction wrote it.
fn record(txn: u64, index: u64) -> Record {
    Record::ExtentUnmap { ino: txn + 2, file_block: index, block_count: 1 }
}

pub(super) fn transaction(txn: u64, records: u64) -> Vec<Record> {
    (0..records).map(|index| record(txn, index)).collect()
}

/// Commits, checkpointing (with an empty state) whenever the log is full,
/// as `MetaStore::commit` does. Returns whether a checkpoint was written.
fn commit_or_checkpoint(journal: &Journal, lsn: u64) -> bool {
    let mut checkpointed = false;
    loop {
        match journal.commit(lsn) {
            Ok(()) => return checkpointed,
            Err(CommitError::Full) => {
                journal.write_checkpoint(journal.replay_point(), 2, &[], 0).expect("checkpoint");
                checkpointed = true;
            }
            Err(CommitError::Failed(message)) => panic!("commit failed: {message}"),
        }
    }
}

#[test]
fn committed_transactions_come_back_in_order_from_load() {
    let fixture = Fixture::new();
    let (journal, loaded) = fixture.open();
    assert!(loaded.journal_records.is_empty());
    let mut expected = Vec::new();
    for txn in 0..20 {
        let records = transaction(txn, 1 + txn % 4);
        let lsn = journal.append(&records);
        expected.extend(records);
        if txn % 3 == 2 {
            journal.commit(lsn).expect("commit");
        }
    }
    journal.commit(journal.last_lsn()).expect("commit");
    assert_eq!(journal.durable_lsn(), expected.len() as u64);

    let (reopened, loaded) = fixture.open();
    assert_eq!(loaded.journal_records, expected);
    assert_eq!(loaded.journal_groups_replayed, 7, "one group per commit");
    // The reopened writer continues the numbering where the log ended.
    assert_eq!(reopened.last_lsn(), expected.len() as u64);
}

#[test]
fn appended_but_uncommitted_records_are_not_replayed() {
    let fixture = Fixture::new();
    let (journal, _) = fixture.open();
    let committed = transaction(0, 3);
    journal.commit(journal.append(&committed)).expect("commit");
    journal.append(&transaction(1, 2));
    drop(journal);
    let (_, loaded) = fixture.open();
    assert_eq!(loaded.journal_records, committed);
}

#[test]
fn the_log_wraps_at_the_end_of_its_region_and_replays_past_the_wrap() {
    let fixture = Fixture::new();
    let (journal, _) = fixture.open();
    // Records since the last checkpoint: what load must return.
    let mut since_checkpoint: Vec<Record> = Vec::new();
    let mut checkpoints = 0;
    // Enough groups of ~1.3 KiB to go round the 64 KiB region several times.
    for txn in 0..300 {
        let records = transaction(txn, 40);
        let lsn = journal.append(&records);
        if commit_or_checkpoint(&journal, lsn) {
            checkpoints += 1;
            // A checkpoint holds the whole state, which has every appended
            // record applied (this transaction too): replay skips them.
            since_checkpoint.clear();
        } else {
            since_checkpoint.extend(records);
        }
    }
    let head = journal.inner.lock().head;
    assert!(head > 3 * JOURNAL_BYTES, "the log went round ({head} bytes written)");
    assert!(checkpoints >= 3, "{checkpoints} checkpoints");
    drop(journal);
    let (reopened, loaded) = fixture.open();
    assert_eq!(loaded.journal_records, since_checkpoint);
    // Positions are virtual (they only grow); a reload counts laps from
    // its checkpoint, so only the place in the region must agree.
    let journal_bytes = fixture.geometry.journal_bytes;
    assert_eq!(loaded.position.head % journal_bytes, head % journal_bytes);
    assert_eq!(reopened.durable_lsn(), 300 * 40);
}

#[test]
fn a_full_log_says_full_and_overwrites_nothing_replay_needs() {
    let fixture = Fixture::new();
    let (journal, _) = fixture.open();
    let mut committed = Vec::new();
    let mut full_at = None;
    for txn in 0..200 {
        let records = transaction(txn, 40);
        let lsn = journal.append(&records);
        match journal.commit(lsn) {
            Ok(()) => committed.extend(records),
            Err(CommitError::Full) => {
                full_at = Some(txn);
                break;
            }
            Err(CommitError::Failed(message)) => panic!("commit failed: {message}"),
        }
    }
    let full_at = full_at.expect("a 64 KiB log fills without a checkpoint");
    assert!(full_at > 10, "the log held {full_at} groups");
    assert!(journal.failure().is_none(), "Full is not a failure");
    assert!(journal.used_fraction() <= 1.0);
    drop(journal);
    // Everything committed before Full is still there, in order.
    let (_, loaded) = fixture.open();
    assert_eq!(loaded.journal_records, committed);
}

#[test]
fn a_failed_group_write_leaves_the_journal_refusing_everything() {
    let fixture = Fixture::new();
    let (journal, _) = fixture.open();
    let first = transaction(0, 2);
    journal.commit(journal.append(&first)).expect("commit");

    fixture.raw.add_rule(FaultRule::next(FaultOp::Write, 1));
    let lsn = journal.append(&transaction(1, 2));
    assert!(matches!(journal.commit(lsn), Err(CommitError::Failed(_))));
    fixture.raw.clear_rules();

    // The device works again, but the journal does not pretend it does.
    assert!(journal.failure().is_some());
    let lsn = journal.append(&transaction(2, 2));
    assert!(matches!(journal.commit(lsn), Err(CommitError::Failed(_))));
    assert!(journal.write_checkpoint(journal.replay_point(), 2, &[], 0).is_err());
    assert_eq!(journal.durable_lsn(), 2);
    drop(journal);
    let (_, loaded) = fixture.open();
    assert_eq!(loaded.journal_records, first, "only what was durable comes back");
}

/// Transactions pending past what one group holds go out in two groups,
/// each with only its own records: the first group's payload once held
/// every pending byte (records of the second beyond its record count, past
/// the group limit), and replay refused it, losing both groups after the
/// commit had returned.
#[test]
fn pending_transactions_past_one_group_are_written_as_groups_of_their_own() {
    let fixture = Fixture::new();
    let (journal, _) = fixture.open();
    let payload_max = fixture.geometry.group_payload_bytes_max() as usize;
    // Each transaction about 60% of a group: two do not fit one.
    let records_per_txn = (payload_max * 3 / 5 / record(0, 0).encoded_bytes_max()) as u64;
    let first = transaction(0, records_per_txn);
    let second = transaction(1, records_per_txn);
    journal.append(&first);
    let lsn = journal.append(&second);
    let fua_before = fixture.device.stats().fua_writes;
    journal.commit(lsn).expect("commit");
    assert_eq!(fixture.device.stats().fua_writes, fua_before + 2, "two groups");
    drop(journal);
    let (_, loaded) = fixture.open();
    assert_eq!(loaded.journal_groups_replayed, 2);
    assert_eq!(loaded.journal_records, [first, second].concat());
}
