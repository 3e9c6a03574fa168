//! A volume mounted in the test's own process, so a test can watch the
//! library (device counters) while programs use the mount.
//!
//! Needs root (or fusermount3) and /dev/fuse, as the CLI's mount tests do;
//! FOLIOFS_SKIP_MOUNT_TESTS=1 skips these tests explicitly.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use foliofs::vfs::MkfsOptions;
use foliofs::{Volume, VolumeOptions};
use foliofs_fuse::{Mount, MountOptions};

#[path = "../../../../tests/support/skip.rs"]
pub mod skip;

pub fn skip_requested() -> bool {
    if std::env::var_os("FOLIOFS_SKIP_MOUNT_TESTS").is_some_and(|value| value == "1") {
        skip::skip_or_fail("FOLIOFS_SKIP_MOUNT_TESTS=1 asks to skip the mount tests");
        return true;
    }
    assert!(Path::new("/dev/fuse").exists(), "this test needs /dev/fuse (modprobe fuse)");
    if let Err(why) = transport_ready() {
        skip::skip_or_fail(&format!("FOLIOFS_TRANSPORT={}: {why}", transport()));
        return true;
    }
    false
}

/// The transport the mount tests use: FOLIOFS_TRANSPORT=uring (the
/// default) or dev.
pub fn transport() -> &'static str {
    match std::env::var("FOLIOFS_TRANSPORT").as_deref() {
        Ok("dev") => "dev",
        Ok("uring") | Err(_) => "uring",
        Ok(other) => panic!("FOLIOFS_TRANSPORT={other}: expected uring or dev"),
    }
}

/// For io_uring: the kernel's switch is on (turned on here as root).
fn transport_ready() -> Result<(), String> {
    if transport() == "dev" {
        return Ok(());
    }
    foliofs_fuse::transport::enable_kernel_uring().map(drop).map_err(|error| {
        format!(
            "the kernel does not offer FUSE over io_uring ({}: {error})",
            foliofs_fuse::transport::ENABLE_URING_PARAMETER
        )
    })
}

fn is_mounted(point: &Path) -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = point.to_str().unwrap();
    mountinfo.lines().any(|line| line.split(' ').nth(4) == Some(point))
}

pub struct InProcessMount {
    dir: Option<tempfile::TempDir>,
    pub image: PathBuf,
    pub point: PathBuf,
    pub volume: Arc<Volume>,
    /// How direct I/O data moved between requests and the engine.
    pub direct_io: Arc<foliofs_fuse::DirectIoCounters>,
    /// How many OPEN and RELEASE requests reached the daemon.
    pub opens: Arc<foliofs_fuse::OpenCounters>,
    unmounter: foliofs_fuse::Unmounter,
    server: Option<JoinHandle<foliofs::Result<()>>>,
}

impl InProcessMount {
    /// A fresh volume of `size_bytes`, mounted with `options` (mount -o form).
    pub fn new(size_bytes: u64, options: &str) -> Self {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let image = dir.path().join("vol.img");
        let point = dir.path().join("mnt");
        std::fs::create_dir(&point).unwrap();
        let point = point.canonicalize().unwrap();
        let mkfs = MkfsOptions::default();
        Volume::mkfs_path(&image, Some(size_bytes), &mkfs, &VolumeOptions::default()).unwrap();
        let options = format!("{options},transport={}", transport());
        let options = MountOptions::parse(&options).unwrap();
        let mut mount = Mount::new(&image, &point, &options).unwrap();
        let uring = matches!(mount.transport(), foliofs_fuse::transport::LiveTransport::IoUring(_));
        assert_eq!(uring, transport() == "uring", "live transport: {:?}", mount.transport());
        let volume = Arc::clone(mount.volume());
        let direct_io = mount.direct_io_counters();
        let opens = mount.open_counters();
        let unmounter = mount.unmounter();
        let server = std::thread::spawn(move || mount.run());
        let started = Instant::now();
        while !is_mounted(&point) {
            assert!(started.elapsed() < Duration::from_secs(20), "mount did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            dir: Some(dir),
            image,
            point,
            volume,
            direct_io,
            opens,
            unmounter,
            server: Some(server),
        }
    }

    /// Unmounts (retrying while a file just closed is still busy) and checks
    /// the volume closed cleanly.
    pub fn unmount(mut self) {
        let started = Instant::now();
        while let Err(error) = self.unmounter.unmount() {
            assert!(started.elapsed() < Duration::from_secs(10), "unmount: {error}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let server = self.server.take().unwrap();
        server.join().unwrap().unwrap();
    }
}

impl InProcessMount {
    /// As `unmount`, then returns the image, closed, for checking (it lives
    /// as long as the directory returned with it).
    pub fn unmount_keeping_image(mut self) -> (tempfile::TempDir, PathBuf) {
        let dir = self.dir.take().unwrap();
        let image = self.image.clone();
        self.unmount();
        (dir, image)
    }
}

impl InProcessMount {
    /// `umount -f` (the kernel aborts the connection, whatever is in
    /// flight; the mount stays while files are open, so it is then detached
    /// with `umount -l`), then waits for serving to end (at most `timeout`) and the
    /// volume to close; returns the image, closed, for checking (it lives
    /// as long as the directory returned with it).
    pub fn force_unmount(mut self, timeout: Duration) -> (tempfile::TempDir, PathBuf) {
        let umount = |flag: &str| {
            std::process::Command::new("umount").arg(flag).arg(&self.point).status().unwrap()
        };
        if !umount("-f").success() {
            assert!(umount("-l").success(), "umount -l failed");
        }
        let server = self.server.take().unwrap();
        let started = Instant::now();
        while !server.is_finished() {
            assert!(started.elapsed() < timeout, "serving did not end after umount -f");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The session may report the aborted connection.
        let _ = server.join().unwrap();
        let dir = self.dir.take().unwrap();
        let image = self.image.clone();
        // The last reference to the volume: it closes.
        drop(self);
        (dir, image)
    }
}

impl Drop for InProcessMount {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.point).status();
            let _ = server.join();
        }
    }
}

/// The errno of `ioctl(open(point), request, arg)` issued by a process
/// whose bounding set lacks CAP_SYS_ADMIN (root otherwise, as xfstests
/// runs). `arg_python` is a Python expression for the argument buffer
/// (`struct.pack(...)`); python's fcntl.ioctl passes its address, as
/// `godown` and `fstrim` do. Panics if the ioctl succeeds.
pub fn ioctl_errno_without_sys_admin(point: &Path, request: u32, arg_python: &str) -> i32 {
    let script = format!(
        "import fcntl, os, struct, sys\n\
         try:\n    fcntl.ioctl(os.open(sys.argv[1], os.O_RDONLY), {request:#x}, {arg_python})\n\
         except OSError as error:\n    print(error.errno)\n"
    );
    let output = std::process::Command::new("setpriv")
        .args(["--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "python3", "-c", &script])
        .arg(point)
        .output()
        .expect("setpriv and python3");
    let printed = String::from_utf8_lossy(&output.stdout);
    printed
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the ioctl did not fail: {printed:?} {output:?}"))
}
