//! mount(2) for a FUSE session, so the mount's type reads `fuse.foliofs`
//! (fuser's own mount(2) drops the subtype); its unmount; remount, as
//! `mount -o remount,...` runs the helper; and the watcher that writes the
//! volume back when its mount turns read-only.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{self, Read, Seek};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use libc::c_ulong;
use parking_lot::Mutex;

use foliofs::{Error, Volume};

use crate::mount_options::MountOptions;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{} has a NUL byte", path.display()))
    })
}

fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{text:?} has a NUL byte"))
    })
}

/// Opens /dev/fuse and mounts it on `mountpoint` as `fuse.<subtype>`;
/// returns the device for the session. EPERM when the caller may not mount
/// (not root): fusermount3 is the way then.
pub(crate) fn mount_fuse(
    image: &Path,
    mountpoint: &Path,
    options: &MountOptions,
) -> io::Result<OwnedFd> {
    let device = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(|error| io::Error::new(error.kind(), format!("/dev/fuse: {error}")))?;
    let root_type = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data =
        format!("fd={},rootmode={root_type:o},user_id={uid},group_id={gid}", device.as_raw_fd());
    if options.default_permissions {
        data.push_str(",default_permissions");
    }
    // allow_root is allow_other to the kernel; fuser refuses the others.
    if options.allow_other || options.allow_root {
        data.push_str(",allow_other");
    }
    let mut flags = options.mount_flags;
    if options.volume.read_only {
        flags |= libc::MS_RDONLY;
    }
    let source = options.fsname.clone().unwrap_or_else(|| image.display().to_string());
    let source = c_string(&source)?;
    let target = c_path(mountpoint)?;
    let fstype = c_string(&format!("fuse.{}", options.subtype))?;
    let data = c_string(&data)?;
    // SAFETY: every pointer is a NUL-terminated string alive across the call;
    // the data string is what the fuse file system parses.
    let result = unsafe {
        libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data.as_ptr().cast())
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(device.into())
}

/// Detaches the mount on `mountpoint` (MNT_DETACH): used when the session
/// could not start on a mount already made.
pub(crate) fn detach(mountpoint: &Path) -> io::Result<()> {
    let target = c_path(mountpoint)?;
    // SAFETY: `target` is a NUL-terminated path alive across the call.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

enum UnmountState {
    /// Mounted by [`mount_fuse`]: unmounted with umount2.
    Own(PathBuf),
    /// Mounted by fuser (through fusermount3).
    Fuser(fuser::SessionUnmounter),
    /// Unmounted, or the session is over: nothing of ours is there.
    Done,
}

/// Unmounts the session's mount from any thread (a signal handler), once.
#[derive(Clone)]
pub struct Unmounter(Arc<Mutex<UnmountState>>);

impl Unmounter {
    pub(crate) fn own(mountpoint: &Path) -> Self {
        Self(Arc::new(Mutex::new(UnmountState::Own(mountpoint.to_path_buf()))))
    }

    pub(crate) fn fuser(unmounter: fuser::SessionUnmounter) -> Self {
        Self(Arc::new(Mutex::new(UnmountState::Fuser(unmounter))))
    }

    /// Unmounts; EBUSY while files are open on the mount.
    pub fn unmount(&self) -> io::Result<()> {
        let mut state = self.0.lock();
        match &mut *state {
            UnmountState::Own(mountpoint) => {
                let target = c_path(mountpoint)?;
                // SAFETY: `target` is a NUL-terminated path alive across the call.
                if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
                    let error = io::Error::last_os_error();
                    // EINVAL: no longer a mount point (unmounted meanwhile).
                    if error.raw_os_error() != Some(libc::EINVAL) {
                        return Err(error);
                    }
                }
            }
            UnmountState::Fuser(unmounter) => unmounter.unmount()?,
            UnmountState::Done => {}
        }
        *state = UnmountState::Done;
        Ok(())
    }

    /// After the session ended, a later mount on the same point is not ours
    /// to unmount.
    pub(crate) fn session_ended(&self) {
        *self.0.lock() = UnmountState::Done;
    }
}

/// One line of /proc/self/mountinfo, the fields remount needs.
struct MountInfo {
    mount_options: String,
    fstype: String,
    super_options: String,
}

