//! `page_cache=kernel`: the kernel keeps a file's pages across opens and
//! serves reads of them without asking the daemon, so every change to the
//! data it did not make in its own cache must drop them. A reader that
//! cached a file (through read and through a shared mapping) sees each
//! change at once: a direct write (synchronous or asynchronous), a truncate, a hole punched, a write
//! through a second handle, and a write and truncate by a library user of
//! the same volume.

mod common;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;

use common::{skip_requested, InProcessMount};
use foliofs::OpenFlags;

const FILE_BYTES: usize = 64 * 1024;

/// A file of `FILE_BYTES` of `b'a'`, read once (the kernel caches it), with
/// a reader that keeps it open and mapped.
struct CachedReader {
    file: File,
    map: *const u8,
}

impl CachedReader {
    fn new(path: &Path) -> Self {
        std::fs::write(path, vec![b'a'; FILE_BYTES]).unwrap();
        let file = File::open(path).unwrap();
        // SAFETY: a fresh shared read-only mapping of a file we keep open;
        // unmapped in Drop, read only within FILE_BYTES while the file is
        // at least that long (the checks that truncate read past nothing).
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let reader = Self { file, map: map as *const u8 };
        assert_eq!(reader.read(0, FILE_BYTES), vec![b'a'; FILE_BYTES]);
        assert_eq!(reader.mapped(0, FILE_BYTES), vec![b'a'; FILE_BYTES]);
        reader
    }

    fn read(&self, offset: u64, length: usize) -> Vec<u8> {
        let mut buffer = vec![0; length];
        let count = self.file.read_at(&mut buffer, offset).unwrap();
        buffer.truncate(count);
        buffer
    }

    fn mapped(&self, offset: usize, length: usize) -> Vec<u8> {
        // SAFETY: within the mapping, which lives as long as self.
        unsafe { std::slice::from_raw_parts(self.map.add(offset), length) }.to_vec()
    }
}

impl Drop for CachedReader {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new, unmapped once.
        unsafe { libc::munmap(self.map as *mut libc::c_void, FILE_BYTES) };
    }
}

/// A volume mounted with `page_cache=kernel`, unless the test is skipped.
fn kernel_cache_mount() -> Option<InProcessMount> {
    if skip_requested() {
        return None;
    }
    Some(InProcessMount::new(256 << 20, "page_cache=kernel"))
}

/// What a fresh open of `path` reads (the kernel keeps its pages across opens).
fn reopened(path: &Path, offset: u64, length: usize) -> Vec<u8> {
    let mut buffer = vec![0; length];
    let count = File::open(path).unwrap().read_at(&mut buffer, offset).unwrap();
    buffer.truncate(count);
    buffer
}

fn check_sees(reader: &CachedReader, path: &Path, offset: u64, expected: &[u8], what: &str) {
    let length = expected.len();
    let seen = [
        ("read", reader.read(offset, length)),
        ("mmap", reader.mapped(offset as usize, length)),
        ("reopen", reopened(path, offset, length)),
    ];
    for (how, got) in seen {
        if got != expected {
            let at = got.iter().zip(expected).position(|(a, b)| a != b).unwrap_or(got.len());
            panic!(
                "{how} after {what}: {} bytes at {offset}, byte {at} is {:?}, expected {:?}",
                got.len(),
                got.get(at),
                expected.get(at)
            );
        }
    }
}

#[test]
fn a_cached_reader_sees_a_direct_write_through_another_handle() {
    let Some(mount) = kernel_cache_mount() else { return };
    let path = mount.point.join("direct");
    let reader = CachedReader::new(&path);
    let writer = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
    let layout = std::alloc::Layout::from_size_align(8192, 4096).unwrap();
    // SAFETY: a non-zero-sized layout; freed below with the same layout.
    let buffer = unsafe { std::alloc::alloc(layout) };
    // SAFETY: buffer holds 8192 bytes.
    let data = unsafe { std::slice::from_raw_parts_mut(buffer, 8192) };
    data.fill(b'D');
    writer.write_all_at(data, 4096).unwrap();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(buffer, layout) };
    check_sees(&reader, &path, 4096, &[b'D'; 8192], "a direct write");
    check_sees(&reader, &path, 0, &[b'a'; 4096], "a direct write (untouched)");
    drop((reader, writer));
    mount.unmount();
}

