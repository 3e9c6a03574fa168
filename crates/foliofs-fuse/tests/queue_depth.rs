//! Asynchronous dispatch through a real mount: one fio job at iodepth 64
//! reaches the device as a deep queue although only two threads serve the
//! mount, because no serving thread waits for its request's device I/O.

mod common;

use std::process::{Command, Output};

use common::InProcessMount;

const IODEPTH: u32 = 64;
/// At least half the queue the application asked for must reach the device.
const IN_FLIGHT_PEAK_MIN: u64 = IODEPTH as u64 / 2;

#[test]
fn one_fio_job_at_iodepth_64_keeps_a_deep_device_queue_with_two_serving_threads() {
    if common::skip_requested() {
        return;
    }
    // Two serving threads: with one request per thread, the device would
    // never see more than two in flight.
    let mount = InProcessMount::new(512 << 20, "fuse_threads=2,engine=uring");

    let filename = format!("--filename={}", mount.point.join("queue").display());
    let layout = lay_out(&filename);
    let peak_before = mount.volume.device().stats().in_flight_peak;
    let fio = layout.and_then(|_| {
        Command::new("fio")
            .args(["--name=depth", &filename, "--ioengine=libaio", "--direct=1"])
            .args(["--rw=randwrite", "--bs=4k", "--size=64M", "--io_size=64M"])
            .arg(format!("--iodepth={IODEPTH}"))
            .args(["--iodepth_batch_submit=16", "--verify=crc32c", "--verify_fatal=1"])
            .arg("--verify_state_save=0")
            .output()
    });
    let peak = mount.volume.device().stats().in_flight_peak;
    eprintln!("requests in flight at most: {peak_before} laying out, {peak} at iodepth {IODEPTH}");
    mount.unmount();

    assert_fio_succeeded(fio);
    assert!(peak_before < IN_FLIGHT_PEAK_MIN, "the layout alone reached {peak_before}");
    assert!(
        peak >= IN_FLIGHT_PEAK_MIN,
        "one job at iodepth {IODEPTH} reached the device with at most {peak} requests in flight"
    );
}

/// Asynchronous requests in the kernel's hands at once (`max_background`),
/// past which a submitting program waits in the kernel for one to end.
const BACKGROUND_DEPTH: u32 = 1024;

/// Four jobs at iodepth 256 ask for 1,024 direct writes at once: with ring
/// entries for them all, more than the kernel's old limit of 256
/// background requests reach the device together, because the mount asks
/// the kernel for more (`max_background`, default 4096).
#[test]
fn four_fio_jobs_at_iodepth_256_reach_the_device_past_256_in_flight() {
    if common::skip_requested() {
        return;
    }
    let peak = background_peak("uring_depth=512,fuse_threads=4");
    let peak_limited = background_peak("uring_depth=512,fuse_threads=4,max_background=256");
    eprintln!(
        "requests in flight at most: {peak} by default, {peak_limited} with max_background=256"
    );
    assert!(peak_limited <= 256, "max_background=256 let {peak_limited} through");
    assert!(peak > 300, "1,024 asked for, at most {peak} at the device");
}

fn background_peak(options: &str) -> u64 {
    let mount = InProcessMount::new(512 << 20, options);
    let filename = format!("--filename={}", mount.point.join("queue").display());
    let fio = lay_out(&filename).and_then(|_| {
        Command::new("fio")
            .args(["--name=depth", &filename, "--ioengine=libaio", "--direct=1", "--thread"])
            .args(["--rw=randwrite", "--bs=4k", "--size=64M", "--io_size=16M", "--numjobs=4"])
            .arg(format!("--iodepth={}", BACKGROUND_DEPTH / 4))
            .arg(format!("--iodepth_batch_submit={}", BACKGROUND_DEPTH / 4))
            .output()
    });
    let peak = mount.volume.device().stats().in_flight_peak;
    mount.unmount();
    assert_fio_succeeded(fio);
    peak
}

/// Lays the file out with one direct write at a time (so the device's peak
/// stays low), so that the measured job is pure overwrites.
fn lay_out(filename: &str) -> std::io::Result<Output> {
    Command::new("fio")
        .args(["--name=layout", filename, "--ioengine=psync", "--direct=1", "--rw=write"])
        .args(["--bs=1M", "--size=64M"])
        .output()
}

fn assert_fio_succeeded(fio: std::io::Result<Output>) {
    let fio = fio.expect("run fio (apt-get install fio)");
    assert!(
        fio.status.success(),
        "fio failed:\n{}\n{}",
        String::from_utf8_lossy(&fio.stdout),
        String::from_utf8_lossy(&fio.stderr)
    );
}
