//! Error injection: the fault device fails chosen requests with EIO (data
//! writes, metadata writes, reads, flushes; the next N, every Nth, or at
//! random from a seed) while random workloads run on 1 KiB, 4 KiB and
//! 64 KiB blocks. What must hold:
//!
//! - a failing call returns EIO (or EROFS once the volume is read-only),
//!   never panics or hangs, and a failed read caches nothing;
//! - a writeback failure reaches the next fsync of every handle of the file,
//!   once each, and the data stays dirty until a writeback succeeds;
//! - a failed metadata write (journal group, checkpoint) turns the volume
//!   read-only: later changes fail with EROFS naming the cause, reads work;
//! - after the rules are cleared, the image (as it is, and as a power cut
//!   at the last flush leaves it) mounts fsck-clean with everything that was
//!   fsynced before the fault;
//! - an I/O error while mounting fails the mount with EIO; it never mounts
//!   an older state instead;
//! - on a disk that loses its volatile cache when a flush fails, the failed
//!   fsync reports EIO, no later fsync claims the lost data durable, and
//!   nothing fsynced before is lost.
//!
//! `FOLIOFS_FAULT_WORKLOADS` (per test and block size) and
//! `FOLIOFS_FAULT_OPS` (per workload) raise the budget for long runs;
//! `FOLIOFS_FAULT_SEED` moves the seeds.

#[macro_use]
mod common;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use foliofs::dev::fault::{FaultOp, FaultRule, Keep};
use foliofs::dev::{AlignedBuf, Device, FaultDev, FuaMode};
use foliofs::space::FallocateMode;
use foliofs::vfs::MkfsOptions;
use foliofs::{Error, File, OpenFlags, Volume, VolumeOptions};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{new_volume_with_options, open_image, open_image_with, owner, pattern, ROOT};

block_size_tests!(
    writeback_errors_reach_every_handle_once_and_nothing_is_dropped,
    direct_write_errors_fail_the_write_only,
    journal_write_error_makes_the_volume_read_only,
    checkpoint_write_error_makes_the_volume_read_only,
    read_errors_fail_the_read_and_cache_nothing,
    read_errors_while_mounting_fail_with_eio_never_an_older_state,
    superblock_write_errors_fail_mkfs_cleanly,
    superblock_read_errors_fail_the_mount_with_eio,
    writeback_failure_of_several_runs_keeps_them_dirty,
    failed_truncate_leaves_the_file_as_it_was,
    size_held_back_by_a_failure_catches_up_at_syncfs,
    a_flush_failure_that_drops_the_disk_cache_loses_nothing_fsynced,
    an_overwrite_lost_with_the_disk_cache_is_never_reported_durable,
    random_data_write_faults,
    random_metadata_write_faults,
    random_read_faults,
    random_flush_faults,
    random_mixed_faults,
);

// ---------------------------------------------------------------------------
// Figures for the long run
// ---------------------------------------------------------------------------

static FAULTS_INJECTED: AtomicU64 = AtomicU64::new(0);
static OPS_RUN: AtomicU64 = AtomicU64::new(0);
static REMOUNTS_CHECKED: AtomicU64 = AtomicU64::new(0);
static WENT_READ_ONLY: AtomicU64 = AtomicU64::new(0);

fn report(test: &str, block_bytes: u32) {
    eprintln!(
        "faults [{test} {block_bytes}]: {} faults injected, {} ops, {} remounts checked, {} \
         volumes turned read-only (cumulative in this process)",
        FAULTS_INJECTED.load(Ordering::Relaxed),
        OPS_RUN.load(Ordering::Relaxed),
        REMOUNTS_CHECKED.load(Ordering::Relaxed),
        WENT_READ_ONLY.load(Ordering::Relaxed),
    );
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn options() -> VolumeOptions {
    // A cache large enough that writers are never throttled into a silent
    // background writeback: every writeback failure is one a call reports.
    VolumeOptions { cache_bytes: 256 << 20, ..common::options() }
}

/// Device byte ranges of a volume's areas.
#[derive(Clone)]
struct Areas {
    superblocks: Range<u64>,
    journal: Range<u64>,
    checkpoints: Range<u64>,
    data: Range<u64>,
}

fn areas(volume: &Volume) -> Areas {
    let superblock = volume.superblock();
    let block = superblock.block_bytes_u64();
    let bytes =
        |region: foliofs::format::Region| region.start_block * block..region.end_block() * block;
    Areas {
        superblocks: 0..2 * block,
        journal: bytes(superblock.journal),
        checkpoints: bytes(superblock.checkpoint_slots[0]).start
            ..bytes(superblock.checkpoint_slots[1]).end,
        data: bytes(superblock.data),
    }
}

fn is_eio(error: &Error) -> bool {
    error.errno() == libc::EIO
}

#[track_caller]
fn expect_eio<T: std::fmt::Debug>(result: foliofs::Result<T>, what: &str) -> Error {
    let error = result.expect_err(what);
    assert!(is_eio(&error), "{what}: expected EIO, got {} ({error})", error.errno());
    error
}

/// A read-only refusal must say why: the failed write or flush and the
/// device error.
#[track_caller]
fn assert_names_the_cause(error: &Error) {
    let message = error.to_string();
    assert!(
        ["journal write failed", "checkpoint write failed", "flush failed"]
            .iter()
            .any(|cause| message.contains(cause))
            && (message.contains("os error 5") || message.contains("Input/output")),
        "the refusal names its cause: {message}"
    );
}

fn read_all(volume: &Volume, ino: u64) -> Vec<u8> {
    let size = volume.getattr(ino).unwrap().size as usize;
    let mut data = vec![0u8; size];
    let file = volume.open_file(ino, OpenFlags::READ).unwrap();
    let mut done = 0;
    while done < size {
        let count = file.read_at(&mut data[done..], done as u64).unwrap();
        assert!(count > 0, "short read at {done} of {size}");
        done += count;
    }
    data
}

fn fsck_clean(device: &Arc<Device>, what: &str) {
    let report = foliofs::fsck::check(device.clone());
    assert!(report.is_clean(), "{what}: fsck finds {:?}", report.problems);
}

fn create(volume: &Volume, name: &str) -> u64 {
    volume.create(ROOT, name.as_bytes(), 0o644, owner()).unwrap().ino
}

fn direct_buffer(data: &[u8]) -> AlignedBuf {
    AlignedBuf::from_slice(data)
}

// ---------------------------------------------------------------------------
// Targeted tests
// ---------------------------------------------------------------------------

/// Failed writeback: EIO at the next fsync of every open handle, once each;
/// the blocks stay dirty, the retry lands them, and a remount shows them.
fn writeback_errors_reach_every_handle_once_and_nothing_is_dropped(block_bytes: u32) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let areas = areas(&volume);
    let ino = create(&volume, "f");
    let buffered = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let reader = volume.open_file(ino, OpenFlags::READ).unwrap();
    let data = pattern(1, 3 * block_bytes as usize + 77);
    buffered.write_at(&data, 0).unwrap();
    buffered.fsync().unwrap();
    let update = pattern(2, block_bytes as usize + 10);
    buffered.write_at(&update, 100).unwrap();
    let mut expected = data.clone();
    expected[100..100 + update.len()].copy_from_slice(&update);

    raw.add_rule(FaultRule::next(FaultOp::Write, 2).in_range(areas.data.clone()));
    let error = expect_eio(buffered.fdatasync(), "fdatasync over a failing data write");
    assert!(error.to_string().contains("writeback"), "names what failed: {error}");
    // The second failure is consumed by this retry, which the handle has
    // not seen yet.
    expect_eio(buffered.fsync(), "the retry fails too");
    buffered.fsync().expect("the retry succeeds; both failures were reported");
    buffered.fsync().unwrap();
    // Every other handle hears of it exactly once, whatever its mode.
    expect_eio(direct.fsync(), "the direct handle");
    direct.fsync().unwrap();
    expect_eio(reader.fdatasync(), "the read-only handle");
    reader.fdatasync().unwrap();
    let later = volume.open_file(ino, OpenFlags::READ).unwrap();
    later.fsync().expect("a handle opened after every report has nothing to hear");
    assert_eq!(read_all(&volume, ino), expected, "nothing was dropped from the cache");

    let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
    drop((buffered, direct, reader, later));
    drop(volume);
    let (_, volume) = open_image(image).unwrap();
    assert_eq!(read_all(&volume, ino), expected, "the retried data is durable");
    fsck_clean(volume.device(), "after the retry");
}

