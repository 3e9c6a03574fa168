//! The vfs API over an in-memory device: namespace rules, data, persistence,
//! each on 1 KiB, 4 KiB and 64 KiB blocks.

#[macro_use]
mod common;

use common::{new_volume, new_volume_with_journal, open_image, owner, pattern, ROOT};
use foliofs::{Error, InodeKind, OpenFlags, RenameFlags, SetAttr, TimeSet, Timestamp};

fn names(volume: &foliofs::Volume, dir: u64) -> Vec<String> {
    volume
        .inodes()
        .readdir(dir)
        .unwrap()
        .into_iter()
        .map(|entry| String::from_utf8(entry.name).unwrap())
        .collect()
}

block_size_tests!(
    data_and_namespace_survive_close_and_reopen,
    partial_block_writes_read_modify_write,
    truncate_down_then_up_exposes_zeros_not_old_bytes,
    namespace_errors_are_the_posix_ones,
    rename_replaces_exchanges_and_keeps_link_counts,
    rename_whiteout_leaves_a_whiteout_device_that_survives_reopen,
    unlinked_open_file_lives_until_closed_and_orphans_are_freed_at_mount,
    hard_links_share_data_and_count,
    setattr_changes_mode_owner_and_times,
    full_volume_reports_enospc_and_keeps_earlier_files,
    many_files_force_checkpoints_and_reload,
    dot_and_dot_dot_find_an_inode_and_its_parent_by_number,
    a_readers_size_follows_changes_made_through_other_paths,
);

fn data_and_namespace_survive_close_and_reopen(block_bytes: u32) {
    let (device, volume) = new_volume(64 << 20, block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"dir", 0o750, owner()).unwrap();
    let file = volume.inodes().create(dir.ino, b"file", 0o640, owner()).unwrap();
    let data = pattern(1, 100_000);
    let handle = volume.inodes().open_file(file.ino, OpenFlags::READ_WRITE).unwrap();
    assert_eq!(handle.write_at(&data, 12_345).unwrap(), data.len());
    handle.close().unwrap();
    volume.inodes().symlink(ROOT, b"link", b"dir/file", owner()).unwrap();
    volume.close().unwrap();

    let (_, volume) = open_image(device.image()).unwrap();
    let ino = volume.inodes().resolve("/dir/file").unwrap();
    let attr = volume.inodes().getattr(ino).unwrap();
    assert_eq!(attr.size, 12_345 + 100_000);
    assert_eq!((attr.mode, attr.uid, attr.kind), (0o640, 1000, InodeKind::File));
    let handle = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let mut back = vec![0xAA; attr.size as usize + 10];
    assert_eq!(handle.read_at(&mut back, 0).unwrap(), attr.size as usize);
    assert!(back[..12_345].iter().all(|&byte| byte == 0), "the hole reads as zeros");
    assert_eq!(&back[12_345..attr.size as usize], &data[..]);
    assert_eq!(
        volume.inodes().readlink(volume.inodes().resolve("/link").unwrap()).unwrap(),
        b"dir/file"
    );
    assert_eq!(names(&volume, ROOT), ["dir", "link"]);
    assert_eq!(volume.inodes().getattr(ROOT).unwrap().nlink, 3);
}

/// Writes that start or end inside blocks, including ones straddling the
/// first and second block boundaries of each block size.
fn partial_block_writes_read_modify_write(block_bytes: u32) {
    let (_, volume) = new_volume(32 << 20, block_bytes);
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let handle = volume.inodes().open_file(file.ino, OpenFlags::READ_WRITE).unwrap();
    let block = block_bytes as usize;
    let writes = [
        (0usize, 5000usize),
        (100, 1),
        (4095, 2),
        (8000, 9000),
        (3, 4093),
        (block - 1, 2),
        (2 * block - 7, 20),
        (block + 5, block - 10),
    ];
    let size_expected = writes.iter().map(|(pos, length)| pos + length).max().unwrap();
    let mut model = vec![0u8; size_expected];
    for (index, (pos, length)) in writes.iter().enumerate() {
        let data = pattern(index as u64 + 10, *length);
        handle.write_at(&data, *pos as u64).unwrap();
        model[*pos..pos + length].copy_from_slice(&data);
    }
    let size = handle.attr().unwrap().size as usize;
    assert_eq!(size, size_expected);
    let mut back = vec![0u8; size];
    handle.read_at(&mut back, 0).unwrap();
    assert_eq!(back, model[..size]);
    let mut tail = [1u8; 10];
    assert_eq!(handle.read_at(&mut tail, size as u64 - 5).unwrap(), 5);
    assert_eq!(tail[..5], model[size - 5..]);
    assert_eq!(handle.read_at(&mut tail, size as u64).unwrap(), 0);
}

