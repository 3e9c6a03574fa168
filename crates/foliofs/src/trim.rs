//! Batched discard of free space (FITRIM, `fstrim`): the free blocks in a
//! byte range of the volume are discarded on the device, so a thin disk
//! image or an SSD gets back what the volume does not use.
//!
//! A trim follows the rules of `-o discard` (see `MetaStore::commit`'s
//! discard of durable frees), which keep every crash image sound:
//! - only blocks in the allocator are trimmed, and a block reaches the
//!   allocator only once the record that freed it is durable, so no crash
//!   brings back a file whose blocks were trimmed;
//! - the blocks of a batch are taken out of the allocator before their
//!   discard is issued and given back after it completed, so no write of a
//!   new owner's data can be overtaken by the discard;
//! - nothing about a trim is recorded: lost in a crash, a discard leaves
//!   old bytes in free space, which nothing reads.
//!
//! A batch holds out of the allocator at most [`BATCH_BYTES_MAX`], 1/64 of
//! the data region and half the space not promised to delayed allocations,
//! so writers running alongside lose little space for a moment and nothing
//! they were promised (ext4 likewise keeps the extents it is discarding
//! from its allocator).

use crate::alloc::BlockRun;
use crate::dev::{Device, DiscardMode};
use crate::error::{Error, Result};
use crate::meta::MetaStore;

/// The most bytes of free space one batch holds out of the allocator.
pub const BATCH_BYTES_MAX: u64 = 64 << 20;

/// A batch holds at most this fraction of the data region.
const BATCH_REGION_DIVISOR: u64 = 64;

/// What FITRIM's `struct fstrim_range` asks for, in bytes of the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimRange {
    /// Where the range starts; at or past the volume's end is refused.
    pub start_bytes: u64,
    /// `u64::MAX` (fstrim's default) for everything from `start_bytes` on.
    pub length_bytes: u64,
    /// Free runs shorter than this are left alone.
    pub minimum_bytes: u64,
}

impl TrimRange {
    /// The whole volume, every free run.
    pub const ALL: Self = Self { start_bytes: 0, length_bytes: u64::MAX, minimum_bytes: 0 };
}

/// Discards the free blocks of `range` on `device` in batches; returns the
/// bytes discarded. Refused as ext4 refuses FITRIM: a start past the
/// volume's end, a length under one block or a minimum longer than the
/// data region (EINVAL); a device without discard is EOPNOTSUPP.
pub fn trim_free_space(
    meta: &MetaStore,
    device: &Device,
    block_bytes: u64,
    volume_bytes: u64,
    range: TrimRange,
) -> Result<u64> {
    if let Some(refusal) = meta.refusal() {
        return Err(refusal);
    }
    let region = meta.space().alloc.region();
    if range.start_bytes >= volume_bytes {
        return Err(Error::invalid(format!(
            "trim: start {} is past the end of the volume ({volume_bytes} bytes)",
            range.start_bytes
        )));
    }
    if range.length_bytes < block_bytes {
        return Err(Error::invalid(format!(
            "trim: length {} is less than a block ({block_bytes} bytes)",
            range.length_bytes
        )));
    }
    if range.minimum_bytes > region.block_count * block_bytes {
        return Err(Error::invalid(format!(
            "trim: minimum length {} exceeds the data region ({} bytes)",
            range.minimum_bytes,
            region.block_count * block_bytes
        )));
    }
    let end_bytes = range.start_bytes.saturating_add(range.length_bytes).min(volume_bytes);
    let mut cursor = (range.start_bytes / block_bytes).max(region.start_block);
    let end = (end_bytes / block_bytes).min(region.end_block());
    let minimum_blocks = range.minimum_bytes.div_ceil(block_bytes).max(1);
    let batch_blocks_max = (BATCH_BYTES_MAX / block_bytes)
        .min(region.block_count / BATCH_REGION_DIVISOR)
        .max(minimum_blocks);
    let mut trimmed_bytes = 0;
    while cursor < end {
        // Frees made durable since the last transaction are free space too
        // (a transaction would release them first).
        meta.release_durable_frees();
        let (batch, next) =
            take_batch(&mut meta.space().alloc, cursor, end, minimum_blocks, batch_blocks_max);
        let discarded = discard_runs(device, &batch, block_bytes);
        let mut space = meta.space();
        batch.iter().for_each(|&run| space.alloc.free(run));
        drop(space);
        trimmed_bytes += discarded?;
        // Every batch moves the cursor on: the loop ends.
        assert!(next > cursor, "trim stalled at block {cursor}");
        cursor = next;
    }
    Ok(trimmed_bytes)
}

