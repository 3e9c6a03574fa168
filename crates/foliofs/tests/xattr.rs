//! Extended attributes and special files through the library: Linux's
//! limits and errnos, durability across remounts and checkpoints, fsck,
//! and crash consistency at every durability point of a workload of
//! attribute changes.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use foliofs::dev::fault::Keep;
use foliofs::dev::{Device, FaultDev, FuaMode};
use foliofs::{InodeKind, OpenFlags, Privilege, Volume, VolumeOptions, XattrFlags};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{new_volume, new_volume_with_journal, open_image, open_image_with, owner, ROOT};

const VOLUME_BYTES: u64 = 16 << 20;
const ADMIN: Privilege = Privilege::SysAdmin;
const USER: Privilege = Privilege::Unprivileged;
const ANY: XattrFlags = XattrFlags { create: false, replace: false, acl_kill_sgid: false };
const CREATE: XattrFlags = XattrFlags { create: true, ..ANY };
const REPLACE: XattrFlags = XattrFlags { replace: true, ..ANY };
const KILL_SGID: XattrFlags = XattrFlags { acl_kill_sgid: true, ..ANY };

block_size_tests!(
    attributes_survive_remount_checkpoint_and_fsck,
    attribute_changes_are_crash_consistent,
    special_files_survive_remount_crash_and_fsck,
);

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";
const USER_OBJ: u16 = 0x01;
const NAMED_USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const NAMED_GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// An ACL in the kernel's xattr format from `(tag, perm, id)` entries.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut bytes = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        let id = if matches!(tag, NAMED_USER | NAMED_GROUP) { id } else { u32::MAX };
        bytes.extend_from_slice(&tag.to_le_bytes());
        bytes.extend_from_slice(&perm.to_le_bytes());
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    bytes
}

fn minimal_acl() -> Vec<u8> {
    acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 5, 0)])
}

/// user::rwx user:1000:rw- group::r-x group:50:r-- mask::<mask> other::<other>
fn named_acl(mask: u16, other: u16) -> Vec<u8> {
    owned_named_acl(7, mask, other)
}

fn owned_named_acl(owner: u16, mask: u16, other: u16) -> Vec<u8> {
    acl(&[
        (USER_OBJ, owner, 0),
        (NAMED_USER, 6, 1000),
        (GROUP_OBJ, 5, 0),
        (NAMED_GROUP, 4, 50),
        (MASK, mask, 0),
        (OTHER, other, 0),
    ])
}

fn errno<T: std::fmt::Debug>(result: foliofs::Result<T>) -> i32 {
    result.expect_err("the call should fail").errno()
}

fn all_xattrs(volume: &Volume, ino: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    volume
        .inodes()
        .list_xattr(ino, ADMIN)
        .unwrap()
        .into_iter()
        .map(|name| {
            let value = volume.inodes().get_xattr(ino, &name, ADMIN).unwrap();
            (name, value)
        })
        .collect()
}

fn fsck(image: Vec<u8>) -> foliofs::fsck::FsckReport {
    let raw = Arc::new(FaultDev::from_image(image, 512));
    let report = foliofs::fsck::check(Arc::new(Device::new(raw, FuaMode::Native)));
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
    report
}

