//! One inode in memory: its attributes, its body (extent map, directory
//! entries, symlink target or device number), extended attributes and the
//! memory-only fields of the running volume.
//!
//! Memory: an inode costs about 220 B, a directory entry about 80 B plus its
//! name, an extent about 64 B (BTreeMap node share included), an extended
//! attribute about 100 B plus its name and value. A million files of one
//! extent each need roughly 370 MB. An inode that an open handle reads
//! adds 24 B for its view generation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::extent::ExtentMap;
use crate::format::{InodeAttrs, InodeKind};

/// Extended attributes of one inode: name (with its namespace prefix) -> value.
pub type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

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
    /// Counts changes of this inode for the lock-free copies open handles
    /// keep (`super::view`); made when a handle first asks for one, and
    /// bumped by every change made under its shard's write lock after that.
    pub view_generation: Option<Arc<AtomicU64>>,
}

impl Inode {
    /// A new inode of `attrs.kind` with an empty body.
    pub(super) fn new(attrs: InodeAttrs) -> Self {
        let body = match attrs.kind {
            InodeKind::File => InodeBody::File(ExtentMap::new()),
            InodeKind::Dir => InodeBody::Dir(BTreeMap::new()),
            InodeKind::Symlink => InodeBody::Symlink(Vec::new()),
            InodeKind::Fifo
            | InodeKind::Socket
            | InodeKind::CharDevice
            | InodeKind::BlockDevice => InodeBody::Special { rdev: 0 },
        };
        Self {
            attrs,
            size: attrs.size,
            body,
            xattrs: Xattrs::new(),
            open_handles: 0,
            meta_lsn: 0,
            data_lsn: 0,
            times_dirty: false,
            linkable: false,
            flags: 0,
            view_generation: None,
        }
    }

    /// Tells the handles' copies that this inode changed.
    pub(super) fn note_changed(&self) {
        if let Some(generation) = &self.view_generation {
            generation.fetch_add(1, Ordering::AcqRel);
        }
    }

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
