//! The paged metadata index: copy-on-write B+trees of byte keys and values
//! on the volume's device, read through a cache with a memory budget and
//! committed by writing only the pages changed since the last commit.
//!
//! A tree stands in a region of a device (two root slots, then pages), or
//! keeps only its root slots there and takes pages from its owner as it
//! grows: the metadata store of a volume of format 3 keeps its checkpoint
//! in one (the `meta` module, `docs/metadata.md`).

mod alloc;
mod cache;
mod commit;
mod leaf;
pub mod page;
mod root;
mod tree;

#[cfg(test)]
mod tests;

/// Maps keyed by node number or page address: the keys are already well
/// spread (or consecutive), so one multiply (Fibonacci hashing) does, where
/// the default SipHash took a tenth of an insert's time.
pub(crate) type NumberMap<V> =
    std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<NumberHasher>>;

#[derive(Default)]
pub(crate) struct NumberHasher(u64);

impl std::hash::Hasher for NumberHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8 | u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, number: u64) {
        self.0 = number.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub use commit::{SealedCommit, WrittenCommit};
pub use page::{ENTRY_BYTES_MAX, KEY_BYTES_MAX, PAGE_BYTES};
pub use root::ATTACHED_BYTES;
pub use tree::{CommitReport, IndexOptions, IndexStats, Tree};
