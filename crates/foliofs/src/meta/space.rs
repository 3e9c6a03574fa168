//! Free space: the allocator, the blocks freed by records not yet durable,
//! and those waiting for a discard. Memory only, rebuilt from the extent
//! maps at mount; under its own mutex, taken after any shard and held only
//! for the allocation or free itself.

use std::collections::BTreeMap;

use crate::alloc::{Allocator, BlockRun};
use crate::extent::{Extent, ExtentKind};
use crate::refcount::SharedBlocks;

/// Runs freed by records not yet durable, by the lsn of the record. Every
/// transaction releases those that became durable and every delayed
/// allocation asks how many blocks wait: neither walks the runs, which an
/// `rm -rf` of a tree leaves by the thousand until the next commit.
#[derive(Default)]
struct PendingFrees {
    by_lsn: BTreeMap<u64, Vec<BlockRun>>,
    blocks: u64,
}

impl PendingFrees {
    fn push(&mut self, lsn: u64, run: BlockRun) {
        assert!(run.count > 0, "an empty run freed at lsn {lsn}");
        self.by_lsn.entry(lsn).or_default().push(run);
        self.blocks += run.count;
    }

    fn first_lsn(&self) -> Option<u64> {
        self.by_lsn.first_key_value().map(|(&lsn, _)| lsn)
    }

    /// Removes and returns the runs freed by records up to `durable_lsn`.
    fn take_through(&mut self, durable_lsn: u64) -> Vec<BlockRun> {
        match self.by_lsn.first_key_value() {
            Some((&lsn, _)) if lsn <= durable_lsn => {}
            _ => return Vec::new(),
        }
        let later = match durable_lsn.checked_add(1) {
            Some(next) => self.by_lsn.split_off(&next),
            None => BTreeMap::new(),
        };
        let taken: Vec<BlockRun> =
            std::mem::replace(&mut self.by_lsn, later).into_values().flatten().collect();
        let taken_blocks = taken.iter().map(|run| run.count).sum::<u64>();
        assert!(taken_blocks <= self.blocks, "{taken_blocks} blocks taken of {}", self.blocks);
        self.blocks -= taken_blocks;
        // What is left was freed by records after `durable_lsn` only.
        debug_assert!(self.first_lsn().is_none_or(|lsn| lsn > durable_lsn));
        taken
    }
}

/// Blocks that were shared until a record not yet durable dropped all but
/// one of their mappings (a clone deleted, truncated or overwritten). The
/// one mapping left must not be written in place until that record is
/// durable: a crash before it brings the other mappings back, and they
/// must read what they held. So until then a write copies them like
/// shared blocks, as a free waits in [`PendingFrees`] before reuse.
#[derive(Default)]
pub struct Unsharing {
    by_lsn: BTreeMap<u64, Vec<BlockRun>>,
    /// How many pending records cover each block, plus one (a
    /// [`SharedBlocks`] table: a block in it is still copied on write).
    covered: SharedBlocks,
}

impl Unsharing {
    pub fn push(&mut self, lsn: u64, run: BlockRun) {
        assert!(run.count > 0, "an empty run unshared at lsn {lsn}");
        self.by_lsn.entry(lsn).or_default().push(run);
        self.cover(run, 1);
    }

    fn cover(&mut self, run: BlockRun, change: i64) {
        for piece in self.covered.counted(run.start, run.count) {
            let refs = u32::try_from(i64::from(piece.refs) + change).expect("covered count");
            self.covered.set(piece.start, piece.count, refs);
        }
    }

    pub fn first_lsn(&self) -> Option<u64> {
        self.by_lsn.first_key_value().map(|(&lsn, _)| lsn)
    }

    /// Forgets the runs of records up to `durable_lsn`: now written in place.
    fn release_through(&mut self, durable_lsn: u64) {
        while let Some(entry) = self.by_lsn.first_entry() {
            if *entry.key() > durable_lsn {
                break;
            }
            for run in entry.remove() {
                self.cover(run, -1);
            }
        }
        debug_assert!(self.first_lsn().is_none_or(|lsn| lsn > durable_lsn));
    }

    /// Blocks still copied on write for this reason.
    pub fn blocks(&self) -> u64 {
        self.covered.shared_blocks()
    }
}

pub struct Space {
    pub alloc: Allocator,
    /// Device blocks more than one file block maps, and how many.
    pub shared: SharedBlocks,
    /// Blocks mapped once, by a record not yet durable: still copied on write.
    pub unsharing: Unsharing,
    /// Blocks freed by records not yet durable, by the lsn that freed them.
    pending_frees: PendingFrees,
    /// With `-o discard`: durable frees wait for their discard (see
    /// `MetaStore::discard_durable_frees`) instead of going straight back
    /// to the allocator.
    pub discard_freed: bool,
    /// Runs taken for discarding, not yet back in the allocator.
    discarding_blocks: u64,
}

