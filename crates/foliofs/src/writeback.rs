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
//! A failed write leaves its blocks dirty (retried by the next writeback,
//! never dropped) and advances the file's error sequence, which the next
//! fsync of every handle reports once.
//!
//! Folios under writeback are read-locked: readers go on, writers wait. A
//! file's writebacks are serialised by its `writeback_lock`, which truncate
//! and invalidation also take before dropping folios.

use std::io::IoSlice;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{RwLockReadGuard, RwLockWriteGuard};

use crate::cache::{BlockBits, Folio, FolioState, InodeCache};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::Record;
use crate::iomap::{self, Intent, MapKind, Mapping};
use crate::meta::Txn;

/// Folios locked and written as one batch: bounds what one writeback pins.
const BATCH_BYTES_MAX: usize = 64 << 20;
/// Buffers per vectored request (the kernel's IOV_MAX).
const SLICES_PER_REQUEST_MAX: usize = 1024;
/// How long a throttled writer waits for the flusher at most, in steps.
const THROTTLE_WAIT_STEP: Duration = Duration::from_millis(10);
const THROTTLE_WAIT_STEPS_MAX: u32 = 100;

/// A folio held for writeback: read-locked, with the dirty bits it had.
struct Held<'a> {
    folio: &'a Folio,
    state: RwLockReadGuard<'a, FolioState>,
    dirty: BlockBits,
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
    if inode.dirty_bytes() == 0 {
        return Ok(());
    }
    let _serial = inode.writeback_lock.lock();
    if engine.meta.read().inode(inode.ino).is_none() {
        // Freed while cached: its data has nowhere to go.
        inode.remove_range(0, u64::MAX);
        return Ok(());
    }
    let folios = inode.folios_in(start, end);
    let mut size_may_grow = true;
    let mut result = Ok(());
    let mut batch_start = 0;
    let mut batch_bytes = 0;
    for index in 0..folios.len() {
        batch_bytes += folios[index].bytes();
        if batch_bytes >= BATCH_BYTES_MAX || index + 1 == folios.len() {
            let written =
                write_batch(engine, inode, &folios[batch_start..=index], &mut size_may_grow);
            if result.is_ok() {
                result = written;
            }
            batch_start = index + 1;
            batch_bytes = 0;
        }
    }
    if result.is_ok() && start == 0 && end == u64::MAX {
        settle_disk_size(engine, inode)?;
    }
    engine.cache.note_progress();
    result
}

/// Writes back every file with dirty data (syncfs, close, the flusher).
pub fn write_back_all(engine: &Engine) -> Result<()> {
    let mut result = Ok(());
    for inode in engine.cache.dirty_inodes() {
        let written = write_back(engine, &inode, 0, u64::MAX);
        if result.is_ok() {
            result = written;
        }
    }
    result
}

/// Locks the dirty folios of a batch, writes their dirty runs, converts what
/// completed, and re-dirties what failed.
fn write_batch(
    engine: &Engine,
    inode: &InodeCache,
    folios: &[Arc<Folio>],
    size_may_grow: &mut bool,
) -> Result<()> {
    let mut held = Vec::new();
    for folio in folios {
        let mut state = folio.write();
        if state.dirty.is_empty() {
            continue;
        }
        let dirty = inode.take_dirty(&mut state);
        let state = RwLockWriteGuard::downgrade(state);
        held.push(Held { folio, state, dirty });
    }
    let runs = dirty_runs(&held, engine.block_bytes);
    let mut failed: Vec<(u64, u64)> = Vec::new();
    let mut first_error = None;
    for run in &runs {
        if let Err((failed_from, error)) = write_run(engine, inode.ino, run, &held, size_may_grow) {
            *size_may_grow = false;
            failed.push((failed_from, run.pos + run.bytes));
            first_error.get_or_insert(error);
        }
    }
    // Unlock, then put the failed blocks back for the next writeback.
    let taken: Vec<(&Folio, BlockBits)> =
        held.into_iter().map(|held| (held.folio, held.dirty)).collect();
    if let Some(error) = first_error {
        for (folio, dirty) in taken {
            let mut retry = BlockBits::new(folio.block_count());
            for &(start, end) in &failed {
                let (first, count) = folio.blocks_of(start, end);
                retry.set_range(first, count);
            }
            retry.intersect_with(&dirty);
            if !retry.is_empty() {
                inode.redirty(&mut folio.write(), &retry);
            }
        }
        inode.record_error(error.to_string());
        return Err(error);
    }
    Ok(())
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
    runs
}

