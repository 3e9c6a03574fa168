//! A volume of format 1 or 2 converted in place to format 3, its metadata
//! checkpoint moved from the two slots into a paged index (`foliofs convert`).
//!
//! Why a crash cannot lose the volume: the index's root records go to the
//! first two pages of slot A, and its pages to blocks that were free, while
//! the newest checkpoint sits in slot B (one more checkpoint puts it there
//! if it was in A); the superblock naming format 3 is written last. Until
//! then the volume opens as it was (slot A reads as damaged, slot B is
//! newer anyway, and the index's pages are free space); once a superblock
//! copy names format 3, the index holds everything the old checkpoint did
//! and the log resumes where that checkpoint left it.

use std::path::Path;
use std::sync::Arc;

use crate::dev::Device;
use crate::error::{Error, IoContext, Result};
use crate::format::Superblock;
use crate::layout;
use crate::meta::{LoadLimits, MetaStore};

use super::Volume;
use crate::options::VolumeOptions;

impl Volume {
    /// Converts the volume in the image file or block device at `path`
    /// (closed: no other opener) to format 3; returns its new superblock.
    pub fn convert_path(path: &Path, options: &VolumeOptions) -> Result<Superblock> {
        let device = Device::open(path, &options.dev_options())
            .context(|| format!("open {}", path.display()))?;
        Self::convert_to_metadata_index(Arc::new(device))
    }

    /// Converts the formatted `device` to format 3 (see the module's note).
    pub fn convert_to_metadata_index(device: Arc<Device>) -> Result<Superblock> {
        let old = layout::read_superblock(&device)?;
        if old.metadata_in_index() {
            return Err(Error::invalid(format!(
                "the volume is of format {}: its metadata is in an index already",
                old.version
            )));
        }
        let new =
            old.clone().with_metadata_index().map_err(|error| Error::invalid(error.to_string()))?;
        debug_assert_eq!(new.checkpoint_slots[0].start_block, old.checkpoint_slots[0].start_block);
        let limits = LoadLimits {
            block_bytes: old.block_bytes_u64(),
            size_max: crate::engine::FILE_BYTES_MAX,
        };
        let (meta, _) = MetaStore::load(Arc::clone(&device), &old, false, limits)?;
        // Each checkpoint also frees the log before it: the index starts
        // from a clean cut, and slot A is free once the newest is in B.
        meta.checkpoint()?;
        if meta.journal().checkpoint_generation() % 2 == 0 {
            meta.checkpoint()?;
        }
        meta.write_index(&new)?;
        drop(meta);
        layout::write_superblocks(&device, &new)?;
        Ok(new)
    }
}
