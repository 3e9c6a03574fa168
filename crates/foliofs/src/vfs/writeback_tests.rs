//! Writeback through a whole volume: the flusher's interval pass,
//! background writeback sparing the folio being filled, small files
//! written back in one request, and a failed group request. Here rather
//! than in writeback.rs, which may not build a volume.

use std::time::Duration;

use crate::dev::fault::{FaultOp, FaultRule};
use crate::format::ROOT_INO;
use crate::vfs::{OpenFlags, Owner, Volume};
use crate::writeback::{write_back, write_back_background, write_back_expired, write_back_sparing};

use super::volume::test_volume;

/// A volume of 4 KiB blocks on a fresh in-memory device, no background
/// threads acting on their own, with `options` on top.
fn quiet_volume(options: &str) -> Volume {
    let options = format!("writeback_interval_ms=0,commit_interval_ms=0,{options}");
    test_volume(&options).0
}

/// The flusher's interval pass writes back only the files dirty for
/// `dirty_expire_ms`; a file's age runs from when it went from clean to
/// dirty, not from its last write, and starts over once it is clean.
#[test]
fn the_interval_pass_writes_back_only_files_dirty_long_enough() {
    let owner = Owner { uid: 0, gid: 0 };
    let expire = Duration::from_millis(300);
    // Whole blocks, each into a folio of its own that it fills: the
    // pass leaves out a folio a write ended inside (a writer filling
    // it), which is not what this test is about.
    let volume = quiet_volume(&format!("dirty_expire_ms={}", expire.as_millis()));
    let engine = &volume.shared.engine;
    let old_ino = volume.inodes().create(ROOT_INO, b"old", 0o644, owner).unwrap().ino;
    let old = volume.inodes().open_file(old_ino, OpenFlags::WRITE).unwrap();
    old.write_at(&[1; 4096], 0).unwrap();
    let first_write = std::time::Instant::now();
    let old_inode = volume.shared.inode_cache(old_ino);
    while first_write.elapsed() < expire {
        // Later writes do not make the file younger.
        old.write_at(&[2; 4096], 4096).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let new_ino = volume.inodes().create(ROOT_INO, b"new", 0o644, owner).unwrap().ino;
    let new = volume.inodes().open_file(new_ino, OpenFlags::WRITE).unwrap();
    new.write_at(b"just now", 0).unwrap();
    let new_inode = volume.shared.inode_cache(new_ino);
    assert!(old_inode.dirty_age().unwrap() >= expire);
    write_back_expired(engine).unwrap();
    assert_eq!(old_inode.dirty_bytes(), 0, "dirty for the expiry time: written back");
    assert_eq!(old_inode.dirty_age(), None);
    // Unless this thread slept the whole expiry time since its write.
    if new_inode.dirty_age().unwrap() < expire {
        assert!(new_inode.dirty_bytes() > 0, "dirtied just now: left for later");
    }
    // Clean, then dirty again: young again.
    let before_rewrite = std::time::Instant::now();
    old.write_at(&[3; 4096], 8192).unwrap();
    let age = old_inode.dirty_age().unwrap();
    // Ages count whole milliseconds.
    assert!(age <= before_rewrite.elapsed() + Duration::from_millis(1), "{age:?}");
    // Integrity writeback takes every file whatever its age.
    volume.sync().unwrap();
    assert_eq!((old_inode.dirty_bytes(), new_inode.dirty_bytes()), (0, 0));
    drop((old, new));
    volume.close().unwrap();
}

/// The flusher's pass leaves the folio the last write ended inside dirty
/// (and unlocked) and writes the rest; a later pass past the spare time,
/// and any integrity writeback, take it too.
#[test]
fn background_writeback_leaves_the_folio_being_filled_for_a_while() {
    const MIB: u64 = 1 << 20;
    let owner = Owner { uid: 0, gid: 0 };
    let volume = quiet_volume("folio_max=2M");
    let ino = volume.inodes().create(ROOT_INO, b"stream", 0o644, owner).unwrap().ino;
    let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    // Folios of 1, 1 and 2 MiB (a sequential stream's grow); the last
    // write ends half-way through the third.
    for index in 0..3 {
        file.write_at(&vec![index as u8 + 1; MIB as usize], index * MIB).unwrap();
    }
    let engine = &volume.shared.engine;
    let inode = volume.shared.inode_cache(ino);
    let dirty_folios = || -> Vec<u64> {
        inode.dirty_folios_from(0, u64::MAX, usize::MAX).iter().map(|folio| folio.pos()).collect()
    };
    assert_eq!(dirty_folios(), [0, MIB, 2 * MIB]);
    write_back_sparing(engine, &inode, 0, u64::MAX, Duration::from_secs(3600)).unwrap();
    assert_eq!(dirty_folios(), [2 * MIB], "the folio being filled stays dirty");
    assert_eq!(inode.dirty_bytes(), MIB);
    // The on-disk size stops below the dirty folio.
    assert_eq!(engine.meta.inode(ino).unwrap().attrs.size, 2 * MIB);
    // The writer finishes the folio: nothing is being filled.
    file.write_at(&vec![9; MIB as usize], 3 * MIB).unwrap();
    write_back_sparing(engine, &inode, 0, u64::MAX, Duration::from_secs(3600)).unwrap();
    assert_eq!(dirty_folios(), Vec::<u64>::new());
    // A writer that stops half-way: spared once, then written.
    file.write_at(&vec![7; MIB as usize], 4 * MIB).unwrap();
    let spare = Duration::from_millis(1);
    write_back_sparing(engine, &inode, 0, u64::MAX, spare).unwrap();
    assert_eq!(dirty_folios(), [4 * MIB]);
    std::thread::sleep(spare * 2);
    write_back_sparing(engine, &inode, 0, u64::MAX, spare).unwrap();
    assert_eq!(dirty_folios(), Vec::<u64>::new(), "spared for a while only");
    // Integrity writeback leaves nothing out.
    file.write_at(&vec![8; MIB as usize], 5 * MIB).unwrap();
    write_back(engine, &inode, 0, u64::MAX).unwrap();
    assert_eq!(dirty_folios(), Vec::<u64>::new());
    assert_eq!(engine.meta.inode(ino).unwrap().attrs.size, 6 * MIB);
    drop(file);
    volume.close().unwrap();
}

/// Creates `count` files of 1 KiB (file `i` holds byte `i + 1`),
/// written and closed, so they are dirty with no handle open.
fn small_closed_files(volume: &Volume, count: u8) -> Vec<u64> {
    let owner = Owner { uid: 0, gid: 0 };
    (0..count)
        .map(|index| {
            let name = format!("small{index}");
            let ino = volume.inodes().create(ROOT_INO, name.as_bytes(), 0o644, owner).unwrap().ino;
            let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
            file.write_at(&[index + 1; 1024], 0).unwrap();
            file.close().unwrap();
            ino
        })
        .collect()
}

/// A closed file has nobody filling its folio: the flusher's pass
/// leaves nothing of it dirty (a small file's one write ends inside its
/// folio, and was spared as if a writer were half-way through it).
#[test]
fn background_writeback_spares_nothing_of_a_closed_file() {
    let volume = quiet_volume("");
    let engine = &volume.shared.engine;
    let ino = small_closed_files(&volume, 1)[0];
    let inode = volume.shared.inode_cache(ino);
    assert_eq!(inode.dirty_bytes(), 4096);
    write_back_sparing(engine, &inode, 0, u64::MAX, Duration::from_secs(3600)).unwrap();
    assert_eq!(inode.dirty_bytes(), 0, "a closed file is written back whole");
    assert_eq!(engine.meta.inode(ino).unwrap().attrs.size, 1024);
    volume.close().unwrap();
}

/// The flusher's pass writes small files in groups: their blocks,
/// allocated one after another, go out in one device request, and
/// each file is then converted and sized as if written alone.
#[test]
fn small_files_are_written_back_in_one_request() {
    let (volume, device) = test_volume("writeback_interval_ms=0,commit_interval_ms=0");
    let engine = &volume.shared.engine;
    let inos = small_closed_files(&volume, 16);
    let requests_before = engine.device.stats().write_requests;
    write_back_background(engine).unwrap();
    assert_eq!(engine.device.stats().write_requests - requests_before, 1);
    for &ino in &inos {
        assert_eq!(volume.shared.inode_cache(ino).dirty_bytes(), 0);
        assert_eq!(engine.meta.inode(ino).unwrap().attrs.size, 1024);
    }
    volume.close().unwrap();
    // On disk: every file's own bytes, read back through a fresh cache.
    let device = std::sync::Arc::new(crate::dev::Device::new(
        std::sync::Arc::new(crate::dev::FaultDev::from_image(device.image(), 512)),
        crate::dev::FuaMode::Native,
    ));
    let volume = Volume::open_device(device, &crate::options::VolumeOptions::default()).unwrap();
    for (index, &ino) in inos.iter().enumerate() {
        let file = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
        let mut bytes = vec![0; 2048];
        assert_eq!(file.read_at(&mut bytes, 0).unwrap(), 1024);
        assert!(bytes[..1024].iter().all(|&byte| byte == index as u8 + 1), "file {index}");
    }
    volume.close().unwrap();
}

/// A group's request that fails is tried again file by file: a file
/// whose own write fails again stays dirty and reports the error at its
/// next fsync; its neighbours in the failed request are written and
/// report nothing.
#[test]
fn a_failed_group_request_fails_only_the_files_that_fail_alone() {
    let (volume, device) = test_volume("writeback_interval_ms=0,commit_interval_ms=0");
    let engine = &volume.shared.engine;
    let inos = small_closed_files(&volume, 8);
    // The group's request, then the first file's write alone.
    device.add_rule(FaultRule::next(FaultOp::Write, 2));
    assert!(write_back_background(engine).is_err());
    assert_eq!(device.failures_injected(), 2);
    let dirty: Vec<u64> = inos
        .iter()
        .copied()
        .filter(|&ino| volume.shared.inode_cache(ino).dirty_bytes() > 0)
        .collect();
    assert_eq!(dirty.len(), 1, "only the file whose write failed alone stays dirty");
    for &ino in &inos {
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
        let synced = file.sync_all();
        assert_eq!(synced.is_err(), ino == dirty[0], "fsync of inode {ino}: {synced:?}");
        assert_eq!(engine.meta.inode(ino).unwrap().attrs.size, 1024);
    }
    volume.close().unwrap();
}
