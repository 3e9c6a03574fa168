//! `Volume::set_read_only`, what a remount read-only and back asks of the
//! library: everything written back and checkpointed first, then every
//! change refused; writable again unless opened read-only.

mod common;

use common::{new_volume, open_image, open_image_with, options, owner, pattern, ROOT};
use foliofs::{Error, OpenFlags};

#[test]
fn read_only_writes_back_then_refuses_changes_and_rw_accepts_them_again() {
    let (device, volume) = new_volume(64 << 20, 4096);
    let file = volume.create(ROOT, b"cached", 0o644, owner()).unwrap();
    let data = pattern(3, 300_000);
    let handle = volume.open_file(file.ino, OpenFlags::READ_WRITE).unwrap();
    handle.write_at(&data, 0).unwrap();
    assert!(volume.cache_stats().dirty_bytes > 0, "the data should be only cached yet");

    volume.set_read_only(true).unwrap();
    assert_eq!(volume.cache_stats().dirty_bytes, 0);
    // The image is complete as it stands: checkpointed, nothing to replay.
    let (_, copy) = open_image(device.image()).unwrap();
    assert_eq!(copy.load_report().journal_groups_replayed, 0);
    let mut back = vec![0; data.len()];
    let copied = copy.open_file(copy.resolve("/cached").unwrap(), OpenFlags::READ).unwrap();
    assert_eq!(copied.read_at(&mut back, 0).unwrap(), data.len());
    assert!(back == data);
    drop((copied, copy));
    let image_while_read_only = device.image();

    // Every change is refused; reads still work.
    assert!(matches!(handle.write_at(b"x", 0), Err(Error::ReadOnly(_))));
    assert!(matches!(volume.create(ROOT, b"new", 0o644, owner()), Err(Error::ReadOnly(_))));
    assert!(matches!(volume.unlink(ROOT, b"cached"), Err(Error::ReadOnly(_))));
    let mut back = vec![0; data.len()];
    assert_eq!(handle.read_at(&mut back, 0).unwrap(), data.len());
    assert!(back == data);
    volume.sync().unwrap();
    assert!(device.image() == image_while_read_only, "a read-only volume wrote to its image");

    volume.set_read_only(false).unwrap();
    handle.write_at(b"rw again", 0).unwrap();
    volume.create(ROOT, b"new", 0o644, owner()).unwrap();
    handle.close().unwrap();
    volume.close().unwrap();
    let (_, volume) = open_image(device.image()).unwrap();
    volume.resolve("/new").unwrap();
    let handle = volume.open_file(volume.resolve("/cached").unwrap(), OpenFlags::READ).unwrap();
    let mut head = [0; 8];
    handle.read_at(&mut head, 0).unwrap();
    assert_eq!(&head, b"rw again");
}

#[test]
fn a_volume_opened_read_only_stays_read_only() {
    let (device, volume) = new_volume(16 << 20, 4096);
    volume.close().unwrap();
    let read_only = foliofs::VolumeOptions { read_only: true, ..options() };
    let (_, volume) = open_image_with(device.image(), &read_only).unwrap();
    volume.set_read_only(true).unwrap_or_else(|error| panic!("ro on ro: {error}"));
    let refused = volume.set_read_only(false).unwrap_err();
    assert!(matches!(refused, Error::ReadOnly(_)), "{refused}");
    assert!(matches!(volume.create(ROOT, b"new", 0o644, owner()), Err(Error::ReadOnly(_))));
}
