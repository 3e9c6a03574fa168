//! Damaged images: flipping bytes of the superblocks, the journal or the
//! checkpoints must give a clean error or a recovered, consistent state,
//! never a panic, on 1 KiB, 4 KiB and 64 KiB blocks. The decoders
//! themselves are fuzzed with arbitrary bytes.

#[macro_use]
mod common;

use foliofs::format::journal::{check_group_payload, decode_group_header};
use foliofs::format::record::decode_all;
use foliofs::format::{CheckpointHeader, Superblock};
use foliofs::{InodeKind, OpenFlags, Volume};
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{new_volume, open_image, owner, pattern, ROOT};

/// Path and content (symlink target for symlinks) of everything in a volume.
type Tree = Vec<(String, Vec<u8>)>;

block_size_tests!(
    any_flip_in_one_superblock_falls_back_to_the_other,
    the_same_flip_in_both_superblocks_is_a_clean_error,
    flips_in_the_journal_lose_at_most_a_suffix,
    flips_in_the_checkpoints_fall_back_or_fail_cleanly,
    stale_groups_behind_a_damaged_one_never_replay,
);

/// A volume with a checkpoint and journal groups after it, and its tree.
fn built_image(block_bytes: u32) -> (Vec<u8>, Superblock, Tree) {
    let (device, volume) = new_volume(8 << 20, block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"dir", 0o755, owner()).unwrap();
    for index in 0..6u64 {
        let attr = volume
            .inodes()
            .create(dir.ino, format!("f{index}").as_bytes(), 0o644, owner())
            .unwrap();
        let file = volume.inodes().open_file(attr.ino, OpenFlags::WRITE).unwrap();
        file.write_at(&pattern(index, 3000 * index as usize + 1), 0).unwrap();
        file.sync_all().unwrap();
        if index == 2 {
            volume.checkpoint().unwrap();
        }
    }
    volume.inodes().symlink(ROOT, b"link", b"dir/f1", owner()).unwrap();
    volume.sync().unwrap();
    let tree = tree_of(&volume);
    let image = device.image();
    drop(volume);
    let superblock = Superblock::decode(&image).unwrap();
    (image, superblock, tree)
}

fn tree_of(volume: &Volume) -> Tree {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), ROOT)];
    while let Some((path, dir)) = stack.pop() {
        for entry in volume.inodes().readdir(dir).unwrap() {
            let child = format!("{path}/{}", String::from_utf8_lossy(&entry.name));
            let content = match entry.kind {
                InodeKind::Dir => {
                    stack.push((child.clone(), entry.ino));
                    Vec::new()
                }
                InodeKind::Symlink => volume.inodes().readlink(entry.ino).unwrap(),
                InodeKind::Fifo
                | InodeKind::Socket
                | InodeKind::CharDevice
                | InodeKind::BlockDevice => Vec::new(),
                InodeKind::File => {
                    let size = volume.inodes().getattr(entry.ino).unwrap().size as usize;
                    let mut data = vec![0u8; size];
                    volume
                        .inodes()
                        .open_file(entry.ino, OpenFlags::READ)
                        .unwrap()
                        .read_at(&mut data, 0)
                        .unwrap();
                    data
                }
            };
            out.push((child, content));
        }
    }
    out.sort();
    out
}

/// Opens a damaged image; if it opens, it must be readable and fsck-clean.
fn open_damaged(image: Vec<u8>, what: &str) -> Option<Tree> {
    let (_, volume) = open_image(image).ok()?;
    let tree = tree_of(&volume);
    let report = foliofs::fsck::check(volume.device().clone());
    let load_problems: Vec<&String> =
        report.problems.iter().filter(|problem| !problem.contains("superblock")).collect();
    assert!(load_problems.is_empty(), "{what}: opened but fsck finds {load_problems:?}");
    Some(tree)
}

fn any_flip_in_one_superblock_falls_back_to_the_other(block_bytes: u32) {
    let (image, superblock, tree) = built_image(block_bytes);
    let copy_b = Superblock::copy_offset(superblock.block_bytes, 1) as usize;
    for offset in 0..512 {
        for copy in [0, copy_b] {
            let mut damaged = image.clone();
            damaged[copy + offset] ^= 0xFF;
            let recovered = open_damaged(damaged, &format!("superblock flip at {}", copy + offset));
            assert_eq!(recovered.as_ref(), Some(&tree), "flip at {}", copy + offset);
        }
    }
}

fn the_same_flip_in_both_superblocks_is_a_clean_error(block_bytes: u32) {
    let (image, superblock, _) = built_image(block_bytes);
    let copy_b = Superblock::copy_offset(superblock.block_bytes, 1) as usize;
    for offset in (0..512).step_by(3) {
        let mut damaged = image.clone();
        damaged[offset] ^= 0x01;
        damaged[copy_b + offset] ^= 0x01;
        let error = open_image(damaged).err().unwrap_or_else(|| panic!("flip at {offset} opened"));
        assert_eq!(error.errno(), libc::EUCLEAN);
        assert!(error.to_string().contains("superblock"), "{error}");
    }
}

