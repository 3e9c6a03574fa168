//! Attributes as callers see them.

use crate::format::{InodeKind, Timestamp};
use crate::meta::Inode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: InodeKind,
    /// Permission bits (07777).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    /// Allocated space in 512-byte units, as st_blocks.
    pub blocks_512: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
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
    Now,
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
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The change time to record instead of now: a FUSE kernel that caches
    /// writes (writeback_cache) keeps the times itself and sends them.
    pub ctime: Option<Timestamp>,
}

/// Who creates a node: owner of the new inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// The effective user and group of this process.
    pub fn current() -> Self {
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Self { uid, gid }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: InodeKind,
}

/// Volume-wide figures, as statfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_bytes: u32,
    pub data_blocks: u64,
    /// Blocks a new write can use: free minus delalloc reservations.
    pub available_blocks: u64,
    pub free_blocks: u64,
    pub inodes: u64,
    pub name_bytes_max: u32,
    /// Metadata bytes used and the checkpoint slot's capacity.
    pub metadata_bytes: u64,
    pub metadata_bytes_max: u64,
}
