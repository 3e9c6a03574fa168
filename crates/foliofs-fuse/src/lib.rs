//! The FUSE front end of foliofs: it turns kernel requests into
//! [`foliofs::Volume`] and [`foliofs::File`] calls and their results into
//! replies. Every decision (POSIX rules, errnos, caching, durability) lives in
//! the library; this crate only translates, keeps the table of open handles,
//! and chooses how the kernel's own caches are used.
//!
//! How the kernel's page cache is used: by default every open file gets
//! FOPEN_DIRECT_IO, so the engine's folio cache is the only cache and a
//! buffered write costs one crossing instead of a copy into the kernel's page
//! cache followed by a second one at writeback (`docs/BENCHMARKS.md` has the
//! measurement). Direct writes are marked FOPEN_PARALLEL_DIRECT_WRITES so the
//! kernel does not serialize them per inode, and FUSE_DIRECT_IO_ALLOW_MMAP
//! keeps shared mmap working on such files. `page_cache=kernel` switches to
//! the kernel's page cache for buffered opens instead.

mod adapter;
mod attr;
mod handles;
mod mount_options;

pub use adapter::FolioFs;
pub use mount_options::{MountOptions, PageCacheUse, MOUNT_OPTION_KEYS};

use std::path::Path;
use std::sync::Arc;

use foliofs::Volume;

/// A mounted volume: the FUSE session, ready to run.
pub struct Mount {
    session: fuser::Session<FolioFs>,
    volume: Arc<Volume>,
}

impl Mount {
    /// Opens the volume in `image` and mounts it on `mountpoint`. Nothing is
    /// served until [`Mount::run`].
    pub fn new(image: &Path, mountpoint: &Path, options: &MountOptions) -> foliofs::Result<Self> {
        let volume = Arc::new(Volume::open(image, &options.volume)?);
        let fs = FolioFs::new(Arc::clone(&volume), options);
        let notifier = fs.notifier_slot();
        let config = options.fuse_config(image);
        let session = fuser::Session::new(fs, mountpoint, &config).map_err(|error| {
            foliofs::Error::io(format!("mount on {}", mountpoint.display()), error)
        })?;
        let _ = notifier.set(session.notifier());
        Ok(Self { session, volume })
    }

    /// Something that unmounts from another thread (a signal handler), which
    /// makes [`Mount::run`] return.
    pub fn unmounter(&mut self) -> fuser::SessionUnmounter {
        self.session.unmount_callable()
    }

    /// Serves requests until the file system is unmounted, then writes back
    /// and closes the volume, reporting what that finds.
    pub fn run(self) -> foliofs::Result<()> {
        let Self { session, volume } = self;
        let served = session.run();
        // The session owned the adapter and dropped it (closing any handle the
        // kernel had not released) when it ended, so this is the last owner.
        let closed = match Arc::try_unwrap(volume) {
            Ok(volume) => volume.close(),
            Err(volume) => volume.sync(),
        };
        served.map_err(|error| foliofs::Error::io("serving FUSE requests", error))?;
        closed
    }
}
