//! Open files: handles that read and write data through the folio cache
//! (buffered) or the direct path (O_DIRECT), blocking or asynchronously.

use std::io::{self, SeekFrom};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::freeze::Writing;
use crate::buffered::{self, Readahead};
use crate::cache::InodeCache;
use crate::dev::AlignedBuf;
use crate::direct::{self, DirectFuture, WriteObserver};
use crate::error::{Error, Result};
use crate::format::record::{INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE};
use crate::format::InodeKind;
use crate::meta::InodeView;
use crate::space::{self, FallocateMode, Whence};
use crate::writeback;

use super::attr::{Attr, SetAttr};
use super::inodes::Inodes;
use super::metadata::{Metadata, Permissions};
use super::observe::ChangeEvent;
use super::volume::VolumeCore;

/// How a file is opened, as [`File::flags`] tells it; the path-based calls
/// take [`OpenOptions`](super::OpenOptions), the inode-level ones
/// (`Inodes::open_file`) these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFlags {
    /// Reads are allowed.
    pub read: bool,
    /// Writes are allowed.
    pub write: bool,
    /// Truncate to zero on open (needs `write`).
    pub truncate: bool,
    /// Every write goes to the current end of file.
    pub append: bool,
    /// O_DIRECT: data moves between the caller's buffer and the device, with
    /// offsets, lengths and buffer addresses aligned to the device's logical
    /// block (EINVAL otherwise).
    pub direct: bool,
    /// O_DSYNC: a write is durable when it returns.
    pub dsync: bool,
    /// Another cache (the kernel's page cache in front of a FUSE mount)
    /// keeps what this handle reads and writes, so the engine does not keep
    /// a second copy (as RWF_DONTCACHE): clean folios a buffered read has
    /// consumed are dropped after it, and the file's folios are dropped
    /// once written back. Dirty data, delayed allocation and large-folio
    /// writeback are unchanged.
    pub drop_behind: bool,
}

impl OpenFlags {
    /// Read only.
    pub const READ: Self = Self {
        read: true,
        write: false,
        truncate: false,
        append: false,
        direct: false,
        dsync: false,
        drop_behind: false,
    };
    /// Write only.
    pub const WRITE: Self = Self { read: false, write: true, ..Self::READ };
    /// Read and write.
    pub const READ_WRITE: Self = Self { read: true, write: true, ..Self::READ };

    /// These flags with O_DIRECT.
    pub fn with_direct(self) -> Self {
        Self { direct: true, ..self }
    }

    /// These flags with O_DSYNC.
    pub fn with_dsync(self) -> Self {
        Self { dsync: true, ..self }
    }

    /// These flags with drop-behind ([`OpenFlags::drop_behind`]).
    pub fn with_drop_behind(self) -> Self {
        Self { drop_behind: true, ..self }
    }
}

/// An open regular file. Closing (or dropping) the last handle of an
/// unlinked file frees it.
pub struct File {
    pub(super) shared: Arc<VolumeCore>,
    pub(super) ino: u64,
    pub(super) inode: Arc<InodeCache>,
    flags: OpenFlags,
    readahead: Readahead,
    /// The size and access-time outlook its reads last saw, for reads that
    /// take no shared lock while nothing changed (`meta::view`).
    view: InodeView,
    /// The file's writeback error sequence as this handle last saw it.
    errors_seen: AtomicU64,
    /// Where `std::io::Read`, `Write` and `Seek` go on (the positional
    /// calls ignore it), as a file description's offset.
    cursor: Mutex<u64>,
    /// Where the last asynchronous direct request on this handle ended: one
    /// that starts there is sequential (`DirectFuture`).
    direct_end: AtomicU64,
    released: bool,
}

