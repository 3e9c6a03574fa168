//! The metadata store: the sharded inode table (`super::shards`), free
//! space, transactions that lock the shards of the inodes they name, apply
//! records and log them before letting go, group commit, and checkpoints.
//!
//! Because a transaction appends its records while it still holds the
//! shards of every inode they change, the records of one inode reach the
//! log in the order they changed it; records of transactions that hold no
//! shard in common change different inodes and commute (docs/format.md,
//! "Log order"). A checkpoint's cut, taken with every shard held, is
//! exactly "the state after lsn L" (`super::checkpoint`).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{
    Condvar, MappedRwLockReadGuard, MappedRwLockWriteGuard, Mutex, MutexGuard, RwLockReadGuard,
    RwLockWriteGuard,
};
use smallvec::SmallVec;

use crate::alloc::{BlockRun, Promises};
use crate::dev::{Device, DiscardMode};
use crate::error::{Error, Result};
use crate::extent::Extent;
use crate::extent::ExtentKind;
use crate::format::codec::Writer;
use crate::format::record::SHARED_SET_RECORD_BYTES;
use crate::format::{ExtentState, InodeAttrs, Record, Superblock, ROOT_INO};
use crate::journal::{self, CommitError, Journal, JournalGeometry, SyncOnTheWay};
use crate::lock_order::{Contention, Level, Ordered};
use crate::refcount::{self, SharedBlocks};

use super::checkpoint;
use super::free_set::FreeSet;
use super::indexed::{changes_at_cut, mapped_runs, Changed, IndexedCheckpoint, Summary};
use super::inode::Inode;
use super::load::{apply_loaded, load_indexed, LoadLimits};
use super::shards::{
    catch_undeclared, no_parts, shard_of, CutPart, MetaCore, MetaState, MetaView, ShardSet,
    UndeclaredShard, DIRECTORY_INO_STRIDE, SHARD_COUNT,
};
use super::space::Space;

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

/// The parts of `displaced` whose device blocks `remapped` does not map
/// again (delayed extents, which hold no device blocks, pass unchanged).
/// Each remapped block cancels one displaced mapping of it, not all: with
/// shared blocks one device block can be displaced twice in a transaction
/// (a collapse unmapping two file blocks of one file that map it) and
/// mapped again only once (the one shifted down); the other reference is
/// dropped.
fn not_remapped(displaced: Vec<Extent>, remapped: &[BlockRun]) -> Vec<Extent> {
    if remapped.is_empty() {
        return displaced;
    }
    let mut pieces = displaced;
    for run in remapped {
        // The run's blocks no displaced piece has matched yet.
        let mut unmatched = vec![(run.start, run.start + run.count)];
        let mut kept_pieces = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let mut kept = vec![piece];
            let mut still_unmatched = Vec::new();
            for (start, end) in unmatched {
                let mut matched = Vec::new();
                let mut outside = Vec::new();
                for part in kept {
                    let (part_start, part_end) =
                        (part.dev_block, part.dev_block + part.block_count);
                    let (from, to) = (part_start.max(start), part_end.min(end));
                    if part.kind != ExtentKind::Delalloc && from < to {
                        matched.push((from, to));
                        outside.extend(part.outside_dev_blocks(from, to));
                    } else {
                        outside.push(part);
                    }
                }
                kept = outside;
                matched.sort_unstable();
                let mut at = start;
                for (from, to) in matched {
                    if at < from {
                        still_unmatched.push((at, from));
                    }
                    at = at.max(to);
                }
                if at < end {
                    still_unmatched.push((at, end));
                }
            }
            unmatched = still_unmatched;
            kept_pieces.extend(kept);
        }
        pieces = kept_pieces;
    }
    pieces
}

/// Start a checkpoint when this much of the journal is live.
const CHECKPOINT_USED_FRACTION: f64 = 0.5;
/// Memory of an empty file's inode in a shard (`super::inode`), for the
/// count of inodes in memory against `inode_cache_bytes`.
const INODE_BYTES_TYPICAL: u64 = 256;

/// What mount found, for `info` and `fsck`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadReport {
    pub checkpoint_generation: u64,
    pub checkpoint_records: u64,
    pub journal_groups_replayed: u64,
    pub journal_records_replayed: u64,
}

pub struct MetaStore {
    pub(super) core: MetaCore,
    space: Mutex<Space>,
    space_contention: Contention,
    /// The allocator's reservations, reached without the space mutex.
    promises: Arc<Promises>,
    /// Blocks of `Space::shared`, set under the space mutex: while 0 (no
    /// clone on the volume) no data path or transaction looks at the table.
    shared_blocks: AtomicU64,
    /// Blocks of `Space::unsharing`, set under the space mutex: while it
    /// and `shared_blocks` are 0 no write asks whether to copy.
    unsharing_blocks: AtomicU64,
    /// The lsn of the earliest record whose freed blocks wait in `space`
    /// (u64::MAX when none do): a transaction takes the space mutex to
    /// release them only when the journal has made that one durable.
    first_pending_free_lsn: AtomicU64,
    /// Renames that move a directory to another parent, one at a time, so
    /// that no two of them can each move one directory under the other.
    rename_lock: Mutex<()>,
    /// This store among those a thread's inode batch may come from.
    store_id: u64,
    pub(super) journal: Journal,
    /// One checkpoint at a time.
    pub(super) checkpoint_lock: Mutex<()>,
    /// The metadata index where the volume keeps its checkpoint in one
    /// (format 3), `None` for slots. Read under shard locks to bring an
    /// inode into memory (`meta/on_demand.rs`); changed by a checkpoint only
    /// after its cut, when it holds no shard.
    pub(super) index: Mutex<Option<IndexedCheckpoint>>,
    /// Inode numbers from here on are not in the index: its last
    /// committed cut's next inode number.
    pub(super) index_ino_limit: AtomicU64,
    /// Memory the inodes may keep after a checkpoint, where they can be
    /// read again from an index (`VolumeOptions::inode_cache_bytes`).
    pub(super) inode_cache_bytes: AtomicU64,
    /// What every inode read from the index is held to (`check_limits`).
    pub(super) limits: LoadLimits,
    /// The most the metadata may encode to: a slot's room, or for an
    /// index, unbounded while its reserve of free space holds and the
    /// size of the metadata when it no longer does (no growth, then).
    metadata_bytes_max: AtomicU64,
    /// Checkpoints written since open: how many, their payload bytes and
    /// the time each took from cut to durable (`bench scale` reports them;
    /// today each re-encodes the whole state, the cost issue 53 measures).
    checkpoints_written: AtomicU64,
    checkpoint_bytes_total: AtomicU64,
    checkpoint_ns_total: AtomicU64,
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

/// What a transaction's end settles under the space mutex
/// ([`MetaStore::append_settling`]).
struct Settling {
    /// Device blocks its records mapped that other mappings hold too.
    shared_added: Vec<BlockRun>,
    /// Extents its records displaced and did not map again.
    freed: Vec<Extent>,
    /// Blocks of delayed extents whose reservation an allocation took over.
    reservation_taken_over: u64,
}

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
    state: MetaState<'a>,
    space: &'a Mutex<Space>,
    space_contention: &'a Contention,
    /// The volume's shared blocks, so that a transaction on a volume
    /// without clones never takes the space mutex to count them.
    volume_shared_blocks: &'a AtomicU64,
    records: Vec<Record>,
    displaced: Vec<Extent>,
    /// Device blocks mapped by this transaction's records: a block that one
    /// record unmaps and a later one maps again (extents shifted by
    /// COLLAPSE_RANGE / INSERT_RANGE) is not freed.
    remapped: Vec<BlockRun>,
    /// Device blocks mapped by this transaction's records that other
    /// mappings hold too (clones): one more reference each.
    shared_added: Vec<BlockRun>,
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
    /// Blocks of delayed extents whose reservation an allocation took over
    /// ([`Txn::allocate_reserved`]).
    reservation_taken_over: u64,
}

