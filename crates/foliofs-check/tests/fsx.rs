//! A bounded slice of `foliofs fsx` for CI: a fixed op count per block size.

use foliofs_check::fsx::{run, FsxConfig, FsxStats};

fn slice(block_bytes: u32, seed: u64, ops: u64) -> FsxStats {
    slice_with("", block_bytes, seed, ops)
}

fn slice_with(options: &'static str, block_bytes: u32, seed: u64, ops: u64) -> FsxStats {
    run_config(FsxConfig { options, ..FsxConfig::new(seed, ops, block_bytes) })
}

fn run_config(config: FsxConfig) -> FsxStats {
    match run(config, &mut |_| {}) {
        Ok(stats) => {
            eprintln!("block {}: {stats:?}", config.block_bytes);
            stats
        }
        Err(failure) => panic!("{failure}"),
    }
}

/// Every kind of clone, dedupe and copy the run must have taken: within
/// the file and with the second one, dedupes that share and dedupes that
/// differ, requests the rules refuse, and the shared-count checks.
fn assert_clones_ran(stats: &FsxStats) {
    assert!(stats.clones > 0 && stats.copies > 0, "{stats:?}");
    assert!(stats.dedupes_equal > 0 && stats.dedupes_differ > 0, "{stats:?}");
    assert!(stats.refused > 0 && stats.bytes_remapped > 0, "{stats:?}");
    assert!(stats.other_file_ops > 0 && stats.shared_checks > 0, "{stats:?}");
}

#[test]
fn fsx_1k() {
    assert_clones_ran(&slice(1024, 1, 20_000));
}

#[test]
fn fsx_4k() {
    assert_clones_ran(&slice(4096, 4, 20_000));
}

#[test]
fn fsx_64k() {
    assert_clones_ran(&slice(65536, 64, 8_000));
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

/// `--no-direct`: clones, dedupes and copies through buffered handles
/// only, so the cache (never a direct read) must show what they shared;
/// a small file makes them meet the same blocks again and again.
#[test]
fn fsx_4k_clones_buffered_small_file() {
    let stats = run_config(FsxConfig {
        direct_io: false,
        file_bytes_max: 64 << 10,
        op_bytes_max: 16 << 10,
        compare_every: 16,
        ..FsxConfig::new(11, 8_000, 4096)
    });
    assert_eq!(stats.direct_reads + stats.direct_writes, 0);
    assert_clones_ran(&stats);
}

/// `--no-clone --no-dedupe --no-copy-range`: none of them is drawn.
#[test]
fn fsx_switches_turn_clones_off() {
    let stats = run_config(FsxConfig {
        clone_range: false,
        dedupe_range: false,
        copy_range: false,
        ..FsxConfig::new(12, 2_000, 4096)
    });
    assert_eq!(stats.clones + stats.dedupes + stats.copies + stats.other_file_ops, 0);
}

/// Found by fsx (seed 11, 4 KiB blocks, shrunk): a collapse over a source
/// range and part of its clone in the same file unmapped one device block
/// at two file blocks and mapped it again at one; the transaction counted
/// the remap against both, so the block's count stayed 2 with one mapping.
#[test]
fn fsx_collapse_over_a_clone_and_its_source_drops_one_reference() {
    use foliofs::FallocateMode;
    use foliofs_check::fsx::{replay, FsxOp, Side};
    let ops = [
        FsxOp::Write { pos: 0xd23, len: 0x443f },
        FsxOp::Write { pos: 0xaaca, len: 0x5536 },
        FsxOp::CloneRange {
            from: Side::Main,
            to: Side::Main,
            src_pos: 0x2000,
            dst_pos: 0x9000,
            len: 0x4000,
            direct: false,
        },
        FsxOp::Fallocate { mode: FallocateMode::CollapseRange, offset: 0x2000, len: 0xa000 },
    ];
    if let Err(failure) = replay(FsxConfig::new(11, 0, 4096), &ops) {
        panic!("{failure}");
    }
}

/// Found by fsx (seed 1, 1 KiB blocks, shrunk): a direct write of part of a
/// shared Unwritten block copied the rest of the block from the shared
/// device block, which was never written (garbage), instead of zeros.
#[test]
fn fsx_direct_write_into_part_of_a_shared_unwritten_block_reads_zeros_around_it() {
    use foliofs::FallocateMode;
    use foliofs_check::fsx::{replay, FsxOp, Side};
    let ops = [
        FsxOp::Fallocate {
            mode: FallocateMode::ZeroRange { keep_size: false },
            offset: 0x28fb2,
            len: 0xccff,
        },
        FsxOp::CloneRange {
            from: Side::Main,
            to: Side::Other,
            src_pos: 0x32400,
            dst_pos: 0x28000,
            len: 0x3800,
            direct: false,
        },
        FsxOp::DirectWrite { pos: 0x35600, len: 0xaa00 },
        FsxOp::Reopen,
    ];
    if let Err(failure) = replay(FsxConfig::new(1, 0, 1024), &ops) {
        panic!("{failure}");
    }
}
