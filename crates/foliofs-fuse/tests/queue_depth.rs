//! Asynchronous dispatch through a real mount: one fio job at iodepth 64
//! reaches the device as a deep queue although only two threads serve the
//! mount, because no serving thread waits for its request's device I/O.
//!
//! Needs root (or fusermount3), /dev/fuse and fio, as the CLI's mount tests
//! do; FOLIOFS_SKIP_MOUNT_TESTS=1 skips it explicitly.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foliofs::vfs::MkfsOptions;
use foliofs::{Volume, VolumeOptions};
use foliofs_fuse::{Mount, MountOptions};

const IODEPTH: u32 = 64;
/// At least half the queue the application asked for must reach the device.
const IN_FLIGHT_PEAK_MIN: u64 = IODEPTH as u64 / 2;

fn is_mounted(point: &Path) -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = point.to_str().unwrap();
    mountinfo.lines().any(|line| line.split(' ').nth(4) == Some(point))
}

#[test]
fn one_fio_job_at_iodepth_64_keeps_a_deep_device_queue_with_two_serving_threads() {
    if std::env::var_os("FOLIOFS_SKIP_MOUNT_TESTS").is_some_and(|value| value == "1") {
        eprintln!("FOLIOFS_SKIP_MOUNT_TESTS=1: mount test skipped");
        return;
    }
    assert!(Path::new("/dev/fuse").exists(), "this test needs /dev/fuse (modprobe fuse)");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("vol.img");
    let point = dir.path().join("mnt");
    std::fs::create_dir(&point).unwrap();
    let point = point.canonicalize().unwrap();
    Volume::mkfs_path(&image, Some(512 << 20), &MkfsOptions::default(), &VolumeOptions::default())
        .unwrap();

    // Two serving threads: with one request per thread, the device would
    // never see more than two in flight.
    let options = MountOptions::parse("fuse_threads=2,engine=uring").unwrap();
    let mut mount = Mount::new(&image, &point, &options).unwrap();
    let volume = Arc::clone(mount.volume());
    let mut unmounter = mount.unmounter();
    let server = std::thread::spawn(move || mount.run());
    let started = Instant::now();
    while !is_mounted(&point) {
        assert!(started.elapsed() < Duration::from_secs(20), "mount did not appear");
        std::thread::sleep(Duration::from_millis(10));
    }

    // Lay the file out first, one direct write at a time (so the peak stays
    // low), and the measured job is pure overwrites.
    let file = point.join("queue");
    let filename = format!("--filename={}", file.display());
    let layout = Command::new("fio")
        .args(["--name=layout", &filename, "--ioengine=psync", "--direct=1", "--rw=write"])
        .args(["--bs=1M", "--size=64M"])
        .output();
    let peak_before = volume.device().stats().in_flight_peak;
    let fio = layout.and_then(|_| {
        Command::new("fio")
            .args([
                "--name=depth",
                &filename,
                "--ioengine=libaio",
                "--direct=1",
                "--rw=randwrite",
                "--bs=4k",
                "--size=64M",
                &format!("--iodepth={IODEPTH}"),
                "--iodepth_batch_submit=16",
                "--io_size=64M",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--verify_state_save=0",
            ])
            .output()
    });
    let peak = volume.device().stats().in_flight_peak;
    eprintln!("requests in flight at most: {peak_before} laying out, {peak} at iodepth {IODEPTH}");
    drop(volume);
    // The file fio just closed may not be released yet: busy for a moment.
    let unmounting = Instant::now();
    while let Err(error) = unmounter.unmount() {
        assert!(unmounting.elapsed() < Duration::from_secs(10), "unmount: {error}");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.join().unwrap().unwrap();

    let fio = fio.expect("run fio (apt-get install fio)");
    assert!(
        fio.status.success(),
        "fio failed:\n{}\n{}",
        String::from_utf8_lossy(&fio.stdout),
        String::from_utf8_lossy(&fio.stderr)
    );
    assert!(peak_before < IN_FLIGHT_PEAK_MIN, "the layout alone reached {peak_before}");
    assert!(
        peak >= IN_FLIGHT_PEAK_MIN,
        "one job at iodepth {IODEPTH} reached the device with at most {peak} requests in flight"
    );
}
