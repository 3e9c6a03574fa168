//! Attributes as callers see them.

use crate::format::{InodeKind, Timestamp};
use crate::meta::Inode;

/// A node's attributes, as stat(2) returns them (the inode-level form of [`Metadata`](super::Metadata)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// File, directory, symlink or special file.
    pub kind: InodeKind,
    /// Permission bits (07777).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links.
    pub nlink: u32,
    /// Size in bytes.
    pub size: u64,
    /// Allocated space in 512-byte units, as st_blocks.
    pub blocks_512: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last change of the contents.
    pub mtime: Timestamp,
    /// Last change of the attributes or contents.
    pub ctime: Timestamp,
    /// Preferred I/O size (st_blksize): the volume's block size.
    pub block_bytes: u32,
    /// A device node's number (st_rdev); 0 for other kinds.
    pub rdev: u32,
}

impl Attr {
    pub(crate) fn of(ino: u64, inode: &Inode, block_bytes: u32) -> Self {
        let allocated_blocks: u64 = inode
            .extents()
            .map_or(0, |extents| extents.iter().map(|extent| extent.block_count).sum());
        let attrs = &inode.attrs;
        Attr {
            ino,
            kind: attrs.kind,
            mode: attrs.mode,
            uid: attrs.uid,
            gid: attrs.gid,
            nlink: attrs.nlink,
            size: inode.size,
            blocks_512: allocated_blocks * u64::from(block_bytes) / 512,
            atime: attrs.atime,
            mtime: attrs.mtime,
            ctime: attrs.ctime,
            block_bytes,
            rdev: inode.rdev(),
        }
    }
}

/// A time to set: now, or a given instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    /// The current time.
    Now,
    /// This instant.
    At(Timestamp),
}

impl TimeSet {
    pub(crate) fn resolve(self, now: Timestamp) -> Timestamp {
        match self {
            TimeSet::Now => now,
            TimeSet::At(at) => at,
        }
    }
}

/// Fields to change in `setattr`; `None` leaves a field alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (07777).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size: truncates or extends a regular file.
    pub size: Option<u64>,
    /// Access time.
    pub atime: Option<TimeSet>,
    /// Modification time.
    pub mtime: Option<TimeSet>,
    /// The change time to record instead of now: a FUSE kernel that caches
    /// writes (writeback_cache) keeps the times itself and sends them.
    pub ctime: Option<Timestamp>,
}

/// Who creates a node: owner of the new inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl Owner {
    /// The effective user and group of this process.
    pub fn current() -> Self {
        let (uid, gid) = crate::dev::effective_ids();
        Self { uid, gid }
    }
}

/// One entry of a directory: a name and the node it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The name, as bytes (any but "/" and NUL).
    pub name: Vec<u8>,
    /// Inode number of the node it names.
    pub ino: u64,
    /// Kind of the node it names.
    pub kind: InodeKind,
}

/// Metadata bytes one more small file takes, about: what
/// [`StatFs::free_inodes_estimate`] divides the free metadata room by.
const INODE_METADATA_BYTES_ESTIMATE: u64 = 256;

/// Volume-wide figures, as statfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Block size (f_bsize).
    pub block_bytes: u32,
    /// Blocks of the data region (f_blocks).
    pub data_blocks: u64,
    /// Blocks a new write can use: free minus delalloc reservations.
    pub available_blocks: u64,
    /// Data blocks not in use.
    pub free_blocks: u64,
    /// Inodes in use.
    pub inodes: u64,
    /// Longest name (f_namemax).
    pub name_bytes_max: u32,
    /// Metadata bytes used and the checkpoint slot's capacity.
    pub metadata_bytes: u64,
    /// Capacity of a checkpoint slot, which all metadata must fit.
    pub metadata_bytes_max: u64,
    /// Data blocks that more than one file block maps (clones), each
    /// counted once in the used blocks.
    pub shared_blocks: u64,
}

impl StatFs {
    /// How many more inodes fit, about: inodes have no table here, so the
    /// figure is the checkpoint's free metadata room over what one small
    /// file's records take (statfs's f_ffree). A metadata index (format 3)
    /// takes its room from free space, so there it is what free space
    /// holds, as XFS counts its dynamically allocated inodes.
    pub fn free_inodes_estimate(&self) -> u64 {
        let room = match self.metadata_bytes_max {
            u64::MAX => self.available_blocks.saturating_mul(u64::from(self.block_bytes)),
            max => max.saturating_sub(self.metadata_bytes),
        };
        room / INODE_METADATA_BYTES_ESTIMATE
    }
}
