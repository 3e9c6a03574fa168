//! `foliofs bench buffered`: one buffered-I/O workload, as fio runs it with
//! ioengine=psync direct=0: `numjobs` threads, each reading or writing its
//! own file (fio's `name.N.0` files) one request at a time through the
//! engine's folio cache. `--memcpy` runs the same loop as plain memory
//! copies between a file-sized buffer and the request buffer: the limit for
//! cached I/O.

use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use foliofs::dev::AlignedBuf;
use foliofs::options::parse_size;
use foliofs::{File, OpenFlags, Owner, Volume, VolumeOptions};
use rand::{RngExt, SeedableRng};

use super::direct::{parse_duration, Rw};
use super::image::{BenchImage, ImageArgs};
use foliofs_bench::latency::Latencies;

#[derive(Args)]
pub struct BufferedArgs {
    /// Access pattern.
    #[arg(long, value_enum, default_value = "randwrite")]
    rw: Rw,
    /// Bytes per request.
    #[arg(long, default_value = "4k")]
    bs: String,
    /// Threads, each with its own file.
    #[arg(long, default_value = "1")]
    numjobs: usize,
    /// Size of each job's file.
    #[arg(long, default_value = "1G")]
    size: String,
    /// How long to measure, e.g. 10s, 2m, 500ms; 0 runs once through the file.
    #[arg(long, default_value = "10s")]
    runtime: String,
    /// Run this long before measuring.
    #[arg(long, default_value = "0s")]
    ramp_time: String,
    /// fdatasync after every N writes (fio's fdatasync=N); 0: never.
    #[arg(long, default_value = "0")]
    fdatasync: u64,
    /// Write each file whole (and fsync it) before measuring, so writes
    /// overwrite allocated blocks (fio's overwrite=1; reads always do this).
    #[arg(long)]
    overwrite: bool,
    /// Read each file whole before measuring, so it is cached (fio's pre_read=1).
    #[arg(long)]
    pre_read: bool,
    /// fsync each file when its job ends, inside the measured time (fio's end_fsync=1).
    #[arg(long)]
    end_fsync: bool,
    /// No file system: memcpy between a file-sized buffer and the request buffer.
    #[arg(long)]
    memcpy: bool,
    #[command(flatten)]
    image: ImageArgs,
}

#[derive(Debug, Clone, Copy)]
struct Workload {
    rw: Rw,
    request_bytes: usize,
    file_bytes: u64,
    runtime: Option<Duration>,
    ramp: Duration,
    fdatasync_every: u64,
    end_fsync: bool,
}

impl Workload {
    fn requests_per_file(&self) -> u64 {
        self.file_bytes / self.request_bytes as u64
    }

    /// The offsets a job visits, fio style: in order (wrapping), or random.
    fn offsets(&self, job: usize) -> impl FnMut() -> u64 {
        let requests = self.requests_per_file();
        let request_bytes = self.request_bytes as u64;
        let random = self.rw.random();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(job as u64 + 1);
        let mut next = 0u64;
        move || {
            let index = if random {
                rng.random_range(0..requests)
            } else {
                let index = next;
                next = (next + 1) % requests;
                index
            };
            index * request_bytes
        }
    }
}

/// What one job did after the ramp.
struct JobResult {
    latencies: Latencies,
    bytes: u64,
}

pub fn run(args: &BufferedArgs, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let request_bytes = parse_size(&args.bs).context("--bs")? as usize;
    let file_bytes = parse_size(&args.size).context("--size")?;
    if request_bytes == 0 || file_bytes < request_bytes as u64 {
        bail!("--bs must be non-zero and no larger than --size");
    }
    if args.numjobs == 0 {
        bail!("--numjobs must be at least 1");
    }
    let runtime = parse_duration(&args.runtime)?;
    let workload = Workload {
        rw: args.rw,
        request_bytes,
        file_bytes,
        runtime: (!runtime.is_zero()).then_some(runtime),
        ramp: parse_duration(&args.ramp_time)?,
        fdatasync_every: args.fdatasync,
        end_fsync: args.end_fsync,
    };
    let (results, elapsed, device_bytes) = if args.memcpy {
        let (results, elapsed) = run_memcpy(&workload, args.numjobs)?;
        (results, elapsed, None)
    } else {
        let total_bytes = file_bytes * args.numjobs as u64;
        let image_bytes = total_bytes + total_bytes / 8 + (256 << 20);
        let image = BenchImage::create(&args.image, image_bytes, options)?;
        let volume = Volume::open(image.path(), options)?;
        let prepared = prepare_files(&volume, &workload, args)?;
        let before = volume.device().stats();
        let (results, elapsed) = run_jobs(&workload, prepared)?;
        let stats = volume.device().stats().since(&before);
        let cache = volume.cache_stats();
        println!(
            "cache at the end: {} MiB cached, {} MiB dirty; folios allocated {}, reused {}",
            cache.cached_bytes >> 20,
            cache.dirty_bytes >> 20,
            cache.folios_allocated,
            cache.folios_reused
        );
        volume.close()?;
        (results, elapsed, Some(stats))
    };
    report(args, options, &workload, &results, elapsed, device_bytes);
    Ok(ExitCode::SUCCESS)
}

