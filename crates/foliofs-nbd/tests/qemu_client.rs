//! The server with QEMU's and libnbd's own tools as clients: qemu-img
//! convert/compare, qemu-io (FUA, write -z, discard), nbdinfo --map.
//! Skipped, with the reason printed, when the tools are missing
//! (`.ci/run` installs qemu-utils and libnbd-bin).

#[path = "../../../tests/support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;

use foliofs::dev::{DevStats, Device};
use foliofs::vfs::MkfsOptions;
use foliofs::MapKind;
use foliofs::{OpenFlags, Owner, Volume, VolumeOptions};
use foliofs_nbd::{ExportSpec, Listener, Server, Stopper};

const DISK_BYTES: u64 = 32 << 20;

fn tools_missing(tools: &[&str]) -> bool {
    for tool in tools {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .is_ok_and(|output| output.status.success());
        if !found {
            skip::skip_or_fail(&format!(
                "{tool} is not installed (apt-get install qemu-utils libnbd-bin)"
            ));
            return true;
        }
    }
    false
}

fn options() -> VolumeOptions {
    VolumeOptions { commit_interval_ms: 0, writeback_interval_ms: 0, ..VolumeOptions::default() }
}

/// A volume with /disk.raw served on a unix socket by a server thread.
struct Served {
    dir: tempfile::TempDir,
    socket: PathBuf,
    device: Arc<Device>,
    stopper: Stopper,
    thread: JoinHandle<foliofs::Result<()>>,
}

impl Served {
    /// `prepare` runs on the open disk file before serving starts.
    fn start(prepare: impl FnOnce(&foliofs::File)) -> Self {
        Self::start_with(false, prepare)
    }

    fn start_with(read_only: bool, prepare: impl FnOnce(&foliofs::File)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("vol.img");
        Volume::mkfs_path(&image, Some(128 << 20), &MkfsOptions::default(), &options()).unwrap();
        let volume = Volume::open(&image, &options()).unwrap();
        let ino = volume.inodes().create(1, b"disk.raw", 0o644, Owner::current()).unwrap().ino;
        let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
        file.set_len(DISK_BYTES).unwrap();
        prepare(&file);
        file.sync_all().unwrap();
        file.close().unwrap();
        let device = Arc::clone(volume.device());
        let export = ExportSpec { name: "disk.raw".into(), path: "/disk.raw".into() };
        let server = Server::new(volume, &[export], read_only, 4).unwrap();
        let socket = dir.path().join("nbd.sock");
        let listener = Listener::unix(socket.clone()).unwrap();
        let stopper = server.stopper();
        let thread = std::thread::spawn(move || server.serve(listener));
        Self { dir, socket, device, stopper, thread }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///disk.raw?socket={}", self.socket.display())
    }

