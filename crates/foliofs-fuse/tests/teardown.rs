//! The end of a mount while requests are in flight: `umount -f` aborts the
//! connection with a deep queue of direct writes outstanding (on io_uring:
//! entries armed, and others held by replies still to come). Serving must
//! end, the volume close, and the image check clean with every fsynced byte
//! in place. (Daemon death, kill -9, is the CLI's
//! sigkill_mid_workload_keeps_every_fsynced_file.)

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::InProcessMount;
use foliofs::{Volume, VolumeOptions};

#[test]
fn forced_unmount_with_a_deep_queue_in_flight_ends_serving_cleanly() {
    if common::skip_requested() {
        return;
    }
    let mount = InProcessMount::new(256 << 20, "fuse_threads=2,engine=uring");
    let synced: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let synced_path = mount.point.join("synced");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&synced_path).unwrap();
        file.write_all(&synced).unwrap();
        file.sync_all().unwrap();
    }
    let target = format!("--filename={}", mount.point.join("busy").display());
    let mut fio = Command::new("fio")
        .args(["--name=busy", &target, "--ioengine=libaio", "--direct=1", "--iodepth=64"])
        .args(["--rw=randwrite", "--bs=4k", "--size=32M", "--time_based", "--runtime=60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run fio (apt-get install fio)");
    // Until the job's writes are under way: the device sees a deep queue.
    let started = Instant::now();
    while mount.volume.device().stats().in_flight_peak < 8 {
        assert!(started.elapsed() < Duration::from_secs(30), "fio never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_dir, image) = mount.force_unmount(Duration::from_secs(30));
    let _ = fio.kill();
    let _ = fio.wait();

    let device_options = VolumeOptions { read_only: true, ..VolumeOptions::default() };
    let device = foliofs::dev::Device::open(&image, &device_options.dev_options()).unwrap();
    let report = foliofs::fsck::check(Arc::new(device));
    assert!(report.is_clean(), "{:?}", report.problems);
    let volume = Volume::open(&image, &device_options).unwrap();
    let file = volume.inodes().open_path("/synced", foliofs::vfs::OpenFlags::READ).unwrap();
    let mut found = vec![0u8; synced.len()];
    assert_eq!(file.read_at(&mut found, 0).unwrap(), synced.len());
    assert!(found == synced, "the fsynced file differs after the forced unmount");
}