/// A direct write that fails returns EIO; its range reads as old or new
/// data, the rest of the file is untouched, and the volume stays writable.
fn direct_write_errors_fail_the_write_only(block_bytes: u32) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let areas = areas(&volume);
    let ino = create(&volume, "d");
    let file = volume.open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let block = block_bytes as usize;
    let old = pattern(3, 4 * block);
    file.write_at(&direct_buffer(&old), 0).unwrap();
    file.fsync().unwrap();
    for (pos, length) in [(block, block), (0, 4 * block), (3 * block, 2 * block), (512, 1024)] {
        let new = pattern(pos as u64 + 9, length);
        raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(areas.data.clone()));
        expect_eio(file.write_at(&direct_buffer(&new), pos as u64), "direct write");
        raw.clear_rules();
        let now = read_all(&volume, ino);
        assert!(now.len() >= old.len() && now.len() <= old.len().max(pos + length));
        for (index, &byte) in now.iter().enumerate() {
            let was = old.get(index).copied().unwrap_or(0);
            let inside = (pos..pos + length).contains(&index);
            assert!(
                byte == was || (inside && byte == new[index - pos]),
                "byte {index} after a failed direct write at {pos}+{length}: {byte} (was {was})"
            );
        }
        // Put the old content back for the next round.
        file.set_len(old.len() as u64).unwrap();
        file.write_at(&direct_buffer(&old), 0).unwrap();
    }
    file.fsync().unwrap();
    volume.create(ROOT, b"still-writable", 0o644, owner()).unwrap();
    drop(file);
    volume.close().unwrap();
    let (_, volume) = open_image(raw.image()).unwrap();
    assert_eq!(read_all(&volume, ino), old);
}

/// Everything a read-only volume must refuse, and what it must still do.
fn assert_read_only(volume: &Volume, ino: u64, expected: &[u8], block_bytes: u32) {
    let refusals: Vec<(&str, foliofs::Result<()>)> = vec![
        ("create", volume.create(ROOT, b"new", 0o644, owner()).map(|_| ())),
        ("mkdir", volume.mkdir(ROOT, b"newdir", 0o755, owner()).map(|_| ())),
        ("unlink", volume.unlink(ROOT, b"f")),
        ("open for writing", volume.open_file(ino, OpenFlags::WRITE).map(|_| ())),
        ("checkpoint", volume.checkpoint()),
    ];
    for (what, result) in refusals {
        let error = result.expect_err(what);
        assert_eq!(error.errno(), libc::EROFS, "{what}: {error}");
        assert_names_the_cause(&error);
    }
    assert!(volume.sync().is_err(), "syncfs fails");
    assert_eq!(read_all(volume, ino), expected, "reads still work");
    let direct = volume.open_file(ino, OpenFlags::READ.with_direct()).unwrap();
    let mut buffer = AlignedBuf::zeroed(block_bytes as usize);
    direct.read_at(&mut buffer, 0).expect("direct reads still work");
    assert_eq!(&buffer[..], &expected[..block_bytes as usize]);
}

/// Changes through handles opened before the volume turned read-only.
fn assert_handles_refuse(buffered: &File, direct: &File, block_bytes: u32) {
    let block = block_bytes as usize;
    let attempts: Vec<(&str, foliofs::Result<()>)> = vec![
        ("buffered write", buffered.write_at(b"late", 0).map(|_| ())),
        ("set_len", buffered.set_len(1)),
        ("fallocate", buffered.fallocate(FallocateMode::PunchHole, 0, block_bytes.into())),
        // An overwrite of written blocks changes no metadata, but the
        // volume promised to change nothing more.
        ("direct overwrite", direct.write_at(&AlignedBuf::zeroed(block), 0).map(|_| ())),
        (
            "asynchronous direct overwrite",
            foliofs::completion::block_on(direct.write_at_async(AlignedBuf::zeroed(block), 0))
                .1
                .map(|_| ()),
        ),
    ];
    for (what, result) in attempts {
        let error = result.expect_err(what);
        assert_eq!(error.errno(), libc::EROFS, "{what}: {error}");
        assert_names_the_cause(&error);
    }
    for (what, result) in [("fsync", buffered.fsync()), ("fdatasync", direct.fdatasync())] {
        let error = result.expect_err(what);
        assert!([libc::EIO, libc::EROFS].contains(&error.errno()), "{what}: {error}");
    }
}

/// Files f (fsynced) and g (written, never synced) and both handles of f.
fn metadata_fault_setup(
    block_bytes: u32,
    journal_bytes: Option<u64>,
) -> (Arc<FaultDev>, Volume, Areas, u64, Vec<u8>, File, File) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, journal_bytes, &options());
    let areas = areas(&volume);
    let ino = create(&volume, "f");
    let buffered = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let data = pattern(5, 2 * block_bytes as usize + 300);
    buffered.write_at(&data, 0).unwrap();
    buffered.fsync().unwrap();
    (raw, volume, areas, ino, data, buffered, direct)
}

