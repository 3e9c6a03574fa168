//! Space management: every fallocate mode against a model, mixed with
//! buffered and direct writes, truncates and reads, on 1 KiB, 4 KiB and
//! 64 KiB blocks; SEEK_DATA / SEEK_HOLE; fiemap after fsync; bad arguments.

#[macro_use]
mod common;

use foliofs::dev::AlignedBuf;
use foliofs::FallocateMode;
use foliofs::MapKind;
use foliofs::{OpenFlags, VolumeOptions};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{
    apply_fallocate_to_model as apply_to_model, direct_unit, new_volume_with_options,
    open_image_with, owner, pattern, ROOT,
};

const FILE_BYTES_MAX: u64 = 1 << 20;

block_size_tests!(
    fallocate_modes_match_a_model,
    preallocation_reads_zeros_and_keeps_space_promised,
    punching_frees_blocks_and_bad_arguments_are_refused,
);

fn options() -> VolumeOptions {
    common::options()
}

fn random_mode(rng: &mut ChaCha8Rng) -> FallocateMode {
    match rng.random_range(0..7) {
        0 => FallocateMode::Allocate { keep_size: false },
        1 => FallocateMode::Allocate { keep_size: true },
        2 | 3 => FallocateMode::PunchHole,
        4 => FallocateMode::ZeroRange { keep_size: rng.random_bool(0.5) },
        5 => FallocateMode::CollapseRange,
        _ => FallocateMode::InsertRange,
    }
}