impl Inodes<'_> {
    /// Opens regular file `ino` (truncating it with `flags.truncate`).
    pub fn open_file(&self, ino: u64, flags: OpenFlags) -> Result<File> {
        self.volume.shared.check_running()?;
        if flags.write {
            if let Some(refusal) = self.volume.shared.meta.refusal() {
                return Err(refusal);
            }
        }
        if flags.truncate && !flags.write {
            return Err(Error::invalid("O_TRUNC without write access"));
        }
        {
            let mut inode = self.volume.shared.existing_inode_mut(ino)?;
            if flags.write && inode.flags & INODE_FLAG_IMMUTABLE != 0 {
                return Err(Error::NotPermitted(format!("inode {ino} is immutable: writing")));
            }
            if flags.truncate && inode.flags & (INODE_FLAG_IMMUTABLE | INODE_FLAG_APPEND) != 0 {
                return Err(Error::NotPermitted(format!(
                    "inode {ino} is immutable or append-only: truncating"
                )));
            }
            match inode.attrs.kind {
                InodeKind::File => {}
                InodeKind::Dir => return Err(Error::IsDir(format!("inode {ino}"))),
                InodeKind::Symlink => {
                    return Err(Error::invalid(format!("inode {ino} is a symlink")))
                }
                // The kernel opens FIFOs, sockets and devices itself.
                _ => return Err(Error::invalid(format!("inode {ino} is a special file"))),
            }
            inode.open_handles += 1;
        }
        let inode = self.volume.shared.inode_cache(ino);
        debug_assert_eq!(inode.ino, ino, "inode {ino} handed another's cache entry");
        if flags.drop_behind {
            inode.set_drop_behind();
        }
        let file = File {
            shared: Arc::clone(&self.volume.shared),
            ino,
            errors_seen: AtomicU64::new(inode.error_sample()),
            inode,
            flags,
            readahead: Readahead::default(),
            view: InodeView::default(),
            cursor: Mutex::new(0),
            direct_end: AtomicU64::new(u64::MAX),
            released: false,
        };
        if flags.truncate {
            file.set_len(0)?;
        }
        Ok(file)
    }

    /// Opens the regular file at `path` (symlinks not followed); see [`OpenOptions::open`](super::OpenOptions::open) for the std-shaped form.
    pub fn open_path(&self, path: &str, flags: OpenFlags) -> Result<File> {
        let ino = self.resolve(path)?;
        self.open_file(ino, flags)
    }
}

impl File {
    /// The file's inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The flags the file was opened with.
    pub fn flags(&self) -> OpenFlags {
        self.flags
    }

    /// The file's attributes (fstat).
    pub fn attr(&self) -> Result<Attr> {
        self.shared.attr_of(&self.shared.meta.view(&[self.ino]), self.ino)
    }

    pub(super) fn check_readable(&self) -> Result<()> {
        self.shared.check_running()?;
        if !self.flags.read {
            return Err(Error::BadHandle("file not open for reading".into()));
        }
        Ok(())
    }

