//! The data blocks no file maps at a checkpoint's cut, as the metadata
//! index keeps them (format 3), so that open reads free space instead of
//! deriving it from every extent map.
//!
//! A cut brings the set up to date from what changed: every changed
//! inode's extents as the index held them go back in, then its extents at
//! the cut come out (`super::indexed`). That holds while no block is mapped
//! twice: a volume with shared blocks (clones) keeps no set, and its open
//! derives free space from every extent map, as format 2 does. The index's
//! own pages are in the set (no file maps them); open takes them out.

use std::collections::BTreeMap;

use crate::alloc::{Allocator, BlockRun};
use crate::format::Region;

/// Disjoint, non-adjacent runs of blocks: start -> count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FreeSet {
    runs: BTreeMap<u64, u64>,
}

impl FreeSet {
    /// What `alloc` holds free.
    pub fn of(alloc: &Allocator) -> Self {
        let mut set = Self::default();
        for run in alloc.free_runs() {
            set.runs.insert(run.start, run.count);
        }
        set
    }

    /// The set from runs read back (in any order); fails where two overlap.
    pub fn from_runs(runs: impl IntoIterator<Item = BlockRun>) -> Result<Self, String> {
        let mut set = Self::default();
        for run in runs {
            set.insert(run)?;
        }
        Ok(set)
    }

    pub fn runs(&self) -> impl Iterator<Item = BlockRun> + '_ {
        self.runs.iter().map(|(&start, &count)| BlockRun { start, count })
    }

    /// Whether `run` is one of the set's runs, exactly.
    pub fn holds_run(&self, run: BlockRun) -> bool {
        self.runs.get(&run.start) == Some(&run.count)
    }

    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// Adds `run`, joined to its neighbours; fails if any of it is in.
    pub fn insert(&mut self, run: BlockRun) -> Result<(), String> {
        if run.count == 0 {
            return Ok(());
        }
        let end = run.start.checked_add(run.count).ok_or("a free run past the last block")?;
        let before = self.runs.range(..=run.start).next_back().map(|(&s, &c)| (s, c));
        if before.is_some_and(|(start, count)| start + count > run.start) {
            return Err(format!("blocks [{}, +{}) are free twice", run.start, run.count));
        }
        if self.runs.range(run.start..end).next().is_some() {
            return Err(format!("blocks [{}, +{}) are free twice", run.start, run.count));
        }
        let (mut start, mut count) = (run.start, run.count);
        if let Some((before_start, before_count)) = before {
            if before_start + before_count == start {
                self.runs.remove(&before_start);
                start = before_start;
                count += before_count;
            }
        }
        if let Some(after_count) = self.runs.remove(&end) {
            count += after_count;
        }
        self.runs.insert(start, count);
        Ok(())
    }

    /// Takes `run` out; fails unless all of it is in.
    pub fn remove(&mut self, run: BlockRun) -> Result<(), String> {
        if run.count == 0 {
            return Ok(());
        }
        let end = run.start.saturating_add(run.count);
        let holder = self.runs.range(..=run.start).next_back().map(|(&s, &c)| (s, c));
        let Some((start, count)) = holder.filter(|(start, count)| start + count >= end) else {
            return Err(format!("blocks [{}, +{}) are not all free", run.start, run.count));
        };
        self.runs.remove(&start);
        if start < run.start {
            self.runs.insert(start, run.start - start);
        }
        if end < start + count {
            self.runs.insert(end, start + count - end);
        }
        Ok(())
    }

    /// An allocator whose free space is this set.
    pub fn allocator(&self, region: Region) -> Result<Allocator, String> {
        let mut alloc = Allocator::new(region);
        let mut at = region.start_block;
        for run in
            self.runs().chain(std::iter::once(BlockRun { start: region.end_block(), count: 0 }))
        {
            if run.start < at || run.start + run.count > region.end_block() {
                return Err(format!(
                    "free blocks [{}, +{}) outside the data region",
                    run.start, run.count
                ));
            }
            if at < run.start {
                alloc.mark_used(BlockRun { start: at, count: run.start - at })?;
            }
            at = run.start + run.count;
        }
        Ok(alloc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: u64, count: u64) -> BlockRun {
        BlockRun { start, count }
    }

    #[test]
    fn runs_join_split_and_refuse_what_is_not_theirs() {
        let mut set = FreeSet::default();
        set.insert(run(10, 5)).unwrap();
        set.insert(run(20, 5)).unwrap();
        set.insert(run(15, 5)).unwrap();
        assert_eq!(set.runs().collect::<Vec<_>>(), [run(10, 15)]);
        assert!(set.insert(run(24, 2)).is_err());
        assert!(set.insert(run(5, 6)).is_err());
        set.remove(run(12, 3)).unwrap();
        assert_eq!(set.runs().collect::<Vec<_>>(), [run(10, 2), run(15, 10)]);
        assert!(set.remove(run(11, 3)).is_err());
        assert!(set.remove(run(30, 1)).is_err());
        set.remove(run(10, 2)).unwrap();
        set.remove(run(15, 10)).unwrap();
        assert_eq!(set.len(), 0);
    }

    #[test]
    fn an_allocator_made_from_a_set_frees_exactly_the_set() {
        let region = Region { start_block: 100, block_count: 100 };
        let set = FreeSet::from_runs([run(100, 3), run(150, 10), run(195, 5)]).unwrap();
        let alloc = set.allocator(region).unwrap();
        assert_eq!(FreeSet::of(&alloc), set);
        assert!(FreeSet::from_runs([run(300, 1)]).unwrap().allocator(region).is_err());
    }
}
