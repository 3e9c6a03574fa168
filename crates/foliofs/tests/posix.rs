//! POSIX rules the kernel leaves to the file system, as ext4 and XFS keep
//! them (each named after the xfstests case that checks it through a mount):
//! set-ID bits dropped by data changes, set-group-ID directories, open
//! directories outliving their name, freed space reused at once.

#[macro_use]
mod common;

use std::sync::Arc;

use common::{new_volume, owner, ROOT};
use foliofs::dev::{Device, FaultDev, FuaMode};
use foliofs::format::{INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE, INODE_FLAG_NODUMP};
use foliofs::FallocateMode;
use foliofs::{
    Error, InodeKind, OpenFlags, Owner, Privilege, RenameFlags, SetAttr, TimeSet, XattrFlags,
};

block_size_tests!(
    data_changes_by_unprivileged_callers_drop_setid_bits,
    data_changes_remove_file_capabilities_and_keep_other_attributes,
    setgid_directories_pass_on_their_group_and_bit,
    open_directory_outlives_its_name_with_nlink_zero,
    freed_space_is_reusable_at_once,
    reads_advance_atime_as_the_policy_says,
    unnamed_files_live_while_open_and_take_a_name_by_link,
    immutable_and_append_only_inodes_refuse_changes_and_persist,
);

const ROOT_CALLER: Owner = Owner { uid: 0, gid: 0 };

fn mode_of(volume: &foliofs::Volume, ino: u64) -> u32 {
    volume.inodes().getattr(ino).unwrap().mode
}

fn chmod(volume: &foliofs::Volume, ino: u64, mode: u32) {
    volume.inodes().setattr(ino, &SetAttr { mode: Some(mode), ..SetAttr::default() }).unwrap();
}

/// generic/355, 683-685: a write, truncate or fallocate by a caller
/// without CAP_FSETID drops set-user-ID, and set-group-ID where group
/// execute is set or the caller is not in the file's group.
fn data_changes_by_unprivileged_callers_drop_setid_bits(block_bytes: u32) {
    let (device, volume) = new_volume(16 << 20, block_bytes);
    let file = volume.inodes().create(ROOT, b"f", 0o644, Owner { uid: 0, gid: 0 }).unwrap().ino;
    let member = Owner { uid: 1000, gid: 0 };
    let stranger = Owner { uid: 1000, gid: 1000 };
    // (mode before, caller, mode after): 355's table for a caller in the
    // group, 683's for one outside it, and root keeping everything.
    let cases = [
        (0o6644, member, 0o2644),
        (0o6744, member, 0o2744),
        (0o6654, member, 0o0654),
        (0o6754, member, 0o0754),
        (0o6666, stranger, 0o0666),
        (0o6676, stranger, 0o0676),
        (0o6766, stranger, 0o0766),
        (0o2676, stranger, 0o0676),
        (0o6777, ROOT_CALLER, 0o6777),
        (0o6666, ROOT_CALLER, 0o6666),
        (0o0644, stranger, 0o0644),
    ];
    for (before, caller, after) in cases {
        chmod(&volume, file, before);
        let ctime = volume.inodes().getattr(file).unwrap().ctime;
        let changed = volume.inodes().remove_privileges(file, caller, true).unwrap();
        assert_eq!(mode_of(&volume, file), after, "{before:o} by {caller:?}");
        assert_eq!(changed, before != after);
        if changed {
            assert!(volume.inodes().getattr(file).unwrap().ctime >= ctime);
        }
    }
    // Directories keep their set-group-ID bit: it is not a privilege there.
    let dir = volume.inodes().mkdir(ROOT, b"d", 0o2775, ROOT_CALLER).unwrap().ino;
    assert!(!volume.inodes().remove_privileges(dir, stranger, true).unwrap());
    assert_eq!(mode_of(&volume, dir), 0o2775);
    // The change is a journalled one: it survives reopening.
    chmod(&volume, file, 0o4755);
    volume.inodes().remove_privileges(file, stranger, true).unwrap();
    volume.close().unwrap();
    let (_, volume) = common::open_image(device.image()).unwrap();
    assert_eq!(mode_of(&volume, file), 0o755);
}

