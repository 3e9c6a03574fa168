//! A real VM guest mounts a volume through `foliofs serve virtiofs`
//! (`virtiofs/guest.rs` builds and boots it). The guest runs the project's fsx (buffered,
//! O_DIRECT and mmap) and writes a tree of small files, each fsynced,
//! unmounts and powers off; then the image must fsck clean and hold every
//! file the guest wrote. `scripts/test-packages.sh` installs what it needs;
//! without it the test skips, or fails under FOLIOFS_NO_SKIP=1.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use guest::{boot, build_initramfs, find_guest, run, start_server, FOLIOFS};

#[path = "../../../tests/support/skip.rs"]
mod skip;

#[path = "virtiofs/guest.rs"]
mod guest;

const TREE_DIRS: usize = 8;
const TREE_FILES: usize = 16;

fn tree_content(dir: usize, file: usize) -> String {
    format!("file {file} of directory {dir}, written and fsynced in the guest")
}

#[test]
fn a_guest_runs_fsx_and_a_synced_tree_on_the_volume_which_fscks_clean() {
    let guest = match find_guest() {
        Ok(guest) => guest,
        Err(why) => return skip::skip_or_fail(&format!("no VM guest: {why}")),
    };
    let _guest_slot = guest::one_at_a_time();
    let started = Instant::now();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut tree = String::from("mkdir /mnt/tree; t=0\n");
    for d in 0..TREE_DIRS {
        tree += &format!("mkdir /mnt/tree/d{d}\n");
        for f in 0..TREE_FILES {
            let path = format!("/mnt/tree/d{d}/f{f}");
            tree += &format!("echo -n '{}' > {path} && sync {path} || t=1\n", tree_content(d, f));
        }
    }
    let init = format!(
        "mount -t virtiofs folio /mnt && echo GUEST-MOUNTED\n\
         mkdir /mnt/fsx; foliofs fsx --threads 2 --files 2 --ops 2000 --seconds 25 --seed 55 \
         --path /mnt/fsx; echo GUEST-FSX=$?\n\
         {tree}echo GUEST-TREE=$t\n\
         umount /mnt; echo GUEST-UMOUNT=$?\n"
    );
    let initramfs = build_initramfs(&guest, dir.path(), &init);
    let image = dir.path().join("volume.img");
    run(Command::new(FOLIOFS).arg("mkfs").arg(&image).args(["--size", "256M"]));
    let socket = dir.path().join("virtiofs.sock");
    let server = start_server(&image, &socket);
    let console = boot(&guest, &initramfs, &socket, Duration::from_secs(150));
    let served = server.wait_with_output().unwrap();
    let server_log = String::from_utf8_lossy(&served.stderr);
    eprintln!("guest and server took {:.1} s", started.elapsed().as_secs_f64());
    for marker in ["GUEST-MOUNTED", "GUEST-FSX=0", "GUEST-TREE=0", "GUEST-UMOUNT=0"] {
        assert!(
            console.contains(marker),
            "no {marker} on the guest's console:\n{console}\nserver:\n{server_log}"
        );
    }
    assert!(served.status.success(), "the server failed: {server_log}");
    assert!(server_log.contains("the guest left; the volume is closed"), "{server_log}");

    let fsck = run(Command::new(FOLIOFS).arg("fsck").arg(&image));
    assert!(fsck.contains("clean"), "{fsck}");
    let volume = foliofs::Volume::open(&image, &foliofs::VolumeOptions::default()).unwrap();
    for d in 0..TREE_DIRS {
        for f in 0..TREE_FILES {
            let read = volume.read(format!("/tree/d{d}/f{f}")).unwrap();
            assert_eq!(String::from_utf8_lossy(&read), tree_content(d, f), "/tree/d{d}/f{f}");
        }
    }
    volume.close().unwrap();
}

/// Bytes in each file the guest syncs before and while the server dies:
/// three pages, so each fsync writes back more than one page.
const KILLED_FILE_BYTES: usize = 12288;

/// How long a guest's write or fsync may be stuck before its watchdog
/// takes the server for dead: far longer than one file takes under TCG.
const STALL_SECONDS: u32 = 5;

/// What the guest writes into /mnt/fN: "file N\n" repeated (`yes | head`).
fn killed_file_content(index: usize) -> Vec<u8> {
    format!("file {index}\n").into_bytes().into_iter().cycle().take(KILLED_FILE_BYTES).collect()
}

