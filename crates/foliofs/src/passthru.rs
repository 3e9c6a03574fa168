//! The simple data path: writes go straight through the mapping to the
//! device, one bounce buffer per piece, with read-modify-write for partial
//! blocks. The direct path uses it for the sub-block writes that must zero
//! the rest of their blocks (under the exclusive lock), and truncation for
//! the size change. Its rules are the ones every data path keeps:
//! - new space is written through Unwritten extents and converted at completion;
//! - the size grows only in the transaction that records the completed write;
//! - bytes past the size inside the last block are zero on disk, so growing a
//!   file never exposes old bytes.

use crate::dev::AlignedBuf;
use crate::engine::Engine;
use crate::error::{Error, IoContext, Result};
use crate::format::{Record, Timestamp};
use crate::iomap::{self, Intent, MapKind, Mapping};
use crate::meta::Txn;

/// Largest piece one device request carries, which bounds bounce buffers.
pub const PIECE_BYTES_MAX: u64 = 8 << 20;

/// The simple data path over an engine.
pub struct DataPath<'a> {
    engine: &'a Engine,
}

impl<'a> DataPath<'a> {
    pub fn new(engine: &'a Engine) -> Self {
        Self { engine }
    }

    fn align_down(&self, value: u64) -> u64 {
        self.engine.align_down(value)
    }

    fn align_up(&self, value: u64) -> u64 {
        self.engine.align_up(value)
    }

    /// Writes `data` at `pos`; returns the bytes written. A failure after some
    /// pieces completed returns the completed count.
    pub fn write(&self, ino: u64, data: &[u8], pos: u64) -> Result<usize> {
        let total = data.len() as u64;
        pos.checked_add(total).ok_or_else(|| Error::FileTooLarge(format!("inode {ino}")))?;
        let mut done = 0u64;
        // Chunks bound the bounce buffer; each is walked mapping by mapping,
        // every piece written and recorded before the next is mapped.
        while done < total {
            let chunk_pos = pos + done;
            let chunk = &data[done as usize..(done + (total - done).min(PIECE_BYTES_MAX)) as usize];
            let block_bytes = self.engine.block_bytes;
            let walk = iomap::walk(
                &self.engine.meta,
                ino,
                chunk_pos,
                chunk.len() as u64,
                Intent::Write,
                block_bytes,
            );
            for range in walk {
                let written = range.and_then(|range| {
                    self.write_range(
                        ino,
                        &chunk[range.bytes()],
                        chunk_pos + range.start,
                        &range.mapping,
                    )
                });
                match written {
                    Ok(()) => {}
                    Err(error) if done == 0 => return Err(error),
                    Err(error) => {
                        tracing::debug!("short write on inode {ino} after {done} bytes: {error}");
                        return Ok(done as usize);
                    }
                }
            }
            done += chunk.len() as u64;
        }
        Ok(done as usize)
    }

    /// Writes `piece`, which lies in `mapping`, at `pos`, and records it.
    fn write_range(&self, ino: u64, piece: &[u8], pos: u64, mapping: &Mapping) -> Result<()> {
        assert!(matches!(mapping.kind, MapKind::Written | MapKind::Unwritten));
        let data_end = pos + piece.len() as u64;
        debug_assert!(data_end <= mapping.end());
        let io_start = self.align_down(pos);
        let io_end = self.align_up(data_end);
        // `begin` maps from the block holding the position it was asked for.
        debug_assert_eq!(io_start, mapping.offset);
        // The mapping's end is on a block: the bounce, whole blocks, stays
        // inside the space it maps.
        debug_assert!(io_end <= mapping.end(), "a write past the space mapped for it");
        let mut bounce = AlignedBuf::zeroed((io_end - io_start) as usize);
        // The rest of a partial block is the old data: in place, or in the
        // shared blocks this new space replaces.
        let old_data_at = match (mapping.kind, mapping.cow_source) {
            (_, Some(source)) => source.old_data_at(),
            (MapKind::Written, None) => Some(mapping.dev_offset),
            _ => None,
        };
        if let Some(old_data_at) = old_data_at {
            if let Err(error) =
                self.fill_partial_blocks(mapping, old_data_at, &mut bounce, pos, data_end)
            {
                if mapping.new {
                    iomap::end_write(
                        &self.engine.meta,
                        ino,
                        &[(*mapping, 0)],
                        self.engine.block_bytes,
                        |_| {},
                    )?;
                }
                return Err(error);
            }
        }
        let head = (pos - io_start) as usize;
        bounce[head..head + piece.len()].copy_from_slice(piece);
        let dev_offset = mapping.dev_offset;
        let block_bytes = self.engine.block_bytes;
        let result = self.engine.device.write(dev_offset, &bounce, false);
        if let Err(error) = result {
            iomap::end_write(&self.engine.meta, ino, &[(*mapping, 0)], block_bytes, |_| {})?;
            return Err(Error::io(format!("write at device offset {dev_offset}"), error));
        }
        let completed = io_end - io_start;
        iomap::end_write(&self.engine.meta, ino, &[(*mapping, completed)], block_bytes, |txn| {
            note_write(txn, ino, data_end)
        })?;
        Ok(())
    }

