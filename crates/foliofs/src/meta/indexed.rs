//! The checkpoint of a volume of format 3: the state at a cut of the log,
//! kept in a paged index (`crate::index`) and brought up to date at each
//! cut with only what changed since the last one.
//!
//! Keys, big-endian so that an inode's keys sort together and every inode
//! sorts before every entry (load applies them in key order, as it applies
//! a slot's payload):
//! - `1, ino, chunk`: the inode's records (attributes, symlink target,
//!   device number, extents, extended attributes, flags), encoded as a
//!   slot's payload holds them, in chunks that fit a page;
//! - `2, dir, name`: a directory entry; the value is the inode's number;
//! - `3, chunk`: the shared-block table's records;
//! - `4, start`: a run of blocks no file maps at the cut (`super::free_set`),
//!   the value its length; kept while no block is shared;
//! - `5`: the counts open needs (inodes, the checkpoint estimate), present
//!   exactly while the `4` keys are;
//! - `6, ino`: an inode with no links at the cut (an orphan mount frees).
//!
//! What changed is noted as records apply (`Changed`, per shard): an
//! inode's number, or a directory entry's name. At the cut each shard's
//! notes become `IndexChange`s, read from the shard as it is at the cut
//! (`super::shards::MetaCore::pay_checkpoint`). The index's pages come from
//! the data region (`super::store`, `MetaStore::give_index_pages`); at open
//! every page the index holds is taken out of free space.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::checkpoint::encode_inode;
use super::inode::Inode;
use super::resident::{add_entry, InodeBuilder};
use crate::alloc::BlockRun;
use crate::extent::ExtentKind;

use super::free_set::FreeSet;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::codec::{Reader, Writer};
use crate::format::{CheckpointHeader, InodeAttrs, Record, Region, Superblock, ROOT_INO};
use crate::index::{CommitReport, IndexOptions, Tree, PAGE_BYTES};
use crate::refcount::Counted;

/// The metadata index's owner number, in every page.
const INDEX_OWNER: u32 = 1;
const INODE_KEY: u8 = 1;
const ENTRY_KEY: u8 = 2;
const SHARED_KEY: u8 = 3;
const FREE_KEY: u8 = 4;
const SUMMARY_KEY: u8 = 5;
const ORPHAN_KEY: u8 = 6;
/// The layout of the summary's value: version, inode count, estimate.
const SUMMARY_VERSION: u8 = 1;
const SUMMARY_BYTES: usize = 17;
/// Bytes of records per value: with its 13-byte key, well inside what a
/// page entry holds (`crate::index::ENTRY_BYTES_MAX`).
const CHUNK_BYTES: usize = 1024;
/// Decoded pages kept in memory: the branches (a few hundred KiB at ten
/// million files) and the leaves inodes were last read from on demand
/// (`meta/on_demand.rs`).
const CACHE_BYTES: usize = 16 << 20;
/// Entries of a directory read from the index per scan.
const ENTRIES_PER_SCAN: usize = 256;
/// Pages a new volume gives its index.
const FORMAT_PAGES: u64 = 16;

const _: () = assert!(crate::index::ATTACHED_BYTES == crate::format::checkpoint::ATTACHED_BYTES);
const _: () =
    assert!(crate::index::PAGE_BYTES as u64 == crate::format::superblock::INDEX_PAGE_BYTES);
const _: () = assert!(CHUNK_BYTES + 13 <= crate::index::ENTRY_BYTES_MAX);

/// What changed in one shard since the last cut.
#[derive(Debug, Default)]
pub struct Changed {
    pub inodes: FxHashSet<u64>,
    pub entries: FxHashSet<(u64, Vec<u8>)>,
}

impl Changed {
    /// Notes what `record` changes; the caller holds the shard of the inode
    /// (or directory) it names.
    pub fn note(&mut self, record: &Record) {
        match record {
            Record::DirAdd { dir, name, .. } | Record::DirRemove { dir, name } => {
                self.entries.insert((*dir, name.clone()));
            }
            _ => {
                if let Some(ino) = changed_inode(record) {
                    self.inodes.insert(ino);
                }
            }
        }
    }
}

