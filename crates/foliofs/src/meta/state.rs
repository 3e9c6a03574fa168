//! How records change the metadata: [`MetaState::apply`] is the only way
//! metadata changes, live or at replay: the live path builds records,
//! applies them here and logs them, and mount applies the same records from
//! the checkpoint and the journal. One code path means replay cannot
//! disagree with what the running volume did.
//!
//! A record changes only inodes it names, so it applies to the shards
//! (`super::shards`) of those inodes alone: the transaction that applies it
//! holds their write locks, and mount holds them all.

use std::sync::atomic::Ordering;

use crate::alloc::{Allocator, BlockRun};
use crate::extent::{Extent, ExtentKind, ExtentMap, Lookup};
use crate::format::record::SHARED_SET_RECORD_BYTES;
use crate::format::record::{is_valid_name, is_valid_xattr_name};
use crate::format::{InodeAttrs, Record, ROOT_INO, SYMLINK_BYTES_MAX, XATTR_VALUE_BYTES_MAX};
use crate::refcount::{self, SharedBlocks};

use super::inode::{Inode, InodeBody};
use super::shards::MetaState;
use crate::alloc::Promises;

/// Encoded bytes per item in a checkpoint, for the capacity estimate.
const INODE_RECORD_BYTES: u64 = 78;
const EXTENT_RECORD_BYTES: u64 = 34;
const DIR_ENTRY_RECORD_BYTES: u64 = 19;
const SYMLINK_RECORD_BYTES: u64 = 11;
const XATTR_RECORD_BYTES: u64 = 15;
const DEVICE_RECORD_BYTES: u64 = 13;
const FLAGS_RECORD_BYTES: u64 = 13;

fn xattr_record_bytes(name: &[u8], value: &[u8]) -> u64 {
    XATTR_RECORD_BYTES + name.len() as u64 + value.len() as u64
}

/// What inode `inode` adds to the checkpoint estimate, its entries aside
/// (`entry_estimate_bytes`): what applying its records would add. Open adds
/// it for inodes it reads from an index without applying them.
pub(super) fn inode_estimate_bytes(inode: &Inode) -> u64 {
    let body = match &inode.body {
        InodeBody::File(extents) => extents.len() as u64 * EXTENT_RECORD_BYTES,
        InodeBody::Symlink(target) if !target.is_empty() => {
            SYMLINK_RECORD_BYTES + target.len() as u64
        }
        InodeBody::Special { rdev } if *rdev != 0 => DEVICE_RECORD_BYTES,
        _ => 0,
    };
    let flags = if inode.flags != 0 { FLAGS_RECORD_BYTES } else { 0 };
    let xattrs: u64 =
        inode.xattrs.iter().map(|(name, value)| xattr_record_bytes(name, value)).sum();
    INODE_RECORD_BYTES + body + flags + xattrs
}

/// What a directory entry named `name` adds to the checkpoint estimate.
pub(super) fn entry_estimate_bytes(name: &[u8]) -> u64 {
    DIR_ENTRY_RECORD_BYTES + name.len() as u64
}

/// A record that cannot be applied: the log or checkpoint contradicts itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyError(pub String);

impl std::fmt::Display for ApplyError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

fn fail<T>(message: String) -> Result<T, ApplyError> {
    Err(ApplyError(message))
}

