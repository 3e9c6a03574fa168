//! The mapping contract every I/O path uses, after the kernel's iomap:
//! [`walk`] goes over a file range mapping by mapping, as the kernel's
//! `iomap_iter` does (each step is `begin`: where the next piece lives,
//! allocating when asked to write into a hole), and [`end_write`] records
//! what the I/O completed, for all of a request's pieces at once.
//! [`report_range`] is the walk that never allocates, taken under one lock.
//!
//! Writes into new space go through Unwritten extents: `begin` allocates them
//! Unwritten, the data is written, and `end_write` converts exactly the
//! completed blocks to Written in the same transaction as any size change.
//! A crash in between leaves Unwritten blocks, which read as zeros, so a file
//! can never expose stale blocks.

use smallvec::SmallVec;

use crate::alloc::BlockRun;
use crate::error::{Error, Result};
use crate::extent::{ExtentKind, ExtentMap, Lookup};
use crate::format::{ExtentState, Record};
use crate::meta::{InodeTable, MetaStore, Txn};

/// What backs a range of a file, as `Inodes::fiemap` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapKind {
    /// No space: reads as zeros.
    Hole,
    /// Reserved in memory, not yet allocated (delayed allocation).
    Delalloc,
    /// Allocated, not yet written: reads as zeros.
    Unwritten,
    /// Allocated and written.
    Written,
}

/// The most blocks one delayed extent is allocated as at a time (512 MiB
/// at 4 KiB blocks): large enough for long contiguous writeback, small
/// enough to bound one allocation's search.
const DELALLOC_CONVERT_BLOCKS_MAX: u64 = 1 << 17;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Allocate Unwritten space for holes in the range, and real space for
    /// delayed allocations (writeback and direct writes).
    Write,
    /// Report only (fiemap, seek): never allocates.
    Report,
}

/// One contiguous piece of a file: whole blocks, starting at or before the
/// requested position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub kind: MapKind,
    /// File byte offset of the first block.
    pub offset: u64,
    /// Bytes, a multiple of the block size.
    pub length: u64,
    /// Device byte offset of `offset` (Unwritten and Written only; else 0).
    pub dev_offset: u64,
    /// Allocated by this call: the caller writes or zeroes every byte of it
    /// (or, with `cow_source`, copies what it does not write).
    pub new: bool,
    /// Other file blocks map these device blocks too (a clone's): reported
    /// only, since a write never gets them (it gets `cow_source` space).
    pub shared: bool,
    /// New space that takes the place of shared blocks once written
    /// (copy-on-write): where `offset`'s shared copy is, from which a write
    /// of part of a block takes the rest.
    pub cow_source: Option<CowSource>,
}

/// The shared blocks a copy-on-write mapping replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CowSource {
    /// Device byte offset of the mapping's first block's shared copy.
    pub dev_offset: u64,
    /// Whether they hold data: shared unwritten blocks (a clone of
    /// fallocated space) read as zeros, whatever the device holds there.
    pub written: bool,
}

impl CowSource {
    /// Where the old bytes of the mapping's blocks are, if they are not zeros.
    pub fn old_data_at(&self) -> Option<u64> {
        self.written.then_some(self.dev_offset)
    }
}

impl Mapping {
    pub fn end(&self) -> u64 {
        self.offset + self.length
    }

    /// Reads of this range return zeros without device I/O.
    pub fn reads_as_zeros(&self) -> bool {
        self.kind != MapKind::Written
    }
}

/// One step of a walk over a request's range: a mapping, and the part of
/// the request it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedRange {
    pub mapping: Mapping,
    /// The request's bytes `[start, end)` that lie in `mapping` (offsets
    /// from the request's first byte).
    pub start: u64,
    pub end: u64,
    /// Device byte offset of the request's byte `start` (meaningless for
    /// holes and delayed allocations, which have no device address).
    pub dev_offset: u64,
}