/// The inode whose shard holds what `record` changes: the directory for
/// an entry, `None` for the shared-block table (free space's).
pub fn changed_inode(record: &Record) -> Option<u64> {
    match record {
        Record::DirAdd { dir, .. } | Record::DirRemove { dir, .. } => Some(*dir),
        Record::SharedSet { .. } => None,
        Record::InodeSet { ino, .. }
        | Record::InodeFree { ino }
        | Record::SymlinkSet { ino, .. }
        | Record::ExtentMap { ino, .. }
        | Record::ExtentUnmap { ino, .. }
        | Record::XattrSet { ino, .. }
        | Record::XattrRemove { ino, .. }
        | Record::DeviceSet { ino, .. }
        | Record::FlagsSet { ino, .. } => Some(*ino),
    }
}

/// What the index holds, as `IndexedCheckpoint::each_loaded` hands it
/// out: every inode (built, without its entries), then every entry, then
/// the shared-block table's records.
pub enum Loaded {
    Inode(u64, Inode),
    Entry { dir: u64, name: Vec<u8>, target: u64 },
    Shared(Record),
}

/// One key's change, as the shard was at the cut.
#[derive(Debug, Clone)]
pub enum IndexChange {
    /// The inode's records, or `None` once it is freed; the device blocks
    /// its extents map, and whether it has no links.
    Inode { ino: u64, records: Option<Vec<u8>>, extents: Vec<BlockRun>, orphan: bool },
    /// The entry's inode, or `None` once it is removed.
    Entry { dir: u64, name: Vec<u8>, target: Option<u64> },
}

impl IndexChange {
    /// Orders changes as their keys are ordered.
    fn sort_key(&self) -> (u8, u64, &[u8]) {
        match self {
            Self::Inode { ino, .. } => (INODE_KEY, *ino, &[]),
            Self::Entry { dir, name, .. } => (ENTRY_KEY, *dir, name),
        }
    }
}

/// The changes `changed` names, read from `inodes` (one shard, at the cut).
pub fn changes_at_cut(inodes: &FxHashMap<u64, Inode>, changed: Changed) -> Vec<IndexChange> {
    let mut changes = Vec::with_capacity(changed.inodes.len() + changed.entries.len());
    for ino in changed.inodes {
        let change = match inodes.get(&ino) {
            Some(inode) => {
                let mut writer = Writer::with_capacity(96);
                encode_inode(ino, inode, &mut writer);
                let extents = mapped_runs(inode);
                let orphan = inode.attrs.nlink == 0;
                IndexChange::Inode { ino, records: Some(writer.into_bytes()), extents, orphan }
            }
            None => IndexChange::Inode { ino, records: None, extents: Vec::new(), orphan: false },
        };
        changes.push(change);
    }
    for (dir, name) in changed.entries {
        let target = inodes
            .get(&dir)
            .and_then(|directory| directory.entries())
            .and_then(|entries| entries.get(&name))
            .copied();
        changes.push(IndexChange::Entry { dir, name, target });
    }
    changes
}

/// The device blocks `inode`'s extents map (delayed ones map none).
pub fn mapped_runs(inode: &Inode) -> Vec<BlockRun> {
    inode
        .extents()
        .into_iter()
        .flat_map(|extents| extents.iter())
        .filter(|extent| extent.kind != ExtentKind::Delalloc)
        .map(|extent| BlockRun { start: extent.dev_block, count: extent.block_count })
        .collect()
}

/// What open reads instead of every inode (`super::load`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub inode_count: u64,
    pub estimate_bytes: u64,
}

fn free_key(start: u64) -> Vec<u8> {
    let mut key = vec![FREE_KEY];
    key.extend_from_slice(&start.to_be_bytes());
    key
}

fn orphan_key(ino: u64) -> Vec<u8> {
    let mut key = vec![ORPHAN_KEY];
    key.extend_from_slice(&ino.to_be_bytes());
    key
}

