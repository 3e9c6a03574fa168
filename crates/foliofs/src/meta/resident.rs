//! Inodes read on demand where the metadata is kept in an index (format 3):
//! an inode is built from the records the index holds for it when an
//! operation first names it, and a clean one that nothing pins leaves
//! memory again after a checkpoint has made its state the index's.
//!
//! What may leave memory (`evictable`): an inode whose every field the
//! index holds. Memory-only state pins it: open handles and the copies they
//! keep of its metadata (`super::view`), delayed extents (reservations, no
//! record yet), times advanced without a record, a size running ahead of
//! the size on disk, no links (an orphan mount frees) and an O_TMPFILE not
//! yet linked. The root directory stays, as every path starts there.
//! Whether the inode changed since the last cut is the caller's to know
//! (its shard's notes).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustc_hash::FxHashSet;

use crate::error::{Error, Result};
use crate::extent::{Extent, ExtentKind};
use crate::format::record::{is_valid_name, is_valid_xattr_name};
use crate::format::{Record, Region, ROOT_INO, SYMLINK_BYTES_MAX, XATTR_VALUE_BYTES_MAX};
use crate::lock_order::{Level, Ordered};

use super::indexed::Loaded;
use super::inode::{Inode, InodeBody};
use super::shards::{shard_of, ShardInodes, SHARD_COUNT};
use super::store::MetaStore;

/// Memory an inode takes, as `super::inode` estimates it: what eviction
/// counts against the budget.
pub fn resident_bytes(inode: &Inode) -> u64 {
    let body = match &inode.body {
        InodeBody::File(extents) => extents.len() as u64 * 64,
        InodeBody::Dir(entries) => entries.keys().map(|name| 80 + name.len() as u64).sum(),
        InodeBody::Symlink(target) => target.len() as u64,
        InodeBody::Special { .. } => 0,
    };
    let xattrs: u64 =
        inode.xattrs.iter().map(|(name, value)| 100 + (name.len() + value.len()) as u64).sum();
    220 + body + xattrs
}

/// Whether inode `ino` holds nothing but what the index has: see the
/// module documentation.
pub fn evictable(ino: u64, inode: &Inode) -> bool {
    let copies_held =
        inode.view_generation.as_ref().is_some_and(|generation| Arc::strong_count(generation) > 1);
    let delayed = inode
        .extents()
        .is_some_and(|extents| extents.iter().any(|extent| extent.kind == ExtentKind::Delalloc));
    ino != ROOT_INO
        && inode.open_handles == 0
        && !copies_held
        && !delayed
        && !inode.linkable
        && inode.attrs.nlink > 0
        && inode.size == inode.attrs.size
}

/// Builds one inode from its records as the index holds them: its
/// `InodeSet` first, then its symlink target, extents, device number,
/// extended attributes and flags. Each is checked as `super::state` checks
/// a record it applies, so a damaged index is an error, never a panic.
pub struct InodeBuilder {
    ino: u64,
    inode: Inode,
    data_region: Region,
}

fn corrupt<T>(ino: u64, why: impl std::fmt::Display) -> std::result::Result<T, String> {
    Err(format!("inode {ino}: {why}"))
}

