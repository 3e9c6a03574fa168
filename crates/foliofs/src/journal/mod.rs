//! The metadata journal: group commit of logical redo records and checkpoints
//! to alternating slots (this file); fsyncs from several threads batched
//! into one group (`batch`); loading, checkpoint plus replay, at mount
//! (`replay`).
//!
//! Positions in the journal are *virtual*: they only grow, and the physical
//! offset is `virtual % journal_bytes`. A group never straddles the end of
//! the region; when it does not fit, it starts the next lap at offset 0. The
//! live part of the log is `[tail, head)`; the tail moves when a checkpoint
//! is durable, so `head - tail <= journal_bytes` is the only space rule.
//!
//! Ordering rules (why replay never exposes stale data):
//! - a group is written with FUA after a flush of any plain write completed
//!   before it (`Device::flush_if_needed`), so records that declare data
//!   written reach the disk only after that data;
//! - a group is written only after the previous one is durable;
//! - a checkpoint follows the same flush-then-FUA rule and frees journal space
//!   only after it is durable.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::dev::{AlignedBuf, Device};
use crate::error::{Error, IoContext, Result};
use crate::format::codec::Writer;
use crate::format::journal::{
    check_group_payload, decode_group_header, encode_group, GroupHeader, GroupLink,
    GROUP_HEADER_BYTES,
};
use crate::format::record::{decode_all, Record};
use crate::format::{align_up, CheckpointHeader, Superblock, HEADER_BYTES};
use crate::lock_order::{Contention, Level, Ordered};

pub use batch::SyncOnTheWay;

mod batch;
mod replay;
#[cfg(test)]
mod tests;

pub use replay::{load, load_after};

/// Where the journal lives and how it is framed; derived from the superblock.
#[derive(Debug, Clone)]
pub struct JournalGeometry {
    pub uuid: [u8; 16],
    pub sector_bytes: u32,
    /// Device byte offset of the journal region.
    pub journal_offset: u64,
    pub journal_bytes: u64,
    /// Device byte offsets of the two checkpoint slots.
    pub slot_offsets: [u64; 2],
    pub slot_bytes: u64,
}

impl JournalGeometry {
    pub fn new(superblock: &Superblock) -> Self {
        let block = superblock.block_bytes_u64();
        Self {
            uuid: superblock.uuid,
            sector_bytes: superblock.sector_bytes,
            journal_offset: superblock.journal.start_block * block,
            journal_bytes: superblock.journal.block_count * block,
            slot_offsets: superblock.checkpoint_slots.map(|slot| slot.start_block * block),
            slot_bytes: superblock.checkpoint_slots[0].block_count * block,
        }
    }

    /// The largest group: a quarter of the journal, so a group always fits
    /// once a checkpoint has emptied the log.
    pub fn group_bytes_max(&self) -> u64 {
        self.journal_bytes / 4
    }

    /// Room for records in the largest group, after its header: what one
    /// transaction may log.
    pub fn group_payload_bytes_max(&self) -> u64 {
        self.group_bytes_max() - GROUP_HEADER_BYTES as u64
    }

    /// Room for the checkpoint payload after its header sector.
    pub fn slot_payload_bytes_max(&self) -> u64 {
        self.slot_bytes - u64::from(self.sector_bytes)
    }

    fn header_area_bytes(&self) -> usize {
        self.sector_bytes as usize
    }
}

/// Where replay must start to rebuild a state that includes records up to
/// `lsn_applied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayPoint {
    pub virtual_offset: u64,
    pub seq: u64,
    pub prev_crc: u32,
    pub lsn_applied: u64,
}

#[derive(Debug)]
pub enum CommitError {
    /// The log has no room for the next group: checkpoint, then retry.
    Full,
    /// A journal write failed earlier or now; the volume must go read-only.
    Failed(String),
}

struct Inner {
    /// Encoded records appended but not yet taken by a commit.
    pending: Vec<u8>,
    /// The last group's buffer, kept for the records a group leaves behind.
    spare: Vec<u8>,
    /// (last lsn, end offset in `pending`) of each transaction, so groups split
    /// only between transactions.
    pending_txn_ends: Vec<(u64, usize)>,
    pending_first_lsn: u64,
    next_lsn: u64,
    durable_lsn: u64,
    leader_active: bool,
    head: u64,
    tail: u64,
    next_seq: u64,
    /// Header checksum of the last group written: the next one's `prev`.
    last_header_crc: u32,
    checkpoint_generation: u64,
    failed: Option<String>,
}

