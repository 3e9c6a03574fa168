//! The direct I/O path (O_DIRECT): data moves between the caller's buffer
//! and the device without a copy, and without the cache.
//!
//! Locking follows ext4 after the seed 000 patch and XFS's overwrite-only
//! mode: a write runs concurrently (inode lock shared, counted in flight) when
//! it is aligned to the file-system block inside EOF, or when it only
//! overwrites Written blocks inside EOF (`dio_unaligned=overwrite`). Anything
//! else, including every sub-block write with `dio_unaligned=exclusive`,
//! takes the lock exclusively after in-flight direct I/O drains; a sub-block
//! write into a hole or an Unwritten block then zeroes the rest of its blocks
//! in that same exclusive section (through the simple data path).
//!
//! With `dsync` (O_DSYNC), a write that changes no metadata goes out as one
//! FUA write; otherwise its conversion or size change is committed with the
//! journal (flush, then a FUA journal write) before it completes.

use std::cell::Cell;
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::{smallvec, SmallVec};

use crate::cache::InodeCache;
use crate::completion::{self, Completer, IoFuture};
use crate::dev::{AlignedBuf, DevCallback, DevRequest, DevResponse};
use crate::engine::Engine;
use crate::error::{Error, IoContext, Result};
use crate::iomap::{self, Intent, MapKind, MappedRange, Mapping};
use crate::options::DioUnaligned;
use crate::passthru::DataPath;
use crate::writeback;

/// What an asynchronous read or write resolves to: the bytes transferred,
/// and the caller's buffer back, in the `(result, buffer)` order of
/// tokio-uring and the other io_uring crates.
pub type DirectResult = (Result<usize>, AlignedBuf);

/// An asynchronous direct read or write. Its device requests are plugged
/// (held for a batch); polling it while it is not done unplugs them, so a
/// thread that queues many requests and then waits hands them to the kernel
/// in one system call, as the kernel's block plug does at schedule(). A
/// request that continues its handle's previous one stays plugged when
/// polled on a thread that unplugs before it waits (as the FUSE front end's
/// threads do, through `unplug_before_waiting_on_this_thread`).
pub struct DirectFuture {
    inner: IoFuture<DirectResult>,
    engine: Option<Arc<Engine>>,
    /// Told once the write succeeded.
    observer: Option<WriteNote>,
    /// Starts where its handle's previous asynchronous request ended.
    sequential: bool,
}

thread_local! {
    /// See [`unplug_before_waiting_on_this_thread`].
    static UNPLUGS_BEFORE_WAITING: Cell<bool> = const { Cell::new(false) };
}

/// Declares that the calling thread, for the rest of its life, calls
/// [`Device::unplug`](crate::dev::Device::unplug) before it waits for
/// anything but device I/O it submitted (a FUSE ring thread before it waits
/// for the kernel's next requests). A direct read or write it submits that
/// continues the previous one on the same handle then stays plugged until
/// that unplug, instead of going to the kernel at its first poll: the
/// sequential requests of one wake-up reach the kernel in one system call,
/// where the block layer merges neighbours and the device is notified once.
/// Random requests still go at once: holding them gains no merge and delays
/// them (4 KiB random reads at iodepth 64 through the mount ran 9% slower
/// held, docs/bench/history/2026-11-28-mount-max-background.md).
pub fn unplug_before_waiting_on_this_thread() {
    UNPLUGS_BEFORE_WAITING.with(|promised| promised.set(true));
}

/// Told of an asynchronous direct write that succeeded, before its future
/// resolves (the volume reports it as a change).
pub(crate) trait WriteObserver: Send + Sync {
    fn direct_written(&self, ino: u64, pos: u64, written: usize);
}

/// Whom a write's success is told to, and where it wrote: an `Arc` the
/// observer already had, cloned, so no allocation per request.
struct WriteNote {
    observer: Arc<dyn WriteObserver>,
    ino: u64,
    pos: u64,
}

impl DirectFuture {
    fn ready(result: DirectResult) -> Self {
        Self { inner: completion::ready(result), engine: None, observer: None, sequential: false }
    }

    /// Marks the request as continuing its handle's previous one.
    pub(crate) fn sequential(mut self, sequential: bool) -> Self {
        self.sequential = sequential;
        self
    }

