//! The buffered I/O path: the folio cache against a model, what reaches the
//! device (partial-block reads, per-block dirty writeback, delayed
//! allocation), coherence with direct I/O, truncation, writeback errors and
//! a full volume, each on 1 KiB, 4 KiB and 64 KiB blocks.

#[macro_use]
mod common;

use std::sync::Arc;

use foliofs::dev::fault::{FaultOp, FaultRule};
use foliofs::dev::{AlignedBuf, FaultDev};
use foliofs::MapKind;
use foliofs::{OpenFlags, Volume, VolumeOptions};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{new_volume_with_options, open_image_with, owner, pattern, ROOT};

fn options_with(list: &str) -> VolumeOptions {
    let mut options = common::options();
    options.apply_list(list).expect("test options");
    options
}

/// A device byte range covering the data region of `volume`.
fn data_region_bytes(volume: &Volume) -> std::ops::Range<u64> {
    let superblock = volume.superblock();
    let block = superblock.block_bytes_u64();
    let start = superblock.data.start_block * block;
    start..start + superblock.data.block_count * block
}

fn create(volume: &Volume, name: &str) -> u64 {
    volume.inodes().create(ROOT, name.as_bytes(), 0o644, owner()).expect("create").ino
}

fn read_all(volume: &Volume, ino: u64) -> Vec<u8> {
    let size = volume.inodes().getattr(ino).expect("getattr").size as usize;
    let mut content = vec![0; size];
    let file = volume.inodes().open_file(ino, OpenFlags::READ).expect("open");
    assert_eq!(file.read_at(&mut content, 0).expect("read"), size);
    content
}

