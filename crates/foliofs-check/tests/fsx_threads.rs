//! The threaded fsx in process: a bounded run that must find nothing, and
//! a target serving stale reads that it must catch.

use std::sync::mpsc;
use std::time::Duration;

use foliofs_check::fsx_threads::{
    run, InProcess, StaleReads, ThreadOp, ThreadsConfig, ThreadsFailure, ThreadsStats,
};
use foliofs_check::quiet_options;

/// Runs the checker on a thread of its own: a deadlock fails the test after
/// five minutes rather than hanging the suite.
fn run_bounded(
    config: ThreadsConfig,
    image_bytes: u64,
    options: foliofs::VolumeOptions,
    stale: bool,
) -> Result<ThreadsStats, Box<ThreadsFailure>> {
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let target = InProcess::create(config.files, image_bytes, &options).unwrap();
        let outcome = if stale {
            run(&config, &StaleReads(&target), &|_| {})
        } else {
            run(&config, &target, &|_| {})
        };
        let _ = done.send(outcome);
    });
    result.recv_timeout(Duration::from_secs(300)).expect("fsx --threads hung for 5 minutes")
}

fn config(seed: u64, ops: u64) -> ThreadsConfig {
    ThreadsConfig {
        files: 2,
        time_limit: Some(Duration::from_secs(120)),
        ..ThreadsConfig::new(seed, 4, ops)
    }
}

fn options() -> foliofs::VolumeOptions {
    // Writeback and commits in the background, as a mount runs.
    foliofs::VolumeOptions { cache_bytes: 64 << 20, ..foliofs::VolumeOptions::default() }
}

#[test]
fn four_threads_on_two_files_read_only_what_was_written() {
    for seed in [1, 2] {
        let stats = run_bounded(config(seed, 3_000), 256 << 20, options(), false)
            .unwrap_or_else(|failure| panic!("{failure}"));
        assert_eq!(stats.ops, 3_000, "the run stopped early: {stats}");
        assert!(stats.window_races > 100, "{stats}");
        assert!(stats.stream_reads > 100, "{stats}");
        assert!(stats.direct_writes > 50 && stats.truncates > 5 && stats.punches > 10, "{stats}");
        // Most reads of another thread's slot land while it is idle.
        assert!(stats.bytes_checked > 4 * stats.bytes_undefined, "{stats}");
    }
}

#[test]
fn quiet_options_run_too() {
    let config = ThreadsConfig { files: 1, ..config(3, 1_000) };
    run_bounded(config, 128 << 20, quiet_options(), false)
        .unwrap_or_else(|failure| panic!("{failure}"));
}

#[test]
fn a_target_serving_stale_reads_is_caught() {
    let failure = run_bounded(config(4, 3_000), 256 << 20, options(), true)
        .expect_err("stale reads went unseen");
    assert!(failure.message.contains("mismatch"), "{failure}");
    assert!(matches!(failure.op, ThreadOp::WindowRace { .. } | ThreadOp::Read { .. }), "{failure}");
    assert!(failure.stats.ops < 3_000, "the run went on after the mismatch: {failure}");
}
