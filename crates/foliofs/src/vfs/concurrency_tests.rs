//! Operations on unrelated inodes do not wait on each other: a transaction
//! stopped part-way, holding its shards, blocks only what needs them.

use std::sync::mpsc;
use std::time::Duration;

use crate::meta::{shard_of, test_hooks};
use crate::options::VolumeOptions;
use crate::vfs::{MkfsOptions, OpenFlags, Owner, Volume};

const OWNER: Owner = Owner { uid: 0, gid: 0 };
/// Long enough for any of the operations on a loaded 2-CPU machine; an
/// operation that waits for the held transaction waits forever.
const PATIENCE: Duration = Duration::from_secs(30);

fn shards_of(inos: &[u64]) -> Vec<usize> {
    inos.iter().map(|&ino| shard_of(ino)).collect()
}

/// A formatted 64 MiB volume with no background commits (so only what a
/// test commits reaches the journal), and its image file.
fn fresh_volume() -> (tempfile::NamedTempFile, Volume) {
    let image = tempfile::NamedTempFile::new().unwrap();
    image.as_file().set_len(64 << 20).unwrap();
    let options = VolumeOptions { commit_interval_ms: 0, ..VolumeOptions::default() };
    Volume::mkfs_path(image.path(), None, &MkfsOptions::default(), &options).unwrap();
    let volume = Volume::open(image.path(), &options).unwrap();
    (image, volume)
}

/// The first of `candidates` whose shard none of `held` has.
fn clear_of(held: &[usize], candidates: &[u64]) -> u64 {
    *candidates
        .iter()
        .find(|&&ino| !held.contains(&shard_of(ino)))
        .expect("a candidate in a shard the held transaction does not hold")
}

/// A create in directory A is stopped inside its transaction (its shards
/// locked, nothing applied). Meanwhile a create in directory B, a stat of
/// file C and a buffered overwrite (with its fdatasync) of file D run to
/// the end; then A's create finishes. The candidates for B, C and D are
/// made first, so that ones in shards the held transaction does not hold
/// can be chosen: the property is about unrelated inodes, and two unrelated
/// inodes may hash to one shard (1 in 256).
#[test]
fn a_held_transaction_blocks_nothing_unrelated() {
    let (_image, volume) = fresh_volume();
    let inodes = volume.inodes();
    let dir_a = inodes.mkdir(1, b"a", 0o755, OWNER).unwrap().ino;
    let make = |prefix: &str, dir: bool| -> Vec<u64> {
        (0..8)
            .map(|index| {
                let name = format!("{prefix}{index}");
                let made = if dir {
                    inodes.mkdir(1, name.as_bytes(), 0o755, OWNER)
                } else {
                    inodes.create(1, name.as_bytes(), 0o644, OWNER)
                };
                made.unwrap().ino
            })
            .collect()
    };
    let (dirs_b, files_c, files_d) = (make("b", true), make("c", false), make("d", false));
    for &ino in &files_d {
        let file = inodes.open_file(ino, OpenFlags::WRITE).unwrap();
        file.write_at(&[1; 8192], 0).unwrap();
        file.sync_all().unwrap();
    }

    let (held_sender, held) = mpsc::channel::<Vec<u64>>();
    let (release, released) = mpsc::channel::<()>();
    let shared_volume = &volume;
    std::thread::scope(|scope| {
        let volume = shared_volume;
        let holder = scope.spawn(move || {
            test_hooks::set_inside_transaction(Some(Box::new(move |inos: &[u64]| {
                if inos.first() == Some(&dir_a) {
                    held_sender.send(inos.to_vec()).unwrap();
                    released.recv().unwrap();
                }
            })));
            let made = volume.inodes().create(dir_a, b"held", 0o644, OWNER);
            test_hooks::set_inside_transaction(None);
            made.unwrap().ino
        });
        let held_inos = held.recv_timeout(PATIENCE).expect("the create reached its transaction");
        let held_shards = shards_of(&held_inos);
        let (dir_b, file_c, file_d) = (
            clear_of(&held_shards, &dirs_b),
            clear_of(&held_shards, &files_c),
            clear_of(&held_shards, &files_d),
        );

        let (done_sender, done) = mpsc::channel::<&str>();
        scope.spawn(move || {
            let meta = &volume.shared.meta;
            // The create's new inode must be clear of the held shards too.
            while held_shards.contains(&shard_of(meta.peek_ino(false))) {
                meta.take_ino(false);
            }
            volume.inodes().create(dir_b, b"free", 0o644, OWNER).unwrap();
            done_sender.send("create in another directory").unwrap();
            assert_eq!(volume.inodes().getattr(file_c).unwrap().size, 0);
            done_sender.send("stat of a third file").unwrap();
            let file = volume.inodes().open_file(file_d, OpenFlags::WRITE).unwrap();
            file.write_at(&[2; 4096], 4096).unwrap();
            file.sync_data().unwrap();
            file.close().unwrap();
            done_sender.send("overwrite and fdatasync of a fourth file").unwrap();
        });
        let finished: Vec<&str> =
            std::iter::from_fn(|| done.recv_timeout(PATIENCE).ok()).take(3).collect();
        // Let the held create go before judging, so that a failure fails
        // the test instead of leaving its threads waiting for ever.
        release.send(()).unwrap();
        assert_eq!(
            finished,
            [
                "create in another directory",
                "stat of a third file",
                "overwrite and fdatasync of a fourth file"
            ],
            "the rest waited on the held transaction"
        );
        let made = holder.join().unwrap();
        assert_eq!(volume.inodes().lookup(dir_a, b"held").unwrap().ino, made);
    });
    let mut back = vec![0; 8192];
    let file = volume.inodes().open_file(clear_of(&[], &files_d), OpenFlags::READ).unwrap();
    file.read_at(&mut back, 0).unwrap();
    drop(file);
    volume.close().unwrap();
}

