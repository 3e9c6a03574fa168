//! Volumes whose NBD link fails under them: the in-process server
//! restarted 20 times with its volatile cache lost, one link of four
//! dropped again and again, a link that stalls or swallows replies, and a
//! server that does not come back within the bound. The program sees no
//! error while the server comes back in time; everything fsynced is
//! durable; past the bound, EIO and read-only.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foliofs::dev::{Device, FaultDev, FuaMode};
use foliofs::vfs::MkfsOptions;
use foliofs::{OpenFlags, Volume, VolumeOptions};
use foliofs_check::fault_proxy::{FaultProxy, Upstream};
use foliofs_check::{nbd_loop, owner, pattern, quiet_options, GARBAGE_BYTE, SECTOR_BYTES};

const VOLUME_BYTES: u64 = 64 << 20;

/// Creates, writes and fsyncs files until `stop` (or `count_max`); returns (name, seed,
/// length) of each whose fsync returned. Any error fails the test.
fn fsync_files(
    volume: &Volume,
    stop: &AtomicBool,
    prefix: &str,
    count_max: usize,
) -> Vec<(String, u64, usize)> {
    let mut synced = Vec::new();
    let mut index = 0u64;
    while !stop.load(Ordering::Relaxed) && synced.len() < count_max {
        let name = format!("{prefix}{index}");
        let length = 1 + (foliofs_check::mix(&[index, 54]) % 24_000) as usize;
        let inodes = volume.inodes();
        let ino = inodes.create(1, name.as_bytes(), 0o644, owner()).unwrap().ino;
        let handle = inodes.open_file(ino, OpenFlags::READ_WRITE).unwrap();
        handle.write_at(&pattern(index, length), 0).unwrap();
        handle.sync_all().unwrap();
        synced.push((name, index, length));
        index += 1;
    }
    synced
}

fn check_files(volume: &Volume, files: &[(String, u64, usize)]) {
    for (name, seed, length) in files {
        let handle = volume.inodes().open_path(&format!("/{name}"), OpenFlags::READ).unwrap();
        let mut data = vec![0; *length + 1];
        assert_eq!(handle.read_at(&mut data, 0).unwrap(), *length, "{name}");
        assert!(data[..*length] == pattern(*seed, *length), "{name} differs");
    }
}

fn served_volume(options: &VolumeOptions) -> (Arc<FaultDev>, nbd_loop::NbdLoop) {
    let raw =
        Arc::new(FaultDev::from_image(vec![GARBAGE_BYTE; VOLUME_BYTES as usize], SECTOR_BYTES));
    let server = nbd_loop::start(Arc::clone(&raw), 54).unwrap();
    let mkfs = MkfsOptions { block_bytes: 4096, root_owner: owner(), ..MkfsOptions::default() };
    Volume::mkfs_path(Path::new(&server.uri), None, &mkfs, options).unwrap();
    (raw, server)
}