impl<'a> Txn<'a> {
    /// Allocates up to `count` blocks near `goal` for a delayed extent of
    /// this transaction's inode, from its reservation (see
    /// [`Space::allocate_reserved`]); the caller maps the run over it.
    pub fn allocate_reserved(&mut self, goal: u64, count: u64) -> Option<BlockRun> {
        let run = self.space().allocate_reserved(goal, count)?;
        self.reservation_taken_over += run.count;
        Some(run)
    }

    /// The inodes the transaction named, write-locked.
    pub fn state(&self) -> &MetaState<'a> {
        &self.state
    }

    /// For memory-only fields; persistent fields change only through
    /// [`Txn::apply`].
    pub fn state_mut(&mut self) -> &mut MetaState<'a> {
        &mut self.state
    }

    /// Free space, locked for as long as the guard lives: take it for the
    /// allocation and let it go (it comes after every shard in the order).
    pub fn space(&self) -> Ordered<MutexGuard<'a, Space>> {
        let (space, contention) = (self.space, self.space_contention);
        Ordered::lock(Level::Space, || contention.lock(|| space.try_lock(), || space.lock()))
    }

    /// Applies `record` now and logs it at the end of the transaction.
    pub fn apply(&mut self, record: Record) {
        if let Record::ExtentMap { dev_block, block_count, .. } = record {
            self.remapped.push(BlockRun { start: dev_block, count: block_count });
        }
        self.apply_unchecked(record);
    }

    /// Maps file blocks of `ino` onto device blocks that other file blocks
    /// map too (a clone, a deduplication): their counts go up by one when
    /// the transaction ends, in the same group as this record.
    pub fn map_shared(
        &mut self,
        ino: u64,
        file_block: u64,
        dev_block: u64,
        block_count: u64,
        state: ExtentState,
    ) {
        self.shared_added.push(BlockRun { start: dev_block, count: block_count });
        self.apply_unchecked(Record::ExtentMap { ino, file_block, dev_block, block_count, state });
    }

    /// Gives back device blocks taken from the allocator that no extent
    /// maps (a copy-on-write whose write did not complete): freed with the
    /// transaction's other frees.
    pub fn free_unmapped(&mut self, run: BlockRun) {
        self.displaced.push(Extent {
            file_block: 0,
            block_count: run.count,
            dev_block: run.start,
            kind: ExtentKind::Written,
        });
    }

    fn apply_unchecked(&mut self, record: Record) {
        self.log_bytes += record.encoded_bytes_max() as u64;
        assert!(
            self.log_bytes <= self.log_bytes_granted,
            "transaction outgrew its reservation: {} journal bytes after {record:?}, {} reserved \
             (reserve with ensure_metadata_room before the first apply)",
            self.log_bytes,
            self.log_bytes_granted
        );
        self.note_touched(&record);
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
            Record::SharedSet { .. } => {}
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
                "metadata would need {needed} bytes; the checkpoint slot holds {} (make the \
                 volume larger, or with more room for metadata: foliofs mkfs --metadata-size)",
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

impl Txn<'_> {
    /// How many shared-count records unmapping file blocks `[first_block,
    /// first_block + block_count)` of `ino` writes at most
    /// ([`shared_counts_in`]); 0 on a volume without clones, without the
    /// space mutex.
    pub fn shared_counts_unmapping(&self, ino: u64, first_block: u64, block_count: u64) -> u64 {
        if self.volume_shared_blocks.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let Some(extents) = self.state.inode(ino).and_then(|inode| inode.extents()) else {
            return 0;
        };
        shared_counts_in(extents, &self.space().shared, first_block, block_count)
    }

    /// How many leading blocks of device run `[dev_block, dev_block +
    /// block_count)` one more mapping may take while writing at most
    /// `counts_max` shared-count records (one per run of equal count it
    /// crosses), and how many it writes. All of them, for one record, on
    /// a volume without clones.
    pub fn blocks_cloneable(
        &self,
        dev_block: u64,
        block_count: u64,
        counts_max: u64,
    ) -> (u64, u64) {
        if self.volume_shared_blocks.load(Ordering::Acquire) == 0 {
            return if counts_max > 0 { (block_count, 1) } else { (0, 0) };
        }
        let space = self.space();
        let mut blocks = 0;
        let mut counts = 0;
        for piece in space.shared.counted(dev_block, block_count) {
            if counts == counts_max {
                break;
            }
            blocks += piece.count;
            counts += 1;
        }
        (blocks, counts)
    }

    /// How many shared-count records the journal group still holds beside
    /// what this transaction reserved, with half kept back: a bound for
    /// the unmapping it may do.
    pub fn shared_count_room(&self) -> u64 {
        let left = self.log_bytes_max.saturating_sub(self.log_bytes_granted);
        left / 2 / SHARED_SET_RECORD_BYTES as u64
    }

    /// Refuses (ENOSPC, nothing changed) an unmapping of `[first_block,
    /// first_block + block_count)` of `ino` whose shared-count records
    /// would not fit one journal group: a range holding that many
    /// separately counted pieces of clones is cut in smaller steps.
    pub fn ensure_room_for_unmapping(
        &self,
        ino: u64,
        first_block: u64,
        block_count: u64,
    ) -> Result<()> {
        let counts = self.shared_counts_unmapping(ino, first_block, block_count);
        check_unmapping_room(ino, counts, self.shared_count_room())
    }

    /// The first file block of `ino` such that unmapping everything before
    /// it writes at most `counts_max` shared-count records: where a free
    /// in steps cuts next. None when the whole file fits.
    pub fn unmapping_cut(&self, ino: u64, counts_max: u64) -> Option<u64> {
        if self.volume_shared_blocks.load(Ordering::Acquire) == 0 {
            return None;
        }
        let extents = self.state.inode(ino).and_then(|inode| inode.extents())?;
        let space = self.space();
        let mut counts = 0u64;
        for extent in extents.iter().filter(|extent| extent.kind != ExtentKind::Delalloc) {
            for piece in space.shared.counted(extent.dev_block, extent.block_count) {
                if piece.refs < 2 {
                    continue;
                }
                if counts == counts_max {
                    return Some(extent.file_block + (piece.start - extent.dev_block));
                }
                counts += 1;
            }
        }
        None
    }
}

