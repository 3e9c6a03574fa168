//! The metadata store: one lock around the state, transactions that apply
//! records and log them in the same critical section, group commit, and
//! checkpoints.
//!
//! Because a transaction applies and appends under the write lock, the order
//! of records in the log is the order in which the state changed, and a
//! checkpoint taken under the read lock is exactly "the state after lsn L".

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::alloc::BlockRun;
use crate::dev::{Device, DiscardMode};
use crate::error::{Error, Result};
use crate::extent::Extent;
use crate::format::{InodeAttrs, Record, Superblock, ROOT_INO};
use crate::journal::{self, CommitError, Journal, JournalGeometry};
use crate::lock_order::{Level, Ordered};

use super::state::MetaState;

/// `runs` sorted and joined where one ends where the next starts, as
/// (start, count): one discard per contiguous stretch.
fn merged_runs(runs: &[BlockRun]) -> Vec<(u64, u64)> {
    let mut sorted = runs.to_vec();
    sorted.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for run in sorted {
        match merged.last_mut() {
            Some((start, count)) if *start + *count == run.start => *count += run.count,
            _ => merged.push((run.start, run.count)),
        }
    }
    merged
}

/// The parts of `displaced` whose device blocks no run of `remapped` covers
/// (delayed extents, which hold no device blocks, pass unchanged).
fn not_remapped(displaced: Vec<Extent>, remapped: &[BlockRun]) -> Vec<Extent> {
    if remapped.is_empty() {
        return displaced;
    }
    let mut pieces = displaced;
    for run in remapped {
        pieces = pieces
            .iter()
            .flat_map(|piece| piece.outside_dev_blocks(run.start, run.start + run.count))
            .collect();
    }
    pieces
}

/// Start a checkpoint when this much of the journal is live.
const CHECKPOINT_USED_FRACTION: f64 = 0.5;

/// What mount found, for `info` and `fsck`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadReport {
    pub checkpoint_generation: u64,
    pub checkpoint_records: u64,
    pub journal_groups_replayed: u64,
    pub journal_records_replayed: u64,
}

pub struct MetaStore {
    state: RwLock<MetaState>,
    /// Bumped by every write lock of `state`, once it is held and before
    /// anything changes: a copy of state taken under the read lock at
    /// generation G is still true while the generation reads G
    /// ([`super::view::InodeView`]).
    generation: AtomicU64,
    journal: Journal,
    checkpoint_lock: Mutex<()>,
    read_only: bool,
    /// Bytes of a block once `-o discard` is on; 0 while off.
    discard_block_bytes: AtomicU64,
    /// Requests to the background committer, where the volume runs one.
    committer: Mutex<CommitterMailbox>,
    committer_wake: Condvar,
}

/// What a writer and the volume tell the background committer.
#[derive(Default)]
struct CommitterMailbox {
    /// A thread serves requests ([`MetaStore::committer_starting`]).
    running: bool,
    /// Commit now, without waiting for the interval.
    commit_wanted: bool,
    stopping: bool,
}

/// Journal bytes any transaction may use without reserving them: a few
/// inode, directory-entry and extent records (each under 300 bytes). The
/// smallest journal's group (`JOURNAL_BYTES_MIN / 4`, 16 KiB) holds it many
/// times over, so only a transaction that reserves more can be refused.
pub const TXN_LOG_BYTES_UNRESERVED: u64 = 1024;

