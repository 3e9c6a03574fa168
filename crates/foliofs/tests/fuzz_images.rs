//! Image fuzzing that runs on stable Rust and in CI for a bounded time, as
//! cargo-fuzz would on nightly: a checked-in corpus (small volumes on 1 KiB,
//! 4 KiB and 64 KiB blocks stored sparsely, and samples of each on-disk
//! structure) is mutated with a seeded generator and fed to
//!
//! - the decoders of `format` (superblock, checkpoint header, journal group
//!   framing, records) directly, and
//! - `Volume::open_device` on an in-memory device, then a walk of the tree
//!   that reads every file (buffered, direct, SEEK_DATA/SEEK_HOLE, fiemap),
//!   statfs and fsck.
//!
//! Mutations are raw (bit flips, byte and word sets with hostile values,
//! splices, zeroed sectors, truncation), which checksums mostly catch, and
//! structure-aware: a record, a checkpoint header field or a superblock
//! field is changed and the checksums (and the journal's hash chain) are
//! recomputed, so the hostile content reaches replay and the live state.
//!
//! Every case must end without a panic, within `CASE_SECONDS`, and without a
//! single allocation larger than the image justifies (a counting global
//! allocator watches; anything above 1 GiB is refused, which aborts). An
//! image changed only by raw mutations that still mounts must be fsck-clean
//! (checksums caught the damage or it hit nothing that matters).
//!
//! Budget: `FOLIOFS_FUZZ_ITERATIONS` cases per test (default below) and at
//! most `FOLIOFS_FUZZ_SECONDS` seconds each; `FOLIOFS_FUZZ_SEED` moves the
//! seed; `FOLIOFS_FUZZ_CASE=seed` replays one mount case. Inputs that once
//! failed live in `tests/corpus/regressions/` and run first, every time.
//! `cargo test --test fuzz_images -- --ignored regenerate_corpus` rebuilds
//! the seed corpus (the regressions are patches against it: keep both).

#[macro_use]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foliofs::dev::{AlignedBuf, Device, FaultDev, FuaMode};
use foliofs::format::codec::Reader;
use foliofs::format::journal::{
    check_group_payload, decode_group_header, encode_group, GroupHeader, GroupLink,
    GROUP_HEADER_BYTES,
};
use foliofs::format::record::{decode_all, encode_all};
use foliofs::format::{
    CheckpointHeader, ExtentState, InodeAttrs, InodeKind, Record, Superblock, Timestamp,
    HEADER_BYTES,
};
use foliofs::space::FallocateMode;
use foliofs::vfs::MkfsOptions;
use foliofs::{OpenFlags, Privilege, Volume, VolumeOptions, XattrFlags};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{owner, pattern, ROOT};

// ---------------------------------------------------------------------------
// Allocation bound
// ---------------------------------------------------------------------------

/// Largest single allocation since the last reset.
static LARGEST_ALLOCATION: AtomicUsize = AtomicUsize::new(0);
/// Requests above this are refused (the process aborts naming the size)
/// rather than letting a hostile length exhaust the machine.
const ALLOCATION_REFUSED_ABOVE: usize = 1 << 30;

struct WatchedAllocator;

fn note_allocation(bytes: usize) -> bool {
    LARGEST_ALLOCATION.fetch_max(bytes, Ordering::Relaxed);
    bytes <= ALLOCATION_REFUSED_ABOVE
}

