//! Shared blocks: device blocks that more than one file block maps (a
//! clone's, or a deduplicated range's), with how many map each, as XFS's
//! refcount B-tree keeps them. A block absent from the table is mapped at
//! most once, so the table stays empty on a volume without clones and
//! costs the data paths one atomic load there.
//!
//! The table changes only at the end of a transaction ([`settle`]): the
//! references its records added (clones) and dropped (displaced extents)
//! are netted block by block against the counts, the counts that changed
//! are logged as `SharedSet` records in the same group, and only blocks
//! whose count reaches zero are freed. Mount checks every count against
//! the extent maps (`MetaState::finish_load`).

use std::collections::BTreeMap;

use crate::alloc::BlockRun;

/// The device blocks mapped more than once, as runs of equal count.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SharedBlocks {
    /// start -> (block count, references); runs never overlap, every count
    /// is at least 2, and neighbours with equal counts are joined.
    runs: BTreeMap<u64, (u64, u32)>,
    /// Blocks in `runs`.
    blocks: u64,
}

/// A piece of a device range and how many file blocks map each of its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub start: u64,
    pub count: u64,
    /// 1 where the table has no entry.
    pub refs: u32,
}

impl SharedBlocks {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Blocks mapped more than once (each counted once).
    pub fn shared_blocks(&self) -> u64 {
        self.blocks
    }

    /// Runs of equal count in the table: what its `SharedSet` records say.
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Every run, in device order.
    pub fn iter(&self) -> impl Iterator<Item = Counted> + '_ {
        self.runs.iter().map(|(&start, &(count, refs))| Counted { start, count, refs })
    }

    /// `[start, start + count)` cut where its count changes, in order; 1
    /// where the table has no entry.
    pub fn counted(&self, start: u64, count: u64) -> Vec<Counted> {
        let end = start + count;
        let mut pieces = Vec::new();
        let mut at = start;
        let before = self.runs.range(..start).next_back().map(|(&s, &v)| (s, v));
        let from = before.filter(|&(s, (c, _))| s + c > start).map_or(start, |(s, _)| s);
        for (&run_start, &(run_count, refs)) in self.runs.range(from..end) {
            let run_end = run_start + run_count;
            if run_end <= at {
                continue;
            }
            if run_start > at {
                pieces.push(Counted { start: at, count: run_start - at, refs: 1 });
                at = run_start;
            }
            let piece_end = run_end.min(end);
            pieces.push(Counted { start: at, count: piece_end - at, refs });
            at = piece_end;
        }
        if at < end {
            pieces.push(Counted { start: at, count: end - at, refs: 1 });
        }
        // The pieces tile `[start, end)`, in order.
        debug_assert!(pieces.windows(2).all(|pair| pair[0].start + pair[0].count == pair[1].start));
        debug_assert_eq!(pieces.iter().map(|piece| piece.count).sum::<u64>(), count);
        pieces
    }

    /// Whether block `start` is shared, and how many blocks from it (up to
    /// `count`) are as it is.
    pub fn run_at(&self, start: u64, count: u64) -> (bool, u64) {
        debug_assert!(count > 0, "the run at block {start} of no blocks");
        let pieces = self.counted(start, count);
        let shared = pieces[0].refs >= 2;
        let same: u64 = pieces
            .iter()
            .take_while(|piece| (piece.refs >= 2) == shared)
            .map(|piece| piece.count)
            .sum();
        debug_assert!(same > 0 && same <= count);
        (shared, same)
    }

    /// Sets every block of `[start, start + count)` to `refs` references (1:
    /// no longer shared, out of the table). What a `SharedSet` record does,
    /// live and at replay: an absolute value, so applying twice is once.
    pub fn set(&mut self, start: u64, count: u64, refs: u32) {
        debug_assert!(count > 0, "a count set for no blocks at {start}");
        let end = start + count;
        // Cut the runs that cross either end, then drop everything inside.
        self.split_at(start);
        self.split_at(end);
        let inside: Vec<u64> = self.runs.range(start..end).map(|(&s, _)| s).collect();
        for run_start in inside {
            let (run_count, _) = self.runs.remove(&run_start).expect("listed");
            // Split at both ends: what is removed lies inside the range.
            debug_assert!(run_start + run_count <= end);
            self.blocks -= run_count;
        }
        if refs >= 2 {
            self.runs.insert(start, (count, refs));
            self.blocks += count;
            self.join_at(start);
            self.join_at(end);
        }
    }

    /// Splits the run holding `block` (not at its start) in two there.
    fn split_at(&mut self, block: u64) {
        let Some((&run_start, &(run_count, refs))) = self.runs.range(..block).next_back() else {
            return;
        };
        if run_start + run_count > block {
            self.runs.insert(run_start, (block - run_start, refs));
            self.runs.insert(block, (run_start + run_count - block, refs));
        }
    }

    /// Joins the run starting at `block` to the one ending there, if their
    /// counts are equal.
    fn join_at(&mut self, block: u64) {
        let Some(&(count, refs)) = self.runs.get(&block) else { return };
        let Some((&before_start, &(before_count, before_refs))) =
            self.runs.range(..block).next_back()
        else {
            return;
        };
        if before_start + before_count == block && before_refs == refs {
            self.runs.remove(&block);
            self.runs.insert(before_start, (before_count + count, refs));
        }
    }
}

