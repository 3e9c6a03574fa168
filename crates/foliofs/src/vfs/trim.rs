//! FITRIM (`fstrim`) on a volume: see [`crate::trim`].

use crate::error::Result;
use crate::trim::{self, TrimRange};

use super::volume::Volume;

impl Volume {
    /// Discards the free space in `range` on the device, as FITRIM does
    /// (`fstrim`, for thin disk images and SSDs); returns the bytes
    /// discarded. Safe alongside any other operation and across crashes:
    /// only space whose freeing is durable is discarded, and none of it can
    /// be allocated until its discard completed.
    pub fn trim(&self, range: TrimRange) -> Result<u64> {
        let shared = &self.shared;
        trim::trim_free_space(
            &shared.meta,
            &shared.device,
            shared.block_bytes,
            shared.superblock.volume_bytes(),
            range,
        )
    }
}
