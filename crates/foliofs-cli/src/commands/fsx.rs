//! `foliofs fsx`: random operations on one file compared with an in-memory
//! model after every step, or with `--threads`, threads racing on shared
//! files (the work is `foliofs_check::fsx` and `fsx_threads`; this parses
//! and prints).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use foliofs_check::fsx::{recorded_ops, run as run_fsx, shrink, FsxConfig, FsxFailure, FsxStats};
use foliofs_check::fsx_threads::{self, InProcess, PathTarget, Target, ThreadsConfig};

use super::crashtest::{parse_block_sizes, seed_or_clock, tool_options};

#[derive(Args)]
pub struct FsxArgs {
    /// Seed of the operation sequence; default: from the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// Operations per block size.
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// Block sizes, comma separated (1024, 4096, 65536) or "all".
    #[arg(long, default_value = "4096")]
    block_size: String,
    /// Largest file size (default 256k, 2M on 64 KiB blocks).
    #[arg(long)]
    file_size: Option<String>,
    /// Race this many threads on shared files (all threads' ops count
    /// towards --ops); without it, one thread on one file.
    #[arg(long)]
    threads: Option<usize>,
    /// With --threads: how many files they share.
    #[arg(long, default_value_t = 1, requires = "threads")]
    files: usize,
    /// With --threads: stop after this many seconds if --ops is not reached.
    #[arg(long, requires = "threads")]
    seconds: Option<f64>,
    /// With --threads: the bytes of a slot, the unit one thread owns (a
    /// multiple of 64k; smaller slots make cheaper operations).
    #[arg(long, default_value = "640k", requires = "threads")]
    slot_size: String,
    /// With --threads: run on files under this directory (a foliofs mount)
    /// rather than on the library in process; reads also go through mmap.
    #[arg(long, requires = "threads")]
    path: Option<PathBuf>,
    /// No O_DIRECT: no direct reads or writes, and clones, dedupes and
    /// copies only through the buffered handles.
    #[arg(long, conflicts_with = "threads")]
    no_direct: bool,
    /// No FICLONERANGE (xfstests' fsx -J).
    #[arg(long, conflicts_with = "threads")]
    no_clone: bool,
    /// No FIDEDUPERANGE (fsx -B).
    #[arg(long, conflicts_with = "threads")]
    no_dedupe: bool,
    /// No copy_file_range (fsx -E). With --no-clone and --no-dedupe too,
    /// the second file they work on stays out of the run.
    #[arg(long, conflicts_with = "threads")]
    no_copy_range: bool,
    /// On a mismatch, replay shorter op lists until none can be dropped
    /// and still fail the same way, and print the shortest.
    #[arg(long, conflicts_with = "threads")]
    shrink: bool,
}

