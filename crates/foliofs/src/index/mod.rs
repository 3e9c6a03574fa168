//! The paged metadata index: copy-on-write B+trees of byte keys and values
//! on the volume's device, read through a cache with a memory budget and
//! committed by writing only the pages changed since the last commit.
//!
//! It is the first step of moving metadata out of memory (issue "Metadata
//! on disk"; `docs/metadata.md`, "The paged index"): a tree standing alone
//! in a region of a device, with its own root record and free list. The
//! metadata store does not use it yet.

mod alloc;
mod cache;
mod commit;
pub mod page;
mod root;
mod tree;

#[cfg(test)]
mod tests;

pub use commit::{SealedCommit, WrittenCommit};
pub use page::{ENTRY_BYTES_MAX, KEY_BYTES_MAX, PAGE_BYTES};
pub use tree::{CommitReport, IndexOptions, IndexStats, Tree};