#[test]
fn set_get_list_and_remove() {
    let (_, volume) = new_volume(VOLUME_BYTES, 4096);
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let before = volume.inodes().getattr(file.ino).unwrap().ctime;
    volume.inodes().set_xattr(file.ino, b"user.mime", b"text/plain", ANY, USER).unwrap();
    assert!(volume.inodes().getattr(file.ino).unwrap().ctime >= before);
    volume.inodes().set_xattr(file.ino, b"security.selinux", b"u:r:t:s0\0", ANY, USER).unwrap();
    volume.inodes().set_xattr(file.ino, b"trusted.overlay", b"", ANY, ADMIN).unwrap();
    volume.inodes().set_xattr(file.ino, b"user.empty", b"", CREATE, USER).unwrap();
    assert_eq!(volume.inodes().get_xattr(file.ino, b"user.mime", USER).unwrap(), b"text/plain");
    assert_eq!(volume.inodes().get_xattr(file.ino, b"user.empty", USER).unwrap(), b"");
    let names: Vec<&[u8]> =
        vec![b"security.selinux", b"trusted.overlay", b"user.empty", b"user.mime"];
    assert_eq!(volume.inodes().list_xattr(file.ino, ADMIN).unwrap(), names);
    // An unprivileged caller neither sees nor reads trusted names.
    assert_eq!(
        volume.inodes().list_xattr(file.ino, USER).unwrap(),
        vec![names[0], names[2], names[3]]
    );
    assert_eq!(errno(volume.inodes().get_xattr(file.ino, b"trusted.overlay", USER)), libc::ENODATA);
    volume.inodes().set_xattr(file.ino, b"user.mime", b"text/html", REPLACE, USER).unwrap();
    assert_eq!(volume.inodes().get_xattr(file.ino, b"user.mime", USER).unwrap(), b"text/html");
    volume.inodes().remove_xattr(file.ino, b"user.mime", USER).unwrap();
    assert_eq!(errno(volume.inodes().get_xattr(file.ino, b"user.mime", USER)), libc::ENODATA);
    assert_eq!(errno(volume.inodes().remove_xattr(file.ino, b"user.mime", USER)), libc::ENODATA);
    let dir = volume.inodes().mkdir(ROOT, b"d", 0o755, owner()).unwrap();
    volume.inodes().set_xattr(dir.ino, b"user.tag", b"1", ANY, USER).unwrap();
    volume
        .inodes()
        .set_xattr(dir.ino, b"system.posix_acl_default", &minimal_acl(), ANY, USER)
        .unwrap();
    assert_eq!(
        errno(volume.inodes().set_xattr(
            dir.ino,
            b"system.posix_acl_default",
            b"\x02\0\0\0",
            ANY,
            USER
        )),
        libc::EINVAL
    );
    assert_eq!(volume.inodes().list_xattr(dir.ino, USER).unwrap().len(), 2);
}

