//! The buffered I/O path: reads and writes through the folio cache.
//!
//! - read: cached, uptodate blocks are copied out; a miss reads ahead a
//!   window that doubles while the handle reads sequentially, into the
//!   largest folios that fit. Holes, delayed and Unwritten blocks are zeros
//!   without device I/O. The reader waits only for the folios its request
//!   needs: the rest of the window, and while it reads sequentially the
//!   next window, are filled by the engine's background workers (the
//!   kernel's async readahead), so the device reads ahead while the reader
//!   copies.
//! - write (iomap's write_begin / copy / write_end): a missing folio is
//!   sized from the access (the write's length; twice the last size for a
//!   write that continues the previous one), so small files get small
//!   folios and streaming writers large ones; holes are reserved as
//!   delayed allocations first (a full volume fails the write, never the
//!   writeback); only the partially written blocks that are not uptodate are
//!   read, never the whole folio; the copy marks blocks uptodate and dirty
//!   (`dirty=block`) or every uptodate block of the folio dirty
//!   (`dirty=folio`, the behaviour before seed 001); the size grows while
//!   the folio is still locked, so writeback never sees dirty bytes past it.
//! - truncate: writes back what the new on-disk size will cover, drops the
//!   folios from the new end of file on, then shrinks or grows the file.
//!
//! Callers hold the file's I/O lock: shared to read, exclusive to write or
//! truncate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::cache::{BlockBits, Folio, FolioState, InodeCache};
use crate::engine::{Engine, FILE_BYTES_MAX};
use crate::error::{Error, IoContext, Result};
use crate::iomap::{self, MapKind};
use crate::options::DirtyMode;
use crate::passthru::DataPath;
use crate::writeback;

/// First readahead window, and the most it grows to.
const READAHEAD_MIN_BYTES: u64 = 128 << 10;
const READAHEAD_MAX_BYTES: u64 = 4 << 20;

/// A handle's readahead state (the kernel's file_ra_state): where the next
/// sequential read would start, the current window, and where the folios
/// readahead made end (the next window starts there).
#[derive(Debug, Default)]
pub struct Readahead {
    next_pos: AtomicU64,
    window_bytes: AtomicU64,
    ahead_end: AtomicU64,
}

impl Readahead {
    /// Whether a read at `pos` continues the previous one (or starts the
    /// file), as a sequential reader's do.
    fn is_sequential(&self, pos: u64) -> bool {
        pos == 0 || pos == self.next_pos.load(Ordering::Relaxed)
    }

    /// The window for a miss of a read of `request_bytes`: doubled when the
    /// handle reads sequentially, else sized from the request (as the
    /// kernel's get_init_ra_size: four times a small request, twice a
    /// medium one), between the least and the most.
    fn window_for(&self, sequential: bool, request_bytes: u64) -> u64 {
        let previous = self.window_bytes.load(Ordering::Relaxed);
        let window = if sequential && previous > 0 {
            (previous * 2).min(READAHEAD_MAX_BYTES)
        } else {
            let request = request_bytes.max(1).next_power_of_two();
            let scaled = if request <= READAHEAD_MAX_BYTES / 32 {
                request * 4
            } else if request <= READAHEAD_MAX_BYTES / 4 {
                request * 2
            } else {
                READAHEAD_MAX_BYTES
            };
            scaled.clamp(READAHEAD_MIN_BYTES, READAHEAD_MAX_BYTES)
        };
        debug_assert!(window > 0 && window <= READAHEAD_MAX_BYTES, "readahead window {window}");
        self.window_bytes.store(window, Ordering::Relaxed);
        window
    }

    /// The window for a miss that a cached run of `bytes` (history plus
    /// the request) leads to: that many, to a power of two, at most the
    /// most (the kernel's `ra->size = contig_count + req_count`).
    fn window_from_history(&self, bytes: u64) -> u64 {
        let window = bytes.next_power_of_two().min(READAHEAD_MAX_BYTES);
        debug_assert!(window > 0 && window <= READAHEAD_MAX_BYTES, "readahead window {window}");
        self.window_bytes.store(window, Ordering::Relaxed);
        window
    }

    /// A read ending at `end` is done. A plain store, not a swap: cached
    /// reads pass here millions of times a second, and a race between
    /// threads of one handle only misjudges a window.
    fn note_read(&self, end: u64) {
        self.next_pos.store(end, Ordering::Relaxed);
    }
}

