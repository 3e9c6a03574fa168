//! `foliofs bench scale`: the yardstick of issue 53 ("Metadata on disk").
//! N empty files, `per_dir` to a directory, are created on each target (in
//! process, through the FUSE mount, on the kernel's ext4 and XFS on loop
//! devices), each by a child process (`scale_worker`) that reports every
//! window's rate and, in process, every checkpoint's bytes and time. Then,
//! per target: the peak memory of whoever held the metadata, the close,
//! the open after it, a stat of every file in a shuffled order with the
//! caches as small as the target allows, and a second run killed with
//! SIGKILL half-way, then opened and checked: every file reported durable
//! must be there.
//!
//! Images are sparse files in the working directory, not laid out as the
//! other benches' are: the workload writes only metadata, and a volume
//! sized for 10 million files (160 GiB by default, for its checkpoint
//! slots) could not be written whole on the disks this runs on.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use foliofs::vfs::MkfsOptions;
use foliofs::{Volume, VolumeOptions};
use serde_json::{json, Value};

use crate::peers::{self, FuseMount, KernelFs};
use crate::scale_worker::{self, Job, Place, Task};
use crate::tree::median;

/// Where the files are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    InProcess,
    Mount,
    Ext4,
    Xfs,
}

impl Target {
    pub const ALL: [Target; 4] = [Target::InProcess, Target::Mount, Target::Ext4, Target::Xfs];

    /// The name `--targets` takes.
    pub fn name(self) -> &'static str {
        match self {
            Target::InProcess => "in-process",
            Target::Mount => "mount",
            Target::Ext4 => "ext4",
            Target::Xfs => "xfs",
        }
    }

    pub fn parse(text: &str) -> anyhow::Result<Self> {
        Target::ALL
            .into_iter()
            .find(|target| target.name() == text)
            .with_context(|| format!("no target {text:?} (known: in-process, mount, ext4, xfs)"))
    }

    /// Whether it needs root, loop devices or FUSE.
    pub fn needs_root(self) -> bool {
        self != Target::InProcess
    }
}

/// What a run makes and where.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    pub files: u64,
    pub per_dir: u64,
    /// Files in a window of the rate.
    pub window: u64,
    /// Bytes of each volume (and each kernel peer's loop file).
    pub volume_bytes: u64,
    /// The journal's bytes (mkfs's default where `None`).
    pub journal_bytes: Option<u64>,
    /// Volumes of format 3, their metadata in a paged index.
    pub metadata_index: bool,
    pub targets: Vec<Target>,
    /// Where the images go (the disk measured).
    pub work_dir: PathBuf,
    /// The volume options as text (`-o`), for the workers and the mount.
    pub volume_options_text: String,
    /// The engine's cache during the stat pass (`cache_bytes`).
    pub stat_cache_bytes: u64,
    /// The `foliofs` executable: the workers and the mount daemon.
    pub program: PathBuf,
    pub seed: u64,
}

/// Bytes of volume for `files` with default mkfs options: the checkpoint
/// slots are 1/128 of the volume (at most 1 GiB each) and today hold about
/// 110 bytes a file, so 16 KiB of volume a file, and 1 GiB besides.
pub fn default_volume_bytes(files: u64) -> u64 {
    (1 << 30) + files * (16 << 10)
}

/// One checkpoint (or several, when they ended between two creates).
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Files created when it was seen.
    pub at_files: u64,
    pub count: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// The stat of every file in a shuffled order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatPass {
    pub stats: u64,
    pub seconds: f64,
    /// Device read requests during the pass, where the target counts them.
    pub read_requests: Option<u64>,
    pub read_bytes: u64,
}

/// The run killed half-way, and the open after it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CrashRun {
    /// Files the worker had reported durable when it was killed.
    pub durable: u64,
    pub open_seconds: f64,
    /// Files found after the open (of all N).
    pub found: u64,
    /// Durable files that were not found: must be 0.
    pub missing_durable: u64,
}

