//! foliofs through a real FUSE mount, driven by unmodified programs: fio with
//! verification, xfs_io, cp -a and diff, sqlite3, and a daemon killed with
//! SIGKILL mid-workload.
//!
//! These need root (or fusermount3), /dev/fuse, fio, xfs_io and sqlite3;
//! `.ci/run` installs them. Without them each test fails saying what is
//! missing; FOLIOFS_SKIP_MOUNT_TESTS=1 skips them explicitly.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod scale;
#[path = "../../../tests/support/skip.rs"]
mod skip;
mod transport;

const FOLIOFS: &str = env!("CARGO_BIN_EXE_foliofs");

fn skip_requested() -> bool {
    if std::env::var_os("FOLIOFS_SKIP_MOUNT_TESTS").is_some_and(|value| value == "1") {
        skip::skip_or_fail("FOLIOFS_SKIP_MOUNT_TESTS=1 asks to skip the mount tests");
        return true;
    }
    transport::skip_unavailable()
}

fn require(tools: &[&str]) {
    assert!(Path::new("/dev/fuse").exists(), "mount tests need /dev/fuse (modprobe fuse)");
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        assert!(
            found,
            "mount tests need {tool} (apt-get install fio xfsprogs sqlite3 fuse3 attr acl)"
        );
    }
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| panic!("run {program}: {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let output = run(program, args);
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Deterministic bytes for a file, so a reader can check them without
/// keeping a copy.
fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn is_mounted(point: &Path) -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = point.to_str().unwrap();
    mountinfo.lines().any(|line| line.split(' ').nth(4) == Some(point))
}

/// An image in a temporary directory and, while mounted, its daemon.
struct Mounted {
    _dir: tempfile::TempDir,
    image: PathBuf,
    point: PathBuf,
    daemon: Option<Child>,
}

impl Mounted {
    fn new(block_size: u32, size: &str, options: &str) -> Self {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let image = dir.path().join("vol.img");
        let point = dir.path().join("mnt");
        fs::create_dir(&point).unwrap();
        let point = point.canonicalize().unwrap();
        let block_size = block_size.to_string();
        ok(
            FOLIOFS,
            &["mkfs", image.to_str().unwrap(), "--size", size, "--block-size", &block_size],
        );
        let mut mounted = Self { _dir: dir, image, point, daemon: None };
        mounted.mount(options);
        mounted
    }

    fn image_str(&self) -> &str {
        self.image.to_str().unwrap()
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.point.join(relative)
    }

    fn path_str(&self, relative: &str) -> String {
        self.path(relative).to_str().unwrap().to_string()
    }