impl InodeBuilder {
    /// Starts inode `ino` from its first record, which must set it.
    pub fn start(
        ino: u64,
        first: &Record,
        data_region: Region,
    ) -> std::result::Result<Self, String> {
        match first {
            Record::InodeSet { ino: named, attrs } if *named == ino => {
                let inode = Inode::new(*attrs);
                Ok(Self { ino, inode, data_region })
            }
            other => corrupt(ino, format!("its records start with {other:?}")),
        }
    }

    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// Adds one more of the inode's records.
    pub fn add(&mut self, record: &Record) -> std::result::Result<(), String> {
        let ino = self.ino;
        match (record, &mut self.inode.body) {
            (Record::SymlinkSet { target, .. }, InodeBody::Symlink(stored)) => {
                if target.is_empty() || target.len() > SYMLINK_BYTES_MAX {
                    return corrupt(ino, format!("a symlink target of {} bytes", target.len()));
                }
                *stored = target.clone();
            }
            (Record::DeviceSet { rdev, .. }, InodeBody::Special { rdev: stored }) => {
                *stored = *rdev;
            }
            (
                Record::ExtentMap { file_block, dev_block, block_count, state, .. },
                InodeBody::File(extents),
            ) => {
                let region = self.data_region;
                let inside = dev_block.checked_add(*block_count).is_some_and(|end| {
                    *dev_block >= region.start_block && end <= region.end_block()
                });
                if !inside {
                    return corrupt(
                        ino,
                        format!(
                            "maps device blocks [{dev_block}, +{block_count}) outside the data \
                             region"
                        ),
                    );
                }
                let extent = Extent {
                    file_block: *file_block,
                    block_count: *block_count,
                    dev_block: *dev_block,
                    kind: ExtentKind::from(*state),
                };
                if !extents.insert(extent).is_empty() {
                    return corrupt(ino, format!("extents overlap at file block {file_block}"));
                }
            }
            (Record::XattrSet { name, value, .. }, _) => {
                if !is_valid_xattr_name(name) || value.len() > XATTR_VALUE_BYTES_MAX {
                    return corrupt(ino, "an invalid extended attribute");
                }
                self.inode.xattrs.insert(name.clone(), value.clone());
            }
            (Record::FlagsSet { flags, .. }, _) => self.inode.flags = *flags,
            (other, _) => return corrupt(ino, format!("{other:?} is none of its records")),
        }
        Ok(())
    }

    /// The inode, its in-memory size that of the disk.
    pub fn finish(self) -> (u64, Inode) {
        let mut inode = self.inode;
        inode.size = inode.attrs.size;
        (self.ino, inode)
    }
}

/// Adds the entry `name` -> `target` that the index holds for directory
/// `dir`.
pub fn add_entry(
    dir: u64,
    inode: &mut Inode,
    name: &[u8],
    target: u64,
) -> std::result::Result<(), String> {
    if !is_valid_name(name) {
        return corrupt(dir, "an invalid entry name");
    }
    match &mut inode.body {
        InodeBody::Dir(entries) => {
            entries.insert(name.to_vec(), target);
            Ok(())
        }
        _ => corrupt(dir, "entries of a file that is not a directory"),
    }
}

impl MetaStore {
    /// Brings inode `ino` into `shard` (its shard, write-locked) from the
    /// index, unless it is in memory already, was never in the index, or
    /// was freed since the index last committed (its shard's notes say so:
    /// every inode changed since then is in memory, but a freed one).
    /// Returns whether it is in memory now.
    pub(super) fn make_resident(&self, shard: &mut ShardInodes, ino: u64) -> Result<bool> {
        if shard.inodes.contains_key(&ino) {
            return Ok(true);
        }
        if !self.core.indexed
            || ino >= self.index_ino_limit.load(Ordering::Acquire)
            || shard.changed.get_mut().inodes.contains(&ino)
            || shard.freed_in_cut.get_mut().contains(&ino)
        {
            return Ok(false);
        }
        let mut index = Ordered::lock(Level::MetadataIndex, || self.index.lock());
        let read = index.as_mut().expect("an indexed store holds its index");
        let inode = read.read_inode(ino, self.core.data_region)?;
        drop(index);
        Ok(inode.is_some_and(|inode| shard.inodes.insert(ino, inode).is_none()))
    }

    /// As `make_resident` for a caller holding no shard; a failure to read
    /// the index turns the volume read-only (the inode reads as missing).
    pub(super) fn bring_in(&self, ino: u64) -> bool {
        let mut shard = self.core.write_shard(shard_of(ino));
        match self.make_resident(&mut shard, ino) {
            Ok(resident) => resident,
            Err(error) => {
                self.journal.fail_metadata_read(format_args!(
                    "reading inode {ino} from the metadata index: {error}"
                ));
                false
            }
        }
    }