#[test]
fn limits_and_errnos_are_linux_s() {
    let (_, volume) = new_volume(VOLUME_BYTES, 4096);
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let name_of = |length: usize| [&b"user."[..], &vec![b'n'; length - 5]].concat();
    volume.inodes().set_xattr(file, &name_of(255), b"v", ANY, USER).unwrap();
    assert_eq!(
        errno(volume.inodes().set_xattr(file, &name_of(256), b"v", ANY, USER)),
        libc::ERANGE
    );
    assert_eq!(errno(volume.inodes().set_xattr(file, b"", b"v", ANY, USER)), libc::ERANGE);
    assert_eq!(errno(volume.inodes().get_xattr(file, &name_of(256), USER)), libc::ERANGE);
    volume.inodes().set_xattr(file, b"user.big", &vec![7; 65536], ANY, USER).unwrap();
    assert_eq!(volume.inodes().get_xattr(file, b"user.big", USER).unwrap().len(), 65536);
    assert_eq!(
        errno(volume.inodes().set_xattr(file, b"user.big", &vec![7; 65537], ANY, USER)),
        libc::E2BIG
    );
    assert_eq!(errno(volume.inodes().set_xattr(file, b"os2.x", b"v", ANY, USER)), libc::EOPNOTSUPP);
    assert_eq!(
        errno(volume.inodes().set_xattr(file, b"system.foo", b"v", ANY, USER)),
        libc::EOPNOTSUPP
    );
    assert_eq!(errno(volume.inodes().get_xattr(file, b"xfs.x", USER)), libc::EOPNOTSUPP);
    assert_eq!(errno(volume.inodes().set_xattr(file, b"user.", b"v", ANY, USER)), libc::EINVAL);
    assert_eq!(
        errno(volume.inodes().set_xattr(file, b"user.big", b"v", CREATE, USER)),
        libc::EEXIST
    );
    assert_eq!(
        errno(volume.inodes().set_xattr(file, b"user.none", b"v", REPLACE, USER)),
        libc::ENODATA
    );
    assert_eq!(errno(XattrFlags::from_bits(0x10)), libc::EINVAL);
    assert_eq!(errno(volume.inodes().set_xattr(file, b"trusted.x", b"v", ANY, USER)), libc::EPERM);
    assert_eq!(errno(volume.inodes().remove_xattr(file, b"trusted.x", USER)), libc::EPERM);
    assert_eq!(errno(volume.inodes().set_xattr(999, b"user.x", b"v", ANY, USER)), libc::ENOENT);
    // user.* lives on regular files and directories only.
    let link = volume.inodes().symlink(ROOT, b"l", b"f", owner()).unwrap().ino;
    let fifo = volume.inodes().mknod(ROOT, b"p", InodeKind::Fifo, 0o644, 0, owner()).unwrap().ino;
    for ino in [link, fifo] {
        assert_eq!(errno(volume.inodes().set_xattr(ino, b"user.x", b"v", ANY, USER)), libc::EPERM);
        assert_eq!(errno(volume.inodes().get_xattr(ino, b"user.x", USER)), libc::ENODATA);
        volume.inodes().set_xattr(ino, b"security.x", b"v", ANY, USER).unwrap();
        volume.inodes().set_xattr(ino, b"trusted.x", b"v", ANY, ADMIN).unwrap();
    }
    assert_eq!(
        errno(volume.inodes().set_xattr(file, b"system.posix_acl_default", b"", ANY, USER)),
        libc::EPERM,
        "a default ACL only on directories"
    );
    // The names of one inode fit listxattr's 64 KiB: 255 such names of
    // 256 bytes with their NULs are 65280 bytes; the 256th fills it.
    let other = volume.inodes().create(ROOT, b"many", 0o644, owner()).unwrap().ino;
    for index in 0..256 {
        let name = [format!("user.{index:03}").into_bytes(), vec![b'x'; 247]].concat();
        volume.inodes().set_xattr(other, &name, b"", ANY, USER).unwrap();
    }
    let listed: usize =
        volume.inodes().list_xattr(other, USER).unwrap().iter().map(|n| n.len() + 1).sum();
    assert_eq!(listed, 65536);
    assert_eq!(
        errno(volume.inodes().set_xattr(other, b"user.one_more", b"", ANY, USER)),
        libc::ENOSPC
    );
    // Replacing the value of an existing name needs no list room.
    let first = [b"user.000".to_vec(), vec![b'x'; 247]].concat();
    volume.inodes().set_xattr(other, &first, b"new", ANY, USER).unwrap();
}

#[test]
fn failed_changes_change_nothing_and_read_only_volumes_refuse() {
    // A 64 KiB journal has 16 KiB groups: a 64 KiB value cannot be logged.
    let (device, volume) = new_volume_with_journal(VOLUME_BYTES, 4096, Some(64 << 10));
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    volume.inodes().set_xattr(file, b"user.small", &vec![1; 8000], ANY, USER).unwrap();
    let error =
        volume.inodes().set_xattr(file, b"user.big", &vec![7; 65536], ANY, USER).unwrap_err();
    assert_eq!(error.errno(), libc::ENOSPC);
    assert!(error.to_string().contains("larger journal"), "{error}");
    assert_eq!(volume.inodes().list_xattr(file, USER).unwrap(), vec![b"user.small".to_vec()]);
    volume.close().unwrap();
    let options = VolumeOptions { read_only: true, ..common::options() };
    let (_, volume) = open_image_with(device.image(), &options).unwrap();
    assert_eq!(volume.inodes().get_xattr(file, b"user.small", USER).unwrap(), vec![1; 8000]);
    assert_eq!(errno(volume.inodes().set_xattr(file, b"user.x", b"v", ANY, USER)), libc::EROFS);
    assert_eq!(errno(volume.inodes().remove_xattr(file, b"user.small", USER)), libc::EROFS);
}

