//! Free-space allocator over the data region.
//!
//! Free space is not persisted: mount rebuilds it from the extent maps (every
//! data block not mapped by a file is free), so it can never disagree with them.
//! Two indexes over the free extents: by start (to allocate near a goal and to
//! merge neighbours on free) and by length (best fit when the goal area is full).
//!
//! Blocks freed by a transaction are not reusable until that transaction is
//! durable (see `meta`): otherwise a crash could leave a block owned by the old
//! file on disk while it already holds the new owner's data.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::format::Region;

/// What free space is promised to: the blocks reserved by delayed
/// allocations, and the free blocks no one was promised. Atomic, so that a
/// buffered write reserves its blocks without the allocator's lock (every
/// write into a hole reserves), and exact: every reservation and every
/// allocation claims from `unpromised` with one compare-and-swap, so
/// `unpromised == free - reserved` whenever no claim is half done, and no
/// two claims can both take the last block.
#[derive(Debug)]
pub struct Promises {
    unpromised: AtomicU64,
    reserved: AtomicU64,
}

impl Promises {
    /// Takes up to `count` unpromised blocks; returns how many.
    fn claim_up_to(&self, count: u64) -> u64 {
        let mut claimed = 0;
        let _ = self.unpromised.fetch_update(Ordering::AcqRel, Ordering::Acquire, |unpromised| {
            claimed = count.min(unpromised);
            Some(unpromised - claimed)
        });
        debug_assert!(claimed <= count);
        claimed
    }

    fn give_back(&self, count: u64) {
        self.unpromised.fetch_add(count, Ordering::AcqRel);
    }

    /// Promises up to `count` blocks to a delayed allocation; returns how
    /// many it got (fewer when space is short).
    pub fn reserve_up_to(&self, count: u64) -> u64 {
        let granted = self.claim_up_to(count);
        self.reserved.fetch_add(granted, Ordering::AcqRel);
        granted
    }

    /// Promises exactly `count` blocks, or none (false).
    pub fn reserve(&self, count: u64) -> bool {
        let taken =
            self.unpromised.fetch_update(Ordering::AcqRel, Ordering::Acquire, |unpromised| {
                unpromised.checked_sub(count)
            });
        if taken.is_ok() {
            self.reserved.fetch_add(count, Ordering::AcqRel);
        }
        taken.is_ok()
    }

    /// A delayed allocation gives up `count` blocks of its reservation.
    pub fn unreserve(&self, count: u64) {
        let before = self.reserved.fetch_sub(count, Ordering::AcqRel);
        assert!(count <= before, "unreserving {count} blocks of {before} reserved");
        self.give_back(count);
    }

    /// Free blocks not promised to a reservation.
    pub fn available_blocks(&self) -> u64 {
        self.unpromised.load(Ordering::Acquire)
    }

    pub fn reserved_blocks(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }
}

/// How far past the goal we look for a fitting free extent before falling
/// back to best fit anywhere. Bounds the cost of an allocation.
const GOAL_SCAN_EXTENTS_MAX: usize = 64;

#[derive(Debug)]
pub struct Allocator {
    region: Region,
    by_start: BTreeMap<u64, u64>,
    by_length: BTreeSet<(u64, u64)>,
    free_blocks: u64,
    /// Reservations and unpromised space, shared with whoever reserves
    /// without this allocator's lock.
    promises: Arc<Promises>,
    /// Where the last allocation ended: the goal for a file with no extents,
    /// so new files are laid out one after another.
    cursor: u64,
}

/// A run of device blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockRun {
    pub start: u64,
    pub count: u64,
}

impl Allocator {
    /// An allocator with the whole data region free.
    pub fn new(region: Region) -> Self {
        let mut allocator = Self {
            region,
            by_start: BTreeMap::new(),
            by_length: BTreeSet::new(),
            free_blocks: 0,
            promises: Arc::new(Promises {
                unpromised: AtomicU64::new(region.block_count),
                reserved: AtomicU64::new(0),
            }),
            cursor: region.start_block,
        };
        allocator.insert_free(region.start_block, region.block_count);
        debug_assert_eq!(allocator.free_blocks, region.block_count);
        allocator
    }

