//! Writeback: dirty blocks of the folio cache to the device.
//!
//! As iomap's writeback with XFS's and (since seed 004) ext4's allocation
//! policy: dirty blocks are gathered into file-contiguous runs across folios;
//! each run is mapped through `iomap` (delayed extents become one large
//! contiguous Unwritten allocation), written straight from folio memory in
//! one vectored request per mapping piece, and converted to Written in the
//! transaction that also moves the on-disk size, never past completed data.
//! Because new space is Unwritten until its write completes, no data flush
//! has to precede a journal commit ("ordered data" is not needed); the
//! journal flushes completed writes before each group anyway.
//!
//! A pass over many files (the flusher's, syncfs) writes the small ones in
//! groups: their runs are mapped one file after another, so delayed
//! allocation lays them out side by side, and the group's requests are
//! merged by device offset into few large writes, as the kernel's block
//! plug merges the bios of the inodes one writeback pass visits.
//!
//! A failed write leaves its blocks dirty (retried by the next writeback,
//! never dropped) and advances the file's error sequence, which the next
//! fsync of every handle reports once.
//!
//! Folios under writeback are read-locked: readers go on, writers wait, so
//! the flusher leaves alone the folio a writer is half-way through. A
//! file's writebacks are serialised by its `writeback_lock`, which truncate
//! and invalidation also take before dropping folios.

use std::io::IoSlice;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Mutex, RwLockReadGuard, RwLockWriteGuard};

use crate::cache::{BlockBits, FlusherRound, Folio, FolioState, InodeCache, WritebackGuard};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::Record;
use crate::iomap::{self, Intent, MapKind, Mapping};
use crate::meta::Txn;

/// Folios locked and written as one batch: bounds what one writeback pins.
const BATCH_BYTES_MAX: usize = 256 << 20;
/// Buffers per vectored request (the kernel's IOV_MAX).
const SLICES_PER_REQUEST_MAX: usize = 1024;
/// Largest writeback request, and how many are in flight at once (on the
/// bench VM's disk, 8 MiB requests 8 at a time wrote at 1.4x the rate of 4
/// at a time).
const REQUEST_BYTES_MAX: u64 = 8 << 20;
const WRITEBACK_THREADS: usize = 8;
/// Files with at most this much dirty data are written back in groups
/// ([`write_group`]), up to `GROUP_FILES_MAX` files or
/// `GROUP_DIRTY_BYTES_MAX` bytes a group.
const GROUP_FILE_DIRTY_BYTES_MAX: u64 = 256 << 10;
const GROUP_FILES_MAX: usize = 256;
const GROUP_DIRTY_BYTES_MAX: u64 = 16 << 20;
/// How long a throttled writer waits for the flusher at most, in steps.
const THROTTLE_WAIT_STEP: Duration = Duration::from_millis(10);
const THROTTLE_WAIT_STEPS_MAX: u32 = 100;
/// How long background writeback leaves a folio being filled alone at most
/// (see [`InodeCache::folio_being_filled`]).
const SPARE_FILLING_MAX: Duration = Duration::from_secs(1);

/// A folio held for writeback: read-locked, with the dirty bits it had and
/// those of its blocks that had a block promised to their copy.
struct Held<'a> {
    folio: &'a Folio,
    state: RwLockReadGuard<'a, FolioState>,
    dirty: BlockBits,
    copy_reserved: BlockBits,
}

/// Part of a run: bytes of one held folio.
#[derive(Debug, Clone, Copy)]
struct Segment {
    held: usize,
    offset: usize,
    bytes: usize,
}

/// Dirty bytes contiguous in the file.
struct Run {
    pos: u64,
    bytes: u64,
    segments: Vec<Segment>,
}

/// Writes back every dirty block of the folios overlapping `[start, end)`,
/// and waits for it. On a write failure the blocks stay dirty, the file's
/// error sequence advances, and the first error is returned.
pub fn write_back(engine: &Engine, inode: &InodeCache, start: u64, end: u64) -> Result<()> {
    write_back_sparing(engine, inode, start, end, Duration::ZERO)
}