fn attributes_survive_remount_checkpoint_and_fsck(block_bytes: u32) {
    let (device, volume) = new_volume(VOLUME_BYTES, block_bytes);
    let empty_metadata = volume.statfs().metadata_bytes;
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let dir = volume.inodes().mkdir(ROOT, b"d", 0o755, owner()).unwrap().ino;
    volume.inodes().set_xattr(file, b"user.a", b"one", ANY, USER).unwrap();
    volume.inodes().set_xattr(file, b"trusted.b", &vec![2; 65536], ANY, ADMIN).unwrap();
    volume.inodes().set_xattr(dir, b"security.c", b"three", ANY, USER).unwrap();
    // Half before the checkpoint, half replayed from the journal.
    volume.checkpoint().unwrap();
    volume.inodes().set_xattr(file, b"user.a", b"uno", ANY, USER).unwrap();
    volume.inodes().set_xattr(dir, b"user.d", b"four", ANY, USER).unwrap();
    volume.inodes().remove_xattr(dir, b"security.c", USER).unwrap();
    let expected_file = all_xattrs(&volume, file);
    let expected_dir = all_xattrs(&volume, dir);
    volume.sync().unwrap();
    let crashed = device.image();
    volume.close().unwrap();
    for image in [crashed, device.image()] {
        let (_, reopened) = open_image(image.clone()).unwrap();
        assert_eq!(all_xattrs(&reopened, file), expected_file);
        assert_eq!(all_xattrs(&reopened, dir), expected_dir);
        drop(reopened);
        let report = fsck(image);
        assert_eq!(report.xattrs, 3);
        assert_eq!(report.xattr_bytes, (6 + 3 + 9 + 65536 + 6 + 4) as u64);
    }
    // Freed with the inode: the metadata goes back to what it was.
    let (device, volume) = open_image(device.image()).unwrap();
    volume.inodes().unlink(ROOT, b"f").unwrap();
    volume.inodes().remove_xattr(dir, b"user.a".as_slice(), USER).unwrap_err();
    volume.inodes().remove_xattr(dir, b"user.d", USER).unwrap();
    volume.inodes().rmdir(ROOT, b"d").unwrap();
    assert_eq!(volume.statfs().metadata_bytes, empty_metadata);
    volume.close().unwrap();
    assert_eq!(fsck(device.image()).xattrs, 0);
}