fn truncate_down_then_up_exposes_zeros_not_old_bytes(block_bytes: u32) {
    let (_, volume) = new_volume(64 << 20, block_bytes);
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let handle = volume.inodes().open_file(file.ino, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(&[0xEE; 200_000], 0).unwrap();
    handle.set_len(1000).unwrap();
    assert_eq!(handle.attr().unwrap().size, 1000);
    let used = volume.inodes().getattr(file.ino).unwrap().blocks_512 * 512;
    assert_eq!(used, 1000u64.div_ceil(u64::from(block_bytes)) * u64::from(block_bytes));
    handle.set_len(300_000).unwrap();
    let mut back = vec![1u8; 300_000];
    handle.read_at(&mut back, 0).unwrap();
    assert!(back[..1000].iter().all(|&byte| byte == 0xEE));
    assert!(back[1000..].iter().all(|&byte| byte == 0));
    let attr = volume
        .inodes()
        .setattr(file.ino, &SetAttr { size: Some(5), ..SetAttr::default() })
        .unwrap();
    assert_eq!(attr.size, 5);
}

fn namespace_errors_are_the_posix_ones(block_bytes: u32) {
    let (_, volume) = new_volume(32 << 20, block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"d", 0o755, owner()).unwrap();
    volume.inodes().create(dir.ino, b"f", 0o644, owner()).unwrap();
    fn errno<T: std::fmt::Debug>(result: foliofs::Result<T>) -> i32 {
        result.unwrap_err().errno()
    }
    assert_eq!(errno(volume.inodes().create(dir.ino, b"f", 0o644, owner())), libc::EEXIST);
    assert_eq!(errno(volume.inodes().rmdir(ROOT, b"d")), libc::ENOTEMPTY);
    assert_eq!(errno(volume.inodes().unlink(ROOT, b"d")), libc::EISDIR);
    assert_eq!(errno(volume.inodes().rmdir(dir.ino, b"f")), libc::ENOTDIR);
    assert_eq!(errno(volume.inodes().lookup(ROOT, b"missing")), libc::ENOENT);
    assert_eq!(
        errno(volume.inodes().create(ROOT, &[b'x'; 256], 0o644, owner())),
        libc::ENAMETOOLONG
    );
    assert_eq!(errno(volume.inodes().create(ROOT, b"a/b", 0o644, owner())), libc::EINVAL);
    assert_eq!(errno(volume.inodes().create(ROOT, b"..", 0o644, owner())), libc::EINVAL);
    let file = volume.inodes().resolve("/d/f").unwrap();
    assert_eq!(errno(volume.inodes().create(file, b"x", 0o644, owner())), libc::ENOTDIR);
    assert_eq!(errno(volume.inodes().link(dir.ino, ROOT, b"dirlink")), libc::EPERM);
    assert_eq!(
        errno(volume.inodes().rename(ROOT, b"d", dir.ino, b"inside", RenameFlags::default())),
        libc::EINVAL
    );
    assert_eq!(errno(volume.inodes().open_file(dir.ino, OpenFlags::READ)), libc::EISDIR);
    assert!(matches!(volume.inodes().resolve("/d/f/x"), Err(Error::NotDir(_))));
}

fn rename_replaces_exchanges_and_keeps_link_counts(block_bytes: u32) {
    let (_, volume) = new_volume(32 << 20, block_bytes);
    let a = volume.inodes().mkdir(ROOT, b"a", 0o755, owner()).unwrap();
    let b = volume.inodes().mkdir(ROOT, b"b", 0o755, owner()).unwrap();
    let sub = volume.inodes().mkdir(a.ino, b"sub", 0o755, owner()).unwrap();
    let f1 = volume.inodes().create(a.ino, b"f1", 0o644, owner()).unwrap();
    let f2 = volume.inodes().create(b.ino, b"f2", 0o644, owner()).unwrap();
    volume.inodes().rename(a.ino, b"f1", b.ino, b"f2", RenameFlags::default()).unwrap();
    assert_eq!(volume.inodes().lookup(b.ino, b"f2").unwrap().ino, f1.ino);
    assert!(volume.inodes().getattr(f2.ino).is_err(), "the replaced file is freed");
    let no_replace = RenameFlags { no_replace: true, ..RenameFlags::default() };
    volume.inodes().create(a.ino, b"f3", 0o644, owner()).unwrap();
    assert_eq!(
        volume.inodes().rename(a.ino, b"f3", b.ino, b"f2", no_replace).unwrap_err().errno(),
        libc::EEXIST
    );
    volume.inodes().rename(a.ino, b"sub", b.ino, b"sub2", RenameFlags::default()).unwrap();
    assert_eq!(volume.inodes().getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(volume.inodes().getattr(b.ino).unwrap().nlink, 3);
    assert_eq!(volume.inodes().resolve("/b/sub2/..").unwrap(), b.ino);
    let exchange = RenameFlags { exchange: true, ..RenameFlags::default() };
    volume.inodes().rename(a.ino, b"f3", b.ino, b"sub2", exchange).unwrap();
    assert_eq!(volume.inodes().lookup(a.ino, b"f3").unwrap().ino, sub.ino);
    assert_eq!(volume.inodes().getattr(a.ino).unwrap().nlink, 3);
    assert_eq!(volume.inodes().getattr(b.ino).unwrap().nlink, 2);
    assert_eq!(volume.inodes().resolve("/a/f3/..").unwrap(), a.ino);
    let report = foliofs::fsck::check(volume.device().clone());
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// RENAME_WHITEOUT (overlayfs' upper layer; xfstests generic/078, 626,
/// 700): the source name is left holding a character device 0:0 with mode
/// 0, made in the rename's own transaction.
fn rename_whiteout_leaves_a_whiteout_device_that_survives_reopen(block_bytes: u32) {
    let (device, volume) = new_volume(32 << 20, block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"d", 0o755, owner()).unwrap();
    let moved = volume.inodes().create(dir.ino, b"src", 0o644, owner()).unwrap();
    let replaced = volume.inodes().create(ROOT, b"dst", 0o644, owner()).unwrap();
    let caller = foliofs::Owner { uid: 0, gid: 0 };
    let whiteout = RenameFlags { whiteout: Some(caller), ..RenameFlags::default() };
    let exchange_too = RenameFlags { exchange: true, ..whiteout };
    assert_eq!(
        volume.inodes().rename(dir.ino, b"src", ROOT, b"dst", exchange_too).unwrap_err().errno(),
        libc::EINVAL
    );
    volume.inodes().rename(dir.ino, b"src", ROOT, b"dst", whiteout).unwrap();
    assert_eq!(volume.inodes().lookup(ROOT, b"dst").unwrap().ino, moved.ino);
    assert!(volume.inodes().getattr(replaced.ino).is_err(), "the replaced file is freed");
    let left = volume.inodes().lookup(dir.ino, b"src").unwrap();
    assert_eq!((left.kind, left.mode & 0o7777, left.rdev), (InodeKind::CharDevice, 0, 0));
    assert_eq!((left.uid, left.gid, left.nlink), (0, 0, 1));
    let no_replace = RenameFlags { no_replace: true, ..whiteout };
    volume.inodes().create(ROOT, b"taken", 0o644, owner()).unwrap();
    assert_eq!(
        volume.inodes().rename(ROOT, b"dst", ROOT, b"taken", no_replace).unwrap_err().errno(),
        libc::EEXIST
    );
    assert_eq!(
        volume.inodes().lookup(ROOT, b"dst").unwrap().ino,
        moved.ino,
        "a refused rename changes nothing"
    );
    volume.sync().unwrap();
    let image = device.image();
    drop(volume);
    let (_, volume) = open_image(image).unwrap();
    let dir = volume.inodes().lookup(ROOT, b"d").unwrap();
    assert_eq!(volume.inodes().lookup(dir.ino, b"src").unwrap().kind, InodeKind::CharDevice);
    let report = foliofs::fsck::check(volume.device().clone());
    assert!(report.is_clean(), "{:?}", report.problems);
}

fn unlinked_open_file_lives_until_closed_and_orphans_are_freed_at_mount(block_bytes: u32) {
    let (device, volume) = new_volume(32 << 20, block_bytes);
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let handle = volume.inodes().open_file(file.ino, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(&[7u8; 50_000], 0).unwrap();
    let free_before = volume.statfs().free_blocks;
    volume.inodes().unlink(ROOT, b"f").unwrap();
    let mut back = [0u8; 10];
    assert_eq!(handle.read_at(&mut back, 0).unwrap(), 10);
    assert_eq!(back, [7u8; 10]);
    volume.sync().unwrap();
    let crashed = device.image();
    handle.close().unwrap();
    volume.sync().unwrap();
    assert!(volume.statfs().free_blocks > free_before, "space freed on the last close");
    assert!(volume.inodes().getattr(file.ino).is_err());
    drop(volume);

    // A crash while the orphan was open: fsck notes it, mount frees it.
    let report = foliofs::fsck::check(open_image(crashed.clone()).unwrap().1.device().clone());
    assert!(report.is_clean(), "{:?}", report.problems);
    let (_, volume) = open_image(crashed).unwrap();
    assert!(volume.inodes().getattr(file.ino).is_err(), "orphan freed at mount");
}

fn hard_links_share_data_and_count(block_bytes: u32) {
    let (_, volume) = new_volume(32 << 20, block_bytes);
    let file = volume.inodes().create(ROOT, b"one", 0o644, owner()).unwrap();
    volume.inodes().link(file.ino, ROOT, b"two").unwrap();
    assert_eq!(volume.inodes().getattr(file.ino).unwrap().nlink, 2);
    volume.inodes().open_file(file.ino, OpenFlags::WRITE).unwrap().write_at(b"shared", 0).unwrap();
    volume.inodes().unlink(ROOT, b"one").unwrap();
    let two = volume.inodes().lookup(ROOT, b"two").unwrap();
    assert_eq!((two.ino, two.nlink, two.size), (file.ino, 1, 6));
}

fn setattr_changes_mode_owner_and_times(block_bytes: u32) {
    let (_, volume) = new_volume(32 << 20, block_bytes);
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let at = Timestamp { secs: 1_000_000, nanos: 123_456_789 };
    let changes = SetAttr {
        mode: Some(0o4711),
        uid: Some(7),
        gid: Some(8),
        atime: Some(TimeSet::At(at)),
        mtime: Some(TimeSet::At(at)),
        size: None,
        ctime: None,
    };
    let attr = volume.inodes().setattr(file.ino, &changes).unwrap();
    assert_eq!((attr.mode, attr.uid, attr.gid, attr.atime, attr.mtime), (0o4711, 7, 8, at, at));
    assert!(attr.ctime > at);
}

fn full_volume_reports_enospc_and_keeps_earlier_files(block_bytes: u32) {
    let (_, volume) = new_volume(16 << 20, block_bytes);
    let keep = volume.inodes().create(ROOT, b"keep", 0o644, owner()).unwrap();
    let keep_data = pattern(5, 100_000);
    volume.inodes().open_file(keep.ino, OpenFlags::WRITE).unwrap().write_at(&keep_data, 0).unwrap();
    volume.sync().unwrap();
    let available_before = volume.statfs().available_blocks;
    let big = volume.inodes().create(ROOT, b"big", 0o644, owner()).unwrap();
    let handle = volume.inodes().open_file(big.ino, OpenFlags::WRITE).unwrap();
    let chunk = vec![1u8; 1 << 20];
    let mut error = None;
    for index in 0..64u64 {
        match handle.write_at(&chunk, index << 20) {
            Ok(written) if written == chunk.len() => {}
            Ok(_) => {}
            Err(failure) => {
                error = Some(failure);
                break;
            }
        }
    }
    let error = error.expect("a 16 MiB volume cannot take 64 MiB");
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    let mut back = vec![0u8; keep_data.len()];
    volume.inodes().open_file(keep.ino, OpenFlags::READ).unwrap().read_at(&mut back, 0).unwrap();
    assert_eq!(back, keep_data);
    drop(handle);
    volume.inodes().unlink(ROOT, b"big").unwrap();
    volume.sync().unwrap();
    assert_eq!(
        volume.statfs().available_blocks,
        available_before,
        "all the space comes back once the unlink is durable"
    );
}

fn many_files_force_checkpoints_and_reload(block_bytes: u32) {
    // Room for the ~430 one-block files (a third of them unlinked), and the
    // same 256 KiB journal on every block size, so it wraps through
    // checkpoints on each (a 1 MiB one held all 3,000 creates: none was
    // forced, and the test checked only the closing one).
    let volume_bytes = (16 << 20) + 430 * u64::from(block_bytes);
    let (device, volume) = new_volume_with_journal(volume_bytes, block_bytes, Some(256 << 10));
    for index in 0..3000u32 {
        let name = format!("file-with-a-long-name-{index:05}");
        let attr = volume.inodes().create(ROOT, name.as_bytes(), 0o644, owner()).unwrap();
        if index % 7 == 0 {
            volume
                .inodes()
                .open_file(attr.ino, OpenFlags::WRITE)
                .unwrap()
                .write_at(&index.to_le_bytes(), 0)
                .unwrap();
        }
        if index % 3 == 0 {
            volume.inodes().unlink(ROOT, name.as_bytes()).unwrap();
        }
        if index % 50 == 0 {
            volume.sync().unwrap();
        }
    }
    volume.sync().unwrap();
    let expected = names(&volume, ROOT);
    // The journal filled and forced checkpoints before any was asked for.
    let forced = volume.checkpoint_stats();
    assert!(forced.checkpoints >= 1, "the workload forced no checkpoint: {forced:?}");
    // Every checkpoint written is counted, with its payload and time.
    volume.checkpoint().unwrap();
    let written = volume.checkpoint_stats();
    assert_eq!(written.checkpoints, forced.checkpoints + 1, "{written:?}");
    assert!(written.bytes_total > 0 && written.ns_total > 0, "{written:?}");
    drop(volume);
    let (_, volume) = open_image(device.image()).unwrap();
    // mkfs wrote the first; the closing drop wrote one more than counted.
    assert_eq!(volume.load_report().checkpoint_generation, written.checkpoints + 2);
    assert_eq!(volume.checkpoint_stats().checkpoints, 0, "counted since this open");
    assert!(
        volume.load_report().checkpoint_generation > 1,
        "the journal wrapped through checkpoints"
    );
    assert_eq!(names(&volume, ROOT), expected);
    let ino = volume.inodes().resolve("/file-with-a-long-name-00007").unwrap();
    let mut back = [0u8; 4];
    volume.inodes().open_file(ino, OpenFlags::READ).unwrap().read_at(&mut back, 0).unwrap();
    assert_eq!(u32::from_le_bytes(back), 7);
}

/// What the kernel asks to turn a file handle back into an inode: "." in any
/// inode (a file too) is itself, ".." in a directory its parent; a removed
/// inode is not found (the handle is stale).
fn dot_and_dot_dot_find_an_inode_and_its_parent_by_number(block_bytes: u32) {
    let (_, volume) = new_volume(32 << 20, block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"dir", 0o755, owner()).unwrap();
    let file = volume.inodes().create(dir.ino, b"file", 0o644, owner()).unwrap();
    assert_eq!(volume.inodes().lookup(file.ino, b".").unwrap().ino, file.ino);
    assert_eq!(volume.inodes().lookup(dir.ino, b".").unwrap().ino, dir.ino);
    assert_eq!(volume.inodes().lookup(dir.ino, b"..").unwrap().ino, ROOT);
    assert_eq!(volume.inodes().lookup(ROOT, b"..").unwrap().ino, ROOT);
    assert_eq!(volume.inodes().lookup(file.ino, b"..").unwrap_err().errno(), libc::ENOTDIR);
    volume.inodes().unlink(dir.ino, b"file").unwrap();
    assert_eq!(volume.inodes().lookup(file.ino, b".").unwrap_err().errno(), libc::ENOENT);
}

/// A handle's buffered reads keep a copy of the file's size and use it
/// while the metadata is unchanged (`meta::view`): every size change made
/// through another handle, setattr, fallocate or a direct write is still
/// seen by the very next read of a handle that read before it.
fn a_readers_size_follows_changes_made_through_other_paths(block_bytes: u32) {
    use foliofs::FallocateMode;
    let (_, volume) = new_volume(64 << 20, block_bytes);
    let block = block_bytes as usize;
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let writer = volume.inodes().open_file(file, OpenFlags::READ_WRITE).unwrap();
    let reader = volume.inodes().open_file(file, OpenFlags::READ).unwrap();
    let mut buffer = vec![0u8; 8 * block];
    let read = |buffer: &mut [u8]| reader.read_at(buffer, 0).unwrap();
    assert_eq!(read(&mut buffer), 0);
    writer.write_at(&pattern(1, 2 * block), 0).unwrap();
    assert_eq!(read(&mut buffer), 2 * block, "a buffered write through another handle");
    assert_eq!(buffer[..2 * block], pattern(1, 2 * block)[..]);
    assert_eq!(read(&mut buffer), 2 * block, "the same again, from the copy");
    volume
        .inodes()
        .setattr(file, &SetAttr { size: Some(block as u64 + 5), ..SetAttr::default() })
        .unwrap();
    assert_eq!(read(&mut buffer), block + 5, "a truncate");
    writer.fallocate(FallocateMode::Allocate { keep_size: false }, 0, 3 * block as u64).unwrap();
    assert_eq!(read(&mut buffer), 3 * block, "a fallocate that grows the file");
    let direct = volume
        .inodes()
        .open_file(file, OpenFlags { direct: true, ..OpenFlags::READ_WRITE })
        .unwrap();
    let data = foliofs::dev::AlignedBuf::from_slice(&pattern(2, block));
    direct.write_at(&data, 4 * block as u64).unwrap();
    assert_eq!(read(&mut buffer), 5 * block, "a direct write past the end");
    assert_eq!(buffer[4 * block..5 * block], pattern(2, block)[..]);
    let mut in_place = Vec::new();
    let seen = reader.read_in_place(4 * block as u64, block, |bytes| in_place = bytes.to_vec());
    if seen.unwrap().is_some() {
        assert_eq!(in_place, pattern(2, block));
    }
    volume.inodes().setattr(file, &SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
    assert_eq!(read(&mut buffer), 0, "a truncate to nothing");
    assert_eq!(reader.read_in_place(0, block, |_| ()).unwrap(), None);
}

/// The room for metadata is the checkpoint slot, sized at mkfs: a volume
/// refuses the create that would outgrow it with ENOSPC naming the remedy,
/// keeps every file it took, and the same volume made with twice the room
/// takes about twice the files.
#[test]
fn mkfs_metadata_size_sets_how_many_files_fit() {
    use std::sync::Arc;

    use foliofs::dev::{Device, FaultDev, FuaMode};
    use foliofs::vfs::MkfsOptions;

    let files_that_fit = |metadata_bytes: Option<u64>| -> u64 {
        let raw = Arc::new(FaultDev::new(64 << 20, 512));
        let device = Arc::new(Device::new(raw, FuaMode::Native));
        let mkfs = MkfsOptions { metadata_bytes, root_owner: owner(), ..MkfsOptions::default() };
        foliofs::Volume::format(&device, &mkfs).unwrap();
        let volume = foliofs::Volume::open_device(device, &common::options()).unwrap();
        let mut created = 0u64;
        let refusal = loop {
            let name = format!("file-with-a-longish-name-{created:06}");
            match volume.inodes().create(ROOT, name.as_bytes(), 0o644, owner()) {
                Ok(_) => created += 1,
                Err(error) => break error,
            }
            assert!(created < 1_000_000, "the metadata never ran out of room");
        };
        assert_eq!(refusal.errno(), libc::ENOSPC, "{refusal}");
        assert!(refusal.to_string().contains("--metadata-size"), "{refusal}");
        assert_eq!(names(&volume, ROOT).len() as u64, created);
        volume.close().unwrap();
        created
    };
    // 64 MiB volumes: the default slot is its 1 MiB floor.
    let default = files_that_fit(None);
    let doubled = files_that_fit(Some(2 << 20));
    assert!(default > 1_000, "{default} files in 1 MiB of metadata");
    assert!(doubled > default * 3 / 2, "{doubled} files in 2 MiB against {default} in 1 MiB");
    let refused = foliofs::Volume::format(
        &Arc::new(Device::new(Arc::new(FaultDev::new(64 << 20, 512)), FuaMode::Native)),
        &MkfsOptions { metadata_bytes: Some(4 << 10), ..MkfsOptions::default() },
    )
    .unwrap_err();
    assert!(refused.to_string().contains("metadata size"), "{refused}");
}
