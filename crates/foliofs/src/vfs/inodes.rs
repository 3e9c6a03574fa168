//! The inode-level calls, for front ends that speak in inode numbers as
//! the kernel does (the FUSE adapter above all): `volume.inodes().lookup(
//! parent, name)`, `getattr`, `setattr`, `mknod`, `rename` with its flags,
//! the extended attributes, ... Each applies the same POSIX rules as the
//! path calls on [`Volume`], which spell their names as `std::fs` does and
//! are what an embedder uses.

use crate::error::{Error, Result};
use crate::iomap::{self, Intent, MapKind};

use super::volume::{FiemapExtent, Volume};

/// The inode-level view of a volume ([`Volume::inodes`]).
#[derive(Clone, Copy)]
pub struct Inodes<'volume> {
    pub(super) volume: &'volume Volume,
}

impl Volume {
    /// The inode-level calls (`Inodes`), for the workspace's front ends;
    /// the root directory is inode `ROOT_INO`.
    pub fn inodes(&self) -> Inodes<'_> {
        Inodes { volume: self }
    }
}

impl std::fmt::Debug for Inodes<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Inodes").finish_non_exhaustive()
    }
}

impl Inodes<'_> {
    /// The folios cached for `ino`, as `(file offset, bytes)` in order (for
    /// the workspace's tests).
    #[cfg(feature = "internals")]
    pub fn cached_folios(&self, ino: u64) -> Vec<(u64, usize)> {
        let Some(inode) = self.volume.shared.cache.existing_inode(ino) else { return Vec::new() };
        inode.folios_in(0, u64::MAX).iter().map(|folio| (folio.pos(), folio.bytes())).collect()
    }

    /// The extents of a file, like FIEMAP: file offset, device offset, length
    /// and state, holes omitted.
    pub fn fiemap(&self, ino: u64) -> Result<Vec<FiemapExtent>> {
        self.volume.shared.check_running()?;
        let block_bytes = self.volume.shared.block_bytes;
        let end_block = {
            let inode = self.volume.shared.existing_inode(ino)?;
            let extents =
                inode.extents().ok_or_else(|| Error::invalid("fiemap of a non-regular file"))?;
            extents.end_block()
        };
        let mut out = Vec::new();
        let walk = iomap::walk(
            &self.volume.shared.meta,
            ino,
            0,
            end_block * block_bytes,
            Intent::Report,
            block_bytes,
        );
        for range in walk {
            let mapping = range?.mapping;
            if mapping.kind != MapKind::Hole {
                out.push(FiemapExtent {
                    logical: mapping.offset,
                    physical: mapping.dev_offset,
                    length: mapping.length,
                    kind: mapping.kind,
                    last: false,
                });
            }
        }
        if let Some(last) = out.last_mut() {
            last.last = true;
        }
        Ok(out)
    }
}
