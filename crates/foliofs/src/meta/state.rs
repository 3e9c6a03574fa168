//! The in-memory metadata: inodes, directories, extent maps, and free space.
//!
//! [`MetaState::apply`] is the only way metadata changes, live or at replay:
//! the live path builds records, applies them here and logs them, and mount
//! applies the same records from the checkpoint and the journal. One code path
//! means replay cannot disagree with what the running volume did.
//!
//! Memory: an inode costs about 220 B, a directory entry about 80 B plus its
//! name, an extent about 64 B (BTreeMap node share included), an extended
//! attribute about 100 B plus its name and value. A million files of one
//! extent each need roughly 370 MB.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::alloc::{Allocator, BlockRun};
use crate::extent::{Extent, ExtentKind, ExtentMap, Lookup};
use crate::format::codec::Writer;
use crate::format::record::{is_valid_name, is_valid_xattr_name};
use crate::format::{
    InodeAttrs, InodeKind, Record, Region, ROOT_INO, SYMLINK_BYTES_MAX, XATTR_VALUE_BYTES_MAX,
};

/// Encoded bytes per item in a checkpoint, for the capacity estimate.
const INODE_RECORD_BYTES: u64 = 78;
const EXTENT_RECORD_BYTES: u64 = 34;
const DIR_ENTRY_RECORD_BYTES: u64 = 19;
const SYMLINK_RECORD_BYTES: u64 = 11;
const XATTR_RECORD_BYTES: u64 = 15;
const DEVICE_RECORD_BYTES: u64 = 13;
const FLAGS_RECORD_BYTES: u64 = 13;

/// Extended attributes of one inode: name (with its namespace prefix) -> value.
pub type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

fn xattr_record_bytes(name: &[u8], value: &[u8]) -> u64 {
    XATTR_RECORD_BYTES + name.len() as u64 + value.len() as u64
}

#[derive(Debug, Clone)]
pub enum InodeBody {
    File(ExtentMap),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
    /// A FIFO, socket or device node; `rdev` is 0 but for devices.
    Special {
        rdev: u32,
    },
}

#[derive(Debug, Clone)]
pub struct Inode {
    pub attrs: InodeAttrs,
    /// The size callers see. `attrs.size` is the size on disk, which never
    /// covers data whose write has not completed; this one may run ahead of it.
    pub size: u64,
    pub body: InodeBody,
    pub xattrs: Xattrs,
    /// Open handles (memory only): an unlinked inode lives until the last closes.
    pub open_handles: u32,
    /// Lsn of the last record that changed this inode (memory only): fsync
    /// commits up to it.
    pub meta_lsn: u64,
    /// Lsn of the last change needed to read the data back (size, extents,
    /// a new name); fdatasync commits up to it and skips timestamps.
    pub data_lsn: u64,
    /// mtime/ctime were advanced in memory by a write that changed nothing
    /// else; the next InodeSet (an fsync, any later change, a checkpoint)
    /// carries them. The one persistent field that changes without a record:
    /// logging every overwrite's timestamps would cost a record per write.
    pub times_dirty: bool,
    /// Created without a name (O_TMPFILE, not O_EXCL) and not linked since
    /// (memory only, as the kernel's I_LINKABLE): the one kind of inode
    /// with no links that `link` may still name. A crash frees it.
    pub linkable: bool,
    /// Attribute flags (chattr): `format::record::INODE_FLAG_*` bits.
    pub flags: u32,
}

impl Inode {
    pub fn extents(&self) -> Option<&ExtentMap> {
        match &self.body {
            InodeBody::File(extents) => Some(extents),
            _ => None,
        }
    }

    pub fn entries(&self) -> Option<&BTreeMap<Vec<u8>, u64>> {
        match &self.body {
            InodeBody::Dir(entries) => Some(entries),
            _ => None,
        }
    }

    /// The device number of a device node; 0 for every other kind.
    pub fn rdev(&self) -> u32 {
        match self.body {
            InodeBody::Special { rdev } => rdev,
            _ => 0,
        }
    }

