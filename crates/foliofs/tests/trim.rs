//! FITRIM (`Volume::trim`): the free space of a range is discarded on the
//! device, files keep every byte, space whose freeing is not durable is
//! left alone (so every crash image keeps the file it could bring back),
//! and a trim running beside writers never wipes their new data.

mod common;

use std::sync::Arc;

use foliofs::dev::fault::{Keep, TRIMMED_BYTE};
use foliofs::{OpenFlags, TrimRange, Volume, VolumeOptions};

use common::{new_volume, open_image, open_image_with, options, owner, pattern, ROOT};

const BLOCK_BYTES: u32 = 4096;
const VOLUME_BYTES: u64 = 32 << 20;

fn write_file(volume: &Volume, name: &[u8], data: &[u8]) -> u64 {
    let ino = volume.inodes().create(ROOT, name, 0o644, owner()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(data, 0).unwrap();
    file.sync_all().unwrap();
    ino
}

fn read_file(volume: &Volume, name: &[u8]) -> Option<Vec<u8>> {
    let ino = volume.inodes().lookup(ROOT, name).ok()?.ino;
    let size = volume.inodes().getattr(ino).unwrap().size as usize;
    let file = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let mut data = vec![0; size];
    assert_eq!(file.read_at(&mut data, 0).unwrap(), size);
    Some(data)
}

/// The device byte ranges holding `ino`'s data.
fn device_ranges(volume: &Volume, ino: u64) -> Vec<(u64, u64)> {
    let extents = volume.inodes().fiemap(ino).unwrap();
    extents.iter().map(|extent| (extent.physical, extent.physical + extent.length)).collect()
}

fn all_trimmed(image: &[u8], (start, end): (u64, u64)) -> bool {
    image[start as usize..end as usize].iter().all(|&byte| byte == TRIMMED_BYTE)
}

/// Every free block of the data region is discarded (and counted), the
/// files' blocks are not, and the space is free again afterwards.
#[test]
fn trim_discards_the_free_space_and_nothing_else() {
    let (device, volume) = new_volume(VOLUME_BYTES, BLOCK_BYTES);
    let kept = pattern(1, 1 << 20);
    let kept_ino = write_file(&volume, b"kept", &kept);
    write_file(&volume, b"removed", &pattern(2, 1 << 20));
    volume.inodes().unlink(ROOT, b"removed").unwrap();
    volume.sync().unwrap();
    let statfs = volume.statfs();
    let free_bytes = statfs.free_blocks * u64::from(BLOCK_BYTES);

    let trimmed = volume.trim(TrimRange::ALL).unwrap();
    assert_eq!(trimmed, free_bytes, "every free block, once");
    assert_eq!(volume.device().stats().bytes_discarded, free_bytes);
    assert!(device.discard_requests() >= 1);
    assert_eq!(volume.statfs().free_blocks, statfs.free_blocks, "the space is free again");

    let image = device.image();
    for range in device_ranges(&volume, kept_ino) {
        assert!(!all_trimmed(&image, range), "the kept file's blocks at {range:?}");
    }
    let trimmed_in_image = image.iter().filter(|&&byte| byte == TRIMMED_BYTE).count() as u64;
    assert!(trimmed_in_image >= free_bytes, "the free space reads as trimmed");
    assert_eq!(read_file(&volume, b"kept").unwrap(), kept);

    // The trimmed space is reused, and a new file reads its own data.
    let fresh = pattern(3, 4 << 20);
    write_file(&volume, b"fresh", &fresh);
    volume.sync().unwrap();
    let (_, reopened) = open_image(device.image()).unwrap();
    assert_eq!(read_file(&reopened, b"fresh").unwrap(), fresh);
    assert_eq!(read_file(&reopened, b"kept").unwrap(), kept);
}

/// The range and the minimum length choose the free runs: outside the range
/// and runs shorter than the minimum are kept.
#[test]
fn trim_honours_the_range_and_the_minimum_length() {
    let (device, volume) = new_volume(VOLUME_BYTES, BLOCK_BYTES);
    // Free runs of 2 blocks and of 64 blocks, between files that stay.
    write_file(&volume, b"a", &pattern(1, 64 << 10));
    let small_ino = write_file(&volume, b"small", &pattern(2, 8 << 10));
    write_file(&volume, b"b", &pattern(3, 64 << 10));
    let large_ino = write_file(&volume, b"large", &pattern(4, 256 << 10));
    write_file(&volume, b"c", &pattern(5, 64 << 10));
    let small = device_ranges(&volume, small_ino)[0];
    let large = device_ranges(&volume, large_ino)[0];
    assert_eq!((small.1 - small.0, large.1 - large.0), (8 << 10, 256 << 10));
    volume.inodes().unlink(ROOT, b"small").unwrap();
    volume.inodes().unlink(ROOT, b"large").unwrap();
    volume.sync().unwrap();

    // Only the run holding `small`, by range.
    let range =
        TrimRange { start_bytes: small.0, length_bytes: small.1 - small.0, minimum_bytes: 0 };
    assert_eq!(volume.trim(range).unwrap(), 8 << 10);
    let image = device.image();
    assert!(all_trimmed(&image, small));
    assert!(!all_trimmed(&image, large));

    // Up to the end of `large`, runs of 16 KiB or more: `large` only
    // (`small` is shorter), so exactly its bytes.
    let range = TrimRange { start_bytes: 0, length_bytes: large.1, minimum_bytes: 16 << 10 };
    assert_eq!(volume.trim(range).unwrap(), 256 << 10);
    assert!(all_trimmed(&device.image(), large));
    for name in [&b"a"[..], b"b", b"c"] {
        assert!(read_file(&volume, name).is_some());
    }
}

/// FITRIM's argument checks, as ext4 makes them (xfstests generic/260),
/// and no trim on a volume that cannot change.
#[test]
fn trim_refuses_what_fitrim_refuses() {
    let (device, volume) = new_volume(VOLUME_BYTES, BLOCK_BYTES);
    let refused = |range: TrimRange| volume.trim(range).unwrap_err().errno();
    let everything = TrimRange::ALL;
    assert_eq!(refused(TrimRange { start_bytes: VOLUME_BYTES, ..everything }), libc::EINVAL);
    assert_eq!(refused(TrimRange { start_bytes: u64::MAX, ..everything }), libc::EINVAL);
    assert_eq!(refused(TrimRange { length_bytes: 1024, ..everything }), libc::EINVAL);
    assert_eq!(refused(TrimRange { minimum_bytes: VOLUME_BYTES, ..everything }), libc::EINVAL);
    assert_eq!(device.discard_requests(), 0);
    // A length past the end is cut at the end.
    let tail =
        TrimRange { start_bytes: VOLUME_BYTES / 2, length_bytes: VOLUME_BYTES, ..everything };
    assert!(volume.trim(tail).unwrap() > 0);
    drop(volume);

    let read_only = VolumeOptions { read_only: true, ..options() };
    let (_, volume) = open_image_with(device.image(), &read_only).unwrap();
    assert_eq!(volume.trim(everything).unwrap_err().errno(), libc::EROFS);
}

/// A file removed but not yet committed keeps its blocks through a trim:
/// at every crash point after it the file comes back whole (or, after the
/// removal is durable, is gone), and the volume is clean.
#[test]
fn trim_leaves_space_whose_freeing_is_not_durable() {
    let (device, volume) = new_volume(VOLUME_BYTES, BLOCK_BYTES);
    let data = pattern(7, 1 << 20);
    write_file(&volume, b"f", &data);
    volume.sync().unwrap();
    device.reset_log();

    volume.inodes().unlink(ROOT, b"f").unwrap();
    let free_before_commit = volume.trim(TrimRange::ALL).unwrap();
    volume.sync().unwrap();
    let free_after_commit = volume.trim(TrimRange::ALL).unwrap();
    assert_eq!(
        free_after_commit,
        free_before_commit + (1 << 20),
        "the file's space is trimmed only once its removal is durable"
    );

    for cut in device.durability_points() {
        for keep in [Keep::All, Keep::Nothing] {
            let (_, recovered) = open_image(device.crash_image(cut, &|_| keep.clone())).unwrap();
            if let Some(back) = read_file(&recovered, b"f") {
                assert!(back == data, "cut {cut}: the file came back damaged");
            }
            let report = foliofs::fsck::check(recovered.device().clone());
            assert!(report.problems.is_empty(), "cut {cut}: {:?}", report.problems);
        }
    }
}

/// Writers running beside repeated trims: no new data is ever overtaken by a
/// discard of the space it was given.
#[test]
fn trim_beside_writers_never_wipes_new_data() {
    let (device, volume) = new_volume(VOLUME_BYTES, BLOCK_BYTES);
    let volume = Arc::new(volume);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trimmer = {
        let (volume, stop) = (volume.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut trims = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || trims == 0 {
                volume.trim(TrimRange::ALL).unwrap();
                trims += 1;
            }
            trims
        })
    };
    for round in 0..40u64 {
        let name = format!("f{}", round % 4);
        let _ = volume.inodes().unlink(ROOT, name.as_bytes());
        let data = pattern(round, 256 << 10);
        write_file(&volume, name.as_bytes(), &data);
        volume.sync().unwrap();
        assert!(read_file(&volume, name.as_bytes()).unwrap() == data, "round {round}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(trimmer.join().unwrap() > 0);
    assert!(device.discard_requests() > 0);
    let (_, reopened) = open_image(device.image()).unwrap();
    for round in 36..40u64 {
        let name = format!("f{}", round % 4);
        assert!(read_file(&reopened, name.as_bytes()).unwrap() == pattern(round, 256 << 10));
    }
}
