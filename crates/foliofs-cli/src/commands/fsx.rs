//! `foliofs fsx`: random operations on one file compared with an in-memory
//! model after every step (the work is `foliofs_check::fsx`; this parses
//! and prints).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use foliofs_check::fsx::{run as run_fsx, FsxConfig, FsxStats};

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
}

/// `-o` applies over the tool's defaults, as for crashtest.
pub fn run(args: &FsxArgs, options: &str) -> anyhow::Result<ExitCode> {
    let block_sizes = parse_block_sizes(&args.block_size)?;
    let options_list = tool_options(options, &block_sizes)?;
    let seed = seed_or_clock(args.seed);
    let file_bytes_max = match &args.file_size {
        Some(size) => foliofs::options::parse_size(size)?,
        None => 0,
    };
    for block_bytes in block_sizes {
        println!("fsx: block size {block_bytes}, seed {seed}, {} ops {options}", args.ops);
        let config = FsxConfig {
            file_bytes_max,
            options: options_list,
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
                     {} truncates, {} fallocates, {} seeks, {} fsyncs, {} reopens, {} remounts, \
                     {} crash remounts, {} whole-file compares, {} MiB compared",
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
                    stats.reopens,
                    stats.remounts,
                    stats.crash_remounts,
                    stats.compares,
                    stats.bytes_checked >> 20
                );
            }
            Err(failure) => {
                println!("{failure}");
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
