//! File handles through a real mount: name_to_handle_at, then
//! open_by_handle_at after the kernel dropped its inode cache, so the handle
//! is resolved by the daemon (a lookup of "." by inode number), as NFS
//! re-export does. A removed file's handle is stale.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::InProcessMount;

/// struct file_handle with room for the 8-byte node id and generation FUSE
/// encodes (MAX_HANDLE_SZ is 128).
#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; 128],
}

fn handle_of(path: &Path) -> FileHandle {
    let mut handle = FileHandle { handle_bytes: 128, handle_type: 0, f_handle: [0; 128] };
    let mut mount_id = 0;
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: the kernel writes at most handle_bytes bytes into f_handle and
    // one int into mount_id; both live for the call.
    let done = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            name.as_ptr(),
            (&raw mut handle).cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        done,
        0,
        "name_to_handle_at {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    handle
}

fn open_by_handle(mount_fd: &std::fs::File, handle: &mut FileHandle) -> std::io::Result<OwnedFd> {
    // SAFETY: handle is a valid struct file_handle of handle_bytes bytes.
    let fd = unsafe {
        libc::open_by_handle_at(mount_fd.as_raw_fd(), (&raw mut *handle).cast(), libc::O_RDONLY)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: open_by_handle_at returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn drop_kernel_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (needs root)");
}

#[test]
fn handles_resolve_after_the_kernel_forgot_the_inodes_and_go_stale_after_removal() {
    if common::skip_requested() {
        return;
    }
    let mount = InProcessMount::new(64 << 20, "default_permissions");
    let dir = mount.point.join("dir");
    std::fs::create_dir(&dir).unwrap();
    let kept = dir.join("kept");
    let removed = dir.join("removed");
    std::fs::write(&kept, b"still here").unwrap();
    std::fs::write(&removed, b"going").unwrap();
    let mut kept_handle = handle_of(&kept);
    let mut removed_handle = handle_of(&removed);
    let mut dir_handle = handle_of(&dir);
    std::fs::remove_file(&removed).unwrap();
    drop_kernel_caches();

    let mount_root = std::fs::File::open(&mount.point).unwrap();
    let kept_fd = open_by_handle(&mount_root, &mut kept_handle).expect("open the kept file");
    let contents = std::fs::read(format!("/proc/self/fd/{}", kept_fd.as_raw_fd())).unwrap();
    assert_eq!(contents, b"still here");
    let dir_fd = open_by_handle(&mount_root, &mut dir_handle).expect("open the directory");
    // The directory's ".." resolves too: the kernel reconnects it to the tree.
    let listed: Vec<_> = std::fs::read_dir(format!("/proc/self/fd/{}", dir_fd.as_raw_fd()))
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(listed, ["kept"]);
    let stale = open_by_handle(&mount_root, &mut removed_handle).map(drop);
    assert_eq!(stale.unwrap_err().raw_os_error(), Some(libc::ESTALE));

    drop((kept_fd, dir_fd, mount_root));
    mount.unmount();
}
