//! [`OpenOptions`]: how to open a file, as `std::fs::OpenOptions`, and the
//! open(2) decisions behind it (create, create exclusively, truncate), made
//! here for every front end.

use std::path::Path;

use crate::error::{Error, Result};

use super::attr::{Attr, Owner, SetAttr};
use super::file::{File, OpenFlags};
use super::inodes::Inodes;
use super::volume::Volume;

/// Options to open a file with, as `std::fs::OpenOptions` (plus O_DIRECT
/// and O_DSYNC): build them, then [`OpenOptions::open`] a path.
///
/// ```
/// # fn main() -> foliofs::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let image = dir.path().join("vol.img");
/// # foliofs::Volume::mkfs_path(&image, Some(64 << 20), &Default::default(), &Default::default())?;
/// # let volume = foliofs::Volume::open(&image, &Default::default())?;
/// use foliofs::OpenOptions;
///
/// let log = OpenOptions::new().append(true).create(true).open(&volume, "/log.txt")?;
/// log.write_at(b"started\n", 0)?; // appends, wherever `pos` points
/// let again = OpenOptions::new().write(true).create_new(true).open(&volume, "/log.txt");
/// assert_eq!(again.unwrap_err().errno(), libc::EEXIST);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    direct: bool,
    dsync: bool,
    mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// Nothing set; a new file would get mode 0666 (less the umask 022).
    pub fn new() -> Self {
        Self {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            direct: false,
            dsync: false,
            mode: 0o666,
        }
    }

    /// The options of open(2)'s `flags`: the access mode, O_APPEND,
    /// O_TRUNC, O_CREAT, O_EXCL, O_DIRECT, and O_DSYNC or O_SYNC. Other
    /// flags are the caller's business (the kernel handles them).
    pub fn from_posix_flags(flags: i32) -> Self {
        let access = flags & libc::O_ACCMODE;
        Self {
            read: access == libc::O_RDONLY || access == libc::O_RDWR,
            write: access == libc::O_WRONLY || access == libc::O_RDWR,
            append: flags & libc::O_APPEND != 0,
            truncate: flags & libc::O_TRUNC != 0,
            create: flags & libc::O_CREAT != 0,
            create_new: flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0,
            direct: flags & libc::O_DIRECT != 0,
            // O_SYNC includes O_DSYNC's bit.
            dsync: flags & libc::O_DSYNC != 0,
            mode: 0o666,
        }
    }

    /// Open for reading.
    pub fn read(&mut self, read: bool) -> &mut Self {
        self.read = read;
        self
    }

    /// Open for writing.
    pub fn write(&mut self, write: bool) -> &mut Self {
        self.write = write;
        self
    }

    /// Every write goes to the end of file (implies writing).
    pub fn append(&mut self, append: bool) -> &mut Self {
        self.append = append;
        self
    }

    /// Truncate to zero on open (needs writing).
    pub fn truncate(&mut self, truncate: bool) -> &mut Self {
        self.truncate = truncate;
        self
    }

    /// Create the file if it does not exist (needs writing).
    pub fn create(&mut self, create: bool) -> &mut Self {
        self.create = create;
        self
    }

    /// Create the file, failing with EEXIST if it exists (O_CREAT|O_EXCL);
    /// `create` and `truncate` are then ignored.
    pub fn create_new(&mut self, create_new: bool) -> &mut Self {
        self.create_new = create_new;
        self
    }

    /// O_DIRECT: data moves between the caller's buffers and the device,
    /// aligned to the device's logical block; enables the asynchronous calls
    /// ([`File::read_at_async`], [`File::write_at_async`]).
    pub fn direct(&mut self, direct: bool) -> &mut Self {
        self.direct = direct;
        self
    }

    /// O_DSYNC: a write is durable when it returns.
    pub fn dsync(&mut self, dsync: bool) -> &mut Self {
        self.dsync = dsync;
        self
    }

    /// Permission bits of a file this open creates (default 0666; the umask
    /// 022 or the directory's default ACL applies on top).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode & 0o7777;
        self
    }

    /// Opens the file at `path` (from the root; symlinks are followed) with
    /// these options, creating it as they say, owned by this process's
    /// effective user and group.
    pub fn open(&self, volume: &Volume, path: impl AsRef<Path>) -> Result<File> {
        volume.open_with(path.as_ref(), self)
    }

    /// Whether the options ask to create the file when it is missing.
    pub fn creates(&self) -> bool {
        self.create || self.create_new
    }

    /// The flags of the handle these options open.
    pub fn flags(&self) -> Result<OpenFlags> {
        let write = self.write || self.append;
        if !write && (self.truncate && !self.create_new || self.creates()) {
            return Err(Error::invalid(
                "creating or truncating a file needs write or append access",
            ));
        }
        if !self.read && !write {
            return Err(Error::invalid("opening a file needs read, write or append access"));
        }
        Ok(OpenFlags {
            read: self.read,
            write,
            truncate: self.truncate && !self.create_new,
            append: self.append,
            direct: self.direct,
            dsync: self.dsync,
            drop_behind: false,
        })
    }
}