// SAFETY: every call forwards to the system allocator with the caller's
// layout unchanged; refusing returns null, which GlobalAlloc permits.
unsafe impl GlobalAlloc for WatchedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note_allocation(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as is (see above).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note_allocation(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note_allocation(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: WatchedAllocator = WatchedAllocator;

/// What one mount case may allocate at once: two copies of the image (the
/// in-memory device keeps a base and a current copy) plus the cache's
/// largest folio buffers and slack.
fn allocation_bound(image_bytes: usize) -> usize {
    image_bytes * 2 + (32 << 20)
}

// ---------------------------------------------------------------------------
// Budget
// ---------------------------------------------------------------------------

const CASE_SECONDS: u64 = 20;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|value| value.parse().ok())
}

struct Budget {
    iterations: u64,
    deadline: Instant,
}

impl Budget {
    fn new(default_iterations: u64, default_seconds: u64) -> Self {
        let iterations = env_u64("FOLIOFS_FUZZ_ITERATIONS").unwrap_or(default_iterations);
        let seconds = env_u64("FOLIOFS_FUZZ_SECONDS").unwrap_or(default_seconds);
        Self { iterations, deadline: Instant::now() + Duration::from_secs(seconds) }
    }

    fn allows(&self, done: u64) -> bool {
        done < self.iterations && Instant::now() < self.deadline
    }
}

fn base_seed() -> u64 {
    env_u64("FOLIOFS_FUZZ_SEED").unwrap_or(0x0F01_0F5E)
}

// ---------------------------------------------------------------------------
// Corpus: sparse images and structure samples
// ---------------------------------------------------------------------------

const SPARSE_MAGIC: &[u8; 8] = b"FOLIOSPR";
const SPARSE_SECTOR: usize = 512;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// An image as its non-zero 512-byte runs: magic, length, then
/// (offset u64, length u32, bytes) until the end.
fn sparse_encode(image: &[u8]) -> Vec<u8> {
    let mut out = SPARSE_MAGIC.to_vec();
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    let mut sector = 0;
    let sectors = image.len().div_ceil(SPARSE_SECTOR);
    let bytes_of = |index: usize| {
        &image[index * SPARSE_SECTOR..((index + 1) * SPARSE_SECTOR).min(image.len())]
    };
    while sector < sectors {
        if bytes_of(sector).iter().all(|&byte| byte == 0) {
            sector += 1;
            continue;
        }
        let start = sector;
        while sector < sectors && bytes_of(sector).iter().any(|&byte| byte != 0) {
            sector += 1;
        }
        let from = start * SPARSE_SECTOR;
        let to = (sector * SPARSE_SECTOR).min(image.len());
        out.extend_from_slice(&(from as u64).to_le_bytes());
        out.extend_from_slice(&((to - from) as u32).to_le_bytes());
        out.extend_from_slice(&image[from..to]);
    }
    out
}

fn sparse_decode(bytes: &[u8]) -> Vec<u8> {
    assert_eq!(&bytes[..8], SPARSE_MAGIC, "not a sparse image");
    let mut reader = Reader::new(&bytes[8..], "sparse image");
    let length = reader.u64().unwrap() as usize;
    let mut image = vec![0u8; length];
    while !reader.is_empty() {
        let offset = reader.u64().unwrap() as usize;
        let run = reader.u32().unwrap() as usize;
        image[offset..offset + run].copy_from_slice(reader.take(run).unwrap());
    }
    image
}

/// A regression case: a seed image and the bytes a failing mutation wrote
/// into it: magic, seed name, then (offset u64, length u32, bytes), and an
/// optional truncation length (u64::MAX: none).
const PATCH_MAGIC: &[u8; 8] = b"FOLIOPAT";

fn patch_encode(seed: &str, original: &[u8], mutated: &[u8]) -> Vec<u8> {
    let mut out = PATCH_MAGIC.to_vec();
    out.extend_from_slice(&(seed.len() as u16).to_le_bytes());
    out.extend_from_slice(seed.as_bytes());
    let length = if mutated.len() == original.len() { u64::MAX } else { mutated.len() as u64 };
    out.extend_from_slice(&length.to_le_bytes());
    let common_bytes = original.len().min(mutated.len());
    let mut at = 0;
    while at < common_bytes {
        if original[at] == mutated[at] {
            at += 1;
            continue;
        }
        let start = at;
        while at < common_bytes && (at - start < 64 || original[at] != mutated[at]) {
            at += 1;
        }
        out.extend_from_slice(&(start as u64).to_le_bytes());
        out.extend_from_slice(&((at - start) as u32).to_le_bytes());
        out.extend_from_slice(&mutated[start..at]);
    }
    out
}

fn patch_apply(bytes: &[u8], seeds: &[SeedImage]) -> (String, Vec<u8>) {
    assert_eq!(&bytes[..8], PATCH_MAGIC, "not a patch");
    let mut reader = Reader::new(&bytes[8..], "patch");
    let name = String::from_utf8(reader.bytes16().unwrap().to_vec()).unwrap();
    let seed = seeds.iter().find(|seed| seed.name == name).expect("patch names a seed image");
    let mut image = seed.image.clone();
    let length = reader.u64().unwrap();
    while !reader.is_empty() {
        let offset = reader.u64().unwrap() as usize;
        let run = reader.u32().unwrap() as usize;
        image[offset..offset + run].copy_from_slice(reader.take(run).unwrap());
    }
    if length != u64::MAX {
        image.truncate(length as usize);
    }
    (name, image)
}

struct SeedImage {
    name: String,
    image: Vec<u8>,
}

fn load_seeds() -> Vec<SeedImage> {
    let mut seeds = Vec::new();
    for (name, _, _) in SEED_SHAPES {
        let path = corpus_dir().join(format!("{name}.sparse"));
        let bytes = std::fs::read(&path).unwrap_or_else(|error| {
            panic!("{}: {error} (regenerate_corpus builds it)", path.display())
        });
        seeds.push(SeedImage { name: name.to_string(), image: sparse_decode(&bytes) });
    }
    seeds
}

/// Name, block size and journal size of each seed volume. The 4 KiB one has
/// the smallest journal, so its log has wrapped. `vol-4k-xattr` came later:
/// the first three were made before extended attributes and special files
/// existed (and the regressions patch them as they are), so only it holds
/// those in its checkpoint and journal; a regeneration puts them in all.
const SEED_SHAPES: [(&str, u32, Option<u64>); 4] = [
    ("vol-1k", 1024, None),
    ("vol-4k", 4096, Some(64 << 10)),
    ("vol-64k", 65536, None),
    ("vol-4k-xattr", 4096, None),
];

/// A small volume that has a bit of everything: nested directories, files
/// with holes, unwritten extents and several extents, a symlink, a hard
/// link, an unlinked file still open (an orphan), special files, extended
/// attributes (set, replaced, removed, on every kind), a checkpoint and
/// journal groups after it.
fn build_seed_image(block_bytes: u32, journal_bytes: Option<u64>) -> Vec<u8> {
    let size_bytes = 8 << 20;
    let raw = Arc::new(FaultDev::new(size_bytes, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let mkfs = MkfsOptions { block_bytes, journal_bytes, root_owner: owner() };
    Volume::format(&device, &mkfs).unwrap();
    let volume = Volume::open_device(device, &common::options()).unwrap();
    let block = u64::from(block_bytes);
    let dir = volume.mkdir(ROOT, b"dir", 0o755, owner()).unwrap();
    let sub = volume.mkdir(dir.ino, b"sub", 0o700, owner()).unwrap();
    let write_file = |parent: u64, name: &[u8], pieces: &[(u64, usize)]| {
        let attr = volume.create(parent, name, 0o644, owner()).unwrap();
        let file = volume.open_file(attr.ino, OpenFlags::READ_WRITE).unwrap();
        for (index, &(pos, length)) in pieces.iter().enumerate() {
            file.write_at(&pattern(attr.ino * 16 + index as u64, length), pos).unwrap();
        }
        file.fsync().unwrap();
        (attr.ino, file)
    };
    let (small, _) = write_file(ROOT, b"small", &[(0, 100)]);
    write_file(dir.ino, b"holes", &[(0, 700), (3 * block + 5, 900), (9 * block, 300)]);
    let (_, prealloc) = write_file(sub.ino, b"prealloc", &[(block, 200)]);
    prealloc.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 4 * block).unwrap();
    prealloc.fallocate(FallocateMode::PunchHole, 2 * block, block).unwrap();
    prealloc.fsync().unwrap();
    let set = |ino: u64, name: &[u8], length: usize| {
        let value = pattern(ino ^ name.len() as u64, length);
        volume.set_xattr(ino, name, &value, XattrFlags::default(), Privilege::SysAdmin).unwrap();
    };
    set(small, b"user.mime", 10);
    set(small, b"trusted.big", 3000);
    set(dir.ino, b"security.label", 30);
    // user::rwx user:1000:rw- group::r-x mask::rwx other::---
    let acl: &[u8] = &[
        2, 0, 0, 0, 1, 0, 7, 0, 255, 255, 255, 255, 2, 0, 6, 0, 232, 3, 0, 0, 4, 0, 5, 0, 255, 255,
        255, 255, 16, 0, 7, 0, 255, 255, 255, 255, 32, 0, 0, 0, 255, 255, 255, 255,
    ];
    let flags = XattrFlags::default();
    volume
        .set_xattr(dir.ino, b"system.posix_acl_default", acl, flags, Privilege::SysAdmin)
        .unwrap();
    volume.mkdir(dir.ino, b"inherits", 0o755, owner()).unwrap();
    let fifo = volume.mknod(sub.ino, b"fifo", InodeKind::Fifo, 0o644, 0, owner()).unwrap();
    set(fifo.ino, b"security.fifo", 5);
    volume.checkpoint().unwrap();
    let tty = volume.mknod(dir.ino, b"tty", InodeKind::CharDevice, 0o620, 0x0501, owner()).unwrap();
    volume.mknod(ROOT, b"sock", InodeKind::Socket, 0o755, 0, owner()).unwrap();
    volume.mknod(ROOT, b"sda", InodeKind::BlockDevice, 0o660, 0x0800, owner()).unwrap();
    set(tty.ino, b"trusted.tty", 1);
    set(small, b"user.mime", 20);
    volume.remove_xattr(dir.ino, b"security.label", Privilege::SysAdmin).unwrap();
    volume.symlink(dir.ino, b"link", b"../small", owner()).unwrap();
    volume.link(small, sub.ino, b"hard").unwrap();
    let (_, _) = write_file(ROOT, b"later", &[(0, 3000), (5000, 10)]);
    for index in 0..40u64 {
        // Enough groups to wrap the small journal.
        let name = format!("n{index}");
        let attr = volume.create(sub.ino, name.as_bytes(), 0o600, owner()).unwrap();
        volume.open_file(attr.ino, OpenFlags::READ).unwrap().fsync().unwrap();
        if index % 3 != 0 {
            volume.unlink(sub.ino, name.as_bytes()).unwrap();
        }
    }
    let (orphan, open) = write_file(dir.ino, b"orphan", &[(0, 1500)]);
    volume.unlink(dir.ino, b"orphan").unwrap();
    volume.sync().unwrap();
    open.fsync().unwrap();
    let _ = orphan;
    // The image as a power cut leaves it now: the orphan is still open.
    let image = raw.image();
    drop(open);
    drop(prealloc);
    drop(volume);
    image
}

#[test]
#[ignore = "rewrites tests/corpus; run by hand when the format changes"]
fn regenerate_corpus() {
    std::fs::create_dir_all(corpus_dir()).unwrap();
    // FOLIOFS_FUZZ_REGENERATE=name rebuilds one seed only (one added
    // later), leaving the others, and the regressions against them, alone.
    let only = std::env::var("FOLIOFS_FUZZ_REGENERATE").ok();
    for (name, block_bytes, journal_bytes) in SEED_SHAPES {
        if only.as_ref().is_some_and(|only| only != name) {
            continue;
        }
        let image = build_seed_image(block_bytes, journal_bytes);
        std::fs::write(corpus_dir().join(format!("{name}.sparse")), sparse_encode(&image)).unwrap();
        let structures = Structures::of(&image).expect("a seed image decodes");
        let samples = corpus_dir().join("samples");
        std::fs::create_dir_all(&samples).unwrap();
        std::fs::write(samples.join(format!("{name}.superblock")), &image[..HEADER_BYTES]).unwrap();
        let slot = &structures.slots[structures.newest_slot().expect("a checkpoint")];
        let mut checkpoint = slot.header.encode().to_vec();
        checkpoint.extend_from_slice(&encode_all(&slot.records));
        std::fs::write(samples.join(format!("{name}.checkpoint")), checkpoint).unwrap();
        if let Some(group) = structures.groups.iter().max_by_key(|group| group.records.len()) {
            let start = group.offset;
            let bytes = &image[start..start + group.stored_bytes];
            let mut sample = structures.superblock.uuid.to_vec();
            sample.extend_from_slice(bytes);
            std::fs::write(samples.join(format!("{name}.group")), sample).unwrap();
        }
    }
}

/// Structure samples: `(file name, bytes)`.
fn load_samples() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for dir in [corpus_dir().join("samples"), corpus_dir().join("regressions")] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut paths: Vec<PathBuf> = entries.map(|entry| entry.unwrap().path()).collect();
        paths.sort();
        for path in paths {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if [".superblock", ".checkpoint", ".group", ".records"]
                .iter()
                .any(|suffix| name.ends_with(suffix))
            {
                out.push((name, std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The structures of an image, for structure-aware mutation
// ---------------------------------------------------------------------------

struct Slot {
    offset: usize,
    header: CheckpointHeader,
    records: Vec<Record>,
}

struct Group {
    offset: usize,
    header: GroupHeader,
    stored_bytes: usize,
    records: Vec<Record>,
}

struct Structures {
    superblock: Superblock,
    slots: Vec<Slot>,
    /// Valid groups found anywhere in the journal, in sequence order.
    groups: Vec<Group>,
}

impl Structures {
    fn of(image: &[u8]) -> Option<Self> {
        let superblock = Superblock::decode(image.get(..HEADER_BYTES)?).ok()?;
        let block = superblock.block_bytes as usize;
        let sector = superblock.sector_bytes as usize;
        let slot_bytes = superblock.checkpoint_slots[0].block_count as usize * block;
        let payload_max = (slot_bytes - sector) as u64;
        let mut slots = Vec::new();
        for region in superblock.checkpoint_slots {
            let offset = region.start_block as usize * block;
            let Some(bytes) = image.get(offset..offset + slot_bytes) else { continue };
            let Ok(header) = CheckpointHeader::decode(bytes, payload_max) else { continue };
            let payload = &bytes[sector..sector + header.payload_bytes as usize];
            let Ok(count) = u32::try_from(header.record_count) else { continue };
            let Ok(records) = decode_all(payload, count) else { continue };
            slots.push(Slot { offset, header, records });
        }
        let journal_start = superblock.journal.start_block as usize * block;
        let journal_bytes = superblock.journal.block_count as usize * block;
        let group_payload_max = (journal_bytes / 4 - GROUP_HEADER_BYTES) as u64;
        let mut groups = Vec::new();
        let mut at = 0;
        while at + sector <= journal_bytes {
            let offset = journal_start + at;
            let found = decode_group_header(
                image.get(offset..offset + sector)?,
                &superblock.uuid,
                group_payload_max,
            )
            .ok()
            .and_then(|header| {
                let stored = header.stored_bytes(superblock.sector_bytes) as usize;
                let bytes = image.get(offset..offset + stored)?;
                if at + stored > journal_bytes {
                    return None;
                }
                let payload = check_group_payload(bytes, &header, &superblock.uuid).ok()?;
                let records = decode_all(payload, header.record_count).ok()?;
                Some(Group { offset, header, stored_bytes: stored, records })
            });
            match found {
                Some(group) => {
                    at += group.stored_bytes;
                    groups.push(group);
                }
                None => at += sector,
            }
        }
        groups.sort_by_key(|group| group.header.seq);
        Some(Self { superblock, slots, groups })
    }

    fn newest_slot(&self) -> Option<usize> {
        (0..self.slots.len()).max_by_key(|&index| self.slots[index].header.generation)
    }

    fn journal_end(&self) -> usize {
        let block = self.superblock.block_bytes as usize;
        (self.superblock.journal.start_block + self.superblock.journal.block_count) as usize * block
    }
}

// ---------------------------------------------------------------------------
// Mutations
// ---------------------------------------------------------------------------

const INTERESTING_U64: [u64; 16] = [
    0,
    1,
    2,
    3,
    7,
    255,
    4096,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
    u64::MAX / 4096,
];

const INTERESTING_U32: [u32; 9] =
    [0, 1, 2, 255, 0x7FFF_FFFF, 0x8000_0000, u32::MAX - 1, u32::MAX, 4095];

fn interesting_u64(rng: &mut ChaCha8Rng, near: &[u64]) -> u64 {
    match rng.random_range(0..4) {
        0 if !near.is_empty() => {
            let base = near[rng.random_range(0..near.len())];
            base.wrapping_add_signed(rng.random_range(-2i64..=2))
        }
        1 => rng.random(),
        _ => INTERESTING_U64[rng.random_range(0..INTERESTING_U64.len())],
    }
}

fn interesting_u32(rng: &mut ChaCha8Rng) -> u32 {
    if rng.random_bool(0.2) {
        rng.random()
    } else {
        INTERESTING_U32[rng.random_range(0..INTERESTING_U32.len())]
    }
}

/// Byte ranges worth mutating: the superblock copies and every non-zero
/// sector of the journal and checkpoint slots.
fn hot_ranges(image: &[u8]) -> Vec<(usize, usize)> {
    let Ok(superblock) = Superblock::decode(&image[..HEADER_BYTES.min(image.len())]) else {
        return vec![(0, image.len().min(2 << 16))];
    };
    let block = superblock.block_bytes as usize;
    let mut ranges = vec![(0, HEADER_BYTES), (block, block + HEADER_BYTES)];
    let metadata_end = superblock.data.start_block as usize * block;
    let mut at = superblock.journal.start_block as usize * block;
    while at < metadata_end.min(image.len()) {
        let end = (at + 512).min(image.len());
        if image[at..end].iter().any(|&byte| byte != 0) {
            ranges.push((at, end));
        }
        at += 512;
    }
    // A truncated image may end before the second copy.
    ranges.retain(|&(_, end)| end <= image.len());
    if ranges.is_empty() {
        ranges.push((0, image.len()));
    }
    ranges
}

/// The non-zero sectors of the data area: file contents (all metadata lives
/// in the journal and checkpoints), which nothing checks against anything.
fn data_ranges(image: &[u8]) -> Vec<(usize, usize)> {
    let Ok(superblock) = Superblock::decode(&image[..HEADER_BYTES.min(image.len())]) else {
        return Vec::new();
    };
    let block = superblock.block_bytes as usize;
    let start = (superblock.data.start_block as usize).saturating_mul(block);
    let end = (superblock.data.end_block() as usize).saturating_mul(block).min(image.len());
    (start..end)
        .step_by(512)
        .filter(|&at| image[at..(at + 512).min(end)].iter().any(|&byte| byte != 0))
        .map(|at| (at, (at + 512).min(end)))
        .collect()
}

/// One mutation of file data: bits, bytes, a sector of garbage, of 0xFF,
/// zeroed, or overwritten with metadata (a journal or checkpoint sector, so
/// data that looks like structure). Mount and fsck must not care; reading
/// the file returns bytes or an error.
fn mutate_data(rng: &mut ChaCha8Rng, image: &mut [u8]) -> Option<String> {
    let ranges = data_ranges(image);
    let at = pick_offset(rng, &ranges, 8)?;
    let sector = at / 512 * 512;
    let end = (sector + 512).min(image.len());
    Some(match rng.random_range(0..6) {
        0 => {
            let bit = rng.random_range(0..8);
            image[at] ^= 1 << bit;
            format!("data: flip bit {bit} at {at}")
        }
        1 => {
            let value = interesting_u64(rng, &[]);
            image[at..at + 8].copy_from_slice(&value.to_le_bytes());
            format!("data: u64 {value:#x} at {at}")
        }
        2 => {
            rng.fill(&mut image[sector..end]);
            format!("data: random sector at {sector}")
        }
        3 => {
            image[sector..end].fill(0xFF);
            format!("data: 0xFF sector at {sector}")
        }
        4 => {
            image[sector..end].fill(0);
            format!("data: zero sector at {sector}")
        }
        _ => {
            let metadata = hot_ranges(image);
            let from = pick_offset(rng, &metadata, end - sector)?;
            image.copy_within(from..from + (end - sector), sector);
            format!("data: metadata sector from {from} at {sector}")
        }
    })
}

fn pick_offset(rng: &mut ChaCha8Rng, ranges: &[(usize, usize)], width: usize) -> Option<usize> {
    if ranges.is_empty() {
        return None;
    }
    let (start, end) = ranges[rng.random_range(0..ranges.len())];
    if end < start + width {
        return None;
    }
    Some(rng.random_range(start..=end - width))
}

/// One raw mutation; returns what it did.
fn mutate_raw(rng: &mut ChaCha8Rng, image: &mut Vec<u8>, donor: &[u8]) -> String {
    let ranges = hot_ranges(image);
    let kind = rng.random_range(0..100);
    if kind < 3 && image.len() > 512 {
        let sectors = image.len() / 512;
        let keep = rng.random_range(1..sectors) * 512;
        image.truncate(keep);
        return format!("truncate to {keep}");
    }
    let Some(at) = pick_offset(rng, &ranges, 8) else { return "nothing".into() };
    match kind {
        0..=29 => {
            let bit = rng.random_range(0..8);
            image[at] ^= 1 << bit;
            format!("flip bit {bit} at {at}")
        }
        30..=44 => {
            let value = [0u8, 1, 0x7F, 0x80, 0xFF, rng.random()][rng.random_range(0..6)];
            image[at] = value;
            format!("byte {value:#x} at {at}")
        }
        45..=59 => {
            let value = interesting_u32(rng);
            image[at..at + 4].copy_from_slice(&value.to_le_bytes());
            format!("u32 {value:#x} at {at}")
        }
        60..=74 => {
            let value = interesting_u64(rng, &[]);
            image[at..at + 8].copy_from_slice(&value.to_le_bytes());
            format!("u64 {value:#x} at {at}")
        }
        75..=89 => {
            // Splice: bytes of a hot range of this image or another seed.
            let source = if rng.random_bool(0.5) { donor } else { &image[..] };
            let source_ranges = hot_ranges(source);
            let length = rng.random_range(1..=512usize);
            let Some(from) = pick_offset(rng, &source_ranges, length) else {
                return "nothing".into();
            };
            let length = length.min(image.len() - at);
            let bytes = source[from..from + length].to_vec();
            image[at..at + length].copy_from_slice(&bytes);
            format!("splice {length} bytes from {from} to {at}")
        }
        _ => {
            let sector = at / 512 * 512;
            let end = (sector + 512).min(image.len());
            image[sector..end].fill(0);
            format!("zero sector at {sector}")
        }
    }
}

fn mutate_attrs(rng: &mut ChaCha8Rng, attrs: &mut InodeAttrs, near: &[u64]) {
    match rng.random_range(0..8) {
        0 => attrs.size = interesting_u64(rng, near),
        1 => attrs.nlink = interesting_u32(rng),
        2 => {
            attrs.kind = [
                InodeKind::File,
                InodeKind::Dir,
                InodeKind::Symlink,
                InodeKind::Fifo,
                InodeKind::CharDevice,
            ][rng.random_range(0..5)]
        }
        3 => attrs.parent = interesting_u64(rng, near),
        4 => attrs.mode = interesting_u32(rng) & 0o7777,
        5 => attrs.mtime = Timestamp { secs: interesting_u64(rng, &[]) as i64, nanos: 999_999_999 },
        6 => attrs.uid = interesting_u32(rng),
        _ => attrs.size = interesting_u64(rng, &[]) >> rng.random_range(0..64),
    }
}

/// Changes one field of `record` to a hostile (but decodable) value.
fn mutate_record(rng: &mut ChaCha8Rng, record: &mut Record, near: &[u64]) {
    match record {
        Record::InodeSet { ino, attrs } => {
            if rng.random_bool(0.2) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                mutate_attrs(rng, attrs, near);
            }
        }
        Record::InodeFree { ino } => *ino = interesting_u64(rng, near).max(1),
        Record::SymlinkSet { ino, target } => {
            if rng.random_bool(0.5) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                *target = vec![b'x'; rng.random_range(1..=4095)];
            }
        }
        Record::DirAdd { dir, name, ino } => match rng.random_range(0..3) {
            0 => *dir = interesting_u64(rng, near).max(1),
            1 => *ino = interesting_u64(rng, near).max(1),
            _ => *name = vec![b'n'; rng.random_range(1..=255)],
        },
        Record::DirRemove { dir, name } => {
            if rng.random_bool(0.5) {
                *dir = interesting_u64(rng, near).max(1);
            } else {
                name.push(b'x');
            }
        }
        Record::ExtentMap { ino, file_block, dev_block, block_count, state } => {
            match rng.random_range(0..5) {
                0 => *ino = interesting_u64(rng, near).max(1),
                1 => *file_block = interesting_u64(rng, near),
                2 => *dev_block = interesting_u64(rng, near),
                3 => *block_count = interesting_u64(rng, near).max(1),
                _ => {
                    *state = match state {
                        ExtentState::Written => ExtentState::Unwritten,
                        ExtentState::Unwritten => ExtentState::Written,
                    }
                }
            }
            // Keep the record decodable so it reaches the state.
            *block_count = (*block_count).min(u64::MAX - *file_block).max(1);
            if file_block.checked_add(*block_count).is_none() {
                *file_block = u64::MAX - *block_count;
            }
            *block_count = (*block_count).min(u64::MAX - *dev_block).max(1);
            if dev_block.checked_add(*block_count).is_none() {
                *dev_block = u64::MAX - *block_count;
            }
        }
        Record::ExtentUnmap { ino, file_block, block_count } => {
            match rng.random_range(0..3) {
                0 => *ino = interesting_u64(rng, near).max(1),
                1 => *file_block = interesting_u64(rng, near),
                _ => *block_count = interesting_u64(rng, near).max(1),
            }
            *block_count = (*block_count).min(u64::MAX - *file_block).max(1);
        }
        Record::XattrSet { ino, name, value } => match rng.random_range(0..3) {
            0 => *ino = interesting_u64(rng, near).max(1),
            1 => *value = vec![0xA5; rng.random_range(0..=65536)],
            _ => *name = [&b"trusted."[..], &vec![b'n'; rng.random_range(1..=247)]].concat(),
        },
        Record::XattrRemove { ino, name } => {
            if rng.random_bool(0.5) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                name.push(b'x');
            }
        }
        Record::DeviceSet { ino, rdev } => {
            if rng.random_bool(0.5) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                *rdev = interesting_u32(rng);
            }
        }
        Record::FlagsSet { ino, flags } => {
            if rng.random_bool(0.5) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                // Decodable: any set of the known flags.
                *flags = interesting_u32(rng) & foliofs::format::INODE_FLAGS_KNOWN;
            }
        }
    }
}

/// A record built to contradict a sane tree: cycles, huge extents and
/// sizes, links to the root.
fn hostile_record(rng: &mut ChaCha8Rng, near: &[u64], superblock: &Superblock) -> Record {
    let pick = |rng: &mut ChaCha8Rng| {
        if near.is_empty() {
            1
        } else {
            near[rng.random_range(0..near.len())].max(1)
        }
    };
    let data = superblock.data;
    let attrs = |kind, size, nlink, parent| InodeAttrs {
        kind,
        mode: 0o755,
        uid: 0,
        gid: 0,
        nlink,
        size,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        parent,
    };
    match rng.random_range(0..14) {
        13 => Record::FlagsSet {
            ino: pick(rng),
            flags: foliofs::format::INODE_FLAG_IMMUTABLE | foliofs::format::INODE_FLAG_APPEND,
        },
        9 => Record::XattrSet {
            ino: pick(rng),
            name: b"user.fuzz".to_vec(),
            value: vec![0x5A; rng.random_range(0..=65536)],
        },
        10 => Record::XattrRemove { ino: pick(rng), name: b"user.fuzz".to_vec() },
        11 => Record::DeviceSet { ino: pick(rng), rdev: interesting_u32(rng) },
        12 => Record::InodeSet {
            ino: interesting_u64(rng, near).max(2),
            attrs: attrs(InodeKind::Socket, 0, 1, 0),
        },
        0 => Record::DirAdd { dir: pick(rng), name: b"loop".to_vec(), ino: ROOT },
        1 => {
            let ino = pick(rng);
            Record::DirAdd { dir: ino, name: b"self".to_vec(), ino }
        }
        2 => Record::ExtentMap {
            ino: pick(rng),
            file_block: u64::MAX / 2 - rng.random_range(0..4),
            dev_block: data.start_block,
            block_count: rng.random_range(1..4),
            state: ExtentState::Written,
        },
        3 => Record::ExtentMap {
            ino: pick(rng),
            file_block: 0,
            dev_block: data.start_block,
            block_count: data.block_count,
            state: ExtentState::Written,
        },
        4 => Record::InodeSet {
            ino: pick(rng),
            attrs: attrs(InodeKind::File, interesting_u64(rng, &[]), 1, 0),
        },
        5 => Record::InodeSet {
            ino: interesting_u64(rng, &[]).max(2),
            attrs: attrs(InodeKind::Dir, 0, u32::MAX, ROOT),
        },
        6 => Record::InodeFree { ino: pick(rng) },
        7 => Record::ExtentUnmap { ino: pick(rng), file_block: 0, block_count: u64::MAX },
        _ => Record::ExtentMap {
            ino: pick(rng),
            file_block: rng.random_range(0..1 << 20),
            dev_block: data.end_block() - rng.random_range(1..3),
            block_count: rng.random_range(1..4),
            state: ExtentState::Unwritten,
        },
    }
}

/// Inode numbers and block numbers the records mention: hostile values
/// "near" them reach real objects.
fn numbers_of(records: &[Record], superblock: &Superblock) -> Vec<u64> {
    let mut out = vec![
        ROOT,
        superblock.data.start_block,
        superblock.data.end_block(),
        superblock.block_count,
    ];
    for record in records {
        match record {
            Record::InodeSet { ino, .. }
            | Record::InodeFree { ino }
            | Record::SymlinkSet { ino, .. }
            | Record::XattrSet { ino, .. }
            | Record::XattrRemove { ino, .. }
            | Record::DeviceSet { ino, .. }
            | Record::FlagsSet { ino, .. } => out.push(*ino),
            Record::DirAdd { dir, ino, .. } => out.extend([*dir, *ino]),
            Record::DirRemove { dir, .. } => out.push(*dir),
            Record::ExtentMap { ino, file_block, dev_block, .. } => {
                out.extend([*ino, *file_block, *dev_block])
            }
            Record::ExtentUnmap { ino, file_block, .. } => out.extend([*ino, *file_block]),
        }
    }
    out
}

/// Changes a list of records: one field, a deletion, a duplicate, a swap,
/// or a hostile insertion.
fn mutate_records(
    rng: &mut ChaCha8Rng,
    records: &mut Vec<Record>,
    superblock: &Superblock,
) -> String {
    let near = numbers_of(records, superblock);
    let kind = rng.random_range(0..10);
    if records.is_empty() || kind >= 8 {
        let record = hostile_record(rng, &near, superblock);
        let at = rng.random_range(0..=records.len());
        let what = format!("insert {record:?} at {at}");
        records.insert(at, record);
        return what;
    }
    let index = rng.random_range(0..records.len());
    match kind {
        0..=4 => {
            let before = format!("{:?}", records[index]);
            mutate_record(rng, &mut records[index], &near);
            format!("record {index}: {before} -> {:?}", records[index])
        }
        5 => format!("delete record {index}: {:?}", records.remove(index)),
        6 => {
            let copy = records[index].clone();
            let at = rng.random_range(0..=records.len());
            records.insert(at, copy);
            format!("duplicate record {index} at {at}")
        }
        _ => {
            let other = rng.random_range(0..records.len());
            records.swap(index, other);
            format!("swap records {index} and {other}")
        }
    }
}

/// A structure-aware mutation with checksums recomputed; `None` if the
/// image has no structure to change.
fn mutate_structured(rng: &mut ChaCha8Rng, image: &mut [u8]) -> Option<String> {
    let structures = Structures::of(image)?;
    let superblock = &structures.superblock;
    let sector = superblock.sector_bytes as usize;
    match rng.random_range(0..10) {
        0..=3 if !structures.slots.is_empty() => {
            let index = if rng.random_bool(0.8) {
                structures.newest_slot()?
            } else {
                rng.random_range(0..structures.slots.len())
            };
            let slot = &structures.slots[index];
            let mut header = slot.header;
            let mut records = slot.records.clone();
            let what = if rng.random_bool(0.3) {
                let value = interesting_u64(rng, &[header.lsn_applied, header.generation]);
                let field = rng.random_range(0..6);
                match field {
                    0 => header.generation = value,
                    1 => header.journal_replay_offset = value,
                    2 => header.journal_replay_seq = value,
                    3 => header.lsn_applied = value,
                    4 => header.next_ino = value,
                    _ => header.record_count = value,
                }
                format!("checkpoint slot {index} header field {field} = {value:#x}")
            } else {
                mutate_records(rng, &mut records, superblock)
            };
            let payload = encode_all(&records);
            let slot_bytes = superblock.checkpoint_slots[0].block_count as usize
                * superblock.block_bytes as usize;
            if sector + payload.len() > slot_bytes {
                return None;
            }
            if !what.contains("header field 5") {
                header.record_count = records.len() as u64;
            }
            header.payload_bytes = payload.len() as u64;
            header.payload_crc = crc32c::crc32c(&payload);
            image[slot.offset..slot.offset + HEADER_BYTES].copy_from_slice(&header.encode());
            image[slot.offset + sector..slot.offset + sector + payload.len()]
                .copy_from_slice(&payload);
            Some(format!("checkpoint: {what}"))
        }
        4..=7 if !structures.groups.is_empty() => {
            let index = rng.random_range(0..structures.groups.len());
            let mut groups: Vec<(GroupLink, Vec<Record>)> = structures
                .groups
                .iter()
                .map(|group| {
                    let header = group.header;
                    let link = GroupLink {
                        seq: header.seq,
                        first_lsn: header.first_lsn,
                        record_count: header.record_count,
                        prev_header_crc: header.prev_header_crc,
                    };
                    (link, group.records.clone())
                })
                .collect();
            let what = if rng.random_bool(0.25) {
                let link = &mut groups[index].0;
                let field = rng.random_range(0..3);
                match field {
                    0 => link.seq = interesting_u64(rng, &[link.seq]),
                    1 => link.first_lsn = interesting_u64(rng, &[link.first_lsn]),
                    _ => link.record_count = interesting_u32(rng),
                }
                format!("group {index} link {field}: {link:?}")
            } else {
                let (link, records) = &mut groups[index];
                let what = mutate_records(rng, records, superblock);
                link.record_count = records.len() as u32;
                format!("group {index}: {what}")
            };
            // Rewrite the group and the run of groups physically after it,
            // re-chaining their hashes so replay goes on past the change.
            let mut position = structures.groups[index].offset;
            let mut prev_crc = groups[index].0.prev_header_crc;
            let journal_end = structures.journal_end();
            for (number, (link, records)) in groups.iter().enumerate().skip(index) {
                let original = &structures.groups[number];
                if number > index
                    && (original.offset < structures.groups[number - 1].offset
                        || original.header.seq != structures.groups[number - 1].header.seq + 1)
                {
                    break;
                }
                let link = GroupLink { prev_header_crc: prev_crc, ..*link };
                let payload = encode_all(records);
                let (bytes, header_crc) =
                    encode_group(&superblock.uuid, link, &payload, superblock.sector_bytes);
                if position + bytes.len() > journal_end
                    || bytes.len()
                        > (journal_end
                            - superblock.journal.start_block as usize
                                * superblock.block_bytes as usize)
                            / 4
                {
                    break;
                }
                image[position..position + bytes.len()].copy_from_slice(&bytes);
                position += bytes.len();
                prev_crc = header_crc;
            }
            Some(format!("journal: {what}"))
        }
        _ => {
            let mut changed = superblock.clone();
            let value = interesting_u64(rng, &numbers_of(&[], superblock));
            let field = rng.random_range(0..8);
            match field {
                0 => changed.block_bytes = interesting_u32(rng),
                1 => changed.sector_bytes = [512, 1024, 4096, 65536][rng.random_range(0..4)],
                2 => changed.block_count = value,
                3 => changed.journal.block_count = value,
                4 => changed.journal.start_block = value,
                5 => changed.checkpoint_slots[rng.random_range(0..2)].block_count = value,
                6 => changed.data.start_block = value,
                _ => changed.data.block_count = value,
            }
            let bytes = changed.encode();
            image[..HEADER_BYTES].copy_from_slice(&bytes);
            if rng.random_bool(0.5) {
                let copy = Superblock::copy_offset(superblock.block_bytes, 1) as usize;
                image[copy..copy + HEADER_BYTES].copy_from_slice(&bytes);
            }
            Some(format!("superblock field {field}: {changed:?}"))
        }
    }
}

// ---------------------------------------------------------------------------
// Decoders on bytes
// ---------------------------------------------------------------------------

/// Runs every decoder over `bytes` at every offset that might hold a
/// structure (the sample's start, and each 512-byte sector).
fn decode_everything(bytes: &[u8], uuid: &[u8; 16]) -> u64 {
    let mut calls = 0u64;
    let mut at = 0;
    while at < bytes.len() {
        let here = &bytes[at..];
        let _ = Superblock::decode(here);
        if let Ok(header) = CheckpointHeader::decode(here, here.len() as u64) {
            let payload = &here[HEADER_BYTES.min(here.len())..];
            let payload = &payload[..(header.payload_bytes as usize).min(payload.len())];
            if header.check_payload(payload).is_ok() {
                let _ = decode_all(payload, header.record_count.min(u64::from(u32::MAX)) as u32);
            }
        }
        for uuid in [uuid, &[0u8; 16]] {
            if let Ok(header) = decode_group_header(here, uuid, here.len() as u64) {
                if let Ok(payload) = check_group_payload(here, &header, uuid) {
                    let _ = decode_all(payload, header.record_count);
                }
            }
        }
        let _ = decode_all(here, u32::MAX);
        let _ = decode_all(here, 1);
        calls += 7;
        at += 512;
    }
    calls
}

/// Mutates `sample` in place: raw changes and hostile lengths.
fn mutate_bytes(rng: &mut ChaCha8Rng, sample: &mut Vec<u8>, donor: &[u8]) -> String {
    if sample.is_empty() {
        sample.push(rng.random());
        return "grow".into();
    }
    let at = rng.random_range(0..sample.len());
    match rng.random_range(0..8) {
        0 => {
            sample[at] ^= 1 << rng.random_range(0..8);
            format!("flip at {at}")
        }
        1 => {
            sample[at] = rng.random();
            format!("set at {at}")
        }
        2 if sample.len() >= at + 4 => {
            sample[at..at + 4].copy_from_slice(&interesting_u32(rng).to_le_bytes());
            format!("u32 at {at}")
        }
        3 if sample.len() >= at + 8 => {
            sample[at..at + 8].copy_from_slice(&interesting_u64(rng, &[]).to_le_bytes());
            format!("u64 at {at}")
        }
        4 => {
            sample.truncate(at);
            format!("truncate to {at}")
        }
        5 if !donor.is_empty() => {
            let from = rng.random_range(0..donor.len());
            let length = rng.random_range(1..=64).min(donor.len() - from);
            let end = (at + length).min(sample.len());
            sample.splice(at..end, donor[from..from + length].iter().copied());
            format!("splice {length} at {at}")
        }
        _ => {
            let length = rng.random_range(1..64);
            sample.splice(at..at, std::iter::repeat_n(0xFF, length));
            format!("insert {length} x 0xff at {at}")
        }
    }
}

/// Re-frames a mutated header so the checksum passes: the decoders' field
/// checks, not the crc, get the hostile values.
fn reseal_headers(sample: &mut [u8], uuid: &[u8; 16]) {
    if sample.len() < HEADER_BYTES {
        return;
    }
    if &sample[..8] == b"FOLIOFS\0" || &sample[..8] == b"FOLIOCKP" {
        let crc = foliofs::format::codec::crc_with_hole(&sample[..HEADER_BYTES], HEADER_BYTES - 4);
        sample[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    }
    if &sample[..8] == b"FOLIOJNL" {
        let crc = crc32c::crc32c_append(crc32c::crc32c(uuid), &sample[..60]);
        sample[60..64].copy_from_slice(&crc.to_le_bytes());
    }
}

#[test]
fn decoders_survive_mutated_corpus_samples() {
    let samples = load_samples();
    assert!(samples.len() >= 9, "the corpus has samples of each structure: {}", samples.len());
    let budget = Budget::new(100_000, 8);
    let mut rng = ChaCha8Rng::seed_from_u64(base_seed());
    let mut executions = 0u64;
    let mut calls = 0u64;
    while budget.allows(executions) {
        let (name, sample) = &samples[rng.random_range(0..samples.len())];
        let (uuid, body) = if name.ends_with(".group") && sample.len() >= 16 {
            (<[u8; 16]>::try_from(&sample[..16]).unwrap(), &sample[16..])
        } else {
            ([0u8; 16], &sample[..])
        };
        let donor = &samples[rng.random_range(0..samples.len())].1;
        let mut mutated = body.to_vec();
        for _ in 0..rng.random_range(1..=4) {
            mutate_bytes(&mut rng, &mut mutated, donor);
        }
        if rng.random_bool(0.5) {
            reseal_headers(&mut mutated, &uuid);
        }
        calls += decode_everything(&mutated, &uuid);
        executions += 1;
    }
    eprintln!("decoder fuzz: {executions} executions, {calls} decoder calls");
}

// ---------------------------------------------------------------------------
// Mounting mutated images
// ---------------------------------------------------------------------------

/// What a case did, for the totals.
#[derive(Default, Debug, Clone, Copy)]
struct CaseOutcome {
    mounted: bool,
    files_read: u64,
    fsck_problems: u64,
}

fn options_for(read_only: bool) -> VolumeOptions {
    VolumeOptions { read_only, cache_bytes: 16 << 20, ..common::options() }
}

/// Mounts `image`, walks and reads everything, runs fsck. Panics (caught by
/// the caller) are the failures; errors are fine.
fn exercise_image(image: Vec<u8>, read_only: bool, must_be_clean: bool) -> CaseOutcome {
    let mut outcome = CaseOutcome::default();
    if image.is_empty() || !image.len().is_multiple_of(512) {
        return outcome;
    }
    let image_bytes = image.len();
    let raw = Arc::new(FaultDev::from_image(image, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let Ok(volume) = Volume::open_device(device.clone(), &options_for(read_only)) else {
        let report = foliofs::fsck::check(device);
        assert!(!report.is_clean() || read_only, "fsck calls clean what would not mount");
        return outcome;
    };
    outcome.mounted = true;
    let (files, dirs) = walk(&volume, image_bytes);
    outcome.files_read = files.len() as u64;
    let _ = volume.statfs();
    let report = foliofs::fsck::check(device.clone());
    outcome.fsck_problems = report.problems.len() as u64;
    if must_be_clean {
        let load_problems: Vec<&String> =
            report.problems.iter().filter(|problem| !problem.contains("superblock")).collect();
        assert!(load_problems.is_empty(), "raw damage mounted but fsck finds {load_problems:?}");
    }
    if !read_only && live_changes() {
        change_everything(&volume, &files, &dirs);
        let _ = volume.close();
        // What the library wrote over the loaded state mounts again or is
        // refused cleanly.
        if let Ok(volume) = Volume::open_device(device, &options_for(true)) {
            walk(&volume, image_bytes);
        }
        return outcome;
    }
    let _ = volume.close();
    outcome
}

/// Changes on a mutated image that mounted (FOLIOFS_FUZZ_LIVE=0 skips
/// them): the live paths must not panic on any state mount accepts.
fn live_changes() -> bool {
    std::env::var("FOLIOFS_FUZZ_LIVE").map_or(true, |value| value != "0")
}

/// A bit of every kind of change on the files and directories found.
fn change_everything(volume: &Volume, files: &[FoundFile], dirs: &[u64]) {
    let owner = owner();
    let _ = volume.create(ROOT, b"fuzz-new", 0o644, owner).and_then(|attr| {
        let file = volume.open_file(attr.ino, OpenFlags::READ_WRITE)?;
        file.write_at(&pattern(1, 10_000), 0)?;
        file.fsync()
    });
    for &dir in dirs.iter().take(3) {
        let _ = volume.mkdir(dir, b"fuzz-dir", 0o755, owner);
        let _ = volume.symlink(dir, b"fuzz-link", b"target", owner);
        let _ = volume.rmdir(dir, b"fuzz-dir");
    }
    for (index, (parent, ino, name)) in files.iter().take(4).enumerate() {
        let Ok(file) = volume.open_file(*ino, OpenFlags::READ_WRITE) else { continue };
        let size = file.attr().map_or(0, |attr| attr.size);
        let _ = file.write_at(b"overwrite", 0);
        let _ = file.write_at(&pattern(2, 5000), size.min(1 << 20));
        let _ = file.fallocate(FallocateMode::PunchHole, 100, 5000);
        let _ = file.fallocate(FallocateMode::ZeroRange { keep_size: false }, 0, 3000);
        let _ = file.set_len(size / 2);
        let _ = file.fsync();
        if let Ok(direct) = volume.open_file(*ino, OpenFlags::READ_WRITE.with_direct()) {
            let _ = direct.write_at(&AlignedBuf::zeroed(4096), 0);
            let _ = direct.fdatasync();
        }
        drop(file);
        let _ = volume.link(*ino, ROOT, format!("fuzz-hard{index}").as_bytes());
        let _ = volume.rename(
            *parent,
            name,
            ROOT,
            format!("fuzz-moved{index}").as_bytes(),
            foliofs::RenameFlags::default(),
        );
        if index % 2 == 0 {
            let _ = volume.unlink(ROOT, format!("fuzz-moved{index}").as_bytes());
        }
    }
    for &dir in dirs.iter().skip(1).take(2) {
        if let Ok(parent) = volume.parent_of(dir) {
            let name = volume
                .readdir(parent)
                .ok()
                .and_then(|entries| entries.into_iter().find(|entry| entry.ino == dir))
                .map(|entry| entry.name);
            if let Some(name) = name {
                let _ = volume.rename(parent, &name, ROOT, b"fuzz-dir-moved", Default::default());
                let _ = volume.rmdir(ROOT, b"fuzz-dir-moved");
            }
        }
    }
    let _ = volume.sync();
    let _ = volume.checkpoint();
}

/// Every directory (each once: a hostile image may hold cycles), every
/// symlink and every file, read in bounded pieces. Returns the files (parent,
/// inode, name) and the directories.
/// A file the walk found: its directory, inode and name.
type FoundFile = (u64, u64, Vec<u8>);

fn walk(volume: &Volume, image_bytes: usize) -> (Vec<FoundFile>, Vec<u64>) {
    let mut files = Vec::new();
    let mut dirs = vec![ROOT];
    let mut seen = HashSet::from([ROOT]);
    let mut stack = vec![ROOT];
    let _ = volume.resolve("/dir/sub/../link");
    while let Some(dir) = stack.pop() {
        let _ = volume.parent_of(dir);
        let Ok(entries) = volume.readdir(dir) else { continue };
        for entry in entries {
            let _ = volume.lookup(dir, &entry.name);
            let _ = volume.getattr(entry.ino);
            for name in volume.list_xattr(entry.ino, Privilege::SysAdmin).unwrap_or_default() {
                let _ = volume.get_xattr(entry.ino, &name, Privilege::SysAdmin);
            }
            match entry.kind {
                InodeKind::Dir => {
                    if seen.insert(entry.ino) && seen.len() < 100_000 {
                        stack.push(entry.ino);
                        dirs.push(entry.ino);
                    }
                }
                InodeKind::Symlink => {
                    let _ = volume.readlink(entry.ino);
                }
                InodeKind::Fifo
                | InodeKind::Socket
                | InodeKind::CharDevice
                | InodeKind::BlockDevice => {
                    let _ = volume.open_file(entry.ino, OpenFlags::READ);
                }
                InodeKind::File => {
                    if seen.insert(entry.ino) {
                        read_file(volume, entry.ino, image_bytes);
                        files.push((dir, entry.ino, entry.name.clone()));
                    }
                }
            }
        }
    }
    (files, dirs)
}

fn read_file(volume: &Volume, ino: u64, image_bytes: usize) {
    let Ok(attr) = volume.getattr(ino) else { return };
    let size = attr.size;
    let _ = volume.fiemap(ino);
    if let Ok(file) = volume.open_file(ino, OpenFlags::READ) {
        // All of a small file; of a large (or hostile) one the start, a
        // piece in the middle and the end.
        let head = size.min(256 << 10).min(image_bytes as u64) as usize;
        let mut buffer = vec![0u8; head.max(1)];
        let _ = file.read_at(&mut buffer, 0);
        for pos in [size / 2, size.saturating_sub(4096), size.saturating_sub(1), size, u64::MAX - 1]
        {
            let mut piece = vec![0u8; 8192];
            let _ = file.read_at(&mut piece, pos);
        }
        let _ = file.seek_data(0);
        let _ = file.seek_hole(0);
        let _ = file.seek_data(size / 2);
        let _ = file.attr();
    }
    if let Ok(file) = volume.open_file(ino, OpenFlags::READ.with_direct()) {
        let mut buffer = AlignedBuf::zeroed(8192);
        let _ = file.read_at(&mut buffer, 0);
        let _ = file.read_at(&mut buffer, size & !4095);
    }
}

/// Runs `work` on its own thread; a panic or a run past `CASE_SECONDS` is
/// a failure naming `what`.
fn bounded<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("fuzz-case".into())
        .spawn(move || {
            let _ = sender.send(work());
        })
        .unwrap();
    match receiver.recv_timeout(Duration::from_secs(CASE_SECONDS)) {
        Ok(value) => {
            let _ = worker.join();
            value
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {CASE_SECONDS} s (a hang)")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            let panic = worker.join().err().map(|payload| {
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|text| text.to_string()))
                    .unwrap_or_default()
            });
            panic!("{what}: panicked: {}", panic.unwrap_or_default())
        }
    }
}

