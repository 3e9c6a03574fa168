//! NBD through the binary: a volume on qemu-nbd by URI (mkfs, cp, cat,
//! fsck), and `foliofs serve nbd` writing back on SIGTERM. Skipped, with
//! the reason printed, when qemu-utils or libnbd-bin are missing.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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

#[test]
fn a_volume_lives_on_qemu_nbd_by_uri() {
    if tools_missing(&["qemu-nbd", "qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let socket = dir.path().join("q.sock");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    let mut server = Reaped(
        Command::new("qemu-nbd")
            .args(["-f", "raw", "-x", "vol", "-t", "-k"])
            .arg(&socket)
            .arg(&disk)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_socket(&socket, &mut server.0);
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
