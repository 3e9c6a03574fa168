//! The kernel's own file systems as peers: ext4 and XFS on loop devices
//! (`losetup --direct-io=on`), driven by real fio. `bench seeds` formats
//! them over the engine's own image, one after the other, so every row of a
//! comparison writes the same host file; `bench tree` gives each a file of
//! its own. Everything set up here (mounts, loop devices, files, sysctl
//! changes) is registered for cleanup, which runs on drop and on
//! SIGINT/SIGTERM, so an interrupted run leaves nothing mounted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use parking_lot::Mutex;
use serde_json::Value;

/// Undo actions, most recent last.
static CLEANUP: Cleanup = Cleanup::new();
static HANDLER: Once = Once::new();

/// The undo actions a run registered, and who is running them.
struct Cleanup {
    pending: Mutex<Vec<Undo>>,
    /// Held while actions run. On SIGINT the handler thread cleans up while
    /// the main thread, whose child the signal also killed, returns an error
    /// and ends the process: its own cleanup (a drop) waits here for the
    /// handler's instead of finding the list empty and exiting under it,
    /// which left mounts and files behind.
    running: Mutex<()>,
}

impl Cleanup {
    const fn new() -> Self {
        Self { pending: Mutex::new(Vec::new()), running: Mutex::new(()) }
    }

    /// Runs every pending action, newest first; returns once no run of
    /// them, this one or another thread's, is still going. `report` says
    /// what was removed (an interrupted run tells its user).
    fn run_all(&self, report: bool) {
        let _running = self.running.lock();
        let actions: Vec<Undo> = std::mem::take(&mut *self.pending.lock());
        for action in actions.into_iter().rev() {
            action.run(report);
        }
    }
}

#[derive(PartialEq)]
enum Undo {
    Unmount(PathBuf),
    DetachLoop(String),
    Remove(PathBuf),
    /// A mount point: removed only if empty, so a mount that neither
    /// unmount could detach keeps what it holds.
    RemoveEmptyDir(PathBuf),
    Sysctl(String, String),
}

/// The one SIGINT/SIGTERM/SIGHUP handler of a bench run (a process may
/// have one): it undoes everything registered here, the temporary image
/// included, and exits with 128 + SIGTERM, as a shell reports a process
/// SIGTERM killed. It runs on a thread of its own, so it works while the
/// run's threads are stuck in I/O.
fn register(undo: Undo) {
    HANDLER.call_once(|| {
        let installed = ctrlc::set_handler(|| {
            eprintln!("\nfoliofs bench: stopped; undoing what the run set up");
            CLEANUP.run_all(true);
            std::process::exit(128 + libc::SIGTERM);
        });
        if let Err(error) = installed {
            eprintln!("warning: no cleanup on interrupt ({error})");
        }
    });
    CLEANUP.pending.lock().push(undo);
}

/// Removes `path` (a file, or a directory and what it holds) when the run
/// is cleaned up.
pub fn remove_at_cleanup(path: &Path) {
    register(Undo::Remove(path.to_path_buf()));
}

/// Forgets a removal registered with [`remove_at_cleanup`], once the path
/// is gone by other means.
pub fn forget_removal(path: &Path) {
    unregister(&Undo::Remove(path.to_path_buf()));
}

/// Runs the cleanup when dropped: what a run set up and did not undo
/// itself is undone as it ends, however it ends.
pub struct CleanUpOnDrop;

impl Drop for CleanUpOnDrop {
    fn drop(&mut self) {
        clean_up_all();
    }
}

/// Forgets `undo` (its newest registration), once done by other means.
fn unregister(undo: &Undo) {
    let mut actions = CLEANUP.pending.lock();
    if let Some(index) = actions.iter().rposition(|action| action == undo) {
        actions.remove(index);
    }
}

/// Runs every registered undo action, newest first.
pub fn clean_up_all() {
    CLEANUP.run_all(false);
}

