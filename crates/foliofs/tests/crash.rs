//! Crash recovery guards for specific orderings, on the fault-injecting
//! device, each on 1 KiB, 4 KiB and 64 KiB blocks: freed blocks are reused
//! only after their free is durable, shifted blocks are overwritten only
//! after the shift is durable, buffered appends recover as exact prefixes,
//! syncfs waits for a writeback the flusher already started, an O_DSYNC
//! direct write past the on-disk size is durable, and so is an O_DSYNC
//! overwrite of blocks whose allocation is not yet committed, inode flags
//! are one value they had (the fsynced one or later), and an unnamed
//! (O_TMPFILE) file never outlives a crash. Random workloads crashed at every durability point are the
//! `foliofs-check` crate's (`foliofs crashtest`, and its CI slice in
//! `crates/foliofs-check/tests/crashtest.rs`).

#[macro_use]
mod common;

use std::collections::BTreeMap;

use foliofs::dev::fault::Keep;
use foliofs::FallocateMode;
use foliofs::{InodeKind, OpenFlags, Volume};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{
    new_volume_with_journal, new_volume_with_options, open_image, options, owner, pattern, ROOT,
};

const VOLUME_BYTES: u64 = 8 << 20;
/// A small journal wraps and fills within one test, so checkpoints and
/// replay across the wrap are exercised.
const JOURNAL_BYTES: u64 = 64 << 10;

block_size_tests!(
    freed_blocks_are_reused_only_after_their_free_is_durable,
    buffered_appends_recover_as_exact_prefixes,
    shifted_blocks_are_overwritten_only_after_the_shift_is_durable,
    syncfs_waits_for_writeback_already_in_progress,
    dsync_direct_write_past_the_disk_size_is_durable,
    dsync_direct_overwrite_commits_the_metadata_it_depends_on,
    inode_flags_and_unnamed_files_recover_at_every_crash_point,
    range_writeback_moves_the_disk_size_only_over_data_on_disk,
);

/// What a recovered tree holds: path -> (ino, kind, content for files).
type Tree = BTreeMap<String, (u64, InodeKind, Vec<u8>)>;

fn read_tree(volume: &Volume) -> Tree {
    let mut tree = Tree::new();
    let mut stack = vec![(String::new(), ROOT)];
    while let Some((path, dir)) = stack.pop() {
        for entry in volume.inodes().readdir(dir).expect("readdir") {
            let child = format!("{path}/{}", String::from_utf8_lossy(&entry.name));
            let content = match entry.kind {
                InodeKind::File => {
                    let size = volume.inodes().getattr(entry.ino).expect("getattr").size as usize;
                    let mut content = vec![0u8; size];
                    let file = volume.inodes().open_file(entry.ino, OpenFlags::READ).expect("open");
                    assert_eq!(file.read_at(&mut content, 0).expect("read"), size);
                    content
                }
                InodeKind::Dir => {
                    stack.push((child.clone(), entry.ino));
                    Vec::new()
                }
                InodeKind::Symlink
                | InodeKind::Fifo
                | InodeKind::Socket
                | InodeKind::CharDevice
                | InodeKind::BlockDevice => Vec::new(),
            };
            tree.insert(child, (entry.ino, entry.kind, content));
        }
    }
    tree
}

