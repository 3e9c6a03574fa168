//! Clones (reflinks): a range of one file mapped into another, or
//! elsewhere in the same file, onto the same device blocks, as XFS's
//! `xfs_reflink_remap_range`. Nothing is copied: the clone's extents name
//! the source's blocks, and the transaction that maps them raises their
//! counts (the `refcount` module). Whichever file writes a shared block later
//! writes a new copy of it (copy-on-write, `crate::iomap`), and the last
//! file to let go of a block frees it.
//!
//! Both files' dirty data in the range is written back first (a delayed
//! allocation has no blocks to share) and the destination's cached range
//! dropped; callers hold both files' I/O locks exclusively, so no write,
//! direct I/O or fill changes either range meanwhile, and writeback has
//! nothing left there to write.

use crate::cache::InodeCache;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::extent::{Extent, ExtentKind};
use crate::format::{Record, Timestamp};
use crate::iomap;
use crate::meta::Txn;
use crate::writeback;

/// Source extents mapped per transaction: each costs an ExtentMap and a
/// few shared-count records, and a transaction must fit one journal group.
const EXTENTS_PER_TXN: usize = 16;

/// Journal bytes one cloned extent may cost: its ExtentMap (34) and up to
/// four shared-count records (21 each) where it meets runs of other counts.
const EXTENT_LOG_BYTES: u64 = 34 + 4 * 21;

/// Maps `[src_pos, src_pos + length)` of `src` into `dst` at `dst_pos`,
/// replacing what `dst` had there, and grows `dst` to the range's end if
/// it was shorter. The caller holds both I/O locks exclusively and has
/// checked the range: block-aligned offsets, a length of whole blocks or
/// one reaching the source's end of file (the destination's range then
/// reaching past its own), ranges that do not overlap in one file.
pub fn clone_range(
    engine: &Engine,
    src: &InodeCache,
    dst: &InodeCache,
    src_pos: u64,
    dst_pos: u64,
    length: u64,
) -> Result<()> {
    let block_bytes = engine.block_bytes;
    debug_assert!(src_pos.is_multiple_of(block_bytes) && dst_pos.is_multiple_of(block_bytes));
    if length == 0 {
        return Ok(());
    }
    let (src_ino, dst_ino) = (src.ino, dst.ino);
    writeback::write_back(engine, src, src_pos, src_pos + length)?;
    let dst_end = dst_pos + length;
    let dst_size = engine.meta.inode(dst_ino).map_or(0, |inode| inode.size);
    if dst_end > dst_size {
        // The on-disk size is about to move: it must not come to cover data
        // still only in the cache (writeback's size rule).
        writeback::write_back(engine, dst, 0, u64::MAX)?;
    }
    writeback::sync_for_direct(engine, dst, dst_pos, length, true)?;
    let plan = ClonePlan {
        src_ino,
        dst_ino,
        first_src_block: src_pos / block_bytes,
        first_dst_block: dst_pos / block_bytes,
        block_count: length.div_ceil(block_bytes),
        dst_end,
    };
    let mut done_blocks = 0;
    while done_blocks < plan.block_count {
        let (chunk_end, _) =
            engine.meta.transact(&[src_ino, dst_ino], |txn| plan.clone_chunk(txn, done_blocks))?;
        assert!(chunk_end > done_blocks && chunk_end <= plan.block_count);
        done_blocks = chunk_end;
    }
    Ok(())
}

/// One clone, in blocks: source blocks from `first_src_block` on map to
/// destination blocks from `first_dst_block` on.
struct ClonePlan {
    src_ino: u64,
    dst_ino: u64,
    first_src_block: u64,
    first_dst_block: u64,
    block_count: u64,
    /// The destination's size once the clone is done, at least.
    dst_end: u64,
}

impl ClonePlan {
    /// Clones as many blocks from `done_blocks` on as one transaction
    /// holds; returns where it stopped (relative to the first block).
    fn clone_chunk(&self, txn: &mut Txn<'_>, done_blocks: u64) -> Result<u64> {
        txn.ensure_metadata_room(EXTENTS_PER_TXN as u64 * EXTENT_LOG_BYTES + 25 + 78)?;
        let (pieces, cut_short) = self.cloneable_pieces(txn, done_blocks)?;
        // Where this transaction stops: after its last extent when the
        // range has more, else at the range's end (holes included).
        let chunk_end = match pieces.last() {
            Some(last) if cut_short || pieces.len() == EXTENTS_PER_TXN => {
                last.file_end() - self.first_src_block
            }
            _ => self.block_count,
        };
        assert!(chunk_end > done_blocks, "a clone step that clones nothing");
        if let Some(delayed) = pieces.iter().find(|piece| piece.kind == ExtentKind::Delalloc) {
            return Err(Error::io(
                format!(
                    "cloning inode {}: block {} is still a delayed allocation after writeback",
                    self.src_ino, delayed.file_block
                ),
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        let replaced_first = self.first_dst_block + done_blocks;
        txn.ensure_room_for_unmapping(self.dst_ino, replaced_first, chunk_end - done_blocks)?;
        txn.apply(Record::ExtentUnmap {
            ino: self.dst_ino,
            file_block: replaced_first,
            block_count: chunk_end - done_blocks,
        });
        for piece in &pieces {
            debug_assert!(piece.file_block >= self.first_src_block);
            let state = piece.kind.persisted().expect("not delayed: checked above");
            txn.map_shared(
                self.dst_ino,
                self.first_dst_block + (piece.file_block - self.first_src_block),
                piece.dev_block,
                piece.block_count,
                state,
            );
        }
        if chunk_end == self.block_count {
            touch_destination(txn, self.dst_ino, self.dst_end);
        }
        Ok(chunk_end)
    }

    /// The source's extents from `done_blocks` on that one transaction can
    /// clone, and whether the room for shared-count records cut them short.
    fn cloneable_pieces(&self, txn: &Txn<'_>, done_blocks: u64) -> Result<(Vec<Extent>, bool)> {
        // Each run of equal count the cloned blocks cross is a shared-count
        // record: half the room left goes to them, the rest to the
        // destination's replaced blocks.
        let mut counts_left = txn.shared_count_room() / 2;
        assert!(counts_left > 0, "a journal group holds no shared-count record");
        let extents = iomap::file_extents(txn.state(), self.src_ino)?;
        let first = self.first_src_block;
        let mut pieces = Vec::new();
        for extent in
            extents.range(first + done_blocks, first + self.block_count).take(EXTENTS_PER_TXN)
        {
            let (blocks, counts) = match extent.kind {
                ExtentKind::Delalloc => (extent.block_count, 0),
                _ => txn.blocks_cloneable(extent.dev_block, extent.block_count, counts_left),
            };
            assert!(blocks <= extent.block_count && counts <= counts_left);
            if blocks > 0 {
                pieces.push(Extent { block_count: blocks, ..extent });
            }
            counts_left -= counts;
            if blocks < extent.block_count {
                return Ok((pieces, true));
            }
        }
        Ok((pieces, false))
    }
}

/// The destination's times, and its size when the clone reaches past it.
fn touch_destination(txn: &mut Txn<'_>, ino: u64, end: u64) {
    let Some(inode) = txn.state().inode(ino) else { return };
    let now = Timestamp::now();
    let mut attrs = inode.attrs;
    attrs.mtime = now;
    attrs.ctime = now;
    let new_size = inode.size.max(end);
    attrs.size = attrs.size.max(end);
    txn.apply(Record::InodeSet { ino, attrs });
    txn.state_mut().inode_mut(ino).expect("exists").size = new_size;
}
