//! The direct I/O path: alignment rules, concurrent sub-block writes checked
//! against a model, coherence with the simple path, O_DSYNC request counts,
//! and deep asynchronous queues.

mod common;

use std::sync::Arc;

use foliofs::completion::block_on;
use foliofs::dev::AlignedBuf;
use foliofs::options::DioUnaligned;
use foliofs::vfs::MkfsOptions;
use foliofs::{OpenFlags, Volume, VolumeOptions};

use common::{new_volume, open_image, owner, pattern, ROOT};

const SECTOR: usize = 512;
const DIRECT_RW: OpenFlags = OpenFlags {
    read: true,
    write: true,
    truncate: false,
    append: false,
    direct: true,
    dsync: false,
};

fn aligned(data: &[u8]) -> AlignedBuf {
    AlignedBuf::from_slice(data)
}

fn read_all(volume: &Volume, ino: u64) -> Vec<u8> {
    let size = volume.getattr(ino).unwrap().size as usize;
    let mut buffer = AlignedBuf::zeroed(size.div_ceil(SECTOR) * SECTOR);
    let file = volume.open_file(ino, DIRECT_RW).unwrap();
    assert_eq!(file.read_at(&mut buffer, 0).unwrap(), size);
    buffer[..size].to_vec()
}

/// A volume on a real image file, so the engine's own threads complete I/O.
fn file_volume(dir: &tempfile::TempDir, engine: &str, dio_unaligned: DioUnaligned) -> Volume {
    let path = dir.path().join("vol.img");
    let options = VolumeOptions {
        commit_interval_ms: 0,
        dio_unaligned,
        ..VolumeOptions::parse(&format!("engine={engine}")).unwrap()
    };
    if !path.exists() {
        // Garbage, not zeros: a block whose zeroing was skipped shows it.
        std::fs::write(&path, vec![common::GARBAGE_BYTE; 64 << 20]).unwrap();
        let mkfs = MkfsOptions { block_bytes: 4096, ..MkfsOptions::default() };
        Volume::mkfs_path(&path, None, &mkfs, &options).unwrap();
    }
    Volume::open(&path, &options).unwrap()
}

#[test]
fn misaligned_direct_io_is_einval_and_changes_nothing() {
    let (_, volume) = new_volume(32 << 20, 4096);
    let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
    let file = volume.open_file(attr.ino, DIRECT_RW).unwrap();
    let buffer = AlignedBuf::zeroed(8192);
    for (pos, range) in [(100u64, 0..512), (0, 0..100), (0, 1..513)] {
        let error = file.write_at(&buffer[range.clone()], pos).unwrap_err();
        assert_eq!(error.errno(), libc::EINVAL, "{pos} {range:?}");
        assert!(error.to_string().contains("not a multiple"), "{error}");
    }
    let mut read_buffer = AlignedBuf::zeroed(1024);
    assert_eq!(file.read_at(&mut read_buffer[1..513], 0).unwrap_err().errno(), libc::EINVAL);
    let (_, result) = block_on(file.write_at_async(AlignedBuf::zeroed(100), 0));
    assert_eq!(result.unwrap_err().errno(), libc::EINVAL);
    assert_eq!(volume.getattr(attr.ino).unwrap().size, 0, "nothing was written");
}