/// A random sequence of sets, replaces and removes on two inodes, with
/// fsyncs and syncfs between them, crashed at every durability point with
/// every unflushed write kept, lost or torn: the attributes each inode
/// recovers are exactly those it had after some operation no earlier than
/// the last fsync (or syncfs) that returned before the crash, and fsck
/// finds the volume clean.
fn attribute_changes_are_crash_consistent(block_bytes: u32) {
    for seed in 0..2u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ u64::from(block_bytes));
        let (device, volume) = new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(256 << 10));
        let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
        let dir = volume.inodes().mkdir(ROOT, b"d", 0o755, owner()).unwrap().ino;
        let handle = volume.inodes().open_file(file, OpenFlags::READ).unwrap();
        volume.sync().unwrap();
        device.reset_log();
        let inos = [file, dir];
        // After op k: the log length when it ended and the state then.
        let mut states = vec![(0usize, [BTreeMap::new(), BTreeMap::new()])];
        // (log length when the sync returned, index in `states` it made
        // durable, whether it covers the directory: syncfs does, the
        // file's fsync promises only the file)
        let mut synced: Vec<(usize, usize, bool)> = vec![(0, 0, true)];
        for step in 0..60u64 {
            let which = rng.random_range(0..2);
            let ino = inos[which];
            let mut current = states.last().unwrap().1.clone();
            match rng.random_range(0..12) {
                0..=6 => {
                    let name = format!("user.k{}", rng.random_range(0..5)).into_bytes();
                    let length = [0, 10, 3000, 20_000][rng.random_range(0..4)];
                    let value = common::pattern(seed * 1000 + step, length);
                    volume.inodes().set_xattr(ino, &name, &value, ANY, USER).unwrap();
                    current[which].insert(name, value);
                }
                7..=8 => {
                    let Some(name) = current[which].keys().next().cloned() else { continue };
                    volume.inodes().remove_xattr(ino, &name, USER).unwrap();
                    current[which].remove(&name);
                }
                9 => volume.checkpoint().unwrap(),
                10 => {
                    handle.sync_all().unwrap();
                    synced.push((device.log_len(), states.len() - 1, false));
                }
                _ => {
                    volume.sync().unwrap();
                    synced.push((device.log_len(), states.len() - 1, true));
                }
            }
            states.push((device.log_len(), current));
        }
        let mut cuts = device.durability_points();
        cuts.extend(synced.iter().map(|&(cut, _, _)| cut));
        cuts.sort_unstable();
        cuts.dedup();
        for &cut in &cuts {
            for variant in 0..3 {
                let image = device.crash_image(cut, &|_| match variant {
                    0 => Keep::Nothing,
                    1 => Keep::All,
                    _ => Keep::Sectors((0..256).map(|sector| sector % 3 != 1).collect()),
                });
                let context = format!("seed {seed}, crash at {cut}, variant {variant}");
                let (_, recovered) = open_image(image.clone()).unwrap();
                let found = [all_xattrs(&recovered, file), all_xattrs(&recovered, dir)];
                drop(recovered);
                // States whose op ended by the cut, and the one in progress
                // (its transaction may have been committed already).
                let reached = states.iter().take_while(|(end, _)| *end <= cut).count();
                let last = reached.min(states.len() - 1);
                for (which, name) in ["file", "dir"].iter().enumerate() {
                    let durable = synced
                        .iter()
                        .filter(|&&(at, _, covers_dir)| at <= cut && (which == 0 || covers_dir))
                        .map(|&(_, index, _)| index)
                        .max()
                        .unwrap_or(0);
                    let matches =
                        (durable..=last).any(|index| states[index].1[which] == found[which]);
                    assert!(
                        matches,
                        "{context}: the {name}'s attributes {:?} are none of its states {durable}..={last}",
                        found[which].iter().map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.len())).collect::<Vec<_>>()
                    );
                }
                fsck(image);
            }
        }
        drop(handle);
    }
}