pub struct Journal {
    device: Arc<Device>,
    geometry: JournalGeometry,
    inner: Mutex<Inner>,
    /// Set once `Inner::failed` is: every change asks whether the journal
    /// failed, and a flag read is cheaper than the lock, whose cache line
    /// the rest of the change has usually pushed out by then.
    has_failed: AtomicBool,
    /// `Inner::durable_lsn`, readable without the lock: every transaction
    /// asks whether frees became durable, and must not queue on the
    /// journal's mutex for it.
    durable_lsn: AtomicU64,
    commit_finished: Condvar,
    contention: Contention,
    /// Syncs on their way to the commit, which a sync leading a group
    /// waits for (`batch`).
    batch: batch::SyncBatch,
}

/// What mount reads: the checkpoint, then the journal records after it.
pub struct Loaded {
    pub checkpoint: CheckpointHeader,
    pub checkpoint_records: Vec<Record>,
    /// Journal records with lsn above the checkpoint's, in log order.
    pub journal_records: Vec<Record>,
    pub journal_groups_replayed: u64,
    /// Writer position after the last valid group.
    pub position: JournalPosition,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalPosition {
    pub head: u64,
    pub tail: u64,
    pub next_seq: u64,
    pub last_header_crc: u32,
    pub next_lsn: u64,
    pub checkpoint_generation: u64,
}

impl Journal {
    /// The journal's state, under its mutex (after the metadata lock in the
    /// lock order).
    fn inner(&self) -> Ordered<MutexGuard<'_, Inner>> {
        Ordered::lock(Level::Journal, || {
            self.contention.lock(|| self.inner.try_lock(), || self.inner.lock())
        })
    }

    /// Waits for the journal's mutex so far: (waits, nanoseconds).
    pub fn lock_waits(&self) -> (u64, u64) {
        self.contention.totals()
    }

