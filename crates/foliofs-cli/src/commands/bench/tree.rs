//! `foliofs bench tree`: a tree of small files created, stat'ed, read,
//! renamed and deleted, from one or more jobs; in process, through the
//! mount in each page_cache mode and on the kernel's ext4 and XFS (as
//! root); see `foliofs_bench::tree`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use foliofs::options::parse_size;
use foliofs::VolumeOptions;
use foliofs_bench::{peers, tree};

use super::image::{BenchImage, ImageArgs};

#[derive(Args)]
pub struct TreeArgs {
    /// Files in the tree (default 100,000; 5,000 with --quick).
    #[arg(long)]
    files: Option<u64>,
    /// A small tree, for a run of a minute or two.
    #[arg(long)]
    quick: bool,
    /// Bytes written to each file.
    #[arg(long, default_value = "1k")]
    file_size: String,
    #[arg(long, default_value = "100")]
    files_per_dir: u64,
    /// Leaf directories under each top-level directory.
    #[arg(long, default_value = "100")]
    dirs_per_branch: u64,
    /// Threads sharing the tree out, each count a run of every row: `1,2`
    /// runs each file system with one job and with two, and prints how the
    /// rates scale.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    jobs: Vec<u64>,
    /// Runs of every row (each count of jobs in turn within a run): rates
    /// are medians, and a scaling factor is the median of each run's own,
    /// printed with its range. On a machine whose speed drifts, a factor
    /// from one run of each count can be off by a third.
    #[arg(long, default_value = "1")]
    reps: usize,
    /// All jobs in the same directories (each its own file names) instead
    /// of each in its own subtree; the rename phase renames files.
    #[arg(long)]
    shared_dir: bool,
    /// Leave out the kernel peers and the rows through the mount.
    #[arg(long)]
    no_peers: bool,
    /// page_cache modes measured through the mount.
    #[arg(long, value_delimiter = ',', default_value = "engine,kernel")]
    page_cache: Vec<String>,
    /// `opens` settings (kernel, daemon) measured with each page_cache mode
    /// that uses the kernel's page cache; default: the mount's own default.
    #[arg(long, value_delimiter = ',')]
    opens: Vec<String>,
    /// Also write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    image: ImageArgs,
}

pub fn run(
    args: &TreeArgs,
    options: &VolumeOptions,
    options_text: &str,
) -> anyhow::Result<ExitCode> {
    let files = args.files.unwrap_or(if args.quick { 5_000 } else { 100_000 });
    if files == 0 || args.files_per_dir == 0 || args.dirs_per_branch == 0 {
        bail!("--files, --files-per-dir and --dirs-per-branch must be at least 1");
    }
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    if let Some(bad) = args.jobs.iter().find(|&&jobs| jobs == 0 || jobs > files) {
        bail!("--jobs {bad}: each job needs at least one of the {files} files");
    }
    if let Some(bad) =
        args.opens.iter().find(|opens| !["kernel", "daemon"].contains(&opens.as_str()))
    {
        bail!("--opens takes kernel and daemon, not {bad:?}");
    }
    let file_bytes = usize::try_from(parse_size(&args.file_size)?)?;
    let shape = tree::TreeShape {
        files,
        file_bytes,
        files_per_dir: args.files_per_dir,
        dirs_per_branch: args.dirs_per_branch,
    };
    let peers = !args.no_peers
        && match peers::unavailable() {
            None => true,
            Some(why) => {
                eprintln!("kernel peers and rows through the mount skipped: {why}");
                false
            }
        };
    let image = BenchImage::create(&args.image, tree::image_bytes(&shape), options)?;
    let tree_options = tree::TreeOptions {
        shape,
        jobs: args.jobs.clone(),
        reps: args.reps,
        layout: if args.shared_dir { tree::Layout::SharedDirs } else { tree::Layout::Subtrees },
        peers,
        work_dir: std::env::current_dir()?,
        volume_options: options.clone(),
        volume_options_text: options_text.to_string(),
        mount_program: std::env::current_exe().ok(),
        page_cache_modes: args.page_cache.clone(),
        opens_modes: args.opens.clone(),
    };
    let result = tree::run(&tree_options, image.path(), &|label| eprintln!("running: {label}"))?;
    print!("{}", tree::to_markdown(&result));
    let missed = result.goals.iter().filter(|goal| !goal.met).count();
    if !result.goals.is_empty() {
        println!("{} of {} goals met", result.goals.len() - missed, result.goals.len());
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&tree::to_json(&result))?)?;
    }
    Ok(ExitCode::SUCCESS)
}