/// generic/314, 633, 696: in a set-group-ID directory new entries take the
/// directory's group, and new directories its set-group-ID bit too.
fn setgid_directories_pass_on_their_group_and_bit(block_bytes: u32) {
    let (_device, volume) = new_volume(16 << 20, block_bytes);
    let shared =
        volume.inodes().mkdir(ROOT, b"shared", 0o775, Owner { uid: 1000, gid: 12345 }).unwrap();
    chmod(&volume, shared.ino, 0o2775);
    let creator = owner();
    let subdir = volume.inodes().mkdir(shared.ino, b"subdir", 0o755, creator).unwrap();
    assert_eq!((subdir.mode, subdir.uid, subdir.gid), (0o2755, creator.uid, 12345));
    let file = volume.inodes().create(shared.ino, b"file", 0o644, creator).unwrap();
    assert_eq!((file.mode, file.gid), (0o644, 12345), "files take the group, not the bit");
    let link = volume.inodes().symlink(shared.ino, b"link", b"file", creator).unwrap();
    assert_eq!((link.kind, link.gid), (InodeKind::Symlink, 12345));
    // The inherited bit carries on down the tree.
    let deeper = volume.inodes().mkdir(subdir.ino, b"deeper", 0o700, creator).unwrap();
    assert_eq!((deeper.mode, deeper.gid), (0o2700, 12345));
    // Without the bit the creator's group is used.
    let plain = volume.inodes().mkdir(ROOT, b"plain", 0o755, Owner { uid: 5, gid: 6 }).unwrap();
    let inside = volume.inodes().create(plain.ino, b"f", 0o6755, creator).unwrap();
    assert_eq!((inside.mode, inside.gid), (0o6755, creator.gid));
}

/// generic/035: a directory replaced by a rename (or removed) while open
/// stays, with nlink 0, until its last handle closes; it lists nothing and
/// takes no new entries. A crash meanwhile leaves an orphan that fsck notes
/// and the next mount frees.
fn open_directory_outlives_its_name_with_nlink_zero(block_bytes: u32) {
    let (device, volume) = new_volume(16 << 20, block_bytes);
    let source = volume.inodes().mkdir(ROOT, b"dir1", 0o755, owner()).unwrap();
    let target = volume.inodes().mkdir(ROOT, b"dir2", 0o755, owner()).unwrap();
    let open = volume.inodes().open_dir(target.ino).unwrap();
    volume.inodes().rename(ROOT, b"dir1", ROOT, b"dir2", RenameFlags::default()).unwrap();
    assert_eq!(open.attr().unwrap().nlink, 0);
    assert_eq!(volume.inodes().getattr(target.ino).unwrap().nlink, 0, "fstat through the handle");
    assert!(open.entries().unwrap().is_empty());
    assert!(matches!(
        volume.inodes().create(target.ino, b"late", 0o644, owner()),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        volume.inodes().mkdir(target.ino, b"late", 0o755, owner()),
        Err(Error::NotFound(_))
    ));
    assert_eq!(volume.inodes().getattr(ROOT).unwrap().nlink, 3, "one subdirectory left");
    assert_eq!(volume.inodes().lookup(ROOT, b"dir2").unwrap().ino, source.ino);
    open.close().unwrap();
    assert!(
        matches!(volume.inodes().getattr(target.ino), Err(Error::NotFound(_))),
        "freed on close"
    );

    // rmdir of an open directory, then a crash before the close.
    let open = volume.inodes().open_dir(source.ino).unwrap();
    volume.inodes().rmdir(ROOT, b"dir2").unwrap();
    assert_eq!(open.attr().unwrap().nlink, 0);
    volume.sync().unwrap();
    let crashed = device.image();
    drop(open);
    assert!(volume.inodes().getattr(source.ino).is_err());
    drop(volume);
    let volume = orphan_freed_after_crash(crashed, source.ino);
    assert!(foliofs::fsck::check(volume.device().clone()).is_clean());
}

