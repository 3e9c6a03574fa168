//! Path-based calls in `std::fs`'s shape, over the inode-level namespace
//! calls. Paths start at the volume's root ("/a/b" and "a/b" are the same
//! file); symlinks are followed where `std::fs` follows them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::{InodeKind, ROOT_INO};

use super::attr::{DirEntry, Owner, SetAttr};
use super::file::OpenFlags;
use super::metadata::{FileType, Metadata, Permissions};
use super::namespace::RenameFlags;
use super::open_options::DEFAULT_UMASK;
use super::volume::Volume;

/// Symlinks one path resolution follows at most before ELOOP, as Linux.
const SYMLINKS_FOLLOWED_MAX: u32 = 40;

impl Volume {
    /// The inode `path` names; symlinks on the way are followed, the last
    /// component's only if `follow_last`.
    pub(super) fn walk(&self, path: &Path, follow_last: bool) -> Result<u64> {
        let mut links_left = SYMLINKS_FOLLOWED_MAX;
        self.walk_from(ROOT_INO, path.as_os_str().as_bytes(), follow_last, &mut links_left).map_err(
            |error| match error {
                Error::NotFound(_) => Error::NotFound(path.display().to_string()),
                Error::NotDir(_) => Error::NotDir(path.display().to_string()),
                Error::Loop(_) => Error::Loop(path.display().to_string()),
                other => other,
            },
        )
    }

    fn walk_from(
        &self,
        start: u64,
        path: &[u8],
        follow_last: bool,
        links_left: &mut u32,
    ) -> Result<u64> {
        debug_assert!(*links_left <= SYMLINKS_FOLLOWED_MAX, "{links_left} symlinks left to follow");
        let mut dir = if path.starts_with(b"/") { ROOT_INO } else { start };
        let components: Vec<&[u8]> = path
            .split(|byte| *byte == b'/')
            .filter(|component| !component.is_empty() && *component != b".")
            .collect();
        for (index, component) in components.iter().enumerate() {
            let last = index + 1 == components.len();
            if *component == b".." {
                dir = self.inodes().parent_of(dir)?;
                continue;
            }
            let attr = self.inodes().lookup(dir, component)?;
            let ino = if attr.kind == InodeKind::Symlink && (follow_last || !last) {
                *links_left = links_left
                    .checked_sub(1)
                    .ok_or_else(|| Error::Loop(String::from_utf8_lossy(component).into()))?;
                let target = self.inodes().readlink(attr.ino)?;
                self.walk_from(dir, &target, true, links_left)?
            } else {
                attr.ino
            };
            if last {
                return Ok(ino);
            }
            dir = ino;
        }
        Ok(dir)
    }

