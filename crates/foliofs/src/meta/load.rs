//! Opening a volume whose metadata is in an index (format 3) without
//! keeping every inode in memory.
//!
//! Where the index keeps free space and the counts (its summary), open
//! reads those, the orphans, the root and the inodes the journal's records
//! name, replays the journal, and takes free space as the index's set plus
//! what those inodes mapped before the replay, less what they map after
//! (`load_summarized`): no other inode is read. Otherwise (shared blocks,
//! or an index written before the summary) it reads every inode once,
//! keeping only those same ones in memory, and derives free space from
//! every extent map (`load_streamed`). Either way the rest are read again
//! when an operation first names them (`meta/on_demand.rs`).

use rustc_hash::FxHashSet;

use crate::alloc::{Allocator, BlockRun};
use crate::error::{Error, Result};
use crate::extent::ExtentKind;
use crate::format::record::SHARED_SET_RECORD_BYTES;
use crate::format::{Record, ROOT_INO};
use crate::refcount::{self, SharedBlocks};

use super::free_set::FreeSet;
use super::indexed::{changed_inode, mapped_runs, IndexedCheckpoint, Loaded, Summary};
use super::inode::Inode;
use super::resident::add_entry;
use super::shards::{MetaCore, MetaState, ShardSet};
use super::state::{check_limits, entry_estimate_bytes, inode_estimate_bytes};

/// Applies one record at load: shared-block counts to `shared` (checked
/// against the data region), the rest to the inodes.
pub fn apply_loaded(
    state: &mut MetaState<'_>,
    shared: &mut SharedBlocks,
    record: &Record,
    data_region: crate::format::Region,
) -> std::result::Result<(), String> {
    match record {
        Record::SharedSet { dev_block, block_count, refs } => {
            let end = dev_block.checked_add(*block_count);
            if *dev_block < data_region.start_block
                || end.is_none_or(|end| end > data_region.end_block())
            {
                return Err(format!(
                    "shared device blocks [{dev_block}, +{block_count}) outside the data region"
                ));
            }
            shared.set(*dev_block, *block_count, *refs);
            Ok(())
        }
        _ => state.apply(record).map(|_| ()).map_err(|error| error.0),
    }
}

/// The limits `check_limits` holds every inode to.
#[derive(Debug, Clone, Copy)]
pub struct LoadLimits {
    pub block_bytes: u64,
    pub size_max: u64,
}

/// The inodes `record` names: the one it changes and, for a new entry,
/// the inode the entry names (applying it checks that one exists).
fn named_inodes(record: &Record) -> impl Iterator<Item = u64> {
    let target = match record {
        Record::DirAdd { ino, .. } => Some(*ino),
        _ => None,
    };
    changed_inode(record).into_iter().chain(target)
}

/// Where the blocks an inode maps go: straight out of free space, or, on a
/// volume with shared blocks, to the list whose mapping counts are checked
/// against the shared-block table first.
struct Mapped {
    alloc: Allocator,
    counted: Option<Vec<BlockRun>>,
}

impl Mapped {
    fn take(&mut self, ino: u64, inode: &Inode) -> Result<()> {
        let Some(extents) = inode.extents() else { return Ok(()) };
        for extent in extents.iter().filter(|extent| extent.kind != ExtentKind::Delalloc) {
            let run = BlockRun { start: extent.dev_block, count: extent.block_count };
            match &mut self.counted {
                Some(runs) => runs.push(run),
                None => self
                    .alloc
                    .mark_used(run)
                    .map_err(|error| Error::Corrupt(format!("inode {ino}: {error}")))?,
            }
        }
        Ok(())
    }

    fn finish(self, shared: &SharedBlocks) -> Result<Allocator> {
        let Self { mut alloc, counted } = self;
        let Some(runs) = counted else { return Ok(alloc) };
        // Each stretch of equal mapping count must be what the table says.
        for counted in refcount::verify(runs, shared).map_err(Error::Corrupt)? {
            let run = BlockRun { start: counted.start, count: counted.count };
            alloc.mark_used(run).map_err(Error::Corrupt)?;
        }
        Ok(alloc)
    }
}

/// Reads `index` into `core` as the module documentation says, then
/// replays `journal_records`; returns free space and how many records it
/// read from the index. Where the index keeps free space and the counts
/// (`Summary`), open reads those and the inodes it keeps, nothing else;
/// otherwise it reads every inode once.
pub fn load_indexed(
    core: &MetaCore,
    index: &mut IndexedCheckpoint,
    journal_records: &[Record],
    shared: &mut SharedBlocks,
    limits: LoadLimits,
) -> Result<(Allocator, u64)> {
    let journal_shares =
        journal_records.iter().any(|record| matches!(record, Record::SharedSet { .. }));
    match index.read_summary()? {
        Some(summary) if !journal_shares => {
            load_summarized(core, index, journal_records, summary, limits)
        }
        _ => load_streamed(core, index, journal_records, shared, limits),
    }
}

fn corrupt_free(error: String) -> Error {
    Error::Corrupt(format!("metadata index: free space: {error}"))
}