/// After the fault: the image as it is and as a power cut leaves it mount
/// with the fsynced file intact and fsck clean.
fn assert_fsynced_survives(raw: &FaultDev, ino: u64, expected: &[u8]) {
    raw.clear_rules();
    for image in [raw.image(), raw.crash_image(raw.log_len(), &|_| Keep::Nothing)] {
        let (_, volume) = open_image(image).unwrap();
        assert_eq!(read_all(&volume, ino), expected, "the fsynced file survives");
        fsck_clean(volume.device(), "after a metadata fault");
        REMOUNTS_CHECKED.fetch_add(1, Ordering::Relaxed);
    }
}

/// A disk whose volatile cache is lost with a failed flush (what
/// `FaultDev::drop_cache_on_failed_flush` models): writes the engine
/// already issued vanish. The fsync whose flush failed reports EIO; a later
/// fsync either fails too or has really made the data durable (never Ok
/// over lost writes); what was fsynced before the failure is all there in
/// the image as it is and as a power cut leaves it, fsck-clean. Each round
/// fails a different flush of the fsync (the one before its journal write,
/// or later ones), and fsyncs through buffered, direct and O_DSYNC paths.
fn a_flush_failure_that_drops_the_disk_cache_loses_nothing_fsynced(block_bytes: u32) {
    let block = block_bytes as usize;
    for round in 0..6u64 {
        let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
        raw.drop_cache_on_failed_flush(true);
        let synced = create(&volume, "synced");
        let synced_data = pattern(round, 3 * block + 100);
        let handle = volume.open_file(synced, OpenFlags::READ_WRITE).unwrap();
        handle.write_at(&synced_data, 0).unwrap();
        handle.fsync().unwrap();
        drop(handle);
        // Written, not yet durable: a buffered file, a direct one.
        let lost = create(&volume, "lost");
        let lost_data = pattern(round + 100, 2 * block + 7);
        let buffered = volume.open_file(lost, OpenFlags::READ_WRITE).unwrap();
        buffered.write_at(&lost_data, 0).unwrap();
        let direct_ino = create(&volume, "direct");
        let direct_data = pattern(round + 200, 2 * block);
        let direct = volume.open_file(direct_ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
        direct.write_at(&direct_buffer(&direct_data), 0).unwrap();
        let dropped_before = raw.writes_dropped();
        raw.add_rule(FaultRule::next(FaultOp::Flush, 1 + round % 3));
        let failed = if round < 3 { buffered.fsync() } else { direct.fsync() };
        expect_eio(failed, "fsync whose flush fails");
        assert!(raw.writes_dropped() > dropped_before, "round {round}: the cache was dropped");
        raw.clear_rules();
        // No fsync may now claim what the disk lost.
        let later = [buffered.fsync(), direct.fsync(), volume.sync()];
        let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        for (index, (ino, data)) in
            [(lost, &lost_data), (direct_ino, &direct_data)].iter().enumerate()
        {
            if later[index].is_ok() && later[2].is_ok() {
                assert_eq!(&read_all(&recovered, *ino), *data, "round {round}: fsync said durable");
            }
        }
        drop(recovered);
        drop((buffered, direct));
        for image in [raw.image(), raw.crash_image(raw.log_len(), &|_| Keep::Nothing)] {
            let (_, volume) = open_image(image).unwrap();
            assert_eq!(read_all(&volume, synced), synced_data, "round {round}: fsynced file");
            fsck_clean(volume.device(), "after a flush that dropped the cache");
            REMOUNTS_CHECKED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The case of `a_flush_failure_that_drops_the_disk_cache_loses_nothing_fsynced`
/// with nothing for the journal to commit: overwrites of written blocks
/// (buffered, and direct without FUA), whose fdatasync is the data write and
/// a flush alone. The flush fails and the disk loses the data; a later
/// fdatasync finds nothing dirty, and its own flush succeeds, but must not
/// report the lost overwrite durable.
fn an_overwrite_lost_with_the_disk_cache_is_never_reported_durable(block_bytes: u32) {
    let block = block_bytes as usize;
    for direct in [false, true] {
        let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
        let ino = create(&volume, "f");
        let first = pattern(1, 4 * block);
        let flags =
            if direct { OpenFlags::READ_WRITE.with_direct() } else { OpenFlags::READ_WRITE };
        let handle = volume.open_file(ino, flags).unwrap();
        handle.write_at(&direct_buffer(&first), 0).unwrap();
        handle.fsync().unwrap();
        raw.drop_cache_on_failed_flush(true);
        let second = pattern(2, 4 * block);
        let dropped_before = raw.writes_dropped();
        raw.add_rule(FaultRule::next(FaultOp::Flush, 1));
        let written = handle.write_at(&direct_buffer(&second), 0);
        let failed = written.and_then(|_| handle.fdatasync());
        expect_eio(failed, "the overwrite's fdatasync whose flush fails");
        assert!(raw.writes_dropped() > dropped_before, "direct {direct}: the cache was dropped");
        raw.clear_rules();
        let later = handle.fdatasync();
        let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let on_disk = read_all(&recovered, ino);
        assert!(
            later.is_err() || on_disk == second,
            "direct {direct}: a later fdatasync returned Ok over the lost overwrite"
        );
        assert!(on_disk == first || on_disk == second, "direct {direct}: old or new data");
    }
}

fn journal_write_error_makes_the_volume_read_only(block_bytes: u32) {
    let (raw, volume, areas, ino, data, buffered, direct) = metadata_fault_setup(block_bytes, None);
    let other = create(&volume, "g");
    raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(areas.journal.clone()));
    let handle = volume.open_file(other, OpenFlags::READ).unwrap();
    let error = expect_eio(handle.fsync(), "fsync whose journal write fails");
    assert!(error.to_string().contains("journal write failed"), "{error}");
    assert_eq!(raw.failures_injected(), 1);
    raw.clear_rules();
    assert_read_only(&volume, ino, &data, block_bytes);
    assert_handles_refuse(&buffered, &direct, block_bytes);
    let error = volume.close().expect_err("close reports the failure");
    assert_eq!(error.errno(), libc::EROFS);
    drop((buffered, direct, handle));
    assert_fsynced_survives(&raw, ino, &data);
}

fn checkpoint_write_error_makes_the_volume_read_only(block_bytes: u32) {
    let (raw, volume, areas, ino, data, buffered, direct) = metadata_fault_setup(block_bytes, None);
    raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(areas.checkpoints.clone()));
    let error = volume.checkpoint().expect_err("checkpoint whose write fails");
    assert_eq!(error.errno(), libc::EROFS, "{error}");
    assert_names_the_cause(&error);
    raw.clear_rules();
    assert_read_only(&volume, ino, &data, block_bytes);
    assert_handles_refuse(&buffered, &direct, block_bytes);
    drop((buffered, direct));
    drop(volume);
    assert_fsynced_survives(&raw, ino, &data);

    // A checkpoint the journal forces (it is full) fails the same way.
    let (raw, volume, areas, ino, data, buffered, _direct) =
        metadata_fault_setup(block_bytes, Some(64 << 10));
    raw.add_rule(FaultRule::every_nth(FaultOp::Write, 1).in_range(areas.checkpoints.clone()));
    let mut failed = None;
    for index in 0..400 {
        let name = format!("n{index}");
        let result = volume
            .create(ROOT, name.as_bytes(), 0o644, owner())
            .and_then(|attr| volume.fsync_inode(attr.ino, false));
        if let Err(error) = result {
            failed = Some(error);
            break;
        }
    }
    let error = failed.expect("the journal filled and its checkpoint failed");
    assert!([libc::EIO, libc::EROFS].contains(&error.errno()), "{error}");
    assert!(error.to_string().contains("checkpoint write failed"), "{error}");
    let refused = buffered.write_at(b"x", 0).expect_err("read-only");
    assert_eq!(refused.errno(), libc::EROFS);
    drop(buffered);
    drop(volume);
    assert_fsynced_survives(&raw, ino, &data);
}

/// A failed read returns EIO and leaves nothing in the cache: the same
/// read without the fault returns the data. Each round mounts afresh, so
/// nothing is cached before the fault.
fn read_errors_fail_the_read_and_cache_nothing(block_bytes: u32) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let areas = areas(&volume);
    let ino = create(&volume, "r");
    let data = pattern(7, 6 * block_bytes as usize + 5);
    {
        let file = volume.open_file(ino, OpenFlags::WRITE).unwrap();
        file.write_at(&data, 0).unwrap();
        file.fsync().unwrap();
    }
    drop(volume);
    let image = raw.image();
    let block = block_bytes as usize;
    let mut injected = 0;
    for (pos, length) in [(0usize, 10usize), (block + 3, 2 * block), (5 * block, block + 5)] {
        let (raw, volume) = open_image(image.clone()).unwrap();
        let buffered = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
        raw.add_rule(FaultRule::next(FaultOp::Read, 1).in_range(areas.data.clone()));
        let mut buffer = vec![0u8; length];
        expect_eio(buffered.read_at(&mut buffer, pos as u64), "buffered read");
        let count = buffered.read_at(&mut buffer, pos as u64).unwrap();
        assert_eq!(&buffer[..count], &data[pos..pos + count], "no garbage was cached");
        // A partial-block write needs the block's old bytes: their read
        // failing fails the write, which changes nothing.
        let target = (pos + length + block / 2).min(data.len() - 2);
        raw.add_rule(FaultRule::next(FaultOp::Read, 1).in_range(areas.data.clone()));
        match buffered.write_at(b"zz", target as u64) {
            Err(error) => assert!(is_eio(&error), "{error}"),
            // The block was read ahead by the read above.
            Ok(_) => {
                buffered.write_at(&data[target..target + 2], target as u64).map(|_| ()).unwrap()
            }
        }
        raw.clear_rules();
        assert_eq!(read_all(&volume, ino), data);
        injected += raw.failures_injected();
    }
    let (raw, volume) = open_image(image).unwrap();
    let direct = volume.open_file(ino, OpenFlags::READ.with_direct()).unwrap();
    raw.add_rule(FaultRule::next(FaultOp::Read, 1).in_range(areas.data.clone()));
    let mut buffer = AlignedBuf::zeroed(2 * block);
    expect_eio(direct.read_at(&mut buffer, 0), "direct read");
    direct.read_at(&mut buffer, 0).unwrap();
    assert_eq!(&buffer[..], &data[..2 * block]);
    FAULTS_INJECTED.fetch_add(injected + raw.failures_injected(), Ordering::Relaxed);
}

/// A volume whose journal has wrapped past several checkpoints, so that
/// the older checkpoint slot no longer leads to the current state.
fn wrapped_volume(block_bytes: u32) -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, Some(64 << 10), &options());
    let mut files = Vec::new();
    for index in 0..60u64 {
        let name = format!("w{index}");
        let ino = create(&volume, &name);
        let file = volume.open_file(ino, OpenFlags::WRITE).unwrap();
        let data = pattern(index, 100 + index as usize * 37);
        file.write_at(&data, 0).unwrap();
        file.fsync().unwrap();
        files.push((name, data));
    }
    let image = raw.image();
    drop(volume);
    (image, files)
}