/// Where a readahead window of `window` bytes from `start` ends: at a
/// multiple of the window (at most `folio_max`), so that windows tile the
/// file in aligned folios of their size (a boundary off that alignment
/// splits the large folios of every window after it, and their reads),
/// and never past the block holding the end of file.
fn window_end(engine: &Engine, start: u64, window: u64, size: u64) -> u64 {
    let alignment = window.min(engine.cache.policy().folio_max_bytes).max(engine.block_bytes);
    let end = start.saturating_add(window).div_ceil(alignment).saturating_mul(alignment);
    engine.align_up(end.min(size))
}

/// Reads into `buffer` from `pos` of a file of `size` bytes (as the
/// caller's look at the metadata found it, with the file's I/O lock held
/// shared); returns the bytes read (short at EOF).
pub fn read(
    engine: &Engine,
    inode: &Arc<InodeCache>,
    readahead: &Readahead,
    buffer: &mut [u8],
    pos: u64,
    size: u64,
) -> Result<usize> {
    if pos >= size || buffer.is_empty() {
        return Ok(0);
    }
    let total = (buffer.len() as u64).min(size - pos);
    let end = pos + total;
    let sequential = readahead.is_sequential(pos);
    let mut at = pos;
    while at < end {
        let folio = match inode.folio_at(at) {
            Some(folio) => folio,
            None => read_ahead(engine, inode, readahead, sequential, at, end, size)?,
        };
        // The folio found or read holds `at`: each turn copies something.
        debug_assert!(
            folio.pos() <= at && at < folio.end(),
            "folio {}..{} for {at}",
            folio.pos(),
            folio.end()
        );
        let piece_end = end.min(folio.end());
        let out = &mut buffer[(at - pos) as usize..(piece_end - pos) as usize];
        copy_out(engine, inode, &folio, at, out, size)?;
        at = piece_end;
    }
    debug_assert_eq!(at, end);
    readahead.note_read(end);
    if sequential {
        read_ahead_async(engine, inode, readahead, end, size);
    }
    Ok(total as usize)
}

/// The bytes of `[pos, pos + length)` (clipped at the end of file) handed to
/// `consume` where the cache holds them, with how many there were, when one
/// cached folio holds them all uptodate (a request inside a large folio,
/// the usual case once readahead ran); `None` otherwise, and `consume` is
/// not called. The folio stays read-locked while `consume` runs.
pub fn read_in_place<R>(
    engine: &Engine,
    inode: &Arc<InodeCache>,
    readahead: &Readahead,
    pos: u64,
    length: usize,
    size: u64,
    consume: impl FnOnce(&[u8]) -> R,
) -> Result<Option<(R, usize)>> {
    if pos >= size || length == 0 {
        return Ok(None);
    }
    let end = pos + (length as u64).min(size - pos);
    let Some(folio) = inode.folio_at(pos) else { return Ok(None) };
    if end > folio.end() {
        return Ok(None);
    }
    let (first, count) = folio.blocks_of(pos, end);
    let state = folio.read();
    if !state.uptodate.all_set(first, count) {
        return Ok(None);
    }
    let start = (pos - folio.pos()) as usize;
    let bytes = (end - pos) as usize;
    // Zeros past a folio's memory (a small file extended) are not at hand:
    // a copying read makes them.
    let Some(held) = state.in_memory(start, start + bytes) else { return Ok(None) };
    let consumed = consume(held);
    drop(state);
    let sequential = readahead.is_sequential(pos);
    readahead.note_read(end);
    if sequential {
        read_ahead_async(engine, inode, readahead, end, size);
    }
    Ok(Some((consumed, bytes)))
}

/// Copies `out.len()` bytes at `pos` out of `folio`, first filling any of
/// the blocks involved that are not uptodate: all of the folio's if none is
/// (a folio readahead made and a background worker has not filled yet, so
/// it is read whole, in one request, as readahead would have).
fn copy_out(
    engine: &Engine,
    inode: &InodeCache,
    folio: &Folio,
    pos: u64,
    out: &mut [u8],
    size: u64,
) -> Result<()> {
    debug_assert!(
        folio.pos() <= pos && pos + out.len() as u64 <= folio.end(),
        "a copy past its folio"
    );
    let start = (pos - folio.pos()) as usize;
    let (first, count) = folio.blocks_of(pos, pos + out.len() as u64);
    {
        let state = folio.read();
        if state.uptodate.all_set(first, count) {
            state.copy_out(start, out);
            return Ok(());
        }
    }
    let mut state = folio.write();
    if state.uptodate.is_empty() {
        fill_blocks(engine, inode, folio, &mut state, 0, folio.block_count(), size)?;
    } else {
        fill_blocks(engine, inode, folio, &mut state, first, count, size)?;
    }
    state.copy_out(start, out);
    Ok(())
}

