//! Zero-message opens (FUSE no-open) where the kernel's page cache serves
//! the data (`page_cache=kernel` and `writeback`): open and close reach the
//! daemon once for the life of the mount (the OPEN answered ENOSYS), and
//! what used to ride on each open still holds: the data, a file unlinked
//! while open (kept until the kernel forgets it), O_DIRECT and O_DSYNC taken
//! from each request, and a volume that closes cleanly. Directories are
//! opened without a message in every mode (FUSE no-opendir), and the kernel
//! caches their listings: a library user's changes still show.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use common::InProcessMount;

const OPENS: u64 = 20;

fn mount(options: &str) -> Option<InProcessMount> {
    if common::skip_requested() {
        return None;
    }
    Some(InProcessMount::new(64 << 20, options))
}

#[test]
fn opens_and_closes_stay_in_the_kernel_with_its_page_cache() {
    for page_cache in ["page_cache=kernel", "page_cache=writeback"] {
        let Some(mount) = mount(page_cache) else { return };
        let path = mount.point.join("f");
        std::fs::write(&path, b"hello").unwrap();
        for round in 0..OPENS {
            let mut file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
            let mut read = Vec::new();
            file.read_to_end(&mut read).unwrap();
            assert_eq!(read, b"hello", "{page_cache}, round {round}");
            file.write_all_at(b"h", 0).unwrap();
        }
        let (opens, releases) = (mount.opens.opens(), mount.opens.releases());
        mount.unmount();
        // The first open is answered ENOSYS; the kernel asks no more.
        assert!(opens <= 1, "{page_cache}: {opens} OPEN requests for {OPENS} opens");
        // The create's release may come before the kernel knew.
        assert!(releases <= 1, "{page_cache}: {releases} RELEASE requests");
    }
}

#[test]
fn each_open_reaches_the_daemon_with_opens_daemon() {
    let Some(mount) = mount("page_cache=kernel,opens=daemon") else { return };
    let path = mount.point.join("f");
    std::fs::write(&path, b"hello").unwrap();
    for _ in 0..OPENS {
        File::open(&path).unwrap().read_to_end(&mut Vec::new()).unwrap();
    }
    let opens = mount.opens.opens();
    mount.unmount();
    assert!(opens >= OPENS, "{opens} OPEN requests for {OPENS} opens");
}

#[test]
fn a_file_unlinked_while_open_stays_until_its_last_close() {
    for page_cache in ["page_cache=kernel", "page_cache=writeback"] {
        let Some(mount) = mount(page_cache) else { return };
        // One open before, so the kernel already knows it opens alone.
        std::fs::write(mount.point.join("first"), b"x").unwrap();
        File::open(mount.point.join("first")).unwrap();
        let path = mount.point.join("unlinked");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        // The kernel forgets both files, so the daemon keeps no file of
        // them open from their writes: only the opens below hold them.
        drop_kernel_caches(3);
        let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let renamed_over = OpenOptions::new().read(true).open(mount.point.join("first")).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(mount.point.join("second"), b"y").unwrap();
        std::fs::rename(mount.point.join("second"), mount.point.join("first")).unwrap();
        // The kernel drops what it cached, so the reads below reach the
        // engine for the unlinked file's data.
        drop_kernel_caches(1);
        let mut buffer = vec![0u8; 8192];
        file.read_exact_at(&mut buffer, 0).unwrap();
        assert_eq!(buffer, vec![7u8; 8192], "{page_cache}: the unlinked file's data");
        file.write_all_at(&[9u8; 4096], 4096).unwrap();
        file.sync_all().unwrap();
        file.read_exact_at(&mut buffer[..4096], 4096).unwrap();
        assert_eq!(buffer[..4096], [9u8; 4096], "{page_cache}: written after the unlink");
        let mut old = Vec::new();
        (&renamed_over).read_to_end(&mut old).unwrap();
        assert_eq!(old, b"x", "{page_cache}: the file renamed over");
        drop((file, renamed_over));
        // A clean close: every unlinked inode freed, none leaked open.
        mount.unmount();
    }
}

