//! Inodes in memory on demand, where the metadata is kept in an index
//! (format 3): read from the index when an operation first names one
//! (`MetaStore::make_resident`), evicted after a checkpoint's commit when
//! clean and unpinned (`MetaStore::evict_clean_inodes`, under the budget
//! `inode_cache_bytes`), all brought in for the whole-table walks of fsck
//! (`MetaStore::make_all_resident`).

use std::sync::atomic::Ordering;

use rustc_hash::FxHashSet;

use crate::error::{Error, Result};
use crate::lock_order::{Level, Ordered};

use super::indexed::Loaded;
use super::inode::Inode;
use super::load::LoadLimits;
use super::resident::{add_entry, evictable, resident_bytes};
use super::shards::{shard_of, ShardInodes, SHARD_COUNT};
use super::state::check_limits;
use super::store::MetaStore;

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
        if let Some(inode) = &inode {
            let LoadLimits { block_bytes, size_max } = self.limits;
            check_limits(std::iter::once((ino, inode)), block_bytes, size_max)
                .map_err(|error| Error::Corrupt(format!("metadata index: {}", error.0)))?;
        }
        let inserted = inode.is_some_and(|inode| shard.inodes.insert(ino, inode).is_none());
        if inserted {
            self.core.not_resident.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(inserted)
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
                let evicted = evict_from(&mut shard, share_bytes);
                self.core.not_resident.fetch_add(evicted as i64, Ordering::Relaxed);
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
            if !gone && !shard.inodes.contains_key(&ino) {
                shard.inodes.insert(ino, inode);
                self.core.not_resident.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Evicts clean, unpinned inodes of `shard` until what it keeps fits
/// `share_bytes` (or nothing more may go).
fn evict_from(shard: &mut ShardInodes, share_bytes: u64) -> u64 {
    let mut kept_bytes: u64 = shard.inodes.values().map(resident_bytes).sum();
    if kept_bytes <= share_bytes {
        return 0;
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
    let mut evicted = 0;
    for (ino, bytes) in victims {
        if kept_bytes <= share_bytes {
            break;
        }
        shard.inodes.remove(&ino);
        kept_bytes -= bytes;
        evicted += 1;
    }
    evicted
}
