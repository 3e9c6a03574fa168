//! The background committer of a volume: it commits when a writer has
//! logged half a group, and at its interval.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dev::FaultDev;
use crate::format::ROOT_INO;
use crate::vfs::{Owner, Volume};

use super::volume::test_volume;

/// A 64 MiB volume (a 1 MiB journal: groups of 256 KiB) with `options`,
/// and its device.
fn volume_with(options: &str) -> (Volume, Arc<FaultDev>) {
    test_volume(&format!("writeback_interval_ms=0,{options}"))
}

/// Creates files until the log holds more than half a group or a
/// commit happened; returns how many.
fn create_until_half_a_group(volume: &Volume, durable_before: u64) -> u64 {
    let journal = volume.shared.meta.journal();
    let half_group = journal.geometry().group_bytes_max() / 2;
    let owner = Owner { uid: 0, gid: 0 };
    for created in 1..=100_000 {
        volume.inodes().create(ROOT_INO, format!("f{created}").as_bytes(), 0o644, owner).unwrap();
        if journal.pending_bytes() as u64 > half_group || journal.durable_lsn() > durable_before {
            return created;
        }
    }
    panic!("100,000 creates never filled half a journal group");
}

/// Half a group of log goes to the background committer: the writer
/// goes on without writing it (as jbd2 commits a transaction grown
/// large), and it is durable well before the commit interval.
#[test]
fn half_a_group_of_log_is_committed_by_the_background_committer() {
    let (volume, raw) = volume_with("commit_interval_ms=600000");
    // Half a group (128 KiB) takes 2 s to write: a create that waited
    // for it would return only with its log durable.
    raw.limit_write_bandwidth(Some(64 << 10));
    let journal = volume.shared.meta.journal();
    let durable_before = journal.durable_lsn();
    create_until_half_a_group(&volume, durable_before);
    let logged = journal.last_lsn();
    assert!(journal.durable_lsn() < logged, "the create returned before its log was written");
    raw.limit_write_bandwidth(None);
    let started = Instant::now();
    while journal.durable_lsn() < logged {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "half a group was not committed within 30 s (the interval is 10 minutes)"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    volume.close().unwrap();
}

/// Without a background committer the writer that fills half a group
/// writes it, before its create returns.
#[test]
fn without_a_committer_the_writer_commits_half_a_group_itself() {
    let (volume, _) = volume_with("commit_interval_ms=0");
    let journal = volume.shared.meta.journal();
    let durable_before = journal.durable_lsn();
    create_until_half_a_group(&volume, durable_before);
    assert_eq!(journal.durable_lsn(), journal.last_lsn(), "committed within the create");
    assert_eq!(journal.pending_bytes(), 0);
    volume.close().unwrap();
}