/// Creates folios for the readahead window from `pos` (at least up to
/// `request_end`, never past the block holding the end of file), fills
/// those the request needs, has the rest filled in the background (here if
/// that is refused), and returns the one containing `pos`.
///
/// A read that does not continue the handle's last one is judged by the
/// cached blocks right before it, the trace a sequential stream of any
/// handle would leave (the kernel's page_cache_sync_ra): no longer run of
/// them than the request itself makes it a standalone random read, which
/// reads just its own blocks and leaves the readahead state alone (a 4 KiB
/// random read used to read a 128 KiB window, and a file larger than the
/// cache read at a fifth of the rate it does now); a longer run sizes the
/// window from that history, as the kernel does.
fn read_ahead(
    engine: &Engine,
    inode: &Arc<InodeCache>,
    readahead: &Readahead,
    sequential: bool,
    pos: u64,
    request_end: u64,
    size: u64,
) -> Result<Arc<Folio>> {
    let block_start = engine.align_down(pos);
    let request_bytes = engine.align_up(request_end) - block_start;
    let history_bytes = if sequential || block_start == 0 {
        None
    } else {
        // As far back as the kernel's page_cache_prev_miss looks (a first
        // window), or past the request when it is larger: enough to tell a
        // stream from a random read, at a few folio lookups.
        let limit = READAHEAD_MIN_BYTES.max(2 * request_bytes).min(READAHEAD_MAX_BYTES);
        Some(cached_run_before(inode, block_start, limit))
    };
    if history_bytes.is_some_and(|history| history <= request_bytes) {
        let end = engine.align_up(request_end.min(size));
        let folios = folios_for_range(engine, inode, block_start, end);
        for folio in &folios {
            let mut state = folio.write();
            fill_blocks(engine, inode, folio, &mut state, 0, folio.block_count(), size)?;
        }
        return Ok(folios.into_iter().next().expect("a request holds the block at pos"));
    }
    let window = match history_bytes {
        Some(history) => readahead.window_from_history(history + request_bytes),
        None => readahead.window_for(sequential, request_end - pos),
    };
    let end = window_end(engine, pos, window, size).max(engine.align_up(request_end));
    let folios = folios_for_range(engine, inode, engine.align_down(pos), end);
    readahead.ahead_end.store(end, Ordering::Relaxed);
    for folio in &folios {
        // The caller holds the I/O lock: a refused job is not run here (its
        // worker would take the lock again) but done as it was before.
        if folio.pos() >= request_end && fill_in_background(engine, inode, folio) {
            continue;
        }
        let mut state = folio.write();
        fill_blocks(engine, inode, folio, &mut state, 0, folio.block_count(), size)?;
    }
    let first = folios.into_iter().next().expect("a window holds the block at pos");
    debug_assert!(first.pos() <= pos && pos < first.end());
    Ok(first)
}

/// How many bytes right before `pos` are in cached folios, one after
/// another (counted up to `limit`).
fn cached_run_before(inode: &InodeCache, pos: u64, limit: u64) -> u64 {
    let start = pos.saturating_sub(limit);
    let mut at = pos;
    while at > start {
        match inode.folio_at(at - 1) {
            Some(folio) => at = folio.pos().max(start),
            None => break,
        }
    }
    debug_assert!(start <= at && at <= pos);
    pos - at
}

/// The folios covering `[start, end)` (block-aligned), made where none are.
fn folios_for_range(
    engine: &Engine,
    inode: &Arc<InodeCache>,
    start: u64,
    end: u64,
) -> Vec<Arc<Folio>> {
    let mut folios = Vec::new();
    let mut at = start;
    while at < end {
        let folio = engine.cache.folio_for(inode, at, end - at, end);
        // The folio for `at` holds it: the walk moves on every turn.
        debug_assert!(folio.pos() <= at && at < folio.end());
        at = folio.end();
        folios.push(folio);
    }
    folios
}

