//! NBD through the binary: a volume on qemu-nbd by URI (mkfs, cp, cat,
//! fsck), `foliofs serve nbd` writing back on SIGTERM, and snapshots of a
//! served disk through its control socket (with the library's own NBD
//! client, so never skipped). The qemu and nbdcopy tests are skipped, with
//! the reason printed, when qemu-utils or libnbd-bin are missing.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use foliofs_check::fault_proxy::{FaultProxy, Upstream};

fn foliofs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_foliofs")).args(args).output().expect("run foliofs")
}

fn ok(args: &[&str]) -> String {
    let output = foliofs(args);
    assert!(
        output.status.success(),
        "foliofs {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn tools_missing(tools: &[&str]) -> bool {
    for tool in tools {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .is_ok_and(|output| output.status.success());
        if !found {
            skip::skip_or_fail(&format!(
                "{tool} is not installed (apt-get install qemu-utils libnbd-bin)"
            ));
            return true;
        }
    }
    false
}

fn wait_for_socket(socket: &Path, server: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        if let Some(status) = server.try_wait().unwrap() {
            panic!("the server exited before listening: {status}");
        }
        assert!(Instant::now() < deadline, "no socket at {}", socket.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills and reaps a child on drop, so a failed assertion leaves no server.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// qemu-nbd exporting `disk` as "vol" to one client after another, on a
/// socket in `dir`; killed when the first value is dropped.
fn qemu_nbd_on(dir: &Path, disk: &Path) -> (Reaped, std::path::PathBuf) {
    let socket = dir.join("q.sock");
    let mut server = Reaped(
        Command::new("qemu-nbd")
            .args(["-f", "raw", "-x", "vol", "-t", "-k"])
            .arg(&socket)
            .arg(disk)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_socket(&socket, &mut server.0);
    (server, socket)
}

#[test]
fn a_volume_lives_on_qemu_nbd_by_uri() {
    if tools_missing(&["qemu-nbd", "qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let (_server, socket) = qemu_nbd_on(dir.path(), &disk);
    let uri = format!("nbd+unix:///vol?socket={}", socket.display());
    let made = ok(&["mkfs", &uri]);
    assert!(made.contains("67108864 bytes"), "{made}");
    let source = dir.path().join("tree");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    let payload: Vec<u8> = (0..3_000_000u32).map(|index| (index % 251) as u8).collect();
    std::fs::write(source.join("sub/data.bin"), &payload).unwrap();
    ok(&["cp", "-r", source.to_str().unwrap(), &format!("{uri}:/tree")]);
    let output = foliofs(&["cat", &format!("{uri}:/tree/sub/data.bin")]);
    assert!(output.status.success());
    assert!(output.stdout == payload, "the file read back differs");
    let checked = ok(&["fsck", &uri]);
    assert!(checked.contains("clean"), "{checked}");
    // An export size is the server's: mkfs --size is refused, nothing written.
    let output = foliofs(&["mkfs", "--size", "1G", &uri]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("size is the server's"));
    assert!(ok(&["fsck", &uri]).contains("clean"));
}

#[test]
fn serve_nbd_writes_back_and_closes_the_volume_on_sigterm() {
    if tools_missing(&["nbdcopy"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("vol.img");
    let image_text = image.to_str().unwrap();
    ok(&["mkfs", "--size", "128M", image_text]);
    let socket = dir.path().join("f.sock");
    let mut server = Reaped(
        Command::new(env!("CARGO_BIN_EXE_foliofs"))
            .args(["serve", "nbd", &format!("{image_text}:/vm/disk.raw"), "--size", "16M"])
            .arg("--socket")
            .arg(&socket)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // --size creates the file, but not its directory.
    let status = server.0.wait().unwrap();
    assert!(!status.success());
    ok(&["mkdir", &format!("{image_text}:/vm")]);
    let mut server = Reaped(
        Command::new(env!("CARGO_BIN_EXE_foliofs"))
            .args(["serve", "nbd", &format!("{image_text}:/vm/disk.raw"), "--size", "16M"])
            .arg("--socket")
            .arg(&socket)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_socket(&socket, &mut server.0);
    let source = dir.path().join("source.raw");
    let payload: Vec<u8> = (0..16u32 << 20).map(|index| (index / 4096 % 253) as u8).collect();
    std::fs::write(&source, &payload).unwrap();
    // nbdcopy sends no FLUSH unless asked: what it wrote is durable only
    // because the server writes back as it stops.
    let uri = format!("nbd+unix:///vm/disk.raw?socket={}", socket.display());
    let copied = Command::new("nbdcopy").arg(&source).arg(&uri).output().unwrap();
    assert!(copied.status.success(), "{}", String::from_utf8_lossy(&copied.stderr));
    let killed = Command::new("kill").args(["-TERM", &server.0.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = server.0.wait().unwrap();
    assert!(status.success(), "serve exited with {status}");
    assert!(!socket.exists(), "the socket is removed");
    let output = foliofs(&["cat", &format!("{image_text}:/vm/disk.raw")]);
    assert!(output.stdout == payload, "the disk read back differs");
    assert!(ok(&["fsck", image_text]).contains("clean"));
}

/// TCP both ways: `serve nbd --listen` on an ephemeral loopback port, and a
/// volume made, filled and checked on that export by URI.
#[test]
fn a_volume_on_a_file_served_over_tcp() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("vol.img");
    let image_text = image.to_str().unwrap();
    ok(&["mkfs", "--size", "128M", image_text]);
    let mut server = Reaped(
        Command::new(env!("CARGO_BIN_EXE_foliofs"))
            .args(["serve", "nbd", &format!("{image_text}:/disk.raw"), "--size", "32M"])
            .args(["--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut banner = String::new();
    std::io::BufReader::new(server.0.stderr.take().unwrap()).read_line(&mut banner).unwrap();
    let uri = banner.split_whitespace().last().expect("serving ... as URI").to_string();
    assert!(uri.starts_with("nbd://127.0.0.1:") && uri.ends_with("/disk.raw"), "{banner}");
    ok(&["mkfs", &uri]);
    ok(&["mkdir", &format!("{uri}:/inner")]);
    let host_file = dir.path().join("note.txt");
    std::fs::write(&host_file, b"on a volume inside a volume, over TCP\n").unwrap();
    ok(&["cp", host_file.to_str().unwrap(), &format!("{uri}:/inner/note.txt")]);
    let read = ok(&["cat", &format!("{uri}:/inner/note.txt")]);
    assert_eq!(read, "on a volume inside a volume, over TCP\n");
    assert!(ok(&["fsck", &uri]).contains("clean"));
    let killed = Command::new("kill").args(["-TERM", &server.0.id().to_string()]).status().unwrap();
    assert!(killed.success());
    assert!(server.0.wait().unwrap().success());
    assert!(ok(&["fsck", image_text]).contains("clean"));
}

/// nbdkit with a writeback cache over a disk file; None when nbdkit is missing.
fn nbdkit_cached(socket: &Path, disk: &Path, cache: bool) -> Option<Reaped> {
    let file = format!("file={}", disk.display());
    // A killed server leaves its socket behind; wait for the new one.
    let _ = std::fs::remove_file(socket);
    let mut command = Command::new("nbdkit");
    command.args(["-f", "-U"]).arg(socket);
    if cache {
        command.arg("--filter=cache");
    }
    command.args(["file", &file]);
    if cache {
        command.arg("cache=writeback");
    }
    let mut server = match command.stderr(Stdio::null()).spawn() {
        Ok(child) => Reaped(child),
        Err(error) => {
            skip::skip_or_fail(&format!("nbdkit cannot run ({error}); apt-get install nbdkit"));
            return None;
        }
    };
    wait_for_socket(socket, &mut server.0);
    Some(server)
}

/// The engine (a `foliofs cp`) and a volatile-cache server both killed with
/// kill -9 while the copy runs, round after round on one disk: every copy
/// that finished before stays intact, and fsck stays clean.
#[test]
fn killing_the_engine_and_the_server_mid_copy_loses_nothing_finished() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(256 << 20).unwrap();
    let socket = dir.path().join("cache.sock");
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let Some(server) = nbdkit_cached(&socket, &disk, true) else { return };
    ok(&["mkfs", &uri]);
    let source = dir.path().join("tree");
    std::fs::create_dir_all(&source).unwrap();
    for index in 0..40u32 {
        let data: Vec<u8> = (0..100_000u32).map(|byte| (byte ^ index) as u8).collect();
        std::fs::write(source.join(format!("f{index}")), data).unwrap();
    }
    let source_text = source.to_str().unwrap();
    // A finished copy, which every later crash must leave as it is.
    ok(&["cp", "-r", source_text, &format!("{uri}:/done")]);
    drop(server);
    for round in 0..3u64 {
        let server = nbdkit_cached(&socket, &disk, true).unwrap();
        let mut copy = Reaped(
            Command::new(env!("CARGO_BIN_EXE_foliofs"))
                .args(["cp", "-r", source_text, &format!("{uri}:/r{round}")])
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // Somewhere in the copy (or after it): the kill point varies by round.
        std::thread::sleep(Duration::from_millis(20 + 40 * round));
        let _ = copy.0.kill();
        let _ = copy.0.wait();
        drop(server);
        let checker = nbdkit_cached(&socket, &disk, false).unwrap();
        let checked = ok(&["fsck", &uri]);
        assert!(checked.contains("clean"), "round {round}: {checked}");
        for index in [0u32, 17, 39] {
            let output = foliofs(&["cat", &format!("{uri}:/done/f{index}")]);
            let expected: Vec<u8> = (0..100_000u32).map(|byte| (byte ^ index) as u8).collect();
            assert!(output.stdout == expected, "round {round}: /done/f{index} changed");
        }
        drop(checker);
    }
}

/// `foliofs serve nbd IMAGE:/path... --control` on fresh sockets in `dir`;
/// returns the server, the NBD socket and the control socket.
fn serve_with_control(
    dir: &Path,
    image: &str,
    targets: &[&str],
    extra: &[&str],
) -> (Reaped, std::path::PathBuf, std::path::PathBuf) {
    let (socket, control) = (dir.join("nbd.sock"), dir.join("control.sock"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_foliofs"));
    command.args(["serve", "nbd"]);
    for target in targets {
        command.arg(format!("{image}:{target}"));
    }
    command.args(extra).arg("--socket").arg(&socket).arg("--control").arg(&control);
    let mut server = Reaped(command.stderr(Stdio::null()).spawn().unwrap());
    wait_for_socket(&socket, &mut server.0);
    wait_for_socket(&control, &mut server.0);
    (server, socket, control)
}

/// SIGTERM, and the server's clean exit: everything written back.
fn stop(mut server: Reaped) {
    let killed = Command::new("kill").args(["-TERM", &server.0.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = server.0.wait().unwrap();
    assert!(status.success(), "serve exited with {status}");
}

/// One request line on the control socket and its answer.
fn control_request(control: &Path, request: &str) -> serde_json::Value {
    use std::io::{BufRead, Write};
    let stream = std::os::unix::net::UnixStream::connect(control).unwrap();
    writeln!(&stream, "{request}").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(&stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|error| panic!("{error}: {line:?}"))
}

fn snapshot_fails(control: &Path, args: &[&str], why: &str) {
    let mut all = vec!["snapshot", "--server", control.to_str().unwrap()];
    all.extend_from_slice(args);
    let output = foliofs(&all);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "snapshot {args:?} succeeded");
    assert!(stderr.contains(why), "snapshot {args:?}: {stderr}");
}

fn listed(directory: &str) -> Vec<String> {
    let mut names: Vec<String> = ok(&["ls", directory]).lines().map(String::from).collect();
    names.sort();
    names
}

/// Bytes each write covers: four 4 KiB blocks, so a torn request shows.
const UNIT_BYTES: usize = 16 << 10;

/// What a write of generation `generation` puts in unit `unit` (0: zeros,
/// as WRITE_ZEROES and TRIM leave it).
fn unit_content(unit: u64, generation: u64) -> Vec<u8> {
    if generation == 0 {
        return vec![0; UNIT_BYTES];
    }
    (0..UNIT_BYTES as u64 / 8)
        .flat_map(|word| ((unit << 40) | (generation << 16) | word).to_le_bytes())
        .collect()
}

/// One request a writer made: what it left in its unit, and when it was
/// sent and answered on the shared clock.
struct Op {
    unit: u64,
    /// 0 for WRITE_ZEROES and TRIM.
    content: u64,
    sent: u64,
    answered: u64,
}

/// A snapshot through the control socket while three threads keep writing
/// (plain and FUA writes, WRITE_ZEROES, TRIM, 16 KiB each, over two
/// connections): the snapshot holds every write answered before the
/// request and none sent after the answer, each unit wholly one write's;
/// the original holds every write; fsck is clean and the blocks shared.
#[test]
fn a_snapshot_of_a_served_disk_holds_every_answered_write() {
    use foliofs::dev::{DevOptions, DiscardMode, RawDev};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    const DISK_BYTES: u64 = 16 << 20;
    const UNITS: u64 = DISK_BYTES / UNIT_BYTES as u64;
    const WRITERS: u64 = 3;
    const OPS_AFTER: usize = 48;
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("vol.img");
    let image_text = image.to_str().unwrap();
    ok(&["mkfs", "--size", "256M", image_text]);
    ok(&["mkdir", &format!("{image_text}:/snaps")]);
    let (server, socket, control) =
        serve_with_control(dir.path(), image_text, &["/disk.raw"], &["--size", "16M"]);
    let uri = format!("nbd+unix:///disk.raw?socket={}&connections=2", socket.display());
    let disk = Arc::new(foliofs::dev::nbd::NbdDev::open(&uri, &DevOptions::default()).unwrap());
    // Generation 1 everywhere, in 1 MiB writes.
    let per_write = (1 << 20) / UNIT_BYTES as u64;
    for first in (0..UNITS).step_by(per_write as usize) {
        let data: Vec<u8> =
            (first..first + per_write).flat_map(|unit| unit_content(unit, 1)).collect();
        disk.write_at(first * UNIT_BYTES as u64, &[std::io::IoSlice::new(&data)], false).unwrap();
    }
    let clock = Arc::new(AtomicU64::new(1));
    let answered_at = Arc::new(AtomicU64::new(u64::MAX));
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (disk, clock) = (Arc::clone(&disk), Arc::clone(&clock));
            let answered_at = Arc::clone(&answered_at);
            std::thread::spawn(move || {
                let mut ops = Vec::new();
                let mut after = 0;
                for generation in 2.. {
                    for unit in (writer..UNITS).step_by(WRITERS as usize) {
                        if after >= OPS_AFTER {
                            return ops;
                        }
                        let offset = unit * UNIT_BYTES as u64;
                        let kind = (unit + generation) % 8;
                        let sent = clock.fetch_add(1, Ordering::SeqCst);
                        let content = match kind {
                            6 => disk.discard(offset, UNIT_BYTES as u64, DiscardMode::Zero),
                            7 => disk.discard(offset, UNIT_BYTES as u64, DiscardMode::Trim),
                            _ => {
                                let data = unit_content(unit, generation);
                                disk.write_at(offset, &[std::io::IoSlice::new(&data)], kind == 5)
                            }
                        }
                        .map(|()| if kind >= 6 { 0 } else { generation })
                        .unwrap();
                        let answered = clock.fetch_add(1, Ordering::SeqCst);
                        if sent > answered_at.load(Ordering::SeqCst) {
                            after += 1;
                        }
                        ops.push(Op { unit, content, sent, answered });
                    }
                }
                unreachable!()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    let asked = clock.fetch_add(1, Ordering::SeqCst);
    let made =
        ok(&["snapshot", "--server", control.to_str().unwrap(), "disk.raw", "/snaps/disk-1"]);
    let answered = clock.fetch_add(1, Ordering::SeqCst);
    answered_at.store(answered, Ordering::SeqCst);
    assert!(
        made.contains("/snaps/disk-1: snapshot of export disk.raw (/disk.raw, 16777216 bytes)")
            && made.contains("durable in"),
        "{made}"
    );
    // Each writer stops once it sent OPS_AFTER requests after the answer.
    let ops: Vec<Op> = writers.into_iter().flat_map(|writer| writer.join().unwrap()).collect();
    drop(disk);
    stop(server);

    let snapshot = foliofs(&["cat", &format!("{image_text}:/snaps/disk-1")]).stdout;
    let original = foliofs(&["cat", &format!("{image_text}:/disk.raw")]).stdout;
    assert_eq!((snapshot.len() as u64, original.len() as u64), (DISK_BYTES, DISK_BYTES));
    let mut history: Vec<Vec<&Op>> = (0..UNITS).map(|_| Vec::new()).collect();
    for op in &ops {
        history[op.unit as usize].push(op);
    }
    let initial = |unit| Op { unit, content: 1, sent: 0, answered: 0 };
    let (mut changed_after, mut overlapping) = (0, 0);
    for unit in 0..UNITS {
        let first = initial(unit);
        let mut unit_ops: Vec<&Op> = vec![&first];
        unit_ops.extend(history[unit as usize].iter().copied());
        let range = unit as usize * UNIT_BYTES..(unit as usize + 1) * UNIT_BYTES;
        // The last write answered before the request, and every one sent
        // before the answer after it: the snapshot holds one of those.
        let oldest = unit_ops.iter().rposition(|op| op.answered < asked).unwrap();
        let candidates: Vec<&Op> =
            unit_ops[oldest..].iter().copied().filter(|op| op.sent < answered).collect();
        overlapping +=
            unit_ops.iter().filter(|op| op.sent < answered && op.answered > asked).count();
        let held = &snapshot[range.clone()];
        assert!(
            candidates.iter().any(|op| held == unit_content(unit, op.content)),
            "unit {unit}: the snapshot holds none of generations {:?} (first word {:#x})",
            candidates.iter().map(|op| op.content).collect::<Vec<_>>(),
            u64::from_le_bytes(held[..8].try_into().unwrap())
        );
        let last = unit_ops.last().unwrap();
        assert!(original[range.clone()] == unit_content(unit, last.content), "unit {unit}");
        if snapshot[range.clone()] != original[range] {
            changed_after += 1;
        }
    }
    assert!(overlapping > 0, "no write was in flight while the snapshot was taken");
    assert!(changed_after > 0, "no write after the snapshot changed the original");
    assert!(ops.iter().filter(|op| op.sent > answered).count() >= OPS_AFTER);
    assert!(ok(&["fsck", image_text]).contains("clean"));
    let info = ok(&["info", image_text]);
    let shared: u64 = info
        .lines()
        .find_map(|line| line.strip_prefix("shared:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no shared count in {info}"));
    assert!(shared > 0, "{info}");
}

/// What the control socket refuses, each with its reason to the client and
/// nothing left in the volume; several exports at one instant, all or
/// none; a socket of mode 0600 that stays usable after a bad request.
#[test]
fn snapshot_refusals_leave_nothing_behind() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("vol.img");
    let image_text = image.to_str().unwrap();
    ok(&["mkfs", "--size", "128M", image_text]);
    ok(&["mkdir", &format!("{image_text}:/snaps")]);
    let (server, _socket, control) =
        serve_with_control(dir.path(), image_text, &["/a.raw", "/b.raw"], &["--size", "1M"]);
    // The image is the server's: the offline snapshot points at --server.
    let output = foliofs(&["snapshot", &format!("{image_text}:/a.raw"), "/snaps/x"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("foliofs snapshot --server SOCKET"));
    let mode = std::fs::metadata(&control).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the control socket is the owner's alone");
    snapshot_fails(&control, &["nosuch", "/snaps/x"], "no export named \"nosuch\"");
    snapshot_fails(&control, &["/c.raw", "/snaps/x"], "no export at \"/c.raw\"");
    snapshot_fails(&control, &["a.raw", "snaps/x"], "a path inside the volume");
    snapshot_fails(&control, &["a.raw", "/nodir/x"], "snapshot of a.raw (/a.raw) to /nodir/x");
    snapshot_fails(&control, &["a.raw", "/snaps/x", "b.raw"], "pairs");
    let made = ok(&["snapshot", "--server", control.to_str().unwrap(), "a.raw", "/snaps/a1"]);
    assert!(made.contains("/snaps/a1: snapshot of export a.raw (/a.raw, 1048576 bytes)"), "{made}");
    snapshot_fails(&control, &["/a.raw", "/snaps/a1"], "/snaps/a1 exists");
    snapshot_fails(&control, &["a.raw", "/snaps/a2", "b.raw", "/snaps/a1"], "/snaps/a1 exists");
    snapshot_fails(&control, &["a.raw", "/snaps/a2", "b.raw", "/snaps/a2"], "named twice");
    // The first clone is made, the second fails: the first is removed.
    snapshot_fails(&control, &["a.raw", "/snaps/a2", "b.raw", "/nodir/b2"], "/nodir/b2");
    let pair = ok(&[
        "snapshot",
        "--server",
        control.to_str().unwrap(),
        "/a.raw",
        "/snaps/pa",
        "b.raw",
        "/snaps/pb",
    ]);
    assert!(
        pair.contains("/snaps/pa: snapshot of export a.raw")
            && pair.contains("/snaps/pb: snapshot of export b.raw"),
        "{pair}"
    );
    let answer = control_request(&control, "not json");
    assert!(answer["error"].as_str().unwrap().contains("not JSON"), "{answer}");
    let answer = control_request(&control, r#"{"resize": {}}"#);
    assert!(answer["error"].as_str().unwrap().contains("unknown request"), "{answer}");
    let answer = control_request(&control, r#"{"exports": {}}"#);
    let exports = answer["ok"]["exports"].as_array().unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(exports.len(), 2);
    assert_eq!(
        (exports[1]["name"].as_str(), exports[1]["bytes"].as_u64()),
        (Some("b.raw"), Some(1 << 20))
    );
    let answer =
        control_request(&control, r#"{"snapshot": {"export": "b.raw", "to": "/snaps/b1"}}"#);
    assert_eq!(answer["ok"]["to"], "/snaps/b1", "{answer}");
    assert_eq!(answer["ok"]["durable"], true, "{answer}");
    stop(server);
    assert!(!control.exists(), "the control socket is removed");
    assert_eq!(listed(&format!("{image_text}:/snaps")), ["a1", "b1", "pa", "pb"]);
    assert_eq!(listed(&format!("{image_text}:/")), ["a.raw", "b.raw", "snaps"]);
    assert!(ok(&["fsck", image_text]).contains("clean"));

    // A read-only server takes no snapshot.
    let (server, _socket, control) =
        serve_with_control(dir.path(), image_text, &["/a.raw"], &["--read-only"]);
    snapshot_fails(&control, &["a.raw", "/snaps/ro"], "served read-only");
    stop(server);
    assert_eq!(listed(&format!("{image_text}:/snaps")), ["a1", "b1", "pa", "pb"]);
}

/// A volume of format version 1 (made by an older build) takes no clones:
/// the snapshot is refused with the reason, and nothing is left.
#[test]
fn a_format_version_1_volume_refuses_snapshots() {
    use foliofs::format::Superblock;
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("vol.img");
    let image_text = image.to_str().unwrap();
    ok(&["mkfs", "--size", "64M", image_text]);
    ok(&["mkdir", &format!("{image_text}:/snaps")]);
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&image).unwrap();
    let mut bytes = vec![0; 4096];
    file.read_exact_at(&mut bytes, 0).unwrap();
    let mut superblock = Superblock::decode(&bytes).unwrap();
    superblock.version = 1;
    for copy in 0..2 {
        let offset = Superblock::copy_offset(superblock.block_bytes, copy);
        file.write_all_at(&superblock.encode(), offset).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    let (server, _socket, control) =
        serve_with_control(dir.path(), image_text, &["/disk.raw"], &["--size", "1M"]);
    snapshot_fails(&control, &["disk.raw", "/snaps/d1"], "format version 2");
    stop(server);
    assert!(listed(&format!("{image_text}:/snaps")).is_empty());
    assert!(ok(&["fsck", image_text]).contains("clean"));
}

fn is_mounted(point: &Path) -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = point.to_str().unwrap();
    mountinfo.lines().any(|line| line.split(' ').nth(4) == Some(point))
}

/// A mount whose export sits behind a link that drops every second
/// (the fault proxy between the client and qemu-nbd): the threaded fsx
/// with fsync and a tree of fsynced small files run through it with no
/// error and no mismatch, the daemon logs each reconnect, and fsck is
/// clean afterwards.
#[test]
fn a_mount_on_nbd_rides_out_a_link_dropped_every_second() {
    if tools_missing(&["qemu-nbd", "umount"]) {
        return;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        skip::skip_or_fail("mounting needs root and /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(512 << 20).unwrap();
    let (_server, socket) = qemu_nbd_on(dir.path(), &disk);
    let proxy = FaultProxy::start(Upstream::Unix(socket.clone())).unwrap();
    let uri = format!("{}&timeout=10", proxy.uri("vol"));
    ok(&["mkfs", &uri]);
    let point = dir.path().join("mnt");
    std::fs::create_dir(&point).unwrap();
    let log_path = dir.path().join("mount.log");
    let mut daemon = Reaped(
        Command::new(env!("CARGO_BIN_EXE_foliofs"))
            .args(["mount", "-f", &uri])
            .arg(&point)
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    while !is_mounted(&point) {
        assert!(daemon.0.try_wait().unwrap().is_none(), "foliofs mount exited early");
        assert!(started.elapsed() < Duration::from_secs(20), "mount did not appear");
        std::thread::sleep(Duration::from_millis(10));
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                proxy.drop_links();
            }
        });
        let fsx = Command::new(env!("CARGO_BIN_EXE_foliofs"))
            .args(["fsx", "--threads", "2", "--files", "2", "--ops", "2000", "--seconds", "60"])
            .args(["--seed", "54", "--path"])
            .arg(&point)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&fsx.stdout);
        let tree = point.join("tree");
        std::fs::create_dir(&tree).unwrap();
        for index in 0..300u32 {
            let content = format!("file {index} ").repeat(1 + index as usize % 97);
            let mut file = std::fs::File::create(tree.join(format!("f{index}"))).unwrap();
            std::io::Write::write_all(&mut file, content.as_bytes()).unwrap();
            file.sync_all().unwrap();
        }
        for index in 0..300u32 {
            let content = format!("file {index} ").repeat(1 + index as usize % 97);
            assert_eq!(std::fs::read_to_string(tree.join(format!("f{index}"))).unwrap(), content);
        }
        // However fast the machine, the workload spans several drops.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut more = 0u32;
        while proxy.links_dropped() < 4 {
            assert!(Instant::now() < deadline, "the link never dropped four times");
            let path = tree.join(format!("more{more}"));
            let mut file = std::fs::File::create(&path).unwrap();
            std::io::Write::write_all(&mut file, &more.to_le_bytes()).unwrap();
            file.sync_all().unwrap();
            more += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            fsx.status.success() && stdout.contains("0 mismatches"),
            "fsx through the mount with the link dropping ({}):\n{stdout}\n{}",
            fsx.status,
            String::from_utf8_lossy(&fsx.stderr)
        );
    });
    let output = Command::new("umount").arg(&point).output().unwrap();
    assert!(output.status.success(), "umount: {output:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = daemon.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the daemon did not exit after umount");
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "the daemon failed ({status}):\n{log}");
    let reconnects = log.matches("is back after").count();
    assert!(proxy.links_dropped() >= 3, "dropped {} links", proxy.links_dropped());
    assert!(reconnects >= 3, "{reconnects} reconnects logged:\n{log}");
    assert!(ok(&["fsck", &uri]).contains("clean"));
}