/// Random buffered writes (sub-block, across folios, appends), reads,
/// truncates, fsyncs and direct reads and writes on one file, compared with
/// a byte vector after every read, and again after a remount.
fn random_ops_match_a_model_with(seed: u64, block_bytes: u32, list: &str) {
    let options = options_with(list);
    let (device, volume) = new_volume_with_options(64 << 20, block_bytes, None, &options);
    let ino = create(&volume, "model");
    let buffered = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    let file_bytes_max = 1usize << 20;
    for step in 0..300 {
        let context = format!("seed {seed}, block {block_bytes}, {list}, step {step}");
        match rng.random_range(0..100) {
            0..=39 => {
                let pos = if rng.random_bool(0.2) {
                    model.len()
                } else {
                    rng.random_range(0..file_bytes_max)
                };
                let length = match rng.random_range(0..4) {
                    0 => rng.random_range(1..16),
                    1 => rng.random_range(1..block_bytes as usize * 2),
                    _ => rng.random_range(1..200_000),
                };
                let data = pattern(seed * 1000 + step, length);
                assert_eq!(buffered.write_at(&data, pos as u64).unwrap(), length, "{context}");
                if model.len() < pos + length {
                    model.resize(pos + length, 0);
                }
                model[pos..pos + length].copy_from_slice(&data);
            }
            40..=59 => {
                let pos = rng.random_range(0..file_bytes_max + 1000);
                let length = rng.random_range(1..300_000);
                let mut buffer = vec![0xEE; length];
                let read = buffered.read_at(&mut buffer, pos as u64).unwrap();
                let expected = model.get(pos..(pos + length).min(model.len())).unwrap_or(&[]);
                assert_eq!(read, expected.len(), "{context}: read length at {pos}");
                assert!(buffer[..read] == *expected, "{context}: buffered read at {pos}+{length}");
            }
            60..=67 => {
                let size = rng.random_range(0..file_bytes_max);
                buffered.set_len(size as u64).unwrap();
                model.resize(size, 0);
            }
            68..=75 => {
                if rng.random_bool(0.5) { buffered.sync_all() } else { buffered.sync_data() }
                    .unwrap_or_else(|error| panic!("{context}: fsync: {error}"));
            }
            76..=87 => {
                let sectors = rng.random_range(1..64);
                let pos = rng.random_range(0..file_bytes_max / 512) * 512;
                let data = pattern(seed * 1000 + step + 7, sectors * 512);
                let buffer = AlignedBuf::from_slice(&data);
                assert_eq!(direct.write_at(&buffer, pos as u64).unwrap(), data.len(), "{context}");
                if model.len() < pos + data.len() {
                    model.resize(pos + data.len(), 0);
                }
                model[pos..pos + data.len()].copy_from_slice(&data);
            }
            _ => {
                let sectors = rng.random_range(1..64);
                let pos = rng.random_range(0..file_bytes_max / 512) * 512;
                let mut buffer = AlignedBuf::zeroed(sectors * 512);
                let read = direct.read_at(&mut buffer, pos as u64).unwrap();
                let expected = model.get(pos..(pos + buffer.len()).min(model.len())).unwrap_or(&[]);
                assert_eq!(read, expected.len(), "{context}: direct read length");
                assert!(buffer[..read] == *expected, "{context}: direct read at {pos}");
            }
        }
        assert_eq!(
            volume.inodes().getattr(ino).unwrap().size,
            model.len() as u64,
            "{context}: size"
        );
    }
    drop((buffered, direct));
    volume.close().unwrap();
    let (_, reopened) = open_image_with(device.image(), &options).unwrap();
    assert!(read_all(&reopened, ino) == model, "seed {seed}: content after remount");
    let report = foliofs::fsck::check(reopened.device().clone());
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

block_size_tests!(
    random_ops_match_a_model,
    random_ops_match_a_model_under_memory_pressure,
    dirty_blocks_alone_are_written_back,
    a_partial_block_write_reads_only_that_block,
    sequential_reads_grow_the_readahead_window,
    a_sequential_reader_is_read_ahead_in_the_background,
    random_reads_read_only_their_own_blocks,
    buffered_and_direct_see_each_other,
    truncation_drops_cached_bytes_past_the_end,
    seed_001_sequence_leaves_no_delalloc,
    a_full_volume_fails_the_write_not_the_writeback,
    writeback_errors_reach_every_handle_once_and_data_is_retried,
    writes_larger_than_the_cache_survive_remount,
    a_long_stream_recycles_its_folios_behind_it,
    a_stream_that_comes_round_again_recycles_the_last_pass_tail,
    a_small_write_into_a_new_file_makes_a_small_folio,
    sequential_writes_grow_folios_up_to_folio_max,
    many_small_files_stay_within_twice_their_data,
    small_files_take_memory_for_what_they_hold_not_a_block,
    mixed_folio_sizes_and_overlaps_read_back_exact,
    dirty_folio_writes_back_whole_folios_of_a_file_written_small,
    drop_behind_keeps_no_copy_of_what_was_read_or_written_back,
    reads_in_place_hand_out_the_cached_bytes_of_one_folio,
);

/// Per-block dirty tracking with the default folios and with folios larger
/// than a block, and whole-folio dirtying, on each block size.
fn random_ops_match_a_model(block_bytes: u32) {
    let (seeds, lists): (std::ops::Range<u64>, &[&str]) = match block_bytes {
        1024 => (20..23, &["folio_max=16k", "dirty=folio,folio_max=16k"]),
        4096 => (0..4, &["", "dirty=folio,folio_max=64k"]),
        _ => (30..33, &["", "dirty=folio"]),
    };
    for seed in seeds {
        for (index, list) in lists.iter().enumerate() {
            random_ops_match_a_model_with(seed + 10 * index as u64, block_bytes, list);
        }
    }
}

fn random_ops_match_a_model_under_memory_pressure(block_bytes: u32) {
    // A cache of 1 MiB with dirty limits far below it (on 64 KiB blocks, a
    // few folios): eviction, the flusher and throttled writers all take part.
    let seeds = if block_bytes == 4096 { 40..43 } else { 40..42 };
    for seed in seeds {
        random_ops_match_a_model_with(
            seed,
            block_bytes,
            "cache_bytes=1M,dirty_bytes=256k,dirty_background_bytes=64k,writeback_interval_ms=5,\
             dirty_expire_ms=0",
        );
    }
}

/// A volume of `block_bytes` blocks holding one fsynced file of
/// `file_bytes`, remounted so that nothing of it is cached.
fn written_file(list: &str, block_bytes: u32, file_bytes: usize) -> (Arc<FaultDev>, Volume, u64) {
    let options = options_with(list);
    let (device, volume) = new_volume_with_options(64 << 20, block_bytes, None, &options);
    let ino = create(&volume, "file");
    let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    file.write_at(&pattern(5, file_bytes), 0).unwrap();
    file.sync_all().unwrap();
    drop(file);
    volume.close().unwrap();
    let (device, volume) = open_image_with(device.image(), &options).unwrap();
    (device, volume, ino)
}

/// As `written_file`, then read whole, so it is cached in `folio_max`
/// folios: the seed 001 setup (overwrite=1, pre_read=1).
fn written_and_cached(
    list: &str,
    block_bytes: u32,
    file_bytes: usize,
) -> (Arc<FaultDev>, Volume, u64) {
    let (device, volume, ino) = written_file(list, block_bytes, file_bytes);
    assert!(read_all(&volume, ino) == pattern(5, file_bytes));
    (device, volume, ino)
}

/// 4 KiB overwrites of a cached file: per-block dirtying writes back the
/// blocks written (4 KiB, or the one 64 KiB block), whole-folio dirtying the
/// 64 KiB folio.
fn dirty_blocks_alone_are_written_back(block_bytes: u32) {
    let block = u64::from(block_bytes);
    let cases =
        [("dirty=block,folio_max=64k", block.max(4096)), ("dirty=folio,folio_max=64k", 65536)];
    for (list, bytes_per_write) in cases {
        let (_device, volume, ino) = written_and_cached(list, block_bytes, 1 << 20);
        let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
        let before = volume.device().stats();
        for index in 0..16u64 {
            file.write_at(&[index as u8; 4096], index * 65536 + 8192).unwrap();
            file.sync_data().unwrap();
        }
        let delta = volume.device().stats().since(&before);
        assert_eq!(delta.bytes_read, 0, "{list}: the file was cached");
        assert_eq!(delta.bytes_written, 16 * bytes_per_write, "{list}: bytes written back");
        assert_eq!(delta.write_requests, 16, "{list}: one request per fdatasync");
        assert_eq!(delta.flush_requests, 16, "{list}: an overwrite needs only a flush");
    }
}

fn a_partial_block_write_reads_only_that_block(block_bytes: u32) {
    let block = block_bytes as usize;
    let (_device, volume, ino) = written_file("", block_bytes, 256 << 10);
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let before = volume.device().stats();
    file.write_at(b"x", 100_000).unwrap();
    let delta = volume.device().stats().since(&before);
    assert_eq!(
        (delta.read_requests, delta.bytes_read),
        (1, block as u64),
        "one block read, not a folio"
    );
    // A write of whole blocks (two, away from the one just read) reads nothing.
    let whole = if 100_000 / block == 2 { 4 * block } else { 2 * block };
    file.write_at(&vec![7; 2 * block], whole as u64).unwrap();
    assert_eq!(volume.device().stats().since(&before).bytes_read, block as u64);
    let mut expected = pattern(5, 256 << 10);
    expected[100_000] = b'x';
    expected[whole..whole + 2 * block].fill(7);
    assert!(read_all(&volume, ino) == expected);
}

fn sequential_reads_grow_the_readahead_window(block_bytes: u32) {
    let (_device, volume, ino) = written_file("", block_bytes, 8 << 20);
    let file = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let before = volume.device().stats();
    let mut buffer = vec![0; 4096];
    for index in 0..2048u64 {
        file.read_at(&mut buffer, index * 4096).unwrap();
    }
    let delta = volume.device().stats().since(&before);
    assert_eq!(delta.bytes_read, 8 << 20);
    assert!(
        delta.read_requests <= 64,
        "{} requests for 8 MiB read 4 KiB at a time",
        delta.read_requests
    );
}

/// The device reads a sequential reader's next window while the reader is
/// still in the first: after one 64 KiB read (a 128 KiB first window), the
/// next 256 KiB arrive without another read asking, and reading them then
/// costs no device read.
fn a_sequential_reader_is_read_ahead_in_the_background(block_bytes: u32) {
    let (_device, volume, ino) = written_file("", block_bytes, 8 << 20);
    let file = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let before = volume.device().stats();
    let mut buffer = vec![0; 64 << 10];
    assert_eq!(file.read_at(&mut buffer, 0).unwrap(), buffer.len());
    let expected = pattern(5, 8 << 20);
    assert!(buffer[..] == expected[..64 << 10]);
    let ahead_bytes = 384 << 10;
    let waited = std::time::Instant::now();
    while volume.device().stats().since(&before).bytes_read < ahead_bytes {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(20),
            "only {} bytes read after a 64 KiB read",
            volume.device().stats().since(&before).bytes_read
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let read_ahead = volume.device().stats();
    // Not where the last read ended: no further readahead starts.
    let mut ahead = vec![0; (ahead_bytes - (128 << 10)) as usize];
    assert_eq!(file.read_at(&mut ahead, 128 << 10).unwrap(), ahead.len());
    assert!(ahead[..] == expected[128 << 10..ahead_bytes as usize]);
    assert_eq!(volume.device().stats().since(&read_ahead).bytes_read, 0);
}

/// Reads that continue no stream (not where the handle's last read ended,
/// nothing cached right before them) read only their own blocks, as the
/// kernel's page_cache_sync_ra: a random 4 KiB read used to read a 128 KiB
/// window. A read right after a cached run longer than itself (another
/// handle's stream) reads ahead, sized from that run rather than a full
/// window.
fn random_reads_read_only_their_own_blocks(block_bytes: u32) {
    let (_device, volume, ino) = written_file("", block_bytes, 8 << 20);
    let file = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let expected = pattern(5, 8 << 20);
    let unit = u64::from(block_bytes).max(4096);
    let stride = 512u64 << 10;
    let before = volume.device().stats();
    let mut buffer = vec![0; unit as usize];
    for index in (0..16u64).rev() {
        let offset = index * stride + unit;
        assert_eq!(file.read_at(&mut buffer, offset).unwrap(), buffer.len());
        assert!(buffer[..] == expected[offset as usize..(offset + unit) as usize]);
    }
    let delta = volume.device().stats().since(&before);
    assert_eq!(delta.bytes_read, 16 * unit, "16 random reads of {unit} bytes");
    assert_eq!(delta.read_requests, 16);
    // Another handle's stream left two units cached before this read.
    let stream = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let start = 4 * stride;
    let mut two = vec![0; 2 * unit as usize];
    assert_eq!(stream.read_at(&mut two, start).unwrap(), two.len());
    let before = volume.device().stats();
    assert_eq!(file.read_at(&mut buffer, start + 2 * unit).unwrap(), buffer.len());
    let ahead = volume.device().stats().since(&before).bytes_read;
    assert!(ahead > unit && ahead <= 8 * unit, "{ahead} bytes after a cached run of two units");
    let at = (start + 2 * unit) as usize;
    assert!(buffer[..] == expected[at..at + unit as usize]);
}

/// Cached, then overwritten directly by 4 KiB: four blocks on 1 KiB blocks,
/// part of the cached block on 64 KiB blocks.
fn buffered_and_direct_see_each_other(block_bytes: u32) {
    let (_device, volume) =
        new_volume_with_options(16 << 20, block_bytes, None, &common::options());
    let ino = create(&volume, "shared");
    let buffered = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    buffered.write_at(&pattern(1, 20_000), 0).unwrap();
    let mut seen = AlignedBuf::zeroed(20_480);
    assert_eq!(direct.read_at(&mut seen, 0).unwrap(), 20_000, "dirty data written back first");
    assert!(seen[..20_000] == pattern(1, 20_000)[..]);
    // Cached, then overwritten directly: the cache must not serve old bytes.
    let mut cached = vec![0; 8192];
    buffered.read_at(&mut cached, 0).unwrap();
    direct.write_at(&AlignedBuf::from_slice(&[9; 4096]), 4096).unwrap();
    buffered.read_at(&mut cached, 0).unwrap();
    assert!(cached[4096..].iter().all(|&byte| byte == 9));
    assert!(cached[..4096] == pattern(1, 4096)[..]);
}

fn truncation_drops_cached_bytes_past_the_end(block_bytes: u32) {
    let options = common::options();
    let (device, volume) = new_volume_with_options(32 << 20, block_bytes, None, &options);
    let ino = create(&volume, "t");
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&pattern(3, 100_000), 0).unwrap();
    file.set_len(50_001).unwrap();
    file.set_len(120_000).unwrap();
    let mut expected = pattern(3, 50_001);
    expected.resize(120_000, 0);
    assert!(read_all(&volume, ino) == expected, "cached");
    file.sync_all().unwrap();
    drop(file);
    volume.close().unwrap();
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    assert!(read_all(&volume, ino) == expected, "after remount");
}

/// The xfs_io sequence of seed 001 (truncate 4k, mread 0 4k, pwrite 0 1,
/// pwrite 2k 1, fsync) leaves only Written extents, over exactly the blocks
/// written (0 and 2 on 1 KiB blocks, 0 otherwise): no delayed allocation is
/// left behind.
fn seed_001_sequence_leaves_no_delalloc(block_bytes: u32) {
    let block = u64::from(block_bytes);
    let mut written_blocks = vec![0, 2048 / block];
    written_blocks.dedup();
    let (_device, volume) =
        new_volume_with_options(16 << 20, block_bytes, None, &common::options());
    let ino = create(&volume, "testfile");
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.set_len(4096).unwrap();
    let mut mapped = vec![0; 4096];
    assert_eq!(file.read_at(&mut mapped, 0).unwrap(), 4096);
    file.write_at(b"a", 0).unwrap();
    file.write_at(b"b", 2048).unwrap();
    file.sync_all().unwrap();
    let extents = volume.inodes().fiemap(ino).unwrap();
    assert!(extents.iter().all(|extent| extent.kind == MapKind::Written), "{extents:?}");
    let blocks: Vec<u64> = extents
        .iter()
        .flat_map(|extent| {
            let first = extent.logical / block;
            first..first + extent.length / block
        })
        .collect();
    assert_eq!(blocks, written_blocks);
    let content = read_all(&volume, ino);
    assert_eq!((content[0], content[2048], content.len()), (b'a', b'b', 4096));
}

/// Writes to holes reserve space: a full volume fails the write itself, and
/// everything acknowledged before reaches the disk.
fn a_full_volume_fails_the_write_not_the_writeback(block_bytes: u32) {
    let options = common::options();
    let (device, volume) = new_volume_with_options(8 << 20, block_bytes, None, &options);
    let data_bytes = volume.statfs().available_blocks * u64::from(block_bytes);
    let mut files = Vec::new();
    let mut acknowledged = 0u64;
    'fill: for index in 0.. {
        let ino = create(&volume, &format!("f{index}"));
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
        let mut size = 0;
        for chunk in 0..8u64 {
            match file.write_at(&pattern(index * 8 + chunk, 100_000), chunk * 100_000) {
                Ok(written) => {
                    acknowledged += written as u64;
                    size = chunk * 100_000 + written as u64;
                    if written < 100_000 {
                        files.push((ino, index, size));
                        break 'fill;
                    }
                }
                Err(error) => {
                    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
                    files.push((ino, index, size));
                    break 'fill;
                }
            }
        }
        files.push((ino, index, size));
    }
    // Most of the space: the files' partly used last blocks are lost to it.
    assert!(
        acknowledged > data_bytes * 4 / 5,
        "most of the volume was written: {acknowledged} of {data_bytes}"
    );
    volume.sync().expect("writeback of reserved data cannot run out of space");
    volume.close().unwrap();
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    for (ino, index, size) in files {
        let content = read_all(&volume, ino);
        assert_eq!(content.len() as u64, size);
        for (chunk, piece) in content.chunks(100_000).enumerate() {
            let expected = pattern(index * 8 + chunk as u64, 100_000);
            assert!(piece == &expected[..piece.len()], "file {index} chunk {chunk}");
        }
    }
}

