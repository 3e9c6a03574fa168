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

use std::sync::Arc;

use parking_lot::Mutex;

use crate::completion::{self, IoFuture};
use crate::dev::{AlignedBuf, DevRequest, DevResponse};
use crate::engine::Engine;
use crate::error::{Error, IoContext, Result};
use crate::io_lock::InodeIo;
use crate::iomap::{self, Intent, MapKind, Mapping};
use crate::options::DioUnaligned;
use crate::passthru::DataPath;

/// What an asynchronous read or write resolves to: the caller's buffer back,
/// and the bytes transferred.
pub type DirectResult = (AlignedBuf, Result<usize>);

/// Refuses requests O_DIRECT would refuse: offset, length and buffer address
/// must be multiples of the device's logical block.
pub fn check_alignment(engine: &Engine, address: usize, length: usize, pos: u64) -> Result<()> {
    let align = u64::from(engine.device.logical_block_bytes());
    let misaligned =
        [("offset", pos), ("length", length as u64), ("buffer address", address as u64)]
            .into_iter()
            .find(|(_, value)| value % align != 0);
    match misaligned {
        Some((what, value)) => Err(Error::invalid(format!(
            "direct I/O {what} {value:#x} is not a multiple of the device's logical block ({align} B)"
        ))),
        None => Ok(()),
    }
}

/// Where the cache and direct I/O meet: overlapping folios are written back
/// and dropped before a direct request (the folio cache of the buffered path
/// hooks in here; until then nothing is cached).
fn sync_cached_range(_engine: &Engine, _ino: u64, _pos: u64, _length: u64) -> Result<()> {
    Ok(())
}

/// How a write may run, decided under the shared lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WritePlan {
    /// Every block touched is Written and the write ends inside EOF: no
    /// allocation, conversion, zeroing or size change.
    pure_overwrite: bool,
    /// Whole blocks and inside EOF.
    aligned_inside_eof: bool,
}

impl WritePlan {
    fn may_share(&self, policy: DioUnaligned) -> bool {
        self.aligned_inside_eof || (self.pure_overwrite && policy == DioUnaligned::Overwrite)
    }
}

fn plan_write(engine: &Engine, ino: u64, pos: u64, length: u64) -> Result<WritePlan> {
    let end = pos + length;
    let inside_eof = end <= engine.size_of(ino)?;
    let aligned = pos.is_multiple_of(engine.block_bytes) && end.is_multiple_of(engine.block_bytes);
    let pure_overwrite = inside_eof && all_written(engine, ino, pos, end)?;
    Ok(WritePlan { pure_overwrite, aligned_inside_eof: aligned && inside_eof })
}

fn all_written(engine: &Engine, ino: u64, mut pos: u64, end: u64) -> Result<bool> {
    while pos < end {
        let mapping =
            iomap::begin(&engine.meta, ino, pos, end - pos, Intent::Report, engine.block_bytes)?;
        if mapping.kind != MapKind::Written {
            return Ok(false);
        }
        pos = mapping.end();
    }
    Ok(true)
}

/// One contiguous piece of a request on the device.
#[derive(Debug, Clone, Copy)]
struct Piece {
    mapping: Mapping,
    /// Byte range of the request this piece carries.
    start: usize,
    end: usize,
    dev_offset: u64,
}

/// Maps `[pos, pos + length)` for writing (allocating Unwritten space for
/// holes) or reading, one piece per mapping.
fn map_pieces(
    engine: &Engine,
    ino: u64,
    pos: u64,
    length: u64,
    intent: Intent,
) -> Result<Vec<Piece>> {
    let mut pieces = Vec::new();
    let mut done = 0u64;
    while done < length {
        let at = pos + done;
        let mapping =
            iomap::begin(&engine.meta, ino, at, length - done, intent, engine.block_bytes)?;
        let piece_end = (pos + length).min(mapping.end());
        let dev_offset = mapping.dev_offset + (at - mapping.offset);
        pieces.push(Piece {
            mapping,
            start: done as usize,
            end: (piece_end - pos) as usize,
            dev_offset,
        });
        done = piece_end - pos;
    }
    Ok(pieces)
}