    /// Tells `observer` the bytes written at `pos` of `ino` when the write
    /// succeeds, before the future resolves.
    pub(crate) fn observed_by(
        mut self,
        observer: Arc<dyn WriteObserver>,
        ino: u64,
        pos: u64,
    ) -> Self {
        self.observer = Some(WriteNote { observer, ino, pos });
        self
    }

    /// A request refused before it reached the device.
    pub fn failed(buffer: AlignedBuf, error: Error) -> Self {
        Self::ready((Err(error), buffer))
    }
}

impl std::future::Future for DirectFuture {
    type Output = DirectResult;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<DirectResult> {
        let polled = std::pin::Pin::new(&mut self.inner).poll(context);
        match &polled {
            std::task::Poll::Pending => {
                let held = self.sequential && UNPLUGS_BEFORE_WAITING.with(Cell::get);
                if let (Some(engine), false) = (&self.engine, held) {
                    engine.device.unplug();
                }
            }
            std::task::Poll::Ready((Ok(count), _)) => {
                if let Some(note) = self.observer.take() {
                    note.observer.direct_written(note.ino, note.pos, *count);
                }
            }
            std::task::Poll::Ready(_) => {}
        }
        polled
    }
}

/// Refuses requests O_DIRECT would refuse: offset, length and buffer address
/// must be multiples of the device's logical block.
pub fn check_alignment(engine: &Engine, address: usize, length: usize, pos: u64) -> Result<()> {
    let align = u64::from(engine.device.logical_block_bytes());
    let values = [("offset", pos), ("length", length as u64), ("buffer address", address as u64)];
    match values.into_iter().find(|(_, value)| value % align != 0) {
        Some((what, value)) => Err(Error::invalid(format!(
            "direct I/O {what} {value:#x} is not a multiple of the device's logical block ({align} B)"
        ))),
        None => Ok(()),
    }
}

/// A request's pieces: nearly always one, kept inline (no allocation per
/// request).
type Pieces = SmallVec<[MappedRange; 2]>;

/// A direct write counted in flight on its inode from before it invalidates
/// the cache until its data is on the device. Counting first is what keeps
/// a buffered read that races with the write from caching what it read: a
/// fill that ends while the write is in flight, or after it completed (the
/// write generation moved), does not mark its blocks uptodate, and a fill
/// that ended before it is dropped by the invalidation that follows. (The
/// kernel invalidates again once the write completed,
/// kiocb_invalidate_post_direct_write; `finish_write` does that too.)
struct WriteInFlight<'a> {
    inode: &'a InodeCache,
}

impl<'a> WriteInFlight<'a> {
    /// Call under the shared lock, before the write reads the extent map:
    /// it counts as direct I/O for the exclusive lock's drain and as a
    /// write bypassing the cache for buffered fills.
    fn start(inode: &'a InodeCache) -> Self {
        inode.io.dio_started();
        inode.bypass_write_started();
        Self { inode }
    }

    /// The completion of the device requests ends it now (`write_in_flight_ended`).
    fn hand_to_completion(self) {
        std::mem::forget(self);
    }
}

impl Drop for WriteInFlight<'_> {
    fn drop(&mut self) {
        write_in_flight_ended(self.inode);
    }
}

/// Ends a write `WriteInFlight` started, once it has dropped its range from
/// the cache: fills see it finished before the exclusive lock's drain does.
fn write_in_flight_ended(inode: &InodeCache) {
    inode.bypass_write_finished();
    inode.io.dio_finished();
}

/// How a write may run, decided under the shared lock.
struct WritePlan {
    /// Every block touched is Written, none shared, and the write ends
    /// inside EOF: no allocation, conversion, zeroing or size change.
    pure_overwrite: bool,
    /// Some block touched is shared with another file (a clone's): the
    /// write goes to new space, copying what it does not cover, and runs
    /// alone, so that no two writers copy one block.
    touches_shared: bool,
    /// Whole blocks and inside EOF.
    aligned_inside_eof: bool,
    /// The pieces, when `pure_overwrite` (no allocation was needed to know them).
    pieces: Pieces,
}

impl WritePlan {
    fn may_share(&self, policy: DioUnaligned) -> bool {
        !self.touches_shared
            && (self.aligned_inside_eof
                || (self.pure_overwrite && policy == DioUnaligned::Overwrite))
    }

    fn may_skip_zeroing(&self) -> bool {
        self.aligned_inside_eof || self.pure_overwrite
    }
}

