//! Unnamed files (O_TMPFILE): a regular file made in a directory with no
//! link, open from birth. It lives while a handle is open and is freed
//! with the last one, as a file unlinked while open; one the volume still
//! holds at a crash is an orphan the next mount frees. Unless it was made
//! exclusive, `link` may give it a name (linkat with AT_EMPTY_PATH), which
//! makes it an ordinary file.

use crate::error::{Error, Result};
use crate::format::{InodeKind, Timestamp};

use super::attr::Owner;
use super::file::{File, OpenFlags};
use super::inodes::Inodes;
use super::namespace::{apply_new_inode, NewInode};

impl Inodes<'_> {
    /// Creates a regular file with no name in directory `parent` (whose
    /// default ACL and set-group-ID bit it inherits, as a named file) and
    /// opens it with `flags`. `linkable`: whether `link` may name it later
    /// (O_TMPFILE without O_EXCL).
    pub fn create_unnamed(
        &self,
        parent: u64,
        mode: u32,
        owner: Owner,
        flags: OpenFlags,
        linkable: bool,
    ) -> Result<File> {
        let _writing = self.volume.shared.write_gate.start_write();
        if !flags.write {
            // As open(2): O_TMPFILE needs O_WRONLY or O_RDWR.
            return Err(Error::invalid("an unnamed file must be opened for writing"));
        }
        let ino = self.volume.shared.meta.take_ino(false);
        let (ino, _) = self.volume.shared.meta.transact(&[parent, ino], |txn| {
            let state = txn.state();
            let dir = state
                .inode(parent)
                .ok_or_else(|| Error::NotFound(format!("directory inode {parent}")))?;
            if dir.entries().is_none() {
                return Err(Error::NotDir(format!("inode {parent}")));
            }
            if dir.attrs.nlink == 0 {
                return Err(Error::NotFound(format!("directory {parent} was removed")));
            }
            if state.inode(ino).is_some() {
                return Err(Error::NoSpace("no inode numbers left".into()));
            }
            let kind = InodeKind::File;
            let new = NewInode { ino, kind, mode, owner, nlink: 0, size: 0, now: Timestamp::now() };
            apply_new_inode(txn, parent, new, 200)?;
            if let Some(inode) = txn.state_mut().inode_mut(ino) {
                inode.linkable = linkable;
            }
            Ok(ino)
        })?;
        // Nothing frees it before this open: only closing one of its handles
        // or mounting frees an inode with no links, and it has no handles.
        self.open_file(ino, flags).inspect_err(|_| {
            let _ = self.volume.shared.free_orphan(ino);
        })
    }
}
