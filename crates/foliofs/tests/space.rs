//! Space management: every fallocate mode against a model, mixed with
//! buffered and direct writes, truncates and reads, on 1 KiB, 4 KiB and
//! 64 KiB blocks; SEEK_DATA / SEEK_HOLE; fiemap after fsync; bad arguments.

mod common;

use foliofs::dev::AlignedBuf;
use foliofs::iomap::MapKind;
use foliofs::space::FallocateMode;
use foliofs::{OpenFlags, VolumeOptions};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{
    apply_fallocate_to_model as apply_to_model, new_volume_with_options, open_image_with, owner,
    pattern, ROOT,
};

const FILE_BYTES_MAX: u64 = 1 << 20;

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
    let ino = volume.create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let file = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
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
                let pos = rng.random_range(0..FILE_BYTES_MAX as usize / 512) * 512;
                let data = pattern(seed * 1000 + step + 5, rng.random_range(1..32) * 512);
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
            75..=79 => file.fsync().unwrap(),
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
        assert_eq!(volume.getattr(ino).unwrap().size, model.len() as u64, "{context}: size");
    }
    file.fsync().unwrap();
    let extents = volume.fiemap(ino).unwrap();
    assert!(
        extents.iter().all(|extent| extent.kind != MapKind::Delalloc),
        "seed {seed}: delalloc after fsync"
    );
    drop((file, direct));
    volume.close().unwrap();
    let (_, reopened) = open_image_with(device.image(), &options).unwrap();
    let size = reopened.getattr(ino).unwrap().size as usize;
    let mut content = vec![0; size];
    let handle = reopened.open_file(ino, OpenFlags::READ).unwrap();
    assert_eq!(handle.read_at(&mut content, 0).unwrap(), size);
    assert!(content == model, "seed {seed}, block {block_bytes}: content after remount");
    let report = foliofs::fsck::check(reopened.device().clone());
    assert!(report.is_clean(), "seed {seed}: fsck {:?}", report.problems);
}

#[test]
fn fallocate_modes_match_a_model_on_every_block_size() {
    for (seed, block_bytes) in [(1, 1024), (2, 4096), (3, 65536), (4, 4096), (5, 1024)] {
        model_check(seed, block_bytes);
    }
}

#[test]
fn preallocation_reads_zeros_and_keeps_space_promised() {
    let (_device, volume) = new_volume_with_options(16 << 20, 4096, None, &options());
    let ino = volume.create(ROOT, b"p", 0o644, owner()).unwrap().ino;
    let file = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let free_before = volume.statfs().free_blocks;
    file.fallocate(FallocateMode::Allocate { keep_size: true }, 0, 1 << 20).unwrap();
    assert_eq!(volume.getattr(ino).unwrap().size, 0, "KEEP_SIZE");
    assert_eq!(free_before - volume.statfs().free_blocks, 256);
    let extents = volume.fiemap(ino).unwrap();
    assert_eq!(extents.len(), 1);
    assert_eq!((extents[0].kind, extents[0].length), (MapKind::Unwritten, 1 << 20));
    // A write into preallocated space needs no new blocks, and the rest
    // still reads as zeros.
    file.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 1 << 20).unwrap();
    file.write_at(&[7; 4096], 8192).unwrap();
    file.fsync().unwrap();
    assert_eq!(free_before - volume.statfs().free_blocks, 256);
    let mut back = vec![1; 16384];
    file.read_at(&mut back, 0).unwrap();
    assert!(
        back[..8192].iter().all(|&byte| byte == 0)
            && back[8192..12288].iter().all(|&byte| byte == 7)
    );
    // SEEK_DATA finds the written block inside the Unwritten extent.
    assert_eq!(file.seek_data(0).unwrap(), 8192);
    assert_eq!(file.seek_hole(8192).unwrap(), 12288);
    // More than the volume has: ENOSPC, and nothing changed.
    let error =
        file.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 64 << 20).unwrap_err();
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    assert_eq!(volume.getattr(ino).unwrap().size, 1 << 20);
    assert_eq!(free_before - volume.statfs().free_blocks, 256);
}

#[test]
fn punching_frees_blocks_and_bad_arguments_are_refused() {
    let (_device, volume) = new_volume_with_options(16 << 20, 4096, None, &options());
    let ino = volume.create(ROOT, b"h", 0o644, owner()).unwrap().ino;
    let file = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&pattern(3, 1 << 20), 0).unwrap();
    file.fsync().unwrap();
    let free_before = volume.statfs().free_blocks;
    file.fallocate(FallocateMode::PunchHole, 10_000, 500_000).unwrap();
    volume.sync().unwrap();
    let freed = volume.statfs().free_blocks - free_before;
    assert_eq!(freed, (510_000 / 4096) - (10_000u64.div_ceil(4096)), "whole blocks freed");
    assert_eq!(file.seek_hole(0).unwrap(), 12288);
    // Blocks 3..124 are gone; block 124 keeps data after the zeroed part.
    assert_eq!(file.seek_data(12288).unwrap(), 124 * 4096);
    let cases = [
        (FallocateMode::CollapseRange, 1000, 4096, "multiples of the block size"),
        (FallocateMode::CollapseRange, 0, 1 << 20, "before the end of file"),
        (FallocateMode::InsertRange, 1 << 20, 4096, "before the end of file"),
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
    let read_only = volume.open_file(ino, OpenFlags::READ).unwrap();
    let error = read_only.fallocate(FallocateMode::PunchHole, 0, 4096).unwrap_err();
    assert_eq!(error.errno(), libc::EBADF);
}