impl MappedRange {
    /// The part of `mapping` that a request of `length` bytes at `pos`
    /// carries from its byte `done` on.
    fn clip(mapping: Mapping, pos: u64, done: u64, length: u64) -> Self {
        let at = pos + done;
        debug_assert!(mapping.offset <= at && at < mapping.end());
        let end = (pos + length).min(mapping.end()) - pos;
        let dev_offset = match mapping.kind {
            MapKind::Hole | MapKind::Delalloc => 0,
            MapKind::Unwritten | MapKind::Written => mapping.dev_offset + (at - mapping.offset),
        };
        debug_assert!(end > done, "an empty range of {mapping:?} at {done}");
        Self { mapping, start: done, end, dev_offset }
    }

    /// Bytes of the request in this range.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// The request's bytes in this range, as indexes into its buffer.
    pub fn bytes(&self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// Walks `[pos, pos + length)` of file `ino` mapping by mapping: each item
/// is the next `begin` step clipped to the range, so the ranges are contiguous
/// and cover the request exactly. With `Intent::Write` holes and delayed
/// allocations are allocated as the walk reaches them. After an error the
/// walk ends: the caller gives back what it mapped (see [`end_write`]).
pub fn walk(
    meta: &MetaStore,
    ino: u64,
    pos: u64,
    length: u64,
    intent: Intent,
    block_bytes: u64,
) -> Walk<'_> {
    Walk { meta, ino, pos, length, intent, block_bytes, done: 0, failed: false, copies_reserved: 0 }
}

/// The iterator [`walk`] returns.
pub struct Walk<'a> {
    meta: &'a MetaStore,
    ino: u64,
    pos: u64,
    length: u64,
    intent: Intent,
    block_bytes: u64,
    /// Bytes of the range the ranges yielded so far cover.
    done: u64,
    failed: bool,
    /// Blocks promised to copies of shared blocks ([`reserve_copies`]) that
    /// the walk's copy-on-write allocations take before any other space.
    copies_reserved: u64,
}

impl Walk<'_> {
    /// Lets the walk's copy-on-write allocations use `block_count` blocks
    /// promised by [`reserve_copies`] (writeback of the blocks that
    /// reserved them).
    pub fn paying_copies_with(mut self, block_count: u64) -> Self {
        self.copies_reserved = block_count;
        self
    }

    /// The promised blocks no copy took: the caller gives them back.
    pub fn copies_reserved_left(&self) -> u64 {
        self.copies_reserved
    }
}

impl Iterator for Walk<'_> {
    type Item = Result<MappedRange>;

    fn next(&mut self) -> Option<Result<MappedRange>> {
        if self.failed || self.done >= self.length {
            return None;
        }
        let at = self.pos + self.done;
        let left = self.length - self.done;
        let begun = begin(
            self.meta,
            self.ino,
            at,
            left,
            self.intent,
            self.block_bytes,
            &mut self.copies_reserved,
        );
        match begun {
            Ok(mapping) => {
                let range = MappedRange::clip(mapping, self.pos, self.done, self.length);
                // Each step moves on, and never past the request.
                assert!(range.end > self.done && range.end <= self.length, "{range:?}");
                self.done = range.end;
                Some(Ok(range))
            }
            Err(error) => {
                self.failed = true;
                Some(Err(error))
            }
        }
    }
}

