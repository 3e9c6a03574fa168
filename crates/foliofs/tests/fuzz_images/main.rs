//! Image fuzzing that runs on stable Rust and in CI for a bounded time, as
//! cargo-fuzz would on nightly: a checked-in corpus (small volumes on 1 KiB,
//! 4 KiB and 64 KiB blocks stored sparsely, and samples of each on-disk
//! structure) is mutated with a seeded generator and fed to
//!
//! - the decoders of `format` (superblock, checkpoint header, journal group
//!   framing, records) directly, and
//! - `Volume::open_device` on an in-memory device, then a walk of the tree
//!   that reads every file (buffered, direct, SEEK_DATA/SEEK_HOLE, fiemap),
//!   statfs and fsck.
//!
//! Mutations are raw (bit flips, byte and word sets with hostile values,
//! splices, zeroed sectors, truncation), which checksums mostly catch, and
//! structure-aware: a record, a checkpoint header field or a superblock
//! field is changed and the checksums (and the journal's hash chain) are
//! recomputed, so the hostile content reaches replay and the live state.
//!
//! Every case must end without a panic, within `CASE_SECONDS`, and without a
//! single allocation larger than the image justifies (a counting global
//! allocator watches; anything above 1 GiB is refused, which aborts). An
//! image changed only by raw mutations that still mounts must be fsck-clean
//! (checksums caught the damage or it hit nothing that matters).
//!
//! Budget: `FOLIOFS_FUZZ_ITERATIONS` cases per test (default below) and at
//! most `FOLIOFS_FUZZ_SECONDS` seconds each; `FOLIOFS_FUZZ_SEED` moves the
//! seed; `FOLIOFS_FUZZ_CASE=seed` replays one mount case. Inputs that once
//! failed live in `tests/corpus/regressions/` and run first, every time.
//! `cargo test --test fuzz_images -- --ignored regenerate_corpus` rebuilds
//! the seed corpus (the regressions are patches against it: keep both).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod alloc_bound;
mod corpus;
mod decoders;
mod exercise;
mod mutate;
mod structures;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foliofs::dev::{AlignedBuf, Device, FaultDev, FuaMode};
use foliofs::format::codec::Reader;
use foliofs::format::journal::{
    check_group_payload, decode_group_header, encode_group, GroupHeader, GroupLink,
    GROUP_HEADER_BYTES,
};
use foliofs::format::record::{decode_all, encode_all};
use foliofs::format::{
    CheckpointHeader, ExtentState, InodeAttrs, InodeKind, Record, Superblock, Timestamp,
    HEADER_BYTES,
};
use foliofs::vfs::MkfsOptions;
use foliofs::FallocateMode;
use foliofs::{OpenFlags, Privilege, Volume, VolumeOptions, XattrFlags};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{owner, pattern, ROOT};

use alloc_bound::*;
use corpus::*;
use mutate::*;
use structures::*;

// ---------------------------------------------------------------------------
// Budget
// ---------------------------------------------------------------------------

pub(crate) const CASE_SECONDS: u64 = 20;

pub(crate) fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|value| value.parse().ok())
}

pub(crate) struct Budget {
    iterations: u64,
    deadline: Instant,
}

impl Budget {
    fn new(default_iterations: u64, default_seconds: u64) -> Self {
        let iterations = env_u64("FOLIOFS_FUZZ_ITERATIONS").unwrap_or(default_iterations);
        let seconds = env_u64("FOLIOFS_FUZZ_SECONDS").unwrap_or(default_seconds);
        Self { iterations, deadline: Instant::now() + Duration::from_secs(seconds) }
    }

    fn allows(&self, done: u64) -> bool {
        done < self.iterations && Instant::now() < self.deadline
    }
}

pub(crate) fn base_seed() -> u64 {
    env_u64("FOLIOFS_FUZZ_SEED").unwrap_or(0x0F01_0F5E)
}