/// Takes out of `alloc` the free runs (clipped to `cursor..end`) of at
/// least `minimum_blocks`, up to `batch_blocks_max` blocks and half of
/// those available beyond reservations; returns them and where the next
/// batch starts.
fn take_batch(
    alloc: &mut crate::alloc::Allocator,
    cursor: u64,
    end: u64,
    minimum_blocks: u64,
    batch_blocks_max: u64,
) -> (Vec<BlockRun>, u64) {
    // Claimed first, so that no reservation made meanwhile (reservations
    // take no lock) finds its blocks gone.
    let claimed = alloc.claim_up_to(batch_blocks_max.min(alloc.available_blocks().div_ceil(2)));
    let mut budget = claimed;
    let mut batch = Vec::new();
    let mut next = end;
    for run in alloc.free_runs_from(cursor) {
        let start = run.start.max(cursor);
        let run_end = (run.start + run.count).min(end);
        if start >= end {
            break;
        }
        if run_end - start < minimum_blocks {
            continue;
        }
        if budget < minimum_blocks {
            next = start;
            break;
        }
        let count = (run_end - start).min(budget);
        batch.push(BlockRun { start, count });
        budget -= count;
        if start + count < run_end {
            next = start + count;
            break;
        }
    }
    // What the batch took, and its budget left, are what was claimed; each
    // run is long enough.
    debug_assert_eq!(batch.iter().map(|run| run.count).sum::<u64>() + budget, claimed);
    debug_assert!(batch.iter().all(|run| run.count >= minimum_blocks && run.start >= cursor));
    for &run in &batch {
        alloc.take_claimed(run).expect("the run was just found free");
    }
    alloc.return_claimed(budget);
    // No progress possible (every free block is promised): stop here.
    if batch.is_empty() {
        next = end;
    }
    debug_assert!(next > cursor || cursor >= end);
    (batch, next)
}

fn discard_runs(device: &Device, runs: &[BlockRun], block_bytes: u64) -> Result<u64> {
    let mut discarded_bytes = 0;
    for run in runs {
        let (offset, length) = (run.start * block_bytes, run.count * block_bytes);
        device.discard(offset, length, DiscardMode::Trim).map_err(|error| {
            if error.kind() == std::io::ErrorKind::Unsupported {
                Error::Unsupported(format!("trim: the device does not discard: {error}"))
            } else {
                Error::io(format!("trim: discard of {length} bytes at {offset}"), error)
            }
        })?;
        discarded_bytes += length;
    }
    Ok(discarded_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Allocator;
    use crate::format::Region;

    fn overlaps(a: BlockRun, b: BlockRun) -> bool {
        a.start < b.start + b.count && b.start < a.start + a.count
    }

    /// While a batch is being discarded its blocks cannot be allocated, so
    /// no new owner's write can be overtaken by the discard; reservations
    /// are left their blocks.
    #[test]
    fn a_batch_is_out_of_the_allocator_until_given_back() {
        let mut alloc = Allocator::new(Region { start_block: 100, block_count: 1000 });
        let used = alloc.allocate(100, 100, 0).unwrap();
        assert!(alloc.reserve(300));
        let (batch, next) = take_batch(&mut alloc, 0, 1100, 1, 1000);
        let held: u64 = batch.iter().map(|run| run.count).sum();
        assert_eq!(held, 300, "half of the 600 blocks not reserved");
        assert_eq!(next, 500, "the next batch starts after this one");
        assert!(batch.iter().all(|&run| !overlaps(run, used)));
        while let Some(run) = alloc.allocate(0, 1000, 0) {
            assert!(batch.iter().all(|&held| !overlaps(run, held)), "{run:?} is held");
        }
        assert_eq!(alloc.free_blocks(), 300, "the reserved blocks stay free");
        batch.iter().for_each(|&run| alloc.free(run));
        assert_eq!(alloc.free_blocks(), 600);
    }

    /// Runs shorter than the minimum are skipped, and a batch stops short of
    /// the budget rather than take a piece under the minimum.
    #[test]
    fn a_batch_takes_runs_of_the_minimum_length_only() {
        let mut alloc = Allocator::new(Region { start_block: 0, block_count: 100 });
        for (start, count) in [(0, 10), (12, 3), (20, 40)] {
            alloc.mark_used(BlockRun { start, count }).unwrap();
        }
        // Free now: 10..12, 15..20 and 60..100; half of the 47 is 24.
        let (batch, next) = take_batch(&mut alloc, 0, 100, 3, 100);
        assert_eq!(
            batch,
            vec![BlockRun { start: 15, count: 5 }, BlockRun { start: 60, count: 19 }]
        );
        assert_eq!(next, 79);
        // The next batch goes on from there (half of the 23 left); the
        // 2-block run stays.
        let (batch, next) = take_batch(&mut alloc, next, 100, 3, 100);
        assert_eq!((batch, next), (vec![BlockRun { start: 79, count: 12 }], 91));
        let mut alloc = Allocator::new(Region { start_block: 0, block_count: 100 });
        let (batch, next) = take_batch(&mut alloc, 0, 100, 1, 30);
        assert_eq!((batch, next), (vec![BlockRun { start: 0, count: 30 }], 30));
    }
}