impl MetaState<'_> {
    /// A write changed the data but no metadata: advance mtime and ctime in
    /// memory only (see `Inode::times_dirty`).
    pub fn touch_times(&mut self, ino: u64, now: crate::format::Timestamp) {
        if let Some(inode) = self.locked.get_mut(ino) {
            inode.attrs.mtime = now;
            inode.attrs.ctime = now;
            inode.times_dirty = true;
            self.note_inode_change(ino);
        }
    }

    /// Applies one record. Returns the extents it displaced (their device
    /// blocks are the caller's to free). Never touches the allocator.
    pub fn apply(&mut self, record: &Record) -> Result<Vec<Extent>, ApplyError> {
        self.note_change(record);
        match record {
            Record::InodeSet { ino, attrs } => {
                self.apply_inode_set(*ino, attrs).map(|()| Vec::new())
            }
            Record::InodeFree { ino } => self.apply_inode_free(*ino),
            Record::SymlinkSet { ino, target } => {
                self.apply_symlink_set(*ino, target).map(|()| Vec::new())
            }
            Record::DirAdd { dir, name, ino } => {
                self.apply_dir_add(*dir, name, *ino).map(|()| Vec::new())
            }
            Record::DirRemove { dir, name } => {
                self.apply_dir_remove(*dir, name).map(|()| Vec::new())
            }
            Record::ExtentMap { ino, file_block, dev_block, block_count, state } => {
                let extent = Extent {
                    file_block: *file_block,
                    block_count: *block_count,
                    dev_block: *dev_block,
                    kind: ExtentKind::from(*state),
                };
                self.apply_extent_map(*ino, extent)
            }
            Record::ExtentUnmap { ino, file_block, block_count } => {
                self.apply_extent_unmap(*ino, *file_block, *block_count)
            }
            Record::XattrSet { ino, name, value } => {
                self.apply_xattr_set(*ino, name, value).map(|()| Vec::new())
            }
            Record::XattrRemove { ino, name } => {
                self.apply_xattr_remove(*ino, name).map(|()| Vec::new())
            }
            Record::DeviceSet { ino, rdev } => {
                self.apply_device_set(*ino, *rdev).map(|()| Vec::new())
            }
            Record::FlagsSet { ino, flags } => {
                self.apply_flags_set(*ino, *flags).map(|()| Vec::new())
            }
            // The shared-block table is free space's, not a shard's: the
            // store applies these (`MetaStore::load`, `transact`).
            Record::SharedSet { .. } => fail("a shared-block count applied to the inodes".into()),
        }
    }

    fn apply_xattr_set(&mut self, ino: u64, name: &[u8], value: &[u8]) -> Result<(), ApplyError> {
        if !is_valid_xattr_name(name) || value.len() > XATTR_VALUE_BYTES_MAX {
            return fail(format!("inode {ino}: invalid extended attribute"));
        }
        let Some(inode) = self.locked.get_mut(ino) else {
            return fail(format!("extended attribute for inode {ino}, which does not exist"));
        };
        let new_bytes = xattr_record_bytes(name, value);
        let old_bytes = inode
            .xattrs
            .insert(name.to_vec(), value.to_vec())
            .map_or(0, |old| xattr_record_bytes(name, &old));
        self.estimate_delta += (new_bytes) as i64;
        self.estimate_delta -= (old_bytes) as i64;
        Ok(())
    }

    fn apply_xattr_remove(&mut self, ino: u64, name: &[u8]) -> Result<(), ApplyError> {
        let Some(inode) = self.locked.get_mut(ino) else {
            return fail(format!(
                "extended attribute removed from inode {ino}, which does not exist"
            ));
        };
        let Some(old) = inode.xattrs.remove(name) else {
            return fail(format!("removing a missing extended attribute from inode {ino}"));
        };
        self.estimate_delta -= (xattr_record_bytes(name, &old)) as i64;
        Ok(())
    }

    fn apply_device_set(&mut self, ino: u64, rdev: u32) -> Result<(), ApplyError> {
        let Some(inode) = self.locked.get_mut(ino) else {
            return fail(format!("device number for inode {ino}, which does not exist"));
        };
        let InodeBody::Special { rdev: stored } = &mut inode.body else {
            return fail(format!("device number for inode {ino}, which is not a device"));
        };
        if !inode.attrs.kind.is_device() {
            return fail(format!("device number for inode {ino}, which is not a device"));
        }
        if *stored == 0 {
            self.estimate_delta += (DEVICE_RECORD_BYTES) as i64;
        }
        *stored = rdev;
        if rdev == 0 {
            self.estimate_delta -= (DEVICE_RECORD_BYTES) as i64;
        }
        Ok(())
    }

    fn apply_flags_set(&mut self, ino: u64, flags: u32) -> Result<(), ApplyError> {
        let Some(inode) = self.locked.get_mut(ino) else {
            return fail(format!("flags for inode {ino}, which does not exist"));
        };
        if flags & !crate::format::record::INODE_FLAGS_KNOWN != 0 {
            return fail(format!("inode {ino}: unknown flags {flags:#x}"));
        }
        if inode.flags == 0 {
            self.estimate_delta += (FLAGS_RECORD_BYTES) as i64;
        }
        inode.flags = flags;
        if flags == 0 {
            self.estimate_delta -= (FLAGS_RECORD_BYTES) as i64;
        }
        Ok(())
    }

    fn apply_inode_set(&mut self, ino: u64, attrs: &InodeAttrs) -> Result<(), ApplyError> {
        if let Some(inode) = self.locked.get_mut(ino) {
            if inode.attrs.kind != attrs.kind {
                return fail(format!("inode {ino} changes kind"));
            }
            inode.attrs = *attrs;
            inode.times_dirty = false;
            return Ok(());
        }
        self.locked.shard_mut(ino).inodes.insert(ino, Inode::new(*attrs));
        self.inode_delta += 1;
        self.core.next_ino.fetch_max(ino.saturating_add(1), Ordering::Relaxed);
        self.estimate_delta += (INODE_RECORD_BYTES) as i64;
        Ok(())
    }

    fn apply_inode_free(&mut self, ino: u64) -> Result<Vec<Extent>, ApplyError> {
        if ino == ROOT_INO {
            return fail("the root directory cannot be freed".into());
        }
        let Some(inode) = self.locked.inode(ino) else {
            return fail(format!("freeing inode {ino}, which does not exist"));
        };
        if inode.entries().is_some_and(|entries| !entries.is_empty()) {
            return fail(format!("freeing directory {ino}, which is not empty"));
        }
        let inode = self.locked.shard_mut(ino).inodes.remove(&ino).expect("checked above");
        inode.note_changed();
        self.inode_delta -= 1;
        self.estimate_delta -= (INODE_RECORD_BYTES) as i64;
        if inode.flags != 0 {
            self.estimate_delta -= (FLAGS_RECORD_BYTES) as i64;
        }
        for (name, value) in &inode.xattrs {
            self.estimate_delta -= (xattr_record_bytes(name, value)) as i64;
        }
        match inode.body {
            InodeBody::File(extents) => {
                self.estimate_delta -= (extents.len() as u64 * EXTENT_RECORD_BYTES) as i64;
                Ok(extents.iter().copied().collect())
            }
            InodeBody::Symlink(target) => {
                if !target.is_empty() {
                    self.estimate_delta -= (SYMLINK_RECORD_BYTES + target.len() as u64) as i64;
                }
                Ok(Vec::new())
            }
            InodeBody::Special { rdev } => {
                if rdev != 0 {
                    self.estimate_delta -= (DEVICE_RECORD_BYTES) as i64;
                }
                Ok(Vec::new())
            }
            InodeBody::Dir(_) => Ok(Vec::new()),
        }
    }

    fn apply_symlink_set(&mut self, ino: u64, target: &[u8]) -> Result<(), ApplyError> {
        if target.is_empty() || target.len() > SYMLINK_BYTES_MAX {
            return fail(format!("symlink {ino} target of {} bytes", target.len()));
        }
        let Some(InodeBody::Symlink(stored)) =
            self.locked.get_mut(ino).map(|inode| &mut inode.body)
        else {
            return fail(format!("symlink target for inode {ino}, which is not a symlink"));
        };
        let old_bytes =
            if stored.is_empty() { 0 } else { SYMLINK_RECORD_BYTES + stored.len() as u64 };
        *stored = target.to_vec();
        self.estimate_delta += (SYMLINK_RECORD_BYTES + target.len() as u64) as i64;
        self.estimate_delta -= (old_bytes) as i64;
        Ok(())
    }

    fn apply_dir_add(&mut self, dir: u64, name: &[u8], ino: u64) -> Result<(), ApplyError> {
        if !is_valid_name(name) {
            return fail(format!("invalid name in directory {dir}"));
        }
        if self.locked.inode(ino).is_none() {
            return fail(format!(
                "entry in directory {dir} names inode {ino}, which does not exist"
            ));
        }
        let Some(InodeBody::Dir(entries)) = self.locked.get_mut(dir).map(|inode| &mut inode.body)
        else {
            return fail(format!("entry added to inode {dir}, which is not a directory"));
        };
        if entries.insert(name.to_vec(), ino).is_none() {
            self.estimate_delta += (DIR_ENTRY_RECORD_BYTES + name.len() as u64) as i64;
        }
        Ok(())
    }

    fn apply_dir_remove(&mut self, dir: u64, name: &[u8]) -> Result<(), ApplyError> {
        let Some(InodeBody::Dir(entries)) = self.locked.get_mut(dir).map(|inode| &mut inode.body)
        else {
            return fail(format!("entry removed from inode {dir}, which is not a directory"));
        };
        if entries.remove(name).is_none() {
            return fail(format!("removing a missing entry from directory {dir}"));
        }
        self.estimate_delta -= (DIR_ENTRY_RECORD_BYTES + name.len() as u64) as i64;
        Ok(())
    }

    fn file_extents_mut(&mut self, ino: u64) -> Result<&mut ExtentMap, ApplyError> {
        match self.locked.get_mut(ino).map(|inode| &mut inode.body) {
            Some(InodeBody::File(extents)) => Ok(extents),
            _ => fail(format!("extent change for inode {ino}, which is not a regular file")),
        }
    }

    fn apply_extent_map(&mut self, ino: u64, extent: Extent) -> Result<Vec<Extent>, ApplyError> {
        let region = self.core.data_region;
        let dev_end = extent.dev_block.checked_add(extent.block_count);
        if extent.dev_block < region.start_block
            || dev_end.is_none_or(|end| end > region.end_block())
        {
            return fail(format!(
                "inode {ino} maps device blocks [{}, +{}) outside the data region",
                extent.dev_block, extent.block_count
            ));
        }
        let extents = self.file_extents_mut(ino)?;
        let count_before = extents.len() as u64;
        let displaced = extents.insert(extent);
        let count_after = extents.len() as u64;
        self.adjust_extent_estimate(count_before, count_after);
        // Converting in place (Unwritten -> Written) displaces the very blocks
        // it maps again: only what the new extent does not reuse is freed.
        Ok(displaced
            .iter()
            .flat_map(|piece| {
                piece.outside_dev_blocks(extent.dev_block, extent.dev_block + extent.block_count)
            })
            .collect())
    }

    fn apply_extent_unmap(
        &mut self,
        ino: u64,
        file_block: u64,
        block_count: u64,
    ) -> Result<Vec<Extent>, ApplyError> {
        let extents = self.file_extents_mut(ino)?;
        let count_before = extents.len() as u64;
        let displaced = extents.remove(file_block, block_count);
        let count_after = extents.len() as u64;
        self.adjust_extent_estimate(count_before, count_after);
        Ok(displaced)
    }

    fn adjust_extent_estimate(&mut self, count_before: u64, count_after: u64) {
        self.estimate_delta += (count_after * EXTENT_RECORD_BYTES) as i64;
        self.estimate_delta -= (count_before * EXTENT_RECORD_BYTES) as i64;
    }

    /// After loading: sets every in-memory size to the size on disk and
    /// rebuilds free space from the extent maps (returned). Fails if two
    /// extents claim the same block that `shared` does not count as
    /// shared by exactly that many, or if `shared` counts a block more or
    /// less often than the extents map it. Every shard is locked.
    pub fn finish_load(&mut self, shared: &SharedBlocks) -> Result<Allocator, ApplyError> {
        let mut alloc = Allocator::new(self.core.data_region);
        self.core
            .persisted_bytes_estimate
            .fetch_add((shared.run_count() * SHARED_SET_RECORD_BYTES) as i64, Ordering::Relaxed);
        self.publish_estimate();
        let mut mapped = Vec::new();
        for (ino, inode) in self.inodes_mut() {
            inode.size = inode.attrs.size;
            let Some(extents) = inode.extents() else {
                continue;
            };
            for extent in extents.iter() {
                let run = BlockRun { start: extent.dev_block, count: extent.block_count };
                if shared.is_empty() {
                    alloc
                        .mark_used(run)
                        .map_err(|error| ApplyError(format!("inode {ino}: {error}")))?;
                } else {
                    mapped.push(run);
                }
            }
        }
        if shared.is_empty() {
            return Ok(alloc);
        }
        // Each stretch of equal mapping count must be what the table says.
        for counted in refcount::verify(mapped, shared).map_err(ApplyError)? {
            let run = BlockRun { start: counted.start, count: counted.count };
            alloc.mark_used(run).map_err(ApplyError)?;
        }
        Ok(alloc)
    }

    /// Delayed allocation (memory only, like XFS's in-core delalloc extents):
    /// every hole in `[file_block, file_block + block_count)` gets a Delalloc
    /// extent backed by a reservation, so the space is promised now and
    /// chosen at writeback. Returns how many leading blocks of the range are
    /// mapped afterwards (fewer than asked when space runs out; 0 means none
    /// could be reserved). Crashes forget delayed extents: they hold no data
    /// on disk.
    pub fn reserve_delalloc(
        &mut self,
        promises: &Promises,
        ino: u64,
        file_block: u64,
        block_count: u64,
    ) -> u64 {
        let end = file_block + block_count;
        let Some(InodeBody::File(extents)) = self.locked.inode(ino).map(|inode| &inode.body) else {
            return 0;
        };
        let mut holes = Vec::new();
        let mut block = file_block;
        while block < end {
            match extents.lookup(block) {
                Lookup::Mapped(extent) => block = extent.file_end(),
                Lookup::Hole { block_count } => {
                    let hole_end = end.min(block.saturating_add(block_count));
                    holes.push((block, hole_end - block));
                    block = hole_end;
                }
            }
        }
        let mut mapped_end = end;
        for (start, count) in holes {
            let granted = promises.reserve_up_to(count);
            if granted > 0 {
                let extent = Extent {
                    file_block: start,
                    block_count: granted,
                    dev_block: 0,
                    kind: ExtentKind::Delalloc,
                };
                let extents = self.file_extents_mut(ino).expect("checked above");
                let count_before = extents.len() as u64;
                extents.insert(extent);
                let count_after = extents.len() as u64;
                self.adjust_extent_estimate(count_before, count_after);
            }
            if granted < count {
                mapped_end = start + granted;
                break;
            }
        }
        mapped_end - file_block
    }
}