    /// Reads the first and last block of `[io_start, io_end)` when the write
    /// covers them only partly (read-modify-write), from the mapping's old
    /// data at device offset `old_data_at` (that of `mapping.offset`).
    fn fill_partial_blocks(
        &self,
        mapping: &Mapping,
        old_data_at: u64,
        bounce: &mut [u8],
        pos: u64,
        data_end: u64,
    ) -> Result<()> {
        let block = self.engine.block_bytes as usize;
        debug_assert!(pos < data_end, "no partial blocks in an empty write");
        let io_start = self.align_down(pos);
        let last_block_start = self.align_down(data_end - 1);
        let mut partial = Vec::new();
        if !pos.is_multiple_of(self.engine.block_bytes) {
            partial.push(io_start);
        }
        if !data_end.is_multiple_of(self.engine.block_bytes) && !partial.contains(&last_block_start)
        {
            partial.push(last_block_start);
        }
        for block_start in partial {
            let at = (block_start - io_start) as usize;
            debug_assert!(at + block <= bounce.len(), "a partial block outside the bounce buffer");
            let dev_offset = old_data_at + (block_start - mapping.offset);
            self.engine
                .device
                .read(dev_offset, &mut bounce[at..at + block])
                .context(|| format!("read-modify-write read at device offset {dev_offset}"))?;
        }
        Ok(())
    }

    /// Zeroes bytes `[from, block end)` of the block containing `from` on
    /// disk, if that block is Written; keeps the "zeros past EOF" rule.
    pub fn zero_block_tail(&self, ino: u64, from: u64) -> Result<()> {
        let block_end = self.align_down(from) + self.engine.block_bytes;
        self.zero_in_block(ino, from, block_end)
    }

    /// Zeroes bytes `[from, to)`, which lie in one block, on disk if that
    /// block is Written (holes and Unwritten blocks read as zeros already).
    /// A whole block is left alone: callers unmap or convert those.
    pub fn zero_in_block(&self, ino: u64, from: u64, to: u64) -> Result<()> {
        self.zero_in_block_paying(ino, from, to, &mut 0)
    }

    /// [`DataPath::zero_in_block`] whose copy of a shared block takes one of
    /// `copies_reserved` blocks, promised before ([`iomap::reserve_copies`]).
    pub fn zero_in_block_paying(
        &self,
        ino: u64,
        from: u64,
        to: u64,
        copies_reserved: &mut u64,
    ) -> Result<()> {
        let block_start = self.align_down(from);
        debug_assert!(to <= block_start + self.engine.block_bytes);
        if from >= to || (from == block_start && to == block_start + self.engine.block_bytes) {
            return Ok(());
        }
        let report =
            iomap::report_range(&self.engine.meta, ino, block_start, 1, self.engine.block_bytes)?;
        let Some(range) =
            report.ranges.first().filter(|range| range.mapping.kind == MapKind::Written)
        else {
            return Ok(());
        };
        if range.mapping.shared {
            return self.zero_in_shared_block(ino, from, to, copies_reserved);
        }
        let dev_offset = range.dev_offset;
        let mut block = AlignedBuf::zeroed(self.engine.block_bytes as usize);
        self.engine
            .device
            .read(dev_offset, &mut block)
            .context(|| format!("read at device offset {dev_offset}"))?;
        block[(from - block_start) as usize..(to - block_start) as usize].fill(0);
        self.engine
            .device
            .write(dev_offset, &block, false)
            .context(|| format!("write at device offset {dev_offset}"))
    }

