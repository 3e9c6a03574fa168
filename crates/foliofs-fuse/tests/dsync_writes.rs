//! Seed 003 through the mount: an O_DSYNC direct overwrite reaches the
//! device as exactly one write with FUA, on whichever transport
//! FOLIOFS_TRANSPORT selects.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use common::InProcessMount;

const WRITES: u64 = 64;
const BLOCK_BYTES: usize = 4096;

#[test]
fn each_o_dsync_direct_overwrite_is_one_fua_write() {
    if common::skip_requested() {
        return;
    }
    let mount = InProcessMount::new(64 << 20, "fua=native,engine=uring");
    let path = mount.point.join("dsync");
    // Laid out and made durable first, so the measured writes are pure
    // overwrites: no allocation, no journal commit.
    std::fs::write(&path, vec![1u8; BLOCK_BYTES * WRITES as usize]).unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();

    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(&path)
        .unwrap();
    let block = AlignedBlock::filled(7);
    let before = mount.volume.device().stats();
    for index in 0..WRITES {
        // Scattered offsets: every block once.
        let offset = (index * 37 % WRITES) * BLOCK_BYTES as u64;
        file.write_all_at(block.bytes(), offset).unwrap();
    }
    let written = mount.volume.device().stats().since(&before);
    drop(file);
    mount.unmount();

    eprintln!("{WRITES} O_DSYNC writes: {written:?}");
    assert_eq!(written.write_requests, WRITES, "{written:?}");
    assert_eq!(written.fua_writes, WRITES, "{written:?}");
    assert_eq!(written.flush_requests, 0, "{written:?}");
}

/// One 4 KiB block in page-aligned memory, as O_DIRECT needs.
struct AlignedBlock(Box<Page>);

#[repr(C, align(4096))]
struct Page([u8; BLOCK_BYTES]);

impl AlignedBlock {
    fn filled(byte: u8) -> Self {
        Self(Box::new(Page([byte; BLOCK_BYTES])))
    }

    fn bytes(&self) -> &[u8] {
        &self.0 .0
    }
}
