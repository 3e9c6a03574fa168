//! The corpus: sparse seed images, structure samples and regression
//! patches, and how they are built and loaded.

use super::*;

pub(crate) const SPARSE_MAGIC: &[u8; 8] = b"FOLIOSPR";
pub(crate) const SPARSE_SECTOR: usize = 512;

pub(crate) fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// An image as its non-zero 512-byte runs: magic, length, then
/// (offset u64, length u32, bytes) until the end.
pub(crate) fn sparse_encode(image: &[u8]) -> Vec<u8> {
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

pub(crate) fn sparse_decode(bytes: &[u8]) -> Vec<u8> {
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
pub(crate) const PATCH_MAGIC: &[u8; 8] = b"FOLIOPAT";

pub(crate) fn patch_encode(seed: &str, original: &[u8], mutated: &[u8]) -> Vec<u8> {
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

pub(crate) fn patch_apply(bytes: &[u8], seeds: &[SeedImage]) -> (String, Vec<u8>) {
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

pub(crate) struct SeedImage {
    pub(crate) name: String,
    pub(crate) image: Vec<u8>,
}

pub(crate) fn load_seeds() -> Vec<SeedImage> {
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
pub(crate) const SEED_SHAPES: [(&str, u32, Option<u64>); 4] = [
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
pub(crate) fn build_seed_image(block_bytes: u32, journal_bytes: Option<u64>) -> Vec<u8> {
    let size_bytes = 8 << 20;
    let raw = Arc::new(FaultDev::new(size_bytes, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let mkfs = MkfsOptions {
        block_bytes,
        journal_bytes,
        metadata_bytes: None,
        metadata_index: false,
        root_owner: owner(),
    };
    Volume::format(&device, &mkfs).unwrap();
    let volume = Volume::open_device(device, &common::options()).unwrap();
    let block = u64::from(block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"dir", 0o755, owner()).unwrap();
    let sub = volume.inodes().mkdir(dir.ino, b"sub", 0o700, owner()).unwrap();
    let write_file = |parent: u64, name: &[u8], pieces: &[(u64, usize)]| {
        let attr = volume.inodes().create(parent, name, 0o644, owner()).unwrap();
        let file = volume.inodes().open_file(attr.ino, OpenFlags::READ_WRITE).unwrap();
        for (index, &(pos, length)) in pieces.iter().enumerate() {
            file.write_at(&pattern(attr.ino * 16 + index as u64, length), pos).unwrap();
        }
        file.sync_all().unwrap();
        (attr.ino, file)
    };
    let (small, _) = write_file(ROOT, b"small", &[(0, 100)]);
    write_file(dir.ino, b"holes", &[(0, 700), (3 * block + 5, 900), (9 * block, 300)]);
    let (_, prealloc) = write_file(sub.ino, b"prealloc", &[(block, 200)]);
    prealloc.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 4 * block).unwrap();
    prealloc.fallocate(FallocateMode::PunchHole, 2 * block, block).unwrap();
    prealloc.sync_all().unwrap();
    let set = |ino: u64, name: &[u8], length: usize| {
        let value = pattern(ino ^ name.len() as u64, length);
        volume
            .inodes()
            .set_xattr(ino, name, &value, XattrFlags::default(), Privilege::SysAdmin)
            .unwrap();
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
        .inodes()
        .set_xattr(dir.ino, b"system.posix_acl_default", acl, flags, Privilege::SysAdmin)
        .unwrap();
    volume.inodes().mkdir(dir.ino, b"inherits", 0o755, owner()).unwrap();
    let fifo = volume.inodes().mknod(sub.ino, b"fifo", InodeKind::Fifo, 0o644, 0, owner()).unwrap();
    set(fifo.ino, b"security.fifo", 5);
    volume.checkpoint().unwrap();
    let tty = volume
        .inodes()
        .mknod(dir.ino, b"tty", InodeKind::CharDevice, 0o620, 0x0501, owner())
        .unwrap();
    volume.inodes().mknod(ROOT, b"sock", InodeKind::Socket, 0o755, 0, owner()).unwrap();
    volume.inodes().mknod(ROOT, b"sda", InodeKind::BlockDevice, 0o660, 0x0800, owner()).unwrap();
    set(tty.ino, b"trusted.tty", 1);
    set(small, b"user.mime", 20);
    volume.inodes().remove_xattr(dir.ino, b"security.label", Privilege::SysAdmin).unwrap();
    volume.inodes().symlink(dir.ino, b"link", b"../small", owner()).unwrap();
    volume.inodes().link(small, sub.ino, b"hard").unwrap();
    let (_, _) = write_file(ROOT, b"later", &[(0, 3000), (5000, 10)]);
    for index in 0..40u64 {
        // Enough groups to wrap the small journal.
        let name = format!("n{index}");
        let attr = volume.inodes().create(sub.ino, name.as_bytes(), 0o600, owner()).unwrap();
        volume.inodes().open_file(attr.ino, OpenFlags::READ).unwrap().sync_all().unwrap();
        if index % 3 != 0 {
            volume.inodes().unlink(sub.ino, name.as_bytes()).unwrap();
        }
    }
    let (orphan, open) = write_file(dir.ino, b"orphan", &[(0, 1500)]);
    volume.inodes().unlink(dir.ino, b"orphan").unwrap();
    volume.sync().unwrap();
    open.sync_all().unwrap();
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
pub(crate) fn regenerate_corpus() {
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
pub(crate) fn load_samples() -> Vec<(String, Vec<u8>)> {
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
