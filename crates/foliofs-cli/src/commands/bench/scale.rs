//! `foliofs bench scale`: N empty files in process, through the mount and
//! on the kernel's ext4 and XFS; the rate per window, memory, checkpoints,
//! close, open, open after a kill -9 and a shuffled stat of every file
//! (issue 53); see `foliofs_bench::scale`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use foliofs::options::parse_size;
use foliofs::VolumeOptions;
use foliofs_bench::scale::{self, ScaleOptions, Target};
use foliofs_bench::{peers, scale_worker};

#[derive(Args)]
pub struct ScaleArgs {
    /// Empty files to create on each target.
    #[arg(long, default_value = "1000000")]
    files: u64,
    /// Files in each directory.
    #[arg(long, default_value = "1000")]
    per_dir: u64,
    /// Files in each window of the rate (default: a tenth of --files).
    #[arg(long)]
    window: Option<u64>,
    /// Size of each volume and kernel peer's loop file, sparse (default:
    /// 1 GiB and 16 KiB a file, which today's checkpoint slots need).
    #[arg(long)]
    volume_size: Option<String>,
    /// Journal size of each volume (default: mkfs's, 1/128 of the volume).
    #[arg(long)]
    journal_size: Option<String>,
    /// Volumes of format 3: the metadata in a paged index
    /// (`mkfs --metadata-index`).
    #[arg(long)]
    metadata_index: bool,
    /// Targets, in the order they run: in-process, mount, ext4, xfs (all
    /// but in-process need root, loop devices and FUSE; skipped without).
    #[arg(long, value_delimiter = ',', default_value = "in-process,mount,ext4,xfs")]
    targets: Vec<String>,
    /// The engine's cache (cache_bytes) during the stat pass.
    #[arg(long, default_value = "1M")]
    stat_cache_size: String,
    /// Seed of the stat pass's order.
    #[arg(long, default_value = "1")]
    seed: u64,
    /// Also write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run one worker's task (JSON) in this process: how the bench starts
    /// its children.
    #[arg(long, hide = true)]
    worker: Option<String>,
}

pub fn run(args: &ScaleArgs, options_text: &str) -> anyhow::Result<ExitCode> {
    if let Some(task) = &args.worker {
        scale_worker::run(task)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.files == 0 || args.per_dir == 0 || args.window == Some(0) {
        bail!("--files, --per-dir and --window must be at least 1");
    }
    // Checked here, before hours of work: the workers parse it again.
    VolumeOptions::parse(options_text)?;
    let mut targets =
        args.targets.iter().map(|name| Target::parse(name)).collect::<Result<Vec<_>, _>>()?;
    if targets.iter().any(|target| target.needs_root()) {
        if let Some(why) = peers::unavailable() {
            eprintln!("the mount and the kernel's file systems skipped: {why}");
            targets.retain(|target| !target.needs_root());
        }
    }
    let volume_bytes = match &args.volume_size {
        Some(text) => parse_size(text).context("--volume-size")?,
        None => scale::default_volume_bytes(args.files),
    };
    let options = ScaleOptions {
        files: args.files,
        per_dir: args.per_dir,
        window: args.window.unwrap_or((args.files / 10).max(1)),
        volume_bytes,
        journal_bytes: args
            .journal_size
            .as_deref()
            .map(parse_size)
            .transpose()
            .context("--journal-size")?,
        metadata_index: args.metadata_index,
        targets,
        work_dir: std::env::current_dir()?,
        volume_options_text: options_text.to_string(),
        stat_cache_bytes: parse_size(&args.stat_cache_size).context("--stat-cache-size")?,
        program: std::env::current_exe().context("the foliofs executable")?,
        seed: args.seed,
    };
    let result = scale::run(&options, &|line| eprintln!("running: {line}"))?;
    print!("{}", scale::to_markdown(&result));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&scale::to_json(&result))?)?;
    }
    let failed = result.results.iter().any(|each| each.error.is_some());
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
