//! `foliofs bench metadata`: create a file, write to it, fsync, close; over
//! and over, from one or more threads.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use foliofs::options::parse_size;
use foliofs::{OpenFlags, Owner, Volume, VolumeOptions};

use super::image::{BenchImage, ImageArgs};
use foliofs_bench::latency::Latencies;

#[derive(Args)]
pub struct MetadataArgs {
    /// Files to create per job.
    #[arg(long, default_value = "2000")]
    files: u64,
    /// Threads creating files at once (each in its own directory).
    #[arg(long, default_value = "1")]
    jobs: u64,
    /// Bytes written to each file before its fsync.
    #[arg(long, default_value = "4k")]
    file_size: String,
    #[command(flatten)]
    image: ImageArgs,
}

pub fn run(args: &MetadataArgs, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let file_bytes = parse_size(&args.file_size).context("--file-size")? as usize;
    let image = BenchImage::create(&args.image, 1 << 30, options)?;
    let volume = Arc::new(Volume::open(image.path(), options)?);
    let before = volume.device().stats();
    let started = Instant::now();
    let workers: Vec<_> = (0..args.jobs)
        .map(|job| {
            let volume = Arc::clone(&volume);
            let files = args.files;
            std::thread::spawn(move || create_and_fsync(&volume, job, files, file_bytes))
        })
        .collect();
    let mut latencies = Latencies::new();
    for worker in workers {
        let job = worker.join().map_err(|_| anyhow::anyhow!("a bench job panicked"))??;
        latencies.merge(&job);
    }
    let elapsed = started.elapsed();
    let stats = volume.device().stats().since(&before);
    let operations = latencies.count() as f64;
    println!(
        "metadata: create + write {} + fsync + close, {} files x {} jobs, engine {:?}, fua {:?}",
        args.file_size, args.files, args.jobs, options.engine, options.fua
    );
    println!("  {:.0} ops/s; {}", operations / elapsed.as_secs_f64(), latencies.summary());
    println!(
        "  device per op: {:.2} requests ({:.2} writes, {:.2} FUA, {:.2} flushes), {:.0} bytes written",
        stats.requests() as f64 / operations,
        stats.write_requests as f64 / operations,
        stats.fua_writes as f64 / operations,
        stats.flush_requests as f64 / operations,
        stats.bytes_written as f64 / operations
    );
    match Arc::try_unwrap(volume) {
        Ok(volume) => volume.close()?,
        Err(_) => anyhow::bail!("bench jobs still hold the volume"),
    }
    Ok(ExitCode::SUCCESS)
}

fn create_and_fsync(
    volume: &Volume,
    job: u64,
    files: u64,
    file_bytes: usize,
) -> anyhow::Result<Latencies> {
    let dir = volume.mkdir(1, format!("job{job}").as_bytes(), 0o755, Owner::current())?.ino;
    let data = vec![0xABu8; file_bytes];
    let mut latencies = Latencies::new();
    for index in 0..files {
        let started = Instant::now();
        let attr = volume.create(dir, format!("f{index}").as_bytes(), 0o644, Owner::current())?;
        let file = volume.open_file(attr.ino, OpenFlags::WRITE)?;
        file.write_at(&data, 0)?;
        file.fsync()?;
        file.close()?;
        latencies.record(started.elapsed());
    }
    Ok(latencies)
}