    /// Encoded bytes of the names of all extended attributes, each with its
    /// NUL, as listxattr returns them.
    pub fn xattr_list_bytes(&self) -> usize {
        self.xattrs.keys().map(|name| name.len() + 1).sum()
    }
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

/// Runs freed by records not yet durable, by the lsn of the record. Every
/// transaction releases those that became durable and every delayed
/// allocation asks how many blocks wait: neither walks the runs, which an
/// `rm -rf` of a tree leaves by the thousand until the next commit.
#[derive(Default)]
struct PendingFrees {
    by_lsn: BTreeMap<u64, Vec<BlockRun>>,
    blocks: u64,
}

impl PendingFrees {
    fn push(&mut self, lsn: u64, run: BlockRun) {
        self.by_lsn.entry(lsn).or_default().push(run);
        self.blocks += run.count;
    }

    /// Removes and returns the runs freed by records up to `durable_lsn`.
    fn take_through(&mut self, durable_lsn: u64) -> Vec<BlockRun> {
        match self.by_lsn.first_key_value() {
            Some((&lsn, _)) if lsn <= durable_lsn => {}
            _ => return Vec::new(),
        }
        let later = match durable_lsn.checked_add(1) {
            Some(next) => self.by_lsn.split_off(&next),
            None => BTreeMap::new(),
        };
        let taken: Vec<BlockRun> =
            std::mem::replace(&mut self.by_lsn, later).into_values().flatten().collect();
        self.blocks -= taken.iter().map(|run| run.count).sum::<u64>();
        taken
    }

    fn clear(&mut self) {
        self.by_lsn.clear();
        self.blocks = 0;
    }
}

pub struct MetaState {
    /// By inode number, hashed with FxHash: looked up on every operation
    /// (two per cached read), and the numbers are ours, not an attacker's.
    inodes: FxHashMap<u64, Inode>,
    pub next_ino: u64,
    data_region: Region,
    /// Free space; rebuilt from the extent maps at mount, never persisted.
    pub alloc: Allocator,
    /// Blocks freed by records not yet durable, by the lsn that freed them.
    pending_frees: PendingFrees,
    /// With `-o discard`: durable frees wait for their discard (see
    /// `MetaStore::discard_durable_frees`) instead of going straight back
    /// to the allocator.
    pub discard_freed: bool,
    /// Runs taken for discarding, not yet back in the allocator.
    discarding_blocks: u64,
    /// Upper bound of the checkpoint payload this state encodes to.
    persisted_bytes_estimate: u64,
}

impl MetaState {
    pub fn new(data_region: Region) -> Self {
        Self {
            inodes: FxHashMap::default(),
            next_ino: ROOT_INO + 1,
            data_region,
            alloc: Allocator::new(data_region),
            pending_frees: PendingFrees::default(),
            discard_freed: false,
            discarding_blocks: 0,
            persisted_bytes_estimate: 0,
        }
    }

    pub fn inode(&self, ino: u64) -> Option<&Inode> {
        self.inodes.get(&ino)
    }

    /// Memory-only fields (size, open handles); persistent ones change through `apply`.
    pub fn inode_mut(&mut self, ino: u64) -> Option<&mut Inode> {
        self.inodes.get_mut(&ino)
    }