fn special_files_survive_remount_crash_and_fsck(block_bytes: u32) {
    let (device, volume) = new_volume(VOLUME_BYTES, block_bytes);
    let dir = volume.inodes().mkdir(ROOT, b"dev", 0o755, owner()).unwrap().ino;
    let tty = 5 << 8 | 1; // makedev(5, 1)
    let sda = 8 << 8; // makedev(8, 0)
    let big = (0x123 << 8) | 0x45 | (0xABC << 12 << 8); // major 0x123, minor 0xABC45
    let nodes = [
        (&b"fifo"[..], InodeKind::Fifo, 0o640, 77u32, 0u32),
        (b"sock", InodeKind::Socket, 0o755, 0, 0),
        (b"console", InodeKind::CharDevice, 0o620, tty, tty),
        (b"sda", InodeKind::BlockDevice, 0o660, sda, sda),
        (b"wide", InodeKind::CharDevice, 0o600, big, big),
    ];
    for &(name, kind, mode, rdev, _) in &nodes {
        let attr = volume.inodes().mknod(dir, name, kind, mode | 0o170000, rdev, owner()).unwrap();
        assert_eq!((attr.kind, attr.mode, attr.nlink, attr.size), (kind, mode, 1, 0));
    }
    assert_eq!(
        volume.inodes().mknod(dir, b"reg", InodeKind::File, 0o644, 9, owner()).unwrap().rdev,
        0
    );
    assert_eq!(
        errno(volume.inodes().mknod(dir, b"x", InodeKind::Dir, 0o755, 0, owner())),
        libc::EINVAL
    );
    assert_eq!(
        errno(volume.inodes().mknod(dir, b"fifo", InodeKind::Fifo, 0o644, 0, owner())),
        libc::EEXIST
    );
    let fifo = volume.inodes().lookup(dir, b"fifo").unwrap().ino;
    assert_eq!(errno(volume.inodes().open_file(fifo, OpenFlags::READ)), libc::EINVAL);
    // Special files are linked, renamed and carry attributes like others.
    volume.inodes().link(fifo, ROOT, b"fifo-link").unwrap();
    volume.inodes().rename(dir, b"sock", ROOT, b"sock2", Default::default()).unwrap();
    volume.inodes().set_xattr(fifo, b"security.label", b"x", ANY, USER).unwrap();
    let sda_ino = volume.inodes().lookup(dir, b"sda").unwrap().ino;
    volume.inodes().fsync_inode(sda_ino, false).unwrap();
    let expect = |volume: &Volume| {
        for &(name, kind, mode, _, rdev) in &nodes {
            let parent = if name == b"sock" { ROOT } else { dir };
            let name = if name == b"sock" { &b"sock2"[..] } else { name };
            let attr = volume.inodes().lookup(parent, name).unwrap();
            assert_eq!((attr.kind, attr.mode, attr.rdev), (kind, mode, rdev), "{name:?}");
            let listed = volume.inodes().readdir(parent).unwrap();
            assert!(listed.iter().any(|entry| entry.name == name && entry.kind == kind));
        }
        assert_eq!(volume.inodes().getattr(fifo).unwrap().nlink, 2);
    };
    expect(&volume);
    volume.sync().unwrap();
    // A crash after the sync, then a clean close and remount, then one
    // from a checkpoint alone.
    let crashed = device.crash_image(device.log_len(), &|_| Keep::Nothing);
    volume.checkpoint().unwrap();
    volume.close().unwrap();
    for image in [crashed, device.image()] {
        let (_, reopened) = open_image(image.clone()).unwrap();
        expect(&reopened);
        drop(reopened);
        let report = fsck(image);
        assert_eq!(report.special_files, 5);
    }
    // Unlinking frees them; fsck stays clean.
    let (device, volume) = open_image(device.image()).unwrap();
    for name in [&b"fifo"[..], b"console", b"sda", b"wide", b"reg"] {
        volume.inodes().unlink(dir, name).unwrap();
    }
    volume.inodes().unlink(ROOT, b"fifo-link").unwrap();
    volume.inodes().unlink(ROOT, b"sock2").unwrap();
    volume.close().unwrap();
    let report = fsck(device.image());
    assert_eq!((report.special_files, report.xattrs), (0, 0));
}

#[test]
fn access_acls_set_the_mode_and_chmod_rewrites_them() {
    let (device, volume) = new_volume(VOLUME_BYTES, 4096);
    let file = volume.inodes().create(ROOT, b"f", 0o4644, owner()).unwrap().ino;
    volume.inodes().set_xattr(file, ACL_ACCESS, &named_acl(6, 4), ANY, USER).unwrap();
    // The mask gives the group bits; the setuid bit stays.
    assert_eq!(volume.inodes().getattr(file).unwrap().mode, 0o4764);
    assert_eq!(volume.inodes().get_xattr(file, ACL_ACCESS, USER).unwrap(), named_acl(6, 4));
    // chmod rewrites owner, mask and other; named entries stay.
    let chmod = foliofs::SetAttr { mode: Some(0o710), ..Default::default() };
    volume.inodes().setattr(file, &chmod).unwrap();
    assert_eq!(volume.inodes().get_xattr(file, ACL_ACCESS, USER).unwrap(), named_acl(1, 0));
    // Set by a caller outside the group without CAP_FSETID: setgid goes.
    volume
        .inodes()
        .setattr(file, &foliofs::SetAttr { mode: Some(0o2770), ..Default::default() })
        .unwrap();
    volume.inodes().set_xattr(file, ACL_ACCESS, &named_acl(7, 0), ANY, USER).unwrap();
    assert_eq!(volume.inodes().getattr(file).unwrap().mode, 0o2770);
    volume.inodes().set_xattr(file, ACL_ACCESS, &named_acl(5, 0), KILL_SGID, USER).unwrap();
    assert_eq!(volume.inodes().getattr(file).unwrap().mode, 0o750);
    // An ACL the mode says whole is not kept.
    volume.inodes().set_xattr(file, ACL_ACCESS, &minimal_acl(), ANY, USER).unwrap();
    assert_eq!(volume.inodes().getattr(file).unwrap().mode & 0o777, 0o755);
    assert_eq!(errno(volume.inodes().get_xattr(file, ACL_ACCESS, USER)), libc::ENODATA);
    for bad in [b"\x02\0\0\0".to_vec(), named_acl(8, 0), acl(&[(USER_OBJ, 7, 0), (OTHER, 0, 0)])] {
        assert_eq!(
            errno(volume.inodes().set_xattr(file, ACL_ACCESS, &bad, ANY, USER)),
            libc::EINVAL
        );
    }
    let link = volume.inodes().symlink(ROOT, b"l", b"f", owner()).unwrap().ino;
    assert_eq!(
        errno(volume.inodes().set_xattr(link, ACL_ACCESS, &named_acl(6, 4), ANY, USER)),
        libc::EOPNOTSUPP
    );
    volume.inodes().set_xattr(file, ACL_ACCESS, &named_acl(7, 5), ANY, USER).unwrap();
    volume.close().unwrap();
    let (_, volume) = open_image(device.image()).unwrap();
    assert_eq!(volume.inodes().getattr(file).unwrap().mode & 0o777, 0o775);
    assert_eq!(volume.inodes().get_xattr(file, ACL_ACCESS, USER).unwrap(), named_acl(7, 5));
    drop(volume);
    fsck(device.image());
}

