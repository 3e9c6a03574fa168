//! Zero-message opens (FUSE no-open): with the kernel's page cache serving
//! the data, the daemon answers OPEN with ENOSYS and the kernel stops
//! sending OPEN and RELEASE altogether; every request then quotes handle 0
//! and carries the opener's flags instead (fuse_read_in and fuse_write_in
//! hold `file->f_flags`, with O_DSYNC added for RWF_DSYNC). This table keeps
//! the engine [`File`]s those requests are served through: one per inode
//! and kind of access, opened at the first request that needs it and closed
//! when the kernel forgets the inode (FORGET of as many lookups as it was
//! handed: counted here), which is also when it holds no open file of it
//! any more. Counting, rather than closing at any FORGET, matters for a
//! FORGET of an inode's earlier life in the kernel that arrives after a
//! new lookup of it.
//!
//! The kernel sends nothing when a file unlinked while open is finally
//! closed, so an unlink or rename that takes a file's last name first puts
//! a file of it here ([`InodeFiles::keep_while_known`]): the volume frees an
//! unlinked inode when its last engine file closes, which is then at the
//! FORGET that follows the kernel's last close. Directories likewise, in
//! every mode: the kernel holds a process's working directory without an
//! open (and, with FUSE no-opendir, open directories too), so an rmdir or
//! a rename over a directory first keeps a [`Dir`] of it here. A removed
//! directory then stats with nlink 0, lists nothing and lets a path walk
//! start from it, as on ext4, until the kernel forgets it, and its number
//! is not reused meanwhile. Outside zero-message opens only directories'
//! lookups are counted.

use std::collections::HashMap;
use std::sync::Arc;

use foliofs::{Dir, File, OpenFlags, Volume};
use parking_lot::Mutex;

/// What a request needs of the file it is served through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    pub(crate) write: bool,
    pub(crate) direct: bool,
    pub(crate) dsync: bool,
}

impl Access {
    /// From a request's open flags; `write` when it changes data.
    /// `page_cache_writeback` (FUSE_WRITE_CACHE) is the kernel writing back
    /// its own pages: buffered whatever the file that dirtied them said.
    pub(crate) fn from_flags(flags: i32, write: bool, page_cache_writeback: bool) -> Self {
        let direct = flags & libc::O_DIRECT != 0 && !page_cache_writeback;
        // O_SYNC includes O_DSYNC's bit.
        let dsync = flags & libc::O_DSYNC != 0 && !page_cache_writeback;
        Self { write, direct, dsync }
    }

    /// Whether a file opened with `flags` serves this access.
    fn served_by(self, flags: OpenFlags) -> bool {
        (flags.write || !self.write) && flags.direct == self.direct && flags.dsync == self.dsync
    }
}

const SHARD_COUNT: usize = 16;

/// What the kernel holds of an inode, as far as the daemon can tell.
#[derive(Default)]
struct Known {
    /// Entries handed to the kernel and not yet forgotten.
    lookups: u64,
    files: Vec<Arc<File>>,
    /// A directory kept open for the kernel (see [`InodeFiles::keep_dir_while_known`]).
    dir: Option<Dir>,
}

type Shard = Mutex<HashMap<u64, Known>>;

pub(crate) struct InodeFiles {
    shards: [Shard; SHARD_COUNT],
}

impl InodeFiles {
    pub(crate) fn new() -> Self {
        Self { shards: std::array::from_fn(|_| Mutex::new(HashMap::new())) }
    }

    fn shard(&self, ino: u64) -> &Shard {
        &self.shards[ino as usize % SHARD_COUNT]
    }