    /// Passes the volume's write gate ([`super::freeze`]) and checks the
    /// handle writes; the operation ends when the value is dropped.
    pub(super) fn check_writable(&self) -> Result<Writing<'_>> {
        let writing = self.shared.write_gate.start_write();
        self.shared.check_running()?;
        if !self.flags.write {
            return Err(Error::BadHandle("file not open for writing".into()));
        }
        Ok(writing)
    }

    /// Reads at `pos`; returns the bytes read, fewer than asked at end of file.
    pub fn read_at(&self, buffer: &mut [u8], pos: u64) -> Result<usize> {
        self.check_readable()?;
        let engine = &self.shared.engine;
        if self.flags.direct {
            let read = direct::read(engine, &self.inode, self.ino, buffer, pos);
            if let Ok(count) = read {
                assert!(
                    count <= buffer.len(),
                    "direct read of {count} bytes into {}",
                    buffer.len()
                );
                if !buffer.is_empty() {
                    self.shared.accessed(self.ino);
                }
            }
            return read;
        }
        let (viewed, count) = {
            let _shared = self.inode.io.shared();
            let viewed = self.shared.read_view(self.ino, &self.view)?;
            let count = buffered::read(
                engine,
                &self.inode,
                &self.readahead,
                buffer,
                pos,
                viewed.size_bytes,
            )?;
            // Never more than asked, never past the end of file.
            assert!(count <= buffer.len(), "read {count} bytes into {}", buffer.len());
            assert!(
                count as u64 <= viewed.size_bytes.saturating_sub(pos),
                "read {count} bytes at {pos} past the size {}",
                viewed.size_bytes
            );
            if self.flags.drop_behind {
                self.drop_consumed(pos, pos + count as u64)?;
            }
            (viewed, count)
        };
        if !buffer.is_empty() {
            self.shared.accessed_viewed(self.ino, &viewed);
        }
        Ok(count)
    }

    /// Writes at `pos` (at the end of file with `append`); returns the bytes
    /// written. With `dsync` the data is durable on return.
    pub fn write_at(&self, data: &[u8], pos: u64) -> Result<usize> {
        let _writing = self.check_writable()?;
        let engine = &self.shared.engine;
        // Before either path: a direct overwrite of written blocks needs no
        // metadata, so nothing below would refuse it on a volume that went
        // read-only (found by tests/faults/random.rs).
        if let Some(refusal) = self.shared.meta.refusal() {
            return Err(refusal);
        }
        if !self.flags.append {
            self.shared.check_data_change(self.ino, pos, "writing before its end")?;
        } else {
            self.shared.check_data_change(self.ino, u64::MAX, "appending")?;
        }
        if self.flags.direct && !self.flags.append {
            let written =
                direct::write(engine, &self.inode, self.ino, data, pos, self.flags.dsync)?;
            debug_assert!(written <= data.len(), "wrote {written} bytes of {}", data.len());
            self.shared.changed(ChangeEvent::range(self.ino, pos, written as u64));
            return Ok(written);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let (pos, written) = {
            let _exclusive = self.inode.io.exclusive(|| self.shared.engine.device.unplug());
            let pos = if self.flags.append { self.shared.size_of(self.ino)? } else { pos };
            (pos, buffered::write(engine, &self.inode, data, pos)?)
        };
        debug_assert!(written <= data.len(), "wrote {written} bytes of {}", data.len());
        self.shared.changed(ChangeEvent::range(self.ino, pos, written as u64));
        writeback::balance_dirty(engine, &self.inode, written as u64);
        if self.flags.dsync {
            self.sync_range(pos, pos + written as u64, true)?;
        }
        Ok(written)
    }

    /// Asynchronous read into an owned buffer (direct files only). Any
    /// executor can drive the future; many may be in flight per thread.
    pub fn read_at_async(&self, buffer: AlignedBuf, pos: u64) -> DirectFuture {
        match self.check_direct().and_then(|()| self.check_readable()) {
            Ok(()) => {
                // At submission: a future may be dropped unpolled, but the
                // read was asked for.
                self.shared.accessed(self.ino);
                let sequential = self.continues_direct(pos, buffer.len());
                direct::read_async(&self.shared.engine, &self.inode, self.ino, buffer, pos)
                    .sequential(sequential)
            }
            Err(error) => DirectFuture::failed(buffer, error),
        }
    }

    /// A buffered read without a copy where the cache allows it: `consume`
    /// gets the bytes of `[pos, pos + length)` (fewer at end of file) where
    /// the cache holds them, when one cached folio holds them all; `None`
    /// comes back otherwise (and always on a direct handle), `consume`
    /// uncalled: read with [`File::read_at`] then. A server replying from
    /// the bytes saves the copy into its own buffer.
    pub fn read_in_place<R>(
        &self,
        pos: u64,
        length: usize,
        consume: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        self.check_readable()?;
        if self.flags.direct {
            return Ok(None);
        }
        let engine = &self.shared.engine;
        let (read, viewed) = {
            let _shared = self.inode.io.shared();
            let viewed = self.shared.read_view(self.ino, &self.view)?;
            let size = viewed.size_bytes;
            let read = buffered::read_in_place(
                engine,
                &self.inode,
                &self.readahead,
                pos,
                length,
                size,
                consume,
            )?;
            (read, viewed)
        };
        let Some((consumed, count)) = read else { return Ok(None) };
        debug_assert!(count <= length, "{count} bytes read in place of {length}");
        if count > 0 {
            self.shared.accessed_viewed(self.ino, &viewed);
        }
        if self.flags.drop_behind {
            self.drop_consumed(pos, pos + count as u64)?;
        }
        Ok(Some(consumed))
    }

    /// Drop-behind after a buffered read of `[pos, end)`: the folios it
    /// finished (up to its end, or all of them once it reached the end of
    /// file). A folio the read ended inside stays for the read that
    /// continues it: a sequential reader in requests smaller than a folio
    /// would otherwise read each folio from the device again.
    fn drop_consumed(&self, pos: u64, end: u64) -> Result<()> {
        debug_assert!(pos <= end, "drop-behind of [{pos}, {end})");
        let size = self.shared.engine.size_of(self.ino)?;
        let consumed_end = if end >= size { u64::MAX } else { end };
        self.inode.drop_behind_range(pos, end, consumed_end);
        // And the folios wholly behind this read that an earlier read
        // finished while a concurrent one still held them (the kernel sends
        // readahead from several threads, so reads end out of order): a
        // reader moving forward does not come back for them. Cheap, since
        // drop-behind leaves few of the file's folios cached.
        if pos > 0 {
            self.inode.drop_behind_range(0, pos, pos);
        }
        Ok(())
    }

    /// Asynchronous write from an owned buffer (direct files only).
    pub fn write_at_async(&self, buffer: AlignedBuf, pos: u64) -> DirectFuture {
        // The gate is held while the write is submitted; a freeze that
        // follows waits for it at the file's I/O lock.
        let checked =
            self.check_direct().and_then(|()| self.check_writable()).and_then(|writing| {
                // As in write_at: an overwrite alone would not be refused.
                self.shared.meta.refusal().map_or(Ok(()), Err)?;
                self.shared.check_data_change(self.ino, pos, "writing before its end")?;
                Ok(writing)
            });
        match checked {
            Ok(_writing) => {
                let engine = &self.shared.engine;
                let shared: Arc<dyn WriteObserver> = Arc::clone(&self.shared) as _;
                let sequential = self.continues_direct(pos, buffer.len());
                direct::write_async(engine, &self.inode, self.ino, buffer, pos, self.flags.dsync)
                    .observed_by(shared, self.ino, pos)
                    .sequential(sequential)
            }
            Err(error) => DirectFuture::failed(buffer, error),
        }
    }

    /// Whether an asynchronous direct request of `length` bytes at `pos`
    /// starts where this handle's previous one ended; it is the previous
    /// one from now on.
    fn continues_direct(&self, pos: u64, length: usize) -> bool {
        let end = pos.saturating_add(length as u64);
        self.direct_end.swap(end, Ordering::Relaxed) == pos
    }

    fn check_direct(&self) -> Result<()> {
        if !self.flags.direct || self.flags.append {
            return Err(Error::invalid(
                "asynchronous I/O needs a file opened direct, without append",
            ));
        }
        Ok(())
    }

    /// Truncates or extends to `size` bytes.
    pub fn set_len(&self, size: u64) -> Result<()> {
        let _writing = self.check_writable()?;
        // Any size change, growing included, as the kernel's truncate.
        self.shared.check_data_change(self.ino, 0, "changing its size")?;
        if let Some(refusal) = self.shared.meta.refusal() {
            return Err(refusal);
        }
        {
            let _exclusive = self.inode.io.exclusive(|| self.shared.engine.device.unplug());
            buffered::set_size(&self.shared.engine, &self.inode, size)?;
        }
        self.shared.changed(ChangeEvent::from_offset(self.ino, size));
        Ok(())
    }

    /// fallocate(2): preallocate, punch a hole, zero, collapse or insert a
    /// range (see [`FallocateMode`]).
    pub fn fallocate(&self, mode: FallocateMode, offset: u64, length: u64) -> Result<()> {
        let _writing = self.check_writable()?;
        // Append-only files take plain preallocation alone (vfs_fallocate).
        let start = if matches!(mode, FallocateMode::Allocate { .. }) { u64::MAX } else { 0 };
        self.shared.check_data_change(self.ino, start, "fallocate")?;
        if let Some(refusal) = self.shared.meta.refusal() {
            return Err(refusal);
        }
        {
            let _exclusive = self.inode.io.exclusive(|| self.shared.engine.device.unplug());
            space::fallocate(&self.shared.engine, &self.inode, mode, offset, length)?;
        }
        // Collapse and insert move every byte after `offset`.
        let changed = match mode {
            FallocateMode::CollapseRange | FallocateMode::InsertRange => {
                ChangeEvent::from_offset(self.ino, offset)
            }
            _ => ChangeEvent::range(self.ino, offset, length),
        };
        self.shared.changed(changed);
        Ok(())
    }

    /// lseek(SEEK_DATA): the first data at or after `pos`; ENXIO past it.
    pub fn seek_data(&self, pos: u64) -> Result<u64> {
        self.shared.check_running()?;
        let _shared = self.inode.io.shared();
        space::seek(&self.shared.engine, &self.inode, pos, Whence::Data)
    }

    /// lseek(SEEK_HOLE): the first hole at or after `pos` (the end of file
    /// at the latest); ENXIO at or past the end of file.
    pub fn seek_hole(&self, pos: u64) -> Result<u64> {
        self.shared.check_running()?;
        let _shared = self.inode.io.shared();
        space::seek(&self.shared.engine, &self.inode, pos, Whence::Hole)
    }

    pub(super) fn sync_range(&self, start: u64, end: u64, data_only: bool) -> Result<()> {
        debug_assert!(start <= end, "a sync of [{start}, {end})");
        self.shared.check_running()?;
        // Announced before the data goes out, so that a sync about to lead
        // a journal group meanwhile waits for this one to share it.
        let on_the_way = self.shared.meta.journal().announce_sync();
        let written = writeback::write_back(&self.shared.engine, &self.inode, start, end);
        if let Some(message) = self.inode.check_error(&self.errors_seen) {
            return Err(Error::io(message, std::io::Error::from_raw_os_error(libc::EIO)));
        }
        written?;
        self.shared.fsync_inode(self.ino, data_only, Some(on_the_way))
    }

    /// Makes the file's data and metadata durable, as
    /// `std::fs::File::sync_all` (fsync). A writeback failure since this
    /// handle last looked is reported here, once.
    pub fn sync_all(&self) -> Result<()> {
        self.sync_range(0, u64::MAX, false)
    }

    /// Makes the file's data durable, with the metadata needed to read it
    /// back, as `std::fs::File::sync_data` (fdatasync).
    pub fn sync_data(&self) -> Result<()> {
        self.sync_range(0, u64::MAX, true)
    }

    /// The file's attributes, as `std::fs::File::metadata`.
    pub fn metadata(&self) -> Result<Metadata> {
        Ok(self.attr()?.into())
    }

    /// Sets the permission bits, as `std::fs::File::set_permissions`.
    pub fn set_permissions(&self, permissions: Permissions) -> Result<()> {
        let changes = SetAttr { mode: Some(permissions.mode()), ..SetAttr::default() };
        self.shared.change_attrs(self.ino, &changes).map(drop)
    }

    /// Writes all of `data` at `pos` (at the end of file with `append`), as
    /// `std::os::unix::fs::FileExt::write_all_at`.
    pub fn write_all_at(&self, mut data: &[u8], mut pos: u64) -> Result<()> {
        while !data.is_empty() {
            let written = self.write_at(data, pos)?;
            if written == 0 {
                return Err(Error::io("write_all_at", io::ErrorKind::WriteZero.into()));
            }
            data = &data[written..];
            pos += written as u64;
        }
        Ok(())
    }

    /// Fills `buffer` from `pos`, as
    /// `std::os::unix::fs::FileExt::read_exact_at`: end of file first is an
    /// error (ENXIO).
    pub fn read_exact_at(&self, mut buffer: &mut [u8], mut pos: u64) -> Result<()> {
        while !buffer.is_empty() {
            let read = self.read_at(buffer, pos)?;
            if read == 0 {
                return Err(Error::PastEnd(format!("inode {} at {pos}", self.ino)));
            }
            buffer = &mut buffer[read..];
            pos += read as u64;
        }
        Ok(())
    }

    /// Closes the handle, reporting an error freeing an unlinked file.
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
            self.shared.cache.release_inode(ino, 1);
            return Ok(());
        }
        // No writeback of the file may still be writing into blocks that the
        // free hands back.
        let freed = {
            // Nothing may still write into the blocks the free hands back:
            // in-flight direct I/O drains under the exclusive lock, writeback
            // under its own lock.
            let _exclusive = self.inode.io.exclusive(|| self.shared.engine.device.unplug());
            let _serial = self.inode.lock_writeback();
            let freed = self.shared.free_orphan(ino);
            // Cached data goes only with the inode (someone may have opened
            // it by number meanwhile).
            if matches!(freed, Ok(true)) {
                self.inode.remove_range(0, u64::MAX);
            }
            freed
        };
        self.shared.cache.release_inode(ino, 1);
        freed.map(|_| ())
    }
}

