//! Idmapped mounts (FUSE_ALLOW_IDMAP, kernel 6.12+): a clone of the mount
//! with an idmapping shows the volume's owners mapped and creates files
//! owned by the unmapped ids; requests that create nothing name no caller
//! (FUSE_INVALID_UIDGID), and the daemon still applies root's set-ID rule
//! to root's writes.

mod common;

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::InProcessMount;

/// The idmapping: volume ids 0..1000 show as 10000..11000 on the clone.
const MAPPED_BASE: u32 = 10000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn check(result: libc::c_long, what: &str) -> libc::c_long {
    assert!(result >= 0, "{what}: {}", std::io::Error::last_os_error());
    result
}

/// A user namespace whose ids 0..1000 are `MAPPED_BASE`.. outside.
fn user_namespace() -> OwnedFd {
    let mut holder = Command::new("unshare").args(["--user", "sleep", "60"]).spawn().unwrap();
    let pid = holder.id();
    // The child must have entered its namespace before the maps are written.
    let started = std::time::Instant::now();
    while std::fs::read_link(format!("/proc/{pid}/ns/user")).ok()
        == std::fs::read_link("/proc/self/ns/user").ok()
        || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim()
            != "sleep"
    {
        assert!(started.elapsed().as_secs() < 10, "unshare did not start");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let map = format!("0 {MAPPED_BASE} 1000");
    std::fs::write(format!("/proc/{pid}/uid_map"), &map).unwrap();
    std::fs::write(format!("/proc/{pid}/gid_map"), &map).unwrap();
    let namespace = std::fs::File::open(format!("/proc/{pid}/ns/user")).unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();
    namespace.into()
}

/// Attaches an idmapped clone of `source` at `target`.
fn mount_idmapped(source: &Path, target: &Path, namespace: &OwnedFd) {
    let source = c_path(source);
    // SAFETY: open_tree reads the NUL-terminated path; it returns a new fd.
    let tree = check(
        unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                source.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
            )
        },
        "open_tree",
    );
    // SAFETY: open_tree returned a descriptor nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: namespace.as_raw_fd() as u64,
    };
    // SAFETY: the kernel reads `size_of::<mount_attr>()` bytes of `attr`
    // and the empty NUL-terminated path; both live for the call.
    check(
        unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                &attr as *const libc::mount_attr,
                std::mem::size_of::<libc::mount_attr>(),
            )
        },
        "mount_setattr(MOUNT_ATTR_IDMAP)",
    );
    let target = c_path(target);
    // SAFETY: both paths are NUL-terminated and live for the call.
    check(
        unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        },
        "move_mount",
    );
}

#[test]
fn an_idmapped_clone_maps_owners_both_ways() {
    if common::skip_requested() {
        return;
    }
    // allow_other: the caller on the clone is uid 10000, not the mount's
    // owner. (The other mount tests, without it, check that requests
    // without a caller are served.)
    let mount = InProcessMount::new(64 << 20, "default_permissions,allow_other");
    let shared = mount.point.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let program = mount.point.join("program");
    std::fs::write(&program, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // A write names no caller once idmapping is on: root's still keeps the
    // set-user-ID bit.
    let mut appended = std::fs::OpenOptions::new().append(true).open(&program).unwrap();
    appended.write_all(b"true\n").unwrap();
    drop(appended);
    assert_eq!(std::fs::metadata(&program).unwrap().mode() & 0o7777, 0o4755);

    let clone = mount.point.parent().unwrap().join("idmapped");
    std::fs::create_dir(&clone).unwrap();
    mount_idmapped(&mount.point, &clone, &user_namespace());
    let unmount_clone = || {
        let target = c_path(&clone);
        // SAFETY: the NUL-terminated path lives for the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    };

    let shown = std::fs::metadata(clone.join("program")).unwrap();
    let created = Command::new("setpriv")
        .args([&format!("--reuid={MAPPED_BASE}"), &format!("--regid={MAPPED_BASE}")])
        .args(["--clear-groups", "touch"])
        .arg(clone.join("shared/made"))
        .status()
        .unwrap();
    unmount_clone();
    assert_eq!((shown.uid(), shown.gid()), (MAPPED_BASE, MAPPED_BASE));
    assert!(created.success(), "touch through the idmapped clone as uid {MAPPED_BASE}");
    let made = std::fs::metadata(shared.join("made")).unwrap();
    assert_eq!((made.uid(), made.gid()), (0, 0), "the volume stores the unmapped ids");
    mount.unmount();
}
