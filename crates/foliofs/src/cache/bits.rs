//! Per-block state bits of a folio (the kernel's `iomap_folio_state`
//! bitmaps): one bit per file-system block, so a 2 MiB folio of 4 KiB blocks
//! needs 512 bits.

use smallvec::{smallvec, SmallVec};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockBits {
    /// Inline up to 64 blocks: a folio's four bitmaps then cost no heap
    /// allocation, and most folios (every small file's) have one block.
    words: SmallVec<[u64; 1]>,
    block_count: usize,
}

impl BlockBits {
    pub fn new(block_count: usize) -> Self {
        Self { words: smallvec![0; block_count.div_ceil(64)], block_count }
    }

    pub fn block_count(&self) -> usize {
        self.block_count
    }

    pub fn get(&self, block: usize) -> bool {
        debug_assert!(block < self.block_count, "block {block} of {}", self.block_count);
        self.words[block / 64] & (1 << (block % 64)) != 0
    }

    /// Sets `[first, first + count)`; returns how many bits were clear before.
    pub fn set_range(&mut self, first: usize, count: usize) -> usize {
        self.update_range(first, count, true)
    }

    /// Clears `[first, first + count)`; returns how many bits were set before.
    pub fn clear_range(&mut self, first: usize, count: usize) -> usize {
        self.update_range(first, count, false)
    }

    fn update_range(&mut self, first: usize, count: usize, set: bool) -> usize {
        assert!(first + count <= self.block_count, "bit range past the folio");
        let mut changed = 0;
        let mut block = first;
        let end = first + count;
        while block < end {
            let word = block / 64;
            let bit = block % 64;
            let span = (64 - bit).min(end - block);
            let mask = if span == 64 { u64::MAX } else { ((1u64 << span) - 1) << bit };
            let before = self.words[word];
            if set {
                changed += (!before & mask).count_ones() as usize;
                self.words[word] = before | mask;
            } else {
                changed += (before & mask).count_ones() as usize;
                self.words[word] = before & !mask;
            }
            block += span;
        }
        debug_assert!(changed <= count, "{changed} bits changed in a range of {count}");
        changed
    }

    /// Whether every bit of `[first, first + count)` is set.
    pub fn all_set(&self, first: usize, count: usize) -> bool {
        debug_assert!(first + count <= self.block_count, "bit range past the folio");
        (first..first + count).all(|block| self.get(block))
    }

    pub fn count_set(&self) -> usize {
        let count = self.words.iter().map(|word| word.count_ones() as usize).sum();
        // No bit past the folio's blocks is ever set (update_range asserts).
        debug_assert!(count <= self.block_count, "{count} bits set of {}", self.block_count);
        count
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&word| word == 0)
    }

    /// Clears every bit; returns the bits as they were.
    pub fn take(&mut self) -> BlockBits {
        let empty = BlockBits::new(self.block_count);
        std::mem::replace(self, empty)
    }

    /// Sets every bit that is set in `other`; returns how many were clear.
    pub fn union_with(&mut self, other: &BlockBits) -> usize {
        assert_eq!(self.block_count, other.block_count);
        let mut changed = 0;
        for (word, &theirs) in self.words.iter_mut().zip(other.words.iter()) {
            changed += (!*word & theirs).count_ones() as usize;
            *word |= theirs;
        }
        changed
    }

    /// Keeps only the bits also set in `other`.
    pub fn intersect_with(&mut self, other: &BlockBits) {
        assert_eq!(self.block_count, other.block_count);
        for (word, &theirs) in self.words.iter_mut().zip(other.words.iter()) {
            *word &= theirs;
        }
    }

    /// Runs of set bits as `(first, count)`, in order.
    pub fn runs(&self) -> Vec<(usize, usize)> {
        let mut runs = Vec::new();
        let mut block = 0;
        while block < self.block_count {
            if !self.get(block) {
                block += 1;
                continue;
            }
            let start = block;
            while block < self.block_count && self.get(block) {
                block += 1;
            }
            runs.push((start, block - start));
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_across_words() {
        let mut bits = BlockBits::new(512);
        assert_eq!(bits.set_range(60, 10), 10);
        assert_eq!(bits.set_range(65, 10), 5);
        assert!(bits.all_set(60, 15));
        assert!(!bits.all_set(59, 2));
        assert_eq!(bits.runs(), vec![(60, 15)]);
        assert_eq!(bits.clear_range(0, 64), 4);
        assert_eq!(bits.runs(), vec![(64, 11)]);
        let taken = bits.take();
        assert!(bits.is_empty());
        assert_eq!(taken.count_set(), 11);
        assert_eq!(bits.union_with(&taken), 11);
    }

    proptest! {
        #[test]
        fn matches_a_vector_of_booleans(
            block_count in 1usize..300,
            operations in proptest::collection::vec((any::<bool>(), 0usize..300, 0usize..300), 1..40),
        ) {
            let mut bits = BlockBits::new(block_count);
            let mut model = vec![false; block_count];
            for (set, first, count) in operations {
                let first = first % block_count;
                let count = count % (block_count - first + 1);
                let changed = if set { bits.set_range(first, count) } else { bits.clear_range(first, count) };
                let expected = model[first..first + count].iter().filter(|&&bit| bit != set).count();
                prop_assert_eq!(changed, expected);
                model[first..first + count].iter_mut().for_each(|bit| *bit = set);
            }
            for (block, &bit) in model.iter().enumerate() {
                prop_assert_eq!(bits.get(block), bit);
            }
            let from_runs: usize = bits.runs().iter().map(|(_, count)| count).sum();
            prop_assert_eq!(from_runs, model.iter().filter(|&&bit| bit).count());
        }
    }
}
