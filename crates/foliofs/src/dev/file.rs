//! The `sync` engine: pread/pwritev2 in the calling thread. It also opens
//! and sizes the image for the other engines.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::{run_blocking, sys, DevCallback, DevOptions, DevRequest, RawDev};

/// The smallest logical block we ever use, whatever the device reports.
const LOGICAL_BLOCK_BYTES_MIN: u32 = 512;

pub(crate) struct FileDev {
    file: File,
    size_bytes: u64,
    logical_block_bytes: u32,
}

impl FileDev {
    pub(crate) fn open(path: &Path, options: &DevOptions) -> io::Result<Self> {
        let mut open = OpenOptions::new();
        open.read(true).write(!options.read_only).custom_flags(libc::O_CLOEXEC);
        if options.direct {
            open.custom_flags(libc::O_CLOEXEC | libc::O_DIRECT);
        }
        let file = open.open(path).map_err(|error| {
            if options.direct && error.raw_os_error() == Some(libc::EINVAL) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: the backing file system does not support O_DIRECT; \
                         -o direct=off opens it without",
                        path.display()
                    ),
                )
            } else {
                error
            }
        })?;
        let metadata = file.metadata()?;
        let (size_bytes, logical_block_bytes) = if metadata.file_type().is_block_device() {
            (sys::block_device_bytes(file.as_fd())?, sys::block_device_sector_bytes(file.as_fd())?)
        } else if metadata.is_file() {
            let align =
                if options.direct { sys::direct_io_offset_align(file.as_fd()) } else { None };
            (metadata.len(), align.unwrap_or(LOGICAL_BLOCK_BYTES_MIN))
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is neither a regular file nor a block device", path.display()),
            ));
        };
        let logical_block_bytes = logical_block_bytes.max(LOGICAL_BLOCK_BYTES_MIN);
        if !logical_block_bytes.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: logical block size {logical_block_bytes} is not a power of two",
                    path.display()
                ),
            ));
        }
        Ok(Self { file, size_bytes, logical_block_bytes })
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }
}

impl RawDev for FileDev {
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        sys::read_exact_vectored(self.file.as_fd(), buffers, offset)
    }

    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        let flags = if fua { libc::RWF_DSYNC } else { 0 };
        let mut buffers: Vec<IoSlice<'_>> = buffers.to_vec();
        sys::write_all_vectored(self.file.as_fd(), &mut buffers, offset, flags)
    }

    fn flush(&self) -> io::Result<()> {
        sys::fdatasync(self.file.as_fd())
    }

    fn submit(&self, request: DevRequest, done: DevCallback) {
        done(run_blocking(self, request))
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn logical_block_bytes(&self) -> u32 {
        self.logical_block_bytes
    }
}
