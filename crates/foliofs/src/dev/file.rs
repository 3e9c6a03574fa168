//! TEMPORARY minimal backend until the real one lands.
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::{run_blocking, DevCallback, DevOptions, DevRequest, RawDev};

pub(crate) struct FileDev {
    file: File,
    size_bytes: u64,
}

impl FileDev {
    pub(crate) fn open(path: &Path, options: &DevOptions) -> io::Result<Self> {
        let mut open = std::fs::OpenOptions::new();
        open.read(true).write(!options.read_only);
        if options.direct {
            open.custom_flags(libc::O_DIRECT);
        }
        let file = open.open(path)?;
        let size_bytes = file.metadata()?.len();
        Ok(Self { file, size_bytes })
    }
}

impl RawDev for FileDev {
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        let mut at = offset;
        for buffer in buffers {
            self.file.read_exact_at(buffer, at)?;
            at += buffer.len() as u64;
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        let mut at = offset;
        for buffer in buffers {
            self.file.write_all_at(buffer, at)?;
            at += buffer.len() as u64;
        }
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn submit(&self, request: DevRequest, done: DevCallback) {
        done(run_blocking(self, request))
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn logical_block_bytes(&self) -> u32 {
        512
    }
}
