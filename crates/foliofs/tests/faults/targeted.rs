//! Targeted tests: one fault at a chosen request, and what each promise
//! in the crate doc says must hold after it.

use super::*;

// ---------------------------------------------------------------------------
// Targeted tests
// ---------------------------------------------------------------------------

/// Failed writeback: EIO at the next fsync of every open handle, once each;
/// the blocks stay dirty, the retry lands them, and a remount shows them.
pub(crate) fn writeback_errors_reach_every_handle_once_and_nothing_is_dropped(block_bytes: u32) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let areas = areas(&volume);
    let ino = create(&volume, "f");
    let buffered = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let reader = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    let data = pattern(1, 3 * block_bytes as usize + 77);
    buffered.write_at(&data, 0).unwrap();
    buffered.sync_all().unwrap();
    let update = pattern(2, block_bytes as usize + 10);
    buffered.write_at(&update, 100).unwrap();
    let mut expected = data.clone();
    expected[100..100 + update.len()].copy_from_slice(&update);

    raw.add_rule(FaultRule::next(FaultOp::Write, 2).in_range(areas.data.clone()));
    let error = expect_eio(buffered.sync_data(), "fdatasync over a failing data write");
    assert!(error.to_string().contains("writeback"), "names what failed: {error}");
    // The second failure is consumed by this retry, which the handle has
    // not seen yet.
    expect_eio(buffered.sync_all(), "the retry fails too");
    buffered.sync_all().expect("the retry succeeds; both failures were reported");
    buffered.sync_all().unwrap();
    // Every other handle hears of it exactly once, whatever its mode.
    expect_eio(direct.sync_all(), "the direct handle");
    direct.sync_all().unwrap();
    expect_eio(reader.sync_data(), "the read-only handle");
    reader.sync_data().unwrap();
    let later = volume.inodes().open_file(ino, OpenFlags::READ).unwrap();
    later.sync_all().expect("a handle opened after every report has nothing to hear");
    assert_eq!(read_all(&volume, ino), expected, "nothing was dropped from the cache");

    let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
    drop((buffered, direct, reader, later));
    drop(volume);
    let (_, volume) = open_image(image).unwrap();
    assert_eq!(read_all(&volume, ino), expected, "the retried data is durable");
    fsck_clean(volume.device(), "after the retry");
}

/// A direct write that fails returns EIO; its range reads as old or new
/// data, the rest of the file is untouched, and the volume stays writable.
pub(crate) fn direct_write_errors_fail_the_write_only(block_bytes: u32) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let areas = areas(&volume);
    let ino = create(&volume, "d");
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let block = block_bytes as usize;
    let old = pattern(3, 4 * block);
    file.write_at(&direct_buffer(&old), 0).unwrap();
    file.sync_all().unwrap();
    for (pos, length) in [(block, block), (0, 4 * block), (3 * block, 2 * block), (512, 1024)] {
        let new = pattern(pos as u64 + 9, length);
        raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(areas.data.clone()));
        expect_eio(file.write_at(&direct_buffer(&new), pos as u64), "direct write");
        raw.clear_rules();
        let now = read_all(&volume, ino);
        assert!(now.len() >= old.len() && now.len() <= old.len().max(pos + length));
        for (index, &byte) in now.iter().enumerate() {
            let was = old.get(index).copied().unwrap_or(0);
            let inside = (pos..pos + length).contains(&index);
            assert!(
                byte == was || (inside && byte == new[index - pos]),
                "byte {index} after a failed direct write at {pos}+{length}: {byte} (was {was})"
            );
        }
        // Put the old content back for the next round.
        file.set_len(old.len() as u64).unwrap();
        file.write_at(&direct_buffer(&old), 0).unwrap();
    }
    file.sync_all().unwrap();
    volume.inodes().create(ROOT, b"still-writable", 0o644, owner()).unwrap();
    drop(file);
    volume.close().unwrap();
    let (_, volume) = open_image(raw.image()).unwrap();
    assert_eq!(read_all(&volume, ino), old);
}