fn plan_write(engine: &Engine, ino: u64, pos: u64, length: u64) -> Result<WritePlan> {
    debug_assert!(length > 0, "empty writes return before they are planned");
    let report = iomap::report_range(&engine.meta, ino, pos, length, engine.block_bytes)?;
    let end = pos + length;
    let inside_eof = end <= report.size;
    let aligned = pos.is_multiple_of(engine.block_bytes) && end.is_multiple_of(engine.block_bytes);
    let touches_shared = report.ranges.iter().any(|range| range.mapping.shared);
    let pure_overwrite = inside_eof
        && !touches_shared
        && report.ranges.iter().all(|range| range.mapping.kind == MapKind::Written);
    // A pure overwrite's pieces are the report's: no allocation to wait for.
    let pieces = if pure_overwrite { report.ranges } else { Pieces::new() };
    Ok(WritePlan {
        pure_overwrite,
        touches_shared,
        aligned_inside_eof: aligned && inside_eof,
        pieces,
    })
}

/// The pieces a write runs with: those the plan found, or freshly mapped.
fn pieces_for(
    engine: &Engine,
    ino: u64,
    pos: u64,
    length: u64,
    plan: &mut WritePlan,
) -> Result<Pieces> {
    if plan.pure_overwrite {
        let pieces = std::mem::take(&mut plan.pieces);
        assert_pieces_cover(&pieces, length, ino, pos);
        return Ok(pieces);
    }
    // Holes become Unwritten space as the walk reaches them.
    let mut pieces = Pieces::new();
    for range in iomap::walk(&engine.meta, ino, pos, length, Intent::Write, engine.block_bytes) {
        match range {
            Ok(range) => pieces.push(range),
            Err(error) => {
                // What the walk allocated before it failed (ENOSPC part way)
                // goes back, as a write that did not complete gives it back.
                let allocated: SmallVec<[(Mapping, u64); 2]> = pieces
                    .iter()
                    .filter(|piece| piece.mapping.new)
                    .map(|piece| (piece.mapping, 0))
                    .collect();
                if !allocated.is_empty() {
                    iomap::end_write(&engine.meta, ino, &allocated, engine.block_bytes, |_| {})?;
                }
                return Err(error);
            }
        }
    }
    assert_pieces_cover(&pieces, length, ino, pos);
    Ok(pieces)
}

/// What a write's pieces promise the submission: they cover the request's
/// `length` bytes in order, with neither gap nor overlap, and each has
/// device space to write to.
fn assert_pieces_cover(pieces: &[MappedRange], length: u64, ino: u64, pos: u64) {
    let mut covered = 0;
    for piece in pieces {
        assert!(
            piece.start == covered,
            "inode {ino}: write at {pos}: piece {piece:?} after {covered}"
        );
        assert!(piece.end > piece.start, "inode {ino}: write at {pos}: empty piece {piece:?}");
        assert!(piece.mapping.kind != MapKind::Hole, "inode {ino}: write at {pos} into a hole");
        assert!(
            piece.mapping.kind != MapKind::Delalloc,
            "inode {ino}: write at {pos} into unallocated space"
        );
        covered = piece.end;
    }
    assert!(covered == length, "inode {ino}: write at {pos}: {covered} of {length} bytes mapped");
}