/// Maps the block containing `pos` and as many following blocks, up to the
/// block containing `pos + length - 1`, as share its state.
fn begin(
    meta: &MetaStore,
    ino: u64,
    pos: u64,
    length: u64,
    intent: Intent,
    block_bytes: u64,
    copies_reserved: &mut u64,
) -> Result<Mapping> {
    assert!(length > 0);
    let mapping = map_first_blocks(meta, ino, pos, length, intent, block_bytes, copies_reserved)?;
    // What every caller relies on when it advances by the mapping, as the
    // kernel's iomap_iter_done checks: it starts at or before `pos`, covers
    // `pos`, ends no later than the block holding the range's last byte,
    // and is in whole blocks; a hole has no device address.
    let range_end = (pos + length).div_ceil(block_bytes) * block_bytes;
    let context = || format!("inode {ino}: mapping {mapping:?} for {length} bytes at {pos}");
    assert!(mapping.length > 0, "empty mapping: {}", context());
    assert!(mapping.offset <= pos, "mapping starts after the position: {}", context());
    assert!(mapping.end() > pos, "mapping ends before the position: {}", context());
    assert!(mapping.end() <= range_end, "mapping runs past the request: {}", context());
    assert!(mapping.offset.is_multiple_of(block_bytes), "unaligned offset: {}", context());
    assert!(mapping.length.is_multiple_of(block_bytes), "unaligned length: {}", context());
    assert!(
        mapping.dev_offset.is_multiple_of(block_bytes),
        "unaligned device offset: {}",
        context()
    );
    if mapping.kind == MapKind::Hole {
        assert!(mapping.dev_offset == 0, "a hole with a device address: {}", context());
        assert!(!mapping.new, "a hole marked newly allocated: {}", context());
        assert!(intent != Intent::Write, "a write left a hole unallocated: {}", context());
    }
    Ok(mapping)
}

/// How often one mapping may commit so that blocks freed by transactions
/// not yet durable become usable, before it reports ENOSPC: other threads
/// free and allocate meanwhile, so one commit may find the next frees
/// pending again; each commit makes every pending free before it usable.
const COMMITS_FOR_SPACE_MAX: u32 = 4;

/// How often one mapping may look again after another writer changed the
/// extent it found (a race each time, settled by the other's transaction):
/// far more than threads can race it in turn, and a bound against a bug
/// that would otherwise spin for ever.
const LOOKUPS_AFTER_RACE_MAX: u32 = 1000;

/// Counts an operation's retries for space and after races against their
/// bounds.
pub(crate) struct Retries {
    ino: u64,
    commits_for_space: u32,
    lookups_after_race: u32,
}

impl Retries {
    pub(crate) fn new(ino: u64) -> Self {
        Self { ino, commits_for_space: 0, lookups_after_race: 0 }
    }

    /// Another writer changed the extent: look again, up to the bound.
    fn raced(&mut self) -> Result<()> {
        self.lookups_after_race += 1;
        if self.lookups_after_race > LOOKUPS_AFTER_RACE_MAX {
            return Err(Error::Io {
                context: format!(
                    "mapping inode {}: the extent changed under {LOOKUPS_AFTER_RACE_MAX} lookups \
                     in a row",
                    self.ino
                ),
                cause: std::io::Error::other("retries exhausted"),
            });
        }
        Ok(())
    }

    /// Nothing free but blocks waiting for their freeing to be durable:
    /// commits so they can be taken, or ENOSPC (`refusal`) past the bound.
    pub(crate) fn commit_for_space(
        &mut self,
        meta: &MetaStore,
        refusal: impl FnOnce() -> String,
    ) -> Result<()> {
        if self.commits_for_space >= COMMITS_FOR_SPACE_MAX {
            return Err(Error::NoSpace(refusal()));
        }
        self.commits_for_space += 1;
        meta.commit_all()?;
        meta.release_durable_frees();
        Ok(())
    }
}

