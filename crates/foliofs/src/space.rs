//! Space management: fallocate's modes and SEEK_DATA / SEEK_HOLE.
//!
//! Every fallocate mode first writes back (and, where data moves or goes
//! away, drops) the cached range it touches, then changes the extent map in
//! one transaction with the size and times:
//! - allocate (KEEP_SIZE or not): holes become Unwritten space, read as zeros;
//! - PUNCH_HOLE: whole blocks are unmapped, the partial blocks at the edges
//!   zeroed on disk;
//! - ZERO_RANGE: whole blocks become Unwritten (Written ones in place, holes
//!   allocated), the edges zeroed;
//! - COLLAPSE_RANGE / INSERT_RANGE: block-aligned; the extents after the
//!   range move down or up, which the transaction writes as an unmap and the
//!   shifted maps (absolute, so replaying it is idempotent, and blocks that
//!   move are not freed).
//!
//! Callers hold the file's I/O lock exclusively.

use smallvec::SmallVec;

use crate::alloc::BlockRun;
use crate::cache::InodeCache;
use crate::engine::{Engine, FILE_BYTES_MAX};
use crate::error::{Error, Result};
use crate::extent::{ExtentKind, Lookup};
use crate::format::{Record, Timestamp};
use crate::iomap::{self, MapKind};
use crate::meta::Txn;
use crate::passthru::DataPath;
use crate::writeback;

/// What a fallocate does, as the modes of fallocate(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocateMode {
    /// Preallocate as Unwritten; grows the size unless `keep_size`.
    Allocate {
        /// FALLOC_FL_KEEP_SIZE: the size stays.
        keep_size: bool,
    },
    /// Free the range (the size never changes).
    PunchHole,
    /// Make the range read as zeros, keeping (or allocating) its space.
    ZeroRange {
        /// FALLOC_FL_KEEP_SIZE: the size stays.
        keep_size: bool,
    },
    /// Remove the range; what follows moves down.
    CollapseRange,
    /// Insert a hole; what follows moves up.
    InsertRange,
}

impl FallocateMode {
    /// From fallocate(2)'s flags; a combination the kernel's file systems
    /// refuse with EOPNOTSUPP is refused the same way, naming the flags (so
    /// posix_fallocate's fallback still works through a mount).
    pub fn from_flags(flags: i32) -> Result<Self> {
        let keep_size = flags & libc::FALLOC_FL_KEEP_SIZE != 0;
        let rest = flags & !libc::FALLOC_FL_KEEP_SIZE;
        match rest {
            0 => Ok(Self::Allocate { keep_size }),
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Ok(Self::PunchHole),
            libc::FALLOC_FL_PUNCH_HOLE => {
                Err(Error::Unsupported("FALLOC_FL_PUNCH_HOLE needs FALLOC_FL_KEEP_SIZE".into()))
            }
            libc::FALLOC_FL_ZERO_RANGE => Ok(Self::ZeroRange { keep_size }),
            libc::FALLOC_FL_COLLAPSE_RANGE if !keep_size => Ok(Self::CollapseRange),
            libc::FALLOC_FL_INSERT_RANGE if !keep_size => Ok(Self::InsertRange),
            _ => Err(Error::Unsupported(format!("fallocate flags {flags:#x}"))),
        }
    }
}

fn sizes(engine: &Engine, ino: u64) -> Result<(u64, u64)> {
    let inode =
        engine.meta.inode(ino).ok_or_else(|| Error::BadHandle(format!("inode {ino} is gone")))?;
    Ok((inode.size, inode.attrs.size))
}

/// Writes back the cached folios overlapping `[start, end)` and drops them.
fn flush_and_drop(engine: &Engine, inode: &InodeCache, start: u64, end: u64) -> Result<()> {
    writeback::write_back(engine, inode, start, end)?;
    let _serial = inode.lock_writeback();
    inode.remove_range(start, end);
    Ok(())
}