/// A transaction: records applied to the state as they are added, appended to
/// the journal when the closure returns Ok. A closure validates before its
/// first `apply`; returning an error after applying is a bug (asserted).
///
/// Its size is bounded here, where it can still be refused: a transaction
/// must fit one journal group (replay applies whole groups), so a closure
/// whose records can grow past `TXN_LOG_BYTES_UNRESERVED` reserves their
/// room with [`Txn::ensure_metadata_room`] before its first `apply`, which
/// fails with ENOSPC when the group cannot hold them. `apply` asserts that
/// the records stay within what was reserved, so an estimate that falls
/// short is caught at the operation that made it, never as a journal write
/// that cannot be done.
pub struct Txn<'a> {
    state: &'a mut MetaState,
    records: Vec<Record>,
    displaced: Vec<Extent>,
    /// Device blocks mapped by this transaction's records: a block that one
    /// record unmaps and a later one maps again (extents shifted by
    /// COLLAPSE_RANGE / INSERT_RANGE) is not freed.
    remapped: Vec<BlockRun>,
    /// Inodes the records changed, and whether the change matters to
    /// reading data back (for the per-inode lsns fsync and fdatasync use).
    touched: Vec<(u64, bool)>,
    metadata_bytes_max: u64,
    /// Upper bound of the applied records' encoded size
    /// ([`Record::encoded_bytes_max`]).
    log_bytes: u64,
    /// What `log_bytes` may reach: the unreserved allowance, raised by
    /// `ensure_metadata_room`; never above `log_bytes_max`.
    log_bytes_granted: u64,
    /// One journal group's payload.
    log_bytes_max: u64,
}

impl Txn<'_> {
    pub fn state(&self) -> &MetaState {
        self.state
    }

    /// For memory-only fields and the allocator; persistent fields change
    /// only through [`Txn::apply`].
    pub fn state_mut(&mut self) -> &mut MetaState {
        self.state
    }

    /// Applies `record` now and logs it at the end of the transaction.
    pub fn apply(&mut self, record: Record) {
        self.log_bytes += record.encoded_bytes_max() as u64;
        assert!(
            self.log_bytes <= self.log_bytes_granted,
            "transaction outgrew its reservation: {} journal bytes after {record:?}, {} reserved \
             (reserve with ensure_metadata_room before the first apply)",
            self.log_bytes,
            self.log_bytes_granted
        );
        self.note_touched(&record);
        if let Record::ExtentMap { dev_block, block_count, .. } = record {
            self.remapped.push(BlockRun { start: dev_block, count: block_count });
        }
        match self.state.apply(&record) {
            Ok(displaced) => self.displaced.extend(displaced),
            Err(error) => panic!("live metadata change does not apply: {error} ({record:?})"),
        }
        self.records.push(record);
    }

    fn note_touched(&mut self, record: &Record) {
        match record {
            Record::InodeSet { ino, attrs } => {
                let size_changed =
                    self.state.inode(*ino).is_none_or(|inode| inode.attrs.size != attrs.size);
                self.touched.push((*ino, size_changed));
            }
            Record::InodeFree { .. } => {}
            Record::SymlinkSet { ino, .. } => self.touched.push((*ino, true)),
            Record::DirAdd { dir, ino, .. } => {
                self.touched.push((*dir, true));
                self.touched.push((*ino, true));
            }
            Record::DirRemove { dir, .. } => self.touched.push((*dir, true)),
            Record::ExtentMap { ino, .. } | Record::ExtentUnmap { ino, .. } => {
                self.touched.push((*ino, true))
            }
            // Not needed to read the data back: fdatasync skips them.
            Record::XattrSet { ino, .. } | Record::XattrRemove { ino, .. } => {
                self.touched.push((*ino, false))
            }
            Record::DeviceSet { ino, .. } => self.touched.push((*ino, true)),
            Record::FlagsSet { ino, .. } => self.touched.push((*ino, false)),
        }
    }

    pub fn records_applied(&self) -> usize {
        self.records.len()
    }

    /// Reserves room for records of up to `extra_bytes` (encoded, as
    /// [`Record::encoded_bytes_max`] counts them) beyond those applied so
    /// far and the unreserved allowance. Fails with ENOSPC, changing
    /// nothing, if they would not fit one journal group or the metadata
    /// would outgrow the checkpoint slot.
    pub fn ensure_metadata_room(&mut self, extra_bytes: u64) -> Result<()> {
        let needed = self.state.persisted_bytes_estimate() + extra_bytes;
        if needed > self.metadata_bytes_max {
            return Err(Error::NoSpace(format!(
                "metadata would need {needed} bytes; the checkpoint slot holds {}",
                self.metadata_bytes_max
            )));
        }
        let log_bytes_needed = self.log_bytes + extra_bytes + TXN_LOG_BYTES_UNRESERVED;
        if log_bytes_needed > self.log_bytes_max {
            return Err(Error::NoSpace(format!(
                "one change would need {log_bytes_needed} bytes of journal; a journal group \
                 holds {} (make the volume with a larger journal)",
                self.log_bytes_max
            )));
        }
        self.log_bytes_granted = self.log_bytes_granted.max(log_bytes_needed);
        Ok(())
    }
}