/// Everything a read-only volume must refuse, and what it must still do.
pub(crate) fn assert_read_only(volume: &Volume, ino: u64, expected: &[u8], block_bytes: u32) {
    let refusals: Vec<(&str, foliofs::Result<()>)> = vec![
        ("create", volume.inodes().create(ROOT, b"new", 0o644, owner()).map(|_| ())),
        ("mkdir", volume.inodes().mkdir(ROOT, b"newdir", 0o755, owner()).map(|_| ())),
        ("unlink", volume.inodes().unlink(ROOT, b"f")),
        ("open for writing", volume.inodes().open_file(ino, OpenFlags::WRITE).map(|_| ())),
        ("checkpoint", volume.checkpoint()),
    ];
    for (what, result) in refusals {
        let error = result.expect_err(what);
        assert_eq!(error.errno(), libc::EROFS, "{what}: {error}");
        assert_names_the_cause(&error);
    }
    assert!(volume.sync().is_err(), "syncfs fails");
    assert_eq!(read_all(volume, ino), expected, "reads still work");
    let direct = volume.inodes().open_file(ino, OpenFlags::READ.with_direct()).unwrap();
    let mut buffer = AlignedBuf::zeroed(block_bytes as usize);
    direct.read_at(&mut buffer, 0).expect("direct reads still work");
    assert_eq!(&buffer[..], &expected[..block_bytes as usize]);
}

/// Changes through handles opened before the volume turned read-only.
pub(crate) fn assert_handles_refuse(buffered: &File, direct: &File, block_bytes: u32) {
    let block = block_bytes as usize;
    let attempts: Vec<(&str, foliofs::Result<()>)> = vec![
        ("buffered write", buffered.write_at(b"late", 0).map(|_| ())),
        ("set_len", buffered.set_len(1)),
        ("fallocate", buffered.fallocate(FallocateMode::PunchHole, 0, block_bytes.into())),
        // An overwrite of written blocks changes no metadata, but the
        // volume promised to change nothing more.
        ("direct overwrite", direct.write_at(&AlignedBuf::zeroed(block), 0).map(|_| ())),
        (
            "asynchronous direct overwrite",
            foliofs::block_on(direct.write_at_async(AlignedBuf::zeroed(block), 0)).0.map(|_| ()),
        ),
    ];
    for (what, result) in attempts {
        let error = result.expect_err(what);
        assert_eq!(error.errno(), libc::EROFS, "{what}: {error}");
        assert_names_the_cause(&error);
    }
    for (what, result) in [("fsync", buffered.sync_all()), ("fdatasync", direct.sync_data())] {
        let error = result.expect_err(what);
        assert!([libc::EIO, libc::EROFS].contains(&error.errno()), "{what}: {error}");
    }
}

/// Files f (fsynced) and g (written, never synced) and both handles of f.
pub(crate) fn metadata_fault_setup(
    block_bytes: u32,
    journal_bytes: Option<u64>,
) -> (Arc<FaultDev>, Volume, Areas, u64, Vec<u8>, File, File) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, journal_bytes, &options());
    let areas = areas(&volume);
    let ino = create(&volume, "f");
    let buffered = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
    let data = pattern(5, 2 * block_bytes as usize + 300);
    buffered.write_at(&data, 0).unwrap();
    buffered.sync_all().unwrap();
    (raw, volume, areas, ino, data, buffered, direct)
}

/// After the fault: the image as it is and as a power cut leaves it mount
/// with the fsynced file intact and fsck clean.
pub(crate) fn assert_fsynced_survives(raw: &FaultDev, ino: u64, expected: &[u8]) {
    raw.clear_rules();
    for image in [raw.image(), raw.crash_image(raw.log_len(), &|_| Keep::Nothing)] {
        let (_, volume) = open_image(image).unwrap();
        assert_eq!(read_all(&volume, ino), expected, "the fsynced file survives");
        fsck_clean(volume.device(), "after a metadata fault");
        REMOUNTS_CHECKED.fetch_add(1, Ordering::Relaxed);
    }
}