fn inode_key(ino: u64, chunk: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(13);
    key.push(INODE_KEY);
    key.extend_from_slice(&ino.to_be_bytes());
    key.extend_from_slice(&chunk.to_be_bytes());
    key
}

fn entry_key(dir: u64, name: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(9 + name.len());
    key.push(ENTRY_KEY);
    key.extend_from_slice(&dir.to_be_bytes());
    key.extend_from_slice(name);
    key
}

fn shared_key(chunk: u32) -> Vec<u8> {
    let mut key = vec![SHARED_KEY];
    key.extend_from_slice(&chunk.to_be_bytes());
    key
}

fn options(superblock: &Superblock) -> IndexOptions {
    IndexOptions {
        owner: INDEX_OWNER,
        region: superblock.index_root_region(),
        cache_bytes: CACHE_BYTES,
        pages_given: true,
    }
}

/// The metadata index of an open volume of format 3.
pub struct IndexedCheckpoint {
    tree: Tree,
    pub block_bytes: u64,
    /// The blocks no file maps as of the last cut, where kept: `None`
    /// while blocks are shared, or until an open has derived it.
    free: Option<FreeSet>,
    /// The set the `4` keys hold, `None` when there are none.
    free_in_keys: Option<FreeSet>,
    /// Inode numbers from here on were never in the index: its last
    /// commit's next inode number. A cut reads no old value of those.
    next_ino_committed: u64,
    /// Chunks of the shared-block table the index holds.
    shared_chunks: u32,
    /// Free blocks promised to the index (`reserve_wanted_blocks`).
    pub reserved_blocks: u64,
}

impl IndexedCheckpoint {
    /// Writes the index of a new volume: its root directory, the log at
    /// its start. Its first pages are the data region's first blocks.
    pub fn format(device: &Arc<Device>, superblock: &Superblock, root: InodeAttrs) -> Result<()> {
        let mut tree = Tree::create(Arc::clone(device), options(superblock))?;
        let block_bytes = superblock.block_bytes_u64();
        let start = superblock.data.start_block * block_bytes;
        if superblock.data.block_count * block_bytes < 4 * FORMAT_PAGES * PAGE_BYTES as u64 {
            return Err(Error::invalid("the data region is too small for a metadata index"));
        }
        let pages = FORMAT_PAGES.div_ceil(block_bytes / PAGE_BYTES as u64) * block_bytes
            / PAGE_BYTES as u64;
        let pages: Vec<u64> = (0..pages).map(|page| start + page * PAGE_BYTES as u64).collect();
        tree.give_pages(&pages)?;
        let mut index = Self::with(tree, superblock);
        let changes = [IndexChange::Inode {
            ino: ROOT_INO,
            records: Some({
                let mut writer = Writer::with_capacity(96);
                encode_inode(ROOT_INO, &Inode::new(root), &mut writer);
                writer.into_bytes()
            }),
            extents: Vec::new(),
            orphan: false,
        }];
        index.apply(changes)?;
        let header = crate::journal::initial_checkpoint_header(device, superblock, ROOT_INO + 1);
        index.tree.set_attached(header.encode_attached());
        index.tree.commit()?;
        Ok(())
    }

    /// An empty index for `superblock`, its root slots cleared, nothing
    /// committed: what a volume converted to format 3 fills
    /// (`MetaStore::write_index`).
    pub fn create(device: &Arc<Device>, superblock: &Superblock) -> Result<Self> {
        let tree = Tree::create(Arc::clone(device), options(superblock))?;
        Ok(Self::with(tree, superblock))
    }

    /// Opens the index and reads where the log resumes from its root.
    pub fn open(device: &Arc<Device>, superblock: &Superblock) -> Result<(Self, CheckpointHeader)> {
        let tree = Tree::open(Arc::clone(device), options(superblock))?;
        let header = CheckpointHeader::decode_attached(
            &tree.attached(),
            superblock.uuid,
            tree.committed_generation(),
        )
        .map_err(|error| Error::Corrupt(format!("metadata index root: {error}")))?;
        let mut index = Self::with(tree, superblock);
        index.next_ino_committed = header.next_ino;
        Ok((index, header))
    }

