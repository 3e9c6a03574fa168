//! The child processes of `bench scale` (`foliofs bench scale --worker
//! TASK`): each creates, opens or checks the files of one target and
//! reports on its stdout, one JSON object a line, as it goes. The work runs
//! in a child so that its peak memory (VmHWM) is its own, and so that it
//! can be killed with SIGKILL part-way, as a crash would end it.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use foliofs::{Error, Owner, Permissions, Volume, VolumeOptions, ROOT_INO};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};

/// Where a worker's files are: inside a volume (opened in process), or
/// under a directory of a mounted file system (through the kernel).
#[derive(Debug, Clone, PartialEq)]
pub enum Place {
    Volume { image: PathBuf, options: String },
    Dir(PathBuf),
}

/// What a worker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Create the files, a window at a time.
    Create,
    /// Open the volume (timed), then stat or check its files.
    Open,
}

/// One worker's task, passed to it as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub job: Job,
    pub place: Place,
    pub files: u64,
    pub per_dir: u64,
    pub window: u64,
    /// Create: make each window durable and report it (`durable` events),
    /// then, once all are made, wait to be killed instead of closing.
    pub until_killed: bool,
    /// Open: stat every file in an order shuffled from this seed.
    pub stat_seed: Option<u64>,
    /// Open: count the files present, and check that the first `durable`
    /// are.
    pub verify_durable: Option<u64>,
}

impl Task {
    pub fn to_json(&self) -> Value {
        let place = match &self.place {
            Place::Volume { image, options } => json!({"image": image, "options": options}),
            Place::Dir(dir) => json!({"dir": dir}),
        };
        json!({
            "job": match self.job { Job::Create => "create", Job::Open => "open" },
            "place": place,
            "files": self.files,
            "per_dir": self.per_dir,
            "window": self.window,
            "until_killed": self.until_killed,
            "stat_seed": self.stat_seed,
            "verify_durable": self.verify_durable,
        })
    }

    pub fn from_json(value: &Value) -> anyhow::Result<Self> {
        let number = |key: &str| value[key].as_u64().with_context(|| format!("task: no {key}"));
        let place = &value["place"];
        let place = match (place["image"].as_str(), place["dir"].as_str()) {
            (Some(image), _) => Place::Volume {
                image: image.into(),
                options: place["options"].as_str().unwrap_or_default().to_string(),
            },
            (None, Some(dir)) => Place::Dir(dir.into()),
            (None, None) => bail!("task: no image or dir"),
        };
        let job = match value["job"].as_str() {
            Some("create") => Job::Create,
            Some("open") => Job::Open,
            other => bail!("task: job {other:?}"),
        };
        let task = Task {
            job,
            place,
            files: number("files")?,
            per_dir: number("per_dir")?,
            window: number("window")?,
            until_killed: value["until_killed"].as_bool().unwrap_or(false),
            stat_seed: value["stat_seed"].as_u64(),
            verify_durable: value["verify_durable"].as_u64(),
        };
        anyhow::ensure!(task.per_dir > 0 && task.window > 0, "task: per_dir and window >= 1");
        Ok(task)
    }
}

/// File `index`'s directory and name: `d<index / per_dir>/f<index>`.
pub fn names_of(index: u64, per_dir: u64) -> (String, String) {
    (format!("d{}", index / per_dir), format!("f{index}"))
}

/// Every file's index, shuffled from `seed` (the stat pass's order).
pub fn shuffled(files: u64, seed: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..files).collect();
    order.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(seed));
    order
}

/// A process's peak resident memory (VmHWM), in bytes.
pub fn vm_hwm_bytes(pid: &str) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

/// A memory field of a process's /proc status (`VmRSS:`, `VmHWM:`), in
/// bytes; `pid` may be `self`.
pub fn status_bytes(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix(field))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

fn emit(event: Value) {
    // One line each, flushed at once: the parent acts on `durable` lines
    // as they come (it kills the worker half-way).
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{event}");
    let _ = out.flush();
}

/// Runs the task given as JSON text (the worker's command line).
pub fn run(task_text: &str) -> anyhow::Result<()> {
    let task = Task::from_json(&serde_json::from_str(task_text).context("the worker's task")?)?;
    match (&task.job, &task.place) {
        (Job::Create, Place::Volume { image, options }) => {
            create_in_volume(&task, image, &VolumeOptions::parse(options)?)
        }
        (Job::Create, Place::Dir(dir)) => create_in_dir(&task, dir),
        (Job::Open, Place::Volume { image, options }) => {
            open_volume(&task, image, &VolumeOptions::parse(options)?)
        }
        (Job::Open, Place::Dir(_)) => bail!("an open task is for a volume in process"),
    }?;
    emit(json!({"event": "memory", "vm_hwm_bytes": vm_hwm_bytes("self")}));
    Ok(())
}

/// Window timing and reporting, shared by both ways of creating.
struct Windows {
    started: Instant,
    window_started: Instant,
    window_first: u64,
}

impl Windows {
    fn new() -> Self {
        Self { started: Instant::now(), window_started: Instant::now(), window_first: 0 }
    }