    pub fn region(&self) -> Region {
        self.region
    }

    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    pub fn reserved_blocks(&self) -> u64 {
        self.promises.reserved_blocks()
    }

    /// Free blocks not promised to a reservation.
    pub fn available_blocks(&self) -> u64 {
        self.promises.available_blocks()
    }

    /// The reservations, for those who reserve without this lock.
    pub fn promises(&self) -> &Arc<Promises> {
        &self.promises
    }

    /// Promises exactly `count` blocks to a delayed allocation, or none.
    pub fn reserve(&mut self, count: u64) -> bool {
        self.promises.reserve(count)
    }

    pub fn unreserve(&mut self, count: u64) {
        self.promises.unreserve(count);
    }

    pub fn free_extent_count(&self) -> usize {
        self.by_start.len()
    }

    /// Marks `run` used; fails (naming the first block) if any of it is not
    /// free or lies outside the data region. Mount uses this to rebuild free
    /// space, so a failure means two files claim the same block.
    pub fn mark_used(&mut self, run: BlockRun) -> Result<(), String> {
        self.check_free(run)?;
        let claimed = self.promises.claim_up_to(run.count);
        assert_eq!(claimed, run.count, "free blocks promised to reservations taken");
        self.take_free(run);
        Ok(())
    }

    /// Takes the free `run`, whose blocks the caller claimed from the
    /// unpromised ones ([`Allocator::claim_up_to`]).
    pub fn take_claimed(&mut self, run: BlockRun) -> Result<(), String> {
        self.check_free(run)?;
        self.take_free(run);
        Ok(())
    }

    /// Claims up to `count` unpromised blocks for [`Allocator::take_claimed`];
    /// what is not taken goes back with [`Allocator::return_claimed`].
    pub fn claim_up_to(&mut self, count: u64) -> u64 {
        self.promises.claim_up_to(count)
    }

    pub fn return_claimed(&mut self, count: u64) {
        self.promises.give_back(count);
    }

    fn take_free(&mut self, run: BlockRun) {
        let (&free_start, &free_count) =
            self.by_start.range(..=run.start).next_back().expect("checked free");
        let free_before = self.free_blocks;
        self.take(free_start, free_count, run);
        debug_assert_eq!(self.free_blocks, free_before - run.count);
    }

    /// Whether `run` lies in the data region and is all free.
    fn check_free(&self, run: BlockRun) -> Result<(), String> {
        let outside = run.start < self.region.start_block
            || run.start.checked_add(run.count).is_none_or(|end| end > self.region.end_block());
        if run.count == 0 || outside {
            return Err(format!(
                "extent of {} blocks at {} lies outside the data region",
                run.count, run.start
            ));
        }
        let Some((&free_start, &free_count)) = self.by_start.range(..=run.start).next_back() else {
            return Err(format!("block {} is mapped twice", run.start));
        };
        if free_start + free_count < run.start + run.count {
            let first_used = (run.start..run.start + run.count)
                .find(|&block| !(free_start..free_start + free_count).contains(&block))
                .unwrap_or(run.start);
            return Err(format!("block {first_used} is mapped twice"));
        }
        Ok(())
    }

    /// Allocates up to `count` contiguous blocks, preferably at or after `goal`.
    /// Returns a shorter run only when no free extent is long enough.
    /// Up to `from_reserved` blocks come out of the caller's own reservation
    /// (a delayed allocation being replaced), which shrinks by as many; the
    /// rest are claimed from the unpromised blocks.
    pub fn allocate(&mut self, goal: u64, count: u64, from_reserved: u64) -> Option<BlockRun> {
        debug_assert!(from_reserved <= count);
        let claimed = self.promises.claim_up_to(count - from_reserved);
        let count = from_reserved + claimed;
        let found = (count > 0)
            .then(|| self.find_near(goal, count).or_else(|| self.find_best_fit(count)))
            .flatten();
        let Some(run) = found else {
            self.promises.give_back(claimed);
            return None;
        };
        let from_reservation = from_reserved.min(run.count);
        let before = self.promises.reserved.fetch_sub(from_reservation, Ordering::AcqRel);
        assert!(from_reservation <= before, "allocating {from_reservation} reserved of {before}");
        // A run found is as long as asked at most, and inside the region.
        assert!(run.count > 0 && run.count <= count, "{run:?} for {count} blocks");
        debug_assert!(
            run.start >= self.region.start_block
                && run.start + run.count <= self.region.end_block()
        );
        self.promises.give_back(claimed - (run.count - from_reservation));
        self.take_free(run);
        self.cursor = run.start + run.count;
        Some(run)
    }