/// [`write_back`], leaving out the folio a writer is filling for up to
/// `spare_filling_max` (zero: nothing is left out).
pub(crate) fn write_back_sparing(
    engine: &Engine,
    inode: &InodeCache,
    start: u64,
    end: u64,
    spare_filling_max: Duration,
) -> Result<()> {
    // Under the lock: a writeback in progress has already taken the dirty
    // bits of what it is writing, and returning before it ends would let an
    // fsync or a direct read overtake data not yet on disk.
    let _serial = inode.lock_writeback();
    // Any writeback that leaves the file clean lets the on-disk size catch
    // up, not only a whole-file one: a range writeback (a direct read's, a
    // truncate's) may be the retry that cleans a file whose size growth an
    // earlier failure held back, and syncfs then skips the clean file, so
    // the size stayed behind data it had reported durable (found by
    // tests/faults/random.rs).
    if inode.dirty_bytes() == 0 {
        return settle_disk_size(engine, inode);
    }
    let Some((disk_size, open_handles)) =
        engine.meta.inode(inode.ino).map(|found| (found.attrs.size, found.open_handles))
    else {
        // Freed while cached: its data has nowhere to go.
        inode.remove_range(0, u64::MAX);
        return Ok(());
    };
    // Nobody is filling a folio of a file no handle has open: a small file
    // written and closed looked half-filled (its one write ended inside its
    // folio), and every background pass left it for a second while writers
    // throttled at the dirty limit (8,300 creates/s with 64 MiB of it).
    let spare_filling_max = if open_handles == 0 { Duration::ZERO } else { spare_filling_max };
    // A writeback that moves the on-disk size must not leave dirty data
    // below the new size behind it: it starts at the current on-disk size.
    let start = if end > disk_size { start.min(disk_size) } else { start };
    let mut size_may_grow = true;
    let mut result = Ok(());
    let mut cursor = start;
    // Batch by batch, holding only the batch's folios: the rest stay
    // evictable while this writeback runs.
    while cursor < end {
        let mut batch = inode.dirty_folios_from(cursor, end, BATCH_BYTES_MAX);
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else { break };
        let batch_start = first.pos();
        let batch_end = last.end();
        let mut next_cursor = batch_end;
        // Asked again for every batch: the writer moves on while one is
        // written.
        if let Some(filling) = inode.folio_being_filled(spare_filling_max) {
            let count = batch.len();
            batch.retain(|folio| folio.pos() != filling);
            if batch.is_empty() {
                break;
            }
            if batch.len() < count {
                // The next batch starts at the folio left out, which the
                // writer is about done with: left behind the flusher, it
                // stayed dirty for the whole pass, and a stream's recycling
                // stops at the first dirty folio (so the cache grew with
                // fresh memory meanwhile).
                next_cursor = filling;
            }
        }
        let written = write_batch(engine, inode, &batch, &mut size_may_grow);
        drop(batch);
        if written.is_ok() && inode.drops_behind() {
            // Another cache holds these pages: the engine keeps no second
            // copy once they are on disk.
            inode.drop_behind_range(batch_start, batch_end, u64::MAX);
        }
        cursor = next_cursor;
        // Throttled writers may go on as soon as a batch is clean.
        engine.cache.note_progress();
        if result.is_ok() {
            result = written;
        }
    }
    if result.is_ok() && inode.dirty_bytes() == 0 {
        settle_disk_size(engine, inode)?;
    }
    result
}

/// Writes back every file with dirty data (syncfs, close).
pub fn write_back_all(engine: &Engine) -> Result<()> {
    write_back_files(engine, engine.cache.dirty_inodes(), Duration::ZERO)
}

/// The flusher's pass when woken (dirty data above the background
/// threshold, memory short): every file with dirty data, less the folio a
/// writer is filling (see [`InodeCache::folio_being_filled`]). A folio left
/// out stays dirty, so the on-disk size stops below it, and integrity
/// writeback (fsync, syncfs, close) never leaves anything out.
pub fn write_back_background(engine: &Engine) -> Result<()> {
    write_back_files(engine, engine.cache.dirty_inodes(), SPARE_FILLING_MAX)
}

/// The flusher's pass at its interval: the files whose data has been dirty
/// for `dirty_expire_ms` or longer, as the kernel's periodic writeback, so
/// a file rewritten or removed within that time costs no write, and one
/// just dirtied is not cut into small writebacks. A file's age counts from
/// when it went from clean to dirty, not from its last write, so one
/// written to all the time still goes out (at every pass once it is old
/// enough, for as long as it never comes clean).
pub fn write_back_expired(engine: &Engine) -> Result<()> {
    write_back_files(engine, engine.cache.expired_dirty_inodes(), SPARE_FILLING_MAX)
}

/// `inodes` whole; the first error is returned. Small files go in groups
/// ([`write_group`]); the others, and those a group could not take, one
/// by one afterwards (a group holds its files' writeback locks, so it may
/// only try another's, never wait for it).
fn write_back_files(
    engine: &Engine,
    inodes: Vec<Arc<InodeCache>>,
    spare_filling_max: Duration,
) -> Result<()> {
    let mut result = Ok(());
    let mut keep_first_error = |written: Result<()>| {
        if result.is_ok() {
            result = written;
        }
    };
    let mut alone = Vec::new();
    let mut group = Vec::new();
    let mut group_bytes = 0;
    for inode in &inodes {
        let Some(member) = group_member(engine, inode, spare_filling_max) else {
            alone.push(inode);
            continue;
        };
        group_bytes += member.dirty_bytes;
        group.push(member);
        if group.len() == GROUP_FILES_MAX || group_bytes >= GROUP_DIRTY_BYTES_MAX {
            keep_first_error(write_group(engine, std::mem::take(&mut group)));
            group_bytes = 0;
        }
        debug_assert!(group.len() < GROUP_FILES_MAX && group_bytes < GROUP_DIRTY_BYTES_MAX);
    }
    if !group.is_empty() {
        keep_first_error(write_group(engine, group));
    }
    for inode in alone {
        keep_first_error(write_back_sparing(engine, inode, 0, u64::MAX, spare_filling_max));
    }
    result
}

