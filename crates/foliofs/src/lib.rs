//! foliofs: a crash-safe file system engine in user space.
//!
//! A file system inside one image file or block device, re-creating the I/O
//! path of the Linux kernel's iomap layer. Open a [`Volume`], then work with
//! it as with `std::fs`: paths from the volume's root, [`OpenOptions`],
//! [`File`]s that read and write (positionally or through `std::io`),
//! [`Metadata`], and durability through [`File::sync_all`].
//!
//! ```
//! use std::io::{Read, Write};
//! use foliofs::{MkfsOptions, OpenOptions, Volume, VolumeOptions};
//!
//! # fn main() -> foliofs::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let image = dir.path().join("vol.img");
//! let options = VolumeOptions::default();
//! Volume::mkfs_path(&image, Some(64 << 20), &MkfsOptions::default(), &options)?;
//! let volume = Volume::open(&image, &options)?;
//!
//! volume.create_dir_all("/notes/2026")?;
//! let mut file = OpenOptions::new().write(true).create(true).open(&volume, "/notes/2026/a.txt")?;
//! file.write_all(b"hello")?;
//! file.sync_all()?; // durable when this returns
//!
//! let mut text = String::new();
//! OpenOptions::new().read(true).open(&volume, "/notes/2026/a.txt")?.read_to_string(&mut text)?;
//! assert_eq!(text, "hello");
//! assert_eq!(volume.metadata("/notes/2026/a.txt")?.len(), 5);
//! volume.close()
//! # }
//! ```
//!
//! The path calls are spelled as `std::fs` spells them (`create_dir_all`,
//! `read_dir`, `rename`, `remove_file`, `read_link`, `File::sync_all`, ...).
//! Files opened `direct` take asynchronous requests
//! ([`File::read_at_async`], [`File::write_at_async`]) that any executor,
//! or [`block_on`], drives.
//!
//! `ARCHITECTURE.md` maps the layers below; they are private, except what
//! the workspace's own tools use behind the `internals` feature (devices
//! and fault injection, the on-disk format, and the inode-level calls of
//! `Volume::inodes` that the FUSE and NBD front ends speak in), which is
//! not a stable interface.

#![warn(missing_docs)]
// unsafe lives at the OS boundary only: `dev` (syscalls, io_uring, aligned
// memory) and the cache's slab mappings (`cache/pool.rs`).
#![deny(unsafe_code)]
// Without `internals`, what only the workspace's tools use (fault devices,
// codec entry points, counters) is unused; the workspace's own build, with
// the feature, still reports dead code.
#![cfg_attr(not(feature = "internals"), allow(dead_code, unused_imports))]

// Modules the workspace's front ends, tools and tests reach into (devices
// and fault injection, the on-disk encoding, the completion machinery):
// public only with the `internals` feature, which those crates turn on,
// so an embedder sees the curated surface below and nothing else.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod completion;
#[cfg(not(feature = "internals"))]
mod completion;
#[cfg(feature = "internals")]
#[doc(hidden)]
#[allow(unsafe_code)]
pub mod dev;
#[cfg(not(feature = "internals"))]
#[allow(unsafe_code)]
mod dev;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod direct;
#[cfg(not(feature = "internals"))]
mod direct;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod format;
#[cfg(not(feature = "internals"))]
mod format;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod fsck;
#[cfg(not(feature = "internals"))]
mod fsck;

#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod index;
#[cfg(not(feature = "internals"))]
mod index;

// The public modules: errors and the options.
pub mod error;
pub mod options;

// The file-system API: its names are re-exported at the root below, and
// the module's own path is for the workspace's tools.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod vfs;
#[cfg(not(feature = "internals"))]
mod vfs;

// The layers below the API, private to the library.
mod alloc;
mod buffered;
mod cache;
mod engine;
mod extent;
mod io_lock;
mod iomap;
mod journal;
mod layout;
mod lock_order;
mod meta;
mod passthru;
mod refcount;
mod reflink;
mod space;
mod trim;
mod writeback;

// The curated surface: what an embedder uses.
pub use completion::block_on;
pub use dev::{AlignedBuf, EngineKind, FuaMode};
pub use direct::{DirectFuture, DirectResult};
pub use error::{Error, Result};
pub use format::{InodeKind, Timestamp, ROOT_INO};
pub use options::VolumeOptions;
pub use space::FallocateMode;
pub use trim::TrimRange;
pub use vfs::{
    Access, Attr, Credentials, DirEntry, File, FileType, Frozen, Metadata, MkfsOptions, OpenFlags,
    OpenOptions, Owner, Permissions, ReadDir, ShutdownMode, StatFs, Volume,
};

// The inode-level types the FUSE and NBD front ends use, for the
// workspace's tools only.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use iomap::MapKind;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use vfs::{
    ChangeEvent, ChangeObserver, Dir, Inodes, NamespaceEvent, NamespaceObserver, Privilege,
    RenameFlags, SetAttr, TimeSet, XattrFlags,
};

/// The README's library example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
