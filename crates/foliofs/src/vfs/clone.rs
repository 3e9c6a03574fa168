//! Clones, deduplication and copies between open files: FICLONERANGE,
//! FIDEDUPERANGE and copy_file_range(2) as Linux's file systems answer
//! them, over `crate::reflink`. A clone shares the source's blocks (no data
//! moves); a later write to either file copies only the blocks it touches.

use std::path::Path;

use crate::buffered::{self, Readahead};
use crate::cache::IoExclusive;
use crate::engine::FILE_BYTES_MAX;
use crate::error::{Error, Result};
use crate::reflink;
use crate::writeback;

use super::file::File;
use super::observe::ChangeEvent;
use super::open_options::OpenOptions;
use super::volume::Volume;

/// The first volume format whose images may share blocks.
const FORMAT_VERSION_CLONES: u32 = 2;

/// Bytes a copy moves per read and write.
const COPY_CHUNK_BYTES: usize = 1 << 20;

/// Both files' I/O locks held exclusively (one lock when they are one file).
struct LockedPair<'a> {
    _first: IoExclusive<'a>,
    _second: Option<IoExclusive<'a>>,
}

impl File {
    /// FICLONERANGE: makes `[dst_pos, dst_pos + length)` of this file share
    /// the blocks of `[src_pos, src_pos + length)` of `src` (which may be
    /// this file, the ranges apart), growing this file if the range ends
    /// past it. `length` 0 means up to the source's end of file. Offsets
    /// must be multiples of the block size, and so must `length` unless
    /// the range ends at the source's end of file and reaches this file's.
    /// Returns the bytes cloned. EXDEV across volumes; EOPNOTSUPP on a
    /// volume of format version 1.
    pub fn clone_range_from(
        &self,
        src: &File,
        src_pos: u64,
        dst_pos: u64,
        length: u64,
    ) -> Result<u64> {
        let _writing = self.shared.write_gate.start_write();
        let length = {
            let _locks = self.lock_with(src);
            let length = self.check_clone(src, src_pos, dst_pos, length, false)?;
            reflink::clone_range(
                &self.shared.engine,
                &src.inode,
                &self.inode,
                src_pos,
                dst_pos,
                length,
            )?;
            length
        };
        self.shared.changed(ChangeEvent::range(self.ino, dst_pos, length));
        Ok(length)
    }

    /// FIDEDUPERANGE for one destination: if `[dst_pos, dst_pos + length)`
    /// of this file holds the same bytes as `[src_pos, src_pos + length)` of
    /// `src`, this file's range comes to share the source's blocks (freeing
    /// its own). Returns the bytes deduplicated: `length`, or 0 when the
    /// bytes differ (FILE_DEDUPE_RANGE_DIFFERS). Alignment as
    /// [`File::clone_range_from`]; the range must lie inside both files.
    pub fn dedupe_range_from(
        &self,
        src: &File,
        src_pos: u64,
        dst_pos: u64,
        length: u64,
    ) -> Result<u64> {
        let _writing = self.shared.write_gate.start_write();
        let _locks = self.lock_with(src);
        let length = self.check_clone(src, src_pos, dst_pos, length, true)?;
        let engine = &self.shared.engine;
        let (src_size, dst_size) = (engine.size_of(src.ino)?, engine.size_of(self.ino)?);
        let mut src_bytes = vec![0u8; COPY_CHUNK_BYTES];
        let mut dst_bytes = vec![0u8; COPY_CHUNK_BYTES];
        let mut done = 0u64;
        while done < length {
            let chunk = (length - done).min(COPY_CHUNK_BYTES as u64) as usize;
            let (src_chunk, dst_chunk) = (&mut src_bytes[..chunk], &mut dst_bytes[..chunk]);
            let read_src = buffered::read(
                engine,
                &src.inode,
                &Readahead::default(),
                src_chunk,
                src_pos + done,
                src_size,
            )?;
            let read_dst = buffered::read(
                engine,
                &self.inode,
                &Readahead::default(),
                dst_chunk,
                dst_pos + done,
                dst_size,
            )?;
            if read_src != chunk || read_dst != chunk || src_chunk != dst_chunk {
                return Ok(0);
            }
            done += chunk as u64;
        }
        reflink::clone_range(engine, &src.inode, &self.inode, src_pos, dst_pos, length)?;
        Ok(length)
    }