#[test]
fn default_acls_are_inherited_instead_of_the_umask() {
    let (device, volume) = new_volume(VOLUME_BYTES, 4096);
    let plain = volume.inodes().mkdir(ROOT, b"plain", 0o755, owner()).unwrap().ino;
    assert_eq!(volume.inodes().creation_mode(plain, 0o666, 0o022), 0o644);
    let dir = volume.inodes().mkdir(ROOT, b"d", 0o755, owner()).unwrap().ino;
    volume.inodes().set_xattr(dir, ACL_DEFAULT, &named_acl(7, 5), ANY, USER).unwrap();
    assert_eq!(
        volume.inodes().creation_mode(dir, 0o666, 0o022),
        0o666,
        "no umask under a default ACL"
    );
    // A file asking for rw-rw-rw-: owner rw-, mask rw- (the named entries
    // stay), other r-x & rw- = r--.
    let file = volume.inodes().create(dir, b"f", 0o666, owner()).unwrap();
    assert_eq!(file.mode, 0o664);
    assert_eq!(
        volume.inodes().get_xattr(file.ino, ACL_ACCESS, USER).unwrap(),
        owned_named_acl(6, 6, 4)
    );
    assert_eq!(errno(volume.inodes().get_xattr(file.ino, ACL_DEFAULT, USER)), libc::ENODATA);
    // A directory inherits the default as its default too.
    let sub = volume.inodes().mkdir(dir, b"sub", 0o750, owner()).unwrap();
    assert_eq!(sub.mode, 0o750);
    assert_eq!(volume.inodes().get_xattr(sub.ino, ACL_ACCESS, USER).unwrap(), named_acl(5, 0));
    assert_eq!(volume.inodes().get_xattr(sub.ino, ACL_DEFAULT, USER).unwrap(), named_acl(7, 5));
    let deeper = volume.inodes().create(sub.ino, b"g", 0o600, owner()).unwrap();
    assert_eq!(deeper.mode, 0o600);
    // Special files inherit; symlinks do not.
    let fifo = volume.inodes().mknod(dir, b"p", InodeKind::Fifo, 0o640, 0, owner()).unwrap();
    assert_eq!(
        volume.inodes().get_xattr(fifo.ino, ACL_ACCESS, USER).unwrap(),
        owned_named_acl(6, 4, 0)
    );
    let link = volume.inodes().symlink(dir, b"l", b"f", owner()).unwrap();
    assert!(volume.inodes().list_xattr(link.ino, USER).unwrap().is_empty());
    // A minimal default ACL gives a minimal access ACL: none is stored.
    let minimal = volume.inodes().mkdir(ROOT, b"m", 0o755, owner()).unwrap().ino;
    volume.inodes().set_xattr(minimal, ACL_DEFAULT, &minimal_acl(), ANY, USER).unwrap();
    let file = volume.inodes().create(minimal, b"f", 0o666, owner()).unwrap();
    assert_eq!(file.mode, 0o644);
    assert!(volume.inodes().list_xattr(file.ino, USER).unwrap().is_empty());
    volume.close().unwrap();
    let report = fsck(device.image());
    assert_eq!(report.xattrs, 7);
}