/// One mount case from a seed number: which seed image, how many and which
/// mutations, read-only or not.
fn build_case(seeds: &[SeedImage], case: u64) -> (String, Vec<u8>, bool, bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(case);
    let seed = &seeds[rng.random_range(0..seeds.len())];
    let donor = &seeds[rng.random_range(0..seeds.len())].image;
    let mut image = seed.image.clone();
    let mut steps = Vec::new();
    let mut structured = false;
    for _ in 0..rng.random_range(1..=3) {
        if rng.random_bool(0.25) {
            if let Some(what) = mutate_data(&mut rng, &mut image) {
                steps.push(what);
                continue;
            }
        }
        if rng.random_bool(0.6) {
            if let Some(what) = mutate_structured(&mut rng, &mut image) {
                structured = true;
                steps.push(what);
                continue;
            }
        }
        steps.push(mutate_raw(&mut rng, &mut image, donor));
    }
    let read_only = rng.random_bool(0.3);
    let description = format!("case {case} on {}: {}", seed.name, steps.join("; "));
    (description, image, read_only, !structured)
}

fn run_case(description: &str, image: Vec<u8>, read_only: bool, clean: bool) -> CaseOutcome {
    let bound = allocation_bound(image.len());
    LARGEST_ALLOCATION.store(0, Ordering::Relaxed);
    let outcome = bounded(description, move || exercise_image(image, read_only, clean));
    let largest = LARGEST_ALLOCATION.load(Ordering::Relaxed);
    assert!(largest <= bound, "{description}: one allocation of {largest} bytes (bound {bound})");
    outcome
}