/// Fills the volume, then unlinks a synced file and writes a new one that can
/// only use the freed blocks. Whatever the crash keeps, the old file (if it
/// is still there) must show its own data and the new one only its own.
fn freed_blocks_are_reused_only_after_their_free_is_durable(block_bytes: u32) {
    let (device, volume) = new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
    let old_data = pattern(1, 40 << 10);
    let old = volume.inodes().create(ROOT, b"old", 0o644, owner()).unwrap();
    volume.inodes().open_file(old.ino, OpenFlags::WRITE).unwrap().write_at(&old_data, 0).unwrap();
    let filler = volume.inodes().create(ROOT, b"filler", 0o644, owner()).unwrap();
    let filler_file = volume.inodes().open_file(filler.ino, OpenFlags::WRITE).unwrap();
    let mut filled = 0u64;
    for chunk in [1 << 20, block_bytes as usize] {
        while filler_file.write_at(&vec![0x5A; chunk], filled).is_ok_and(|written| written == chunk)
        {
            filled += chunk as u64;
        }
    }
    drop(filler_file);
    volume.sync().unwrap();
    assert!(volume.statfs().available_blocks < 10, "the volume is full");
    device.reset_log();

    volume.inodes().unlink(ROOT, b"old").unwrap();
    let new_data = pattern(2, 40 << 10);
    let new = volume.inodes().create(ROOT, b"new", 0o644, owner()).unwrap();
    let written = volume
        .inodes()
        .open_file(new.ino, OpenFlags::WRITE)
        .unwrap()
        .write_at(&new_data, 0)
        .unwrap();
    assert_eq!(written, new_data.len(), "the freed space is reused after a commit");

    for cut in 0..=device.log_len() {
        for keep in [Keep::All, Keep::Nothing] {
            let image = device.crash_image(cut, &|_| keep.clone());
            let (_, recovered) = open_image(image).unwrap();
            let tree = read_tree(&recovered);
            if let Some((_, _, content)) = tree.get("/old") {
                assert_eq!(content, &old_data, "crash at {cut}: the old file shows foreign data");
            }
            if let Some((_, _, content)) = tree.get("/new") {
                let own =
                    content.iter().zip(&new_data).all(|(byte, own)| byte == own || *byte == 0);
                assert!(own, "crash at {cut}: the new file shows foreign data");
            }
        }
    }
}

/// A collapse moves blocks down without moving their data, and an insert
/// moves them up; a write into a moved block then overwrites it in place.
/// Whatever a crash keeps, the data written at the new offset must never
/// show at the block's old one: the file is either as before the shift or
/// as after it, with the moved block holding its old or its new data.
fn shifted_blocks_are_overwritten_only_after_the_shift_is_durable(block_bytes: u32) {
    let block = block_bytes as usize;
    for mode in [FallocateMode::CollapseRange, FallocateMode::InsertRange] {
        let (device, volume) =
            new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
        let ino = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
        let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
        let before = pattern(1, 8 * block);
        file.write_at(&before, 0).unwrap();
        file.sync_all().unwrap();
        device.reset_log();
        // Blocks 4.. move to 2.. (collapse) or to 6.. (insert); the first of
        // them is then overwritten at its new place.
        file.fallocate(mode, 2 * block as u64, 2 * block as u64).unwrap();
        let moved_to = if mode == FallocateMode::CollapseRange { 2 } else { 6 };
        let mut after = before.clone();
        common::apply_fallocate_to_model(&mut after, mode, 2 * block, 2 * block);
        let shifted = after.clone();
        let new_data = pattern(2, block);
        after[moved_to * block..(moved_to + 1) * block].copy_from_slice(&new_data);
        file.write_at(&new_data, (moved_to * block) as u64).unwrap();
        volume.sync().unwrap();
        for cut in 0..=device.log_len() {
            for keep in [Keep::All, Keep::Nothing] {
                let (_, recovered) =
                    open_image(device.crash_image(cut, &|_| keep.clone())).unwrap();
                let tree = read_tree(&recovered);
                let (_, _, content) = &tree["/f"];
                let context = format!("{mode:?}, crash at {cut} of {}", device.log_len());
                if content.len() == before.len() {
                    assert!(*content == before, "{context}: the unshifted file changed");
                } else {
                    assert!(
                        *content == after || *content == shifted,
                        "{context}: the shifted file has foreign data"
                    );
                }
            }
        }
    }
}

