//! Volumes on real NBD servers through the client backend: what reaches
//! the server for FUA under fua=native and fua=emulate, and against a
//! server without FUA (counted by nbdkit's log filter); requests in
//! flight at once; EIO from nbdkit's error filter; a server with a
//! volatile cache killed mid-workload. Skipped, with the reason printed,
//! when nbdkit is missing (`.ci/run` installs it).

#[path = "../../../tests/support/skip.rs"]
mod skip;

use std::os::unix::net::UnixStream;
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
                skip::skip_or_fail(&format!("nbdkit cannot run ({error}); apt-get install nbdkit"));
                return None;
            }
        };
        let mut server = Self { child, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        // The socket file exists from bind(), a moment before listen(): a
        // connection made in between is refused, so wait for one to go through.
        while UnixStream::connect(&server.socket).is_err() {
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

/// After the server failed a write: the fsync that needed it reports EIO,
/// and metadata cannot be written either, so the volume turns read-only.
fn fsync_fails_and_the_volume_turns_read_only(volume: &Volume, file: &foliofs::File) {
    let error = file.sync_all().unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
    let error = volume.checkpoint().unwrap_err();
    assert!([libc::EIO, libc::EROFS].contains(&error.errno()), "{error}");
    let error = volume.inodes().create(1, b"refused", 0o644, Owner::current()).unwrap_err();
    assert_eq!(error.errno(), libc::EROFS, "{error}");
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
    let ino = volume.inodes().create(1, b"f", 0o644, Owner::current()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    file.write_at(&AlignedBuf::from_slice(&[1; 64 << 10]), 0).unwrap();
    file.sync_all().unwrap();
    let dsync =
        volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct().with_dsync()).unwrap();
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
    let ino = volume.inodes().create(1, b"f", 0o644, Owner::current()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    file.write_at(&AlignedBuf::from_slice(&[3; 1 << 20]), 0).unwrap();
    let futures: Vec<_> = (0..16u64)
        .map(|index| file.read_at_async(AlignedBuf::zeroed(4096), index * 65536))
        .collect();
    for future in futures {
        let (read, buffer) = foliofs::block_on(future);
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
    let kept = volume.inodes().create(1, b"kept", 0o644, Owner::current()).unwrap().ino;
    let handle = volume.inodes().open_file(kept, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(&[4; 100_000], 0).unwrap();
    handle.sync_all().unwrap();
    let later = volume.inodes().create(1, b"later", 0o644, Owner::current()).unwrap().ino;
    let other = volume.inodes().open_file(later, OpenFlags::READ_WRITE).unwrap();
    other.write_at(&[5; 10_000], 0).unwrap();
    std::fs::write(&inject, b"").unwrap();
    fsync_fails_and_the_volume_turns_read_only(&volume, &other);
    std::fs::remove_file(&inject).unwrap();
    drop((handle, other));
    let _ = volume.close();
    // Remounting replays: what was fsynced is there, and fsck is clean.
    let volume = Volume::open(&server.uri(), &options(FuaMode::Native)).unwrap();
    let handle = volume.inodes().open_file(kept, OpenFlags::READ).unwrap();
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

/// Writes 8 MiB to a file, fsyncs, deletes it and syncs on a volume with
/// `-o discard` as `discard` says; returns the device's discard count.
fn write_then_delete(uri: &Path, discard: bool) -> u64 {
    mkfs(uri);
    let volume = Volume::open(uri, &VolumeOptions { discard, ..options(FuaMode::Native) }).unwrap();
    let ino = volume.inodes().create(1, b"big", 0o644, Owner::current()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&vec![9; 8 << 20], 0).unwrap();
    file.sync_all().unwrap();
    drop(file);
    volume.inodes().unlink(1, b"big").unwrap();
    volume.sync().unwrap();
    let stats = volume.device().stats();
    assert_eq!(stats.bytes_discarded, if discard { 8 << 20 } else { 0 }, "{stats:?}");
    volume.close().unwrap();
    stats.discard_requests
}

/// `-o discard` reaches nbdkit as TRIM (counted by its log filter), and
/// qemu-nbd with `--discard=unmap` punches the freed blocks out of its
/// image file; without the option the server sees none.
#[test]
fn freed_blocks_reach_the_server_as_trim_with_discard() {
    let dir = tempfile::tempdir().unwrap();
    for discard in [false, true] {
        let log = dir.path().join(format!("trim-{discard}.log"));
        let logfile = format!("logfile={}", log.display());
        let name = format!("trim-{discard}");
        let args = ["--filter=log", "memory", "64M", &logfile];
        let Some(server) = Nbdkit::start(dir.path(), &name, &args) else { return };
        let discards = write_then_delete(&server.uri(), discard);
        let trims =
            logged_requests(&log).iter().filter(|(command, _)| command == "Trim").count() as u64;
        assert_eq!(trims, discards, "every discard is one TRIM");
        assert_eq!(trims > 0, discard, "discard={discard}");
    }
    let disk = dir.path().join("unmap.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let Some((mut qemu, uri)) = qemu_nbd_with(dir.path(), &disk, &["--discard=unmap"]) else {
        return;
    };
    use std::os::unix::fs::MetadataExt;
    let allocated_bytes = || std::fs::metadata(&disk).unwrap().blocks() * 512;
    mkfs(&uri);
    let before = allocated_bytes();
    write_then_delete(&uri, true);
    let _ = qemu.kill();
    let _ = qemu.wait();
    assert!(allocated_bytes() < before + (1 << 20), "the 8 MiB went back to the file system");
}

/// Seeded choices without a dependency: splitmix64.
struct Choices(u64);

impl Choices {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut value = self.0;
        value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (value ^ (value >> 31)) % bound
    }
}

/// Rounds of: nbdkit with a writeback cache over one disk file, files
/// written (buffered and direct, some fsynced) until nbdkit is killed with
/// kill -9 after a seeded number of operations (what it held unflushed is
/// lost), then a restart, a remount that replays, every fsynced file
/// checked and fsck.
#[test]
fn killing_a_volatile_cache_server_keeps_every_fsynced_byte() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let file_arg = format!("file={}", disk.display());
    let cached = ["--filter=cache", "file", &file_arg, "cache=writeback"];
    let Some(server) = Nbdkit::start(dir.path(), "mkfs", &cached) else { return };
    mkfs(&server.uri());
    drop(server);
    let seed = std::env::var("FOLIOFS_NBD_CRASH_SEED").ok().and_then(|text| text.parse().ok());
    let mut choices = Choices(seed.unwrap_or(15));
    let rounds = std::env::var("FOLIOFS_NBD_CRASH_ROUNDS").ok().and_then(|text| text.parse().ok());
    // (name, fill byte, length) of every file whose fsync returned.
    let mut synced: Vec<(String, u8, usize)> = Vec::new();
    for round in 0..rounds.unwrap_or(4u32) {
        let mut server = Nbdkit::start(dir.path(), &format!("round{round}"), &cached).unwrap();
        // The server stays down: after a second of reconnecting the
        // client gives up, and the volume's requests fail with EIO.
        let uri = format!("{}&reconnect=1", server.uri().display());
        let volume = Volume::open(Path::new(&uri), &options(FuaMode::Native)).unwrap();
        let ops_before_kill = 1 + choices.below(8);
        let mut open = Vec::new();
        for op in 0..ops_before_kill {
            let name = format!("r{round}op{op}");
            let fill = choices.below(250) as u8 + 1;
            let direct = choices.below(2) == 0;
            let length = if direct {
                4096 * (1 + choices.below(64) as usize)
            } else {
                1 + choices.below(400_000) as usize
            };
            let ino =
                volume.inodes().create(1, name.as_bytes(), 0o644, Owner::current()).unwrap().ino;
            let flags =
                if direct { OpenFlags::READ_WRITE.with_direct() } else { OpenFlags::READ_WRITE };
            let handle = volume.inodes().open_file(ino, flags).unwrap();
            if direct {
                handle.write_at(&AlignedBuf::from_slice(&vec![fill; length]), 0).unwrap();
            } else {
                handle.write_at(&vec![fill; length], 0).unwrap();
            }
            if choices.below(3) != 0 {
                handle.sync_all().unwrap();
                synced.push((name, fill, length));
            }
            open.push(handle);
        }
        server.kill();
        for handle in &open {
            // Whatever was not yet durable cannot be made so now.
            let error = handle.sync_all().err();
            assert!(error.is_none_or(|error| error.errno() == libc::EIO));
        }
        drop(open);
        let _ = volume.close();
        drop(server);

        let server =
            Nbdkit::start(dir.path(), &format!("check{round}"), &["file", &file_arg]).unwrap();
        let volume = Volume::open(&server.uri(), &options(FuaMode::Native)).unwrap();
        for (name, fill, length) in &synced {
            let handle = volume.inodes().open_path(&format!("/{name}"), OpenFlags::READ).unwrap();
            let mut data = vec![0; *length + 1];
            assert_eq!(handle.read_at(&mut data, 0).unwrap(), *length, "round {round}: {name}");
            assert!(data[..*length].iter().all(|byte| byte == fill), "round {round}: {name}");
        }
        volume.close().unwrap();
        let device =
            foliofs::dev::Device::open(&server.uri(), &options(FuaMode::Native).dev_options())
                .unwrap();
        let report = foliofs::fsck::check(std::sync::Arc::new(device));
        assert!(report.is_clean(), "round {round}: {:?}", report.problems);
    }
}

/// qemu-nbd on a unix socket (the other server family); None when missing.
fn qemu_nbd(dir: &Path, disk: &Path) -> Option<(Child, PathBuf)> {
    qemu_nbd_with(dir, disk, &[])
}

/// qemu-nbd with `extra` arguments before the socket.
fn qemu_nbd_with(dir: &Path, disk: &Path, extra: &[&str]) -> Option<(Child, PathBuf)> {
    let disk = disk.display().to_string();
    let mut image = vec!["-f", "raw"];
    image.extend_from_slice(extra);
    image.push(&disk);
    qemu_nbd_serving(dir, &image)
}

/// qemu-nbd exporting `image` (options and the image, as qemu-nbd takes
/// them) as "vol"; the socket of an earlier one killed is replaced.
fn qemu_nbd_serving(dir: &Path, image: &[&str]) -> Option<(Child, PathBuf)> {
    let socket = dir.join("qemu.sock");
    let _ = std::fs::remove_file(&socket);
    let child = match Command::new("qemu-nbd")
        .args(["-x", "vol", "-t", "-e", "4", "-k"])
        .arg(&socket)
        .args(image)
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            skip::skip_or_fail(&format!(
                "qemu-nbd cannot run ({error}); apt-get install qemu-utils"
            ));
            return None;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "qemu-nbd never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    Some((child, PathBuf::from(format!("nbd+unix:///vol?socket={}", socket.display()))))
}

/// qemu-nbd with blkdebug between the export and the image, failing every
/// write with EIO: a volume whose device starts refusing writes turns
/// read-only, and after a restart without the fault everything fsynced
/// before is there and fsck is clean.
#[test]
fn blkdebug_write_errors_on_qemu_nbd_turn_the_volume_read_only_and_lose_nothing_fsynced() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let Some((qemu, uri)) = qemu_nbd(dir.path(), &disk) else { return };
    let healthy = KillOnDrop(qemu);
    mkfs(&uri);
    let volume = Volume::open(&uri, &options(FuaMode::Native)).unwrap();
    let kept = volume.inodes().create(1, b"kept", 0o644, Owner::current()).unwrap().ino;
    let handle = volume.inodes().open_file(kept, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(&[4; 100_000], 0).unwrap();
    handle.sync_all().unwrap();
    drop(handle);
    volume.close().unwrap();
    drop(healthy);

    let rules = dir.path().join("blkdebug.cfg");
    let rule =
        "[inject-error]\nevent = \"pwritev\"\nerrno = \"5\"\nonce = \"off\"\niotype = \"write\"\n";
    std::fs::write(&rules, rule).unwrap();
    let image = format!(
        "driver=raw,file.driver=blkdebug,file.config={},file.image.driver=file,\
         file.image.filename={}",
        rules.display(),
        disk.display()
    );
    let Some((qemu, uri)) = qemu_nbd_serving(dir.path(), &["--image-opts", &image]) else {
        return;
    };
    let faulty = KillOnDrop(qemu);
    let volume = Volume::open(&uri, &options(FuaMode::Native)).unwrap();
    let later = volume.inodes().create(1, b"later", 0o644, Owner::current()).unwrap().ino;
    let other = volume.inodes().open_file(later, OpenFlags::READ_WRITE).unwrap();
    other.write_at(&[5; 10_000], 0).unwrap();
    fsync_fails_and_the_volume_turns_read_only(&volume, &other);
    drop(other);
    let _ = volume.close();
    drop(faulty);

    let Some((qemu, uri)) = qemu_nbd(dir.path(), &disk) else { return };
    let _healthy = KillOnDrop(qemu);
    let volume = Volume::open(&uri, &options(FuaMode::Native)).unwrap();
    let handle = volume.inodes().open_file(kept, OpenFlags::READ).unwrap();
    let mut data = vec![0; 100_001];
    assert_eq!(handle.read_at(&mut data, 0).unwrap(), 100_000);
    assert!(data[..100_000].iter().all(|byte| *byte == 4));
    drop(handle);
    volume.close().unwrap();
    let device = foliofs::dev::Device::open(&uri, &options(FuaMode::Native).dev_options()).unwrap();
    let report = foliofs::fsck::check(std::sync::Arc::new(device));
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A server process killed (and reaped) however the test ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Four threads, each writing its own file at random offsets (buffered
/// and direct, fsync now and then) against a byte model; then a remount
/// that must read back every model, and fsck.
fn mixed_workload(uri: &Path) {
    mkfs(uri);
    let volume = Volume::open(uri, &options(FuaMode::Native)).unwrap();
    let models: Vec<(u64, Vec<u8>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4u64)
            .map(|thread| {
                let volume = &volume;
                scope.spawn(move || {
                    let name = format!("t{thread}");
                    let ino = volume
                        .inodes()
                        .create(1, name.as_bytes(), 0o644, Owner::current())
                        .unwrap()
                        .ino;
                    let buffered = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
                    let direct = volume
                        .inodes()
                        .open_file(ino, OpenFlags::READ_WRITE.with_direct())
                        .unwrap();
                    let mut model = Vec::new();
                    let mut choices = Choices(thread + 100);
                    for op in 0..60u64 {
                        let fill = (op as u8).wrapping_mul(7).wrapping_add(thread as u8) | 1;
                        if choices.below(2) == 0 {
                            let offset = 4096 * choices.below(256) as usize;
                            let length = 4096 * (1 + choices.below(16) as usize);
                            let data = AlignedBuf::from_slice(&vec![fill; length]);
                            direct.write_at(&data, offset as u64).unwrap();
                            write_model(&mut model, offset, &data);
                        } else {
                            let offset = choices.below(1 << 20) as usize;
                            let data = vec![fill; 1 + choices.below(100_000) as usize];
                            buffered.write_at(&data, offset as u64).unwrap();
                            write_model(&mut model, offset, &data);
                        }
                        if choices.below(8) == 0 {
                            buffered.sync_all().unwrap();
                        }
                    }
                    (ino, model)
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().unwrap()).collect()
    });
    volume.close().unwrap();
    let volume = Volume::open(uri, &options(FuaMode::Native)).unwrap();
    for (ino, model) in models {
        let handle = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
        let mut data = vec![0; model.len() + 1];
        assert_eq!(handle.read_at(&mut data, 0).unwrap(), model.len());
        assert!(data[..model.len()] == model[..], "file {ino} differs from its model");
    }
    volume.close().unwrap();
    let device = foliofs::dev::Device::open(uri, &options(FuaMode::Native).dev_options()).unwrap();
    let report = foliofs::fsck::check(std::sync::Arc::new(device));
    assert!(report.is_clean(), "{:?}", report.problems);
}

fn write_model(model: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if model.len() < offset + data.len() {
        model.resize(offset + data.len(), 0);
    }
    model[offset..offset + data.len()].copy_from_slice(data);
}

#[test]
fn a_mixed_workload_reads_back_on_nbdkit_and_on_qemu_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = Nbdkit::start(dir.path(), "memory", &["memory", "128M"]) else { return };
    mixed_workload(&server.uri());
    drop(server);
    let disk = dir.path().join("qemu.img");
    std::fs::File::create(&disk).unwrap().set_len(128 << 20).unwrap();
    let Some((mut qemu, uri)) = qemu_nbd(dir.path(), &disk) else { return };
    mixed_workload(&uri);
    let _ = qemu.kill();
    let _ = qemu.wait();
}

/// How many connections nbdkit's log filter saw made.
fn connections_made(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().filter(|line| line.contains(" Connect export=")).count()
}

#[test]
fn several_connections_only_when_the_server_offers_multi_conn() {
    let dir = tempfile::tempdir().unwrap();
    for (name, filter, expected) in [
        ("multi", None, 4),
        ("single", Some(["--filter=multi-conn", "multi-conn-mode=disable"]), 1),
    ] {
        let log = dir.path().join(format!("{name}.log"));
        let logfile = format!("logfile={}", log.display());
        let mut args = vec!["--filter=log"];
        args.extend(filter.map(|[filter, _]| filter));
        args.extend(["memory", "64M", &logfile]);
        args.extend(filter.map(|[_, parameter]| parameter));
        let Some(server) = Nbdkit::start(dir.path(), name, &args) else { return };
        let uri = PathBuf::from(format!("{}&connections=4", server.uri().display()));
        mixed_workload(&uri);
        // The workload opens the export four times: mkfs, open, reopen, fsck.
        assert_eq!(connections_made(&log), 4 * expected, "{name}");
    }
}

/// (name, fill byte, length) of each file whose fsync returned.
type Synced = Vec<(String, u8, usize)>;

/// Creates, writes and fsyncs files on the volume at `uri` while `restart`
/// kills its server with SIGKILL and starts it again, 20 times: the client
/// reconnects each time and replays what a lost cache dropped, and the
/// workload sees no error at all (a failed unwrap fails the test).
fn fsync_through_20_restarts(
    uri: &Path,
    restart: &mut dyn FnMut(),
) -> (Synced, foliofs::dev::nbd::LinkStats) {
    let volume = Volume::open(uri, &options(FuaMode::Native)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let synced = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut choices = Choices(20);
            let mut synced = Synced::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if synced.len() >= 4000 {
                    // Enough for the volume: wait for the restarts to end.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                let name = format!("f{}", synced.len());
                let fill = choices.below(250) as u8 + 1;
                let length = 1 + choices.below(16_000) as usize;
                let inodes = volume.inodes();
                let ino = inodes.create(1, name.as_bytes(), 0o644, Owner::current()).unwrap().ino;
                let handle = inodes.open_file(ino, OpenFlags::READ_WRITE).unwrap();
                handle.write_at(&vec![fill; length], 0).unwrap();
                handle.sync_all().unwrap();
                synced.push((name, fill, length));
            }
            synced
        });
        let mut choices = Choices(21);
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(100 + choices.below(300)));
            restart();
        }
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().expect("the workload saw no error")
    });
    let stats = volume.device().link_stats().expect("a volume on NBD");
    // A kill while the client is still reconnecting from the last one
    // costs no reconnect of its own.
    assert!(stats.reconnects >= 10, "{stats:?}");
    volume.close().unwrap();
    assert!(synced.len() > 20, "the workload ran: {} files", synced.len());
    (synced, stats)
}

/// Every file of `synced` reads back whole from the volume at `uri`, and
/// fsck finds it clean.
fn all_synced_files_are_there(uri: &Path, synced: &Synced) {
    let volume = Volume::open(uri, &options(FuaMode::Native)).unwrap();
    for (name, fill, length) in synced {
        let handle = volume.inodes().open_path(&format!("/{name}"), OpenFlags::READ).unwrap();
        let mut data = vec![0; *length + 1];
        assert_eq!(handle.read_at(&mut data, 0).unwrap(), *length, "{name}");
        assert!(data[..*length].iter().all(|byte| byte == fill), "{name}");
    }
    volume.close().unwrap();
    let device = foliofs::dev::Device::open(uri, &options(FuaMode::Native).dev_options()).unwrap();
    let report = foliofs::fsck::check(std::sync::Arc::new(device));
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// nbdkit with a volatile cache (the cache filter's writeback) killed and
/// restarted 20 times: each restart loses what the cache held, the client
/// replays it, and every fsync that returned is durable on the file.
#[test]
fn nbdkit_killed_and_restarted_20_times_loses_nothing_fsynced_and_fails_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(256 << 20).unwrap();
    let file_arg = format!("file={}", disk.display());
    let cached = ["--filter=cache", "file", &file_arg, "cache=writeback"];
    let Some(mut server) = Nbdkit::start(dir.path(), "restarted", &cached) else { return };
    let uri = server.uri();
    mkfs(&uri);
    let (synced, stats) = fsync_through_20_restarts(&uri, &mut || {
        server.kill();
        let _ = std::fs::remove_file(&server.socket);
        server = Nbdkit::start(dir.path(), "restarted", &cached).unwrap();
    });
    assert!(stats.replayed_requests > 0, "the killed caches held unflushed writes: {stats:?}");
    drop(server);
    let server = Nbdkit::start(dir.path(), "check", &["file", &file_arg]).unwrap();
    all_synced_files_are_there(&server.uri(), &synced);
}

/// qemu-nbd killed with SIGKILL and restarted 20 times on the same socket:
/// no error reaches the workload, and every fsync that returned is there.
#[test]
fn qemu_nbd_killed_and_restarted_20_times_loses_nothing_fsynced_and_fails_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(256 << 20).unwrap();
    let Some((qemu, uri)) = qemu_nbd(dir.path(), &disk) else { return };
    let mut server = KillOnDrop(qemu);
    mkfs(&uri);
    let (synced, _) = fsync_through_20_restarts(&uri, &mut || {
        let _ = server.0.kill();
        let _ = server.0.wait();
        server = KillOnDrop(qemu_nbd(dir.path(), &disk).expect("restart qemu-nbd").0);
    });
    all_synced_files_are_there(&uri, &synced);
}