/// EIO on any single read while mounting (superblock, checkpoint header or
/// payload, journal) fails the mount with EIO, or the mount goes on with
/// the whole state; it never falls back to an older one silently.
fn read_errors_while_mounting_fail_with_eio_never_an_older_state(block_bytes: u32) {
    let (image, files) = wrapped_volume(block_bytes);
    let mut failed_with_eio = 0;
    for nth in 0..64u64 {
        let raw = Arc::new(FaultDev::from_image(image.clone(), 512));
        let mut rule = FaultRule::next(FaultOp::Read, 1);
        rule.after = nth;
        raw.add_rule(rule);
        let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
        let opened = Volume::open_device(device, &options());
        let injected = raw.failures_injected();
        raw.clear_rules();
        match opened {
            Err(error) => {
                assert!(injected == 1, "read {nth}: {error}");
                assert_eq!(error.errno(), libc::EIO, "read {nth} failing fails the mount: {error}");
                failed_with_eio += 1;
            }
            Ok(volume) => {
                for (name, data) in &files {
                    let ino = volume
                        .lookup(ROOT, name.as_bytes())
                        .unwrap_or_else(|error| {
                            panic!("read {nth} failing: {name} lost on mount: {error}")
                        })
                        .ino;
                    assert_eq!(&read_all(&volume, ino), data, "read {nth}: {name}");
                }
                if injected == 0 {
                    break; // Past the mount's last read.
                }
            }
        }
    }
    assert!(failed_with_eio > 0, "some mount read failed");
    FAULTS_INJECTED.fetch_add(failed_with_eio, Ordering::Relaxed);
}

/// Regression: with neither superblock copy readable the mount said "not a
/// foliofs volume" (EUCLEAN); it is the device's EIO. One unreadable copy
/// falls back to the other, written at the same time.
fn superblock_read_errors_fail_the_mount_with_eio(block_bytes: u32) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let ino = create(&volume, "s");
    volume.open_file(ino, OpenFlags::READ).unwrap().fsync().unwrap();
    let superblocks = areas(&volume).superblocks;
    drop(volume);
    let image = raw.image();
    for (rule, fails) in [
        (FaultRule::every_nth(FaultOp::Read, 1).in_range(superblocks.clone()), true),
        (FaultRule::next(FaultOp::Read, 1).in_range(0..512), false),
    ] {
        let raw = Arc::new(FaultDev::from_image(image.clone(), 512));
        raw.add_rule(rule);
        let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
        match Volume::open_device(device, &options()) {
            Err(error) => {
                assert!(fails, "one copy was readable: {error}");
                assert!(is_eio(&error), "{error}");
            }
            Ok(volume) => {
                assert!(!fails, "mounted with no readable superblock");
                volume.lookup(ROOT, b"s").unwrap();
            }
        }
    }
}