impl MetaStore {
    /// Loads the checkpoint and replays the journal. Fails (changing nothing)
    /// if any record contradicts the state or two files share a block.
    pub fn load(
        device: Arc<Device>,
        geometry: JournalGeometry,
        data_region: crate::format::Region,
        read_only: bool,
    ) -> Result<(Self, LoadReport)> {
        let loaded = journal::load(&device, &geometry)?;
        let mut state = MetaState::new(data_region);
        for (index, record) in loaded.checkpoint_records.iter().enumerate() {
            state
                .apply(record)
                .map_err(|error| Error::Corrupt(format!("checkpoint record {index}: {error}")))?;
        }
        for (index, record) in loaded.journal_records.iter().enumerate() {
            state
                .apply(record)
                .map_err(|error| Error::Corrupt(format!("journal record {index}: {error}")))?;
        }
        state.finish_load().map_err(|error| Error::Corrupt(error.0))?;
        state.next_ino = state.next_ino.max(loaded.checkpoint.next_ino);
        let report = LoadReport {
            checkpoint_generation: loaded.checkpoint.generation,
            checkpoint_records: loaded.checkpoint_records.len() as u64,
            journal_groups_replayed: loaded.journal_groups_replayed,
            journal_records_replayed: loaded.journal_records.len() as u64,
        };
        let journal = Journal::new(device, geometry, loaded.position);
        let store = Self {
            state: RwLock::new(state),
            generation: AtomicU64::new(1),
            journal,
            checkpoint_lock: Mutex::new(()),
            read_only,
            discard_block_bytes: AtomicU64::new(0),
            committer: Mutex::new(CommitterMailbox::default()),
            committer_wake: Condvar::new(),
        };
        Ok((store, report))
    }

    /// Writes the first checkpoint of a new volume: an empty root directory.
    pub fn format(device: &Arc<Device>, superblock: &Superblock, root: InodeAttrs) -> Result<()> {
        let mut state = MetaState::new(superblock.data);
        state.apply(&Record::InodeSet { ino: ROOT_INO, attrs: root }).expect("fresh state");
        let (payload, record_count) = state.encode_snapshot();
        let geometry = JournalGeometry::new(superblock);
        journal::write_initial_checkpoint(device, &geometry, state.next_ino, &payload, record_count)
    }

