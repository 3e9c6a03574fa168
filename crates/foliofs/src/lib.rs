//! foliofs: a crash-safe file storage engine in user space.
//!
//! A file system inside one image file or block device, re-creating the I/O
//! path of the Linux kernel's iomap layer. See `ARCHITECTURE.md` for the map.
//!
//! Layers, each calling only those below it:
//! `vfs` → `buffered` / `direct` → `writeback` → `cache`, `iomap` → `meta` →
//! `journal` → `dev`, with `alloc`,
//! `extent` and `format` as pure building blocks.

pub mod alloc;
pub mod buffered;
pub mod cache;
pub mod completion;
pub mod dev;
pub mod direct;
pub mod engine;
pub mod error;
pub mod extent;
pub mod format;
pub mod fsck;
pub mod io_lock;
pub mod iomap;
pub mod journal;
pub mod layout;
pub mod meta;
pub mod options;
mod passthru;
pub mod space;
pub mod vfs;
pub mod writeback;

pub use error::{Error, Result};
pub use format::{InodeKind, Timestamp};
pub use options::VolumeOptions;
pub use vfs::{
    Attr, ChangeEvent, ChangeObserver, Dir, DirEntry, File, OpenFlags, Owner, RenameFlags, SetAttr,
    StatFs, TimeSet, Volume,
};
pub use vfs::{NamespaceEvent, NamespaceObserver};
pub use vfs::{Privilege, XattrFlags};