/// The in-process server restarted 20 times, each time forgetting every
/// write no FLUSH covered: the client replays what it kept, the workload
/// sees no error, and after a last loss of everything unflushed every
/// fsynced file reads back whole.
#[test]
fn the_test_server_restarted_20_times_losing_its_cache_loses_nothing_fsynced() {
    let options = quiet_options();
    let (raw, server) = served_volume(&options);
    let volume = Volume::open(Path::new(&server.uri), &options).unwrap();
    let stop = AtomicBool::new(false);
    let mut lost_writes = 0;
    let synced = std::thread::scope(|scope| {
        let writer = scope.spawn(|| fsync_files(&volume, &stop, "f", 2000));
        for round in 0..20u64 {
            std::thread::sleep(Duration::from_millis(50 + foliofs_check::mix(&[round]) % 150));
            lost_writes += server.restart_losing_unflushed();
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("the workload saw no error")
    });
    let stats = volume.device().link_stats().unwrap();
    assert_eq!(server.restarts(), 20);
    // A restart while the client is still reconnecting from the last one
    // costs no reconnect of its own.
    assert!(stats.reconnects >= 10, "{stats:?}");
    assert!(lost_writes > 0 && stats.replayed_requests > 0, "{lost_writes} lost; {stats:?}");
    assert!(synced.len() > 20, "the workload ran: {} files", synced.len());
    drop(volume);
    raw.lose_unflushed();
    drop(server);
    let volume = foliofs_check::open_raw(&raw, &options).unwrap();
    check_files(&volume, &synced);
    volume.close().unwrap();
}

/// qemu-nbd on a unix socket offering multi-conn (-e 4); killed on drop.
struct QemuNbd(Child);

impl Drop for QemuNbd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn qemu_nbd(dir: &Path) -> Option<(QemuNbd, std::path::PathBuf)> {
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(VOLUME_BYTES).unwrap();
    let socket = dir.join("q.sock");
    let child = Command::new("qemu-nbd")
        .args(["-f", "raw", "-x", "vol", "-t", "-e", "4", "-k"])
        .arg(&socket)
        .arg(&disk)
        .stderr(Stdio::null())
        .spawn();
    let child = match child {
        Ok(child) => QemuNbd(child),
        Err(error) => {
            skip::skip_or_fail(&format!("qemu-nbd cannot run ({error}); .ci/run installs it"));
            return None;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "qemu-nbd never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    Some((child, socket))
}

/// With four connections, the oldest link is cut again and again while
/// four threads write and fsync: only that connection reconnects, the
/// others carry on, and nothing fails or is lost.
#[test]
fn with_four_connections_one_lost_link_stops_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_server, socket)) = qemu_nbd(dir.path()) else { return };
    let proxy = FaultProxy::start(Upstream::Unix(socket)).unwrap();
    let uri = format!("{}&connections=4", proxy.uri("vol"));
    let options = VolumeOptions { fua: FuaMode::Native, ..quiet_options() };
    let mkfs = MkfsOptions { block_bytes: 4096, root_owner: owner(), ..MkfsOptions::default() };
    Volume::mkfs_path(Path::new(&uri), None, &mkfs, &options).unwrap();
    let volume = Volume::open(Path::new(&uri), &options).unwrap();
    let links_before = proxy.links_accepted();
    let stop = AtomicBool::new(false);
    let files = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..4)
            .map(|thread| {
                let (volume, stop) = (&volume, &stop);
                scope.spawn(move || fsync_files(volume, stop, &format!("t{thread}-"), 2000))
            })
            .collect();
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(150));
            assert!(proxy.drop_oldest_link(), "a link to cut");
        }
        stop.store(true, Ordering::Relaxed);
        writers.into_iter().flat_map(|writer| writer.join().expect("no error")).collect::<Vec<_>>()
    });
    // Each new link is one connection's reconnect (the last may still be
    // finishing), and there is at most one per cut: the other connections
    // never noticed. (A cut can land on a link already closing, so fewer
    // is possible.)
    let new_links = proxy.links_accepted() - links_before;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stats = volume.device().link_stats().unwrap();
    while stats.reconnects < new_links && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        stats = volume.device().link_stats().unwrap();
    }
    assert_eq!(stats.reconnects, new_links, "{stats:?}");
    assert!((5..=10).contains(&new_links), "{new_links} new links for 10 cuts");
    check_files(&volume, &files);
    volume.close().unwrap();
    let device = Device::open(Path::new(&uri), &options.dev_options()).unwrap();
    let report = foliofs::fsck::check(Arc::new(device));
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A link that stops answering (stalled past the request timeout, or its
/// replies swallowed) is treated as lost: the requests go out again on a
/// new link and the caller sees only the delay.
#[test]
fn a_stalled_link_or_one_that_swallows_replies_is_replaced() {
    let options = quiet_options();
    let (_raw, server) = served_volume(&options);
    let proxy = FaultProxy::start(Upstream::Unix(server.socket_path().to_path_buf())).unwrap();
    let uri = format!("{}&timeout=1", proxy.uri("crash"));
    let volume = Volume::open(Path::new(&uri), &options).unwrap();
    let stop = AtomicBool::new(false);
    let files = std::thread::scope(|scope| {
        let writer = scope.spawn(|| fsync_files(&volume, &stop, "s", 2000));
        std::thread::sleep(Duration::from_millis(200));
        proxy.stall(Duration::from_millis(2500));
        std::thread::sleep(Duration::from_millis(3000));
        proxy.blackhole_replies();
        std::thread::sleep(Duration::from_millis(2500));
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("no error")
    });
    let stats = volume.device().link_stats().unwrap();
    assert!(stats.reconnects >= 2, "{stats:?}");
    assert!(stats.requests_resent >= 2, "{stats:?}");
    check_files(&volume, &files);
    volume.close().unwrap();
}

/// A server that stays away past `reconnect=`: the fsync waiting on it
/// fails with EIO after the bound, and the volume turns read-only.
#[test]
fn past_the_reconnect_bound_fsync_is_eio_and_the_volume_read_only() {
    let options = quiet_options();
    let (_raw, server) = served_volume(&options);
    let proxy = FaultProxy::start(Upstream::Unix(server.socket_path().to_path_buf())).unwrap();
    let uri = format!("{}&reconnect=2", proxy.uri("crash"));
    let volume = Volume::open(Path::new(&uri), &options).unwrap();
    let inodes = volume.inodes();
    let ino = inodes.create(1, b"late", 0o644, owner()).unwrap().ino;
    let handle = inodes.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(&pattern(1, 10_000), 0).unwrap();
    proxy.refuse_connections(true);
    proxy.drop_links();
    let started = Instant::now();
    let error = handle.sync_all().unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
    assert!(started.elapsed() >= Duration::from_secs(1), "waited for the bound");
    let error = volume.checkpoint().unwrap_err();
    assert!([libc::EIO, libc::EROFS].contains(&error.errno()), "{error}");
    let refused = inodes.create(1, b"after", 0o644, owner()).unwrap_err();
    assert_eq!(refused.errno(), libc::EROFS, "{refused}");
    assert!(proxy.links_refused() > 0, "the client kept trying");
}

/// The crash checker's server ends links at random (one request in 200
/// under `crashtest --over-nbd`, too rare to be sure of in a short test):
/// at one in three, a workload of fsynced files crosses many drops with no
/// error, and everything reads back.
#[test]
fn the_crash_checkers_server_drops_links_at_random_and_nothing_is_lost() {
    let options = quiet_options();
    let (raw, volume, server) =
        foliofs_check::new_volume_over_nbd(VOLUME_BYTES, 4096, None, &options, 54).unwrap();
    server.drop_links_at_random(3);
    let files = fsync_files(&volume, &AtomicBool::new(false), "d", 40);
    let stats = volume.device().link_stats().unwrap();
    assert!(server.links_dropped() >= 5, "{} links dropped", server.links_dropped());
    assert!(stats.reconnects >= 5, "{stats:?}");
    check_files(&volume, &files);
    drop(volume);
    raw.lose_unflushed();
    drop(server);
    let volume = foliofs_check::open_raw(&raw, &options).unwrap();
    check_files(&volume, &files);
}