fn model_check(seed: u64, block_bytes: u32) {
    let options = options();
    let (device, volume) = new_volume_with_options(48 << 20, block_bytes, None, &options);
    let ino = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let block = u64::from(block_bytes) as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    for step in 0..250u64 {
        let context = format!("seed {seed}, block {block_bytes}, step {step}");
        match rng.random_range(0..100) {
            0..=29 => {
                let pos = rng.random_range(0..FILE_BYTES_MAX as usize);
                let data = pattern(seed * 1000 + step, rng.random_range(1..40_000));
                file.write_at(&data, pos as u64).unwrap();
                if model.len() < pos + data.len() {
                    model.resize(pos + data.len(), 0);
                }
                model[pos..pos + data.len()].copy_from_slice(&data);
            }
            30..=37 => {
                let unit = direct_unit(block_bytes);
                let pos = rng.random_range(0..FILE_BYTES_MAX as usize / unit) * unit;
                let data = pattern(seed * 1000 + step + 5, rng.random_range(1..32) * unit);
                direct.write_at(&AlignedBuf::from_slice(&data), pos as u64).unwrap();
                if model.len() < pos + data.len() {
                    model.resize(pos + data.len(), 0);
                }
                model[pos..pos + data.len()].copy_from_slice(&data);
            }
            38..=69 => {
                let mode = random_mode(&mut rng);
                let aligned =
                    matches!(mode, FallocateMode::CollapseRange | FallocateMode::InsertRange);
                let (offset, length) = if aligned {
                    let blocks = (model.len() / block).max(1);
                    let offset = rng.random_range(0..blocks) * block;
                    (offset, rng.random_range(1..=4) * block)
                } else {
                    (rng.random_range(0..FILE_BYTES_MAX as usize), rng.random_range(1..100_000))
                };
                let result = file.fallocate(mode, offset as u64, length as u64);
                let allowed = match mode {
                    FallocateMode::CollapseRange => offset + length < model.len(),
                    FallocateMode::InsertRange => offset < model.len(),
                    _ => true,
                };
                match result {
                    Ok(()) => {
                        assert!(allowed, "{context}: {mode:?} {offset}+{length} should fail");
                        apply_to_model(&mut model, mode, offset, length);
                    }
                    Err(error) => {
                        assert!(!allowed, "{context}: {mode:?} {offset}+{length}: {error}");
                        assert_eq!(error.errno(), libc::EINVAL, "{context}: {error}");
                    }
                }
            }
            70..=74 => {
                let size = rng.random_range(0..FILE_BYTES_MAX as usize);
                file.set_len(size as u64).unwrap();
                model.resize(size, 0);
            }
            75..=79 => file.sync_all().unwrap(),
            80..=89 => {
                let pos = rng.random_range(0..model.len().max(1));
                let mut buffer = vec![0xEE; rng.random_range(1..200_000)];
                let read = file.read_at(&mut buffer, pos as u64).unwrap();
                let expected = model.get(pos..(pos + buffer.len()).min(model.len())).unwrap_or(&[]);
                assert!(buffer[..read] == *expected, "{context}: read at {pos}");
            }
            _ => {
                let pos = rng.random_range(0..model.len().max(1) + 10) as u64;
                let size = model.len() as u64;
                for (whence, found) in
                    [("data", file.seek_data(pos)), ("hole", file.seek_hole(pos))]
                {
                    match found {
                        Err(error) => {
                            assert_eq!(
                                error.errno(),
                                libc::ENXIO,
                                "{context}: seek {whence} {pos}"
                            );
                            assert!(
                                pos >= size || whence == "data",
                                "{context}: seek {whence} {pos}"
                            );
                        }
                        Ok(at) => {
                            assert!(
                                pos < size && at >= pos && at <= size,
                                "{context}: {whence} {pos} -> {at}"
                            );
                            // What SEEK_DATA skips, and the block SEEK_HOLE
                            // lands in, read as zeros.
                            let zeros = if whence == "data" {
                                pos as usize..at as usize
                            } else {
                                at as usize..(at as usize + 1).min(size as usize)
                            };
                            assert!(
                                model[zeros.clone()].iter().all(|&byte| byte == 0),
                                "{context}: seek {whence} {pos} -> {at}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(
            volume.inodes().getattr(ino).unwrap().size,
            model.len() as u64,
            "{context}: size"
        );
    }
    file.sync_all().unwrap();
    let extents = volume.inodes().fiemap(ino).unwrap();
    assert!(
        extents.iter().all(|extent| extent.kind != MapKind::Delalloc),
        "seed {seed}: delalloc after fsync"
    );
    drop((file, direct));
    volume.close().unwrap();
    let (_, reopened) = open_image_with(device.image(), &options).unwrap();
    let size = reopened.inodes().getattr(ino).unwrap().size as usize;
    let mut content = vec![0; size];
    let handle = reopened.inodes().open_file(ino, OpenFlags::READ).unwrap();
    assert_eq!(handle.read_at(&mut content, 0).unwrap(), size);
    assert!(content == model, "seed {seed}, block {block_bytes}: content after remount");
    let report = foliofs::fsck::check(reopened.device().clone());
    assert!(report.is_clean(), "seed {seed}: fsck {:?}", report.problems);
}

/// Two seeds on each block size.
fn fallocate_modes_match_a_model(block_bytes: u32) {
    let seeds: &[u64] = match block_bytes {
        1024 => &[1, 5],
        4096 => &[2, 4],
        _ => &[3, 6],
    };
    for &seed in seeds {
        model_check(seed, block_bytes);
    }
}

fn preallocation_reads_zeros_and_keeps_space_promised(block_bytes: u32) {
    let block = u64::from(block_bytes);
    let (_device, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let ino = volume.inodes().create(ROOT, b"p", 0o644, owner()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let free_before = volume.statfs().free_blocks;
    let promised = (1 << 20) / block;
    file.fallocate(FallocateMode::Allocate { keep_size: true }, 0, 1 << 20).unwrap();
    assert_eq!(volume.inodes().getattr(ino).unwrap().size, 0, "KEEP_SIZE");
    assert_eq!(free_before - volume.statfs().free_blocks, promised);
    let extents = volume.inodes().fiemap(ino).unwrap();
    assert_eq!(extents.len(), 1);
    assert_eq!((extents[0].kind, extents[0].length), (MapKind::Unwritten, 1 << 20));
    // A write of block 2 into preallocated space needs no new blocks, and
    // the rest still reads as zeros.
    file.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 1 << 20).unwrap();
    let (at, length) = (2 * block as usize, block as usize);
    file.write_at(&vec![7; length], at as u64).unwrap();
    file.sync_all().unwrap();
    assert_eq!(free_before - volume.statfs().free_blocks, promised);
    let mut back = vec![1; 4 * length];
    file.read_at(&mut back, 0).unwrap();
    assert!(
        back[..at].iter().all(|&byte| byte == 0)
            && back[at..at + length].iter().all(|&byte| byte == 7)
            && back[at + length..].iter().all(|&byte| byte == 0)
    );
    // SEEK_DATA finds the written block inside the Unwritten extent.
    assert_eq!(file.seek_data(0).unwrap(), at as u64);
    assert_eq!(file.seek_hole(at as u64).unwrap(), (at + length) as u64);
    // More than the volume has: ENOSPC, and nothing changed.
    let error =
        file.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 64 << 20).unwrap_err();
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    assert_eq!(volume.inodes().getattr(ino).unwrap().size, 1 << 20);
    assert_eq!(free_before - volume.statfs().free_blocks, promised);
    // A zero range that does not fit starts inside the written block: the
    // shortage is found before its partial block is zeroed.
    let zero = FallocateMode::ZeroRange { keep_size: false };
    let error = file.fallocate(zero, at as u64 + 1, 64 << 20).unwrap_err();
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    assert_eq!(volume.inodes().getattr(ino).unwrap().size, 1 << 20);
    let mut block_two = vec![0; length];
    file.read_at(&mut block_two, at as u64).unwrap();
    assert!(block_two.iter().all(|&byte| byte == 7), "a refused zero range changed data");
}

fn punching_frees_blocks_and_bad_arguments_are_refused(block_bytes: u32) {
    let block = u64::from(block_bytes);
    let (_device, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let ino = volume.inodes().create(ROOT, b"h", 0o644, owner()).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&pattern(3, 1 << 20), 0).unwrap();
    file.sync_all().unwrap();
    let free_before = volume.statfs().free_blocks;
    file.fallocate(FallocateMode::PunchHole, 10_000, 500_000).unwrap();
    volume.sync().unwrap();
    let freed = volume.statfs().free_blocks - free_before;
    // The whole blocks inside 10_000..510_000 (3..124 on 4 KiB blocks) are
    // freed; the partial blocks at the edges keep their data outside it.
    let (first, last) = (10_000u64.div_ceil(block), 510_000 / block);
    assert_eq!(freed, last - first, "whole blocks freed");
    assert_eq!(file.seek_hole(0).unwrap(), first * block);
    assert_eq!(file.seek_data(first * block).unwrap(), last * block);
    let mut edges = vec![0xEE; 510_000 - 10_000 + 200];
    file.read_at(&mut edges, 10_000 - 100).unwrap();
    let original = pattern(3, 1 << 20);
    assert_eq!(edges[..100], original[9_900..10_000]);
    assert!(edges[100..edges.len() - 100].iter().all(|&byte| byte == 0), "the range reads zeros");
    assert_eq!(edges[edges.len() - 100..], original[510_000..510_100]);
    let cases = [
        (FallocateMode::CollapseRange, 1000, block, "multiples of the block size"),
        (FallocateMode::CollapseRange, 0, 1 << 20, "before the end of file"),
        (FallocateMode::InsertRange, 1 << 20, block, "before the end of file"),
        (FallocateMode::PunchHole, 0, 0, "length 0"),
    ];
    for (mode, offset, length, expected) in cases {
        let error = file.fallocate(mode, offset, length).unwrap_err();
        assert_eq!(error.errno(), libc::EINVAL, "{mode:?}");
        assert!(error.to_string().contains(expected), "{mode:?}: {error}");
    }
    let error = file
        .fallocate(FallocateMode::Allocate { keep_size: false }, u64::MAX - 10, 100)
        .unwrap_err();
    assert_eq!(error.errno(), libc::EFBIG, "{error}");
    assert!(
        FallocateMode::from_flags(libc::FALLOC_FL_PUNCH_HOLE).is_err(),
        "punch needs KEEP_SIZE"
    );
    assert_eq!(file.seek_data(1 << 20).unwrap_err().errno(), libc::ENXIO);
    let read_only = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let error = read_only.fallocate(FallocateMode::PunchHole, 0, block).unwrap_err();
    assert_eq!(error.errno(), libc::EBADF);
}