/// A failed writeback keeps the data dirty, is reported by the next fsync of
/// every handle open at the time, once each, and the retry lands the data.
fn writeback_errors_reach_every_handle_once_and_data_is_retried(block_bytes: u32) {
    let options = common::options();
    let (device, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options);
    let ino = create(&volume, "e");
    let first = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let second = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    first.write_at(&pattern(9, 50_000), 0).unwrap();
    device.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(data_region_bytes(&volume)));
    let error = first.sync_all().unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
    assert!(error.to_string().contains("writeback"), "names what failed: {error}");
    first.sync_all().expect("the retry succeeds and the failure was reported already");
    let error = second.sync_all().unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "the other handle hears of it too");
    second.sync_all().unwrap();
    let third = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    third.sync_all().expect("a handle opened after the report has nothing to hear");
    drop((first, second, third));
    volume.close().unwrap();
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    assert!(read_all(&volume, ino) == pattern(9, 50_000), "nothing was dropped");
}

/// Much more data than the cache holds, through throttling and eviction.
fn writes_larger_than_the_cache_survive_remount(block_bytes: u32) {
    let list = "cache_bytes=2M,dirty_bytes=512k,dirty_background_bytes=128k,folio_max=64k";
    let options = options_with(list);
    let (device, volume) = new_volume_with_options(64 << 20, block_bytes, None, &options);
    let ino = create(&volume, "big");
    let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    let data = pattern(11, 24 << 20);
    for (index, chunk) in data.chunks(100_000).enumerate() {
        file.write_at(chunk, index as u64 * 100_000).unwrap();
    }
    let cached_bytes = volume.cache_stats().cached_bytes;
    assert!(cached_bytes <= 3 << 20, "the cache stayed near its limit: {cached_bytes}");
    drop(file);
    volume.close().unwrap();
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    assert!(read_all(&volume, ino) == data);
}