/// mkfs whose superblock writes (its last step) fail reports EIO and leaves
/// nothing that mounts.
fn superblock_write_errors_fail_mkfs_cleanly(block_bytes: u32) {
    for copy in 0..2u64 {
        let raw = Arc::new(FaultDev::new(16 << 20, 512));
        let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
        let at = copy * u64::from(block_bytes);
        raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(at..at + 512));
        let mkfs = MkfsOptions { block_bytes, journal_bytes: None, root_owner: owner() };
        let error = Volume::format(&device, &mkfs).expect_err("mkfs fails");
        assert!(is_eio(&error), "{error}");
        assert!(error.to_string().contains("superblock"), "{error}");
        raw.clear_rules();
        // Copy A failing leaves no superblock; copy B failing leaves A, and
        // the volume mounts (fsck notes the missing copy).
        match Volume::open_device(device.clone(), &options()) {
            Err(error) => assert_eq!(copy, 0, "{error}"),
            Ok(volume) => {
                assert_eq!(copy, 1);
                assert!(volume.readdir(ROOT).unwrap().is_empty());
            }
        }
    }
    // A failing flush at the end of mkfs is reported too.
    let raw = Arc::new(FaultDev::new(16 << 20, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    raw.add_rule(FaultRule::every_nth(FaultOp::Flush, 1));
    let mkfs = MkfsOptions { block_bytes, journal_bytes: None, root_owner: owner() };
    expect_eio(Volume::format(&device, &mkfs).map(|_| ()), "mkfs with failing flushes");
}

/// Regression: writeback re-dirties each failed range in every folio of
/// its batch, and a range before a folio underflowed `Folio::blocks_of`
/// (a panic) when a batch had several runs and an early one failed.
fn writeback_failure_of_several_runs_keeps_them_dirty(block_bytes: u32) {
    let options = VolumeOptions { folio_max_bytes: block_bytes.into(), ..options() };
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options);
    let areas = areas(&volume);
    let ino = create(&volume, "runs");
    let file = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let block = block_bytes as usize;
    let mut expected = vec![0u8; 7 * block];
    for run in [0, 2, 4, 6] {
        let data = pattern(run as u64, block);
        file.write_at(&data, (run * block) as u64).unwrap();
        expected[run * block..(run + 1) * block].copy_from_slice(&data);
    }
    raw.add_rule(FaultRule::every_nth(FaultOp::Write, 1).in_range(areas.data.clone()));
    expect_eio(file.fsync(), "every run fails");
    raw.clear_rules();
    file.fsync().expect("the retry writes every run");
    assert_eq!(read_all(&volume, ino), expected);
    drop(file);
    let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
    drop(volume);
    let (_, volume) = open_image(image).unwrap();
    assert_eq!(read_all(&volume, ino), expected, "every run is durable");
}

/// Regression: truncation dropped the cached folios past the new end before
/// zeroing the new last block on disk, so when that read-modify-write
/// failed the truncate returned EIO with the size unchanged but the dirty
/// data past the new end gone (reads showed older data from the disk).
fn failed_truncate_leaves_the_file_as_it_was(block_bytes: u32) {
    // One block per folio: the dirty blocks past the new end are in folios
    // of their own, which truncation drops without writing them back.
    let options = VolumeOptions { folio_max_bytes: block_bytes.into(), ..options() };
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options);
    let areas = areas(&volume);
    let ino = create(&volume, "t");
    let file = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let block = block_bytes as usize;
    let mut expected = pattern(11, 4 * block);
    file.write_at(&expected, 0).unwrap();
    file.fsync().unwrap();
    let update = pattern(12, 2 * block);
    file.write_at(&update, 2 * block as u64).unwrap();
    expected[2 * block..].copy_from_slice(&update);
    for (op, rule) in [
        (FaultOp::Read, FaultRule::next(FaultOp::Read, 1)),
        (FaultOp::Write, FaultRule::next(FaultOp::Write, 1)),
    ] {
        raw.add_rule(rule.in_range(areas.data.clone()));
        expect_eio(file.set_len(block as u64 + 100), &format!("truncate whose {op:?} fails"));
        raw.clear_rules();
        assert_eq!(read_all(&volume, ino), expected, "{op:?}: nothing was lost");
    }
    file.fsync().unwrap();
    file.set_len(block as u64 + 100).unwrap();
    expected.truncate(block + 100);
    drop(file);
    volume.close().unwrap();
    let (_, volume) = open_image_with(raw.image(), &options).unwrap();
    assert_eq!(read_all(&volume, ino), expected);
}

/// Regression: a failed run holds back the on-disk size of the runs after
/// it; when a range writeback (here a direct read's) retried the failed run
/// and left the file clean, the size stayed behind, syncfs skipped the clean
/// file and reported success, and a power cut lost the appended data.
fn size_held_back_by_a_failure_catches_up_at_syncfs(block_bytes: u32) {
    let options = VolumeOptions { folio_max_bytes: block_bytes.into(), ..options() };
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options);
    let ino = create(&volume, "grow");
    let file = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.open_file(ino, OpenFlags::READ.with_direct()).unwrap();
    let block = block_bytes as usize;
    let mut expected = pattern(21, 2 * block);
    file.write_at(&expected, 0).unwrap();
    file.fsync().unwrap();
    // Run 1 overwrites block 1, whose device place is known; run 2 appends
    // blocks 3 and 4 after a hole.
    let block_1 = volume
        .fiemap(ino)
        .unwrap()
        .iter()
        .find(|extent| {
            extent.logical <= block as u64 && block as u64 * 2 <= extent.logical + extent.length
        })
        .map(|extent| extent.physical + block as u64 - extent.logical)
        .expect("block 1 is mapped");
    let overwrite = pattern(22, block);
    let append = pattern(23, 2 * block);
    file.write_at(&overwrite, block as u64).unwrap();
    file.write_at(&append, 3 * block as u64).unwrap();
    expected[block..].copy_from_slice(&overwrite);
    expected.resize(3 * block, 0);
    expected.extend_from_slice(&append);
    raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(block_1..block_1 + block as u64));
    expect_eio(file.fsync(), "run 1 fails");
    raw.clear_rules();
    let mut buffer = AlignedBuf::zeroed(block);
    direct.read_at(&mut buffer, block as u64).unwrap();
    assert_eq!(&buffer[..], &overwrite[..]);
    volume.sync().unwrap();
    let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
    drop((file, direct));
    drop(volume);
    let (_, volume) = open_image_with(image, &options).unwrap();
    assert_eq!(read_all(&volume, ino), expected, "syncfs made the appended runs durable");
}