    pub fn new(device: Arc<Device>, geometry: JournalGeometry, position: JournalPosition) -> Self {
        // Replay moves the head on from the checkpoint's replay point (the
        // tail), and lsns start at 1.
        assert!(position.tail <= position.head, "journal head {position:?} behind its tail");
        assert!(position.next_lsn >= 1, "lsn 0 is never a record's");
        let inner = Inner {
            pending: Vec::new(),
            spare: Vec::new(),
            pending_txn_ends: Vec::new(),
            pending_first_lsn: position.next_lsn,
            next_lsn: position.next_lsn,
            durable_lsn: position.next_lsn - 1,
            leader_active: false,
            head: position.head,
            tail: position.tail,
            next_seq: position.next_seq,
            last_header_crc: position.last_header_crc,
            checkpoint_generation: position.checkpoint_generation,
            failed: None,
        };
        Self {
            device,
            geometry,
            inner: Mutex::new(inner),
            has_failed: AtomicBool::new(false),
            durable_lsn: AtomicU64::new(position.next_lsn - 1),
            commit_finished: Condvar::new(),
            contention: Contention::default(),
            batch: batch::SyncBatch::default(),
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn device_arc(&self) -> &Arc<Device> {
        &self.device
    }

    /// The newest checkpoint's generation (a slot volume keeps generation
    /// `g` in slot `g % 2`).
    pub fn checkpoint_generation(&self) -> u64 {
        self.inner().checkpoint_generation
    }

    pub fn geometry(&self) -> &JournalGeometry {
        &self.geometry
    }

    /// Appends one transaction's records; returns the lsn of the last one (or
    /// of the last record so far when `records` is empty). Callers append in
    /// the order they applied the records to the state.
    pub fn append(&self, records: &[Record]) -> u64 {
        let mut writer = Writer::with_capacity(records.iter().map(Record::encoded_bytes_max).sum());
        for record in records {
            record.encode(&mut writer);
        }
        self.append_encoded(writer.as_bytes(), records.len() as u64).0
    }

    /// Appends one transaction's `record_count` records, encoded by the
    /// caller outside the lock; returns the lsn of the last one (or of the
    /// last record so far when there are none) and the bytes now pending.
    pub fn append_encoded(&self, encoded: &[u8], record_count: u64) -> (u64, usize) {
        assert!(
            encoded.len() as u64 <= self.geometry.group_payload_bytes_max(),
            "a transaction of {} bytes exceeds the journal group limit",
            encoded.len()
        );
        assert_eq!(record_count == 0, encoded.is_empty(), "records and their bytes go together");
        let mut inner = self.inner();
        if record_count == 0 {
            return (inner.next_lsn - 1, inner.pending.len());
        }
        let durable_before = inner.durable_lsn;
        inner.pending.extend_from_slice(encoded);
        inner.next_lsn += record_count;
        let last_lsn = inner.next_lsn - 1;
        let end = inner.pending.len();
        // Pending transactions are in lsn order, each ending after the one
        // before: a group takes a prefix of them.
        if let Some(&(previous_lsn, previous_end)) = inner.pending_txn_ends.last() {
            assert!(previous_lsn < last_lsn, "lsn {last_lsn} appended after {previous_lsn}");
            assert!(previous_end < end, "an empty transaction pending at lsn {last_lsn}");
        }
        inner.pending_txn_ends.push((last_lsn, end));
        // Appending makes nothing durable.
        assert!(inner.durable_lsn == durable_before, "durable lsn moved by an append");
        assert!(inner.durable_lsn < last_lsn, "lsn {last_lsn} durable before it was written");
        (last_lsn, end)
    }

    pub fn last_lsn(&self) -> u64 {
        self.inner().next_lsn - 1
    }

    pub fn durable_lsn(&self) -> u64 {
        self.durable_lsn.load(Ordering::Acquire)
    }

    /// Moves the durable lsn, under the lock, and its lock-free copy.
    fn set_durable(&self, inner: &mut Inner, lsn: u64) {
        assert!(lsn < inner.next_lsn, "lsn {lsn} durable before it was appended");
        inner.durable_lsn = inner.durable_lsn.max(lsn);
        self.durable_lsn.store(inner.durable_lsn, Ordering::Release);
    }

    pub fn pending_bytes(&self) -> usize {
        self.inner().pending.len()
    }

    /// Shuts the journal and its device down (`Volume::shutdown`): records
    /// not yet committed stay in memory and no commit or checkpoint is
    /// written any more, as if the machine had stopped here.
    pub fn shut_down(&self) {
        let mut inner = self.inner();
        self.fail(&mut inner, "the volume was shut down".into());
        self.device.shut_down();
    }

    pub fn failure(&self) -> Option<String> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.inner().failed.clone()
    }

    /// Records the first failure (later ones keep it) and returns it.
    fn fail(&self, inner: &mut Inner, message: String) -> String {
        let failure = inner.failed.get_or_insert(message).clone();
        self.has_failed.store(true, Ordering::Release);
        debug_assert!(inner.failed.is_some());
        failure
    }

    /// Flushes plain data writes no flush covers yet: an fsync's last step
    /// when nothing (or nothing more) was committed. A failure turns the
    /// volume read-only, as a failed flush before a journal group does: a
    /// disk may have lost its volatile cache with it, and which writes went
    /// is unknown, so a later flush that succeeds proves nothing about them
    /// and no later fsync may report them durable.
    pub fn flush_data(&self) -> Result<(), String> {
        let mut inner = self.inner();
        if let Some(failure) = &inner.failed {
            return Err(failure.clone());
        }
        drop(inner);
        let Err(error) = self.device.flush_if_needed() else { return Ok(()) };
        let message = format!("flush failed, the volume is now read-only: {error}");
        tracing::error!("{message}");
        inner = self.inner();
        Err(self.fail(&mut inner, message))
    }

    /// Fraction of the journal between tail and head (0.0 ..= 1.0).
    pub fn used_fraction(&self) -> f64 {
        let inner = self.inner();
        debug_assert!(inner.tail <= inner.head);
        (inner.head - inner.tail) as f64 / self.geometry.journal_bytes as f64
    }

    /// Makes every record up to `lsn` durable. Concurrent callers share one
    /// device write: the first becomes the leader and writes all pending
    /// records as one group; the others wait for it.
    pub fn commit(&self, lsn: u64) -> Result<(), CommitError> {
        self.commit_batching(lsn, false)
    }

    /// As [`Journal::commit`], for a sync: before leading a group it waits
    /// for other syncs on their way (`batch`), so one group covers them.
    pub fn commit_sync(&self, lsn: u64) -> Result<(), CommitError> {
        self.commit_batching(lsn, true)
    }

    fn commit_batching(&self, lsn: u64, batching: bool) -> Result<(), CommitError> {
        let mut inner = self.inner();
        // Once per call: a sync waits for those on their way when it
        // first would lead, not again after every group.
        let mut may_wait = batching;
        loop {
            if let Some(failure) = &inner.failed {
                return Err(CommitError::Failed(failure.clone()));
            }
            if inner.durable_lsn >= lsn {
                return Ok(());
            }
            if inner.leader_active {
                self.commit_finished.wait(inner.guard_mut());
                continue;
            }
            assert!(lsn < inner.next_lsn, "committing lsn {lsn}, which was never appended");
            if std::mem::take(&mut may_wait)
                && self.wait_for_syncs_on_the_way(inner.guard_mut(), lsn)
            {
                continue;
            }
            self.lead_one_group(inner.guard_mut())?;
        }
    }

    /// Takes the longest run of whole pending transactions that fits a group,
    /// writes it (lock released during the I/O), and publishes the result.
    fn lead_one_group(
        &self,
        inner: &mut parking_lot::MutexGuard<'_, Inner>,
    ) -> Result<(), CommitError> {
        debug_assert!(!inner.leader_active, "two leaders at once");
        assert!(!inner.pending_txn_ends.is_empty(), "leading a group with nothing pending");
        let payload_bytes_max = self.geometry.group_payload_bytes_max() as usize;
        let taken_txns = inner
            .pending_txn_ends
            .iter()
            .take_while(|&&(_, end)| end <= payload_bytes_max)
            .count()
            .max(1);
        let (last_lsn, payload_end) = inner.pending_txn_ends[taken_txns - 1];
        let group_stored = align_up(
            (GROUP_HEADER_BYTES + payload_end) as u64,
            u64::from(self.geometry.sector_bytes),
        );
        let position = self.group_position(inner.head, group_stored);
        if position + group_stored - inner.tail > self.geometry.journal_bytes {
            return Err(CommitError::Full);
        }
        // Moved out, not copied: the lock is held meanwhile, and a group
        // is up to a quarter of the journal (a copy of it kept every
        // appender waiting tens of microseconds). The records left behind
        // go to the spare buffer, which has grown before: appends do not
        // grow (reallocate and copy) the buffer under the lock again.
        let mut rest = std::mem::take(&mut inner.spare);
        rest.clear();
        rest.extend_from_slice(&inner.pending[payload_end..]);
        let mut payload = std::mem::replace(&mut inner.pending, rest);
        // The group's records only: those left behind went to `rest`.
        payload.truncate(payload_end);
        inner.pending_txn_ends.drain(..taken_txns);
        for (_, end) in inner.pending_txn_ends.iter_mut() {
            *end -= payload_end;
        }
        // The bytes pending end where their last transaction does.
        debug_assert_eq!(payload.len(), payload_end);
        debug_assert_eq!(
            inner.pending_txn_ends.last().map_or(0, |&(_, end)| end),
            inner.pending.len()
        );
        let first_lsn = inner.pending_first_lsn;
        debug_assert!(first_lsn <= last_lsn, "a group of no records: {first_lsn}..={last_lsn}");
        inner.pending_first_lsn = last_lsn + 1;
        let seq = inner.next_seq;
        inner.leader_active = true;
        let record_count = u32::try_from(last_lsn + 1 - first_lsn).expect("group record count");
        let link =
            GroupLink { seq, first_lsn, record_count, prev_header_crc: inner.last_header_crc };
        let result = parking_lot::MutexGuard::unlocked(inner, || {
            let (bytes, header_crc) =
                encode_group(&self.geometry.uuid, link, &payload, self.geometry.sector_bytes);
            let device_offset = self.geometry.journal_offset + self.physical_offset(position);
            let started = std::time::Instant::now();
            let written = self.write_durably(device_offset, &bytes, "journal group");
            self.batch.note_group_write(started.elapsed());
            written.map(|()| header_crc)
        });
        inner.leader_active = false;
        self.commit_finished.notify_all();
        // A sync waiting for others on their way may find its records in
        // this group.
        self.batch.notify_group_written();
        if payload.capacity() > inner.spare.capacity() {
            inner.spare = payload;
        }
        match result {
            Ok(header_crc) => {
                inner.head = position + group_stored;
                // Checked before the write: the log never laps its tail.
                debug_assert!(inner.head - inner.tail <= self.geometry.journal_bytes);
                inner.next_seq = seq + 1;
                inner.last_header_crc = header_crc;
                self.set_durable(inner, last_lsn);
                Ok(())
            }
            Err(error) => {
                let message = format!("journal write failed, the volume is now read-only: {error}");
                // A shutdown fails the group in flight on purpose.
                if !self.device.is_shut_down() {
                    tracing::error!("{message}");
                }
                Err(CommitError::Failed(self.fail(inner, message)))
            }
        }
    }

    /// Virtual position of a group of `stored_bytes` written after `head`.
    fn group_position(&self, head: u64, stored_bytes: u64) -> u64 {
        let journal_bytes = self.geometry.journal_bytes;
        let position = if head % journal_bytes + stored_bytes > journal_bytes {
            align_up_any(head, journal_bytes)
        } else {
            head
        };
        // A group is never split at the journal's end.
        debug_assert!(position >= head);
        debug_assert!(
            stored_bytes > journal_bytes
                || position % journal_bytes + stored_bytes <= journal_bytes
        );
        position
    }

    fn physical_offset(&self, virtual_offset: u64) -> u64 {
        virtual_offset % self.geometry.journal_bytes
    }

    /// Flush first if plain writes are outstanding (their data may be what
    /// the records describe), then write with FUA.
    fn write_durably(&self, device_offset: u64, bytes: &[u8], what: &str) -> Result<()> {
        // Groups and checkpoints start on a sector and fill whole ones.
        let sector = u64::from(self.geometry.sector_bytes);
        debug_assert!(device_offset.is_multiple_of(sector), "{what} at {device_offset}");
        debug_assert!((bytes.len() as u64).is_multiple_of(sector), "{what} of {}", bytes.len());
        self.device.flush_if_needed().context(|| format!("flush before {what}"))?;
        let buffer = AlignedBuf::from_slice(bytes);
        self.device.write(device_offset, &buffer, true).context(|| format!("write {what}"))
    }

    /// The replay point of a checkpoint taken now. The caller must hold
    /// every metadata shard so no transaction is part-way and none appends
    /// meanwhile.
    pub fn replay_point(&self) -> ReplayPoint {
        let inner = self.inner();
        debug_assert!(inner.tail <= inner.head);
        ReplayPoint {
            virtual_offset: inner.head,
            seq: inner.next_seq,
            prev_crc: inner.last_header_crc,
            lsn_applied: inner.next_lsn - 1,
        }
    }

    /// Writes a checkpoint (the state encoded as records) to the next slot and,
    /// once it is durable, frees the journal before its replay point.
    pub fn write_checkpoint(
        &self,
        point: ReplayPoint,
        next_ino: u64,
        payload: &[u8],
        record_count: u64,
    ) -> Result<()> {
        if let Some(failure) = self.failure() {
            return Err(Error::ReadOnly(failure));
        }
        let payload_bytes_max = self.geometry.slot_payload_bytes_max();
        if payload.len() as u64 > payload_bytes_max {
            return Err(Error::NoSpace(format!(
                "metadata of {} bytes exceeds the checkpoint slot ({payload_bytes_max} bytes)",
                payload.len()
            )));
        }
        let header = self.checkpoint_header(point, next_ino);
        let header = CheckpointHeader {
            record_count,
            payload_bytes: payload.len() as u64,
            payload_crc: crc32c::crc32c(payload),
            ..header
        };
        let header_area = self.geometry.header_area_bytes();
        let total =
            align_up((header_area + payload.len()) as u64, u64::from(self.geometry.sector_bytes));
        let mut bytes = AlignedBuf::zeroed(total as usize);
        bytes[..HEADER_BYTES].copy_from_slice(&header.encode());
        bytes[header_area..header_area + payload.len()].copy_from_slice(payload);
        let slot_offset = self.geometry.slot_offsets[header.slot_index()];
        if let Err(error) = self.write_durably(slot_offset, &bytes, "checkpoint") {
            return Err(self.fail_checkpoint(error));
        }
        self.checkpoint_durable(point, header.generation);
        Ok(())
    }

    /// The header of the next checkpoint, taken at `point`, without a
    /// payload: what a volume of format 3 keeps in its index's root record.
    pub fn checkpoint_header(&self, point: ReplayPoint, next_ino: u64) -> CheckpointHeader {
        CheckpointHeader {
            uuid: self.geometry.uuid,
            generation: self.inner().checkpoint_generation + 1,
            journal_replay_offset: self.physical_offset(point.virtual_offset),
            journal_replay_seq: point.seq,
            journal_prev_crc: point.prev_crc,
            lsn_applied: point.lsn_applied,
            next_ino,
            record_count: 0,
            payload_bytes: 0,
            payload_crc: 0,
        }
    }

    /// The checkpoint `generation`, taken at `point`, is durable: the log
    /// before its point is free.
    pub fn checkpoint_durable(&self, point: ReplayPoint, generation: u64) {
        let mut inner = self.inner();
        // The checkpoint mutex lets one checkpoint write at a time.
        debug_assert_eq!(inner.checkpoint_generation + 1, generation, "checkpoints overlapped");
        debug_assert!(point.virtual_offset <= inner.head, "a replay point past the head");
        inner.checkpoint_generation = generation;
        inner.tail = inner.tail.max(point.virtual_offset);
        self.set_durable(&mut inner, point.lsn_applied);
        self.commit_finished.notify_all();
    }

    /// Marks the journal failed (read-only from now on) after a checkpoint
    /// that could not be written; returns the error to give.
    pub fn fail_checkpoint(&self, error: impl std::fmt::Display) -> Error {
        if self.device.is_shut_down() {
            return Error::ShutDown;
        }
        let message = format!("checkpoint write failed, the volume is now read-only: {error}");
        tracing::error!("{message}");
        self.fail(&mut self.inner(), message.clone());
        Error::ReadOnly(message)
    }

    /// Metadata the volume needs could not be read (a damaged page of its
    /// metadata index): turns the volume read-only, naming `what`.
    pub fn fail_metadata_read(&self, what: impl std::fmt::Display) {
        let message = format!("the volume is now read-only: {what}");
        tracing::error!("{message}");
        self.fail(&mut self.inner(), message);
    }
}

/// Rounds `value` up to a multiple of `align` (any non-zero value).
fn align_up_any(value: u64, align: u64) -> u64 {
    debug_assert!(align > 0);
    value.div_ceil(align) * align
}

/// The journal of a fresh volume.
fn fresh_journal(device: &Arc<Device>, geometry: &JournalGeometry) -> Journal {
    let position = JournalPosition {
        head: 0,
        tail: 0,
        next_seq: 1,
        last_header_crc: 0,
        next_lsn: 1,
        checkpoint_generation: 0,
    };
    Journal::new(Arc::clone(device), geometry.clone(), position)
}

/// Encodes the checkpoint of a fresh volume; used by mkfs.
pub fn write_initial_checkpoint(
    device: &Arc<Device>,
    geometry: &JournalGeometry,
    next_ino: u64,
    payload: &[u8],
    record_count: u64,
) -> Result<()> {
    let journal = fresh_journal(device, geometry);
    journal.write_checkpoint(journal.replay_point(), next_ino, payload, record_count)
}

/// The checkpoint header of a fresh volume of format 3, for its index's
/// first root record.
pub fn initial_checkpoint_header(
    device: &Arc<Device>,
    superblock: &Superblock,
    next_ino: u64,
) -> CheckpointHeader {
    let journal = fresh_journal(device, &JournalGeometry::new(superblock));
    journal.checkpoint_header(journal.replay_point(), next_ino)
}