impl MountInfo {
    /// The topmost mount on `mountpoint`, if any.
    fn find(mountinfo: &str, mountpoint: &Path) -> Option<Self> {
        let wanted = mountpoint.to_string_lossy();
        mountinfo.lines().rev().find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().position(|field| *field == "-")?;
            if unescape(fields.get(4)?) != wanted {
                return None;
            }
            Some(Self {
                mount_options: fields.get(5)?.to_string(),
                fstype: fields.get(separator + 1)?.to_string(),
                super_options: fields.get(separator + 3)?.to_string(),
            })
        })
    }

    fn read(mountpoint: &Path) -> io::Result<Option<Self>> {
        Ok(Self::find(&std::fs::read_to_string("/proc/self/mountinfo")?, mountpoint))
    }

    fn super_read_only(&self) -> bool {
        self.super_options.split(',').next() == Some("ro")
    }

    /// The MS_* flags that describe the mount now, for a remount that keeps
    /// whatever it does not mention.
    fn flags(&self) -> c_ulong {
        let mut flags = 0;
        for option in self.mount_options.split(',').chain(self.super_options.split(',')) {
            flags |= match option {
                "ro" => libc::MS_RDONLY,
                "nosuid" => libc::MS_NOSUID,
                "nodev" => libc::MS_NODEV,
                "noexec" => libc::MS_NOEXEC,
                "noatime" => libc::MS_NOATIME,
                "nodiratime" => libc::MS_NODIRATIME,
                "relatime" => libc::MS_RELATIME,
                "nosymfollow" => libc::MS_NOSYMFOLLOW,
                "sync" => libc::MS_SYNCHRONOUS,
                "dirsync" => libc::MS_DIRSYNC,
                "lazytime" => libc::MS_LAZYTIME,
                _ => 0,
            };
        }
        // No atime word means strictatime.
        if flags & (libc::MS_NOATIME | libc::MS_RELATIME) == 0 {
            flags |= libc::MS_STRICTATIME;
        }
        flags
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub(crate) fn unescape(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// The engine's and the adapter's settings are fixed for a mount's life;
/// remount takes only what the kernel can change on a live mount.
/// Mounts `image` on `mountpoint` as another view of a live mount of the
/// same image, if there is one (a bind mount: one volume, one daemon, as a
/// block file system mounted twice shares one superblock). Returns whether
/// it did; false when the image is not mounted yet.
pub fn bind_if_mounted(image: &Path, mountpoint: &Path) -> foliofs::Result<bool> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|error| Error::io("reading /proc/self/mountinfo", error))?;
    let Some(existing) = mount_of_image(&mountinfo, image) else {
        return Ok(false);
    };
    let source = c_path(&existing).map_err(|error| Error::io("mount source", error))?;
    let target = c_path(mountpoint).map_err(|error| Error::io("mount point", error))?;
    attach_private_clone(&source, &target).map_err(|error| {
        Error::io(
            format!(
                "{} is mounted on {}; binding that mount on {}",
                image.display(),
                existing.display(),
                mountpoint.display()
            ),
            error,
        )
    })?;
    Ok(true)
}

/// Attaches a clone of the mount at `source` on `target` as the kernel
/// attaches a block device mounted again: a new mount in no peer group,
/// which is shared (in a group of its own) only under a shared parent. A
/// plain MS_BIND of a shared mount would join the existing mount's peer
/// group, so mounts made later under either would appear under both
/// (xfstests generic/409 and 411 count them). open_tree(OPEN_TREE_CLONE)
/// gives a detached clone, mount_setattr makes it private, move_mount
/// attaches it; kernels before 5.12 get the plain bind.
fn attach_private_clone(source: &CString, target: &CString) -> io::Result<()> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    // SAFETY: open_tree reads the NUL-terminated path, alive across the
    // call, and returns a new descriptor or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if tree < 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ENOSYS) {
            return plain_bind(source, target);
        }
        return Err(error);
    }
    // SAFETY: open_tree returned a descriptor nothing else owns.
    let tree = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(tree as i32) };
    let attr =
        libc::mount_attr { attr_set: 0, attr_clr: 0, propagation: libc::MS_PRIVATE, userns_fd: 0 };
    // SAFETY: the kernel reads `size_of::<mount_attr>()` bytes of `attr`
    // and the empty NUL-terminated path; both live for the call.
    let set = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if set != 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ENOSYS) {
            return plain_bind(source, target);
        }
        return Err(error);
    }
    // SAFETY: the empty path and `target` are NUL-terminated and live for
    // the call; the descriptor is open.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if moved != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn plain_bind(source: &CString, target: &CString) -> io::Result<()> {
    // SAFETY: both pointers are NUL-terminated paths alive across the call; a
    // bind mount reads no type or data.
    let result = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The first foliofs mount whose source is `image`.
