//! Shared helpers for the integration tests: volumes on the in-memory
//! fault-injecting device, and the block sizes every behaviour is tested on.
#![allow(dead_code, unused_macros)]

use std::sync::Arc;

use foliofs::dev::{Device, FaultDev, FuaMode};
use foliofs::vfs::MkfsOptions;
use foliofs::{Owner, Volume, VolumeOptions};

pub const ROOT: u64 = foliofs::ROOT_INO;

/// The block sizes the suite runs on: the smallest, the common one and the
/// largest the format allows.
pub const BLOCK_SIZES: [u32; 3] = [1024, 4096, 65536];

/// One `#[test]` per block size for each function named, each taking the
/// block size: `block_size_tests!(truncate_exposes_zeros)` makes
/// `truncate_exposes_zeros::block_1k`, `::block_4k` and `::block_64k`, so a
/// failure names its block size and the three run in parallel. (A module and
/// a function may share a name: they live in different namespaces.)
macro_rules! block_size_tests {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn block_1k() {
                    super::$name(1024)
                }

                #[test]
                fn block_4k() {
                    super::$name(4096)
                }

                #[test]
                fn block_64k() {
                    super::$name(65536)
                }
            }
        )+
    };
}

/// The unit of sub-block direct I/O on a volume of `block_bytes` blocks:
/// 512-byte sectors below 64 KiB blocks; on 64 KiB blocks 4 KiB, as
/// software with 4 KiB pages (or a 4Kn device) writes.
pub fn direct_unit(block_bytes: u32) -> usize {
    if block_bytes >= 65536 {
        4096
    } else {
        512
    }
}

/// No background threads acting on their own: tests decide when things
/// are committed and written back.
pub fn options() -> VolumeOptions {
    VolumeOptions { commit_interval_ms: 0, writeback_interval_ms: 0, ..VolumeOptions::default() }
}

pub fn owner() -> Owner {
    Owner { uid: 1000, gid: 1000 }
}

/// The byte every device starts filled with: blocks whose data write was lost
/// show it, so a file exposing unwritten space cannot pass as zeros.
pub const GARBAGE_BYTE: u8 = 0xA5;

/// A freshly formatted in-memory volume and its device, which starts full of
/// garbage rather than zeros.
pub fn new_volume(size_bytes: u64, block_bytes: u32) -> (Arc<FaultDev>, Volume) {
    new_volume_with_journal(size_bytes, block_bytes, None)
}

pub fn new_volume_with_journal(
    size_bytes: u64,
    block_bytes: u32,
    journal_bytes: Option<u64>,
) -> (Arc<FaultDev>, Volume) {
    new_volume_with_options(size_bytes, block_bytes, journal_bytes, &options())
}

pub fn new_volume_with_options(
    size_bytes: u64,
    block_bytes: u32,
    journal_bytes: Option<u64>,
    options: &VolumeOptions,
) -> (Arc<FaultDev>, Volume) {
    let raw = Arc::new(FaultDev::from_image(vec![GARBAGE_BYTE; size_bytes as usize], 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    // FOLIOFS_CHECK_METADATA_INDEX=1 runs these tests on volumes of format
    // 3, as it runs the checkers (`foliofs_check::mkfs_options`).
    let metadata_index =
        std::env::var_os("FOLIOFS_CHECK_METADATA_INDEX").is_some_and(|value| value == "1");
    let mkfs = MkfsOptions {
        block_bytes,
        journal_bytes,
        metadata_bytes: None,
        metadata_index: metadata_index && block_bytes >= 4096,
        root_owner: owner(),
    };
    Volume::format(&device, &mkfs).expect("mkfs");
    let volume = Volume::open_device(device, options).expect("open");
    (raw, volume)
}

/// Opens a volume over a copy of `image`.
pub fn open_image(image: Vec<u8>) -> foliofs::Result<(Arc<FaultDev>, Volume)> {
    open_image_with(image, &options())
}

pub fn open_image_with(
    image: Vec<u8>,
    options: &VolumeOptions,
) -> foliofs::Result<(Arc<FaultDev>, Volume)> {
    let raw = Arc::new(FaultDev::from_image(image, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let volume = Volume::open_device(device, options)?;
    Ok((raw, volume))
}

/// Deterministic bytes for a (file, generation) pair, so a read can tell
/// whose data it sees.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// Applies a fallocate to a byte-vector model of a file, as the kernel would.
pub fn apply_fallocate_to_model(
    model: &mut Vec<u8>,
    mode: foliofs::FallocateMode,
    offset: usize,
    length: usize,
) {
    use foliofs::FallocateMode;
    let end = offset + length;
    let zero = |model: &mut Vec<u8>| {
        let stop = end.min(model.len());
        if offset < stop {
            model[offset..stop].fill(0);
        }
    };
    match mode {
        FallocateMode::Allocate { keep_size } => {
            if !keep_size && end > model.len() {
                model.resize(end, 0);
            }
        }
        FallocateMode::PunchHole => zero(model),
        FallocateMode::ZeroRange { keep_size } => {
            zero(model);
            if !keep_size && end > model.len() {
                model.resize(end, 0);
            }
        }
        FallocateMode::CollapseRange => {
            model.drain(offset..end);
        }
        FallocateMode::InsertRange => {
            let tail = model.split_off(offset);
            model.resize(offset + length, 0);
            model.extend_from_slice(&tail);
        }
    }
}