impl Undo {
    fn run(self, report: bool) {
        match self {
            Undo::Unmount(path) => {
                // Quietly: a FUSE mount is usually gone already.
                let _ = Command::new("umount").arg(&path).stderr(Stdio::null()).status();
                if is_mounted(&path) {
                    // Busy (a fio the interrupt did not reach still holds
                    // it): detached now, gone when its last user closes.
                    let _ = Command::new("umount").arg("-l").arg(&path).status();
                }
            }
            Undo::DetachLoop(device) => {
                // A device still held by a lazily unmounted file system is
                // marked to detach once released.
                let _ = Command::new("losetup").args(["-d", &device]).status();
            }
            Undo::Remove(path) => {
                let removed =
                    std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
                if report && removed.is_ok() {
                    eprintln!("foliofs bench: stopped; removed {}", path.display());
                }
            }
            Undo::RemoveEmptyDir(path) => {
                let _ = std::fs::remove_dir(&path);
            }
            Undo::Sysctl(key, value) => {
                let _ = std::fs::write(format!("/proc/sys/vm/{key}"), value);
            }
        }
    }
}

fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command.output().with_context(|| format!("run {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Why peers cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (loop devices and mounts need it)".into());
    }
    for tool in ["fio", "losetup", "mkfs.ext4", "mkfs.xfs", "mount"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
        if !found.is_ok_and(|output| output.status.success()) {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// Writes `path` whole, with O_DIRECT, in pseudo-random data. Every backing
/// file of a comparison is laid out the same way: on a virtual disk, how fast
/// a block is rewritten depends on what the host holds under it (a block
/// never written, or written with zeros, can be several times faster to
/// write than one holding data), so files laid out differently are not
/// comparable. The kernel peers' mkfs must then not discard what this wrote:
/// a loop device turns a discard into a hole punched in its file.
pub fn lay_out(path: &Path, size_bytes: u64) -> anyhow::Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const CHUNK_BYTES: usize = 4 << 20;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    let mut chunk = foliofs::dev::AlignedBuf::zeroed(CHUNK_BYTES);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut offset = 0u64;
    while offset < size_bytes {
        for word in chunk.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let length = (size_bytes - offset).min(CHUNK_BYTES as u64) as usize;
        let length = length.div_ceil(4096) * 4096;
        file.write_all_at(&chunk[..length], offset)
            .with_context(|| format!("lay out {}", path.display()))?;
        offset += length as u64;
    }
    file.sync_all().with_context(|| format!("sync {}", path.display()))?;
    Ok(())
}

/// The kernel file systems compared, in the order their rows run.
pub const KERNEL_FILE_SYSTEMS: [&str; 2] = ["ext4", "xfs"];

/// A kernel file system made on a loop device over a backing file and
/// mounted, until `stop` (or the run's cleanup).
pub struct KernelFs {
    pub name: &'static str,
    pub mount: PathBuf,
    loop_device: String,
}

impl KernelFs {
    /// Makes `name` ("ext4" or "xfs") over `backing` and mounts it on
    /// `mount`, with room for at least `inodes` files on ext4 (0: mkfs's
    /// default). mkfs discards nothing (the backing file keeps its layout,
    /// see `lay_out`) and ext4 initializes its inode tables and journal at
    /// once, so no lazy-init thread writes behind a measured row.
    pub fn start(
        name: &'static str,
        backing: &Path,
        mount: PathBuf,
        inodes: u64,
    ) -> anyhow::Result<Self> {
        let loop_device =
            run(Command::new("losetup").args(["--direct-io=on", "-f", "--show"]).arg(backing))?
                .trim()
                .to_string();
        register(Undo::DetachLoop(loop_device.clone()));
        let mut mkfs = match name {
            "ext4" => {
                let mut mkfs = Command::new("mkfs.ext4");
                mkfs.args(["-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"]);
                if inodes > 0 {
                    mkfs.arg("-N").arg(inodes.to_string());
                }
                mkfs
            }
            "xfs" => {
                let mut mkfs = Command::new("mkfs.xfs");
                mkfs.args(["-q", "-f", "-K"]);
                mkfs
            }
            other => bail!("no kernel peer named {other:?} (known: ext4, xfs)"),
        };
        run(mkfs.arg(&loop_device))?;
        std::fs::create_dir_all(&mount)?;
        run(Command::new("mount").arg(&loop_device).arg(&mount))?;
        register(Undo::Unmount(mount.clone()));
        Ok(Self { name, mount, loop_device })
    }

    /// Bytes the loop device has written so far (its sectors written).
    pub fn bytes_written(&self) -> u64 {
        let name = self.loop_device.trim_start_matches("/dev/");
        std::fs::read_to_string(format!("/sys/block/{name}/stat"))
            .ok()
            .and_then(|stat| stat.split_whitespace().nth(6).and_then(|field| field.parse().ok()))
            .map_or(0, |sectors: u64| sectors * 512)
    }

    /// Read requests and bytes the loop device has completed so far.
    pub fn reads(&self) -> (u64, u64) {
        let name = self.loop_device.trim_start_matches("/dev/");
        let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap_or_default();
        let field = |index: usize| -> u64 {
            stat.split_whitespace().nth(index).and_then(|field| field.parse().ok()).unwrap_or(0)
        };
        (field(0), field(2) * 512)
    }

    /// Unmounts the file system and keeps the loop device, to mount it
    /// again (`bench scale` times a close and an open).
    pub fn unmount(&self) -> anyhow::Result<()> {
        unmount_retrying_unheld(&self.mount, UNMOUNT_TRIES, |point| {
            run(Command::new("umount").arg(point)).map(drop)
        })?;
        unregister(&Undo::Unmount(self.mount.clone()));
        Ok(())
    }

    /// Mounts the loop device again after [`KernelFs::unmount`].
    pub fn mount_again(&self) -> anyhow::Result<()> {
        run(Command::new("mount").arg(&self.loop_device).arg(&self.mount))?;
        register(Undo::Unmount(self.mount.clone()));
        Ok(())
    }

    /// Unmounts and detaches the loop device, leaving the backing file to
    /// the next user.
    pub fn stop(self) -> anyhow::Result<()> {
        unmount_retrying_unheld(&self.mount, UNMOUNT_TRIES, |point| {
            run(Command::new("umount").arg(point)).map(drop)
        })?;
        unregister(&Undo::Unmount(self.mount.clone()));
        let _ = std::fs::remove_dir(&self.mount);
        run(Command::new("losetup").args(["-d", &self.loop_device]))?;
        unregister(&Undo::DetachLoop(self.loop_device.clone()));
        Ok(())
    }
}

/// ext4 and XFS mounted side by side, each on a loop device over a file of
/// its own in `dir` (`bench tree`).
pub struct Peers {
    pub file_systems: Vec<KernelFs>,
}

impl Peers {
    /// Both peers, with room for at least `inodes` files on ext4 (whose
    /// inode table is fixed at mkfs: one per 16 KiB by default; XFS
    /// allocates its inodes as it goes).
    pub fn start_for_files(dir: &Path, size_bytes: u64, inodes: u64) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        register(Undo::Remove(dir.to_path_buf()));
        let mut file_systems = Vec::new();
        for name in KERNEL_FILE_SYSTEMS {
            let backing = dir.join(format!("{name}.img"));
            lay_out(&backing, size_bytes)?;
            let mount = dir.join(format!("mnt-{name}"));
            file_systems.push(KernelFs::start(name, &backing, mount, inodes)?);
        }
        Ok(Self { file_systems })
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        clean_up_all();
    }
}

