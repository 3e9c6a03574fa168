//! The FUSE front end of foliofs: it turns kernel requests into
//! [`foliofs::Volume`] and [`foliofs::File`] calls and their results into
//! replies. Every decision (POSIX rules, errnos, caching, durability) lives in
//! the library; this crate only translates, keeps the table of open handles,
//! and chooses how the kernel's own caches are used.
//!
//! How the kernel's page cache is used: by default every open file gets
//! FOPEN_DIRECT_IO, so the engine's folio cache is the only cache and a
//! buffered write costs one crossing instead of a copy into the kernel's page
//! cache followed by a second one at writeback (measured in
//! `docs/bench/history/2026-11-23-mount-first-figures.md`). Direct writes are marked FOPEN_PARALLEL_DIRECT_WRITES so the
//! kernel does not serialize them per inode, and FUSE_DIRECT_IO_ALLOW_MMAP
//! keeps shared mmap working on such files. `page_cache=kernel` switches to
//! the kernel's page cache for buffered opens instead, kept across opens,
//! so reads of cached pages never reach the daemon; the library's change
//! events tell the kernel which cached pages went stale (`invalidate`).
//! `page_cache=writeback` lets the kernel's cache hold buffered writes too
//! (FUSE_WRITEBACK_CACHE), with the mount's dirty limits relaxed (`bdi`).

mod adapter;
mod attr;
mod bdi;
mod credentials;
mod direct_payload;
mod file_flags;
mod fitrim;
mod going_down;
mod handles;
mod in_flight;
mod inode_files;
mod invalidate;
mod mount_options;
mod mounting;
pub mod transport;
pub mod virtiofs;

pub use adapter::{FolioFs, OpenCounters};
pub use direct_payload::{DirectIoCounters, DirectIoStats};
pub use mount_options::{MountOptions, PageCacheUse, Transport, MOUNT_OPTION_KEYS};
pub use mounting::{bind_if_mounted, remount, RemountWatcher, Unmounter};

use std::path::Path;
use std::sync::Arc;

use foliofs::Volume;

/// A mounted volume: the FUSE session, ready to run.
pub struct Mount {
    session: fuser::Session<FolioFs>,
    volume: Arc<Volume>,
    unmounter: Unmounter,
    watcher: Option<RemountWatcher>,
    transport: transport::LiveTransport,
    direct_io: Arc<DirectIoCounters>,
    opens: Arc<OpenCounters>,
}

impl Mount {
    /// Opens the volume in `image` and mounts it on `mountpoint` as type
    /// `fuse.<subtype>`: with mount(2) when allowed (root), through
    /// fusermount3 otherwise and for auto_unmount. Nothing is served until [`Mount::run`].
    pub fn new(image: &Path, mountpoint: &Path, options: &MountOptions) -> foliofs::Result<Self> {
        let volume = Arc::new(Volume::open(image, &options.volume)?);
        let fs = FolioFs::new(Arc::clone(&volume), options);
        let notifier = fs.notifier_slot();
        let direct_io = fs.direct_io_counters();
        let opens = fs.open_counters();
        let config = options.fuse_config(image);
        let failed =
            |error| foliofs::Error::io(format!("mount on {}", mountpoint.display()), error);
        // auto_unmount needs fusermount3, which stays to unmount after us.
        let own_mount = if options.auto_unmount {
            Err(std::io::Error::from_raw_os_error(libc::EPERM))
        } else {
            mounting::mount_fuse(image, mountpoint, options)
        };
        let (session, unmounter): (fuser::Session<FolioFs>, Unmounter) = match own_mount {
            Ok(device) => {
                let acl = config.acl;
                let session = fuser::Session::from_fd(fs, device, acl, config).inspect_err(|_| {
                    let _ = mounting::detach(mountpoint);
                });
                (session.map_err(failed)?, Unmounter::own(mountpoint))
            }
            // Not root (or auto_unmount): fusermount3 mounts for us, and
            // sets the subtype too.
            Err(error) if error.raw_os_error() == Some(libc::EPERM) => {
                let mut session = fuser::Session::new(fs, mountpoint, &config).map_err(failed)?;
                let unmounter = Unmounter::fuser(session.unmount_callable());
                (session, unmounter)
            }
            Err(error) => return Err(failed(error)),
        };
        let _ = notifier.set(session.notifier());
        let transport = session.transport();
        tracing::info!(
            "{}: requests travel by {}",
            mountpoint.display(),
            transport::describe(&transport)
        );
        if options.page_cache == PageCacheUse::Writeback {
            bdi::relax_dirty_limits(mountpoint);
        }
        let watcher = RemountWatcher::start(mountpoint, Arc::downgrade(&volume));
        Ok(Self { session, volume, unmounter, watcher, transport, direct_io, opens })
    }

    /// The transport INIT settled on (io_uring, or /dev/fuse and why).
    pub fn transport(&self) -> &transport::LiveTransport {
        &self.transport
    }

    /// The mounted volume, for callers that watch it while it is served
    /// (its device counters, for example).
    pub fn volume(&self) -> &Arc<Volume> {
        &self.volume
    }

    /// How direct writes' and reads' data moved between the requests and the
    /// engine (in place or copied).
    pub fn direct_io_counters(&self) -> Arc<DirectIoCounters> {
        Arc::clone(&self.direct_io)
    }

    /// How many OPEN and RELEASE requests the kernel sent.
    pub fn open_counters(&self) -> Arc<OpenCounters> {
        Arc::clone(&self.opens)
    }

    /// Something that unmounts from another thread (a signal handler), which
    /// makes [`Mount::run`] return.
    pub fn unmounter(&mut self) -> Unmounter {
        self.unmounter.clone()
    }

    /// Serves requests until the file system is unmounted, then writes back
    /// and closes the volume, reporting what that finds.
    pub fn run(self) -> foliofs::Result<()> {
        let Self { session, volume, unmounter, watcher, transport: _, direct_io: _, opens: _ } =
            self;
        let served = session.run();
        unmounter.session_ended();
        drop(watcher);
        // The session owned the adapter and dropped it (closing any handle the
        // kernel had not released) when it ended, so this is the last owner.
        let closed = match Arc::try_unwrap(volume) {
            Ok(volume) => volume.close(),
            // A shutdown lost what it did not flush on purpose.
            Err(volume) if volume.is_shut_down() => Ok(()),
            Err(volume) => volume.sync(),
        };
        served.map_err(|error| foliofs::Error::io("serving FUSE requests", error))?;
        closed
    }
}