/// After a sequential read that ended at `end`: once what readahead made
/// ahead of the reader is down to one window or less, the next window (twice
/// as large, up to the most) is made and filled by the background workers,
/// so the device reads it while the reader copies what came before (the
/// kernel's async readahead, started at a PG_readahead folio). A reader that
/// catches up with a folio still being filled waits for it; one that finds
/// a folio not yet started fills it itself. Reads that never missed (a file
/// cached whole) have no readahead ahead of them, and this does nothing.
fn read_ahead_async(
    engine: &Engine,
    inode: &Arc<InodeCache>,
    readahead: &Readahead,
    end: u64,
    size: u64,
) {
    // Another cache reads ahead of the reader (see `fill_in_background`).
    if inode.drops_behind() {
        return;
    }
    let ahead_end = readahead.ahead_end.load(Ordering::Relaxed);
    let window = readahead.window_bytes.load(Ordering::Relaxed);
    if ahead_end < end || ahead_end >= size || ahead_end - end > window {
        return;
    }
    let next_window = (window * 2).min(READAHEAD_MAX_BYTES);
    let next_end = window_end(engine, ahead_end, next_window, size);
    // One reader of a handle shared by threads starts a given window.
    let claimed = readahead.ahead_end.compare_exchange(
        ahead_end,
        next_end,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    if claimed.is_err() {
        return;
    }
    readahead.window_bytes.store(next_window, Ordering::Relaxed);
    for folio in folios_for_range(engine, inode, ahead_end, next_end) {
        // Refused (no workers, a full queue): the reader fills it when it
        // gets there.
        fill_in_background(engine, inode, &folio);
    }
}

/// Queues the filling of `folio` for a background worker; false if that
/// was refused (the job is dropped unrun), and always for a file another
/// cache holds (drop-behind: that cache reads ahead itself, and a folio a
/// job held could not be dropped by the read that finished it).
fn fill_in_background(engine: &Engine, inode: &Arc<InodeCache>, folio: &Arc<Folio>) -> bool {
    if inode.drops_behind() {
        return false;
    }
    let inode = Arc::clone(inode);
    // Weakly: a queued folio stays evictable.
    let folio = Arc::downgrade(folio);
    let job = Box::new(move |engine: &Engine| fill_ahead(engine, &inode, &folio));
    engine.background.submit(job).is_ok()
}

/// A background worker's readahead of one folio, filled as a reader would
/// fill it (under the file's shared I/O lock, so no writer or truncate runs
/// meanwhile) unless it has left the cache since. Errors are left to the
/// reader: the blocks stay not uptodate, and its own read meets the error.
fn fill_ahead(engine: &Engine, inode: &InodeCache, folio: &Weak<Folio>) {
    let _shared = inode.io.shared();
    let Some(folio) = folio.upgrade() else { return };
    let cached = inode.folio_at(folio.pos()).is_some_and(|cached| Arc::ptr_eq(&cached, &folio));
    if !cached {
        return;
    }
    let Ok(size) = engine.size_of(inode.ino) else { return };
    let mut state = folio.write();
    if let Err(error) = fill_blocks(engine, inode, &folio, &mut state, 0, folio.block_count(), size)
    {
        tracing::debug!("readahead of inode {} at {}: {error}", inode.ino, folio.pos());
    }
}

/// Makes blocks `[first, first + count)` of a locked folio uptodate: Written
/// blocks are read from the device (one request per contiguous run), the
/// rest (holes, delayed, Unwritten, past the end of file) are zeros. If a
/// direct write was in flight when the fill began, or started or finished
/// before it ended (direct writes run beside readers), the bytes are left
/// in the folio for this caller but not marked uptodate: they may predate
/// it (`InodeCache::fill_may_cache`).
fn fill_blocks(
    engine: &Engine,
    inode: &InodeCache,
    folio: &Folio,
    state: &mut FolioState,
    first: usize,
    count: usize,
    size: u64,
) -> Result<()> {
    if count == 0 || state.uptodate.all_set(first, count) {
        return Ok(());
    }
    debug_assert!(
        first + count <= folio.block_count(),
        "blocks {first}+{count} of a folio of {}",
        folio.block_count()
    );
    let ino = inode.ino;
    let ticket = inode.fill_began();
    let block = folio.block_bytes();
    let start = folio.pos() + (first * block) as u64;
    let report =
        iomap::report_range(&engine.meta, ino, start, (count * block) as u64, engine.block_bytes)?;
    let mut filled: Vec<(usize, usize)> = Vec::new();
    for range in &report.ranges {
        let mapping = &range.mapping;
        let (map_first, map_count) = folio.blocks_of(start + range.start, start + range.end);
        if mapping.kind != MapKind::Hole {
            state.mapped.set_range(map_first, map_count);
        }
        // Contiguous runs of blocks that are not uptodate.
        let mut block_index = map_first;
        while block_index < map_first + map_count {
            if state.uptodate.get(block_index) {
                block_index += 1;
                continue;
            }
            let run_first = block_index;
            while block_index < map_first + map_count && !state.uptodate.get(block_index) {
                block_index += 1;
            }
            let (run_start, run_end) = (run_first * block, block_index * block);
            let run_pos = folio.pos() + run_start as u64;
            if mapping.kind == MapKind::Written && run_pos < size {
                let dev_offset = mapping.dev_offset + (run_pos - mapping.offset);
                let bytes = folio.bytes_mut(state, run_start, run_end);
                engine
                    .device
                    .read(dev_offset, bytes)
                    .context(|| format!("read of inode {ino} at device offset {dev_offset}"))?;
            } else {
                state.zero(run_start, run_end);
            }
            filled.push((run_first, block_index - run_first));
        }
    }
    if inode.fill_may_cache(ticket) {
        for (run_first, run_count) in filled {
            state.uptodate.set_range(run_first, run_count);
        }
    }
    Ok(())
}

/// Writes `data` at `pos` into the cache; returns the bytes written (short
/// only when space ran out after some were written).
pub fn write(engine: &Engine, inode: &Arc<InodeCache>, data: &[u8], pos: u64) -> Result<usize> {
    let total = data.len() as u64;
    let end = pos
        .checked_add(total)
        .ok_or_else(|| Error::FileTooLarge(format!("inode {}", inode.ino)))?;
    let stream_bytes = inode.write_folio_bytes(pos, total, engine.cache.policy().folio_max_bytes);
    engine.cache.recycle_behind_stream(inode, pos, total);
    let mut done = 0u64;
    while done < total {
        let at = pos + done;
        let size = engine.size_of(inode.ino)?;
        let wanted = (end - at).max(stream_bytes);
        let folio = engine.cache.folio_for(inode, at, wanted, u64::MAX);
        let piece = &data[done as usize..(end.min(folio.end()) - pos) as usize];
        match write_into_folio(engine, inode, &folio, at, piece, size) {
            Ok(written) => {
                debug_assert!(written <= piece.len() as u64);
                done += written;
                if written < piece.len() as u64 {
                    break;
                }
            }
            Err(error) if done == 0 => return Err(error),
            Err(error) => {
                tracing::debug!("short write on inode {} after {done} bytes: {error}", inode.ino);
                break;
            }
        }
    }
    if done > 0 && inode.io.times_due() {
        engine.touch_times(inode.ino);
    }
    Ok(done as usize)
}

/// write_begin, copy and write_end for one folio.
fn write_into_folio(
    engine: &Engine,
    inode: &InodeCache,
    folio: &Folio,
    pos: u64,
    piece: &[u8],
    size: u64,
) -> Result<u64> {
    debug_assert!(
        folio.pos() <= pos && pos + piece.len() as u64 <= folio.end(),
        "a write past its folio"
    );
    let mut state = folio.write();
    let mut length = piece.len() as u64;
    // Only the blocks written in part need their old bytes; read them before
    // reserving space, so a failed read leaves no reservation behind.
    let (first, count) = folio.blocks_of(pos, pos + length);
    if !pos.is_multiple_of(engine.block_bytes) {
        fill_blocks(engine, inode, folio, &mut state, first, 1, size)?;
    }
    if !(pos + length).is_multiple_of(engine.block_bytes) {
        fill_blocks(engine, inode, folio, &mut state, first + count - 1, 1, size)?;
    }
    if !state.mapped.all_set(first, count) {
        length = iomap::reserve(&engine.meta, inode.ino, pos, length, engine.block_bytes)?;
        debug_assert!(length <= piece.len() as u64, "reserved past the write");
        let (first, count) = folio.blocks_of(pos, pos + length);
        state.mapped.set_range(first, count);
    }
    let end = pos + length;
    let (first, count) = folio.blocks_of(pos, end);
    // Every block about to be dirtied has space: mapped, or reserved.
    debug_assert!(state.mapped.all_set(first, count), "dirty blocks with no space for them");
    let dirty_mode = engine.cache.policy().dirty_mode;
    if engine.meta.may_copy_on_write() {
        let mut dirtied = match dirty_mode {
            DirtyMode::Block => BlockBits::new(folio.block_count()),
            DirtyMode::Folio => state.uptodate.clone(),
        };
        dirtied.set_range(first, count);
        dirtied.intersect_with(&state.mapped);
        reserve_copies(engine, inode.ino, folio, &mut state, &dirtied)?;
    }
    let start = (pos - folio.pos()) as usize;
    folio
        .bytes_mut(&mut state, start, start + length as usize)
        .copy_from_slice(&piece[..length as usize]);
    state.uptodate.set_range(first, count);
    match dirty_mode {
        DirtyMode::Block => inode.mark_dirty(folio, &mut state, first, count),
        DirtyMode::Folio => {
            let mut whole = state.uptodate.clone();
            whole.intersect_with(&state.mapped);
            inode.redirty(folio, &mut state, &whole);
        }
    }
    // The size grows before the folio unlocks: writeback (which locks it)
    // then never finds dirty bytes past the size.
    if end > size {
        if let Some(mut found) = engine.meta.inode_mut(inode.ino) {
            found.size = found.size.max(end);
        }
    }
    Ok(length)
}

/// Promises a block to the copy of each of a folio's blocks `dirtied` maps
/// onto shared blocks that has no promise yet (`FolioState::copy_reserved`),
/// before any byte changes: writeback then always finds the space to copy
/// them. The promise goes with the copy writeback makes, or with the folio
/// if it is dropped first.
fn reserve_copies(
    engine: &Engine,
    ino: u64,
    folio: &Folio,
    state: &mut FolioState,
    dirtied: &BlockBits,
) -> Result<()> {
    let folio_block = folio.pos() / engine.block_bytes;
    let mut reserved = state.copy_reserved.clone();
    for (first, count) in dirtied.runs() {
        let runs =
            iomap::blocks_to_copy(&engine.meta, ino, folio_block + first as u64, count as u64)?;
        for (file_block, block_count) in runs {
            debug_assert!(file_block >= folio_block, "a block to copy before its folio");
            reserved.set_range((file_block - folio_block) as usize, block_count as usize);
        }
    }
    // Only added to: what was reserved stays.
    debug_assert!(reserved.count_set() >= state.copy_reserved.count_set());
    let newly = reserved.count_set() - state.copy_reserved.count_set();
    let promised = iomap::reserve_copies(&engine.meta, ino, newly as u64)?;
    promised.take_over();
    state.copy_reserved = reserved;
    Ok(())
}

/// Truncates or extends the file to `new_size`.
pub fn set_size(engine: &Engine, inode: &InodeCache, new_size: u64) -> Result<()> {
    if new_size > FILE_BYTES_MAX {
        return Err(Error::FileTooLarge(format!("inode {}: size {new_size}", inode.ino)));
    }
    let (size, disk_size) = {
        let found = engine
            .meta
            .inode(inode.ino)
            .ok_or_else(|| Error::BadHandle(format!("inode {} is gone", inode.ino)))?;
        (found.size, found.attrs.size)
    };
    let kept_end = new_size.min(size);
    let dropped_from = engine.align_down(kept_end);
    let first_dropped_folio =
        inode.folio_at(dropped_from).map_or(dropped_from, |folio| folio.pos());
    // The new on-disk size must not cover data still only in memory, and the
    // folio holding the new end of file is dropped whole.
    writeback::write_back(engine, inode, disk_size.min(first_dropped_folio), kept_end)?;
    // The step that can fail for want of the device comes before the
    // folios past the new end are dropped: a truncate that fails must leave
    // the file as it was, not without the dirty data it had cached (found
    // by tests/faults/random.rs).
    let data = DataPath::new(engine);
    engine.meta.check_room_for_unmapping(
        inode.ino,
        new_size.div_ceil(engine.block_bytes),
        u64::MAX,
    )?;
    data.zero_block_tail(inode.ino, kept_end)?;
    {
        let _serial = inode.lock_writeback();
        inode.remove_range(dropped_from, u64::MAX);
    }
    data.commit_size(inode.ino, new_size)?;
    Ok(())
}