/// A small file of a group, its writeback lock held and its dirty folios
/// found.
struct GroupMember<'a> {
    inode: &'a InodeCache,
    _serial: WritebackGuard<'a>,
    folios: Vec<Arc<Folio>>,
    dirty_bytes: u64,
}

/// `inode` as a group member, if it is small, its writeback lock free, and
/// nothing asks for more than [`write_back_sparing`]'s one whole-file
/// batch: a freed file, one gone clean, or one with a folio to spare
/// (open, in a background pass) is written alone.
fn group_member<'a>(
    engine: &Engine,
    inode: &'a InodeCache,
    spare_filling_max: Duration,
) -> Option<GroupMember<'a>> {
    let dirty_bytes = inode.dirty_bytes();
    if dirty_bytes == 0 || dirty_bytes > GROUP_FILE_DIRTY_BYTES_MAX {
        return None;
    }
    let serial = inode.try_lock_writeback()?;
    let open_handles = engine.meta.inode(inode.ino)?.open_handles;
    if (open_handles > 0 && !spare_filling_max.is_zero()) || inode.dirty_bytes() == 0 {
        return None;
    }
    let folios = inode.dirty_folios_from(0, u64::MAX, BATCH_BYTES_MAX);
    (!folios.is_empty()).then_some(GroupMember { inode, _serial: serial, folios, dirty_bytes })
}

/// Several small files' writeback with their requests merged, as the
/// kernel's block plug merges adjacent bios of the files one writeback pass
/// visits: each file's blocks are mapped (delayed allocation places the
/// files one after another), the requests of all of them are sorted by
/// device offset and neighbours joined into one vectored write, and then
/// each file converts and sizes what completed, as alone. A small file
/// written alone cost a device request and its wait each (12,000 files/s
/// of 1 KiB written back, the writers throttled behind it).
fn write_group(engine: &Engine, members: Vec<GroupMember<'_>>) -> Result<()> {
    let prepared: Vec<Prepared<'_>> = members
        .iter()
        .map(|member| prepare_batch(engine, member.inode, &member.folios, true))
        .collect();
    let outcomes = write_prepared(engine, &prepared);
    // One outcome list per member: the zip below leaves none out.
    debug_assert_eq!(outcomes.len(), members.len());
    let mut result = Ok(());
    for ((member, batch), outcomes) in members.iter().zip(prepared).zip(outcomes) {
        let (written, _) = finish_batch(engine, member.inode, batch, outcomes);
        let inode = member.inode;
        if let (true, Some(first), Some(last)) =
            (written.is_ok() && inode.drops_behind(), member.folios.first(), member.folios.last())
        {
            inode.drop_behind_range(first.pos(), last.end(), u64::MAX);
        }
        let written = written.and_then(|()| {
            if inode.dirty_bytes() == 0 {
                settle_disk_size(engine, inode)
            } else {
                Ok(())
            }
        });
        if result.is_ok() {
            result = written;
        }
    }
    engine.cache.note_progress();
    result
}

