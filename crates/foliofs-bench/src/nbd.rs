//! qemu-nbd in front of the scratch image, for the seed rows that put the
//! engine (and the raw limit) on an NBD export of the same disk: the cost
//! of the network hop, over a unix socket.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Why the NBD rows cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    let found = Command::new("sh").args(["-c", "command -v qemu-nbd"]).output();
    if found.is_ok_and(|output| output.status.success()) {
        None
    } else {
        Some("qemu-nbd is not installed (apt-get install qemu-utils)".into())
    }
}

/// A qemu-nbd serving one raw image; stopped when dropped.
pub struct QemuNbd {
    child: Child,
    socket: PathBuf,
}

impl QemuNbd {
    /// Serves `image` with O_DIRECT and Linux AIO (as the engine opens its
    /// image), writable, to one client after another (-t), on a unix socket
    /// beside it.
    pub fn start(image: &Path) -> anyhow::Result<Self> {
        let socket = image.with_extension(format!("{}.nbd.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let child = Command::new("qemu-nbd")
            .args([
                "-f",
                "raw",
                "-x",
                "seeds",
                "--cache=none",
                "--aio=native",
                "-t",
                "-e",
                "4",
                "-k",
            ])
            .arg(&socket)
            .arg(image)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start qemu-nbd")?;
        let mut server = Self { child, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&server.socket).is_err() {
            if let Some(status) = server.child.try_wait()? {
                bail!("qemu-nbd on {} exited: {status}", image.display());
            }
            if Instant::now() > deadline {
                bail!("qemu-nbd on {} never listened", image.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }

    /// The export's URI, usable wherever an image path is.
    pub fn uri(&self) -> PathBuf {
        PathBuf::from(format!("nbd+unix:///seeds?socket={}", self.socket.display()))
    }
}

impl Drop for QemuNbd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}
