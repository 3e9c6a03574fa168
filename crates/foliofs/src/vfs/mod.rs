//! The public API: volumes, the namespace, and open files.
//!
//! `vfs` is the only layer that knows names, handles and POSIX rules. It
//! validates, then changes metadata through `MetaStore::transact` and data
//! through the data path; it never touches the device itself.

mod access;
mod acl;
mod atime;
mod attr;
mod clone;
#[cfg(test)]
mod coherence_tests;
#[cfg(test)]
mod committer_tests;
#[cfg(test)]
mod concurrency_tests;
mod convert;
mod dir;
mod file;
mod flags;
mod freeze;
mod inodes;
mod metadata;
mod namespace;
mod observe;
mod open_options;
mod paths;
mod setattr;
mod shutdown;
mod special;
mod tmpfile;
mod trim;
#[cfg(test)]
mod undeclared_shard_tests;
mod volume;
#[cfg(test)]
mod writeback_tests;
mod xattr;

pub use access::{Access, Credentials};
// For fsck's check of stored ACLs.
pub(crate) use acl::is_valid_acl;
pub use attr::{Attr, DirEntry, Owner, SetAttr, StatFs, TimeSet};
pub use dir::Dir;
pub use file::{File, OpenFlags};
pub use freeze::Frozen;
pub use inodes::Inodes;
pub use metadata::{FileType, Metadata, Permissions};
pub use namespace::RenameFlags;
pub use observe::{ChangeEvent, ChangeObserver, NamespaceEvent, NamespaceObserver};
pub use open_options::OpenOptions;
pub use paths::ReadDir;
pub use shutdown::ShutdownMode;
pub use volume::{CacheStats, CheckpointStats, FiemapExtent, LockWaits, MkfsOptions, Volume};
pub use xattr::{Privilege, XattrFlags};