/// One shared-count record per run of equal count (two or more) that the
/// device blocks of `extents`' blocks `[first_block, first_block +
/// block_count)` cross: what unmapping them writes at most.
fn shared_counts_in(
    extents: &crate::extent::ExtentMap,
    shared: &SharedBlocks,
    first_block: u64,
    block_count: u64,
) -> u64 {
    let end = first_block.saturating_add(block_count);
    extents
        .range(first_block, end)
        .filter(|extent| extent.kind != ExtentKind::Delalloc)
        .map(|extent| {
            let pieces = shared.counted(extent.dev_block, extent.block_count);
            pieces.iter().filter(|piece| piece.refs >= 2).count() as u64
        })
        .sum()
}

fn check_unmapping_room(ino: u64, counts: u64, room: u64) -> Result<()> {
    if counts > room {
        return Err(Error::NoSpace(format!(
            "inode {ino}: the range maps {counts} separately counted pieces of shared blocks; \
             one change holds {room} (change it in smaller steps)"
        )));
    }
    Ok(())
}

impl MetaStore {
    /// Refuses (ENOSPC) an unmapping of `[first_block, first_block +
    /// block_count)` of `ino` that no transaction could hold
    /// ([`Txn::ensure_room_for_unmapping`]), before the caller changes
    /// anything else; the transaction that unmaps checks again.
    pub fn check_room_for_unmapping(
        &self,
        ino: u64,
        first_block: u64,
        block_count: u64,
    ) -> Result<()> {
        if self.shared_blocks.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let view = self.view(&[ino]);
        let Some(extents) = view.inode(ino).and_then(|inode| inode.extents()) else {
            return Ok(());
        };
        let counts = shared_counts_in(extents, &self.space().shared, first_block, block_count);
        let log_bytes_max = self.journal.geometry().group_payload_bytes_max();
        let room = log_bytes_max.saturating_sub(TXN_LOG_BYTES_UNRESERVED)
            / 2
            / SHARED_SET_RECORD_BYTES as u64;
        check_unmapping_room(ino, counts, room)
    }
}

/// Applies a slot's checkpoint and the journal to every inode and derives
/// free space from them (formats 1 and 2); returns it and how many records
/// the checkpoint held.
fn load_whole(
    core: &MetaCore,
    loaded: &journal::Loaded,
    shared: &mut SharedBlocks,
) -> Result<(crate::alloc::Allocator, u64)> {
    let data_region = core.data_region;
    let mut state = MetaState::lock(core, ShardSet::All);
    for (count, record) in loaded.checkpoint_records.iter().enumerate() {
        apply_loaded(&mut state, shared, record, data_region)
            .map_err(|error| Error::Corrupt(format!("checkpoint record {count}: {error}")))?;
    }
    for (count, record) in loaded.journal_records.iter().enumerate() {
        apply_loaded(&mut state, shared, record, data_region)
            .map_err(|error| Error::Corrupt(format!("journal record {count}: {error}")))?;
    }
    let alloc = state.finish_load(shared).map_err(|error| Error::Corrupt(error.0))?;
    Ok((alloc, loaded.checkpoint_records.len() as u64))
}

impl MetaStore {
    /// Loads the checkpoint and replays the journal. Fails (changing nothing)
    /// if any record contradicts the state, two files share a block, or an
    /// inode passes `limits`. From an index (format 3) only the inodes
    /// needed at once stay in memory (`super::load`).
    pub fn load(
        device: Arc<Device>,
        superblock: &Superblock,
        read_only: bool,
        limits: LoadLimits,
    ) -> Result<(Self, LoadReport)> {
        let geometry = JournalGeometry::new(superblock);
        let data_region = superblock.data;
        let (loaded, mut index) = if superblock.metadata_in_index() {
            let (index, header) = IndexedCheckpoint::open(&device, superblock)?;
            (journal::load_after(&device, &geometry, header)?, Some(index))
        } else {
            (journal::load(&device, &geometry)?, None)
        };
        let core = MetaCore::new(data_region, ROOT_INO + 1, index.is_some());
        let mut shared = SharedBlocks::new();
        let (alloc, checkpoint_records) = match &mut index {
            Some(index) => {
                let (mut alloc, records) =
                    load_indexed(&core, index, &loaded.journal_records, &mut shared, limits)?;
                for run in index.held_blocks()? {
                    alloc.mark_used(run).map_err(|error| {
                        Error::Corrupt(format!("a page of the metadata index: {error}"))
                    })?;
                }
                (alloc, records)
            }
            None => load_whole(&core, &loaded, &mut shared)?,
        };
        let metadata_bytes_max = match &mut index {
            Some(index) if !read_only => {
                let full = index.fill_reserve(alloc.promises(), geometry.journal_bytes);
                if full {
                    u64::MAX
                } else {
                    core.persisted_bytes_estimate()
                }
            }
            Some(_) => u64::MAX,
            None => geometry.slot_payload_bytes_max(),
        };
        let shared_blocks = AtomicU64::new(shared.shared_blocks());
        core.next_ino.fetch_max(loaded.checkpoint.next_ino, Ordering::Relaxed);
        let report = LoadReport {
            checkpoint_generation: loaded.checkpoint.generation,
            checkpoint_records,
            journal_groups_replayed: loaded.journal_groups_replayed,
            journal_records_replayed: loaded.journal_records.len() as u64,
        };
        let journal = Journal::new(device, geometry, loaded.position);
        let store = Self {
            core,
            promises: Arc::clone(alloc.promises()),
            shared_blocks,
            unsharing_blocks: AtomicU64::new(0),
            space: Mutex::new(Space::new(alloc, shared)),
            space_contention: Contention::default(),
            first_pending_free_lsn: AtomicU64::new(u64::MAX),
            rename_lock: Mutex::new(()),
            store_id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            journal,
            checkpoint_lock: Mutex::new(()),
            index: Mutex::new(index),
            index_ino_limit: AtomicU64::new(loaded.checkpoint.next_ino),
            inode_cache_bytes: AtomicU64::new(u64::MAX),
            limits,
            metadata_bytes_max: AtomicU64::new(metadata_bytes_max),
            checkpoints_written: AtomicU64::new(0),
            checkpoint_bytes_total: AtomicU64::new(0),
            checkpoint_ns_total: AtomicU64::new(0),
            read_only,
            discard_block_bytes: AtomicU64::new(0),
            committer: Mutex::new(CommitterMailbox::default()),
            committer_wake: Condvar::new(),
        };
        Ok((store, report))
    }

    /// Writes the first checkpoint of a new volume: an empty root directory.
    pub fn format(device: &Arc<Device>, superblock: &Superblock, root: InodeAttrs) -> Result<()> {
        if superblock.metadata_in_index() {
            return IndexedCheckpoint::format(device, superblock, root);
        }
        let core = MetaCore::new(superblock.data, ROOT_INO + 1, false);
        let mut state = MetaState::lock(&core, ShardSet::All);
        state.apply(&Record::InodeSet { ino: ROOT_INO, attrs: root }).expect("fresh state");
        let (payload, record_count) = checkpoint::assemble(&state.shard_parts());
        let next_ino = core.next_ino.load(Ordering::Relaxed);
        drop(state);
        let geometry = JournalGeometry::new(superblock);
        journal::write_initial_checkpoint(device, &geometry, next_ino, &payload, record_count)
    }