impl Space {
    pub fn new(alloc: Allocator, shared: SharedBlocks) -> Self {
        Self {
            alloc,
            shared,
            unsharing: Unsharing::default(),
            pending_frees: PendingFrees::default(),
            discard_freed: false,
            discarding_blocks: 0,
        }
    }

    /// Frees `extents` displaced by a record with `lsn`: delayed allocations
    /// return their reservation now (but for `already_unreserved` blocks,
    /// whose reservation an allocation took over: [`Space::allocate_reserved`]);
    /// device blocks become reusable only once `lsn` is durable.
    pub fn release_displaced(&mut self, extents: &[Extent], lsn: u64, already_unreserved: u64) {
        let mut already_unreserved = already_unreserved;
        for extent in extents {
            match extent.kind {
                ExtentKind::Delalloc => {
                    let taken_over = already_unreserved.min(extent.block_count);
                    already_unreserved -= taken_over;
                    self.alloc.unreserve(extent.block_count - taken_over);
                }
                ExtentKind::Unwritten | ExtentKind::Written => {
                    let run = BlockRun { start: extent.dev_block, count: extent.block_count };
                    self.pending_frees.push(lsn, run);
                }
            }
        }
    }

    /// Allocates up to `count` blocks near `goal` for a delayed extent, paid
    /// for by its reservation, which the run takes over at once: free space
    /// never shows the blocks both reserved and allocated. The transaction
    /// that maps the run says so when the delayed extent goes
    /// (`already_unreserved` of [`Space::release_displaced`]).
    pub fn allocate_reserved(&mut self, goal: u64, count: u64) -> Option<BlockRun> {
        assert!(count > 0, "allocating no blocks for a delayed extent");
        let run = self.alloc.allocate(goal, count, count)?;
        assert!(run.count > 0 && run.count <= count, "{run:?} for {count} blocks");
        Some(run)
    }

    /// Makes blocks freed by records up to `durable_lsn` allocatable (with
    /// `discard_freed` they wait for [`Space::take_durable_frees`]), and
    /// those such records left mapped once writable in place.
    pub fn release_pending_frees(&mut self, durable_lsn: u64) {
        self.unsharing.release_through(durable_lsn);
        if self.discard_freed {
            return;
        }
        for run in self.pending_frees.take_through(durable_lsn) {
            self.alloc.free(run);
        }
    }

    /// The lsn of the earliest record whose freed blocks wait (unless they
    /// wait for discards) or whose unshared blocks are still copied on
    /// write; None when none do.
    pub fn first_pending_lsn(&self) -> Option<u64> {
        let frees = if self.discard_freed { None } else { self.pending_frees.first_lsn() };
        frees.into_iter().chain(self.unsharing.first_lsn()).min()
    }

    /// Whether device block `start` must be copied on write (shared, or
    /// unshared by a record not yet durable), and for how many blocks from
    /// it (up to `count`) that answer holds.
    pub fn copy_on_write_run(&self, start: u64, count: u64) -> (bool, u64) {
        let (shared, shared_for) = self.shared.run_at(start, count);
        let (unsharing, unsharing_for) = self.unsharing.covered.run_at(start, count);
        let answer = match (shared, unsharing) {
            (false, false) => (false, shared_for.min(unsharing_for)),
            (true, false) => (true, shared_for),
            (false, true) => (true, unsharing_for),
            (true, true) => (true, shared_for.max(unsharing_for)),
        };
        debug_assert!(answer.1 <= count, "an answer for {} of {count} blocks", answer.1);
        answer
    }

    /// Takes the runs freed by records up to `durable_lsn`, to be discarded
    /// and then handed to [`Space::finish_discards`]; still counted as
    /// pending meanwhile.
    pub fn take_durable_frees(&mut self, durable_lsn: u64) -> Vec<BlockRun> {
        let taken = self.pending_frees.take_through(durable_lsn);
        self.discarding_blocks += taken.iter().map(|run| run.count).sum::<u64>();
        taken
    }

    /// Makes runs taken by [`Space::take_durable_frees`] allocatable.
    pub fn finish_discards(&mut self, runs: &[BlockRun]) {
        for &run in runs {
            assert!(
                run.count <= self.discarding_blocks,
                "{run:?} discarded of {} blocks taken",
                self.discarding_blocks
            );
            self.discarding_blocks -= run.count;
            self.alloc.free(run);
        }
    }

