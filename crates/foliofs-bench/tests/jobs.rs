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
    let mkfs = MkfsOptions {
        block_bytes: 4096,
        journal_bytes: None,
        metadata_bytes: None,
        metadata_index: false,
        root_owner: Owner::current(),
    };
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
    assert!(volume.inodes().resolve("/buffered.1.0").is_ok());
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

/// A target whose writes stay in flight until the runner has submitted
/// others (each completes at its second poll), and which records any write
/// submitted to a block that still has one in flight.
struct SlowWrites {
    bytes: parking_lot::Mutex<Vec<u8>>,
    writing: Arc<parking_lot::Mutex<std::collections::HashSet<u64>>>,
    overlaps: Arc<std::sync::atomic::AtomicU64>,
}

struct SecondPoll {
    result: Option<foliofs::DirectResult>,
    polled: bool,
    done: Option<(Arc<parking_lot::Mutex<std::collections::HashSet<u64>>>, u64)>,
}

impl std::future::Future for SecondPoll {
    type Output = foliofs::DirectResult;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if !self.polled {
            self.polled = true;
            context.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        if let Some((writing, offset)) = self.done.take() {
            writing.lock().remove(&offset);
        }
        std::task::Poll::Ready(self.result.take().expect("polled once ready"))
    }
}

impl runner::Target for SlowWrites {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> foliofs::Result<usize> {
        let start = offset as usize;
        buffer.copy_from_slice(&self.bytes.lock()[start..start + buffer.len()]);
        Ok(buffer.len())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> foliofs::Result<usize> {
        let start = offset as usize;
        self.bytes.lock()[start..start + data.len()].copy_from_slice(data);
        Ok(data.len())
    }

    fn read_async(&self, mut buffer: foliofs::AlignedBuf, offset: u64) -> runner::Submitted {
        let result = self.read_at(&mut buffer, offset);
        Box::pin(SecondPoll { result: Some((result, buffer)), polled: false, done: None })
    }

    fn write_async(&self, buffer: foliofs::AlignedBuf, offset: u64) -> runner::Submitted {
        if !self.writing.lock().insert(offset) {
            self.overlaps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let result = self.write_at(&buffer, offset);
        let done = Some((Arc::clone(&self.writing), offset));
        Box::pin(SecondPoll { result: Some((result, buffer)), polled: false, done })
    }

    fn fsync(&self) -> foliofs::Result<()> {
        Ok(())
    }

    fn fdatasync(&self) -> foliofs::Result<()> {
        Ok(())
    }
}

/// With verify, two writes to one block are never in flight together: they
/// may land in either order (on a device, through FUSE), so the checksum of
/// the later one could not be trusted (a `--target files` run through the
/// mount failed its verify so). 16 writes in flight over a file of 16
/// blocks would overlap all the time without it.
#[test]
fn verify_never_has_two_writes_to_a_block_in_flight() {
    let jobs = parse_command_line(&words(
        "--name=w --rw=randwrite --bs=4k --size=64k --ioengine=io_uring --direct=1 --iodepth=16 \
         --verify=crc32c --runtime=1s --time_based",
    ))
    .unwrap();
    let overlaps = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let target = SlowWrites {
        bytes: parking_lot::Mutex::new(vec![0; 64 << 10]),
        writing: Arc::default(),
        overlaps: Arc::clone(&overlaps),
    };
    let targets: Vec<(usize, u32, Box<dyn runner::Target>)> = vec![(0, 0, Box::new(target))];
    let run = runner::run_targets(&jobs, targets, &foliofs::dev::DevStats::default).unwrap();
    let job = &run.jobs[0];
    assert!(job.write.ios > 1000, "{} writes", job.write.ios);
    assert!(job.verified_blocks > 0);
    assert_eq!(overlaps.load(std::sync::atomic::Ordering::Relaxed), 0);
}
