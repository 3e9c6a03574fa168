//! The direct I/O path: alignment rules, concurrent sub-block writes checked
//! against a model, coherence with the simple path, O_DSYNC request counts,
//! and deep asynchronous queues, each on 1 KiB, 4 KiB and 64 KiB blocks.
//! Sub-block writes are 512-byte sectors below 64 KiB blocks and 4 KiB
//! pieces on 64 KiB blocks (`common::direct_unit`).

#[macro_use]
mod common;

use std::collections::VecDeque;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use foliofs::block_on;
use foliofs::dev::AlignedBuf;
use foliofs::options::DioUnaligned;
use foliofs::vfs::MkfsOptions;
use foliofs::MapKind;
use foliofs::{FallocateMode, OpenFlags, Volume, VolumeOptions};

use common::{direct_unit, new_volume, open_image, owner, pattern, ROOT};

const SECTOR: usize = 512;
const DIRECT_RW: OpenFlags = OpenFlags {
    read: true,
    write: true,
    truncate: false,
    append: false,
    direct: true,
    dsync: false,
    drop_behind: false,
};

fn aligned(data: &[u8]) -> AlignedBuf {
    AlignedBuf::from_slice(data)
}

fn read_all(volume: &Volume, ino: u64) -> Vec<u8> {
    let size = volume.inodes().getattr(ino).unwrap().size as usize;
    let mut buffer = AlignedBuf::zeroed(size.div_ceil(SECTOR) * SECTOR);
    let file = volume.inodes().open_file(ino, DIRECT_RW).unwrap();
    assert_eq!(file.read_at(&mut buffer, 0).unwrap(), size);
    buffer[..size].to_vec()
}

block_size_tests!(
    misaligned_direct_io_is_einval_and_changes_nothing,
    concurrent_sub_block_overwrites_of_one_block_lose_nothing,
    concurrent_sub_block_writes_into_holes_zero_the_rest_once,
    concurrent_extending_sub_block_writes_lose_nothing,
    direct_and_simple_paths_see_each_others_writes,
    dsync_overwrite_is_one_fua_write_native_and_write_plus_flush_emulated,
    dsync_write_into_a_hole_survives_a_crash_right_after_it,
    hundreds_of_async_requests_in_flight_from_one_thread,
    async_writes_into_holes_and_past_eof_complete_and_persist,
    async_queue_mixing_writes_into_holes_and_overwrites_never_waits_on_itself,
    buffered_read_after_a_direct_write_sees_it_despite_racing_readers,
);

/// A volume on a real image file, so the engine's own threads complete I/O.
fn file_volume(
    dir: &tempfile::TempDir,
    engine: &str,
    dio_unaligned: DioUnaligned,
    block_bytes: u32,
) -> Volume {
    let path = dir.path().join("vol.img");
    let options = VolumeOptions {
        commit_interval_ms: 0,
        dio_unaligned,
        ..VolumeOptions::parse(&format!("engine={engine}")).unwrap()
    };
    if !path.exists() {
        // Garbage, not zeros: a block whose zeroing was skipped shows it.
        std::fs::write(&path, vec![common::GARBAGE_BYTE; 64 << 20]).unwrap();
        let mkfs = MkfsOptions { block_bytes, ..MkfsOptions::default() };
        Volume::mkfs_path(&path, None, &mkfs, &options).unwrap();
    }
    Volume::open(&path, &options).unwrap()
}

/// The rule is the device's sector, whatever the block size.
fn misaligned_direct_io_is_einval_and_changes_nothing(block_bytes: u32) {
    let (_, volume) = new_volume(32 << 20, block_bytes);
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
    let buffer = AlignedBuf::zeroed(8192);
    for (pos, range) in [(100u64, 0..512), (0, 0..100), (0, 1..513)] {
        let error = file.write_at(&buffer[range.clone()], pos).unwrap_err();
        assert_eq!(error.errno(), libc::EINVAL, "{pos} {range:?}");
        assert!(error.to_string().contains("not a multiple"), "{error}");
    }
    let mut read_buffer = AlignedBuf::zeroed(1024);
    assert_eq!(file.read_at(&mut read_buffer[1..513], 0).unwrap_err().errno(), libc::EINVAL);
    let (result, _) = block_on(file.write_at_async(AlignedBuf::zeroed(100), 0));
    assert_eq!(result.unwrap_err().errno(), libc::EINVAL);
    // A range that would end past u64::MAX: EFBIG, blocking or not.
    let last_sector = u64::MAX - 511;
    assert_eq!(file.write_at(&buffer[..1024], last_sector).unwrap_err().errno(), libc::EFBIG);
    let (result, _) = block_on(file.write_at_async(AlignedBuf::zeroed(1024), last_sector));
    assert_eq!(result.unwrap_err().errno(), libc::EFBIG);
    assert_eq!(volume.inodes().getattr(attr.ino).unwrap().size, 0, "nothing was written");
}