/// foliofs itself mounted through FUSE by the `foliofs` executable
/// (`foliofs mount -f`), so the same fio command runs across the kernel's
/// FUSE crossing as on the kernel peers.
pub struct FuseMount {
    pub mount: PathBuf,
    daemon: Option<Child>,
}

impl FuseMount {
    /// Mounts the (formatted) `image` on `mount` with `-o options`.
    pub fn start(
        program: &Path,
        image: &Path,
        mount: &Path,
        options: &str,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(mount)?;
        let mount = mount.canonicalize()?;
        // Once per mount point (rows reuse it), and undone after the
        // unmount registered below.
        let mount_point = Undo::RemoveEmptyDir(mount.clone());
        unregister(&mount_point);
        register(mount_point);
        let mut daemon = Command::new(program)
            .args(["mount", "-f", "-o", options])
            .arg(image)
            .arg(&mount)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("start {} mount", program.display()))?;
        register(Undo::Unmount(mount.clone()));
        let started = Instant::now();
        while !is_mounted(&mount) {
            if let Some(status) = daemon.try_wait()? {
                bail!("foliofs mount exited ({status}) before mounting {}", mount.display());
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = daemon.kill();
                bail!("{} was not mounted within 30 s", mount.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Self { mount, daemon: Some(daemon) })
    }

    /// Bytes the daemon has sent to storage so far (its /proc io counter).
    pub fn bytes_written(&self) -> u64 {
        let Some(daemon) = &self.daemon else { return 0 };
        std::fs::read_to_string(format!("/proc/{}/io", daemon.id()))
            .ok()
            .and_then(|io| {
                io.lines()
                    .find_map(|line| line.strip_prefix("write_bytes: "))
                    .and_then(|value| value.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The daemon's process id, while it runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Child::id)
    }

    /// Bytes the daemon has read from storage so far (its /proc io
    /// counter, which counts O_DIRECT reads as the block layer submits
    /// them).
    pub fn bytes_read(&self) -> u64 {
        let Some(daemon) = &self.daemon else { return 0 };
        std::fs::read_to_string(format!("/proc/{}/io", daemon.id()))
            .ok()
            .and_then(|io| {
                io.lines()
                    .find_map(|line| line.strip_prefix("read_bytes: "))
                    .and_then(|value| value.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// Ends the daemon with SIGKILL, as a crash would, and detaches the
    /// mount: the connection is aborted first, since a daemon killed while
    /// the kernel waits on it can stay stuck there (README).
    pub fn kill(mut self) -> anyhow::Result<()> {
        use std::os::unix::fs::MetadataExt;
        // The mount's root is on the connection's device: its minor number
        // names the connection. Read while the daemon can still answer.
        let minor = std::fs::metadata(&self.mount).map(|metadata| libc::minor(metadata.dev()));
        let mut daemon = self.daemon.take().expect("running");
        // An error here is a daemon already gone: the wait below reaps it.
        let killed = daemon.kill();
        if let Ok(minor) = minor {
            let _ = std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        unregister(&Undo::Unmount(self.mount.clone()));
        daemon.wait().context("wait for the killed foliofs daemon")?;
        killed.context("kill the foliofs daemon")
    }

    /// Unmounts and waits for the daemon to write back and exit.
    pub fn stop(mut self) -> anyhow::Result<()> {
        let mut daemon = self.daemon.take().expect("running");
        let unmounted = unmount_retrying_unheld(&self.mount, UNMOUNT_TRIES, |point| {
            run(Command::new("umount").arg(point)).map(drop)
        });
        if let Err(error) = unmounted {
            // Name what kept the mount busy: the failure is rare and only under load, so the
            // error itself must carry the evidence.
            let holders = mount_holders(&self.mount);
            let error =
                error.context(format!("processes using {}: {holders:?}", self.mount.display()));
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
            let _ = daemon.kill();
            let _ = daemon.wait();
            return Err(error);
        }
        unregister(&Undo::Unmount(self.mount.clone()));
        let status = daemon.wait()?;
        if !status.success() {
            bail!("foliofs mount exited with {status} after unmount");
        }
        Ok(())
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
    }
}

fn is_mounted(point: &Path) -> bool {
    let point = point.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|info| info.lines().any(|line| line.split(' ').nth(4) == Some(&*point)))
}

/// Sets /proc/sys/vm values until the guard drops (or the run is
/// interrupted).
pub struct SysctlGuard {
    saved: Vec<(String, String)>,
}

impl SysctlGuard {
    pub fn set(values: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut saved = Vec::new();
        for (key, value) in values {
            let path = format!("/proc/sys/vm/{key}");
            let old = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
            register(Undo::Sysctl(key.to_string(), old.trim().to_string()));
            saved.push((key.to_string(), old.trim().to_string()));
            std::fs::write(&path, value).with_context(|| format!("write {path}"))?;
        }
        Ok(Self { saved })
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        for (key, value) in &self.saved {
            let _ = std::fs::write(format!("/proc/sys/vm/{key}"), value);
        }
    }
}

/// Runs fio with `arguments` (fio's own options) plus JSON output; returns
/// the first job.
pub fn fio(arguments: &[String]) -> anyhow::Result<Value> {
    let output = run(Command::new("fio").args(arguments).arg("--output-format=json"))?;
    // fio may print notes before the JSON.
    let start = output.find('{').context("fio printed no JSON")?;
    let json: Value = serde_json::from_str(&output[start..]).context("parse fio's JSON")?;
    Ok(json["jobs"][0].clone())
}

/// Unmount attempts while no process holds the mount. Right after the last
/// user exits the kernel may still answer EBUSY with nothing left to name:
/// files an exited program's io_uring or AIO context held are put by a
/// kernel worker a moment later (seen under load on 2026-11-26: `umount`
/// busy, holders `[]`, the seed 004 run lost).
const UNMOUNT_TRIES: u32 = 20;

/// Calls `unmount` until it succeeds, retrying 100 ms apart (at most `tries`
/// calls) only while no process holds `point`: a real holder will not go
/// away by waiting, so its error is returned at once.
fn unmount_retrying_unheld(
    point: &Path,
    tries: u32,
    mut unmount: impl FnMut(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut tried = 1;
    loop {
        match unmount(point) {
            Ok(()) => return Ok(()),
            Err(error) if tried >= tries || !mount_holders(point).is_empty() => return Err(error),
            Err(_) => {
                tried += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Processes with an open file, working directory or root under `point`, as "PID (COMM) PATH".
fn mount_holders(point: &Path) -> Vec<String> {
    let mut holders = Vec::new();
    let Ok(processes) = std::fs::read_dir("/proc") else { return holders };
    for process in processes.flatten() {
        let pid = process.file_name();
        if !pid.to_string_lossy().bytes().all(|byte| byte.is_ascii_digit()) {
            continue;
        }
        let dir = process.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let mut links: Vec<PathBuf> = vec![dir.join("cwd"), dir.join("root")];
        if let Ok(fds) = std::fs::read_dir(dir.join("fd")) {
            links.extend(fds.flatten().map(|fd| fd.path()));
        }
        for link in links {
            if let Ok(target) = std::fs::read_link(&link) {
                if target.starts_with(point) {
                    holders.push(format!(
                        "{} ({}) {}",
                        pid.to_string_lossy(),
                        comm.trim(),
                        target.display()
                    ));
                }
            }
        }
    }
    holders
}

#[cfg(test)]
mod holder_tests {
    use super::{mount_holders, unmount_retrying_unheld};
    use anyhow::bail;

    fn scratch_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("foliofs-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn unmount_retries_while_nothing_holds_the_mount() {
        let dir = scratch_dir("unheld");
        let mut calls = 0;
        let result = unmount_retrying_unheld(&dir, 20, |_| {
            calls += 1;
            if calls < 3 {
                bail!("target is busy");
            }
            Ok(())
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(calls, 3);
    }

    #[test]
    fn unmount_gives_up_at_once_when_a_process_holds_the_mount() {
        let dir = scratch_dir("held");
        let _file = std::fs::File::create(dir.join("held")).unwrap();
        let mut calls = 0;
        let result = unmount_retrying_unheld(&dir, 20, |_| {
            calls += 1;
            bail!("target is busy")
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(result.is_err());
        assert_eq!(calls, 1, "a held mount is not retried");
    }

    #[test]
    fn mount_holders_names_this_process_open_file() {
        let dir = std::env::temp_dir().join(format!("foliofs-holders-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("held");
        let _file = std::fs::File::create(&path).unwrap();
        let me = std::process::id().to_string();
        let holders = mount_holders(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            holders.iter().any(|holder| holder.starts_with(&me) && holder.ends_with("held")),
            "{holders:?}"
        );
    }
}

#[cfg(test)]
mod kernel_fs_tests {
    use super::{lay_out, register, unavailable, unregister, Cleanup, KernelFs, Undo, CLEANUP};
    use std::os::unix::fs::MetadataExt;

    /// (No `clean_up_all` here: it would undo the other tests' mounts.)
    #[test]
    fn unregister_forgets_only_the_action_named() {
        let kept = std::path::PathBuf::from("/nonexistent/foliofs-kept");
        let forgotten = std::path::PathBuf::from("/nonexistent/foliofs-forgotten");
        register(Undo::Remove(kept.clone()));
        register(Undo::Remove(forgotten.clone()));
        unregister(&Undo::Remove(forgotten.clone()));
        let registered = |path: &std::path::PathBuf| {
            CLEANUP.pending.lock().iter().any(|action| *action == Undo::Remove(path.clone()))
        };
        let (kept_registered, forgotten_registered) = (registered(&kept), registered(&forgotten));
        unregister(&Undo::Remove(kept.clone()));
        assert!(kept_registered, "unregister forgot another action");
        assert!(!forgotten_registered, "unregister kept the action named");
    }

    /// A second cleanup (the main thread's drop) returns only once the one
    /// under way (the SIGINT handler's) is done, not at once with nothing
    /// left to take: the process must not end under the first.
    #[test]
    fn a_cleanup_waits_for_the_one_under_way() {
        let cleanup: &'static Cleanup = Box::leak(Box::new(Cleanup::new()));
        let dir = std::env::temp_dir().join(format!("foliofs-cleanup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for index in 0..3000 {
            std::fs::write(dir.join(format!("f{index}")), b"x").unwrap();
        }
        cleanup.pending.lock().push(Undo::Remove(dir.clone()));
        let first = std::thread::spawn(move || cleanup.run_all(false));
        while !cleanup.pending.lock().is_empty() {
            std::thread::yield_now();
        }
        cleanup.run_all(false);
        let left = dir.exists();
        first.join().unwrap();
        assert!(!left, "the second cleanup returned while the first was still removing");
    }

    /// The peers' mkfs must not punch holes in a laid-out backing file (a
    /// loop device turns discards into holes), or the peers would write to
    /// freshly allocated host blocks while the engine overwrites data.
    #[test]
    fn kernel_peers_keep_the_backing_file_laid_out() {
        if let Some(why) = unavailable() {
            eprintln!("kernel peers not tried: {why}");
            return;
        }
        let dir = std::env::temp_dir().join(format!("foliofs-peer-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let backing = dir.join("image");
        let size_bytes = 320u64 << 20; // XFS's smallest volume is 300 MiB
        lay_out(&backing, size_bytes).unwrap();
        let allocated = |path: &std::path::Path| std::fs::metadata(path).unwrap().blocks() * 512;
        // At least: the host file system may count a block of its own.
        assert!(allocated(&backing) >= size_bytes);
        for name in super::KERNEL_FILE_SYSTEMS {
            let fs = KernelFs::start(name, &backing, dir.join(format!("mnt-{name}")), 0).unwrap();
            std::fs::write(fs.mount.join("file"), b"peer").unwrap();
            fs.stop().unwrap();
            let after = allocated(&backing);
            assert!(after >= size_bytes, "{name}'s mkfs punched holes: {after} bytes allocated");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