#[test]
fn seed_images_mount_clean() {
    let seeds = load_seeds();
    for seed in &seeds {
        let outcome = run_case(&seed.name, seed.image.clone(), false, true);
        assert!(outcome.mounted && outcome.files_read >= 5, "{}: {outcome:?}", seed.name);
    }
}

#[test]
fn regressions_stay_fixed() {
    let seeds = load_seeds();
    let Ok(entries) = std::fs::read_dir(corpus_dir().join("regressions")) else { return };
    let mut paths: Vec<PathBuf> = entries.map(|entry| entry.unwrap().path()).collect();
    paths.sort();
    for path in paths.iter().filter(|path| path.extension().is_some_and(|ext| ext == "patch")) {
        let (_, image) = patch_apply(&std::fs::read(path).unwrap(), &seeds);
        for read_only in [false, true] {
            run_case(&path.display().to_string(), image.clone(), read_only, false);
        }
    }
}

#[test]
fn mounting_mutated_images_never_panics_hangs_or_overallocates() {
    let seeds = load_seeds();
    if let Some(case) = env_u64("FOLIOFS_FUZZ_CASE") {
        let (description, image, read_only, clean) = build_case(&seeds, case);
        eprintln!("{description}");
        if std::env::var_os("FOLIOFS_FUZZ_SAVE").is_some() {
            let (name, original) = seeds
                .iter()
                .map(|seed| (&seed.name, &seed.image))
                .find(|(name, _)| description.contains(&format!(" on {name}:")))
                .unwrap();
            let path = corpus_dir().join(format!("regressions/case-{case}.patch"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, patch_encode(name, original, &image)).unwrap();
            eprintln!("saved {}", path.display());
        }
        run_case(&description, image, read_only, clean);
        return;
    }
    let budget = Budget::new(3_000, 25);
    let first = base_seed() << 20;
    let (mut executions, mut mounted, mut files, mut fsck_problems) = (0u64, 0u64, 0u64, 0u64);
    let mut data_mutated = 0u64;
    // FOLIOFS_FUZZ_KEEP_GOING: collect every failing case instead of
    // stopping at the first (for long runs).
    let keep_going = std::env::var_os("FOLIOFS_FUZZ_KEEP_GOING").is_some();
    let mut failures = Vec::new();
    while budget.allows(executions) {
        let case = first + executions;
        let (description, image, read_only, clean) = build_case(&seeds, case);
        executions += 1;
        data_mutated += u64::from(description.contains("data: "));
        let outcome = if keep_going {
            let run = || run_case(&description, image, read_only, clean);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                Ok(outcome) => outcome,
                Err(_) => {
                    failures.push(case);
                    continue;
                }
            }
        } else {
            run_case(&description, image, read_only, clean)
        };
        mounted += u64::from(outcome.mounted);
        files += outcome.files_read;
        fsck_problems += outcome.fsck_problems;
    }
    eprintln!(
        "mount fuzz: {executions} executions from case {first} ({data_mutated} with file data \
         mutated), {mounted} mounted, {files} files read, {fsck_problems} fsck problems \
         reported, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "failing cases (FOLIOFS_FUZZ_CASE replays one): {failures:?}");
    assert!(executions > 0);
}

#[test]
fn sparse_and_patch_formats_round_trip() {
    let mut image = vec![0u8; 4096];
    image[5] = 1;
    image[1500..1600].fill(7);
    assert_eq!(sparse_decode(&sparse_encode(&image)), image);
    let seeds = vec![SeedImage { name: "s".into(), image: image.clone() }];
    let mut mutated = image.clone();
    mutated[3000] = 9;
    mutated.truncate(3584);
    assert_eq!(patch_apply(&patch_encode("s", &image, &mutated), &seeds).1, mutated);
}