/// Creates each job's file; lays it out and pre-reads it as asked.
fn prepare_files(
    volume: &Volume,
    workload: &Workload,
    args: &BufferedArgs,
) -> anyhow::Result<Vec<File>> {
    const CHUNK_BYTES: usize = 1 << 20;
    let chunk = vec![0x5Au8; CHUNK_BYTES];
    let mut files = Vec::new();
    for job in 0..args.numjobs {
        let attr =
            volume.create(1, format!("bench.{job}.0").as_bytes(), 0o644, Owner::current())?;
        let file = volume.open_file(attr.ino, OpenFlags::READ_WRITE)?;
        if args.overwrite || !workload.rw.writes() {
            let mut offset = 0;
            while offset < workload.file_bytes {
                let length = (workload.file_bytes - offset).min(CHUNK_BYTES as u64) as usize;
                file.write_at(&chunk[..length], offset)?;
                offset += length as u64;
            }
            file.fsync()?;
        }
        if args.pre_read {
            let mut buffer = vec![0u8; CHUNK_BYTES];
            let mut offset = 0;
            while offset < workload.file_bytes {
                offset += file.read_at(&mut buffer, offset)?.max(1) as u64;
            }
        }
        files.push(file);
    }
    Ok(files)
}

fn run_jobs(workload: &Workload, files: Vec<File>) -> anyhow::Result<(Vec<JobResult>, Duration)> {
    let workload = *workload;
    run_threads(files.len(), move |job, start| {
        let file = &files[job];
        // Page-aligned, as fio's buffers are: copy speed depends on it.
        let mut buffer = AlignedBuf::zeroed(workload.request_bytes);
        buffer.fill((job as u8).wrapping_mul(29) | 1);
        let mut next_offset = workload.offsets(job);
        let mut writes_since_sync = 0;
        run_loop(&workload, start, || {
            let offset = next_offset();
            let done = if workload.rw.writes() {
                let done = file.write_at(&buffer, offset)?;
                writes_since_sync += 1;
                if workload.fdatasync_every > 0 && writes_since_sync == workload.fdatasync_every {
                    writes_since_sync = 0;
                    file.fdatasync()?;
                }
                done
            } else {
                file.read_at(&mut buffer, offset)?
            };
            Ok(done)
        })
        .and_then(|result| {
            if workload.end_fsync && workload.rw.writes() {
                file.fsync()?;
            }
            Ok(result)
        })
    })
}

fn run_memcpy(workload: &Workload, numjobs: usize) -> anyhow::Result<(Vec<JobResult>, Duration)> {
    let workload = *workload;
    // Each job's "file", touched once so its pages exist, as a cached file's
    // do; each job takes its own out before the clock starts.
    // Aligned buffers as the cache's folio memory is (huge pages where whole).
    let regions: Vec<Option<AlignedBuf>> =
        (0..numjobs).map(|_| Some(AlignedBuf::zeroed(workload.file_bytes as usize))).collect();
    let regions = std::sync::Mutex::new(regions);
    run_threads(numjobs, move |job, start| {
        let mut region =
            regions.lock().expect("not poisoned")[job].take().expect("one job per region");
        let mut buffer = AlignedBuf::zeroed(workload.request_bytes);
        buffer.fill((job as u8) | 1);
        let mut next_offset = workload.offsets(job);
        run_loop(&workload, start, || {
            let offset = next_offset() as usize;
            let span = offset..offset + workload.request_bytes;
            if workload.rw.writes() {
                region[span].copy_from_slice(&buffer);
            } else {
                buffer.copy_from_slice(&region[span]);
            }
            std::hint::black_box(&buffer);
            Ok(workload.request_bytes)
        })
    })
}

