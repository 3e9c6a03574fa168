//! Volumes of format 3, whose metadata checkpoint lives in a paged index
//! that grows from the data region: what they keep across checkpoints and
//! reopening, what a checkpoint writes, how many files they hold, and how
//! a damaged index page is refused.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{open_image, owner, pattern, ROOT};
use foliofs::dev::{Device, FaultDev, FuaMode};
use foliofs::vfs::MkfsOptions;
use foliofs::{Error, InodeKind, OpenFlags, Privilege, Volume, XattrFlags};

const ANY: XattrFlags = XattrFlags { create: false, replace: false, acl_kill_sgid: false };

fn new_indexed_volume(size_bytes: u64, journal_bytes: Option<u64>) -> (Arc<FaultDev>, Volume) {
    let raw = Arc::new(FaultDev::from_image(vec![common::GARBAGE_BYTE; size_bytes as usize], 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let mkfs = MkfsOptions {
        block_bytes: 4096,
        journal_bytes,
        metadata_bytes: None,
        metadata_index: true,
        root_owner: owner(),
    };
    Volume::format(&device, &mkfs).expect("mkfs");
    let volume = Volume::open_device(device, &common::options()).expect("open");
    (raw, volume)
}

/// Everything a path shows: kind, mode, size, links, data or target, and
/// extended attributes, by path.
fn snapshot(volume: &Volume) -> BTreeMap<String, String> {
    let mut seen = BTreeMap::new();
    let mut pending = vec![(ROOT, String::new())];
    while let Some((dir, path)) = pending.pop() {
        for entry in volume.inodes().readdir(dir).unwrap() {
            let name = String::from_utf8(entry.name.clone()).unwrap();
            if name == "." || name == ".." {
                continue;
            }
            let path = format!("{path}/{name}");
            let attr = volume.inodes().getattr(entry.ino).unwrap();
            let body = match attr.kind {
                InodeKind::Dir => {
                    pending.push((entry.ino, path.clone()));
                    String::new()
                }
                InodeKind::Symlink => format!("{:?}", volume.inodes().readlink(entry.ino).unwrap()),
                InodeKind::File => {
                    let mut data = vec![0u8; attr.size as usize];
                    let file = volume.inodes().open_file(entry.ino, OpenFlags::READ).unwrap();
                    file.read_at(&mut data, 0).unwrap();
                    format!("{:08x}", crc32c::crc32c(&data))
                }
                _ => String::new(),
            };
            let mut xattrs = Vec::new();
            for xattr in volume.inodes().list_xattr(entry.ino, Privilege::SysAdmin).unwrap() {
                let value =
                    volume.inodes().get_xattr(entry.ino, &xattr, Privilege::SysAdmin).unwrap();
                xattrs.push((xattr, value));
            }
            let shown = format!(
                "{:?} {:o} {} links {} {body} {xattrs:?}",
                attr.kind, attr.mode, attr.size, attr.nlink
            );
            seen.insert(path, shown);
        }
    }
    seen
}

fn assert_fsck_clean(image: Vec<u8>) {
    let raw = Arc::new(FaultDev::from_image(image, 512));
    let report = foliofs::fsck::check(Arc::new(Device::new(raw, FuaMode::Native)));
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

#[test]
fn an_indexed_volume_keeps_every_kind_of_change_across_checkpoints_and_reopening() {
    let (device, volume) = new_indexed_volume(64 << 20, Some(256 << 10));
    let inodes = volume.inodes();
    let dir = inodes.mkdir(ROOT, b"dir", 0o750, owner()).unwrap();
    let big = inodes.mkdir(ROOT, b"big", 0o755, owner()).unwrap();
    for index in 0..300u64 {
        let attr = inodes.create(big.ino, format!("f{index}").as_bytes(), 0o644, owner()).unwrap();
        if index % 10 == 0 {
            let file = inodes.open_file(attr.ino, OpenFlags::WRITE).unwrap();
            file.write_at(&pattern(index, 5000 + index as usize), index * 4096).unwrap();
        }
    }
    let data = inodes.create(dir.ino, b"data", 0o600, owner()).unwrap();
    // Many extents: its records take several chunks of the index.
    let file = inodes.open_file(data.ino, OpenFlags::WRITE).unwrap();
    for block in (0..400u64).step_by(2) {
        file.write_at(&pattern(block, 4096), block * 4096).unwrap();
    }
    file.sync_all().unwrap();
    inodes.symlink(dir.ino, b"link", b"../big/f10", owner()).unwrap();
    inodes.link(data.ino, ROOT, b"hard").unwrap();
    inodes.set_xattr(data.ino, b"user.small", b"value", ANY, Privilege::SysAdmin).unwrap();
    inodes.set_xattr(dir.ino, b"user.large", &vec![7u8; 3000], ANY, Privilege::SysAdmin).unwrap();
    volume.checkpoint().unwrap();
    // Changes after the checkpoint: some reach the next, some only the log.
    for index in (0..300u64).step_by(3) {
        inodes.unlink(big.ino, format!("f{index}").as_bytes()).unwrap();
    }
    inodes.rename(big.ino, b"f1", dir.ino, b"moved", foliofs::RenameFlags::default()).unwrap();
    inodes.remove_xattr(data.ino, b"user.small", Privilege::SysAdmin).unwrap();
    file.write_at(&pattern(999, 100), 1 << 20).unwrap();
    drop(file);
    volume.checkpoint().unwrap();
    inodes.set_xattr(big.ino, b"user.after", b"log only", ANY, Privilege::SysAdmin).unwrap();
    inodes.unlink(big.ino, b"f2").unwrap();
    volume.sync().unwrap();
    let expected = snapshot(&volume);
    // Reopened from the log alone after the last checkpoint (no closing
    // checkpoint), then again after a clean close.
    let image = device.image();
    let (_, reopened) = open_image(image.clone()).unwrap();
    assert_eq!(snapshot(&reopened), expected, "after the log's replay");
    assert!(reopened.load_report().journal_records_replayed > 0);
    drop(reopened);
    assert_fsck_clean(image);
    drop(volume);
    let (_, reopened) = open_image(device.image()).unwrap();
    assert_eq!(snapshot(&reopened), expected, "after a clean close");
    assert_eq!(reopened.load_report().journal_records_replayed, 0);
    drop(reopened);
    assert_fsck_clean(device.image());
}

#[test]
fn a_checkpoint_writes_what_changed_not_the_whole_state() {
    let (_, volume) = new_indexed_volume(256 << 20, Some(16 << 20));
    let inodes = volume.inodes();
    let mut files = Vec::new();
    for dir_index in 0..20u64 {
        let dir = inodes.mkdir(ROOT, format!("d{dir_index}").as_bytes(), 0o755, owner()).unwrap();
        for index in 0..1000u64 {
            let name = format!("a-file-with-a-longer-name-{index:06}");
            files.push(inodes.create(dir.ino, name.as_bytes(), 0o644, owner()).unwrap().ino);
        }
    }
    volume.checkpoint().unwrap();
    let first = volume.checkpoint_stats();
    // 100 of 20,000 files change.
    for &ino in files.iter().step_by(200) {
        let file = inodes.open_file(ino, OpenFlags::WRITE).unwrap();
        file.write_at(b"changed", 0).unwrap();
    }
    volume.checkpoint().unwrap();
    let second = volume.checkpoint_stats();
    let second_bytes = second.bytes_total - first.bytes_total;
    // The whole state is 20,000 inodes and entries, about 2.5 MB as
    // records; the 100 changed files sit in at most 100 leaves.
    assert!(first.bytes_total > 1 << 20, "the first checkpoint wrote everything: {first:?}");
    assert!(
        second_bytes <= 110 * 4096 * 2,
        "a checkpoint after 100 changes wrote {second_bytes} bytes (the first {})",
        first.bytes_total
    );
}

#[test]
fn an_indexed_volume_holds_more_files_than_checkpoint_slots_would() {
    // A slot of this volume's default size (1 MiB) holds about 13,000 empty
    // files; the index takes what it needs from the data region.
    let (device, volume) = new_indexed_volume(24 << 20, Some(1 << 20));
    let inodes = volume.inodes();
    let mut created = 0u64;
    for dir_index in 0..40u64 {
        let dir = inodes.mkdir(ROOT, format!("d{dir_index}").as_bytes(), 0o755, owner()).unwrap();
        for index in 0..1000u64 {
            inodes.create(dir.ino, format!("{index}").as_bytes(), 0o644, owner()).unwrap();
            created += 1;
        }
    }
    let statfs = volume.statfs();
    assert!(statfs.inodes > created, "{statfs:?}");
    // Free inodes are what free space holds, as XFS counts them.
    let free_bytes = statfs.available_blocks * u64::from(statfs.block_bytes);
    assert!(statfs.free_inodes_estimate() > 0, "{statfs:?}");
    assert!(statfs.free_inodes_estimate() <= free_bytes / 64, "{statfs:?}");
    drop(volume);
    let (_, reopened) = open_image(device.image()).unwrap();
    assert_eq!(reopened.inodes().readdir(ROOT).unwrap().len(), 40);
    let last = reopened.inodes().resolve("/d39/999").unwrap();
    assert_eq!(reopened.inodes().getattr(last).unwrap().kind, InodeKind::File);
    drop(reopened);
    assert_fsck_clean(device.image());
}

/// The byte addresses of the index's pages: those that carry its magic.
fn index_page_addresses(image: &[u8]) -> Vec<u64> {
    image
        .chunks(4096)
        .enumerate()
        .filter(|(_, page)| page.starts_with(b"FIDX"))
        .map(|(index, _)| index as u64 * 4096)
        .collect()
}

#[test]
fn a_damaged_index_page_is_refused_naming_it_and_never_panics() {
    let (device, volume) = new_indexed_volume(16 << 20, None);
    for index in 0..400u64 {
        volume.inodes().create(ROOT, format!("file-{index}").as_bytes(), 0o644, owner()).unwrap();
    }
    drop(volume);
    let image = device.image();
    let pages = index_page_addresses(&image);
    assert!(pages.len() >= 3, "the index's pages: {pages:?}");
    let mut refused = 0;
    for (index, &page) in pages.iter().enumerate() {
        for offset in [0usize, 17, 100, 2000 + index * 7, 4095] {
            let mut damaged = image.clone();
            damaged[page as usize + offset] ^= 0x20;
            match open_image(damaged) {
                Ok(_) => {} // a page no longer reached (free, or an older copy)
                Err(Error::Corrupt(message)) => {
                    refused += 1;
                    assert!(message.contains(&page.to_string()), "{message}");
                }
                Err(other) => panic!("page {page} byte {offset}: {other}"),
            }
        }
    }
    assert!(refused > 0, "no damaged page was refused");
}

/// A format-3 volume whose data filled it refuses new metadata with ENOSPC
/// before its index could run out of pages: it never turns read-only,
/// changes to what exists go on, and it reopens clean with every file.
#[test]
fn a_full_indexed_volume_refuses_new_files_and_stays_writable() {
    let (device, volume) = new_indexed_volume(16 << 20, None);
    let inodes = volume.inodes();
    let big = inodes.create(ROOT, b"big", 0o644, owner()).unwrap();
    let file = inodes.open_file(big.ino, OpenFlags::WRITE).unwrap();
    let mut size = 0u64;
    let error = loop {
        match file.write_at(&[1u8; 1 << 20], size) {
            Ok(written) => size += written as u64,
            Err(error) => break error,
        }
    };
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    file.sync_all().unwrap();
    drop(file);
    let mut made = Vec::new();
    let error = loop {
        let name = format!("file-{}", made.len());
        match inodes.create(ROOT, name.as_bytes(), 0o644, owner()) {
            Ok(attr) => made.push((name, attr.ino)),
            Err(error) => break error,
        }
        assert!(made.len() < 1_000_000, "a full volume took a million files");
    };
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    // What exists still changes, through checkpoints.
    for (_, ino) in &made {
        let mode = foliofs::SetAttr { mode: Some(0o600), ..Default::default() };
        inodes.setattr(*ino, &mode).unwrap();
    }
    volume.checkpoint().unwrap();
    for (name, _) in made.iter().step_by(2) {
        inodes.unlink(ROOT, name.as_bytes()).unwrap();
    }
    volume.checkpoint().unwrap();
    volume.sync().unwrap();
    let kept: Vec<&String> = made.iter().skip(1).step_by(2).map(|(name, _)| name).collect();
    drop(volume);
    assert_fsck_clean(device.image());
    let (_, reopened) = open_image(device.image()).unwrap();
    assert_eq!(reopened.inodes().readdir(ROOT).unwrap().len(), kept.len() + 1);
    for name in kept {
        let ino = reopened.inodes().lookup(ROOT, name.as_bytes()).unwrap().ino;
        assert_eq!(reopened.inodes().getattr(ino).unwrap().mode & 0o777, 0o600);
    }
    assert_eq!(reopened.inodes().getattr(big.ino).unwrap().size, size);
}

/// Options that keep no inode in memory past a checkpoint but those in
/// use: every eviction, and every read back from the index, is taken.
fn evicting() -> foliofs::VolumeOptions {
    foliofs::VolumeOptions { inode_cache_bytes: 0, ..common::options() }
}

fn reopen_evicting(image: Vec<u8>) -> (Arc<FaultDev>, Volume) {
    common::open_image_with(image, &evicting()).expect("reopen")
}

/// A tree of every kind: directories, files with data and extended
/// attributes, a symlink, a hard link.
fn populate(volume: &Volume) -> Vec<u64> {
    let inodes = volume.inodes();
    let mut made = Vec::new();
    for d in 0..4 {
        let dir = inodes.mkdir(ROOT, format!("dir-{d}").as_bytes(), 0o755, owner()).unwrap();
        made.push(dir.ino);
        for f in 0..50 {
            let name = format!("file-{f}");
            let file = inodes.create(dir.ino, name.as_bytes(), 0o644, owner()).unwrap();
            made.push(file.ino);
            if f % 5 == 0 {
                let handle = inodes.open_file(file.ino, OpenFlags::WRITE).unwrap();
                handle.write_at(&pattern(f as u64, 3 * 4096 + f), 0).unwrap();
            }
            if f % 7 == 0 {
                inodes
                    .set_xattr(file.ino, b"user.note", name.as_bytes(), ANY, Privilege::SysAdmin)
                    .unwrap();
            }
        }
        inodes.symlink(dir.ino, b"link", b"file-0", owner()).unwrap();
        inodes.link(made[made.len() - 1], dir.ino, b"hard").unwrap();
    }
    volume.sync().unwrap();
    made
}

#[test]
fn inodes_leave_memory_after_a_checkpoint_and_are_read_back_when_named() {
    let (device, volume) = new_indexed_volume(64 << 20, None);
    drop(volume);
    let (device, volume) = reopen_evicting(device.image());
    let made = populate(&volume);
    let before = snapshot(&volume);
    let in_memory = volume.inodes_in_memory();
    assert!(in_memory > made.len() as u64, "{in_memory} in memory before the checkpoint");
    volume.checkpoint().unwrap();
    let in_memory = volume.inodes_in_memory();
    assert!(in_memory <= 2, "{in_memory} inodes stayed in memory after the checkpoint");
    // Every path reads the same from the index.
    assert_eq!(snapshot(&volume), before);
    // Change what was evicted: write, chmod, rename, unlink, remove a
    // directory's files and the directory.
    volume.checkpoint().unwrap();
    let inodes = volume.inodes();
    let dir0 = inodes.lookup(ROOT, b"dir-0").unwrap().ino;
    let file = inodes.lookup(dir0, b"file-1").unwrap().ino;
    inodes.open_file(file, OpenFlags::WRITE).unwrap().write_at(b"changed", 100).unwrap();
    let mode = foliofs::SetAttr { mode: Some(0o600), ..Default::default() };
    inodes.setattr(inodes.lookup(dir0, b"file-2").unwrap().ino, &mode).unwrap();
    volume.checkpoint().unwrap();
    inodes.rename(dir0, b"file-3", ROOT, b"moved", foliofs::RenameFlags::default()).unwrap();
    inodes.unlink(dir0, b"file-4").unwrap();
    let dir3 = inodes.lookup(ROOT, b"dir-3").unwrap().ino;
    for entry in inodes.readdir(dir3).unwrap() {
        if entry.name != b"." && entry.name != b".." {
            inodes.unlink(dir3, &entry.name).unwrap();
        }
    }
    volume.checkpoint().unwrap();
    inodes.rmdir(ROOT, b"dir-3").unwrap();
    volume.sync().unwrap();
    let after = snapshot(&volume);
    assert_ne!(after, before);
    assert!(after.contains_key("/moved") && !after.contains_key("/dir-0/file-4"));
    let statfs_inodes = volume.statfs().inodes;
    drop(volume);
    assert_fsck_clean(device.image());
    // Reopened: only what open needs is in memory, and every path reads
    // back as it was.
    let (_, reopened) = reopen_evicting(device.image());
    assert!(reopened.inodes_in_memory() <= 2);
    assert_eq!(reopened.statfs().inodes, statfs_inodes);
    assert_eq!(snapshot(&reopened), after);
}

#[test]
fn a_freed_inode_is_never_read_back_from_the_index() {
    let (device, volume) = new_indexed_volume(32 << 20, None);
    drop(volume);
    let (_, volume) = reopen_evicting(device.image());
    let inodes = volume.inodes();
    let file = inodes.create(ROOT, b"gone", 0o644, owner()).unwrap().ino;
    inodes.open_file(file, OpenFlags::WRITE).unwrap().write_at(&[7u8; 8192], 0).unwrap();
    volume.sync().unwrap();
    // The index holds the file, and memory does not.
    volume.checkpoint().unwrap();
    inodes.unlink(ROOT, b"gone").unwrap();
    // Freed in memory, still in the index until the next checkpoint.
    assert_eq!(inodes.getattr(file).unwrap_err().errno(), libc::ENOENT);
    volume.checkpoint().unwrap();
    assert_eq!(inodes.getattr(file).unwrap_err().errno(), libc::ENOENT);
    assert!(inodes.lookup(ROOT, b"gone").is_err());
}

#[test]
fn what_only_memory_holds_keeps_an_inode_in_memory() {
    let (device, volume) = new_indexed_volume(32 << 20, None);
    drop(volume);
    let (device, volume) = reopen_evicting(device.image());
    let inodes = volume.inodes();
    // Data written and not yet written back (delayed extents), through a
    // handle still open.
    let file = inodes.create(ROOT, b"open", 0o644, owner()).unwrap().ino;
    let handle = inodes.open_file(file, OpenFlags::WRITE).unwrap();
    handle.write_at(&pattern(3, 20_000), 0).unwrap();
    // Unlinked while open: an orphan.
    let orphan = inodes.create(ROOT, b"orphan", 0o644, owner()).unwrap().ino;
    let orphan_handle = inodes.open_file(orphan, OpenFlags::READ_WRITE).unwrap();
    orphan_handle.write_at(b"still here", 0).unwrap();
    inodes.unlink(ROOT, b"orphan").unwrap();
    volume.checkpoint().unwrap();
    assert!(volume.inodes_in_memory() >= 3);
    assert_eq!(inodes.getattr(file).unwrap().size, 20_000);
    let mut back = vec![0u8; 10];
    orphan_handle.read_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"still here");
    handle.sync_all().unwrap();
    drop(handle);
    // A crash with the orphan still open: mount frees it.
    let image = device.image();
    drop(orphan_handle);
    drop(volume);
    let (_, reopened) = reopen_evicting(image);
    assert_eq!(reopened.inodes().getattr(orphan).unwrap_err().errno(), libc::ENOENT);
    let mut data = vec![0u8; 20_000];
    let handle = reopened.inodes().open_file(file, OpenFlags::READ).unwrap();
    handle.read_at(&mut data, 0).unwrap();
    assert_eq!(data, pattern(3, 20_000));
}

#[test]
fn open_reads_free_space_and_counts_from_the_index_not_every_inode() {
    let (device, volume) = new_indexed_volume(64 << 20, None);
    let made = populate(&volume);
    volume.checkpoint().unwrap();
    // After the cut, changes only the journal holds: files freed, a file
    // written, one unlinked while open (an orphan the crash leaves).
    let inodes = volume.inodes();
    let dir0 = inodes.lookup(ROOT, b"dir-0").unwrap().ino;
    for f in [0, 5, 10] {
        inodes.unlink(dir0, format!("file-{f}").as_bytes()).unwrap();
    }
    let late = inodes.create(ROOT, b"late", 0o644, owner()).unwrap().ino;
    let handle = inodes.open_file(late, OpenFlags::WRITE).unwrap();
    handle.write_at(&pattern(9, 50_000), 0).unwrap();
    handle.sync_all().unwrap();
    let orphan = inodes.lookup(dir0, b"file-15").unwrap().ino;
    let orphan_handle = inodes.open_file(orphan, OpenFlags::READ).unwrap();
    inodes.unlink(dir0, b"file-15").unwrap();
    volume.sync().unwrap();
    let expected = snapshot(&volume);
    let image = device.image();
    drop(orphan_handle);
    drop(handle);
    drop(volume);
    let (_, reopened) = open_image(image.clone()).unwrap();
    let report = reopened.load_report();
    assert!(
        report.checkpoint_records < made.len() as u64 / 4,
        "open read {} keys of the index for {} inodes",
        report.checkpoint_records,
        made.len()
    );
    assert!(report.journal_records_replayed > 0);
    assert_eq!(reopened.inodes().getattr(orphan).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(snapshot(&reopened), expected);
    let statfs = reopened.statfs();
    drop(reopened);
    // fsck derives free space from every extent map and compares.
    assert_fsck_clean(image.clone());
    // Closed cleanly (a checkpoint, whose pages come from free space) and
    // opened again: the same files, free space as fsck derives it.
    let (device, volume) = open_image(image).unwrap();
    drop(volume);
    let (_, again) = open_image(device.image()).unwrap();
    assert_eq!(again.statfs().inodes, statfs.inodes);
    assert!(again.statfs().free_blocks <= statfs.free_blocks);
    assert_eq!(snapshot(&again), expected);
    drop(again);
    assert_fsck_clean(device.image());
}

#[test]
fn inodes_read_for_lookups_alone_leave_memory_without_a_change() {
    let (device, volume) = new_indexed_volume(32 << 20, None);
    let inodes = volume.inodes();
    for f in 0..300 {
        inodes.create(ROOT, format!("file-{f}").as_bytes(), 0o644, owner()).unwrap();
    }
    drop(volume);
    // The background thread, every 20 ms, with no inode kept past use.
    let options = foliofs::VolumeOptions { commit_interval_ms: 20, ..evicting() };
    let (_, volume) = common::open_image_with(device.image(), &options).unwrap();
    for f in 0..300 {
        let ino = volume.inodes().lookup(ROOT, format!("file-{f}").as_bytes()).unwrap().ino;
        assert_eq!(volume.inodes().getattr(ino).unwrap().mode & 0o777, 0o644);
    }
    let mut in_memory = volume.inodes_in_memory();
    for _ in 0..500 {
        if in_memory <= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        in_memory = volume.inodes_in_memory();
    }
    assert!(in_memory <= 2, "{in_memory} inodes still in memory after 10 s of nothing changing");
}