/// O_TMPFILE (generic/004, 509, 530): an unnamed file has no link, is
/// freed with its last handle, or at the next mount after a crash, and
/// takes a name by link unless made exclusive; an unlinked file does not.
fn unnamed_files_live_while_open_and_take_a_name_by_link(block_bytes: u32) {
    let (device, volume) = new_volume(16 << 20, block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"d", 0o2775, Owner { uid: 0, gid: 7 }).unwrap().ino;
    let dir_mtime = volume.inodes().getattr(dir).unwrap().mtime;
    let free_blocks = volume.statfs().free_blocks;

    // Freed on close, with its data.
    let data = common::pattern(1, 300_000);
    let temp =
        volume.inodes().create_unnamed(dir, 0o600, owner(), OpenFlags::READ_WRITE, true).unwrap();
    let attr = volume.inodes().getattr(temp.ino()).unwrap();
    assert_eq!((attr.nlink, attr.kind, attr.mode & 0o7777), (0, InodeKind::File, 0o600));
    assert_eq!(attr.gid, 7, "the set-group-ID directory's group");
    temp.write_at(&data, 0).unwrap();
    temp.sync_all().unwrap();
    assert!(volume.inodes().readdir(dir).unwrap().is_empty(), "no name");
    assert_eq!(
        volume.inodes().getattr(dir).unwrap().mtime,
        dir_mtime,
        "the directory is unchanged"
    );
    let ino = temp.ino();
    temp.close().unwrap();
    assert!(matches!(volume.inodes().getattr(ino), Err(Error::NotFound(_))), "freed on close");
    volume.sync().unwrap();
    assert_eq!(volume.statfs().free_blocks, free_blocks, "its space is back");

    // Named by link: an ordinary file from then on, with its data.
    let temp =
        volume.inodes().create_unnamed(dir, 0o644, owner(), OpenFlags::READ_WRITE, true).unwrap();
    temp.write_at(&data, 0).unwrap();
    let named = volume.inodes().link(temp.ino(), dir, b"named").unwrap();
    assert_eq!((named.ino, named.nlink), (temp.ino(), 1));
    temp.close().unwrap();
    let reopened = volume.inodes().open_path("/d/named", OpenFlags::READ).unwrap();
    let mut read = vec![0; data.len()];
    assert_eq!(reopened.read_at(&mut read, 0).unwrap(), data.len());
    assert!(read == data);
    reopened.close().unwrap();

    // Exclusive ones, and files unlinked while open, take no name.
    let exclusive =
        volume.inodes().create_unnamed(dir, 0o644, owner(), OpenFlags::READ_WRITE, false).unwrap();
    assert!(matches!(volume.inodes().link(exclusive.ino(), dir, b"x"), Err(Error::NotFound(_))));
    let unlinked = volume.inodes().open_path("/d/named", OpenFlags::READ).unwrap();
    volume.inodes().unlink(dir, b"named").unwrap();
    assert!(matches!(volume.inodes().link(unlinked.ino(), dir, b"again"), Err(Error::NotFound(_))));
    unlinked.close().unwrap();
    exclusive.close().unwrap();
    assert!(volume.inodes().readdir(dir).unwrap().is_empty());
    assert!(matches!(
        volume.inodes().create_unnamed(dir, 0o644, owner(), OpenFlags::READ, true),
        Err(Error::Invalid(_))
    ));

    // A crash while one is open (its creation and data durable): fsck calls
    // it an orphan, the next mount frees it and its space.
    let temp =
        volume.inodes().create_unnamed(dir, 0o644, owner(), OpenFlags::READ_WRITE, true).unwrap();
    temp.write_at(&data, 0).unwrap();
    temp.sync_all().unwrap();
    volume.sync().unwrap();
    let crashed = device.image();
    let ino = temp.ino();
    drop(temp);
    drop(volume);
    let volume = orphan_freed_after_crash(crashed, ino);
    volume.sync().unwrap();
    assert_eq!(volume.statfs().free_blocks, free_blocks);
    assert!(foliofs::fsck::check(volume.device().clone()).is_clean());
}

fn is_eperm<T: std::fmt::Debug>(result: foliofs::Result<T>) -> bool {
    matches!(result, Err(Error::NotPermitted(_)))
}