    /// After file `index` is made: whether it ends a window.
    fn ends_window(task: &Task, index: u64) -> bool {
        (index + 1).is_multiple_of(task.window) || index + 1 == task.files
    }

    fn report(&mut self, made: u64) {
        let seconds = self.window_started.elapsed().as_secs_f64();
        emit(json!({"event": "window", "files": made - self.window_first, "seconds": seconds}));
        self.window_first = made;
        self.window_started = Instant::now();
    }

    fn finish(&self, task: &Task) {
        let seconds = self.started.elapsed().as_secs_f64();
        emit(json!({"event": "created", "files": task.files, "seconds": seconds}));
        if task.until_killed {
            // The kill must find the files made but the volume not closed.
            loop {
                std::thread::park();
            }
        }
    }
}

fn create_in_volume(task: &Task, image: &Path, options: &VolumeOptions) -> anyhow::Result<()> {
    let volume = Volume::open(image, options)?;
    let owner = Owner::current();
    let inodes = volume.inodes();
    let mut dir = ROOT_INO;
    let mut seen = volume.checkpoint_stats();
    let mut windows = Windows::new();
    for index in 0..task.files {
        let (dir_name, name) = names_of(index, task.per_dir);
        if index.is_multiple_of(task.per_dir) {
            dir = inodes.mkdir(ROOT_INO, dir_name.as_bytes(), 0o755, owner)?.ino;
        }
        inodes.create(dir, name.as_bytes(), 0o644, owner)?;
        // Three atomic loads: cheap beside a create, and each checkpoint
        // shows up at the file that waited for it.
        let now = volume.checkpoint_stats();
        if now.checkpoints != seen.checkpoints {
            emit(json!({
                "event": "checkpoint",
                "at_files": index + 1,
                "count": now.checkpoints - seen.checkpoints,
                "bytes": now.bytes_total - seen.bytes_total,
                "seconds": (now.ns_total - seen.ns_total) as f64 / 1e9,
            }));
            seen = now;
        }
        if Windows::ends_window(task, index) {
            if task.until_killed {
                volume.sync()?;
                emit(json!({"event": "durable", "files": index + 1}));
            }
            windows.report(index + 1);
        }
    }
    windows.finish(task);
    checkpoint_after_changes(&volume, task)?;
    let started = Instant::now();
    volume.close()?;
    emit(json!({"event": "close", "seconds": started.elapsed().as_secs_f64()}));
    Ok(())
}

/// Files a checkpoint follows changes to: what it writes tells whether
/// checkpoints grow with the change or with the volume.
const CHANGED_FILES: u64 = 1000;

/// Checkpoints, changes the mode of [`CHANGED_FILES`] files spread over
/// all of them, checkpoints again and reports what that one wrote.
fn checkpoint_after_changes(volume: &Volume, task: &Task) -> anyhow::Result<()> {
    volume.checkpoint()?;
    let before = volume.checkpoint_stats();
    let changed = task.files.min(CHANGED_FILES);
    for step in 0..changed {
        let (dir, name) = names_of(step * task.files / changed, task.per_dir);
        volume.set_permissions(format!("/{dir}/{name}"), Permissions::from_mode(0o600))?;
    }
    volume.checkpoint()?;
    let after = volume.checkpoint_stats();
    emit(json!({
        "event": "changed_checkpoint",
        "files": changed,
        "bytes": after.bytes_total - before.bytes_total,
        "seconds": (after.ns_total - before.ns_total) as f64 / 1e9,
    }));
    Ok(())
}

