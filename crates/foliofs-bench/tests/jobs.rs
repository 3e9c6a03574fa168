//! fio jobs run in-process on an in-memory volume: what they do to the
//! device, crc32c verification, and the JSON that fio's tools read.

use std::sync::Arc;

use foliofs::dev::{Device, FaultDev, FuaMode};
use foliofs::vfs::MkfsOptions;
use foliofs::{Owner, Volume, VolumeOptions};
use foliofs_bench::jobfile::{parse_command_line, parse_job_file};
use foliofs_bench::{report, runner};
use serde_json::Value;

fn volume() -> Volume {
    let raw = Arc::new(FaultDev::new(96 << 20, 512));
    let device = Arc::new(Device::new(raw, FuaMode::Native));
    let mkfs = MkfsOptions { block_bytes: 4096, journal_bytes: None, root_owner: Owner::current() };
    Volume::format(&device, &mkfs).unwrap();
    let options =
        VolumeOptions { commit_interval_ms: 0, writeback_interval_ms: 0, ..Default::default() };
    Volume::open_device(device, &options).unwrap()
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn fdatasync_after_every_write_reaches_the_device_each_time() {
    let volume = volume();
    let jobs = parse_command_line(&words(
        "--name=sync --rw=randwrite --bs=4k --size=1M --overwrite=1 --pre_read=1 --fdatasync=1 \
         --ioengine=psync",
    ))
    .unwrap();
    let run = runner::run(&volume, &jobs).unwrap();
    let job = &run.jobs[0];
    assert_eq!(job.write.io_bytes, 1 << 20, "size bounds a job that is not time based");
    assert_eq!(job.write.ios, 256);
    assert_eq!(run.device.write_requests, 256, "one writeback per fdatasync");
    assert_eq!(run.device.flush_requests, 256, "an overwrite needs a flush and nothing else");
    assert_eq!(run.device.bytes_written, 1 << 20);
}

#[test]
fn mixed_direct_jobs_keep_their_queue_and_verify_their_data() {
    let volume = volume();
    let text = "[global]\nioengine=io_uring\ndirect=1\nbs=4k\nsize=4M\nverify=crc32c\n\
                [mixed]\nrw=randrw\nrwmixread=30\niodepth=16\noverwrite=1\n\
                [buffered]\nioengine=psync\ndirect=0\nrw=write\nnumjobs=2\ngroup_reporting\n";
    let jobs = parse_job_file(text, "mixed.fio").unwrap();
    let run = runner::run(&volume, &jobs).unwrap();
    assert_eq!(run.jobs.len(), 2);
    let mixed = &run.jobs[0];
    assert_eq!(mixed.read.io_bytes + mixed.write.io_bytes, 4 << 20);
    assert!(
        mixed.read.ios > 150 && mixed.write.ios > 500,
        "about 30% reads: {} / {}",
        mixed.read.ios,
        mixed.write.ios
    );
    assert!(mixed.verified_blocks > 0);
    let buffered = &run.jobs[1];
    assert_eq!((buffered.instances, buffered.write.io_bytes), (2, 8 << 20));
    assert_eq!(buffered.verified_blocks, 2 * 1024, "every block of both files read back");
    // fio's names for its files: name.index.0.
    assert!(volume.resolve("/buffered.1.0").is_ok());
}

#[test]
fn a_file_that_must_exist_and_does_not_is_an_error() {
    let volume = volume();
    let jobs = parse_command_line(&words(
        "--name=test --ioengine=libaio --direct=1 --size=1M --filename=/mnt/fio --rw=write \
         --bs=2k --iodepth=4 --allow_file_create=0",
    ))
    .unwrap();
    let Err(error) = runner::run(&volume, &jobs) else { panic!("the job ran") };
    assert!(
        format!("{error:#}").contains("/mnt/fio: does not exist, and allow_file_create=0"),
        "{error:#}"
    );
}

/// The keys fio's own tools (fio_jsonplus_clat2csv, fiologparser, fio-plot)
/// read from `--output-format=json`.
#[test]
fn json_has_the_keys_fio_tools_read() {
    let volume = volume();
    let jobs = parse_command_line(&words("--name=r --rw=read --bs=64k --size=2M --ioengine=psync"))
        .unwrap();
    let run = runner::run(&volume, &jobs).unwrap();
    let text = serde_json::to_string(&report::to_json(&run, "engine=uring")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    assert!(json["fio version"].is_string());
    let job = &json["jobs"][0];
    assert_eq!(job["jobname"], "r");
    let read = &job["read"];
    assert_eq!(read["io_bytes"], 2 << 20);
    assert_eq!(read["total_ios"], 32);
    assert!(read["iops"].as_f64().unwrap() > 0.0);
    assert!(read["bw"].as_u64().unwrap() > 0, "KiB/s");
    assert!(read["runtime"].is_u64(), "milliseconds");
    let percentiles = read["clat_ns"]["percentile"].as_object().unwrap();
    for key in ["1.000000", "50.000000", "99.000000", "99.990000"] {
        assert!(percentiles[key].as_u64().unwrap() > 0, "{key}");
    }
    assert!(read["lat_ns"]["mean"].as_f64().unwrap() > 0.0);
    assert_eq!(job["write"]["total_ios"], 0);
    let device = &json["foliofs"]["device"];
    assert!(device["read_requests"].is_u64() && device["bytes_written"].is_u64());
    let text = report::to_text(&run);
    assert!(text.contains("r: (groupid=0, jobs=1)") && text.contains("read: IOPS="), "{text}");
}