/// Limits the live path never passes: a size above `size_max`, or an
/// extent whose end in bytes does not fit in a u64 (INSERT_RANGE may
/// shift preallocated extents past `size_max`, never that far). Checked
/// after loading, so no later byte arithmetic on a hostile image
/// overflows.
pub fn check_limits<'i>(
    inodes: impl Iterator<Item = (u64, &'i Inode)>,
    block_bytes: u64,
    size_max: u64,
) -> Result<(), ApplyError> {
    for (ino, inode) in inodes {
        if inode.attrs.size > size_max {
            return fail(format!(
                "inode {ino} has size {}, above the largest file ({size_max})",
                inode.attrs.size
            ));
        }
        let end_block = inode.extents().map_or(0, ExtentMap::end_block);
        if end_block.checked_mul(block_bytes).is_none() {
            return fail(format!(
                "inode {ino} maps file block {end_block}, past the largest file offset"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{decode_all, ExtentState, Timestamp};
    use crate::format::{InodeKind, Region};
    use crate::meta::checkpoint;
    use crate::meta::shards::{MetaCore, ShardSet};

    fn attrs(kind: InodeKind, nlink: u32, parent: u64) -> InodeAttrs {
        InodeAttrs {
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            nlink,
            size: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            parent,
        }
    }

    fn region() -> Region {
        Region { start_block: 100, block_count: 1000 }
    }

    fn core() -> MetaCore {
        MetaCore::new(region(), ROOT_INO + 1, false)
    }

    /// Every shard locked, as mount holds them.
    fn all(core: &MetaCore) -> MetaState<'_> {
        MetaState::lock(core, ShardSet::All)
    }

    fn snapshot(state: &MetaState<'_>) -> (Vec<u8>, u64) {
        checkpoint::assemble(&state.shard_parts())
    }

    fn populated(core: &MetaCore) -> MetaState<'_> {
        let mut state = all(core);
        let records = vec![
            Record::InodeSet { ino: 1, attrs: attrs(InodeKind::Dir, 3, 1) },
            Record::InodeSet { ino: 2, attrs: attrs(InodeKind::Dir, 2, 1) },
            Record::DirAdd { dir: 1, name: b"sub".to_vec(), ino: 2 },
            Record::InodeSet { ino: 3, attrs: attrs(InodeKind::File, 1, 0) },
            Record::DirAdd { dir: 2, name: b"file".to_vec(), ino: 3 },
            Record::ExtentMap {
                ino: 3,
                file_block: 0,
                dev_block: 200,
                block_count: 4,
                state: ExtentState::Written,
            },
            Record::InodeSet { ino: 4, attrs: attrs(InodeKind::Symlink, 1, 0) },
            Record::SymlinkSet { ino: 4, target: b"sub/file".to_vec() },
            Record::DirAdd { dir: 1, name: b"link".to_vec(), ino: 4 },
            Record::XattrSet { ino: 3, name: b"user.a".to_vec(), value: b"1".to_vec() },
            Record::XattrSet { ino: 3, name: b"user.a".to_vec(), value: vec![9; 300] },
            Record::XattrSet { ino: 2, name: b"trusted.t".to_vec(), value: Vec::new() },
            Record::InodeSet { ino: 5, attrs: attrs(InodeKind::CharDevice, 1, 0) },
            Record::DeviceSet { ino: 5, rdev: 0x0501 },
            Record::DirAdd { dir: 1, name: b"tty".to_vec(), ino: 5 },
            Record::InodeSet { ino: 6, attrs: attrs(InodeKind::Fifo, 1, 0) },
            Record::DirAdd { dir: 1, name: b"fifo".to_vec(), ino: 6 },
        ];
        for record in &records {
            state.apply(record).unwrap();
        }
        state
    }

    #[test]
    fn snapshot_reloads_to_the_same_state_and_estimate_bounds_it() {
        let core = core();
        let (payload, count) = {
            // One thread holds one volume's shards at a time (the lock
            // order counts shards by index, whatever their volume).
            let state = populated(&core);
            let (payload, count) = snapshot(&state);
            assert!(payload.len() as u64 <= state.persisted_bytes_estimate());
            (payload, count)
        };
        let reloaded_core = self::core();
        let mut reloaded = all(&reloaded_core);
        for record in decode_all(&payload, count as u32).unwrap() {
            reloaded.apply(&record).unwrap();
        }
        let alloc = reloaded.finish_load(&SharedBlocks::new()).unwrap();
        assert_eq!(snapshot(&reloaded), (payload, count));
        assert_eq!(reloaded_core.next_ino.load(Ordering::Relaxed), 7);
        assert_eq!(reloaded.inode(3).unwrap().xattrs[&b"user.a"[..]], vec![9; 300]);
        assert_eq!(reloaded.inode(5).unwrap().rdev(), 0x0501);
        assert_eq!(reloaded.inode(6).unwrap().rdev(), 0);
        assert_eq!(alloc.free_blocks(), 996);
        assert_eq!(reloaded_core.inode_count(), 6);
    }

    #[test]
    fn applying_twice_is_idempotent() {
        let core = core();
        let mut state = populated(&core);
        let record = Record::ExtentMap {
            ino: 3,
            file_block: 2,
            dev_block: 500,
            block_count: 4,
            state: ExtentState::Unwritten,
        };
        state.apply(&record).unwrap();
        let once = snapshot(&state);
        state.apply(&record).unwrap();
        assert_eq!(snapshot(&state), once);
    }

    #[test]
    fn contradictions_are_errors_not_panics() {
        let core = core();
        let mut state = populated(&core);
        let bad = [
            Record::DirAdd { dir: 3, name: b"x".to_vec(), ino: 2 },
            Record::DirAdd { dir: 1, name: b"x".to_vec(), ino: 99 },
            Record::DirRemove { dir: 1, name: b"missing".to_vec() },
            Record::InodeFree { ino: 1 },
            Record::InodeFree { ino: 2 },
            Record::InodeSet { ino: 3, attrs: attrs(InodeKind::Dir, 1, 1) },
            Record::SymlinkSet { ino: 3, target: b"x".to_vec() },
            Record::ExtentMap {
                ino: 3,
                file_block: 0,
                dev_block: 1099,
                block_count: 2,
                state: ExtentState::Written,
            },
            Record::ExtentUnmap { ino: 2, file_block: 0, block_count: 1 },
            Record::XattrSet { ino: 99, name: b"user.a".to_vec(), value: Vec::new() },
            Record::XattrRemove { ino: 3, name: b"user.missing".to_vec() },
            Record::DeviceSet { ino: 3, rdev: 1 },
            Record::DeviceSet { ino: 6, rdev: 1 },
            Record::InodeSet { ino: 6, attrs: attrs(InodeKind::Socket, 1, 0) },
        ];
        for record in &bad {
            assert!(state.apply(record).is_err(), "{record:?} should not apply");
        }
    }

    #[test]
    fn overlapping_extents_fail_the_load() {
        let core = core();
        let mut state = populated(&core);
        state.apply(&Record::InodeSet { ino: 9, attrs: attrs(InodeKind::File, 1, 0) }).unwrap();
        let record = Record::ExtentMap {
            ino: 9,
            file_block: 0,
            dev_block: 202,
            block_count: 1,
            state: ExtentState::Written,
        };
        state.apply(&record).unwrap();
        let error = state.finish_load(&SharedBlocks::new()).unwrap_err();
        assert!(error.0.contains("mapped twice"), "{error}");
    }

    #[test]
    fn shared_counts_must_match_the_extent_maps() {
        let clone_of_inode_3 = Record::ExtentMap {
            ino: 9,
            file_block: 0,
            dev_block: 201,
            block_count: 2,
            state: ExtentState::Written,
        };
        let load = |counts: &[(u64, u64, u32)]| {
            let core = core();
            let mut state = populated(&core);
            state.apply(&Record::InodeSet { ino: 9, attrs: attrs(InodeKind::File, 1, 0) }).unwrap();
            state.apply(&clone_of_inode_3).unwrap();
            let mut shared = SharedBlocks::new();
            for &(start, count, refs) in counts {
                shared.set(start, count, refs);
            }
            state.finish_load(&shared).map(|alloc| alloc.free_blocks())
        };
        // Inode 3 maps 200..204, inode 9 maps 201..203: counted right, the
        // shared blocks are used once.
        assert_eq!(load(&[(201, 2, 2)]), Ok(996));
        for wrong in
            [&[][..], &[(201, 1, 2)], &[(201, 2, 3)], &[(201, 3, 2)], &[(201, 2, 2), (500, 1, 2)]]
        {
            let error = load(wrong).expect_err(&format!("{wrong:?} must not load"));
            assert!(
                error.0.contains("mapped") || error.0.contains("counted"),
                "{wrong:?}: {error}"
            );
        }
    }

    #[test]
    fn converting_in_place_frees_nothing_and_remapping_frees_the_old_blocks() {
        let core = core();
        let mut state = populated(&core);
        state.finish_load(&SharedBlocks::new()).unwrap();
        let convert = |dev_block| Record::ExtentMap {
            ino: 3,
            file_block: 1,
            dev_block,
            block_count: 2,
            state: ExtentState::Unwritten,
        };
        assert!(state.apply(&convert(201)).unwrap().is_empty(), "same blocks: nothing displaced");
        let displaced = state.apply(&convert(600)).unwrap();
        let freed: Vec<(u64, u64)> =
            displaced.iter().map(|e| (e.dev_block, e.block_count)).collect();
        assert_eq!(freed, vec![(201, 2)]);
        let overlapping = state.apply(&convert(599)).unwrap();
        let freed: Vec<(u64, u64)> =
            overlapping.iter().map(|e| (e.dev_block, e.block_count)).collect();
        assert_eq!(freed, vec![(601, 1)]);
    }

    #[test]
    fn freeing_an_inode_drops_its_attributes_from_the_estimate() {
        let core = core();
        let mut state = populated(&core);
        let before = state.persisted_bytes_estimate();
        state.apply(&Record::InodeSet { ino: 9, attrs: attrs(InodeKind::File, 1, 0) }).unwrap();
        let set = Record::XattrSet { ino: 9, name: b"user.big".to_vec(), value: vec![1; 5000] };
        state.apply(&set).unwrap();
        assert!(state.persisted_bytes_estimate() > before + 5000);
        state.apply(&Record::InodeFree { ino: 9 }).unwrap();
        assert_eq!(state.persisted_bytes_estimate(), before);
        state.apply(&Record::XattrRemove { ino: 3, name: b"user.a".to_vec() }).unwrap();
        state.apply(&Record::InodeFree { ino: 5 }).unwrap();
        let (payload, _) = snapshot(&state);
        assert!(payload.len() as u64 <= state.persisted_bytes_estimate());
    }
}
