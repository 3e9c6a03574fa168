//! Volumes on real NBD servers through the client backend: what reaches
//! the server for FUA under fua=native and fua=emulate, and against a
//! server without FUA (counted by nbdkit's log filter); requests in
//! flight at once; EIO from nbdkit's error filter; a server with a
//! volatile cache killed mid-workload. Skipped, with the reason printed,
//! when nbdkit is missing (`.ci/run` installs it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use foliofs::dev::{AlignedBuf, FuaMode};
use foliofs::vfs::MkfsOptions;
use foliofs::{OpenFlags, Owner, Volume, VolumeOptions};

/// An nbdkit serving on a unix socket; killed when dropped.
struct Nbdkit {
    child: Child,
    socket: PathBuf,
}

impl Nbdkit {
    /// `nbdkit -f -U SOCKET ARGS...`; None when nbdkit is not installed.
    fn start(dir: &Path, name: &str, args: &[&str]) -> Option<Self> {
        let socket = dir.join(format!("{name}.sock"));
        let child = match Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&socket)
            .args(args)
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(error) => {
                eprintln!("skipped: nbdkit cannot run ({error}); apt-get install nbdkit");
                return None;
            }
        };
        let mut server = Self { child, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.socket.exists() {
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("nbdkit {args:?} exited: {status}");
            }
            assert!(Instant::now() < deadline, "nbdkit never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(server)
    }

    fn uri(&self) -> PathBuf {
        PathBuf::from(format!("nbd+unix:///?socket={}", self.socket.display()))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        self.kill();
    }
}

fn options(fua: FuaMode) -> VolumeOptions {
    VolumeOptions {
        fua,
        commit_interval_ms: 0,
        writeback_interval_ms: 0,
        ..VolumeOptions::default()
    }
}

fn mkfs(uri: &Path) {
    Volume::mkfs_path(uri, None, &MkfsOptions::default(), &options(FuaMode::Native)).unwrap();
}

/// The requests in nbdkit's log filter output: (command, fua flag).
fn logged_requests(log: &Path) -> Vec<(String, bool)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut words =
                line.split_whitespace().skip_while(|word| !word.starts_with("connection="));
            let command = words.nth(1)?;
            if command.starts_with("...") || !line.contains(" id=") {
                return None;
            }
            Some((command.to_string(), line.contains(" fua=1")))
        })
        .collect()
}

/// Overwrites a written block with an O_DSYNC direct write and returns
/// the requests the server saw for it.
fn requests_for_one_durable_write(
    server: &Nbdkit,
    log: &Path,
    fua: FuaMode,
) -> Vec<(String, bool)> {
    mkfs(&server.uri());
    let volume = Volume::open(&server.uri(), &options(fua)).unwrap();
    let ino = volume.create(1, b"f", 0o644, Owner::current()).unwrap().ino;
    let file = volume.open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    file.write_at(&AlignedBuf::from_slice(&[1; 64 << 10]), 0).unwrap();
    file.fsync().unwrap();
    let dsync = volume.open_file(ino, OpenFlags::READ_WRITE.with_direct().with_dsync()).unwrap();
    let before = logged_requests(log).len();
    let device_before = volume.device().stats();
    dsync.write_at(&AlignedBuf::from_slice(&[2; 4096]), 8192).unwrap();
    let device = volume.device().stats().since(&device_before);
    let seen = logged_requests(log)[before..].to_vec();
    assert_eq!(device.write_requests, 1, "{device:?}");
    assert_eq!(device.fua_writes, u64::from(fua == FuaMode::Native), "{device:?}");
    drop((file, dsync));
    volume.close().unwrap();
    seen
}

fn write(fua: bool) -> (String, bool) {
    ("Write".to_string(), fua)
}

fn flush() -> (String, bool) {
    ("Flush".to_string(), false)
}

#[test]
fn fua_reaches_the_server_as_the_flag_or_as_write_then_flush() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("native.log");
    let logfile = format!("logfile={}", log.display());
    let Some(server) =
        Nbdkit::start(dir.path(), "native", &["--filter=log", "memory", "64M", &logfile])
    else {
        return;
    };
    assert_eq!(requests_for_one_durable_write(&server, &log, FuaMode::Native), [write(true)]);
    drop(server);

    let log = dir.path().join("emulate.log");
    let logfile = format!("logfile={}", log.display());
    let server =
        Nbdkit::start(dir.path(), "emulate", &["--filter=log", "memory", "64M", &logfile]).unwrap();
    assert_eq!(
        requests_for_one_durable_write(&server, &log, FuaMode::Emulate),
        [write(false), flush()]
    );
    drop(server);

    // A server that offers no FUA (the fua filter's default mode, none):
    // fua=native falls back to write + flush.
    let log = dir.path().join("nofua.log");
    let logfile = format!("logfile={}", log.display());
    let args = ["--filter=log", "--filter=fua", "memory", "64M", &logfile];
    let server = Nbdkit::start(dir.path(), "nofua", &args).unwrap();
    assert_eq!(
        requests_for_one_durable_write(&server, &log, FuaMode::Native),
        [write(false), flush()]
    );
}

