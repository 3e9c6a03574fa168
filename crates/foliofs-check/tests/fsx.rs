//! A bounded slice of `foliofs fsx` for CI: a fixed op count per block size.

use foliofs_check::fsx::{run, FsxConfig};

fn slice(block_bytes: u32, seed: u64, ops: u64) {
    match run(FsxConfig::new(seed, ops, block_bytes), &mut |_| {}) {
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