/// What a transaction's reference changes come to ([`settle`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settled {
    /// New counts, to log as `SharedSet` records (refs 1: unshared).
    pub counts: Vec<Counted>,
    /// Blocks no file maps any more: free once the records are durable.
    pub freed: Vec<BlockRun>,
    /// Blocks that were shared and are now mapped once: the one mapping
    /// left may write them in place only once the records are durable.
    pub unshared: Vec<BlockRun>,
}

/// Nets the references `added` (each block of each run one more mapping)
/// and `dropped` (one fewer) block by block, applies the new counts to
/// `table`, and returns them with the blocks whose count reached zero.
/// Every block named is mapped before the transaction (a clone's source,
/// a displaced extent), so one the table does not hold counts 1.
///
/// Panics if a count would go below zero: a transaction dropped more
/// mappings of a block than exist.
pub fn settle(table: &mut SharedBlocks, added: &[BlockRun], dropped: &[BlockRun]) -> Settled {
    // Change in count at each boundary; the running sum is each stretch's.
    let mut edges: BTreeMap<u64, i64> = BTreeMap::new();
    for (runs, sign) in [(added, 1i64), (dropped, -1i64)] {
        for run in runs.iter().filter(|run| run.count > 0) {
            *edges.entry(run.start).or_default() += sign;
            *edges.entry(run.start + run.count).or_default() -= sign;
        }
    }
    let mut settled = Settled::default();
    let mut delta = 0i64;
    let mut previous = None;
    for (&at, &change) in &edges {
        if let Some(start) = previous.filter(|_| delta != 0) {
            for piece in table.counted(start, at - start) {
                let refs = i64::from(piece.refs) + delta;
                assert!(
                    refs >= 0,
                    "device blocks [{}, +{}): {} references dropped from {}",
                    piece.start,
                    piece.count,
                    -delta,
                    piece.refs
                );
                if refs == 0 {
                    push_run(
                        &mut settled.freed,
                        BlockRun { start: piece.start, count: piece.count },
                    );
                    if piece.refs >= 2 {
                        // Every mapping went at once: out of the table too.
                        push_counted(&mut settled.counts, Counted { refs: 1, ..piece });
                    }
                } else {
                    let refs = u32::try_from(refs).expect("reference count fits u32");
                    if refs == 1 && piece.refs >= 2 {
                        push_run(
                            &mut settled.unshared,
                            BlockRun { start: piece.start, count: piece.count },
                        );
                    }
                    push_counted(&mut settled.counts, Counted { refs, ..piece });
                }
            }
        }
        delta += change;
        previous = Some(at);
    }
    // Every stretch listed changed by a nonzero delta, so a count of 1
    // there was a shared block's (or one no file maps any more): each
    // entry is a change to log.
    // Edges are walked in order and neighbours joined: each list is
    // sorted, its runs apart.
    debug_assert!(settled
        .freed
        .windows(2)
        .all(|pair| pair[0].start + pair[0].count < pair[1].start));
    debug_assert!(settled
        .counts
        .windows(2)
        .all(|pair| pair[0].start + pair[0].count <= pair[1].start));
    for counted in &settled.counts {
        table.set(counted.start, counted.count, counted.refs);
    }
    settled
}