/// chattr +i / +a (generic/079, 545, 623): nothing changes an immutable
/// inode; an append-only one takes data only past its end and entries only
/// added; only a privileged caller sets or clears them; the flags survive
/// a crash (replayed) and a checkpoint.
fn immutable_and_append_only_inodes_refuse_changes_and_persist(block_bytes: u32) {
    let (device, volume) = new_volume(16 << 20, block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"d", 0o755, owner()).unwrap().ino;
    let file = volume.inodes().create(dir, b"f", 0o644, owner()).unwrap().ino;
    let handle = volume.inodes().open_file(file, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(b"0123456789", 0).unwrap();
    let xattr = XattrFlags::default();
    let user = Privilege::Unprivileged;
    volume.inodes().set_xattr(file, b"user.a", b"1", xattr, user).unwrap();

    assert!(is_eperm(volume.inodes().set_flags(file, INODE_FLAG_IMMUTABLE, false)), "unprivileged");
    assert!(matches!(
        volume.inodes().set_flags(file, 0x1000_0000, true),
        Err(Error::Unsupported(_))
    ));
    volume.inodes().set_flags(file, INODE_FLAG_IMMUTABLE | INODE_FLAG_NODUMP, true).unwrap();
    assert_eq!(volume.inodes().flags(file).unwrap(), INODE_FLAG_IMMUTABLE | INODE_FLAG_NODUMP);
    let before = volume.inodes().getattr(file).unwrap();
    assert!(is_eperm(handle.write_at(b"x", 10)), "a handle opened before");
    assert!(is_eperm(handle.write_at(b"x", 0)));
    assert!(is_eperm(handle.set_len(0)));
    assert!(is_eperm(handle.fallocate(FallocateMode::Allocate { keep_size: true }, 0, 4096)));
    assert!(is_eperm(volume.inodes().open_file(file, OpenFlags::WRITE)));
    // A write through a handle opened before: set-ID bits stay too.
    assert!(is_eperm(volume.inodes().remove_privileges(file, owner(), true)));
    let chmod = SetAttr { mode: Some(0o600), ..SetAttr::default() };
    assert!(is_eperm(volume.inodes().setattr(file, &chmod)));
    let touch = SetAttr { mtime: Some(TimeSet::Now), ..SetAttr::default() };
    assert!(is_eperm(volume.inodes().setattr(file, &touch)));
    assert!(is_eperm(volume.inodes().set_xattr(file, b"user.b", b"2", xattr, user)));
    assert!(is_eperm(volume.inodes().remove_xattr(file, b"user.a", user)));
    assert!(is_eperm(volume.inodes().link(file, dir, b"g")));
    assert!(is_eperm(volume.inodes().unlink(dir, b"f")));
    assert!(is_eperm(volume.inodes().rename(dir, b"f", dir, b"g", RenameFlags::default())));
    let other = volume.inodes().create(dir, b"other", 0o644, owner()).unwrap().ino;
    assert!(is_eperm(volume.inodes().rename(dir, b"other", dir, b"f", RenameFlags::default())));
    assert_eq!(volume.inodes().getattr(file).unwrap(), before, "nothing changed");
    let mut read = [0; 10];
    handle.read_at(&mut read, 0).unwrap();
    assert_eq!(&read, b"0123456789", "reads still work");

    // Append-only: appends only, times set to now, nothing removed.
    assert!(is_eperm(volume.inodes().set_flags(file, INODE_FLAG_APPEND, false)), "clearing +i");
    volume.inodes().set_flags(file, INODE_FLAG_APPEND, true).unwrap();
    assert_eq!(handle.write_at(b"abc", 10).unwrap(), 3);
    assert!(is_eperm(handle.write_at(b"x", 5)));
    assert!(is_eperm(handle.set_len(100)));
    assert!(is_eperm(handle.fallocate(FallocateMode::PunchHole, 0, 4096)));
    handle.fallocate(FallocateMode::Allocate { keep_size: true }, 0, 8192).unwrap();
    let appender =
        volume.inodes().open_file(file, OpenFlags { append: true, ..OpenFlags::WRITE }).unwrap();
    appender.write_at(b"de", 0).unwrap();
    appender.close().unwrap();
    volume.inodes().setattr(file, &touch).unwrap();
    assert!(is_eperm(volume.inodes().setattr(file, &chmod)));
    assert!(is_eperm(volume.inodes().unlink(dir, b"f")));
    assert!(is_eperm(volume.inodes().check_append_only_open(file, true, false)));
    volume.inodes().check_append_only_open(file, true, true).unwrap();
    assert_eq!(volume.inodes().getattr(file).unwrap().size, 15);

    // Directories: immutable takes no entry; append-only only new ones.
    let sub = volume.inodes().mkdir(dir, b"sub", 0o755, owner()).unwrap().ino;
    volume.inodes().create(sub, b"inside", 0o644, owner()).unwrap();
    volume.inodes().set_flags(dir, INODE_FLAG_IMMUTABLE, true).unwrap();
    assert!(is_eperm(volume.inodes().create(dir, b"new", 0o644, owner())));
    assert!(is_eperm(volume.inodes().unlink(dir, b"other")));
    // EPERM before ENOTEMPTY and EISDIR, as the kernel's may_delete (generic/079).
    assert!(is_eperm(volume.inodes().rmdir(dir, b"sub")));
    assert!(is_eperm(volume.inodes().unlink(dir, b"sub")));
    assert!(is_eperm(volume.inodes().rename(dir, b"sub", ROOT, b"sub", RenameFlags::default())));
    volume.inodes().set_flags(dir, INODE_FLAG_APPEND, true).unwrap();
    volume.inodes().create(dir, b"new", 0o644, owner()).unwrap();
    assert!(is_eperm(volume.inodes().unlink(dir, b"new")));
    assert!(is_eperm(volume.inodes().rename(
        dir,
        b"other",
        ROOT,
        b"moved",
        RenameFlags::default()
    )));
    handle.close().unwrap();

    // Durable in the journal (crash: replay) and in a checkpoint.
    volume.sync().unwrap();
    let (_, replayed) = common::open_image(device.image()).unwrap();
    assert_eq!(replayed.inodes().flags(dir).unwrap(), INODE_FLAG_APPEND);
    assert_eq!(replayed.inodes().flags(file).unwrap(), INODE_FLAG_APPEND);
    assert_eq!(replayed.inodes().flags(other).unwrap(), 0);
    drop(replayed);
    volume.checkpoint().unwrap();
    volume.inodes().set_flags(dir, 0, true).unwrap();
    volume.inodes().unlink(dir, b"new").unwrap();
    volume.sync().unwrap();
    drop(volume);
    let (_, reopened) = common::open_image(device.image()).unwrap();
    assert_eq!(reopened.inodes().flags(dir).unwrap(), 0);
    assert!(is_eperm(reopened.inodes().unlink(dir, b"f")));
    assert!(foliofs::fsck::check(reopened.device().clone()).is_clean());
}

/// generic/213: the space of a removed preallocated file is usable at once,
/// by the next fallocate and in statfs, without waiting for a background
/// commit (the tests' volumes have none) or a sync.
fn freed_space_is_reusable_at_once(block_bytes: u32) {
    let (_device, volume) = new_volume(64 << 20, block_bytes);
    let block = u64::from(block_bytes);
    let available = volume.statfs().available_blocks * block;
    let big = available * 3 / 4;
    for round in 0..3 {
        let file = volume.inodes().create(ROOT, b"ouch", 0o644, owner()).unwrap();
        let handle = volume.inodes().open_file(file.ino, OpenFlags::READ_WRITE).unwrap();
        handle
            .fallocate(FallocateMode::Allocate { keep_size: false }, 0, big)
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
        handle.set_len(100).unwrap();
        handle.close().unwrap();
        volume.inodes().unlink(ROOT, b"ouch").unwrap();
    }
    assert!(volume.statfs().available_blocks * block >= available - (1 << 20));
}

fn atime_of(volume: &foliofs::Volume, ino: u64) -> foliofs::Timestamp {
    volume.inodes().getattr(ino).unwrap().atime
}

fn volume_with(block_bytes: u32, options: &str) -> (Arc<FaultDev>, foliofs::Volume) {
    let mut volume_options = common::options();
    volume_options.apply_list(options).unwrap();
    common::new_volume_with_options(16 << 20, block_bytes, None, &volume_options)
}

/// generic/003: reads advance the access time under relatime (when it is
/// not after mtime/ctime), strictatime (always) and never under noatime;
/// nodiratime spares directories; the update survives a clean close.
fn reads_advance_atime_as_the_policy_says(block_bytes: u32) {
    let (device, volume) = volume_with(block_bytes, "");
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let handle = volume.inodes().open_file(file, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(b"aaa", 0).unwrap();
    let written = volume.inodes().getattr(file).unwrap();
    let mut buffer = [0u8; 16];
    handle.read_at(&mut buffer, 0).unwrap();
    let first = atime_of(&volume, file);
    assert!(first > written.atime && first >= written.mtime, "relatime: first read after a write");
    handle.read_at(&mut buffer, 0).unwrap();
    assert_eq!(atime_of(&volume, file), first, "relatime: atime already after mtime");
    // (Writes advance mtime once per clock tick; setattr does at once.)
    volume
        .inodes()
        .setattr(file, &SetAttr { mtime: Some(TimeSet::Now), ..SetAttr::default() })
        .unwrap();
    handle.read_at(&mut buffer, 0).unwrap();
    let third = atime_of(&volume, file);
    assert!(third > first, "relatime: read after a modification");
    let mtime = volume.inodes().getattr(file).unwrap().mtime;
    // Listing a directory is reading it.
    let dir_atime = atime_of(&volume, ROOT);
    volume.inodes().readdir(ROOT).unwrap();
    assert!(atime_of(&volume, ROOT) > dir_atime);
    handle.close().unwrap();
    volume.close().unwrap();
    let (_, volume) = common::open_image(device.image()).unwrap();
    assert_eq!(atime_of(&volume, file), third, "kept by the checkpoint at close");
    assert_eq!(volume.inodes().getattr(file).unwrap().mtime, mtime);
    drop(volume);

    let (_, volume) = volume_with(block_bytes, "atime=strictatime,nodiratime");
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let handle = volume.inodes().open_file(file, OpenFlags::READ).unwrap();
    handle.read_at(&mut buffer, 0).unwrap();
    let first = atime_of(&volume, file);
    handle.read_at(&mut buffer, 0).unwrap();
    assert!(atime_of(&volume, file) > first, "strictatime: every read");
    let dir = volume.inodes().open_dir(ROOT).unwrap();
    let dir_atime = dir.attr().unwrap().atime;
    dir.entries().unwrap();
    assert_eq!(dir.attr().unwrap().atime, dir_atime, "nodiratime");
    drop((dir, handle, volume));

    let (_, volume) = volume_with(block_bytes, "atime=noatime");
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let before = atime_of(&volume, file);
    let handle = volume.inodes().open_file(file, OpenFlags::READ).unwrap();
    handle.read_at(&mut buffer, 0).unwrap();
    volume.inodes().readdir(ROOT).unwrap();
    assert_eq!(atime_of(&volume, file), before, "noatime");
    assert!(foliofs::VolumeOptions::parse("atime=sometimes").is_err());
}

/// generic/093: any data change, root's too, removes the file's capabilities
/// (security.capability) and only them; the mode is untouched without
/// kill_setid.
fn data_changes_remove_file_capabilities_and_keep_other_attributes(block_bytes: u32) {
    let (device, volume) = new_volume(16 << 20, block_bytes);
    let file = volume.inodes().create(ROOT, b"f", 0o4755, ROOT_CALLER).unwrap().ino;
    let set = |name: &[u8], value: &[u8]| {
        volume
            .inodes()
            .set_xattr(file, name, value, XattrFlags::default(), Privilege::SysAdmin)
            .unwrap()
    };
    set(b"security.capability", &[1, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    set(b"trusted.name", b"value");
    assert!(
        !volume.inodes().remove_privileges(file, ROOT_CALLER, false).unwrap(),
        "the mode stays"
    );
    let names = volume.inodes().list_xattr(file, Privilege::SysAdmin).unwrap();
    assert_eq!(names, [b"trusted.name".to_vec()]);
    assert_eq!(mode_of(&volume, file), 0o4755);
    // Nothing left to remove: no transaction.
    assert!(!volume.inodes().remove_privileges(file, ROOT_CALLER, false).unwrap());
    volume.close().unwrap();
    let (_, volume) = common::open_image(device.image()).unwrap();
    assert_eq!(
        volume.inodes().list_xattr(file, Privilege::SysAdmin).unwrap(),
        [b"trusted.name".to_vec()]
    );
}

/// `crashed`, an image taken while `ino` was open with no name: fsck finds
/// it clean with an orphan noted, and mounting frees it. The mounted volume.
fn orphan_freed_after_crash(crashed: Vec<u8>, ino: u64) -> foliofs::Volume {
    let raw = Arc::new(FaultDev::from_image(crashed.clone(), 512));
    let report = foliofs::fsck::check(Arc::new(Device::new(raw, FuaMode::Native)));
    assert!(report.is_clean(), "{:?}", report.problems);
    assert!(report.notes.iter().any(|note| note.contains("orphan")), "{:?}", report.notes);
    let (_, volume) = common::open_image(crashed).unwrap();
    assert!(volume.inodes().getattr(ino).is_err(), "orphan freed at mount");
    volume
}
