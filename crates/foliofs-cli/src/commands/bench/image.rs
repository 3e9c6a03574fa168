//! The image a benchmark runs on: by default a temporary file in the current
//! directory (like fio's files), fully written once and removed afterwards,
//! also when SIGINT, SIGTERM or SIGHUP ends the run (a stuck bench killed by
//! its user must not leave gigabytes behind).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use foliofs::options::parse_size;
use foliofs::vfs::MkfsOptions;
use foliofs::{Volume, VolumeOptions};

#[derive(Args, Clone)]
pub struct ImageArgs {
    /// Run on this image (formatted first); default: a temporary file in the
    /// current directory, removed afterwards.
    #[arg(long)]
    image: Option<PathBuf>,
    /// Size of the image to create (default: enough for the workload).
    #[arg(long)]
    image_size: Option<String>,
    #[arg(long, default_value = "4096")]
    block_size: String,
}

impl ImageArgs {
    /// Whether the user named an image (which a benchmark must not clobber).
    pub fn named(&self) -> bool {
        self.image.is_some()
    }
}

/// A formatted image, deleted on drop unless the user named it.
pub struct BenchImage {
    path: PathBuf,
    temporary: bool,
    mkfs: MkfsOptions,
}

impl BenchImage {
    /// Creates (or reuses) the image and formats it; `default_bytes` is the
    /// size when the user gave none.
    pub fn create(
        args: &ImageArgs,
        default_bytes: u64,
        options: &VolumeOptions,
    ) -> anyhow::Result<Self> {
        let (path, temporary) = match &args.image {
            Some(path) => (path.clone(), false),
            // /tmp may be a tmpfs, which says nothing about a disk.
            None => (PathBuf::from(format!("foliofs-bench-{}.img", std::process::id())), true),
        };
        if temporary {
            // Removed by the bench's signal handler too (a stuck bench
            // killed by its user must not leave gigabytes behind).
            foliofs_bench::peers::remove_at_cleanup(&path);
        }
        let block_bytes = u32::try_from(parse_size(&args.block_size).context("--block-size")?)?;
        let mkfs = MkfsOptions { block_bytes, ..MkfsOptions::default() };
        let image = Self { path, temporary, mkfs };
        let size_bytes = match &args.image_size {
            Some(text) => parse_size(text).context("--image-size")?,
            None => default_bytes,
        };
        // An NBD export is the server's to size and lay out.
        let on_nbd = foliofs::dev::nbd::is_nbd_uri(&image.path);
        if !on_nbd && (image.temporary || !image.path.exists()) {
            lay_out(&image.path, size_bytes)?;
        }
        image.reformat(options)?;
        Ok(image)
    }

    /// Formats the image again, as `create` did (a fresh volume for the
    /// next row of a comparison).
    pub fn reformat(&self, options: &VolumeOptions) -> anyhow::Result<()> {
        Volume::mkfs_path(&self.path, None, &self.mkfs, options)?;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BenchImage {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
            foliofs_bench::peers::forget_removal(&self.path);
        }
    }
}

/// Writes the whole image once, as fio lays out its files: a sparse image
/// would measure the host file system allocating blocks, not the disk (and
/// see `foliofs_bench::peers::lay_out` on why the data is not zeros).
fn lay_out(path: &Path, size_bytes: u64) -> anyhow::Result<()> {
    foliofs_bench::peers::lay_out(path, size_bytes)
}