/// After the device completed (or failed) the pieces of a write under the
/// shared or exclusive lock: converts what was written, gives back what was
/// allocated and not written, moves the on-disk size up to the write's end,
/// advances the times, and with `dsync` makes the write durable (a pure
/// overwrite that went out with FUA, `fua_sent`, already is).
fn finish_write(
    engine: &Engine,
    inode: &InodeCache,
    ino: u64,
    pieces: &[MappedRange],
    written: bool,
    dsync: bool,
    fua_sent: bool,
) -> Result<()> {
    debug_assert!(!fua_sent || (dsync && written), "FUA is sent for O_DSYNC writes only");
    // Only whole-block writes reach Unwritten space here, so such a piece
    // starts at its mapping and covers whole blocks.
    let completions: SmallVec<[(Mapping, u64); 2]> = pieces
        .iter()
        .filter(|piece| piece.mapping.kind == MapKind::Unwritten)
        .map(|piece| {
            let completed =
                if written { engine.align_up(piece.len()).min(piece.mapping.length) } else { 0 };
            (piece.mapping, completed)
        })
        .collect();
    // The file bytes written (pieces are never holes: their device offsets
    // place them in the file).
    let file_range = pieces.first().zip(pieces.last()).map(|(first, last)| {
        let start = first.mapping.offset + (first.dev_offset - first.mapping.dev_offset);
        (start, start + (last.end - first.start))
    });
    // A write inside the size callers see but past the on-disk size (a
    // buffered write further on not yet written back) must move the
    // on-disk size to its end, as ext4 moves i_disksize: else its data
    // sits past the size on disk, lost to a crash even after O_DSYNC
    // returned (found by `foliofs crashtest`). Everything below it was
    // written back first (`sync_for_direct`).
    let grows_disk_size = written
        && file_range.is_some_and(|(_, end)| {
            engine.meta.inode(ino).is_some_and(|found| found.attrs.size < end.min(found.size))
        });
    // The conversions and the size in one transaction.
    let lsn = if completions.is_empty() && !grows_disk_size {
        None
    } else {
        Some(iomap::end_write(&engine.meta, ino, &completions, engine.block_bytes, |txn| {
            if let (true, Some((_, end))) = (grows_disk_size, file_range) {
                writeback::advance_disk_size(txn, ino, end);
            }
        })?)
    };
    if !written {
        return Ok(());
    }
    if let Some((start, end)) = file_range {
        if inode.has_folios() {
            // A buffered read racing with this write may have cached old bytes.
            inode.remove_clean_range(start, end);
        }
    }
    if inode.io.times_due() {
        engine.touch_times(ino);
    }
    if !dsync {
        return Ok(());
    }
    // The blocks are reachable only through records (their allocation and
    // conversion, the size, the file's name) that an earlier writeback or
    // direct write may have left uncommitted; a FUA write alone is durable
    // only when those are, as iomap writes through with FUA only when the
    // inode has no dirty metadata (found by `foliofs crashtest`: a
    // writeback for this very write converted the blocks, the FUA overwrite
    // returned, and a crash lost the file).
    let data_lsn = engine.meta.inode(ino).map_or(0, |found| found.data_lsn);
    let lsn = lsn.unwrap_or(0).max(data_lsn);
    if lsn > engine.meta.journal().durable_lsn() {
        return engine.meta.make_durable(lsn, None);
    }
    if fua_sent {
        return Ok(());
    }
    // Aligned overwrites with nothing to commit, written without FUA.
    engine
        .meta
        .journal()
        .flush_data()
        .map_err(|message| Error::io(message, std::io::Error::from_raw_os_error(libc::EIO)))
}

/// Blocking direct write of `data` (address-aligned) at `pos`.
pub fn write(
    engine: &Engine,
    inode: &InodeCache,
    ino: u64,
    data: &[u8],
    pos: u64,
    dsync: bool,
) -> Result<usize> {
    check_alignment(engine, data.as_ptr() as usize, data.len(), pos)?;
    if data.is_empty() {
        return Ok(0);
    }
    pos.checked_add(data.len() as u64)
        .ok_or_else(|| Error::FileTooLarge(format!("inode {ino}")))?;
    {
        let _shared = inode.io.shared();
        let _in_flight = WriteInFlight::start(inode);
        writeback::sync_for_direct(engine, inode, pos, data.len() as u64, true)?;
        let mut plan = plan_write(engine, ino, pos, data.len() as u64)?;
        if plan.may_share(engine.options.dio_unaligned) {
            return write_mapped(engine, inode, ino, data, pos, dsync, &mut plan);
        }
    }
    let _exclusive = inode.io.exclusive(|| engine.device.unplug());
    writeback::sync_for_direct(engine, inode, pos, data.len() as u64, true)?;
    write_alone(engine, inode, ino, data, pos, dsync)
}

/// The write under the exclusive lock: one that needs no zeroing goes
/// straight to the device; anything else zeroes partial blocks and updates
/// the size through the simple data path.
fn write_alone(
    engine: &Engine,
    inode: &InodeCache,
    ino: u64,
    data: &[u8],
    pos: u64,
    dsync: bool,
) -> Result<usize> {
    debug_assert!(inode.io.is_exclusive(), "a write that runs alone without the exclusive lock");
    let mut plan = plan_write(engine, ino, pos, data.len() as u64)?;
    if plan.may_skip_zeroing() {
        return write_mapped(engine, inode, ino, data, pos, dsync, &mut plan);
    }
    let written = DataPath::new(engine).write(ino, data, pos)?;
    if dsync {
        let lsn = engine.meta.inode(ino).map_or(0, |inode| inode.data_lsn);
        engine.meta.make_durable(lsn, None)?;
    }
    Ok(written)
}

