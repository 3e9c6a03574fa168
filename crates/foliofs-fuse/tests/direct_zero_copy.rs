//! Aligned O_DIRECT writes through the mount reach the device from the
//! request's own buffer on io_uring (no staging copy), and direct reads land
//! in the reply's own buffer, and the bytes are right; /dev/fuse copies
//! each payload once (its read buffer is reused).

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use common::InProcessMount;
use foliofs::dev::AlignedBuf;

/// 64 KiB and 4 KiB writes, and 2 KiB ones (seed 000's size).
const WRITE_SIZES: [usize; 3] = [64 << 10, 4 << 10, 2 << 10];
const WRITES_PER_SIZE: u64 = 16;

#[test]
fn aligned_direct_io_moves_between_request_and_device_without_a_copy() {
    if common::skip_requested() {
        return;
    }
    let mount = InProcessMount::new(64 << 20, "engine=uring");
    let path = mount.point.join("zero-copy");
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).custom_flags(libc::O_DIRECT);
    let file = options.open(&path).unwrap();
    // Laid out first: the 2 KiB writes then overwrite, as seed 000's do.
    let span_bytes = (64 << 10) * WRITES_PER_SIZE;
    file.write_all_at(&AlignedBuf::zeroed(span_bytes as usize), 0).unwrap();
    let before = mount.direct_io.stats();

    let mut expected = vec![0u8; span_bytes as usize];
    let mut written_bytes = 0u64;
    for (round, size) in WRITE_SIZES.into_iter().enumerate() {
        for index in 0..WRITES_PER_SIZE {
            let fill = (round as u64 * WRITES_PER_SIZE + index + 1) as u8;
            let offset = (index * 7 % WRITES_PER_SIZE) * size as u64;
            let mut buffer = AlignedBuf::zeroed(size);
            buffer.fill(fill);
            file.write_all_at(&buffer, offset).unwrap();
            expected[offset as usize..offset as usize + size].fill(fill);
            written_bytes += size as u64;
        }
    }
    let counted = mount.direct_io.stats();
    let mut read_back = AlignedBuf::zeroed(span_bytes as usize);
    file.read_exact_at(&mut read_back, 0).unwrap();
    let after_read = mount.direct_io.stats();
    drop(file);
    mount.unmount();

    assert!(read_back[..] == expected[..], "the bytes read back differ from those written");
    let lent_write_bytes = counted.lent_write_bytes - before.lent_write_bytes;
    let staged_write_bytes = counted.staged_write_bytes - before.staged_write_bytes;
    eprintln!("direct writes: {lent_write_bytes} bytes in place, {staged_write_bytes} staged");
    let lent_read_bytes = after_read.lent_read_bytes - counted.lent_read_bytes;
    let staged_read_bytes = after_read.staged_read_bytes - counted.staged_read_bytes;
    eprintln!("direct reads: {lent_read_bytes} bytes in place, {staged_read_bytes} staged");
    if common::transport() == "uring" {
        assert_eq!(staged_write_bytes, 0, "aligned direct writes were copied before the device");
        assert_eq!(lent_write_bytes, written_bytes);
        assert_eq!(staged_read_bytes, 0, "direct reads were copied into their replies");
        assert_eq!(lent_read_bytes, span_bytes);
    } else {
        assert_eq!(staged_write_bytes, written_bytes, "/dev/fuse payloads are copied once");
        assert_eq!(staged_read_bytes, span_bytes);
    }
}