/// Open from the summary: the orphans and the inodes the journal names
/// are read, the journal replayed; free space is the index's, with the
/// blocks the replay let go back in and those it mapped out.
fn load_summarized(
    core: &MetaCore,
    index: &mut IndexedCheckpoint,
    journal_records: &[Record],
    summary: Summary,
    limits: LoadLimits,
) -> Result<(Allocator, u64)> {
    let data_region = core.data_region;
    let mut kept: Vec<u64> = journal_records.iter().flat_map(named_inodes).collect();
    kept.extend(index.read_orphans()?);
    kept.push(ROOT_INO);
    kept.sort_unstable();
    kept.dedup();
    let mut state = MetaState::lock(core, ShardSet::All);
    state.note_changes = false;
    let mut free = index.free().cloned().expect("a summary comes with free space");
    let (mut records, mut kept_count) = (1 + free.len() as u64, 0u64);
    for ino in kept {
        let Some(inode) = index.read_inode(ino, data_region)? else { continue };
        check_limits(std::iter::once((ino, &inode)), limits.block_bytes, limits.size_max)
            .map_err(|error| Error::Corrupt(error.0))?;
        for run in mapped_runs(&inode) {
            free.insert(run).map_err(corrupt_free)?;
        }
        state.locked.shard_mut(ino).inodes.insert(ino, inode);
        records += 1;
        kept_count += 1;
    }
    state.note_changes = true;
    let mut no_shares = SharedBlocks::new();
    for (count, record) in journal_records.iter().enumerate() {
        apply_loaded(&mut state, &mut no_shares, record, data_region)
            .map_err(|error| Error::Corrupt(format!("journal record {count}: {error}")))?;
    }
    for (_, inode) in state.inodes_mut() {
        inode.size = inode.attrs.size;
        for run in mapped_runs(inode) {
            free.remove(run).map_err(corrupt_free)?;
        }
    }
    let alloc = free.allocator(data_region).map_err(corrupt_free)?;
    core.add_loaded(summary.inode_count, kept_count, summary.estimate_bytes);
    state.publish_estimate();
    Ok((alloc, records))
}

/// Open from every inode the index holds: see the module documentation.
/// Where no block is shared, the free space derived here becomes the
/// index's at its next cut.
fn load_streamed(
    core: &MetaCore,
    index: &mut IndexedCheckpoint,
    journal_records: &[Record],
    shared: &mut SharedBlocks,
    limits: LoadLimits,
) -> Result<(Allocator, u64)> {
    let data_region = core.data_region;
    let kept: FxHashSet<u64> = journal_records.iter().flat_map(named_inodes).collect();
    let counts_shared = index.holds_shared()?
        || journal_records.iter().any(|record| matches!(record, Record::SharedSet { .. }));
    let mut mapped =
        Mapped { alloc: Allocator::new(data_region), counted: counts_shared.then(Vec::new) };
    let mut state = MetaState::lock(core, ShardSet::All);
    // What the index holds needs no note; what the journal adds goes to
    // the index at the next cut.
    state.note_changes = false;
    let (mut inode_count, mut estimate_bytes) = (0u64, 0u64);
    let mut kept_at_cut = Vec::new();
    let mut kept_count = 0u64;
    let records = index.each_loaded(data_region, |loaded| match loaded {
        Loaded::Inode(ino, inode) => {
            check_limits(std::iter::once((ino, &inode)), limits.block_bytes, limits.size_max)
                .map_err(|error| Error::Corrupt(error.0))?;
            inode_count += 1;
            estimate_bytes += inode_estimate_bytes(&inode);
            if kept.contains(&ino) || ino == ROOT_INO || inode.attrs.nlink == 0 {
                kept_at_cut.extend(mapped_runs(&inode));
                kept_count += 1;
                state.locked.shard_mut(ino).inodes.insert(ino, inode);
                Ok(())
            } else {
                mapped.take(ino, &inode)
            }
        }
        Loaded::Entry { dir, name, target } => {
            estimate_bytes += entry_estimate_bytes(&name);
            match state.locked.shard_mut(dir).inodes.get_mut(&dir) {
                Some(directory) => add_entry(dir, directory, &name, target)
                    .map_err(|error| Error::Corrupt(format!("metadata index: {error}"))),
                None => Ok(()),
            }
        }
        Loaded::Shared(record) => apply_loaded(&mut state, shared, &record, data_region)
            .map_err(|error| Error::Corrupt(format!("metadata index: {error}"))),
    })?;
    state.note_changes = true;
    for (count, record) in journal_records.iter().enumerate() {
        apply_loaded(&mut state, shared, record, data_region)
            .map_err(|error| Error::Corrupt(format!("journal record {count}: {error}")))?;
    }
    let mut kept_now = Vec::new();
    for (ino, inode) in state.inodes_mut() {
        inode.size = inode.attrs.size;
        mapped.take(ino, inode)?;
        kept_now.extend(mapped_runs(inode));
    }
    let alloc = mapped.finish(shared)?;
    // Whatever set the index kept is not followed past shared blocks.
    index.clear_free();
    if !counts_shared {
        // Free space at the index's cut (no block shared there or since):
        // what is free now, with what the replay mapped back in and what
        // it let go out again.
        let mut free = FreeSet::of(&alloc);
        let at_cut = kept_now
            .into_iter()
            .try_for_each(|run| free.insert(run))
            .and_then(|()| kept_at_cut.into_iter().try_for_each(|run| free.remove(run)));
        match at_cut {
            Ok(()) => index.set_free(free),
            Err(error) => tracing::warn!("metadata index: free space at its cut: {error}"),
        }
    }
    let shared_bytes = (shared.run_count() * SHARED_SET_RECORD_BYTES) as u64;
    core.add_loaded(inode_count, kept_count, estimate_bytes + shared_bytes);
    state.publish_estimate();
    Ok((alloc, records))
}