    /// [`DataPath::zero_in_block`] for a block other files map too: the
    /// zeroed copy goes to new space, remapped once written; the size and
    /// times stay as they are.
    fn zero_in_shared_block(
        &self,
        ino: u64,
        from: u64,
        to: u64,
        copies_reserved: &mut u64,
    ) -> Result<()> {
        let block_bytes = self.engine.block_bytes;
        let block_start = self.align_down(from);
        // `zero_in_block_paying` sends a part of one block, never all of it.
        debug_assert!(from < to && to <= block_start + block_bytes);
        let meta = &self.engine.meta;
        let mut walk = iomap::walk(meta, ino, block_start, block_bytes, Intent::Write, block_bytes)
            .paying_copies_with(*copies_reserved);
        let range = walk.next();
        *copies_reserved = walk.copies_reserved_left();
        let Some(range) = range else {
            return Ok(());
        };
        let mapping = range?.mapping;
        let old_data_at = match mapping.cow_source {
            Some(source) => source.old_data_at(),
            None => (mapping.kind == MapKind::Written).then_some(mapping.dev_offset),
        };
        let mut block = AlignedBuf::zeroed(block_bytes as usize);
        // Old bytes of unwritten blocks are zeros, as the buffer starts.
        let read = match old_data_at {
            Some(at) => self
                .engine
                .device
                .read(at, &mut block[..block_bytes as usize])
                .context(|| format!("read at device offset {at}")),
            None => Ok(()),
        };
        let copied = read.and_then(|()| {
            block[(from - block_start) as usize..(to - block_start) as usize].fill(0);
            let at = mapping.dev_offset;
            self.engine
                .device
                .write(at, &block[..block_bytes as usize], false)
                .context(|| format!("write at device offset {at}"))
        });
        let completed = if copied.is_ok() { block_bytes } else { 0 };
        iomap::end_write(meta, ino, &[(mapping, completed)], block_bytes, |_| {})?;
        copied
    }

    /// Changes the size: unmaps whole blocks past the new end in one
    /// transaction with the new size. The caller has zeroed the tail of the
    /// new last block on disk first (`zero_block_tail`), before dropping any
    /// cached data, so that a failure there changes nothing.
    pub fn commit_size(&self, ino: u64, new_size: u64) -> Result<u64> {
        let first_gone_block = new_size.div_ceil(self.engine.block_bytes);
        let (_, lsn) = self.engine.meta.transact(&[ino], |txn| {
            let now = Timestamp::now();
            let state = txn.state();
            let inode =
                state.inode(ino).ok_or_else(|| Error::BadHandle(format!("inode {ino} is gone")))?;
            let mapped_end = inode.extents().map_or(0, |extents| extents.end_block());
            let mut attrs = inode.attrs;
            attrs.size = new_size;
            attrs.mtime = now;
            attrs.ctime = now;
            if mapped_end > first_gone_block {
                txn.ensure_room_for_unmapping(ino, first_gone_block, u64::MAX)?;
                txn.apply(Record::ExtentUnmap {
                    ino,
                    file_block: first_gone_block,
                    block_count: mapped_end - first_gone_block,
                });
            }
            txn.apply(Record::InodeSet { ino, attrs });
            txn.state_mut().inode_mut(ino).expect("exists").size = new_size;
            Ok(())
        })?;
        Ok(lsn)
    }
}

/// Adds the size and time changes of a completed write ending at `data_end`:
/// a record when the size grows, otherwise the times only, in memory.
pub fn note_write(txn: &mut Txn<'_>, ino: u64, data_end: u64) {
    let Some(inode) = txn.state().inode(ino) else { return };
    let now = Timestamp::now();
    if data_end <= inode.attrs.size {
        txn.state_mut().touch_times(ino, now);
        return;
    }
    let mut attrs = inode.attrs;
    attrs.size = data_end;
    attrs.mtime = now;
    attrs.ctime = now;
    let new_size = inode.size.max(data_end);
    txn.apply(Record::InodeSet { ino, attrs });
    txn.state_mut().inode_mut(ino).expect("exists").size = new_size;
}
