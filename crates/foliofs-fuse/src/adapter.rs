//! `fuser::Filesystem` over a [`Volume`]: each handler decodes the request,
//! makes one library call and encodes its result. The only state here is the
//! handle table and a per-thread aligned buffer for direct I/O.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use foliofs::FallocateMode;
use foliofs::{
    Access, Attr, Error, File, OpenFlags, OpenOptions, Privilege, RenameFlags, SetAttr,
    ShutdownMode, TimeSet, Volume, XattrFlags,
};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, Notifier, ReplyAttr, ReplyCopied, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::attr::{errno, file_attr, file_type, timestamp};
use crate::credentials::{
    caller_ids, caller_privilege, owner, CallerStatus, CAP_FSETID, CAP_LINUX_IMMUTABLE,
    CAP_SYS_ADMIN, SET_ID_BITS,
};
use crate::direct_payload::DirectIoCounters;
use crate::file_flags::{self, FlagsRequest};
use crate::fitrim;
use crate::going_down;
use crate::handles::{walk_offset, DirListing, DirSnapshots, Handle, Handles};
use crate::in_flight;
use crate::inode_files::{self, InodeFiles};
use crate::invalidate::{self, Invalidator};
use crate::mount_options::{MountOptions, PageCacheUse};

/// The most one FUSE_COPY_FILE_RANGE reply can count (its size is 32
/// bits), in whole 64 KiB so that a clone of large blocks is never cut
/// short. FUSE_COPY_FILE_RANGE_64 has no such cap.
const COPY_FILE_RANGE_BYTES_MAX: u64 = (u32::MAX as u64) & !0xFFFF;

/// Capabilities asked of the kernel at init, each only where it offers it.
const WANTED_CAPABILITIES: &[InitFlags] = &[
    // Shared mmap on FOPEN_DIRECT_IO files (kernel 6.6+).
    InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
    // Asynchronous direct I/O stays asynchronous: io_uring and libaio
    // requests reach the daemon concurrently, not one at a time.
    InitFlags::FUSE_ASYNC_DIO,
    // Lookups and readdirs in one directory run in parallel.
    InitFlags::FUSE_PARALLEL_DIROPS,
    InitFlags::FUSE_CACHE_SYMLINKS,
    // A listing carries each entry's attributes, so `ls -l` and `find`
    // need no lookup per name; the kernel asks for it only where lookups
    // followed the last listing of the directory (AUTO).
    InitFlags::FUSE_DO_READDIRPLUS,
    InitFlags::FUSE_READDIRPLUS_AUTO,
    // File handles outlive the kernel's inode cache: it looks up "." (and
    // "..") by inode number, so open_by_handle_at and NFS re-export work.
    InitFlags::FUSE_EXPORT_SUPPORT,
];