// ---------------------------------------------------------------------------
// Random workloads against a model
// ---------------------------------------------------------------------------

/// Which requests a workload's rules fail.
#[derive(Clone, Copy, Debug)]
enum Plan {
    DataWrites,
    MetadataWrites,
    Reads,
    Flushes,
    Mixed,
}

struct ModelFile {
    name: String,
    ino: u64,
    /// What reads must return now.
    live: Vec<u8>,
    /// The content at the last successful fsync (or syncfs), if nothing
    /// changed the file since.
    durable: Option<Vec<u8>>,
    /// Some fsync succeeded: its name must survive.
    named_durably: bool,
    buffered: File,
    direct: File,
    /// Another handle's fsync reported a writeback failure this one has
    /// not: its next fsync must fail.
    owed: [bool; 2],
}

struct Workload {
    rng: ChaCha8Rng,
    raw: Arc<FaultDev>,
    volume: Volume,
    areas: Areas,
    block: u64,
    plan: Plan,
    rules_seed: u64,
    armed: bool,
    files: Vec<ModelFile>,
    /// Why the volume refuses changes, once it does.
    read_only: Option<String>,
    log: Vec<String>,
    next_name: u64,
}

const FILE_BYTES_MAX: u64 = 300 << 10;

impl Workload {
    fn new(block_bytes: u32, plan: Plan, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let journal = if rng.random_bool(0.5) { Some(64 << 10) } else { None };
        let (raw, volume) = new_volume_with_options(32 << 20, block_bytes, journal, &options());
        let areas = areas(&volume);
        let mut workload = Self {
            rng,
            raw,
            volume,
            areas,
            block: u64::from(block_bytes),
            plan,
            rules_seed: seed,
            armed: false,
            files: Vec::new(),
            read_only: None,
            log: Vec::new(),
            next_name: 0,
        };
        for _ in 0..3 {
            workload.create_file();
        }
        for index in 0..workload.files.len() {
            workload.files[index].buffered.fsync().unwrap();
            workload.files[index].durable = Some(Vec::new());
            workload.files[index].named_durably = true;
        }
        workload
    }

    fn rules(&mut self) -> Vec<FaultRule> {
        self.rules_seed = self.rules_seed.wrapping_add(1);
        let seed = self.rules_seed;
        let areas = &self.areas;
        let metadata = areas.superblocks.start..areas.data.start;
        let random = self.rng.random_bool(0.5);
        let every = self.rng.random_range(2..12);
        let probability = self.rng.random_range(0.02..0.3);
        let rule = |op: FaultOp, range: Option<Range<u64>>, salt: u64| {
            let rule = if random {
                FaultRule::random(op, probability, seed.wrapping_mul(31).wrapping_add(salt))
            } else {
                FaultRule::every_nth(op, every)
            };
            match range {
                Some(range) => rule.in_range(range),
                None => rule,
            }
        };
        match self.plan {
            Plan::DataWrites => vec![rule(FaultOp::Write, Some(areas.data.clone()), 1)],
            Plan::MetadataWrites => {
                let range = match self.rng.random_range(0..3) {
                    0 => areas.journal.clone(),
                    1 => areas.checkpoints.clone(),
                    _ => metadata,
                };
                vec![rule(FaultOp::Write, Some(range), 2)]
            }
            Plan::Reads => vec![rule(FaultOp::Read, None, 3)],
            Plan::Flushes => vec![rule(FaultOp::Flush, None, 4)],
            Plan::Mixed => vec![
                rule(FaultOp::Write, Some(areas.data.clone()), 5),
                rule(FaultOp::Read, None, 6),
                FaultRule::random(FaultOp::Any, 0.01, seed ^ 0x5EED),
            ],
        }
    }

    fn arm(&mut self) {
        if !self.armed {
            for rule in self.rules() {
                self.raw.add_rule(rule);
            }
            self.armed = true;
            self.log.push("arm".into());
        }
    }

    fn disarm(&mut self) {
        self.raw.clear_rules();
        if self.armed {
            self.log.push("disarm".into());
        }
        self.armed = false;
    }

