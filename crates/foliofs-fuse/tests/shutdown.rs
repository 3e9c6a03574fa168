//! FS_IOC_SHUTDOWN through a real mount, as xfstests' `godown` sends it (on
//! the mount's root directory, flags by address): afterwards the mount
//! answers EIO, and the next open of the image has everything written
//! before it, whatever the flag: a syncfs on the mount never reaches the
//! daemon, so the shutdown keeps what one would have. An invalid flag is
//! EINVAL, a caller without CAP_SYS_ADMIN gets EPERM, and neither changes
//! anything.

mod common;

use std::os::fd::AsRawFd;

use foliofs::{OpenFlags, Volume, VolumeOptions};

use common::InProcessMount;

/// _IOR('X', 125, __u32): XFS_IOC_GOINGDOWN, EXT4_IOC_SHUTDOWN.
const FS_IOC_SHUTDOWN: libc::Ioctl = 0x8004_587d_u32 as libc::Ioctl;
const LOGFLUSH: u32 = 1;
const NOLOGFLUSH: u32 = 2;

fn go_down(point: &std::path::Path, flags: u32) -> std::io::Result<()> {
    let root = std::fs::File::open(point)?;
    // SAFETY: the kernel reads one u32 at the address, which lives for the call.
    let done = unsafe { libc::ioctl(root.as_raw_fd(), FS_IOC_SHUTDOWN, &flags as *const u32) };
    if done != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn shutdown_ioctl_fails_later_requests_and_keeps_what_its_flag_flushed() {
    if common::skip_requested() {
        return;
    }
    for flags in [LOGFLUSH, NOLOGFLUSH] {
        let mount = InProcessMount::new(64 << 20, "default_permissions");
        let synced = mount.point.join("synced");
        let later = mount.point.join("later");
        std::fs::write(&synced, b"fsynced before the shutdown").unwrap();
        std::fs::File::open(&synced).unwrap().sync_all().unwrap();
        std::fs::write(&later, b"written, never synced").unwrap();
        let open_before = std::fs::OpenOptions::new().write(true).open(&later).unwrap();

        assert_eq!(errno_without_sys_admin(&mount.point), libc::EPERM);
        let invalid = go_down(&mount.point, 7).expect_err("flags 7");
        assert_eq!(invalid.raw_os_error(), Some(libc::EINVAL));
        std::fs::write(mount.point.join("up"), b"x").expect("write after an invalid shutdown");
        go_down(&mount.point, flags).expect("FS_IOC_SHUTDOWN");
        let eio = |result: std::io::Result<()>, what: &str| {
            let error = result.expect_err(what);
            assert_eq!(error.raw_os_error(), Some(libc::EIO), "{what}: {error}");
        };
        eio(std::fs::write(mount.point.join("new"), b"x"), "create after the shutdown");
        eio(std::fs::read(&synced).map(drop), "read after the shutdown");
        eio(std::io::Write::write_all(&mut &open_before, b"x"), "write after the shutdown");
        eio(open_before.sync_all(), "fsync after the shutdown");
        drop(open_before);
        let (_dir, image) = mount.unmount_keeping_image();

        let volume = Volume::open(&image, &VolumeOptions::default()).unwrap();
        assert_eq!(read(&volume, "/synced"), b"fsynced before the shutdown");
        assert_eq!(read(&volume, "/later"), b"written, never synced", "flags {flags}");
        assert_eq!(volume.inodes().resolve("/new").map(drop).unwrap_err().errno(), libc::ENOENT);
        volume.close().unwrap();
    }
}

fn read(volume: &Volume, path: &str) -> Vec<u8> {
    let attr = volume.inodes().resolve(path).and_then(|ino| volume.inodes().getattr(ino)).unwrap();
    let mut content = vec![0; attr.size as usize];
    let file = volume.inodes().open_file(attr.ino, OpenFlags::READ).unwrap();
    file.read_exact_at(&mut content, 0).unwrap();
    content
}

/// FS_IOC_SHUTDOWN (flag 2, NOLOGFLUSH) from a process whose bounding set
/// lacks CAP_SYS_ADMIN.
fn errno_without_sys_admin(point: &std::path::Path) -> i32 {
    common::ioctl_errno_without_sys_admin(point, 0x8004587d, "struct.pack('I', 2)")
}