/// The server dies (SIGKILL) while the guest writes files and fsyncs each:
/// the guest's next fsync fails, no later one succeeds, and every file the
/// guest saw synced is in the image after the journal's replay.
#[test]
fn a_server_killed_while_the_guest_fsyncs_loses_no_synced_file() {
    let guest = match find_guest() {
        Ok(guest) => guest,
        Err(why) => return skip::skip_or_fail(&format!("no VM guest: {why}")),
    };
    let _guest_slot = guest::one_at_a_time();
    let started = Instant::now();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // The writer prints "synced N" only once fsync returned 0; after the
    // first failure, three more tries, each of which must fail too. The
    // watchdog aborts the FUSE connection (fusectl, as an administrator
    // would) once an attempt has been stuck for STALL_SECONDS.
    let init = format!(
        "mount -t virtiofs folio /mnt && echo GUEST-MOUNTED\n\
         echo start > /tmp/attempt; (i=0; failures=0\n\
         while [ $failures -lt 4 ]; do\n\
           echo $i > /tmp/attempt; f=/mnt/f$i\n\
           if out=$({{ yes file $i | head -c {KILLED_FILE_BYTES} > $f; }} 2>&1 && sync $f 2>&1); then\n\
             if [ $failures = 0 ]; then echo \"synced $i\"; else echo \"GUEST-SUCCESS-AFTER-FAILURE $i\"; fi\n\
           else\n\
             echo \"failed $i: $out\"; failures=$((failures + 1))\n\
           fi\n\
           i=$((i + 1))\n\
         done) &\n\
         writer=$!; last=; still=0\n\
         while kill -0 $writer 2>/dev/null; do\n\
           sleep 1; now=$(cat /tmp/attempt)\n\
           if [ \"$now\" = \"$last\" ]; then still=$((still + 1)); else still=0; last=$now; fi\n\
           if [ $still = {STALL_SECONDS} ]; then\n\
             echo \"GUEST-STALLED at $now\"\n\
             for p in /proc/[0-9]*; do\n\
               case $(cat $p/wchan) in *fuse*|*answer*|*writeback*) echo \"GUEST-BLOCKED $(cat $p/comm) in $(cat $p/wchan)\";; esac\n\
             done\n\
             echo GUEST-WATCHED\n\
           fi\n\
         done\n\
         echo GUEST-DONE\n"
    );
    let initramfs = build_initramfs(&guest, dir.path(), &init);
    let image = dir.path().join("volume.img");
    run(Command::new(FOLIOFS).arg("mkfs").arg(&image).args(["--size", "128M"]));
    let socket = dir.path().join("virtiofs.sock");
    let mut server = start_server(&image, &socket);
    let mut running = guest::spawn_guest(&guest, &initramfs, &socket);
    let deadline = Instant::now() + Duration::from_secs(50);
    let tenth = running.wait_for_line(deadline, |line| line == "synced 9");
    if tenth.is_none() {
        let _ = server.kill();
        panic!("the guest synced no 10 files:\n{}", running.finish(Instant::now()));
    }
    server.kill().unwrap();
    let killed = server.wait_with_output().unwrap();
    let watched = running.wait_for_line(deadline, |line| line == "GUEST-WATCHED");
    let console = running.finish(Instant::now());
    eprintln!("guest and server took {:.1} s", started.elapsed().as_secs_f64());
    let server_log = String::from_utf8_lossy(&killed.stderr);
    assert!(
        watched.is_some(),
        "the guest's writer never stalled:\n{console}\nserver: {server_log}"
    );
    // Linux 6.1's virtiofs answers a lost back end with neither EIO nor
    // ENOTCONN: the request waits for a reply that never comes (the mount
    // has no fusectl abort and no forced unmount), so the write or fsync
    // in flight waits in request_wait_answer, and nothing after it runs.
    assert!(
        !console.lines().any(|line| line.starts_with("failed ")),
        "a write or fsync failed after the kill (a guest kernel that now reports the lost \
         server: assert its errno here):\n{console}"
    );
    let blocked: Vec<&str> =
        console.lines().filter_map(|line| line.strip_prefix("GUEST-BLOCKED ")).collect();
    assert!(
        blocked.iter().any(|waiting| waiting.ends_with(" in request_wait_answer")),
        "no writer waits for a FUSE reply:\n{console}"
    );
    let synced: Vec<usize> = console
        .lines()
        .filter_map(|line| line.strip_prefix("synced "))
        .map(|number| number.parse().unwrap())
        .collect();
    assert!(synced.len() >= 10, "{console}");
    assert_eq!(synced, (0..synced.len()).collect::<Vec<_>>(), "{console}");
    // The attempt that stalled is the one after the last synced file: no
    // success after it.
    let stalled = console.lines().find_map(|line| line.strip_prefix("GUEST-STALLED at ")).unwrap();
    assert_eq!(stalled, synced.len().to_string(), "{console}");

    let volume = foliofs::Volume::open(&image, &foliofs::VolumeOptions::default()).unwrap();
    let lost: Vec<String> = synced
        .iter()
        .filter(|&&index| {
            volume.read(format!("/f{index}")).ok() != Some(killed_file_content(index))
        })
        .map(|index| format!("/f{index}"))
        .collect();
    assert!(lost.is_empty(), "synced in the guest, lost or wrong after the replay: {lost:?}");
    let replayed = volume.load_report();
    assert!(replayed.journal_groups_replayed > 0, "the kill left nothing to replay: {replayed:?}");
    volume.close().unwrap();
    let fsck = run(Command::new(FOLIOFS).arg("fsck").arg(&image));
    assert!(fsck.contains("clean"), "{fsck}");
}