/// Reads at the handle's cursor and moves it, as a `std::fs::File`.
impl io::Read for &File {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let mut cursor = self.cursor.lock();
        let read = self.read_at(buffer, *cursor)?;
        *cursor += read as u64;
        Ok(read)
    }
}

/// Writes at the handle's cursor (at the end of file with `append`) and
/// moves it past the data, as a `std::fs::File`.
impl io::Write for &File {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut cursor = self.cursor.lock();
        let pos = if self.flags.append { self.attr()?.size } else { *cursor };
        let written = self.write_at(data, pos)?;
        *cursor = pos + written as u64;
        Ok(written)
    }

    /// Nothing is buffered in the handle: the data is in the volume's cache
    /// already. Durability is [`File::sync_all`]'s job.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Moves the handle's cursor, as a `std::fs::File`.
impl io::Seek for &File {
    fn seek(&mut self, position: SeekFrom) -> io::Result<u64> {
        let mut cursor = self.cursor.lock();
        let (base, delta) = match position {
            SeekFrom::Start(offset) => (offset, 0),
            SeekFrom::Current(delta) => (*cursor, delta),
            SeekFrom::End(delta) => (self.attr()?.size, delta),
        };
        let moved = base.checked_add_signed(delta).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "seek before the start of the file")
        })?;
        *cursor = moved;
        Ok(moved)
    }
}

impl io::Read for File {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buffer)
    }
}

impl io::Write for File {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        (&*self).write(data)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self).flush()
    }
}

impl io::Seek for File {
    fn seek(&mut self, position: SeekFrom) -> io::Result<u64> {
        (&*self).seek(position)
    }
}

/// A direct write's change event comes from the thread that completed it.
impl WriteObserver for VolumeCore {
    fn direct_written(&self, ino: u64, pos: u64, written: usize) {
        let changed = ChangeEvent::range(ino, pos, written as u64);
        self.changed(ChangeEvent { deferred: true, ..changed })
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("File").field("ino", &self.ino).field("flags", &self.flags).finish()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if let Err(error) = self.release() {
            tracing::error!("closing inode {}: {error}", self.ino);
        }
    }
}