    fn find_near(&self, goal: u64, count: u64) -> Option<BlockRun> {
        debug_assert!(count > 0 && self.region.block_count > 0);
        let goal = goal.clamp(self.region.start_block, self.region.end_block() - 1);
        if let Some((&start, &length)) = self.by_start.range(..=goal).next_back() {
            if start + length >= goal + count {
                return Some(BlockRun { start: goal, count });
            }
        }
        self.by_start
            .range(goal..)
            .take(GOAL_SCAN_EXTENTS_MAX)
            .find(|(_, &length)| length >= count)
            .map(|(&start, _)| BlockRun { start, count })
    }

    fn find_best_fit(&self, count: u64) -> Option<BlockRun> {
        if let Some(&(_, start)) = self.by_length.range((count, 0)..).next() {
            return Some(BlockRun { start, count });
        }
        // Nothing long enough: the longest free extent, a partial allocation.
        let longest = self.by_length.iter().next_back();
        debug_assert!(longest.is_none_or(|&(length, _)| length < count));
        longest.map(|&(length, start)| BlockRun { start, count: length })
    }

    /// Removes `run` from the free extent `[free_start, free_start + free_count)`.
    fn take(&mut self, free_start: u64, free_count: u64, run: BlockRun) {
        debug_assert!(free_start <= run.start && run.start + run.count <= free_start + free_count);
        self.remove_free(free_start, free_count);
        if run.start > free_start {
            self.insert_free(free_start, run.start - free_start);
        }
        let free_end = free_start + free_count;
        let run_end = run.start + run.count;
        if run_end < free_end {
            self.insert_free(run_end, free_end - run_end);
        }
    }

    /// Returns `run` to free space, merging with its neighbours.
    pub fn free(&mut self, run: BlockRun) {
        self.free_run(run);
        self.promises.give_back(run.count);
    }

    fn free_run(&mut self, run: BlockRun) {
        assert!(run.count > 0);
        assert!(
            run.start >= self.region.start_block
                && run.start + run.count <= self.region.end_block()
        );
        let mut start = run.start;
        let mut count = run.count;
        if let Some((&left_start, &left_count)) = self.by_start.range(..start).next_back() {
            assert!(left_start + left_count <= start, "double free of block {start}");
            if left_start + left_count == start {
                self.remove_free(left_start, left_count);
                start = left_start;
                count += left_count;
            }
        }
        if let Some((&right_start, &right_count)) = self.by_start.range(start..).next() {
            assert!(run.start + run.count <= right_start, "double free of block {right_start}");
            if run.start + run.count == right_start {
                self.remove_free(right_start, right_count);
                count += right_count;
            }
        }
        debug_assert!(start <= run.start && count >= run.count);
        self.insert_free(start, count);
    }

    fn insert_free(&mut self, start: u64, count: u64) {
        debug_assert!(count > 0);
        let replaced = self.by_start.insert(start, count);
        debug_assert!(replaced.is_none(), "free extent at {start} inserted twice");
        let fresh = self.by_length.insert((count, start));
        debug_assert!(fresh, "the two indexes of free space disagree at {start}");
        self.free_blocks += count;
    }

    fn remove_free(&mut self, start: u64, count: u64) {
        let removed = self.by_start.remove(&start);
        debug_assert_eq!(removed, Some(count));
        let indexed = self.by_length.remove(&(count, start));
        debug_assert!(indexed, "the two indexes of free space disagree at {start}");
        self.free_blocks -= count;
    }