    /// A file of `ino` that serves `access`, opened if none does yet.
    /// Writable files are opened read-write (the kernel reads through any
    /// file of an inode: partial pages, mmap faults); a read-only volume or
    /// file refuses that open, and so the request, as an open would.
    pub(crate) fn file(
        &self,
        volume: &Volume,
        ino: u64,
        access: Access,
        drop_behind: bool,
    ) -> foliofs::Result<Arc<File>> {
        let mut shard = self.shard(ino).lock();
        let files = &mut shard.entry(ino).or_default().files;
        if let Some(file) = files.iter().find(|file| access.served_by(file.flags())) {
            return Ok(Arc::clone(file));
        }
        let mut flags = if access.write { OpenFlags::READ_WRITE } else { OpenFlags::READ };
        flags.direct = access.direct;
        flags.dsync = access.dsync;
        flags.drop_behind = drop_behind && !access.direct;
        let file = Arc::new(volume.inodes().open_file(ino, flags)?);
        files.push(Arc::clone(&file));
        Ok(file)
    }

    /// Any file of `ino` (fsync and lseek need no particular access).
    pub(crate) fn any(
        &self,
        volume: &Volume,
        ino: u64,
        drop_behind: bool,
    ) -> foliofs::Result<Arc<File>> {
        if let Some(file) = self.shard(ino).lock().get(&ino).and_then(|known| known.files.first()) {
            return Ok(Arc::clone(file));
        }
        let read = Access { write: false, direct: false, dsync: false };
        self.file(volume, ino, read, drop_behind)
    }

    /// Keeps `file` until the kernel forgets its inode (a file created or
    /// made unnamed with its first open, which the kernel will not release).
    pub(crate) fn adopt(&self, file: File) {
        let ino = file.ino();
        self.shard(ino).lock().entry(ino).or_default().files.push(Arc::new(file));
    }

    /// Before a change that may take `ino`'s last name: an open file of it,
    /// so the volume keeps it for the kernel's open files until FORGET.
    pub(crate) fn keep_while_known(&self, volume: &Volume, ino: u64) -> foliofs::Result<()> {
        let kept = self.shard(ino).lock().get(&ino).is_some_and(|known| !known.files.is_empty());
        if kept {
            return Ok(());
        }
        self.any(volume, ino, true).map(drop)
    }

    /// Before a change that may remove directory `ino`: an open directory of
    /// it, so the volume keeps it (listing nothing) until FORGET.
    pub(crate) fn keep_dir_while_known(&self, volume: &Volume, ino: u64) -> foliofs::Result<()> {
        let mut shard = self.shard(ino).lock();
        let known = shard.entry(ino).or_default();
        if known.dir.is_none() {
            known.dir = Some(volume.inodes().open_dir(ino)?);
        }
        Ok(())
    }

    /// A reply handed the kernel an entry of `ino` (a lookup, a create, a
    /// readdirplus entry): one more lookup it will forget.
    pub(crate) fn looked_up(&self, ino: u64) {
        self.shard(ino).lock().entry(ino).or_default().lookups += 1;
    }

    /// FORGET of `lookups`: once all are forgotten the kernel dropped the
    /// inode, so no file of it is open there.
    pub(crate) fn forget(&self, ino: u64, lookups: u64) {
        let mut shard = self.shard(ino).lock();
        let Some(known) = shard.get_mut(&ino) else { return };
        known.lookups = known.lookups.saturating_sub(lookups);
        if known.lookups > 0 {
            return;
        }
        let Some(known) = shard.remove(&ino) else { return };
        drop(shard);
        close_all(known.files);
        close_dir(known.dir);
    }

    /// At unmount: whatever the kernel did not forget.
    pub(crate) fn drain(&self) {
        for shard in &self.shards {
            let known: Vec<_> = shard.lock().drain().map(|(_, known)| known).collect();
            for known in known {
                close_all(known.files);
                close_dir(known.dir);
            }
        }
    }
}

/// Closes each file whose last user this was; a request still running on
/// one holds a clone, and its drop closes the file then.
fn close_all(files: Vec<Arc<File>>) {
    for file in files {
        if let Ok(file) = Arc::try_unwrap(file) {
            if let Err(error) = file.close() {
                tracing::warn!("closing a file the kernel forgot: {error}");
            }
        }
    }
}

/// Closes a directory kept for the kernel (freeing it if it was removed).
fn close_dir(dir: Option<Dir>) {
    if let Some(Err(error)) = dir.map(Dir::close) {
        tracing::warn!("closing a directory the kernel forgot: {error}");
    }
}
