//! `Volume::shutdown` (XFS_IOC_GOINGDOWN): each mode makes durable what it
//! promises and nothing more reaches the device afterwards; every operation
//! then fails EIO, closing writes nothing, and the next open recovers what
//! was durable. On 1 KiB, 4 KiB and 64 KiB blocks.

#[macro_use]
mod common;

use foliofs::dev::fault::Keep;
use foliofs::{OpenFlags, ShutdownMode, Volume};

use common::{new_volume, open_image, owner, pattern, ROOT};

const VOLUME_BYTES: u64 = 8 << 20;
const DATA_BYTES: usize = 20_000;

block_size_tests!(
    sync_mode_keeps_cached_data,
    flush_log_mode_keeps_names_but_not_cached_data,
    immediate_mode_keeps_only_what_was_durable,
    after_a_shutdown_everything_fails_eio_and_nothing_reaches_the_device,
);

/// What the reopened volume holds of the file `later` (created, and written
/// through the cache, after the last fsync): None when the name is gone.
fn shut_down_with(block_bytes: u32, mode: ShutdownMode) -> Option<Vec<u8>> {
    let (raw, volume) = new_volume(VOLUME_BYTES, block_bytes);
    let synced = volume.inodes().create(ROOT, b"synced", 0o644, owner()).expect("create synced");
    let file = volume.inodes().open_file(synced.ino, OpenFlags::WRITE).expect("open synced");
    file.write_all_at(&pattern(1, DATA_BYTES), 0).expect("write synced");
    file.sync_all().expect("fsync synced");
    let later = volume.inodes().create(ROOT, b"later", 0o644, owner()).expect("create later");
    let file = volume.inodes().open_file(later.ino, OpenFlags::WRITE).expect("open later");
    file.write_all_at(&pattern(2, DATA_BYTES), 0).expect("write later");

    volume.shutdown(mode).expect("shutdown");
    let issued = raw.log_len();
    drop(file);
    volume.close().expect("closing a volume that was shut down");
    assert_eq!(raw.log_len(), issued, "closing wrote to a volume that was shut down");

    // A power cut right after the shutdown: unflushed writes are lost.
    let (_, volume) = open_image(raw.crash_image(issued, &|_| Keep::Nothing)).expect("reopen");
    assert_eq!(read_file(&volume, b"synced"), Some(pattern(1, DATA_BYTES)));
    read_file(&volume, b"later")
}

fn read_file(volume: &Volume, name: &[u8]) -> Option<Vec<u8>> {
    let attr = volume.inodes().lookup(ROOT, name).ok()?;
    let mut content = vec![0; attr.size as usize];
    let file = volume.inodes().open_file(attr.ino, OpenFlags::READ).expect("open");
    file.read_exact_at(&mut content, 0).expect("read");
    Some(content)
}

fn sync_mode_keeps_cached_data(block_bytes: u32) {
    assert_eq!(shut_down_with(block_bytes, ShutdownMode::Sync), Some(pattern(2, DATA_BYTES)));
}

/// The journal's records (the create) are committed; the data was still in
/// the cache, so its size never reached the disk either.
fn flush_log_mode_keeps_names_but_not_cached_data(block_bytes: u32) {
    assert_eq!(shut_down_with(block_bytes, ShutdownMode::FlushLog), Some(Vec::new()));
}

fn immediate_mode_keeps_only_what_was_durable(block_bytes: u32) {
    assert_eq!(shut_down_with(block_bytes, ShutdownMode::Immediate), None);
}

fn after_a_shutdown_everything_fails_eio_and_nothing_reaches_the_device(block_bytes: u32) {
    let (raw, volume) = new_volume(VOLUME_BYTES, block_bytes);
    let attr = volume.inodes().create(ROOT, b"file", 0o644, owner()).expect("create");
    let file = volume.inodes().open_file(attr.ino, OpenFlags::READ_WRITE).expect("open");
    file.write_all_at(&pattern(3, DATA_BYTES), 0).expect("write");
    file.sync_all().expect("fsync");
    // Cached and dirty: answers the cache could give are refused too.
    file.write_all_at(&pattern(4, 100), 0).expect("write");

    volume.shutdown(ShutdownMode::Immediate).expect("shutdown");
    assert!(volume.is_shut_down());
    let issued = raw.log_len();
    let eio = |result: foliofs::Result<()>, what: &str| {
        let error = result.expect_err(what);
        assert_eq!(error.errno(), libc::EIO, "{what}: {error}");
    };
    let mut buffer = vec![0; 100];
    eio(file.read_at(&mut buffer, 0).map(drop), "read");
    eio(file.write_at(&buffer, 0).map(drop), "write");
    eio(file.sync_all(), "fsync");
    eio(file.set_len(0), "truncate");
    eio(file.attr().map(drop), "fstat");
    eio(volume.inodes().getattr(attr.ino).map(drop), "getattr");
    eio(volume.inodes().lookup(ROOT, b"file").map(drop), "lookup");
    eio(volume.inodes().readdir(ROOT).map(drop), "readdir");
    eio(volume.inodes().open_file(attr.ino, OpenFlags::READ).map(drop), "open");
    eio(volume.inodes().create(ROOT, b"new", 0o644, owner()).map(drop), "create");
    eio(volume.inodes().unlink(ROOT, b"file"), "unlink");
    eio(volume.sync(), "syncfs");
    eio(volume.checkpoint(), "checkpoint");
    volume.shutdown(ShutdownMode::Sync).expect("a second shutdown does nothing");
    drop(file);
    volume.close().expect("close");
    assert_eq!(raw.log_len(), issued, "a request reached the device after the shutdown");
}