/// `-o` applies over the tool's defaults, as for crashtest.
pub fn run(args: &FsxArgs, options: &str) -> anyhow::Result<ExitCode> {
    if let Some(threads) = args.threads {
        return run_threads(args, threads, options);
    }
    let block_sizes = parse_block_sizes(&args.block_size)?;
    let options_list = tool_options(options, &block_sizes)?;
    let seed = seed_or_clock(args.seed);
    let file_bytes_max = match &args.file_size {
        Some(size) => foliofs::options::parse_size(size)?,
        None => 0,
    };
    for block_bytes in block_sizes {
        println!(
            "fsx: block size {block_bytes}, seed {seed}, {} ops{} {options}",
            args.ops,
            config_switches(args)
        );
        let config = FsxConfig {
            file_bytes_max,
            options: options_list,
            direct_io: !args.no_direct,
            clone_range: !args.no_clone,
            dedupe_range: !args.no_dedupe,
            copy_range: !args.no_copy_range,
            ..FsxConfig::new(seed, args.ops, block_bytes)
        };
        let started = Instant::now();
        let mut report = |stats: &FsxStats| {
            if stats.ops.is_multiple_of(100_000) {
                eprintln!("  {} ops ({:.0} s)", stats.ops, started.elapsed().as_secs_f64());
            }
        };
        match run_fsx(config, &mut report) {
            Ok(stats) => {
                let seconds = started.elapsed().as_secs_f64();
                println!(
                    "  block size {block_bytes}: {} ops in {seconds:.1} s ({:.0} ops/min), \
                     0 mismatches; {} reads, {} writes, {} direct reads, {} direct writes, \
                     {} truncates, {} fallocates, {} seeks, {} fsyncs, {} clones, {} dedupes \
                     ({} of equal ranges, {} of differing), {} copy_file_ranges, {} refused \
                     as the rules require, {} MiB cloned, deduplicated or copied, {} ops on \
                     the second file, {} reopens, {} remounts, {} crash remounts, {} whole-file \
                     compares, {} shared-count checks, {} MiB compared",
                    stats.ops,
                    stats.ops as f64 * 60.0 / seconds,
                    stats.reads,
                    stats.writes,
                    stats.direct_reads,
                    stats.direct_writes,
                    stats.truncates,
                    stats.fallocates,
                    stats.seeks,
                    stats.fsyncs,
                    stats.clones,
                    stats.dedupes,
                    stats.dedupes_equal,
                    stats.dedupes_differ,
                    stats.copies,
                    stats.refused,
                    stats.bytes_remapped >> 20,
                    stats.other_file_ops,
                    stats.reopens,
                    stats.remounts,
                    stats.crash_remounts,
                    stats.compares,
                    stats.shared_checks,
                    stats.bytes_checked >> 20
                );
            }
            Err(failure) => {
                println!("{failure}");
                if args.shrink {
                    print_shrunk(config, &failure);
                }
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--shrink`: the ops up to the failure, less every one whose removal
/// still fails with the same kind of message (its text before the first
/// colon).
fn print_shrunk(config: FsxConfig, failure: &FsxFailure) {
    fn kind(message: &str) -> &str {
        message.split(':').next().unwrap_or(message)
    }
    let ops = recorded_ops(FsxConfig { ops: failure.op_index + 1, ..config });
    let wanted = kind(&failure.message).to_string();
    let shrunk = shrink(config, &ops, &|other| kind(&other.message) == wanted);
    println!("shrunk from {} to {} ops failing with \"{wanted}: ...\":", ops.len(), shrunk.len());
    for op in &shrunk {
        println!("  {op}");
    }
    println!("as FsxOp values (foliofs_check::fsx::replay):");
    for op in &shrunk {
        println!("  {op:?},");
    }
}

/// The `--no-...` switches given, each after a space.
fn config_switches(args: &FsxArgs) -> String {
    [
        (args.no_direct, " --no-direct"),
        (args.no_clone, " --no-clone"),
        (args.no_dedupe, " --no-dedupe"),
        (args.no_copy_range, " --no-copy-range"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, switch)| *switch)
    .collect()
}

/// `--threads`: in process on a fresh volume with `-o` over the library's
/// defaults (background writeback and commits on, as a mount runs them), or
/// on files under `--path`.
fn run_threads(args: &FsxArgs, threads: usize, options: &str) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(threads >= 1, "--threads must be at least 1");
    anyhow::ensure!(args.files >= 1, "--files must be at least 1");
    if args.block_size != "4096" || args.file_size.is_some() {
        anyhow::bail!("--threads runs on 4 KiB blocks and sizes its files by --slot-size; drop --block-size and --file-size");
    }
    let seed = seed_or_clock(args.seed);
    let time_limit = match args.seconds {
        Some(seconds) if seconds.is_finite() && seconds > 0.0 => {
            Some(Duration::from_secs_f64(seconds))
        }
        Some(seconds) => anyhow::bail!("--seconds {seconds}: must be a positive number"),
        None => None,
    };
    let slot_bytes = foliofs::options::parse_size(&args.slot_size)?;
    anyhow::ensure!(
        slot_bytes > 0 && slot_bytes.is_multiple_of(64 << 10),
        "--slot-size {}: must be a positive multiple of 64k",
        args.slot_size
    );
    let config = ThreadsConfig {
        files: args.files,
        slot_bytes,
        time_limit,
        mmap: args.path.is_some(),
        ..ThreadsConfig::new(seed, threads, args.ops)
    };
    let target: Box<dyn Target> = match &args.path {
        Some(dir) => {
            anyhow::ensure!(
                options.is_empty(),
                "-o sets volume options; with --path the mount has its own"
            );
            anyhow::ensure!(dir.is_dir(), "--path {}: not a directory", dir.display());
            Box::new(PathTarget::create(dir, args.files).map_err(anyhow::Error::msg)?)
        }
        None => {
            let mut volume_options = foliofs::VolumeOptions::default();
            volume_options.apply_list(options)?;
            let data_bytes =
                (args.files * threads * config.slots_per_thread) as u64 * config.slot_bytes;
            let image_bytes = (data_bytes * 2).max(256 << 20);
            Box::new(
                InProcess::create(args.files, image_bytes, &volume_options)
                    .map_err(anyhow::Error::msg)?,
            )
        }
    };
    let place =
        args.path.as_ref().map_or("in process".to_string(), |dir| dir.display().to_string());
    println!(
        "fsx --threads {threads}: {} files, seed {seed}, {} ops{}, {place} {options}",
        args.files,
        args.ops,
        time_limit.map_or(String::new(), |limit| format!(" or {:.0} s", limit.as_secs_f64())),
    );
    let started = Instant::now();
    let progress = |ops: u64| {
        if ops.is_multiple_of(100_000) {
            eprintln!("  {ops} ops ({:.0} s)", started.elapsed().as_secs_f64());
        }
    };
    match fsx_threads::run(&config, target.as_ref(), &progress) {
        Ok(stats) => {
            println!("  0 mismatches; {stats}");
            Ok(ExitCode::SUCCESS)
        }
        Err(failure) => {
            println!("{failure}");
            println!("  seed {seed}; what ran: {}", failure.stats);
            Ok(ExitCode::from(1))
        }
    }
}
