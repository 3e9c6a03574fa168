use std::path::Path;
use std::process::ExitCode;

use foliofs::{Volume, VolumeOptions};

pub fn run(image: &Path, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let options = VolumeOptions { read_only: true, commit_interval_ms: 0, ..options.clone() };
    let volume = Volume::open(image, &options)?;
    let superblock = volume.superblock();
    let block = superblock.block_bytes_u64();
    let statfs = volume.statfs();
    let load = volume.load_report();
    let uuid: String = superblock.uuid.iter().map(|byte| format!("{byte:02x}")).collect();
    println!("image:            {}", image.display());
    println!("uuid:             {uuid}");
    println!("created:          {} s since the epoch", superblock.created.secs);
    println!("block size:       {} bytes", superblock.block_bytes);
    println!("sector size:      {} bytes", superblock.sector_bytes);
    println!(
        "volume size:      {} bytes ({} blocks)",
        superblock.volume_bytes(),
        superblock.block_count
    );
    let regions = [
        ("journal", superblock.journal),
        ("checkpoint A", superblock.checkpoint_slots[0]),
        ("checkpoint B", superblock.checkpoint_slots[1]),
        ("data", superblock.data),
    ];
    for (name, region) in regions {
        println!(
            "{:<17} blocks {}..{} ({} KiB)",
            format!("{name}:"),
            region.start_block,
            region.end_block(),
            (region.block_count * block) >> 10
        );
    }
    let used = statfs.data_blocks - statfs.free_blocks;
    println!(
        "data used:        {} of {} blocks ({} free)",
        used, statfs.data_blocks, statfs.free_blocks
    );
    println!("inodes:           {}", statfs.inodes);
    println!("metadata:         {} of {} bytes", statfs.metadata_bytes, statfs.metadata_bytes_max);
    println!(
        "last mount found: checkpoint generation {} ({} records), {} journal groups ({} records) replayed",
        load.checkpoint_generation,
        load.checkpoint_records,
        load.journal_groups_replayed,
        load.journal_records_replayed
    );
    Ok(ExitCode::SUCCESS)
}