    /// copy_file_range(2): copies up to `length` bytes from `src` at
    /// `src_pos` to this file at `dst_pos`, stopping at the source's end of
    /// file; returns the bytes copied. Where both offsets sit at the same
    /// place in their blocks, the whole blocks are cloned (no data moves)
    /// and only the partial blocks at the edges are copied. With `dsync`
    /// on this file the copy is durable on return, as a write would be.
    pub fn copy_range_from(
        &self,
        src: &File,
        src_pos: u64,
        dst_pos: u64,
        length: u64,
    ) -> Result<u64> {
        let _writing = self.shared.write_gate.start_write();
        let copied = self.copy_range_unsynced(src, src_pos, dst_pos, length)?;
        if self.flags().dsync && copied > 0 {
            self.sync_range(dst_pos, dst_pos + copied, true)?;
        }
        Ok(copied)
    }

    fn copy_range_unsynced(
        &self,
        src: &File,
        src_pos: u64,
        dst_pos: u64,
        length: u64,
    ) -> Result<u64> {
        self.check_pair(src, "copy_file_range")?;
        let engine = &self.shared.engine;
        let src_size = engine.size_of(src.ino)?;
        let length = length.min(src_size.saturating_sub(src_pos));
        if length == 0 {
            return Ok(0);
        }
        dst_pos
            .checked_add(length)
            .filter(|&end| end <= FILE_BYTES_MAX)
            .ok_or_else(|| Error::FileTooLarge(format!("inode {}: copy to {dst_pos}", self.ino)))?;
        if self.ino == src.ino && src_pos < dst_pos + length && dst_pos < src_pos + length {
            return Err(Error::invalid("copy_file_range within one file over overlapping ranges"));
        }
        let block = engine.block_bytes;
        let clones = self.shared.superblock.version >= FORMAT_VERSION_CLONES
            && src_pos % block == dst_pos % block
            && !self.flags().append;
        if !clones {
            return self.copy_bytes(src, src_pos, dst_pos, length);
        }
        // Head to the next block boundary, whole blocks, tail.
        let head = ((block - src_pos % block) % block).min(length);
        let mut done = self.copy_bytes(src, src_pos, dst_pos, head)?;
        let whole = (length - head) / block * block;
        if whole > 0 {
            done += self.clone_range_from(src, src_pos + head, dst_pos + head, whole)?;
        }
        let tail = length - head - whole;
        if tail > 0 {
            done += self.copy_bytes(src, src_pos + head + whole, dst_pos + head + whole, tail)?;
        }
        Ok(done)
    }

    /// Copies bytes through the cache, a chunk at a time.
    fn copy_bytes(&self, src: &File, src_pos: u64, dst_pos: u64, length: u64) -> Result<u64> {
        let engine = &self.shared.engine;
        let mut buffer = vec![0u8; (length as usize).min(COPY_CHUNK_BYTES)];
        let mut done = 0u64;
        while done < length {
            let chunk = (length - done).min(COPY_CHUNK_BYTES as u64) as usize;
            let read = {
                let _shared = src.inode.io.shared();
                let size = engine.size_of(src.ino)?;
                let readahead = Readahead::default();
                buffered::read(
                    engine,
                    &src.inode,
                    &readahead,
                    &mut buffer[..chunk],
                    src_pos + done,
                    size,
                )?
            };
            if read == 0 {
                break;
            }
            self.shared.check_data_change(self.ino, dst_pos + done, "copying into it")?;
            let written = {
                let _exclusive = self.inode.io.exclusive(|| engine.device.unplug());
                buffered::write(engine, &self.inode, &buffer[..read], dst_pos + done)?
            };
            self.shared.changed(ChangeEvent::range(self.ino, dst_pos + done, written as u64));
            writeback::balance_dirty(engine, &self.inode, written as u64);
            done += written as u64;
            if written < read {
                break;
            }
        }
        Ok(done)
    }

    /// This file open for writing, `src` for reading, both on one volume.
    fn check_pair(&self, src: &File, what: &str) -> Result<()> {
        // Inside the gate its public caller passed first (before the locks).
        let _writing = self.check_writable()?;
        src.check_readable()?;
        if !std::sync::Arc::ptr_eq(&self.shared, &src.shared) {
            return Err(Error::CrossDevice(format!("{what} between two volumes")));
        }
        Ok(())
    }