/// Flips random bytes of a region; each damaged image must open to a
/// consistent state or fail cleanly.
fn flip_region(
    block_bytes: u32,
    (region_start, region_bytes): (usize, usize),
    samples: usize,
    seed: u64,
) -> (usize, usize) {
    let (image, _, tree) = built_image(block_bytes);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut opened, mut refused) = (0, 0);
    for _ in 0..samples {
        let offset = region_start + rng.random_range(0..region_bytes);
        let mut damaged = image.clone();
        damaged[offset] ^= 1 << rng.random_range(0..8);
        match open_damaged(damaged, &format!("flip at {offset}")) {
            Some(recovered) => {
                opened += 1;
                // A damaged log or checkpoint loses a suffix of history; it
                // never invents files.
                for (path, _) in &recovered {
                    assert!(
                        tree.iter().any(|(known, _)| known == path),
                        "{path} appeared after a flip at {offset}"
                    );
                }
            }
            None => refused += 1,
        }
    }
    (opened, refused)
}

fn flips_in_the_journal_lose_at_most_a_suffix(block_bytes: u32) {
    let (_, superblock, _) = built_image(block_bytes);
    let block = superblock.block_bytes as usize;
    let start = superblock.journal.start_block as usize * block;
    let (opened, _) = flip_region(block_bytes, (start, 16 << 10), 300, 1);
    assert!(opened > 0, "a damaged journal tail still mounts");
}

fn flips_in_the_checkpoints_fall_back_or_fail_cleanly(block_bytes: u32) {
    let (_, superblock, _) = built_image(block_bytes);
    let block = superblock.block_bytes as usize;
    for (index, slot) in superblock.checkpoint_slots.iter().enumerate() {
        let start = slot.start_block as usize * block;
        flip_region(block_bytes, (start, 8 << 10), 150, 10 + index as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..1200), count in any::<u32>()) {
        let _ = Superblock::decode(&bytes);
        let _ = CheckpointHeader::decode(&bytes, 1 << 20);
        let uuid = [0u8; 16];
        if let Ok(header) = decode_group_header(&bytes, &uuid, 1 << 20) {
            let _ = check_group_payload(&bytes, &header, &uuid);
        }
        let _ = decode_all(&bytes, count % 64);
    }

    #[test]
    fn decoders_never_panic_on_mutated_valid_input(flips in proptest::collection::vec((0usize..600, any::<u8>()), 1..8)) {
        let records = vec![
            foliofs::format::Record::DirAdd { dir: 1, name: b"abc".to_vec(), ino: 2 },
            foliofs::format::Record::ExtentMap {
                ino: 2,
                file_block: 0,
                dev_block: 100,
                block_count: 3,
                state: foliofs::format::ExtentState::Written,
            },
        ];
        let mut bytes = foliofs::format::record::encode_all(&records);
        bytes.resize(600, 0);
        for (offset, value) in flips {
            bytes[offset] ^= value;
        }
        let _ = decode_all(&bytes[..43], 2);
        let _ = Superblock::decode(&bytes);
    }
}

/// A damaged group in the middle of the journal ends replay there; groups
/// written after the next mount must not let the stale groups behind the
/// damage come back, even when sizes and record numbers line up exactly.
fn stale_groups_behind_a_damaged_one_never_replay(block_bytes: u32) {
    let (device, volume) = new_volume(8 << 20, block_bytes);
    let superblock = volume.superblock().clone();
    let mut group_offsets = Vec::new();
    for index in 1..=5 {
        let attr =
            volume.inodes().create(ROOT, format!("a{index}").as_bytes(), 0o644, owner()).unwrap();
        let before = device.log_len();
        volume.inodes().open_file(attr.ino, OpenFlags::READ).unwrap().sync_all().unwrap();
        let log = device.log();
        let group = log[before..].iter().find_map(|entry| match entry {
            foliofs::dev::fault::LogEntry::Write { offset, fua: true, .. } => Some(*offset),
            _ => None,
        });
        group_offsets.push(group.expect("fsync wrote a journal group"));
    }
    let mut image = device.image();
    drop(volume);
    let journal_start = superblock.journal.start_block * superblock.block_bytes_u64();
    assert!(group_offsets.iter().all(|&offset| offset >= journal_start));
    // Damage the payload of the third group (past its 64-byte header).
    image[group_offsets[2] as usize + 70] ^= 0xFF;

    let (device, volume) = open_image(image).unwrap();
    let names: Vec<Vec<u8>> =
        volume.inodes().readdir(ROOT).unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, vec![b"a1".to_vec(), b"a2".to_vec()], "replay stops at the damaged group");
    let attr = volume.inodes().create(ROOT, b"b3", 0o644, owner()).unwrap();
    volume.inodes().open_file(attr.ino, OpenFlags::READ).unwrap().sync_all().unwrap();
    let image = device.image();
    drop(volume);

    let (_, volume) = open_image(image).unwrap();
    let names: Vec<Vec<u8>> =
        volume.inodes().readdir(ROOT).unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, vec![b"a1".to_vec(), b"a2".to_vec(), b"b3".to_vec()]);
}
