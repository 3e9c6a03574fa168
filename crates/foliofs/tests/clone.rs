//! Clones: files that share blocks, copy-on-write of only the blocks a
//! write touches (buffered, direct, sub-block direct, zeroing), reference
//! counts that survive remounts and checkpoints, and space that comes back
//! once the last sharer lets go; against a model, on 1 KiB, 4 KiB and
//! 64 KiB blocks.

#[macro_use]
mod common;

use foliofs::dev::fault::Keep;
use foliofs::dev::AlignedBuf;
use foliofs::options::DirtyMode;
use foliofs::{Error, FallocateMode, File, OpenFlags, Volume, VolumeOptions};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{
    direct_unit, new_volume, new_volume_with_journal, new_volume_with_options, open_image,
    open_image_with, owner, pattern, ROOT,
};

block_size_tests!(
    a_clone_shares_every_block_and_writes_copy_only_their_own,
    clones_match_a_model_across_remounts,
    bad_clones_are_refused_and_change_nothing,
    a_crash_anywhere_leaves_each_block_old_or_new_and_the_counts_right,
    a_block_unshared_by_a_record_not_yet_durable_is_still_copied_on_write,
    partial_writes_into_cloned_fallocated_space_keep_its_zeros,
    a_copy_range_into_a_dsync_file_is_durable_on_return,
    buffered_overwrites_of_shared_blocks_reserve_their_copies,
    a_full_volume_refuses_overwrites_of_a_clone_when_written,
    zeroing_two_shared_edges_with_one_free_block_changes_nothing,
);

fn create(volume: &Volume, name: &str) -> u64 {
    volume.inodes().create(ROOT, name.as_bytes(), 0o644, owner()).unwrap().ino
}

fn open(volume: &Volume, ino: u64, direct: bool) -> File {
    let flags = if direct { OpenFlags::READ_WRITE.with_direct() } else { OpenFlags::READ_WRITE };
    volume.inodes().open_file(ino, flags).unwrap()
}

fn contents(file: &File) -> Vec<u8> {
    let size = file.metadata().unwrap().len() as usize;
    let mut bytes = vec![0u8; size];
    file.read_exact_at(&mut bytes, 0).unwrap();
    bytes
}

fn direct_write(file: &File, data: &[u8], pos: u64) {
    let mut buffer = AlignedBuf::zeroed(data.len());
    buffer.copy_from_slice(data);
    assert_eq!(file.write_at(&buffer, pos).unwrap(), data.len());
}

/// Every flush boundary the device saw since its log was last reset, and
/// its end: where the crash tests cut.
fn crash_points(device: &foliofs::dev::fault::FaultDev) -> Vec<usize> {
    let mut points = device.durability_points();
    points.push(device.log_len());
    points.sort_unstable();
    points.dedup();
    points
}

fn free_blocks(volume: &Volume) -> u64 {
    volume.sync().unwrap();
    volume.statfs().free_blocks
}

fn a_clone_shares_every_block_and_writes_copy_only_their_own(block_bytes: u32) {
    let (device, volume) = new_volume(48 << 20, block_bytes);
    let block = block_bytes as usize;
    let blocks = 32;
    let free_at_start = free_blocks(&volume);
    let original = pattern(1, blocks * block - 100);
    let src_ino = create(&volume, "src");
    let src = open(&volume, src_ino, false);
    src.write_all_at(&original, 0).unwrap();
    src.sync_all().unwrap();
    let free_after_write = free_blocks(&volume);
    assert_eq!(free_at_start - free_after_write, blocks as u64);

    volume.clone_file("/src", "/dst").unwrap();
    let dst_ino = volume.inodes().lookup(ROOT, b"dst").unwrap().ino;
    let dst = open(&volume, dst_ino, false);
    assert_eq!(contents(&dst), original);
    assert_eq!(free_blocks(&volume), free_after_write, "a clone takes no data blocks");
    assert_eq!(volume.statfs().shared_blocks, blocks as u64);

    // A buffered overwrite of one block of the clone copies that block only.
    let mut expected_dst = original.clone();
    let new_block = pattern(2, block);
    dst.write_all_at(&new_block, 3 * block as u64).unwrap();
    expected_dst[3 * block..4 * block].copy_from_slice(&new_block);
    dst.sync_all().unwrap();
    assert_eq!(volume.statfs().shared_blocks, blocks as u64 - 1);
    assert_eq!(free_blocks(&volume), free_after_write - 1);

    // A direct whole-block overwrite of the original, and a sub-block one.
    let mut expected_src = original.clone();
    let src_direct = open(&volume, src_ino, true);
    let whole = pattern(3, block);
    direct_write(&src_direct, &whole, 5 * block as u64);
    expected_src[5 * block..6 * block].copy_from_slice(&whole);
    let unit = direct_unit(block_bytes);
    if unit < block {
        let piece = pattern(4, unit);
        let at = 7 * block + unit;
        direct_write(&src_direct, &piece, at as u64);
        expected_src[at..at + unit].copy_from_slice(&piece);
    }
    // Zeroing part of a shared block (punching inside it) copies it too.
    let punch_at = 9 * block + block / 4;
    dst.fallocate(FallocateMode::PunchHole, punch_at as u64, (block / 2) as u64).unwrap();
    expected_dst[punch_at..punch_at + block / 2].fill(0);
    // A truncate that cuts a shared last block keeps the original's tail.
    let cut = 20 * block + 17;
    dst.set_len(cut as u64).unwrap();
    expected_dst.truncate(cut);
    volume.sync().unwrap();
    assert_eq!(contents(&src), expected_src);
    assert_eq!(contents(&dst), expected_dst);
    let shared = volume.statfs().shared_blocks;
    assert!(shared < 21 && shared > 10, "{shared} blocks still shared");

    // The counts come back from the journal, then from a checkpoint.
    drop((src, src_direct, dst));
    volume.close().unwrap();
    let (device, volume) = open_image(device.image()).unwrap();
    assert_eq!(volume.statfs().shared_blocks, shared);
    volume.checkpoint().unwrap();
    volume.close().unwrap();
    let image = device.image();
    let (_device, volume) = open_image(image).unwrap();
    assert_eq!(volume.statfs().shared_blocks, shared);
    let src = open(&volume, src_ino, false);
    let dst = open(&volume, dst_ino, false);
    assert_eq!(contents(&src), expected_src);
    assert_eq!(contents(&dst), expected_dst);

    // The last of the sharers to go frees the blocks; nothing leaks.
    drop(src);
    volume.remove_file("/src").unwrap();
    assert_eq!(contents(&dst), expected_dst);
    assert_eq!(volume.statfs().shared_blocks, 0);
    drop(dst);
    volume.remove_file("/dst").unwrap();
    assert_eq!(free_blocks(&volume), free_at_start);
}

