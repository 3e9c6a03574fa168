//! A bounded slice of the crash-point suite with the volume on real NBD
//! servers: every request crosses qemu-nbd or nbdkit through the client
//! backend, and a [`MirrorDev`](foliofs_check::mirror::MirrorDev) records
//! what each answered, so crash images are cut from that log as on the
//! in-memory device (the server's own crashes are fsx_nbd.rs's). After each
//! workload the export must hold exactly what the log says was written.
//! Bounded for CI (`FOLIOFS_NBD_CRASH_WORKLOADS` multiplies the seeds for
//! longer runs); skipped, with the reason printed, where the servers are
//! missing.

#[path = "../../../tests/support/skip.rs"]
mod skip;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foliofs::dev::nbd::NbdDev;
use foliofs::dev::DevOptions;
use foliofs_check::crashtest::{run_one_on, CrashOptions, Stats};
use foliofs_check::workload::{Geometry, WorkloadConfig};

/// A server killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `program ARGS` ({socket} replaced) and waits until its socket
/// accepts a connection; None when the program is not installed.
fn start(program: &str, socket: &Path, args: &[&str]) -> Option<Server> {
    let args: Vec<String> =
        args.iter().map(|arg| arg.replace("{socket}", &socket.display().to_string())).collect();
    let child = match Command::new(program).args(&args).stderr(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(error) => {
            skip::skip_or_fail(&format!("{program} cannot run ({error}); .ci/run installs it"));
            return None;
        }
    };
    let mut server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(socket).is_err() {
        if let Some(status) = server.0.try_wait().unwrap() {
            panic!("{program} {args:?} exited: {status}");
        }
        assert!(Instant::now() < deadline, "{program} never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(server)
}

/// Workloads `seeds` on the export at `uri`, each crashed at every point.
fn slice(uri: &str, options: &'static str, block_bytes: u32, seeds: std::ops::Range<u64>) -> Stats {
    let scale: u64 = std::env::var("FOLIOFS_NBD_CRASH_WORKLOADS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1);
    let mut stats = Stats::default();
    for seed in seeds.start..seeds.start + (seeds.end - seeds.start) * scale {
        let config = WorkloadConfig { options, ..WorkloadConfig::new(seed, block_bytes, 2, 20) };
        let real = Arc::new(NbdDev::open(uri, &DevOptions::default()).expect("connect"));
        if let Err(failure) = run_one_on(config, real, &CrashOptions::default(), &mut stats) {
            panic!("{failure}");
        }
    }
    eprintln!("{uri} -o {options:?}: {stats:?}");
    assert!(stats.images > stats.crash_points, "volatile writes were explored: {stats:?}");
    stats
}

fn disk(dir: &Path) -> String {
    let disk = dir.join("disk.img");
    let bytes = Geometry::of(4096).volume_bytes.max(Geometry::of(65536).volume_bytes);
    std::fs::File::create(&disk).unwrap().set_len(bytes).unwrap();
    disk.display().to_string()
}

#[test]
fn crash_points_on_qemu_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("qemu-nbd.sock");
    let disk = disk(dir.path());
    let args = ["-f", "raw", "-x", "vol", "-t", "-e", "4", "-k", "{socket}", &disk];
    let Some(_server) = start("qemu-nbd", &socket, &args) else { return };
    let uri = format!("nbd+unix:///vol?socket={}", socket.display());
    slice(&uri, "", 4096, 4300..4303);
    slice(&uri, "fua=emulate", 1024, 1300..1302);
}

#[test]
fn crash_points_on_nbdkit() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbdkit.sock");
    let file = format!("file={}", disk(dir.path()));
    let args = ["-f", "-U", "{socket}", "file", &file];
    let Some(_server) = start("nbdkit", &socket, &args) else { return };
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    slice(&uri, "", 4096, 4400..4403);
    slice(&uri, "", 65536, 64400..64401);
}
