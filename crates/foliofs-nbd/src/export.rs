//! One exported file: the NBD commands as library calls.
//!
//! Aligned requests take the direct path (a plain write is one device
//! write; a FUA write is the engine's durable write, one FUA request when
//! it overwrites written blocks), unaligned ones the folio cache. FLUSH is
//! the file's fdatasync, which covers every write already answered on any
//! connection: all connections share these handles, hence CAN_MULTI_CONN.

use foliofs::dev::nbd::proto::{self, BlockStatus};
use foliofs::dev::AlignedBuf;
use foliofs::FallocateMode;
use foliofs::MapKind;
use foliofs::{Error, File, OpenFlags, Volume};

/// The most descriptors one BLOCK_STATUS reply carries; the client asks
/// again from where it ends.
const BLOCK_STATUS_DESCRIPTORS_MAX: usize = 1024;

pub struct Export {
    pub name: String,
    /// The file's path inside the volume.
    pub path: String,
    pub read_only: bool,
    /// Fixed at open, as the protocol fixes it at negotiation.
    pub size_bytes: u64,
    /// Requests aligned to this take the direct path (the device's logical block).
    pub direct_align_bytes: u32,
    /// The volume's block size: the preferred request size.
    pub block_bytes: u32,
    direct: File,
    direct_dsync: File,
    buffered: File,
    buffered_dsync: File,
}

/// A failed command: the wire error and what to log.
#[derive(Debug)]
pub struct CommandError {
    pub error: u32,
    pub message: String,
}

impl CommandError {
    pub fn invalid(message: String) -> Self {
        Self { error: proto::EINVAL, message }
    }
}

impl From<Error> for CommandError {
    fn from(error: Error) -> Self {
        Self { error: proto::error_from_errno(error.errno()), message: error.to_string() }
    }
}

pub type CommandResult<T> = Result<T, CommandError>;

impl Export {
    pub fn open(volume: &Volume, name: &str, path: &str, read_only: bool) -> foliofs::Result<Self> {
        let flags = if read_only { OpenFlags::READ } else { OpenFlags::READ_WRITE };
        let open = |flags: OpenFlags| volume.inodes().open_path(path, flags);
        let buffered = open(flags)?;
        let size_bytes = buffered.attr()?.size;
        Ok(Self {
            name: name.to_string(),
            path: path.to_string(),
            read_only,
            size_bytes,
            direct_align_bytes: volume.device().logical_block_bytes(),
            block_bytes: volume.superblock().block_bytes,
            direct: open(flags.with_direct())?,
            direct_dsync: open(flags.with_direct().with_dsync())?,
            buffered_dsync: open(flags.with_dsync())?,
            buffered,
        })
    }

    pub fn transmission_flags(&self) -> u16 {
        let mut flags = proto::TF_HAS_FLAGS | proto::TF_SEND_FLUSH | proto::TF_CAN_MULTI_CONN;
        if self.read_only {
            flags |= proto::TF_READ_ONLY;
        } else {
            flags |= proto::TF_SEND_FUA | proto::TF_SEND_TRIM | proto::TF_SEND_WRITE_ZEROES;
        }
        flags
    }

    fn aligned(&self, offset: u64, length: usize) -> bool {
        let mask = u64::from(self.direct_align_bytes) - 1;
        offset & mask == 0 && length as u64 & mask == 0
    }

    /// Reads `length` bytes at `offset` (inside the export) into a buffer.
    pub fn read(&self, offset: u64, length: u32) -> CommandResult<AlignedBuf> {
        let mut buffer = AlignedBuf::zeroed(length as usize);
        let file = if self.aligned(offset, buffer.len()) { &self.direct } else { &self.buffered };
        let mut done = 0;
        while done < buffer.len() {
            let read = file.read_at(&mut buffer[done..], offset + done as u64)?;
            if read == 0 {
                // Shortened behind our back: the rest reads as zeros.
                break;
            }
            done += read;
        }
        Ok(buffer)
    }

    pub fn write(&self, offset: u64, data: &AlignedBuf, fua: bool) -> CommandResult<()> {
        let file = match (self.aligned(offset, data.len()), fua) {
            (true, false) => &self.direct,
            (true, true) => &self.direct_dsync,
            (false, false) => &self.buffered,
            (false, true) => &self.buffered_dsync,
        };
        let mut done = 0;
        while done < data.len() {
            done += file.write_at(&data[done..], offset + done as u64)?;
        }
        Ok(())
    }

    pub fn flush(&self) -> CommandResult<()> {
        if self.read_only {
            // Nothing was written; a read-only volume has nothing to commit.
            return Ok(());
        }
        Ok(self.buffered.sync_data()?)
    }

    pub fn trim(&self, offset: u64, length: u32, fua: bool) -> CommandResult<()> {
        self.buffered.fallocate(FallocateMode::PunchHole, offset, u64::from(length))?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Zeroes a range: with `keep_allocated` (NBD_CMD_FLAG_NO_HOLE) as a
    /// zero range, else as a punched hole, which the spec allows and which
    /// keeps a converted image sparse.
    pub fn write_zeroes(
        &self,
        offset: u64,
        length: u32,
        keep_allocated: bool,
        fua: bool,
    ) -> CommandResult<()> {
        let mode = if keep_allocated {
            FallocateMode::ZeroRange { keep_size: true }
        } else {
            FallocateMode::PunchHole
        };
        self.buffered.fallocate(mode, offset, u64::from(length))?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// base:allocation of `length` bytes at `offset`, from the extent map:
    /// holes read as zeros and are unallocated, unwritten extents read as
    /// zeros, the rest is data.
    pub fn block_status(
        &self,
        volume: &Volume,
        offset: u64,
        length: u32,
        only_one: bool,
    ) -> CommandResult<Vec<BlockStatus>> {
        let end = offset + u64::from(length);
        let extents = volume.inodes().fiemap(self.buffered.ino())?;
        let mut descriptors: Vec<BlockStatus> = Vec::new();
        let mut push = |start: u64, stop: u64, flags: u32| {
            if stop <= start {
                return;
            }
            let length = (stop - start) as u32;
            match descriptors.last_mut() {
                Some(last) if last.flags == flags => last.length += length,
                _ => descriptors.push(BlockStatus { length, flags }),
            }
        };
        let mut pos = offset;
        for extent in extents {
            let (start, stop) = (extent.logical, extent.logical + extent.length);
            if stop <= pos {
                continue;
            }
            if start >= end {
                break;
            }
            push(pos, start.min(end), proto::STATE_HOLE | proto::STATE_ZERO);
            let flags = match extent.kind {
                MapKind::Unwritten => proto::STATE_ZERO,
                MapKind::Hole => proto::STATE_HOLE | proto::STATE_ZERO,
                MapKind::Delalloc | MapKind::Written => 0,
            };
            push(start.max(pos), stop.min(end), flags);
            pos = stop.min(end);
        }
        push(pos, end, proto::STATE_HOLE | proto::STATE_ZERO);
        let keep = if only_one { 1 } else { BLOCK_STATUS_DESCRIPTORS_MAX };
        descriptors.truncate(keep);
        Ok(descriptors)
    }

    /// Closes the handles, reporting the first error (a failed writeback).
    pub fn close(self) -> foliofs::Result<()> {
        let flushed = if self.read_only { Ok(()) } else { self.buffered.sync_data() };
        // Every handle is closed, whatever the first error.
        let mut result = flushed;
        for file in [self.direct, self.direct_dsync, self.buffered_dsync, self.buffered] {
            let closed = file.close();
            result = result.and(closed);
        }
        result
    }
}