/// Makes everything created under `dir` so far durable: syncfs for the
/// kernel's file systems, and an fsync of the directories for a FUSE
/// mount, which gets no syncfs (README) but whose fsync commits the
/// journal, every change before it included.
fn make_durable(dir: &Path, current: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    for path in [current, dir] {
        let opened = std::fs::File::open(path).with_context(|| format!("open {path:?}"))?;
        opened.sync_all().with_context(|| format!("fsync {path:?}"))?;
        // SAFETY: syncfs only reads the descriptor, which `opened` holds.
        if unsafe { libc::syncfs(opened.as_raw_fd()) } != 0 {
            bail!("syncfs {path:?}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn create_in_dir(task: &Task, root: &Path) -> anyhow::Result<()> {
    let mut windows = Windows::new();
    let mut dir = root.to_path_buf();
    for index in 0..task.files {
        let (dir_name, name) = names_of(index, task.per_dir);
        if index.is_multiple_of(task.per_dir) {
            dir = root.join(dir_name);
            std::fs::create_dir(&dir).with_context(|| format!("mkdir {dir:?}"))?;
        }
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("create {path:?}"))?;
        if Windows::ends_window(task, index) {
            if task.until_killed {
                make_durable(root, &dir)?;
                emit(json!({"event": "durable", "files": index + 1}));
            }
            windows.report(index + 1);
        }
    }
    windows.finish(task);
    Ok(())
}

/// Whether file `index` exists in `volume`; an error other than "not
/// found" is the answer's.
fn exists_in(volume: &Volume, index: u64, per_dir: u64) -> anyhow::Result<bool> {
    let (dir, name) = names_of(index, per_dir);
    match volume.symlink_metadata(format!("/{dir}/{name}")) {
        Ok(_) => Ok(true),
        Err(Error::NotFound(_)) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

fn open_volume(task: &Task, image: &Path, options: &VolumeOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    let volume = Volume::open(image, options)?;
    let report = volume.load_report();
    emit(json!({
        "event": "open",
        "seconds": started.elapsed().as_secs_f64(),
        "journal_records_replayed": report.journal_records_replayed,
        "vm_hwm_bytes": vm_hwm_bytes("self"),
    }));
    if let Some(seed) = task.stat_seed {
        let order = shuffled(task.files, seed);
        let before = volume.device().stats();
        let started = Instant::now();
        for &index in &order {
            anyhow::ensure!(exists_in(&volume, index, task.per_dir)?, "file {index} is missing");
        }
        let seconds = started.elapsed().as_secs_f64();
        let reads = volume.device().stats().since(&before);
        emit(json!({
            "event": "stat",
            "stats": order.len(),
            "seconds": seconds,
            "read_requests": reads.read_requests,
            "read_bytes": reads.bytes_read,
        }));
    }
    if let Some(durable) = task.verify_durable {
        let mut found = 0;
        let mut missing_durable = 0;
        for index in 0..task.files {
            let exists = exists_in(&volume, index, task.per_dir)?;
            found += u64::from(exists);
            missing_durable += u64::from(!exists && index < durable);
        }
        emit(json!({
            "event": "verify",
            "durable": durable,
            "found": found,
            "missing_durable": missing_durable,
        }));
    }
    volume.close()?;
    Ok(())
}

/// The stat pass through the kernel: every file under `root`, in a
/// shuffled order; returns its seconds.
pub fn stat_on_path(root: &Path, files: u64, per_dir: u64, seed: u64) -> anyhow::Result<f64> {
    let order = shuffled(files, seed);
    let started = Instant::now();
    for &index in &order {
        let (dir, name) = names_of(index, per_dir);
        let path = root.join(dir).join(name);
        std::fs::symlink_metadata(&path).with_context(|| format!("stat {path:?}"))?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The files found under `root` (of `files`), and how many of the first
/// `durable` are missing.
pub fn verify_on_path(root: &Path, files: u64, per_dir: u64, durable: u64) -> (u64, u64) {
    let mut found = 0;
    let mut missing_durable = 0;
    for index in 0..files {
        let (dir, name) = names_of(index, per_dir);
        let exists = std::fs::symlink_metadata(root.join(dir).join(name)).is_ok();
        found += u64::from(exists);
        missing_durable += u64::from(!exists && index < durable);
    }
    (found, missing_durable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_survives_its_json() {
        let task = Task {
            job: Job::Open,
            place: Place::Volume { image: "/tmp/x.img".into(), options: "cache_bytes=1M".into() },
            files: 3000,
            per_dir: 1000,
            window: 300,
            until_killed: false,
            stat_seed: Some(7),
            verify_durable: Some(1500),
        };
        let text = task.to_json().to_string();
        assert_eq!(Task::from_json(&serde_json::from_str(&text).unwrap()).unwrap(), task);
        let dir = Task { job: Job::Create, place: Place::Dir("/mnt".into()), ..task };
        assert_eq!(Task::from_json(&dir.to_json()).unwrap(), dir);
        let mut bad = dir.to_json();
        bad["window"] = json!(0);
        assert!(Task::from_json(&bad).is_err());
    }

    #[test]
    fn names_put_per_dir_files_in_each_directory_and_shuffles_cover_all() {
        assert_eq!(names_of(0, 1000), ("d0".to_string(), "f0".to_string()));
        assert_eq!(names_of(1999, 1000), ("d1".to_string(), "f1999".to_string()));
        let mut order = shuffled(500, 3);
        assert_ne!(order, (0..500).collect::<Vec<_>>(), "shuffled");
        assert_eq!(order, shuffled(500, 3), "the same seed, the same order");
        order.sort_unstable();
        assert_eq!(order, (0..500).collect::<Vec<_>>());
    }

    #[test]
    fn files_are_created_windowed_and_found_through_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let task = Task {
            job: Job::Create,
            place: Place::Dir(dir.path().into()),
            files: 25,
            per_dir: 10,
            window: 10,
            until_killed: false,
            stat_seed: None,
            verify_durable: None,
        };
        create_in_dir(&task, dir.path()).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
        assert_eq!(std::fs::read_dir(dir.path().join("d2")).unwrap().count(), 5);
        assert!(stat_on_path(dir.path(), 25, 10, 1).unwrap() >= 0.0);
        assert_eq!(verify_on_path(dir.path(), 30, 10, 25), (25, 0));
        assert_eq!(verify_on_path(dir.path(), 30, 10, 28), (25, 3));
        assert!(vm_hwm_bytes("self").unwrap() > 0);
    }
}
