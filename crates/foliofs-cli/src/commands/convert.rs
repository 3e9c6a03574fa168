use std::path::Path;
use std::process::ExitCode;

use foliofs::{Volume, VolumeOptions};

/// `foliofs convert IMAGE`: a volume of format 1 or 2 to format 3, in place.
pub fn run(image: &Path, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let superblock = Volume::convert_path(image, options)?;
    println!(
        "{}: format {}, the metadata in an index that grows from the data region ({} MiB)",
        image.display(),
        superblock.version,
        (superblock.data.block_count * superblock.block_bytes_u64()) >> 20
    );
    Ok(ExitCode::SUCCESS)
}