    fn context(&self) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(12).collect();
        format!("{:?} seed {}; last ops (newest first): {tail:?}", self.plan, self.rules_seed)
    }

    /// Classifies a failed call: EIO, or EROFS from a read-only volume
    /// whose message names the cause. Notes when the volume turns
    /// read-only.
    fn check_error(&mut self, what: &str, error: &Error) {
        let errno = error.errno();
        let message = error.to_string();
        self.log.push(format!("-> {what} failed: {message}"));
        let context = self.context();
        assert!(
            errno == libc::EIO || errno == libc::EROFS,
            "{what}: unexpected errno {errno}: {message} ({context})"
        );
        if message.contains("read-only") {
            assert_names_the_cause(error);
            if self.read_only.is_none() {
                WENT_READ_ONLY.fetch_add(1, Ordering::Relaxed);
                self.read_only = Some(message.clone());
            }
        }
        if errno == libc::EROFS {
            assert!(self.read_only.is_some(), "{what}: EROFS from a writable volume ({context})");
        }
        // With no fault armed a call fails only to report an earlier
        // writeback failure (fsync) or because the volume is read-only.
        let stale_report = what == "fsync" && message.contains("writeback");
        if !self.armed && self.read_only.is_none() && !stale_report {
            panic!("{what} failed with no fault armed: {message} ({context})");
        }
    }

    /// A change succeeded: the volume must not be read-only.
    fn check_change_allowed(&self, what: &str) {
        assert!(
            self.read_only.is_none(),
            "{what} succeeded on a read-only volume ({:?}; {})",
            self.read_only,
            self.context()
        );
    }

    /// The file's content read with the rules cleared.
    fn read_back(&mut self, index: usize) -> Vec<u8> {
        let armed = self.armed;
        self.disarm();
        let content = read_all(&self.volume, self.files[index].ino);
        if armed {
            self.arm();
        }
        content
    }

    /// After a failed change: the content is, byte by byte, what it was or
    /// what the change would have made; the model adopts it.
    fn settle_after_failure(&mut self, index: usize, intended: &[u8], what: &str) {
        let now = self.read_back(index);
        let old = &self.files[index].live;
        let long = old.len().max(intended.len());
        assert!(
            now.len() == old.len()
                || now.len() == intended.len()
                || (now.len() >= old.len().min(intended.len()) && now.len() <= long),
            "{what}: size {} after a failure (was {}, intended {}) ({})",
            now.len(),
            old.len(),
            intended.len(),
            self.context()
        );
        for (offset, &byte) in now.iter().enumerate() {
            let was = old.get(offset).copied().unwrap_or(0);
            let would = intended.get(offset).copied().unwrap_or(0);
            assert!(
                byte == was || byte == would,
                "{what}: byte {offset} is {byte} after a failure, neither {was} nor {would} ({})",
                self.context()
            );
        }
        let file = &mut self.files[index];
        file.live = now;
        file.durable = None;
    }

    fn changed(&mut self, index: usize, content: Vec<u8>) {
        let file = &mut self.files[index];
        file.live = content;
        file.durable = None;
    }

    fn create_file(&mut self) {
        let name = format!("file{}", self.next_name);
        self.next_name += 1;
        let result = self.volume.create(ROOT, name.as_bytes(), 0o644, owner());
        self.log.push(format!("create {name}"));
        let ino = match result {
            Ok(attr) => {
                self.check_change_allowed("create");
                attr.ino
            }
            Err(error) => {
                self.check_error("create", &error);
                // The record may have been applied before its commit failed.
                match self.volume.lookup(ROOT, name.as_bytes()) {
                    Ok(attr) => attr.ino,
                    Err(_) => return,
                }
            }
        };
        let open = |flags| self.volume.open_file(ino, flags);
        let (Ok(buffered), Ok(direct)) =
            (open(OpenFlags::READ_WRITE), open(OpenFlags::READ_WRITE.with_direct()))
        else {
            assert!(self.read_only.is_some(), "opening a new file failed on a writable volume");
            return;
        };
        self.files.push(ModelFile {
            name,
            ino,
            live: Vec::new(),
            durable: None,
            named_durably: false,
            buffered,
            direct,
            owed: [false; 2],
        });
    }

    fn step(&mut self) {
        OPS_RUN.fetch_add(1, Ordering::Relaxed);
        let toggle = self.rng.random_bool(0.08);
        if toggle {
            if self.armed {
                self.disarm();
            } else {
                self.arm();
            }
        }
        let index = self.rng.random_range(0..self.files.len());
        match self.rng.random_range(0..100) {
            0..=29 => self.write(index),
            30..=44 => self.read(index),
            45..=59 => self.fsync(index),
            60..=67 => self.truncate(index),
            68..=75 => self.fallocate(index),
            76..=79 => self.syncfs(),
            80..=82 => {
                if self.files.len() < 6 {
                    self.create_file();
                }
            }
            83..=85 => {
                let result = self.volume.checkpoint();
                self.log.push("checkpoint".into());
                if let Err(error) = result {
                    self.check_error("checkpoint", &error);
                }
            }
            _ => self.verify_live(index),
        }
    }

    fn write(&mut self, index: usize) {
        let direct = self.rng.random_bool(0.4);
        let unit = if direct { 512 } else { 1 };
        let end_max = FILE_BYTES_MAX / unit;
        let start = self.rng.random_range(0..end_max - 1);
        let length = self.rng.random_range(1..=(end_max - start).min(3 * self.block / unit + 2));
        let (pos, length) = ((start * unit) as usize, (length * unit) as usize);
        let data = pattern(self.rng.random(), length);
        let mut intended = self.files[index].live.clone();
        if intended.len() < pos + length {
            intended.resize(pos + length, 0);
        }
        intended[pos..pos + length].copy_from_slice(&data);
        self.log.push(format!("write {} {pos}+{length} direct={direct}", self.files[index].name));
        let file = &self.files[index];
        let injected_before = self.raw.failures_injected();
        let result = if direct {
            file.direct.write_at(&direct_buffer(&data), pos as u64)
        } else {
            file.buffered.write_at(&data, pos as u64)
        };
        match result {
            Ok(count) if count == length => {
                self.check_change_allowed("write");
                self.changed(index, intended);
            }
            Ok(count) => {
                // A short write: what it counts is written; the rest failed.
                self.log.push(format!("-> short write of {count}"));
                self.check_change_allowed("write");
                self.settle_after_failure(index, &intended, "short write");
                let live = &self.files[index].live;
                assert!(live[pos..pos + count] == data[..count], "short write's bytes");
            }
            Err(error) => {
                self.check_error("write", &error);
                self.note_writeback_report(index, None, &error, injected_before);
                self.settle_after_failure(index, &intended, "write");
            }
        }
    }

    fn read(&mut self, index: usize) {
        let direct = self.rng.random_bool(0.4);
        let unit = if direct { 512 } else { 1 };
        let start = self.rng.random_range(0..FILE_BYTES_MAX / unit);
        let length = self.rng.random_range(1..=4 * self.block / unit);
        let (pos, length) = ((start * unit) as usize, (length * unit) as usize);
        self.log.push(format!("read {} {pos}+{length} direct={direct}", self.files[index].name));
        let file = &self.files[index];
        let mut plain = vec![0u8; length];
        let mut aligned = AlignedBuf::zeroed(length);
        let injected_before = self.raw.failures_injected();
        let result = if direct {
            file.direct.read_at(&mut aligned, pos as u64)
        } else {
            file.buffered.read_at(&mut plain, pos as u64)
        };
        let got: &[u8] = if direct { &aligned } else { &plain };
        match result {
            Ok(count) => {
                let live = &self.files[index].live;
                let expected = &live[pos.min(live.len())..(pos + length).min(live.len())];
                assert!(
                    &got[..count] == expected,
                    "read of {pos}+{length} returned other bytes ({})",
                    self.context()
                );
            }
            Err(error) => {
                self.check_error("read", &error);
                self.note_writeback_report(index, None, &error, injected_before);
                // Nothing the failure left in the cache may show.
                self.verify_live(index);
            }
        }
    }

    /// A writeback failure that happened during the call (the device failed
    /// a request meanwhile: `injected_before` tells) advanced the file's
    /// error sequence: every handle but `reporter` owes a report. (A report
    /// of an older failure owes nobody anything new.)
    fn note_writeback_report(
        &mut self,
        index: usize,
        reporter: Option<usize>,
        error: &Error,
        injected_before: u64,
    ) {
        let new_failure = self.raw.failures_injected() > injected_before;
        if new_failure && error.to_string().contains("writeback") {
            for (handle, owed) in self.files[index].owed.iter_mut().enumerate() {
                if Some(handle) != reporter {
                    *owed = true;
                }
            }
        }
    }

    fn fsync(&mut self, index: usize) {
        let handle = self.rng.random_range(0..2);
        let data_only = self.rng.random_bool(0.3);
        self.log.push(format!(
            "fsync {} handle {handle} data_only={data_only}",
            self.files[index].name
        ));
        let file = &self.files[index];
        let target = if handle == 0 { &file.buffered } else { &file.direct };
        let injected_before = self.raw.failures_injected();
        let result = if data_only { target.fdatasync() } else { target.fsync() };
        let owed = std::mem::replace(&mut self.files[index].owed[handle], false);
        match result {
            Ok(()) => {
                assert!(
                    !owed,
                    "fsync succeeded on a handle that had not heard of a writeback failure ({})",
                    self.context()
                );
                self.check_change_allowed("fsync");
                let file = &mut self.files[index];
                file.durable = Some(file.live.clone());
                file.named_durably = true;
            }
            Err(error) => {
                self.check_error("fsync", &error);
                self.note_writeback_report(index, Some(handle), &error, injected_before);
            }
        }
    }

    fn truncate(&mut self, index: usize) {
        let size = self.rng.random_range(0..FILE_BYTES_MAX);
        let mut intended = self.files[index].live.clone();
        intended.resize(size as usize, 0);
        self.log.push(format!("truncate {} to {size}", self.files[index].name));
        let injected_before = self.raw.failures_injected();
        match self.files[index].buffered.set_len(size) {
            Ok(()) => {
                self.check_change_allowed("truncate");
                self.changed(index, intended);
            }
            Err(error) => {
                self.check_error("truncate", &error);
                self.note_writeback_report(index, None, &error, injected_before);
                self.settle_after_failure(index, &intended, "truncate");
            }
        }
    }

    fn fallocate(&mut self, index: usize) {
        let modes = [
            FallocateMode::PunchHole,
            FallocateMode::ZeroRange { keep_size: true },
            FallocateMode::ZeroRange { keep_size: false },
            FallocateMode::Allocate { keep_size: false },
        ];
        let mode = modes[self.rng.random_range(0..modes.len())];
        let offset = self.rng.random_range(0..FILE_BYTES_MAX - 1);
        let length = self.rng.random_range(1..=(FILE_BYTES_MAX - offset).min(4 * self.block));
        let mut intended = self.files[index].live.clone();
        common::apply_fallocate_to_model(&mut intended, mode, offset as usize, length as usize);
        self.log.push(format!("fallocate {} {mode:?} {offset}+{length}", self.files[index].name));
        let injected_before = self.raw.failures_injected();
        match self.files[index].buffered.fallocate(mode, offset, length) {
            Ok(()) => {
                self.check_change_allowed("fallocate");
                self.changed(index, intended);
            }
            Err(error) => {
                self.check_error("fallocate", &error);
                self.note_writeback_report(index, None, &error, injected_before);
                self.settle_after_failure(index, &intended, "fallocate");
            }
        }
    }

    fn syncfs(&mut self) {
        self.log.push("syncfs".into());
        match self.volume.sync() {
            Ok(()) => {
                self.check_change_allowed("syncfs");
                for file in &mut self.files {
                    file.durable = Some(file.live.clone());
                    file.named_durably = true;
                }
            }
            Err(error) => self.check_error("syncfs", &error),
        }
    }

    fn verify_live(&mut self, index: usize) {
        let now = self.read_back(index);
        assert!(
            now == self.files[index].live,
            "{} differs from what was written (size {} vs {}) ({})",
            self.files[index].name,
            now.len(),
            self.files[index].live.len(),
            self.context()
        );
    }

    /// Clears the rules, checks the live state, then remounts the image as
    /// a power cut at the last flush leaves it, and as it is: fsynced files
    /// hold their fsynced content, every fsynced name is there, fsck is
    /// clean. A writable volume then closes cleanly with everything.
    fn finish(mut self) {
        self.disarm();
        FAULTS_INJECTED.fetch_add(self.raw.failures_injected(), Ordering::Relaxed);
        for index in 0..self.files.len() {
            self.verify_live(index);
        }
        let images = [
            ("power cut", self.raw.crash_image(self.raw.log_len(), &|_| Keep::Nothing)),
            ("as written", self.raw.image()),
        ];
        for (what, image) in images {
            let (_, volume) = open_image(image).unwrap_or_else(|error| {
                panic!("{what}: mount fails: {error} ({})", self.context())
            });
            for file in &self.files {
                if !file.named_durably {
                    continue;
                }
                let ino = volume.lookup(ROOT, file.name.as_bytes()).unwrap_or_else(|error| {
                    panic!("{what}: fsynced {} is gone: {error} ({})", file.name, self.context())
                });
                assert_eq!(ino.ino, file.ino);
                if let Some(durable) = &file.durable {
                    let content = read_all(&volume, file.ino);
                    assert!(
                        &content == durable,
                        "{what}: {} lost fsynced data (size {} vs {}) ({})",
                        file.name,
                        content.len(),
                        durable.len(),
                        self.context()
                    );
                }
            }
            fsck_clean(volume.device(), what);
            REMOUNTS_CHECKED.fetch_add(1, Ordering::Relaxed);
        }
        let Workload { raw, volume, files, read_only, .. } = self;
        let expected: Vec<(u64, Vec<u8>)> =
            files.iter().map(|file| (file.ino, file.live.clone())).collect();
        drop(files);
        let closed = volume.close();
        match &read_only {
            Some(_) => {
                assert_eq!(closed.expect_err("close of a read-only volume").errno(), libc::EROFS)
            }
            None => {
                closed.expect("close without faults");
                let (_, volume) = open_image(raw.image()).unwrap();
                for (ino, content) in expected {
                    assert_eq!(read_all(&volume, ino), content, "after a clean close");
                }
                REMOUNTS_CHECKED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Far above what a workload takes in a debug build on a loaded machine.
const WORKLOAD_SECONDS_MAX: u64 = 300;

fn run_random(block_bytes: u32, plan: Plan, salt: u64) {
    let workloads = env_u64("FOLIOFS_FAULT_WORKLOADS", 3);
    let ops = env_u64("FOLIOFS_FAULT_OPS", 150);
    let base = env_u64("FOLIOFS_FAULT_SEED", 0xFA17) ^ (salt << 32) ^ u64::from(block_bytes);
    // FOLIOFS_FAULT_FIRST: start at a later workload (to replay one).
    for number in env_u64("FOLIOFS_FAULT_FIRST", 0)..workloads {
        let seed = base.wrapping_add(number * 7919);
        // On a thread of its own, so that a hang fails the test (naming the
        // workload) instead of stalling it.
        let (done, finished) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let mut workload = Workload::new(block_bytes, plan, seed);
            for _ in 0..ops {
                workload.step();
            }
            workload.finish();
            let _ = done.send(());
        });
        match finished.recv_timeout(std::time::Duration::from_secs(WORKLOAD_SECONDS_MAX)) {
            Ok(()) => worker.join().unwrap(),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                // The workload panicked: pass its message on.
                if let Err(panic) = worker.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                "{plan:?} workload {number} (FOLIOFS_FAULT_FIRST={number}) on {block_bytes} B \
                 blocks still runs after {WORKLOAD_SECONDS_MAX} s: a hang"
            ),
        }
    }
    report(&format!("{plan:?}"), block_bytes);
}

fn random_data_write_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::DataWrites, 1);
}

fn random_metadata_write_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::MetadataWrites, 2);
}

fn random_read_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::Reads, 3);
}

fn random_flush_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::Flushes, 4);
}

fn random_mixed_faults(block_bytes: u32) {
    run_random(block_bytes, Plan::Mixed, 5);
}
