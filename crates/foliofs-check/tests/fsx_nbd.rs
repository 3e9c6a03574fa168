//! fsx over NBD: the same random operations and byte model as `fsx.rs`,
//! with the volume on a real server through the client backend. A crash
//! is the server's: kill -9 (nbdkit's writeback cache loses what was not
//! flushed), a restart, and a remount that replays; everything fsynced
//! must read back. On nbdkit with `-o discard`, so TRIM is among the
//! requests that cross a crash. Bounded for CI (`FOLIOFS_NBD_FSX_OPS` for longer runs);
//! skipped, with the reason printed, where the servers are missing.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use foliofs_check::fsx::{run_on, FsxConfig, FsxDevice};

/// A server on a unix socket, restarted by `power_cut`; killed when dropped.
struct Server {
    program: &'static str,
    args: Vec<String>,
    socket: PathBuf,
    child: Child,
}

impl Server {
    /// `program ARGS` where `{socket}` in ARGS is the socket path; None when
    /// the program is not installed.
    fn start(program: &'static str, dir: &Path, args: &[&str]) -> Option<Self> {
        let socket = dir.join(format!("{program}.sock"));
        let args: Vec<String> =
            args.iter().map(|arg| arg.replace("{socket}", &socket.display().to_string())).collect();
        let child = match spawn(program, &args, &socket) {
            Ok(child) => child,
            Err(error) => {
                skip::skip_or_fail(&format!("{program} cannot run ({error}); .ci/run installs it"));
                return None;
            }
        };
        Some(Self { program, args, socket, child })
    }

    fn uri(&self, export: &str) -> PathBuf {
        PathBuf::from(format!("nbd+unix:///{export}?socket={}", self.socket.display()))
    }

    /// kill -9, then the same server again on the same disk.
    fn power_cut(&mut self) {
        self.stop();
        self.child = spawn(self.program, &self.args, &self.socket).expect("restart the server");
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `program` and waits until its socket accepts a connection (the
/// socket file exists from bind(), a moment before listen()).
fn spawn(program: &str, args: &[String], socket: &Path) -> std::io::Result<Child> {
    let _ = std::fs::remove_file(socket);
    let mut child = Command::new(program).args(args).stderr(Stdio::null()).spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(socket).is_err() {
        if let Some(status) = child.try_wait()? {
            panic!("{program} {args:?} exited: {status}");
        }
        assert!(Instant::now() < deadline, "{program} never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child)
}

fn ops() -> u64 {
    std::env::var("FOLIOFS_NBD_FSX_OPS").ok().and_then(|text| text.parse().ok()).unwrap_or(3000)
}

fn disk(dir: &Path) -> PathBuf {
    let disk = dir.join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(64 << 20).unwrap();
    disk
}

fn fsx_on(server: &mut Server, export: &str, seed: u64, options: &'static str) {
    let uri = server.uri(export);
    let mut power_cut = || server.power_cut();
    let device = FsxDevice::Path { path: &uri, power_cut: &mut power_cut };
    let config = FsxConfig { options, ..FsxConfig::new(seed, ops(), 4096) };
    match run_on(config, device, &mut |_| {}) {
        Ok(stats) => {
            eprintln!("{stats:?}");
            assert!(stats.crash_remounts > 0, "the server was crashed: {stats:?}");
        }
        Err(failure) => panic!("{failure}"),
    }
}

#[test]
fn fsx_on_nbdkit_with_a_volatile_cache() {
    let dir = tempfile::tempdir().unwrap();
    let file = format!("file={}", disk(dir.path()).display());
    let args = ["-f", "-U", "{socket}", "--filter=cache", "file", &file, "cache=writeback"];
    let Some(mut server) = Server::start("nbdkit", dir.path(), &args) else { return };
    // Freed blocks become TRIMs, which the cache filter passes on to the
    // file as punched holes.
    fsx_on(&mut server, "", 15, "discard");
}

#[test]
fn fsx_on_qemu_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk(dir.path()).display().to_string();
    let args = ["-f", "raw", "-x", "vol", "-t", "-e", "4", "-k", "{socket}", &disk];
    let Some(mut server) = Server::start("qemu-nbd", dir.path(), &args) else { return };
    fsx_on(&mut server, "vol", 16, "");
}