/// Everything measured on one target.
#[derive(Debug, Clone, Default)]
pub struct TargetResult {
    pub target: Option<Target>,
    /// Each window's (files, seconds).
    pub windows: Vec<(u64, f64)>,
    pub created: u64,
    pub create_seconds: f64,
    pub checkpoints: Vec<Checkpoint>,
    /// Peak memory of what held the metadata, and what that was.
    pub memory_bytes: Option<u64>,
    pub memory_what: String,
    pub close_seconds: Option<f64>,
    pub open_seconds: Option<f64>,
    pub stat: Option<StatPass>,
    pub crash: Option<CrashRun>,
    /// Why the target stopped short, if it did.
    pub error: Option<String>,
    pub notes: Vec<String>,
}

impl TargetResult {
    /// Each window's rate, in files per second.
    pub fn window_rates(&self) -> Vec<f64> {
        self.windows.iter().map(|&(files, seconds)| files as f64 / seconds.max(1e-9)).collect()
    }

    /// (slowest, median, fastest) window rates.
    pub fn window_summary(&self) -> Option<(f64, f64, f64)> {
        let rates = self.window_rates();
        if rates.is_empty() {
            return None;
        }
        let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let fastest = rates.iter().copied().fold(0.0, f64::max);
        Some((slowest, median(rates), fastest))
    }
}

pub struct ScaleResult {
    pub options: ScaleOptions,
    pub results: Vec<TargetResult>,
}

/// A worker's events, read as they come; `on_event` may kill it (then its
/// death is no error).
fn run_worker(
    program: &Path,
    task: &Task,
    mut on_event: impl FnMut(&Value, &mut Child) -> anyhow::Result<bool>,
) -> anyhow::Result<Vec<Value>> {
    let mut child = Command::new(program)
        .args(["bench", "scale", "--worker"])
        .arg(task.to_json().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {}", program.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let mut events = Vec::new();
    let mut killed = false;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.context("read the worker's report")?;
        let event: Value =
            serde_json::from_str(&line).with_context(|| format!("the worker printed {line:?}"))?;
        if !killed && on_event(&event, &mut child)? {
            killed = true;
        }
        events.push(event);
    }
    let status = child.wait()?;
    if !killed && !status.success() {
        bail!("the worker ({:?} on {:?}) exited with {status}", task.job, task.place);
    }
    Ok(events)
}

/// Takes a create worker's windows, checkpoints, close and memory.
fn take_create_events(result: &mut TargetResult, events: &[Value]) {
    for event in events {
        let number = |key: &str| event[key].as_u64().unwrap_or(0);
        let seconds = event["seconds"].as_f64().unwrap_or(0.0);
        match event["event"].as_str() {
            Some("window") => result.windows.push((number("files"), seconds)),
            Some("checkpoint") => result.checkpoints.push(Checkpoint {
                at_files: number("at_files"),
                count: number("count"),
                bytes: number("bytes"),
                seconds,
            }),
            Some("created") => {
                result.created = number("files");
                result.create_seconds = seconds;
            }
            Some("close") => result.close_seconds = Some(seconds),
            Some("memory") => result.memory_bytes = event["vm_hwm_bytes"].as_u64(),
            Some("changed_checkpoint") => result.notes.push(format!(
                "a checkpoint after changing {} of the files (their mode) wrote {} in {seconds:.3} s",
                number("files"),
                mib(number("bytes"))
            )),
            _ => {}
        }
    }
}

/// A create worker that is killed once it reports half the files durable;
/// returns how many it had reported.
fn create_until_killed(program: &Path, task: &Task) -> anyhow::Result<u64> {
    let half = task.files / 2;
    let mut durable = 0;
    run_worker(program, task, |event, child| {
        if event["event"] == "durable" {
            durable = event["files"].as_u64().unwrap_or(0);
            if durable >= half {
                child.kill().context("kill the worker")?;
                return Ok(true);
            }
        }
        Ok(false)
    })?;
    Ok(durable)
}

