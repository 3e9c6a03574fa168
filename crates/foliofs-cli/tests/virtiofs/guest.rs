//! The VM guest the virtio-fs tests boot: QEMU (`qemu-system-x86_64`, TCG
//! unless FOLIOFS_GUEST_ACCEL=kvm) runs the host's Debian kernel with an
//! initramfs built from busybox-static, the kernel's virtio and fuse
//! modules and the `foliofs` binary with its libraries; `init` is a shell
//! script the test writes. The guest's console comes back line by line,
//! so a test can act (kill the server) on what the guest printed.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const FOLIOFS: &str = env!("CARGO_BIN_EXE_foliofs");

/// The modules virtio-fs needs, in load order (modules.dep of Debian's
/// 6.1 kernel; the ones built in are skipped).
const MODULES: &[&str] = &[
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci_modern_dev",
    "drivers/virtio/virtio_pci",
    "fs/fuse/fuse",
    "fs/fuse/virtiofs",
];

/// Guests boot one at a time: each is a TCG emulation that takes a whole
/// CPU, and two at once would each run past their deadlines.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static GUEST: Mutex<()> = Mutex::new(());
    GUEST.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub struct Guest {
    kernel: PathBuf,
    modules: PathBuf,
}

/// The host's newest /boot/vmlinuz-* with its modules, or why not.
pub fn find_guest() -> Result<Guest, String> {
    for tool in ["qemu-system-x86_64", "cpio"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !found {
            return Err(format!("{tool} is not installed (scripts/test-packages.sh)"));
        }
    }
    if !Path::new("/bin/busybox").exists() {
        return Err("/bin/busybox is missing (busybox-static)".into());
    }
    let mut kernels: Vec<PathBuf> = fs::read_dir("/boot")
        .map_err(|error| format!("/boot: {error}"))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("vmlinuz-"))
        })
        .collect();
    kernels.sort();
    let kernel = kernels.pop().ok_or("no /boot/vmlinuz-* (linux-image-amd64)")?;
    let release =
        kernel.file_name().unwrap().to_string_lossy().trim_start_matches("vmlinuz-").to_string();
    let modules = PathBuf::from(format!("/lib/modules/{release}/kernel"));
    if !modules.join("fs/fuse/virtiofs.ko").exists()
        && !modules.join("fs/fuse/virtiofs.ko.xz").exists()
    {
        return Err(format!("{}: no fs/fuse/virtiofs.ko", modules.display()));
    }
    Ok(Guest { kernel, modules })
}

pub fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|error| panic!("{command:?}: {error}"));
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{command:?} failed: {text}");
    text
}

/// The initramfs: busybox, the modules, foliofs and its libraries, `init`.
pub fn build_initramfs(guest: &Guest, dir: &Path, init: &str) -> PathBuf {
    let root = dir.join("root");
    for sub in ["bin", "dev", "proc", "sys", "mnt", "modules", "tmp"] {
        fs::create_dir_all(root.join(sub)).unwrap();
    }
    fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    fs::copy(FOLIOFS, root.join("bin/foliofs")).unwrap();
    let libraries = run(Command::new("ldd").arg(FOLIOFS));
    for library in libraries.split_whitespace().filter(|word| word.starts_with('/')) {
        let target = root.join(library.trim_start_matches('/'));
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        fs::copy(library, &target).unwrap_or_else(|error| panic!("{library}: {error}"));
    }
    let mut loads = String::new();
    for module in MODULES {
        let name = Path::new(module).file_name().unwrap().to_string_lossy().to_string();
        let plain = guest.modules.join(format!("{module}.ko"));
        let packed = guest.modules.join(format!("{module}.ko.xz"));
        let target = root.join(format!("modules/{name}.ko"));
        if plain.exists() {
            fs::copy(&plain, &target).unwrap();
        } else if packed.exists() {
            // busybox's insmod takes plain modules only.
            let unpacked = Command::new("xz").arg("-dc").arg(&packed).output().unwrap();
            assert!(unpacked.status.success(), "xz -dc {}", packed.display());
            fs::write(&target, unpacked.stdout).unwrap();
        } else {
            continue; // built in
        }
        loads += &format!("insmod /modules/{name}.ko\n");
    }
    let script = format!(
        "#!/bin/busybox sh\n/bin/busybox --install -s /bin\n\
         mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev\n\
         {loads}{init}\npoweroff -f\n"
    );
    fs::write(root.join("init"), script).unwrap();
    run(Command::new("chmod").arg("+x").arg(root.join("init")));
    let image = dir.join("initramfs.cpio");
    run(Command::new("sh")
        .current_dir(&root)
        .args(["-c", &format!("find . | cpio -o -H newc --quiet > {}", image.display())]));
    image
}