/// Writes `data` piece by piece straight from the caller's buffer.
fn write_mapped(
    engine: &Engine,
    inode: &InodeCache,
    ino: u64,
    data: &[u8],
    pos: u64,
    dsync: bool,
    plan: &mut WritePlan,
) -> Result<usize> {
    let pieces = pieces_for(engine, ino, pos, data.len() as u64, plan)?;
    let fua = dsync && plan.pure_overwrite;
    for (index, piece) in pieces.iter().enumerate() {
        let result = engine.device.write(piece.dev_offset, &data[piece.bytes()], fua);
        if let Err(error) = result {
            finish_write(engine, inode, ino, &pieces[..index], true, false, false)?;
            finish_write(engine, inode, ino, &pieces[index..], false, false, false)?;
            return Err(Error::io(
                format!("direct write at device offset {}", piece.dev_offset),
                error,
            ));
        }
    }
    finish_write(engine, inode, ino, &pieces, true, dsync, fua)?;
    Ok(data.len())
}

/// Blocking direct read into `buffer` (address-aligned) from `pos`; returns
/// the bytes read, fewer at end of file.
pub fn read(
    engine: &Engine,
    inode: &InodeCache,
    ino: u64,
    buffer: &mut [u8],
    pos: u64,
) -> Result<usize> {
    check_alignment(engine, buffer.as_ptr() as usize, buffer.len(), pos)?;
    let _shared = inode.io.shared();
    writeback::sync_for_direct(engine, inode, pos, buffer.len() as u64, false)?;
    let Some((count, pieces)) = read_pieces(engine, ino, buffer.len(), pos)? else { return Ok(0) };
    debug_assert!(count <= buffer.len());
    for piece in pieces {
        let out = &mut buffer[piece.bytes()];
        if piece.mapping.reads_as_zeros() {
            out.fill(0);
        } else {
            let dev_offset = piece.dev_offset;
            engine
                .device
                .read(dev_offset, out)
                .context(|| format!("direct read at device offset {dev_offset}"))?;
        }
    }
    Ok(count)
}

/// The bytes a read of `length` at `pos` returns and the pieces of the
/// sector-aligned range it transfers; None at or past end of file.
fn read_pieces(
    engine: &Engine,
    ino: u64,
    length: usize,
    pos: u64,
) -> Result<Option<(usize, Pieces)>> {
    if length == 0 {
        return Ok(None);
    }
    let report = iomap::report_range(&engine.meta, ino, pos, length as u64, engine.block_bytes)?;
    if pos >= report.size {
        return Ok(None);
    }
    let count = (length as u64).min(report.size - pos);
    let align = u64::from(engine.device.logical_block_bytes());
    let io_length = count.div_ceil(align) * align;
    // The buffer's length is a multiple of the sector (`check_alignment`),
    // so the sectors the read transfers fit in it.
    debug_assert!(count > 0 && count <= io_length && io_length <= length as u64);
    // The transfer ends at the sector holding the last byte before EOF.
    let pieces = report
        .ranges
        .into_iter()
        .take_while(|range| range.start < io_length)
        .map(|range| MappedRange { end: range.end.min(io_length), ..range })
        .collect();
    Ok(Some((count as usize, pieces)))
}