    /// The free extents that end after `block`, in block order (the first
    /// may hold `block`).
    pub fn free_runs_from(&self, block: u64) -> impl Iterator<Item = BlockRun> + '_ {
        let first = self
            .by_start
            .range(..=block)
            .next_back()
            .filter(|(&start, &count)| start + count > block)
            .map_or(block, |(&start, _)| start);
        self.by_start.range(first..).map(|(&start, &count)| BlockRun { start, count })
    }

    /// The free extents in block order (for fsck and tests).
    pub fn free_runs(&self) -> impl Iterator<Item = BlockRun> + '_ {
        self.by_start.iter().map(|(&start, &count)| BlockRun { start, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocator() -> Allocator {
        Allocator::new(Region { start_block: 100, block_count: 1000 })
    }

    #[test]
    fn allocates_at_goal_and_merges_on_free() {
        let mut allocator = allocator();
        let run = allocator.allocate(500, 10, 0).unwrap();
        assert_eq!(run, BlockRun { start: 500, count: 10 });
        assert_eq!(allocator.free_blocks(), 990);
        assert_eq!(allocator.free_extent_count(), 2);
        let next = allocator.allocate(500, 10, 0).unwrap();
        assert_eq!(next.start, 510, "near the goal, after the used part");
        allocator.free(run);
        allocator.free(next);
        assert_eq!(allocator.free_extent_count(), 1);
        assert_eq!(allocator.free_blocks(), 1000);
    }

    #[test]
    fn falls_back_to_best_fit_then_partial() {
        let mut allocator = allocator();
        allocator.mark_used(BlockRun { start: 100, count: 1000 }).unwrap();
        allocator.free(BlockRun { start: 200, count: 5 });
        allocator.free(BlockRun { start: 300, count: 20 });
        allocator.free(BlockRun { start: 400, count: 8 });
        assert_eq!(allocator.allocate(350, 7, 0), Some(BlockRun { start: 400, count: 7 }));
        assert_eq!(allocator.allocate(0, 50, 0), Some(BlockRun { start: 300, count: 20 }));
        assert_eq!(allocator.allocate(0, 50, 0), Some(BlockRun { start: 200, count: 5 }));
        assert_eq!(allocator.allocate(0, 50, 0), Some(BlockRun { start: 407, count: 1 }));
        assert_eq!(allocator.allocate(0, 1, 0), None);
    }

    #[test]
    fn mark_used_detects_double_mapping_and_out_of_region() {
        let mut allocator = allocator();
        allocator.mark_used(BlockRun { start: 150, count: 10 }).unwrap();
        let error = allocator.mark_used(BlockRun { start: 155, count: 10 }).unwrap_err();
        assert!(error.contains("155"), "{error}");
        assert!(allocator.mark_used(BlockRun { start: 50, count: 1 }).is_err());
        assert!(allocator.mark_used(BlockRun { start: 1099, count: 2 }).is_err());
        assert!(allocator.mark_used(BlockRun { start: u64::MAX, count: 2 }).is_err());
    }

    #[test]
    fn reservations_limit_unreserved_allocation() {
        let mut allocator = allocator();
        assert!(allocator.reserve(995));
        assert!(!allocator.reserve(6));
        assert_eq!(allocator.allocate(0, 10, 0).map(|run| run.count), Some(5));
        assert_eq!(allocator.available_blocks(), 0);
        // A delayed allocation of 100 blocks gets its space out of its
        // reservation, which shrinks by as much: no block counted twice.
        let run = allocator.allocate(0, 100, 100).unwrap();
        assert_eq!(run.count, 100);
        assert_eq!(allocator.free_blocks(), 895);
        assert_eq!(allocator.reserved_blocks(), 895);
        assert_eq!(allocator.available_blocks(), 0);
        allocator.unreserve(895);
        assert_eq!(allocator.available_blocks(), 895);
        assert_eq!(allocator.promises().reserve_up_to(1000), 895, "all that is left");
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_a_bug() {
        let mut allocator = allocator();
        allocator.free(BlockRun { start: 150, count: 1 });
    }
}