/// A disk whose volatile cache is lost with a failed flush (what
/// `FaultDev::drop_cache_on_failed_flush` models): writes the engine
/// already issued vanish. The fsync whose flush failed reports EIO; a later
/// fsync either fails too or has really made the data durable (never Ok
/// over lost writes); what was fsynced before the failure is all there in
/// the image as it is and as a power cut leaves it, fsck-clean. Each round
/// fails a different flush of the fsync (the one before its journal write,
/// or later ones), and fsyncs through buffered, direct and O_DSYNC paths.
pub(crate) fn a_flush_failure_that_drops_the_disk_cache_loses_nothing_fsynced(block_bytes: u32) {
    let block = block_bytes as usize;
    for round in 0..6u64 {
        let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
        raw.drop_cache_on_failed_flush(true);
        let synced = create(&volume, "synced");
        let synced_data = pattern(round, 3 * block + 100);
        let handle = volume.inodes().open_file(synced, OpenFlags::READ_WRITE).unwrap();
        handle.write_at(&synced_data, 0).unwrap();
        handle.sync_all().unwrap();
        drop(handle);
        // Written, not yet durable: a buffered file, a direct one.
        let lost = create(&volume, "lost");
        let lost_data = pattern(round + 100, 2 * block + 7);
        let buffered = volume.inodes().open_file(lost, OpenFlags::READ_WRITE).unwrap();
        buffered.write_at(&lost_data, 0).unwrap();
        let direct_ino = create(&volume, "direct");
        let direct_data = pattern(round + 200, 2 * block);
        let direct =
            volume.inodes().open_file(direct_ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
        direct.write_at(&direct_buffer(&direct_data), 0).unwrap();
        let dropped_before = raw.writes_dropped();
        raw.add_rule(FaultRule::next(FaultOp::Flush, 1 + round % 3));
        let failed = if round < 3 { buffered.sync_all() } else { direct.sync_all() };
        expect_eio(failed, "fsync whose flush fails");
        assert!(raw.writes_dropped() > dropped_before, "round {round}: the cache was dropped");
        raw.clear_rules();
        // No fsync may now claim what the disk lost.
        let later = [buffered.sync_all(), direct.sync_all(), volume.sync()];
        let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        for (index, (ino, data)) in
            [(lost, &lost_data), (direct_ino, &direct_data)].iter().enumerate()
        {
            if later[index].is_ok() && later[2].is_ok() {
                assert_eq!(&read_all(&recovered, *ino), *data, "round {round}: fsync said durable");
            }
        }
        drop(recovered);
        drop((buffered, direct));
        for image in [raw.image(), raw.crash_image(raw.log_len(), &|_| Keep::Nothing)] {
            let (_, volume) = open_image(image).unwrap();
            assert_eq!(read_all(&volume, synced), synced_data, "round {round}: fsynced file");
            fsck_clean(volume.device(), "after a flush that dropped the cache");
            REMOUNTS_CHECKED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The case of `a_flush_failure_that_drops_the_disk_cache_loses_nothing_fsynced`
/// with nothing for the journal to commit: overwrites of written blocks
/// (buffered, and direct without FUA), whose fdatasync is the data write and
/// a flush alone. The flush fails and the disk loses the data; a later
/// fdatasync finds nothing dirty, and its own flush succeeds, but must not
/// report the lost overwrite durable.
pub(crate) fn an_overwrite_lost_with_the_disk_cache_is_never_reported_durable(block_bytes: u32) {
    let block = block_bytes as usize;
    for direct in [false, true] {
        let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
        let ino = create(&volume, "f");
        let first = pattern(1, 4 * block);
        let flags =
            if direct { OpenFlags::READ_WRITE.with_direct() } else { OpenFlags::READ_WRITE };
        let handle = volume.inodes().open_file(ino, flags).unwrap();
        handle.write_at(&direct_buffer(&first), 0).unwrap();
        handle.sync_all().unwrap();
        raw.drop_cache_on_failed_flush(true);
        let second = pattern(2, 4 * block);
        let dropped_before = raw.writes_dropped();
        raw.add_rule(FaultRule::next(FaultOp::Flush, 1));
        let written = handle.write_at(&direct_buffer(&second), 0);
        let failed = written.and_then(|_| handle.sync_data());
        expect_eio(failed, "the overwrite's fdatasync whose flush fails");
        assert!(raw.writes_dropped() > dropped_before, "direct {direct}: the cache was dropped");
        raw.clear_rules();
        let later = handle.sync_data();
        let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
        let (_, recovered) = open_image(image).unwrap();
        let on_disk = read_all(&recovered, ino);
        assert!(
            later.is_err() || on_disk == second,
            "direct {direct}: a later fdatasync returned Ok over the lost overwrite"
        );
        assert!(on_disk == first || on_disk == second, "direct {direct}: old or new data");
    }
}

pub(crate) fn journal_write_error_makes_the_volume_read_only(block_bytes: u32) {
    let (raw, volume, areas, ino, data, buffered, direct) = metadata_fault_setup(block_bytes, None);
    let other = create(&volume, "g");
    raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(areas.journal.clone()));
    let handle = volume.inodes().open_file(other, OpenFlags::READ).unwrap();
    let error = expect_eio(handle.sync_all(), "fsync whose journal write fails");
    assert!(error.to_string().contains("journal write failed"), "{error}");
    assert_eq!(raw.failures_injected(), 1);
    raw.clear_rules();
    assert_read_only(&volume, ino, &data, block_bytes);
    assert_handles_refuse(&buffered, &direct, block_bytes);
    let error = volume.close().expect_err("close reports the failure");
    assert_eq!(error.errno(), libc::EROFS);
    drop((buffered, direct, handle));
    assert_fsynced_survives(&raw, ino, &data);
}

pub(crate) fn checkpoint_write_error_makes_the_volume_read_only(block_bytes: u32) {
    let (raw, volume, areas, ino, data, buffered, direct) = metadata_fault_setup(block_bytes, None);
    raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(areas.checkpoints.clone()));
    let error = volume.checkpoint().expect_err("checkpoint whose write fails");
    assert_eq!(error.errno(), libc::EROFS, "{error}");
    assert_names_the_cause(&error);
    raw.clear_rules();
    assert_read_only(&volume, ino, &data, block_bytes);
    assert_handles_refuse(&buffered, &direct, block_bytes);
    drop((buffered, direct));
    drop(volume);
    assert_fsynced_survives(&raw, ino, &data);

    // A checkpoint the journal forces (it is full) fails the same way.
    let (raw, volume, areas, ino, data, buffered, _direct) =
        metadata_fault_setup(block_bytes, Some(64 << 10));
    raw.add_rule(FaultRule::every_nth(FaultOp::Write, 1).in_range(areas.checkpoints.clone()));
    let mut failed = None;
    for index in 0..400 {
        let name = format!("n{index}");
        let result = volume
            .inodes()
            .create(ROOT, name.as_bytes(), 0o644, owner())
            .and_then(|attr| volume.inodes().fsync_inode(attr.ino, false));
        if let Err(error) = result {
            failed = Some(error);
            break;
        }
    }
    let error = failed.expect("the journal filled and its checkpoint failed");
    assert!([libc::EIO, libc::EROFS].contains(&error.errno()), "{error}");
    assert!(error.to_string().contains("checkpoint write failed"), "{error}");
    let refused = buffered.write_at(b"x", 0).expect_err("read-only");
    assert_eq!(refused.errno(), libc::EROFS);
    drop(buffered);
    drop(volume);
    assert_fsynced_survives(&raw, ino, &data);
}

/// A failed read returns EIO and leaves nothing in the cache: the same
/// read without the fault returns the data. Each round mounts afresh, so
/// nothing is cached before the fault.
pub(crate) fn read_errors_fail_the_read_and_cache_nothing(block_bytes: u32) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let areas = areas(&volume);
    let ino = create(&volume, "r");
    let data = pattern(7, 6 * block_bytes as usize + 5);
    {
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
        file.write_at(&data, 0).unwrap();
        file.sync_all().unwrap();
    }
    drop(volume);
    let image = raw.image();
    let block = block_bytes as usize;
    let mut injected = 0;
    for (pos, length) in [(0usize, 10usize), (block + 3, 2 * block), (5 * block, block + 5)] {
        let (raw, volume) = open_image(image.clone()).unwrap();
        let buffered = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
        raw.add_rule(FaultRule::next(FaultOp::Read, 1).in_range(areas.data.clone()));
        let mut buffer = vec![0u8; length];
        expect_eio(buffered.read_at(&mut buffer, pos as u64), "buffered read");
        let count = buffered.read_at(&mut buffer, pos as u64).unwrap();
        assert_eq!(&buffer[..count], &data[pos..pos + count], "no garbage was cached");
        // A partial-block write needs the block's old bytes: their read
        // failing fails the write, which changes nothing.
        let target = (pos + length + block / 2).min(data.len() - 2);
        raw.add_rule(FaultRule::next(FaultOp::Read, 1).in_range(areas.data.clone()));
        match buffered.write_at(b"zz", target as u64) {
            Err(error) => assert!(is_eio(&error), "{error}"),
            // The block was read ahead by the read above.
            Ok(_) => {
                buffered.write_at(&data[target..target + 2], target as u64).map(|_| ()).unwrap()
            }
        }
        raw.clear_rules();
        assert_eq!(read_all(&volume, ino), data);
        injected += raw.failures_injected();
    }
    let (raw, volume) = open_image(image).unwrap();
    let direct = volume.inodes().open_file(ino, OpenFlags::READ.with_direct()).unwrap();
    raw.add_rule(FaultRule::next(FaultOp::Read, 1).in_range(areas.data.clone()));
    let mut buffer = AlignedBuf::zeroed(2 * block);
    expect_eio(direct.read_at(&mut buffer, 0), "direct read");
    direct.read_at(&mut buffer, 0).unwrap();
    assert_eq!(&buffer[..], &data[..2 * block]);
    FAULTS_INJECTED.fetch_add(injected + raw.failures_injected(), Ordering::Relaxed);
}

/// A volume whose journal has wrapped past several checkpoints, so that
/// the older checkpoint slot no longer leads to the current state.
pub(crate) fn wrapped_volume(block_bytes: u32) -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, Some(64 << 10), &options());
    let mut files = Vec::new();
    for index in 0..60u64 {
        let name = format!("w{index}");
        let ino = create(&volume, &name);
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE).unwrap();
        let data = pattern(index, 100 + index as usize * 37);
        file.write_at(&data, 0).unwrap();
        file.sync_all().unwrap();
        files.push((name, data));
    }
    let image = raw.image();
    drop(volume);
    (image, files)
}

