//! `transport=uring` where the kernel does not offer FUSE over io_uring:
//! the mount serves /dev/fuse, says why, and works. The kernel's switch is
//! turned off for the test and restored after (its own test binary, so no
//! other mount of this suite negotiates meanwhile).

#[path = "../../../tests/support/skip.rs"]
mod skip;

use foliofs_fuse::transport::{kernel_uring_enabled, LiveTransport, ENABLE_URING_PARAMETER};
use foliofs_fuse::{Mount, MountOptions};

/// Puts the kernel's switch back as it was, also when the test fails.
struct RestoreSwitch(bool);

impl Drop for RestoreSwitch {
    fn drop(&mut self) {
        let _ = std::fs::write(ENABLE_URING_PARAMETER, if self.0 { "1" } else { "0" });
    }
}

#[test]
fn uring_not_offered_falls_back_to_dev_fuse_and_says_why() {
    if std::env::var_os("FOLIOFS_SKIP_MOUNT_TESTS").is_some_and(|value| value == "1") {
        skip::skip_or_fail("FOLIOFS_SKIP_MOUNT_TESTS=1 asks to skip the mount tests");
        return;
    }
    let Some(was_on) = kernel_uring_enabled() else {
        skip::skip_or_fail(&format!(
            "{ENABLE_URING_PARAMETER} is missing (no FUSE over io_uring here)"
        ));
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip::skip_or_fail(&format!("turning {ENABLE_URING_PARAMETER} off needs root"));
        return;
    }
    let _restore = RestoreSwitch(was_on);
    std::fs::write(ENABLE_URING_PARAMETER, "0").unwrap();

    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let point = dir.path().join("mnt");
    std::fs::create_dir(&point).unwrap();
    let mkfs = foliofs::vfs::MkfsOptions::default();
    let volume_options = foliofs::VolumeOptions::default();
    foliofs::Volume::mkfs_path(&image, Some(64 << 20), &mkfs, &volume_options).unwrap();
    let options = MountOptions::parse("transport=uring").unwrap();
    let mut mount = Mount::new(&image, &point, &options).unwrap();
    // Offered or not is decided at INIT: the switch can be restored now.
    drop(_restore);
    match mount.transport() {
        LiveTransport::DevFuse(Some(why)) => {
            assert!(why.contains("enable_uring"), "the reason names the switch: {why}")
        }
        other => panic!("expected /dev/fuse with a reason, got {other:?}"),
    }
    let unmounter = mount.unmounter();
    let server = std::thread::spawn(move || mount.run());
    std::fs::write(point.join("file"), b"over /dev/fuse").unwrap();
    assert_eq!(std::fs::read(point.join("file")).unwrap(), b"over /dev/fuse");
    let started = std::time::Instant::now();
    while let Err(error) = unmounter.unmount() {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "unmount: {error}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    server.join().unwrap().unwrap();
}