fn map_first_blocks(
    meta: &MetaStore,
    ino: u64,
    pos: u64,
    length: u64,
    intent: Intent,
    block_bytes: u64,
    copies_reserved: &mut u64,
) -> Result<Mapping> {
    let first_block = pos / block_bytes;
    let wanted_blocks = (pos + length).div_ceil(block_bytes) - first_block;
    let mut retries = Retries::new(ino);
    loop {
        let hole_blocks = match lookup(meta, ino, first_block)? {
            Lookup::Mapped(extent)
                if intent == Intent::Write && extent.kind == ExtentKind::Delalloc =>
            {
                match allocate_delalloc(meta, ino, first_block)? {
                    Some(run) => {
                        return Ok(delalloc_mapping(run, first_block, wanted_blocks, block_bytes))
                    }
                    // Writeback or truncate changed the extent: look again.
                    None => {
                        retries.raced()?;
                        continue;
                    }
                }
            }
            Lookup::Mapped(extent) => {
                let mapping = mapped(meta, extent, wanted_blocks, block_bytes);
                if intent != Intent::Write || !mapping.shared {
                    return Ok(mapping);
                }
                match allocate_cow(meta, ino, mapping.length / block_bytes, copies_reserved)? {
                    Allocation::Mapped(run) => return Ok(cow_mapping(mapping, run, block_bytes)),
                    Allocation::NeedsCommit => {
                        retries.commit_for_space(meta, || {
                            format!("no free blocks to copy shared blocks of inode {ino} to")
                        })?;
                        continue;
                    }
                    Allocation::Raced => {
                        retries.raced()?;
                        continue;
                    }
                }
            }
            Lookup::Hole { block_count } => block_count.min(wanted_blocks),
        };
        if intent != Intent::Write {
            return Ok(Mapping {
                kind: MapKind::Hole,
                offset: first_block * block_bytes,
                length: hole_blocks * block_bytes,
                dev_offset: 0,
                new: false,
                shared: false,
                cow_source: None,
            });
        }
        match allocate_unwritten(meta, ino, first_block, hole_blocks)? {
            Allocation::Mapped(run) => {
                return Ok(Mapping {
                    kind: MapKind::Unwritten,
                    offset: first_block * block_bytes,
                    length: run.count * block_bytes,
                    dev_offset: run.start * block_bytes,
                    new: true,
                    shared: false,
                    cow_source: None,
                })
            }
            // Another writer mapped the hole meanwhile: look again.
            Allocation::Raced => retries.raced()?,
            // Freed space becomes usable once its transaction is durable.
            Allocation::NeedsCommit => {
                retries.commit_for_space(meta, || format!("no free blocks for inode {ino}"))?
            }
        }
    }
}

/// The Unwritten mapping of a delayed extent's first blocks, given `run`.
fn delalloc_mapping(
    run: BlockRun,
    first_block: u64,
    wanted_blocks: u64,
    block_bytes: u64,
) -> Mapping {
    debug_assert!(run.count > 0, "an empty run for a delayed extent");
    Mapping {
        kind: MapKind::Unwritten,
        offset: first_block * block_bytes,
        length: run.count.min(wanted_blocks) * block_bytes,
        dev_offset: run.start * block_bytes,
        new: false,
        shared: false,
        cow_source: None,
    }
}

/// The mapping that writes shared blocks `shared` to their copy `run`.
fn cow_mapping(shared: Mapping, run: BlockRun, block_bytes: u64) -> Mapping {
    debug_assert!(run.count * block_bytes <= shared.length, "a copy longer than its source");
    Mapping {
        kind: MapKind::Unwritten,
        length: run.count * block_bytes,
        dev_offset: run.start * block_bytes,
        new: true,
        shared: false,
        cow_source: Some(CowSource {
            dev_offset: shared.dev_offset,
            written: shared.kind == MapKind::Written,
        }),
        ..shared
    }
}

/// The extent map of regular file `ino`, or the error a data path reports.
pub fn file_extents<T: InodeTable + ?Sized>(state: &T, ino: u64) -> Result<&ExtentMap> {
    let inode = state.inode(ino).ok_or_else(|| Error::BadHandle(format!("inode {ino} is gone")))?;
    inode.extents().ok_or_else(|| Error::IsDir(format!("inode {ino}")))
}

fn lookup(meta: &MetaStore, ino: u64, file_block: u64) -> Result<Lookup> {
    let inode = meta.inode(ino).ok_or_else(|| Error::BadHandle(format!("inode {ino} is gone")))?;
    let extents = inode.extents().ok_or_else(|| Error::IsDir(format!("inode {ino}")))?;
    Ok(extents.lookup(file_block))
}

