//! `foliofs bench direct`: one direct-I/O workload, as fio would run it with
//! ioengine=io_uring direct=1: `numjobs` threads each keep `iodepth` requests
//! in flight through the engine's asynchronous API on one preallocated file.
//! `--raw` runs the same loop through the same I/O backend straight on the
//! image file, with no file system in between: the limit for the engine.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use foliofs::completion::{self, IoFuture};
use foliofs::dev::{AlignedBuf, DevRequest, DevStats, Device};
use foliofs::options::parse_size;
use foliofs::{OpenFlags, Owner, Volume, VolumeOptions};
use futures::stream::{FuturesUnordered, StreamExt};
use rand::{RngExt, SeedableRng};

use super::image::{BenchImage, ImageArgs};
use foliofs_bench::latency::Latencies;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Rw {
    Read,
    Write,
    Randread,
    Randwrite,
}

impl Rw {
    pub fn writes(self) -> bool {
        matches!(self, Rw::Write | Rw::Randwrite)
    }

    pub fn random(self) -> bool {
        matches!(self, Rw::Randread | Rw::Randwrite)
    }
}

#[derive(Args)]
pub struct DirectArgs {
    /// Access pattern.
    #[arg(long, value_enum, default_value = "randwrite")]
    rw: Rw,
    /// Bytes per request (a multiple of 512).
    #[arg(long, default_value = "4k")]
    bs: String,
    /// Requests each job keeps in flight.
    #[arg(long, default_value = "1")]
    iodepth: usize,
    /// Threads, each with its own queue; all share the one file.
    #[arg(long, default_value = "1")]
    numjobs: usize,
    /// Size of the file the requests land in.
    #[arg(long, default_value = "1G")]
    size: String,
    /// How long to measure, e.g. 10s, 2m, 500ms.
    #[arg(long, default_value = "10s")]
    runtime: String,
    /// Run this long before measuring (fio's ramp_time), e.g. to let the host
    /// finish writing back the image's layout.
    #[arg(long, default_value = "0s")]
    ramp_time: String,
    /// O_DSYNC writes (fio's sync=1).
    #[arg(long)]
    dsync: bool,
    /// Bypass the file system: the same backend straight on the image file.
    #[arg(long)]
    raw: bool,
    #[command(flatten)]
    image: ImageArgs,
}

/// Parses `10s`, `2m`, `500ms`, `1h` or a plain number of seconds.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits.parse().with_context(|| format!("bad time {text:?}"))?;
    Ok(match unit {
        "" | "s" => Duration::from_secs(number),
        "ms" => Duration::from_millis(number),
        "us" => Duration::from_micros(number),
        "m" => Duration::from_secs(number * 60),
        "h" => Duration::from_secs(number * 3600),
        other => bail!("bad time unit {other:?} in {text:?} (use ms, s, m or h)"),
    })
}

#[derive(Debug, Clone, Copy)]
struct Workload {
    rw: Rw,
    block_bytes: usize,
    file_bytes: u64,
    iodepth: usize,
    runtime: Duration,
    ramp: Duration,
}

/// What a run measured after the ramp.
struct Measured {
    stats: DevStats,
    elapsed: Duration,
    latencies: Latencies,
}

pub fn run(args: &DirectArgs, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let block_bytes = parse_size(&args.bs).context("--bs")? as usize;
    let file_bytes = parse_size(&args.size).context("--size")?;
    if block_bytes == 0 || !block_bytes.is_multiple_of(512) || file_bytes < block_bytes as u64 {
        bail!("--bs must be a non-zero multiple of 512 and no larger than --size");
    }
    if args.iodepth == 0 || args.numjobs == 0 {
        bail!("--iodepth and --numjobs must be at least 1");
    }
    if args.raw && args.image.named() {
        bail!("--raw writes over the whole image; it runs only on a temporary image");
    }
    let workload = Workload {
        rw: args.rw,
        block_bytes,
        file_bytes,
        iodepth: args.iodepth,
        runtime: parse_duration(&args.runtime)?,
        ramp: parse_duration(&args.ramp_time)?,
    };
    let image_bytes = file_bytes + file_bytes / 16 + (128 << 20);
    let image = BenchImage::create(&args.image, image_bytes, options)?;
    let measured = if args.raw {
        run_raw(&workload, image.path(), options, args.numjobs, args.dsync)?
    } else {
        run_engine(&workload, image.path(), options, args.numjobs, args.dsync)?
    };
    report(args, options, &workload, &measured);
    Ok(ExitCode::SUCCESS)
}