block_size_tests!(acl_and_mode_changes_are_crash_consistent);

/// chmods and access-ACL changes on one file, crashed at every durability
/// point: the recovered mode and ACL always agree with each other (the
/// mode's bits are the ACL's owner, mask and other entries: both change in
/// one transaction) and are a pair the file had no earlier than its last
/// fsync.
fn acl_and_mode_changes_are_crash_consistent(block_bytes: u32) {
    let mut rng = ChaCha8Rng::seed_from_u64(u64::from(block_bytes));
    let (device, volume) = new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(256 << 10));
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let handle = volume.inodes().open_file(file, OpenFlags::READ).unwrap();
    volume.sync().unwrap();
    device.reset_log();
    let state_of = |volume: &Volume| {
        let mode = volume.inodes().getattr(file).unwrap().mode;
        (mode, volume.inodes().get_xattr(file, ACL_ACCESS, USER).ok())
    };
    let mut states = vec![(0usize, state_of(&volume))];
    let mut synced = vec![(0usize, 0usize)];
    for _ in 0..50 {
        match rng.random_range(0..8) {
            0..=2 => {
                let mode = rng.random_range(0..0o1000);
                volume
                    .inodes()
                    .setattr(file, &foliofs::SetAttr { mode: Some(mode), ..Default::default() })
                    .unwrap();
            }
            3..=4 => {
                let value = named_acl(rng.random_range(0..8), rng.random_range(0..8));
                volume.inodes().set_xattr(file, ACL_ACCESS, &value, ANY, USER).unwrap();
            }
            5 => {
                let _ = volume.inodes().remove_xattr(file, ACL_ACCESS, USER);
            }
            6 => volume.checkpoint().unwrap(),
            _ => {
                handle.sync_all().unwrap();
                synced.push((device.log_len(), states.len() - 1));
            }
        }
        states.push((device.log_len(), state_of(&volume)));
    }
    let mut cuts = device.durability_points();
    cuts.extend(synced.iter().map(|&(cut, _)| cut));
    cuts.sort_unstable();
    cuts.dedup();
    for &cut in &cuts {
        for variant in 0..2 {
            let keep = if variant == 0 { Keep::Nothing } else { Keep::All };
            let image = device.crash_image(cut, &|_| keep.clone());
            let (_, recovered) = open_image(image.clone()).unwrap();
            let found = state_of(&recovered);
            drop(recovered);
            let context = format!("crash at {cut}, variant {variant}: {found:?}");
            if let Some(value) = &found.1 {
                let perm = |tag: u16| {
                    value[4..].chunks(8).find(|entry| entry[..2] == tag.to_le_bytes()).unwrap()[2]
                        as u32
                };
                let bits = perm(USER_OBJ) << 6 | perm(MASK) << 3 | perm(OTHER);
                assert_eq!(found.0 & 0o777, bits, "{context}: the mode and the ACL disagree");
            }
            let reached = states.iter().take_while(|(end, _)| *end <= cut).count();
            let last = reached.min(states.len() - 1);
            let durable =
                synced.iter().filter(|&&(at, _)| at <= cut).map(|&(_, i)| i).max().unwrap();
            assert!(
                (durable..=last).any(|index| states[index].1 == found),
                "{context}: not a state from {durable} to {last}"
            );
            fsck(image);
        }
    }
}
