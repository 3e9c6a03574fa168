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
    println!("created:          {}", utc_time(superblock.created.secs));
    println!("block size:       {} bytes", superblock.block_bytes);
    println!("sector size:      {} bytes", superblock.sector_bytes);
    println!(
        "volume size:      {} bytes ({} blocks)",
        superblock.volume_bytes(),
        superblock.block_count
    );
    let slot_names = match superblock.metadata_in_index() {
        true => ["index root A", "index root B"],
        false => ["checkpoint A", "checkpoint B"],
    };
    let regions = [
        ("journal", superblock.journal),
        (slot_names[0], superblock.checkpoint_slots[0]),
        (slot_names[1], superblock.checkpoint_slots[1]),
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
    println!(
        "shared:           {} blocks mapped by more than one file block (counted once above)",
        statfs.shared_blocks
    );
    println!("format version:   {}", volume.superblock().version);
    println!("inodes:           {}", statfs.inodes);
    if statfs.metadata_bytes_max == u64::MAX {
        println!(
            "metadata:         {} bytes, in an index without a fixed limit",
            statfs.metadata_bytes
        );
    } else {
        println!(
            "metadata:         {} of {} bytes",
            statfs.metadata_bytes, statfs.metadata_bytes_max
        );
    }
    println!(
        "last mount found: checkpoint generation {} ({} records), {} journal groups ({} records) replayed",
        load.checkpoint_generation,
        load.checkpoint_records,
        load.journal_groups_replayed,
        load.journal_records_replayed
    );
    Ok(ExitCode::SUCCESS)
}

/// `secs` since the epoch as "YYYY-MM-DD hh:mm:ss UTC (secs)", as `date -u`
/// would show it; the civil date from the day count by H. Hinnant's
/// days_from_civil inverse (proleptic Gregorian calendar).
fn utc_time(secs: i64) -> String {
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let shifted = days + 719_468; // days since 0000-03-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (hour, minute, second) = (day_secs / 3_600, day_secs % 3_600 / 60, day_secs % 60);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02} UTC ({secs})")
}

#[cfg(test)]
mod tests {
    use super::utc_time;

    #[test]
    fn utc_time_matches_date() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00 UTC (0)");
        // `date -u -d @951782400`: the leap day of a century divisible by 400.
        assert_eq!(utc_time(951_782_400), "2000-02-29 00:00:00 UTC (951782400)");
        assert_eq!(utc_time(1_795_472_129), "2026-11-23 22:15:29 UTC (1795472129)");
        assert_eq!(utc_time(-1), "1969-12-31 23:59:59 UTC (-1)");
    }
}