/// Writes the requests of prepared batches (one file's, or a group's):
/// sorted by device offset, neighbours joined into one vectored write, at
/// most `REQUEST_BYTES_MAX` and `SLICES_PER_REQUEST_MAX` each; each batch's
/// outcomes in its requests' order. A joined request of several files that
/// fails is written again part by part, so one file's bad block does not
/// fail its neighbours' writeback (and their next fsync); one file's parts
/// fail together, as one request of theirs would.
fn write_prepared(engine: &Engine, batches: &[Prepared<'_>]) -> Vec<Vec<std::io::Result<()>>> {
    let mut parts: Vec<(usize, usize)> = batches
        .iter()
        .enumerate()
        .flat_map(|(file, batch)| (0..batch.requests.len()).map(move |request| (file, request)))
        .collect();
    parts.sort_by_key(|&(file, request)| batches[file].requests[request].dev_offset);
    let mut merged: Vec<MergedRequest<'_>> = Vec::new();
    for (file, index) in parts {
        let request = &batches[file].requests[index];
        let slices = batches[file].slices(request);
        match merged.last_mut() {
            Some(last)
                if last.dev_offset + last.bytes == request.dev_offset
                    && last.bytes + request.bytes <= REQUEST_BYTES_MAX
                    && last.slices.len() + slices.len() <= SLICES_PER_REQUEST_MAX =>
            {
                last.bytes += request.bytes;
                last.slices.extend(slices);
                last.parts.push((file, index));
            }
            _ => merged.push(MergedRequest {
                dev_offset: request.dev_offset,
                bytes: request.bytes,
                slices,
                parts: vec![(file, index)],
            }),
        }
    }
    // Joined within the bounds each request kept alone.
    debug_assert!(merged.iter().all(|request| {
        request.bytes <= REQUEST_BYTES_MAX
            && request.slices.len() <= SLICES_PER_REQUEST_MAX
            && !request.parts.is_empty()
    }));
    let throttle = engine.cache.throttle();
    throttle.writeback_started();
    let merged_outcomes = issue_each(merged.len(), |index| {
        let request = &merged[index];
        engine.device.write_vectored(request.dev_offset, &request.slices, false)
    });
    debug_assert_eq!(merged_outcomes.len(), merged.len());
    let mut outcomes: Vec<Vec<Option<std::io::Result<()>>>> =
        batches.iter().map(|batch| (0..batch.requests.len()).map(|_| None).collect()).collect();
    for (request, outcome) in merged.iter().zip(merged_outcomes) {
        let (first_file, _) = request.parts[0];
        let one_file = request.parts.iter().all(|&(file, _)| file == first_file);
        match outcome {
            Err(_) if !one_file => {
                for &(file, index) in &request.parts {
                    let part = &batches[file].requests[index];
                    let slices = batches[file].slices(part);
                    let outcome = engine.device.write_vectored(part.dev_offset, &slices, false);
                    outcomes[file][index] = Some(outcome);
                }
            }
            outcome => {
                for &(file, index) in &request.parts {
                    outcomes[file][index] = Some(copy_outcome(&outcome));
                }
            }
        }
    }
    let outcomes: Vec<Vec<std::io::Result<()>>> = outcomes
        .into_iter()
        .map(|batch| batch.into_iter().map(|outcome| outcome.expect("every request ran")).collect())
        .collect();
    let written_bytes: u64 = batches
        .iter()
        .zip(&outcomes)
        .flat_map(|(batch, outcomes)| batch.requests.iter().zip(outcomes))
        .filter(|(_, outcome)| outcome.is_ok())
        .map(|(request, _)| request.bytes)
        .sum();
    throttle.writeback_finished(written_bytes);
    outcomes
}

/// An outcome for each part of a joined request (an I/O error keeps its
/// errno).
fn copy_outcome(outcome: &std::io::Result<()>) -> std::io::Result<()> {
    match outcome {
        Ok(()) => Ok(()),
        Err(error) => Err(error.raw_os_error().map_or_else(
            || std::io::Error::new(error.kind(), error.to_string()),
            std::io::Error::from_raw_os_error,
        )),
    }
}

/// Requests of several files that are neighbours on the device, as one.
struct MergedRequest<'a> {
    dev_offset: u64,
    bytes: u64,
    slices: Vec<IoSlice<'a>>,
    /// (file of the group, its request).
    parts: Vec<(usize, usize)>,
}

/// One file's batch between locking its folios and converting what
/// completed: its folios held, runs mapped and cut into requests.
struct Prepared<'a> {
    held: Vec<Held<'a>>,
    runs: Vec<Run>,
    pieces: Vec<Piece>,
    requests: Vec<Request>,
    failures: Failures,
    size_may_grow: bool,
}

impl Prepared<'_> {
    fn slices(&self, request: &Request) -> Vec<IoSlice<'_>> {
        slices_of(&self.runs[request.run], &self.held, request.skip, request.bytes)
    }
}

/// Locks the dirty folios of a batch, writes their dirty runs, converts what
/// completed, and re-dirties what failed.
fn write_batch(
    engine: &Engine,
    inode: &InodeCache,
    folios: &[Arc<Folio>],
    size_may_grow: &mut bool,
) -> Result<()> {
    let batch = prepare_batch(engine, inode, folios, *size_may_grow);
    let outcomes = write_prepared(engine, std::slice::from_ref(&batch)).pop().expect("one batch");
    let (written, grows) = finish_batch(engine, inode, batch, outcomes);
    *size_may_grow = grows;
    written
}

