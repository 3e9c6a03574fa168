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
//! Beside the path-based calls, [`Volume`] has the inode-level calls a FUSE
//! front end needs (`lookup`, `create`, `open_file` by inode number, the
//! root being [`ROOT_INO`]), and files opened `direct` take asynchronous
//! requests ([`File::read_at_async`], [`File::write_at_async`]) that any
//! executor, or [`block_on`], drives.
//!
//! `ARCHITECTURE.md` maps the layers below. Their modules are public for
//! the front ends and tests of this workspace but hidden from these docs:
//! they are not a stable interface.

#![warn(missing_docs)]
// unsafe lives at the OS boundary only: `dev` (syscalls, io_uring, aligned
// memory) and the cache's slab mappings (`cache/pool.rs`).
#![deny(unsafe_code)]

#[doc(hidden)]
pub mod alloc;
#[doc(hidden)]
pub mod buffered;
#[doc(hidden)]
pub mod cache;
#[doc(hidden)]
pub mod completion;
#[doc(hidden)]
#[allow(unsafe_code)]
pub mod dev;
#[doc(hidden)]
pub mod direct;
#[doc(hidden)]
pub mod engine;
pub mod error;
#[doc(hidden)]
pub mod extent;
#[doc(hidden)]
pub mod format;
#[doc(hidden)]
pub mod fsck;
#[doc(hidden)]
pub mod io_lock;
#[doc(hidden)]
pub mod iomap;
#[doc(hidden)]
pub mod journal;
#[doc(hidden)]
pub mod layout;
#[doc(hidden)]
pub mod meta;
#[doc(hidden)]
pub mod options;
mod passthru;
#[doc(hidden)]
pub mod space;
#[doc(hidden)]
pub mod trim;
pub mod vfs;
#[doc(hidden)]
pub mod writeback;

// The curated surface: what an embedder uses.
pub use completion::block_on;
pub use dev::AlignedBuf;
pub use direct::{DirectFuture, DirectResult};
pub use error::{Error, Result};
pub use format::{InodeKind, Timestamp, ROOT_INO};
pub use options::VolumeOptions;
pub use space::FallocateMode;
pub use trim::TrimRange;
pub use vfs::{
    Access, Credentials, DirEntry, File, FileType, Metadata, MkfsOptions, OpenOptions, Permissions,
    ReadDir, ShutdownMode, Volume,
};

// The inode-level types the FUSE front end uses.
#[doc(hidden)]
pub use vfs::{
    Attr, ChangeEvent, ChangeObserver, Dir, NamespaceEvent, NamespaceObserver, OpenFlags, Owner,
    Privilege, RenameFlags, SetAttr, StatFs, TimeSet, XattrFlags,
};

/// The README's library example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