/// Above the freerun ceiling (halfway from the background threshold to the
/// dirty limit) writers are paced by the bandwidth writeback measured: on a
/// disk that writes 32 MiB/s, a 24 MiB stream through a 4 MiB dirty limit
/// sleeps many short times below the limit, the bandwidth measured is the
/// disk's, and every byte survives a remount.
#[test]
fn buffered_writers_are_paced_by_the_measured_write_bandwidth() {
    let list = "cache_bytes=16M,dirty_bytes=4M,dirty_background_bytes=2M,folio_max=256k";
    let options = options_with(list);
    let (device, volume) = new_volume_with_options(64 << 20, 4096, None, &options);
    let ino = create(&volume, "paced");
    let disk_bytes_per_s: u64 = 32 << 20;
    device.limit_write_bandwidth(Some(disk_bytes_per_s));
    let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    let data = pattern(21, 24 << 20);
    for (index, chunk) in data.chunks(64 << 10).enumerate() {
        file.write_at(chunk, index as u64 * (64 << 10)).unwrap();
    }
    let stats = volume.cache_stats();
    let bandwidth = stats.write_bandwidth_bytes_per_s.expect("writeback measured its bandwidth");
    // Never above the disk's (its writes take at least their time); below
    // it only by what else writeback does per batch.
    assert!(
        bandwidth <= disk_bytes_per_s + disk_bytes_per_s / 10 && bandwidth >= disk_bytes_per_s / 8,
        "measured {bandwidth} B/s on a {disk_bytes_per_s} B/s disk"
    );
    assert!(stats.throttle_pauses >= 10, "writers were paced: {stats:?}");
    assert!(stats.dirty_bytes <= 4 << 20, "the dirty limit held: {stats:?}");
    drop(file);
    device.limit_write_bandwidth(None);
    volume.close().unwrap();
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    assert!(read_all(&volume, ino) == data);
}