/// After the device completed (or failed) the pieces of a shared write:
/// converts what was written, gives back what was allocated and not written,
/// advances the times, and with `dsync` commits what needs committing.
fn finish_write(
    engine: &Engine,
    ino: u64,
    pieces: &[Piece],
    written: bool,
    dsync: bool,
) -> Result<()> {
    let mut lsn = None;
    for piece in pieces.iter().filter(|piece| piece.mapping.kind == MapKind::Unwritten) {
        // Only whole-block writes reach Unwritten space on the shared path,
        // so a piece starts at its mapping and covers whole blocks.
        let piece_bytes = (piece.end - piece.start) as u64;
        let completed =
            if written { engine.align_up(piece_bytes).min(piece.mapping.length) } else { 0 };
        let mapping = &piece.mapping;
        lsn = Some(iomap::end_write(
            &engine.meta,
            ino,
            mapping,
            completed,
            engine.block_bytes,
            |_| {},
        )?);
    }
    if !written {
        return Ok(());
    }
    engine.touch_times(ino);
    match (dsync, lsn) {
        (true, Some(lsn)) => engine.meta.make_durable(lsn),
        _ => Ok(()),
    }
}

/// Blocking direct write of `data` (address-aligned) at `pos`.
pub fn write(
    engine: &Engine,
    io: &InodeIo,
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
    sync_cached_range(engine, ino, pos, data.len() as u64)?;
    {
        let _shared = io.shared();
        let plan = plan_write(engine, ino, pos, data.len() as u64)?;
        if plan.may_share(engine.options.dio_unaligned) {
            return write_mapped(engine, ino, data, pos, dsync, plan);
        }
    }
    let _exclusive = io.exclusive();
    write_alone(engine, ino, data, pos, dsync)
}

/// The write under the exclusive lock: a pure overwrite goes straight to the
/// device; anything else zeroes partial blocks and updates the size through
/// the simple data path.
fn write_alone(engine: &Engine, ino: u64, data: &[u8], pos: u64, dsync: bool) -> Result<usize> {
    let plan = plan_write(engine, ino, pos, data.len() as u64)?;
    if plan.pure_overwrite || plan.aligned_inside_eof {
        return write_mapped(engine, ino, data, pos, dsync, plan);
    }
    let written = DataPath::new(engine).write(ino, data, pos)?;
    if dsync {
        let lsn = engine.meta.read().inode(ino).map_or(0, |inode| inode.data_lsn);
        engine.meta.make_durable(lsn)?;
    }
    Ok(written)
}

/// Writes `data` piece by piece straight from the caller's buffer.
fn write_mapped(
    engine: &Engine,
    ino: u64,
    data: &[u8],
    pos: u64,
    dsync: bool,
    plan: WritePlan,
) -> Result<usize> {
    let pieces = map_pieces(engine, ino, pos, data.len() as u64, Intent::Write)?;
    let fua = dsync && plan.pure_overwrite;
    for (index, piece) in pieces.iter().enumerate() {
        let result = engine.device.write(piece.dev_offset, &data[piece.start..piece.end], fua);
        if let Err(error) = result {
            finish_write(engine, ino, &pieces[..index], true, false)?;
            finish_write(engine, ino, &pieces[index..], false, false)?;
            return Err(Error::io(
                format!("direct write at device offset {}", piece.dev_offset),
                error,
            ));
        }
    }
    finish_write(engine, ino, &pieces, true, dsync && !plan.pure_overwrite)?;
    if dsync
        && !plan.pure_overwrite
        && !pieces.iter().any(|piece| piece.mapping.kind == MapKind::Unwritten)
    {
        // Aligned overwrite of a mix that needed no conversion: the data
        // still has to reach the disk.
        engine.device.flush_if_needed().context(|| "flush".into())?;
    }
    Ok(data.len())
}