/// Writes one run, piece by piece as the mapping allows. On failure returns
/// the file offset from which the run was not written, and the error.
fn write_run(
    engine: &Engine,
    ino: u64,
    run: &Run,
    held: &[Held<'_>],
    size_may_grow: &mut bool,
) -> std::result::Result<(), (u64, Error)> {
    let mut done = 0u64;
    while done < run.bytes {
        let pos = run.pos + done;
        let fail = |error| (pos, error);
        let mapping = iomap::begin(
            &engine.meta,
            ino,
            pos,
            run.bytes - done,
            Intent::Write,
            engine.block_bytes,
        )
        .map_err(fail)?;
        debug_assert_eq!(mapping.offset, pos);
        let slices = slices_of(run, held, done, mapping.end().min(run.pos + run.bytes) - pos);
        let piece_bytes: u64 = slices.iter().map(|slice| slice.len() as u64).sum();
        if let Err(error) = engine.device.write_vectored(mapping.dev_offset, &slices, false) {
            if mapping.new {
                // Space allocated for this write goes back.
                let _ =
                    iomap::end_write(&engine.meta, ino, &mapping, 0, engine.block_bytes, |_| {});
            }
            let at = mapping.dev_offset;
            return Err(fail(Error::io(
                format!("writeback of inode {ino} at device offset {at}"),
                error,
            )));
        }
        done += piece_bytes;
        // The size moves with the run's last piece: a crash then shows either
        // none of the run or all of it below the size.
        let grow = *size_may_grow && done == run.bytes;
        finish_piece(engine, ino, &mapping, piece_bytes, grow).map_err(fail)?;
    }
    Ok(())
}

/// The folio memory of `[run.pos + skip, + bytes)`, capped at
/// `SLICES_PER_REQUEST_MAX` slices (the rest goes in the next request).
fn slices_of<'a>(run: &Run, held: &'a [Held<'a>], skip: u64, bytes: u64) -> Vec<IoSlice<'a>> {
    let mut slices = Vec::new();
    let mut skip = skip as usize;
    let mut wanted = bytes as usize;
    for segment in &run.segments {
        if wanted == 0 || slices.len() == SLICES_PER_REQUEST_MAX {
            break;
        }
        if skip >= segment.bytes {
            skip -= segment.bytes;
            continue;
        }
        let start = segment.offset + skip;
        let length = (segment.bytes - skip).min(wanted);
        slices.push(IoSlice::new(&held[segment.held].state.data[start..start + length]));
        skip = 0;
        wanted -= length;
    }
    slices
}

/// After a piece's write completed: Unwritten blocks become Written and the
/// on-disk size moves up to the end of the piece (never past the size callers
/// see), in one transaction. A pure overwrite below the on-disk size needs
/// none.
fn finish_piece(
    engine: &Engine,
    ino: u64,
    mapping: &Mapping,
    piece_bytes: u64,
    size_may_grow: bool,
) -> Result<()> {
    let piece_end = mapping.offset + piece_bytes;
    let grows = size_may_grow
        && engine
            .meta
            .read()
            .inode(ino)
            .is_some_and(|inode| inode.size.min(piece_end) > inode.attrs.size);
    if mapping.kind != MapKind::Unwritten && !grows {
        return Ok(());
    }
    iomap::end_write(&engine.meta, ino, mapping, piece_bytes, engine.block_bytes, |txn| {
        if grows {
            advance_disk_size(txn, ino, piece_end);
        }
    })?;
    Ok(())
}

/// Moves the on-disk size up to `end`, capped by the size callers see.
fn advance_disk_size(txn: &mut Txn<'_>, ino: u64, end: u64) {
    let Some(inode) = txn.state().inode(ino) else { return };
    let target = inode.size.min(end);
    if target <= inode.attrs.size {
        return;
    }
    let mut attrs = inode.attrs;
    attrs.size = target;
    txn.apply(Record::InodeSet { ino, attrs });
}

/// With nothing of the file left dirty, everything below the size callers
/// see is on disk (or a hole), so the on-disk size may catch up with it: the
/// case of writes whose size growth was held back by an earlier failure.
fn settle_disk_size(engine: &Engine, inode: &InodeCache) -> Result<()> {
    let behind =
        engine.meta.read().inode(inode.ino).is_some_and(|state| state.size > state.attrs.size);
    if !behind {
        return Ok(());
    }
    engine.meta.transact(|txn| {
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
        let _serial = inode.writeback_lock.lock();
        inode.remove_range(pos, end);
    }
    Ok(())
}

/// After a buffered write: wake the flusher above the background threshold,
/// and above the dirty limit write back this file before returning, then
/// wait (boundedly) for the flusher to bring the rest under the limit.
pub fn balance_dirty(engine: &Engine, inode: &InodeCache) {
    let cache = &engine.cache;
    if cache.over_background_threshold() {
        cache.wake_flusher();
    }
    if !cache.over_dirty_limit() {
        return;
    }
    if let Err(error) = write_back(engine, inode, 0, u64::MAX) {
        tracing::warn!("writeback of inode {} while throttled: {error}", inode.ino);
    }
    for _ in 0..THROTTLE_WAIT_STEPS_MAX {
        if !cache.over_dirty_limit() {
            break;
        }
        cache.wake_flusher();
        cache.wait_for_progress(THROTTLE_WAIT_STEP);
    }
}

/// The background flusher: every `interval_ms` (0: only when woken), or when
/// dirty data passes the background threshold or memory runs short, writes
/// back every dirty file.
pub fn spawn_flusher(engine: Weak<Engine>, interval_ms: u64) -> JoinHandle<()> {
    let interval = (interval_ms > 0).then(|| Duration::from_millis(interval_ms));
    std::thread::Builder::new()
        .name("foliofs-flush".into())
        .spawn(move || loop {
            let Some(engine) = engine.upgrade() else { return };
            if !engine.cache.flusher_wait(interval) {
                return;
            }
            if let Err(error) = write_back_all(&engine) {
                tracing::error!("background writeback: {error}");
            }
            engine.cache.note_progress();
        })
        .expect("spawn the flusher")
}