/// EIO on any single read while mounting (superblock, checkpoint header or
/// payload, journal) fails the mount with EIO, or the mount goes on with
/// the whole state; it never falls back to an older one silently.
pub(crate) fn read_errors_while_mounting_fail_with_eio_never_an_older_state(block_bytes: u32) {
    let (image, files) = wrapped_volume(block_bytes);
    let mut failed_with_eio = 0;
    for nth in 0..64u64 {
        let raw = Arc::new(FaultDev::from_image(image.clone(), 512));
        let mut rule = FaultRule::next(FaultOp::Read, 1);
        rule.after = nth;
        raw.add_rule(rule);
        let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
        let opened = Volume::open_device(device, &options());
        let injected = raw.failures_injected();
        raw.clear_rules();
        match opened {
            Err(error) => {
                assert!(injected == 1, "read {nth}: {error}");
                assert_eq!(error.errno(), libc::EIO, "read {nth} failing fails the mount: {error}");
                failed_with_eio += 1;
            }
            Ok(volume) => {
                for (name, data) in &files {
                    let ino = volume
                        .inodes()
                        .lookup(ROOT, name.as_bytes())
                        .unwrap_or_else(|error| {
                            panic!("read {nth} failing: {name} lost on mount: {error}")
                        })
                        .ino;
                    assert_eq!(&read_all(&volume, ino), data, "read {nth}: {name}");
                }
                if injected == 0 {
                    break; // Past the mount's last read.
                }
            }
        }
    }
    assert!(failed_with_eio > 0, "some mount read failed");
    FAULTS_INJECTED.fetch_add(failed_with_eio, Ordering::Relaxed);
}

