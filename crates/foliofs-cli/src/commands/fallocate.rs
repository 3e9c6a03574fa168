//! fallocate on `IMAGE:/path`: preallocate, punch, zero, collapse or insert
//! a range, like util-linux fallocate(1). A missing file is created first, as
//! fallocate(1) does.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use foliofs::options::parse_size;
use foliofs::FallocateMode;
use foliofs::{Error, OpenFlags, Owner, Volume, VolumeOptions};

use crate::image_path::ImagePath;

#[derive(Args)]
pub struct FallocateArgs {
    /// The file: IMAGE:/path.
    target: String,
    /// What to do with the range.
    #[arg(long, value_enum, default_value_t = Mode::Allocate)]
    mode: Mode,
    /// Keep the file size with allocate or zero-range (punch-hole always
    /// does; keep-size is allocate with it).
    #[arg(long)]
    keep_size: bool,
    /// Start of the range, e.g. 0, 4k, 1M.
    #[arg(long, default_value = "0")]
    offset: String,
    /// Length of the range, e.g. 4k, 1M.
    #[arg(long)]
    length: String,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Allocate the range as unwritten space (reads as zeros); grows the size.
    Allocate,
    /// Allocate without changing the size (FALLOC_FL_KEEP_SIZE).
    KeepSize,
    /// Free the range; the size never changes (FALLOC_FL_PUNCH_HOLE).
    PunchHole,
    /// Make the range read as zeros, keeping its space (FALLOC_FL_ZERO_RANGE).
    ZeroRange,
    /// Remove the range; what follows moves down (block-aligned).
    CollapseRange,
    /// Insert a hole; what follows moves up (block-aligned).
    InsertRange,
}

impl Mode {
    /// As written on the command line.
    fn name(self) -> String {
        self.to_possible_value().map_or_else(String::new, |value| value.get_name().to_string())
    }

    fn with_keep_size(self, keep_size: bool) -> anyhow::Result<FallocateMode> {
        Ok(match self {
            Mode::Allocate => FallocateMode::Allocate { keep_size },
            Mode::KeepSize => FallocateMode::Allocate { keep_size: true },
            Mode::PunchHole => FallocateMode::PunchHole,
            Mode::ZeroRange => FallocateMode::ZeroRange { keep_size },
            Mode::CollapseRange | Mode::InsertRange if keep_size => {
                anyhow::bail!("--keep-size does not apply to --mode {}", self.name())
            }
            Mode::CollapseRange => FallocateMode::CollapseRange,
            Mode::InsertRange => FallocateMode::InsertRange,
        })
    }
}

pub fn run(args: &FallocateArgs, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let target = ImagePath::require(&args.target)?;
    let mode = args.mode.with_keep_size(args.keep_size)?;
    let offset = parse_size(&args.offset).context("--offset")?;
    let length = parse_size(&args.length).context("--length")?;
    let options = VolumeOptions { commit_interval_ms: 0, ..options.clone() };
    let volume = Volume::open(&target.image, &options)
        .with_context(|| format!("open {}", target.image.display()))?;
    let ino = match volume.inodes().resolve(&target.path) {
        Ok(ino) => ino,
        Err(Error::NotFound(_)) => {
            let (parent, name) =
                target.split().ok_or_else(|| anyhow::anyhow!("{}: not a file", target.path))?;
            let parent = volume.inodes().resolve(&parent)?;
            volume.inodes().create(parent, name.as_bytes(), 0o644, Owner::current())?.ino
        }
        Err(error) => return Err(error.into()),
    };
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE)?;
    file.fallocate(mode, offset, length).with_context(|| {
        format!("fallocate --mode {} of {offset}+{length} on {}", args.mode.name(), target.path)
    })?;
    let attr = file.attr()?;
    file.close()?;
    volume.close()?;
    println!(
        "{}: size {} bytes, {} bytes allocated",
        target.path,
        attr.size,
        attr.blocks_512 * 512
    );
    Ok(ExitCode::SUCCESS)
}
