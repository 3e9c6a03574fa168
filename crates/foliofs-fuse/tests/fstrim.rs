//! FITRIM through a real mount, as `fstrim -v MOUNTPOINT` sends it (a
//! directory ioctl): the free space of the volume is discarded on the
//! device, fstrim reports the bytes the library discarded, files keep their
//! data, a range and a minimum length are honoured, a start past the end is
//! EINVAL and a caller without CAP_SYS_ADMIN gets EPERM.

mod common;

use std::path::Path;
use std::process::Command;

use common::InProcessMount;

/// `fstrim -v` (with extra arguments); returns the bytes it reports.
fn fstrim(point: &Path, args: &[&str]) -> Result<u64, String> {
    let output = Command::new("fstrim").arg("-v").args(args).arg(point).output().expect("fstrim");
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)));
    }
    // "MOUNTPOINT: 1.2 MiB (1234567 bytes) trimmed"
    let bytes = stdout.split('(').nth(1).and_then(|rest| rest.split(' ').next());
    Ok(bytes
        .and_then(|bytes| bytes.parse().ok())
        .unwrap_or_else(|| panic!("fstrim said {stdout:?}")))
}

#[test]
fn fstrim_discards_the_free_space_of_the_mount() {
    if common::skip_requested() {
        return;
    }
    let mount = InProcessMount::new(64 << 20, "default_permissions");
    let kept = vec![0x5a; 4 << 20];
    for (name, data) in [("kept", &kept), ("removed", &vec![0x6b; 8 << 20])] {
        std::fs::write(mount.point.join(name), data).unwrap();
        // On the device, not reserved in the cache: statfs counts it used.
        std::fs::File::open(mount.point.join(name)).unwrap().sync_all().unwrap();
    }
    std::fs::remove_file(mount.point.join("removed")).unwrap();
    // The removal durable (syncfs does not reach a /dev/fuse daemon).
    std::fs::File::open(&mount.point).unwrap().sync_all().unwrap();
    let statfs = mount.volume.statfs();
    let free_bytes = statfs.free_blocks * u64::from(statfs.block_bytes);

    let trimmed = fstrim(&mount.point, &[]).unwrap();
    assert_eq!(trimmed, free_bytes, "fstrim reports every free byte");
    assert_eq!(mount.volume.device().stats().bytes_discarded, trimmed, "and the device saw them");
    assert_eq!(std::fs::read(mount.point.join("kept")).unwrap(), kept);

    // A range and a minimum longer than any free run: nothing.
    let none = fstrim(&mount.point, &["--minimum", &format!("{}", 64 << 20)]);
    assert!(none.is_err(), "a minimum longer than the data region is refused: {none:?}");
    let past_end = fstrim(&mount.point, &["--offset", &format!("{}", 1u64 << 40)]).unwrap_err();
    assert!(past_end.contains("Invalid argument"), "{past_end}");
    let first_megabyte = fstrim(&mount.point, &["--offset", "0", "--length", "1M"]).unwrap();
    assert!(first_megabyte <= 1 << 20, "{first_megabyte}");

    assert_eq!(errno_without_sys_admin(&mount.point), libc::EPERM);
    mount.unmount();
}

/// FITRIM (struct fstrim_range: start, len, minlen) from a process whose
/// bounding set lacks CAP_SYS_ADMIN.
fn errno_without_sys_admin(point: &Path) -> i32 {
    common::ioctl_errno_without_sys_admin(point, 0xc0185879, "struct.pack('QQQ', 0, 2**64 - 1, 0)")
}
