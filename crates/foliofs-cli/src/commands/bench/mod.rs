//! `foliofs bench`: benchmarks run in-process against the engine, on a
//! temporary image unless one is given: fio jobs (a job file or fio's
//! command-line options), or one of the fixed workloads below.

mod image;
mod index;
mod jobs;
mod metadata;
mod scale;
mod seeds;
mod tree;

use std::process::ExitCode;

use clap::{Args, Subcommand};
use foliofs::VolumeOptions;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    jobs: jobs::JobArgs,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The paged metadata index alone, growing to --files files: creates
    /// per window, RSS, commits, open, random stats on a cold cache.
    Index(index::IndexArgs),
    /// Metadata operations: create a file, write 4 KiB, fsync, close; with
    /// --peers also through the mount and on the kernel's ext4 and XFS.
    Metadata(metadata::MetadataArgs),
    /// Empty files by the million in process, through the mount and on the
    /// kernel's ext4 and XFS: rate per window, memory, checkpoints, close,
    /// open, open after a kill -9, a shuffled stat of every file.
    Scale(scale::ScaleArgs),
    /// The five seed experiments, old policy against new, against the
    /// engine's limits and the kernel's ext4 and XFS (as root, with fio).
    Seeds(seeds::SeedsArgs),
    /// A tree of small files created, stat'ed, read, renamed and deleted:
    /// in process, through the mount and on the kernel's ext4 and XFS.
    Tree(tree::TreeArgs),
}

pub fn run(
    args: BenchArgs,
    options: &VolumeOptions,
    options_text: &str,
) -> anyhow::Result<ExitCode> {
    // Whatever a run set up and did not undo is undone as it ends; and if a
    // signal's handler is undoing it, the run waits for that before the
    // process exits under it.
    let _clean_up = foliofs_bench::peers::CleanUpOnDrop;
    match args.command {
        None => jobs::run(&args.jobs, options, options_text),
        Some(BenchCommand::Index(args)) => index::run(&args),
        Some(BenchCommand::Metadata(args)) => metadata::run(&args, options, options_text),
        Some(BenchCommand::Scale(args)) => scale::run(&args, options_text),
        Some(BenchCommand::Seeds(args)) => seeds::run(&args, options, options_text),
        Some(BenchCommand::Tree(args)) => tree::run(&args, options, options_text),
    }
}