/// Runs `job(index, start)` on `count` threads released together; returns
/// their results and the time from the measurement start to the last end.
fn run_threads<J>(count: usize, job: J) -> anyhow::Result<(Vec<JobResult>, Duration)>
where
    J: Fn(usize, Instant) -> anyhow::Result<JobResult> + Send + Sync + 'static,
{
    let job = Arc::new(job);
    let barrier = Arc::new(Barrier::new(count + 1));
    let start_cell = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let threads: Vec<_> = (0..count)
        .map(|index| {
            let (job, barrier, start_cell) =
                (Arc::clone(&job), Arc::clone(&barrier), Arc::clone(&start_cell));
            std::thread::Builder::new()
                .name(format!("bench-job-{index}"))
                .spawn(move || {
                    barrier.wait();
                    let start =
                        start_cell.lock().expect("not poisoned").expect("set before the barrier");
                    job(index, start)
                })
                .expect("spawn a bench job")
        })
        .collect();
    let start = Instant::now();
    *start_cell.lock().expect("not poisoned") = Some(start);
    barrier.wait();
    let mut results = Vec::new();
    for thread in threads {
        results.push(thread.join().map_err(|_| anyhow::anyhow!("a bench job panicked"))??);
    }
    Ok((results, start.elapsed()))
}

/// Calls `one` (which does one request and returns its bytes) until the
/// ramp and the runtime are over (or once through the file without a
/// runtime), timing the requests after the ramp.
fn run_loop(
    workload: &Workload,
    start: Instant,
    mut one: impl FnMut() -> anyhow::Result<usize>,
) -> anyhow::Result<JobResult> {
    let ramp_end = start + workload.ramp;
    let deadline = workload.runtime.map(|runtime| ramp_end + runtime);
    let mut latencies = Latencies::new();
    let mut bytes = 0u64;
    let mut done_requests = 0u64;
    loop {
        let started = Instant::now();
        match deadline {
            Some(deadline) if started >= deadline => break,
            None if done_requests == workload.requests_per_file() => break,
            _ => {}
        }
        let measured = started >= ramp_end;
        let transferred = one().context("benchmark I/O failed")?;
        done_requests += 1;
        if measured {
            latencies.record(started.elapsed());
            bytes += transferred as u64;
        }
    }
    Ok(JobResult { latencies, bytes })
}

fn report(
    args: &BufferedArgs,
    options: &VolumeOptions,
    workload: &Workload,
    results: &[JobResult],
    elapsed: Duration,
    device: Option<foliofs::dev::DevStats>,
) {
    let mut latencies = Latencies::new();
    let mut bytes = 0;
    for result in results {
        latencies.merge(&result.latencies);
        bytes += result.bytes;
    }
    let seconds = elapsed.saturating_sub(workload.ramp).as_secs_f64();
    let ios = latencies.count();
    let target = if args.memcpy { "memcpy" } else { "foliofs" };
    println!(
        "buffered {:?} on {target}: bs={} numjobs={} size={} runtime={} fdatasync={} \
         overwrite={} pre_read={} end_fsync={} dirty={:?} folio_max={} engine={:?}",
        workload.rw,
        args.bs,
        args.numjobs,
        args.size,
        args.runtime,
        args.fdatasync,
        args.overwrite,
        args.pre_read,
        args.end_fsync,
        options.dirty,
        options.folio_max_bytes,
        options.engine,
    );
    let direction = if workload.rw.writes() { "write" } else { "read" };
    println!(
        "  {direction}: IOPS={:.0}, BW={:.1}MiB/s, ios={ios} in {seconds:.2}s",
        ios as f64 / seconds,
        bytes as f64 / seconds / (1 << 20) as f64
    );
    println!("  {}", latencies.summary());
    if let Some(stats) = device {
        let per_io = |count: u64| count as f64 / ios.max(1) as f64;
        println!(
            "  device: requests/io={:.3} (writes {:.3}, reads {:.3}, flushes {:.3}), \
             bytes written/io={:.0}, device bytes written per byte written={:.2}",
            per_io(stats.requests()),
            per_io(stats.write_requests),
            per_io(stats.read_requests),
            per_io(stats.flush_requests),
            per_io(stats.bytes_written),
            if workload.rw.writes() {
                stats.bytes_written as f64 / bytes.max(1) as f64
            } else {
                0.0
            },
        );
    }
}
