//! A frozen volume and a tree snapshot taken while other threads write:
//! `Volume::freeze` holds changing operations and lets reads through, and
//! `Volume::clone_tree` copies one instant of the tree.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use foliofs::{Error, OpenOptions, Volume};

use common::new_volume;

/// Files each writer round rewrites, in the order their names sort (the
/// order the snapshot walks them).
const FILES: usize = 48;

fn data_name(index: usize) -> String {
    format!("t/data_{index:02}")
}

fn read_u64(volume: &Volume, path: &Path) -> u64 {
    let bytes = volume.read(path).unwrap();
    u64::from_le_bytes(bytes[..8].try_into().unwrap())
}

/// One writer rewrites every data file with its round number in name
/// order and then creates that round's marker; another swaps a file
/// between two names. A snapshot taken at one instant sees the data files
/// at most one round apart, never a later file ahead of an earlier one, a
/// marker only for rounds whose every file it holds, and exactly one of
/// the two names. Without the freeze the snapshots saw later files rounds
/// ahead of earlier ones (the writer laps the walk), markers past the
/// data, and a name the walk listed gone before it was cloned.
#[test]
fn a_tree_snapshot_is_one_instant_while_writers_run() {
    let (_device, volume) = new_volume(64 << 20, 4096);
    volume.create_dir("t").unwrap();
    for index in 0..FILES {
        volume.write(data_name(index), 0u64.to_le_bytes()).unwrap();
    }
    volume.write("t/moving_a", b"moving").unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let files: Vec<_> = (0..FILES)
                .map(|index| OpenOptions::new().write(true).open(&volume, data_name(index)))
                .collect::<Result<_, _>>()
                .unwrap();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                for file in &files {
                    file.write_all_at(&round.to_le_bytes(), 0).unwrap();
                }
                volume.write(format!("t/round_{round:08}"), b"").unwrap();
                // Bounds the markers (each snapshot clones them all).
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                volume.rename("t/moving_a", "t/moving_b").unwrap();
                volume.rename("t/moving_b", "t/moving_a").unwrap();
            }
        });
        for snapshot in 0..12 {
            std::thread::sleep(Duration::from_millis(5));
            let name = format!("snap_{snapshot}");
            volume.clone_tree("t", &name).unwrap();
            let root = Path::new(&name);
            let values: Vec<u64> = (0..FILES)
                .map(|index| read_u64(&volume, &root.join(format!("data_{index:02}"))))
                .collect();
            for pair in values.windows(2) {
                assert!(pair[0] >= pair[1], "snapshot {snapshot}: a later file ahead: {values:?}");
            }
            assert!(values[0] - values[FILES - 1] <= 1, "snapshot {snapshot}: {values:?}");
            let markers: Vec<u64> = volume
                .read_dir(root)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .filter_map(|name| name.strip_prefix("round_").map(|round| round.parse().unwrap()))
                .collect();
            let last_marker = markers.iter().copied().max().unwrap_or(0);
            assert_eq!(
                markers.len() as u64,
                last_marker,
                "snapshot {snapshot}: markers {markers:?}"
            );
            assert!(
                values[FILES - 1] >= last_marker && values[0] <= last_marker + 1,
                "snapshot {snapshot}: marker {last_marker}, data {values:?}"
            );
            let moving: Vec<bool> = ["moving_a", "moving_b"]
                .iter()
                .map(|moving| volume.symlink_metadata(root.join(moving)).is_ok())
                .collect();
            assert_eq!(moving.iter().filter(|&&there| there).count(), 1, "snapshot {snapshot}");
            let hidden = format!(".{name}.foliofs-snapshot");
            assert!(volume.symlink_metadata(&hidden).is_err(), "the hidden copy was renamed");
        }
        stop.store(true, Ordering::Relaxed);
    });
    volume.check_shared_counts().unwrap();
}

/// While frozen, a write from another thread waits and a read of the same
/// file does not; the freeze wrote everything back first; the write lands
/// when the volume thaws.
#[test]
fn a_frozen_volume_holds_writers_and_lets_readers_through() {
    let (_device, volume) = new_volume(16 << 20, 4096);
    volume.write("file", vec![1u8; 8192]).unwrap();
    let frozen = volume.freeze().unwrap();
    assert_eq!(volume.cache_stats().dirty_bytes, 0, "a freeze writes everything back");
    // The freezing thread itself may still change the volume.
    volume.write("by_the_freezer", b"yes").unwrap();
    let (written_tx, written) = mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let file = OpenOptions::new().write(true).open(&volume, "file").unwrap();
            file.write_all_at(&[2u8; 4096], 0).unwrap();
            written_tx.send(()).unwrap();
        });
        assert!(written.recv_timeout(Duration::from_millis(200)).is_err(), "the write waits");
        assert_eq!(volume.read("file").unwrap(), vec![1u8; 8192], "reads go on");
        drop(frozen);
        written.recv_timeout(Duration::from_secs(10)).unwrap();
    });
    assert_eq!(&volume.read("file").unwrap()[..4096], &[2u8; 4096]);
}

/// A snapshot refuses a target that exists and a hidden copy an earlier
/// snapshot left, naming it, and changes nothing.
#[test]
fn a_snapshot_refuses_an_existing_target_or_a_leftover_copy() {
    let (_device, volume) = new_volume(16 << 20, 4096);
    volume.create_dir("src").unwrap();
    volume.write("src/file", b"data").unwrap();
    volume.create_dir("taken").unwrap();
    assert!(matches!(volume.clone_tree("src", "taken"), Err(Error::Exists(_))));
    assert_eq!(volume.read_dir("taken").unwrap().count(), 0);
    volume.create_dir(".copy.foliofs-snapshot").unwrap();
    match volume.clone_tree("src", "copy") {
        Err(Error::Exists(message)) => {
            assert!(message.contains(".copy.foliofs-snapshot"), "{message}")
        }
        other => panic!("expected EEXIST, got {other:?}"),
    }
    assert!(volume.symlink_metadata("copy").is_err());
    volume.remove_dir(".copy.foliofs-snapshot").unwrap();
    assert_eq!(volume.clone_tree("src", "copy").unwrap(), (1, 0));
    assert_eq!(volume.read("copy/file").unwrap(), b"data");
}
