//! `foliofs bench metadata`: create a file, write to it, fsync (unless
//! `--no-fsync`), close; over and over, from one or more threads. Reports the
//! rate, the latencies, the device requests per file, and the memory the
//! files took: the folio cache's bytes and folios, and the process's
//! resident memory against the data written. With `--peers` the same loop
//! then runs through the OS: on foliofs mounted through FUSE and on the
//! kernel's ext4 and XFS (`foliofs_bench::creates`), with the same jobs.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use foliofs::options::parse_size;
use foliofs::{OpenFlags, Owner, Volume, VolumeOptions};

use super::image::{BenchImage, ImageArgs};
use foliofs_bench::creates::{self, CreateLoop, CreateRun};
use foliofs_bench::latency::Latencies;
use foliofs_bench::peers::{self, FuseMount, Peers};

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
    /// Leave the data in the cache: no fsync per file (the files are
    /// written back when the volume closes, outside the timing).
    #[arg(long)]
    no_fsync: bool,
    /// Then run the same loop, with the same jobs, through the mount and
    /// on the kernel's ext4 and XFS (loop devices over laid-out files in
    /// the current directory; needs root, mkfs.ext4, mkfs.xfs and FUSE).
    #[arg(long)]
    peers: bool,
    #[command(flatten)]
    image: ImageArgs,
}