    fn with(tree: Tree, superblock: &Superblock) -> Self {
        let block_bytes = superblock.block_bytes_u64();
        Self {
            tree,
            block_bytes,
            free: None,
            free_in_keys: None,
            next_ino_committed: 0,
            shared_chunks: 0,
            reserved_blocks: 0,
        }
    }

    /// Blocks the index wants promised to it beyond the free pages it
    /// holds, so that its next commit never finds the volume full: room to
    /// copy every page it has (a commit copies each at most once), twice
    /// what a full log of `journal_bytes` can add, and 64 KiB. The old
    /// format kept two slots for the same reason.
    pub fn reserve_wanted_blocks(&self, journal_bytes: u64) -> u64 {
        let page = PAGE_BYTES as u64;
        let wanted = self.tree.used_pages() * page + 2 * journal_bytes + (64 << 10);
        let held = self.tree.free_pages_now() as u64 * page;
        wanted.saturating_sub(held).div_ceil(self.block_bytes)
    }

    /// Fills the reserve up to what is wanted, from `promises`, or gives
    /// back what is over; returns whether it is full.
    pub fn fill_reserve(&mut self, promises: &crate::alloc::Promises, journal_bytes: u64) -> bool {
        let wanted = self.reserve_wanted_blocks(journal_bytes);
        if wanted > self.reserved_blocks {
            self.reserved_blocks += promises.reserve_up_to(wanted - self.reserved_blocks);
        } else {
            promises.unreserve(self.reserved_blocks - wanted);
            self.reserved_blocks = wanted;
        }
        self.reserved_blocks >= wanted
    }

    /// Hands every record the index holds to `sink`, inodes first, then
    /// entries, then the shared-block table: what load applies before the
    /// journal's.
    pub fn each_record(&mut self, sink: impl FnMut(Record) -> Result<()>) -> Result<()> {
        let mut loader = Loader { sink, inode: None, shared: Vec::new(), shared_chunks: 0 };
        self.tree.for_each(|key, value| loader.add(key, value))?;
        self.shared_chunks = loader.shared_chunks;
        loader.finish()
    }

    /// Hands out every inode, entry and shared-block record the index
    /// holds, in key order (`Loaded`); returns how many records it read.
    /// Inodes are built and checked as on demand (`read_inode`).
    pub fn each_loaded(
        &mut self,
        data_region: Region,
        mut sink: impl FnMut(Loaded) -> Result<()>,
    ) -> Result<u64> {
        let mut building: Option<InodeBuilder> = None;
        let mut records = 0;
        self.each_record(|record| {
            records += 1;
            match record {
                Record::InodeSet { ino, .. } => {
                    flush(&mut building, &mut sink)?;
                    building =
                        Some(InodeBuilder::start(ino, &record, data_region).map_err(corrupt)?);
                    Ok(())
                }
                Record::DirAdd { dir, name, ino } => {
                    flush(&mut building, &mut sink)?;
                    sink(Loaded::Entry { dir, name, target: ino })
                }
                Record::SharedSet { .. } => {
                    flush(&mut building, &mut sink)?;
                    sink(Loaded::Shared(record))
                }
                other => match &mut building {
                    Some(builder) if changed_inode(&other) == Some(builder.ino()) => {
                        builder.add(&other).map_err(corrupt)
                    }
                    _ => Err(corrupt(format!("{other:?} follows no inode of its own"))),
                },
            }
        })?;
        flush(&mut building, &mut sink)?;
        Ok(records)
    }

