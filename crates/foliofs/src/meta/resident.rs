//! An inode as the index holds it (format 3): built from its records when
//! an operation first names it (`InodeBuilder`), and whether a clean one
//! may leave memory again after a checkpoint (`evictable`); the store's
//! side of both is in `super::on_demand`.
//!
//! What may leave memory (`evictable`): an inode whose every field the
//! index holds. Memory-only state pins it: open handles and the copies they
//! keep of its metadata (`super::view`), delayed extents (reservations, no
//! record yet), times advanced without a record, a size running ahead of
//! the size on disk, no links (an orphan mount frees) and an O_TMPFILE not
//! yet linked. The root directory stays, as every path starts there.
//! Whether the inode changed since the last cut is the caller's to know
//! (its shard's notes).

use std::sync::Arc;

use crate::extent::{Extent, ExtentKind};
use crate::format::record::{is_valid_name, is_valid_xattr_name};
use crate::format::{Record, Region, ROOT_INO, SYMLINK_BYTES_MAX, XATTR_VALUE_BYTES_MAX};

use super::inode::{Inode, InodeBody};

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

fn corrupt<T>(ino: u64, why: impl std::fmt::Display) -> Result<T, String> {
    Err(format!("inode {ino}: {why}"))
}

impl InodeBuilder {
    /// Starts inode `ino` from its first record, which must set it.
    pub fn start(ino: u64, first: &Record, data_region: Region) -> Result<Self, String> {
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
    pub fn add(&mut self, record: &Record) -> Result<(), String> {
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
pub fn add_entry(dir: u64, inode: &mut Inode, name: &[u8], target: u64) -> Result<(), String> {
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