fn mount_of_image(mountinfo: &str, image: &Path) -> Option<PathBuf> {
    let wanted = image.to_string_lossy();
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let separator = fields.iter().position(|field| *field == "-")?;
        let fstype = fields.get(separator + 1)?;
        let source = fields.get(separator + 2)?;
        let point = fields.get(4)?;
        (fstype.starts_with("fuse.foliofs") && unescape(source) == wanted)
            .then(|| PathBuf::from(unescape(point)))
    })
}

const REMOUNT_KEEPS: &[&str] = &["remount", "ro", "rw", "defaults"];

/// `mount -o remount,OPTIONS`: ro/rw and the standard flags (nosuid,
/// noexec, noatime, ...) change on the live mount; anything else is refused
/// by name. The daemon notices a change to read-only and writes the volume
/// back (see [`RemountWatcher`]). A volume mounted with `ro` was opened
/// read-only and cannot become writable without a new mount.
pub fn remount(image: &Path, mountpoint: &Path, list: &str) -> foliofs::Result<()> {
    let items: Vec<&str> = list.split(',').map(str::trim).filter(|i| !i.is_empty()).collect();
    let fixed: Vec<&str> = items
        .iter()
        .copied()
        .filter(|item| !REMOUNT_KEEPS.contains(item) && !MountOptions::is_standard_flag(item))
        // What mount(8) repeats from the mount's own options.
        .filter(|item| {
            ![
                "user_id=",
                "group_id=",
                "default_permissions",
                "allow_other",
                "max_read=",
                "blksize=",
                "x-",
            ]
            .iter()
            .any(|prefix| item.starts_with(prefix))
        })
        .collect();
    // mount(8) repeats the options the mount was made with (it keeps the
    // helper's in its utab): those change nothing and pass.
    let serving = serving_options(image);
    let fixed: Vec<&str> =
        fixed.into_iter().filter(|item| !serving.iter().any(|option| option == item)).collect();
    if !fixed.is_empty() {
        return Err(Error::invalid(format!(
            "remount cannot change {}: only ro/rw and the standard mount flags change on a live \
             mount; unmount and mount again",
            fixed.join(",")
        )));
    }
    let current = MountInfo::read(mountpoint)
        .map_err(|error| Error::io("reading /proc/self/mountinfo", error))?
        .filter(|info| info.fstype.starts_with("fuse"))
        .ok_or_else(|| {
            Error::invalid(format!("{} is not a foliofs mount", mountpoint.display()))
        })?;
    let mut flags = current.flags();
    for item in &items {
        match *item {
            "ro" => flags |= libc::MS_RDONLY,
            "rw" => flags &= !libc::MS_RDONLY,
            other => {
                if let Some((set, clear)) = MountOptions::standard_flag_bits(other) {
                    flags = (flags & !clear) | set;
                }
            }
        }
    }
    if flags & libc::MS_RDONLY == 0 && current.super_read_only() && opened_read_only(image)? {
        return Err(Error::ReadOnly(format!(
            "{} was mounted with ro, so its volume was opened read-only and cannot become \
             writable on a live mount; unmount it and mount it again without ro",
            mountpoint.display()
        )));
    }
    let target = c_path(mountpoint).map_err(|error| Error::io("remount", error))?;
    // SAFETY: `target` is a NUL-terminated path alive across the call; a
    // remount takes no source, type or data.
    let result = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | flags,
            std::ptr::null(),
        )
    };
    if result != 0 {
        let error = io::Error::last_os_error();
        return Err(Error::io(format!("remount {}", mountpoint.display()), error));
    }
    Ok(())
}

/// The `-o` options of the daemon serving `image`, read from its command
/// line (`foliofs mount IMAGE MOUNTPOINT --daemon -o OPTIONS`, or `-f`);
/// empty when none is found.
fn serving_options(image: &Path) -> Vec<String> {
    let image = image.as_os_str().as_bytes();
    let Ok(processes) = std::fs::read_dir("/proc") else { return Vec::new() };
    for process in processes.flatten() {
        let Ok(cmdline) = std::fs::read(process.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|&byte| byte == 0).collect();
        let serves = args.iter().any(|arg| *arg == b"mount")
            && args.contains(&image)
            && args.iter().any(|arg| *arg == b"--daemon" || *arg == b"-f");
        let options = args.iter().position(|arg| *arg == b"-o").and_then(|at| args.get(at + 1));
        if let (true, Some(options)) = (serves, options) {
            let options = String::from_utf8_lossy(options);
            return options.split(',').map(|item| item.trim().to_string()).collect();
        }
    }
    Vec::new()
}