/// `extent`'s first blocks (up to `wanted_blocks`) that are all shared or
/// all not.
fn mapped(
    meta: &MetaStore,
    extent: crate::extent::Extent,
    wanted_blocks: u64,
    block_bytes: u64,
) -> Mapping {
    let kind = match extent.kind {
        ExtentKind::Delalloc => MapKind::Delalloc,
        ExtentKind::Unwritten => MapKind::Unwritten,
        ExtentKind::Written => MapKind::Written,
    };
    let mut blocks = extent.block_count.min(wanted_blocks);
    let mut shared = false;
    if kind != MapKind::Delalloc {
        (shared, blocks) = meta.shared_run(extent.dev_block, blocks);
    }
    debug_assert!(blocks > 0 && blocks <= wanted_blocks, "{blocks} blocks of {extent:?}");
    let dev_offset = if kind == MapKind::Delalloc { 0 } else { extent.dev_block * block_bytes };
    Mapping {
        kind,
        offset: extent.file_block * block_bytes,
        length: blocks * block_bytes,
        dev_offset,
        new: false,
        shared,
        cow_source: None,
    }
}

/// Takes up to `block_count` free blocks for a write that copies shared
/// blocks: no extent maps them until the write completes ([`end_write`]
/// remaps them over the shared ones), so a crash before leaves them free.
/// Blocks promised to copies (`copies_reserved`) pay first, and what the
/// run took of them leaves the count.
fn allocate_cow(
    meta: &MetaStore,
    ino: u64,
    block_count: u64,
    copies_reserved: &mut u64,
) -> Result<Allocation> {
    let mut space = meta.space();
    let goal = space.alloc.cursor();
    let from_reserved = block_count.min(*copies_reserved);
    match space.alloc.allocate(goal, block_count, from_reserved) {
        Some(run) => {
            assert!(run.count > 0 && run.count <= block_count, "{run:?} for {block_count}");
            *copies_reserved -= from_reserved.min(run.count);
            Ok(Allocation::Mapped(run))
        }
        None if space.pending_free_blocks() > 0 => Ok(Allocation::NeedsCommit),
        None => {
            Err(Error::NoSpace(format!("no free blocks to copy shared blocks of inode {ino} to")))
        }
    }
}

enum Allocation {
    Mapped(BlockRun),
    Raced,
    /// Nothing free now, but blocks freed by uncommitted transactions wait.
    NeedsCommit,
}

/// Allocates up to `block_count` blocks for file block `file_block` (a hole)
/// and maps them Unwritten. Re-checks the hole under the write lock: another
/// writer may have filled it since the lookup.
fn allocate_unwritten(
    meta: &MetaStore,
    ino: u64,
    file_block: u64,
    block_count: u64,
) -> Result<Allocation> {
    let (allocation, _) = meta.transact(&[ino], |txn| {
        txn.ensure_metadata_room(64)?;
        let (goal, hole_blocks) = allocation_goal(txn, ino, file_block)?;
        let wanted = block_count.min(hole_blocks);
        if wanted == 0 {
            return Ok(Allocation::Raced);
        }
        let mut space = txn.space();
        let Some(run) = space.alloc.allocate(goal, wanted, 0) else {
            if space.pending_free_blocks() > 0 {
                return Ok(Allocation::NeedsCommit);
            }
            return Err(Error::NoSpace(format!("no free blocks for inode {ino}")));
        };
        drop(space);
        assert!(run.count > 0 && run.count <= wanted, "{run:?} for a hole of {wanted}");
        map_unwritten(txn, ino, file_block, run.start, run.count);
        Ok(Allocation::Mapped(run))
    })?;
    Ok(allocation)
}

/// Chooses device blocks for the delayed extent starting at `file_block`,
/// as one contiguous Unwritten run when free space allows, paid for by the
/// extent's own reservation (returned when the Delalloc extent is displaced).
/// None if the block is no longer Delalloc.
fn allocate_delalloc(meta: &MetaStore, ino: u64, file_block: u64) -> Result<Option<BlockRun>> {
    let (run, _) = meta.transact(&[ino], |txn| {
        txn.ensure_metadata_room(64)?;
        let delayed = match file_extents(txn.state(), ino)?.lookup(file_block) {
            Lookup::Mapped(extent) if extent.kind == ExtentKind::Delalloc => extent,
            _ => return Ok(None),
        };
        let wanted = delayed.block_count.min(DELALLOC_CONVERT_BLOCKS_MAX);
        let (goal, _) = allocation_goal(txn, ino, file_block)?;
        let run = txn.allocate_reserved(goal, wanted).ok_or_else(|| {
            Error::NoSpace(format!("no free blocks for the reservation of inode {ino}"))
        })?;
        assert!(run.count <= wanted, "{run:?} for a delayed extent of {wanted}");
        map_unwritten(txn, ino, file_block, run.start, run.count);
        Ok(Some(run))
    })?;
    Ok(run)
}