thread_local! {
    /// Buffered reads are copied out of the engine's cache into this buffer
    /// and from it into the reply: reused by every read the thread serves,
    /// so a read allocates nothing.
    static READ_STAGING: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_staging<R>(length: usize, work: impl FnOnce(&mut [u8]) -> R) -> R {
    READ_STAGING.with(|staging| {
        let mut staging = staging.borrow_mut();
        if staging.len() < length {
            staging.resize(length.next_power_of_two(), 0);
        }
        work(&mut staging[..length])
    })
}

pub struct FolioFs {
    volume: Arc<Volume>,
    handles: Handles,
    /// Set once the session exists (it needs the file system first).
    notifier: Arc<OnceLock<Notifier>>,
    page_cache: PageCacheUse,
    /// Tells the kernel which of its cached pages and attributes went stale.
    invalidator: Arc<Invalidator>,
    ttl: Duration,
    max_write_bytes: u32,
    max_background: u16,
    /// FUSE_HANDLE_KILLPRIV_V2 is on (`setattr`).
    kills_privileges: bool,
    /// The kernel enforces POSIX ACLs (FUSE_POSIX_ACL); it needs the
    /// kernel's permission checks, so only with default_permissions.
    posix_acl: bool,
    /// FUSE_ALLOW_IDMAP: idmapped mounts of this mount (the kernel allows
    /// them only with default_permissions).
    allow_idmap: bool,
    direct_io: Arc<DirectIoCounters>,
    /// FUSE no-open: OPEN is answered ENOSYS, and I/O is served by inode
    /// through `inode_files` (see that module).
    zero_message_opens: bool,
    /// FUSE no-opendir: OPENDIR is answered ENOSYS, and listings are served
    /// by inode. In every `page_cache` mode with `opens=kernel`: a listing
    /// is metadata, which the kernel caches in every mode.
    zero_message_opendirs: bool,
    inode_files: InodeFiles,
    /// Directory walks without a handle (zero-message opendirs).
    dir_snapshots: DirSnapshots,
    opens: Arc<OpenCounters>,
}

/// How many OPEN and RELEASE requests reached the daemon: with zero-message
/// opens, one OPEN (answered ENOSYS) for the life of the mount.
#[derive(Debug, Default)]
pub struct OpenCounters {
    opens: std::sync::atomic::AtomicU64,
    releases: std::sync::atomic::AtomicU64,
    opendirs: std::sync::atomic::AtomicU64,
}

impl OpenCounters {
    /// OPEN requests received.
    pub fn opens(&self) -> u64 {
        self.opens.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// RELEASE requests received.
    pub fn releases(&self) -> u64 {
        self.releases.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// OPENDIR requests received.
    pub fn opendirs(&self) -> u64 {
        self.opendirs.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn count(counter: &std::sync::atomic::AtomicU64) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl FolioFs {
    pub fn new(volume: Arc<Volume>, options: &MountOptions) -> Self {
        let notifier = Arc::new(OnceLock::new());
        // With FOPEN_DIRECT_IO everywhere the kernel caches pages only for
        // mmap, and its direct I/O path keeps those coherent with the
        // writes it sends: only a library user's changes need telling.
        let served_changes = options.page_cache != PageCacheUse::Engine;
        let invalidator = Invalidator::start(Arc::clone(&notifier), served_changes);
        // Per-open FOPEN flags are what page_cache=engine is made of.
        let zero_message_opens = options.zero_message_opens && served_changes;
        if zero_message_opens {
            invalidator.assume_every_inode_cached();
        }
        volume.set_change_observer(Some(invalidator.observer()));
        volume.set_namespace_observer(Some(invalidator.namespace_observer()));
        Self {
            volume,
            handles: Handles::new(),
            notifier,
            page_cache: options.page_cache,
            invalidator,
            ttl: options.attr_timeout,
            max_write_bytes: options.max_write_bytes,
            max_background: options.max_background,
            posix_acl: options.default_permissions,
            allow_idmap: options.default_permissions,
            kills_privileges: false,
            direct_io: Arc::default(),
            zero_message_opens,
            zero_message_opendirs: options.zero_message_opens,
            inode_files: InodeFiles::new(),
            dir_snapshots: DirSnapshots::new(),
            opens: Arc::default(),
        }
    }

    /// Where OPEN and RELEASE requests are counted.
    pub(crate) fn open_counters(&self) -> Arc<OpenCounters> {
        Arc::clone(&self.opens)
    }

    /// Where the payloads of direct writes are counted.
    pub(crate) fn direct_io_counters(&self) -> Arc<DirectIoCounters> {
        Arc::clone(&self.direct_io)
    }

    /// Where [`crate::Mount`] puts the session's notifier.
    pub(crate) fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        Arc::clone(&self.notifier)
    }

    /// Replies to an `operation` that makes a node with its entry or errno.
    fn reply_entry(&self, operation: &str, reply: ReplyEntry, result: foliofs::Result<Attr>) {
        match result {
            Ok(attr) => {
                self.handed_to_kernel(&attr);
                reply.entry(&self.ttl, &file_attr(&attr), Generation(0))
            }
            Err(error) => reply.error(self.failed(operation, &error)),
        }
    }

    /// A reply is about to hand the kernel an entry of `attr`'s inode,
    /// which it counts until FORGET: a removed directory (and, with
    /// zero-message opens, an inode's files) stays open until then. Other
    /// inodes are not counted, so the table stays the size of the
    /// directories the kernel knows.
    fn handed_to_kernel(&self, attr: &Attr) {
        if self.zero_message_opens || attr.kind == foliofs::InodeKind::Dir {
            self.inode_files.looked_up(attr.ino);
        }
    }

    /// The errno for `error`; faults of the volume (not of the caller's
    /// request) are logged, since the caller sees only a number.
    fn failed(&self, operation: &str, error: &Error) -> Errno {
        failed(operation, error)
    }

    /// FS_IOC_SHUTDOWN: CAP_SYS_ADMIN only, as XFS and ext4 ask; every
    /// valid flag shuts down as `ShutdownMode::Sync` (see `going_down`).
    fn shut_down(&self, req: &Request, flags_address: u64, reply: fuser::ReplyIoctl) {
        if !CallerStatus::of(req).has_capability(CAP_SYS_ADMIN) {
            return reply.error(Errno::EPERM);
        }
        match going_down::requested_mode(req.pid(), flags_address) {
            Ok(asked) => tracing::info!("shutdown asked ({asked:?}): flushing everything first"),
            Err(errno) => return reply.error(Errno::from_i32(errno)),
        }
        match self.volume.shutdown(ShutdownMode::Sync) {
            Ok(()) => reply.ioctl(0, &[]),
            Err(error) => reply.error(self.failed("shutdown", &error)),
        }
    }

    /// FITRIM (`fstrim`): CAP_SYS_ADMIN only, as ext4 and XFS ask; the
    /// reply's range says how many bytes were discarded.
    fn trim(&self, req: &Request, in_data: &[u8], reply: fuser::ReplyIoctl) {
        if !CallerStatus::of(req).has_capability(CAP_SYS_ADMIN) {
            return reply.error(Errno::EPERM);
        }
        let range = match fitrim::decode(in_data) {
            Ok(range) => range,
            Err(errno) => return reply.error(Errno::from_i32(errno)),
        };
        match self.volume.trim(range) {
            Ok(trimmed_bytes) => reply.ioctl(0, &fitrim::encode(range, trimmed_bytes)),
            Err(error) => reply.error(self.failed("trim", &error)),
        }
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, Errno> {
        self.handles.file(fh.0).ok_or(Errno::EBADF)
    }

    /// The file a request on `ino` is served through: its handle's, or
    /// with zero-message opens (handle 0) the inode's file for `access`.
    fn served_file(
        &self,
        operation: &str,
        ino: INodeNo,
        fh: FileHandle,
        access: Option<inode_files::Access>,
    ) -> Result<Arc<File>, Errno> {
        if fh.0 != 0 || !self.zero_message_opens {
            return self.file(fh);
        }
        let drop_behind = self.page_cache != PageCacheUse::Engine;
        let file = match access {
            Some(access) => self.inode_files.file(&self.volume, ino.0, access, drop_behind),
            None => self.inode_files.any(&self.volume, ino.0, drop_behind),
        };
        file.map_err(|error| self.failed(operation, &error))
    }

    /// Before an unlink, an rmdir or a rename over an existing name. A
    /// directory may be a process's working directory, which the kernel
    /// holds without an open (and, with zero-message opens, a regular
    /// file may be held open with its last name gone): the kernel tells
    /// nothing until it forgets the inode, and stat or a path walk from it
    /// must find it there meanwhile (nlink 0, as on ext4).
    fn keep_if_last_name(&self, parent: INodeNo, name: &OsStr) {
        let Ok(attr) = self.volume.inodes().lookup(parent.0, name_bytes(name)) else { return };
        if attr.kind == foliofs::InodeKind::Dir {
            if let Err(error) = self.inode_files.keep_dir_while_known(&self.volume, attr.ino) {
                tracing::debug!("keeping directory {} for the kernel: {error}", attr.ino);
            }
        } else if self.zero_message_opens
            && attr.kind == foliofs::InodeKind::File
            && attr.nlink <= 1
        {
            if let Err(error) = self.inode_files.keep_while_known(&self.volume, attr.ino) {
                tracing::debug!("keeping inode {} for the kernel: {error}", attr.ino);
            }
        }
    }

    /// After an ENOSPC: waits (up to a second) while another open handle
    /// holds an unlinked file, for the kernel's RELEASE of it; whether a
    /// handle was released since `seen`. The kernel sends RELEASE after
    /// close(2) returns, in the background, so `rm` of a file just written
    /// can reach us first and leave its blocks held until then: space a
    /// program saw freed would otherwise be refused (xfstests
    /// generic/213), as XFS flushes its background inode frees on ENOSPC.
    fn wait_for_orphans_released(&self, fh: FileHandle, seen: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut looked_at = seen;
        while Instant::now() < deadline {
            let holds_orphan = self
                .handles
                .open_file_inos(fh.0)
                .into_iter()
                .any(|ino| self.volume.inodes().getattr(ino).is_ok_and(|attr| attr.nlink == 0));
            if !holds_orphan {
                break;
            }
            // A release since the last look: look again before waiting.
            let released = self.handles.released();
            if released == looked_at && !self.handles.wait_for_release(looked_at, deadline) {
                break;
            }
            looked_at = self.handles.released();
        }
        self.handles.released() != seen
    }

    fn open_flags(&self, flags: i32) -> OpenFlags {
        let mut open = match flags & libc::O_ACCMODE {
            libc::O_WRONLY | libc::O_RDWR => OpenFlags::READ_WRITE,
            _ => OpenFlags::READ,
        };
        // The kernel enforces the access mode; the handle is opened readable
        // whatever it asked because the kernel may read through any handle of
        // the file (mmap faults, partial pages). O_APPEND is left to the
        // kernel too: it passes the end-of-file offset with each write.
        // O_TRUNC arrives as a separate setattr.
        open.direct = flags & libc::O_DIRECT != 0;
        open.dsync = flags & libc::O_DSYNC != 0;
        // The kernel's page cache keeps what a buffered handle reads and
        // writes (FOPEN_KEEP_CACHE): one copy in memory, not two.
        open.drop_behind = !open.direct && self.page_cache != PageCacheUse::Engine;
        open
    }

    fn fopen_flags(&self, open: OpenFlags) -> FopenFlags {
        if open.direct || self.page_cache == PageCacheUse::Engine {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        } else {
            // Kept coherent by the invalidator, not by dropping it at open.
            FopenFlags::FOPEN_KEEP_CACHE
        }
    }

    /// Before a data change: the kernel asks (FUSE_WRITE_KILL_SUIDGID, set on
    /// direct writes when the caller lacks CAP_FSETID) and the library
    /// applies the rule for the caller's ids.
    /// What a data change takes away first (`Inodes::remove_privileges`):
    /// file capabilities always, set-ID bits when the kernel says the caller
    /// may not keep them (FUSE_WRITE_KILL_SUIDGID).
    fn remove_privileges(
        &self,
        operation: &str,
        req: &Request,
        ino: INodeNo,
        flags: WriteFlags,
    ) -> Result<(), Errno> {
        // The caller's ids decide only which set-ID bits go, so they are
        // looked up (in /proc: three system calls and a dozen allocations)
        // only for a file that has some; the library ignores them otherwise.
        let kill_setid = flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            && self.volume.inodes().getattr(ino.0).is_ok_and(|attr| attr.mode & SET_ID_BITS != 0);
        let caller = if kill_setid { caller_ids(req) } else { owner(req) };
        match self.volume.inodes().remove_privileges(ino.0, caller, kill_setid) {
            // The kernel keeps the old mode cached (a write or fallocate
            // reply carries no attributes, and `stat -c %A` asks for the
            // mode alone): drop its cached attributes.
            Ok(true) => {
                if let Some(notifier) = self.notifier.get() {
                    if let Err(error) = notifier.inval_inode(ino, -1, 0) {
                        tracing::debug!("{operation}: invalidating attributes: {error}");
                    }
                }
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(error) => Err(self.failed(operation, &error)),
        }
    }

    /// What readdir and readdirplus list after "." and "..": the entries a
    /// READDIR at `offset` lists (a fresh snapshot at 0), the directory's parent, and
    /// where the listing's offsets start: with a handle its snapshot, and
    /// with zero-message opens (handle 0) a walk's (see [`DirSnapshots`]).
    fn listing(
        &self,
        operation: &str,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
    ) -> Result<DirPage, Errno> {
        let failed = |error: Error| self.failed(operation, &error);
        if fh.0 == 0 && self.zero_message_opendirs {
            let dir = self.volume.inodes().open_dir(ino.0).map_err(failed)?;
            let listed =
                self.dir_snapshots.entries(&dir, offset).and_then(|(walk, entries, position)| {
                    Ok(DirPage { entries, parent: dir.parent()?, walk, position })
                });
            let closed = dir.close();
            let page = listed.map_err(failed)?;
            closed.map_err(failed)?;
            return Ok(page);
        }
        let listing = self.handles.dir(fh.0).ok_or(Errno::EBADF)?;
        listing
            .entries(offset)
            .and_then(|entries| {
                Ok(DirPage { entries, parent: listing.dir.parent()?, walk: 0, position: offset })
            })
            .map_err(failed)
    }

    /// The handle a create replies with: with zero-message opens none (the
    /// kernel will not release it once it knows), the file served by inode.
    fn create_handle(&self, ino: u64, flags: i32) -> foliofs::Result<(u64, FopenFlags)> {
        if !self.zero_message_opens {
            return self.open_handle(ino, flags);
        }
        let write = self.open_flags(flags).write;
        self.volume.inodes().check_append_only_open(ino, write, flags & libc::O_APPEND != 0)?;
        Ok((0, FopenFlags::FOPEN_KEEP_CACHE))
    }

    fn open_handle(&self, ino: u64, flags: i32) -> foliofs::Result<(u64, FopenFlags)> {
        let open = self.open_flags(flags);
        self.volume.inodes().check_append_only_open(
            ino,
            open.write,
            flags & libc::O_APPEND != 0,
        )?;
        let file = self.volume.inodes().open_file(ino, open)?;
        let fh = self.handles.insert(Handle::File(Arc::new(file)));
        // Any open file may be cached: through the page cache, or mapped.
        self.invalidator.page_cached(ino);
        Ok((fh, self.fopen_flags(open)))
    }
}

/// A file of a copy_file_range request: its inode, handle and offset.
type CopyEnd = (INodeNo, FileHandle, u64);

impl FolioFs {
    /// copy_file_range(2) for both request kinds: answered as a clone of
    /// the whole blocks (no data moves, the blocks are shared) and a copy
    /// of the partial blocks at the edges (`File::copy_range_from`).
    /// FICLONE and FIDEDUPERANGE never reach a FUSE daemon. Into a handle
    /// opened O_DSYNC or O_SYNC the copy is durable before the reply; with
    /// zero-message opens it is not, for the request carries no open flags
    /// (fuse_copy_file_range_in has none, unlike reads and writes).
    fn copy_range(
        &self,
        req: &Request,
        (ino_in, fh_in, offset_in): CopyEnd,
        (ino_out, fh_out, offset_out): CopyEnd,
        len: u64,
        flags: CopyFileRangeFlags,
    ) -> Result<u64, Errno> {
        invalidate::mark_serving();
        if !flags.is_empty() {
            return Err(Errno::EINVAL);
        }
        let readable = inode_files::Access { write: false, direct: false, dsync: false };
        let source = self.served_file("copy_file_range", ino_in, fh_in, Some(readable))?;
        let writable = inode_files::Access { write: true, direct: false, dsync: false };
        let target = self.served_file("copy_file_range", ino_out, fh_out, Some(writable))?;
        let kill = WriteFlags::FUSE_WRITE_KILL_SUIDGID;
        self.remove_privileges("copy_file_range", req, ino_out, kill)?;
        target
            .copy_range_from(&source, offset_in, offset_out, len)
            .map_err(|error| self.failed("copy_file_range", &error))
    }
}

/// What a READDIR lists from: `entries` from `position` on (the dots
/// first), with offsets in walk `walk` ([`walk_offset`]).
struct DirPage {
    entries: Arc<Vec<foliofs::DirEntry>>,
    parent: u64,
    walk: u32,
    position: u64,
}

/// The errno for `error`; faults of the volume (not of the caller's request)
/// are logged, since the caller sees only a number.
fn failed(operation: &str, error: &Error) -> Errno {
    if matches!(error, Error::Io { .. } | Error::Corrupt(_) | Error::ReadOnly(_)) {
        tracing::warn!("{operation}: {error}");
    } else {
        tracing::debug!("{operation}: {error}");
    }
    errno(error)
}

fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

fn time_set(time: TimeOrNow) -> TimeSet {
    match time {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(at) => TimeSet::At(timestamp(at)),
    }
}

/// getxattr/listxattr answers: the size when asked for it (size 0), ERANGE
/// when the caller's buffer is too small, the bytes otherwise.
fn reply_sized(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    if size == 0 {
        reply.size(bytes.len() as u32);
    } else if bytes.len() > size as usize {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(bytes);
    }
}

/// The privilege a get, set or remove of an extended attribute runs with:
/// the kernel's VFS (`xattr_permission`) has already refused `trusted.`
/// names to a caller without CAP_SYS_ADMIN in its effective credentials,
/// which may be another's: overlayfs copies up with its mounter's. The
/// process's own capabilities (`caller_privilege`, from /proc) would refuse
/// overlayfs's `trusted.overlay.` attributes for an unprivileged user
/// (generic/699). Listing is filtered here, by the process: the kernel
/// passes a FUSE listing through unfiltered.
const XATTR_CHECKED_BY_KERNEL: Privilege = Privilege::SysAdmin;

impl Filesystem for FolioFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        for &capability in WANTED_CAPABILITIES {
            if config.add_capabilities(capability).is_err() {
                tracing::info!("the kernel does not offer {capability:?}");
            }
        }
        // POSIX ACLs: the kernel checks them and leaves the umask to the
        // volume (FUSE_DONT_MASK), which skips it under a default ACL.
        if self.posix_acl {
            let acl = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
            if config.add_capabilities(acl).is_err() {
                tracing::info!("the kernel does not offer POSIX ACLs");
            }
        }
        // Idmapped mounts (`mount --bind -o X-mount.idmap=...`, kernel
        // 6.12+): the kernel maps ids itself and names the caller only in
        // the requests that create (see `caller_ids`).
        if self.allow_idmap && config.add_capabilities(InitFlags::FUSE_ALLOW_IDMAP).is_err() {
            tracing::info!("the kernel does not offer FUSE_ALLOW_IDMAP");
        }
        // Buffered writes stay in the kernel's page cache; it sends them
        // (and the times it keeps) later. Without it, the mount stays
        // write-through, which is what `page_cache=kernel` does.
        if self.page_cache == PageCacheUse::Writeback
            && config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE).is_err()
        {
            tracing::warn!("the kernel does not offer FUSE_WRITEBACK_CACHE: writes go through");
        }
        // Where the kernel's page cache takes buffered writes: without it,
        // each write asks for security.capability first (FUSE clears
        // SB_NOSEC), a GETXATTR round trip per write(2).
        if self.page_cache != PageCacheUse::Engine {
            self.kills_privileges =
                config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
        }
        if let Err(nearest) = config.set_max_write(self.max_write_bytes) {
            let _ = config.set_max_write(nearest);
        }
        // Enough background requests for asynchronous direct I/O at depth
        // (`max_background`); the congestion threshold, past which the
        // kernel skips readahead, stays at fuser's three quarters of it.
        let _ = config.set_max_background(self.max_background);
        Ok(())
    }

    fn before_wait(&self) -> Option<std::os::fd::RawFd> {
        // Sequential direct requests this wake-up brought were left plugged
        // (`unplug_before_waiting_on_this_thread`): one system call hands
        // them all to the kernel, which merges neighbours. Only ring threads
        // come here, so only they hold requests.
        foliofs::direct::unplug_before_waiting_on_this_thread();
        self.volume.device().unplug();
        // Direct I/O this ring thread submitted that ended meanwhile: its
        // replies go out with the ring's coming wait, not through the
        // sweeper thread and a wake-up of this one. The I/O that ends while
        // it sleeps wakes it through the descriptor returned, so the thread
        // that sends the replies runs those completions too.
        foliofs::completion::prepare_to_wait()
    }

    fn after_wait(&self) {
        foliofs::completion::woke();
    }

    fn destroy(&mut self) {
        // Ends the invalidation thread; nothing is mounted to invalidate.
        self.volume.set_change_observer(None);
        self.volume.set_namespace_observer(None);
        // After a forced unmount the kernel may not have released every
        // handle; close them so unlinked files are freed before the volume
        // closes.
        self.inode_files.drain();
        for handle in self.handles.drain() {
            if let Handle::File(file) = handle {
                if let Ok(file) = Arc::try_unwrap(file) {
                    if let Err(error) = file.close() {
                        tracing::warn!("closing a handle left open at unmount: {error}");
                    }
                }
            }
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.volume.inodes().lookup(parent.0, name_bytes(name)) {
            Ok(attr) => {
                self.handed_to_kernel(&attr);
                reply.entry(&self.ttl, &file_attr(&attr), Generation(0))
            }
            // Not logged even at debug: misses are most lookups of a build.
            Err(error) => reply.error(errno(&error)),
        }
    }

    /// (BATCH_FORGET comes here too, one inode at a time.)
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inode_files.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.volume.inodes().getattr(ino.0) {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
            Err(error) => reply.error(self.failed("getattr", &error)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mut mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        invalidate::mark_serving();
        // FUSE_HANDLE_KILLPRIV_V2: the kernel leaves to the daemon what a
        // truncate and a chown take away (it would otherwise ask for
        // security.capability before every buffered write: one GETXATTR
        // round trip each); the library has the rule.
        let (truncate, chown) = (size.is_some(), uid.or(gid).is_some());
        if self.kills_privileges && (truncate || chown) {
            let caller = caller_ids(req);
            match self
                .volume
                .inodes()
                .remove_privileges_for_setattr(ino.0, caller, truncate, chown, mode)
            {
                Ok(Some(cleared_mode)) => mode = Some(cleared_mode),
                Ok(None) => {}
                Err(error) => return reply.error(self.failed("setattr", &error)),
            }
        }
        let changes = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            // With writeback_cache the kernel keeps the times and sends
            // its ctime beside the mtime it writes back.
            ctime: ctime.map(timestamp),
        };
        match self.volume.inodes().setattr(ino.0, &changes) {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
            Err(error) => reply.error(self.failed("setattr", &error)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.volume.inodes().readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(error) => reply.error(self.failed("readlink", &error)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        let kind = match mode & libc::S_IFMT {
            0 | libc::S_IFREG => foliofs::InodeKind::File,
            libc::S_IFIFO => foliofs::InodeKind::Fifo,
            libc::S_IFSOCK => foliofs::InodeKind::Socket,
            libc::S_IFCHR => foliofs::InodeKind::CharDevice,
            libc::S_IFBLK => foliofs::InodeKind::BlockDevice,
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        let mode = self.volume.inodes().creation_mode(parent.0, mode, umask) & 0o7777;
        let result =
            self.volume.inodes().mknod(parent.0, name_bytes(name), kind, mode, rdev, owner(req));
        self.reply_entry("mknod", reply, result);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        let mode = self.volume.inodes().creation_mode(parent.0, mode, umask);
        let result = self.volume.inodes().mkdir(parent.0, name_bytes(name), mode, owner(req));
        self.reply_entry("mkdir", reply, result);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        self.keep_if_last_name(parent, name);
        match self.volume.inodes().unlink(parent.0, name_bytes(name)) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("unlink", &error)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        self.keep_if_last_name(parent, name);
        match self.volume.inodes().rmdir(parent.0, name_bytes(name)) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("rmdir", &error)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        let result = self.volume.inodes().symlink(
            parent.0,
            name_bytes(link_name),
            target.as_os_str().as_bytes(),
            owner(req),
        );
        self.reply_entry("symlink", reply, result);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        // The kernel has checked CAP_MKNOD for a whiteout; the whiteout is
        // the caller's, as a node it made itself.
        let whiteout = flags.contains(fuser::RenameFlags::RENAME_WHITEOUT).then(|| owner(req));
        let flags = RenameFlags {
            no_replace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
            whiteout,
        };
        if !flags.no_replace && !flags.exchange {
            self.keep_if_last_name(newparent, newname);
        }
        let result = self.volume.inodes().rename(
            parent.0,
            name_bytes(name),
            newparent.0,
            name_bytes(newname),
            flags,
        );
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("rename", &error)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        let result = self.volume.inodes().link(ino.0, newparent.0, name_bytes(newname));
        self.reply_entry("link", reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: fuser::OpenFlags, reply: ReplyOpen) {
        OpenCounters::count(&self.opens.opens);
        if self.zero_message_opens {
            // The kernel opens without asking from now on, and releases
            // without telling: FOPEN_KEEP_CACHE is its default then.
            return reply.error(Errno::ENOSYS);
        }
        match self.open_handle(ino.0, flags.0) {
            Ok((fh, fopen)) => reply.opened(FileHandle(fh), fopen),
            Err(error) => reply.error(self.failed("open", &error)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let access = inode_files::Access::from_flags(flags.0, false, false);
        let file = match self.served_file("read", ino, fh, Some(access)) {
            Ok(file) => file,
            Err(errno) => return reply.error(errno),
        };
        if file.flags().direct {
            // The serving thread does not wait for the device: the reply is
            // sent from the read's completion.
            let buffer = self.direct_io.read_buffer(&reply, size as usize);
            let read = file.read_at_async(buffer, offset);
            return in_flight::spawn(in_flight::then(read, move |read| match read {
                (Ok(count), buffer) => reply.data(&buffer[..count]),
                (Err(error), _) => reply.error(failed("read", &error)),
            }));
        }
        // From the engine's folio when one holds the range: one copy less
        // than through the staging buffer.
        let mut reply = Some(reply);
        let in_place = file.read_in_place(offset, size as usize, |bytes| {
            if let Some(reply) = reply.take() {
                reply.data(bytes);
            }
        });
        if let Err(error) = in_place {
            if let Some(reply) = reply.take() {
                reply.error(self.failed("read", &error));
            }
        }
        let Some(reply) = reply else { return };
        with_staging(size as usize, |buffer| match file.read_at(buffer, offset) {
            Ok(count) => reply.data(&buffer[..count]),
            Err(error) => reply.error(self.failed("read", &error)),
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        invalidate::mark_serving();
        let page_cache_writeback = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let access = inode_files::Access::from_flags(flags.0, true, page_cache_writeback);
        let file = match self.served_file("write", ino, fh, Some(access)) {
            Ok(file) => file,
            Err(errno) => return reply.error(errno),
        };
        if let Err(errno) = self.remove_privileges("write", req, ino, write_flags) {
            return reply.error(errno);
        }
        if page_cache_writeback && file.flags().direct {
            // The kernel writing back its page cache (a shared mapping of an
            // O_DIRECT file) through whichever handle is writable: its pages,
            // partial at end of file, are not the caller's direct I/O, and
            // take the buffered path through a handle of their own.
            let cached = OpenFlags {
                direct: false,
                truncate: false,
                drop_behind: self.page_cache != PageCacheUse::Engine,
                ..file.flags()
            };
            let written = self.volume.inodes().open_file(file.ino(), cached).and_then(|buffered| {
                let written = invalidate::kernel_sees(|| buffered.write_at(data, offset));
                buffered.close().and(written)
            });
            return match written {
                Ok(count) => reply.written(count as u32),
                Err(error) => reply.error(self.failed("write", &error)),
            };
        }
        if file.flags().direct {
            // In place when the payload arrived aligned (io_uring), else
            // copied once into aligned memory; the reply is sent from the
            // write's completion.
            let write = file.write_at_async(self.direct_io.write_buffer(&reply, data), offset);
            // Its change event comes from the thread that completes it.
            let write = invalidate::serving(write);
            let invalidator = Arc::clone(&self.invalidator);
            return in_flight::spawn(in_flight::then(write, move |(written, _)| {
                // After the invalidation of the range its completion queued.
                invalidator.after_queued(move || match written {
                    Ok(count) => reply.written(count as u32),
                    Err(error) => reply.error(failed("write", &error)),
                });
            }));
        }
        // A buffered handle: the kernel's page cache took the write first
        // (write-through), or there is none (`page_cache=engine`).
        match invalidate::kernel_sees(|| file.write_at(data, offset)) {
            Ok(count) => reply.written(count as u32),
            Err(error) => reply.error(self.failed("write", &error)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) promises nothing about durability, and writeback errors
        // are reported by fsync, once per handle, as the kernel does. So
        // there is nothing to do, and ENOSYS tells the kernel not to send
        // FLUSH again: one round trip less per close(2). (POSIX locks are
        // the kernel's own here: no lock handlers, so no owner to release.)
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        OpenCounters::count(&self.opens.releases);
        if fh.0 == 0 && self.zero_message_opens {
            // A file created before the kernel learned of zero-message
            // opens: it is served by inode, with nothing to release.
            return reply.ok();
        }
        let Some(Handle::File(file)) = self.handles.remove(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        // A request still running on the handle holds a clone; the last
        // owner's drop closes the file then.
        let closed = Arc::try_unwrap(file).map(File::close);
        self.handles.note_released();
        match closed {
            Ok(Err(error)) => reply.error(self.failed("release", &error)),
            _ => reply.ok(),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let file = match self.served_file("fsync", _ino, fh, None) {
            Ok(file) => file,
            Err(errno) => return reply.error(errno),
        };
        tracing::trace!(ino = _ino.0, datasync, "fsync");
        let synced = if datasync { file.sync_data() } else { file.sync_all() };
        match synced {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("fsync", &error)),
        }
    }

    /// sync(1) and syncfs(2) in a virtio-fs guest: everything written is
    /// durable when it returns.
    fn syncfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyEmpty) {
        match self.volume.sync() {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("syncfs", &error)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        OpenCounters::count(&self.opens.opendirs);
        if self.zero_message_opendirs {
            // FUSE no-opendir: the kernel lists by inode from now on (handle
            // 0) and sends no RELEASEDIR; see `listing`.
            return reply.error(Errno::ENOSYS);
        }
        match self.volume.inodes().open_dir(ino.0) {
            Ok(dir) => {
                let fh = self.handles.insert(Handle::Dir(Arc::new(DirListing::new(dir))));
                // The kernel keeps the listing across opens and lists from
                // it until the directory changes: through the mount (which
                // it sees) or by a library user (whose changes drop it: see
                // `invalidate`). A warm `ls -l` or `find` then sends no
                // READDIRPLUS, whose entries would also make the kernel
                // forget each file's cached ACL and ask for it again.
                reply.opened(
                    FileHandle(fh),
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
                );
            }
            Err(error) => reply.error(self.failed("opendir", &error)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let DirPage { entries, parent, walk, position } =
            match self.listing("readdir", ino, fh, offset) {
                Ok(page) => page,
                Err(errno) => return reply.error(errno),
            };
        // Offsets: 1 after ".", 2 after "..", 2 + i + 1 after entry i.
        let dots = [(ino.0, b".".as_slice()), (parent, b"..".as_slice())];
        let dot_entries = dots.iter().map(|&(ino, name)| (ino, fuser::FileType::Directory, name));
        let entries =
            entries.iter().map(|entry| (entry.ino, file_type(entry.kind), entry.name.as_slice()));
        for (index, (entry_ino, kind, name)) in
            dot_entries.chain(entries).enumerate().skip(position as usize)
        {
            let offset = walk_offset(walk, index as u64 + 1);
            if reply.add(INodeNo(entry_ino), offset, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let DirPage { entries, parent, walk, position } =
            match self.listing("readdirplus", ino, fh, offset) {
                Ok(page) => page,
                Err(errno) => return reply.error(errno),
            };
        // Offsets as readdir's.
        let dots = [(ino.0, b".".as_slice()), (parent, b"..".as_slice())];
        let names = dots
            .into_iter()
            .chain(entries.iter().map(|entry| (entry.ino, entry.name.as_slice())))
            .enumerate()
            .skip(position as usize);
        for (index, (entry_ino, name)) in names {
            let attr = match self.volume.inodes().getattr(entry_ino) {
                Ok(attr) => attr,
                // Removed since the listing was taken: left out.
                Err(Error::NotFound(_)) => continue,
                Err(error) => return reply.error(self.failed("readdirplus", &error)),
            };
            let name = OsStr::from_bytes(name);
            let offset = walk_offset(walk, index as u64 + 1);
            if reply.add(
                INodeNo(entry_ino),
                offset,
                name,
                &self.ttl,
                &file_attr(&attr),
                Generation(0),
            ) {
                break;
            }
            // The kernel counts a lookup for each entry but the dots.
            if index >= 2 {
                self.handed_to_kernel(&attr);
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        reply: ReplyEmpty,
    ) {
        let Some(Handle::Dir(listing)) = self.handles.remove(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        // As release: a readdir still running holds a clone and closes last.
        match Arc::try_unwrap(listing).map(|listing| listing.dir.close()) {
            Ok(Err(error)) => reply.error(self.failed("releasedir", &error)),
            _ => reply.ok(),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.volume.inodes().fsync_inode(ino.0, datasync) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("fsyncdir", &error)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let stat = self.volume.statfs();
        let free_inodes = stat.free_inodes_estimate();
        // Delalloc reservations are spoken for: like ext4, count them as used
        // in both free figures so df agrees with what the next write gets.
        reply.statfs(
            stat.data_blocks,
            stat.available_blocks,
            stat.available_blocks,
            stat.inodes + free_inodes,
            free_inodes,
            stat.block_bytes,
            stat.name_bytes_max,
            stat.block_bytes,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        let name = name_bytes(name);
        let result = XattrFlags::from_bits(flags).and_then(|mut flags| {
            if name == b"system.posix_acl_access" {
                flags.acl_kill_sgid = match self.volume.inodes().getattr(ino.0) {
                    // No setgid bit to clear: the caller's groups and
                    // capabilities (a read of /proc) do not matter. The
                    // kernel holds the inode lock over a set_acl, so no
                    // chmod through the mount sets the bit meanwhile.
                    Ok(attr) if attr.mode & libc::S_ISGID == 0 => false,
                    Ok(attr) => {
                        let caller = CallerStatus::of(req);
                        !(caller.has_capability(CAP_FSETID) || caller.in_group(req, attr.gid))
                    }
                    Err(_) => true,
                };
            }
            self.volume.inodes().set_xattr(ino.0, name, value, flags, XATTR_CHECKED_BY_KERNEL)
        });
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("setxattr", &error)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name_bytes(name);
        match self.volume.inodes().get_xattr(ino.0, name, XATTR_CHECKED_BY_KERNEL) {
            Ok(value) => reply_sized(reply, size, &value),
            Err(error) => reply.error(self.failed("getxattr", &error)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        // The caller's capabilities (a read of /proc) matter only where
        // there are `trusted.` names to hide from it.
        let listed =
            self.volume.inodes().list_xattr(ino.0, Privilege::SysAdmin).and_then(|names| {
                if names.iter().any(|name| name.starts_with(b"trusted.")) {
                    self.volume.inodes().list_xattr(ino.0, caller_privilege(req))
                } else {
                    Ok(names)
                }
            });
        match listed {
            Ok(names) => {
                let list: Vec<u8> = names
                    .iter()
                    .flat_map(|name| name.iter().copied().chain(std::iter::once(0)))
                    .collect();
                reply_sized(reply, size, &list);
            }
            Err(error) => reply.error(self.failed("listxattr", &error)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // The kernel makes this change itself: no notification for it.
        invalidate::mark_serving();
        let name = name_bytes(name);
        match self.volume.inodes().remove_xattr(ino.0, name, XATTR_CHECKED_BY_KERNEL) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("removexattr", &error)),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let caller = CallerStatus::of(req).credentials(req);
        let access = Access::from_mask(mask.bits());
        match access.and_then(|access| self.volume.inodes().access(ino.0, &caller, access)) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("access", &error)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        invalidate::mark_serving();
        let name = name_bytes(name);
        let mode = self.volume.inodes().creation_mode(parent.0, mode, umask);
        // O_CREAT is implied: the kernel sends create only for it.
        let options = OpenOptions::from_posix_flags(flags | libc::O_CREAT);
        let created =
            self.volume.inodes().create_or_open(parent.0, name, mode, owner(req), &options);
        let opened = created.and_then(|attr| Ok((attr, self.create_handle(attr.ino, flags)?)));
        match opened {
            Ok((attr, (fh, fopen))) => {
                self.handed_to_kernel(&attr);
                reply.created(&self.ttl, &file_attr(&attr), Generation(0), FileHandle(fh), fopen)
            }
            Err(error) => reply.error(self.failed("create", &error)),
        }
    }

    /// chattr / lsattr (FS_IOC_GETFLAGS, SETFLAGS and their fsxattr forms,
    /// which the kernel sends on a handle of its own), FS_IOC_SHUTDOWN
    /// (`going_down`) and FITRIM (`fitrim`); any other ioctl is ENOTTY, as
    /// the kernel answers for a file system without it.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        if cmd == going_down::FS_IOC_SHUTDOWN {
            return self.shut_down(req, arg, reply);
        }
        if cmd == fitrim::FITRIM {
            return self.trim(req, in_data, reply);
        }
        let request = match file_flags::decode(cmd, in_data) {
            Ok(request) => request,
            Err(errno) => return reply.error(Errno::from_i32(errno)),
        };
        let result = match request {
            FlagsRequest::Get { as_fsxattr } => {
                self.volume.inodes().flags(ino.0).map(|flags| file_flags::encode(flags, as_fsxattr))
            }
            FlagsRequest::Set { flags } => {
                let may_protect = CallerStatus::of(req).has_capability(CAP_LINUX_IMMUTABLE);
                let set = self.volume.inodes().set_flags(ino.0, flags, may_protect);
                // The ctime moved; the kernel learns of it only this way.
                if let (Ok(()), Some(notifier)) = (&set, self.notifier.get()) {
                    if let Err(error) = notifier.inval_inode(ino, -1, 0) {
                        tracing::debug!("ioctl: invalidating attributes: {error}");
                    }
                }
                set.map(|()| Vec::new())
            }
        };
        match result {
            Ok(data) => reply.ioctl(0, &data),
            Err(error) => reply.error(self.failed("ioctl", &error)),
        }
    }

    /// O_TMPFILE: an unnamed file, opened; linkat(AT_EMPTY_PATH) names it
    /// through `link` unless O_EXCL made it exclusive.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        invalidate::mark_serving();
        let mode = self.volume.inodes().creation_mode(parent.0, mode, umask);
        let open = self.open_flags(flags);
        let linkable = flags & libc::O_EXCL == 0;
        let opened = self
            .volume
            .inodes()
            .create_unnamed(parent.0, mode, owner(req), open, linkable)
            .and_then(|file| Ok((self.volume.inodes().getattr(file.ino())?, file)));
        match opened {
            Ok((attr, file)) if self.zero_message_opens => {
                // Unnamed: kept until the kernel forgets it (FORGET), since
                // it will not release it.
                self.inode_files.adopt(file);
                self.handed_to_kernel(&attr);
                let fopen = FopenFlags::FOPEN_KEEP_CACHE;
                reply.created(&self.ttl, &file_attr(&attr), Generation(0), FileHandle(0), fopen)
            }
            Ok((attr, file)) => {
                let fh = self.handles.insert(Handle::File(Arc::new(file)));
                self.invalidator.page_cached(attr.ino);
                self.handed_to_kernel(&attr);
                let fopen = self.fopen_flags(open);
                reply.created(&self.ttl, &file_attr(&attr), Generation(0), FileHandle(fh), fopen)
            }
            Err(error) => reply.error(self.failed("tmpfile", &error)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        invalidate::mark_serving();
        let writable = inode_files::Access { write: true, direct: false, dsync: false };
        let file = match self.served_file("fallocate", ino, fh, Some(writable)) {
            Ok(file) => file,
            Err(errno) => return reply.error(errno),
        };
        // The kernel's fallocate neither strips set-ID bits nor says who may
        // keep them: the caller's ids decide, in the library.
        let kill = WriteFlags::FUSE_WRITE_KILL_SUIDGID;
        if let Err(errno) = self.remove_privileges("fallocate", req, ino, kill) {
            return reply.error(errno);
        }
        let released = self.handles.released();
        let fallocate = || {
            FallocateMode::from_flags(mode).and_then(|mode| file.fallocate(mode, offset, length))
        };
        let mut result = fallocate();
        if matches!(result, Err(foliofs::Error::NoSpace(_)))
            && self.wait_for_orphans_released(fh, released)
        {
            result = fallocate();
        }
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(self.failed("fallocate", &error)),
        }
    }

    /// copy_file_range(2), which `cp` uses, as the kernel before 6.18 asks
    /// it (and 6.18 after an ENOSYS to [`Self::copy_file_range_64`]): its
    /// reply counts bytes in 32 bits, so a call copies less than 4 GiB and
    /// the caller asks again for the rest.
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let source = (ino_in, fh_in, offset_in);
        let target = (ino_out, fh_out, offset_out);
        let len = len.min(COPY_FILE_RANGE_BYTES_MAX);
        match self.copy_range(req, source, target, len, flags) {
            Ok(copied) => reply.written(u32::try_from(copied).expect("capped below 4 GiB")),
            Err(errno) => reply.error(errno),
        }
    }

    /// FUSE_COPY_FILE_RANGE_64 (Linux 6.18): the caller's whole length in
    /// one request, so `cp` of a 10 GiB file is one clone.
    fn copy_file_range_64(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyCopied,
    ) {
        let source = (ino_in, fh_in, offset_in);
        let target = (ino_out, fh_out, offset_out);
        match self.copy_range(req, source, target, len, flags) {
            Ok(copied) => reply.copied(copied),
            Err(errno) => reply.error(errno),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let file = match self.served_file("lseek", ino, fh, None) {
            Ok(file) => file,
            Err(errno) => return reply.error(errno),
        };
        // The kernel answers SEEK_SET/CUR/END itself; only these reach here.
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        let found = match whence {
            libc::SEEK_DATA => file.seek_data(offset),
            libc::SEEK_HOLE => file.seek_hole(offset),
            _ => return reply.error(Errno::EINVAL),
        };
        match found {
            Ok(position) => reply.offset(position as i64),
            Err(error) => reply.error(self.failed("lseek", &error)),
        }
    }
}