/// Regression: with neither superblock copy readable the mount said "not a
/// foliofs volume" (EUCLEAN); it is the device's EIO. One unreadable copy
/// falls back to the other, written at the same time.
pub(crate) fn superblock_read_errors_fail_the_mount_with_eio(block_bytes: u32) {
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options());
    let ino = create(&volume, "s");
    volume.inodes().open_file(ino, OpenFlags::READ).unwrap().sync_all().unwrap();
    let superblocks = areas(&volume).superblocks;
    drop(volume);
    let image = raw.image();
    for (rule, fails) in [
        (FaultRule::every_nth(FaultOp::Read, 1).in_range(superblocks.clone()), true),
        (FaultRule::next(FaultOp::Read, 1).in_range(0..512), false),
    ] {
        let raw = Arc::new(FaultDev::from_image(image.clone(), 512));
        raw.add_rule(rule);
        let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
        match Volume::open_device(device, &options()) {
            Err(error) => {
                assert!(fails, "one copy was readable: {error}");
                assert!(is_eio(&error), "{error}");
            }
            Ok(volume) => {
                assert!(!fails, "mounted with no readable superblock");
                volume.inodes().lookup(ROOT, b"s").unwrap();
            }
        }
    }
}

/// mkfs whose superblock writes (its last step) fail reports EIO and leaves
/// nothing that mounts.
pub(crate) fn superblock_write_errors_fail_mkfs_cleanly(block_bytes: u32) {
    for copy in 0..2u64 {
        let raw = Arc::new(FaultDev::new(16 << 20, 512));
        let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
        let at = copy * u64::from(block_bytes);
        raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(at..at + 512));
        let mkfs = MkfsOptions {
            block_bytes,
            journal_bytes: None,
            metadata_bytes: None,
            metadata_index: false,
            root_owner: owner(),
        };
        let error = Volume::format(&device, &mkfs).expect_err("mkfs fails");
        assert!(is_eio(&error), "{error}");
        assert!(error.to_string().contains("superblock"), "{error}");
        raw.clear_rules();
        // Copy A failing leaves no superblock; copy B failing leaves A, and
        // the volume mounts (fsck notes the missing copy).
        match Volume::open_device(device.clone(), &options()) {
            Err(error) => assert_eq!(copy, 0, "{error}"),
            Ok(volume) => {
                assert_eq!(copy, 1);
                assert!(volume.inodes().readdir(ROOT).unwrap().is_empty());
            }
        }
    }
    // A failing flush at the end of mkfs is reported too.
    let raw = Arc::new(FaultDev::new(16 << 20, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    raw.add_rule(FaultRule::every_nth(FaultOp::Flush, 1));
    let mkfs = MkfsOptions {
        block_bytes,
        journal_bytes: None,
        metadata_bytes: None,
        metadata_index: false,
        root_owner: owner(),
    };
    expect_eio(Volume::format(&device, &mkfs).map(|_| ()), "mkfs with failing flushes");
}

/// Regression: writeback re-dirties each failed range in every folio of
/// its batch, and a range before a folio underflowed `Folio::blocks_of`
/// (a panic) when a batch had several runs and an early one failed.
pub(crate) fn writeback_failure_of_several_runs_keeps_them_dirty(block_bytes: u32) {
    let options = VolumeOptions { folio_max_bytes: block_bytes.into(), ..options() };
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options);
    let areas = areas(&volume);
    let ino = create(&volume, "runs");
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let block = block_bytes as usize;
    let mut expected = vec![0u8; 7 * block];
    for run in [0, 2, 4, 6] {
        let data = pattern(run as u64, block);
        file.write_at(&data, (run * block) as u64).unwrap();
        expected[run * block..(run + 1) * block].copy_from_slice(&data);
    }
    raw.add_rule(FaultRule::every_nth(FaultOp::Write, 1).in_range(areas.data.clone()));
    expect_eio(file.sync_all(), "every run fails");
    raw.clear_rules();
    file.sync_all().expect("the retry writes every run");
    assert_eq!(read_all(&volume, ino), expected);
    drop(file);
    let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
    drop(volume);
    let (_, volume) = open_image(image).unwrap();
    assert_eq!(read_all(&volume, ino), expected, "every run is durable");
}

