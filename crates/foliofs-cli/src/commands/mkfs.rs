use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use foliofs::options::parse_size;
use foliofs::vfs::MkfsOptions;
use foliofs::{Volume, VolumeOptions};

/// The sizes `foliofs mkfs` was given, as typed (e.g. `4G`).
pub struct Sizes<'a> {
    pub volume: Option<&'a str>,
    pub block: &'a str,
    pub journal: Option<&'a str>,
    pub metadata: Option<&'a str>,
    /// `--metadata-index`: format 3.
    pub metadata_index: bool,
}

pub fn run(image: &Path, sizes: &Sizes<'_>, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let block_bytes = parse_size(sizes.block).context("--block-size")?;
    let block_bytes = u32::try_from(block_bytes)
        .map_err(|_| anyhow::anyhow!("block size {block_bytes} is too large"))?;
    let size_bytes = sizes.volume.map(parse_size).transpose().context("--size")?;
    if size_bytes.is_none() && !image.exists() && !foliofs::dev::nbd::is_nbd_uri(image) {
        anyhow::bail!("{} does not exist: give --size to create it", image.display());
    }
    let journal_bytes = sizes.journal.map(parse_size).transpose().context("--journal-size")?;
    let metadata_bytes = sizes.metadata.map(parse_size).transpose().context("--metadata-size")?;
    let mkfs = MkfsOptions {
        block_bytes,
        journal_bytes,
        metadata_bytes,
        metadata_index: sizes.metadata_index,
        ..MkfsOptions::default()
    };
    let superblock = Volume::mkfs_path(image, size_bytes, &mkfs, options)?;
    let block = superblock.block_bytes_u64();
    println!(
        "foliofs volume on {}: {} bytes, {} blocks of {} bytes",
        image.display(),
        superblock.volume_bytes(),
        superblock.block_count,
        superblock.block_bytes
    );
    if superblock.metadata_in_index() {
        println!(
            "journal {} KiB, metadata in an index that grows from the data region, data {} MiB",
            (superblock.journal.block_count * block) >> 10,
            (superblock.data.block_count * block) >> 20
        );
    } else {
        println!(
            "journal {} KiB, two checkpoint slots of {} KiB, data {} MiB",
            (superblock.journal.block_count * block) >> 10,
            (superblock.checkpoint_slots[0].block_count * block) >> 10,
            (superblock.data.block_count * block) >> 20
        );
    }
    Ok(ExitCode::SUCCESS)
}