pub fn fallocate(
    engine: &Engine,
    inode: &InodeCache,
    mode: FallocateMode,
    offset: u64,
    length: u64,
) -> Result<()> {
    let ino = inode.ino;
    if length == 0 {
        return Err(Error::invalid("fallocate of length 0"));
    }
    let end = offset.checked_add(length).filter(|&end| end <= FILE_BYTES_MAX).ok_or_else(|| {
        Error::FileTooLarge(format!("inode {ino}: fallocate to {offset}+{length}"))
    })?;
    let block = engine.block_bytes;
    let (size, _) = sizes(engine, ino)?;
    let grows = matches!(
        mode,
        FallocateMode::Allocate { keep_size: false }
            | FallocateMode::ZeroRange { keep_size: false }
    ) && end > size;
    if grows || matches!(mode, FallocateMode::CollapseRange | FallocateMode::InsertRange) {
        // The on-disk size is about to move: it must not come to cover data
        // still only in the cache (see writeback's size rule).
        writeback::write_back(engine, inode, 0, u64::MAX)?;
    }
    match mode {
        FallocateMode::Allocate { keep_size } => {
            // Delayed extents get their real (Unwritten) space from writeback.
            writeback::write_back(engine, inode, offset, end)?;
            let new_size = (!keep_size && end > size).then_some(end);
            allocate(engine, ino, offset / block, end.div_ceil(block), false, new_size)
        }
        FallocateMode::ZeroRange { keep_size } => {
            flush_and_drop(engine, inode, offset, end)?;
            // The space for every change first: a shortage of it fails
            // with nothing changed, before a partial block is zeroed. The
            // size moves last, once the edges read as zeros.
            let mut edge_copies = reserve_edge_copies(engine, ino, offset, end)?;
            allocate(engine, ino, offset.div_ceil(block), end / block, true, None)?;
            zero_edges(engine, ino, offset, end, &mut edge_copies)?;
            let new_size = (!keep_size && end > size).then_some(end);
            if new_size.is_some() {
                engine.meta.transact(&[ino], |txn| {
                    touch(txn, ino, new_size);
                    Ok(())
                })?;
            }
            Ok(())
        }
        FallocateMode::PunchHole => {
            flush_and_drop(engine, inode, offset, end)?;
            let (first, last) = (offset.div_ceil(block), end / block);
            engine.meta.check_room_for_unmapping(ino, first, last.saturating_sub(first))?;
            let mut edge_copies = reserve_edge_copies(engine, ino, offset, end)?;
            zero_edges(engine, ino, offset, end, &mut edge_copies)?;
            engine.meta.transact(&[ino], |txn| {
                if last > first {
                    txn.ensure_room_for_unmapping(ino, first, last - first)?;
                    txn.apply(Record::ExtentUnmap {
                        ino,
                        file_block: first,
                        block_count: last - first,
                    });
                }
                touch(txn, ino, None);
                Ok(())
            })?;
            Ok(())
        }
        FallocateMode::CollapseRange | FallocateMode::InsertRange => {
            if !offset.is_multiple_of(block) || !length.is_multiple_of(block) {
                return Err(Error::invalid(format!(
                    "collapse and insert ranges must be multiples of the block size ({block} B)"
                )));
            }
            let collapse = mode == FallocateMode::CollapseRange;
            if collapse && end >= size {
                return Err(Error::invalid("COLLAPSE_RANGE must end before the end of file"));
            }
            if !collapse && offset >= size {
                return Err(Error::invalid("INSERT_RANGE must start before the end of file"));
            }
            if !collapse && size.checked_add(length).is_none_or(|grown| grown > FILE_BYTES_MAX) {
                return Err(Error::FileTooLarge(format!("inode {ino}: insert of {length} bytes")));
            }
            flush_and_drop(engine, inode, offset, u64::MAX)?;
            shift(engine, ino, offset / block, length / block, collapse, size)
        }
    }
}

/// Promises a block to each copy zeroing the edges of `[start, end)` may
/// make (a partly covered block that is shared), so that a full volume
/// fails the zeroing before the first edge changes, not between the two.
fn reserve_edge_copies(
    engine: &Engine,
    ino: u64,
    start: u64,
    end: u64,
) -> Result<iomap::CopyReservation<'_>> {
    let block = engine.block_bytes;
    let mut edges: SmallVec<[u64; 2]> = SmallVec::new();
    if !start.is_multiple_of(block) {
        edges.push(start / block);
    }
    if !end.is_multiple_of(block) && edges.last() != Some(&(end / block)) {
        edges.push(end / block);
    }
    let mut block_count = 0;
    for edge in edges {
        let runs = iomap::blocks_to_copy(&engine.meta, ino, edge, 1)?;
        block_count += runs.iter().map(|&(_, count)| count).sum::<u64>();
    }
    iomap::reserve_copies(&engine.meta, ino, block_count)
}

/// Zeroes on disk the parts of the first and last blocks of `[start, end)`
/// that the range covers only partly; copies of shared blocks take the
/// blocks `copies` promised.
fn zero_edges(
    engine: &Engine,
    ino: u64,
    start: u64,
    end: u64,
    copies: &mut iomap::CopyReservation<'_>,
) -> Result<()> {
    let data = DataPath::new(engine);
    let first_block_end = engine.align_down(start) + engine.block_bytes;
    data.zero_in_block_paying(ino, start, end.min(first_block_end), &mut copies.block_count)?;
    if end > first_block_end {
        let last_block_start = engine.align_down(end).max(start);
        data.zero_in_block_paying(ino, last_block_start, end, &mut copies.block_count)?;
    }
    Ok(())
}

