//! `foliofs bench`: benchmarks run in-process against the engine, on a
//! temporary image unless one is given.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use foliofs::dev::AlignedBuf;
use foliofs::options::parse_size;
use foliofs::vfs::MkfsOptions;
use foliofs::{OpenFlags, Owner, Volume, VolumeOptions};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Metadata operations: create a file, write 4 KiB, fsync, close.
    Metadata(MetadataArgs),
}

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

#[derive(Args)]
pub struct ImageArgs {
    /// Run on this image (formatted first); default: a temporary file in the
    /// current directory, removed afterwards.
    #[arg(long)]
    image: Option<PathBuf>,
    /// Size of the image to create.
    #[arg(long, default_value = "1G")]
    size: String,
    #[arg(long, default_value = "4096")]
    block_size: String,
}

pub fn run(command: BenchCommand, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Metadata(args) => metadata(&args, options),
    }
}

/// An image that is deleted when the benchmark ends, unless the user named it.
struct BenchImage {
    path: PathBuf,
    temporary: bool,
}

impl BenchImage {
    fn create(args: &ImageArgs, options: &VolumeOptions) -> anyhow::Result<Self> {
        let (path, temporary) = match &args.image {
            Some(path) => (path.clone(), false),
            // Like fio, in the current directory: /tmp may be a tmpfs, which
            // says nothing about a disk (and may refuse O_DIRECT).
            None => (PathBuf::from(format!("foliofs-bench-{}.img", std::process::id())), true),
        };
        let image = Self { path, temporary };
        let size_bytes = parse_size(&args.size).context("--size")?;
        let block_bytes = u32::try_from(parse_size(&args.block_size).context("--block-size")?)?;
        let mkfs = MkfsOptions { block_bytes, ..MkfsOptions::default() };
        let size = if image.temporary || !image.path.exists() {
            lay_out(&image.path, size_bytes)?;
            Some(size_bytes)
        } else {
            None
        };
        Volume::mkfs_path(&image.path, size, &mkfs, options)?;
        Ok(image)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes the whole image once, as fio lays out its files: a sparse image
/// would measure the host file system allocating blocks, not the disk.
fn lay_out(path: &Path, size_bytes: u64) -> anyhow::Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const CHUNK_BYTES: usize = 4 << 20;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    let zeros = AlignedBuf::zeroed(CHUNK_BYTES);
    let mut offset = 0u64;
    while offset < size_bytes {
        let length = (size_bytes - offset).min(CHUNK_BYTES as u64) as usize;
        file.write_all_at(&zeros[..length], offset)
            .with_context(|| format!("lay out {}", path.display()))?;
        offset += length as u64;
    }
    file.sync_all()?;
    Ok(())
}

impl Drop for BenchImage {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn metadata(args: &MetadataArgs, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let file_bytes = parse_size(&args.file_size).context("--file-size")? as usize;
    let image = BenchImage::create(&args.image, options)?;
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
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.join().map_err(|_| anyhow::anyhow!("a bench job panicked"))??);
    }
    let elapsed = started.elapsed();
    let stats = volume.device().stats().since(&before);
    let operations = latencies.len() as f64;
    latencies.sort_unstable();
    println!(
        "metadata: create + write {} + fsync + close, {} files x {} jobs, engine {:?}, fua {:?}",
        args.file_size, args.files, args.jobs, options.engine, options.fua
    );
    println!(
        "  {:.0} ops/s; latency p50 {} us, p99 {} us, max {} us",
        operations / elapsed.as_secs_f64(),
        percentile_us(&latencies, 0.50),
        percentile_us(&latencies, 0.99),
        percentile_us(&latencies, 1.0)
    );
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
) -> anyhow::Result<Vec<Duration>> {
    let dir = volume.mkdir(1, format!("job{job}").as_bytes(), 0o755, Owner::current())?.ino;
    let data = vec![0xABu8; file_bytes];
    let mut latencies = Vec::with_capacity(files as usize);
    for index in 0..files {
        let started = Instant::now();
        let attr = volume.create(dir, format!("f{index}").as_bytes(), 0o644, Owner::current())?;
        let file = volume.open_file(attr.ino, OpenFlags::WRITE)?;
        file.write_at(&data, 0)?;
        file.fsync()?;
        file.close()?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}

fn percentile_us(sorted: &[Duration], fraction: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[index].as_micros()
}
