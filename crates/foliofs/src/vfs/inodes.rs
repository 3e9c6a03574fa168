//! The inode-level calls, for front ends that speak in inode numbers as
//! the kernel does (the FUSE adapter above all): `volume.inodes().lookup(
//! parent, name)`, `getattr`, `setattr`, `mknod`, `rename` with its flags,
//! the extended attributes, ... Each applies the same POSIX rules as the
//! path calls on [`Volume`], which spell their names as `std::fs` does and
//! are what an embedder uses.

use super::volume::Volume;

/// The inode-level view of a volume ([`Volume::inodes`]).
#[derive(Clone, Copy)]
pub struct Inodes<'volume> {
    pub(super) volume: &'volume Volume,
}

impl Volume {
    /// The inode-level calls ([`Inodes`]); the root directory is inode
    /// `ROOT_INO`.
    pub fn inodes(&self) -> Inodes<'_> {
        Inodes { volume: self }
    }
}

impl std::fmt::Debug for Inodes<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Inodes").finish_non_exhaustive()
    }
}
