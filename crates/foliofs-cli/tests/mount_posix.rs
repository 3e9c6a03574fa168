//! POSIX rules through a real FUSE mount, where the kernel leaves them to the
//! file system (each test names the xfstests case it mirrors): set-ID bits
//! dropped by unprivileged writes and fallocate, set-group-ID directories,
//! rewinddir, fstat of a replaced open directory, a removed working
//! directory, freed space reused at once, access times.
//!
//! Needs root (to mount and to act as another user), /dev/fuse, dd and
//! fallocate; FOLIOFS_SKIP_MOUNT_TESTS=1 skips these explicitly.

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../../../tests/support/skip.rs"]
mod skip;
mod transport;

const FOLIOFS: &str = env!("CARGO_BIN_EXE_foliofs");

/// The unprivileged user the tests act as (nobody:nogroup).
const USER_ID: u32 = 65534;

fn skip_requested() -> bool {
    if std::env::var_os("FOLIOFS_SKIP_MOUNT_TESTS").is_some_and(|value| value == "1") {
        skip::skip_or_fail("FOLIOFS_SKIP_MOUNT_TESTS=1 asks to skip the mount tests");
        return true;
    }
    assert!(Path::new("/dev/fuse").exists(), "mount tests need /dev/fuse (modprobe fuse)");
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these mount tests act as another user: run as root");
    transport::skip_unavailable()
}

fn checked(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `program` as root.
fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().expect("spawn");
    checked(output, &format!("{program} {args:?}"))
}

/// Runs `program` as nobody:nogroup, without supplementary groups or
/// capabilities.
fn run_as_user(program: &str, args: &[&str]) -> String {
    let output =
        Command::new(program).args(args).uid(USER_ID).gid(USER_ID).output().expect("spawn");
    checked(output, &format!("{program} {args:?} as uid {USER_ID}"))
}

fn is_mounted(point: &Path) -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = point.to_str().unwrap();
    mountinfo.lines().any(|line| line.split(' ').nth(4) == Some(point))
}

/// A volume mounted with allow_other under /tmp (every user can reach it).
struct Mounted {
    dir: tempfile::TempDir,
    point: PathBuf,
    daemon: Option<Child>,
}

impl Mounted {
    fn new(options: &str) -> Self {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let image = dir.path().join("vol.img");
        run(FOLIOFS, &["mkfs", image.to_str().unwrap(), "--size", "96M"]);
        let point = dir.path().join("mnt");
        fs::create_dir(&point).unwrap();
        let mut mounted = Self { dir, point, daemon: None };
        mounted.mount(options);
        fs::set_permissions(&mounted.point, fs::Permissions::from_mode(0o777)).unwrap();
        mounted
    }