    /// Stops the server and reopens the volume to look at the file.
    fn stop(self) -> (tempfile::TempDir, Volume) {
        self.stopper.stop();
        self.thread.join().unwrap().unwrap();
        // The device handle holds the image's lock.
        drop(self.device);
        let volume = Volume::open(&self.dir.path().join("vol.img"), &options()).unwrap();
        (self.dir, volume)
    }
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// What one qemu-io command line did to the device.
fn qemu_io(served: &Served, commands: &[&str]) -> DevStats {
    let before = served.device.stats();
    let mut args = vec!["-t", "writeback", "-f", "raw"];
    let uri = served.uri();
    args.push(&uri);
    for command in commands {
        args.extend(["-c", command]);
    }
    let output = run("qemu-io", &args);
    assert!(!output.contains("Pattern verification failed"), "{output}");
    served.device.stats().since(&before)
}

fn write_pattern(path: &Path, pieces: &[(u64, u64, u8)]) {
    let mut bytes = vec![0; DISK_BYTES as usize];
    for &(offset, length, value) in pieces {
        for (index, byte) in
            bytes[offset as usize..(offset + length) as usize].iter_mut().enumerate()
        {
            *byte = value ^ (index as u8);
        }
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn qemu_img_convert_and_compare_round_trip_and_holes_show_in_the_map() {
    if tools_missing(&["qemu-img", "nbdinfo"]) {
        return;
    }
    let served = Served::start(|_| {});
    let source = served.dir.path().join("source.img");
    write_pattern(&source, &[(1 << 20, 3 << 20, 0x5a), (20 << 20, 512 << 10, 0xc3)]);
    let source_text = source.to_str().unwrap();
    run("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", source_text, &served.uri()]);
    let compared =
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", source_text, &served.uri()]);
    assert!(compared.contains("Images are identical"), "{compared}");
    let map = run("nbdinfo", &["--map", &served.uri()]);
    let lines: Vec<Vec<&str>> = map.lines().map(|line| line.split_whitespace().collect()).collect();
    let expected = [
        ["0", "1048576", "3"],
        ["1048576", "3145728", "0"],
        ["4194304", "16777216", "3"],
        ["20971520", "524288", "0"],
        ["21495808", "12058624", "3"],
    ];
    assert_eq!(lines.len(), expected.len(), "{map}");
    for (line, expected) in lines.iter().zip(expected) {
        assert_eq!(&line[..3], &expected[..], "{map}");
    }
    served.stop();
}

#[test]
fn a_fua_write_is_one_durable_device_write_and_a_plain_write_none() {
    if tools_missing(&["qemu-io"]) {
        return;
    }
    // Written blocks: an overwrite needs no metadata, so FUA is the only cost.
    let served = Served::start(|file| {
        file.write_at(&foliofs::dev::AlignedBuf::zeroed(1 << 20), 0).unwrap();
    });
    let fua = qemu_io(&served, &["write -f -P 0xab 0 64k"]);
    assert_eq!((fua.write_requests, fua.fua_writes), (1, 1), "{fua:?}");
    let plain = qemu_io(&served, &["write -P 0xcd 64k 64k"]);
    assert_eq!((plain.write_requests, plain.fua_writes), (1, 0), "{plain:?}");
    // qemu-io flushes as it closes: the plain write is made durable there.
    assert_eq!(plain.flush_requests, 1, "{plain:?}");
    let read = qemu_io(&served, &["read -P 0xab 0 64k", "read -P 0xcd 64k 64k"]);
    assert_eq!(read.write_requests, 0);
    served.stop();
}

#[test]
fn discard_punches_and_write_zeroes_zeroes_in_the_extent_map() {
    if tools_missing(&["qemu-io"]) {
        return;
    }
    let served = Served::start(|file| {
        file.write_at(&foliofs::dev::AlignedBuf::from_slice(&[7; 1 << 20]), 0).unwrap();
    });
    qemu_io(&served, &["discard 128k 64k", "write -z 256k 64k", "read -P 0 128k 64k"]);
    qemu_io(&served, &["read -P 0 256k 64k", "read -P 7 0 128k"]);
    let (_dir, volume) = served.stop();
    let ino = volume.inodes().resolve("/disk.raw").unwrap();
    let extents = volume.inodes().fiemap(ino).unwrap();
    let kind_at = |offset: u64| {
        extents
            .iter()
            .find(|extent| extent.logical <= offset && offset < extent.logical + extent.length)
            .map(|extent| extent.kind)
    };
    assert_eq!(kind_at(0), Some(MapKind::Written));
    assert_eq!(kind_at(128 << 10), None, "discard leaves a hole: {extents:?}");
    assert_eq!(kind_at(256 << 10), Some(MapKind::Unwritten), "write -z keeps space: {extents:?}");
    assert_eq!(kind_at(320 << 10), Some(MapKind::Written));
    volume.close().unwrap();
}

#[test]
fn a_read_only_export_refuses_writes_and_an_unknown_name_lists_the_exports() {
    if tools_missing(&["qemu-io", "nbdinfo"]) {
        return;
    }
    let served = Served::start_with(true, |file| {
        file.write_at(&foliofs::dev::AlignedBuf::from_slice(&[9; 8192]), 0).unwrap();
    });
    let uri = served.uri();
    let output = Command::new("qemu-io")
        .args(["-t", "writeback", "-f", "raw", &uri, "-c", "write -P 1 0 4k"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    // qemu sees READ_ONLY in the export's flags and refuses a writable open.
    assert!(!output.status.success() && text.contains("Permission denied"), "{text}");
    run("qemu-io", &["-r", "-f", "raw", &uri, "-c", "read -P 9 0 8k"]);
    let wrong = format!("nbd+unix:///nope?socket={}", served.socket.display());
    let output = Command::new("qemu-img").args(["info", &wrong]).output().unwrap();
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("no export named \"nope\" (exports: disk.raw)"), "{text}");
    let (_dir, volume) = served.stop();
    let file = volume.inodes().open_path("/disk.raw", OpenFlags::READ).unwrap();
    let mut data = vec![0; 8192];
    file.read_at(&mut data, 0).unwrap();
    assert!(data.iter().all(|byte| *byte == 9), "nothing changed");
    drop(file);
    volume.close().unwrap();
}

#[test]
fn nbdcopy_over_four_connections_with_flush_round_trips() {
    if tools_missing(&["nbdcopy", "qemu-img"]) {
        return;
    }
    let served = Served::start(|_| {});
    let source = served.dir.path().join("source.img");
    write_pattern(&source, &[(0, 8 << 20, 0x11), (16 << 20, 8 << 20, 0x77)]);
    let source_text = source.to_str().unwrap();
    run("nbdcopy", &["--connections=4", "--flush", source_text, &served.uri()]);
    let compared =
        run("qemu-img", &["compare", "-f", "raw", "-F", "raw", source_text, &served.uri()]);
    assert!(compared.contains("Images are identical"), "{compared}");
    served.stop();
}

/// The two halves together: a volume whose device is a file inside another
/// volume, through this server and the library's client backend.
#[test]
fn a_volume_lives_on_a_file_served_from_another_volume() {
    let served = Served::start(|_| {});
    let uri = PathBuf::from(format!("{}&connections=2", served.uri()));
    Volume::mkfs_path(&uri, None, &MkfsOptions::default(), &options()).unwrap();
    let inner = Volume::open(&uri, &options()).unwrap();
    let ino = inner.inodes().create(1, b"nested", 0o644, Owner::current()).unwrap().ino;
    let file = inner.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|index| (index % 241) as u8).collect();
    file.write_at(&data, 12345).unwrap();
    file.sync_all().unwrap();
    drop(file);
    inner.close().unwrap();
    let inner = Volume::open(&uri, &options()).unwrap();
    let file = inner.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let mut back = vec![0; data.len()];
    assert_eq!(file.read_at(&mut back, 12345).unwrap(), data.len());
    assert!(back == data, "the nested file differs");
    drop(file);
    inner.close().unwrap();
    let device = Device::open(&uri, &options().dev_options()).unwrap();
    let report = foliofs::fsck::check(Arc::new(device));
    assert!(report.is_clean(), "{:?}", report.problems);
    served.stop();
}