    pub fn read(&self) -> Ordered<RwLockReadGuard<'_, MetaState>> {
        Ordered::lock(Level::Metadata, || self.state.read())
    }

    /// How many times the state was locked for change (see `generation`);
    /// stable while a read lock is held.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The write lock, the only way to change the state: counts the change
    /// before the caller makes it.
    fn write_state(&self) -> Ordered<RwLockWriteGuard<'_, MetaState>> {
        let state = Ordered::lock(Level::Metadata, || self.state.write());
        self.generation.fetch_add(1, Ordering::AcqRel);
        state
    }

    /// Changes memory-only fields (open handle counts, in-memory sizes) under
    /// the write lock without logging; works on read-only volumes too. The
    /// closure must not change persistent state.
    pub fn update_memory<T>(&self, change: impl FnOnce(&mut MetaState) -> T) -> T {
        change(&mut self.write_state())
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Why the store refuses changes, if it does.
    pub fn refusal(&self) -> Option<Error> {
        if self.read_only {
            return Some(Error::ReadOnly("opened read-only".into()));
        }
        if self.journal.device().is_shut_down() {
            return Some(Error::ShutDown);
        }
        self.journal.failure().map(Error::ReadOnly)
    }

    /// Runs `change` as one transaction; returns its value and the lsn of the
    /// transaction's last record.
    pub fn transact<T>(&self, change: impl FnOnce(&mut Txn<'_>) -> Result<T>) -> Result<(T, u64)> {
        if let Some(refusal) = self.refusal() {
            return Err(refusal);
        }
        let metadata_bytes_max = self.journal.geometry().slot_payload_bytes_max();
        let log_bytes_max = self.journal.geometry().group_payload_bytes_max();
        debug_assert!(TXN_LOG_BYTES_UNRESERVED <= log_bytes_max);
        let mut state = self.write_state();
        state.release_pending_frees(self.journal.durable_lsn());
        let mut txn = Txn {
            state: &mut state,
            records: Vec::new(),
            displaced: Vec::new(),
            remapped: Vec::new(),
            touched: Vec::new(),
            metadata_bytes_max,
            log_bytes: 0,
            log_bytes_granted: TXN_LOG_BYTES_UNRESERVED.min(log_bytes_max),
            log_bytes_max,
        };
        let value = match change(&mut txn) {
            Ok(value) => value,
            Err(error) => {
                assert!(
                    txn.records.is_empty(),
                    "transaction failed after applying records: {error}"
                );
                return Err(error);
            }
        };
        let Txn { records, displaced, remapped, touched, .. } = txn;
        let lsn = self.journal.append(&records);
        state.release_displaced(&not_remapped(displaced, &remapped), lsn);
        for (ino, data) in touched {
            if let Some(inode) = state.inode_mut(ino) {
                // fsync waits for an inode's lsns: they only move forward.
                assert!(inode.meta_lsn <= lsn, "inode {ino}: lsn {lsn} after {}", inode.meta_lsn);
                assert!(inode.data_lsn <= lsn, "inode {ino}: lsn {lsn} after {}", inode.data_lsn);
                inode.meta_lsn = lsn;
                if data {
                    inode.data_lsn = lsn;
                }
            }
        }
        drop(state);
        let pending_bytes = self.journal.pending_bytes() as u64;
        let group_bytes_max = self.journal.geometry().group_bytes_max();
        if pending_bytes > group_bytes_max / 2 {
            // Bound the unwritten log. Half a group's worth is handed to the
            // background committer, and the writer goes on (as jbd2 commits
            // a transaction grown too large); a writer that outruns it by a
            // whole group, or a volume without one, writes it itself.
            if pending_bytes > group_bytes_max || !self.request_commit() {
                self.commit(lsn)?;
            }
        }
        Ok((value, lsn))
    }

    /// Asks the background committer to commit now; false when no
    /// committer runs.
    fn request_commit(&self) -> bool {
        let mut mailbox = self.committer.lock();
        if !mailbox.running || mailbox.stopping {
            return false;
        }
        if !mailbox.commit_wanted {
            mailbox.commit_wanted = true;
            self.committer_wake.notify_one();
        }
        true
    }

    /// The background committer's wait: returns after `interval`, or
    /// sooner when a writer asks for a commit (true: commit), or when the
    /// volume stops it (false: end).
    pub fn wait_for_commit_request(&self, interval: Duration) -> bool {
        let mut mailbox = self.committer.lock();
        if !mailbox.commit_wanted && !mailbox.stopping {
            self.committer_wake.wait_for(&mut mailbox, interval);
        }
        mailbox.commit_wanted = false;
        if mailbox.stopping {
            mailbox.running = false;
            return false;
        }
        true
    }

    /// A background committer is about to start: from now on writers hand
    /// it half-full groups (it picks up a request made before its first wait).
    pub fn committer_starting(&self) {
        self.committer.lock().running = true;
    }

    /// Ends the background committer's waits, and refuses it requests.
    pub fn stop_committer(&self) {
        self.committer.lock().stopping = true;
        self.committer_wake.notify_all();
    }

    /// From now on blocks freed by a durable record are discarded on the
    /// device before they can be reused (`-o discard`, as ext4's).
    pub fn enable_discard(&self, block_bytes: u64) {
        self.discard_block_bytes.store(block_bytes, Ordering::Relaxed);
        self.write_state().discard_freed = true;
    }

    /// Discards the blocks freed by records now durable, then hands them to
    /// the allocator. Why this order keeps every crash image sound:
    /// - only runs whose freeing record is durable are discarded, so replay
    ///   after any crash applies that record and no live file maps them
    ///   (discarding at the free itself would wipe data that a crash before
    ///   the commit brings back into a file);
    /// - the runs reach the allocator only after the discard completed, so
    ///   no write of a new owner's data can be overtaken by it (a device
    ///   orders a completed request before one issued later);
    /// - the discard is not flushed: lost in a crash, the old bytes stay in
    ///   free space, which nothing reads (a new allocation is unwritten, read
    ///   as zeros, until its data is written).
    ///
    /// A failed discard only costs the device its hint: the blocks are freed
    /// all the same, and a device that cannot discard is not asked again.
    fn discard_durable_frees(&self) {
        let block_bytes = self.discard_block_bytes.load(Ordering::Relaxed);
        if block_bytes == 0 {
            return;
        }
        let runs = self.write_state().take_durable_frees(self.journal.durable_lsn());
        if runs.is_empty() {
            return;
        }
        for (start, count) in merged_runs(&runs) {
            let discarded = self.journal.device().discard(
                start * block_bytes,
                count * block_bytes,
                DiscardMode::Trim,
            );
            match discarded {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::Unsupported => {
                    tracing::warn!("discard turned off: {error}");
                    self.discard_block_bytes.store(0, Ordering::Relaxed);
                    break;
                }
                Err(error) => tracing::warn!("discard of {count} blocks at {start}: {error}"),
            }
        }
        let mut state = self.write_state();
        state.finish_discards(&runs);
        if self.discard_block_bytes.load(Ordering::Relaxed) == 0 {
            state.discard_freed = false;
            let durable_lsn = self.journal.durable_lsn();
            state.release_pending_frees(durable_lsn);
        }
    }

    /// Makes every record up to `lsn` durable, checkpointing when the log is full.
    pub fn commit(&self, lsn: u64) -> Result<()> {
        loop {
            match self.journal.commit(lsn) {
                Ok(()) => {
                    self.discard_durable_frees();
                    return Ok(());
                }
                Err(CommitError::Full) => self.checkpoint()?,
                Err(CommitError::Failed(message)) => {
                    return Err(Error::io(message, std::io::Error::from_raw_os_error(libc::EIO)))
                }
            }
        }
    }

    /// Commits up to `lsn`, then flushes plain data writes the commit did
    /// not already cover: what fsync, fdatasync and syncfs promise.
    pub fn make_durable(&self, lsn: u64) -> Result<()> {
        if self.journal.device().is_shut_down() {
            return Err(Error::ShutDown);
        }
        if let Some(failure) = self.journal.failure() {
            return Err(Error::io(failure, std::io::Error::from_raw_os_error(libc::EIO)));
        }
        self.commit(lsn)?;
        self.journal
            .flush_data()
            .map_err(|message| Error::io(message, std::io::Error::from_raw_os_error(libc::EIO)))
    }

    pub fn commit_all(&self) -> Result<()> {
        self.commit(self.journal.last_lsn())
    }

    /// Writes the whole state to the next checkpoint slot.
    pub fn checkpoint(&self) -> Result<()> {
        if let Some(refusal) = self.refusal() {
            return Err(refusal);
        }
        let _only_one = Ordered::lock(Level::Checkpoint, || self.checkpoint_lock.lock());
        let (point, next_ino, payload, record_count) = {
            let state = self.read();
            let point = self.journal.replay_point();
            let (payload, record_count) = state.encode_snapshot();
            (point, state.next_ino, payload, record_count)
        };
        self.journal.write_checkpoint(point, next_ino, &payload, record_count)
    }

    /// Checkpoints if the journal is filling up; returns whether it did.
    pub fn checkpoint_if_due(&self) -> Result<bool> {
        if self.refusal().is_some() || self.journal.used_fraction() < CHECKPOINT_USED_FRACTION {
            return Ok(false);
        }
        self.checkpoint().map(|()| true)
    }
}
