//! Per-inode extent maps: file blocks to device blocks, with a state.
//!
//! A file block is in exactly one of four states: a hole (no extent),
//! `Delalloc` (space reserved, no device block chosen yet; memory only),
//! `Unwritten` (device blocks allocated, reads return zeros) or `Written`.
//! Adjacent extents that continue each other on the device in the same state
//! are merged, so a map stays as short as the layout allows.

use std::collections::BTreeMap;

use crate::format::ExtentState;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtentKind {
    Delalloc,
    Unwritten,
    Written,
}

impl From<ExtentState> for ExtentKind {
    fn from(state: ExtentState) -> Self {
        match state {
            ExtentState::Unwritten => Self::Unwritten,
            ExtentState::Written => Self::Written,
        }
    }
}

impl ExtentKind {
    /// The on-disk state; `None` for delayed allocations, which are never persisted.
    pub fn persisted(self) -> Option<ExtentState> {
        match self {
            Self::Delalloc => None,
            Self::Unwritten => Some(ExtentState::Unwritten),
            Self::Written => Some(ExtentState::Written),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub file_block: u64,
    pub block_count: u64,
    /// First device block; meaningless (0) for `Delalloc`.
    pub dev_block: u64,
    pub kind: ExtentKind,
}

impl Extent {
    /// The parts of this extent whose device blocks lie outside
    /// `[dev_start, dev_end)`, in file order; a delayed extent, which holds
    /// no device blocks, is returned whole.
    pub fn outside_dev_blocks(&self, dev_start: u64, dev_end: u64) -> Vec<Extent> {
        debug_assert!(dev_start <= dev_end, "device range [{dev_start}, {dev_end})");
        let end = self.dev_block + self.block_count;
        if self.kind == ExtentKind::Delalloc || end <= dev_start || dev_end <= self.dev_block {
            return vec![*self];
        }
        let mut parts = Vec::new();
        if self.dev_block < dev_start {
            parts.push(Extent { block_count: dev_start - self.dev_block, ..*self });
        }
        if dev_end < end {
            let skipped = dev_end - self.dev_block;
            parts.push(Extent {
                file_block: self.file_block + skipped,
                dev_block: dev_end,
                block_count: end - dev_end,
                kind: self.kind,
            });
        }
        // What is left: non-empty pieces of this extent, no more than it.
        debug_assert!(parts.iter().all(|part| part.block_count > 0));
        debug_assert!(parts.iter().map(|part| part.block_count).sum::<u64>() <= self.block_count);
        parts
    }

    pub fn file_end(&self) -> u64 {
        self.file_block + self.block_count
    }

    /// The part of this extent inside `[start, end)`, if any.
    pub fn clip(&self, start: u64, end: u64) -> Option<Extent> {
        let clipped_start = self.file_block.max(start);
        let clipped_end = self.file_end().min(end);
        if clipped_start >= clipped_end {
            return None;
        }
        let dev_block = match self.kind {
            ExtentKind::Delalloc => 0,
            _ => self.dev_block + (clipped_start - self.file_block),
        };
        Some(Extent {
            file_block: clipped_start,
            block_count: clipped_end - clipped_start,
            dev_block,
            kind: self.kind,
        })
    }

    fn continues(&self, next: &Extent) -> bool {
        self.kind == next.kind
            && self.file_end() == next.file_block
            && (self.kind == ExtentKind::Delalloc
                || self.dev_block + self.block_count == next.dev_block)
    }
}

/// What covers a file block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// An extent starting at the looked-up block (clipped on the left).
    Mapped(Extent),
    /// A hole of `block_count` blocks (up to the next extent; u64::MAX - start if none).
    Hole { block_count: u64 },
}

#[derive(Debug, Clone, Default)]
pub struct ExtentMap {
    /// Keyed by first file block.
    extents: BTreeMap<u64, Extent>,
}

impl ExtentMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.extents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Extent> + '_ {
        self.extents.values()
    }

    /// Extents overlapping `[start, end)`, clipped to it.
    pub fn range(&self, start: u64, end: u64) -> impl Iterator<Item = Extent> + '_ {
        let first_key = self
            .extents
            .range(..=start)
            .next_back()
            .filter(|(_, extent)| extent.file_end() > start)
            .map_or(start, |(&key, _)| key);
        self.extents
            .range(first_key..end.max(first_key))
            .filter_map(move |(_, extent)| extent.clip(start, end))
    }

    pub fn lookup(&self, file_block: u64) -> Lookup {
        if let Some((_, extent)) = self.extents.range(..=file_block).next_back() {
            if let Some(clipped) = extent.clip(file_block, extent.file_end()) {
                return Lookup::Mapped(clipped);
            }
        }
        let next_start = self.extents.range(file_block..).next().map(|(&key, _)| key);
        // An extent at `file_block` itself was found above.
        debug_assert!(next_start.is_none_or(|next| next > file_block));
        Lookup::Hole { block_count: next_start.unwrap_or(u64::MAX) - file_block }
    }

    /// The block after the last mapped block (0 when empty).
    pub fn end_block(&self) -> u64 {
        self.extents.values().next_back().map_or(0, Extent::file_end)
    }

    /// Maps `extent`, replacing what covered its range. Returns the displaced
    /// pieces (the caller frees their device blocks or drops reservations).
    pub fn insert(&mut self, extent: Extent) -> Vec<Extent> {
        assert!(extent.block_count > 0);
        let displaced = self.remove(extent.file_block, extent.block_count);
        let mut merged = extent;
        if let Some((&key, left)) = self.extents.range(..merged.file_block).next_back() {
            if left.continues(&merged) {
                merged = Extent { block_count: left.block_count + merged.block_count, ..*left };
                self.extents.remove(&key);
            }
        }
        if let Some(right) = self.extents.get(&merged.file_end()).copied() {
            if merged.continues(&right) {
                self.extents.remove(&right.file_block);
                merged.block_count += right.block_count;
            }
        }
        debug_assert!(
            merged.file_block <= extent.file_block && merged.file_end() >= extent.file_end()
        );
        let replaced = self.extents.insert(merged.file_block, merged);
        debug_assert!(
            replaced.is_none(),
            "an extent at {} survived its removal",
            merged.file_block
        );
        displaced
    }

    /// Unmaps `[file_block, file_block + block_count)`; returns what was there.
    pub fn remove(&mut self, file_block: u64, block_count: u64) -> Vec<Extent> {
        let end = file_block.saturating_add(block_count);
        self.split_at(file_block);
        self.split_at(end);
        let keys: Vec<u64> = self.extents.range(file_block..end).map(|(&key, _)| key).collect();
        let removed: Vec<Extent> =
            keys.into_iter().filter_map(|key| self.extents.remove(&key)).collect();
        // Split at both ends first, so what went lies inside the range.
        debug_assert!(removed
            .iter()
            .all(|extent| extent.file_block >= file_block && extent.file_end() <= end));
        debug_assert!(self.extents.range(file_block..end).next().is_none());
        removed
    }

    /// Ensures no extent straddles `file_block`.
    fn split_at(&mut self, file_block: u64) {
        let Some((&key, &extent)) = self.extents.range(..file_block).next_back() else {
            return;
        };
        if extent.file_end() <= file_block {
            return;
        }
        let left = extent.clip(key, file_block).expect("non-empty left part");
        let right = extent.clip(file_block, extent.file_end()).expect("non-empty right part");
        debug_assert_eq!(left.block_count + right.block_count, extent.block_count);
        self.extents.insert(left.file_block, left);
        self.extents.insert(right.file_block, right);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(file_block: u64, block_count: u64, dev_block: u64) -> Extent {
        Extent { file_block, block_count, dev_block, kind: ExtentKind::Written }
    }

    #[test]
    fn merges_contiguous_and_splits_on_overwrite() {
        let mut map = ExtentMap::new();
        assert!(map.insert(written(0, 4, 100)).is_empty());
        assert!(map.insert(written(4, 4, 104)).is_empty());
        assert_eq!(map.len(), 1, "contiguous in file and device: merged");
        let displaced = map.insert(Extent { kind: ExtentKind::Unwritten, ..written(2, 2, 500) });
        assert_eq!(displaced, vec![written(2, 2, 102)]);
        let extents: Vec<Extent> = map.iter().copied().collect();
        assert_eq!(
            extents,
            vec![
                written(0, 2, 100),
                Extent { kind: ExtentKind::Unwritten, ..written(2, 2, 500) },
                written(4, 4, 104),
            ]
        );
    }

    #[test]
    fn lookup_reports_holes_up_to_next_extent() {
        let mut map = ExtentMap::new();
        map.insert(written(10, 5, 100));
        assert_eq!(map.lookup(3), Lookup::Hole { block_count: 7 });
        assert_eq!(map.lookup(12), Lookup::Mapped(written(12, 3, 102)));
        assert_eq!(map.lookup(15), Lookup::Hole { block_count: u64::MAX - 15 });
        assert_eq!(map.end_block(), 15);
    }

    #[test]
    fn remove_and_range_clip() {
        let mut map = ExtentMap::new();
        map.insert(written(0, 10, 100));
        map.insert(written(20, 10, 300));
        let in_range: Vec<Extent> = map.range(5, 25).collect();
        assert_eq!(in_range, vec![written(5, 5, 105), written(20, 5, 300)]);
        let removed = map.remove(8, 15);
        assert_eq!(removed, vec![written(8, 2, 108), written(20, 3, 300)]);
        let left: Vec<Extent> = map.iter().copied().collect();
        assert_eq!(left, vec![written(0, 8, 100), written(23, 7, 303)]);
        assert_eq!(map.remove(0, u64::MAX).len(), 2);
        assert!(map.is_empty());
    }

    #[test]
    fn delalloc_merges_without_device_blocks() {
        let mut map = ExtentMap::new();
        let delalloc = |file_block, block_count| Extent {
            file_block,
            block_count,
            dev_block: 0,
            kind: ExtentKind::Delalloc,
        };
        map.insert(delalloc(0, 2));
        map.insert(delalloc(2, 2));
        assert_eq!(map.len(), 1);
        assert_eq!(map.lookup(1), Lookup::Mapped(delalloc(1, 3)));
    }
}
