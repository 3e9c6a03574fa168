//! A transaction that reaches an inode it did not name is abandoned with
//! EIO, in every build, and never waits for that inode's shard out of the
//! ascending order (where two threads could wait for each other forever).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::meta::{shard_of, MetaStore};
use crate::options::VolumeOptions;
use crate::vfs::{MkfsOptions, Volume};

/// Long enough for any step on a loaded 2-CPU machine; a step that waits
/// for the other thread's shard waits forever.
const PATIENCE: Duration = Duration::from_secs(30);

/// A formatted volume with no background commits, leaked: a thread left
/// hanging by a failing run must not keep the test from reporting.
fn leaked_volume() -> &'static Volume {
    let image = tempfile::NamedTempFile::new().unwrap();
    image.as_file().set_len(64 << 20).unwrap();
    let options = VolumeOptions { commit_interval_ms: 0, ..VolumeOptions::default() };
    Volume::mkfs_path(image.path(), None, &MkfsOptions::default(), &options).unwrap();
    let volume = Volume::open(image.path(), &options).unwrap();
    let leaked: &'static (tempfile::NamedTempFile, Volume) = Box::leak(Box::new((image, volume)));
    &leaked.1
}

/// Two inode numbers whose shards are `low` < `high`.
fn inodes_in_two_shards() -> (u64, u64) {
    let first = 1000;
    let other = (first + 1..first + 10_000)
        .find(|&ino| shard_of(ino) != shard_of(first))
        .expect("another shard among 10,000 numbers");
    if shard_of(first) < shard_of(other) {
        (first, other)
    } else {
        (other, first)
    }
}

/// Waits until `done` holds, up to [`PATIENCE`].
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The interleaving that hung release builds: A holds the high shard and
/// reaches an inode of the low one it did not name, while B (naming both)
/// holds the low shard and waits for the high one. A is abandoned with
/// EIO, which lets B go on; the volume goes on working.
#[test]
fn an_unnamed_lower_shard_abandons_the_transaction_instead_of_waiting() {
    let volume = leaked_volume();
    let meta: &'static MetaStore = &volume.shared.meta;
    let (low, high) = inodes_in_two_shards();

    let (a_holds_high, a_held) = mpsc::channel::<()>();
    let (results, result) = mpsc::channel::<(&str, crate::error::Result<()>)>();
    let a_results = results.clone();
    std::thread::spawn(move || {
        let outcome = meta.transact(&[high], |txn| {
            a_holds_high.send(()).unwrap();
            // B locks the low shard, then waits for the high one A holds.
            wait_until("B to hold the low shard", || meta.shard_write_locked(low));
            let _ = txn.state().inode(low);
            Ok(())
        });
        a_results.send(("A", outcome.map(|_| ()))).unwrap();
    });
    a_held.recv_timeout(PATIENCE).expect("A's transaction holds the high shard");
    std::thread::spawn(move || {
        let outcome = meta.transact(&[low, high], |txn| {
            let _ = txn.state().inode(low);
            let _ = txn.state().inode(high);
            Ok(())
        });
        results.send(("B", outcome.map(|_| ()))).unwrap();
    });

    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let (who, outcome) = result
            .recv_timeout(PATIENCE)
            .expect("both transactions end (neither waits for the other forever)");
        outcomes.insert(who, outcome);
    }
    let abandoned = outcomes["A"].as_ref().expect_err("A reached a shard it did not name");
    assert_eq!(abandoned.errno(), libc::EIO, "{abandoned}");
    assert!(abandoned.to_string().contains("did not name"), "{abandoned}");
    assert!(outcomes["B"].is_ok(), "B: {:?}", outcomes["B"]);
    // Nothing was applied before the abandon: the volume takes changes.
    assert!(meta.refusal().is_none(), "{:?}", meta.refusal());
    meta.transact(&[low, high], |_| Ok(())).unwrap();
}