    /// Both files' I/O locks, exclusively, the lower inode number's first
    /// (so two clones between one pair of files in opposite directions
    /// never deadlock).
    fn lock_with<'a>(&'a self, src: &'a File) -> LockedPair<'a> {
        let unplug = || self.shared.engine.device.unplug();
        if self.ino == src.ino {
            return LockedPair { _first: self.inode.io.exclusive(unplug), _second: None };
        }
        let (first, second) = if self.ino < src.ino { (self, src) } else { (src, self) };
        let first_guard = first.inode.io.exclusive(unplug);
        let second_guard = second.inode.io.exclusive(unplug);
        LockedPair { _first: first_guard, _second: Some(second_guard) }
    }

    /// What FICLONERANGE and FIDEDUPERANGE refuse, checked under both
    /// locks; returns the length (0 resolved to the source's end). With
    /// `inside_both`, the range must lie inside the destination too.
    fn check_clone(
        &self,
        src: &File,
        src_pos: u64,
        dst_pos: u64,
        length: u64,
        inside_both: bool,
    ) -> Result<u64> {
        self.check_pair(src, "cloning")?;
        if self.shared.superblock.version < FORMAT_VERSION_CLONES {
            return Err(Error::Unsupported(format!(
                "clones need a volume of format version {FORMAT_VERSION_CLONES}; this one is \
                 version {} (made by an older build): copy its files to a new volume",
                self.shared.superblock.version
            )));
        }
        if let Some(refusal) = self.shared.meta.refusal() {
            return Err(refusal);
        }
        if self.flags().append {
            return Err(Error::BadHandle("cloning into a file opened for appending".into()));
        }
        self.shared.check_data_change(self.ino, dst_pos, "cloning into it")?;
        let engine = &self.shared.engine;
        let block = engine.block_bytes;
        let (src_size, dst_size) = (engine.size_of(src.ino)?, engine.size_of(self.ino)?);
        if src_pos > src_size {
            return Err(Error::invalid(format!(
                "clone source offset {src_pos} is past the source's end ({src_size} bytes)"
            )));
        }
        let length = if length == 0 { src_size - src_pos } else { length };
        let src_end =
            src_pos.checked_add(length).filter(|&end| end <= src_size).ok_or_else(|| {
                Error::invalid(format!(
                "clone of {length} bytes at {src_pos} runs past the source's end ({src_size} bytes)"
            ))
            })?;
        let dst_end =
            dst_pos.checked_add(length).filter(|&end| end <= FILE_BYTES_MAX).ok_or_else(|| {
                Error::FileTooLarge(format!("inode {}: clone to {dst_pos}", self.ino))
            })?;
        if inside_both && dst_end > dst_size {
            return Err(Error::invalid(format!(
                "deduplication of {length} bytes at {dst_pos} runs past the destination's end \
                 ({dst_size} bytes)"
            )));
        }
        if !src_pos.is_multiple_of(block) || !dst_pos.is_multiple_of(block) {
            return Err(Error::invalid(format!(
                "clone offsets {src_pos} and {dst_pos} must be multiples of the block size \
                 ({block} B)"
            )));
        }
        let whole_blocks = length.is_multiple_of(block);
        let tail_at_ends = src_end == src_size && dst_end >= dst_size;
        if !whole_blocks && !tail_at_ends {
            return Err(Error::invalid(format!(
                "clone length {length} must be a multiple of the block size ({block} B) unless \
                 the range ends at the source's end of file and reaches the destination's"
            )));
        }
        if self.ino == src.ino {
            let (src_blocks_end, dst_blocks_end) = (
                src_pos + length.div_ceil(block) * block,
                dst_pos + length.div_ceil(block) * block,
            );
            if src_pos < dst_blocks_end && dst_pos < src_blocks_end {
                return Err(Error::invalid("clone within one file over overlapping ranges"));
            }
        }
        Ok(length)
    }
}

impl Volume {
    /// Checks every shared-block count against the extent maps, as mount
    /// does; EUCLEAN naming the first disagreement. Stops writers while it
    /// runs (tests and fsck).
    #[doc(hidden)]
    pub fn check_shared_counts(&self) -> Result<()> {
        self.shared.meta.verify_shared_counts().map_err(Error::Corrupt)
    }