/// generic/451's shape: an asynchronous (io_uring) direct write while a
/// buffered reader keeps reading the range. The kernel drops its cached
/// pages of the range before a direct write and, for a synchronous one,
/// after it, but not after an asynchronous one: pages the reader cached
/// while the write was in flight hold the old bytes unless the daemon has
/// invalidated them before it answers the write.
#[test]
fn a_cached_reader_sees_each_asynchronous_direct_write_once_it_completes() {
    const CHUNK: usize = 64 << 10;
    const CHUNKS: usize = 4;
    let Some(mount) = kernel_cache_mount() else { return };
    let path = mount.point.join("aio");
    std::fs::write(&path, vec![0u8; CHUNK * CHUNKS]).unwrap();
    let writer = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
    let reader = File::open(&path).unwrap();
    let layout = std::alloc::Layout::from_size_align(CHUNK, 4096).unwrap();
    // SAFETY: a non-zero-sized layout; freed below with the same layout.
    let buffer = unsafe { std::alloc::alloc(layout) };
    // SAFETY: buffer holds CHUNK bytes.
    let data = unsafe { std::slice::from_raw_parts_mut(buffer, CHUNK) };
    let mut ring = io_uring::IoUring::new(4).unwrap();
    let mut seen = vec![0u8; CHUNK];
    for round in 0..200u64 {
        let offset = (round % CHUNKS as u64) * CHUNK as u64;
        let fill = (round % 251) as u8 + 1;
        data.fill(fill);
        reader.read_exact_at(&mut seen, offset).unwrap();
        let write = io_uring::opcode::Write::new(
            io_uring::types::Fd(writer.as_raw_fd()),
            data.as_ptr(),
            CHUNK as u32,
        )
        .offset(offset)
        .build();
        // SAFETY: the buffer and the file outlive the write, which is
        // waited for below before either is touched again.
        unsafe { ring.submission().push(&write).unwrap() };
        ring.submit().unwrap();
        let written = loop {
            // The reader caches the range again while the write is in flight.
            reader.read_exact_at(&mut seen, offset).unwrap();
            if let Some(completion) = ring.completion().next() {
                break completion.result();
            }
        };
        assert_eq!(written, CHUNK as i32, "round {round}: the direct write");
        reader.read_exact_at(&mut seen, offset).unwrap();
        if let Some(stale) = seen.iter().position(|&byte| byte != fill) {
            panic!(
                "round {round}: byte {stale} of the range at {offset} reads {} after the \
                 asynchronous direct write of {fill} completed",
                seen[stale]
            );
        }
    }
    // SAFETY: allocated above with this layout; no write is in flight.
    unsafe { std::alloc::dealloc(buffer, layout) };
    drop((reader, writer));
    mount.unmount();
}

#[test]
fn a_cached_reader_sees_a_write_through_a_second_handle() {
    let Some(mount) = kernel_cache_mount() else { return };
    let path = mount.point.join("second");
    let reader = CachedReader::new(&path);
    let writer = OpenOptions::new().write(true).open(&path).unwrap();
    writer.write_all_at(&[b'w'; 100], 5000).unwrap();
    check_sees(&reader, &path, 5000, &[b'w'; 100], "a write through a second handle");
    drop((reader, writer));
    mount.unmount();
}

#[test]
fn a_cached_reader_sees_a_truncate_and_a_punched_hole() {
    let Some(mount) = kernel_cache_mount() else { return };
    let path = mount.point.join("space");
    let reader = CachedReader::new(&path);
    let writer = OpenOptions::new().write(true).open(&path).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on an open descriptor, no memory involved.
    let punched = unsafe { libc::fallocate(writer.as_raw_fd(), punch, 8192, 8192) };
    assert_eq!(punched, 0, "punch: {}", std::io::Error::last_os_error());
    check_sees(&reader, &path, 8192, &[0; 8192], "a punched hole");
    // Shrink, then grow back: the cut-off tail reads as zeros.
    writer.set_len(20000).unwrap();
    writer.set_len(FILE_BYTES as u64).unwrap();
    check_sees(&reader, &path, 20000, &vec![0; FILE_BYTES - 20000], "a truncate");
    check_sees(&reader, &path, 16384, &[b'a'; 20000 - 16384], "a truncate (kept)");
    drop((reader, writer));
    mount.unmount();
}

