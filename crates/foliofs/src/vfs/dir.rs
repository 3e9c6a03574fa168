//! Open directories. An open directory keeps its inode: removed or replaced
//! by a rename meanwhile, it answers `attr` with nlink 0 and lists nothing,
//! as on ext4, instead of vanishing under its handle.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::InodeKind;

use super::attr::{Attr, DirEntry};
use super::inodes::Inodes;
use super::volume::VolumeCore;

/// An open directory. Closing (or dropping) the last handle of a removed
/// directory frees it.
pub struct Dir {
    shared: Arc<VolumeCore>,
    ino: u64,
    released: bool,
}

impl Inodes<'_> {
    /// Opens directory `ino` for listing (opendir).
    pub fn open_dir(&self, ino: u64) -> Result<Dir> {
        self.volume.shared.check_running()?;
        {
            let mut inode = self.volume.shared.existing_inode_mut(ino)?;
            if inode.attrs.kind != InodeKind::Dir {
                return Err(Error::NotDir(format!("inode {ino}")));
            }
            inode.open_handles += 1;
        }
        Ok(Dir { shared: Arc::clone(&self.volume.shared), ino, released: false })
    }
}

impl Dir {
    /// The directory's inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The directory's attributes.
    pub fn attr(&self) -> Result<Attr> {
        self.shared.attr_of(&self.shared.meta.view(&[self.ino]), self.ino)
    }

    /// The entries now, sorted by name ("." and ".." not included).
    pub fn entries(&self) -> Result<Vec<DirEntry>> {
        let entries = super::namespace::list(&self.shared.meta, self.ino)?;
        self.shared.accessed(self.ino);
        Ok(entries)
    }

    /// The directory holding this one when it was last named (a removed
    /// directory keeps its last parent, for "..").
    pub fn parent(&self) -> Result<u64> {
        let inode = self
            .shared
            .meta
            .inode(self.ino)
            .ok_or_else(|| Error::NotFound(format!("inode {}", self.ino)))?;
        Ok(inode.attrs.parent)
    }

    /// Closes the handle, reporting an error freeing a removed directory.
    pub fn close(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.released, true) {
            return Ok(());
        }
        let ino = self.ino;
        let orphaned = self.shared.close_handle(ino);
        if !orphaned || self.shared.meta.refusal().is_some() {
            // A read-only volume frees orphans at its next writable mount.
            return Ok(());
        }
        self.shared.free_orphan(ino)?;
        Ok(())
    }
}

impl std::fmt::Debug for Dir {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Dir").field("ino", &self.ino).finish()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if let Err(error) = self.release() {
            tracing::error!("closing directory {}: {error}", self.ino);
        }
    }
}