/// An fsync announces itself before its writeback (`File::sync_range`):
/// file B's fsync is stopped inside its writeback's first transaction, and
/// meanwhile file A's fsync, about to lead a journal group, waits for it.
/// Once B goes on, one group (one FUA write) makes both durable.
#[test]
fn an_fsync_waits_for_another_under_way_and_they_share_a_group() {
    let (_image, volume) = fresh_volume();
    let inodes = volume.inodes();
    let file_a = inodes.create(1, b"a", 0o644, OWNER).unwrap().ino;
    let file_b = inodes.create(1, b"b", 0o644, OWNER).unwrap().ino;
    // Both creates durable first: the group below holds only the syncs'.
    volume.sync().unwrap();
    volume.shared.meta.journal().assume_group_write(PATIENCE);

    let (held_sender, held) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let (synced_sender, synced) = mpsc::channel::<&str>();
    let fua_before = volume.device().stats().fua_writes;
    let shared_volume = &volume;
    std::thread::scope(|scope| {
        let volume = shared_volume;
        let synced_b = synced_sender.clone();
        scope.spawn(move || {
            let file = volume.inodes().open_file(file_b, OpenFlags::WRITE).unwrap();
            file.write_at(&[2; 4096], 0).unwrap();
            let mut first = true;
            test_hooks::set_inside_transaction(Some(Box::new(move |inos: &[u64]| {
                if first && inos.contains(&file_b) {
                    first = false;
                    held_sender.send(()).unwrap();
                    released.recv().unwrap();
                }
            })));
            file.sync_all().unwrap();
            test_hooks::set_inside_transaction(None);
            synced_b.send("b").unwrap();
        });
        held.recv_timeout(PATIENCE).expect("b's writeback reached a transaction");
        scope.spawn(move || {
            let file = volume.inodes().open_file(file_a, OpenFlags::WRITE).unwrap();
            file.write_at(&[1; 4096], 0).unwrap();
            file.sync_all().unwrap();
            synced_sender.send("a").unwrap();
        });
        // Not proof that a waits, but a sync that did not would be done.
        let early = synced.recv_timeout(Duration::from_millis(300));
        release.send(()).unwrap();
        assert!(early.is_err(), "a's fsync did not wait for b's, under way");
        let mut order: Vec<&str> = synced.iter().take(2).collect();
        order.sort_unstable();
        assert_eq!(order, ["a", "b"]);
    });
    assert_eq!(volume.device().stats().fua_writes, fua_before + 1, "one group for both fsyncs");
    volume.close().unwrap();
}