/// Locks the dirty folios of a batch, takes their dirty bits, and maps
/// their runs (allocating) into requests.
fn prepare_batch<'a>(
    engine: &Engine,
    inode: &InodeCache,
    folios: &'a [Arc<Folio>],
    size_may_grow: bool,
) -> Prepared<'a> {
    let mut held = Vec::new();
    // Blocks promised to the copies of the batch's shared blocks: the
    // copy-on-write allocations of `map_runs` take them, and what they do
    // not take (blocks unshared since they were dirtied) goes back.
    let mut copies = iomap::CopyReservation::adopt(&engine.meta, 0);
    for folio in folios {
        let mut state = folio.write();
        if state.dirty.is_empty() {
            inode.note_clean(folio, &state);
            continue;
        }
        let dirty = inode.take_dirty(folio, &mut state);
        let copy_reserved = state.copy_reserved.take();
        copies.block_count += copy_reserved.count_set() as u64;
        let state = RwLockWriteGuard::downgrade(state);
        held.push(Held { folio, state, dirty, copy_reserved });
    }
    // The dirty count just fell by the batch: a writer throttled above the
    // dirty limit may copy on while the batch is written, instead of
    // sleeping until the whole batch is on disk.
    engine.cache.note_progress();
    // In file order, as `size_growth_end` searches them.
    debug_assert!(held.windows(2).all(|pair| pair[0].folio.pos() < pair[1].folio.pos()));
    let runs = dirty_runs(&held, engine.block_bytes);
    let mut failures = Failures::default();
    let pieces = map_runs(engine, inode.ino, &runs, &mut failures, &mut copies.block_count);
    drop(copies);
    // A run left unwritten: no later run may move the size past it.
    let size_may_grow = size_may_grow && failures.first_error.is_none();
    let requests = split_requests(&pieces, &runs, &held);
    Prepared { held, runs, pieces, requests, failures, size_may_grow }
}

/// After a batch's requests: converts what completed, unlocks, and puts
/// the failed blocks back for the next writeback; the outcome, and whether
/// a later batch may still move the on-disk size.
fn finish_batch(
    engine: &Engine,
    inode: &InodeCache,
    batch: Prepared<'_>,
    outcomes: Vec<std::io::Result<()>>,
) -> (Result<()>, bool) {
    let Prepared { held, runs, pieces, requests, mut failures, mut size_may_grow } = batch;
    finish_pieces(
        engine,
        inode,
        &held,
        &runs,
        &pieces,
        &requests,
        outcomes,
        &mut size_may_grow,
        &mut failures,
    );
    // Unlock, then put the failed blocks back for the next writeback.
    let taken: Vec<(&Folio, BlockBits, BlockBits)> =
        held.into_iter().map(|held| (held.folio, held.dirty, held.copy_reserved)).collect();
    let Some(error) = failures.first_error else { return (Ok(()), size_may_grow) };
    for (folio, dirty, copy_reserved) in taken {
        let mut retry = BlockBits::new(folio.block_count());
        for &(start, end) in &failures.ranges {
            let (first, count) = folio.blocks_of(start, end);
            retry.set_range(first, count);
        }
        retry.intersect_with(&dirty);
        if !retry.is_empty() {
            let mut state = folio.write();
            inode.redirty(folio, &mut state, &retry);
            // The failed copies gave their blocks back: promise them again
            // where free space still can.
            let mut copies = copy_reserved;
            copies.intersect_with(&retry);
            if engine.meta.reserve_copies(copies.count_set() as u64) {
                state.copy_reserved.union_with(&copies);
            }
        }
    }
    inode.record_error(error.to_string());
    (Err(error), size_may_grow)
}

/// What of a batch did not reach the disk.
#[derive(Default)]
struct Failures {
    /// File byte ranges to re-dirty.
    ranges: Vec<(u64, u64)>,
    first_error: Option<Error>,
}

impl Failures {
    fn add(&mut self, start: u64, end: u64, error: Error) {
        self.ranges.push((start, end));
        self.first_error.get_or_insert(error);
    }
}

/// Part of a run inside one mapping: converted once all its requests
/// completed.
struct Piece {
    run: usize,
    /// Byte offset in the run.
    skip: u64,
    bytes: u64,
    mapping: Mapping,
}

/// One device request: part of a piece, within the size and slice limits.
struct Request {
    piece: usize,
    run: usize,
    skip: u64,
    bytes: u64,
    dev_offset: u64,
}

/// Maps every run (allocating delayed and new space), in file order so a
/// file written in order is laid out in order.
/// Copies of shared blocks take `copies_reserved` blocks first; what they
/// left is left there.
fn map_runs(
    engine: &Engine,
    ino: u64,
    runs: &[Run],
    failures: &mut Failures,
    copies_reserved: &mut u64,
) -> Vec<Piece> {
    let mut pieces = Vec::new();
    for (index, run) in runs.iter().enumerate() {
        let mut walk =
            iomap::walk(&engine.meta, ino, run.pos, run.bytes, Intent::Write, engine.block_bytes)
                .paying_copies_with(*copies_reserved);
        let mut mapped_bytes = 0;
        for range in walk.by_ref() {
            match range {
                Ok(range) => {
                    // Runs are whole blocks, so each piece starts its mapping.
                    assert_eq!(range.mapping.offset, run.pos + range.start);
                    assert!(range.start == mapped_bytes, "a gap in the mapping of a run");
                    let mapping = range.mapping;
                    pieces.push(Piece {
                        run: index,
                        skip: range.start,
                        bytes: range.len(),
                        mapping,
                    });
                    mapped_bytes = range.end;
                }
                // The walk ends at its first error.
                Err(error) => failures.add(run.pos + mapped_bytes, run.pos + run.bytes, error),
            }
        }
        *copies_reserved = walk.copies_reserved_left();
    }
    debug_assert!(pieces.iter().all(|piece| piece.bytes > 0));
    pieces
}