/// Asynchronous direct write of `buffer` at `pos`. Concurrent-eligible writes
/// are submitted and the future completes from the device's completion; a
/// write that must run alone runs now, under the exclusive lock, and the
/// future is ready (as the kernel makes unaligned AIO synchronous). That
/// wait depends on the device alone: requests submitted earlier, by this
/// caller too, complete on the device's threads once `exclusive` unplugs.
pub fn write_async(
    engine: &Arc<Engine>,
    inode: &Arc<InodeCache>,
    ino: u64,
    buffer: AlignedBuf,
    pos: u64,
    dsync: bool,
) -> DirectFuture {
    if let Err(error) = check_alignment(engine, buffer.as_ptr() as usize, buffer.len(), pos) {
        return DirectFuture::failed(buffer, error);
    }
    if buffer.is_empty() {
        return DirectFuture::ready((Ok(0), buffer));
    }
    let length = buffer.len() as u64;
    // As the blocking write: a range past u64::MAX is a user's error, not
    // an overflow in planning it.
    if pos.checked_add(length).is_none() {
        return DirectFuture::failed(buffer, Error::FileTooLarge(format!("inode {ino}")));
    }
    {
        let _shared = inode.io.shared();
        let in_flight = WriteInFlight::start(inode);
        let mut plan = match writeback::sync_for_direct(engine, inode, pos, length, true)
            .and_then(|()| plan_write(engine, ino, pos, length))
        {
            Ok(plan) => plan,
            Err(error) => return DirectFuture::failed(buffer, error),
        };
        if plan.may_share(engine.options.dio_unaligned) {
            let pieces = match pieces_for(engine, ino, pos, length, &mut plan) {
                Ok(pieces) => pieces,
                Err(error) => return DirectFuture::failed(buffer, error),
            };
            in_flight.hand_to_completion();
            // Submitted before the shared lock goes: an exclusive holder
            // then finds every request it drains in the device's hands.
            return submit_write(engine, inode, ino, buffer, pieces, dsync, plan.pure_overwrite);
        }
    }
    let _exclusive = inode.io.exclusive(|| engine.device.unplug());
    let result = writeback::sync_for_direct(engine, inode, pos, length, true)
        .and_then(|()| write_alone(engine, inode, ino, &buffer, pos, dsync));
    DirectFuture::ready((result, buffer))
}

/// The buffers a caller's device requests handed back, in their order:
/// inline for the one request of nearly every caller.
type Returned = SmallVec<[Option<AlignedBuf>; 1]>;

/// A caller's device requests: nearly always one, kept inline.
type Requests = SmallVec<[DevRequest; 1]>;

/// Finishes one caller's request once all its device requests completed,
/// given the buffers they handed back and the first failure.
type Finish = Box<dyn FnOnce(Returned, Option<std::io::Error>) + Send>;

/// Submits `requests` and runs `finish` when the last one completes. A
/// single request (the common case) needs no shared bookkeeping, and its
/// `finish` goes into the device's callback as it is: one allocation.
fn submit_group<F>(engine: &Engine, mut requests: Requests, finish: F)
where
    F: FnOnce(Returned, Option<std::io::Error>) + Send + 'static,
{
    match requests.len() {
        0 => finish(Returned::new(), None),
        1 => {
            let request = requests.pop().expect("one request");
            engine.device.submit_plugged(request, move |response: DevResponse| {
                finish(smallvec![response.buffer], response.result.err())
            });
        }
        count => submit_many(engine, requests, count, Box::new(finish)),
    }
}

struct GroupState {
    remaining: usize,
    failure: Option<std::io::Error>,
    returned: Returned,
    finish: Option<Finish>,
}

fn submit_many(engine: &Engine, requests: Requests, count: usize, finish: Finish) {
    debug_assert!(count >= 2 && requests.len() == count);
    let group = Arc::new(Mutex::new(GroupState {
        remaining: count,
        failure: None,
        returned: (0..count).map(|_| None).collect(),
        finish: Some(finish),
    }));
    for (index, request) in requests.into_iter().enumerate() {
        let group = Arc::clone(&group);
        let callback: DevCallback = Box::new(move |response: DevResponse| {
            let mut state = group.lock();
            if let Err(error) = response.result {
                state.failure.get_or_insert(error);
            }
            debug_assert!(
                state.remaining > 0 && state.returned[index].is_none(),
                "completed twice"
            );
            state.returned[index] = response.buffer;
            state.remaining -= 1;
            if state.remaining > 0 {
                return;
            }
            let finish = state.finish.take().expect("finished once");
            let returned = std::mem::take(&mut state.returned);
            let failure = state.failure.take();
            drop(state);
            finish(returned, failure);
        });
        engine.device.submit_plugged(request, callback);
    }
}