    /// `cp --reflink=always`: creates `dst` (which must not exist) with
    /// `src`'s permission bits and makes it share all of `src`'s blocks.
    pub fn clone_file(&self, src: impl AsRef<Path>, dst: impl AsRef<Path>) -> Result<()> {
        let source = OpenOptions::new().read(true).open(self, src.as_ref())?;
        let mode = source.metadata()?.permissions().mode() & 0o7777;
        let target =
            OpenOptions::new().write(true).create_new(true).mode(mode).open(self, dst.as_ref())?;
        let cloned = target.clone_range_from(&source, 0, 0, 0);
        if cloned.is_err() {
            // Leave no half-made copy behind.
            let _ = self.remove_file(dst.as_ref());
        }
        cloned.map(|_| ())
    }

    /// Clones the tree at `src` to `dst` (which must not exist): each
    /// directory made again with its permission bits, each regular file
    /// cloned ([`Volume::clone_file`]), each symlink copied; other nodes
    /// are skipped and counted. Returns how many files were cloned and how
    /// many nodes skipped.
    ///
    /// The copy is one instant of the volume, however many threads change
    /// the tree meanwhile: the volume is frozen ([`Volume::freeze`]) while
    /// the copy is made, so every change answered before the call is in it
    /// and none answered after; writers wait for the snapshot (about 25 us
    /// a file on the bench VM), readers do not. The copy is built under a
    /// hidden name beside `dst` (`.NAME.foliofs-snapshot`) and renamed to
    /// `dst` when whole, so `dst` never names a half-made copy, even after
    /// a crash (which leaves the hidden one, to be removed).
    pub fn clone_tree(&self, src: impl AsRef<Path>, dst: impl AsRef<Path>) -> Result<(u64, u64)> {
        let (src, dst) = (src.as_ref(), dst.as_ref());
        let _frozen = self.freeze_unsynced()?;
        if !self.symlink_metadata(src)?.is_dir() {
            self.clone_file(src, dst)?;
            return Ok((1, 0));
        }
        if dst.starts_with(src) {
            return Err(Error::invalid(format!(
                "cannot clone {} into itself ({})",
                src.display(),
                dst.display()
            )));
        }
        if self.symlink_metadata(dst).is_ok() {
            return Err(Error::Exists(dst.display().to_string()));
        }
        let name = dst.file_name().ok_or_else(|| {
            Error::invalid(format!("{} names no directory to create", dst.display()))
        })?;
        let mut hidden_name = std::ffi::OsString::from(".");
        hidden_name.push(name);
        hidden_name.push(".foliofs-snapshot");
        let hidden = dst.with_file_name(hidden_name);
        if self.symlink_metadata(&hidden).is_ok() {
            return Err(Error::Exists(format!(
                "{} (left by an earlier snapshot that did not finish: remove it)",
                hidden.display()
            )));
        }
        let made = self.clone_tree_into(src, &hidden).and_then(|counts| {
            let (from_parent, from_name) = self.parent_and_name(&hidden)?;
            let (to_parent, to_name) = self.parent_and_name(dst)?;
            let no_replace =
                super::namespace::RenameFlags { no_replace: true, ..Default::default() };
            self.inodes().rename(from_parent, from_name, to_parent, to_name, no_replace)?;
            Ok(counts)
        });
        if made.is_err() && self.symlink_metadata(&hidden).is_ok() {
            // Leave no half-made copy behind.
            let _ = self.remove_dir_all(&hidden);
        }
        made
    }

    /// [`Volume::clone_tree`]'s walk, on a frozen volume.
    fn clone_tree_into(&self, src: &Path, dst: &Path) -> Result<(u64, u64)> {
        let mode = self.symlink_metadata(src)?.permissions().mode() & 0o7777;
        self.create_dir(dst)?;
        self.set_permissions(dst, super::metadata::Permissions::from_mode(mode))?;
        let (mut files, mut skipped) = (0, 0);
        let mut entries: Vec<_> = self.read_dir(src)?.collect::<Result<_>>()?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for entry in entries {
            let (from, to) = (src.join(entry.file_name()), dst.join(entry.file_name()));
            match entry.kind {
                crate::format::InodeKind::Dir => {
                    let (more_files, more_skipped) = self.clone_tree_into(&from, &to)?;
                    files += more_files;
                    skipped += more_skipped;
                }
                crate::format::InodeKind::File => {
                    self.clone_file(&from, &to)?;
                    files += 1;
                }
                crate::format::InodeKind::Symlink => self.symlink(self.read_link(&from)?, &to)?,
                _ => skipped += 1,
            }
        }
        Ok((files, skipped))
    }
}