/// Cuts pieces into requests of at most `REQUEST_BYTES_MAX` and
/// `SLICES_PER_REQUEST_MAX` buffers.
fn split_requests(pieces: &[Piece], runs: &[Run], held: &[Held<'_>]) -> Vec<Request> {
    let mut requests = Vec::new();
    for (index, piece) in pieces.iter().enumerate() {
        let mut done = 0u64;
        while done < piece.bytes {
            let wanted = (piece.bytes - done).min(REQUEST_BYTES_MAX);
            let slices = slices_of(&runs[piece.run], held, piece.skip + done, wanted);
            let bytes: u64 = slices.iter().map(|slice| slice.len() as u64).sum();
            requests.push(Request {
                piece: index,
                run: piece.run,
                skip: piece.skip + done,
                bytes,
                dev_offset: piece.mapping.dev_offset + done,
            });
            // A request carries at least a block: the walk cannot stall.
            assert!(bytes > 0, "an empty writeback request in piece {index}");
            done += bytes;
        }
        assert!(done == piece.bytes, "piece {index}: {done} of {} bytes requested", piece.bytes);
    }
    requests
}

/// Runs `write` for each of `count` requests straight from folio memory;
/// several at a time (the device is fastest with a few large requests in
/// flight), each blocking on its own thread, so no folio byte is copied.
fn issue_each(
    count: usize,
    write: impl Fn(usize) -> std::io::Result<()> + Sync,
) -> Vec<std::io::Result<()>> {
    if count <= 1 {
        return (0..count).map(&write).collect();
    }
    let next = AtomicUsize::new(0);
    let outcomes: Mutex<Vec<Option<std::io::Result<()>>>> =
        Mutex::new((0..count).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..WRITEBACK_THREADS.min(count) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    break;
                }
                let outcome = write(index);
                outcomes.lock()[index] = Some(outcome);
            });
        }
    });
    let outcomes: Vec<std::io::Result<()>> = outcomes
        .into_inner()
        .into_iter()
        .map(|outcome| outcome.expect("every request ran"))
        .collect();
    debug_assert_eq!(outcomes.len(), count);
    outcomes
}