#[test]
fn reads_are_in_flight_together_on_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("depth.log");
    let logfile = format!("logfile={}", log.display());
    // The delay keeps each read at the server long enough to overlap.
    let args = ["--filter=log", "--filter=delay", "memory", "64M", "rdelay=20ms", &logfile];
    let Some(server) = Nbdkit::start(dir.path(), "depth", &args) else { return };
    mkfs(&server.uri());
    let volume = Volume::open(&server.uri(), &options(FuaMode::Native)).unwrap();
    let ino = volume.create(1, b"f", 0o644, Owner::current()).unwrap().ino;
    let file = volume.open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    file.write_at(&AlignedBuf::from_slice(&[3; 1 << 20]), 0).unwrap();
    let futures: Vec<_> = (0..16u64)
        .map(|index| file.read_at_async(AlignedBuf::zeroed(4096), index * 65536))
        .collect();
    for future in futures {
        let (buffer, read) = foliofs::completion::block_on(future);
        assert_eq!(read.unwrap(), 4096);
        assert!(buffer.iter().all(|byte| *byte == 3));
    }
    // The most reads the server had started and not yet answered.
    let text = std::fs::read_to_string(&log).unwrap();
    let (mut open, mut most) = (0i64, 0i64);
    for line in text.lines() {
        if line.contains(" Read id=") {
            open += 1;
            most = most.max(open);
        } else if line.contains(" ...Read id=") {
            open -= 1;
        }
    }
    assert!(most >= 8, "at most {most} reads were at the server at once:\n{text}");
    drop(file);
    volume.close().unwrap();
}

#[test]
fn server_write_errors_are_eio_then_read_only_and_nothing_fsynced_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let inject = dir.path().join("inject");
    let (file_arg, error_file) =
        (format!("file={}", disk.display()), format!("error-file={}", inject.display()));
    // nbdkit 1.32's error filter fails writes, not flushes (the unit tests
    // of the client fail FLUSH with a server of their own).
    let args =
        ["--filter=error", "file", &file_arg, "error=EIO", "error-pwrite-rate=1", &error_file];
    let Some(server) = Nbdkit::start(dir.path(), "error", &args) else { return };
    mkfs(&server.uri());
    let volume = Volume::open(&server.uri(), &options(FuaMode::Native)).unwrap();
    let kept = volume.create(1, b"kept", 0o644, Owner::current()).unwrap().ino;
    let handle = volume.open_file(kept, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(&[4; 100_000], 0).unwrap();
    handle.fsync().unwrap();
    let later = volume.create(1, b"later", 0o644, Owner::current()).unwrap().ino;
    let other = volume.open_file(later, OpenFlags::READ_WRITE).unwrap();
    other.write_at(&[5; 10_000], 0).unwrap();
    std::fs::write(&inject, b"").unwrap();
    let error = other.fsync().unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
    // Metadata cannot be written either: the volume turns read-only.
    let error = volume.checkpoint().unwrap_err();
    assert!([libc::EIO, libc::EROFS].contains(&error.errno()), "{error}");
    let error = volume.create(1, b"refused", 0o644, Owner::current()).unwrap_err();
    assert_eq!(error.errno(), libc::EROFS, "{error}");
    std::fs::remove_file(&inject).unwrap();
    drop((handle, other));
    let _ = volume.close();
    // Remounting replays: what was fsynced is there, and fsck is clean.
    let volume = Volume::open(&server.uri(), &options(FuaMode::Native)).unwrap();
    let handle = volume.open_file(kept, OpenFlags::READ).unwrap();
    let mut data = vec![0; 100_000];
    assert_eq!(handle.read_at(&mut data, 0).unwrap(), 100_000);
    assert!(data.iter().all(|byte| *byte == 4));
    drop(handle);
    volume.close().unwrap();
    let device =
        foliofs::dev::Device::open(&server.uri(), &options(FuaMode::Native).dev_options()).unwrap();
    let report = foliofs::fsck::check(std::sync::Arc::new(device));
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn killing_a_volatile_cache_server_keeps_every_fsynced_byte() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let file_arg = format!("file={}", disk.display());
    // Writes sit in nbdkit's cache until FLUSH or FUA: kill -9 loses them.
    let args = ["--filter=cache", "file", &file_arg, "cache=writeback"];
    let Some(mut server) = Nbdkit::start(dir.path(), "cache", &args) else { return };
    mkfs(&server.uri());
    let volume = Volume::open(&server.uri(), &options(FuaMode::Native)).unwrap();
    let mut synced = Vec::new();
    for round in 0..4u8 {
        let name = format!("synced{round}");
        let ino = volume.create(1, name.as_bytes(), 0o644, Owner::current()).unwrap().ino;
        let handle = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
        handle.write_at(&vec![round + 1; 50_000 * (usize::from(round) + 1)], 0).unwrap();
        handle.fsync().unwrap();
        synced.push((ino, round + 1, 50_000 * (usize::from(round) + 1)));
    }
    let unsynced = volume.create(1, b"unsynced", 0o644, Owner::current()).unwrap().ino;
    let handle = volume.open_file(unsynced, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(&[9; 300_000], 0).unwrap();
    server.kill();
    let error = handle.fsync().unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "a lost connection is EIO: {error}");
    drop(handle);
    let _ = volume.close();
    drop(server);

    let server = Nbdkit::start(dir.path(), "restarted", &["file", &file_arg]).unwrap();
    let volume = Volume::open(&server.uri(), &options(FuaMode::Native)).unwrap();
    for (ino, value, length) in synced {
        let handle = volume.open_file(ino, OpenFlags::READ).unwrap();
        let mut data = vec![0; length];
        assert_eq!(handle.read_at(&mut data, 0).unwrap(), length);
        assert!(data.iter().all(|byte| *byte == value), "fsynced file {ino} changed");
    }
    volume.close().unwrap();
    let device =
        foliofs::dev::Device::open(&server.uri(), &options(FuaMode::Native).dev_options()).unwrap();
    let report = foliofs::fsck::check(std::sync::Arc::new(device));
    assert!(report.is_clean(), "{:?}", report.problems);
}
