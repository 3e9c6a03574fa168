//! A bounded slice of `foliofs fsx` for CI: a fixed op count per block size.

use foliofs_check::fsx::{run, FsxConfig};

fn slice(block_bytes: u32, seed: u64, ops: u64) {
    slice_with("", block_bytes, seed, ops);
}

fn slice_with(options: &'static str, block_bytes: u32, seed: u64, ops: u64) {
    match run(FsxConfig { options, ..FsxConfig::new(seed, ops, block_bytes) }, &mut |_| {}) {
        Ok(stats) => eprintln!("block {block_bytes}: {stats:?}"),
        Err(failure) => panic!("{failure}"),
    }
}

#[test]
fn fsx_1k() {
    slice(1024, 1, 20_000);
}

#[test]
fn fsx_4k() {
    slice(4096, 4, 20_000);
}

#[test]
fn fsx_64k() {
    slice(65536, 64, 8_000);
}

/// Whole-folio dirty tracking, small folios and writers that write back
/// themselves take other paths through the cache.
#[test]
fn fsx_4k_folio_dirty_throttled() {
    slice_with(
        "dirty=folio,folio_max=16k,dirty_bytes=64k,dirty_background_bytes=32k",
        4096,
        5,
        10_000,
    );
}

/// `-o discard`: truncates and punched holes trim the freed blocks (the
/// fault device fills them with a byte no file holds), across remounts
/// and crashes.
#[test]
fn fsx_4k_discard() {
    slice_with("discard", 4096, 7, 5_000);
}