#[test]
fn a_cached_reader_sees_changes_by_a_library_user_of_the_volume() {
    let Some(mount) = kernel_cache_mount() else { return };
    let path = mount.point.join("library");
    let reader = CachedReader::new(&path);
    let ino = std::fs::metadata(&path).unwrap().ino();
    let file = mount.volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&[b'L'; 3000], 10000).unwrap();
    check_sees(&reader, &path, 10000, &[b'L'; 3000], "a library write");
    // A size change the kernel never saw: a longer file, then a shorter one.
    file.write_at(b"tail", FILE_BYTES as u64).unwrap();
    assert!(reader.read(FILE_BYTES as u64 - 2, 100) == b"aatail", "read past the old end");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_BYTES as u64 + 4);
    file.set_len(40000).unwrap();
    file.set_len(FILE_BYTES as u64).unwrap();
    check_sees(&reader, &path, 40000, &vec![0; FILE_BYTES - 40000], "a library truncate");
    // A direct library write too.
    let direct = mount.volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let mut buffer = foliofs::dev::AlignedBuf::zeroed(4096);
    buffer.fill(b'X');
    direct.write_at(&buffer, 0).unwrap();
    check_sees(&reader, &path, 0, &[b'X'; 4096], "a direct library write");
    direct.close().unwrap();
    file.close().unwrap();
    drop(reader);
    mount.unmount();
}

fn fio(directory: &Path, args: &[&str]) {
    let directory = format!("--directory={}", directory.display());
    let mut all =
        vec![directory.as_str(), "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0"];
    all.extend_from_slice(args);
    let output = Command::new("fio").args(&all).output().expect("fio (apt-get install fio)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "fio {all:?} failed:\n{text}");
    assert!(!text.contains("verify:"), "fio reported a verify failure:\n{text}");
}

#[test]
fn fio_verifies_buffered_and_mixed_direct_buffered_io() {
    let Some(mount) = kernel_cache_mount() else { return };
    let dir = &mount.point;
    // Buffered random reads and writes from two jobs, verified.
    fio(dir, &["--name=kernelcache", "--rw=randrw", "--bs=3k", "--size=8M", "--numjobs=2"]);
    fio(dir, &["--name=mmap", "--ioengine=mmap", "--rw=randwrite", "--bs=4k", "--size=4M"]);
    // One file written and verified buffered (its pages stay cached), then
    // rewritten direct with another pattern, then verified buffered again:
    // the kernel's kept pages must not answer.
    let shared = ["--filename=mixed", "--size=4M", "--bs=16k", "--rw=write"];
    let buffered_a = [&shared[..], &["--name=a", "--verify_pattern=0xaa"]].concat();
    fio(dir, &buffered_a);
    let direct_b = [&shared[..], &["--name=b", "--direct=1", "--verify_pattern=0xbb"]].concat();
    fio(dir, &direct_b);
    let check_b = [&shared[..], &["--name=b", "--verify_pattern=0xbb", "--verify_only"]].concat();
    fio(dir, &check_b);
    // Direct writes (each invalidating the range) racing buffered readers
    // and a mapping of the same pages, whose page locks the kernel holds
    // while it waits for the daemon: must finish, not deadlock.
    let directory = format!("--directory={}", dir.display());
    let race = [
        directory.as_str(),
        "--filename=mixed",
        "--size=4M",
        "--bs=4k",
        "--number_ios=4000",
        "--name=direct",
        "--direct=1",
        "--rw=randwrite",
        "--ioengine=libaio",
        "--iodepth=8",
        "--name=buffered",
        "--rw=randread",
        "--name=mapped",
        "--ioengine=mmap",
        "--rw=randread",
    ];
    let output = Command::new("fio").args(race).output().expect("fio");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    mount.unmount();
}

#[test]
fn a_listing_carries_each_entrys_attributes_and_sees_library_changes() {
    let Some(mount) = kernel_cache_mount() else { return };
    let dir = mount.point.join("listed");
    std::fs::create_dir(&dir).unwrap();
    for index in 0..300 {
        std::fs::write(dir.join(format!("f{index}")), vec![b'x'; index]).unwrap();
    }
    let sizes = |dir: &Path| -> Vec<(String, u64)> {
        let mut sizes: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                (entry.file_name().into_string().unwrap(), entry.metadata().unwrap().len())
            })
            .collect();
        sizes.sort();
        sizes
    };
    let mut expected: Vec<_> = (0..300).map(|index| (format!("f{index}"), index as u64)).collect();
    expected.sort();
    assert_eq!(sizes(&dir), expected);
    // A library user grows one file: stat (the kernel cached its
    // attributes from the listing) and the next listing show its new size.
    let ino = std::fs::metadata(dir.join("f7")).unwrap().ino();
    let file = mount.volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(b"grown", 1000).unwrap();
    file.close().unwrap();
    assert_eq!(
        std::fs::metadata(dir.join("f7")).unwrap().len(),
        1005,
        "stat after a library write"
    );
    let f7 = expected.iter_mut().find(|(name, _)| name == "f7").unwrap();
    f7.1 = 1005;
    assert_eq!(sizes(&dir), expected);
    mount.unmount();
}