    /// A write changed the data but no metadata: advance mtime and ctime in
    /// memory only (see `Inode::times_dirty`).
    pub fn touch_times(&mut self, ino: u64, now: crate::format::Timestamp) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.attrs.mtime = now;
            inode.attrs.ctime = now;
            inode.times_dirty = true;
        }
    }

    /// A read advanced the access time: memory only, like `touch_times`
    /// (the inode's next record, fsync or checkpoint carries it).
    pub fn touch_atime(&mut self, ino: u64, now: crate::format::Timestamp) {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.attrs.atime = now;
            inode.times_dirty = true;
        }
    }

    pub fn inodes(&self) -> impl Iterator<Item = (u64, &Inode)> + '_ {
        self.inodes.iter().map(|(&ino, inode)| (ino, inode))
    }

    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    pub fn persisted_bytes_estimate(&self) -> u64 {
        self.persisted_bytes_estimate
    }

    /// Applies one record. Returns the extents it displaced (their device
    /// blocks are the caller's to free). Never touches the allocator.
    pub fn apply(&mut self, record: &Record) -> Result<Vec<Extent>, ApplyError> {
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
        }
    }

    fn apply_xattr_set(&mut self, ino: u64, name: &[u8], value: &[u8]) -> Result<(), ApplyError> {
        if !is_valid_xattr_name(name) || value.len() > XATTR_VALUE_BYTES_MAX {
            return fail(format!("inode {ino}: invalid extended attribute"));
        }
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return fail(format!("extended attribute for inode {ino}, which does not exist"));
        };
        let new_bytes = xattr_record_bytes(name, value);
        let old_bytes = inode
            .xattrs
            .insert(name.to_vec(), value.to_vec())
            .map_or(0, |old| xattr_record_bytes(name, &old));
        self.persisted_bytes_estimate += new_bytes;
        self.persisted_bytes_estimate -= old_bytes;
        Ok(())
    }

    fn apply_xattr_remove(&mut self, ino: u64, name: &[u8]) -> Result<(), ApplyError> {
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return fail(format!(
                "extended attribute removed from inode {ino}, which does not exist"
            ));
        };
        let Some(old) = inode.xattrs.remove(name) else {
            return fail(format!("removing a missing extended attribute from inode {ino}"));
        };
        self.persisted_bytes_estimate -= xattr_record_bytes(name, &old);
        Ok(())
    }

    fn apply_device_set(&mut self, ino: u64, rdev: u32) -> Result<(), ApplyError> {
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return fail(format!("device number for inode {ino}, which does not exist"));
        };
        let InodeBody::Special { rdev: stored } = &mut inode.body else {
            return fail(format!("device number for inode {ino}, which is not a device"));
        };
        if !inode.attrs.kind.is_device() {
            return fail(format!("device number for inode {ino}, which is not a device"));
        }
        if *stored == 0 {
            self.persisted_bytes_estimate += DEVICE_RECORD_BYTES;
        }
        *stored = rdev;
        if rdev == 0 {
            self.persisted_bytes_estimate -= DEVICE_RECORD_BYTES;
        }
        Ok(())
    }

    fn apply_flags_set(&mut self, ino: u64, flags: u32) -> Result<(), ApplyError> {
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return fail(format!("flags for inode {ino}, which does not exist"));
        };
        if flags & !crate::format::record::INODE_FLAGS_KNOWN != 0 {
            return fail(format!("inode {ino}: unknown flags {flags:#x}"));
        }
        if inode.flags == 0 {
            self.persisted_bytes_estimate += FLAGS_RECORD_BYTES;
        }
        inode.flags = flags;
        if flags == 0 {
            self.persisted_bytes_estimate -= FLAGS_RECORD_BYTES;
        }
        Ok(())
    }

    fn apply_inode_set(&mut self, ino: u64, attrs: &InodeAttrs) -> Result<(), ApplyError> {
        if let Some(inode) = self.inodes.get_mut(&ino) {
            if inode.attrs.kind != attrs.kind {
                return fail(format!("inode {ino} changes kind"));
            }
            inode.attrs = *attrs;
            inode.times_dirty = false;
            return Ok(());
        }
        let body = match attrs.kind {
            InodeKind::File => InodeBody::File(ExtentMap::new()),
            InodeKind::Dir => InodeBody::Dir(BTreeMap::new()),
            InodeKind::Symlink => InodeBody::Symlink(Vec::new()),
            InodeKind::Fifo
            | InodeKind::Socket
            | InodeKind::CharDevice
            | InodeKind::BlockDevice => InodeBody::Special { rdev: 0 },
        };
        let inode = Inode {
            attrs: *attrs,
            size: attrs.size,
            body,
            xattrs: Xattrs::new(),
            open_handles: 0,
            meta_lsn: 0,
            data_lsn: 0,
            times_dirty: false,
            linkable: false,
            flags: 0,
        };
        self.inodes.insert(ino, inode);
        self.next_ino = self.next_ino.max(ino.saturating_add(1));
        self.persisted_bytes_estimate += INODE_RECORD_BYTES;
        Ok(())
    }

    fn apply_inode_free(&mut self, ino: u64) -> Result<Vec<Extent>, ApplyError> {
        if ino == ROOT_INO {
            return fail("the root directory cannot be freed".into());
        }
        let Some(inode) = self.inodes.get(&ino) else {
            return fail(format!("freeing inode {ino}, which does not exist"));
        };
        if inode.entries().is_some_and(|entries| !entries.is_empty()) {
            return fail(format!("freeing directory {ino}, which is not empty"));
        }
        let inode = self.inodes.remove(&ino).expect("checked above");
        self.persisted_bytes_estimate -= INODE_RECORD_BYTES;
        if inode.flags != 0 {
            self.persisted_bytes_estimate -= FLAGS_RECORD_BYTES;
        }
        for (name, value) in &inode.xattrs {
            self.persisted_bytes_estimate -= xattr_record_bytes(name, value);
        }
        match inode.body {
            InodeBody::File(extents) => {
                self.persisted_bytes_estimate -= extents.len() as u64 * EXTENT_RECORD_BYTES;
                Ok(extents.iter().copied().collect())
            }
            InodeBody::Symlink(target) => {
                if !target.is_empty() {
                    self.persisted_bytes_estimate -= SYMLINK_RECORD_BYTES + target.len() as u64;
                }
                Ok(Vec::new())
            }
            InodeBody::Special { rdev } => {
                if rdev != 0 {
                    self.persisted_bytes_estimate -= DEVICE_RECORD_BYTES;
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
            self.inodes.get_mut(&ino).map(|inode| &mut inode.body)
        else {
            return fail(format!("symlink target for inode {ino}, which is not a symlink"));
        };
        let old_bytes =
            if stored.is_empty() { 0 } else { SYMLINK_RECORD_BYTES + stored.len() as u64 };
        *stored = target.to_vec();
        self.persisted_bytes_estimate += SYMLINK_RECORD_BYTES + target.len() as u64;
        self.persisted_bytes_estimate -= old_bytes;
        Ok(())
    }

    fn apply_dir_add(&mut self, dir: u64, name: &[u8], ino: u64) -> Result<(), ApplyError> {
        if !is_valid_name(name) {
            return fail(format!("invalid name in directory {dir}"));
        }
        if !self.inodes.contains_key(&ino) {
            return fail(format!(
                "entry in directory {dir} names inode {ino}, which does not exist"
            ));
        }
        let Some(InodeBody::Dir(entries)) = self.inodes.get_mut(&dir).map(|inode| &mut inode.body)
        else {
            return fail(format!("entry added to inode {dir}, which is not a directory"));
        };
        if entries.insert(name.to_vec(), ino).is_none() {
            self.persisted_bytes_estimate += DIR_ENTRY_RECORD_BYTES + name.len() as u64;
        }
        Ok(())
    }

    fn apply_dir_remove(&mut self, dir: u64, name: &[u8]) -> Result<(), ApplyError> {
        let Some(InodeBody::Dir(entries)) = self.inodes.get_mut(&dir).map(|inode| &mut inode.body)
        else {
            return fail(format!("entry removed from inode {dir}, which is not a directory"));
        };
        if entries.remove(name).is_none() {
            return fail(format!("removing a missing entry from directory {dir}"));
        }
        self.persisted_bytes_estimate -= DIR_ENTRY_RECORD_BYTES + name.len() as u64;
        Ok(())
    }

    fn file_extents_mut(&mut self, ino: u64) -> Result<&mut ExtentMap, ApplyError> {
        match self.inodes.get_mut(&ino).map(|inode| &mut inode.body) {
            Some(InodeBody::File(extents)) => Ok(extents),
            _ => fail(format!("extent change for inode {ino}, which is not a regular file")),
        }
    }

    fn apply_extent_map(&mut self, ino: u64, extent: Extent) -> Result<Vec<Extent>, ApplyError> {
        let region = self.data_region;
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
        self.persisted_bytes_estimate += count_after * EXTENT_RECORD_BYTES;
        self.persisted_bytes_estimate -= count_before * EXTENT_RECORD_BYTES;
    }

    /// Encodes the whole persistent state as records: every inode with its
    /// symlink target, device number, extents and extended attributes, then every directory entry (whose targets
    /// then all exist). Returns the payload and the record count.
    pub fn encode_snapshot(&self) -> (Vec<u8>, u64) {
        let mut writer = Writer::with_capacity(self.persisted_bytes_estimate as usize);
        let mut record_count = 0u64;
        let mut inos: Vec<u64> = self.inodes.keys().copied().collect();
        inos.sort_unstable();
        let mut emit = |record: Record, writer: &mut Writer| {
            record.encode(writer);
            record_count += 1;
        };
        for &ino in &inos {
            let inode = &self.inodes[&ino];
            emit(Record::InodeSet { ino, attrs: inode.attrs }, &mut writer);
            match &inode.body {
                InodeBody::Symlink(target) if !target.is_empty() => {
                    emit(Record::SymlinkSet { ino, target: target.clone() }, &mut writer);
                }
                InodeBody::File(extents) => {
                    for extent in extents.iter() {
                        let Some(state) = extent.kind.persisted() else {
                            continue;
                        };
                        let record = Record::ExtentMap {
                            ino,
                            file_block: extent.file_block,
                            dev_block: extent.dev_block,
                            block_count: extent.block_count,
                            state,
                        };
                        emit(record, &mut writer);
                    }
                }
                InodeBody::Special { rdev } if *rdev != 0 => {
                    emit(Record::DeviceSet { ino, rdev: *rdev }, &mut writer);
                }
                _ => {}
            }
            for (name, value) in &inode.xattrs {
                let record = Record::XattrSet { ino, name: name.clone(), value: value.clone() };
                emit(record, &mut writer);
            }
            if inode.flags != 0 {
                emit(Record::FlagsSet { ino, flags: inode.flags }, &mut writer);
            }
        }
        for &ino in &inos {
            let Some(entries) = self.inodes[&ino].entries() else {
                continue;
            };
            for (name, &target) in entries {
                emit(Record::DirAdd { dir: ino, name: name.clone(), ino: target }, &mut writer);
            }
        }
        (writer.into_bytes(), record_count)
    }

    /// After loading: sets every in-memory size to the size on disk and
    /// rebuilds free space from the extent maps. Fails if two extents claim
    /// the same block.
    pub fn finish_load(&mut self) -> Result<(), ApplyError> {
        let mut alloc = Allocator::new(self.data_region);
        let mut inos: Vec<u64> = self.inodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let inode = self.inodes.get_mut(&ino).expect("listed");
            inode.size = inode.attrs.size;
            let Some(extents) = inode.extents() else {
                continue;
            };
            for extent in extents.iter() {
                let run = BlockRun { start: extent.dev_block, count: extent.block_count };
                alloc
                    .mark_used(run)
                    .map_err(|error| ApplyError(format!("inode {ino}: {error}")))?;
            }
        }
        self.alloc = alloc;
        self.pending_frees.clear();
        Ok(())
    }

    /// Limits the live path never passes: a size above `size_max`, or an
    /// extent whose end in bytes does not fit in a u64 (INSERT_RANGE may
    /// shift preallocated extents past `size_max`, never that far). Checked
    /// after loading, so no later byte arithmetic on a hostile image
    /// overflows.
    pub fn check_limits(&self, block_bytes: u64, size_max: u64) -> Result<(), ApplyError> {
        for (&ino, inode) in &self.inodes {
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

    /// Frees `extents` displaced by a record with `lsn`: delayed allocations
    /// return their reservation now; device blocks become reusable only once
    /// `lsn` is durable.
    pub fn release_displaced(&mut self, extents: &[Extent], lsn: u64) {
        for extent in extents {
            match extent.kind {
                ExtentKind::Delalloc => self.alloc.unreserve(extent.block_count),
                ExtentKind::Unwritten | ExtentKind::Written => {
                    let run = BlockRun { start: extent.dev_block, count: extent.block_count };
                    self.pending_frees.push(lsn, run);
                }
            }
        }
    }

    /// Delayed allocation (memory only, like XFS's in-core delalloc extents):
    /// every hole in `[file_block, file_block + block_count)` gets a Delalloc
    /// extent backed by a reservation, so the space is promised now and
    /// chosen at writeback. Returns how many leading blocks of the range are
    /// mapped afterwards (fewer than asked when space runs out; 0 means none
    /// could be reserved). Crashes forget delayed extents: they hold no data
    /// on disk.
    pub fn reserve_delalloc(&mut self, ino: u64, file_block: u64, block_count: u64) -> u64 {
        let end = file_block + block_count;
        let Some(InodeBody::File(extents)) = self.inodes.get(&ino).map(|inode| &inode.body) else {
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
            let granted = count.min(self.alloc.available_blocks());
            if granted > 0 {
                assert!(self.alloc.reserve(granted));
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

    /// Makes blocks freed by records up to `durable_lsn` allocatable; with
    /// `discard_freed` they wait for [`MetaState::take_durable_frees`].
    pub fn release_pending_frees(&mut self, durable_lsn: u64) {
        if self.discard_freed {
            return;
        }
        for run in self.pending_frees.take_through(durable_lsn) {
            self.alloc.free(run);
        }
    }

    /// Takes the runs freed by records up to `durable_lsn`, to be discarded
    /// and then handed to [`MetaState::finish_discards`]; still counted as
    /// pending meanwhile.
    pub fn take_durable_frees(&mut self, durable_lsn: u64) -> Vec<BlockRun> {
        let taken = self.pending_frees.take_through(durable_lsn);
        self.discarding_blocks += taken.iter().map(|run| run.count).sum::<u64>();
        taken
    }

    /// Makes runs taken by [`MetaState::take_durable_frees`] allocatable.
    pub fn finish_discards(&mut self, runs: &[BlockRun]) {
        for &run in runs {
            self.discarding_blocks -= run.count;
            self.alloc.free(run);
        }
    }

    pub fn pending_free_blocks(&self) -> u64 {
        self.pending_frees.blocks + self.discarding_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{decode_all, ExtentState, Timestamp};

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

    fn populated() -> MetaState {
        let mut state = MetaState::new(region());
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
        let state = populated();
        let (payload, count) = state.encode_snapshot();
        assert!(payload.len() as u64 <= state.persisted_bytes_estimate());
        let mut reloaded = MetaState::new(region());
        for record in decode_all(&payload, count as u32).unwrap() {
            reloaded.apply(&record).unwrap();
        }
        reloaded.finish_load().unwrap();
        assert_eq!(reloaded.encode_snapshot(), (payload, count));
        assert_eq!(reloaded.next_ino, 7);
        assert_eq!(reloaded.inode(3).unwrap().xattrs[&b"user.a"[..]], vec![9; 300]);
        assert_eq!(reloaded.inode(5).unwrap().rdev(), 0x0501);
        assert_eq!(reloaded.inode(6).unwrap().rdev(), 0);
        assert_eq!(reloaded.alloc.free_blocks(), 996);
    }

    #[test]
    fn applying_twice_is_idempotent() {
        let mut state = populated();
        let record = Record::ExtentMap {
            ino: 3,
            file_block: 2,
            dev_block: 500,
            block_count: 4,
            state: ExtentState::Unwritten,
        };
        state.apply(&record).unwrap();
        let once = state.encode_snapshot();
        state.apply(&record).unwrap();
        assert_eq!(state.encode_snapshot(), once);
    }

    #[test]
    fn contradictions_are_errors_not_panics() {
        let mut state = populated();
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
        let mut state = populated();
        state.apply(&Record::InodeSet { ino: 9, attrs: attrs(InodeKind::File, 1, 0) }).unwrap();
        let record = Record::ExtentMap {
            ino: 9,
            file_block: 0,
            dev_block: 202,
            block_count: 1,
            state: ExtentState::Written,
        };
        state.apply(&record).unwrap();
        let error = state.finish_load().unwrap_err();
        assert!(error.0.contains("mapped twice"), "{error}");
    }

    #[test]
    fn converting_in_place_frees_nothing_and_remapping_frees_the_old_blocks() {
        let mut state = populated();
        state.finish_load().unwrap();
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
        let mut state = populated();
        let before = state.persisted_bytes_estimate();
        state.apply(&Record::InodeSet { ino: 9, attrs: attrs(InodeKind::File, 1, 0) }).unwrap();
        let set = Record::XattrSet { ino: 9, name: b"user.big".to_vec(), value: vec![1; 5000] };
        state.apply(&set).unwrap();
        assert!(state.persisted_bytes_estimate() > before + 5000);
        state.apply(&Record::InodeFree { ino: 9 }).unwrap();
        assert_eq!(state.persisted_bytes_estimate(), before);
        state.apply(&Record::XattrRemove { ino: 3, name: b"user.a".to_vec() }).unwrap();
        state.apply(&Record::InodeFree { ino: 5 }).unwrap();
        let (payload, _) = state.encode_snapshot();
        assert!(payload.len() as u64 <= state.persisted_bytes_estimate());
    }

    #[test]
    fn freed_blocks_wait_for_durability() {
        let mut state = populated();
        state.finish_load().unwrap();
        let displaced =
            state.apply(&Record::ExtentUnmap { ino: 3, file_block: 0, block_count: 4 }).unwrap();
        state.release_displaced(&displaced, 10);
        assert_eq!(state.alloc.free_blocks(), 996);
        assert_eq!(state.pending_free_blocks(), 4);
        state.release_pending_frees(9);
        assert_eq!(state.alloc.free_blocks(), 996);
        state.release_pending_frees(10);
        assert_eq!(state.alloc.free_blocks(), 1000);
    }

    #[test]
    fn pending_frees_leave_in_lsn_order_and_keep_their_count() {
        let run = |start, count| BlockRun { start, count };
        let mut pending = PendingFrees::default();
        pending.push(12, run(100, 3));
        pending.push(10, run(200, 1));
        pending.push(12, run(300, 2));
        pending.push(15, run(400, 4));
        assert_eq!(pending.blocks, 10);
        assert!(pending.take_through(9).is_empty());
        assert_eq!(pending.take_through(10), vec![run(200, 1)]);
        assert_eq!(pending.take_through(14), vec![run(100, 3), run(300, 2)]);
        assert_eq!(pending.blocks, 4);
        assert_eq!(pending.take_through(u64::MAX), vec![run(400, 4)]);
        assert_eq!(pending.blocks, 0);
        assert!(pending.by_lsn.is_empty());
    }

    /// With discard, durable frees stay out of the allocator (and counted
    /// as pending) until their discard is done: nothing can be allocated
    /// on blocks a discard in flight may still wipe.
    #[test]
    fn discarded_blocks_wait_for_their_discard() {
        let mut state = populated();
        state.finish_load().unwrap();
        state.discard_freed = true;
        let displaced =
            state.apply(&Record::ExtentUnmap { ino: 3, file_block: 0, block_count: 4 }).unwrap();
        state.release_displaced(&displaced, 10);
        assert!(state.take_durable_frees(9).is_empty(), "not durable yet");
        state.release_pending_frees(10);
        assert_eq!(state.alloc.free_blocks(), 996, "release leaves them to the discard");
        let runs = state.take_durable_frees(10);
        assert_eq!(runs.iter().map(|run| run.count).sum::<u64>(), 4);
        assert_eq!(state.alloc.free_blocks(), 996, "not reusable while discarding");
        assert_eq!(state.pending_free_blocks(), 4, "still counted as freed space");
        state.finish_discards(&runs);
        assert_eq!(state.alloc.free_blocks(), 1000);
        assert_eq!(state.pending_free_blocks(), 0);
    }
}