/// Blocking direct read into `buffer` (address-aligned) from `pos`; returns
/// the bytes read, fewer at end of file.
pub fn read(engine: &Engine, io: &InodeIo, ino: u64, buffer: &mut [u8], pos: u64) -> Result<usize> {
    check_alignment(engine, buffer.as_ptr() as usize, buffer.len(), pos)?;
    sync_cached_range(engine, ino, pos, buffer.len() as u64)?;
    let _shared = io.shared();
    let Some((count, io_length)) = read_extent(engine, ino, buffer.len(), pos)? else {
        return Ok(0);
    };
    for piece in map_pieces(engine, ino, pos, io_length, Intent::Read)? {
        let out = &mut buffer[piece.start..piece.end];
        if piece.mapping.reads_as_zeros() {
            out.fill(0);
        } else {
            engine
                .device
                .read(piece.dev_offset, out)
                .context(|| format!("direct read at device offset {}", piece.dev_offset))?;
        }
    }
    Ok(count)
}

/// The bytes a read of `length` at `pos` returns and the aligned length it
/// transfers; None at or past end of file.
fn read_extent(engine: &Engine, ino: u64, length: usize, pos: u64) -> Result<Option<(usize, u64)>> {
    let size = engine.size_of(ino)?;
    if pos >= size || length == 0 {
        return Ok(None);
    }
    let count = (length as u64).min(size - pos);
    let align = u64::from(engine.device.logical_block_bytes());
    Ok(Some((count as usize, count.div_ceil(align) * align)))
}

/// Asynchronous direct write of `buffer` at `pos`. Concurrent-eligible writes
/// are submitted and the future completes from the device's completion; a
/// write that must run alone runs now, under the exclusive lock, and the
/// future is ready (as the kernel makes unaligned AIO synchronous).
pub fn write_async(
    engine: &Arc<Engine>,
    io: &Arc<InodeIo>,
    ino: u64,
    buffer: AlignedBuf,
    pos: u64,
    dsync: bool,
) -> IoFuture<DirectResult> {
    let prepared = (|| {
        check_alignment(engine, buffer.as_ptr() as usize, buffer.len(), pos)?;
        sync_cached_range(engine, ino, pos, buffer.len() as u64)
    })();
    if let Err(error) = prepared {
        return completion::ready((buffer, Err(error)));
    }
    if buffer.is_empty() {
        return completion::ready((buffer, Ok(0)));
    }
    let submitted = {
        let _shared = io.shared();
        match plan_write(engine, ino, pos, buffer.len() as u64) {
            Ok(plan) if plan.may_share(engine.options.dio_unaligned) => {
                match map_pieces(engine, ino, pos, buffer.len() as u64, Intent::Write) {
                    Ok(pieces) => {
                        io.dio_started();
                        Ok(Some((plan, pieces)))
                    }
                    Err(error) => Err(error),
                }
            }
            Ok(_) => Ok(None),
            Err(error) => Err(error),
        }
    };
    match submitted {
        Err(error) => completion::ready((buffer, Err(error))),
        Ok(Some((plan, pieces))) => submit_write(engine, io, ino, buffer, pieces, dsync, plan),
        Ok(None) => {
            let _exclusive = io.exclusive();
            let result = write_alone(engine, ino, &buffer, pos, dsync);
            completion::ready((buffer, result))
        }
    }
}

/// Runs once every device request of one caller's request has completed,
/// with the buffers handed back (by request index) and the first failure.
type GroupFinish = Box<dyn FnOnce(Vec<Option<AlignedBuf>>, Option<std::io::Error>) + Send>;

struct GroupState {
    remaining: usize,
    failure: Option<std::io::Error>,
    returned: Vec<Option<AlignedBuf>>,
    finish: Option<GroupFinish>,
}

/// Submits `requests` and calls `finish` when the last one completes.
fn submit_group(engine: &Engine, requests: Vec<DevRequest>, finish: GroupFinish) {
    if requests.is_empty() {
        return finish(Vec::new(), None);
    }
    let group = Arc::new(Mutex::new(GroupState {
        remaining: requests.len(),
        failure: None,
        returned: (0..requests.len()).map(|_| None).collect(),
        finish: Some(finish),
    }));
    for (index, request) in requests.into_iter().enumerate() {
        let group = Arc::clone(&group);
        engine.device.submit(
            request,
            Box::new(move |response: DevResponse| {
                let mut state = group.lock();
                if let Err(error) = response.result {
                    state.failure.get_or_insert(error);
                }
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
            }),
        );
    }
}