/// Regression: truncation dropped the cached folios past the new end before
/// zeroing the new last block on disk, so when that read-modify-write
/// failed the truncate returned EIO with the size unchanged but the dirty
/// data past the new end gone (reads showed older data from the disk).
pub(crate) fn failed_truncate_leaves_the_file_as_it_was(block_bytes: u32) {
    // One block per folio: the dirty blocks past the new end are in folios
    // of their own, which truncation drops without writing them back.
    let options = VolumeOptions { folio_max_bytes: block_bytes.into(), ..options() };
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options);
    let areas = areas(&volume);
    let ino = create(&volume, "t");
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let block = block_bytes as usize;
    let mut expected = pattern(11, 4 * block);
    file.write_at(&expected, 0).unwrap();
    file.sync_all().unwrap();
    let update = pattern(12, 2 * block);
    file.write_at(&update, 2 * block as u64).unwrap();
    expected[2 * block..].copy_from_slice(&update);
    for (op, rule) in [
        (FaultOp::Read, FaultRule::next(FaultOp::Read, 1)),
        (FaultOp::Write, FaultRule::next(FaultOp::Write, 1)),
    ] {
        raw.add_rule(rule.in_range(areas.data.clone()));
        expect_eio(file.set_len(block as u64 + 100), &format!("truncate whose {op:?} fails"));
        raw.clear_rules();
        assert_eq!(read_all(&volume, ino), expected, "{op:?}: nothing was lost");
    }
    file.sync_all().unwrap();
    file.set_len(block as u64 + 100).unwrap();
    expected.truncate(block + 100);
    drop(file);
    volume.close().unwrap();
    let (_, volume) = open_image_with(raw.image(), &options).unwrap();
    assert_eq!(read_all(&volume, ino), expected);
}