    /// Inode `ino`, read-locked (its shard) while the guard lives. Hold one
    /// at a time, and none while taking another shard or starting a
    /// transaction (debug builds check).
    pub fn inode(&self, ino: u64) -> Option<InodeRef<'_>> {
        loop {
            let found = self
                .core
                .read_shard(shard_of(ino))
                .try_map(|guard| RwLockReadGuard::try_map(guard, |shard| shard.inodes.get(&ino)));
            // Not in memory: read from the index if there, and look again
            // (an eviction may come between, only after a checkpoint).
            if found.is_some() || !self.may_be_indexed(ino) || !self.bring_in(ino) {
                return found;
            }
        }
    }

    /// Inode `ino` for a change of memory-only fields (open handle counts,
    /// in-memory sizes, times advanced in memory), without logging; works
    /// on read-only volumes too. Counts as a change for the handles' copies.
    pub fn inode_mut(&self, ino: u64) -> Option<InodeMut<'_>> {
        let mut shard = self.core.write_shard(shard_of(ino));
        if let Err(error) = self.make_resident(&mut shard, ino) {
            self.journal.fail_metadata_read(format_args!(
                "reading inode {ino} from the metadata index: {error}"
            ));
        }
        // Times advanced in memory reach the next checkpoint (an index
        // keeps only inodes noted as changed).
        if self.core.indexed && shard.inodes.contains_key(&ino) {
            shard.changed.get_mut().inodes.insert(ino);
        }
        let guard = shard.try_map(|guard| {
            RwLockWriteGuard::try_map(guard, |shard| shard.inodes.get_mut(&ino))
        })?;
        guard.note_changed();
        Some(guard)
    }

    /// The inodes `inos` (and whatever else their shards hold), read-locked
    /// together: one consistent look at a few of them.
    pub fn view(&self, inos: &[u64]) -> MetaView<'_> {
        loop {
            let view = MetaView::lock(&self.core, ShardSet::of(inos));
            let missing: SmallVec<[u64; 4]> = inos
                .iter()
                .copied()
                .filter(|&ino| self.may_be_indexed(ino) && view.inode(ino).is_none())
                .collect();
            if missing.is_empty() {
                return view;
            }
            drop(view);
            // Read what the index holds; look again (an eviction may come
            // between, only after a checkpoint) unless it held none.
            let brought_in = missing.into_iter().filter(|&ino| self.bring_in(ino)).count() > 0;
            if !brought_in {
                return MetaView::lock(&self.core, ShardSet::of(inos));
            }
        }
    }

    /// Every inode, read-locked: what fsck and mount's orphan scan read.
    /// Waits for every transaction in progress, and stops every writer
    /// while held.
    pub fn view_all(&self) -> MetaView<'_> {
        MetaView::lock(&self.core, ShardSet::All)
    }

    /// Free space, locked while the guard lives (after any shard).
    pub fn space(&self) -> Ordered<MutexGuard<'_, Space>> {
        Ordered::lock(Level::Space, || {
            self.space_contention.lock(|| self.space.try_lock(), || self.space.lock())
        })
    }

    /// Whether a write to device block `dev_block` must copy it (it is
    /// shared with another mapping, or was until a record not yet durable:
    /// `Space::unsharing`), and for how many blocks from it (up to
    /// `count`) that holds. Costs two atomic loads on a volume without
    /// clones.
    pub fn shared_run(&self, dev_block: u64, count: u64) -> (bool, u64) {
        if !self.may_copy_on_write() {
            return (false, count);
        }
        self.space().copy_on_write_run(dev_block, count)
    }

    /// Whether any write may have to copy shared blocks: false on a volume
    /// without clones (two atomic loads).
    pub fn may_copy_on_write(&self) -> bool {
        self.shared_blocks.load(Ordering::Acquire) > 0
            || self.unsharing_blocks.load(Ordering::Acquire) > 0
    }

    /// Promises `block_count` free blocks to the copies that writeback will
    /// make of shared blocks a buffered write dirtied, or none (false):
    /// taken when the blocks become dirty, as delayed allocations are, so a
    /// full volume fails the write and never the writeback. Without the
    /// space mutex (`alloc::Promises`).
    pub fn reserve_copies(&self, block_count: u64) -> bool {
        self.promises.reserve(block_count)
    }

    /// Gives back blocks promised by [`MetaStore::reserve_copies`] that no
    /// copy took.
    pub fn release_copies(&self, block_count: u64) {
        if block_count > 0 {
            self.promises.unreserve(block_count);
        }
    }

    /// [`MetaStore::release_copies`] as a function the folio cache can hold.
    pub fn copy_release(&self) -> Arc<dyn Fn(u64) + Send + Sync> {
        let promises = Arc::clone(&self.promises);
        Arc::new(move |block_count| promises.unreserve(block_count))
    }

    /// Checks the shared-block counts against every extent map, as mount
    /// does (fsck and the tests); stops every writer while it runs.
    pub fn verify_shared_counts(&self) -> std::result::Result<(), String> {
        self.make_all_resident().map_err(|error| error.to_string())?;
        let all = self.view_all();
        let mut mapped = Vec::new();
        for (_, inode) in all.inodes() {
            for extent in inode.extents().into_iter().flat_map(|extents| extents.iter()) {
                if extent.kind != ExtentKind::Delalloc {
                    mapped.push(BlockRun { start: extent.dev_block, count: extent.block_count });
                }
            }
        }
        let space = self.space();
        refcount::verify(mapped, &space.shared).map(|_| ())
    }

    /// Checks that free space is exactly what no file and no page of the
    /// metadata index holds (fsck, on a volume just opened read-only: on
    /// format 3 free space is read from the index, not derived). Brings
    /// every inode in.
    pub fn check_free_space(&self) -> std::result::Result<(), String> {
        self.make_all_resident().map_err(|error| error.to_string())?;
        let all = self.view_all();
        let mapped: Vec<BlockRun> =
            all.inodes().flat_map(|(_, inode)| mapped_runs(inode)).collect();
        let held = match Ordered::lock(Level::MetadataIndex, || self.index.lock()).as_mut() {
            Some(index) => index.held_blocks().map_err(|error| error.to_string())?,
            None => Vec::new(),
        };
        let space = self.space();
        if space.pending_free_blocks() > 0 {
            return Ok(());
        }
        let used: Vec<BlockRun> = if space.shared.is_empty() {
            mapped
        } else {
            refcount::verify(mapped, &space.shared)?
                .into_iter()
                .map(|counted| BlockRun { start: counted.start, count: counted.count })
                .collect()
        };
        let mut derived = crate::alloc::Allocator::new(self.core.data_region);
        for run in used.into_iter().chain(held) {
            derived.mark_used(run)?;
        }
        let (derived, found) = (FreeSet::of(&derived), FreeSet::of(&space.alloc));
        if derived == found {
            return Ok(());
        }
        let differs = derived.runs().zip(found.runs()).find(|(a, b)| a != b);
        Err(format!(
            "free space is not what the extent maps leave: {} runs derived, {} held, first \
             difference {differs:?}",
            derived.len(),
            found.len()
        ))
    }

    /// Device blocks more than one file block maps, each counted once.
    pub fn shared_blocks(&self) -> u64 {
        self.shared_blocks.load(Ordering::Acquire)
    }

    /// Waits for the shard locks and for the space mutex so far, as
    /// (waits, nanoseconds) each.
    pub fn lock_waits(&self) -> ((u64, u64), (u64, u64)) {
        (self.core.contention.totals(), self.space_contention.totals())
    }

    /// The rename mutex: held across a rename that moves a directory to
    /// another parent, from its ancestry check to its end, so that no other
    /// such rename changes the ancestry meanwhile.
    pub fn rename_lock(&self) -> Ordered<MutexGuard<'_, ()>> {
        Ordered::lock(Level::Rename, || self.rename_lock.lock())
    }

    /// A fresh inode number, for a directory (`directory`) or anything
    /// else. Each thread takes numbers in batches from the shared counter,
    /// so creates on many cores do not all write one cache line; numbers of
    /// a batch left unused are never used (they only grow). Directories get
    /// the multiples of [`DIRECTORY_INO_STRIDE`] of their batches, the rest
    /// the others, so that they live in shards of their own
    /// ([`super::shards::shard_of`]). At the end of the number space it
    /// keeps answering u64::MAX, which the caller finds taken (an image
    /// using that number has none left).
    pub fn take_ino(&self, directory: bool) -> u64 {
        thread_local! {
            /// (store, next, end) of this thread's batch for directories
            /// and for the rest.
            static BATCHES: [Cell<(u64, u64, u64)>; 2] =
                const { [Cell::new((0, 0, 0)), Cell::new((0, 0, 0))] };
        }
        #[cfg(test)]
        if let Some((store_id, peeked)) = INO_PEEKED.with(|peeked| peeked.take()) {
            if store_id == self.store_id {
                return peeked;
            }
        }
        let fits = |ino: u64| ino.is_multiple_of(DIRECTORY_INO_STRIDE) == directory;
        BATCHES.with(|batches| {
            let batch = &batches[usize::from(directory)];
            loop {
                let (store_id, mut next, end) = batch.get();
                if store_id == self.store_id {
                    while next < end && !fits(next) {
                        next += 1;
                    }
                    if next < end {
                        batch.set((store_id, next + 1, end));
                        return next;
                    }
                }
                let start = self
                    .core
                    .next_ino
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |first| {
                        Some(first.saturating_add(INO_BATCH))
                    })
                    .expect("the update always answers");
                let end = start.saturating_add(INO_BATCH);
                if start == end {
                    return start;
                }
                batch.set((self.store_id, start, end));
            }
        })
    }

    /// Whether the shard holding `ino` is write-locked (tests that must
    /// know a transaction holds it).
    #[cfg(test)]
    pub fn shard_write_locked(&self, ino: u64) -> bool {
        self.core.shard(shard_of(ino)).lock.is_locked_exclusive()
    }

    /// Inodes in the volume.
    pub fn inode_count(&self) -> u64 {
        self.core.inode_count()
    }

    /// The number this thread's next [`MetaStore::take_ino`] returns, not
    /// taken (tests that must know which shard a create will lock).
    #[cfg(test)]
    pub fn peek_ino(&self, directory: bool) -> u64 {
        let next = self.take_ino(directory);
        INO_PEEKED.with(|peeked| peeked.set(Some((self.store_id, next))));
        next
    }

    /// The upper bound of the checkpoint payload the metadata encodes to.
    pub fn persisted_bytes_estimate(&self) -> u64 {
        self.core.persisted_bytes_estimate()
    }

    /// Delayed allocation for a buffered write: see
    /// [`MetaState::reserve_delalloc`]. Returns the blocks mapped and the
    /// blocks waiting in pending frees.
    /// Reserves without the space mutex (`alloc::Promises`); returns the
    /// blocks mapped.
    pub fn reserve_delalloc(&self, ino: u64, file_block: u64, block_count: u64) -> u64 {
        let mut state = MetaState::lock(&self.core, ShardSet::of(&[ino]));
        if self.make_resident(state.locked.shard_mut(ino), ino).is_err() {
            return 0;
        }
        let mapped = state.reserve_delalloc(&self.promises, ino, file_block, block_count);
        state.publish_estimate();
        mapped
    }

    /// Makes the blocks of records now durable allocatable.
    pub fn release_durable_frees(&self) {
        let durable_lsn = self.journal.durable_lsn();
        if self.first_pending_free_lsn.load(Ordering::Acquire) > durable_lsn {
            return;
        }
        let mut space = self.space();
        space.release_pending_frees(durable_lsn);
        self.note_first_pending(&space);
    }

    fn note_first_pending(&self, space: &Space) {
        let first = space.first_pending_lsn();
        self.first_pending_free_lsn.store(first.unwrap_or(u64::MAX), Ordering::Release);
        self.unsharing_blocks.store(space.unsharing.blocks(), Ordering::Release);
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

    /// Runs `change` as one transaction over the inodes `inos` (a create
    /// names the new inode's number too); returns its value and the lsn of
    /// the transaction's last record. The inodes' shards are write-locked
    /// in ascending order before `change` runs and held until its records
    /// are in the log, so records of one inode reach the log in the order
    /// they changed it (docs/format.md, "Log order"). `change` may look at
    /// inodes of those shards only: reaching another abandons the
    /// transaction with EIO ([`MetaStore::abandon`]), never waits for it.
    pub fn transact<T>(
        &self,
        inos: &[u64],
        change: impl FnOnce(&mut Txn<'_>) -> Result<T>,
    ) -> Result<(T, u64)> {
        if let Some(refusal) = self.refusal() {
            return Err(refusal);
        }
        self.release_durable_frees();
        let mut txn = self.begin(inos);
        if self.core.indexed {
            for &ino in inos {
                self.make_resident(txn.state.locked.shard_mut(ino), ino)?;
            }
        }
        #[cfg(test)]
        test_hooks::inside_transaction(inos);
        let value = match catch_undeclared(|| change(&mut txn)) {
            Ok(Ok(value)) => value,
            Ok(Err(error)) => {
                assert!(
                    txn.records.is_empty(),
                    "transaction failed after applying records: {error}"
                );
                return Err(error);
            }
            Err(undeclared) => return Err(self.abandon(inos, &txn, undeclared)),
        };
        let (lsn, pending_bytes) = self.log(txn);
        self.bound_unwritten_log(lsn, pending_bytes)?;
        Ok((value, lsn))
    }

    /// A transaction with the shards of `inos` write-locked.
    fn begin(&self, inos: &[u64]) -> Txn<'_> {
        let metadata_bytes_max = self.metadata_bytes_max.load(Ordering::Relaxed);
        let log_bytes_max = self.journal.geometry().group_payload_bytes_max();
        debug_assert!(TXN_LOG_BYTES_UNRESERVED <= log_bytes_max);
        Txn {
            state: MetaState::lock(&self.core, ShardSet::of(inos)),
            space: &self.space,
            space_contention: &self.space_contention,
            volume_shared_blocks: &self.shared_blocks,
            records: Vec::new(),
            displaced: Vec::new(),
            remapped: Vec::new(),
            shared_added: Vec::new(),
            touched: Vec::new(),
            metadata_bytes_max,
            log_bytes: 0,
            log_bytes_granted: TXN_LOG_BYTES_UNRESERVED.min(log_bytes_max),
            log_bytes_max,
            reservation_taken_over: 0,
        }
    }

    /// Ends a transaction whose change reached an inode it did not name
    /// (a bug in the caller): EIO for the operation. When it had applied
    /// records, the inodes in memory are ahead of the log and no later
    /// record could be trusted to follow them, so the volume shuts down
    /// (mounting it again recovers what was durable).
    fn abandon(&self, inos: &[u64], txn: &Txn<'_>, undeclared: UndeclaredShard) -> Error {
        let UndeclaredShard { ino, shard } = undeclared;
        let message = format!(
            "a transaction over inodes {inos:?} reached inode {ino} (shard {shard}), which it \
             did not name; abandoned with {} records applied",
            txn.records.len()
        );
        tracing::error!("{message}");
        if !txn.records.is_empty() {
            self.journal.shut_down();
        }
        Error::Io { context: message, cause: std::io::Error::other("transaction abandoned") }
    }

    /// Appends the records of a transaction whose change succeeded, with
    /// the shared-block counts they settle, frees what they displaced (once
    /// durable), stamps the inodes' lsns and lets the shards go. Returns the
    /// lsn of the last record and the bytes the log holds unwritten.
    fn log(&self, txn: Txn<'_>) -> (u64, usize) {
        let Txn {
            mut state,
            records,
            displaced,
            remapped,
            shared_added,
            touched,
            log_bytes,
            log_bytes_max,
            reservation_taken_over,
            ..
        } = txn;
        // Encoded before the journal's mutex: under it, only a copy.
        let mut writer = Writer::with_capacity(log_bytes as usize);
        for record in &records {
            record.encode(&mut writer);
        }
        let freed = not_remapped(displaced, &remapped);
        // Blocks other files may map too (a clone on the volume, or this
        // transaction cloning): their counts settle under the space mutex,
        // held across the append so that the table's records reach the log
        // in the order the table changed.
        let settles = !shared_added.is_empty()
            || (self.shared_blocks.load(Ordering::Acquire) > 0
                && freed.iter().any(|extent| extent.kind != ExtentKind::Delalloc));
        let appended = if settles {
            let settling = Settling { shared_added, freed, reservation_taken_over };
            self.append_settling(writer, records.len() as u64, log_bytes_max, settling)
        } else {
            self.append_plain(&writer, records.len() as u64, &freed, reservation_taken_over)
        };
        let (lsn, _) = appended;
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
        state.publish_estimate();
        appended
    }

    /// Appends records that neither settle shared-block counts nor free
    /// blocks that may be shared; frees what they displaced.
    fn append_plain(
        &self,
        writer: &Writer,
        record_count: u64,
        freed: &[Extent],
        reservation_taken_over: u64,
    ) -> (u64, usize) {
        let (lsn, pending_bytes) = self.journal.append_encoded(writer.as_bytes(), record_count);
        if !freed.is_empty() {
            let mut space = self.space();
            space.release_displaced(freed, lsn, reservation_taken_over);
            self.note_first_pending(&space);
        }
        (lsn, pending_bytes)
    }

    /// Appends records that change shared-block counts, with the counts
    /// they settle to, all under the space mutex; frees the blocks no
    /// mapping holds any more, and notes those no longer shared.
    fn append_settling(
        &self,
        mut writer: Writer,
        record_count: u64,
        log_bytes_max: u64,
        settling: Settling,
    ) -> (u64, usize) {
        let Settling { shared_added, freed, reservation_taken_over } = settling;
        let mut space = self.space();
        let (delayed, mapped): (Vec<Extent>, Vec<Extent>) =
            freed.into_iter().partition(|extent| extent.kind == ExtentKind::Delalloc);
        let dropped: Vec<BlockRun> = mapped
            .iter()
            .map(|extent| BlockRun { start: extent.dev_block, count: extent.block_count })
            .collect();
        let runs_before = space.shared.run_count() as i64;
        let settled = refcount::settle(&mut space.shared, &shared_added, &dropped);
        let runs_after = space.shared.run_count() as i64;
        for counted in &settled.counts {
            Record::SharedSet {
                dev_block: counted.start,
                block_count: counted.count,
                refs: counted.refs,
            }
            .encode(&mut writer);
        }
        let record_count = record_count + settled.counts.len() as u64;
        assert!(
            writer.len() as u64 <= log_bytes_max,
            "a transaction's shared-block counts outgrew one journal group: {} bytes ({} counts)",
            writer.len(),
            settled.counts.len()
        );
        self.core.persisted_bytes_estimate.fetch_add(
            (runs_after - runs_before) * SHARED_SET_RECORD_BYTES as i64,
            Ordering::Relaxed,
        );
        self.shared_blocks.store(space.shared.shared_blocks(), Ordering::Release);
        let (lsn, pending_bytes) = self.journal.append_encoded(writer.as_bytes(), record_count);
        for &run in &settled.unshared {
            space.unsharing.push(lsn, run);
        }
        let mut frees = delayed;
        frees.extend(settled.freed.iter().map(|run| Extent {
            file_block: 0,
            block_count: run.count,
            dev_block: run.start,
            kind: ExtentKind::Written,
        }));
        if !frees.is_empty() {
            space.release_displaced(&frees, lsn, reservation_taken_over);
        }
        if !settled.unshared.is_empty() || !frees.is_empty() {
            self.note_first_pending(&space);
        }
        (lsn, pending_bytes)
    }

    /// Bounds the unwritten log. Half a group's worth is handed to the
    /// background committer, and the writer goes on (as jbd2 commits a
    /// transaction grown too large); a writer that outruns it by a whole
    /// group, or a volume without one, writes it itself.
    fn bound_unwritten_log(&self, lsn: u64, pending_bytes: usize) -> Result<()> {
        let pending_bytes = pending_bytes as u64;
        let group_bytes_max = self.journal.geometry().group_bytes_max();
        if pending_bytes > group_bytes_max / 2
            && (pending_bytes > group_bytes_max || !self.request_commit())
        {
            self.commit(lsn)?;
        }
        Ok(())
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
        let mut space = self.space();
        space.discard_freed = true;
        self.note_first_pending(&space);
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
        let runs = self.space().take_durable_frees(self.journal.durable_lsn());
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
        let mut space = self.space();
        space.finish_discards(&runs);
        if self.discard_block_bytes.load(Ordering::Relaxed) == 0 {
            space.discard_freed = false;
            let durable_lsn = self.journal.durable_lsn();
            space.release_pending_frees(durable_lsn);
            self.note_first_pending(&space);
        }
    }

    /// Makes every record up to `lsn` durable, checkpointing when the log is full.
    pub fn commit(&self, lsn: u64) -> Result<()> {
        self.commit_batching(lsn, false)
    }

    /// As [`MetaStore::commit`]; `batching` for a sync, which first waits
    /// for other syncs on their way (`Journal::commit_sync`).
    fn commit_batching(&self, lsn: u64, batching: bool) -> Result<()> {
        loop {
            let committed =
                if batching { self.journal.commit_sync(lsn) } else { self.journal.commit(lsn) };
            match committed {
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
    ///
    /// `on_the_way`, the caller's own announcement (`Journal::announce_sync`),
    /// arrives here: its records are appended. The commit then waits for
    /// other syncs still on their way before leading a group. Without one
    /// (direct I/O, syncfs, shutdown) it waits for nobody.
    pub fn make_durable(&self, lsn: u64, on_the_way: Option<SyncOnTheWay<'_>>) -> Result<()> {
        let batching = on_the_way.is_some();
        if let Some(on_the_way) = on_the_way {
            on_the_way.arrive();
        }
        if self.journal.device().is_shut_down() {
            return Err(Error::ShutDown);
        }
        if let Some(failure) = self.journal.failure() {
            return Err(Error::io(failure, std::io::Error::from_raw_os_error(libc::EIO)));
        }
        self.commit_batching(lsn, batching)?;
        self.journal
            .flush_data()
            .map_err(|message| Error::io(message, std::io::Error::from_raw_os_error(libc::EIO)))
    }

    pub fn commit_all(&self) -> Result<()> {
        self.commit(self.journal.last_lsn())
    }

    /// Writes the state as of one point of the log to the next checkpoint
    /// slot, without stopping writers for longer than a shard's encoding
    /// (`super::checkpoint`).
    pub fn checkpoint(&self) -> Result<()> {
        if let Some(refusal) = self.refusal() {
            return Err(refusal);
        }
        let _only_one = Ordered::lock(Level::Checkpoint, || self.checkpoint_lock.lock());
        let started = Instant::now();
        let (point, next_ino, shared, summary) = {
            // With every shard held, no transaction is part-way: the log's
            // end is the point the state reflects.
            let all = self.view_all();
            let point = self.journal.replay_point();
            let next_ino = self.core.next_ino.load(Ordering::Relaxed);
            let summary = Summary {
                inode_count: self.core.inode_count(),
                estimate_bytes: self.core.persisted_bytes_estimate(),
            };
            *self.core.checkpoint_parts.lock() = no_parts();
            for (index, _) in all.shards() {
                self.core.shard(index).checkpoint_owed.store(true, Ordering::Release);
            }
            // The table changes only under every shard of a transaction
            // that settles (`transact`): at the cut it is the cut's.
            let shared: Vec<_> = if self.shared_blocks.load(Ordering::Acquire) > 0 {
                self.space().shared.iter().collect()
            } else {
                Vec::new()
            };
            (point, next_ino, shared, summary)
        };
        for index in 0..SHARD_COUNT {
            let shard = self.core.read_shard(index);
            self.core.pay_checkpoint(index, &shard);
        }
        let parts = std::mem::take(&mut *self.core.checkpoint_parts.lock())
            .into_iter()
            .map(|part| part.expect("every shard encoded"));
        let bytes_written = if self.core.indexed {
            let mut index = Ordered::lock(Level::MetadataIndex, || self.index.lock());
            let index = index.as_mut().expect("an indexed store holds its index");
            self.checkpoint_index(index, parts, point, (next_ino, summary), &shared)?
        } else {
            self.checkpoint_slot(parts, point, next_ino, &shared)?
        };
        if self.core.indexed {
            // Every inode not changed since the cut is now the index's.
            self.index_ino_limit.fetch_max(next_ino, Ordering::AcqRel);
            self.evict_clean_inodes();
        }
        self.checkpoint_bytes_total.fetch_add(bytes_written, Ordering::Relaxed);
        let elapsed_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.checkpoint_ns_total.fetch_add(elapsed_ns, Ordering::Relaxed);
        // Last, so a reader that sees the count sees its bytes and time.
        self.checkpoints_written.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Writes the whole state at the cut to the next slot; returns its
    /// payload's bytes.
    fn checkpoint_slot(
        &self,
        parts: impl Iterator<Item = CutPart>,
        point: journal::ReplayPoint,
        next_ino: u64,
        shared: &[refcount::Counted],
    ) -> Result<u64> {
        let parts: Vec<_> = parts
            .map(|part| match part {
                CutPart::Records(records) => records,
                CutPart::Changes(_) => unreachable!("changes noted for checkpoint slots"),
            })
            .collect();
        let (mut payload, mut record_count) = checkpoint::assemble(&parts);
        let mut writer = Writer::with_capacity(shared.len() * SHARED_SET_RECORD_BYTES);
        for counted in shared {
            Record::SharedSet {
                dev_block: counted.start,
                block_count: counted.count,
                refs: counted.refs,
            }
            .encode(&mut writer);
        }
        payload.extend_from_slice(writer.as_bytes());
        record_count += shared.len() as u64;
        self.journal.write_checkpoint(point, next_ino, &payload, record_count)?;
        Ok(payload.len() as u64)
    }

    /// Brings the metadata index up to the cut with what changed since the
    /// last one and commits it with the cut's log position in its root;
    /// then the log before the cut is free. Returns the bytes written.
    /// Any failure leaves the volume read-only: the index in memory may
    /// hold changes no durable root does.
    fn checkpoint_index(
        &self,
        index: &mut IndexedCheckpoint,
        parts: impl Iterator<Item = CutPart>,
        point: journal::ReplayPoint,
        (next_ino, summary): (u64, Summary),
        shared: &[refcount::Counted],
    ) -> Result<u64> {
        if let Some(failure) = self.journal.failure() {
            return Err(Error::ReadOnly(failure));
        }
        let changes = parts.flat_map(|part| match part {
            CutPart::Changes(changes) => changes,
            CutPart::Records(_) => unreachable!("a shard encoded whole for a metadata index"),
        });
        let header = self.journal.checkpoint_header(point, next_ino);
        // The shared blocks first: where there are any, free space is not
        // followed through the changes.
        let committed = index
            .put_shared(shared)
            .and_then(|()| index.apply(changes))
            .and_then(|()| index.put_summary(summary))
            .and_then(|()| self.give_index_pages(index))
            .and_then(|()| index.commit(&header));
        let report = committed.map_err(|error| self.journal.fail_checkpoint(error))?;
        self.journal.checkpoint_durable(point, header.generation);
        Ok(report.bytes_written)
    }

    /// Gives the index the pages its next commit may want, from free space:
    /// from its reserve first, which is then filled again from what is
    /// free. While the reserve is short of what the index wants
    /// (`IndexedCheckpoint::reserve_wanted_blocks`), the metadata may not
    /// grow (`Txn::ensure_metadata_room` refuses with ENOSPC), so that the
    /// index always has pages for what the log holds.
    fn give_index_pages(&self, index: &mut IndexedCheckpoint) -> Result<()> {
        let wanted = index.pages_wanted() as u64;
        let page_bytes = crate::index::PAGE_BYTES as u64;
        let pages_per_block = index.block_bytes / page_bytes;
        let mut blocks_left = wanted.div_ceil(pages_per_block);
        let mut pages = Vec::with_capacity((blocks_left * pages_per_block) as usize);
        let mut space = self.space();
        while blocks_left > 0 {
            let from_reserved = blocks_left.min(index.reserved_blocks);
            let goal = self.core.data_region.start_block;
            let Some(run) = space.alloc.allocate(goal, blocks_left, from_reserved) else {
                return Err(Error::NoSpace("no free space is left for the metadata index".into()));
            };
            index.reserved_blocks -= from_reserved.min(run.count);
            blocks_left -= run.count;
            for block in run.start..run.start + run.count {
                let start = block * index.block_bytes;
                pages.extend((0..pages_per_block).map(|page| start + page * page_bytes));
            }
        }
        let journal_bytes = self.journal.geometry().journal_bytes;
        let metadata_bytes_max = if index.fill_reserve(space.alloc.promises(), journal_bytes) {
            u64::MAX
        } else {
            self.core.persisted_bytes_estimate()
        };
        self.metadata_bytes_max.store(metadata_bytes_max, Ordering::Relaxed);
        drop(space);
        index.give_pages(&pages)
    }

    /// Writes the whole state, as of now, into a new metadata index for
    /// `superblock` (this volume as format 3): every inode, entry and
    /// shared-block count, and where the log resumes. Its pages come from
    /// free space; its root records go to the slots `superblock` names,
    /// which must hold nothing this store still needs (the newest
    /// checkpoint slot is the other). The caller then writes `superblock`.
    pub fn write_index(&self, superblock: &Superblock) -> Result<()> {
        if let Some(refusal) = self.refusal() {
            return Err(refusal);
        }
        let _only_one = Ordered::lock(Level::Checkpoint, || self.checkpoint_lock.lock());
        let all = self.view_all();
        let point = self.journal.replay_point();
        let next_ino = self.core.next_ino.load(Ordering::Relaxed);
        let mut index = IndexedCheckpoint::create(self.journal.device_arc(), superblock)?;
        let mut changes = Vec::new();
        for (_, shard) in all.shards() {
            let mut everything = Changed::default();
            for (&ino, inode) in &shard.inodes {
                everything.inodes.insert(ino);
                for name in inode.entries().into_iter().flat_map(|entries| entries.keys()) {
                    everything.entries.insert((ino, name.clone()));
                }
            }
            changes.extend(changes_at_cut(&shard.inodes, everything));
        }
        let shared: Vec<_> = self.space().shared.iter().collect();
        drop(all);
        index.apply(changes)?;
        index.put_shared(&shared)?;
        self.give_index_pages(&mut index)?;
        index.commit(&self.journal.checkpoint_header(point, next_ino))?;
        Ok(())
    }

    /// Streams the metadata index (format 3) in bounded memory, checking
    /// every page and that the pages reached are those its root counts;
    /// nothing to check on a volume with checkpoint slots.
    pub fn check_index(&self) -> Result<()> {
        let mut index = Ordered::lock(Level::MetadataIndex, || self.index.lock());
        match index.as_mut() {
            Some(index) => index.check().map(|_| ()),
            None => Ok(()),
        }
    }

    /// The most the metadata may encode to (`u64::MAX`: no limit but the
    /// volume's free space, for a metadata index).
    pub fn metadata_bytes_max(&self) -> u64 {
        self.metadata_bytes_max.load(Ordering::Relaxed)
    }

    /// Sets how much memory inodes may keep after a checkpoint where they
    /// can be read again from a metadata index (format 3); `u64::MAX`
    /// keeps every inode.
    pub fn set_inode_cache_bytes(&self, bytes: u64) {
        self.inode_cache_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Checkpoints written since open: (count, payload bytes, nanoseconds).
    pub fn checkpoint_totals(&self) -> (u64, u64, u64) {
        let count = self.checkpoints_written.load(Ordering::Acquire);
        let bytes = self.checkpoint_bytes_total.load(Ordering::Relaxed);
        (count, bytes, self.checkpoint_ns_total.load(Ordering::Relaxed))
    }

    /// Checkpoints if the journal is filling up, or, where inodes can be
    /// read again from an index, if those in memory take twice their
    /// budget (only a checkpoint makes changed ones clean, and evicts);
    /// returns whether it did.
    pub fn checkpoint_if_due(&self) -> Result<bool> {
        let used_fraction = self.journal.used_fraction();
        let journal_due = used_fraction >= CHECKPOINT_USED_FRACTION;
        let budget_bytes = self.inode_cache_bytes.load(Ordering::Relaxed);
        let memory_over = self.core.indexed
            && self.core.resident_count().saturating_mul(INODE_BYTES_TYPICAL)
                > budget_bytes.saturating_mul(2);
        if self.refusal().is_some() {
            return Ok(false);
        }
        if memory_over && used_fraction == 0.0 {
            // Nothing changed since the last cut, so every inode its notes
            // do not name is the index's: evict without a checkpoint (no
            // cut in flight while the checkpoint mutex is held).
            let _no_cut = Ordered::lock(Level::Checkpoint, || self.checkpoint_lock.lock());
            self.evict_clean_inodes();
            return Ok(false);
        }
        if !(journal_due || memory_over) {
            return Ok(false);
        }
        self.checkpoint().map(|()| true)
    }
}

#[cfg(test)]
thread_local! {
    /// A number [`MetaStore::peek_ino`] took, handed out next.
    static INO_PEEKED: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Numbers a thread takes from the shared inode counter at a time.
const INO_BATCH: u64 = 64;

/// Tells stores apart in the threads' inode batches.
static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

/// A read-locked inode: see [`MetaStore::inode`].
pub type InodeRef<'a> = Ordered<MappedRwLockReadGuard<'a, Inode>>;
/// A write-locked inode: see [`MetaStore::inode_mut`].
pub type InodeMut<'a> = Ordered<MappedRwLockWriteGuard<'a, Inode>>;

/// A place where a test can stop a transaction part-way, holding its shards.
#[cfg(test)]
pub mod test_hooks {
    use std::cell::RefCell;

    type Hook = Box<dyn FnMut(&[u64])>;

    thread_local! {
        static INSIDE: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    /// Runs `hook` in this thread's transactions, after their shards are
    /// locked and before their change, until it is cleared.
    pub fn set_inside_transaction(hook: Option<Hook>) {
        INSIDE.with(|inside| *inside.borrow_mut() = hook);
    }

    pub(super) fn inside_transaction(inos: &[u64]) {
        INSIDE.with(|inside| {
            if let Some(hook) = inside.borrow_mut().as_mut() {
                hook(inos);
            }
        });
    }
}
