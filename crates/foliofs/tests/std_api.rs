//! The std-shaped API a library user sees: paths from the root,
//! `OpenOptions`, `std::io` on files, `Metadata`, and its errors.

use std::io::{Read, Seek, SeekFrom, Write};

use foliofs::{Error, MkfsOptions, OpenOptions, Permissions, Volume, VolumeOptions, ROOT_INO};

fn options() -> VolumeOptions {
    VolumeOptions { commit_interval_ms: 0, writeback_interval_ms: 0, ..VolumeOptions::default() }
}

fn new_volume(dir: &tempfile::TempDir) -> (std::path::PathBuf, Volume) {
    let image = dir.path().join("vol.img");
    Volume::mkfs_path(&image, Some(64 << 20), &MkfsOptions::default(), &options()).unwrap();
    let volume = Volume::open(&image, &options()).unwrap();
    (image, volume)
}

fn errno<T: std::fmt::Debug>(result: foliofs::Result<T>) -> i32 {
    result.unwrap_err().errno()
}

#[test]
fn files_and_directories_by_path_survive_a_remount() {
    let dir = tempfile::tempdir().unwrap();
    let (image, volume) = new_volume(&dir);
    volume.create_dir_all("/a/b/c").unwrap();
    volume.create_dir_all("a/b/c/").unwrap(); // exists: fine, as std
    volume.write("/a/b/c/data", b"0123456789").unwrap();
    assert_eq!(volume.read("/a/b/c/data").unwrap(), b"0123456789");

    let mut file = OpenOptions::new().read(true).write(true).open(&volume, "/a/b/c/data").unwrap();
    file.seek(SeekFrom::Start(4)).unwrap();
    file.write_all(b"xy").unwrap();
    assert_eq!(file.stream_position().unwrap(), 6);
    file.seek(SeekFrom::End(-2)).unwrap();
    let mut tail = String::new();
    file.read_to_string(&mut tail).unwrap();
    assert_eq!(tail, "89");
    file.sync_all().unwrap();
    assert_eq!(file.metadata().unwrap().len(), 10);
    drop(file);

    let mut log = OpenOptions::new().append(true).create(true).open(&volume, "/a/log").unwrap();
    log.write_all(b"one\n").unwrap();
    log.seek(SeekFrom::Start(0)).unwrap();
    log.write_all(b"two\n").unwrap(); // appends wherever the cursor is
    log.sync_data().unwrap();
    drop(log);
    assert_eq!(volume.read("/a/log").unwrap(), b"one\ntwo\n");

    volume.symlink("b/c/data", "/a/link").unwrap();
    volume.hard_link("/a/b/c/data", "/a/hard").unwrap();
    volume.rename("/a/log", "/a/b/log").unwrap();
    volume.set_permissions("/a/hard", Permissions::from_mode(0o600)).unwrap();
    volume.close().unwrap();

    let volume = Volume::open(&image, &options()).unwrap();
    let metadata = volume.metadata("/a/link").unwrap();
    assert!(metadata.is_file() && metadata.len() == 10 && metadata.nlink() == 2);
    assert_eq!(metadata.permissions().mode(), 0o600);
    assert_eq!(metadata.mode() & libc::S_IFMT, libc::S_IFREG);
    assert!(volume.symlink_metadata("/a/link").unwrap().is_symlink());
    assert_eq!(volume.read_link("/a/link").unwrap(), std::path::Path::new("b/c/data"));
    assert_eq!(volume.read("/a/link").unwrap(), b"0123xy6789");
    let mut names: Vec<_> = volume
        .read_dir("/a")
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "hard", "link"]);
    assert_eq!(volume.read("/a/b/log").unwrap(), b"one\ntwo\n");
    assert_eq!(volume.metadata("/").unwrap().ino(), ROOT_INO);

    assert_eq!(errno(volume.remove_dir("/a")), libc::ENOTEMPTY);
    volume.remove_file("/a/link").unwrap();
    assert!(volume.try_exists("/a/hard").unwrap());
    volume.remove_dir_all("/a").unwrap();
    assert!(!volume.try_exists("/a").unwrap());
    assert_eq!(volume.read_dir("/").unwrap().count(), 0);
    volume.close().unwrap();
}