/// Whether the daemon serving `image` opened it read-only: a writer holds
/// the image's lock exclusively, a read-only open shares it (see the
/// device's `lock_image`), so a shared lock is granted only in that case.
fn opened_read_only(image: &Path) -> foliofs::Result<bool> {
    let file = std::fs::File::open(image)
        .map_err(|error| Error::io(format!("open {}", image.display()), error))?;
    Ok(file.try_lock_shared().is_ok())
}

/// Watches the mount table for the mount turning read-only (a remount) and
/// then writes the volume back and checkpoints it, so the image is complete
/// while nothing can change it; the kernel refuses every change from then
/// on (EROFS). Stops when dropped.
pub struct RemountWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RemountWatcher {
    pub(crate) fn start(mountpoint: &Path, volume: Weak<Volume>) -> Option<Self> {
        let mut mountinfo = std::fs::File::open("/proc/self/mountinfo").ok()?;
        let mountpoint = mountpoint.to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("foliofs-remount".into())
            .spawn(move || {
                let mut read_only = None;
                while !stopped.load(Ordering::Relaxed) {
                    let mut text = String::new();
                    if mountinfo
                        .rewind()
                        .and_then(|()| mountinfo.read_to_string(&mut text))
                        .is_err()
                    {
                        return;
                    }
                    let now =
                        MountInfo::find(&text, &mountpoint).map(|info| info.super_read_only());
                    if read_only.is_some() && now.is_some() && now != read_only {
                        let Some(volume) = volume.upgrade() else { return };
                        remounted(&volume, &mountpoint, now == Some(true));
                    }
                    read_only = now.or(read_only);
                    wait_for_mount_change(&mountinfo);
                }
            })
            .ok()?;
        Some(Self { stop, thread: Some(thread) })
    }
}

impl Drop for RemountWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn remounted(volume: &Volume, mountpoint: &Path, read_only: bool) {
    if !read_only {
        tracing::info!("{} remounted read-write", mountpoint.display());
        return;
    }
    match volume.sync().and_then(|()| volume.checkpoint()) {
        Ok(()) => tracing::info!(
            "{} remounted read-only: the volume is written back and checkpointed",
            mountpoint.display()
        ),
        Err(error) => tracing::error!(
            "{} remounted read-only; writing the volume back failed: {error}",
            mountpoint.display()
        ),
    }
}

/// Waits for the mount table to change (the kernel flags POLLPRI on
/// mountinfo then), or half a second, so that a dropped watcher stops soon.
fn wait_for_mount_change(mountinfo: &std::fs::File) {
    let mut poll = libc::pollfd { fd: mountinfo.as_raw_fd(), events: libc::POLLPRI, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut poll, 1, 500) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_of_the_image_is_found_by_its_source() {
        let mountinfo = "\
22 1 0:21 / / rw - ext4 /dev/vda rw
91 22 0:50 / /mnt/a\\040b rw,nosuid - fuse.foliofs /img/vol.img rw,user_id=0
92 22 0:51 / /mnt/c rw - fuse.foliofs /img/other.img rw,user_id=0";
        assert_eq!(
            mount_of_image(mountinfo, Path::new("/img/vol.img")),
            Some(PathBuf::from("/mnt/a b"))
        );
        assert_eq!(mount_of_image(mountinfo, Path::new("/img/none.img")), None);
        assert_eq!(mount_of_image(mountinfo, Path::new("/dev/vda")), None, "not foliofs");
    }

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:50 / /mnt/a\\040b rw,nosuid,nodev,noatime shared:20 - fuse.foliofs /img rw,user_id=0,group_id=0
41 40 0:51 / /mnt/a\\040b ro,nosuid,nodev,relatime shared:21 - fuse.foliofs /img2 ro,lazytime,user_id=0
";

    #[test]
    fn the_topmost_mount_and_its_flags_are_read_from_mountinfo() {
        let info = MountInfo::find(MOUNTINFO, Path::new("/mnt/a b")).unwrap();
        assert_eq!(info.fstype, "fuse.foliofs");
        assert!(info.super_read_only());
        assert_eq!(
            info.flags(),
            libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_RELATIME
                | libc::MS_LAZYTIME
        );
        assert!(MountInfo::find(MOUNTINFO, Path::new("/mnt")).is_none());
    }

    #[test]
    fn remount_refuses_what_only_a_new_mount_can_change() {
        let error =
            remount(Path::new("/img"), Path::new("/nowhere"), "remount,ro,page_cache=kernel")
                .unwrap_err()
                .to_string();
        assert!(error.contains("page_cache=kernel") && error.contains("unmount"), "{error}");
    }
}