impl Inodes<'_> {
    /// open(2) of `name` in directory `parent`, as far as the namespace goes:
    /// with `create_new`, creates it or fails with EEXIST; with `create`,
    /// creates it or finds the one another opener made meanwhile; otherwise
    /// looks it up. `truncate` empties an existing file. `mode` is final
    /// (see [`Inodes::creation_mode`] for the umask and default ACLs).
    /// Returns the file's attributes; open a handle with
    /// [`Inodes::open_file`].
    pub fn create_or_open(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        owner: Owner,
        options: &OpenOptions,
    ) -> Result<Attr> {
        if !options.creates() {
            return self.lookup(parent, name);
        }
        match self.create(parent, name, mode, owner) {
            Err(Error::Exists(_)) if !options.create_new => {
                let attr = self.lookup(parent, name)?;
                if options.truncate && attr.size != 0 {
                    self.setattr(attr.ino, &SetAttr { size: Some(0), ..SetAttr::default() })
                } else {
                    Ok(attr)
                }
            }
            other => other,
        }
    }
}

impl Volume {
    fn open_with(&self, path: &Path, options: &OpenOptions) -> Result<File> {
        let flags = options.flags()?;
        if !options.creates() {
            return self.inodes().open_file(self.walk(path, true)?, flags);
        }
        let (parent, name) = self.parent_and_name(path)?;
        let existing = match self.inodes().lookup(parent, name) {
            Ok(attr) => Some(attr),
            Err(Error::NotFound(_)) => None,
            Err(error) => return Err(error),
        };
        let ino = match existing {
            Some(_) if options.create_new => return Err(Error::Exists(path.display().to_string())),
            // An existing name is opened as open(2) does: through symlinks.
            Some(_) => self.walk(path, true)?,
            None => {
                let mode = self.inodes().creation_mode(parent, options.mode, DEFAULT_UMASK);
                self.inodes().create_or_open(parent, name, mode, Owner::current(), options)?.ino
            }
        };
        self.inodes().open_file(ino, flags)
    }
}

/// The umask the path-based calls create with: the usual 022 (a library
/// has no business changing its process's umask to read it).
pub(super) const DEFAULT_UMASK: u32 = 0o022;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_flags_map_to_options() {
        let options = OpenOptions::from_posix_flags(libc::O_RDWR | libc::O_CREAT | libc::O_EXCL);
        assert!(options.read && options.write && options.create_new);
        let options = OpenOptions::from_posix_flags(libc::O_WRONLY | libc::O_TRUNC | libc::O_SYNC);
        assert!(!options.read && options.write && options.truncate && options.dsync);
        assert!(!OpenOptions::from_posix_flags(libc::O_RDONLY).write);
    }

    #[test]
    fn creating_or_truncating_needs_write_access() {
        for options in [
            *OpenOptions::new().read(true).create(true),
            *OpenOptions::new().read(true).truncate(true),
            OpenOptions::new(),
        ] {
            assert_eq!(options.flags().unwrap_err().errno(), libc::EINVAL, "{options:?}");
        }
        assert!(OpenOptions::new().append(true).create(true).flags().unwrap().write);
    }
}