fn push_run(runs: &mut Vec<BlockRun>, run: BlockRun) {
    match runs.last_mut() {
        Some(last) if last.start + last.count == run.start => last.count += run.count,
        _ => runs.push(run),
    }
}

fn push_counted(counts: &mut Vec<Counted>, counted: Counted) {
    match counts.last_mut() {
        Some(last) if last.start + last.count == counted.start && last.refs == counted.refs => {
            last.count += counted.count
        }
        _ => counts.push(counted),
    }
}

/// How many file blocks map each device block, from every mapped run:
/// the runs of count 1 and more, in device order. What mount checks the
/// table against.
pub fn count_mappings(mut runs: Vec<BlockRun>) -> Vec<Counted> {
    let mut edges: BTreeMap<u64, i64> = BTreeMap::new();
    runs.retain(|run| run.count > 0);
    for run in &runs {
        *edges.entry(run.start).or_default() += 1;
        *edges.entry(run.start + run.count).or_default() -= 1;
    }
    let mut counted = Vec::new();
    let mut refs = 0i64;
    let mut previous = None;
    for (&at, &change) in &edges {
        if let Some(start) = previous.filter(|_| refs > 0) {
            let refs = u32::try_from(refs).unwrap_or(u32::MAX);
            push_counted(&mut counted, Counted { start, count: at - start, refs });
        }
        refs += change;
        // Each run opens before it closes: never fewer than no mappings.
        debug_assert!(refs >= 0, "{refs} mappings of block {at}");
        previous = Some(at);
    }
    debug_assert_eq!(refs, 0, "a run left open");
    counted
}

