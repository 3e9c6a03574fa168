//! `foliofs bench seeds`: the five seed experiments, old policy against new,
//! against the engine's limits and (as root with fio) the kernel's ext4 and
//! XFS; markdown tables on stdout, JSON, markdown and PNG charts in --out.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, ValueEnum};
use foliofs::VolumeOptions;
use foliofs_bench::{peers, seeds};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeersMode {
    /// Run the kernel peers when running as root with fio installed.
    Auto,
    /// Only the engine and its limits.
    None,
}

#[derive(Args)]
pub struct SeedsArgs {
    /// Shorter runs and smaller files (under three minutes on two cores).
    #[arg(long)]
    quick: bool,
    #[arg(long, value_enum, default_value = "auto")]
    peers: PeersMode,
    /// Directory for the JSON, markdown and PNG of each seed.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Only these seeds, e.g. --only 000,002.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Runs per row, the median reported (default: 1 with --quick, else 3).
    #[arg(long)]
    reps: Option<usize>,
    /// Add rows on qemu-nbd over the same image to seeds 002 and 003: the
    /// engine and the raw device across an NBD hop (needs qemu-nbd).
    #[arg(long)]
    nbd: bool,
}

pub fn run(
    args: &SeedsArgs,
    options: &VolumeOptions,
    options_text: &str,
) -> anyhow::Result<ExitCode> {
    const SEEDS: [&str; 5] = ["000", "001", "002", "003", "004"];
    if let Some(unknown) = args.only.iter().find(|id| !SEEDS.contains(&id.as_str())) {
        bail!("--only {unknown}: the seeds are {}", SEEDS.join(", "));
    }
    let peers = match args.peers {
        PeersMode::None => false,
        PeersMode::Auto => match peers::unavailable() {
            None => true,
            Some(why) => {
                eprintln!("kernel peers skipped: {why}");
                false
            }
        },
    };
    if args.nbd {
        if let Some(why) = foliofs_bench::nbd::unavailable() {
            bail!("--nbd: {why}");
        }
    }
    let seed_options = seeds::SeedOptions {
        quick: args.quick,
        peers,
        out_dir: args.out.clone(),
        work_dir: std::env::current_dir()?,
        volume_options: options.clone(),
        volume_options_text: options_text.to_string(),
        // This executable mounts the engine for the rows through FUSE.
        mount_program: std::env::current_exe().ok(),
        only: args.only.clone(),
        nbd: args.nbd,
        reps: args.reps.unwrap_or(if args.quick { 1 } else { 3 }),
    };
    let bar = ProgressBar::new(seeds::planned_rows(&seed_options) as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} rows, {elapsed} {msg}")?);
    // Each seed's table and files as soon as it ends: a full run takes
    // most of an hour on a small machine, and one stopped near the end
    // keeps the seeds it finished.
    let mut missed = 0;
    let mut report = |result: &seeds::SeedResult| -> anyhow::Result<()> {
        bar.suspend(|| print!("{}", seeds::to_markdown(result)));
        let written = seeds::write_outputs(&args.out, result)?;
        let names: Vec<String> = written.iter().map(|path| path.display().to_string()).collect();
        bar.suspend(|| eprintln!("wrote {}", names.join(", ")));
        missed += result.goals.iter().filter(|goal| !goal.met).count();
        Ok(())
    };
    let results = seeds::run(
        &seed_options,
        &|label| {
            bar.inc(1);
            bar.set_message(label.to_string());
        },
        &mut report,
    );
    bar.finish_and_clear();
    let results = results?;
    let goals: usize = results.iter().map(|result| result.goals.len()).sum();
    println!(
        "{} of {goals} goals met{}",
        goals - missed,
        if args.quick { " (quick run: short and noisy)" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}