type Submitted = Pin<Box<dyn Future<Output = (AlignedBuf, foliofs::Result<usize>)> + Send>>;

fn run_engine(
    workload: &Workload,
    image: &Path,
    options: &VolumeOptions,
    numjobs: usize,
    dsync: bool,
) -> anyhow::Result<Measured> {
    let volume = Volume::open(image, options)?;
    let attr = volume.create(1, b"bench", 0o644, Owner::current())?;
    lay_out_file(&volume, attr.ino, workload.file_bytes)?;
    let flags = OpenFlags { dsync, ..OpenFlags::READ_WRITE.with_direct() };
    let files =
        (0..numjobs).map(|_| volume.open_file(attr.ino, flags)).collect::<Result<Vec<_>, _>>()?;
    let device = Arc::clone(volume.device());
    let measured =
        measure(workload, &device, files, |file, buffer, offset, writes| -> Submitted {
            if writes {
                Box::pin(file.write_at_async(buffer, offset))
            } else {
                Box::pin(file.read_at_async(buffer, offset))
            }
        })?;
    volume.close()?;
    Ok(measured)
}

/// Writes the whole file once with large direct writes, so every block is
/// allocated and Written (fio's layout; the seeds run with overwrite=1).
fn lay_out_file(volume: &Volume, ino: u64, file_bytes: u64) -> anyhow::Result<()> {
    const CHUNK_BYTES: u64 = 4 << 20;
    let file = volume.open_file(ino, OpenFlags::WRITE.with_direct())?;
    let chunk = AlignedBuf::zeroed(CHUNK_BYTES as usize);
    let mut offset = 0;
    while offset < file_bytes {
        let length = (file_bytes - offset).min(CHUNK_BYTES) as usize;
        file.write_at(&chunk[..length.div_ceil(512) * 512], offset)?;
        offset += length as u64;
    }
    volume.sync()?;
    Ok(())
}

fn run_raw(
    workload: &Workload,
    image: &Path,
    options: &VolumeOptions,
    numjobs: usize,
    dsync: bool,
) -> anyhow::Result<Measured> {
    let device = Arc::new(Device::open(image, &options.dev_options())?);
    let handles: Vec<Arc<Device>> = (0..numjobs).map(|_| Arc::clone(&device)).collect();
    measure(workload, &device, handles, move |device, buffer, offset, writes| -> Submitted {
        let length = buffer.len();
        let request = if writes {
            DevRequest::Write { offset, buffer, fua: dsync }
        } else {
            DevRequest::Read { offset, buffer }
        };
        let (future, completer) = completion::pair();
        // Plugged, and unplugged when the job would wait: the engine's
        // direct path submits the same way.
        device.submit_plugged(
            request,
            Box::new(move |response| {
                let buffer = response.buffer.expect("reads and writes hand their buffer back");
                let result = response
                    .result
                    .map(|()| length)
                    .map_err(|error| foliofs::Error::io("raw", error));
                completer.complete((buffer, result));
            }),
        );
        Box::pin(Unplugging { inner: future, device: Arc::clone(device) })
    })
}

/// A raw request's future: unplugs the device when it would wait.
struct Unplugging {
    inner: IoFuture<(AlignedBuf, foliofs::Result<usize>)>,
    device: Arc<Device>,
}

impl Future for Unplugging {
    type Output = (AlignedBuf, foliofs::Result<usize>);

    fn poll(mut self: Pin<&mut Self>, context: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let polled = Pin::new(&mut self.inner).poll(context);
        if polled.is_pending() {
            self.device.unplug();
        }
        polled
    }
}