/// Checks `table` against every mapped run: each stretch mapped more than
/// once carries exactly its count, and nothing else is counted. Returns
/// the mapped stretches (each block once), or what disagrees.
pub fn verify(mapped: Vec<BlockRun>, table: &SharedBlocks) -> Result<Vec<Counted>, String> {
    let counted = count_mappings(mapped);
    let mut shared_blocks_mapped = 0;
    for stretch in &counted {
        for piece in table.counted(stretch.start, stretch.count) {
            if piece.refs != stretch.refs {
                return Err(format!(
                    "device blocks [{}, +{}) are mapped {} times but counted {}",
                    piece.start, piece.count, stretch.refs, piece.refs
                ));
            }
        }
        if stretch.refs >= 2 {
            shared_blocks_mapped += stretch.count;
        }
    }
    if shared_blocks_mapped != table.shared_blocks() {
        // Name a counted run that the maps bear out less often.
        for run in table.iter() {
            let mapped_here: u64 = counted
                .iter()
                .filter(|stretch| stretch.refs >= 2)
                .map(|stretch| {
                    let start = stretch.start.max(run.start);
                    let end = (stretch.start + stretch.count).min(run.start + run.count);
                    end.saturating_sub(start)
                })
                .sum();
            if mapped_here < run.count {
                return Err(format!(
                    "device blocks [{}, +{}) are counted {} times, but only {mapped_here} of \
                     them are mapped more than once",
                    run.start, run.count, run.refs
                ));
            }
        }
        return Err(format!(
            "{} device blocks are counted as shared, {} are mapped more than once",
            table.shared_blocks(),
            shared_blocks_mapped
        ));
    }
    Ok(counted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: u64, count: u64) -> BlockRun {
        BlockRun { start, count }
    }

    fn counted(start: u64, count: u64, refs: u32) -> Counted {
        Counted { start, count, refs }
    }

    #[test]
    fn set_splits_joins_and_removes_runs() {
        let mut table = SharedBlocks::new();
        table.set(10, 10, 2);
        table.set(14, 2, 3);
        assert_eq!(
            table.iter().collect::<Vec<_>>(),
            vec![counted(10, 4, 2), counted(14, 2, 3), counted(16, 4, 2)]
        );
        assert_eq!(table.shared_blocks(), 10);
        table.set(14, 2, 2);
        assert_eq!(table.iter().collect::<Vec<_>>(), vec![counted(10, 10, 2)], "joined again");
        table.set(12, 3, 1);
        assert_eq!(table.iter().collect::<Vec<_>>(), vec![counted(10, 2, 2), counted(15, 5, 2)]);
        assert_eq!(table.shared_blocks(), 7);
        assert_eq!(
            table.counted(8, 10),
            vec![counted(8, 2, 1), counted(10, 2, 2), counted(12, 3, 1), counted(15, 3, 2)]
        );
        assert_eq!(table.run_at(15, 10), (true, 5));
        assert_eq!(table.run_at(12, 10), (false, 3));
        let once = table.clone();
        table.set(12, 3, 1);
        assert_eq!(table, once, "a record applied twice is applied once");
    }

    #[test]
    fn a_clone_then_both_frees_frees_the_blocks_once() {
        let mut table = SharedBlocks::new();
        let cloned = settle(&mut table, &[run(100, 8)], &[]);
        assert_eq!(cloned.counts, vec![counted(100, 8, 2)]);
        assert!(cloned.freed.is_empty());
        // The copy's first half is overwritten elsewhere: those blocks are
        // the original's alone again, and nothing is freed.
        let rewritten = settle(&mut table, &[], &[run(100, 4)]);
        assert_eq!(rewritten.counts, vec![counted(100, 4, 1)]);
        assert!(rewritten.freed.is_empty());
        assert_eq!(table.iter().collect::<Vec<_>>(), vec![counted(104, 4, 2)]);
        // The original goes: its unshared half is freed, the rest stays.
        let deleted = settle(&mut table, &[], &[run(100, 8)]);
        assert_eq!(deleted.freed, vec![run(100, 4)]);
        assert_eq!(deleted.counts, vec![counted(104, 4, 1)]);
        assert!(table.is_empty());
        let last = settle(&mut table, &[], &[run(104, 4)]);
        assert_eq!(last, Settled { freed: vec![run(104, 4)], ..Settled::default() });
    }

    #[test]
    fn cloning_over_a_range_that_already_shares_the_blocks_changes_nothing() {
        let mut table = SharedBlocks::new();
        settle(&mut table, &[run(100, 8)], &[]);
        let again = settle(&mut table, &[run(100, 8)], &[run(100, 8)]);
        assert_eq!(again, Settled::default());
        assert_eq!(table.iter().collect::<Vec<_>>(), vec![counted(100, 8, 2)]);
    }

    #[test]
    fn a_block_shared_within_one_file_freed_at_once_leaves_the_table() {
        let mut table = SharedBlocks::new();
        settle(&mut table, &[run(827, 2)], &[]);
        let truncated = settle(&mut table, &[], &[run(827, 2), run(827, 2)]);
        assert_eq!(truncated.freed, vec![run(827, 2)]);
        assert_eq!(truncated.counts, vec![counted(827, 2, 1)]);
        assert!(table.is_empty());
        assert!(truncated.unshared.is_empty(), "freed, not left mapped once");
    }

    #[test]
    fn blocks_left_mapped_once_are_reported_unshared() {
        let mut table = SharedBlocks::new();
        // Three mappings of [100, +4), two of [104, +2).
        settle(&mut table, &[run(100, 4), run(100, 6)], &[]);
        // One mapping of the whole run goes: [104, +2) is mapped once now.
        let dropped = settle(&mut table, &[], &[run(100, 6)]);
        assert_eq!(dropped.counts, vec![counted(100, 4, 2), counted(104, 2, 1)]);
        assert_eq!(dropped.unshared, vec![run(104, 2)]);
        assert!(dropped.freed.is_empty());
    }

    #[test]
    #[should_panic(expected = "references dropped")]
    fn dropping_a_mapping_that_is_not_there_panics() {
        let mut table = SharedBlocks::new();
        settle(&mut table, &[], &[run(100, 1), run(100, 1)]);
    }

    #[test]
    fn mappings_are_counted_per_block() {
        let counts = count_mappings(vec![run(10, 4), run(12, 4), run(30, 1), run(12, 2)]);
        assert_eq!(
            counts,
            vec![counted(10, 2, 1), counted(12, 2, 3), counted(14, 2, 1), counted(30, 1, 1)]
        );
    }
}
