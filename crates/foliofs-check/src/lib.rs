//! Reliability tools for foliofs, used by the `foliofs crashtest` and
//! `foliofs fsx` commands and by the test suites.
//!
//! - [`workload`]: seeded random workloads (namespace operations, buffered
//!   and direct writes, appends, truncate, fallocate, fsync, syncfs) run on
//!   the fault-injecting in-memory device from one or several threads, each
//!   thread in its own directory so that one exact model covers all.
//! - [`model`]: what the checkers compare against: per-offset byte
//!   histories, recovered trees, fallocate on a byte vector.
//! - [`crashtest`]: crashes a finished workload at every durability point
//!   (and random subsets and torn versions of the writes still volatile
//!   there), remounts, and checks the image against the model; shrinks a
//!   failing workload to a short op list.
//! - [`fsx`]: random operations on one file (and a second one for clones,
//!   dedupes and copies) compared with an in-memory copy after every step,
//!   in the manner of xfstests' fsx.
//! - [`fsx_threads`]: threads racing on shared files (buffered, direct and
//!   asynchronous direct I/O, mmap, truncate, punch, fsync), every read with
//!   a defined answer checked against a model; in process or under a path.
//! - [`nbd_loop`]: an in-process NBD server over the fault-injecting device,
//!   restartable with its volatile writes lost.
//! - [`fault_proxy`]: a proxy between an NBD client and server that drops,
//!   stalls or blackholes the link on command.

pub mod crashtest;
pub mod fault_proxy;
pub mod fsx;
pub mod fsx_threads;
pub mod mirror;
pub mod model;
pub mod nbd_loop;
#[cfg(test)]
mod test_nbd_client;
pub mod workload;

use std::sync::Arc;

use foliofs::dev::fault::CowImage;
use foliofs::dev::{Device, FaultDev, FuaMode};
use foliofs::vfs::MkfsOptions;
use foliofs::{Owner, Volume, VolumeOptions};

/// The root directory's inode number.
pub const ROOT: u64 = foliofs::ROOT_INO;

/// The byte every device starts filled with: a block whose data write was
/// lost shows it, so a file exposing unwritten space cannot pass as zeros.
pub const GARBAGE_BYTE: u8 = 0xA5;

/// The logical block (sector) of the in-memory devices: the unit of direct
/// I/O and of torn writes.
pub const SECTOR_BYTES: u32 = 512;

/// Options with no background thread acting on its own: the tools decide
/// when things are committed and written back, so runs are reproducible.
pub fn quiet_options() -> VolumeOptions {
    VolumeOptions {
        commit_interval_ms: 0,
        writeback_interval_ms: 0,
        // Small enough that many volumes can be open at once.
        cache_bytes: 64 << 20,
        ..VolumeOptions::default()
    }
}

/// [`quiet_options`] with a `-o` style list (`dirty=folio,fua=emulate`)
/// applied on top.
pub fn options_with(list: &str) -> foliofs::Result<VolumeOptions> {
    let mut options = quiet_options();
    options.apply_list(list)?;
    Ok(options)
}

pub fn owner() -> Owner {
    Owner { uid: 1000, gid: 1000 }
}

/// How the checkers format volumes: metadata in a paged index (format 3)
/// where `FOLIOFS_CHECK_METADATA_INDEX=1` asks for it, as xfstests takes
/// its mkfs options from the environment; checkpoint slots otherwise.
pub fn mkfs_options(block_bytes: u32, journal_bytes: Option<u64>) -> MkfsOptions {
    let metadata_index =
        std::env::var_os("FOLIOFS_CHECK_METADATA_INDEX").is_some_and(|value| value == "1");
    MkfsOptions {
        block_bytes,
        journal_bytes,
        metadata_bytes: None,
        metadata_index: metadata_index && block_bytes >= 4096,
        root_owner: owner(),
    }
}

/// A freshly formatted in-memory volume on a device full of garbage.
pub fn new_volume(
    size_bytes: u64,
    block_bytes: u32,
    journal_bytes: Option<u64>,
    options: &VolumeOptions,
) -> foliofs::Result<(Arc<FaultDev>, Volume)> {
    new_volume_with(size_bytes, &mkfs_options(block_bytes, journal_bytes), options)
}

