//! `foliofs bench metadata`: create a file, write to it, fsync (unless
//! `--no-fsync`), close; over and over, from one or more threads. Reports the
//! rate, the latencies, the device requests per file, and the memory the
//! files took: the folio cache's bytes and folios, and the process's
//! resident memory against the data written. With `--peers` the same loop
//! then runs through the OS: on foliofs mounted through FUSE and on the
//! kernel's ext4 and XFS (`foliofs_bench::creates`), with the same jobs.

use std::path::PathBuf;
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
use foliofs_bench::tree::{self, jobs_text, Factor};

#[derive(Args)]
pub struct MetadataArgs {
    /// Files to create per job.
    #[arg(long, default_value = "2000")]
    files: u64,
    /// Threads creating files at once (each in its own directory); a list
    /// (1,2,16) runs each count in turn and prints how the rate scales
    /// over the first.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    jobs: Vec<u64>,
    /// Runs of every count of jobs, each on a freshly formatted volume;
    /// within a run each count runs in turn, so a drift of the machine's
    /// speed falls on all of them. Rates are medians, factors the median
    /// of each run's own.
    #[arg(long, default_value = "1")]
    reps: usize,
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

/// Rates of one row: `runs[rep][index of the count of jobs]`.
struct Row {
    label: String,
    runs: Vec<Vec<f64>>,
}

impl Row {
    fn new(label: &str, reps: usize, counts: usize) -> Self {
        Self { label: label.to_string(), runs: vec![vec![0.0; counts]; reps] }
    }

    fn median(&self, count: usize) -> f64 {
        tree::median(self.runs.iter().map(|run| run[count]).collect())
    }