/// Sets the size (if given) and advances mtime/ctime.
fn touch(txn: &mut Txn<'_>, ino: u64, new_size: Option<u64>) {
    let Some(inode) = txn.state().inode(ino) else { return };
    let now = Timestamp::now();
    let mut attrs = inode.attrs;
    attrs.mtime = now;
    attrs.ctime = now;
    if let Some(size) = new_size {
        attrs.size = size;
    }
    txn.apply(Record::InodeSet { ino, attrs });
    if let Some(size) = new_size {
        txn.state_mut().inode_mut(ino).expect("exists").size = size;
    }
}

/// Holes in blocks `[first, last)` become Unwritten space (and with
/// `zero_written`, Written blocks become Unwritten in place), with the size
/// change, in one transaction; nothing changes when space is short.
fn allocate(
    engine: &Engine,
    ino: u64,
    first: u64,
    last: u64,
    zero_written: bool,
    new_size: Option<u64>,
) -> Result<()> {
    let mut retries = iomap::Retries::new(ino);
    loop {
        match allocate_once(engine, ino, first, last, zero_written, new_size) {
            Err(Error::NoSpace(message)) if engine.meta.space().pending_free_blocks() > 0 => {
                // Blocks a transaction freed are reusable only once it is
                // durable (a crash would otherwise hand them to two files).
                // Like XFS forcing its log, commit it now rather than fail
                // while the background commit is seconds away (xfstests
                // generic/213).
                retries.commit_for_space(&engine.meta, || message)?;
            }
            other => return other,
        }
    }
}

fn allocate_once(
    engine: &Engine,
    ino: u64,
    first: u64,
    last: u64,
    zero_written: bool,
    new_size: Option<u64>,
) -> Result<()> {
    let records_max = (engine.meta.journal().geometry().group_bytes_max() / 2 / 48) as usize;
    engine.meta.transact(&[ino], |txn| {
        let state = txn.state();
        let extents = iomap::file_extents(state, ino)?;
        let mut holes: Vec<(u64, u64)> = Vec::new();
        let mut written: Vec<(u64, u64, u64)> = Vec::new();
        let mut block = first;
        while block < last {
            match extents.lookup(block) {
                Lookup::Mapped(extent) => {
                    let count = extent.block_count.min(last - block);
                    if zero_written && extent.kind == ExtentKind::Written {
                        written.push((block, extent.dev_block, count));
                    }
                    block += count;
                }
                Lookup::Hole { block_count } => {
                    let count = block_count.min(last - block);
                    holes.push((block, count));
                    block += count;
                }
            }
        }
        let hole_blocks: u64 = holes.iter().map(|(_, count)| count).sum();
        if holes.len() + written.len() > records_max {
            return Err(Error::NoSpace(format!(
                "fallocate of inode {ino} spans more pieces than one journal transaction holds"
            )));
        }
        txn.ensure_metadata_room(48 * (holes.len() + written.len()) as u64 + 128)?;
        // Check and allocate every run under one hold of free space, before
        // the first record, so a shortage fails with nothing applied.
        let mut space = txn.space();
        if hole_blocks > space.alloc.available_blocks() {
            return Err(Error::NoSpace(format!(
                "fallocate of inode {ino} needs {hole_blocks} blocks, {} are free",
                space.alloc.available_blocks()
            )));
        }
        let mut runs: Vec<(u64, BlockRun)> = Vec::new();
        for &(hole_start, count) in &holes {
            let mut done = 0;
            while done < count {
                let goal =
                    runs.last().map_or(space.alloc.cursor(), |(_, run)| run.start + run.count);
                let Some(run) = space.alloc.allocate(goal, count - done, 0) else {
                    for (_, run) in runs.drain(..) {
                        space.alloc.free(run);
                    }
                    return Err(Error::NoSpace(format!(
                        "no free blocks for fallocate of inode {ino}"
                    )));
                };
                runs.push((hole_start + done, run));
                done += run.count;
            }
        }
        drop(space);
        // Free space in pieces may need more runs than the holes: reserve
        // for the records these runs make.
        let room = if runs.len() + written.len() > records_max {
            Err(Error::NoSpace(format!(
                "fallocate of inode {ino} needs more extents than one journal transaction holds"
            )))
        } else {
            txn.ensure_metadata_room(48 * (runs.len() + written.len()) as u64 + 128)
        };
        if let Err(error) = room {
            let mut space = txn.space();
            for (_, run) in runs.drain(..) {
                space.alloc.free(run);
            }
            return Err(error);
        }
        for (file_block, run) in runs {
            iomap::map_unwritten(txn, ino, file_block, run.start, run.count);
        }
        // Written blocks become Unwritten in place: they read as zeros.
        for (file_block, dev_block, block_count) in written {
            iomap::map_unwritten(txn, ino, file_block, dev_block, block_count);
        }
        touch(txn, ino, new_size);
        Ok(())
    })?;
    Ok(())
}