/// Maps `block_count` device blocks from `dev_block` at `file_block` as
/// Unwritten: new space that reads as zeros until its data is written.
pub fn map_unwritten(
    txn: &mut Txn<'_>,
    ino: u64,
    file_block: u64,
    dev_block: u64,
    block_count: u64,
) {
    debug_assert!(block_count > 0, "mapping no blocks at {file_block} of inode {ino}");
    txn.apply(Record::ExtentMap {
        ino,
        file_block,
        dev_block,
        block_count,
        state: ExtentState::Unwritten,
    });
}

/// Reserves space for a buffered write of `[pos, pos + length)`: holes
/// become Delalloc extents. Returns how many bytes from `pos` are now backed
/// (short when space ran out); ENOSPC when not even the first block is. This
/// is where a full volume is reported: at write time, never at writeback.
pub fn reserve(meta: &MetaStore, ino: u64, pos: u64, length: u64, block_bytes: u64) -> Result<u64> {
    if let Some(refusal) = meta.refusal() {
        return Err(refusal);
    }
    let first_block = pos / block_bytes;
    let block_count = (pos + length).div_ceil(block_bytes) - first_block;
    let metadata_bytes_max = meta.metadata_bytes_max();
    let refusal = || format!("no free blocks for a write to inode {ino}");
    let mut retries = Retries::new(ino);
    loop {
        // The extents writeback will record must fit the checkpoint too.
        let mapped_blocks = if meta.persisted_bytes_estimate() + 128 > metadata_bytes_max {
            0
        } else {
            meta.reserve_delalloc(ino, first_block, block_count)
        };
        if mapped_blocks > 0 {
            assert!(mapped_blocks <= block_count, "{mapped_blocks} of {block_count} reserved");
            let mapped_end = (first_block + mapped_blocks) * block_bytes;
            return Ok(mapped_end.min(pos + length) - pos);
        }
        // Freed space becomes usable once its transaction is durable.
        if meta.space().pending_free_blocks() == 0 {
            return Err(Error::NoSpace(refusal()));
        }
        retries.commit_for_space(meta, refusal)?;
    }
}

/// The blocks of `[first_block, first_block + block_count)` of file `ino`
/// that a write must copy (mapped onto shared blocks, or onto blocks
/// unshared by a record not yet durable), as runs `(file_block, count)`.
/// Empty at the cost of two atomic loads on a volume without clones.
pub fn blocks_to_copy(
    meta: &MetaStore,
    ino: u64,
    first_block: u64,
    block_count: u64,
) -> Result<SmallVec<[(u64, u64); 4]>> {
    let mut runs: SmallVec<[(u64, u64); 4]> = SmallVec::new();
    if !meta.may_copy_on_write() {
        return Ok(runs);
    }
    let inode = meta.inode(ino).ok_or_else(|| Error::BadHandle(format!("inode {ino} is gone")))?;
    let extents = inode.extents().ok_or_else(|| Error::IsDir(format!("inode {ino}")))?;
    for extent in extents.range(first_block, first_block + block_count) {
        if extent.kind == ExtentKind::Delalloc {
            continue;
        }
        let mut block = extent.file_block;
        while block < extent.file_end() {
            let dev_block = extent.dev_block + (block - extent.file_block);
            let (shared, count) = meta.shared_run(dev_block, extent.file_end() - block);
            if shared {
                match runs.last_mut() {
                    Some((start, length)) if *start + *length == block => *length += count,
                    _ => runs.push((block, count)),
                }
            }
            block += count;
        }
    }
    Ok(runs)
}