    /// Each run's rate with `count` over its own with the first count.
    fn scaling(&self, count: usize) -> Factor {
        Factor::of(self.runs.iter().map(|run| run[count] / run[0].max(1e-9)).collect())
    }
}

pub fn run(
    args: &MetadataArgs,
    options: &VolumeOptions,
    options_text: &str,
) -> anyhow::Result<ExitCode> {
    let file_bytes = parse_size(&args.file_size).context("--file-size")? as usize;
    if args.jobs.is_empty() || args.jobs.contains(&0) {
        anyhow::bail!("--jobs takes counts of at least 1");
    }
    if args.reps == 0 {
        anyhow::bail!("--reps must be at least 1");
    }
    if args.peers {
        if let Some(why) = peers::unavailable() {
            anyhow::bail!("--peers cannot run here: {why}");
        }
    }
    let jobs_max = args.jobs.iter().copied().max().expect("at least one count");
    let files = args.files * jobs_max;
    let data_bytes = files * file_bytes as u64;
    // Room for the data twice over, and for the metadata: the checkpoint
    // slots are a fixed share of the volume, about 16 KiB of it per file.
    let image_bytes = (1 << 30) + 2 * data_bytes + files * (16 << 10);
    let image = BenchImage::create(&args.image, image_bytes, options)?;
    let fsync = !args.no_fsync;
    let counts = args.jobs.len();
    let mut rows = vec![Row::new("in process", args.reps, counts)];
    let work_of = |jobs| CreateLoop { jobs, files_per_job: args.files, file_bytes, fsync };
    let through_os = if args.peers {
        let largest = work_of(jobs_max);
        let os = ThroughTheOs::start(&largest, options_text)?;
        rows.push(Row::new("foliofs (mount)", args.reps, counts));
        for fs in &os.peers.file_systems {
            rows.push(Row::new(&format!("kernel {}", fs.name), args.reps, counts));
        }
        Some(os)
    } else {
        None
    };
    for rep in 0..args.reps {
        for (count, &jobs) in args.jobs.iter().enumerate() {
            // `create` formatted it for the first run.
            if rep > 0 || count > 0 {
                image.reformat(options)?;
            }
            let work = work_of(jobs);
            rows[0].runs[rep][count] = run_in_process(&image, options, &args.file_size, &work)?;
            if let Some(os) = &through_os {
                image.reformat(options)?;
                let rates = os.run(&work, &image, rep)?;
                for (row, rate) in rows[1..].iter_mut().zip(&rates) {
                    row.runs[rep][count] = *rate;
                }
                let rate_of = |label: &str| {
                    rows.iter()
                        .find(|row| row.label == label)
                        .map_or(0.0, |row| row.runs[rep][count])
                };
                let ext4 = rate_of("kernel ext4").max(1e-9);
                println!(
                    "  foliofs / kernel ext4: {:.2}x in process, {:.2}x through the mount",
                    rate_of("in process") / ext4,
                    rate_of("foliofs (mount)") / ext4
                );
            }
        }
    }
    if let Some(os) = through_os {
        os.stop();
    }
    if args.reps > 1 || counts > 1 {
        print_summary(args, &rows);
    }
    Ok(ExitCode::SUCCESS)
}

/// One run in process, on the formatted image; prints its report and
/// returns its rate.
fn run_in_process(
    image: &BenchImage,
    options: &VolumeOptions,
    file_size: &str,
    work: &CreateLoop,
) -> anyhow::Result<f64> {
    let data_bytes = work.files() * work.file_bytes as u64;
    let volume = Arc::new(Volume::open(image.path(), options)?);
    let before = volume.device().stats();
    let waits_before = volume.lock_waits();
    let resident_before = resident_bytes();
    let cpu_before = foliofs_bench::cpu::process_seconds();
    let threads_before = foliofs_bench::cpu::seconds_by_thread_name();
    let started = Instant::now();
    let workers: Vec<_> = (0..work.jobs)
        .map(|job| {
            let volume = Arc::clone(&volume);
            let work = *work;
            std::thread::spawn(move || {
                create_and_write(&volume, job, work.files_per_job, work.file_bytes, work.fsync)
            })
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
    let sync = if work.fsync { " + fsync" } else { "" };
    println!(
        "metadata: create + write {file_size}{sync} + close, {} files x {}, engine {:?}, fua {:?}",
        work.files_per_job,
        jobs_text(work.jobs),
        options.engine,
        options.fua
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
    Ok(operations / elapsed.as_secs_f64())
}

/// The loop through the OS: on foliofs mounted (the image formatted again
/// for each run) and on ext4 and XFS (made once, at the start; each run in
/// a directory of its own, removed after it).
struct ThroughTheOs {
    peers: Peers,
    program: PathBuf,
    mount_point: PathBuf,
    /// `foliofs mount -o`: the bench's volume options.
    mount_options: String,
}

impl ThroughTheOs {
    /// Lays out and makes the peers, with room for `largest`.
    fn start(largest: &CreateLoop, options_text: &str) -> anyhow::Result<Self> {
        let work_dir = std::env::current_dir()?;
        let program = std::env::current_exe().context("the foliofs executable, to mount")?;
        let mount_point = work_dir.join(format!("foliofs-metadata-mnt-{}", std::process::id()));
        let peers_dir = work_dir.join(format!("foliofs-metadata-peers-{}", std::process::id()));
        let peers =
            Peers::start_for_files(&peers_dir, largest.peer_bytes(), largest.peer_inodes())?;
        let mount_options = options_text.to_string();
        Ok(Self { peers, program, mount_point, mount_options })
    }

    /// One run of `work` through the mount of the formatted `image`, then on
    /// each peer; prints a line each and returns the rates in that order.
    fn run(&self, work: &CreateLoop, image: &BenchImage, rep: usize) -> anyhow::Result<Vec<f64>> {
        let jobs = work.jobs;
        println!("  the same loop through the OS, {}:", jobs_text(jobs));
        let print_row = |label: &str, run: &CreateRun| {
            println!("    {label:<16} {:.0} ops/s; {}", run.rate(), run.latencies.summary());
        };
        let mounted =
            FuseMount::start(&self.program, image.path(), &self.mount_point, &self.mount_options)?;
        let through_mount = creates::run_on_path(&mounted.mount, work).context("through the mount");
        mounted.stop()?;
        let through_mount = through_mount?;
        print_row("foliofs (mount)", &through_mount);
        let mut rates = vec![through_mount.rate()];
        for fs in &self.peers.file_systems {
            let label = format!("kernel {}", fs.name);
            let base = fs.mount.join(format!("run{rep}-jobs{jobs}"));
            std::fs::create_dir(&base).with_context(|| format!("mkdir {}", base.display()))?;
            let run = creates::run_on_path(&base, work).with_context(|| label.clone())?;
            print_row(&label, &run);
            rates.push(run.rate());
            // Outside the timing: the next run starts from an empty file
            // system again, as the mount's does.
            std::fs::remove_dir_all(&base).with_context(|| format!("remove {}", base.display()))?;
        }
        Ok(rates)
    }

    fn stop(self) {
        let _ = std::fs::remove_dir(&self.mount_point);
        drop(self.peers);
    }
}

/// Every row's median rate per count of jobs, how each scaled over the
/// first count, and (with peers) foliofs over ext4.
fn print_summary(args: &MetadataArgs, rows: &[Row]) {
    let jobs_text =
        |jobs: u64| if jobs == 1 { "1 job".to_string() } else { format!("{jobs} jobs") };
    let runs = if args.reps == 1 { "1 run".to_string() } else { format!("{} runs", args.reps) };
    println!();
    println!("creates/s, median of {runs}; a factor is the median of each run's own (its range):");
    let first = args.jobs[0];
    let mut header: Vec<String> = args.jobs.iter().map(|&jobs| jobs_text(jobs)).collect();
    header.extend(args.jobs[1..].iter().map(|jobs| format!("{jobs} / {first}")));
    println!("| | {} |", header.join(" | "));
    println!("|---|{}", "---:|".repeat(header.len()));
    for row in rows {
        let mut cells: Vec<String> =
            (0..args.jobs.len()).map(|count| format!("{:.0}", row.median(count))).collect();
        cells.extend((1..args.jobs.len()).map(|count| {
            let factor = row.scaling(count);
            format!("{:.2} ({:.2}-{:.2})", factor.median, factor.low, factor.high)
        }));
        println!("| {} | {} |", row.label, cells.join(" | "));
    }
    let Some(ext4) = rows.iter().find(|row| row.label == "kernel ext4") else { return };
    for row in rows.iter().filter(|row| !row.label.starts_with("kernel")) {
        let over: Vec<String> = (0..args.jobs.len())
            .map(|count| {
                let factors = row
                    .runs
                    .iter()
                    .zip(&ext4.runs)
                    .map(|(run, ext4_run)| run[count] / ext4_run[count].max(1e-9))
                    .collect();
                format!("{:.2}", tree::median(factors))
            })
            .collect();
        // Blank under the scaling columns.
        let blank = " |".repeat(args.jobs.len() - 1);
        println!("| {} / ext4 | {} |{blank}", row.label, over.join(" | "));
    }
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