fn task(options: &ScaleOptions, job: Job, place: Place) -> Task {
    Task {
        job,
        place,
        files: options.files,
        per_dir: options.per_dir,
        window: options.window,
        until_killed: false,
        stat_seed: None,
        verify_durable: None,
    }
}

fn mkfs(image: &Path, options: &ScaleOptions) -> anyhow::Result<()> {
    let volume_options = VolumeOptions::parse(&options.volume_options_text)?;
    let _ = std::fs::remove_file(image);
    let mkfs = MkfsOptions {
        journal_bytes: options.journal_bytes,
        metadata_index: options.metadata_index,
        ..MkfsOptions::default()
    };
    Volume::mkfs_path(image, Some(options.volume_bytes), &mkfs, &volume_options)?;
    Ok(())
}

/// The volume options with the stat pass's cache.
fn stat_options(options: &ScaleOptions) -> String {
    let cache = format!("cache_bytes={}", options.stat_cache_bytes);
    [options.volume_options_text.as_str(), &cache]
        .iter()
        .filter(|part| !part.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(",")
}

fn run_in_process(options: &ScaleOptions, result: &mut TargetResult) -> anyhow::Result<()> {
    let image = options.work_dir.join(format!("foliofs-scale-{}.img", std::process::id()));
    peers::remove_at_cleanup(&image);
    let place = |text: String| Place::Volume { image: image.clone(), options: text };
    result.memory_what = "the worker's VmHWM".into();
    mkfs(&image, options)?;
    let create = task(options, Job::Create, place(options.volume_options_text.clone()));
    take_create_events(result, &run_worker(&options.program, &create, |_, _| Ok(false))?);
    let open = Task {
        stat_seed: Some(options.seed),
        ..task(options, Job::Open, place(stat_options(options)))
    };
    for event in run_worker(&options.program, &open, |_, _| Ok(false))? {
        match event["event"].as_str() {
            Some("open") => {
                result.open_seconds = event["seconds"].as_f64();
                if let Some(bytes) = event["vm_hwm_bytes"].as_u64() {
                    result.notes.push(format!("VmHWM just after the open: {}", mib(bytes)));
                }
            }
            Some("stat") => result.stat = Some(stat_from(&event)),
            _ => {}
        }
    }
    mkfs(&image, options)?;
    let killed = Task {
        until_killed: true,
        ..task(options, Job::Create, place(options.volume_options_text.clone()))
    };
    let durable = create_until_killed(&options.program, &killed)?;
    let verify = Task {
        verify_durable: Some(durable),
        ..task(options, Job::Open, place(options.volume_options_text.clone()))
    };
    let mut crash = CrashRun { durable, ..CrashRun::default() };
    for event in run_worker(&options.program, &verify, |_, _| Ok(false))? {
        match event["event"].as_str() {
            Some("open") => crash.open_seconds = event["seconds"].as_f64().unwrap_or(0.0),
            Some("verify") => {
                crash.found = event["found"].as_u64().unwrap_or(0);
                crash.missing_durable = event["missing_durable"].as_u64().unwrap_or(0);
            }
            _ => {}
        }
    }
    result.crash = Some(crash);
    let _ = std::fs::remove_file(&image);
    peers::forget_removal(&image);
    Ok(())
}

fn stat_from(event: &Value) -> StatPass {
    StatPass {
        stats: event["stats"].as_u64().unwrap_or(0),
        seconds: event["seconds"].as_f64().unwrap_or(0.0),
        read_requests: event["read_requests"].as_u64(),
        read_bytes: event["read_bytes"].as_u64().unwrap_or(0),
    }
}

/// Writes back everything and drops the kernel's clean caches (pages,
/// dentries, inodes), as a cold start finds them.
fn drop_caches() -> anyhow::Result<()> {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("drop caches (needs root)")
}

/// A live process's peak memory.
fn daemon_hwm(mount: &FuseMount) -> Option<u64> {
    scale_worker::vm_hwm_bytes(&mount.daemon_pid()?.to_string())
}

fn run_mount(options: &ScaleOptions, result: &mut TargetResult) -> anyhow::Result<()> {
    let image = options.work_dir.join(format!("foliofs-scale-mount-{}.img", std::process::id()));
    peers::remove_at_cleanup(&image);
    let point = options.work_dir.join(format!("foliofs-scale-mnt-{}", std::process::id()));
    let program = &options.program;
    let text = &options.volume_options_text;
    result.memory_what = "the daemon's VmHWM".into();
    mkfs(&image, options)?;
    let mounted = FuseMount::start(program, &image, &point, text)?;
    let create = task(options, Job::Create, Place::Dir(mounted.mount.clone()));
    take_create_events(result, &run_worker(program, &create, |_, _| Ok(false))?);
    result.memory_bytes = daemon_hwm(&mounted);
    let started = Instant::now();
    mounted.stop()?;
    result.close_seconds = Some(started.elapsed().as_secs_f64());
    // Dropped before the open, not after it: the daemon's own code pages,
    // faulted back in, would count as its reads in the stat pass. A fresh
    // mount has no names or attributes cached in the kernel anyway.
    drop_caches()?;
    let started = Instant::now();
    let mounted = FuseMount::start(program, &image, &point, &stat_options(options))?;
    result.open_seconds = Some(started.elapsed().as_secs_f64());
    let read_before = mounted.bytes_read();
    let seconds =
        scale_worker::stat_on_path(&mounted.mount, options.files, options.per_dir, options.seed)?;
    let read_bytes = mounted.bytes_read() - read_before;
    result.stat = Some(StatPass { stats: options.files, seconds, read_requests: None, read_bytes });
    mounted.stop()?;

    mkfs(&image, options)?;
    let mounted = FuseMount::start(program, &image, &point, text)?;
    let killed = Task {
        until_killed: true,
        ..task(options, Job::Create, Place::Dir(mounted.mount.clone()))
    };
    let durable = create_until_killed(program, &killed)?;
    // The worker is gone; the engine's crash is its daemon's.
    mounted.kill()?;
    let started = Instant::now();
    let mounted = FuseMount::start(program, &image, &point, text)?;
    let open_seconds = started.elapsed().as_secs_f64();
    let (found, missing_durable) =
        scale_worker::verify_on_path(&mounted.mount, options.files, options.per_dir, durable);
    mounted.stop()?;
    result.crash = Some(CrashRun { durable, open_seconds, found, missing_durable });
    let _ = std::fs::remove_dir(&point);
    let _ = std::fs::remove_file(&image);
    peers::forget_removal(&image);
    Ok(())
}

/// Slab memory of the kernel (dentries, inodes, buffer heads), in bytes.
fn kernel_slab_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find_map(|line| line.strip_prefix("Slab:"))?;
    Some(line.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
}

/// Shuts the file system down without flushing its log (FS_IOC_SHUTDOWN
/// with NOLOGFLUSH, xfs_io's `shutdown` without -f; ext4 takes the same
/// ioctl): what reached the disk stays, as after a power cut.
fn shut_down(mount: &Path) -> anyhow::Result<()> {
    let output = Command::new("xfs_io").args(["-x", "-c", "shutdown"]).arg(mount).output()?;
    if !output.status.success() {
        bail!("xfs_io shutdown {mount:?}: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

fn run_kernel(
    options: &ScaleOptions,
    name: &'static str,
    result: &mut TargetResult,
) -> anyhow::Result<()> {
    let dir = options.work_dir.join(format!("foliofs-scale-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    peers::remove_at_cleanup(&dir);
    let backing = dir.join("backing.img");
    std::fs::File::create(&backing)?.set_len(options.volume_bytes)?;
    let inodes = options.files + options.files.div_ceil(options.per_dir) + 1024;
    let mount = dir.join("mnt");
    result.memory_what = "the kernel's slab growth".into();
    let fs = KernelFs::start(name, &backing, mount.clone(), inodes)?;
    let slab_before = kernel_slab_bytes();
    let create = task(options, Job::Create, Place::Dir(fs.mount.clone()));
    take_create_events(result, &run_worker(&options.program, &create, |_, _| Ok(false))?);
    result.memory_bytes =
        kernel_slab_bytes().zip(slab_before).map(|(after, before)| after.saturating_sub(before));
    let started = Instant::now();
    fs.unmount()?;
    result.close_seconds = Some(started.elapsed().as_secs_f64());
    drop_caches()?;
    let started = Instant::now();
    fs.mount_again()?;
    result.open_seconds = Some(started.elapsed().as_secs_f64());
    drop_caches()?;
    let (requests_before, bytes_before) = fs.reads();
    let seconds =
        scale_worker::stat_on_path(&fs.mount, options.files, options.per_dir, options.seed)?;
    let (requests, bytes) = fs.reads();
    result.stat = Some(StatPass {
        stats: options.files,
        seconds,
        read_requests: Some(requests - requests_before),
        read_bytes: bytes - bytes_before,
    });
    fs.stop()?;

    let fs = KernelFs::start(name, &backing, mount, inodes)?;
    let killed =
        Task { until_killed: true, ..task(options, Job::Create, Place::Dir(fs.mount.clone())) };
    let durable = create_until_killed(&options.program, &killed)?;
    shut_down(&fs.mount)?;
    fs.unmount()?;
    drop_caches()?;
    let started = Instant::now();
    fs.mount_again()?;
    let open_seconds = started.elapsed().as_secs_f64();
    let (found, missing_durable) =
        scale_worker::verify_on_path(&fs.mount, options.files, options.per_dir, durable);
    fs.stop()?;
    result.crash = Some(CrashRun { durable, open_seconds, found, missing_durable });
    let _ = std::fs::remove_dir_all(&dir);
    peers::forget_removal(&dir);
    Ok(())
}

/// Runs every target in turn; a target that fails is reported with why,
/// and the next runs.
pub fn run(options: &ScaleOptions, progress: &dyn Fn(&str)) -> anyhow::Result<ScaleResult> {
    anyhow::ensure!(options.files > 0, "--files must be at least 1");
    anyhow::ensure!(options.per_dir > 0 && options.window > 0, "--per-dir and --window >= 1");
    let mut results = Vec::new();
    for &target in &options.targets {
        progress(&format!("{}: {} files", target.name(), options.files));
        let mut result = TargetResult { target: Some(target), ..TargetResult::default() };
        let ran = match target {
            Target::InProcess => run_in_process(options, &mut result),
            Target::Mount => run_mount(options, &mut result),
            Target::Ext4 => run_kernel(options, "ext4", &mut result),
            Target::Xfs => run_kernel(options, "xfs", &mut result),
        };
        if let Err(error) = ran {
            progress(&format!("{}: stopped: {error:#}", target.name()));
            result.error = Some(format!("{error:#}"));
            peers::clean_up_all();
        }
        results.push(result);
    }
    Ok(ScaleResult { options: options.clone(), results })
}

/// Bytes in MiB (or GiB past 10 GiB), as text.
fn mib(bytes: u64) -> String {
    if bytes >= 10 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

fn seconds_text(seconds: Option<f64>) -> String {
    seconds.map_or("-".into(), |seconds| format!("{seconds:.3} s"))
}

/// One row of the summary table.
fn summary_row(result: &TargetResult) -> String {
    let name = result.target.map_or("?", Target::name);
    let rate = result.created as f64 / result.create_seconds.max(1e-9);
    let windows = result.window_summary().map_or("- | -".into(), |(slowest, median, fastest)| {
        format!("{slowest:.0} / {median:.0} / {fastest:.0} | {:.2}", slowest / median.max(1e-9))
    });
    let memory = result.memory_bytes.map_or("-".into(), mib);
    let checkpoints = if result.checkpoints.is_empty() {
        if result.target == Some(Target::InProcess) {
            "0".into()
        } else {
            "-".into()
        }
    } else {
        let count: u64 = result.checkpoints.iter().map(|each| each.count).sum();
        let longest = result.checkpoints.iter().map(|each| each.seconds).fold(0.0, f64::max);
        let largest = result.checkpoints.iter().map(|each| each.bytes).max().unwrap_or(0);
        format!("{count}, largest {}, longest {longest:.3} s", mib(largest))
    };
    let stat = result.stat.as_ref().map_or("- | -".into(), |stat| {
        let per_stat = |value: u64| value as f64 / stat.stats.max(1) as f64;
        let reads = match stat.read_requests {
            Some(requests) => format!("{:.3}", per_stat(requests)),
            None => format!("{:.3} KiB", per_stat(stat.read_bytes) / 1024.0),
        };
        format!("{:.0} | {reads}", stat.stats as f64 / stat.seconds.max(1e-9))
    });
    let crash = result.crash.as_ref().map_or("- | -".into(), |crash| {
        format!(
            "{:.3} s | {} / {} ({} missing)",
            crash.open_seconds, crash.durable, crash.found, crash.missing_durable
        )
    });
    format!(
        "| {name} | {} | {rate:.0} | {windows} | {memory} | {checkpoints} | {} | {} | {crash} | {stat} |",
        result.created,
        seconds_text(result.close_seconds),
        seconds_text(result.open_seconds),
    )
}

pub fn to_markdown(result: &ScaleResult) -> String {
    use std::fmt::Write as _;
    let options = &result.options;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "## bench scale: {} empty files, {} per directory, windows of {}, volumes of {}\n",
        options.files,
        options.per_dir,
        options.window,
        mib(options.volume_bytes)
    );
    let _ = writeln!(
        text,
        "| target | files | creates/s | window creates/s: slowest / median / fastest | slowest / median | peak memory | checkpoints | close | open | open after kill -9 | durable / found | stat/s (shuffled, cold) | reads per stat |"
    );
    let _ = writeln!(text, "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for each in &result.results {
        let _ = writeln!(text, "{}", summary_row(each));
    }
    let _ = writeln!(
        text,
        "\npeak memory: in process, the worker's VmHWM; through the mount, the daemon's; on \
         the kernel's file systems, the growth of its slab (evictable). reads per stat: device \
         read requests (in process: the engine's; kernel: the loop device's), or through the \
         mount the daemon's KiB read; the engine's cache at {} in the pass, the kernel's \
         caches dropped at its start.",
        mib(options.stat_cache_bytes)
    );
    for each in &result.results {
        let name = each.target.map_or("?", Target::name);
        if !each.checkpoints.is_empty() {
            let _ = writeln!(text, "\n{name}, each checkpoint: at files, bytes, seconds");
            let list: Vec<String> = each
                .checkpoints
                .iter()
                .map(|point| {
                    let count = if point.count > 1 {
                        format!(" ({} at once)", point.count)
                    } else {
                        String::new()
                    };
                    format!(
                        "{}: {} in {:.3} s{count}",
                        point.at_files,
                        mib(point.bytes),
                        point.seconds
                    )
                })
                .collect();
            let _ = writeln!(text, "{}", list.join("; "));
        }
        let rates: Vec<String> =
            each.window_rates().iter().map(|rate| format!("{rate:.0}")).collect();
        if !rates.is_empty() {
            let _ = writeln!(text, "\n{name}, creates/s per window: {}", rates.join(", "));
        }
        for note in &each.notes {
            let _ = writeln!(text, "\n{name}: {note}");
        }
        if let Some(error) = &each.error {
            let _ = writeln!(text, "\n{name}: stopped: {error}");
        }
    }
    text
}

pub fn to_json(result: &ScaleResult) -> Value {
    let options = &result.options;
    json!({
        "files": options.files,
        "per_dir": options.per_dir,
        "window": options.window,
        "volume_bytes": options.volume_bytes,
        "stat_cache_bytes": options.stat_cache_bytes,
        "volume_options": options.volume_options_text,
        "seed": options.seed,
        "targets": result.results.iter().map(target_json).collect::<Vec<_>>(),
    })
}

fn target_json(result: &TargetResult) -> Value {
    let summary = result.window_summary();
    json!({
        "target": result.target.map(Target::name),
        "created": result.created,
        "create_seconds": result.create_seconds,
        "windows": result.windows.iter().map(|&(files, seconds)| json!({"files": files, "seconds": seconds})).collect::<Vec<_>>(),
        "window_rate_slowest": summary.map(|summary| summary.0),
        "window_rate_median": summary.map(|summary| summary.1),
        "window_rate_fastest": summary.map(|summary| summary.2),
        "checkpoints": result.checkpoints.iter().map(|point| json!({
            "at_files": point.at_files,
            "count": point.count,
            "bytes": point.bytes,
            "seconds": point.seconds,
        })).collect::<Vec<_>>(),
        "memory_bytes": result.memory_bytes,
        "memory_what": result.memory_what,
        "close_seconds": result.close_seconds,
        "open_seconds": result.open_seconds,
        "stat": result.stat.as_ref().map(|stat| json!({
            "stats": stat.stats,
            "seconds": stat.seconds,
            "read_requests": stat.read_requests,
            "read_bytes": stat.read_bytes,
        })),
        "crash": result.crash.as_ref().map(|crash| json!({
            "durable": crash.durable,
            "open_seconds": crash.open_seconds,
            "found": crash.found,
            "missing_durable": crash.missing_durable,
        })),
        "notes": result.notes,
        "error": result.error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_summarise_slowest_median_and_fastest() {
        let result = TargetResult {
            windows: vec![(100, 1.0), (100, 0.5), (100, 2.0), (50, 0.25)],
            ..TargetResult::default()
        };
        assert_eq!(result.window_rates(), [100.0, 200.0, 50.0, 200.0]);
        assert_eq!(result.window_summary(), Some((50.0, 150.0, 200.0)));
        assert_eq!(TargetResult::default().window_summary(), None);
    }

    #[test]
    fn targets_parse_by_name_and_only_in_process_needs_no_root() {
        for target in Target::ALL {
            assert_eq!(Target::parse(target.name()).unwrap(), target);
        }
        assert!(Target::parse("btrfs").unwrap_err().to_string().contains("known: in-process"));
        assert!(!Target::InProcess.needs_root() && Target::Ext4.needs_root());
        assert!(default_volume_bytes(1_000_000) > 16_000_000_000);
    }

    #[test]
    fn the_table_has_a_row_per_target_and_names_a_stopped_one() {
        let options = ScaleOptions {
            files: 10,
            per_dir: 5,
            window: 5,
            volume_bytes: 1 << 30,
            journal_bytes: None,
            metadata_index: false,
            targets: vec![Target::InProcess, Target::Xfs],
            work_dir: PathBuf::from("."),
            volume_options_text: String::new(),
            stat_cache_bytes: 1 << 20,
            program: PathBuf::from("foliofs"),
            seed: 1,
        };
        let done = TargetResult {
            target: Some(Target::InProcess),
            windows: vec![(5, 0.1), (5, 0.2)],
            created: 10,
            create_seconds: 0.3,
            checkpoints: vec![Checkpoint { at_files: 7, count: 1, bytes: 4096, seconds: 0.01 }],
            open_seconds: Some(0.5),
            crash: Some(CrashRun { durable: 5, open_seconds: 0.2, found: 6, missing_durable: 0 }),
            ..TargetResult::default()
        };
        let stopped = TargetResult {
            target: Some(Target::Xfs),
            error: Some("no xfs".into()),
            ..TargetResult::default()
        };
        let result = ScaleResult { options, results: vec![done, stopped] };
        let text = to_markdown(&result);
        assert!(text.contains("| in-process | 10 | 33 | 25 / 38 / 50 | 0.67 |"), "{text}");
        assert!(text.contains("| 5 / 6 (0 missing) |"), "{text}");
        assert!(text.contains("xfs: stopped: no xfs"), "{text}");
        let json = to_json(&result);
        assert_eq!(json["targets"][0]["crash"]["found"], 6);
        assert_eq!(json["targets"][1]["error"], "no xfs");
    }
}