/// Files as byte vectors, changed by random writes, clones, copies,
/// punches and truncates; checked after every step group and across
/// remounts, and all space back once every file is gone.
fn clones_match_a_model_across_remounts(block_bytes: u32) {
    for seed in 0..seeds() {
        model_check(seed, block_bytes);
    }
}

fn model_check(seed: u64, block_bytes: u32) {
    let (device, volume) = new_volume(64 << 20, block_bytes);
    let block = block_bytes as u64;
    let span = 48 * block;
    let free_at_start = free_blocks(&volume);
    let names = ["a", "b", "c"];
    let inos: Vec<u64> = names.iter().map(|name| create(&volume, name)).collect();
    let mut models: Vec<Vec<u8>> = vec![Vec::new(); names.len()];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut image: Option<Vec<u8>> = None;
    let mut opened = Some((device, volume));
    for round in 0..3 {
        let (device, current) =
            opened.take().unwrap_or_else(|| open_image(image.take().unwrap()).unwrap());
        let buffered: Vec<File> = inos.iter().map(|&ino| open(&current, ino, false)).collect();
        let direct: Vec<File> = inos.iter().map(|&ino| open(&current, ino, true)).collect();
        for step in 0..60 {
            let context = format!("seed {seed}, block {block_bytes}, round {round}, step {step}");
            let which = rng.random_range(0..names.len());
            let op = rng.random_range(0..100);
            if std::env::var_os("CLONE_TRACE").is_some() {
                eprintln!(
                    "{context}: op {op} on {which}, sizes {:?}",
                    models.iter().map(Vec::len).collect::<Vec<_>>()
                );
            }
            let model = &mut models[which];
            match op {
                0..=24 => {
                    let pos = rng.random_range(0..span);
                    let data =
                        pattern(seed * 10_000 + step, rng.random_range(1..3 * block) as usize);
                    buffered[which].write_all_at(&data, pos).unwrap();
                    write_model(model, &data, pos);
                }
                25..=39 => {
                    let unit = direct_unit(block_bytes) as u64;
                    let pos = rng.random_range(0..span / unit) * unit;
                    let length = rng.random_range(1..=2 * block / unit) * unit;
                    let data = pattern(seed * 20_000 + step, length as usize);
                    if std::env::var_os("CLONE_TRACE").is_some() {
                        eprintln!("direct write {length} at {pos}");
                    }
                    direct_write(&direct[which], &data, pos);
                    write_model(model, &data, pos);
                }
                40..=64 => {
                    let from = rng.random_range(0..names.len());
                    let src_size = models[from].len() as u64;
                    let src_pos = rng.random_range(0..=src_size / block) * block;
                    let dst_pos = rng.random_range(0..span / block) * block;
                    let mut length = rng.random_range(0..=16) * block;
                    if src_pos + length > src_size {
                        length = src_size - src_pos; // to the source's end
                    }
                    let overlaps = from == which
                        && src_pos < dst_pos + length.div_ceil(block) * block
                        && dst_pos < src_pos + length.div_ceil(block) * block;
                    let reaches_end = dst_pos + length >= models[which].len() as u64;
                    let aligned = length.is_multiple_of(block);
                    if length == 0 {
                        continue; // 0 means "to the source's end": another case
                    }
                    if std::env::var_os("CLONE_TRACE").is_some() {
                        eprintln!("clone {length} from {from} at {src_pos} to {dst_pos}");
                    }
                    let result =
                        buffered[which].clone_range_from(&buffered[from], src_pos, dst_pos, length);
                    if overlaps || (!aligned && !reaches_end) {
                        let error = result.expect_err(&context);
                        assert_eq!(error.errno(), libc::EINVAL, "{context}: {error}");
                        continue;
                    }
                    assert_eq!(result.expect(&context), length, "{context}");
                    let data = models[from][src_pos as usize..(src_pos + length) as usize].to_vec();
                    write_model(&mut models[which], &data, dst_pos);
                }
                65..=74 => {
                    let from = rng.random_range(0..names.len());
                    if from == which {
                        continue;
                    }
                    let src_pos = rng.random_range(0..span);
                    let dst_pos = rng.random_range(0..span);
                    let length = rng.random_range(1..4 * block);
                    let copied = buffered[which]
                        .copy_range_from(&buffered[from], src_pos, dst_pos, length)
                        .expect(&context);
                    let src_model = &models[from];
                    let available = (src_model.len() as u64).saturating_sub(src_pos).min(length);
                    assert_eq!(copied, available, "{context}");
                    let data = src_model[src_pos.min(src_model.len() as u64) as usize..]
                        [..available as usize]
                        .to_vec();
                    write_model(&mut models[which], &data, dst_pos);
                }
                75..=84 => {
                    let pos = rng.random_range(0..span);
                    let length = rng.random_range(1..3 * block);
                    buffered[which].fallocate(FallocateMode::PunchHole, pos, length).unwrap();
                    let end = ((pos + length) as usize).min(model.len());
                    if (pos as usize) < end {
                        model[pos as usize..end].fill(0);
                    }
                }
                85..=92 => {
                    let size = rng.random_range(0..span);
                    if std::env::var_os("CLONE_TRACE").is_some() {
                        eprintln!(
                            "truncate to {size}: {:?}",
                            current
                                .inodes()
                                .fiemap(inos[which])
                                .unwrap()
                                .iter()
                                .map(|e| (e.logical / block, e.physical / block, e.length / block))
                                .collect::<Vec<_>>()
                        );
                    }
                    buffered[which].set_len(size).unwrap();
                    model.resize(size as usize, 0);
                }
                _ => {
                    for (file, model) in buffered.iter().zip(&models) {
                        assert_same(&contents(file), model, &context);
                    }
                }
            }
            current.check_shared_counts().unwrap_or_else(|error| panic!("{context}: {error}"));
            if std::env::var_os("CLONE_TRACE").is_some() {
                for (file, model) in buffered.iter().zip(&models) {
                    assert_same(&contents(file), model, &context);
                }
            }
            if rng.random_range(0..10) == 0 {
                current.sync().unwrap();
            }
        }
        for (file, model) in buffered.iter().zip(&models) {
            assert_same(&contents(file), model, &format!("seed {seed}, round {round}"));
        }
        if round == 1 {
            current.checkpoint().unwrap();
        }
        drop((buffered, direct));
        current.close().unwrap();
        image = Some(device.image());
    }
    let (_device, volume) = open_image(image.unwrap()).unwrap();
    for (&ino, model) in inos.iter().zip(&models) {
        assert_same(
            &contents(&open(&volume, ino, false)),
            model,
            &format!("seed {seed}, remounted"),
        );
    }
    for name in names {
        volume.remove_file(format!("/{name}")).unwrap();
    }
    assert_eq!(volume.statfs().shared_blocks, 0, "seed {seed}");
    assert_eq!(free_blocks(&volume), free_at_start, "seed {seed}: every block back");
}