    /// Starts `foliofs mount -f` and waits for the mount to appear.
    fn mount(&mut self, options: &str) {
        assert!(self.daemon.is_none(), "already mounted");
        let options = transport::with(options);
        let mut daemon = Command::new(FOLIOFS)
            .args(["mount", "-f", "-o", &options])
            .arg(&self.image)
            .arg(&self.point)
            .stdin(Stdio::null())
            .spawn()
            .expect("start foliofs mount");
        let started = Instant::now();
        while !is_mounted(&self.point) {
            if let Some(status) = daemon.try_wait().unwrap() {
                panic!("foliofs mount exited early ({status})");
            }
            assert!(started.elapsed() < Duration::from_secs(20), "mount did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.daemon = Some(daemon);
    }

    /// Unmounts as an administrator would and checks the daemon exits cleanly.
    fn unmount(&mut self) {
        let mut daemon = self.daemon.take().expect("mounted");
        let started = Instant::now();
        loop {
            let output = unmount_command(&self.point, false);
            if output.status.success() {
                break;
            }
            // A file closed just before may not be released yet.
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "unmount failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = wait_with_timeout(&mut daemon, Duration::from_secs(60));
        assert!(status.success(), "foliofs mount exited with {status} after unmount");
        assert!(!is_mounted(&self.point));
    }

    fn remount(&mut self, options: &str) {
        self.unmount();
        self.mount(options);
    }

    fn fsck_clean(&self) {
        let report = ok(FOLIOFS, &["fsck", self.image_str()]);
        assert!(report.contains("clean"), "{report}");
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            let _ = unmount_command(&self.point, true);
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
    }
}

fn unmount_command(point: &Path, lazy: bool) -> Output {
    let root = Command::new("id").arg("-u").output().is_ok_and(|out| out.stdout == b"0\n");
    let (program, args): (&str, Vec<&str>) = match (root, lazy) {
        (true, false) => ("umount", vec![]),
        (true, true) => ("umount", vec!["-l"]),
        (false, false) => ("fusermount3", vec!["-u"]),
        (false, true) => ("fusermount3", vec!["-uz"]),
    };
    Command::new(program).args(args).arg(point).output().expect("run umount")
}

/// SIGKILLs the daemon serving `point` and reaps it. A daemon thread caught
/// in the kernel by SIGKILL while it sends an invalidation can wait there
/// for a folio that a writer locked for the WRITE the daemon will never
/// answer: the process cannot exit, so its /dev/fuse is never closed and the
/// connection never ends (the kernel's own deadlock, not the engine's). As
/// an administrator would, abort the connection through fusectl then.
fn kill_daemon(daemon: &mut Child, point: &Path) {
    daemon.kill().unwrap();
    let started = Instant::now();
    while daemon.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(10) {
            abort_fuse_connection(point);
            daemon.wait().unwrap();
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes 1 to the fusectl `abort` file of the connection mounted at
/// `point` (found in /proc/self/mountinfo, without touching the mount).
fn abort_fuse_connection(point: &Path) {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = point.to_str().unwrap();
    let device = mountinfo
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .find(|fields| fields.len() > 4 && fields[4] == point)
        .map(|fields| fields[2].to_string())
        .unwrap_or_else(|| panic!("{point} is not in /proc/self/mountinfo"));
    let minor = device.split(':').nth(1).unwrap();
    let connections = Path::new("/sys/fs/fuse/connections");
    if !connections.join(minor).exists() {
        // fusectl may not be mounted yet.
        let _ = Command::new("mount").args(["-t", "fusectl", "none"]).arg(connections).status();
    }
    eprintln!("the killed daemon is stuck in the kernel: aborting FUSE connection {minor}");
    fs::write(connections.join(minor).join("abort"), "1").unwrap();
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            panic!("process did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes a file from a child process, so this test process never holds a
/// writable descriptor on the mount. Another test thread that spawns a
/// program while such a descriptor is open hands a copy of it to its child
/// until that child's exec closes it, and for that long the kernel refuses
/// `remount,ro` with EBUSY (a file is open for writing).
fn write_from_child(path: &Path, data: &str) {
    let path = path.to_str().unwrap();
    ok("sh", &["-c", "printf %s \"$2\" > \"$1\"", "sh", path, data]);
}

/// umount(8) of `point`, tried again while busy (see [`while_busy`]): a
/// file this process just closed may still be open in another test's child.
fn umount(point: &str) {
    let output = while_busy(|| run("umount", &[point]));
    assert!(output.status.success(), "umount {point}: {output:?}");
}

/// Runs `command` again while it reports the mount busy, for up to 10 s. A
/// turn to read-only is refused (EBUSY) while any file on the mount is open
/// for writing, and an unmount while any is open at all; a copy of a
/// descriptor that another test's child holds between its fork and its exec
/// counts too.
fn while_busy(command: impl Fn() -> Output) -> Output {
    let started = Instant::now();
    loop {
        let output = command();
        // EBUSY from the helper, "target is busy" from umount(8).
        let busy = String::from_utf8_lossy(&output.stderr).contains("busy");
        if output.status.success() || !busy || started.elapsed() > Duration::from_secs(10) {
            return output;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn errno_of(result: std::io::Result<impl Sized>) -> i32 {
    match result {
        Ok(_) => 0,
        Err(error) => error.raw_os_error().unwrap_or(-1),
    }
}

fn fio(mounted: &Mounted, args: &[&str]) -> String {
    let directory = format!("--directory={}", mounted.point.display());
    let mut all =
        vec![directory.as_str(), "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0"];
    all.extend_from_slice(args);
    let output = ok("fio", &all);
    assert!(!output.contains("verify:"), "fio reported a verify failure:\n{output}");
    output
}

#[test]
fn fio_verifies_buffered_and_direct_io_through_the_mount() {
    if skip_requested() {
        return;
    }
    require(&["fio"]);
    let mut mounted = Mounted::new(4096, "512M", "");
    // Buffered random writes from 4 jobs, then every block read back.
    fio(&mounted, &["--name=buffered", "--rw=randwrite", "--bs=4k", "--size=8M", "--numjobs=4"]);
    // 2 KiB direct writes (sub-block on 4 KiB blocks) from 8 jobs into
    // disjoint regions of ONE file: parallel unaligned direct writes to one
    // inode, each verified.
    fio(
        &mounted,
        &[
            "--name=direct2k",
            "--filename=shared",
            "--rw=randwrite",
            "--bs=2k",
            "--direct=1",
            "--size=1M",
            "--offset_increment=1M",
            "--numjobs=8",
        ],
    );
    // Asynchronous direct I/O at depth, larger blocks.
    fio(
        &mounted,
        &[
            "--name=libaio",
            "--ioengine=libaio",
            "--iodepth=16",
            "--rw=randwrite",
            "--bs=16k",
            "--direct=1",
            "--size=8M",
            "--numjobs=2",
        ],
    );
    mounted.remount("");
    // After remount, the data fio wrote still verifies (read-only pass).
    fio(
        &mounted,
        &[
            "--name=direct2k",
            "--filename=shared",
            "--rw=randwrite",
            "--bs=2k",
            "--direct=1",
            "--size=1M",
            "--offset_increment=1M",
            "--numjobs=8",
            "--verify_only",
        ],
    );
    mounted.unmount();
    mounted.fsck_clean();
}

/// `foliofs bench --target files` runs fio's jobs on the mount's files
/// through the OS (the lent 16-core machine has no fio): asynchronous direct
/// I/O at depth from two jobs and buffered I/O, every block verified, the
/// files left where fio would leave them, at their size.
#[test]
fn bench_target_files_runs_verified_jobs_on_the_mount() {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new(4096, "256M", "");
    let directory = format!("--directory={}", mounted.path_str("jobs"));
    for (name, direct, ioengine) in
        [("direct", "--direct=1", "io_uring"), ("buffered", "--direct=0", "psync")]
    {
        let output = ok(
            FOLIOFS,
            &[
                "bench",
                "--target",
                "files",
                "--output-format",
                "json",
                &directory,
                &format!("--name={name}"),
                "--rw=randrw",
                "--bs=4k",
                "--size=4M",
                &format!("--ioengine={ioengine}"),
                direct,
                "--iodepth=16",
                "--numjobs=2",
                "--verify=crc32c",
            ],
        );
        let json: serde_json::Value = serde_json::from_str(&output).expect("valid JSON");
        for job in json["jobs"].as_array().unwrap() {
            let bytes = job["read"]["io_bytes"].as_u64().unwrap()
                + job["write"]["io_bytes"].as_u64().unwrap();
            assert_eq!(bytes, 4 << 20, "{name}: {job}");
            assert!(job["verified_blocks"].as_u64().unwrap() > 0, "{name}: {job}");
        }
        for index in 0..2 {
            let file = mounted.path(&format!("jobs/{name}.{index}.0"));
            assert_eq!(fs::metadata(&file).unwrap().len(), 4 << 20, "{}", file.display());
        }
    }
    let error = run(
        FOLIOFS,
        &["bench", "--target", "files", "--image", "/tmp/x.img", "--name=x", "--size=1M"],
    );
    assert!(!error.status.success());
    assert!(String::from_utf8_lossy(&error.stderr).contains("not on an image"));
    mounted.unmount();
    mounted.fsck_clean();
}

/// `foliofs bench metadata --peers` runs its loop (create, write, fsync,
/// close) from the same jobs through the mount and on the kernel's ext4 and
/// XFS, prints a rate for each and foliofs against ext4, and leaves nothing
/// behind: not the image, the mount point, or the peers' loop devices and
/// files.
#[test]
fn bench_metadata_peers_run_the_same_loop_through_the_os() {
    if skip_requested() {
        return;
    }
    require(&["fio", "losetup", "mkfs.ext4", "mkfs.xfs"]);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let output = Command::new(FOLIOFS)
        .args(["bench", "metadata", "--peers", "--files", "200", "--jobs", "1,2"])
        .args(["--file-size", "1k"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("the same loop through the OS, 2 jobs:"), "{stdout}");
    let rate = |label: &str| -> f64 {
        let line = stdout
            .lines()
            .find(|line| line.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no row {label:?}: {stdout}"));
        assert!(line.contains("lat (us): min="), "{line}");
        let rest = line.trim_start()[label.len()..].trim_start();
        rest.split(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{line}"))
    };
    for label in ["foliofs (mount)", "kernel ext4", "kernel xfs"] {
        assert!(rate(label) > 0.0, "{label}: {stdout}");
    }
    assert!(stdout.contains("foliofs / kernel ext4: "), "{stdout}");
    assert!(stdout.contains("x in process, ") && stdout.contains("x through the mount"));
    // The summary: a row per file system, and foliofs over ext4.
    for row in ["in process", "foliofs (mount)", "kernel ext4", "kernel xfs"] {
        assert!(stdout.contains(&format!("| {row} | ")), "{row}: {stdout}");
    }
    assert!(stdout.contains("| in process / ext4 | "), "{stdout}");
    assert!(stdout.contains("| foliofs (mount) / ext4 | "), "{stdout}");
    let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = dir.path().to_str().unwrap();
    assert!(!mounts.contains(root), "a mount left under {root}: {mounts}");
}

/// `foliofs bench scale --targets mount`: the files made through the
/// mount, the daemon's memory, its close and open, the stat pass, and the
/// daemon killed with SIGKILL half-way, then every durable file found; and
/// nothing left behind, mounted or on disk.
#[test]
fn bench_scale_through_the_mount_measures_every_phase() {
    if skip_requested() {
        return;
    }
    // bench scale runs the mount where it can run the kernel peers.
    require(&["fio", "losetup", "mkfs.ext4", "mkfs.xfs"]);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json_path = dir.path().join("scale.json");
    let output = Command::new(FOLIOFS)
        .args(["bench", "scale", "--files", "3000", "--targets", "mount", "--json"])
        .arg(&json_path)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("| mount | 3000 | "), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&json_path).unwrap()).unwrap();
    scale::check_scale_target(&json, "mount", 3000);
    assert_eq!(json["targets"][0]["memory_what"], "the daemon's VmHWM");
    let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(leftovers, [json_path]);
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = dir.path().to_str().unwrap();
    assert!(!mounts.contains(root), "a mount left under {root}: {mounts}");
}

#[test]
fn fio_verifies_buffered_io_with_the_kernel_page_cache() {
    fio_verifies_buffered_io_with("page_cache=kernel,dirty=folio");
}

#[test]
fn fio_verifies_buffered_and_mixed_io_with_page_cache_writeback() {
    fio_verifies_buffered_io_with("page_cache=writeback");
}

fn fio_verifies_buffered_io_with(options: &str) {
    if skip_requested() {
        return;
    }
    require(&["fio"]);
    let mut mounted = Mounted::new(1024, "256M", options);
    fio(&mounted, &["--name=kernelcache", "--rw=randrw", "--bs=3k", "--size=8M", "--numjobs=2"]);
    fio(&mounted, &["--name=mmap", "--ioengine=mmap", "--rw=randwrite", "--bs=4k", "--size=4M"]);
    // Written buffered (pages kept, dirty under writeback), rewritten
    // direct with another pattern, verified buffered: no stale page answers.
    let shared = ["--filename=mixed", "--size=4M", "--bs=16k", "--rw=write"];
    fio(&mounted, &[&shared[..], &["--name=a", "--verify_pattern=0xaa"]].concat());
    fio(&mounted, &[&shared[..], &["--name=b", "--direct=1", "--verify_pattern=0xbb"]].concat());
    let check_b = [&shared[..], &["--name=b", "--verify_pattern=0xbb", "--verify_only"]].concat();
    fio(&mounted, &check_b);
    mounted.unmount();
    mounted.fsck_clean();
}

/// The threaded fsx through the mount: 4 processes' worth of threads on 2
/// shared files mix buffered, direct and mmap reads with buffered and direct
/// writes, truncate, punch, zero range and fsync, and every read with a
/// defined answer is checked; among them generic/451's race (a direct write
/// read back buffered while others stream through the same range).
#[test]
fn threaded_fsx_through_the_mount() {
    threaded_fsx_through_the_mount_with("", 21);
}

#[test]
fn threaded_fsx_through_the_mount_with_the_kernel_page_cache() {
    threaded_fsx_through_the_mount_with("page_cache=kernel", 22);
}

fn threaded_fsx_through_the_mount_with(options: &str, seed: u64) {
    if skip_requested() {
        return;
    }
    require(&[]);
    let mut mounted = Mounted::new(4096, "512M", options);
    let mut checker = Command::new(FOLIOFS)
        .args(["fsx", "--threads", "4", "--files", "2", "--ops", "3000", "--seconds", "90"])
        .args(["--seed", &seed.to_string(), "--path"])
        .arg(&mounted.point)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start foliofs fsx");
    // Bounded: a hang fails the test rather than the whole run.
    let status = wait_with_timeout(&mut checker, Duration::from_secs(300));
    let output = checker.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        status.success() && stdout.contains("0 mismatches"),
        "fsx --threads through the mount ({status}):\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(" mmap reads") && !stdout.contains(" 0 mmap reads"), "{stdout}");
    mounted.unmount();
    mounted.fsck_clean();
}

/// Seed 001's xfs_io sequence (truncate, mmap, mread, pwrite, fsync): the
/// file holds exactly the two written bytes, and no delayed allocation is
/// left behind once the mount is gone.
#[test]
fn xfs_io_sequences_from_seed_001_on_1k_and_4k_blocks() {
    if skip_requested() {
        return;
    }
    require(&["xfs_io"]);
    for block_size in [1024, 4096] {
        let mut mounted = Mounted::new(block_size, "64M", "");
        let file = mounted.path_str("testfile");
        let output = ok(
            "xfs_io",
            &[
                "-fc",
                "truncate 4k",
                "-c",
                "mmap 0 4k",
                "-c",
                "mread 0 4k",
                "-c",
                "pwrite 0 1",
                "-c",
                "pwrite 2k 1",
                "-c",
                "fsync",
                &file,
            ],
        );
        assert!(output.contains("wrote 1/1 bytes at offset 0"), "{output}");
        assert!(output.contains("wrote 1/1 bytes at offset 2048"), "{output}");
        // SEEK_DATA/SEEK_HOLE work through the mount (FIEMAP does not: FUSE
        // has no fiemap; the CLI's fiemap reads the image instead).
        let seek = ok("xfs_io", &["-c", "seek -a -r 0", &file]);
        assert!(seek.contains("DATA\t0"), "{seek}");
        // A shared mapping's store reaches the file through the engine.
        ok("xfs_io", &["-c", "mmap -w 0 4k", "-c", "mwrite 3k 16", "-c", "msync -s 0 4k", &file]);
        // Space operations pass through: keep-size preallocation past EOF,
        // a punched block and a zeroed range.
        let block = block_size.to_string();
        ok(
            "xfs_io",
            &[
                "-c",
                "falloc -k 8k 8k",
                "-c",
                &format!("fpunch {block} {block}"),
                "-c",
                "fsync",
                &file,
            ],
        );
        mounted.unmount();

        let mut expected = vec![0u8; 4096];
        expected[0] = 0xcd;
        expected[2048] = 0xcd;
        expected[3072..3088].fill(b'X');
        let fiemap = ok(FOLIOFS, &["fiemap", &format!("{}:/testfile", mounted.image_str())]);
        assert!(!fiemap.contains("delalloc"), "delalloc left behind:\n{fiemap}");
        assert!(fiemap.contains("unwritten"), "the keep-size preallocation:\n{fiemap}");
        mounted.fsck_clean();
        mounted.mount("");
        assert_eq!(fs::read(mounted.path("testfile")).unwrap(), expected);
        mounted.unmount();
    }
}

fn build_tree(root: &Path) {
    for dir in 0..4 {
        let dir_path = root.join(format!("dir{dir}/sub{}", dir % 2));
        fs::create_dir_all(&dir_path).unwrap();
        for file in 0..25 {
            let length = [0, 1, 1023, 4096, 65_537, 300_000][(dir * 25 + file) % 6];
            let path = dir_path.join(format!("file{file}"));
            fs::write(&path, pattern((dir * 100 + file) as u64, length)).unwrap();
            fs::set_permissions(
                &path,
                fs::Permissions::from_mode(0o600 + (file as u32 % 8) * 0o10),
            )
            .unwrap();
        }
    }
    fs::write(root.join("big"), pattern(7, 3 << 20)).unwrap();
    std::os::unix::fs::symlink("dir0/sub0/file1", root.join("link")).unwrap();
    std::os::unix::fs::symlink("no/such/target", root.join("dangling")).unwrap();
    fs::hard_link(root.join("big"), root.join("big.hardlink")).unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o700)).unwrap();
}

/// `find -printf` of what cp -a preserves: type, mode, size (not of
/// directories: that is each file system's own), mtime, links.
fn listing(root: &Path) -> String {
    let root = root.to_str().unwrap();
    let dirs = ok("find", &[root, "-mindepth", "1", "-type", "d", "-printf", "%P d %m %T@ %n\n"]);
    let others = ok(
        "find",
        &[root, "-mindepth", "1", "!", "-type", "d", "-printf", "%P %y %m %s %T@ %n %l\n"],
    );
    let output = dirs + &others;
    let mut lines: Vec<&str> = output.lines().collect();
    lines.sort();
    lines.join("\n")
}

#[test]
fn cp_a_of_a_tree_diffs_clean_and_survives_remount() {
    if skip_requested() {
        return;
    }
    require(&["cp", "diff", "find"]);
    let source = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    build_tree(source.path());
    let mut mounted = Mounted::new(4096, "256M", "");
    let copy = mounted.path("copy");
    ok("cp", &["-a", source.path().to_str().unwrap(), copy.to_str().unwrap()]);
    ok(
        "diff",
        &["-r", "--no-dereference", source.path().to_str().unwrap(), copy.to_str().unwrap()],
    );
    assert_eq!(listing(source.path()), listing(&copy));
    mounted.remount("");
    ok(
        "diff",
        &["-r", "--no-dereference", source.path().to_str().unwrap(), copy.to_str().unwrap()],
    );
    assert_eq!(listing(source.path()), listing(&copy));
    // And back out with cp -a, removal of the tree, then an empty volume.
    ok("rm", &["-r", copy.to_str().unwrap()]);
    assert_eq!(fs::read_dir(&mounted.point).unwrap().count(), 0);
    mounted.unmount();
    mounted.fsck_clean();
}

#[test]
fn sqlite_ten_thousand_transactions_pass_integrity_check_after_remount() {
    sqlite_transactions_pass_integrity_check_after_remount("");
}

#[test]
fn sqlite_transactions_pass_integrity_check_with_page_cache_writeback() {
    sqlite_transactions_pass_integrity_check_after_remount("page_cache=writeback");
}

#[test]
fn sqlite_transactions_pass_integrity_check_with_page_cache_kernel() {
    sqlite_transactions_pass_integrity_check_after_remount("page_cache=kernel");
}

fn sqlite_transactions_pass_integrity_check_after_remount(options: &str) {
    if skip_requested() {
        return;
    }
    require(&["sqlite3"]);
    let mut mounted = Mounted::new(4096, "256M", options);
    let database = mounted.path_str("test.db");
    let mut script = String::from(
        "PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER, pad TEXT);\n",
    );
    for id in 0..10_000 {
        script.push_str(&format!(
            "BEGIN; INSERT INTO t(v, pad) VALUES({id}, hex(randomblob({}))); COMMIT;\n",
            id % 200
        ));
        if id % 1000 == 999 {
            script.push_str(&format!("UPDATE t SET v = v + 1 WHERE id % 7 = {};\n", id % 7));
        }
    }
    let mut sqlite = Command::new("sqlite3")
        .arg(&database)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    sqlite.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    assert!(sqlite.wait().unwrap().success());
    let expected = ok("sqlite3", &[&database, "SELECT count(*), sum(v) FROM t;"]);
    mounted.remount(options);
    let integrity = ok("sqlite3", &[&database, "PRAGMA integrity_check;"]);
    assert_eq!(integrity.trim(), "ok");
    assert_eq!(ok("sqlite3", &[&database, "SELECT count(*), sum(v) FROM t;"]), expected);
    assert!(expected.starts_with("10000|"), "{expected}");
    mounted.unmount();
    mounted.fsck_clean();
}

/// SIGKILL of the daemon while writers run: after a forced unmount the
/// image is consistent and every file whose fsync returned is intact.
#[test]
fn sigkill_mid_workload_keeps_every_fsynced_file() {
    sigkill_mid_workload_keeps_every_fsynced_file_with("");
}

/// The kernel holds buffered writes until fsync writes them back.
#[test]
fn sigkill_with_page_cache_writeback_keeps_every_fsynced_file() {
    sigkill_mid_workload_keeps_every_fsynced_file_with("page_cache=writeback");
}

/// Reads through the kernel's page cache, writes through to the daemon.
#[test]
fn sigkill_with_page_cache_kernel_keeps_every_fsynced_file() {
    sigkill_mid_workload_keeps_every_fsynced_file_with("page_cache=kernel");
}

fn sigkill_mid_workload_keeps_every_fsynced_file_with(options: &str) {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new(4096, "256M", options);
    fs::create_dir(mounted.path("synced")).unwrap();
    let durable = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3u64)
        .map(|writer| {
            let (durable, stop, root) =
                (Arc::clone(&durable), Arc::clone(&stop), mounted.point.clone());
            std::thread::spawn(move || {
                for index in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let seed = writer * 1_000_000 + index;
                    let data = pattern(seed, 1 + (seed as usize * 7919) % 200_000);
                    let path = root.join(format!("synced/w{writer}-{index}"));
                    let written = fs::File::create(&path).and_then(|mut file| {
                        file.write_all(&data)?;
                        // Writer 2 also leaves unsynced overwrites behind.
                        if writer == 2 {
                            let head = 8.min(data.len());
                            file.write_all_at(&b"unsynced"[..head], 0)?;
                            file.write_all_at(&data[..head], 0)?;
                        }
                        file.sync_all()
                    });
                    match written {
                        Ok(()) => durable.lock().unwrap().push((path, seed, data.len())),
                        Err(_) => return, // the daemon is gone
                    }
                    // Unsynced data in another file, to be lost or kept whole.
                    let _ = fs::write(root.join(format!("unsynced-{writer}")), &data);
                }
            })
        })
        .collect();
    let started = Instant::now();
    while durable.lock().unwrap().len() < 150 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut daemon = mounted.daemon.take().unwrap();
    kill_daemon(&mut daemon, &mounted.point);
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
    // The kernel side is left as "transport endpoint is not connected".
    assert!(unmount_command(&mounted.point, true).status.success());
    let durable = durable.lock().unwrap().clone();
    assert!(durable.len() >= 150, "only {} files were fsynced", durable.len());
    mounted.fsck_clean();
    mounted.mount(options);
    for (path, seed, length) in &durable {
        let found = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(found == pattern(*seed, *length), "{} differs after the crash", path.display());
    }
    mounted.unmount();
    mounted.fsck_clean();
}

/// SIGTERM unmounts, writes back what was only cached, and exits 0.
#[test]
fn sigterm_writes_back_and_unmounts_cleanly() {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new(4096, "256M", "writeback_interval_ms=0,commit_interval_ms=0");
    let data = pattern(99, 5 << 20);
    fs::write(mounted.path("cached"), &data).unwrap();
    let mut daemon = mounted.daemon.take().unwrap();
    ok("kill", &["-TERM", &daemon.id().to_string()]);
    let status = wait_with_timeout(&mut daemon, Duration::from_secs(60));
    assert!(status.success(), "daemon exited with {status} on SIGTERM");
    assert!(!is_mounted(&mounted.point));
    mounted.fsck_clean();
    mounted.mount("ro");
    assert!(fs::read(mounted.path("cached")).unwrap() == data);
    // Read-only: every change is EROFS.
    assert_eq!(errno_of(fs::write(mounted.path("new"), b"x")), libc::EROFS);
    mounted.unmount();
}

/// The background form (`foliofs mount` without -f) and the helper name
/// mount(8) runs for `-t fuse.foliofs` both return once mounted.
#[test]
fn background_mount_and_the_mount_helper_name() {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new(4096, "64M", "");
    mounted.unmount();
    let helper_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let helper = helper_dir.path().join("mount.fuse.foliofs");
    std::os::unix::fs::symlink(FOLIOFS, &helper).unwrap();
    // As mount(8) calls it: IMAGE MOUNTPOINT -o OPTIONS (plus flags to ignore).
    let output = Command::new(&helper)
        .args([mounted.image_str(), mounted.point.to_str().unwrap(), "-n", "-o", "rw,dirty=folio"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(is_mounted(&mounted.point), "the helper returned before the mount appeared");
    fs::write(mounted.path("through-helper"), b"hello").unwrap();
    assert!(unmount_command(&mounted.point, false).status.success());
    // The daemon closes the volume after the unmount; wait for the image to
    // be released, then the file is there.
    let started = Instant::now();
    loop {
        let cat = run(FOLIOFS, &["cat", &format!("{}:/through-helper", mounted.image_str())]);
        if cat.status.success() && cat.stdout == b"hello" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "file not found after unmount");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Bad options fail before anything is mounted, naming the option.
    let bad = run(
        FOLIOFS,
        &["mount", "-o", "bogus=1", mounted.image_str(), mounted.point.to_str().unwrap()],
    );
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("\"bogus\""));
    let missing = run(FOLIOFS, &["mount", "/no/such/image", mounted.point.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/no/such/image"));
    assert!(!is_mounted(&mounted.point));
}

/// POSIX errnos and semantics as programs see them through the kernel.
#[test]
fn errnos_and_namespace_semantics_through_the_mount() {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new(4096, "64M", "");
    let root = mounted.point.clone();
    // The mounted image is locked: another foliofs command refuses it, read
    // or write, naming the image, instead of reading it mid-change.
    for command in [["ls", ":/"], ["fsck", ""]] {
        let target = format!("{}{}", mounted.image_str(), command[1]);
        let refused = run(FOLIOFS, &[command[0], &target]);
        assert!(!refused.status.success(), "{command:?} on a mounted image");
        assert!(String::from_utf8_lossy(&refused.stderr).contains("in use"), "{refused:?}");
    }
    fs::create_dir(root.join("d")).unwrap();
    fs::write(root.join("d/f"), b"data").unwrap();
    assert_eq!(errno_of(fs::create_dir(root.join("d"))), libc::EEXIST);
    assert_eq!(errno_of(fs::read(root.join("missing"))), libc::ENOENT);
    assert_eq!(errno_of(fs::remove_dir(root.join("d"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(fs::remove_file(root.join("d"))), libc::EISDIR);
    assert_eq!(errno_of(fs::read_dir(root.join("d/f"))), libc::ENOTDIR);
    assert_eq!(errno_of(fs::write(root.join("n".repeat(256)), b"")), libc::ENAMETOOLONG);
    assert_eq!(errno_of(fs::rename(root.join("d"), root.join("d/inside"))), libc::EINVAL);
    // Special files: special_files_through_the_mount.

    // rename(2) replaces; RENAME_NOREPLACE and RENAME_EXCHANGE via renameat2.
    fs::write(root.join("a"), b"A").unwrap();
    fs::write(root.join("b"), b"B").unwrap();
    assert_eq!(renameat2(&root.join("a"), &root.join("b"), libc::RENAME_NOREPLACE), libc::EEXIST);
    assert_eq!(renameat2(&root.join("a"), &root.join("b"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(root.join("a")).unwrap(), b"B");
    assert_eq!(fs::read(root.join("b")).unwrap(), b"A");
    fs::rename(root.join("a"), root.join("b")).unwrap();
    assert_eq!(fs::read(root.join("b")).unwrap(), b"B");

    // Links, symlinks, attributes.
    fs::hard_link(root.join("b"), root.join("b2")).unwrap();
    assert_eq!(fs::metadata(root.join("b")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("b", root.join("s")).unwrap();
    assert_eq!(fs::read_link(root.join("s")).unwrap(), Path::new("b"));
    fs::set_permissions(root.join("b"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(root.join("b2")).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(root.join("b"), Some(1234), Some(5678)).unwrap();
    let meta = fs::metadata(root.join("b")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
    ok("touch", &["-m", "-d", "@1000000000.5", root.join("b").to_str().unwrap()]);
    assert_eq!(fs::metadata(root.join("b")).unwrap().mtime(), 1_000_000_000);

    // An unlinked open file lives until closed.
    let mut open = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(root.join("tmp"))
        .unwrap();
    fs::remove_file(root.join("tmp")).unwrap();
    open.write_all(b"still here").unwrap();
    open.seek(SeekFrom::Start(0)).unwrap();
    let mut back = String::new();
    open.read_to_string(&mut back).unwrap();
    assert_eq!(back, "still here");
    drop(open);

    // O_DIRECT: misaligned offsets are EINVAL and change nothing.
    let direct = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(root.join("direct"))
        .unwrap();
    assert_eq!(errno_of(direct.write_at(&[1u8; 512], 100)), libc::EINVAL);
    assert_eq!(direct.metadata().unwrap().len(), 0);
    drop(direct);

    // statfs: free space falls as data is written and rises when freed.
    let free_before = free_bytes(&root);
    fs::write(root.join("space"), vec![1u8; 8 << 20]).unwrap();
    ok("sync", &["-f", root.join("space").to_str().unwrap()]);
    let free_during = free_bytes(&root);
    assert!(free_before - free_during >= 8 << 20, "{free_before} -> {free_during}");
    fs::remove_file(root.join("space")).unwrap();
    ok("sync", &["-f", root.to_str().unwrap()]);

    // A full volume: ENOSPC from the write, earlier files intact.
    let mut filler = fs::File::create(root.join("filler")).unwrap();
    let chunk = vec![7u8; 1 << 20];
    let full = loop {
        if let Err(error) = filler.write_all(&chunk) {
            break error.raw_os_error();
        }
    };
    assert_eq!(full, Some(libc::ENOSPC));
    drop(filler);
    assert_eq!(fs::read(root.join("d/f")).unwrap(), b"data");
    fs::remove_file(root.join("filler")).unwrap();
    mounted.unmount();
    mounted.fsck_clean();
}

fn free_bytes(path: &Path) -> i64 {
    let output = ok("stat", &["-f", "-c", "%a %S", path.to_str().unwrap()]);
    let mut fields = output.split_whitespace().map(|field| field.parse::<i64>().unwrap());
    fields.next().unwrap() * fields.next().unwrap()
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> i32 {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let from = CString::new(from.as_os_str().as_bytes()).unwrap();
    let to = CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: renameat2 has no std wrapper; both paths are valid
    // NUL-terminated strings that outlive the call.
    let result = unsafe {
        libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags)
    };
    if result == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

/// A volume mounted by the background form (`foliofs mount` without -f), as
/// a user or mount(8) runs it: the daemon is not our child. Unmounts lazily
/// if a test fails with it mounted.
struct Background {
    dir: tempfile::TempDir,
    image: PathBuf,
    point: PathBuf,
    log: PathBuf,
}

impl Background {
    fn new(size: &str) -> Self {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let image = dir.path().join("vol.img");
        let point = dir.path().join("mnt");
        let log = dir.path().join("daemon.log");
        fs::create_dir(&point).unwrap();
        let point = point.canonicalize().unwrap();
        ok(FOLIOFS, &["mkfs", image.to_str().unwrap(), "--size", size]);
        Self { dir, image, point, log }
    }

    fn image_str(&self) -> &str {
        self.image.to_str().unwrap()
    }

    fn point_str(&self) -> &str {
        self.point.to_str().unwrap()
    }

    /// `foliofs mount IMAGE MOUNTPOINT -o log=...,OPTIONS` (or the same
    /// through `program`, the helper name); returns once mounted.
    fn mount_with(&self, program: &Path, options: &str) -> Output {
        let options = transport::with(&format!("log={},{options}", self.log.display()));
        let mut command = Command::new(program);
        if program == Path::new(FOLIOFS) {
            command.arg("mount");
        }
        let output = command
            .args([self.image_str(), self.point_str(), "-o", &options])
            .output()
            .expect("run foliofs mount");
        if output.status.success() {
            assert!(is_mounted(&self.point), "mount returned before the mount appeared");
        }
        output
    }

    fn mount(&self, options: &str) {
        let output = self.mount_with(Path::new(FOLIOFS), options);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }

    /// umount, then the documented wait for the daemon to close the volume:
    /// the image's lock, which the daemon holds until the volume is closed.
    fn unmount(&self) {
        umount(self.point_str());
        ok("flock", &[self.image_str(), "true"]);
        assert!(!is_mounted(&self.point));
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the daemon to log `text` (it logs after acting).
    fn wait_for_log(&self, text: &str) -> String {
        let started = Instant::now();
        loop {
            let log = self.log_text();
            if log.contains(text) {
                return log;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no {text:?} in the log:\n{log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// This mount's line in /proc/self/mountinfo, split at " - ": (per-mount
    /// part, file-system part).
    fn mountinfo(&self) -> (String, String) {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mountinfo
            .lines()
            .rfind(|line| line.split(' ').nth(4) == Some(self.point_str()))
            .expect("mounted");
        let (mount, filesystem) = line.split_once(" - ").unwrap();
        (mount.to_string(), filesystem.to_string())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if is_mounted(&self.point) {
            let _ = Command::new("umount").arg("-l").arg(&self.point).output();
            // Bounded: a second view of the volume a failed test left
            // mounted keeps the daemon, and its lock, alive.
            let _ = Command::new("flock").arg("-w").arg("30").arg(&self.image).arg("true").output();
        }
    }
}

extern "C" fn ignore_signal(_signal: libc::c_int) {}

/// The backgrounded daemon outlives the `foliofs mount` that started it, and
/// a signal storm against a thread doing I/O on the mount (thousands of
/// interrupted FUSE requests, each of which fuser answers with a reply the
/// kernel refuses) neither kills it nor logs anything at error level.
#[test]
fn backgrounded_daemon_survives_a_signal_storm_and_logs_no_error() {
    if skip_requested() {
        return;
    }
    require(&["flock"]);
    let mounted = Background::new("256M");
    mounted.mount("");
    // SAFETY: installs a handler that does nothing, for SIGUSR1, which only
    // this test sends and only to its own I/O thread; no SA_RESTART, so each
    // signal interrupts the system call it lands in.
    let previous = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        let mut previous: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(libc::SIGUSR1, &action, &mut previous), 0);
        previous
    };
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(Mutex::new(0u64));
    let path = mounted.point.join("stormy");
    let io = {
        let (stop, rounds) = (Arc::clone(&stop), Arc::clone(&rounds));
        std::thread::spawn(move || {
            let data = pattern(7, 4 << 20);
            while !stop.load(Ordering::Relaxed) {
                // std retries what EINTR interrupts; anything else fails.
                let mut file = fs::File::create(&path).unwrap();
                for chunk in data.chunks(64 << 10) {
                    file.write_all(chunk).unwrap();
                }
                file.sync_all().unwrap();
                drop(file);
                assert!(fs::read(&path).unwrap() == data, "data changed under the storm");
                *rounds.lock().unwrap() += 1;
            }
        })
    };
    let thread = std::os::unix::thread::JoinHandleExt::as_pthread_t(&io);
    let mut signals = 0u64;
    while signals < 20_000 || *rounds.lock().unwrap() < 3 {
        // SAFETY: the thread is alive until `stop` is set, and it is set
        // only after the last signal.
        assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
        signals += 1;
        // Spaced, so the signals land in different requests instead of
        // merging while one is pending.
        std::thread::sleep(Duration::from_micros(20));
    }
    stop.store(true, Ordering::Relaxed);
    io.join().expect("the I/O thread failed");
    // SAFETY: restores the disposition saved above.
    unsafe { libc::sigaction(libc::SIGUSR1, &previous, std::ptr::null_mut()) };

    // The daemon is alive and serving.
    assert!(is_mounted(&mounted.point));
    fs::write(mounted.point.join("after"), b"still serving").unwrap();
    assert_eq!(fs::read(mounted.point.join("after")).unwrap(), b"still serving");
    mounted.unmount();
    let log = mounted.wait_for_log("unmounted; the volume is closed");
    assert!(!log.contains("ERROR"), "the daemon logged an error:\n{log}");
    // The storm did interrupt requests (the daemon counts the kernel's
    // refusals of their replies): otherwise this test tested nothing.
    let refused = log
        .lines()
        .find_map(|line| line.split_once(" replies to interrupted requests"))
        .and_then(|(before, _)| before.rsplit(' ').next()?.parse::<u64>().ok());
    eprintln!(
        "{signals} signals, {} rounds of I/O, {refused:?} refused replies",
        rounds.lock().unwrap()
    );
    assert!(
        refused.is_some_and(|count| count > 0),
        "{signals} signals interrupted nothing:\n{log}"
    );
    let stored = run(FOLIOFS, &["cat", &format!("{}:/stormy", mounted.image_str())]);
    assert!(stored.stdout == pattern(7, 4 << 20), "the file differs after unmount");
    let report = ok(FOLIOFS, &["fsck", mounted.image_str()]);
    assert!(report.contains("clean"), "{report}");
}

/// `-o log=PATH` gets the daemon's lines, as plain text; so does a file
/// that is the stderr of a foreground mount.
#[test]
fn log_lines_are_plain_text_off_a_terminal() {
    if skip_requested() {
        return;
    }
    require(&["flock"]);
    let mounted = Background::new("64M");
    mounted.mount("");
    mounted.unmount();
    let log = mounted.wait_for_log("unmounted; the volume is closed");
    assert!(log.contains("INFO") && log.contains("mounted on"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in the log file:\n{log:?}");

    let stderr_path = mounted.dir.path().join("stderr");
    let stderr = fs::File::create(&stderr_path).unwrap();
    let mut daemon = Command::new(FOLIOFS)
        .args(["mount", "-f", mounted.image_str(), mounted.point_str()])
        .stdin(Stdio::null())
        .stderr(stderr)
        .env("FOLIOFS_LOG", "debug")
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !is_mounted(&mounted.point) {
        assert!(daemon.try_wait().unwrap().is_none(), "foliofs mount -f exited early");
        assert!(started.elapsed() < Duration::from_secs(20), "mount did not appear");
        std::thread::sleep(Duration::from_millis(10));
    }
    fs::write(mounted.point.join("f"), b"x").unwrap();
    umount(mounted.point_str());
    assert!(wait_with_timeout(&mut daemon, Duration::from_secs(60)).success());
    let stderr = fs::read_to_string(&stderr_path).unwrap();
    assert!(stderr.contains("DEBUG"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "colour codes on a stderr that is a file:\n{stderr:?}");
}

/// /proc/mounts shows the type as fuse.foliofs (so mount(8) finds the
/// helper for a remount), and the standard flags reach the kernel.
#[test]
fn mount_type_and_standard_flags_reach_the_kernel() {
    if skip_requested() {
        return;
    }
    require(&["flock"]);
    let mounted = Background::new("64M");
    mounted.mount("nodiratime,lazytime,nosymfollow,iversion,suid,dev,relatime,strictatime,noexec");
    let (mount, filesystem) = mounted.mountinfo();
    assert!(filesystem.starts_with("fuse.foliofs "), "{filesystem}");
    let mount_flags: Vec<&str> = mount.split(' ').nth(5).unwrap().split(',').collect();
    for wanted in ["rw", "nodiratime", "nosymfollow", "noexec"] {
        assert!(mount_flags.contains(&wanted), "{wanted} missing from {mount}");
    }
    // suid and dev lift the defaults; strictatime, last, wins over relatime.
    for unwanted in ["nosuid", "nodev", "relatime", "noatime"] {
        assert!(!mount_flags.contains(&unwanted), "{unwanted} in {mount}");
    }
    assert!(filesystem.contains(" rw,lazytime,"), "{filesystem}");
    // nosymfollow is honoured: a symlink on the mount is not followed.
    fs::write(mounted.point.join("target"), b"t").unwrap();
    std::os::unix::fs::symlink("target", mounted.point.join("link")).unwrap();
    assert_eq!(errno_of(fs::read(mounted.point.join("link"))), libc::ELOOP);
    mounted.unmount();
    let bad = run(FOLIOFS, &["mount", "-o", "mand", mounted.image_str(), mounted.point_str()]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("mandatory locks"), "{bad:?}");
    assert!(!is_mounted(&mounted.point));
}

/// `mount -o remount,ro` runs the helper with the mount's options plus
/// remount,ro: the mount turns read-only (EROFS), the daemon writes the
/// volume back; remount,rw makes it writable again. A volume mounted ro
/// was opened read-only and refuses rw with the reason.
#[test]
fn remount_read_only_and_back_through_the_helper() {
    if skip_requested() {
        return;
    }
    require(&["flock"]);
    let mounted = Background::new("64M");
    let helper = mounted.dir.path().join("mount.fuse.foliofs");
    std::os::unix::fs::symlink(FOLIOFS, &helper).unwrap();
    let output = mounted.mount_with(&helper, "rw");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    write_from_child(&mounted.point.join("before"), "written rw");
    // What mount(8) (util-linux 2.38) passes for `mount -o remount,ro MNT`.
    let remount = |options: &str| {
        while_busy(|| {
            Command::new(&helper)
                .args([mounted.image_str(), mounted.point_str(), "-o", options])
                .output()
                .unwrap()
        })
    };
    let to_ro = remount("rw,nosuid,nodev,relatime,remount,ro,user_id=0,group_id=0");
    assert!(to_ro.status.success(), "{}", String::from_utf8_lossy(&to_ro.stderr));
    mounted.wait_for_log("remounted read-only: the volume is written back and checkpointed");
    let (_, filesystem) = mounted.mountinfo();
    assert!(filesystem.contains(" ro,"), "{filesystem}");
    assert_eq!(errno_of(fs::write(mounted.point.join("during"), b"x")), libc::EROFS);
    assert_eq!(errno_of(fs::remove_file(mounted.point.join("before"))), libc::EROFS);
    assert_eq!(fs::read(mounted.point.join("before")).unwrap(), b"written rw");
    // Options a live mount cannot change are refused by name.
    let fixed = remount("remount,rw,page_cache=kernel");
    assert!(String::from_utf8_lossy(&fixed.stderr).contains("page_cache=kernel"), "{fixed:?}");
    // ...but the options the mount was made with, which mount(8) repeats
    // from its utab, change nothing and pass.
    let same = remount(&format!("remount,ro,log={}", mounted.log.display()));
    assert!(same.status.success(), "{}", String::from_utf8_lossy(&same.stderr));
    let to_rw = remount("ro,nosuid,nodev,relatime,remount,rw");
    assert!(to_rw.status.success(), "{}", String::from_utf8_lossy(&to_rw.stderr));
    write_from_child(&mounted.point.join("after"), "written rw again");
    // mount(8) without the helper (-i) remounts by itself; the daemon
    // follows the mount table all the same.
    let plain = while_busy(|| run("mount", &["-i", "-o", "remount,ro", mounted.point_str()]));
    assert!(plain.status.success(), "{plain:?}");
    let started = Instant::now();
    while mounted.log_text().matches("remounted read-only").count() < 2 {
        assert!(started.elapsed() < Duration::from_secs(30), "{}", mounted.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(errno_of(fs::write(mounted.point.join("during"), b"x")), libc::EROFS);
    mounted.unmount();
    for (name, data) in [("before", "written rw"), ("after", "written rw again")] {
        let stored = ok(FOLIOFS, &["cat", &format!("{}:/{name}", mounted.image_str())]);
        assert_eq!(stored, data);
    }
    let report = ok(FOLIOFS, &["fsck", mounted.image_str()]);
    assert!(report.contains("clean"), "{report}");

    // Mounted ro: the volume was opened read-only; rw is refused, the
    // mount stays read-only.
    mounted.mount("ro");
    let refused = remount("ro,remount,rw");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("opened read-only"), "{refused:?}");
    let (_, filesystem) = mounted.mountinfo();
    assert!(filesystem.contains(" ro,"), "{filesystem}");
    mounted.unmount();
}

/// The background daemon is detached from whoever started it: its own
/// session, `/` as working directory, stdin/stdout/stderr on /dev/null.
#[test]
fn background_daemon_is_detached_from_its_caller() {
    if skip_requested() {
        return;
    }
    require(&["flock"]);
    let mounted = Background::new("64M");
    mounted.mount("");
    let daemon = fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.contains("--daemon") && cmdline.contains(mounted.image_str())
        })
        .expect("the daemon's process");
    let stat = fs::read_to_string(format!("/proc/{daemon}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    assert_eq!(fields[3], daemon.to_string(), "not a session leader: {stat}");
    assert_eq!(fs::read_link(format!("/proc/{daemon}/cwd")).unwrap(), Path::new("/"));
    for fd in 0..=2 {
        let target = fs::read_link(format!("/proc/{daemon}/fd/{fd}")).unwrap();
        assert_eq!(target, Path::new("/dev/null"), "fd {fd}");
    }
    mounted.unmount();
}

/// Mounting an image that is already mounted gives a second view of the same
/// mount (one volume, one daemon), as a block file system mounted twice
/// shares one superblock: a rename through one view is seen through the
/// other, and the daemon closes the volume only when the last view goes.
#[test]
fn mounting_a_mounted_image_again_binds_the_live_mount() {
    if skip_requested() {
        return;
    }
    require(&["flock"]);
    let mounted = Background::new("64M");
    mounted.mount("");
    let second = mounted.dir.path().join("second");
    fs::create_dir(&second).unwrap();
    let output = Command::new(FOLIOFS)
        .args(["mount", mounted.image_str(), second.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.stderr.is_empty(), "a mount helper succeeds quietly: {output:?}");
    // One file system under both: the same device number in mountinfo.
    let device_of = |point: &Path| {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mountinfo.lines().find(|line| line.split(' ').nth(4) == point.to_str());
        line.and_then(|line| line.split(' ').nth(2)).map(str::to_string)
    };
    assert!(device_of(&second).is_some(), "the second view is not mounted");
    assert_eq!(device_of(&mounted.point), device_of(&second));
    fs::create_dir(mounted.point.join("A")).unwrap();
    fs::create_dir(second.join("B")).unwrap();
    fs::write(mounted.point.join("A/f"), b"one volume").unwrap();
    fs::rename(second.join("A/f"), second.join("B/f")).unwrap();
    assert_eq!(fs::read(mounted.point.join("B/f")).unwrap(), b"one volume");

    umount(mounted.point_str());
    assert_eq!(fs::read(second.join("B/f")).unwrap(), b"one volume", "the second view serves on");
    umount(second.to_str().unwrap());
    ok("flock", &[mounted.image_str(), "true"]);
    let report = ok(FOLIOFS, &["fsck", mounted.image_str()]);
    assert!(report.contains("clean"), "{report}");
}

/// The second mount of an image is a mount of its own, as a block device
/// mounted again is, not a peer of the first: a mount made later under one
/// does not appear under the other, even when the first is shared
/// (xfstests generic/409 and 411 count the mounts).
#[test]
fn mounting_a_mounted_image_again_joins_no_peer_group() {
    if skip_requested() {
        return;
    }
    require(&[]);
    let mounted = Background::new("64M");
    mounted.mount("");
    ok("mount", &["--make-shared", mounted.point_str()]);
    let second = mounted.dir.path().join("second");
    fs::create_dir(&second).unwrap();
    ok(FOLIOFS, &["mount", mounted.image_str(), second.to_str().unwrap()]);
    fs::create_dir(mounted.point.join("sub")).unwrap();
    let on_second = second.join("sub");
    ok("mount", &["-t", "tmpfs", "none", on_second.to_str().unwrap()]);
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(mounted.dir.path()))
        .collect();
    let on_first = mounted.point.join("sub");
    let propagated = points.iter().any(|point| Path::new(point) == on_first);
    // Unmounting it unmounts its propagated copy, if any, too.
    umount(on_second.to_str().unwrap());
    umount(second.to_str().unwrap());
    assert!(!propagated, "a mount under the second view appeared under the first: {points:?}");
    mounted.unmount();
}

/// xfstests' fsx -Z (generic/263): a file opened O_DIRECT and also mapped
/// shared. The kernel writes the mapped pages back through that O_DIRECT
/// handle, the last one partial at end of file; those writes come from its
/// page cache (FUSE_WRITE_CACHE) and must be stored as written, not refused
/// as misaligned direct I/O. Stores, msync and a read back through a plain
/// handle, a direct one and after remount, in both page-cache modes.
#[test]
fn mmap_of_an_o_direct_file_writes_back_through_msync() {
    if skip_requested() {
        return;
    }
    require(&[]);
    // Not a multiple of the page or the sector: the last page is partial.
    const FILE_BYTES: usize = 3 * 4096 + 1000;
    for options in ["", "page_cache=kernel"] {
        let mut mounted = Mounted::new(4096, "64M", options);
        let path = mounted.path("mapped");
        fs::write(&path, pattern(1, FILE_BYTES)).unwrap();
        let direct = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let stored = pattern(2, FILE_BYTES);
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a fresh shared mapping of a file this test owns, used
            // only inside this block and unmapped at its end; nothing else
            // maps or truncates the file meanwhile.
            let mapping = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    FILE_BYTES,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    direct.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(mapping, libc::MAP_FAILED, "{options:?}: mmap of an O_DIRECT file");
            // SAFETY: the mapping is FILE_BYTES long, readable and writable.
            let bytes = unsafe { std::slice::from_raw_parts_mut(mapping.cast::<u8>(), FILE_BYTES) };
            bytes.copy_from_slice(&stored);
            // SAFETY: msync and munmap of the mapping made above.
            let synced = unsafe { libc::msync(mapping, FILE_BYTES, libc::MS_SYNC) };
            let sync_error = std::io::Error::last_os_error();
            // SAFETY: as above; the slice is not used after this.
            assert_eq!(unsafe { libc::munmap(mapping, FILE_BYTES) }, 0);
            assert_eq!(synced, 0, "{options:?}: msync of an O_DIRECT mapping: {sync_error}");
        }
        let mut through_direct = vec![0u8; FILE_BYTES.div_ceil(4096) * 4096 + 4096];
        // An O_DIRECT read needs an aligned buffer: read into an aligned slice.
        let offset = through_direct.as_ptr().align_offset(4096);
        let aligned = &mut through_direct[offset..offset + FILE_BYTES.div_ceil(4096) * 4096];
        assert_eq!(direct.read_at(aligned, 0).unwrap(), FILE_BYTES, "{options:?}");
        assert!(aligned[..FILE_BYTES] == stored[..], "{options:?}: direct read after msync");
        drop(direct);
        assert!(fs::read(&path).unwrap() == stored, "{options:?}: buffered read after msync");
        mounted.remount(options);
        assert!(fs::read(&path).unwrap() == stored, "{options:?}: read after remount");
        mounted.unmount();
        mounted.fsck_clean();
    }
}

fn c_path(path: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// lsetxattr(2): 0 or the errno.
fn set_xattr(path: &Path, name: &str, value: &[u8], flags: i32) -> i32 {
    let (path, name) = (c_path(path), std::ffi::CString::new(name).unwrap());
    // SAFETY: both strings are NUL-terminated and the value slice is valid
    // for its length, all outliving the call.
    let result = unsafe {
        libc::lsetxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags)
    };
    if result == 0 {
        0
    } else {
        last_errno()
    }
}

/// lgetxattr(2) into a buffer of `size` bytes: the value or the errno.
fn get_xattr(path: &Path, name: &str, size: usize) -> Result<Vec<u8>, i32> {
    let (path, name) = (c_path(path), std::ffi::CString::new(name).unwrap());
    let mut buffer = vec![0u8; size];
    // SAFETY: the strings are NUL-terminated; the buffer is writable for
    // `size` bytes (a null pointer with size 0 asks for the length).
    let length = unsafe {
        let pointer = if size == 0 { std::ptr::null_mut() } else { buffer.as_mut_ptr().cast() };
        libc::lgetxattr(path.as_ptr(), name.as_ptr(), pointer, size)
    };
    if length < 0 {
        return Err(last_errno());
    }
    buffer.truncate(length as usize);
    Ok(buffer)
}

/// llistxattr(2) into a buffer of `size` bytes: the list or the errno.
fn list_xattr(path: &Path, size: usize) -> Result<Vec<u8>, i32> {
    let path = c_path(path);
    let mut buffer = vec![0u8; size];
    // SAFETY: as in get_xattr.
    let length = unsafe {
        let pointer = if size == 0 { std::ptr::null_mut() } else { buffer.as_mut_ptr().cast() };
        libc::llistxattr(path.as_ptr(), pointer, size)
    };
    if length < 0 {
        return Err(last_errno());
    }
    buffer.truncate(length as usize);
    Ok(buffer)
}

#[test]
fn xattrs_through_the_mount_with_setfattr_and_getfattr() {
    if skip_requested() {
        return;
    }
    require(&["setfattr", "getfattr", "setpriv", "cp"]);
    let mut mounted = Mounted::new(4096, "64M", "");
    let root = mounted.point.clone();
    let file = root.join("f");
    fs::write(&file, b"data").unwrap();
    fs::create_dir(root.join("d")).unwrap();
    let file_str = file.to_str().unwrap();
    ok("setfattr", &["-n", "user.mime", "-v", "text/plain", file_str]);
    ok("setfattr", &["-n", "trusted.overlay.opaque", "-v", "y", file_str]);
    ok("setfattr", &["-n", "security.test", "-v", "0x00ff00", file_str]);
    ok("setfattr", &["-n", "user.dir", "-v", "yes", root.join("d").to_str().unwrap()]);
    let dump = ok("getfattr", &["--absolute-names", "-d", "-m", "-", "-e", "text", file_str]);
    assert!(dump.contains("user.mime=\"text/plain\""), "{dump}");
    assert!(dump.contains("trusted.overlay.opaque=\"y\""), "{dump}");
    let missing = run("getfattr", &["-n", "user.missing", file_str]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("No such attribute"), "{missing:?}");

    // Limits and errnos, from the kernel's checks and the volume's.
    assert_eq!(set_xattr(&file, "user.big", &vec![1; 65536], 0), 0);
    assert_eq!(get_xattr(&file, "user.big", 65536).unwrap().len(), 65536);
    assert_eq!(get_xattr(&file, "user.big", 0).unwrap().len(), 0, "size query");
    assert_eq!(get_xattr(&file, "user.big", 100), Err(libc::ERANGE));
    assert_eq!(set_xattr(&file, "user.big", &vec![1; 65537], 0), libc::E2BIG);
    assert_eq!(set_xattr(&file, &format!("user.{}", "n".repeat(251)), b"v", 0), libc::ERANGE);
    assert_eq!(set_xattr(&file, &format!("user.{}", "n".repeat(250)), b"v", 0), 0);
    assert_eq!(set_xattr(&file, "user.mime", b"x", libc::XATTR_CREATE), libc::EEXIST);
    assert_eq!(set_xattr(&file, "user.none", b"x", libc::XATTR_REPLACE), libc::ENODATA);
    assert_eq!(set_xattr(&file, "os2.name", b"x", 0), libc::EOPNOTSUPP);
    assert_eq!(get_xattr(&file, "user.none", 100), Err(libc::ENODATA));
    std::os::unix::fs::symlink("f", root.join("link")).unwrap();
    assert_eq!(set_xattr(&root.join("link"), "user.x", b"x", 0), libc::EPERM);
    let list_length = list_xattr(&file, 0).unwrap().len();
    assert_eq!(list_length, 0, "a size query returns no bytes");
    assert_eq!(list_xattr(&file, 8), Err(libc::ERANGE));
    let names = list_xattr(&file, 65536).unwrap();
    assert!(names.split(|&byte| byte == 0).any(|name| name == b"trusted.overlay.opaque"));
    // A caller without CAP_SYS_ADMIN sees neither trusted names nor values.
    let as_user = |args: &[&str]| {
        let mut all = vec!["--bounding-set=-sys_admin", "--inh-caps=-sys_admin"];
        all.extend_from_slice(args);
        run("setpriv", &all)
    };
    let listed = as_user(&["getfattr", "--absolute-names", "-d", "-m", "-", file_str]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.contains("user.mime") && !listed.contains("trusted."), "{listed}");
    let unprivileged_list = std::thread::spawn({
        let file = file.clone();
        move || {
            drop_sys_admin_in_this_thread();
            list_xattr(&file, 65536).unwrap()
        }
    });
    let names = unprivileged_list.join().unwrap();
    let names: Vec<&[u8]> = names.split(|&byte| byte == 0).filter(|n| !n.is_empty()).collect();
    assert!(names.contains(&&b"user.mime"[..]), "{names:?}");
    assert!(!names.iter().any(|name| name.starts_with(b"trusted.")), "{names:?}");
    let refused = as_user(&["setfattr", "-n", "trusted.x", "-v", "1", file_str]);
    assert!(!refused.status.success());
    // The kernel checks CAP_SYS_ADMIN for trusted values (the daemon trusts
    // that check: overlayfs writes them with its mounter's credentials).
    let refused = as_user(&["getfattr", "-n", "trusted.overlay.opaque", file_str]);
    assert!(!refused.status.success(), "{refused:?}");
    let refused = as_user(&["setfattr", "-x", "trusted.overlay.opaque", file_str]);
    assert!(!refused.status.success(), "{refused:?}");
    // Removal, then a remount and cp -a, which carries user attributes.
    ok("setfattr", &["-x", "user.big", file_str]);
    assert_eq!(get_xattr(&file, "user.big", 10), Err(libc::ENODATA));
    let before = ok("getfattr", &["--absolute-names", "-d", "-m", "-", "-e", "hex", file_str]);
    mounted.remount("");
    let after = ok("getfattr", &["--absolute-names", "-d", "-m", "-", "-e", "hex", file_str]);
    assert_eq!(after, before, "attributes changed across the remount");
    assert!(after.contains("user.mime=0x746578742f706c61696e"), "{after}");
    ok("cp", &["-a", file_str, root.join("copy").to_str().unwrap()]);
    assert_eq!(get_xattr(&root.join("copy"), "user.mime", 100).unwrap(), b"text/plain");
    mounted.unmount();
    mounted.fsck_clean();
}

#[test]
fn special_files_through_the_mount() {
    if skip_requested() {
        return;
    }
    require(&["mkfifo", "mknod", "stat"]);
    let mut mounted = Mounted::new(4096, "64M", "");
    let root = mounted.point.clone();
    let path = |name: &str| root.join(name).to_str().unwrap().to_string();
    ok("mkfifo", &["-m", "0640", &path("fifo")]);
    ok("mknod", &["-m", "0620", &path("null"), "c", "1", "3"]);
    ok("mknod", &["-m", "0660", &path("loop"), "b", "7", "200"]);
    let listener = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    // A FIFO carries data between two openers (the kernel's pipe).
    let reader = std::thread::spawn({
        let fifo = root.join("fifo");
        move || fs::read(fifo).unwrap()
    });
    fs::write(root.join("fifo"), b"through the pipe").unwrap();
    assert_eq!(reader.join().unwrap(), b"through the pipe");
    // A unix socket accepts a connection.
    let client = std::os::unix::net::UnixStream::connect(root.join("sock")).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    (&client).write_all(b"ping").unwrap();
    let mut ping = [0u8; 4];
    server.read_exact(&mut ping).unwrap();
    assert_eq!(&ping, b"ping");
    drop((client, server, listener));
    // nodev by default: device nodes exist but do not open.
    assert_eq!(errno_of(fs::File::open(root.join("null"))), libc::EACCES);
    let expected = [
        ("fifo", "fifo 0 0 640"),
        ("sock", "socket 0 0 "),
        ("null", "character special file 1 3 620"),
        ("loop", "block special file 7 c8 660"),
    ];
    let check = |root: &Path| {
        for (name, want) in expected {
            let shown = ok("stat", &["-c", "%F %t %T %a", root.join(name).to_str().unwrap()]);
            assert!(shown.trim().starts_with(want), "{name}: {shown}");
        }
    };
    check(&root);
    mounted.remount("");
    check(&root);
    mounted.unmount();
    mounted.fsck_clean();
    let report = ok(FOLIOFS, &["fsck", mounted.image_str()]);
    assert!(report.contains(" 4 special files"), "{report}");
    let listing = ok(FOLIOFS, &["ls", "-l", &format!("{}:/", mounted.image_str())]);
    for kind in ['p', 's', 'c', 'b'] {
        assert!(listing.lines().any(|line| line.starts_with(kind)), "{kind}: {listing}");
    }
    mounted.mount("");
    for name in ["fifo", "sock", "null", "loop"] {
        fs::remove_file(root.join(name)).unwrap();
    }
    mounted.unmount();
    mounted.fsck_clean();
}

/// Clears CAP_SYS_ADMIN from the calling thread's effective set
/// (capabilities are per thread), so requests it makes come from a caller
/// without it.
fn drop_sys_admin_in_this_thread() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_ADMIN: u32 = 21;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset have no libc wrapper; version 3 takes a header
    // and two data structs, both valid and writable for the calls, and pid
    // 0 means the calling thread.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()), 0);
        data[0].effective &= !(1 << CAP_SYS_ADMIN);
        assert_eq!(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()), 0);
    }
}

/// Runs `script` with sh as uid and gid 1000, no supplementary groups.
fn as_uid_1000(script: &str) -> Output {
    run("setpriv", &["--reuid=1000", "--regid=1000", "--clear-groups", "sh", "-c", script])
}

#[test]
fn posix_acls_are_enforced_inherited_and_kept_in_sync_with_the_mode() {
    if skip_requested() {
        return;
    }
    require(&["setfacl", "getfacl", "setpriv", "stat"]);
    let mut mounted = Mounted::new(4096, "64M", "allow_other");
    // Let uid 1000 reach the mount point.
    fs::set_permissions(mounted.point.parent().unwrap(), fs::Permissions::from_mode(0o755))
        .unwrap();
    let root = mounted.point.clone();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    let path = |name: &str| root.join(name).to_str().unwrap().to_string();
    let file = path("secret");
    fs::write(&file, b"for 1000 only").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    let read_as_1000 = || as_uid_1000(&format!("cat {file}"));
    assert!(!read_as_1000().status.success(), "mode 0600 keeps uid 1000 out");
    // A named-user entry lets uid 1000 read; the mode's group bits show the mask.
    ok("setfacl", &["-m", "u:1000:r", &file]);
    let read = read_as_1000();
    assert!(read.status.success(), "{read:?}");
    assert_eq!(read.stdout, b"for 1000 only");
    assert_eq!(ok("stat", &["-c", "%a", &file]).trim(), "640");
    let acl = ok("getfacl", &["-c", "-n", &file]);
    assert!(acl.contains("user:1000:r--") && acl.contains("mask::r--"), "{acl}");
    // chmod sets the mask: with group bits 0 the entry grants nothing.
    ok("chmod", &["600", &file]);
    assert!(ok("getfacl", &["-c", "-n", &file]).contains("mask::---"));
    assert!(!read_as_1000().status.success(), "the mask now denies uid 1000");
    ok("chmod", &["640", &file]);
    assert!(read_as_1000().status.success(), "the mask allows again");

    // A default ACL: new files inherit it in place of the umask.
    let dir = path("shared");
    fs::create_dir(&dir).unwrap();
    ok("setfacl", &["-m", "u:1000:rwx", &dir]);
    ok("setfacl", &["-d", "-m", "u:1000:rwx", &dir]);
    let made = as_uid_1000(&format!("umask 077 && echo hi > {dir}/by1000 && mkdir {dir}/sub"));
    assert!(made.status.success(), "{made:?}");
    ok("sh", &["-c", &format!("umask 077 && touch {dir}/byroot")]);
    assert_eq!(ok("stat", &["-c", "%a", &format!("{dir}/byroot")]).trim(), "664");
    let inherited = ok("getfacl", &["-c", "-n", &format!("{dir}/byroot")]);
    assert!(inherited.contains("user:1000:rwx\t#effective:rw-"), "{inherited}");
    let sub = ok("getfacl", &["-c", "-n", &format!("{dir}/sub")]);
    assert!(sub.contains("default:user:1000:rwx"), "{sub}");
    // uid 1000 can write root's new file through the inherited entry.
    let wrote = as_uid_1000(&format!("echo more >> {dir}/byroot"));
    assert!(wrote.status.success(), "{wrote:?}");

    // Setting an access ACL clears the setgid bit when its setter is
    // neither in the file's group nor holds CAP_FSETID (generic/375), and
    // only then.
    let setgid = path("setgid");
    fs::write(&setgid, b"").unwrap();
    std::os::unix::fs::chown(&setgid, Some(1000), Some(0)).unwrap();
    ok("chmod", &["2775", &setgid]);
    ok("setfacl", &["-m", "u:1000:rwx", &setgid]);
    assert_eq!(ok("stat", &["-c", "%a", &setgid]).trim(), "2775", "root keeps the bit");
    let set = as_uid_1000(&format!("setfacl -m u:1000:rw {setgid}"));
    assert!(set.status.success(), "{set:?}");
    assert_eq!(ok("stat", &["-c", "%a", &setgid]).trim(), "775", "uid 1000 is not in group 0");
    let plain = path("plain");
    fs::write(&plain, b"").unwrap();
    std::os::unix::fs::chown(&plain, Some(1000), Some(0)).unwrap();
    ok("chmod", &["755", &plain]);
    let set = as_uid_1000(&format!("setfacl -m u:1000:rwx,m::rx {plain}"));
    assert!(set.status.success(), "{set:?}");
    assert_eq!(ok("stat", &["-c", "%a", &plain]).trim(), "755");
    let before = ok("getfacl", &["-R", "-n", &path("shared"), &file]);
    mounted.remount("allow_other");
    let after = ok("getfacl", &["-R", "-n", &path("shared"), &file]);
    assert_eq!(after, before, "ACLs changed across the remount");
    assert!(read_as_1000().status.success());
    mounted.unmount();
    mounted.fsck_clean();
}

/// Free blocks of the file system holding `path`, from `df`.
fn free_blocks_of(path: &Path) -> u64 {
    let report = ok("df", &["--output=avail", "-B4096", path.to_str().unwrap()]);
    report.lines().nth(1).and_then(|line| line.trim().parse().ok()).expect("df's avail")
}

/// `cp` asks for FICLONE (which never reaches a FUSE daemon) and then
/// copy_file_range: the mount answers it with a clone, so the copy takes
/// no data blocks, and writes to either file leave the other as it was.
#[test]
fn cp_through_the_mount_clones_and_the_copies_stay_apart() {
    if skip_requested() {
        return;
    }
    require(&["cp", "df"]);
    let mut mounted = Mounted::new(4096, "256M", "");
    let original = pattern(41, (32 << 20) + 1000);
    fs::write(mounted.path("original"), &original).unwrap();
    ok("sync", &[mounted.path_str("original").as_str()]);
    let free_before = free_blocks_of(&mounted.point);
    ok("cp", &[&mounted.path_str("original"), &mounted.path_str("copy")]);
    assert_eq!(fs::read(mounted.path("copy")).unwrap(), original);
    ok("sync", &[mounted.path_str("copy").as_str()]);
    let free_after = free_blocks_of(&mounted.point);
    assert!(
        free_before - free_after < 16,
        "the copy took {} blocks of free space",
        free_before - free_after
    );
    // An overwrite of the copy, buffered and then direct, stays in the copy.
    let copy = fs::OpenOptions::new().write(true).open(mounted.path("copy")).unwrap();
    copy.write_all_at(b"changed", 4096 * 3 + 10).unwrap();
    copy.sync_all().unwrap();
    drop(copy);
    let mut expected = original.clone();
    expected[4096 * 3 + 10..4096 * 3 + 17].copy_from_slice(b"changed");
    mounted.remount("");
    assert_eq!(fs::read(mounted.path("original")).unwrap(), original);
    assert_eq!(fs::read(mounted.path("copy")).unwrap(), expected);
    // A copy that starts inside a block copies its edges and clones the rest.
    let partial = fs::File::create(mounted.path("partial")).unwrap();
    let source = fs::File::open(mounted.path("original")).unwrap();
    let (mut from, mut to) = (100i64, 100i64);
    // SAFETY: two open descriptors and offsets that live across the call.
    let copied = unsafe {
        libc::copy_file_range(
            std::os::fd::AsRawFd::as_raw_fd(&source),
            &mut from,
            std::os::fd::AsRawFd::as_raw_fd(&partial),
            &mut to,
            (1 << 20) + 5000,
            0,
        )
    };
    assert_eq!(copied, (1 << 20) + 5000);
    drop((partial, source));
    let read = fs::read(mounted.path("partial")).unwrap();
    assert_eq!(&read[100..], &original[100..100 + (1 << 20) + 5000]);
    assert!(read[..100].iter().all(|&byte| byte == 0));
    mounted.unmount();
    mounted.fsck_clean();
    let info = ok(FOLIOFS, &["info", mounted.image_str()]);
    assert!(info.contains("shared:"), "{info}");
}

/// A copy_file_range of more than 4 GiB is one call through the mount
/// where the kernel asks FUSE_COPY_FILE_RANGE_64 (Linux 6.18): the daemon
/// answers the whole length at once. An older kernel's FUSE_COPY_FILE_RANGE
/// counts in 32 bits, so there one call copies less than 4 GiB. Before the
/// daemon answered the 64-bit request, 6.18 fell back to the 32-bit one.
#[test]
fn a_copy_of_six_gib_is_one_copy_file_range_call() {
    if skip_requested() {
        return;
    }
    let mounted = Mounted::new(4096, "64M", "");
    let (head, tail) = (pattern(44, 65536), pattern(45, 65536));
    let tail_at = 5u64 << 30;
    let source = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(mounted.path("sparse"))
        .unwrap();
    source.write_all_at(&head, 0).unwrap();
    source.write_all_at(&tail, tail_at).unwrap();
    let length = 6u64 << 30;
    source.set_len(length).unwrap();
    source.sync_all().unwrap();
    let target = fs::File::create(mounted.path("copy")).unwrap();
    let copied = copy_file_range(&source, 0, &target, 0, length as usize) as u64;
    if kernel_at_least(6, 18) {
        assert_eq!(copied, length, "one call copies the whole 6 GiB");
    } else {
        assert!(copied > 0 && copied < 1 << 32, "one 32-bit call copied {copied}");
    }
    drop((source, target));
    let copy = fs::File::open(mounted.path("copy")).unwrap();
    assert_eq!(copy.metadata().unwrap().len(), copied);
    let mut read = vec![0u8; 65536];
    copy.read_exact_at(&mut read, 0).unwrap();
    assert_eq!(read, head);
    copy.read_exact_at(&mut read, 1 << 30).unwrap();
    assert!(read.iter().all(|&byte| byte == 0), "a hole of the source reads as zeros");
    if copied == length {
        copy.read_exact_at(&mut read, tail_at).unwrap();
        assert_eq!(read, tail);
    }
}

/// Whether the running kernel is `major.minor` or newer.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let running_major: u32 = parts.next().unwrap().parse().unwrap();
    let running_minor: u32 = parts.next().unwrap().parse().unwrap();
    (running_major, running_minor) >= (major, minor)
}

/// copy_file_range(2) on `source` and `target` at their offsets: the count.
fn copy_file_range(source: &fs::File, from: i64, target: &fs::File, to: i64, length: usize) -> i64 {
    let (mut from, mut to) = (from, to);
    // SAFETY: two open descriptors and offsets that live across the call.
    let copied = unsafe {
        libc::copy_file_range(
            std::os::fd::AsRawFd::as_raw_fd(source),
            &mut from,
            std::os::fd::AsRawFd::as_raw_fd(target),
            &mut to,
            length,
            0,
        )
    };
    assert!(copied >= 0, "copy_file_range: {}", std::io::Error::last_os_error());
    copied as i64
}

/// A copy_file_range into a file opened O_DSYNC is durable when it
/// returns, as a write through that file is: the daemon, SIGKILLed right
/// after (with no background commit or writeback to save it), leaves the
/// clones, the copied edges and the size on the image. It did not: the
/// library ignored O_DSYNC there.
#[test]
fn copy_file_range_into_an_o_dsync_file_survives_a_sigkill() {
    if skip_requested() {
        return;
    }
    let options = "writeback_interval_ms=0,commit_interval_ms=0";
    let mut mounted = Mounted::new(4096, "64M", options);
    let original = pattern(43, (1 << 20) + 333);
    let source = fs::File::create(mounted.path("source")).unwrap();
    source.write_all_at(&original, 0).unwrap();
    source.sync_all().unwrap();
    drop(source);
    fs::File::create(mounted.path("target")).unwrap().sync_all().unwrap();
    let source = fs::File::open(mounted.path("source")).unwrap();
    let target = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(mounted.path("target"))
        .unwrap();
    // Whole blocks and edges (a clone), then bytes apart within blocks (a copy).
    assert_eq!(copy_file_range(&source, 100, &target, 100, 600_000), 600_000);
    assert_eq!(copy_file_range(&source, 7, &target, 700_000, 300_000), 300_000);
    let mut expected = vec![0u8; 1_000_000];
    expected[100..600_100].copy_from_slice(&original[100..600_100]);
    expected[700_000..].copy_from_slice(&original[7..300_007]);
    let mut daemon = mounted.daemon.take().unwrap();
    kill_daemon(&mut daemon, &mounted.point);
    drop((source, target));
    assert!(unmount_command(&mounted.point, true).status.success());
    mounted.fsck_clean();
    mounted.mount("");
    let found = fs::read(mounted.path("target")).unwrap();
    assert!(found == expected, "{} bytes after the crash, {} copied", found.len(), expected.len());
    mounted.unmount();
    mounted.fsck_clean();
}