    /// Inode `ino` as the index holds it, with its entries if a directory;
    /// `None` if the index holds no such inode.
    pub fn read_inode(&mut self, ino: u64, data_region: Region) -> Result<Option<Inode>> {
        let bytes = self.inode_bytes(ino)?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let mut builder: Option<InodeBuilder> = None;
        decode_records(&bytes, Some(ino), &mut |record| {
            match &mut builder {
                None => {
                    builder = Some(InodeBuilder::start(ino, &record, data_region).map_err(corrupt)?)
                }
                Some(builder) => builder.add(&record).map_err(corrupt)?,
            }
            Ok(())
        })?;
        let (_, mut inode) = builder.expect("bytes held a record").finish();
        if inode.entries().is_some() {
            self.each_with_prefix(&entry_key(ino, &[]), |key, value| {
                let target: [u8; 8] = value.try_into().map_err(|_| {
                    corrupt(format!("entry {key:02x?} holds {} bytes", value.len()))
                })?;
                add_entry(ino, &mut inode, &key[9..], u64::from_be_bytes(target)).map_err(corrupt)
            })?;
        }
        Ok(Some(inode))
    }

    /// The bytes of inode `ino`'s records (its chunks, joined); empty when
    /// the index holds no such inode.
    fn inode_bytes(&mut self, ino: u64) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        let mut next_chunk = 0;
        loop {
            // Most inodes are one chunk: a scan of two finds it and its end.
            let found = self.tree.scan(&inode_key(ino, next_chunk), 2)?;
            let mut ended = found.len() < 2;
            for (key, value) in found {
                if key != inode_key(ino, next_chunk) {
                    ended = true;
                    break;
                }
                bytes.extend_from_slice(&value);
                next_chunk += 1;
            }
            if ended {
                break;
            }
        }
        Ok(bytes)
    }

    /// Whether the index holds a shared-block table: open counts each
    /// block's mappings only then.
    pub fn holds_shared(&mut self) -> Result<bool> {
        let found = self.tree.scan(&shared_key(0), 1)?;
        Ok(found.first().is_some_and(|(key, _)| key.first() == Some(&SHARED_KEY)))
    }

    /// The blocks the index holds, as runs: taken out of free space at open.
    pub fn held_blocks(&mut self) -> Result<Vec<BlockRun>> {
        let mut blocks: Vec<u64> =
            self.tree.held_pages()?.into_iter().map(|address| address / self.block_bytes).collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut runs: Vec<BlockRun> = Vec::new();
        for block in blocks {
            match runs.last_mut() {
                Some(run) if run.start + run.count == block => run.count += 1,
                _ => runs.push(BlockRun { start: block, count: 1 }),
            }
        }
        Ok(runs)
    }

    /// Brings the index's keys up to `changes`.
    /// In key order: a tree filled in order keeps its pages full, and each
    /// leaf is copied once however many of its keys change.
    pub fn apply(&mut self, changes: impl IntoIterator<Item = IndexChange>) -> Result<()> {
        let mut changes: Vec<IndexChange> = changes.into_iter().collect();
        changes.sort_unstable_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        let (mut unmapped, mut mapped) = (Vec::new(), Vec::new());
        for change in changes {
            match change {
                IndexChange::Inode { ino, records, extents, orphan } => {
                    let stored_before = ino < self.next_ino_committed;
                    if self.free.is_some() {
                        if stored_before {
                            unmapped.extend(self.stored_runs(ino)?);
                        }
                        mapped.extend(extents);
                    }
                    let records = records.unwrap_or_default();
                    let chunks = self.put_chunks(&records, |chunk| inode_key(ino, chunk))?;
                    if stored_before {
                        self.remove_from(&inode_key(ino, chunks), &inode_key(ino, 0)[..9])?;
                    }
                    if orphan {
                        self.tree.insert(&orphan_key(ino), &[])?;
                    } else if stored_before {
                        self.tree.remove(&orphan_key(ino))?;
                    }
                }
                IndexChange::Entry { dir, name, target: Some(ino) } => {
                    self.tree.insert(&entry_key(dir, &name), &ino.to_be_bytes())?;
                }
                IndexChange::Entry { dir, name, target: None } => {
                    self.tree.remove(&entry_key(dir, &name))?;
                }
            }
        }
        // Every changed inode's old blocks back in, then its new ones out:
        // a block one file let go and another took in the same cut ends
        // mapped.
        if let Some(free) = &mut self.free {
            let updated = unmapped
                .into_iter()
                .try_for_each(|run| free.insert(run))
                .and_then(|()| mapped.into_iter().try_for_each(|run| free.remove(run)));
            if let Err(error) = updated {
                tracing::warn!(
                    "metadata index: free space no longer follows from the changes ({error}); \
                     the next open derives it from every extent map"
                );
                self.free = None;
            }
        }
        Ok(())
    }

    /// The device blocks inode `ino`'s extents map as the index holds it.
    fn stored_runs(&mut self, ino: u64) -> Result<Vec<BlockRun>> {
        let mut runs = Vec::new();
        let bytes = self.inode_bytes(ino)?;
        decode_records(&bytes, Some(ino), &mut |record| {
            if let Record::ExtentMap { dev_block, block_count, .. } = record {
                runs.push(BlockRun { start: dev_block, count: block_count });
            }
            Ok(())
        })?;
        Ok(runs)
    }

    /// Forgets the free space kept; its keys go at the next cut.
    pub fn clear_free(&mut self) {
        self.free = None;
    }

    /// Sets the free space as of the index's cut: what open found.
    pub fn set_free(&mut self, free: FreeSet) {
        self.free = Some(free);
    }

    /// The counts open needs, and free space where it is kept, up to the
    /// cut; with no free space kept, removes both.
    pub fn put_summary(&mut self, summary: Summary) -> Result<()> {
        let Some(free) = self.free.clone() else {
            if self.free_in_keys.take().is_some() {
                self.tree.remove(&[SUMMARY_KEY])?;
                self.remove_from(&[FREE_KEY], &[FREE_KEY])?;
            }
            return Ok(());
        };
        let in_keys = self.free_in_keys.take().unwrap_or_default();
        for run in in_keys.runs().filter(|run| !free.holds_run(*run)) {
            self.tree.remove(&free_key(run.start))?;
        }
        for run in free.runs().filter(|run| !in_keys.holds_run(*run)) {
            self.tree.insert(&free_key(run.start), &run.count.to_be_bytes())?;
        }
        let mut value = Vec::with_capacity(SUMMARY_BYTES);
        value.push(SUMMARY_VERSION);
        value.extend_from_slice(&summary.inode_count.to_be_bytes());
        value.extend_from_slice(&summary.estimate_bytes.to_be_bytes());
        self.tree.insert(&[SUMMARY_KEY], &value)?;
        self.free_in_keys = Some(free);
        Ok(())
    }

    /// The summary, if the index keeps one; reading it also reads the free
    /// space it vouches for (`free`).
    pub fn read_summary(&mut self) -> Result<Option<Summary>> {
        let Some(value) = self.tree.get(&[SUMMARY_KEY])? else { return Ok(None) };
        if value.len() != SUMMARY_BYTES || value[0] != SUMMARY_VERSION {
            return Err(corrupt(format!(
                "a summary of {} bytes, version {}",
                value.len(),
                value[0]
            )));
        }
        let number = |at: usize| u64::from_be_bytes(value[at..at + 8].try_into().unwrap());
        let summary = Summary { inode_count: number(1), estimate_bytes: number(9) };
        let mut runs = Vec::new();
        self.each_with_prefix(&[FREE_KEY], |key, value| {
            let (Ok(start), Ok(count)) =
                (<[u8; 8]>::try_from(&key[1..]), <[u8; 8]>::try_from(value))
            else {
                return Err(corrupt(format!("a free-space entry {key:02x?}")));
            };
            runs.push(BlockRun {
                start: u64::from_be_bytes(start),
                count: u64::from_be_bytes(count),
            });
            Ok(())
        })?;
        let free = FreeSet::from_runs(runs).map_err(corrupt)?;
        self.free = Some(free.clone());
        self.free_in_keys = Some(free);
        Ok(Some(summary))
    }

    /// The free space as of the index's cut, where kept (`read_summary`).
    pub fn free(&self) -> Option<&FreeSet> {
        self.free.as_ref()
    }

    /// The inodes with no links at the cut.
    pub fn read_orphans(&mut self) -> Result<Vec<u64>> {
        let mut orphans = Vec::new();
        self.each_with_prefix(&[ORPHAN_KEY], |key, _| {
            let ino: [u8; 8] =
                key[1..].try_into().map_err(|_| corrupt(format!("an orphan entry {key:02x?}")))?;
            orphans.push(u64::from_be_bytes(ino));
            Ok(())
        })?;
        Ok(orphans)
    }

    /// Visits every key that starts with `prefix`, in order, a batch of
    /// scans at a time.
    fn each_with_prefix(
        &mut self,
        prefix: &[u8],
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut start = prefix.to_vec();
        loop {
            let found = self.tree.scan(&start, ENTRIES_PER_SCAN)?;
            let full = found.len() == ENTRIES_PER_SCAN;
            for (key, value) in &found {
                if !key.starts_with(prefix) {
                    return Ok(());
                }
                visit(key, value)?;
            }
            match found.last() {
                Some((last, _)) if full => {
                    // The next key after `last`: itself with a zero byte.
                    start = last.clone();
                    start.push(0);
                }
                _ => return Ok(()),
            }
        }
    }

    /// Rewrites the shared-block table, when it holds anything or did.
    pub fn put_shared(&mut self, shared: &[Counted]) -> Result<()> {
        if !shared.is_empty() {
            // A block mapped twice cannot be followed through the changes
            // (`super::free_set`): open derives free space again.
            self.free = None;
        }
        if shared.is_empty() && self.shared_chunks == 0 {
            return Ok(());
        }
        let mut writer = Writer::with_capacity(shared.len() * 24);
        for counted in shared {
            let record = Record::SharedSet {
                dev_block: counted.start,
                block_count: counted.count,
                refs: counted.refs,
            };
            record.encode(&mut writer);
        }
        let chunks = self.put_chunks(writer.as_bytes(), shared_key)?;
        self.remove_from(&shared_key(chunks), &[SHARED_KEY])?;
        self.shared_chunks = chunks;
        Ok(())
    }

    /// Puts `bytes` under the keys `key(0..)`, a chunk each; returns how
    /// many chunks.
    fn put_chunks(&mut self, bytes: &[u8], key: impl Fn(u32) -> Vec<u8>) -> Result<u32> {
        let mut count = 0;
        for chunk in bytes.chunks(CHUNK_BYTES) {
            self.tree.insert(&key(count), chunk)?;
            count += 1;
        }
        Ok(count)
    }

    /// Removes the keys from `start` on that begin with `prefix`.
    fn remove_from(&mut self, start: &[u8], prefix: &[u8]) -> Result<()> {
        loop {
            let found = self.tree.scan(start, 1)?;
            match found.first() {
                Some((key, _)) if key.starts_with(prefix) => {
                    self.tree.remove(key)?;
                }
                _ => return Ok(()),
            }
        }
    }

    /// Pages the next commit may need beyond those the index has.
    pub fn pages_wanted(&self) -> usize {
        self.tree.pages_wanted()
    }

    pub fn give_pages(&mut self, pages: &[u64]) -> Result<()> {
        self.tree.give_pages(pages)
    }

    /// Commits the index with `header` (where the log resumes) in its root
    /// record: durable when this returns. The caller gave it the pages it
    /// wanted.
    pub fn commit(&mut self, header: &CheckpointHeader) -> Result<CommitReport> {
        self.tree.set_attached(header.encode_attached());
        let report = self.tree.commit()?;
        self.next_ino_committed = self.next_ino_committed.max(header.next_ino);
        Ok(report)
    }

    /// Streams the index, checking every page and that its pages are the
    /// ones its root record counts: fsck's check.
    pub fn check(&mut self) -> Result<u64> {
        self.tree.check()
    }
}