/// Threads that each own some `unit`-sized pieces write them over and over;
/// at the end every piece holds its owner's last write and nothing else was
/// lost.
fn concurrent_piece_writers(
    volume: &Arc<Volume>,
    ino: u64,
    (unit, pieces): (usize, usize),
    threads: usize,
    rounds: usize,
) -> Vec<u8> {
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let volume = Arc::clone(volume);
            std::thread::spawn(move || {
                let file = volume.inodes().open_file(ino, DIRECT_RW).unwrap();
                for round in 0..rounds {
                    for piece in (thread..pieces).step_by(threads) {
                        let data = aligned(&pattern((piece * 1000 + round) as u64, unit));
                        assert_eq!(file.write_at(&data, (piece * unit) as u64).unwrap(), unit);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    (0..pieces).flat_map(|piece| pattern((piece * 1000 + rounds - 1) as u64, unit)).collect()
}

/// Eight threads over the pieces of one block (at least eight pieces: four
/// blocks of two sectors each on 1 KiB blocks).
fn concurrent_sub_block_overwrites_of_one_block_lose_nothing(block_bytes: u32) {
    let unit = direct_unit(block_bytes);
    let pieces = (block_bytes as usize / unit).max(8);
    for policy in [DioUnaligned::Overwrite, DioUnaligned::Exclusive] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let volume = Arc::new(file_volume(&dir, "uring", policy, block_bytes));
        let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
        let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
        file.write_at(&AlignedBuf::zeroed(2 * pieces * unit), 0).unwrap();
        let expected = concurrent_piece_writers(&volume, attr.ino, (unit, pieces), 8, 50);
        assert_eq!(read_all(&volume, attr.ino)[..pieces * unit], expected[..], "{policy:?}");
    }
}

fn concurrent_sub_block_writes_into_holes_zero_the_rest_once(block_bytes: u32) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = Arc::new(file_volume(&dir, "uring", DioUnaligned::Overwrite, block_bytes));
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let block = block_bytes as usize;
    volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap().set_len(16 * block as u64).unwrap();
    // 16 blocks of holes inside EOF; threads write every other piece, so the
    // zeroing of the first write into each block must not eat a neighbour's.
    let unit = direct_unit(block_bytes);
    let pieces = 16 * block / unit;
    let workers: Vec<_> = (0..8)
        .map(|thread| {
            let volume = Arc::clone(&volume);
            std::thread::spawn(move || {
                let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
                for piece in (thread * 2..pieces).step_by(16) {
                    let data = aligned(&pattern(piece as u64, unit));
                    file.write_at(&data, (piece * unit) as u64).unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let content = read_all(&volume, attr.ino);
    for piece in 0..pieces {
        let got = &content[piece * unit..(piece + 1) * unit];
        if piece % 2 == 0 {
            assert_eq!(got, &pattern(piece as u64, unit)[..], "piece {piece} lost its data");
        } else {
            assert!(got.iter().all(|&byte| byte == 0), "piece {piece} is not zero");
        }
    }
}

fn concurrent_extending_sub_block_writes_lose_nothing(block_bytes: u32) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = Arc::new(file_volume(&dir, "threads", DioUnaligned::Overwrite, block_bytes));
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let unit = direct_unit(block_bytes);
    let expected = concurrent_piece_writers(&volume, attr.ino, (unit, 96), 6, 1);
    assert_eq!(volume.inodes().getattr(attr.ino).unwrap().size, 96 * unit as u64);
    assert_eq!(read_all(&volume, attr.ino), expected);
    let path = dir.path().join("vol.img");
    drop(volume);
    let reopened = Volume::open(&path, &VolumeOptions::default()).unwrap();
    assert_eq!(read_all(&reopened, attr.ino), expected, "after reopening");
}

/// A file of two and a half blocks; the direct write starts and ends inside
/// blocks (and crosses one boundary on 1 KiB blocks).
fn direct_and_simple_paths_see_each_others_writes(block_bytes: u32) {
    let (_, volume) = new_volume(32 << 20, block_bytes);
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let plain = volume.inodes().open_file(attr.ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
    let size = (10_000usize).max(2 * block_bytes as usize + block_bytes as usize / 2 + 100);
    let original = pattern(1, size);
    plain.write_at(&original, 0).unwrap();
    let mut buffer = AlignedBuf::zeroed(size.div_ceil(SECTOR) * SECTOR);
    assert_eq!(direct.read_at(&mut buffer, 0).unwrap(), size);
    assert_eq!(&buffer[..size], &original[..]);
    let unit = direct_unit(block_bytes);
    let (pos, length) = (block_bytes as usize + unit, 2 * unit);
    direct.write_at(&aligned(&pattern(2, length)), pos as u64).unwrap();
    let mut back = vec![0u8; size];
    plain.read_at(&mut back, 0).unwrap();
    assert_eq!(&back[pos..pos + length], &pattern(2, length)[..]);
    assert_eq!(&back[..pos], &original[..pos]);
    assert_eq!(&back[pos + length..], &original[pos + length..]);
}

/// Overwrites of written blocks, whole and sub-block, are one request each.
fn dsync_overwrite_is_one_fua_write_native_and_write_plus_flush_emulated(block_bytes: u32) {
    let unit = direct_unit(block_bytes) as u64;
    let writes = [(0u64, 8 * unit), (16 * unit, 4 * unit), (unit, unit)];
    let file_bytes = writes.iter().map(|(pos, length)| pos + length).max().unwrap();
    let file_bytes = file_bytes.next_multiple_of(u64::from(block_bytes));
    for (fua, expected_requests, expected_fua, expected_flushes) in
        [("native", 1, 1, 0), ("emulate", 2, 0, 1)]
    {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let volume = file_volume(&dir, "uring", DioUnaligned::Overwrite, block_bytes);
        drop(volume);
        let options = VolumeOptions {
            commit_interval_ms: 0,
            ..VolumeOptions::parse(&format!("fua={fua}")).unwrap()
        };
        let volume = Volume::open(&dir.path().join("vol.img"), &options).unwrap();
        let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
        let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
        file.write_at(&AlignedBuf::zeroed(file_bytes as usize), 0).unwrap();
        volume.sync().unwrap();
        let dsync = volume.inodes().open_file(attr.ino, DIRECT_RW.with_dsync()).unwrap();
        for (pos, length) in writes {
            let before = volume.device().stats();
            dsync.write_at(&aligned(&pattern(pos, length as usize)), pos).unwrap();
            let delta = volume.device().stats().since(&before);
            assert_eq!(
                (delta.requests(), delta.fua_writes, delta.flush_requests),
                (expected_requests, expected_fua, expected_flushes),
                "fua={fua} write {pos}+{length}"
            );
        }
    }
}

fn dsync_write_into_a_hole_survives_a_crash_right_after_it(block_bytes: u32) {
    let (device, volume) = new_volume(32 << 20, block_bytes);
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    volume.sync().unwrap();
    let file = volume.inodes().open_file(attr.ino, DIRECT_RW.with_dsync()).unwrap();
    let unit = direct_unit(block_bytes);
    for (pos, length) in [(0, 16 * unit), (32 * unit as u64, 4 * unit), (80 * unit as u64, unit)] {
        file.write_at(&aligned(&pattern(pos, length)), pos).unwrap();
        let image = device.crash_image(device.log_len(), &|_| foliofs::dev::fault::Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let content = read_all(&recovered, attr.ino);
        assert_eq!(&content[pos as usize..pos as usize + length], &pattern(pos, length)[..]);
    }
}

/// 256 sub-block overwrites in flight, one in the middle of each slot of
/// `slot` bytes (4 KiB; two blocks on 1 KiB blocks, one block on 64 KiB),
/// then 256 reads of whole slots.
fn hundreds_of_async_requests_in_flight_from_one_thread(block_bytes: u32) {
    let slot = (block_bytes as usize).max(4 * direct_unit(block_bytes));
    let (start, length) = (slot / 4, slot / 2);
    for engine in ["uring", "threads", "sync"] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let volume = file_volume(&dir, engine, DioUnaligned::Overwrite, block_bytes);
        let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
        let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
        file.write_at(&AlignedBuf::zeroed(256 * slot), 0).unwrap();
        let writes: Vec<_> = (0..256u64)
            .map(|index| {
                let pos = index * slot as u64 + start as u64;
                file.write_at_async(aligned(&pattern(index, length)), pos)
            })
            .collect();
        for future in writes {
            assert_eq!(block_on(future).0.unwrap(), length, "{engine}");
        }
        let reads: Vec<_> = (0..256u64)
            .map(|index| file.read_at_async(AlignedBuf::zeroed(slot), index * slot as u64))
            .collect();
        for (index, future) in reads.into_iter().enumerate() {
            let (result, buffer) = block_on(future);
            assert_eq!(result.unwrap(), slot);
            assert_eq!(
                &buffer[start..start + length],
                &pattern(index as u64, length)[..],
                "{engine} slot {index}"
            );
            assert!(buffer[..start].iter().chain(&buffer[start + length..]).all(|&byte| byte == 0));
        }
    }
}

/// 64 writes of two blocks into holes (every other pair of blocks of a
/// sparse file), then a sub-block write past the end.
fn async_writes_into_holes_and_past_eof_complete_and_persist(block_bytes: u32) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = file_volume(&dir, "uring", DioUnaligned::Overwrite, block_bytes);
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
    // 8 KiB written every 16 KiB as on 4 KiB blocks, never less than two
    // whole blocks.
    let write = (2 * block_bytes as usize).max(8192);
    let stride = 2 * write;
    let sparse = 64 * stride;
    file.set_len(sparse as u64).unwrap();
    let in_holes: Vec<_> = (0..64u64)
        .map(|index| file.write_at_async(aligned(&pattern(index, write)), index * stride as u64))
        .collect();
    for future in in_holes {
        block_on(future).0.unwrap();
    }
    let unit = direct_unit(block_bytes);
    let (extended, _) =
        block_on(file.write_at_async(aligned(&pattern(99, 3 * unit)), (sparse + unit) as u64));
    extended.unwrap();
    assert_eq!(volume.inodes().getattr(attr.ino).unwrap().size, (sparse + 4 * unit) as u64);
    let content = read_all(&volume, attr.ino);
    for index in 0..64usize {
        let at = index * stride;
        assert_eq!(&content[at..at + write], &pattern(index as u64, write)[..]);
        assert!(content[at + write..at + stride].iter().all(|&byte| byte == 0));
    }
    assert!(content[sparse..sparse + unit].iter().all(|&byte| byte == 0));
    assert_eq!(&content[sparse + unit..], &pattern(99, 3 * unit)[..]);
}

/// Longer than any healthy run of a queue test by far: a hang fails the test
/// with a message instead of stalling the suite.
const HANG_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `work` on its own thread and fails if it has not finished within
/// `HANG_TIMEOUT`.
fn within_watchdog(what: String, work: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        work();
        let _ = done.send(());
    });
    match finished.recv_timeout(HANG_TIMEOUT) {
        Ok(()) => worker.join().unwrap(),
        // The worker panicked: its panic is the failure to report.
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: no progress in {HANG_TIMEOUT:?}: the queue deadlocked")
        }
    }
}

/// Requests one submitter keeps in flight in the queue test.
const QUEUE_DEPTH: usize = 16;

/// One submitter keeps `QUEUE_DEPTH` direct writes in flight on a sparse
/// file, alternating sub-block writes into holes (which must run alone, after
/// in-flight direct I/O drains) with overwrites (which run concurrently):
/// fio's libaio randwrite on a fresh file. A write that runs alone must not
/// wait for requests only its own submitter would hand to the device. Every
/// engine, both `dio_unaligned` policies, one and three submitters on the
/// same file; the content is checked against a model.
fn async_queue_mixing_writes_into_holes_and_overwrites_never_waits_on_itself(block_bytes: u32) {
    for engine in ["uring", "threads", "sync"] {
        for policy in [DioUnaligned::Overwrite, DioUnaligned::Exclusive] {
            for submitters in [1, 3] {
                let what = format!("{engine}, {policy:?}, {submitters} submitter(s)");
                within_watchdog(what.clone(), move || {
                    queue_of_hole_writes_and_overwrites(engine, policy, submitters, block_bytes)
                });
            }
        }
    }
}

fn queue_of_hole_writes_and_overwrites(
    engine: &str,
    policy: DioUnaligned,
    submitters: usize,
    block_bytes: u32,
) {
    let what = format!("{engine}, {policy:?}, {submitters} submitter(s)");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = Arc::new(file_volume(&dir, engine, policy, block_bytes));
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let unit = direct_unit(block_bytes);
    // A slot is one or more whole blocks; each submitter owns a region of
    // `written_slots` slots written up front (overwritten in turn, so no two
    // writes in flight overlap) and `requests / 2` sparse slots, each
    // written once, by one sub-block write into its hole.
    let slot = (block_bytes as usize).max(4 * unit);
    let requests = 128;
    let written_slots = 2 * QUEUE_DEPTH;
    let region_slots = written_slots + requests / 2;
    let file_bytes = submitters * region_slots * slot;
    let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
    file.set_len(file_bytes as u64).unwrap();
    let mut model = vec![0u8; file_bytes];
    for region in 0..submitters {
        let at = region * region_slots * slot;
        let data = pattern(region as u64, written_slots * slot);
        file.write_at(&aligned(&data), at as u64).unwrap();
        model[at..at + data.len()].copy_from_slice(&data);
    }
    // Every write of region `region`: (position, data), in submission order.
    let plan = |region: usize| -> Vec<(usize, Vec<u8>)> {
        let base = region * region_slots * slot;
        (0..requests)
            .map(|index| {
                let seed = ((region << 32) | index) as u64 + 1000;
                let half = index / 2;
                if index % 2 == 0 {
                    // Into a hole: one unit somewhere inside a fresh slot.
                    let within = (half * unit) % slot;
                    (base + (written_slots + half) * slot + within, pattern(seed, unit))
                } else if half % 2 == 0 {
                    // A whole-slot overwrite (aligned: concurrent).
                    (base + (half % written_slots) * slot, pattern(seed, slot))
                } else {
                    // A sub-block overwrite of written blocks.
                    let within = (half / 2 % (slot / unit)) * unit;
                    (base + (half % written_slots) * slot + within, pattern(seed, unit))
                }
            })
            .collect()
    };
    for region in 0..submitters {
        for (pos, data) in plan(region) {
            model[pos..pos + data.len()].copy_from_slice(&data);
        }
    }
    let workers: Vec<_> = (0..submitters)
        .map(|region| {
            let (volume, writes) = (Arc::clone(&volume), plan(region));
            std::thread::spawn(move || {
                let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
                let mut in_flight = VecDeque::new();
                for (pos, data) in writes {
                    if in_flight.len() == QUEUE_DEPTH {
                        let (result, _): (foliofs::Result<usize>, _) =
                            block_on(in_flight.pop_front().unwrap());
                        result.unwrap();
                    }
                    in_flight.push_back(file.write_at_async(aligned(&data), pos as u64));
                }
                for future in in_flight {
                    block_on(future).0.unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(volume.inodes().getattr(attr.ino).unwrap().size, file_bytes as u64, "{what}");
    let content = read_all(&volume, attr.ino);
    if let Some(at) = (0..file_bytes).find(|&at| content[at] != model[at]) {
        panic!("{what}: the file differs from the model first at byte {at:#x}");
    }
}

/// xfstests generic/451 in process: buffered readers loop over a range while
/// direct writes (asynchronous and blocking, as the mount sends them) of
/// alternating patterns land on it; once a write has completed, a buffered
/// read must return its data, not bytes a racing reader cached from before.
fn buffered_read_after_a_direct_write_sees_it_despite_racing_readers(block_bytes: u32) {
    const RANGE_BYTES: usize = 640 << 10;
    const CYCLES: usize = 150;
    for engine in ["uring", "threads", "sync"] {
        let what = format!("{engine} engine");
        within_watchdog(what.clone(), move || {
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            let volume = Arc::new(file_volume(&dir, engine, DioUnaligned::Overwrite, block_bytes));
            let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
            let writer = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
            let patterns = [aligned(&[0x55; RANGE_BYTES]), aligned(&[0xAA; RANGE_BYTES])];
            writer.write_at(&patterns[0], 0).unwrap();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let (volume, stop) = (Arc::clone(&volume), Arc::clone(&stop));
                    std::thread::spawn(move || {
                        let file = volume.inodes().open_file(attr.ino, OpenFlags::READ).unwrap();
                        let mut buffer = vec![0; RANGE_BYTES];
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            file.read_at(&mut buffer, 0).unwrap();
                        }
                    })
                })
                .collect();
            let checker = volume.inodes().open_file(attr.ino, OpenFlags::READ).unwrap();
            let mut seen = vec![0; RANGE_BYTES];
            let mut stale = None;
            for cycle in 1..=CYCLES {
                let data = &patterns[cycle % 2];
                if cycle % 3 == 0 {
                    writer.write_at(data, 0).unwrap();
                } else {
                    let (result, _) = block_on(writer.write_at_async(aligned(data), 0));
                    result.unwrap();
                }
                checker.read_at(&mut seen, 0).unwrap();
                if let Some(at) = seen.iter().position(|&byte| byte != data[0]) {
                    stale = Some((cycle, at, seen[at], data[0]));
                    break;
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for reader in readers {
                reader.join().unwrap();
            }
            if let Some((cycle, at, found, expected)) = stale {
                panic!(
                    "{what}: after direct write {cycle} completed, a buffered read found \
                     {found:#04x} at byte {at:#x}, not {expected:#04x}"
                );
            }
        });
    }
}

/// Free space cut into single blocks, then one O_DSYNC direct write of 64
/// blocks into a hole inside EOF (the concurrent path, which maps the whole
/// request before it writes): 64 pieces, more than one transaction records
/// (`end_write` takes a request's pieces 12 at a time). Every piece is converted, the data
/// reads back, and a crash right after the write keeps all of it.
#[test]
fn dsync_direct_write_over_fragmented_free_space_converts_every_piece() {
    const BLOCK: u64 = 4096;
    const PIECES: u64 = 64;
    let (device, volume) = new_volume(16 << 20, BLOCK as u32);
    // A comb: 2 x 200 blocks, then every other block punched out.
    let comb = volume.inodes().create(ROOT, b"comb", 0o644, owner()).unwrap();
    let comb_file = volume.inodes().open_file(comb.ino, OpenFlags::READ_WRITE).unwrap();
    comb_file.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 400 * BLOCK).unwrap();
    // The rest of the free space taken, so the comb's holes are all that is left.
    let filler = volume.inodes().create(ROOT, b"filler", 0o644, owner()).unwrap();
    let filler_file = volume.inodes().open_file(filler.ino, OpenFlags::READ_WRITE).unwrap();
    let free_blocks = volume.statfs().free_blocks;
    filler_file
        .fallocate(FallocateMode::Allocate { keep_size: false }, 0, free_blocks * BLOCK)
        .unwrap();
    for block in 0..200 {
        comb_file.fallocate(FallocateMode::PunchHole, 2 * block * BLOCK, BLOCK).unwrap();
    }
    volume.sync().unwrap();

    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    volume.sync().unwrap();
    let file = volume.inodes().open_file(attr.ino, DIRECT_RW.with_dsync()).unwrap();
    file.set_len(PIECES * BLOCK).unwrap();
    let data = pattern(7, (PIECES * BLOCK) as usize);
    assert_eq!(file.write_at(&aligned(&data), 0).unwrap(), data.len());

    let extents = volume.inodes().fiemap(attr.ino).unwrap();
    assert!(extents.len() as u64 > 12, "the write took {} pieces, not > 12", extents.len());
    assert!(extents.iter().all(|extent| extent.kind == MapKind::Written), "{extents:?}");
    assert_eq!(extents.iter().map(|extent| extent.length).sum::<u64>(), PIECES * BLOCK);
    assert_eq!(read_all(&volume, attr.ino), data);

    let image = device.crash_image(device.log_len(), &|_| foliofs::dev::fault::Keep::Nothing);
    let (_, recovered) = open_image(image).unwrap();
    assert_eq!(read_all(&recovered, attr.ino), data, "the O_DSYNC write survives a crash");
    let report = foliofs::fsck::check(recovered.device().clone());
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A direct write into a hole inside EOF larger than the free space: the
/// walk maps what space there is, then fails; ENOSPC, and the space it had
/// mapped goes back (none left mapped to the file, free space as before).
#[test]
fn direct_write_larger_than_free_space_is_enospc_and_keeps_nothing() {
    const BLOCK: u64 = 4096;
    let (_, volume) = new_volume(16 << 20, BLOCK as u32);
    let filler = volume.inodes().create(ROOT, b"filler", 0o644, owner()).unwrap();
    let filler_file = volume.inodes().open_file(filler.ino, OpenFlags::READ_WRITE).unwrap();
    let free_blocks = volume.statfs().free_blocks;
    filler_file
        .fallocate(FallocateMode::Allocate { keep_size: false }, 0, (free_blocks - 8) * BLOCK)
        .unwrap();
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
    file.set_len(64 * BLOCK).unwrap();
    volume.sync().unwrap();
    let free_before = volume.statfs().free_blocks;
    assert!(free_before < 64, "{free_before} blocks free");

    let error = file.write_at(&aligned(&pattern(3, 64 * BLOCK as usize)), 0).unwrap_err();
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    assert_eq!(volume.inodes().fiemap(attr.ino).unwrap(), vec![], "nothing left mapped");
    volume.sync().unwrap();
    assert_eq!(volume.statfs().free_blocks, free_before, "the space went back");
    let report = foliofs::fsck::check(volume.device().clone());
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Polls `future` (with a waker that does nothing) until it is ready or
/// `within` passed: whether it became ready.
fn settles(future: &mut foliofs::direct::DirectFuture, within: Duration) -> bool {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let mut context = Context::from_waker(Waker::noop());
    let started = std::time::Instant::now();
    loop {
        if let Poll::Ready((result, _)) = std::pin::Pin::new(&mut *future).poll(&mut context) {
            result.unwrap();
            return true;
        }
        if started.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A thread that unplugs before it waits (a FUSE ring thread) leaves a
/// direct request that continues its handle's previous one plugged until
/// that unplug, so a wake-up's sequential requests reach the kernel in one
/// call; a random request goes at its first poll, and on any other thread
/// a sequential one does too.
#[test]
fn sequential_requests_wait_for_the_unplug_of_a_thread_that_promised_it() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let volume = file_volume(&dir, "uring", DioUnaligned::Overwrite, 4096);
    let attr = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let file = volume.inodes().open_file(attr.ino, DIRECT_RW).unwrap();
    file.write_at(&AlignedBuf::zeroed(1 << 20), 0).unwrap();
    let block = 4096usize;
    let write = |index: u64, pos: u64| file.write_at_async(aligned(&pattern(index, block)), pos);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut first = write(0, 0);
            assert!(settles(&mut first, Duration::from_secs(10)));
            let mut next = write(1, block as u64);
            assert!(settles(&mut next, Duration::from_secs(10)), "not promised, yet held");

            foliofs::direct::unplug_before_waiting_on_this_thread();
            let mut random = write(2, 512 << 10);
            assert!(settles(&mut random, Duration::from_secs(10)), "a random request was held");
            let mut sequential = write(3, (512 << 10) + block as u64);
            assert!(
                !settles(&mut sequential, Duration::from_millis(300)),
                "a sequential request reached the device before the unplug"
            );
            volume.device().unplug();
            assert!(settles(&mut sequential, Duration::from_secs(10)), "lost after the unplug");
        });
    });
    for (index, pos) in [(0u64, 0usize), (1, block), (2, 512 << 10), (3, (512 << 10) + block)] {
        let mut buffer = AlignedBuf::zeroed(block);
        assert_eq!(file.read_at(&mut buffer, pos as u64).unwrap(), block);
        assert_eq!(&buffer[..], &pattern(index, block)[..], "block at {pos}");
    }
}