/// Buffered appends with fsync now and then, and the flusher writing back in
/// between: whatever the crash keeps, each file is an exact prefix of what
/// was appended to it, at least as long as its last fsync. Zeros inside the
/// size would mean the size covered blocks whose write never completed.
fn buffered_appends_recover_as_exact_prefixes(block_bytes: u32) {
    let seeds = if block_bytes == 4096 { 0..6u64 } else { 0..3 };
    for seed in seeds {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (device, volume) =
            new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
        let names = ["a", "b", "c"];
        let inos: Vec<u64> = names
            .iter()
            .map(|name| volume.inodes().create(ROOT, name.as_bytes(), 0o644, owner()).unwrap().ino)
            .collect();
        let handles: Vec<_> = inos
            .iter()
            .map(|&ino| volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap())
            .collect();
        volume.sync().unwrap();
        device.reset_log();
        let mut contents: Vec<Vec<u8>> = vec![Vec::new(); names.len()];
        // (log position, file, length durable from there on)
        let mut synced: Vec<(usize, usize, usize)> = Vec::new();
        for step in 0..40u64 {
            let file = rng.random_range(0..names.len());
            match rng.random_range(0..10) {
                0..=6 => {
                    let data = pattern(seed * 1000 + step, rng.random_range(1..20_000));
                    let pos = contents[file].len() as u64;
                    assert_eq!(handles[file].write_at(&data, pos).unwrap(), data.len());
                    contents[file].extend_from_slice(&data);
                }
                7..=8 => {
                    handles[file].sync_all().unwrap();
                    synced.push((device.log_len(), file, contents[file].len()));
                }
                // What the flusher would do at any moment.
                _ => volume.sync().unwrap(),
            }
        }
        let mut points = device.durability_points();
        points.extend(synced.iter().map(|&(cut, _, _)| cut));
        points.sort_unstable();
        points.dedup();
        for &cut in &points {
            for variant in 0..3 {
                let image = device.crash_image(cut, &|_| match variant {
                    0 => Keep::Nothing,
                    1 => Keep::All,
                    _ => Keep::Sectors((0..64).map(|sector| sector % 3 != 0).collect()),
                });
                let (_, recovered) = open_image(image).unwrap();
                for (file, name) in names.iter().enumerate() {
                    let ino = recovered.inodes().lookup(ROOT, name.as_bytes()).unwrap().ino;
                    let size = recovered.inodes().getattr(ino).unwrap().size as usize;
                    let mut found = vec![0u8; size];
                    let handle = recovered.inodes().open_file(ino, OpenFlags::READ).unwrap();
                    assert_eq!(handle.read_at(&mut found, 0).unwrap(), size);
                    let context =
                        format!("seed {seed}, crash at {cut}, variant {variant}, file {name}");
                    assert!(size <= contents[file].len(), "{context}: size {size} past the data");
                    assert!(
                        found == contents[file][..size],
                        "{context}: not a prefix of the appends ({size} bytes)"
                    );
                    let durable = synced
                        .iter()
                        .filter(|&&(at, synced_file, _)| at <= cut && synced_file == file)
                        .map(|&(_, _, length)| length)
                        .max()
                        .unwrap_or(0);
                    assert!(size >= durable, "{context}: {size} bytes, but {durable} were fsynced");
                }
            }
        }
    }
}