/// Turns the index's entries, in key order, back into records.
struct Loader<F> {
    sink: F,
    /// The inode whose chunks are being read: its number, the next chunk
    /// expected, and its records' bytes so far.
    inode: Option<(u64, u32, Vec<u8>)>,
    shared: Vec<u8>,
    shared_chunks: u32,
}

impl<F: FnMut(Record) -> Result<()>> Loader<F> {
    fn add(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        match (key.first().copied(), key.len()) {
            (Some(INODE_KEY), 13) => {
                let ino = u64::from_be_bytes(key[1..9].try_into().unwrap());
                let chunk = u32::from_be_bytes(key[9..13].try_into().unwrap());
                match &mut self.inode {
                    Some((current, next, bytes)) if *current == ino => {
                        if chunk != *next {
                            return Err(chunk_gap(key));
                        }
                        *next += 1;
                        bytes.extend_from_slice(value);
                    }
                    _ => {
                        self.end_inode()?;
                        if chunk != 0 {
                            return Err(chunk_gap(key));
                        }
                        self.inode = Some((ino, 1, value.to_vec()));
                    }
                }
            }
            (Some(ENTRY_KEY), 10..) if value.len() == 8 => {
                self.end_inode()?;
                let dir = u64::from_be_bytes(key[1..9].try_into().unwrap());
                let ino = u64::from_be_bytes(value.try_into().unwrap());
                (self.sink)(Record::DirAdd { dir, name: key[9..].to_vec(), ino })?;
            }
            // Free space, the summary and the orphans: what open reads on
            // its own (`read_summary`, `read_orphans`), never records.
            (Some(FREE_KEY), 9) | (Some(SUMMARY_KEY), 1) | (Some(ORPHAN_KEY), 9) => {
                self.end_inode()?;
            }
            (Some(SHARED_KEY), 5) => {
                self.end_inode()?;
                let chunk = u32::from_be_bytes(key[1..5].try_into().unwrap());
                if chunk != self.shared_chunks {
                    return Err(chunk_gap(key));
                }
                self.shared_chunks += 1;
                self.shared.extend_from_slice(value);
            }
            _ => {
                return Err(Error::Corrupt(format!(
                    "metadata index: an entry with key {key:02x?} and {} bytes of value is none \
                     the index holds",
                    value.len()
                )))
            }
        }
        Ok(())
    }