/// Equal bytes, or a panic naming the first that differs.
fn assert_same(actual: &[u8], expected: &[u8], context: &str) {
    assert_eq!(actual.len(), expected.len(), "{context}: length");
    if let Some(at) = actual.iter().zip(expected).position(|(a, e)| a != e) {
        panic!("{context}: byte {at} is {:#x}, expected {:#x}", actual[at], expected[at]);
    }
}

fn write_model(model: &mut Vec<u8>, data: &[u8], pos: u64) {
    if data.is_empty() {
        return;
    }
    let end = pos as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[pos as usize..end].copy_from_slice(data);
}

fn bad_clones_are_refused_and_change_nothing(block_bytes: u32) {
    let (_device, volume) = new_volume(32 << 20, block_bytes);
    let block = block_bytes as u64;
    let src = open(&volume, create(&volume, "src"), false);
    let dst = open(&volume, create(&volume, "dst"), false);
    src.write_all_at(&pattern(7, 8 * block as usize), 0).unwrap();
    dst.write_all_at(&pattern(8, 8 * block as usize), 0).unwrap();
    let before = (contents(&src), contents(&dst));
    let einval = |result: foliofs::Result<u64>, what: &str| {
        let error = result.expect_err(what);
        assert_eq!(error.errno(), libc::EINVAL, "{what}: {error}");
    };
    einval(dst.clone_range_from(&src, 1, 0, block), "unaligned source");
    einval(dst.clone_range_from(&src, 0, block + 1, block), "unaligned destination");
    einval(dst.clone_range_from(&src, 0, 0, block + 1), "unaligned length inside both files");
    einval(dst.clone_range_from(&src, 4 * block, 0, 8 * block), "past the source's end");
    einval(src.clone_range_from(&src, 0, block, 2 * block), "overlapping in one file");
    einval(dst.dedupe_range_from(&src, 0, 4 * block, 8 * block), "dedupe past the end");
    let reader = volume.inodes().open_file(dst.ino(), OpenFlags::READ).unwrap();
    let error = reader.clone_range_from(&src, 0, 0, block).unwrap_err();
    assert_eq!(error.errno(), libc::EBADF, "{error}");
    // Another volume: EXDEV.
    let (_other_device, other) = new_volume(32 << 20, block_bytes);
    let foreign = open(&other, create(&other, "f"), false);
    let error = foreign.clone_range_from(&src, 0, 0, block).unwrap_err();
    assert!(matches!(error, Error::CrossDevice(_)), "{error}");
    assert_eq!(error.errno(), libc::EXDEV);
    // Different bytes dedupe to nothing; equal ones share.
    assert_eq!(dst.dedupe_range_from(&src, 0, 0, 2 * block).unwrap(), 0);
    assert_eq!((contents(&src), contents(&dst)), before);
    assert_eq!(volume.statfs().shared_blocks, 0);
    dst.write_all_at(&before.0[..2 * block as usize], 4 * block).unwrap();
    assert_eq!(dst.dedupe_range_from(&src, 0, 4 * block, 2 * block).unwrap(), 2 * block);
    assert_eq!(volume.statfs().shared_blocks, 2);
    // cp of a file that does not exist leaves nothing behind.
    assert_eq!(volume.clone_file("/missing", "/copy").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(volume.clone_file("/src", "/dst").unwrap_err().errno(), libc::EEXIST);
    assert!(volume.metadata("/copy").is_err());
}

#[test]
fn truncating_into_a_clone_keeps_the_counts() {
    let (_device, volume) = new_volume(32 << 20, 4096);
    let a = open(&volume, create(&volume, "a"), false);
    let b = open(&volume, create(&volume, "b"), false);
    a.write_all_at(&pattern(1, 40 * 4096), 0).unwrap();
    b.write_all_at(&pattern(2, 40 * 4096), 0).unwrap();
    volume.sync().unwrap();
    b.clone_range_from(&a, 17 * 4096, 18 * 4096, 16 * 4096).unwrap();
    volume.check_shared_counts().unwrap();
    assert_eq!(volume.statfs().shared_blocks, 16);
    b.write_all_at(&pattern(3, 3000), 18 * 4096 + 500).unwrap();
    b.write_all_at(&pattern(4, 9000), 24 * 4096 + 500).unwrap();
    b.set_len(18 * 4096 + 954).unwrap();
    volume.check_shared_counts().unwrap();
    assert_eq!(volume.statfs().shared_blocks, 0);
}

/// copy_file_range into a file opened O_DSYNC (O_SYNC) is durable when it
/// returns, as a write through that file is (XFS forces the log after a
/// remap into such a file; ext4's splice writes are O_DSYNC writes):
/// clones of whole blocks, copied edges, and a pure copy where the offsets
/// sit apart within their blocks; each then survives a crash right after,
/// with nothing volatile kept. xfstests' generic/629 checks this with
/// dm-error (it cannot run without device-mapper). The copy ignored the
/// flag: a crash lost what it had returned.
fn a_copy_range_into_a_dsync_file_is_durable_on_return(block_bytes: u32) {
    let block = block_bytes as u64;
    let (device, volume) = new_volume(32 << 20, block_bytes);
    let src = open(&volume, create(&volume, "src"), false);
    let original = pattern(1, 8 * block as usize);
    src.write_all_at(&original, 0).unwrap();
    src.sync_all().unwrap();
    let dst_ino = create(&volume, "dst");
    volume.sync().unwrap();
    let dsync = volume.inodes().open_file(dst_ino, OpenFlags::READ_WRITE.with_dsync()).unwrap();
    let mut expected = Vec::new();
    // Whole blocks with edges (clones), then bytes at another place in a
    // block (a copy), each past the end of file so the size must last too.
    for (src_pos, dst_pos, length) in
        [(13, 13, 5 * block + 100), (block + 7, 6 * block + 500, 2 * block - 9)]
    {
        let copied = dsync.copy_range_from(&src, src_pos, dst_pos, length).unwrap();
        assert_eq!(copied, length);
        let (start, end) = (dst_pos as usize, (dst_pos + length) as usize);
        expected.resize(expected.len().max(end), 0);
        expected[start..end].copy_from_slice(&original[src_pos as usize..][..length as usize]);
        let image = device.crash_image(device.log_len(), &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let attr = recovered.inodes().lookup(ROOT, b"dst").unwrap();
        let found = contents(&open(&recovered, attr.ino, false));
        assert!(
            found == expected,
            "block {block_bytes}: after the copy to {dst_pos} a crash kept {} bytes, {} expected",
            found.len(),
            expected.len()
        );
        recovered.check_shared_counts().unwrap();
    }
}

/// Seeds of the model check: 3, or `FOLIOFS_CLONE_SEEDS` for a longer run.
fn seeds() -> u64 {
    std::env::var("FOLIOFS_CLONE_SEEDS").ok().and_then(|value| value.parse().ok()).unwrap_or(3)
}

/// Clones, then writes of every kind into the shared blocks and the
/// deletion of the original, each made durable; a crash at every point
/// where the device made something durable (whole, lost, or torn writes)
/// mounts (so the counts agree with the extent maps), and each block of
/// each file holds one of the versions it had, never another file's data
/// or garbage.
fn a_crash_anywhere_leaves_each_block_old_or_new_and_the_counts_right(block_bytes: u32) {
    let (device, volume) = new_volume(32 << 20, block_bytes);
    let block = block_bytes as usize;
    let blocks = 12;
    let src_ino = create(&volume, "src");
    let src = open(&volume, src_ino, false);
    let original = pattern(1, blocks * block);
    src.write_all_at(&original, 0).unwrap();
    src.sync_all().unwrap();
    volume.sync().unwrap();
    // Crash points from here on: the volume as written so far is the base.
    device.reset_log();
    // Each file's blocks: every version each may show after a crash.
    let versions_of = |data: &[u8]| -> Vec<Vec<Vec<u8>>> {
        data.chunks(block).map(|chunk| vec![chunk.to_vec()]).collect()
    };
    let mut src_versions = versions_of(&original);
    let mut dst_versions = versions_of(&original);
    volume.clone_file("/src", "/dst").unwrap();
    let dst_ino = volume.inodes().lookup(ROOT, b"dst").unwrap().ino;
    let dst = open(&volume, dst_ino, false);
    let src_direct = open(&volume, src_ino, true);
    let add = |versions: &mut Vec<Vec<Vec<u8>>>, index: usize, data: Vec<u8>| {
        versions[index].push(data);
    };
    // Buffered overwrite of two blocks of the clone.
    let new = pattern(2, 2 * block);
    dst.write_all_at(&new, 2 * block as u64).unwrap();
    add(&mut dst_versions, 2, new[..block].to_vec());
    add(&mut dst_versions, 3, new[block..].to_vec());
    dst.sync_all().unwrap();
    // A direct whole-block overwrite of the original, and a sub-block one.
    let whole = pattern(3, block);
    direct_write(&src_direct, &whole, 5 * block as u64);
    add(&mut src_versions, 5, whole);
    let unit = direct_unit(block_bytes);
    if unit < block {
        let piece = pattern(4, unit);
        let mut merged = original[7 * block..8 * block].to_vec();
        merged[unit..2 * unit].copy_from_slice(&piece);
        direct_write(&src_direct, &piece, (7 * block + unit) as u64);
        add(&mut src_versions, 7, merged);
    }
    src_direct.sync_all().unwrap();
    // Punch the middle of a shared block of the clone.
    let mut punched = original[9 * block..10 * block].to_vec();
    punched[block / 4..block * 3 / 4].fill(0);
    dst.fallocate(FallocateMode::PunchHole, (9 * block + block / 4) as u64, (block / 2) as u64)
        .unwrap();
    add(&mut dst_versions, 9, punched);
    dst.sync_all().unwrap();
    drop((src, src_direct));
    volume.remove_file("/src").unwrap();
    volume.sync().unwrap();
    let points = crash_points(&device);
    for &cut in &points {
        for variant in 0..3 {
            let image = device.crash_image(cut, &|_| match variant {
                0 => Keep::Nothing,
                1 => Keep::All,
                _ => Keep::Sectors((0..256).map(|sector| sector % 3 != 0).collect()),
            });
            let context = format!("block {block_bytes}, crash at {cut}, variant {variant}");
            let (_, recovered) =
                open_image(image).unwrap_or_else(|error| panic!("{context}: {error}"));
            recovered.check_shared_counts().unwrap_or_else(|error| panic!("{context}: {error}"));
            for (name, versions) in [("src", &src_versions), ("dst", &dst_versions)] {
                let Ok(attr) = recovered.inodes().lookup(ROOT, name.as_bytes()) else {
                    continue;
                };
                let found = contents(&open(&recovered, attr.ino, false));
                assert_eq!(found.len(), blocks * block, "{context}: {name}'s size");
                for (index, chunk) in found.chunks(block).enumerate() {
                    assert!(
                        versions[index].iter().any(|version| version == chunk),
                        "{context}: block {index} of {name} is none of its versions"
                    );
                }
            }
        }
    }
    // At the end: the clone holds its last versions, and nothing else remains.
    let (_, recovered) = open_image(device.image()).unwrap();
    assert!(recovered.inodes().lookup(ROOT, b"src").is_err());
    let found = contents(&open(&recovered, dst_ino, false));
    for (index, chunk) in found.chunks(block).enumerate() {
        assert_eq!(chunk, dst_versions[index].last().unwrap().as_slice(), "block {index}");
    }
    assert_eq!(recovered.statfs().shared_blocks, 0);
}

/// A block whose other mapping went in a record not yet durable is still
/// copied on write: a crash before that record brings the mapping back, and
/// it must read what it held. (Deleting a clone, then overwriting the
/// original in place, once left the recovered clone with the new data.)
fn a_block_unshared_by_a_record_not_yet_durable_is_still_copied_on_write(block_bytes: u32) {
    let (device, volume) = new_volume(32 << 20, block_bytes);
    let block = block_bytes as usize;
    let src_ino = create(&volume, "src");
    let original = pattern(1, 4 * block);
    open(&volume, src_ino, false).write_all_at(&original, 0).unwrap();
    volume.clone_file("/src", "/dst").unwrap();
    volume.sync().unwrap();
    device.reset_log();
    // Not durable: nothing commits on its own in these tests.
    volume.remove_file("/dst").unwrap();
    let direct = open(&volume, src_ino, true);
    let new = pattern(2, 2 * block);
    direct_write(&direct, &new, 0);
    let points = crash_points(&device);
    for &cut in &points {
        for keep in [Keep::Nothing, Keep::All] {
            let context = format!("block {block_bytes}, crash at {cut}, keep {keep:?}");
            let (_, recovered) = open_image(device.crash_image(cut, &|_| keep.clone()))
                .unwrap_or_else(|error| panic!("{context}: {error}"));
            recovered.check_shared_counts().unwrap_or_else(|error| panic!("{context}: {error}"));
            let dst = recovered.inodes().lookup(ROOT, b"dst").expect("the removal was not durable");
            let found = contents(&open(&recovered, dst.ino, false));
            assert_same(&found, &original, &format!("{context}: the clone"));
            let found = contents(&open(&recovered, src_ino, false));
            let head = &found[..2 * block];
            assert!(
                head == &original[..2 * block] || head == &new[..],
                "{context}: the original's first blocks are neither old nor new"
            );
        }
    }
    drop(direct);
    volume.sync().unwrap();
    let (_, recovered) = open_image(device.image()).unwrap();
    assert!(recovered.inodes().lookup(ROOT, b"dst").is_err());
    let found = contents(&open(&recovered, src_ino, false));
    assert_same(&found[..2 * block], &new, "the original after the sync");
    assert_same(&found[2 * block..], &original[2 * block..], "the original's other blocks");
    assert_eq!(recovered.statfs().shared_blocks, 0);
}

/// A clone of fallocated (unwritten) space shares blocks that read as
/// zeros whatever the device holds there: a sub-block direct write or a
/// punch into one copies zeros, not the device's bytes. (Both once copied
/// the device's garbage into the rest of the block.)
fn partial_writes_into_cloned_fallocated_space_keep_its_zeros(block_bytes: u32) {
    let (device, volume) = new_volume(32 << 20, block_bytes);
    let block = block_bytes as usize;
    let unit = direct_unit(block_bytes);
    let ino = create(&volume, "src");
    let src = open(&volume, ino, false);
    src.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 4 * block as u64).unwrap();
    volume.clone_file("/src", "/dst").unwrap();
    let dst_ino = volume.inodes().lookup(ROOT, b"dst").unwrap().ino;
    let mut expected = vec![0u8; 4 * block];
    // A direct write of one sector-sized unit in the middle of block 1.
    let piece = pattern(7, unit);
    let at = block + if unit < block { unit } else { 0 };
    direct_write(&open(&volume, dst_ino, true), &piece, at as u64);
    expected[at..at + unit].copy_from_slice(&piece);
    // A punch inside block 2 of the original.
    src.fallocate(FallocateMode::PunchHole, (2 * block + 1) as u64, (block / 2) as u64).unwrap();
    drop(src);
    volume.sync().unwrap();
    for volume in [volume, open_image(device.image()).unwrap().1] {
        let dst = contents(&open(&volume, dst_ino, false));
        assert_same(&dst, &expected, "the clone");
        let src = contents(&open(&volume, ino, false));
        assert_same(&src, &vec![0u8; 4 * block], "the original");
        volume.check_shared_counts().unwrap();
    }
}

fn available_blocks(volume: &Volume) -> u64 {
    volume.statfs().available_blocks
}

/// A buffered overwrite of shared blocks promises a block to each copy as
/// the blocks become dirty, as a write into a hole does: the promise shows
/// in the available space at once, goes with the copy writeback makes, and
/// comes back whole when the dirty blocks are dropped or found unshared.
fn buffered_overwrites_of_shared_blocks_reserve_their_copies(block_bytes: u32) {
    let (device, volume) = new_volume(32 << 20, block_bytes);
    let block = block_bytes as usize;
    let empty = available_blocks(&volume);
    let src_ino = create(&volume, "src");
    let mut expected = pattern(1, 16 * block);
    open(&volume, src_ino, false).write_all_at(&expected, 0).unwrap();
    volume.clone_file("/src", "/dst").unwrap();
    volume.sync().unwrap();
    let dst_ino = volume.inodes().lookup(ROOT, b"dst").unwrap().ino;
    let dst = open(&volume, dst_ino, false);
    let settled = available_blocks(&volume);
    assert_eq!(settled, empty - 16);
    assert_eq!(volume.statfs().shared_blocks, 16);

    let write = |expected: &mut Vec<u8>, data: Vec<u8>, at: usize| {
        dst.write_all_at(&data, at as u64).unwrap();
        expected[at..at + data.len()].copy_from_slice(&data);
    };
    // Blocks 2..5 whole and a few bytes inside block 8: four copies.
    write(&mut expected, pattern(2, 3 * block), 2 * block);
    write(&mut expected, pattern(3, 10), 8 * block + 5);
    assert_eq!(available_blocks(&volume), settled - 4, "promised when dirtied");
    // Dirty again before writeback: nothing more is promised.
    write(&mut expected, pattern(4, 2 * block), 2 * block);
    assert_eq!(available_blocks(&volume), settled - 4);
    dst.sync_all().unwrap();
    assert_eq!(available_blocks(&volume), settled - 4, "the copies took the promised blocks");
    assert_eq!(volume.statfs().shared_blocks, 12);
    // Blocks copied once are the clone's own: overwriting them promises nothing.
    write(&mut expected, pattern(5, block), 2 * block);
    assert_eq!(available_blocks(&volume), settled - 4);

    // Dirty shared blocks that a truncate drops give their promise back
    // (cutting shared blocks frees none: the original keeps them).
    write(&mut expected, pattern(6, 2 * block), 13 * block);
    assert_eq!(available_blocks(&volume), settled - 6);
    dst.set_len(14 * block as u64).unwrap();
    expected.truncate(14 * block);
    assert_eq!(available_blocks(&volume), settled - 5, "the truncate gave block 14's back");
    // A punch of a dirty shared block leaves no promise and no block behind.
    write(&mut expected, pattern(7, block), 10 * block);
    dst.fallocate(FallocateMode::PunchHole, 10 * block as u64, block as u64).unwrap();
    expected[10 * block..11 * block].fill(0);
    volume.sync().unwrap();
    assert_eq!(available_blocks(&volume), settled - 5, "block 13's copy alone was taken");

    // A block unshared before its writeback needs no copy: its promise goes
    // back when writeback finds it unshared.
    write(&mut expected, pattern(8, block), 12 * block);
    volume.remove_file("/src").unwrap();
    // The blocks only the original mapped (2, 3, 4, 8, 10, 13, 14, 15) are
    // freed once the removal is durable; an fsync of another file commits.
    let other = create(&volume, "other");
    open(&volume, other, false).sync_all().unwrap();
    assert_eq!(available_blocks(&volume), settled - 6 + 8);
    dst.sync_all().unwrap();
    assert_eq!(volume.statfs().shared_blocks, 0);
    assert_eq!(available_blocks(&volume), settled - 5 + 8, "written in place");
    assert_same(&contents(&dst), &expected, "the clone");
    drop(dst);
    volume.close().unwrap();
    let (_, volume) = open_image(device.image()).unwrap();
    assert_same(&contents(&open(&volume, dst_ino, false)), &expected, "the clone remounted");
    volume.check_shared_counts().unwrap();
    volume.remove_file("/dst").unwrap();
    volume.remove_file("/other").unwrap();
    volume.sync().unwrap();
    assert_eq!(available_blocks(&volume), empty, "no promise leaked");
}

/// On a volume too full to copy every shared block of a clone, its
/// overwrite is refused when written (ENOSPC, or a short write), and the
/// writeback of what was accepted finds its space: it once took the copies'
/// blocks only at writeback, where fsync failed with EIO ("no free blocks to
/// copy shared blocks"). In both dirty-tracking modes.
fn a_full_volume_refuses_overwrites_of_a_clone_when_written(block_bytes: u32) {
    for dirty in [DirtyMode::Block, DirtyMode::Folio] {
        let options = VolumeOptions { dirty, ..common::options() };
        let (device, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options);
        let block = block_bytes as u64;
        let available = volume.statfs().available_blocks;
        let file_blocks = available * 2 / 3;
        let original = pattern(1, (file_blocks * block) as usize);
        let src_ino = create(&volume, "src");
        open(&volume, src_ino, false).write_all_at(&original, 0).unwrap();
        volume.clone_file("/src", "/dst").unwrap();
        volume.sync().unwrap();
        let dst_ino = volume.inodes().lookup(ROOT, b"dst").unwrap().ino;
        let dst = open(&volume, dst_ino, false);
        let copies_max = volume.statfs().available_blocks;
        assert!(copies_max < file_blocks, "the volume cannot copy the whole clone");

        let new = pattern(2, original.len());
        let chunk = 64 << 10;
        let mut accepted = 0usize;
        let refusal = loop {
            let end = (accepted + chunk).min(new.len());
            match dst.write_at(&new[accepted..end], accepted as u64) {
                Ok(written) if written == end - accepted => accepted = end,
                Ok(written) => {
                    accepted += written;
                    break "a short write".to_string();
                }
                Err(error) => {
                    assert_eq!(error.errno(), libc::ENOSPC, "{dirty:?}: {error}");
                    break error.to_string();
                }
            }
            assert!(accepted < new.len(), "{dirty:?}: the whole clone was accepted");
        };
        let context = format!("{dirty:?}, {block_bytes}-byte blocks, refused by {refusal}");
        assert!(accepted > 0, "{context}: nothing accepted");
        assert!(accepted as u64 <= copies_max * block, "{context}: {accepted} bytes accepted");
        dst.sync_all().unwrap_or_else(|error| panic!("{context}: the writeback failed: {error}"));
        drop(dst);
        volume.close().unwrap();
        let (_, volume) = open_image_with(device.image(), &options).unwrap();
        let mut expected = original.clone();
        expected[..accepted].copy_from_slice(&new[..accepted]);
        assert_same(&contents(&open(&volume, dst_ino, false)), &expected, &context);
        assert_same(&contents(&open(&volume, src_ino, false)), &original, &context);
        volume.check_shared_counts().unwrap();
    }
}

/// A punch or zero-range whose both edges cut into shared blocks needs two
/// copies: with one block free it is refused before either edge changes
/// (the first edge was once zeroed, then the second refused; found by the
/// crash checker with four threads filling the volume).
fn zeroing_two_shared_edges_with_one_free_block_changes_nothing(block_bytes: u32) {
    let block = block_bytes as u64;
    for mode in [FallocateMode::PunchHole, FallocateMode::ZeroRange { keep_size: false }] {
        let (_device, volume) = new_volume(8 << 20, block_bytes);
        let file_blocks = volume.statfs().available_blocks - 1;
        let original = pattern(1, (file_blocks * block) as usize);
        let src_ino = create(&volume, "src");
        open(&volume, src_ino, false).write_all_at(&original, 0).unwrap();
        volume.clone_file("/src", "/dst").unwrap();
        volume.sync().unwrap();
        assert_eq!(volume.statfs().available_blocks, 1);
        let dst_ino = volume.inodes().lookup(ROOT, b"dst").unwrap().ino;
        let dst = open(&volume, dst_ino, false);
        let error = dst.fallocate(mode, block / 2, block).unwrap_err();
        assert_eq!(error.errno(), libc::ENOSPC, "{mode:?}: {error}");
        assert_same(&contents(&dst), &original, &format!("{mode:?} refused"));
        assert_eq!(volume.statfs().available_blocks, 1, "{mode:?}: the promise came back");
        // One edge alone fits.
        dst.fallocate(mode, block / 2, block / 4).unwrap();
        let mut expected = original.clone();
        expected[(block / 2) as usize..(block * 3 / 4) as usize].fill(0);
        assert_same(&contents(&dst), &expected, &format!("{mode:?} of one edge"));
        volume.check_shared_counts().unwrap();
    }
}

/// Blocks of one file whose counts alternate (a clone overwrote every other
/// block) are a shared-count record each when they go. Unlinking such a
/// file, more records than one journal group holds, once stopped the
/// process on an assertion; now it is freed in steps, crash-safe, a clone
/// of it is made in steps too, and a truncate that cannot be done in one
/// step is refused with ENOSPC, the file unchanged.
#[test]
fn a_file_of_more_shared_pieces_than_a_journal_group_holds_is_freed_in_steps() {
    for block_bytes in [1024u32, 4096] {
        let block = block_bytes as usize;
        let blocks = 2000;
        let (device, volume) = new_volume_with_journal(
            (blocks * block * 4) as u64 + (8 << 20),
            block_bytes,
            Some(64 << 10),
        );
        let empty = available_blocks(&volume);
        let src_ino = create(&volume, "src");
        let original = pattern(1, blocks * block);
        open(&volume, src_ino, false).write_all_at(&original, 0).unwrap();
        volume.clone_file("/src", "/clone").unwrap();
        let clone_ino = volume.inodes().lookup(ROOT, b"clone").unwrap().ino;
        let mut expected_clone = original.clone();
        let clone = open(&volume, clone_ino, false);
        for index in (0..blocks).step_by(2) {
            let data = pattern(2 + index as u64, block);
            clone.write_all_at(&data, (index * block) as u64).unwrap();
            expected_clone[index * block..(index + 1) * block].copy_from_slice(&data);
        }
        drop(clone);
        volume.sync().unwrap();
        assert_eq!(volume.statfs().shared_blocks, blocks as u64 / 2);
        let context = format!("{block_bytes}-byte blocks");

        // One truncate cannot hold the counts: refused, nothing changed.
        let src = open(&volume, src_ino, false);
        let error = src.set_len(0).unwrap_err();
        assert_eq!(error.errno(), libc::ENOSPC, "{context}: {error}");
        assert!(error.to_string().contains("smaller steps"), "{context}: {error}");
        assert_same(&contents(&src), &original, &format!("{context}: the refused truncate"));
        drop(src);

        // A clone of it is made in steps.
        volume.clone_file("/src", "/again").unwrap();
        let again_ino = volume.inodes().lookup(ROOT, b"again").unwrap().ino;
        assert_same(&contents(&open(&volume, again_ino, false)), &original, &context);
        volume.check_shared_counts().unwrap();
        volume.remove_file("/again").unwrap();
        volume.sync().unwrap();

        // Unlinked in steps; a crash anywhere leaves it whole or gone.
        device.reset_log();
        volume.remove_file("/src").unwrap();
        volume.sync().unwrap();
        let points = crash_points(&device);
        for &cut in &points {
            let crashed = format!("{context}, crash at {cut}");
            let (_, recovered) = open_image(device.crash_image(cut, &|_| Keep::Nothing))
                .unwrap_or_else(|error| panic!("{crashed}: {error}"));
            recovered.check_shared_counts().unwrap_or_else(|error| panic!("{crashed}: {error}"));
            if let Ok(found) = recovered.inodes().lookup(ROOT, b"src") {
                let found = contents(&open(&recovered, found.ino, false));
                assert_same(&found, &original, &format!("{crashed}: the original"));
            }
            let found = contents(&open(&recovered, clone_ino, false));
            assert_same(&found, &expected_clone, &format!("{crashed}: the clone"));
        }
        assert!(volume.inodes().lookup(ROOT, b"src").is_err());
        assert_eq!(volume.statfs().shared_blocks, 0, "{context}");
        assert_same(&contents(&open(&volume, clone_ino, false)), &expected_clone, &context);
        volume.check_shared_counts().unwrap();
        volume.remove_file("/clone").unwrap();
        volume.sync().unwrap();
        assert_eq!(available_blocks(&volume), empty, "{context}: every block came back");
    }
}