/// A writer over the dirty limit wakes the flusher, which takes the file's
/// dirty bits and writes them back. A syncfs arriving meanwhile finds the
/// file clean, and used to return before that writeback (and the records
/// converting its blocks and moving the size) was durable: a crash right
/// after it showed the file empty. Found by `foliofs -o dirty_bytes=64k
/// crashtest` (the synced ballast file lost its size).
fn syncfs_waits_for_writeback_already_in_progress(block_bytes: u32) {
    let options = foliofs::VolumeOptions { dirty_bytes: Some(64 << 10), ..common::options() };
    for round in 0..3u64 {
        let (device, volume) = common::new_volume_with_options(
            VOLUME_BYTES,
            block_bytes,
            Some(JOURNAL_BYTES),
            &options,
        );
        let data = pattern(round, 5 << 20);
        let ino = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
        assert_eq!(file.write_at(&data, 0).unwrap(), data.len());
        volume.sync().unwrap();
        let image = device.crash_image(device.log_len(), &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let tree = read_tree(&recovered);
        assert!(tree["/f"].2 == data, "round {round}: the synced file is not all there");
    }
}

/// A direct write inside the size callers see but past the on-disk size (a
/// buffered write further on not yet written back) left the on-disk size
/// where it was, so its data sat past the size on disk: with O_DSYNC it
/// returned, and a crash right after showed the file empty. Found by
/// `foliofs crashtest` with O_DSYNC writes (seed 4006, 4 KiB blocks).
fn dsync_direct_write_past_the_disk_size_is_durable(block_bytes: u32) {
    let (device, volume) = new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
    let ino = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    let block = block_bytes as usize;
    // Buffered, past where the direct write goes, and not written back.
    let far = pattern(1, 1000);
    let buffered = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
    assert_eq!(buffered.write_at(&far, 4 * block as u64 + 17).unwrap(), far.len());
    for (round, pos) in [(2u64, 2 * block), (3, block / 2)] {
        // Whole blocks, then sectors (sub-block where blocks are larger).
        let length = if round == 2 { block } else { 512 };
        let data = pattern(round, length);
        let direct =
            volume.inodes().open_file(ino, OpenFlags::WRITE.with_direct().with_dsync()).unwrap();
        let buffer = foliofs::dev::AlignedBuf::from_slice(&data);
        assert_eq!(direct.write_at(&buffer, pos as u64).unwrap(), length);
        let image = device.crash_image(device.log_len(), &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let content = &read_tree(&recovered)["/f"].2;
        assert!(
            content.len() >= pos + length && content[pos..pos + length] == data[..],
            "round {round}: {} bytes recovered, the O_DSYNC write ended at {}",
            content.len(),
            pos + length
        );
    }
}

/// An O_DSYNC direct overwrite of Written blocks went out as one FUA write
/// and returned, though what makes those blocks the file's (the
/// conversion by the writeback that ran for this very write, or by an
/// earlier plain direct write, and the file's creation) was not committed:
/// a crash right after lost the file. Found by `foliofs crashtest` (seed
/// 11231192, 1 KiB blocks: a buffered write, then an O_DSYNC direct write
/// of sectors inside it).
fn dsync_direct_overwrite_commits_the_metadata_it_depends_on(block_bytes: u32) {
    let block = block_bytes as usize;
    for round in 0..2u64 {
        let (device, volume) =
            new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
        let ino = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
        let first = pattern(round + 10, 3 * block);
        if round == 0 {
            let buffered = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
            assert_eq!(buffered.write_at(&first, 0).unwrap(), first.len());
        } else {
            let direct = volume.inodes().open_file(ino, OpenFlags::WRITE.with_direct()).unwrap();
            let buffer = foliofs::dev::AlignedBuf::from_slice(&first);
            assert_eq!(direct.write_at(&buffer, 0).unwrap(), first.len());
        }
        // Sectors inside the second block (whole blocks at 512 B blocks
        // would be the same path).
        let data = pattern(round + 20, 512);
        let pos = block + block / 2 - block / 2 % 512;
        let dsync =
            volume.inodes().open_file(ino, OpenFlags::WRITE.with_direct().with_dsync()).unwrap();
        let buffer = foliofs::dev::AlignedBuf::from_slice(&data);
        assert_eq!(dsync.write_at(&buffer, pos as u64).unwrap(), data.len());
        let image = device.crash_image(device.log_len(), &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let tree = read_tree(&recovered);
        let content =
            &tree.get("/f").unwrap_or_else(|| panic!("round {round}: the file is lost")).2;
        assert!(
            content.len() >= pos + data.len() && content[pos..pos + data.len()] == data[..],
            "round {round}: {} bytes recovered, the O_DSYNC write ended at {}",
            content.len(),
            pos + data.len()
        );
    }
}

/// chattr flags are one record: after a crash a file has flags it had, at
/// least those of its last fsync. An unnamed file open at the crash, its
/// data fsynced, is an orphan the recovery mount frees (fsck-clean).
fn inode_flags_and_unnamed_files_recover_at_every_crash_point(block_bytes: u32) {
    use foliofs::format::{INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE, INODE_FLAG_NODUMP};
    let (device, volume) = new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
    let file = volume.inodes().create(ROOT, b"f", 0o644, owner()).unwrap().ino;
    volume.sync().unwrap();
    device.reset_log();

    volume.inodes().set_flags(file, INODE_FLAG_NODUMP, true).unwrap();
    volume.inodes().set_flags(file, INODE_FLAG_IMMUTABLE, true).unwrap();
    volume.inodes().fsync_inode(file, false).unwrap();
    let fsynced_at = device.log_len();
    let temp =
        volume.inodes().create_unnamed(ROOT, 0o600, owner(), OpenFlags::READ_WRITE, true).unwrap();
    temp.write_at(&pattern(3, 64 << 10), 0).unwrap();
    temp.sync_all().unwrap();
    volume.inodes().set_flags(file, INODE_FLAG_APPEND, true).unwrap();
    volume.sync().unwrap();
    let inodes_before = volume.statfs().inodes;

    for cut in 0..=device.log_len() {
        for keep in [Keep::All, Keep::Nothing] {
            let image = device.crash_image(cut, &|_| keep.clone());
            let (_, recovered) = open_image(image).unwrap();
            let flags = recovered.inodes().flags(file).unwrap();
            let allowed: &[u32] = if cut >= fsynced_at {
                &[INODE_FLAG_IMMUTABLE, INODE_FLAG_APPEND]
            } else {
                &[0, INODE_FLAG_NODUMP, INODE_FLAG_IMMUTABLE, INODE_FLAG_APPEND]
            };
            assert!(allowed.contains(&flags), "crash at {cut}: flags {flags:#x}");
            assert!(
                recovered.inodes().getattr(temp.ino()).is_err(),
                "crash at {cut}: the unnamed file"
            );
            assert!(recovered.statfs().inodes < inodes_before, "crash at {cut}: its inode");
            let report = foliofs::fsck::check(recovered.device().clone());
            assert!(report.is_clean(), "crash at {cut}: {:?}", report.problems);
        }
    }
}

/// A writeback of part of a file (here fallocate's, of its last block)
/// must not move the on-disk size over an earlier block whose new bytes are
/// only in memory: a crash after the size's commit would show old bytes
/// inside the size, a hole before later data in an append-only log. Two
/// rules keep it, either enough here (the test fails without both): such a
/// writeback starts at the on-disk size, and a size moves only up to the
/// first block still dirty outside the batch being recorded (the race of
/// the same kind inside one writeback is
/// `appends_racing_writeback_on_a_slow_device_...`).
fn range_writeback_moves_the_disk_size_only_over_data_on_disk(block_bytes: u32) {
    let block = u64::from(block_bytes);
    let mut volume_options = options();
    // One block per folio: the two blocks are written back separately.
    volume_options.apply_list(&format!("folio_max={block_bytes}")).unwrap();
    let (device, volume) =
        new_volume_with_options(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES), &volume_options);
    let log = volume.inodes().create(ROOT, b"log", 0o644, owner()).unwrap();
    let other = volume.inodes().create(ROOT, b"other", 0o644, owner()).unwrap();
    let log_file = volume.inodes().open_file(log.ino, OpenFlags::READ_WRITE).unwrap();
    let other_file = volume.inodes().open_file(other.ino, OpenFlags::READ_WRITE).unwrap();
    // Half of block 0 on disk, fsynced.
    let first = pattern(1, (block / 2) as usize);
    log_file.write_at(&first, 0).unwrap();
    log_file.sync_all().unwrap();
    // The rest of block 0 and half of block 1, in memory.
    let second = pattern(2, block as usize);
    log_file.write_at(&second, block / 2).unwrap();
    // Block 1 alone written back (fallocate writes back its range first).
    log_file.fallocate(FallocateMode::Allocate { keep_size: true }, block, block).unwrap();
    // Another file's fdatasync commits the journal, the log's records too.
    other_file.write_at(b"x", 0).unwrap();
    other_file.sync_data().unwrap();

    let image = device.crash_image(device.log_len(), &|_| Keep::Nothing);
    let (_, recovered) = open_image(image).unwrap();
    let size = recovered.inodes().getattr(log.ino).unwrap().size as usize;
    let mut content = vec![0; size];
    let file = recovered.inodes().open_file(log.ino, OpenFlags::READ).unwrap();
    assert_eq!(file.read_at(&mut content, 0).unwrap(), size);
    let mut appended = first.clone();
    appended.extend_from_slice(&second);
    assert!(size >= first.len(), "the fsynced half is kept ({size} bytes)");
    assert!(
        content == appended[..size],
        "{size} bytes are not a prefix of the appends (first difference at {:?})",
        content.iter().zip(&appended).position(|(found, wanted)| found != wanted)
    );
}

/// A device whose writes take a while, so that a writer can change a
/// folio between two batches of one writeback.
struct SlowWrites {
    inner: std::sync::Arc<foliofs::dev::FaultDev>,
    delay: std::time::Duration,
}

impl foliofs::dev::RawDev for SlowWrites {
    fn read_at(&self, offset: u64, buffers: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<()> {
        self.inner.read_at(offset, buffers)
    }
    fn write_at(
        &self,
        offset: u64,
        buffers: &[std::io::IoSlice<'_>],
        fua: bool,
    ) -> std::io::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.write_at(offset, buffers, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn submit(&self, request: foliofs::dev::DevRequest, done: foliofs::dev::DevCallback) {
        std::thread::sleep(self.delay);
        self.inner.submit(request, done)
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn logical_block_bytes(&self) -> u32 {
        self.inner.logical_block_bytes()
    }
}

/// Appends into the partial last block race with writeback on a slow device
/// (one block per folio, syncfs in a loop): every crash point shows the log
/// as a prefix of what was appended, never a block of old bytes inside its
/// size (found by `crashtest --over-nbd`, in a few runs in a hundred: a block
/// written back, an append into it and past it, then the next batch of the
/// same writeback moved the size; without the fix this test fails in most
/// runs).
#[test]
fn appends_racing_writeback_on_a_slow_device_recover_as_prefixes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let raw = Arc::new(foliofs::dev::FaultDev::from_image(
        vec![common::GARBAGE_BYTE; VOLUME_BYTES as usize],
        512,
    ));
    let slow = Arc::new(SlowWrites {
        inner: Arc::clone(&raw),
        delay: std::time::Duration::from_micros(300),
    });
    let device = Arc::new(foliofs::dev::Device::new(slow, foliofs::dev::FuaMode::Native));
    let mkfs = foliofs::vfs::MkfsOptions {
        block_bytes: 4096,
        journal_bytes: Some(JOURNAL_BYTES),
        metadata_bytes: None,
        metadata_index: false,
        root_owner: owner(),
    };
    Volume::format(&device, &mkfs).unwrap();
    let mut volume_options = options();
    volume_options.apply_list("folio_max=4k").unwrap();
    let volume = Volume::open_device(device, &volume_options).unwrap();
    let log = volume.inodes().create(ROOT, b"log", 0o644, owner()).unwrap();
    let handle = volume.inodes().open_file(log.ino, OpenFlags::WRITE).unwrap();
    volume.sync().unwrap();
    raw.reset_log();
    let appending = AtomicBool::new(true);
    let mut appended = Vec::new();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while appending.load(Ordering::Relaxed) {
                volume.sync().unwrap();
            }
        });
        for step in 0..600u64 {
            // A block and a half: into the partial last block and past it.
            let data = pattern(step, 6000);
            handle.write_at(&data, appended.len() as u64).unwrap();
            appended.extend_from_slice(&data);
            std::thread::sleep(std::time::Duration::from_micros(50 * (step % 5)));
        }
        appending.store(false, Ordering::Relaxed);
    });
    volume.sync().unwrap();
    let mut points = raw.durability_points();
    points.dedup();
    assert!(points.len() > 20, "{} durability points", points.len());
    for &cut in &points {
        let image = raw.crash_image(cut, &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let size = recovered.inodes().getattr(log.ino).unwrap().size as usize;
        let mut content = vec![0; size];
        let file = recovered.inodes().open_file(log.ino, OpenFlags::READ).unwrap();
        assert_eq!(file.read_at(&mut content, 0).unwrap(), size);
        assert!(
            content == appended[..size],
            "cut {cut}: {size} bytes are not a prefix of the appends (first difference at {:?})",
            content.iter().zip(&appended).position(|(found, wanted)| found != wanted)
        );
    }
}