/// Runs one job per handle, each on its own thread; measures the device
/// counters and the time from the end of the ramp to the last completion.
fn measure<H, S>(
    workload: &Workload,
    device: &Device,
    handles: Vec<H>,
    submit: S,
) -> anyhow::Result<Measured>
where
    H: Send + 'static,
    S: Fn(&H, AlignedBuf, u64, bool) -> Submitted + Send + Sync + Copy + 'static,
{
    let workload = *workload;
    let ramp_end = Instant::now() + workload.ramp;
    let jobs: Vec<JoinHandle<anyhow::Result<Latencies>>> = handles
        .into_iter()
        .enumerate()
        .map(|(job, handle)| {
            std::thread::Builder::new()
                .name(format!("bench-job-{job}"))
                .spawn(move || {
                    run_job(&workload, job as u64, ramp_end, |buffer, offset| {
                        submit(&handle, buffer, offset, workload.rw.writes())
                    })
                })
                .expect("spawn a bench job")
        })
        .collect();
    std::thread::sleep(ramp_end.saturating_duration_since(Instant::now()));
    let before = device.stats();
    let started = Instant::now();
    let mut latencies = Latencies::new();
    for job in jobs {
        let job = job.join().map_err(|_| anyhow::anyhow!("a bench job panicked"))??;
        latencies.merge(&job);
    }
    Ok(Measured { stats: device.stats().since(&before), elapsed: started.elapsed(), latencies })
}

/// Keeps `iodepth` requests in flight until the ramp and the runtime are over;
/// records the latencies of requests started after the ramp.
fn run_job(
    workload: &Workload,
    job: u64,
    ramp_end: Instant,
    submit: impl Fn(AlignedBuf, u64) -> Submitted,
) -> anyhow::Result<Latencies> {
    let blocks = workload.file_bytes / workload.block_bytes as u64;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(job + 1);
    let mut next_block = 0u64;
    let mut next_offset = || {
        let block = if workload.rw.random() {
            rng.random_range(0..blocks)
        } else {
            let block = next_block;
            next_block = (next_block + 1) % blocks;
            block
        };
        block * workload.block_bytes as u64
    };
    let deadline = ramp_end + workload.runtime;
    let mut latencies = Latencies::new();
    let mut in_flight = FuturesUnordered::new();
    for index in 0..workload.iodepth {
        let mut buffer = AlignedBuf::zeroed(workload.block_bytes);
        buffer.fill((job as u8).wrapping_mul(16).wrapping_add(index as u8));
        in_flight.push(timed(Instant::now(), submit(buffer, next_offset())));
    }
    completion::block_on(async {
        while let Some(((buffer, result), started)) = in_flight.next().await {
            result.context("benchmark I/O failed")?;
            if started >= ramp_end {
                latencies.record(started.elapsed());
            }
            if Instant::now() < deadline {
                in_flight.push(timed(Instant::now(), submit(buffer, next_offset())));
            }
        }
        anyhow::Ok(())
    })?;
    Ok(latencies)
}

/// Pairs a request's result with when it started (taken before the
/// submission, which may complete it).
async fn timed<F: Future>(started: Instant, future: F) -> (F::Output, Instant) {
    (future.await, started)
}

fn report(args: &DirectArgs, options: &VolumeOptions, workload: &Workload, measured: &Measured) {
    let ios = measured.latencies.count();
    let seconds = measured.elapsed.as_secs_f64();
    let iops = ios as f64 / seconds;
    let mib_per_second = iops * workload.block_bytes as f64 / (1 << 20) as f64;
    let target = if args.raw { "raw backing file" } else { "foliofs" };
    println!(
        "direct {:?} on {target}: bs={} iodepth={} numjobs={} size={} runtime={} ramp={} \
         dsync={} engine={:?} fua={:?} dio_unaligned={:?}",
        workload.rw,
        args.bs,
        args.iodepth,
        args.numjobs,
        args.size,
        args.runtime,
        args.ramp_time,
        args.dsync,
        options.engine,
        options.fua,
        options.dio_unaligned
    );
    let direction = if workload.rw.writes() { "write" } else { "read" };
    println!(
        "  {direction}: IOPS={iops:.0}, BW={mib_per_second:.1}MiB/s, ios={ios} in {seconds:.2}s"
    );
    println!("  {}", measured.latencies.summary());
    let stats = &measured.stats;
    let per_io = |count: u64| count as f64 / ios.max(1) as f64;
    println!(
        "  device: requests/io={:.3} (writes {:.3}, reads {:.3}, flushes {:.3}, fua {:.3}), \
         bytes written/io={:.0}",
        per_io(stats.requests()),
        per_io(stats.write_requests),
        per_io(stats.read_requests),
        per_io(stats.flush_requests),
        per_io(stats.fua_writes),
        per_io(stats.bytes_written)
    );
}