#[test]
fn open_options_create_exclusively_truncate_and_refuse_what_std_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (_image, volume) = new_volume(&dir);
    let missing = OpenOptions::new().read(true).open(&volume, "/nothing");
    assert!(matches!(missing, Err(Error::NotFound(ref path)) if path == "/nothing"), "{missing:?}");
    let created = OpenOptions::new().write(true).create_new(true).mode(0o640).open(&volume, "/f");
    created.unwrap().write_all_at(b"data", 0).unwrap();
    assert_eq!(volume.metadata("/f").unwrap().permissions().mode(), 0o640);
    assert_eq!(
        errno(OpenOptions::new().write(true).create_new(true).open(&volume, "/f")),
        libc::EEXIST
    );
    // create without create_new opens what is there; truncate empties it.
    OpenOptions::new().write(true).create(true).open(&volume, "/f").unwrap();
    assert_eq!(volume.metadata("/f").unwrap().len(), 4);
    OpenOptions::new().write(true).truncate(true).open(&volume, "/f").unwrap();
    assert_eq!(volume.metadata("/f").unwrap().len(), 0);
    // As std: creating or truncating without write access is EINVAL, and
    // nothing is created.
    assert_eq!(errno(OpenOptions::new().read(true).create(true).open(&volume, "/g")), libc::EINVAL);
    assert!(!volume.try_exists("/g").unwrap());
    let read_only = OpenOptions::new().read(true).open(&volume, "/f").unwrap();
    assert_eq!(read_only.write_at(b"x", 0).unwrap_err().errno(), libc::EBADF);
    assert_eq!(errno(OpenOptions::new().read(true).open(&volume, "/")), libc::EISDIR);
    assert_eq!(errno(volume.create_dir("/f/sub")), libc::ENOTDIR);
    assert_eq!(errno(volume.remove_dir_all("/f")), libc::ENOTDIR);
    assert_eq!(errno(volume.create_dir("/")), libc::EINVAL);
    volume.symlink("/loop", "/loop").unwrap();
    assert_eq!(errno(volume.metadata("/loop")), libc::ELOOP);
    assert_eq!(errno(OpenOptions::new().read(true).open(&volume, "/loop")), libc::ELOOP);
}

/// open(2)'s namespace decisions, which the FUSE front end now takes from
/// the library: O_CREAT finds a file another opener made meanwhile, O_EXCL
/// refuses it, O_TRUNC empties it.
#[test]
fn create_or_open_decides_as_open_does() {
    let dir = tempfile::tempdir().unwrap();
    let (_image, volume) = new_volume(&dir);
    let owner = foliofs::Owner::current();
    let create = OpenOptions::from_posix_flags(libc::O_RDWR | libc::O_CREAT);
    let first = volume.inodes().create_or_open(ROOT_INO, b"f", 0o644, owner, &create).unwrap();
    volume.write("/f", b"kept").unwrap();
    let again = volume.inodes().create_or_open(ROOT_INO, b"f", 0o644, owner, &create).unwrap();
    assert_eq!((again.ino, again.size), (first.ino, 4));
    let exclusive = OpenOptions::from_posix_flags(libc::O_RDWR | libc::O_CREAT | libc::O_EXCL);
    let refused = volume.inodes().create_or_open(ROOT_INO, b"f", 0o644, owner, &exclusive);
    assert_eq!(errno(refused), libc::EEXIST);
    let truncate = OpenOptions::from_posix_flags(libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC);
    let emptied = volume.inodes().create_or_open(ROOT_INO, b"f", 0o644, owner, &truncate).unwrap();
    assert_eq!((emptied.ino, emptied.size), (first.ino, 0));
}

/// access(2) with supplementary groups, the rule the FUSE front end asks
/// the library for.
#[test]
fn access_honours_supplementary_groups() {
    let dir = tempfile::tempdir().unwrap();
    let (_image, volume) = new_volume(&dir);
    volume.write("/f", b"x").unwrap();
    let ino = volume.metadata("/f").unwrap().ino();
    let changes = foliofs::SetAttr {
        mode: Some(0o640),
        uid: Some(1000),
        gid: Some(100),
        ..Default::default()
    };
    volume.inodes().setattr(ino, &changes).unwrap();
    let member = foliofs::Credentials { uid: 1001, gid: 5, groups: vec![100] };
    volume.inodes().access(ino, &member, foliofs::Access::READ).unwrap();
    assert_eq!(errno(volume.inodes().access(ino, &member, foliofs::Access::WRITE)), libc::EACCES);
    let stranger = foliofs::Credentials { uid: 1001, gid: 5, groups: vec![7] };
    assert_eq!(errno(volume.inodes().access(ino, &stranger, foliofs::Access::READ)), libc::EACCES);
}

#[test]
fn statfs_estimates_free_inodes_from_free_metadata_room() {
    let dir = tempfile::tempdir().unwrap();
    let (_image, volume) = new_volume(&dir);
    let before = volume.statfs().free_inodes_estimate();
    assert!(before > 1000, "{before}");
    for index in 0..50 {
        volume.write(format!("/f{index}"), b"x").unwrap();
    }
    assert!(volume.statfs().free_inodes_estimate() < before);
}

/// An error keeps its errno through `std::io` and back: `?` on a `Read`
/// call in a function returning `foliofs::Result` still says EBADF.
#[test]
fn errors_keep_their_errno_through_std_io() {
    let dir = tempfile::tempdir().unwrap();
    let (_image, volume) = new_volume(&dir);
    let mut write_only = OpenOptions::new().write(true).create(true).open(&volume, "/f").unwrap();
    let through_io = write_only.read(&mut [0; 4]).unwrap_err();
    assert_eq!(through_io.raw_os_error(), None);
    assert_eq!(through_io.kind(), std::io::Error::from_raw_os_error(libc::EBADF).kind());
    let back = Error::from(through_io);
    assert_eq!(back.errno(), libc::EBADF, "{back}");
    let host = Error::from(std::io::Error::from_raw_os_error(libc::EIO));
    assert_eq!(host.errno(), libc::EIO);
}