/// Blocks promised to the copies of shared blocks that writes will make,
/// not yet taken: given back when dropped. Walks pay with them
/// ([`Walk::paying_copies_with`]).
#[must_use]
pub struct CopyReservation<'a> {
    meta: &'a MetaStore,
    pub block_count: u64,
}

impl<'a> CopyReservation<'a> {
    /// Takes charge of `block_count` blocks already promised (those of
    /// folios' `copy_reserved` bits, handed to their writeback).
    pub fn adopt(meta: &'a MetaStore, block_count: u64) -> Self {
        Self { meta, block_count }
    }

    /// Hands the promised blocks to the caller, who now owns giving them
    /// back (a folio's `copy_reserved` bits).
    pub fn take_over(mut self) -> u64 {
        std::mem::take(&mut self.block_count)
    }
}

impl Drop for CopyReservation<'_> {
    fn drop(&mut self) {
        self.meta.release_copies(self.block_count);
    }
}

/// Promises `block_count` free blocks to copies of shared blocks
/// ([`MetaStore::reserve_copies`]), committing (up to
/// `COMMITS_FOR_SPACE_MAX` times) while only blocks freed by records not
/// yet durable could pay. ENOSPC when they cannot be had, so that a full
/// volume fails a write before it changes anything (a buffered
/// write, as [`reserve`] does, never its writeback; a zeroing of both edges
/// of a range, never after the first).
pub fn reserve_copies(meta: &MetaStore, ino: u64, block_count: u64) -> Result<CopyReservation<'_>> {
    if block_count == 0 {
        return Ok(CopyReservation::adopt(meta, 0));
    }
    let mut retries = Retries::new(ino);
    let refusal =
        || format!("no free blocks for copies of {block_count} shared blocks of inode {ino}");
    loop {
        if meta.reserve_copies(block_count) {
            return Ok(CopyReservation::adopt(meta, block_count));
        }
        if meta.space().pending_free_blocks() == 0 {
            return Err(Error::NoSpace(refusal()));
        }
        retries.commit_for_space(meta, refusal)?;
    }
}

/// Prefers the device block right after the extent before `file_block`, so
/// a file written in order is laid out in order. Returns the goal and the
/// length of the hole at `file_block`.
fn allocation_goal(txn: &Txn<'_>, ino: u64, file_block: u64) -> Result<(u64, u64)> {
    let extents = file_extents(txn.state(), ino)?;
    let hole_blocks = match extents.lookup(file_block) {
        Lookup::Hole { block_count } => block_count,
        Lookup::Mapped(_) => 0,
    };
    // Delayed extents have no device blocks to continue from.
    let previous =
        extents.range(0, file_block).filter(|extent| extent.kind != ExtentKind::Delalloc).last();
    let goal = match previous {
        Some(extent) => extent.dev_block + extent.block_count + (file_block - extent.file_end()),
        None => txn.space().alloc.cursor(),
    };
    Ok((goal, hole_blocks))
}

/// How many mappings one transaction of [`end_write`] records: each takes
/// at most an ExtentMap and an ExtentUnmap (59 bytes), and the caller's
/// `also` a size and times record, which must all fit the allowance every
/// transaction has without reserving (`TXN_LOG_BYTES_UNRESERVED`, 1 KiB),
/// so recording completed I/O never fails for want of journal room.
const END_WRITES_PER_TXN: usize = 12;