    /// Whether `ino` may have to be read from the index: where the store
    /// keeps one and the number may be there.
    pub(super) fn may_be_indexed(&self, ino: u64) -> bool {
        self.core.indexed && ino < self.index_ino_limit.load(Ordering::Acquire)
    }

    /// Inodes in memory now, counted a shard at a time.
    pub fn inodes_in_memory(&self) -> u64 {
        (0..SHARD_COUNT).map(|index| self.core.read_shard(index).inodes.len() as u64).sum()
    }

    /// After a checkpoint committed: forgets the inodes freed before its
    /// cut (the index no longer holds them) and, shard by shard, evicts
    /// clean inodes nothing pins until the shard's inodes fit its share of
    /// `inode_cache_bytes`.
    pub(super) fn evict_clean_inodes(&self) {
        let budget_bytes = self.inode_cache_bytes.load(Ordering::Relaxed);
        let share_bytes = budget_bytes / SHARD_COUNT as u64;
        for index in 0..SHARD_COUNT {
            let mut shard = self.core.write_shard(index);
            shard.freed_in_cut.get_mut().clear();
            if budget_bytes != u64::MAX {
                evict_from(&mut shard, share_bytes);
            }
        }
    }

    /// Brings every inode the index holds into memory (fsck's and the
    /// shared-count check's whole-table walks), as much memory as format 2
    /// keeps. Holds off checkpoints meanwhile, so that nothing read here
    /// can have changed, been written back and evicted before it lands.
    pub fn make_all_resident(&self) -> Result<()> {
        if !self.core.indexed {
            return Ok(());
        }
        let _no_checkpoint = Ordered::lock(Level::Checkpoint, || self.checkpoint_lock.lock());
        let mut inodes: Vec<(u64, Inode)> = Vec::new();
        {
            let mut index = Ordered::lock(Level::MetadataIndex, || self.index.lock());
            let index = index.as_mut().expect("an indexed store holds its index");
            index.each_loaded(self.core.data_region, |loaded| {
                match loaded {
                    Loaded::Inode(ino, inode) => inodes.push((ino, inode)),
                    Loaded::Entry { dir, name, target } => {
                        // Keys sort every inode before every entry.
                        let at = inodes.binary_search_by_key(&dir, |(ino, _)| *ino);
                        if let Ok(at) = at {
                            add_entry(dir, &mut inodes[at].1, &name, target)
                                .map_err(|error| Error::Corrupt(error.to_string()))?;
                        }
                    }
                    Loaded::Shared(_) => {}
                }
                Ok(())
            })?;
        }
        for (ino, inode) in inodes {
            let mut guard = self.core.write_shard(shard_of(ino));
            let shard = &mut *guard;
            let gone = shard.changed.get_mut().inodes.contains(&ino)
                || shard.freed_in_cut.get_mut().contains(&ino);
            if !gone {
                shard.inodes.entry(ino).or_insert(inode);
            }
        }
        Ok(())
    }
}

/// Evicts clean, unpinned inodes of `shard` until what it keeps fits
/// `share_bytes` (or nothing more may go).
fn evict_from(shard: &mut ShardInodes, share_bytes: u64) {
    let mut kept_bytes: u64 = shard.inodes.values().map(resident_bytes).sum();
    if kept_bytes <= share_bytes {
        return;
    }
    let changed = shard.changed.get_mut();
    let entries_changed: FxHashSet<u64> = changed.entries.iter().map(|(dir, _)| *dir).collect();
    let victims: Vec<(u64, u64)> = shard
        .inodes
        .iter()
        .filter(|(ino, inode)| {
            !changed.inodes.contains(ino)
                && !entries_changed.contains(ino)
                && evictable(**ino, inode)
        })
        .map(|(&ino, inode)| (ino, resident_bytes(inode)))
        .collect();
    for (ino, bytes) in victims {
        if kept_bytes <= share_bytes {
            break;
        }
        shard.inodes.remove(&ino);
        kept_bytes -= bytes;
    }
}