/// 1: the page cache; 3: dentries and inodes too (the kernel sends FORGET
/// for each inode it drops; waited for by a short pause, since FORGET has
/// no reply).
fn drop_kernel_caches(what: u8) {
    std::fs::write("/proc/sys/vm/drop_caches", what.to_string()).unwrap();
    if what & 2 != 0 {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn o_direct_and_o_dsync_come_from_each_request() {
    let Some(mount) = mount("page_cache=kernel,fua=native") else { return };
    let path = mount.point.join("dsync");
    const BLOCK_BYTES: usize = 4096;
    const WRITES: u64 = 16;
    std::fs::write(&path, vec![1u8; BLOCK_BYTES * WRITES as usize]).unwrap();
    File::open(&path).unwrap().sync_all().unwrap();
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(&path)
        .unwrap();
    let block = AlignedBlock(Box::new(Page([7; BLOCK_BYTES])));
    let before = mount.volume.device().stats();
    for index in 0..WRITES {
        file.write_all_at(&block.0 .0, index * BLOCK_BYTES as u64).unwrap();
    }
    let written = mount.volume.device().stats().since(&before);
    drop(file);
    let read = std::fs::read(&path).unwrap();
    mount.unmount();
    // Direct (the data went to the device once, not through the cache)
    // and durable write by write: one FUA write each.
    assert_eq!(written.fua_writes, WRITES, "{written:?}");
    assert_eq!(read, vec![7u8; BLOCK_BYTES * WRITES as usize]);
}

#[repr(C, align(4096))]
struct Page([u8; 4096]);

struct AlignedBlock(Box<Page>);

/// FUSE no-opendir: listing a directory reaches the daemon as READDIRs
/// only, after the first OPENDIR (answered ENOSYS).
#[test]
fn directory_opens_stay_in_the_kernel_in_every_mode() {
    for page_cache in ["page_cache=engine", "page_cache=kernel", "page_cache=writeback"] {
        let Some(mount) = mount(page_cache) else { return };
        let dir = mount.point.join("d");
        std::fs::create_dir(&dir).unwrap();
        for index in 0..5 {
            std::fs::write(dir.join(format!("f{index}")), b"x").unwrap();
        }
        for round in 0..OPENS {
            let names = sorted_names(&dir);
            assert_eq!(names, ["f0", "f1", "f2", "f3", "f4"], "{page_cache}, round {round}");
        }
        let opendirs = mount.opens.opendirs();
        mount.unmount();
        assert!(opendirs <= 1, "{page_cache}: {opendirs} OPENDIR requests for {OPENS} listings");
    }
}

#[test]
fn each_directory_open_reaches_the_daemon_with_opens_daemon() {
    let Some(mount) = mount("page_cache=kernel,opens=daemon") else { return };
    for _ in 0..OPENS {
        sorted_names(&mount.point);
    }
    let opendirs = mount.opens.opendirs();
    mount.unmount();
    assert!(opendirs >= OPENS, "{opendirs} OPENDIR requests for {OPENS} listings");
}

/// Without a handle a walk still keeps readdir's promise (POSIX): an entry
/// neither removed nor added meanwhile is listed exactly once, and no name is
/// listed twice. Entries removed or added mid-walk may show or not.
#[test]
fn a_walk_without_a_handle_lists_its_snapshot() {
    const FILES: usize = 2000;
    // Directories are listed without a handle in every mode.
    let Some(mount) = mount("page_cache=engine") else { return };
    let dir = mount.point.join("walked");
    std::fs::create_dir(&dir).unwrap();
    let name = |index: usize| format!("entry-with-a-long-name-{index:05}");
    for index in 0..FILES {
        File::create(dir.join(name(index))).unwrap();
    }
    // One listing first, so the kernel already lists without opening.
    sorted_names(&dir);
    let mut walk = std::fs::read_dir(&dir).unwrap();
    let mut seen: Vec<String> = walk
        .by_ref()
        .take(10)
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    // Remove the first half (behind and ahead of the walk) and add as many.
    for index in 0..FILES / 2 {
        std::fs::remove_file(dir.join(name(index))).unwrap();
        File::create(dir.join(format!("added-{index:05}"))).unwrap();
    }
    seen.extend(walk.map(|entry| entry.unwrap().file_name().into_string().unwrap()));
    mount.unmount();
    let mut counts = std::collections::HashMap::new();
    for listed in &seen {
        *counts.entry(listed.as_str()).or_insert(0) += 1;
    }
    let repeated: Vec<_> = counts.iter().filter(|(_, &count)| count > 1).collect();
    assert!(repeated.is_empty(), "listed more than once: {repeated:?}");
    let kept_missing: Vec<String> =
        (FILES / 2..FILES).map(name).filter(|kept| !counts.contains_key(kept.as_str())).collect();
    assert!(kept_missing.is_empty(), "{} kept entries not listed", kept_missing.len());
    let known = |listed: &&str| {
        listed.starts_with("added-") || (0..FILES).any(|index| name(index) == *listed)
    };
    let unknown: Vec<_> = counts.keys().filter(|listed| !known(listed)).collect();
    assert!(unknown.is_empty(), "names never created: {unknown:?}");
}

/// A directory removed while open lists nothing (as on ext4), not ENOENT.
#[test]
fn a_directory_removed_while_open_lists_nothing() {
    let Some(mount) = mount("page_cache=engine") else { return };
    sorted_names(&mount.point);
    let dir = mount.point.join("removed");
    std::fs::create_dir(&dir).unwrap();
    let open = std::fs::read_dir(&dir).unwrap();
    std::fs::remove_dir(&dir).unwrap();
    // A new directory, which may not take the removed one's number.
    std::fs::create_dir(mount.point.join("new")).unwrap();
    std::fs::write(mount.point.join("new/file"), b"x").unwrap();
    let listed: Vec<_> = open.map(|entry| entry.map(|entry| entry.file_name())).collect();
    mount.unmount();
    assert!(listed.is_empty(), "{listed:?}");
}

fn sorted_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The kernel caches listings, those it made without opening
/// (FOPEN_CACHE_DIR is its default then) and with `opens=daemon` those of
/// a handle the daemon marked FOPEN_CACHE_DIR: names a library user adds
/// or removes still show at the next listing, in every mode.
#[test]
fn a_cached_listing_sees_library_changes() {
    use std::os::unix::fs::MetadataExt;
    for options in [
        "page_cache=engine",
        "page_cache=kernel",
        "page_cache=writeback",
        "page_cache=engine,opens=daemon",
        "page_cache=kernel,opens=daemon",
    ] {
        let Some(mount) = mount(options) else { return };
        let dir = mount.point.join("shared");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a"), b"x").unwrap();
        assert_eq!(sorted_names(&dir), ["a"]);
        assert_eq!(sorted_names(&dir), ["a"]);
        let parent = std::fs::metadata(&dir).unwrap().ino();
        let owner = foliofs::Owner { uid: 0, gid: 0 };
        mount.volume.inodes().create(parent, b"b", 0o644, owner).unwrap();
        let added = sorted_names(&dir);
        mount.volume.inodes().unlink(parent, b"a").unwrap();
        let removed = sorted_names(&dir);
        // And the changes made through the mount, which the kernel sees.
        std::fs::write(dir.join("c"), b"x").unwrap();
        let created = sorted_names(&dir);
        std::fs::rename(dir.join("c"), mount.point.join("moved")).unwrap();
        let renamed_away = sorted_names(&dir);
        mount.unmount();
        assert_eq!(added, ["a", "b"], "{options}: a name a library user added");
        assert_eq!(removed, ["b"], "{options}: a name a library user removed");
        assert_eq!(created, ["b", "c"], "{options}: a name created through the mount");
        assert_eq!(renamed_away, ["b"], "{options}: a name renamed away through the mount");
    }
}
