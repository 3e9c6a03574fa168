//! `foliofs bench`: benchmarks run in-process against the engine, on a
//! temporary image unless one is given.

mod buffered;
mod direct;
mod image;
mod latency;
mod metadata;

use std::process::ExitCode;

use clap::Subcommand;
use foliofs::VolumeOptions;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Metadata operations: create a file, write 4 KiB, fsync, close.
    Metadata(metadata::MetadataArgs),
    /// One direct-I/O workload, fio style: rw, bs, iodepth, numjobs, size, runtime.
    Direct(direct::DirectArgs),
    /// One buffered workload, fio psync style: each job its own file, one
    /// request at a time through the folio cache (or --memcpy, the limit).
    Buffered(buffered::BufferedArgs),
}

pub fn run(command: BenchCommand, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Metadata(args) => metadata::run(&args, options),
        BenchCommand::Direct(args) => direct::run(&args, options),
        BenchCommand::Buffered(args) => buffered::run(&args, options),
    }
}