/// QEMU's first vhost-user message, GET_FEATURES (request 1, version 1,
/// no payload); returns the features the back end answers.
fn vhost_user_get_features(stream: &mut UnixStream) -> u64 {
    const GET_FEATURES: u32 = 1;
    const VERSION_1: u32 = 1;
    const REPLY: u32 = 1 << 2;
    let header: Vec<u8> =
        [GET_FEATURES, VERSION_1, 0].iter().flat_map(|word| word.to_le_bytes()).collect();
    stream.write_all(&header).unwrap();
    let mut reply = [0u8; 20];
    stream.read_exact(&mut reply).unwrap();
    let word = |at: usize| u32::from_le_bytes(reply[at..at + 4].try_into().unwrap());
    assert_eq!((word(0), word(4), word(8)), (GET_FEATURES, VERSION_1 | REPLY, 8), "{reply:?}");
    u64::from_le_bytes(reply[12..20].try_into().unwrap())
}

/// SIGTERM, then the server's exit, its last line, and the image as the
/// next open finds it: closed, nothing to replay, fsck clean.
fn sigterm_and_check_closed(server: Child, image: &Path, socket: &Path) {
    run(Command::new("kill").args(["-TERM", &server.id().to_string()]));
    let served = server.wait_with_output().unwrap();
    let server_log = String::from_utf8_lossy(&served.stderr);
    assert!(served.status.success(), "the server failed on SIGTERM: {server_log}");
    assert!(server_log.contains("stopped; the volume is closed"), "{server_log}");
    assert!(!socket.exists(), "the server left its socket behind");
    let volume = foliofs::Volume::open(image, &foliofs::VolumeOptions::default()).unwrap();
    let replayed = volume.load_report();
    assert_eq!(replayed.journal_groups_replayed, 0, "{replayed:?}");
    volume.close().unwrap();
    let fsck = run(Command::new(FOLIOFS).arg("fsck").arg(image));
    assert!(fsck.contains("clean"), "{fsck}");
}

/// While one front end is served, the socket refuses another (the server
/// closed its listener), and the first is still answered; SIGTERM then
/// ends the server with the front end still connected.
#[test]
fn a_second_front_end_is_refused_while_one_is_served() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("volume.img");
    run(Command::new(FOLIOFS).arg("mkfs").arg(&image).args(["--size", "64M"]));
    let socket = dir.path().join("virtiofs.sock");
    let server = start_server(&image, &socket);
    let mut first = UnixStream::connect(&socket).unwrap();
    let features = vhost_user_get_features(&mut first);
    const VIRTIO_F_VERSION_1: u64 = 1 << 32;
    const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
    assert_eq!(features & VIRTIO_F_VERSION_1, VIRTIO_F_VERSION_1, "{features:#x}");
    assert_eq!(features & VHOST_USER_F_PROTOCOL_FEATURES, VHOST_USER_F_PROTOCOL_FEATURES);
    // The listener closes just after the first connection is accepted: a
    // connection queued before that is dropped unserved, one after it
    // refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        match UnixStream::connect(&socket) {
            Err(error) => break error,
            Ok(_) => assert!(Instant::now() < deadline, "a second front end still connects"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    assert_eq!(vhost_user_get_features(&mut first), features, "the first front end");
    sigterm_and_check_closed(server, &image, &socket);
}

/// SIGTERM before any guest connects closes the volume as cleanly.
#[test]
fn sigterm_before_a_guest_connects_closes_the_volume() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = dir.path().join("volume.img");
    run(Command::new(FOLIOFS).arg("mkfs").arg(&image).args(["--size", "64M"]));
    let socket = dir.path().join("virtiofs.sock");
    let server = start_server(&image, &socket);
    sigterm_and_check_closed(server, &image, &socket);
}
