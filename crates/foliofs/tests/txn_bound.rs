//! One transaction must fit one journal group (replay applies whole
//! groups). On the smallest journal (64 KiB: 16 KiB groups) the operations
//! whose records grow with the file or the volume must either split their
//! work or fail with ENOSPC, changing nothing: never reach the journal's
//! assertion, and never leave a volume that does not mount.

mod common;

use common::{new_volume_with_journal, open_image, owner, ROOT};
use foliofs::{FallocateMode, OpenFlags, Privilege, XattrFlags};

const SMALL_JOURNAL_BYTES: u64 = 64 << 10;

fn fsck_clean(volume: &foliofs::Volume) {
    let report = foliofs::fsck::check(volume.device().clone());
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A crash with more unlinked-but-open files than one group holds records:
/// mount frees them all (it used to log them as one transaction).
#[test]
fn more_orphans_than_one_journal_group_holds_are_freed_at_mount() {
    const ORPHANS: usize = 2_500; // 2,500 x 9 bytes > one 16 KiB group
    let (device, volume) = new_volume_with_journal(64 << 20, 4096, Some(SMALL_JOURNAL_BYTES));
    let mut handles = Vec::new();
    for index in 0..ORPHANS {
        let name = format!("f{index}");
        let file = volume.inodes().create(ROOT, name.as_bytes(), 0o644, owner()).unwrap();
        handles.push(volume.inodes().open_file(file.ino, OpenFlags::READ_WRITE).unwrap());
        volume.inodes().unlink(ROOT, name.as_bytes()).unwrap();
    }
    volume.sync().unwrap();
    let crashed = device.image();
    drop(handles);
    drop(volume);

    let (_, volume) = open_image(crashed).expect("the volume mounts and frees its orphans");
    assert_eq!(volume.statfs().inodes, 1, "only the root is left");
    fsck_clean(&volume);
}

/// Free space cut into single blocks, then one fallocate over far more
/// pieces than a group holds: ENOSPC with nothing changed, and the volume
/// goes on working.
#[test]
fn fallocate_over_fragmented_free_space_is_refused_not_asserted() {
    let (_, volume) = new_volume_with_journal(64 << 20, 4096, Some(SMALL_JOURNAL_BYTES));
    let comb = volume.inodes().create(ROOT, b"comb", 0o644, owner()).unwrap();
    let comb_file = volume.inodes().open_file(comb.ino, OpenFlags::READ_WRITE).unwrap();
    for block in 0..2_000u64 {
        comb_file
            .fallocate(FallocateMode::Allocate { keep_size: false }, block * 8192, 8192)
            .unwrap();
    }
    // Every other block of the comb freed: 2,000 one-block holes.
    for block in 0..2_000u64 {
        comb_file.fallocate(FallocateMode::PunchHole, block * 8192, 4096).unwrap();
    }
    let big = volume.inodes().create(ROOT, b"big", 0o644, owner()).unwrap();
    let big_file = volume.inodes().open_file(big.ino, OpenFlags::READ_WRITE).unwrap();
    let free_before = volume.statfs().free_blocks;
    let length = free_before * 4096;
    match big_file.fallocate(FallocateMode::Allocate { keep_size: false }, 0, length) {
        Ok(()) => assert!(volume.statfs().free_blocks < free_before),
        Err(error) => {
            assert_eq!(error.errno(), libc::ENOSPC, "{error}");
            assert_eq!(volume.statfs().free_blocks, free_before, "nothing allocated");
            assert_eq!(volume.inodes().getattr(big.ino).unwrap().size, 0);
        }
    }
    big_file.write_at(b"still works", 0).unwrap();
    volume.sync().unwrap();
    fsck_clean(&volume);
}

/// Collapsing a range ahead of thousands of extents shifts every one of
/// them in one transaction: refused with ENOSPC when they do not fit.
#[test]
fn collapse_before_more_extents_than_a_group_holds_is_refused() {
    let (_, volume) = new_volume_with_journal(64 << 20, 4096, Some(SMALL_JOURNAL_BYTES));
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let handle = volume.inodes().open_file(file.ino, OpenFlags::READ_WRITE).unwrap();
    // Alternate written and unwritten blocks: extents that cannot merge.
    for block in 0..1_500u64 {
        handle.write_at(&[1u8; 4096], block * 8192).unwrap();
        handle
            .fallocate(FallocateMode::Allocate { keep_size: true }, block * 8192 + 4096, 4096)
            .unwrap();
    }
    handle.sync_all().unwrap();
    let size = volume.inodes().getattr(file.ino).unwrap().size;
    let error = handle.fallocate(FallocateMode::CollapseRange, 0, 4096).unwrap_err();
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    assert_eq!(volume.inodes().getattr(file.ino).unwrap().size, size, "nothing shifted");
    let mut first = [0u8; 4];
    handle.read_at(&mut first, 0).unwrap();
    assert_eq!(first, [1u8; 4]);
    fsck_clean(&volume);
}

/// An extended attribute larger than a group can log is ENOSPC, with a
/// message that says what to do.
#[test]
fn an_xattr_larger_than_a_journal_group_is_enospc() {
    let (_, volume) = new_volume_with_journal(64 << 20, 4096, Some(SMALL_JOURNAL_BYTES));
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap();
    let value = vec![7u8; 60_000];
    let error = volume
        .inodes()
        .set_xattr(file.ino, b"user.big", &value, XattrFlags::default(), Privilege::SysAdmin)
        .unwrap_err();
    assert_eq!(error.errno(), libc::ENOSPC, "{error}");
    assert!(error.to_string().contains("journal"), "{error}");
    assert!(volume.inodes().get_xattr(file.ino, b"user.big", Privilege::SysAdmin).is_err());
    fsck_clean(&volume);
}
