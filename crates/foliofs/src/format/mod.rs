//! On-disk structures: pure encode/decode, no I/O.
//!
//! Layout of a volume, in file-system blocks (see `docs/format.md`):
//!
//! ```text
//! | super A | super B | journal ... | checkpoint slot A | checkpoint slot B | data ... |
//! ```
//!
//! Every structure starts with a magic and a version and ends (or is covered)
//! by a crc32c. Decoding returns [`FormatError`] on any malformed input and
//! never panics; the fuzz/proptest targets in `tests/` hold it to that.

pub mod checkpoint;
pub mod codec;
pub mod journal;
pub mod record;
pub mod superblock;

pub use checkpoint::CheckpointHeader;
pub use journal::GroupHeader;
pub use record::{
    ExtentState, InodeAttrs, InodeKind, Record, Timestamp, INODE_FLAGS_KNOWN, INODE_FLAG_APPEND,
    INODE_FLAG_IMMUTABLE, INODE_FLAG_NOATIME, INODE_FLAG_NODUMP,
};
pub use superblock::{Region, Superblock};

/// The volume format mkfs writes (the superblock's version): 2 adds
/// shared extents (`Record::SharedSet`, clones). This build reads 1 too;
/// a volume of version 1 takes no clones, so an older build still opens it.
pub const FORMAT_VERSION: u32 = 2;
/// Format 3 keeps the metadata's checkpoint in a paged index
/// (the `index` module) that takes pages from the data region as it grows,
/// where 2 keeps it in two fixed slots; mkfs makes it when asked
/// (`MkfsOptions::metadata_index`). The superblock's two slots are then
/// the index's two root records, a page each.
pub const FORMAT_VERSION_INDEX: u32 = 3;
/// The oldest volume format this build opens.
pub const FORMAT_VERSION_OLDEST: u32 = 1;
/// The checkpoint header's own version: its layout has not changed since 1,
/// so it stays 1 on volumes of every format.
pub const CHECKPOINT_HEADER_VERSION: u32 = 1;
/// Smallest and largest file-system block size accepted by mkfs.
pub const BLOCK_BYTES_MIN: u32 = 1024;
pub const BLOCK_BYTES_MAX: u32 = 65536;
/// Smallest device sector; journal groups and checkpoint headers are padded to
/// the volume's sector size so each can be written with O_DIRECT.
pub const SECTOR_BYTES_MIN: u32 = 512;
/// Encoded size of the superblock and of the checkpoint header: one 512 B
/// sector, so a single write of either is atomic on any device we support.
pub const HEADER_BYTES: usize = 512;
/// Longest directory entry name, as on Linux.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symlink target we store (PATH_MAX - 1).
pub const SYMLINK_BYTES_MAX: usize = 4095;
/// Longest extended attribute name, prefix included (XATTR_NAME_MAX).
pub const XATTR_NAME_BYTES_MAX: usize = 255;
/// Largest extended attribute value (XATTR_SIZE_MAX).
pub const XATTR_VALUE_BYTES_MAX: usize = 65536;
/// Most bytes listxattr returns (XATTR_LIST_MAX): the names of one inode's
/// attributes, each with its NUL, never take more.
pub const XATTR_LIST_BYTES_MAX: usize = 65536;
/// The root directory's inode number.
pub const ROOT_INO: u64 = 1;

const _: () = assert!(BLOCK_BYTES_MIN.is_power_of_two() && BLOCK_BYTES_MAX.is_power_of_two());
const _: () = assert!(SECTOR_BYTES_MIN as usize == HEADER_BYTES);
const _: () = assert!(BLOCK_BYTES_MIN >= SECTOR_BYTES_MIN);

/// A decode failure. Each variant names what was wrong so `fsck` and `open`
/// can print it as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: bad magic (not a foliofs {what})")]
    BadMagic { what: &'static str },
    #[error(
        "{what}: unsupported format version {found} (this build reads versions {oldest} to \
         {newest}; a newer build made it)"
    )]
    UnsupportedVersion { what: &'static str, found: u32, oldest: u32, newest: u32 },
    #[error("{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum { what: &'static str, stored: u32, computed: u32 },
    #[error("{what}: truncated")]
    Truncated { what: &'static str },
    #[error("{what}: invalid field {field}: {detail}")]
    InvalidField { what: &'static str, field: &'static str, detail: String },
}

impl FormatError {
    pub fn invalid(what: &'static str, field: &'static str, detail: impl Into<String>) -> Self {
        Self::InvalidField { what, field, detail: detail.into() }
    }
}

/// Rounds `value` up to a multiple of `align`, which must be a power of two.
pub fn align_up(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (value + align - 1) & !(align - 1)
}