#[test]
fn with_the_engines_cache_only_a_mapping_and_stat_see_a_library_write() {
    if skip_requested() {
        return;
    }
    let mount = InProcessMount::new(256 << 20, "page_cache=engine");
    let path = mount.point.join("engine");
    let reader = CachedReader::new(&path);
    let ino = std::fs::metadata(&path).unwrap().ino();
    let file = mount.volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&[b'E'; 4096], 8192).unwrap();
    file.write_at(b"end", FILE_BYTES as u64).unwrap();
    file.close().unwrap();
    check_sees(&reader, &path, 8192, &[b'E'; 4096], "a library write");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_BYTES as u64 + 3);
    drop(reader);
    mount.unmount();
}

/// The kernel keeps names and attributes for the default `attr_timeout`
/// (an hour), so what a library user of the volume changes must reach it at
/// once: a mode, a new name, an unlink, a directory renamed, a hard link's
/// count, and the size of a file the mount looked up but never opened.
/// (Each fails with the hour's timeout and no invalidation.)
#[test]
fn long_cached_names_and_attributes_see_a_library_users_changes_at_once() {
    if skip_requested() {
        return;
    }
    for mode in ["engine", "kernel", "writeback"] {
        let mount = InProcessMount::new(256 << 20, &format!("page_cache={mode}"));
        let volume = &mount.volume;
        let owner = foliofs::Owner { uid: 0, gid: 0 };
        let root = &mount.point;
        let what = |change: &str| format!("page_cache={mode}: after a library {change}");

        std::fs::write(root.join("a"), b"a").unwrap();
        assert_eq!(std::fs::metadata(root.join("a")).unwrap().mode() & 0o777, 0o644);
        let a = volume.inodes().lookup(1, b"a").unwrap().ino;
        let chmod = foliofs::SetAttr { mode: Some(0o600), ..foliofs::SetAttr::default() };
        volume.inodes().setattr(a, &chmod).unwrap();
        let seen = std::fs::metadata(root.join("a")).unwrap().mode() & 0o777;
        assert_eq!(seen, 0o600, "{}", what("chmod"));

        volume.inodes().link(a, 1, b"a2").unwrap();
        assert_eq!(std::fs::metadata(root.join("a")).unwrap().nlink(), 2, "{}", what("link"));
        volume.inodes().unlink(1, b"a").unwrap();
        assert!(!root.join("a").exists(), "{}", what("unlink"));
        assert_eq!(std::fs::metadata(root.join("a2")).unwrap().nlink(), 1, "{}", what("unlink"));

        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/x"), b"x").unwrap();
        assert!(root.join("d/x").exists());
        volume.inodes().rename(1, b"d", 1, b"e", foliofs::RenameFlags::default()).unwrap();
        assert!(!root.join("d/x").exists(), "{}", what("rename"));
        assert_eq!(std::fs::read(root.join("e/x")).unwrap(), b"x", "{}", what("rename"));

        let sized = volume.inodes().create(1, b"sized", 0o644, owner).unwrap().ino;
        assert_eq!(std::fs::metadata(root.join("sized")).unwrap().len(), 0, "{}", what("create"));
        let file = volume.inodes().open_file(sized, OpenFlags::READ_WRITE).unwrap();
        file.write_at(b"grown", 100).unwrap();
        file.close().unwrap();
        let size = std::fs::metadata(root.join("sized")).unwrap().len();
        // With writeback_cache the kernel keeps the size of every regular
        // file it holds as its own (fuse_get_cache_mask): a library user's
        // size change is not seen until the kernel lets the inode go.
        let expected = if mode == "writeback" { 0 } else { 105 };
        assert_eq!(size, expected, "{}", what("write to a file the mount never opened"));
        mount.unmount();
    }
}