/// Regression: a failed run holds back the on-disk size of the runs after
/// it; when a range writeback (here a direct read's) retried the failed run
/// and left the file clean, the size stayed behind, syncfs skipped the clean
/// file and reported success, and a power cut lost the appended data.
pub(crate) fn size_held_back_by_a_failure_catches_up_at_syncfs(block_bytes: u32) {
    let options = VolumeOptions { folio_max_bytes: block_bytes.into(), ..options() };
    let (raw, volume) = new_volume_with_options(16 << 20, block_bytes, None, &options);
    let ino = create(&volume, "grow");
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
    let direct = volume.inodes().open_file(ino, OpenFlags::READ.with_direct()).unwrap();
    let block = block_bytes as usize;
    let mut expected = pattern(21, 2 * block);
    file.write_at(&expected, 0).unwrap();
    file.sync_all().unwrap();
    // Run 1 overwrites block 1, whose device place is known; run 2 appends
    // blocks 3 and 4 after a hole.
    let block_1 = volume
        .inodes()
        .fiemap(ino)
        .unwrap()
        .iter()
        .find(|extent| {
            extent.logical <= block as u64 && block as u64 * 2 <= extent.logical + extent.length
        })
        .map(|extent| extent.physical + block as u64 - extent.logical)
        .expect("block 1 is mapped");
    let overwrite = pattern(22, block);
    let append = pattern(23, 2 * block);
    file.write_at(&overwrite, block as u64).unwrap();
    file.write_at(&append, 3 * block as u64).unwrap();
    expected[block..].copy_from_slice(&overwrite);
    expected.resize(3 * block, 0);
    expected.extend_from_slice(&append);
    raw.add_rule(FaultRule::next(FaultOp::Write, 1).in_range(block_1..block_1 + block as u64));
    expect_eio(file.sync_all(), "run 1 fails");
    raw.clear_rules();
    let mut buffer = AlignedBuf::zeroed(block);
    direct.read_at(&mut buffer, block as u64).unwrap();
    assert_eq!(&buffer[..], &overwrite[..]);
    volume.sync().unwrap();
    let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
    drop((file, direct));
    drop(volume);
    let (_, volume) = open_image_with(image, &options).unwrap();
    assert_eq!(read_all(&volume, ino), expected, "syncfs made the appended runs durable");
}