/// COLLAPSE_RANGE (`collapse`) or INSERT_RANGE of `count` blocks at block
/// `first`: one transaction unmaps everything from `first` on and maps the
/// extents that stay at their new places, with the new size.
fn shift(
    engine: &Engine,
    ino: u64,
    first: u64,
    count: u64,
    collapse: bool,
    size: u64,
) -> Result<()> {
    let records_max = (engine.meta.journal().geometry().group_bytes_max() / 2 / 48) as usize;
    let block = engine.block_bytes;
    let ((), lsn) = engine.meta.transact(&[ino], |txn| {
        let state = txn.state();
        let extents = iomap::file_extents(state, ino)?;
        let kept_from = if collapse { first + count } else { first };
        let moved: Vec<_> = extents
            .range(kept_from, u64::MAX)
            .filter_map(|extent| extent.kind.persisted().map(|state| (extent, state)))
            .collect();
        if moved.len() + 2 > records_max {
            return Err(Error::NoSpace(format!(
                "shifting {} extents of inode {ino} does not fit one journal transaction",
                moved.len()
            )));
        }
        let mapped_end = extents.end_block();
        txn.ensure_metadata_room(48 * moved.len() as u64 + 128)?;
        if collapse {
            txn.ensure_room_for_unmapping(ino, first, count)?;
        }
        if mapped_end > first {
            txn.apply(Record::ExtentUnmap {
                ino,
                file_block: first,
                block_count: mapped_end - first,
            });
        }
        for (extent, state) in moved {
            let file_block =
                if collapse { extent.file_block - count } else { extent.file_block + count };
            txn.apply(Record::ExtentMap {
                ino,
                file_block,
                dev_block: extent.dev_block,
                block_count: extent.block_count,
                state,
            });
        }
        let new_size = if collapse { size - count * block } else { size + count * block };
        touch(txn, ino, Some(new_size));
        Ok(())
    })?;
    // The moved blocks keep their device blocks, and later writes to them
    // overwrite those in place. Until this transaction is durable the
    // journal still maps them at their old offsets, so a crash would show
    // data written at the new offsets at the old ones. Commit it before the
    // caller lets writers in again (tests/crash.rs,
    // shifted_blocks_are_overwritten_only_after_the_shift_is_durable).
    engine.meta.commit(lsn)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whence {
    Data,
    Hole,
}

/// lseek's SEEK_DATA and SEEK_HOLE from `pos`. Data is Written or delayed
/// space, or Unwritten space under dirty cached blocks (written, not yet
/// written back); everything else, and the end of file, is a hole. SEEK_DATA
/// past the last data, and either at or past the end of file, is ENXIO.
pub fn seek(engine: &Engine, inode: &InodeCache, pos: u64, whence: Whence) -> Result<u64> {
    let ino = inode.ino;
    let (size, _) = sizes(engine, ino)?;
    if pos >= size {
        return Err(Error::PastEnd(format!("seek from {pos} in inode {ino} of {size} bytes")));
    }
    // Writeback takes dirty bits before it converts the blocks under them:
    // between the two, data would look like a hole.
    let _serial = inode.lock_writeback();
    let want_data = whence == Whence::Data;
    let report = iomap::report_range(&engine.meta, ino, pos, size - pos, engine.block_bytes)?;
    for range in &report.ranges {
        let mapping = &range.mapping;
        let start = mapping.offset.max(engine.align_down(pos));
        let found = match mapping.kind {
            MapKind::Written | MapKind::Delalloc => want_data.then_some(start),
            MapKind::Hole => (!want_data).then_some(start),
            MapKind::Unwritten => inode.first_block_with_dirty(
                start,
                mapping.end(),
                engine.block_bytes,
                want_data,
                |_| false,
            ),
        };
        if let Some(at) = found {
            return Ok(at.max(pos).min(size));
        }
    }
    match whence {
        Whence::Hole => Ok(size),
        Whence::Data => Err(Error::PastEnd(format!("no data after {pos} in inode {ino}"))),
    }
}