/// `foliofs serve virtiofs IMAGE --socket SOCKET`, once its socket exists.
/// `nice` execs foliofs, so the child's pid is the server's.
pub fn start_server(image: &Path, socket: &Path) -> Child {
    let child = Command::new("nice")
        .args(["-n", "19", FOLIOFS, "serve", "virtiofs"])
        .arg(image)
        .arg("--socket")
        .arg(socket)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the server made no socket in 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// A booted guest: QEMU, with its console as lines.
pub struct RunningGuest {
    qemu: Child,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
    /// Every console line received so far.
    pub console: String,
}

/// Boots the guest against the vhost-user `socket`.
pub fn spawn_guest(guest: &Guest, initramfs: &Path, socket: &Path) -> RunningGuest {
    let accel = std::env::var("FOLIOFS_GUEST_ACCEL").unwrap_or_else(|_| "tcg".into());
    let mut qemu = Command::new("nice")
        .args(["-n", "19", "qemu-system-x86_64", "-machine"])
        .arg(format!("q35,accel={accel}"))
        .args(["-cpu", "max", "-smp", "2", "-m", "512M", "-nographic", "-no-reboot"])
        .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
        .args(["-numa", "node,memdev=mem", "-chardev"])
        .arg(format!("socket,id=char0,path={}", socket.display()))
        .args(["-device", "vhost-user-fs-pci,queue-size=1024,chardev=char0,tag=folio"])
        .arg("-kernel")
        .arg(&guest.kernel)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (send, lines) = std::sync::mpsc::channel();
    let mut stdout = BufReader::new(qemu.stdout.take().unwrap());
    std::thread::spawn(move || {
        let mut line = Vec::new();
        while stdout.read_until(b'\n', &mut line).is_ok_and(|read| read > 0) {
            let text = String::from_utf8_lossy(&line).trim_end().to_string();
            if send.send(text).is_err() {
                return;
            }
            line.clear();
        }
    });
    let mut stderr = qemu.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    RunningGuest { qemu, lines, stderr: Some(stderr), console: String::new() }
}

impl RunningGuest {
    /// Waits for a console line `wanted` accepts and returns it, or None
    /// when the console ends or `deadline` passes first.
    pub fn wait_for_line(
        &mut self,
        deadline: Instant,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.console += &line;
                    self.console.push('\n');
                    if wanted(&line) {
                        return Some(line);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Waits until the guest powers off (killing it at `deadline`) and
    /// returns its whole console, QEMU's own messages last.
    pub fn finish(mut self, deadline: Instant) -> String {
        self.wait_for_line(deadline, |_| false);
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(1)) {
            self.console += &line;
            self.console.push('\n');
        }
        self.console + &self.stderr.take().unwrap().join().unwrap_or_default()
    }
}

/// Boots the guest against `socket` and returns its console output once
/// it powers off, or once `limit` has passed.
pub fn boot(guest: &Guest, initramfs: &Path, socket: &Path, limit: Duration) -> String {
    spawn_guest(guest, initramfs, socket).finish(Instant::now() + limit)
}