/// Records what a request's I/O completed, as the kernel's `iomap_end` and
/// a direct write's `end_io` do: for each `(mapping, completed_bytes)`,
/// Unwritten blocks among the first `completed_bytes` become Written, and
/// space the request allocated (`new`) but did not write goes back. `also`
/// adds records (size, times) to the last transaction. One transaction for
/// a request of up to `END_WRITES_PER_TXN` mappings (nearly all); more go
/// in several, in order, the last one holding `also`. Returns the last
/// transaction's lsn.
pub fn end_write(
    meta: &MetaStore,
    ino: u64,
    completions: &[(Mapping, u64)],
    block_bytes: u64,
    also: impl FnOnce(&mut Txn<'_>),
) -> Result<u64> {
    for (mapping, completed_bytes) in completions {
        assert!(
            *completed_bytes <= mapping.length && completed_bytes.is_multiple_of(block_bytes),
            "inode {ino}: {completed_bytes} bytes completed of {mapping:?}"
        );
    }
    let mut chunks = completions.chunks(END_WRITES_PER_TXN).peekable();
    let mut also = Some(also);
    loop {
        // At least one transaction, for `also`.
        let chunk = chunks.next().unwrap_or(&[]);
        let last = chunks.peek().is_none();
        let (_, lsn) = meta.transact(&[ino], |txn| {
            for (mapping, completed_bytes) in chunk {
                record_completion(txn, ino, mapping, *completed_bytes, block_bytes);
            }
            if let Some(also) = also.take().filter(|_| last) {
                also(txn);
            }
            Ok(())
        })?;
        if last {
            return Ok(lsn);
        }
    }
}

fn record_completion(
    txn: &mut Txn<'_>,
    ino: u64,
    mapping: &Mapping,
    completed_bytes: u64,
    block_bytes: u64,
) {
    if mapping.kind == MapKind::Unwritten && completed_bytes > 0 {
        txn.apply(Record::ExtentMap {
            ino,
            file_block: mapping.offset / block_bytes,
            dev_block: mapping.dev_offset / block_bytes,
            block_count: completed_bytes / block_bytes,
            state: ExtentState::Written,
        });
    }
    if mapping.new && completed_bytes < mapping.length {
        // Space allocated for a write that did not complete: give it back.
        let done_blocks = completed_bytes / block_bytes;
        let block_count = (mapping.length - completed_bytes) / block_bytes;
        if mapping.cow_source.is_some() {
            // Never mapped: the file still maps the shared blocks there.
            let start = mapping.dev_offset / block_bytes + done_blocks;
            txn.free_unmapped(BlockRun { start, count: block_count });
        } else {
            txn.apply(Record::ExtentUnmap {
                ino,
                file_block: mapping.offset / block_bytes + done_blocks,
                block_count,
            });
        }
    }
}

/// A file's size and the mappings of a byte range, read under one lock and
/// never allocating: what a direct request needs to decide how it may run.
pub struct RangeReport {
    pub size: u64,
    /// The range's pieces, holes included, clipped to it as [`walk`]'s are.
    /// Inline up to two: a direct request's range is nearly always one
    /// mapping, and it asks for a report per request.
    pub ranges: SmallVec<[MappedRange; 2]>,
}

/// Reports `[pos, pos + length)` as mapped ranges (holes included), in one
/// pass under one lock: [`walk`] with `Intent::Report`, without taking the
/// lock once per step.
pub fn report_range(
    meta: &MetaStore,
    ino: u64,
    pos: u64,
    length: u64,
    block_bytes: u64,
) -> Result<RangeReport> {
    let inode = meta.inode(ino).ok_or_else(|| Error::BadHandle(format!("inode {ino} is gone")))?;
    let extents = inode.extents().ok_or_else(|| Error::IsDir(format!("inode {ino}")))?;
    let end_block = (pos + length).div_ceil(block_bytes);
    let mut done = 0;
    let mut ranges = SmallVec::new();
    while done < length {
        let block = (pos + done) / block_bytes;
        let wanted_blocks = end_block - block;
        let mapping = match extents.lookup(block) {
            Lookup::Mapped(extent) => mapped(meta, extent, wanted_blocks, block_bytes),
            Lookup::Hole { block_count } => Mapping {
                kind: MapKind::Hole,
                offset: block * block_bytes,
                length: block_count.min(wanted_blocks) * block_bytes,
                dev_offset: 0,
                new: false,
                shared: false,
                cow_source: None,
            },
        };
        let range = MappedRange::clip(mapping, pos, done, length);
        done = range.end;
        ranges.push(range);
    }
    Ok(RangeReport { size: inode.size, ranges })
}
