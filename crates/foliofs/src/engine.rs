//! What the data paths share: the device, the metadata store, the folio
//! cache, the block size and the policies. Held in an `Arc` so asynchronous
//! completions and the flusher can finish their work (conversions, size
//! updates) after the caller has moved on.

use std::sync::Arc;

use crate::cache::PageCache;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::Timestamp;
use crate::meta::MetaStore;
use crate::options::VolumeOptions;

/// Largest file size, as the kernel's MAX_LFS_FILESIZE on 64-bit: offsets
/// past it are EFBIG, and byte arithmetic on file offsets never overflows.
pub const FILE_BYTES_MAX: u64 = i64::MAX as u64;

pub struct Engine {
    pub device: Arc<Device>,
    pub meta: MetaStore,
    pub cache: PageCache,
    pub block_bytes: u64,
    pub options: VolumeOptions,
}

impl Engine {
    /// The size callers see.
    pub fn size_of(&self, ino: u64) -> Result<u64> {
        let state = self.meta.read();
        let inode =
            state.inode(ino).ok_or_else(|| Error::BadHandle(format!("inode {ino} is gone")))?;
        Ok(inode.size)
    }

    /// Refuses every operation once the volume was shut down, those the
    /// cache and the metadata in memory could still answer included.
    pub fn check_running(&self) -> Result<()> {
        if self.device.is_shut_down() {
            return Err(Error::ShutDown);
        }
        Ok(())
    }

    /// A write changed data only: advance the file's times in memory.
    pub fn touch_times(&self, ino: u64) {
        let now = Timestamp::now();
        self.meta.update_memory(|state| state.touch_times(ino, now));
    }

    pub fn align_down(&self, value: u64) -> u64 {
        value - value % self.block_bytes
    }

    pub fn align_up(&self, value: u64) -> u64 {
        value.div_ceil(self.block_bytes) * self.block_bytes
    }
}