/// In file order: converts the pieces whose requests all completed and
/// moves the on-disk size with each run's last piece (so a crash shows a
/// run whole or not at all below the size), never past a failure.
#[allow(clippy::too_many_arguments)]
fn finish_pieces(
    engine: &Engine,
    inode: &InodeCache,
    held: &[Held<'_>],
    runs: &[Run],
    pieces: &[Piece],
    requests: &[Request],
    outcomes: Vec<std::io::Result<()>>,
    size_may_grow: &mut bool,
    failures: &mut Failures,
) {
    let ino = inode.ino;
    // An outcome for each request, a request in each piece.
    debug_assert_eq!(requests.len(), outcomes.len());
    debug_assert!(requests.iter().all(|request| request.piece < pieces.len()));
    let mut piece_errors: Vec<Option<std::io::Error>> = (0..pieces.len()).map(|_| None).collect();
    for (request, outcome) in requests.iter().zip(outcomes) {
        if let Err(error) = outcome {
            piece_errors[request.piece].get_or_insert(error);
        }
    }
    for (piece, error) in pieces.iter().zip(piece_errors) {
        let run = &runs[piece.run];
        debug_assert!(piece.skip + piece.bytes <= run.bytes, "a piece past its run");
        let start = run.pos + piece.skip;
        let end = start + piece.bytes;
        if let Some(error) = error {
            *size_may_grow = false;
            if piece.mapping.new {
                // Space allocated for this write goes back.
                let _ = iomap::end_write(
                    &engine.meta,
                    ino,
                    &[(piece.mapping, 0)],
                    engine.block_bytes,
                    |_| {},
                );
            }
            let at = piece.mapping.dev_offset;
            let message = format!("writeback of inode {ino} at device offset {at}");
            failures.add(start, end, Error::io(message, error));
            continue;
        }
        let grow = *size_may_grow && end == run.pos + run.bytes;
        let grow_to = if grow { size_growth_end(engine, inode, held, end) } else { None };
        if let Err(error) = finish_piece(engine, ino, &piece.mapping, piece.bytes, grow_to) {
            *size_may_grow = false;
            failures.add(start, end, error);
        }
    }
    if failures.first_error.is_some() {
        *size_may_grow = false;
    }
}

/// The dirty blocks of the held folios as file-contiguous runs.
fn dirty_runs(held: &[Held<'_>], block_bytes: u64) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (index, folio) in held.iter().enumerate() {
        for (first, count) in folio.dirty.runs() {
            let offset = first * block_bytes as usize;
            let bytes = count * block_bytes as usize;
            let pos = folio.folio.pos() + offset as u64;
            let segment = Segment { held: index, offset, bytes };
            match runs.last_mut() {
                Some(run) if run.pos + run.bytes == pos => {
                    run.bytes += bytes as u64;
                    run.segments.push(segment);
                }
                _ => runs.push(Run { pos, bytes: bytes as u64, segments: vec![segment] }),
            }
        }
    }
    // Runs are whole blocks in ascending file order, never touching (two
    // that touch are one run): what mapping them in order relies on.
    for pair in runs.windows(2) {
        assert!(pair[0].pos + pair[0].bytes < pair[1].pos, "dirty runs out of order or touching");
    }
    for run in &runs {
        assert!(run.pos.is_multiple_of(block_bytes), "dirty run at {} not on a block", run.pos);
        assert!(run.bytes.is_multiple_of(block_bytes), "dirty run of {} bytes", run.bytes);
    }
    runs
}

/// The folio memory of `[run.pos + skip, + bytes)`, capped at
/// `SLICES_PER_REQUEST_MAX` slices (the rest goes in the next request).
fn slices_of<'a>(run: &Run, held: &'a [Held<'a>], skip: u64, bytes: u64) -> Vec<IoSlice<'a>> {
    let mut slices = Vec::new();
    let mut skip = skip as usize;
    let mut wanted = bytes as usize;
    for segment in &run.segments {
        if wanted == 0 {
            break;
        }
        if skip >= segment.bytes {
            skip -= segment.bytes;
            continue;
        }
        let start = segment.offset + skip;
        let length = (segment.bytes - skip).min(wanted);
        // A folio's memory, then zeros for what it does not hold.
        for bytes in held[segment.held].state.io_slices(start, length) {
            if slices.len() == SLICES_PER_REQUEST_MAX {
                return slices;
            }
            debug_assert!(bytes.len() <= wanted, "slices past the bytes wanted");
            slices.push(IoSlice::new(bytes));
            wanted -= bytes.len();
        }
        skip = 0;
    }
    slices
}

/// How far the on-disk size may move with a run that ends at `run_end`:
/// to the run's end, the size callers see, or the first block below them
/// still dirty in a folio outside this batch, whichever comes first; None
/// if not past the on-disk size. A block written back earlier and written
/// again since (an append into the partial last block while this writeback
/// ran) holds its new bytes only in memory: a size moved over it would,
/// after a crash, cover the old bytes where the new ones belong (found by
/// `foliofs crashtest --over-nbd`, whose slow device widened the window:
/// an append-only log showed a hole before its last fsynced append). Ext4
/// keeps this by writing such blocks (its ordered data) before the commit
/// that moves i_disksize; here the size waits for the next writeback.
fn size_growth_end(
    engine: &Engine,
    inode: &InodeCache,
    held: &[Held<'_>],
    run_end: u64,
) -> Option<u64> {
    let (size, disk_size) = {
        let found = engine.meta.inode(inode.ino)?;
        (found.size, found.attrs.size)
    };
    // Writers mark blocks dirty before they grow the size, so every block
    // below `size` that a writer changed is dirty by the time it is read
    // here (or was taken by this batch, whose blocks are all written).
    let end = run_end.min(size);
    if end <= disk_size {
        return None;
    }
    // This batch's folios (in file order) are read-locked by it, their
    // dirty bits taken: skipped, not locked again.
    let in_batch = |folio: &Folio| {
        held.binary_search_by_key(&folio.pos(), |held| held.folio.pos())
            .is_ok_and(|index| std::ptr::eq(held[index].folio, folio))
    };
    let floor = engine.align_down(disk_size);
    let end = inode
        .first_block_with_dirty(floor, end, engine.block_bytes, true, in_batch)
        .map_or(end, |dirty| dirty.min(end));
    (end > disk_size).then_some(end)
}

/// After a piece's write completed: Unwritten blocks become Written and,
/// with `grow_to`, the on-disk size moves up to it (never past the size
/// callers see), in one transaction. A pure overwrite below the on-disk
/// size needs none.
fn finish_piece(
    engine: &Engine,
    ino: u64,
    mapping: &Mapping,
    piece_bytes: u64,
    grow_to: Option<u64>,
) -> Result<()> {
    if mapping.kind != MapKind::Unwritten && grow_to.is_none() {
        return Ok(());
    }
    debug_assert!(piece_bytes > 0 && piece_bytes <= mapping.length);
    iomap::end_write(&engine.meta, ino, &[(*mapping, piece_bytes)], engine.block_bytes, |txn| {
        if let Some(end) = grow_to {
            advance_disk_size(txn, ino, end);
        }
    })?;
    Ok(())
}

/// Moves the on-disk size up to `end`, capped by the size callers see.
pub(crate) fn advance_disk_size(txn: &mut Txn<'_>, ino: u64, end: u64) {
    let Some(inode) = txn.state().inode(ino) else { return };
    let target = inode.size.min(end);
    if target <= inode.attrs.size {
        return;
    }
    // The on-disk size only grows, and never past the size callers see.
    debug_assert!(target > inode.attrs.size && target <= inode.size);
    let mut attrs = inode.attrs;
    attrs.size = target;
    txn.apply(Record::InodeSet { ino, attrs });
}

/// With nothing of the file left dirty, everything below the size callers
/// see is on disk (or a hole), so the on-disk size may catch up with it: the
/// case of writes whose size growth was held back by an earlier failure.
fn settle_disk_size(engine: &Engine, inode: &InodeCache) -> Result<()> {
    let behind = engine.meta.inode(inode.ino).is_some_and(|state| state.size > state.attrs.size);
    // A read-only volume changes nothing, and a read (a direct read's
    // writeback) must not fail for it.
    if !behind || engine.meta.refusal().is_some() {
        return Ok(());
    }
    engine.meta.transact(&[inode.ino], |txn| {
        // Writers mark blocks dirty before they grow the size (under this
        // lock), so no dirty bytes here means the size covers written data.
        if inode.dirty_bytes() == 0 {
            advance_disk_size(txn, inode.ino, u64::MAX);
        }
        Ok(())
    })?;
    Ok(())
}

/// Before direct I/O: writes back the cached range (reads), and for writes
/// also drops it, so neither side sees stale bytes. The caller holds the
/// file's I/O lock, so no buffered write can refill it meanwhile.
pub fn sync_for_direct(
    engine: &Engine,
    inode: &InodeCache,
    pos: u64,
    length: u64,
    invalidate: bool,
) -> Result<()> {
    if !inode.has_folios() {
        return Ok(());
    }
    let end = pos.saturating_add(length);
    write_back(engine, inode, pos, end)?;
    if invalidate {
        let _serial = inode.lock_writeback();
        inode.remove_range(pos, end);
    }
    Ok(())
}

/// After a buffered write that dirtied `bytes`: wake the flusher above the
/// background threshold; above the freerun ceiling sleep as long as the
/// bytes take at the paced share of the measured write bandwidth (see
/// [`crate::cache::DirtyThrottle`]), so writers slow down smoothly before
/// the limit; above the dirty limit wait for the flusher to bring dirty
/// data back under (as balance_dirty_pages sleeps while the flusher works,
/// so copying and writeback overlap), and write this file back alone only
/// if it does not.
pub fn balance_dirty(engine: &Engine, inode: &InodeCache, bytes: u64) {
    let cache = &engine.cache;
    if cache.over_background_threshold() {
        cache.wake_flusher();
    }
    let pause = cache.throttle_pause(bytes);
    if !pause.is_zero() {
        std::thread::sleep(pause);
        cache.throttle().note_pause(pause);
    }
    for _ in 0..THROTTLE_WAIT_STEPS_MAX {
        if !cache.over_dirty_limit() {
            return;
        }
        cache.wake_flusher();
        cache.wait_for_progress(THROTTLE_WAIT_STEP);
    }
    if let Err(error) = write_back(engine, inode, 0, u64::MAX) {
        tracing::warn!("writeback of inode {} while throttled: {error}", inode.ino);
    }
}

/// The background flusher: when dirty data passes the background threshold
/// or memory runs short, writes back every dirty file
/// ([`write_back_background`]); every `interval_ms` (0: only when woken),
/// the files dirty for `dirty_expire_ms` ([`write_back_expired`]).
pub fn spawn_flusher(engine: Weak<Engine>, interval_ms: u64) -> std::io::Result<JoinHandle<()>> {
    let interval = (interval_ms > 0).then(|| Duration::from_millis(interval_ms));
    std::thread::Builder::new().name("foliofs-flush".into()).spawn(move || loop {
        let Some(engine) = engine.upgrade() else { return };
        let written = match engine.cache.flusher_wait(interval) {
            None => return,
            Some(FlusherRound::Woken) => write_back_background(&engine),
            Some(FlusherRound::Interval) => write_back_expired(&engine),
        };
        if let Err(error) = written {
            tracing::error!("background writeback: {error}");
        }
        engine.cache.note_progress();
    })
}
