//! `foliofs bench index`: the paged metadata index alone, on a sparse
//! temporary image in the current directory, growing to `--files` files
//! (an inode record and a directory entry each); see
//! `foliofs_bench::index`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use foliofs::options::parse_size;
use foliofs_bench::index;

#[derive(Args)]
pub struct IndexArgs {
    /// Files whose metadata the index holds.
    #[arg(long, default_value = "1000000")]
    files: u64,
    /// Windows the creates are timed in.
    #[arg(long, default_value = "10")]
    windows: u64,
    /// Memory for clean pages; changed pages are committed past a quarter
    /// of it.
    #[arg(long, default_value = "64m")]
    cache_size: String,
    /// Random files stat'ed (entry and inode) after reopening.
    #[arg(long, default_value = "100000")]
    stats: u64,
    /// Write commits on a thread of their own while the creates go on.
    #[arg(long)]
    background_commits: bool,
    /// Also write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(args: &IndexArgs) -> anyhow::Result<ExitCode> {
    if args.files == 0 || args.windows == 0 {
        bail!("--files and --windows must be at least 1");
    }
    let cache_bytes = usize::try_from(parse_size(&args.cache_size)?)?;
    if cache_bytes < 64 << 10 {
        bail!("--cache-size {}: the index needs at least 64 KiB", args.cache_size);
    }
    let options = index::IndexBenchOptions {
        files: args.files,
        windows: args.windows,
        cache_bytes,
        stats: args.stats,
        background_commits: args.background_commits,
    };
    // /tmp may be a tmpfs, which says nothing about a disk.
    let image = PathBuf::from(format!("foliofs-bench-index-{}.img", std::process::id()));
    foliofs_bench::peers::remove_at_cleanup(&image);
    std::fs::File::create(&image)?.set_len(index::image_bytes(args.files))?;
    let result = index::run(&options, &image, &|window| {
        eprintln!("{} files: {:.0} creates/s", window.files, window.creates_per_s)
    });
    let _ = std::fs::remove_file(&image);
    foliofs_bench::peers::forget_removal(&image);
    let result = result?;
    print!("{}", index::to_markdown(&options, &result));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&index::to_json(&options, &result))?)?;
    }
    Ok(ExitCode::SUCCESS)
}