    fn mount(&mut self, options: &str) {
        let options = format!("allow_other{}{options}", if options.is_empty() { "" } else { "," });
        let options = transport::with(&options);
        let mut daemon = Command::new(FOLIOFS)
            .args(["mount", "-f", "-o", &options])
            .arg(self.dir.path().join("vol.img"))
            .arg(&self.point)
            .stdin(Stdio::null())
            .spawn()
            .expect("start foliofs mount");
        let started = Instant::now();
        while !is_mounted(&self.point) {
            if let Some(status) = daemon.try_wait().unwrap() {
                panic!("foliofs mount exited early ({status})");
            }
            assert!(started.elapsed() < Duration::from_secs(20), "mount did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.daemon = Some(daemon);
    }

    fn unmount(&mut self) {
        let mut daemon = self.daemon.take().expect("mounted");
        let started = Instant::now();
        while !Command::new("umount").arg(&self.point).status().unwrap().success() {
            assert!(started.elapsed() < Duration::from_secs(10), "unmount failed");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(daemon.wait().unwrap().success(), "foliofs mount failed after unmount");
    }

    fn remount(&mut self, options: &str) {
        self.unmount();
        self.mount(options);
    }

    fn path(&self, relative: &str) -> String {
        self.point.join(relative).to_str().unwrap().to_string()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            let _ = Command::new("umount").arg("-l").arg(&self.point).status();
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
    }
}

/// The mode as `stat -c %a` shows it: a statx for the mode alone, which
/// the kernel answers from its attribute cache unless told it changed.
fn mode_of(path: &str) -> u32 {
    u32::from_str_radix(run("stat", &["-c", "%a", path]).trim(), 8).unwrap()
}

fn chmod(path: &str, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// generic/355, 683, 684: a write (direct or buffered) or fallocate by an
/// unprivileged user drops set-user-ID and set-group-ID; root's keeps them.
/// The kernel strips nothing on FOPEN_DIRECT_IO writes (every write with
/// page_cache=engine) and on fallocate: it leaves the rule to the file
/// system. (With page_cache=kernel a buffered write is the kernel's own,
/// which strips set-group-ID only with group execute, whatever the group.)
#[test]
fn unprivileged_writes_and_fallocate_drop_setid_bits() {
    if skip_requested() {
        return;
    }
    for page_cache in ["page_cache=engine", "page_cache=kernel", "page_cache=writeback"] {
        let mut mounted = Mounted::new(page_cache);
        let file = mounted.path("f");
        fs::write(&file, vec![b'X'; 65536]).unwrap();
        let of = format!("of={file}");
        let buffered_by_kernel = page_cache != "page_cache=engine";
        let changes: [(&str, &[&str], bool); 4] = [
            (
                "dd",
                &["if=/dev/zero", &of, "bs=4k", "count=1", "oflag=direct", "conv=notrunc"],
                true,
            ),
            ("dd", &["if=/dev/zero", &of, "bs=4k", "count=1", "conv=notrunc"], !buffered_by_kernel),
            ("fallocate", &["-o", "64k", "-l", "64k", &file], true),
            ("fallocate", &["-p", "-o", "0", "-l", "4k", &file], true),
        ];
        for (program, args, by_library) in changes {
            // Group execute set: both bits go. Without it, set-group-ID goes
            // because the user is outside the file's group (root's).
            let modes: &[(u32, u32)] =
                if by_library { &[(0o6676, 0o676), (0o6666, 0o666)] } else { &[(0o6676, 0o676)] };
            for &(before, after) in modes {
                chmod(&file, before);
                run(program, args);
                assert_eq!(mode_of(&file), before, "{page_cache}: root's {program} {args:?}");
                run_as_user(program, args);
                assert_eq!(mode_of(&file), after, "{page_cache}: {program} {args:?} as a user");
            }
        }
        // Set-group-ID without group execute is a locking mark: kept for a
        // member of the file's group.
        fs::remove_file(&file).unwrap();
        fs::write(&file, b"x").unwrap();
        std::os::unix::fs::chown(&file, Some(USER_ID), Some(USER_ID)).unwrap();
        chmod(&file, 0o6644);
        run_as_user("dd", &["if=/dev/zero", &of, "bs=4k", "count=1", "oflag=direct"]);
        assert_eq!(mode_of(&file), 0o2644, "{page_cache}");
        // A truncate by a user drops them too (FUSE_HANDLE_KILLPRIV_V2
        // leaves it to the daemon where the kernel's cache takes writes);
        // root's truncate keeps them; a chown drops set-user-ID, root's too.
        chmod(&file, 0o6676);
        run("truncate", &["-s", "100", &file]);
        assert_eq!(mode_of(&file), 0o6676, "{page_cache}: root's truncate");
        run_as_user("truncate", &["-s", "50", &file]);
        assert_eq!(mode_of(&file), 0o676, "{page_cache}: truncate as a user");
        chmod(&file, 0o6676);
        std::os::unix::fs::chown(&file, Some(0), None).unwrap();
        assert_eq!(mode_of(&file), 0o676, "{page_cache}: chown");
        mounted.unmount();
    }
}

/// generic/314, 633: in a set-group-ID directory, entries created by a user
/// outside its group take its group; directories take its bit too.
#[test]
fn setgid_directories_pass_on_group_and_bit() {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new("");
    let shared = mounted.path("shared");
    fs::create_dir(&shared).unwrap();
    std::os::unix::fs::chown(&shared, Some(USER_ID), Some(12345)).unwrap();
    chmod(&shared, 0o2775);
    run_as_user("sh", &["-c", &format!("umask 022; mkdir {shared}/sub; touch {shared}/file")]);
    let sub = fs::metadata(format!("{shared}/sub")).unwrap();
    assert_eq!((sub.mode() & 0o7777, sub.uid(), sub.gid()), (0o2755, USER_ID, 12345));
    let file = fs::metadata(format!("{shared}/file")).unwrap();
    assert_eq!((file.mode() & 0o7777, file.gid()), (0o644, 12345));
    mounted.unmount();
}

/// generic/471 and generic/035: a rewound directory stream lists entries
/// created since opendir; fstat of an open directory replaced by rename
/// answers nlink 0.
#[test]
fn rewinddir_and_fstat_of_a_replaced_directory() {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new("");
    let dir = mounted.path("d");
    fs::create_dir(&dir).unwrap();
    let c_dir = CString::new(dir.as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; the stream is closed below.
    let stream = unsafe { libc::opendir(c_dir.as_ptr()) };
    assert!(!stream.is_null());
    for index in 0..100 {
        fs::write(format!("{dir}/{index}"), b"").unwrap();
    }
    // SAFETY: `stream` is the open stream from opendir.
    unsafe { libc::rewinddir(stream) };
    let mut names = Vec::new();
    loop {
        // SAFETY: `stream` is open; the entry is read before the next call.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: readdir returned a valid entry with a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `stream` is open and not used afterwards.
    assert_eq!(unsafe { libc::closedir(stream) }, 0);
    assert_eq!(names.len(), 102, "., .. and the 100 files created after opendir");

    let replaced = mounted.path("replaced");
    fs::create_dir(&replaced).unwrap();
    let open = fs::File::open(&replaced).unwrap();
    fs::rename(&dir, &replaced).unwrap();
    assert_eq!(open.metadata().unwrap().nlink(), 0);
    drop(open);
    assert_eq!(fs::read_dir(&replaced).unwrap().count(), 100);
    mounted.unmount();
    run(FOLIOFS, &["fsck", mounted.dir.path().join("vol.img").to_str().unwrap()]);
}

/// generic/011 (dirstress): a process whose working directory is removed
/// can still stat it (nlink 0), list it (nothing), not create in it, and
/// walk out of it with chdir(".."), as on ext4, whether or not the kernel
/// opens directories through the daemon.
#[test]
fn a_removed_working_directory_stays_usable_until_left() {
    if skip_requested() {
        return;
    }
    // A full stat asks for the birth time, which the kernel does not
    // cache: it reaches the daemon.
    let script = "set -e; rmdir ../gone; stat . >/dev/null; stat -c 'nlink %h' .; ls -A .; \
                  if touch x 2>/dev/null; then echo created; else echo refused; fi; \
                  cd -P ..; echo left";
    for options in ["", "page_cache=kernel"] {
        let mut mounted = Mounted::new(options);
        let gone = mounted.path("gone");
        fs::create_dir(&gone).unwrap();
        let output = Command::new("sh").args(["-c", script]).current_dir(&gone).output();
        let printed = checked(output.expect("spawn sh"), &format!("{script} ({options:?})"));
        assert_eq!(printed, "nlink 0\nrefused\nleft\n", "options {options:?}");
        // The number of the directory the kernel still knew is not reused.
        fs::create_dir(mounted.path("new")).unwrap();
        fs::write(mounted.path("new/file"), b"x").unwrap();
        mounted.unmount();
        run(FOLIOFS, &["fsck", mounted.dir.path().join("vol.img").to_str().unwrap()]);
    }
}

/// generic/213: the space of a removed preallocated file is usable at once,
/// and df shows it, without waiting for the background commit.
#[test]
fn space_of_a_removed_file_is_reusable_at_once() {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new("");
    let file = mounted.path("ouch");
    for _ in 0..3 {
        run("fallocate", &["-l", "64M", &file]);
        fs::remove_file(&file).unwrap();
    }
    let available = run("stat", &["-f", "-c", "%a %S", &mounted.path("")]);
    let mut fields = available.split_whitespace().map(|field| field.parse::<u64>().unwrap());
    let available_bytes = fields.next().unwrap() * fields.next().unwrap();
    assert!(available_bytes > 64 << 20, "df after rm: {available_bytes} bytes available");
    mounted.unmount();
}

/// generic/003: reads advance the access time under relatime (the default)
/// and strictatime, never under noatime; nodiratime spares directories.
#[test]
fn access_times_follow_the_mount_options() {
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new("");
    let file = mounted.path("f");
    let dir = mounted.path("d");
    fs::write(&file, b"aaa").unwrap();
    fs::create_dir(&dir).unwrap();
    let atime = |path: &str| run("stat", &["-c", "%X", path]).trim().parse::<i64>().unwrap();
    let age = |path: &str| run("touch", &["-a", "-d", "@1000000000", path]);
    age(&file);
    age(&dir);
    fs::read(&file).unwrap();
    fs::read_dir(&dir).unwrap().count();
    assert!(atime(&file) > 1_000_000_000, "relatime: an atime older than ctime advances");
    assert!(atime(&dir) > 1_000_000_000);
    for (options, file_moves, dir_moves) in
        [("noatime", false, false), ("strictatime,nodiratime", true, false)]
    {
        mounted.remount(options);
        age(&file);
        age(&dir);
        fs::read(&file).unwrap();
        fs::read_dir(&dir).unwrap().count();
        assert_eq!(atime(&file) > 1_000_000_000, file_moves, "{options}");
        assert_eq!(atime(&dir) > 1_000_000_000, dir_moves, "{options}");
    }
    mounted.unmount();
}

fn c_path(path: &str) -> CString {
    CString::new(path.as_bytes()).unwrap()
}

/// O_TMPFILE in `dir` (with `extra` open flags): the open file.
fn open_unnamed(dir: &str, extra: i32) -> std::io::Result<fs::File> {
    let flags = libc::O_TMPFILE | libc::O_RDWR | extra;
    // SAFETY: a valid NUL-terminated path; the descriptor is owned below.
    let fd = unsafe { libc::open(c_path(dir).as_ptr(), flags, 0o640) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH): the name for an open file.
fn link_open_file(file: &fs::File, path: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let empty = c_path("");
    // SAFETY: valid descriptor and NUL-terminated paths.
    let done = unsafe {
        libc::linkat(
            file.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c_path(path).as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// O_TMPFILE (generic/004, 509, 530): an unnamed file with no link, freed
/// on close; linkat names it (AT_EMPTY_PATH, or through /proc/self/fd)
/// unless it was opened O_EXCL; the volume is fsck-clean after.
#[test]
fn unnamed_files_through_o_tmpfile_and_linkat() {
    use std::io::{Read, Seek, Write};
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new("");
    let dir = mounted.path("d");
    fs::create_dir(&dir).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|index| (index * 7 + index / 4099) as u8).collect();

    let mut temp = open_unnamed(&dir, 0).expect("O_TMPFILE");
    temp.write_all(&data).unwrap();
    let stat = temp.metadata().unwrap();
    assert_eq!((stat.nlink(), stat.len(), stat.mode() & 0o7777), (0, data.len() as u64, 0o640));
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    link_open_file(&temp, &mounted.path("d/named")).expect("linkat AT_EMPTY_PATH");
    assert_eq!(temp.metadata().unwrap().nlink(), 1);
    temp.rewind().unwrap();
    let mut read = Vec::new();
    temp.read_to_end(&mut read).unwrap();
    drop(temp);
    assert!(read == data);
    assert!(fs::read(mounted.path("d/named")).unwrap() == data);

    // Through /proc/self/fd, as programs without CAP_DAC_READ_SEARCH do.
    let mut temp = open_unnamed(&dir, 0).unwrap();
    temp.write_all(b"through proc").unwrap();
    use std::os::fd::AsRawFd;
    let proc_path = format!("/proc/self/fd/{}", temp.as_raw_fd());
    // SAFETY: NUL-terminated paths.
    let linked = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            c_path(&proc_path).as_ptr(),
            libc::AT_FDCWD,
            c_path(&mounted.path("d/proc")).as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    assert_eq!(linked, 0, "{}", std::io::Error::last_os_error());
    drop(temp);
    assert_eq!(fs::read(mounted.path("d/proc")).unwrap(), b"through proc");

    // O_EXCL: never linkable; closed unnamed files leave nothing behind.
    let exclusive = open_unnamed(&dir, libc::O_EXCL).unwrap();
    let refused = link_open_file(&exclusive, &mounted.path("d/excl")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::ENOENT));
    drop(exclusive);
    let mut forgotten = open_unnamed(&dir, 0).unwrap();
    forgotten.write_all(&data).unwrap();
    drop(forgotten);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["named", "proc"]);
    mounted.unmount();
    run(FOLIOFS, &["fsck", mounted.dir.path().join("vol.img").to_str().unwrap()]);
}

/// The error of `program args` as root, which must fail.
fn fails(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().expect("spawn");
    assert!(!output.status.success(), "{program} {args:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// chattr +i / +a and lsattr through the mount (generic/079, 545, 623):
/// the kernel's FS_IOC_GETFLAGS/SETFLAGS reach the volume, which refuses
/// changes with EPERM; an unprivileged user may not set the flags; they
/// survive a remount.
#[test]
fn chattr_immutable_and_append_only_through_the_mount() {
    use std::io::Write;
    if skip_requested() {
        return;
    }
    let mut mounted = Mounted::new("");
    let file = mounted.path("f");
    let dir = mounted.path("d");
    fs::write(&file, b"0123456789").unwrap();
    fs::create_dir(&dir).unwrap();
    chmod(&file, 0o666);
    assert!(fails_as_user("chattr", &["+i", &file]).contains("Operation not permitted"));

    run("chattr", &["+i", &file]);
    run("chattr", &["+a", &dir]);
    assert!(run("lsattr", &["-d", &file]).starts_with("----i"), "{}", run("lsattr", &[&file]));
    let refused = |result: std::io::Result<()>| {
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EPERM));
    };
    refused(fs::OpenOptions::new().write(true).open(&file).map(drop));
    refused(fs::OpenOptions::new().append(true).open(&file).map(drop));
    refused(fs::remove_file(&file));
    refused(fs::rename(&file, mounted.path("g")));
    refused(fs::set_permissions(&file, fs::Permissions::from_mode(0o600)));
    refused(fs::hard_link(&file, mounted.path("g")));
    assert!(fails("touch", &[&file]).contains("Operation not permitted"));
    assert_eq!(fs::read(&file).unwrap(), b"0123456789");

    // The append-only directory takes new entries and loses none.
    fs::write(format!("{dir}/a"), b"").unwrap();
    refused(fs::remove_file(format!("{dir}/a")));
    run("chattr", &["-i", &file]);
    run("chattr", &["+a", &file]);
    refused(fs::OpenOptions::new().write(true).open(&file).map(drop));
    let mut appender = fs::OpenOptions::new().append(true).open(&file).unwrap();
    appender.write_all(b"abc").unwrap();
    drop(appender);
    refused(fs::File::create(&file).map(drop));
    assert_eq!(fs::read(&file).unwrap(), b"0123456789abc");

    mounted.remount("");
    assert!(run("lsattr", &["-d", &dir]).starts_with("-----a"), "{}", run("lsattr", &["-d", &dir]));
    refused(fs::remove_file(format!("{dir}/a")));
    run("chattr", &["-a", &file, &dir]);
    fs::remove_file(format!("{dir}/a")).unwrap();
    fs::remove_file(&file).unwrap();
    mounted.unmount();
    run(FOLIOFS, &["fsck", mounted.dir.path().join("vol.img").to_str().unwrap()]);
}

/// The error of `program args` as nobody, which must fail.
fn fails_as_user(program: &str, args: &[&str]) -> String {
    let output =
        Command::new(program).args(args).uid(USER_ID).gid(USER_ID).output().expect("spawn");
    assert!(!output.status.success(), "{program} {args:?} succeeded as uid {USER_ID}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}
