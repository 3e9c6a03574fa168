//! What a test does when this machine lacks something it needs (a tool,
//! root, /dev/fuse, a kernel feature): on a developer's machine it says so
//! and passes, so `scripts/test.sh` runs anywhere; where FOLIOFS_NO_SKIP=1
//! (`.ci/run` sets it) it fails, so a green CI means every test ran.
//!
//! Included by the test crates that can skip, with
//! `#[path = "<up to the workspace root>/tests/support/skip.rs"] mod skip;`.

// Each test binary uses a part of this module.
#![allow(dead_code)]

/// Whether a missing prerequisite must fail the test instead of skipping it.
pub fn skipping_forbidden() -> bool {
    std::env::var_os("FOLIOFS_NO_SKIP").is_some_and(|value| value == "1")
}

/// Called where a test returns early because `why`: returns (the caller
/// then skips) unless skipping is forbidden, where it fails the test.
pub fn skip_or_fail(why: &str) {
    assert!(
        !skipping_forbidden(),
        "{why}; FOLIOFS_NO_SKIP=1 (as in CI): a test that cannot run fails instead of skipping"
    );
    eprintln!("skipped: {why}");
}
