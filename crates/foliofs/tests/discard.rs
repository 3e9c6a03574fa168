//! `-o discard`: blocks freed by punch hole, truncate and unlink are
//! discarded on the device once the freeing is durable, and only then
//! reused; without the option nothing is discarded.

mod common;

use foliofs::dev::fault::TRIMMED_BYTE;
use foliofs::FallocateMode;
use foliofs::{OpenFlags, Volume, VolumeOptions};

use common::{new_volume_with_options, options, owner, pattern, GARBAGE_BYTE};

const ROOT: u64 = foliofs::ROOT_INO;
const BLOCK_BYTES: u32 = 4096;
const FILE_BYTES: usize = 1 << 20;

fn discard_options(discard: bool) -> VolumeOptions {
    VolumeOptions { discard, ..options() }
}

/// The device byte ranges holding `ino`'s data.
fn device_ranges(volume: &Volume, ino: u64) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = volume
        .inodes()
        .fiemap(ino)
        .unwrap()
        .iter()
        .map(|extent| (extent.physical, extent.physical + extent.length))
        .collect();
    ranges.sort_unstable();
    ranges
}

fn trimmed(image: &[u8], (start, end): (u64, u64)) -> bool {
    image[start as usize..end as usize].iter().all(|&byte| byte == TRIMMED_BYTE)
}

#[test]
fn freed_blocks_are_discarded_once_the_free_is_durable() {
    let (device, volume) =
        new_volume_with_options(16 << 20, BLOCK_BYTES, None, &discard_options(true));
    let ino = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&pattern(1, FILE_BYTES), 0).unwrap();
    file.sync_all().unwrap();
    let ranges = device_ranges(&volume, ino);
    let (start, end) = (ranges[0].0, ranges.last().unwrap().1);
    assert_eq!(end - start, FILE_BYTES as u64, "one contiguous run: {ranges:?}");
    let free_before = volume.statfs().available_blocks;

    file.fallocate(FallocateMode::PunchHole, 64 << 10, 64 << 10).unwrap();
    assert_eq!(device.discard_requests(), 0, "the punch is not durable yet");
    assert!(!trimmed(&device.image(), (start + (64 << 10), start + (128 << 10))));
    volume.sync().unwrap();
    assert_eq!(device.discard_requests(), 1);
    let image = device.image();
    assert!(trimmed(&image, (start + (64 << 10), start + (128 << 10))), "the hole is discarded");
    assert!(!trimmed(&image, (start, start + (64 << 10))), "data before it is kept");
    assert_eq!(volume.statfs().available_blocks, free_before + 16, "and reusable");

    file.set_len(512 << 10).unwrap();
    volume.sync().unwrap();
    assert_eq!(device.discard_requests(), 2);
    assert!(trimmed(&device.image(), (start + (512 << 10), end)), "the cut tail is discarded");

    drop(file);
    volume.inodes().unlink(ROOT, b"f").unwrap();
    assert_eq!(device.discard_requests(), 2, "the unlink is not durable yet");
    volume.sync().unwrap();
    // The two runs left (before and after the hole) are one discard each.
    assert_eq!(device.discard_requests(), 4);
    assert!(trimmed(&device.image(), (start, end)), "every block of the file is discarded");
    let stats = volume.device().stats();
    assert_eq!((stats.discard_requests, stats.bytes_discarded), (4, FILE_BYTES as u64));

    // The freed space is reused, and the new file reads its own data.
    let ino = volume.inodes().create(ROOT, b"g", 0o644, owner()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&pattern(2, FILE_BYTES), 0).unwrap();
    file.sync_all().unwrap();
    let mut back = vec![0; FILE_BYTES];
    file.read_at(&mut back, 0).unwrap();
    assert!(back == pattern(2, FILE_BYTES));
    drop(file);
    volume.close().unwrap();
}

#[test]
fn without_the_option_nothing_is_discarded() {
    let (device, volume) =
        new_volume_with_options(16 << 20, BLOCK_BYTES, None, &discard_options(false));
    let ino = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&pattern(1, FILE_BYTES), 0).unwrap();
    file.sync_all().unwrap();
    let ranges = device_ranges(&volume, ino);
    file.fallocate(FallocateMode::PunchHole, 0, 64 << 10).unwrap();
    drop(file);
    volume.inodes().unlink(ROOT, b"f").unwrap();
    volume.sync().unwrap();
    assert_eq!(device.discard_requests(), 0);
    assert_eq!(volume.device().stats().discard_requests, 0);
    let image = device.image();
    assert!(!trimmed(&image, ranges[0]), "the freed data stays where it was");
    assert_ne!(image[ranges[0].0 as usize], GARBAGE_BYTE);
    volume.close().unwrap();
}

#[test]
fn a_bad_value_is_refused_by_name() {
    let error = VolumeOptions::parse("discard=sometimes").unwrap_err();
    assert!(error.to_string().contains("discard=sometimes"), "{error}");
    assert!(VolumeOptions::parse("discard").unwrap().discard);
    assert!(!VolumeOptions::parse("discard,nodiscard").unwrap().discard);
}