/// Threads that each own some sectors write them over and over; at the end
/// every sector holds its owner's last write and nothing else was lost.
fn concurrent_sector_writers(
    volume: &Arc<Volume>,
    ino: u64,
    sectors: usize,
    threads: usize,
    rounds: usize,
) -> Vec<u8> {
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let volume = Arc::clone(volume);
            std::thread::spawn(move || {
                let file = volume.open_file(ino, DIRECT_RW).unwrap();
                for round in 0..rounds {
                    for sector in (thread..sectors).step_by(threads) {
                        let data = aligned(&pattern((sector * 1000 + round) as u64, SECTOR));
                        assert_eq!(file.write_at(&data, (sector * SECTOR) as u64).unwrap(), SECTOR);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    (0..sectors).flat_map(|sector| pattern((sector * 1000 + rounds - 1) as u64, SECTOR)).collect()
}

#[test]
fn concurrent_sub_block_overwrites_of_one_block_lose_nothing() {
    for policy in [DioUnaligned::Overwrite, DioUnaligned::Exclusive] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let volume = Arc::new(file_volume(&dir, "uring", policy));
        let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
        let file = volume.open_file(attr.ino, DIRECT_RW).unwrap();
        file.write_at(&AlignedBuf::zeroed(8192), 0).unwrap();
        let expected = concurrent_sector_writers(&volume, attr.ino, 8, 8, 50);
        assert_eq!(read_all(&volume, attr.ino)[..4096], expected[..], "{policy:?}");
    }
}

#[test]
fn concurrent_sub_block_writes_into_holes_zero_the_rest_once() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = Arc::new(file_volume(&dir, "uring", DioUnaligned::Overwrite));
    let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
    volume.open_file(attr.ino, DIRECT_RW).unwrap().set_len(64 << 10).unwrap();
    // 16 blocks of holes inside EOF; threads write every other sector, so the
    // zeroing of the first write into each block must not eat a neighbour's.
    let sectors = 128;
    let workers: Vec<_> = (0..8)
        .map(|thread| {
            let volume = Arc::clone(&volume);
            std::thread::spawn(move || {
                let file = volume.open_file(attr.ino, DIRECT_RW).unwrap();
                for sector in (thread * 2..sectors).step_by(16) {
                    let data = aligned(&pattern(sector as u64, SECTOR));
                    file.write_at(&data, (sector * SECTOR) as u64).unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let content = read_all(&volume, attr.ino);
    for sector in 0..sectors {
        let got = &content[sector * SECTOR..(sector + 1) * SECTOR];
        if sector % 2 == 0 {
            assert_eq!(got, &pattern(sector as u64, SECTOR)[..], "sector {sector} lost its data");
        } else {
            assert!(got.iter().all(|&byte| byte == 0), "sector {sector} is not zero");
        }
    }
}

#[test]
fn concurrent_extending_sub_block_writes_lose_nothing() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = Arc::new(file_volume(&dir, "threads", DioUnaligned::Overwrite));
    let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
    let expected = concurrent_sector_writers(&volume, attr.ino, 96, 6, 1);
    assert_eq!(volume.getattr(attr.ino).unwrap().size, 96 * SECTOR as u64);
    assert_eq!(read_all(&volume, attr.ino), expected);
    let path = dir.path().join("vol.img");
    drop(volume);
    let reopened = Volume::open(&path, &VolumeOptions::default()).unwrap();
    assert_eq!(read_all(&reopened, attr.ino), expected, "after reopening");
}

#[test]
fn direct_and_simple_paths_see_each_others_writes() {
    let (_, volume) = new_volume(32 << 20, 4096);
    let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
    let plain = volume.open_file(attr.ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.open_file(attr.ino, DIRECT_RW).unwrap();
    plain.write_at(&pattern(1, 10_000), 0).unwrap();
    let mut buffer = AlignedBuf::zeroed(10_240);
    assert_eq!(direct.read_at(&mut buffer, 0).unwrap(), 10_000);
    assert_eq!(&buffer[..10_000], &pattern(1, 10_000)[..]);
    direct.write_at(&aligned(&pattern(2, 1024)), 2048).unwrap();
    let mut back = vec![0u8; 10_000];
    plain.read_at(&mut back, 0).unwrap();
    assert_eq!(&back[2048..3072], &pattern(2, 1024)[..]);
    assert_eq!(&back[..2048], &pattern(1, 10_000)[..2048]);
    assert_eq!(&back[3072..], &pattern(1, 10_000)[3072..]);
}

#[test]
fn dsync_overwrite_is_one_fua_write_native_and_write_plus_flush_emulated() {
    for (fua, expected_requests, expected_fua, expected_flushes) in
        [("native", 1, 1, 0), ("emulate", 2, 0, 1)]
    {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let volume = file_volume(&dir, "uring", DioUnaligned::Overwrite);
        drop(volume);
        let options = VolumeOptions {
            commit_interval_ms: 0,
            ..VolumeOptions::parse(&format!("fua={fua}")).unwrap()
        };
        let volume = Volume::open(&dir.path().join("vol.img"), &options).unwrap();
        let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
        let file = volume.open_file(attr.ino, DIRECT_RW).unwrap();
        file.write_at(&AlignedBuf::zeroed(65536), 0).unwrap();
        volume.sync().unwrap();
        let dsync = volume.open_file(attr.ino, DIRECT_RW.with_dsync()).unwrap();
        for (pos, length) in [(0u64, 4096usize), (8192, 2048), (512, 512)] {
            let before = volume.device().stats();
            dsync.write_at(&aligned(&pattern(pos, length)), pos).unwrap();
            let delta = volume.device().stats().since(&before);
            assert_eq!(
                (delta.requests(), delta.fua_writes, delta.flush_requests),
                (expected_requests, expected_fua, expected_flushes),
                "fua={fua} write {pos}+{length}"
            );
        }
    }
}

#[test]
fn dsync_write_into_a_hole_survives_a_crash_right_after_it() {
    let (device, volume) = new_volume(32 << 20, 4096);
    let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
    volume.sync().unwrap();
    let file = volume.open_file(attr.ino, DIRECT_RW.with_dsync()).unwrap();
    for (pos, length) in [(0u64, 8192usize), (16384, 2048), (40960, 512)] {
        file.write_at(&aligned(&pattern(pos, length)), pos).unwrap();
        let image = device.crash_image(device.log_len(), &|_| foliofs::dev::fault::Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let content = read_all(&recovered, attr.ino);
        assert_eq!(&content[pos as usize..pos as usize + length], &pattern(pos, length)[..]);
    }
}

#[test]
fn hundreds_of_async_requests_in_flight_from_one_thread() {
    for engine in ["uring", "threads", "sync"] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let volume = file_volume(&dir, engine, DioUnaligned::Overwrite);
        let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
        let file = volume.open_file(attr.ino, DIRECT_RW).unwrap();
        file.write_at(&AlignedBuf::zeroed(256 * 4096), 0).unwrap();
        let writes: Vec<_> = (0..256u64)
            .map(|index| file.write_at_async(aligned(&pattern(index, 2048)), index * 4096 + 1024))
            .collect();
        for future in writes {
            assert_eq!(block_on(future).1.unwrap(), 2048, "{engine}");
        }
        let reads: Vec<_> = (0..256u64)
            .map(|index| file.read_at_async(AlignedBuf::zeroed(4096), index * 4096))
            .collect();
        for (index, future) in reads.into_iter().enumerate() {
            let (buffer, result) = block_on(future);
            assert_eq!(result.unwrap(), 4096);
            assert_eq!(
                &buffer[1024..3072],
                &pattern(index as u64, 2048)[..],
                "{engine} block {index}"
            );
            assert!(buffer[..1024].iter().chain(&buffer[3072..]).all(|&byte| byte == 0));
        }
    }
}

#[test]
fn async_writes_into_holes_and_past_eof_complete_and_persist() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = file_volume(&dir, "uring", DioUnaligned::Overwrite);
    let attr = volume.create(ROOT, b"f", 0o644, owner()).unwrap();
    let file = volume.open_file(attr.ino, DIRECT_RW).unwrap();
    file.set_len(1 << 20).unwrap();
    let in_holes: Vec<_> = (0..64u64)
        .map(|index| file.write_at_async(aligned(&pattern(index, 8192)), index * 16384))
        .collect();
    for future in in_holes {
        block_on(future).1.unwrap();
    }
    let (_, extended) = block_on(file.write_at_async(aligned(&pattern(99, 1536)), (1 << 20) + 512));
    extended.unwrap();
    assert_eq!(volume.getattr(attr.ino).unwrap().size, (1 << 20) + 2048);
    let content = read_all(&volume, attr.ino);
    for index in 0..64usize {
        assert_eq!(&content[index * 16384..index * 16384 + 8192], &pattern(index as u64, 8192)[..]);
        assert!(content[index * 16384 + 8192..(index + 1) * 16384].iter().all(|&byte| byte == 0));
    }
    assert!(content[1 << 20..(1 << 20) + 512].iter().all(|&byte| byte == 0));
    assert_eq!(&content[(1 << 20) + 512..], &pattern(99, 1536)[..]);
}