/// `page_cache=writeback`: buffered writes stay in the kernel's cache until
/// written back, and still every other path sees what it must: a cached
/// reader and a mapping see a direct write, a punched hole, a truncate, a
/// second handle's write and a library user's write (within the size: the
/// kernel owns the size of a file it caches writes for, so a library user's
/// size change is not seen while the mount holds the inode); fsync leaves
/// the bytes in the engine; a write-only handle's partial page is read
/// from the daemon. O_DSYNC: the kernel writes the page back and sends
/// FSYNC (datasync), so each O_DSYNC write costs the engine's fdatasync (a
/// journal FUA or a flush), not seed 003's one FUA write of the data.
#[test]
fn writeback_cache_keeps_cached_readers_coherent_and_fsync_durable() {
    if skip_requested() {
        return;
    }
    let mount = InProcessMount::new(256 << 20, "page_cache=writeback");
    let path = mount.point.join("wb");
    let reader = CachedReader::new(&path);
    let ino = std::fs::metadata(&path).unwrap().ino();

    // A write-only handle writing part of a page: the kernel reads the
    // rest of the page through it first.
    let writer = OpenOptions::new().write(true).open(&path).unwrap();
    writer.write_all_at(b"partial", 5000).unwrap();
    let mut expected = vec![b'a'; FILE_BYTES];
    expected[5000..5007].copy_from_slice(b"partial");
    check_sees(&reader, &path, 0, &expected, "a second handle's write");
    writer.sync_all().unwrap();
    let library = mount.volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let mut engine_bytes = vec![0; FILE_BYTES];
    assert_eq!(library.read_at(&mut engine_bytes, 0).unwrap(), FILE_BYTES);
    assert!(engine_bytes == expected, "the engine holds other bytes after fsync");
    library.close().unwrap();

    // A direct write through the mount.
    let direct = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    // SAFETY: a non-zero-sized layout; freed below with the same layout.
    let buffer = unsafe { std::alloc::alloc(layout) };
    // SAFETY: buffer holds 4096 bytes.
    let data = unsafe { std::slice::from_raw_parts_mut(buffer, 4096) };
    data.fill(b'D');
    direct.write_all_at(data, 8192).unwrap();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(buffer, layout) };
    expected[8192..12288].fill(b'D');
    check_sees(&reader, &path, 0, &expected, "a direct write");

    // A library user's write within the size.
    let file = mount.volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    file.write_at(&[b'L'; 3000], 20000).unwrap();
    file.close().unwrap();
    expected[20000..23000].fill(b'L');
    check_sees(&reader, &path, 0, &expected, "a library write");

    // A punched hole and a truncate through the mount.
    let handle = OpenOptions::new().write(true).open(&path).unwrap();
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on an open descriptor, no memory passed.
    assert_eq!(unsafe { libc::fallocate(handle.as_raw_fd(), mode, 32768, 4096) }, 0);
    expected[32768..36864].fill(0);
    check_sees(&reader, &path, 0, &expected, "a punched hole");
    handle.set_len(40000).unwrap();
    handle.set_len(FILE_BYTES as u64).unwrap();
    expected[40000..].fill(0);
    check_sees(&reader, &path, 0, &expected, "a truncate");

    // O_DSYNC: durable at return, through writeback and FSYNC.
    let before = mount.volume.device().stats();
    let dsync = OpenOptions::new().write(true).custom_flags(libc::O_DSYNC).open(&path).unwrap();
    dsync.write_all_at(&[b'S'; 4096], 0).unwrap();
    let stats = mount.volume.device().stats().since(&before);
    assert!(stats.write_requests >= 1, "an O_DSYNC write returned with nothing written");
    assert!(
        stats.fua_writes + stats.flush_requests >= 1,
        "an O_DSYNC write returned without a FUA write or a flush: {stats:?}"
    );
    drop((dsync, handle, direct, writer, reader));
    mount.unmount();
}