    pub fn pending_free_blocks(&self) -> u64 {
        self.pending_frees.blocks + self.discarding_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Region;

    fn space() -> Space {
        let region = Region { start_block: 100, block_count: 1000 };
        let mut alloc = Allocator::new(region);
        alloc.mark_used(BlockRun { start: 200, count: 4 }).unwrap();
        Space::new(alloc, SharedBlocks::new())
    }

    fn written(dev_block: u64, block_count: u64) -> Extent {
        Extent { file_block: 0, block_count, dev_block, kind: ExtentKind::Written }
    }

    #[test]
    fn unshared_blocks_are_copied_until_their_record_is_durable() {
        let mut space = space();
        space.shared.set(300, 4, 2);
        let run = |start, count| BlockRun { start, count };
        space.unsharing.push(10, run(100, 4));
        space.unsharing.push(12, run(102, 4));
        assert_eq!(space.first_pending_lsn(), Some(10));
        assert_eq!(space.unsharing.blocks(), 6);
        assert_eq!(space.copy_on_write_run(98, 10), (false, 2));
        assert_eq!(space.copy_on_write_run(100, 10), (true, 6));
        assert_eq!(space.copy_on_write_run(300, 10), (true, 4));
        space.release_pending_frees(11);
        assert_eq!(space.copy_on_write_run(100, 10), (false, 2));
        assert_eq!(space.copy_on_write_run(102, 10), (true, 4));
        assert_eq!(space.first_pending_lsn(), Some(12));
        space.release_pending_frees(12);
        assert_eq!(space.unsharing.blocks(), 0);
        assert_eq!(space.first_pending_lsn(), None);
        assert_eq!(space.copy_on_write_run(100, 10), (false, 10));
    }

    #[test]
    fn freed_blocks_wait_for_durability() {
        let mut space = space();
        space.release_displaced(&[written(200, 4)], 10, 0);
        assert_eq!(space.alloc.free_blocks(), 996);
        assert_eq!(space.pending_free_blocks(), 4);
        assert_eq!(space.first_pending_lsn(), Some(10));
        space.release_pending_frees(9);
        assert_eq!(space.alloc.free_blocks(), 996);
        space.release_pending_frees(10);
        assert_eq!(space.alloc.free_blocks(), 1000);
        assert_eq!(space.first_pending_lsn(), None);
    }

    #[test]
    fn pending_frees_leave_in_lsn_order_and_keep_their_count() {
        let run = |start, count| BlockRun { start, count };
        let mut pending = PendingFrees::default();
        pending.push(12, run(100, 3));
        pending.push(10, run(200, 1));
        pending.push(12, run(300, 2));
        pending.push(15, run(400, 4));
        assert_eq!(pending.blocks, 10);
        assert!(pending.take_through(9).is_empty());
        assert_eq!(pending.take_through(10), vec![run(200, 1)]);
        assert_eq!(pending.take_through(14), vec![run(100, 3), run(300, 2)]);
        assert_eq!(pending.blocks, 4);
        assert_eq!(pending.take_through(u64::MAX), vec![run(400, 4)]);
        assert_eq!(pending.blocks, 0);
        assert!(pending.by_lsn.is_empty());
    }

    /// A delayed extent's blocks, once allocated, are never counted both
    /// as reserved and as allocated, and its reservation is returned once.
    #[test]
    fn an_allocation_takes_over_its_reservation() {
        let mut space = space();
        assert!(space.alloc.reserve(8));
        let available = space.alloc.available_blocks();
        let run = space.allocate_reserved(300, 8).unwrap();
        assert_eq!(run.count, 8);
        assert_eq!(space.alloc.available_blocks(), available, "moved, not counted twice");
        let delayed =
            Extent { file_block: 0, block_count: 8, dev_block: 0, kind: ExtentKind::Delalloc };
        space.release_displaced(&[delayed], 11, 8);
        assert_eq!(space.alloc.reserved_blocks(), 0);
        assert_eq!(space.alloc.available_blocks(), available);
    }

    /// With discard, durable frees stay out of the allocator (and counted
    /// as pending) until their discard is done: nothing can be allocated
    /// on blocks a discard in flight may still wipe.
    #[test]
    fn discarded_blocks_wait_for_their_discard() {
        let mut space = space();
        space.discard_freed = true;
        space.release_displaced(&[written(200, 4)], 10, 0);
        assert!(space.take_durable_frees(9).is_empty(), "not durable yet");
        space.release_pending_frees(10);
        assert_eq!(space.alloc.free_blocks(), 996, "release leaves them to the discard");
        let runs = space.take_durable_frees(10);
        assert_eq!(runs.iter().map(|run| run.count).sum::<u64>(), 4);
        assert_eq!(space.alloc.free_blocks(), 996, "not reusable while discarding");
        assert_eq!(space.pending_free_blocks(), 4, "still counted as freed space");
        space.finish_discards(&runs);
        assert_eq!(space.alloc.free_blocks(), 1000);
        assert_eq!(space.pending_free_blocks(), 0);
    }
}