fn submit_write(
    engine: &Arc<Engine>,
    inode: &Arc<InodeCache>,
    ino: u64,
    buffer: AlignedBuf,
    pieces: Pieces,
    dsync: bool,
    pure_overwrite: bool,
) -> DirectFuture {
    let (future, completer) = completion::pair();
    let fua = dsync && pure_overwrite;
    let length = buffer.len();
    // `pieces_for` checked that they cover the buffer.
    debug_assert!(pieces.last().is_some_and(|last| last.end == length as u64));
    // One request carrying the caller's buffer, or a copy per piece.
    let (requests, kept) = if let [piece] = pieces.as_slice() {
        (smallvec![DevRequest::Write { offset: piece.dev_offset, buffer, fua }], None)
    } else {
        let copies = pieces
            .iter()
            .map(|piece| DevRequest::Write {
                offset: piece.dev_offset,
                buffer: AlignedBuf::from_slice(&buffer[piece.bytes()]),
                fua,
            })
            .collect();
        (copies, Some(buffer))
    };
    let (owned_engine, inode) = (Arc::clone(engine), Arc::clone(inode));
    let finish = move |mut returned: Returned, failure: Option<std::io::Error>| {
        let buffer = kept.or_else(|| returned[0].take()).expect("the caller's buffer comes back");
        let finished =
            finish_write(&owned_engine, &inode, ino, &pieces, failure.is_none(), dsync, fua);
        write_in_flight_ended(&inode);
        let result = match (failure, finished) {
            (Some(error), _) => Err(Error::io("direct write", error)),
            (None, Err(error)) => Err(error),
            (None, Ok(())) => Ok(length),
        };
        completer.complete((result, buffer));
    };
    submit_group(engine, requests, finish);
    DirectFuture {
        inner: future,
        engine: Some(Arc::clone(engine)),
        observer: None,
        sequential: false,
    }
}

/// Asynchronous direct read into `buffer` from `pos`.
pub fn read_async(
    engine: &Arc<Engine>,
    inode: &Arc<InodeCache>,
    ino: u64,
    mut buffer: AlignedBuf,
    pos: u64,
) -> DirectFuture {
    if let Err(error) = check_alignment(engine, buffer.as_ptr() as usize, buffer.len(), pos) {
        return DirectFuture::failed(buffer, error);
    }
    // Held until the requests are submitted, as in `write_async`.
    let _shared = inode.io.shared();
    let prepared = writeback::sync_for_direct(engine, inode, pos, buffer.len() as u64, false)
        .and_then(|()| read_pieces(engine, ino, buffer.len(), pos));
    let (count, pieces) = match prepared {
        Err(error) => return DirectFuture::failed(buffer, error),
        Ok(None) => return DirectFuture::ready((Ok(0), buffer)),
        Ok(Some(found)) => found,
    };
    debug_assert!(count <= buffer.len());
    inode.io.dio_started();
    for piece in pieces.iter().filter(|piece| piece.mapping.reads_as_zeros()) {
        buffer[piece.bytes()].fill(0);
    }
    let on_disk: Pieces =
        pieces.into_iter().filter(|piece| !piece.mapping.reads_as_zeros()).collect();
    // The caller's buffer goes to the device when one piece fills all of it.
    let whole = matches!(on_disk.as_slice(), [piece] if piece.bytes() == (0..buffer.len()));
    let (requests, kept) = if whole {
        (smallvec![DevRequest::Read { offset: on_disk[0].dev_offset, buffer }], None)
    } else {
        let reads = on_disk
            .iter()
            .map(|piece| DevRequest::Read {
                offset: piece.dev_offset,
                buffer: AlignedBuf::zeroed(piece.len() as usize),
            })
            .collect();
        (reads, Some(buffer))
    };
    let (future, completer) = completion::pair();
    submit_group(engine, requests, read_finish(Arc::clone(inode), count, on_disk, kept, completer));
    DirectFuture {
        inner: future,
        engine: Some(Arc::clone(engine)),
        observer: None,
        sequential: false,
    }
}

fn read_finish(
    inode: Arc<InodeCache>,
    count: usize,
    on_disk: Pieces,
    kept: Option<AlignedBuf>,
    completer: Completer<DirectResult>,
) -> impl FnOnce(Returned, Option<std::io::Error>) + Send + 'static {
    move |mut returned: Returned, failure| {
        // A request per piece on disk, or the one that took the buffer.
        debug_assert!(kept.is_none() || returned.len() == on_disk.len());
        let buffer = match kept {
            Some(mut buffer) => {
                for (piece, read) in on_disk.iter().zip(&returned) {
                    if let Some(read) = read {
                        buffer[piece.bytes().start..piece.bytes().start + read.len()]
                            .copy_from_slice(read);
                    }
                }
                buffer
            }
            None => returned[0].take().expect("the caller's buffer comes back"),
        };
        inode.io.dio_finished();
        let result = match failure {
            Some(error) => Err(Error::io("direct read", error)),
            None => Ok(count),
        };
        completer.complete((result, buffer));
    }
}