    fn end_inode(&mut self) -> Result<()> {
        match self.inode.take() {
            Some((ino, _, bytes)) => decode_records(&bytes, Some(ino), &mut self.sink),
            None => Ok(()),
        }
    }

    fn finish(mut self) -> Result<()> {
        self.end_inode()?;
        decode_records(&self.shared, None, &mut self.sink)
    }
}

/// Hands the inode `building` holds, if any, to `sink`.
fn flush(
    building: &mut Option<InodeBuilder>,
    sink: &mut impl FnMut(Loaded) -> Result<()>,
) -> Result<()> {
    match building.take() {
        Some(builder) => {
            let (ino, inode) = builder.finish();
            sink(Loaded::Inode(ino, inode))
        }
        None => Ok(()),
    }
}

fn corrupt(why: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("metadata index: {why}"))
}

fn chunk_gap(key: &[u8]) -> Error {
    Error::Corrupt(format!("metadata index: chunk {key:02x?} follows no chunk before it"))
}

/// Decodes the records `bytes` holds, each naming `ino` where one is given.
fn decode_records(
    bytes: &[u8],
    ino: Option<u64>,
    sink: &mut impl FnMut(Record) -> Result<()>,
) -> Result<()> {
    let mut reader = Reader::new(bytes, "metadata index record");
    while !reader.is_empty() {
        let record = Record::decode(&mut reader)
            .map_err(|error| Error::Corrupt(format!("metadata index: {error}")))?;
        // Entries are keys of their own, never among an inode's records.
        let named = match &record {
            Record::DirAdd { .. } | Record::DirRemove { .. } => Some(u64::MAX),
            _ => changed_inode(&record),
        };
        if named != ino {
            return Err(Error::Corrupt(format!(
                "metadata index: the records of inode {ino:?} hold {record:?}"
            )));
        }
        sink(record)?;
    }
    Ok(())
}
