//! std-shaped views of attributes: [`Metadata`], [`FileType`] and
//! [`Permissions`], as `std::fs` has them (with the Unix extensions).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::format::{InodeKind, Timestamp};

use super::attr::Attr;

/// A node's attributes, as `std::fs::Metadata`: from [`Volume::metadata`],
/// [`Volume::symlink_metadata`] or [`File::metadata`].
///
/// [`Volume::metadata`]: super::Volume::metadata
/// [`Volume::symlink_metadata`]: super::Volume::symlink_metadata
/// [`File::metadata`]: super::File::metadata
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    attr: Attr,
}

impl Metadata {
    /// The attributes as the inode-level calls return them.
    pub fn attr(&self) -> &Attr {
        &self.attr
    }

    /// What kind of node this is.
    pub fn file_type(&self) -> FileType {
        FileType(self.attr.kind)
    }

    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.attr.kind == InodeKind::File
    }

    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.attr.kind == InodeKind::Dir
    }

    /// A symbolic link (only [`Volume::symlink_metadata`] returns one).
    ///
    /// [`Volume::symlink_metadata`]: super::Volume::symlink_metadata
    pub fn is_symlink(&self) -> bool {
        self.attr.kind == InodeKind::Symlink
    }

    /// Size in bytes (st_size).
    pub fn len(&self) -> u64 {
        self.attr.size
    }

    /// Whether the size is zero.
    pub fn is_empty(&self) -> bool {
        self.attr.size == 0
    }

    /// The permission bits.
    pub fn permissions(&self) -> Permissions {
        Permissions::from_mode(self.attr.mode)
    }

    /// Last modification of the contents (st_mtime).
    pub fn modified(&self) -> SystemTime {
        system_time(self.attr.mtime)
    }

    /// Last access (st_atime).
    pub fn accessed(&self) -> SystemTime {
        system_time(self.attr.atime)
    }

    /// Last change of the attributes or contents (st_ctime).
    pub fn changed(&self) -> SystemTime {
        system_time(self.attr.ctime)
    }

    /// Inode number (st_ino).
    pub fn ino(&self) -> u64 {
        self.attr.ino
    }

    /// Permission bits and file type, as st_mode.
    pub fn mode(&self) -> u32 {
        self.attr.mode | file_type_bits(self.attr.kind)
    }

    /// Number of hard links (st_nlink).
    pub fn nlink(&self) -> u32 {
        self.attr.nlink
    }

    /// Owner (st_uid).
    pub fn uid(&self) -> u32 {
        self.attr.uid
    }

    /// Group (st_gid).
    pub fn gid(&self) -> u32 {
        self.attr.gid
    }

    /// Allocated space in 512-byte units (st_blocks).
    pub fn blocks(&self) -> u64 {
        self.attr.blocks_512
    }

    /// Preferred I/O size (st_blksize): the volume's block size.
    pub fn blksize(&self) -> u32 {
        self.attr.block_bytes
    }
}

impl From<Attr> for Metadata {
    fn from(attr: Attr) -> Self {
        Self { attr }
    }
}

/// The S_IFMT bits of `kind`.
fn file_type_bits(kind: InodeKind) -> u32 {
    match kind {
        InodeKind::File => libc::S_IFREG,
        InodeKind::Dir => libc::S_IFDIR,
        InodeKind::Symlink => libc::S_IFLNK,
        InodeKind::Fifo => libc::S_IFIFO,
        InodeKind::Socket => libc::S_IFSOCK,
        InodeKind::CharDevice => libc::S_IFCHR,
        InodeKind::BlockDevice => libc::S_IFBLK,
    }
}

fn system_time(timestamp: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(timestamp.nanos));
    match u64::try_from(timestamp.secs) {
        Ok(secs) => UNIX_EPOCH + Duration::from_secs(secs) + nanos,
        Err(_) => UNIX_EPOCH - Duration::from_secs(timestamp.secs.unsigned_abs()) + nanos,
    }
}

/// The kind of a node, as `std::fs::FileType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileType(InodeKind);

impl FileType {
    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.0 == InodeKind::File
    }

    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.0 == InodeKind::Dir
    }

    /// A symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.0 == InodeKind::Symlink
    }

    /// The volume's own name for the kind (also FIFOs, sockets, devices).
    pub fn kind(&self) -> InodeKind {
        self.0
    }
}

impl From<InodeKind> for FileType {
    fn from(kind: InodeKind) -> Self {
        Self(kind)
    }
}

/// Permission bits (07777), as `std::fs::Permissions` with `PermissionsExt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permissions {
    mode: u32,
}

impl Permissions {
    /// From mode bits; bits above 07777 are dropped.
    pub fn from_mode(mode: u32) -> Self {
        Self { mode: mode & 0o7777 }
    }

    /// The mode bits.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Whether no one may write (no write bit set).
    pub fn readonly(&self) -> bool {
        self.mode & 0o222 == 0
    }

    /// Clears every write bit, or sets the owner's (as std does on Unix, it
    /// sets all three; here only the owner's, the safe choice).
    pub fn set_readonly(&mut self, readonly: bool) {
        if readonly {
            self.mode &= !0o222;
        } else {
            self.mode |= 0o200;
        }
    }
}