/// As [`new_volume`], formatted as `mkfs` says.
pub fn new_volume_with(
    size_bytes: u64,
    mkfs: &MkfsOptions,
    options: &VolumeOptions,
) -> foliofs::Result<(Arc<FaultDev>, Volume)> {
    let raw = Arc::new(FaultDev::from_image(vec![GARBAGE_BYTE; size_bytes as usize], SECTOR_BYTES));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    Volume::format(&device, mkfs)?;
    let volume = Volume::open_device(device, options)?;
    Ok((raw, volume))
}

/// One request in this many over [`new_volume_over_nbd`]'s link ends it.
pub const LINK_DROP_ONE_IN: u32 = 200;

/// As [`new_volume`], with the volume reaching the in-memory device
/// through the engine's NBD client and [`nbd_loop`]'s server.
pub fn new_volume_over_nbd(
    size_bytes: u64,
    block_bytes: u32,
    journal_bytes: Option<u64>,
    options: &VolumeOptions,
    seed: u64,
) -> foliofs::Result<(Arc<FaultDev>, Volume, nbd_loop::NbdLoop)> {
    let raw = Arc::new(FaultDev::from_image(vec![GARBAGE_BYTE; size_bytes as usize], SECTOR_BYTES));
    let server = nbd_loop::start(Arc::clone(&raw), seed)
        .map_err(|error| foliofs::Error::io("starting the crash checker's NBD server", error))?;
    let dev_options = options.dev_options();
    let client = foliofs::dev::nbd::NbdDev::open(&server.uri, &dev_options)
        .map_err(|error| foliofs::Error::io(format!("connecting to {}", server.uri), error))?;
    let device = Arc::new(Device::new(Arc::new(client), options.fua));
    let mkfs = mkfs_options(block_bytes, journal_bytes);
    Volume::format(&device, &mkfs)?;
    // The workload's link drops now and then: the client reconnects and
    // sends again what had no reply, and no crash point may show it.
    server.drop_links_at_random(LINK_DROP_ONE_IN);
    let volume = Volume::open_device(device, options)?;
    Ok((raw, volume, server))
}

/// [`new_volume`] on a real device through a [`mirror::MirrorDev`]: the
/// in-memory device records what the real one was asked and answered.
pub fn new_mirrored_volume(
    real: Arc<dyn foliofs::dev::RawDev>,
    size_bytes: u64,
    block_bytes: u32,
    journal_bytes: Option<u64>,
    options: &VolumeOptions,
) -> foliofs::Result<(Arc<FaultDev>, Volume, Arc<mirror::MirrorDev>)> {
    let log = Arc::new(FaultDev::from_image(vec![GARBAGE_BYTE; size_bytes as usize], SECTOR_BYTES));
    let mirror = Arc::new(mirror::MirrorDev::new(real, log.clone())?);
    let device = Arc::new(Device::new(mirror.clone(), FuaMode::Native));
    let mkfs = mkfs_options(block_bytes, journal_bytes);
    Volume::format(&device, &mkfs)?;
    let volume = Volume::open_device(device, options)?;
    Ok((log, volume, mirror))
}

/// Opens a volume over `image`.
pub fn open_image(
    image: Vec<u8>,
    options: &VolumeOptions,
) -> foliofs::Result<(Arc<FaultDev>, Volume)> {
    open_cow_image(CowImage::from_bytes(&image), options)
}

/// Opens a volume over `image`, whose chunks it shares until it writes them.
pub fn open_cow_image(
    image: CowImage,
    options: &VolumeOptions,
) -> foliofs::Result<(Arc<FaultDev>, Volume)> {
    let raw = Arc::new(FaultDev::from_cow_image(image, SECTOR_BYTES));
    let volume = open_raw(&raw, options)?;
    Ok((raw, volume))
}

/// Opens a volume over an existing in-memory device.
pub fn open_raw(raw: &Arc<FaultDev>, options: &VolumeOptions) -> foliofs::Result<Volume> {
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    Volume::open_device(device, options)
}

/// Deterministic bytes for a data identity, so a read can tell whose data it
/// sees. Every byte of one identity is pseudo-random.
pub fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut out = vec![0u8; length];
    fill_pattern(seed, &mut out);
    out
}

/// [`pattern`] into an existing buffer.
pub fn fill_pattern(seed: u64, out: &mut [u8]) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for byte in out {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = (state >> 24) as u8;
    }
}

/// Mixes numbers into one seed (splitmix64 steps).
pub fn mix(values: &[u64]) -> u64 {
    let mut state = 0x243F_6A88_85A3_08D3u64;
    for &value in values {
        state = state.wrapping_add(value).wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        state = z ^ (z >> 31);
    }
    state
}