fn submit_write(
    engine: &Arc<Engine>,
    io: &Arc<InodeIo>,
    ino: u64,
    buffer: AlignedBuf,
    pieces: Vec<Piece>,
    dsync: bool,
    plan: WritePlan,
) -> IoFuture<DirectResult> {
    let (future, completer) = completion::pair();
    let fua = dsync && plan.pure_overwrite;
    let length = buffer.len();
    // One request carrying the caller's buffer, or a copy per piece.
    let (requests, kept) = if let [piece] = pieces.as_slice() {
        (vec![DevRequest::Write { offset: piece.dev_offset, buffer, fua }], None)
    } else {
        let copies = pieces
            .iter()
            .map(|piece| DevRequest::Write {
                offset: piece.dev_offset,
                buffer: AlignedBuf::from_slice(&buffer[piece.start..piece.end]),
                fua,
            })
            .collect();
        (copies, Some(buffer))
    };
    let submitter = Arc::clone(engine);
    let (engine, io) = (Arc::clone(engine), Arc::clone(io));
    let finish: GroupFinish = Box::new(move |mut returned, failure| {
        let buffer = kept.or_else(|| returned[0].take()).expect("the caller's buffer comes back");
        let finished =
            finish_write(&engine, ino, &pieces, failure.is_none(), dsync && !plan.pure_overwrite);
        io.dio_finished();
        let result = match (failure, finished) {
            (Some(error), _) => Err(Error::io("direct write", error)),
            (None, Err(error)) => Err(error),
            (None, Ok(())) => Ok(length),
        };
        completer.complete((buffer, result));
    });
    submit_group(&submitter, requests, finish);
    future
}

/// Asynchronous direct read into `buffer` from `pos`.
pub fn read_async(
    engine: &Arc<Engine>,
    io: &Arc<InodeIo>,
    ino: u64,
    mut buffer: AlignedBuf,
    pos: u64,
) -> IoFuture<DirectResult> {
    let prepared = (|| {
        check_alignment(engine, buffer.as_ptr() as usize, buffer.len(), pos)?;
        sync_cached_range(engine, ino, pos, buffer.len() as u64)?;
        let _shared = io.shared();
        let Some((count, io_length)) = read_extent(engine, ino, buffer.len(), pos)? else {
            return Ok(None);
        };
        let pieces = map_pieces(engine, ino, pos, io_length, Intent::Read)?;
        io.dio_started();
        Ok(Some((count, pieces)))
    })();
    let (count, pieces) = match prepared {
        Err(error) => return completion::ready((buffer, Err(error))),
        Ok(None) => return completion::ready((buffer, Ok(0))),
        Ok(Some(found)) => found,
    };
    for piece in pieces.iter().filter(|piece| piece.mapping.reads_as_zeros()) {
        buffer[piece.start..piece.end].fill(0);
    }
    let written: Vec<&Piece> =
        pieces.iter().filter(|piece| !piece.mapping.reads_as_zeros()).collect();
    // The caller's buffer goes to the device when one piece fills all of it.
    let whole =
        matches!(written.as_slice(), [piece] if piece.start == 0 && piece.end == buffer.len());
    let (requests, kept) = if whole {
        (vec![DevRequest::Read { offset: written[0].dev_offset, buffer }], None)
    } else {
        let reads = written
            .iter()
            .map(|piece| DevRequest::Read {
                offset: piece.dev_offset,
                buffer: AlignedBuf::zeroed(piece.end - piece.start),
            })
            .collect();
        (reads, Some(buffer))
    };
    let starts: Vec<usize> = written.iter().map(|piece| piece.start).collect();
    let (future, completer) = completion::pair();
    let io = Arc::clone(io);
    let finish: GroupFinish = Box::new(move |mut returned, failure| {
        let buffer = match kept {
            Some(mut buffer) => {
                for (start, piece) in starts.iter().zip(&returned) {
                    if let Some(piece) = piece {
                        buffer[*start..*start + piece.len()].copy_from_slice(piece);
                    }
                }
                buffer
            }
            None => returned[0].take().expect("the caller's buffer comes back"),
        };
        io.dio_finished();
        let result = match failure {
            Some(error) => Err(Error::io("direct read", error)),
            None => Ok(count),
        };
        completer.complete((buffer, result));
    });
    submit_group(engine, requests, finish);
    future
}