    /// The directory that holds `path`'s last component (symlinks followed
    /// on the way), and that component.
    pub(super) fn parent_and_name<'path>(&self, path: &'path Path) -> Result<(u64, &'path [u8])> {
        let name = path
            .file_name()
            .ok_or_else(|| Error::invalid(format!("{} names no file", path.display())))?;
        // A normal component: never empty, ".", ".." or with a '/'.
        debug_assert!(
            !name.is_empty() && name != "." && name != ".." && !name.as_bytes().contains(&b'/'),
            "{} ends in {name:?}",
            path.display()
        );
        let parent = match path.parent() {
            Some(parent) => self.walk(parent, true)?,
            None => ROOT_INO,
        };
        Ok((parent, name.as_bytes()))
    }

    /// The attributes of the node at `path`, following symlinks, as
    /// `std::fs::metadata`.
    pub fn metadata(&self, path: impl AsRef<Path>) -> Result<Metadata> {
        Ok(self.inodes().getattr(self.walk(path.as_ref(), true)?)?.into())
    }

    /// As [`Volume::metadata`], but a symlink at the end is described
    /// itself, as `std::fs::symlink_metadata`.
    pub fn symlink_metadata(&self, path: impl AsRef<Path>) -> Result<Metadata> {
        Ok(self.inodes().getattr(self.walk(path.as_ref(), false)?)?.into())
    }

    /// Whether `path` names something (following symlinks); errors other
    /// than "not found" are errors.
    pub fn try_exists(&self, path: impl AsRef<Path>) -> Result<bool> {
        match self.walk(path.as_ref(), true) {
            Ok(_) => Ok(true),
            Err(Error::NotFound(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Creates a directory (mode 0777 less the umask 022 or the parent's
    /// default ACL), as `std::fs::create_dir`.
    pub fn create_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        let (parent, name) = self.parent_and_name(path.as_ref())?;
        self.mkdir_in(parent, name).map(drop)
    }

    fn mkdir_in(&self, parent: u64, name: &[u8]) -> Result<u64> {
        let mode = self.inodes().creation_mode(parent, 0o777, DEFAULT_UMASK);
        Ok(self.inodes().mkdir(parent, name, mode, Owner::current())?.ino)
    }

    /// Creates a directory and every missing parent, as
    /// `std::fs::create_dir_all`: no error when it exists already.
    pub fn create_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let mut dir = ROOT_INO;
        for component in path.as_os_str().as_bytes().split(|byte| *byte == b'/') {
            if component.is_empty() || component == b"." {
                continue;
            }
            if component == b".." {
                dir = self.inodes().parent_of(dir)?;
                continue;
            }
            dir = match self.inodes().lookup(dir, component) {
                Ok(_) => {
                    self.walk_from(dir, component, true, &mut SYMLINKS_FOLLOWED_MAX.clone())?
                }
                Err(Error::NotFound(_)) => match self.mkdir_in(dir, component) {
                    // Made meanwhile by someone else: fine, as std.
                    Err(Error::Exists(_)) => self.inodes().lookup(dir, component)?.ino,
                    other => other?,
                },
                Err(error) => return Err(error),
            };
            if self.inodes().getattr(dir)?.kind != InodeKind::Dir {
                return Err(Error::NotDir(path.display().to_string()));
            }
        }
        Ok(())
    }

    /// The entries of the directory at `path` (without "." and ".."), as
    /// `std::fs::read_dir`.
    pub fn read_dir(&self, path: impl AsRef<Path>) -> Result<ReadDir> {
        let entries = self.inodes().readdir(self.walk(path.as_ref(), true)?)?;
        Ok(ReadDir { entries: entries.into_iter() })
    }

    /// Renames `from` to `to`, replacing a file (or empty directory) there,
    /// as `std::fs::rename`.
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        let (from_parent, from_name) = self.parent_and_name(from.as_ref())?;
        let (to_parent, to_name) = self.parent_and_name(to.as_ref())?;
        self.inodes().rename(from_parent, from_name, to_parent, to_name, RenameFlags::default())
    }

    /// Removes a file (or a symlink, not what it points to), as
    /// `std::fs::remove_file`.
    pub fn remove_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let (parent, name) = self.parent_and_name(path.as_ref())?;
        self.inodes().unlink(parent, name)
    }

    /// Removes an empty directory, as `std::fs::remove_dir`.
    pub fn remove_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        let (parent, name) = self.parent_and_name(path.as_ref())?;
        self.inodes().rmdir(parent, name)
    }

    /// Removes a directory and everything in it, as
    /// `std::fs::remove_dir_all` (a symlink is removed, not followed).
    pub fn remove_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let (parent, name) = self.parent_and_name(path)?;
        let attr = self.inodes().lookup(parent, name)?;
        if attr.kind != InodeKind::Dir {
            return Err(Error::NotDir(path.display().to_string()));
        }
        self.empty_tree(attr.ino)?;
        self.inodes().rmdir(parent, name)
    }

    fn empty_tree(&self, dir: u64) -> Result<()> {
        for entry in self.inodes().readdir(dir)? {
            if entry.kind == InodeKind::Dir {
                self.empty_tree(entry.ino)?;
                self.inodes().rmdir(dir, &entry.name)?;
            } else {
                self.inodes().unlink(dir, &entry.name)?;
            }
        }
        Ok(())
    }

    /// Makes `link` a new name of the file at `original` (a symlink there is
    /// linked itself, as linkat(2) without AT_SYMLINK_FOLLOW), as
    /// `std::fs::hard_link`.
    pub fn hard_link(&self, original: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        let ino = self.walk(original.as_ref(), false)?;
        let (parent, name) = self.parent_and_name(link.as_ref())?;
        self.inodes().link(ino, parent, name).map(drop)
    }

    /// Makes `link` a symlink to `original` (stored as given; a relative
    /// target resolves from the link's directory), as
    /// `std::os::unix::fs::symlink`.
    pub fn symlink(&self, original: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        let (parent, name) = self.parent_and_name(link.as_ref())?;
        let target = original.as_ref().as_os_str().as_bytes();
        self.inodes().symlink(parent, name, target, Owner::current()).map(drop)
    }

    /// The target of the symlink at `path`, as `std::fs::read_link`.
    pub fn read_link(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        let target = self.inodes().readlink(self.walk(path.as_ref(), false)?)?;
        Ok(PathBuf::from(OsStr::from_bytes(&target)))
    }

    /// Sets the permission bits of the node at `path` (following symlinks),
    /// as `std::fs::set_permissions`.
    pub fn set_permissions(&self, path: impl AsRef<Path>, permissions: Permissions) -> Result<()> {
        let ino = self.walk(path.as_ref(), true)?;
        let changes = SetAttr { mode: Some(permissions.mode()), ..SetAttr::default() };
        self.inodes().setattr(ino, &changes).map(drop)
    }

    /// The whole contents of the file at `path`, as `std::fs::read`.
    pub fn read(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let file = self.inodes().open_file(self.walk(path.as_ref(), true)?, OpenFlags::READ)?;
        let mut contents = vec![0; usize::try_from(file.attr()?.size).unwrap_or(usize::MAX)];
        let mut filled = 0;
        while filled < contents.len() {
            match file.read_at(&mut contents[filled..], filled as u64)? {
                0 => break, // Truncated meanwhile.
                read => filled += read,
            }
        }
        debug_assert!(filled <= contents.len(), "read {filled} bytes into {}", contents.len());
        contents.truncate(filled);
        file.close()?;
        Ok(contents)
    }

    /// Makes the file at `path` hold exactly `contents`, creating it if
    /// needed, as `std::fs::write`. Not durable until synced
    /// ([`File::sync_all`](super::File::sync_all), [`Volume::sync`]).
    pub fn write(&self, path: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> Result<()> {
        let file =
            super::OpenOptions::new().write(true).create(true).truncate(true).open(self, path)?;
        file.write_all_at(contents.as_ref(), 0)?;
        file.close()
    }
}

/// The entries of a directory, from [`Volume::read_dir`]: an iterator of
/// [`DirEntry`] (taken when the call was made).
#[derive(Debug)]
pub struct ReadDir {
    entries: std::vec::IntoIter<DirEntry>,
}

impl Iterator for ReadDir {
    type Item = Result<DirEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        self.entries.next().map(Ok)
    }
}

impl DirEntry {
    /// The entry's name, as `std::fs::DirEntry::file_name`.
    pub fn file_name(&self) -> &OsStr {
        OsStr::from_bytes(&self.name)
    }

    /// The kind of node it names (symlinks are not followed).
    pub fn file_type(&self) -> FileType {
        self.kind.into()
    }
}