fn cached_bytes_of(volume: &Volume, ino: u64) -> u64 {
    volume.inodes().cached_folios(ino).iter().map(|&(_, bytes)| bytes as u64).sum()
}

/// A sequential stream longer than the dirty limit drops its written-back
/// folios far behind it, reusing their memory for its next ones, instead of
/// growing the cache with fresh memory; its last `dirty_limit` bytes stay
/// cached, and a file within the dirty limit stays cached whole.
fn a_long_stream_recycles_its_folios_behind_it(block_bytes: u32) {
    let options =
        options_with("cache_bytes=64M,dirty_bytes=4M,folio_max=1M,writeback_interval_ms=0");
    let (device, volume) = new_volume_with_options(128 << 20, block_bytes, None, &options);
    let small = create(&volume, "small");
    let small_data = pattern(5, 3 << 20);
    let file = volume.inodes().open_file(small, OpenFlags::WRITE).unwrap();
    for (index, chunk) in small_data.chunks(256 << 10).enumerate() {
        file.write_at(chunk, index as u64 * (256 << 10)).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    let ino = create(&volume, "stream");
    let data = pattern(6, 32 << 20);
    let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    for (index, chunk) in data.chunks(1 << 20).enumerate() {
        file.write_at(chunk, index as u64 * (1 << 20)).unwrap();
        if index % 2 == 1 {
            file.sync_all().unwrap();
        }
    }
    let stream_cached_bytes = cached_bytes_of(&volume, ino);
    assert!(stream_cached_bytes <= 6 << 20, "the stream keeps {stream_cached_bytes} bytes cached");
    let first_cached = volume.inodes().cached_folios(ino)[0].0;
    assert!(first_cached >= 26 << 20, "the stream's tail stays cached, from {first_cached}");
    assert_eq!(cached_bytes_of(&volume, small), 3 << 20, "the small file stays cached");
    let stats = volume.cache_stats();
    assert!(
        stats.folios_allocated <= 16,
        "{} folios of fresh memory for {} reused",
        stats.folios_allocated,
        stats.folios_reused
    );
    drop(file);
    assert!(read_all(&volume, ino) == data);
    assert!(read_all(&volume, small) == small_data);
    volume.close().unwrap();
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    assert!(read_all(&volume, ino) == data);
}

/// A long stream that starts over from the file's start (fio's time-based
/// jobs, a ring buffer) recycles the last pass's cached tail, far ahead of
/// it, before its own folios need memory, instead of keeping both.
fn a_stream_that_comes_round_again_recycles_the_last_pass_tail(block_bytes: u32) {
    const MIB: u64 = 1 << 20;
    let options =
        options_with("cache_bytes=64M,dirty_bytes=4M,folio_max=1M,writeback_interval_ms=0");
    let (device, volume) = new_volume_with_options(128 << 20, block_bytes, None, &options);
    let ino = create(&volume, "ring");
    let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    let mut data = pattern(7, 32 << 20);
    let write_pass = |data: &[u8], bytes: u64| {
        for index in 0..bytes / MIB {
            let at = index * MIB;
            file.write_at(&data[at as usize..(at + MIB) as usize], at).unwrap();
            if index % 2 == 1 {
                file.sync_all().unwrap();
            }
        }
    };
    write_pass(&data, 32 * MIB);
    let tail_start = volume.inodes().cached_folios(ino)[0].0;
    assert!(tail_start >= 20 * MIB, "the first pass keeps its tail cached, from {tail_start}");
    data[..8 << 20].copy_from_slice(&pattern(8, 8 << 20));
    write_pass(&data, 8 * MIB);
    let cached = volume.inodes().cached_folios(ino);
    let (last_cached, _) = *cached.last().unwrap();
    assert!(
        last_cached < 16 * MIB,
        "the last pass's tail is recycled: cached folios {:?}",
        cached.iter().map(|&(pos, _)| pos / MIB).collect::<Vec<_>>()
    );
    drop(file);
    assert!(read_all(&volume, ino) == data);
    volume.close().unwrap();
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    assert!(read_all(&volume, ino) == data);
}

/// The folios of `ino` tile the file without overlapping, each a power of
/// two aligned to its size, at least a block and at most `folio_max_bytes`.
fn assert_folios_well_formed(volume: &Volume, ino: u64, block_bytes: usize, folio_max: usize) {
    let folios = volume.inodes().cached_folios(ino);
    for pair in folios.windows(2) {
        assert!(pair[0].0 + pair[0].1 as u64 <= pair[1].0, "overlapping folios: {pair:?}");
    }
    for &(pos, bytes) in &folios {
        assert!(bytes.is_power_of_two() && bytes >= block_bytes, "folio size: {pos}+{bytes}");
        assert!(bytes <= folio_max.max(block_bytes), "folio over folio_max: {pos}+{bytes}");
        assert_eq!(pos % bytes as u64, 0, "unaligned folio: {pos}+{bytes}");
    }
}

/// A 4 KiB write into a new file caches one small folio (a block, or 4 KiB
/// of smaller blocks), not a `folio_max` one; a 100-byte write one block.
fn a_small_write_into_a_new_file_makes_a_small_folio(block_bytes: u32) {
    let block = block_bytes as usize;
    let (_device, volume) =
        new_volume_with_options(64 << 20, block_bytes, None, &common::options());
    let ino = create(&volume, "small");
    let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    file.write_at(&pattern(1, 4096), 0).unwrap();
    assert_eq!(volume.inodes().cached_folios(ino), vec![(0, block.max(4096))]);
    let tiny = create(&volume, "tiny");
    volume.inodes().open_file(tiny, OpenFlags::WRITE).unwrap().write_at(&[9; 100], 0).unwrap();
    assert_eq!(volume.inodes().cached_folios(tiny), vec![(0, block)]);
    let stats = volume.cache_stats();
    assert_eq!((stats.folios, stats.cached_bytes), (2, (block.max(4096) + block) as u64));
    drop(file);
    assert!(read_all(&volume, ino) == pattern(1, 4096));
    assert_eq!(read_all(&volume, tiny), vec![9; 100]);
}

/// 4 KiB writes, each where the last one ended, get folios that double (as
/// alignment to their size allows) up to `folio_max` and stay there; the
/// cache holds the data written and no more.
fn sequential_writes_grow_folios_up_to_folio_max(block_bytes: u32) {
    let block = block_bytes as usize;
    let folio_max = 256 << 10;
    let options = options_with("folio_max=256k");
    let (_device, volume) = new_volume_with_options(64 << 20, block_bytes, None, &options);
    let ino = create(&volume, "stream");
    let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    let data = pattern(3, 2 << 20);
    for (index, chunk) in data.chunks(4096).enumerate() {
        file.write_at(chunk, index as u64 * 4096).unwrap();
    }
    assert_folios_well_formed(&volume, ino, block, folio_max);
    let folios = volume.inodes().cached_folios(ino);
    let sizes: Vec<usize> = folios.iter().map(|&(_, bytes)| bytes).collect();
    // Each folio at a power of two as large as its offset (the first one
    // the write), until folio_max: 4k 4k 8k ... 128k, then 256k.
    let first = block.max(4096);
    let mut expected = vec![first];
    while expected.iter().sum::<usize>() < folio_max {
        expected.push(expected.iter().sum::<usize>().min(folio_max));
    }
    expected.resize(expected.len() + (2 << 20) / folio_max - 1, folio_max);
    assert_eq!(sizes, expected);
    assert_eq!(volume.cache_stats().cached_bytes, 2 << 20, "no folio past the data");
    // A write elsewhere starts small again.
    file.write_at(&[1; 4096], 16 << 20).unwrap();
    assert_eq!(volume.inodes().cached_folios(ino).last(), Some(&(16 << 20, first)));
    drop(file);
    let mut expected_data = data;
    expected_data.resize(16 << 20, 0);
    expected_data.extend_from_slice(&[1; 4096]);
    assert!(read_all(&volume, ino) == expected_data);
}

/// Files of 1,000 bytes take 1 KiB of folio memory each on every block
/// size (a folio of one block holds only what was written of it): 2,048 of
/// them fill one 2 MiB slab, where a block each took 8 MiB on 4 KiB blocks.
/// Appends grow a folio's memory, and every byte reads back, from the cache
/// and after a remount.
fn small_files_take_memory_for_what_they_hold_not_a_block(block_bytes: u32) {
    let files = if block_bytes == 65536 { 512 } else { 2048 };
    let image_bytes = if block_bytes == 65536 { 128 << 20 } else { 64 << 20 };
    let options = common::options();
    let (device, volume) = new_volume_with_options(image_bytes, block_bytes, None, &options);
    let mut expected = Vec::new();
    for index in 0..files {
        let ino = create(&volume, &format!("f{index}"));
        let data = pattern(index, 1000);
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
        file.write_at(&data, 0).unwrap();
        file.close().unwrap();
        expected.push((ino, data));
    }
    let stats = volume.cache_stats();
    assert_eq!(stats.folios, files * 1000_u64.div_ceil(block_bytes as u64));
    assert_eq!(stats.memory_bytes, 2 << 20, "one slab of 1 KiB pieces for {files} files");
    for (index, (ino, data)) in expected.iter_mut().enumerate().step_by(2) {
        let appended = pattern(index as u64 + 10_000, 2000);
        let file = volume.inodes().open_file(*ino, OpenFlags::WRITE).unwrap();
        file.write_at(&appended, 1000).unwrap();
        file.close().unwrap();
        data.extend_from_slice(&appended);
    }
    for (ino, data) in &expected {
        assert!(read_all(&volume, *ino) == *data, "inode {ino} from the cache");
    }
    volume.close().unwrap();
    let (_, reopened) = open_image_with(device.image(), &options).unwrap();
    for (ino, data) in &expected {
        assert!(read_all(&reopened, *ino) == *data, "inode {ino} after a remount");
    }
    let report = foliofs::fsck::check(reopened.device().clone());
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

/// Many new 4 KiB files (each created, written, closed) take at most twice
/// their data in folio memory (small folios share slabs), however large
/// `folio_max` is.
fn many_small_files_stay_within_twice_their_data(block_bytes: u32) {
    let file_bytes = (block_bytes as usize).max(4096);
    let files = 300;
    let (_device, volume) =
        new_volume_with_options(64 << 20, block_bytes, None, &common::options());
    let data = pattern(4, 4096);
    let mut inos = Vec::new();
    for index in 0..files {
        let ino = create(&volume, &format!("f{index}"));
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
        file.write_at(&data, 0).unwrap();
        file.close().unwrap();
        inos.push(ino);
    }
    let stats = volume.cache_stats();
    let data_bytes = (files * file_bytes) as u64;
    assert_eq!((stats.folios, stats.cached_bytes), (files as u64, data_bytes));
    assert!(
        stats.memory_bytes <= 2 * data_bytes,
        "{} bytes of folio memory for {data_bytes} bytes of files",
        stats.memory_bytes
    );
    for ino in inos {
        assert!(read_all(&volume, ino) == data);
    }
}

/// Small folios first, then writes and reads that need larger ones around
/// and across them: the folios never overlap, and every byte reads back as
/// written, cached and after a remount.
fn mixed_folio_sizes_and_overlaps_read_back_exact(block_bytes: u32) {
    let block = block_bytes as usize;
    let options = options_with("folio_max=1M");
    let (device, volume) = new_volume_with_options(64 << 20, block_bytes, None, &options);
    let ino = create(&volume, "mixed");
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let mut model = Vec::new();
    let write = |data: Vec<u8>, pos: usize, model: &mut Vec<u8>| {
        assert_eq!(file.write_at(&data, pos as u64).unwrap(), data.len());
        if model.len() < pos + data.len() {
            model.resize(pos + data.len(), 0);
        }
        model[pos..pos + data.len()].copy_from_slice(&data);
    };
    // Scattered small writes: small folios with gaps between.
    for (index, pos) in [5000usize, 70_000, 300_000, 1_048_000, 2_100_000].iter().enumerate() {
        write(pattern(index as u64, 3000), *pos, &mut model);
    }
    // Large writes across them, a sequential stream through them, and an
    // unaligned tail that extends the file.
    write(pattern(10, 900_000), 40_000, &mut model);
    for step in 0..40 {
        write(pattern(20 + step, 50_000), 1_000_000 + step as usize * 50_000, &mut model);
    }
    write(pattern(99, 1_000_000), 3_000_000, &mut model);
    assert_folios_well_formed(&volume, ino, block, 1 << 20);
    assert!(read_all(&volume, ino) == model, "cached content");
    file.sync_all().unwrap();
    // Drop the folios past 3.5 MB and part of one, then read ranges that
    // readahead fills around the folios left.
    file.set_len(3_500_000).unwrap();
    model.truncate(3_500_000);
    file.set_len(4 << 20).unwrap();
    model.resize(4 << 20, 0);
    let direct = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let unit = common::direct_unit(block_bytes);
    let overwrite = AlignedBuf::from_slice(&pattern(7, 64 * unit));
    direct.write_at(&overwrite, (1_500_000 / unit * unit) as u64).unwrap();
    let at = 1_500_000 / unit * unit;
    model[at..at + overwrite.len()].copy_from_slice(&overwrite);
    let mut buffer = vec![0; 700_000];
    for pos in [0usize, 1_234_567, 3_333_333] {
        let read = file.read_at(&mut buffer, pos as u64).unwrap();
        assert!(buffer[..read] == model[pos..pos + read], "read at {pos}");
    }
    assert_folios_well_formed(&volume, ino, block, 1 << 20);
    assert!(read_all(&volume, ino) == model, "content after readahead");
    drop((file, direct));
    volume.close().unwrap();
    let (_, reopened) = open_image_with(device.image(), &options).unwrap();
    assert!(read_all(&reopened, ino) == model, "content after remount");
}

/// The seed 001 setup on a file written 4 KiB at a time: after a remount
/// and a whole read, readahead caches it in `folio_max` folios, and with
/// `dirty=folio` each 4 KiB overwrite + fdatasync writes back the whole
/// 64 KiB folio (per-block dirtying: the block alone).
fn dirty_folio_writes_back_whole_folios_of_a_file_written_small(block_bytes: u32) {
    let block = u64::from(block_bytes);
    let cases =
        [("dirty=block,folio_max=64k", block.max(4096)), ("dirty=folio,folio_max=64k", 65536)];
    for (list, bytes_per_write) in cases {
        let options = options_with(list);
        let (device, volume) = new_volume_with_options(64 << 20, block_bytes, None, &options);
        let ino = create(&volume, "file");
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
        let data = pattern(5, 1 << 20);
        for (index, chunk) in data.chunks(4096).enumerate() {
            file.write_at(chunk, index as u64 * 4096).unwrap();
        }
        file.sync_all().unwrap();
        drop(file);
        volume.close().unwrap();
        let (_device, volume) = open_image_with(device.image(), &options).unwrap();
        assert!(read_all(&volume, ino) == data);
        let sizes: Vec<usize> =
            volume.inodes().cached_folios(ino).iter().map(|&(_, bytes)| bytes).collect();
        assert_eq!(sizes, vec![65536; 16], "{list}: the pre-read caches 64 KiB folios");
        let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
        let before = volume.device().stats();
        for index in 0..16u64 {
            file.write_at(&[index as u8; 4096], index * 65536 + 8192).unwrap();
            file.sync_data().unwrap();
        }
        let delta = volume.device().stats().since(&before);
        assert_eq!(delta.bytes_read, 0, "{list}: the file was cached");
        assert_eq!(delta.bytes_written, 16 * bytes_per_write, "{list}: bytes written back");
    }
}

/// Drop-behind (the kernel's page cache holds the data, as under a FUSE
/// mount with `page_cache=kernel`): a sequential reader in requests smaller
/// than a folio leaves cached only the folio its last read ended inside,
/// and nothing once it reaches the end of file; the bytes read are the
/// file's; written-back folios of such a file are dropped; a handle without
/// it keeps what it reads.
fn drop_behind_keeps_no_copy_of_what_was_read_or_written_back(block_bytes: u32) {
    let folio_max = 256 << 10;
    let options = options_with("folio_max=256k");
    let (_device, volume) = new_volume_with_options(64 << 20, block_bytes, None, &options);
    let ino = create(&volume, "cached-by-the-kernel");
    let data = pattern(21, 4 << 20);
    let writer = volume.inodes().open_file(ino, OpenFlags::WRITE.with_drop_behind()).unwrap();
    writer.write_at(&data, 0).unwrap();
    assert!(volume.cache_stats().cached_bytes >= data.len() as u64, "dirty data stays cached");
    writer.sync_all().unwrap();
    assert_eq!(volume.inodes().cached_folios(ino), vec![], "written back, then dropped");
    drop(writer);

    let reader = volume.inodes().open_file(ino, OpenFlags::READ.with_drop_behind()).unwrap();
    let request = 64 << 10;
    let mut buffer = vec![0; request];
    for pos in (0..folio_max + request).step_by(request) {
        assert_eq!(reader.read_at(&mut buffer, pos as u64).unwrap(), request);
        assert!(buffer == data[pos..pos + request], "bytes at {pos}");
    }
    // The reads ended inside the second folio: it stays, the first went.
    let cached = volume.inodes().cached_folios(ino);
    assert!(cached.iter().all(|&(pos, _)| pos >= folio_max as u64), "{cached:?}");
    assert!(cached.iter().any(|&(pos, _)| pos == folio_max as u64), "{cached:?}");
    for pos in (folio_max + request..data.len()).step_by(request) {
        assert_eq!(reader.read_at(&mut buffer, pos as u64).unwrap(), request);
        assert!(buffer == data[pos..pos + request], "bytes at {pos}");
    }
    assert_eq!(volume.inodes().cached_folios(ino), vec![], "read to the end of file: nothing kept");
    drop(reader);

    let keeper = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    assert_eq!(keeper.read_at(&mut buffer, 0).unwrap(), request);
    assert!(
        !volume.inodes().cached_folios(ino).is_empty(),
        "without drop-behind the read is cached"
    );
}

/// `File::read_in_place` hands out the file's bytes where one cached folio
/// holds the whole range, clipped at the end of file; a range across two
/// folios, a range not cached yet and a direct handle get `None` and the
/// closure is not called.
fn reads_in_place_hand_out_the_cached_bytes_of_one_folio(block_bytes: u32) {
    let folio_max = 256 << 10;
    let options = options_with("folio_max=256k");
    let (device, volume) = new_volume_with_options(64 << 20, block_bytes, None, &options);
    let ino = create(&volume, "served");
    let data = pattern(23, 2 * folio_max + 1000);
    let writer = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    writer.write_at(&data, 0).unwrap();
    drop(writer);
    volume.close().unwrap();
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    let reader = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let in_place = |pos: usize, length: usize| {
        reader.read_in_place(pos as u64, length, |bytes| bytes.to_vec()).unwrap()
    };
    assert_eq!(in_place(4096, 4096), None, "nothing cached yet");
    let mut buffer = vec![0; 4096];
    reader.read_at(&mut buffer, 0).unwrap();
    let inside = in_place(4096, 64 << 10).expect("inside the first folio");
    assert!(inside == data[4096..4096 + (64 << 10)]);
    assert_eq!(in_place(folio_max - 4096, 8192), None, "across two folios");
    reader.read_at(&mut buffer, 2 * folio_max as u64).unwrap();
    let tail = in_place(2 * folio_max, 1 << 20).expect("the last folio");
    assert!(tail == data[2 * folio_max..], "clipped at the end of file");
    let direct = volume.inodes().open_file(ino, OpenFlags::READ.with_direct()).unwrap();
    let mut called = false;
    assert_eq!(direct.read_in_place(0, 4096, |_| called = true).unwrap(), None);
    assert!(!called);
}
