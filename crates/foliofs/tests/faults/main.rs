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
#[path = "../common/mod.rs"]
mod common;

mod random;
mod targeted;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use foliofs::dev::fault::{FaultOp, FaultRule, Keep};
use foliofs::dev::{AlignedBuf, Device, FaultDev, FuaMode};
use foliofs::vfs::MkfsOptions;
use foliofs::FallocateMode;
use foliofs::{Error, File, OpenFlags, Volume, VolumeOptions};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{new_volume_with_options, open_image, open_image_with, owner, pattern, ROOT};

use random::*;
use targeted::*;

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

pub(crate) static FAULTS_INJECTED: AtomicU64 = AtomicU64::new(0);
pub(crate) static OPS_RUN: AtomicU64 = AtomicU64::new(0);
pub(crate) static REMOUNTS_CHECKED: AtomicU64 = AtomicU64::new(0);
pub(crate) static WENT_READ_ONLY: AtomicU64 = AtomicU64::new(0);

pub(crate) fn report(test: &str, block_bytes: u32) {
    eprintln!(
        "faults [{test} {block_bytes}]: {} faults injected, {} ops, {} remounts checked, {} \
         volumes turned read-only (cumulative in this process)",
        FAULTS_INJECTED.load(Ordering::Relaxed),
        OPS_RUN.load(Ordering::Relaxed),
        REMOUNTS_CHECKED.load(Ordering::Relaxed),
        WENT_READ_ONLY.load(Ordering::Relaxed),
    );
}

pub(crate) fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

pub(crate) fn options() -> VolumeOptions {
    // A cache large enough that writers are never throttled into a silent
    // background writeback: every writeback failure is one a call reports.
    VolumeOptions { cache_bytes: 256 << 20, ..common::options() }
}

/// Device byte ranges of a volume's areas.
#[derive(Clone)]
pub(crate) struct Areas {
    pub(crate) superblocks: Range<u64>,
    pub(crate) journal: Range<u64>,
    pub(crate) checkpoints: Range<u64>,
    pub(crate) data: Range<u64>,
}

pub(crate) fn areas(volume: &Volume) -> Areas {
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

pub(crate) fn is_eio(error: &Error) -> bool {
    error.errno() == libc::EIO
}

#[track_caller]
pub(crate) fn expect_eio<T: std::fmt::Debug>(result: foliofs::Result<T>, what: &str) -> Error {
    let error = result.expect_err(what);
    assert!(is_eio(&error), "{what}: expected EIO, got {} ({error})", error.errno());
    error
}

/// A read-only refusal must say why: the failed write or flush and the
/// device error.
#[track_caller]
pub(crate) fn assert_names_the_cause(error: &Error) {
    let message = error.to_string();
    assert!(
        ["journal write failed", "checkpoint write failed", "flush failed"]
            .iter()
            .any(|cause| message.contains(cause))
            && (message.contains("os error 5") || message.contains("Input/output")),
        "the refusal names its cause: {message}"
    );
}

pub(crate) fn read_all(volume: &Volume, ino: u64) -> Vec<u8> {
    let size = volume.inodes().getattr(ino).unwrap().size as usize;
    let mut data = vec![0u8; size];
    let file = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let mut done = 0;
    while done < size {
        let count = file.read_at(&mut data[done..], done as u64).unwrap();
        assert!(count > 0, "short read at {done} of {size}");
        done += count;
    }
    data
}

pub(crate) fn fsck_clean(device: &Arc<Device>, what: &str) {
    let report = foliofs::fsck::check(device.clone());
    assert!(report.is_clean(), "{what}: fsck finds {:?}", report.problems);
}

pub(crate) fn create(volume: &Volume, name: &str) -> u64 {
    volume.inodes().create(ROOT, name.as_bytes(), 0o644, owner()).unwrap().ino
}

pub(crate) fn direct_buffer(data: &[u8]) -> AlignedBuf {
    AlignedBuf::from_slice(data)
}
