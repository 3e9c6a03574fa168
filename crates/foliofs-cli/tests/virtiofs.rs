//! A real VM guest mounts a volume through `foliofs serve virtiofs`: QEMU
//! (`qemu-system-x86_64`, TCG unless FOLIOFS_GUEST_ACCEL=kvm) boots the
//! host's Debian kernel with an initramfs this test builds from
//! busybox-static, the kernel's virtio and fuse modules and the `foliofs`
//! binary with its libraries. The guest runs the project's fsx (buffered,
//! O_DIRECT and mmap) and writes a tree of small files, each fsynced,
//! unmounts and powers off; then the image must fsck clean and hold every
//! file the guest wrote. `scripts/test-packages.sh` installs what it needs;
//! without it the test skips, or fails under FOLIOFS_NO_SKIP=1.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../../tests/support/skip.rs"]
mod skip;

const FOLIOFS: &str = env!("CARGO_BIN_EXE_foliofs");
const TREE_DIRS: usize = 8;
const TREE_FILES: usize = 16;

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

struct Guest {
    kernel: PathBuf,
    modules: PathBuf,
}

/// The host's newest /boot/vmlinuz-* with its modules, or why not.
fn find_guest() -> Result<Guest, String> {
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

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|error| panic!("{command:?}: {error}"));
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{command:?} failed: {text}");
    text
}

/// The initramfs: busybox, the modules, foliofs and its libraries, `init`.
fn build_initramfs(guest: &Guest, dir: &Path, init: &str) -> PathBuf {
    let root = dir.join("root");
    for sub in ["bin", "dev", "proc", "sys", "mnt", "modules"] {
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

fn start_server(image: &Path, socket: &Path) -> Child {
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

/// Boots the guest against `socket` and returns its console output.
fn boot(guest: &Guest, initramfs: &Path, socket: &Path, limit: Duration) -> String {
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
    let deadline = Instant::now() + limit;
    while qemu.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = qemu.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = qemu.wait_with_output().unwrap();
    String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr)
}

fn tree_content(dir: usize, file: usize) -> String {
    format!("file {file} of directory {dir}, written and fsynced in the guest")
}

#[test]
fn a_guest_runs_fsx_and_a_synced_tree_on_the_volume_which_fscks_clean() {
    let guest = match find_guest() {
        Ok(guest) => guest,
        Err(why) => return skip::skip_or_fail(&format!("no VM guest: {why}")),
    };
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