pub fn run(
    args: &MetadataArgs,
    options: &VolumeOptions,
    options_text: &str,
) -> anyhow::Result<ExitCode> {
    let file_bytes = parse_size(&args.file_size).context("--file-size")? as usize;
    if args.peers {
        if let Some(why) = peers::unavailable() {
            anyhow::bail!("--peers cannot run here: {why}");
        }
    }
    let files = args.files * args.jobs;
    let data_bytes = files * file_bytes as u64;
    // Room for the data twice over, and for the metadata: the checkpoint
    // slots are a fixed share of the volume, about 16 KiB of it per file.
    let image_bytes = (1 << 30) + 2 * data_bytes + files * (16 << 10);
    let image = BenchImage::create(&args.image, image_bytes, options)?;
    let volume = Arc::new(Volume::open(image.path(), options)?);
    let before = volume.device().stats();
    let waits_before = volume.lock_waits();
    let resident_before = resident_bytes();
    let cpu_before = foliofs_bench::cpu::process_seconds();
    let threads_before = foliofs_bench::cpu::seconds_by_thread_name();
    let started = Instant::now();
    let fsync = !args.no_fsync;
    let workers: Vec<_> = (0..args.jobs)
        .map(|job| {
            let volume = Arc::clone(&volume);
            let files = args.files;
            std::thread::spawn(move || create_and_write(&volume, job, files, file_bytes, fsync))
        })
        .collect();
    let mut latencies = Latencies::new();
    let mut jobs_cpu_seconds = Some(0.0);
    for worker in workers {
        let (job, job_cpu) =
            worker.join().map_err(|_| anyhow::anyhow!("a bench job panicked"))??;
        latencies.merge(&job);
        jobs_cpu_seconds = jobs_cpu_seconds.zip(job_cpu).map(|(sum, job)| sum + job);
    }
    let elapsed = started.elapsed();
    let engine_threads = foliofs_bench::cpu::used_between(
        &threads_before,
        &foliofs_bench::cpu::seconds_by_thread_name(),
    );
    let stats = volume.device().stats().since(&before);
    let waits = volume.lock_waits();
    let cpu_used =
        foliofs_bench::cpu::process_seconds().zip(cpu_before).map(|(after, was)| after - was);
    let resident_grown = resident_bytes().zip(resident_before).map(|(after, was)| after - was);
    let cache = volume.cache_stats();
    let operations = latencies.count() as f64;
    let sync = if fsync { " + fsync" } else { "" };
    println!(
        "metadata: create + write {}{sync} + close, {} files x {} jobs, engine {:?}, fua {:?}",
        args.file_size, args.files, args.jobs, options.engine, options.fua
    );
    println!("  {:.0} ops/s; {}", operations / elapsed.as_secs_f64(), latencies.summary());
    if let Some(cpu_used) = cpu_used {
        // Steadier than the rate on a busy machine: the work, not the wait.
        println!(
            "  CPU (all threads): {cpu_used:.2} s, {:.1} us per op, {:.0} ops per CPU second",
            cpu_used * 1e6 / operations,
            operations / cpu_used.max(0.01)
        );
        if let Some(jobs) = jobs_cpu_seconds {
            // What bounds the speed-up on few CPUs: every job's own CPU,
            // and what the engine's threads spend beside them.
            let per_op_us = |seconds: f64| seconds * 1e6 / operations;
            let others: Vec<String> = engine_threads
                .iter()
                .take(4)
                .map(|(name, seconds)| format!("{name} {:.1}", per_op_us(*seconds)))
                .collect();
            println!(
                "  CPU per op (us): jobs {:.1}, other threads {:.1} ({}); {:.2} CPUs busy",
                per_op_us(jobs),
                per_op_us((cpu_used - jobs).max(0.0)),
                others.join(", "),
                cpu_used / elapsed.as_secs_f64()
            );
        }
    }
    println!("  {}", foliofs_bench::latency::lock_waits_line(&waits_before, &waits, operations));
    println!(
        "  device per op: {:.2} requests ({:.2} writes, {:.2} FUA, {:.2} flushes), {:.0} bytes written",
        stats.requests() as f64 / operations,
        stats.write_requests as f64 / operations,
        stats.fua_writes as f64 / operations,
        stats.flush_requests as f64 / operations,
        stats.bytes_written as f64 / operations
    );
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    println!(
        "  folio cache: {:.1} MiB in {} folios for {:.1} MiB written ({:.1} MiB dirty); \
         folio memory {:.1} MiB ({:.2}x the data)",
        mib(cache.cached_bytes),
        cache.folios,
        mib(data_bytes),
        mib(cache.dirty_bytes),
        mib(cache.memory_bytes),
        cache.memory_bytes as f64 / data_bytes.max(1) as f64
    );
    if let Some(grown) = resident_grown {
        println!(
            "  resident memory grew {:.1} MiB ({:.2}x the data; cache, metadata and allocator)",
            mib(grown),
            grown as f64 / data_bytes.max(1) as f64
        );
    }
    match Arc::try_unwrap(volume) {
        Ok(volume) => volume.close()?,
        Err(_) => anyhow::bail!("bench jobs still hold the volume"),
    }
    if args.peers {
        let work = CreateLoop { jobs: args.jobs, files_per_job: args.files, file_bytes, fsync };
        let in_process_rate = operations / elapsed.as_secs_f64();
        run_through_the_os(&work, &image, options, options_text, in_process_rate)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The loop through the OS: on foliofs mounted (the image formatted again)
/// and on ext4 and XFS; a line each, then foliofs against ext4.
fn run_through_the_os(
    work: &CreateLoop,
    image: &BenchImage,
    options: &VolumeOptions,
    options_text: &str,
    in_process_rate: f64,
) -> anyhow::Result<()> {
    let jobs = if work.jobs == 1 { "1 job".to_string() } else { format!("{} jobs", work.jobs) };
    println!("  the same loop through the OS, {jobs}:");
    let print_row = |label: &str, run: &CreateRun| {
        println!("    {label:<16} {:.0} ops/s; {}", run.rate(), run.latencies.summary());
    };
    let work_dir = std::env::current_dir()?;
    image.reformat(options)?;
    let program = std::env::current_exe().context("the foliofs executable, to mount")?;
    let mount_point = work_dir.join(format!("foliofs-metadata-mnt-{}", std::process::id()));
    let mounted = FuseMount::start(&program, image.path(), &mount_point, options_text)?;
    let through_mount = creates::run_on_path(&mounted.mount, work).context("through the mount");
    mounted.stop()?;
    let _ = std::fs::remove_dir(&mount_point);
    let through_mount = through_mount?;
    print_row("foliofs (mount)", &through_mount);
    let peers_dir = work_dir.join(format!("foliofs-metadata-peers-{}", std::process::id()));
    let peers = Peers::start_for_files(&peers_dir, work.peer_bytes(), work.peer_inodes())?;
    let mut ext4_rate = None;
    for fs in &peers.file_systems {
        let label = format!("kernel {}", fs.name);
        let run = creates::run_on_path(&fs.mount, work).with_context(|| label.clone())?;
        print_row(&label, &run);
        if fs.name == "ext4" {
            ext4_rate = Some(run.rate());
        }
    }
    drop(peers);
    if let Some(ext4) = ext4_rate {
        println!(
            "  foliofs / kernel ext4: {:.2}x in process, {:.2}x through the mount",
            in_process_rate / ext4,
            through_mount.rate() / ext4
        );
    }
    Ok(())
}

/// The process's resident memory (Linux), or None where it cannot be read.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

fn create_and_write(
    volume: &Volume,
    job: u64,
    files: u64,
    file_bytes: usize,
    fsync: bool,
) -> anyhow::Result<(Latencies, Option<f64>)> {
    let dir =
        volume.inodes().mkdir(1, format!("job{job}").as_bytes(), 0o755, Owner::current())?.ino;
    let data = vec![0xABu8; file_bytes];
    let mut latencies = Latencies::new();
    for index in 0..files {
        let started = Instant::now();
        let attr =
            volume.inodes().create(dir, format!("f{index}").as_bytes(), 0o644, Owner::current())?;
        let file = volume.inodes().open_file(attr.ino, OpenFlags::WRITE)?;
        file.write_at(&data, 0)?;
        if fsync {
            file.sync_all()?;
        }
        file.close()?;
        latencies.record(started.elapsed());
    }
    Ok((latencies, foliofs_bench::cpu::thread_seconds()))
}
