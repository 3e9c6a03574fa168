//! `foliofs bench seeds`: the five seed experiments of DESIGN.md, each in its
//! old and new policy, against its limit (the raw device for direct I/O, a
//! memcpy for cached I/O) and, as root with fio installed, against the
//! kernel's ext4 and XFS on loop devices over the same disk. Every shape is
//! a literal fio command line: the engine runs it in-process, the kernel
//! peers run it with real fio, so both sides run the same job.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use foliofs::dev::{DevStats, Device};
use foliofs::vfs::MkfsOptions;
use foliofs::{Volume, VolumeOptions};
use serde_json::Value;

use crate::jobfile::{parse_command_line, JobSpec};
use crate::peers::{self, FuseMount, KernelFs, SysctlGuard, KERNEL_FILE_SYSTEMS};
pub use crate::results::{
    to_json, to_markdown, write_outputs, Goal, Group, Metric, Row, SeedResult,
};
use crate::runner::{self, RunReport, Target};
use crate::targets;

/// How a run is done: quick (under three minutes on two cores) or full.
#[derive(Debug, Clone)]
pub struct SeedOptions {
    pub quick: bool,
    /// Run the kernel peers (needs root and fio).
    pub peers: bool,
    /// Where tables, JSON and charts go.
    pub out_dir: PathBuf,
    /// Where scratch images and the peers' loop files go (the disk measured).
    pub work_dir: PathBuf,
    pub volume_options: VolumeOptions,
    /// The same options as text, for `foliofs mount -o`.
    pub volume_options_text: String,
    /// The `foliofs` executable, to measure the engine through a FUSE mount
    /// beside the kernel peers; None leaves those rows out.
    pub mount_program: Option<PathBuf>,
    pub only: Vec<String>,
    /// Rows for the engine and the raw device on qemu-nbd over the same
    /// image (seeds 002 and 003).
    pub nbd: bool,
    /// Repetitions of every row; the median is reported.
    pub reps: usize,
}

/// Sizes and times of a run.
struct Scale {
    runtime: &'static str,
    ramp: &'static str,
    seed_000_size: &'static str,
    seed_000_iodepth: u32,
    seed_001_size: &'static str,
    seed_002_size: &'static str,
    seed_003_size: &'static str,
    seed_004_size: &'static str,
    writeback_size: &'static str,
    writeback_cache: &'static str,
}

const QUICK: Scale = Scale {
    runtime: "1s",
    ramp: "0s",
    seed_000_size: "256M",
    seed_000_iodepth: 64,
    seed_001_size: "32M",
    seed_002_size: "256M",
    seed_003_size: "64M",
    seed_004_size: "128M",
    writeback_size: "1G",
    writeback_cache: "256M",
};

const FULL: Scale = Scale {
    runtime: "5s",
    ramp: "1s",
    seed_000_size: "1G",
    seed_000_iodepth: 256,
    seed_001_size: "256M",
    seed_002_size: "1G",
    seed_003_size: "1G",
    seed_004_size: "1G",
    writeback_size: "4G",
    writeback_cache: "1G",
};

/// The seed 004 author's setting for the cache tests: no writeback at all.
const NO_WRITEBACK_SYSCTL: &[(&str, &str)] = &[
    ("dirty_writeback_centisecs", "0"),
    ("dirty_background_ratio", "100"),
    ("dirty_ratio", "100"),
];
const NO_WRITEBACK_OPTIONS: &str =
    "dirty_background_bytes=64G,dirty_bytes=64G,writeback_interval_ms=0";

/// Where rows run: one scratch image for every row (the engine, the raw
/// device, the mount, qemu-nbd, and the kernel peers made over it in turn),
/// so that no row gains from the host file under it (see `KernelFs`).
struct Lab<'a> {
    options: &'a SeedOptions,
    image: PathBuf,
    /// Where the kernel peers are mounted; None runs no peer rows.
    peer_mounts: Option<PathBuf>,
    progress: &'a dyn Fn(&str),
    /// The most write data an engine row on NBD kept for replay after a
    /// reconnect (its memory cost), since `take_replay_peak` last read it.
    replay_peak_bytes: std::sync::atomic::AtomicU64,
}

impl Lab<'_> {
    /// The replay memory peak of the NBD rows since the last call.
    fn take_replay_peak(&self) -> u64 {
        self.replay_peak_bytes.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    fn volume_options(&self, extra: &str) -> anyhow::Result<VolumeOptions> {
        let mut options = self.options.volume_options.clone();
        options.apply_list(extra)?;
        Ok(options)
    }

    /// The engine: a fresh volume on the scratch image, the job in-process.
    fn engine(&self, label: &str, command: &str, extra_options: &str) -> anyhow::Result<Row> {
        self.engine_on(&self.image, label, command, extra_options)
    }

    /// The engine on `image` (the scratch image, or an NBD URI in front of it).
    fn engine_on(
        &self,
        image: &Path,
        label: &str,
        command: &str,
        extra_options: &str,
    ) -> anyhow::Result<Row> {
        let spec = spec(command)?;
        let options = self.volume_options(extra_options)?;
        self.repeat(label, || {
            let mkfs = MkfsOptions { block_bytes: 4096, ..MkfsOptions::default() };
            Volume::mkfs_path(image, None, &mkfs, &options)?;
            let volume = Volume::open(image, &options)?;
            let report = runner::run(&volume, std::slice::from_ref(&spec))?;
            if let Some(link) = volume.device().link_stats() {
                self.replay_peak_bytes
                    .fetch_max(link.replay_data_bytes_peak, std::sync::atomic::Ordering::Relaxed);
            }
            volume.close()?;
            Ok(row_of(label, &report))
        })
    }

    /// The raw device under the engine: the same job on the image file with
    /// no file system (direct jobs only).
    fn raw(&self, label: &str, command: &str) -> anyhow::Result<Row> {
        self.raw_on(&self.image, label, command)
    }

    fn raw_on(&self, image: &Path, label: &str, command: &str) -> anyhow::Result<Row> {
        let spec = spec(command)?;
        let options = self.options.volume_options.clone();
        self.repeat(label, || {
            let device = Arc::new(Device::open(image, &options.dev_options())?);
            let targets = targets::raw_regions(&device, &spec)
                .into_iter()
                .enumerate()
                .map(|(index, region)| (0, index as u32, Box::new(region) as Box<dyn Target>))
                .collect();
            let report =
                runner::run_targets(std::slice::from_ref(&spec), targets, &|| device.stats())?;
            Ok(row_of(label, &report))
        })
    }

    /// Rows on qemu-nbd serving the scratch image (started for these rows
    /// only): the engine with each of `engines` (label, extra options), and
    /// the raw device through the same hop when `raw` is given.
    fn nbd(
        &self,
        command: &str,
        engines: &[(&str, &str)],
        raw: Option<&str>,
        rows: &mut Vec<Row>,
    ) -> anyhow::Result<()> {
        if !self.options.nbd {
            return Ok(());
        }
        let server = crate::nbd::QemuNbd::start(&self.image)?;
        for (label, extra) in engines {
            rows.push(self.engine_on(&server.uri(), label, command, extra)?);
        }
        if let Some(label) = raw {
            rows.push(self.raw_on(&server.uri(), label, command)?);
        }
        Ok(())
    }

    /// Plain copies between memory and the request buffer: the limit for
    /// cached I/O.
    fn memcpy(&self, label: &str, command: &str) -> anyhow::Result<Row> {
        let spec = spec(command)?;
        self.repeat(label, || {
            let targets = targets::memory_regions(&spec)
                .into_iter()
                .enumerate()
                .map(|(index, region)| (0, index as u32, Box::new(region) as Box<dyn Target>))
                .collect();
            let report =
                runner::run_targets(std::slice::from_ref(&spec), targets, &DevStats::default)?;
            Ok(row_of(label, &report))
        })
    }

    /// The same fio command with real fio on each kernel peer, each made
    /// afresh over the scratch image for this command's rows.
    fn kernel(&self, command: &str, rows: &mut Vec<Row>) -> anyhow::Result<()> {
        let Some(mounts) = &self.peer_mounts else { return Ok(()) };
        for name in KERNEL_FILE_SYSTEMS {
            let label = format!("kernel {name}");
            let fs = KernelFs::start(name, &self.image, mounts.join(format!("mnt-{name}")), 0)
                .with_context(|| format!("set up {label} over {}", self.image.display()))?;
            let row =
                self.repeat(&label, || fio_row(&label, &fs.mount, &|| fs.bytes_written(), command));
            fs.stop()?;
            rows.push(row?);
        }
        Ok(())
    }

    fn peers_enabled(&self) -> bool {
        self.peer_mounts.is_some()
    }

    /// Whether rows through a FUSE mount run (with the peers: they need root
    /// and fio too).
    fn fuse_enabled(&self) -> bool {
        self.peers_enabled() && self.options.mount_program.is_some()
    }

    /// The engine mounted through FUSE on a fresh volume, the job run by real
    /// fio on the mount: the in-process row plus the kernel crossing. One row
    /// per transport: `label` over io_uring (`foliofs mount` turns the
    /// kernel's switch on as root), `label dev` over /dev/fuse.
    fn fuse(
        &self,
        label: &str,
        command: &str,
        extra_options: &str,
        rows: &mut Vec<Row>,
    ) -> anyhow::Result<()> {
        let Some(program) = self.options.mount_program.as_deref().filter(|_| self.fuse_enabled())
        else {
            return Ok(());
        };
        for (suffix, transport) in FUSE_TRANSPORTS {
            // mkfs takes the engine's options; the mount gets the extras too
            // (some, such as page_cache, are mount options).
            let options = self.options.volume_options.clone();
            let mount_options =
                [self.options.volume_options_text.as_str(), extra_options, transport]
                    .iter()
                    .filter(|part| !part.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(",");
            let mount_point =
                self.options.work_dir.join(format!("foliofs-fuse-{}", std::process::id()));
            let label = format!("{label}{suffix}");
            let row = self.repeat(&label, || {
                let mkfs = MkfsOptions { block_bytes: 4096, ..MkfsOptions::default() };
                Volume::mkfs_path(&self.image, None, &mkfs, &options)?;
                let mounted = FuseMount::start(program, &self.image, &mount_point, &mount_options)?;
                let row = fio_row(&label, &mounted.mount, &|| mounted.bytes_written(), command);
                mounted.stop()?;
                row
            });
            let _ = std::fs::remove_dir(&mount_point);
            rows.push(row?);
        }
        Ok(())
    }

    fn repeat(
        &self,
        label: &str,
        mut once: impl FnMut() -> anyhow::Result<Row>,
    ) -> anyhow::Result<Row> {
        let mut runs = Vec::new();
        for _ in 0..self.options.reps.max(1) {
            (self.progress)(label);
            runs.push(once().with_context(|| format!("row {label:?}"))?);
        }
        Ok(median_row(runs))
    }
}

/// The FUSE transports each mount row runs on: (label suffix, mount option).
const FUSE_TRANSPORTS: [(&str, &str); 2] = [("", "transport=uring"), (" dev", "transport=dev")];

fn spec(command: &str) -> anyhow::Result<JobSpec> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let mut jobs = parse_command_line(&words)?;
    Ok(jobs.remove(0))
}

/// The memory the NBD client's kept writes took (the price of replaying
/// them after a server restart), against its bound.
fn replay_memory_goal(what: &str, peak_bytes: u64) -> Goal {
    let bound_mib = (foliofs::dev::nbd::DEFAULT_REPLAY_MAX_BYTES >> 20) as f64;
    let peak_mib = peak_bytes as f64 / (1 << 20) as f64;
    Goal::at_most(format!("{what}: NBD writes kept for replay, peak MiB"), peak_mib, bound_mib)
}

fn median_row(mut runs: Vec<Row>) -> Row {
    runs.sort_by(|a, b| a.iops.total_cmp(&b.iops));
    runs.swap_remove(runs.len() / 2)
}

fn row_of(label: &str, report: &RunReport) -> Row {
    let (mut ios, mut bytes, mut written, mut p99_us) = (0, 0, 0, 0f64);
    let mut seconds = 0f64;
    for job in &report.jobs {
        ios += job.read.ios + job.write.ios;
        bytes += job.read.io_bytes + job.write.io_bytes;
        written += job.write.io_bytes;
        seconds = seconds.max(job.runtime.as_secs_f64());
        for side in [&job.read, &job.write] {
            if side.ios > 0 {
                p99_us = p99_us.max(side.latencies.percentile_ns(99.0) as f64 / 1e3);
            }
        }
    }
    let seconds = seconds.max(1e-9);
    let device = &report.device;
    Row {
        label: label.to_string(),
        iops: ios as f64 / seconds,
        mib_per_second: bytes as f64 / seconds / (1 << 20) as f64,
        p99_us,
        write_amplification: (written > 0 && device.requests() > 0)
            .then(|| device.bytes_written as f64 / written as f64),
        requests_per_io: (device.requests() > 0)
            .then(|| device.requests() as f64 / ios.max(1) as f64),
    }
}

/// Real fio running `command` in a directory under `mount`; `bytes_written`
/// reads the storage counter under it.
fn fio_row(
    label: &str,
    mount: &Path,
    bytes_written: &(dyn Fn() -> u64 + Sync),
    command: &str,
) -> anyhow::Result<Row> {
    let dir = mount.join("seed");
    std::fs::create_dir_all(&dir)?;
    let mut arguments: Vec<String> = command
        .split_whitespace()
        .map(|word| match word.strip_prefix("--filename=") {
            Some(name) => format!("--filename={}/{}", dir.display(), name.trim_start_matches('/')),
            None => word.to_string(),
        })
        .collect();
    if !command.contains("--filename=") {
        arguments.push(format!("--directory={}", dir.display()));
    }
    // Files are laid out by writing, as the engine's are, and before the
    // measured run, so the storage counter sees only the job's own writes
    // (as the engine rows' device counters do).
    arguments.push("--fallocate=none".into());
    let mut lay_out = arguments.clone();
    lay_out.push("--create_only=1".into());
    peers::fio(&lay_out)?;
    // And made durable, as the engine rows' layout is (`runner`): otherwise
    // the layout's writeback (fio writes it through the cache) runs during
    // the measured job and competes with it for the device.
    sync_files_under(&dir).with_context(|| format!("fsync the layout under {}", dir.display()))?;
    // The device counter starts where fio's own count does: after the ramp
    // (fio reports no I/O of its ramp; counting it made every ramped row
    // look like 1.2 device bytes per user byte). The timer starts with fio,
    // whose start-up comes before its ramp, so the ramp's last moments still
    // count: seed 000's rows show 1.03-1.06.
    let ramp = spec(command).map(|job| job.ramp_time).unwrap_or_default();
    let (job, device_written) = counted_after(ramp, bytes_written, || peers::fio(&arguments));
    let job = job?;
    let _ = std::fs::remove_dir_all(&dir);
    let side = |name: &str| &job[name];
    let (read, write) = (side("read"), side("write"));
    let number = |value: &Value| value.as_f64().unwrap_or(0.0);
    let runtime_seconds = number(&read["runtime"]).max(number(&write["runtime"])) / 1e3;
    let bytes = number(&read["io_bytes"]) + number(&write["io_bytes"]);
    let written = number(&write["io_bytes"]);
    let p99 = |side: &Value| number(&side["clat_ns"]["percentile"]["99.000000"]) / 1e3;
    Ok(Row {
        label: label.to_string(),
        iops: number(&read["iops"]) + number(&write["iops"]),
        mib_per_second: if runtime_seconds > 0.0 {
            bytes / runtime_seconds / (1 << 20) as f64
        } else {
            0.0
        },
        p99_us: p99(read).max(p99(write)),
        write_amplification: (written > 0.0).then(|| device_written as f64 / written),
        requests_per_io: None,
    })
}

/// Runs `run` and returns its result with how far `counter` rose from
/// `ramp` after the start to the end.
fn counted_after<T>(
    ramp: Duration,
    counter: &(dyn Fn() -> u64 + Sync),
    run: impl FnOnce() -> T,
) -> (T, u64) {
    std::thread::scope(|scope| {
        let after_ramp = scope.spawn(|| {
            std::thread::sleep(ramp);
            counter()
        });
        let result = run();
        let start = after_ramp.join().expect("reading a counter does not panic");
        (result, counter().saturating_sub(start))
    })
}

/// fsyncs every regular file under `dir`.
fn sync_files_under(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            sync_files_under(&entry.path())?;
        } else if kind.is_file() {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    Ok(())
}

fn ratio(group: &Group, metric: Metric, numerator: &str, denominator: &str) -> Option<f64> {
    let top = metric.of(group.row(numerator)?);
    let bottom = metric.of(group.row(denominator)?);
    (bottom > 0.0).then(|| top / bottom)
}

fn seed_000(lab: &Lab<'_>, scale: &Scale) -> anyhow::Result<SeedResult> {
    let command = format!(
        "--name=seed000 --ioengine=libaio --direct=1 --group_reporting --overwrite=1 --thread \
         --size={} --filename=/fio --readwrite=write --ramp_time={} --runtime={} --time_based \
         --numjobs=8 --blocksize=2k --iodepth={}",
        scale.seed_000_size, scale.ramp, scale.runtime, scale.seed_000_iodepth
    );
    let mut rows = vec![
        lab.engine("dio_unaligned=overwrite", &command, "dio_unaligned=overwrite")?,
        lab.engine("dio_unaligned=exclusive", &command, "dio_unaligned=exclusive")?,
        lab.raw("raw device", &command)?,
    ];
    lab.fuse("foliofs fuse", &command, "dio_unaligned=overwrite", &mut rows)?;
    lab.kernel(&command, &mut rows)?;
    let group = Group { name: "2 KiB direct writes, 8 jobs".into(), command, rows };
    let mut goals = Vec::new();
    if let Some(value) =
        ratio(&group, Metric::Iops, "dio_unaligned=overwrite", "dio_unaligned=exclusive")
    {
        goals.push(Goal::at_least("overwrite / exclusive", value, 10.0));
    }
    if let Some(value) = ratio(&group, Metric::Iops, "dio_unaligned=overwrite", "raw device") {
        goals.push(Goal::at_least("overwrite / raw device", value, 0.9));
    }
    if let Some(value) = ratio(&group, Metric::Iops, "foliofs fuse", "dio_unaligned=overwrite") {
        goals.push(Goal::at_least("through the mount / in process", value, 0.5));
    }
    if let Some(value) = ratio(&group, Metric::Iops, "foliofs fuse", "kernel ext4") {
        goals.push(Goal::at_least("through the mount / kernel ext4", value, 1.5));
    }
    Ok(SeedResult {
        id: "000",
        title: "Seed 000: concurrent sub-block direct overwrites".into(),
        metric: Metric::Iops,
        groups: vec![group],
        goals,
    })
}

fn seed_001(lab: &Lab<'_>, scale: &Scale) -> anyhow::Result<SeedResult> {
    let command = format!(
        "--name=seed001 --ioengine=psync --rw=randwrite --overwrite=1 --pre_read=1 --direct=0 \
         --bs=4k --size={} --numjobs=8 --fdatasync=1 --runtime={} --time_based --group_reporting",
        scale.seed_001_size, scale.runtime
    );
    let mut rows = vec![
        lab.engine("dirty=block", &command, "dirty=block,folio_max=64k")?,
        lab.engine("dirty=folio", &command, "dirty=folio,folio_max=64k")?,
    ];
    lab.kernel(&command, &mut rows)?;
    let group =
        Group { name: "4 KiB random overwrites + fdatasync, 64 KiB folios".into(), command, rows };
    let mut goals = Vec::new();
    if let Some(row) = group.row("dirty=block") {
        // At most the data plus a little journal: 1.0 is the goal.
        let amplification = row.write_amplification.unwrap_or(f64::INFINITY);
        let what = "dirty=block device bytes per user byte";
        goals.push(Goal::at_most(what, amplification, 1.05));
    }
    if let Some(row) = group.row("dirty=folio") {
        // The whole 64 KiB folio for each 4 KiB write: 16, less a little
        // for writes that share a folio between two writebacks.
        let what = "dirty=folio device bytes per user byte (the whole folio, 16x)";
        goals.push(Goal::at_least(what, row.write_amplification.unwrap_or(0.0), 15.5));
    }
    // The durable path at the kernel's speed: level with the faster kernel
    // file system of the same run.
    let kernel_ratios = ["kernel ext4", "kernel xfs"]
        .map(|kernel| ratio(&group, Metric::Iops, "dirty=block", kernel));
    if let Some(value) = kernel_ratios.into_iter().flatten().reduce(f64::min) {
        let what = "dirty=block / the faster kernel file system";
        goals.push(Goal::at_least(what, value, 1.0));
    }
    Ok(SeedResult {
        id: "001",
        title: "Seed 001: per-block dirty tracking in large folios".into(),
        metric: Metric::Iops,
        groups: vec![group],
        goals,
    })
}

fn seed_002(lab: &Lab<'_>, scale: &Scale) -> anyhow::Result<SeedResult> {
    let mut groups = Vec::new();
    let mut goals = Vec::new();
    for rw in ["randread", "randwrite"] {
        for bs in ["4k", "16k"] {
            let command = format!(
                "--name=seed002 --ioengine=libaio --size={} --direct=1 --iodepth=64 --time_based=1 \
                 --thread=1 --overwrite=1 --runtime={} --rw={rw} --bs={bs} --filename=/fio",
                scale.seed_002_size, scale.runtime
            );
            let mut rows =
                vec![lab.engine("foliofs", &command, "")?, lab.raw("raw device", &command)?];
            lab.fuse("foliofs fuse", &command, "", &mut rows)?;
            lab.kernel(&command, &mut rows)?;
            lab.nbd(&command, &[("foliofs nbd", "")], Some("raw nbd"), &mut rows)?;
            let group = Group { name: format!("{rw} {bs}, iodepth 64"), command, rows };
            if group.row("foliofs nbd").is_some() {
                goals.push(replay_memory_goal(&format!("{rw} {bs}"), lab.take_replay_peak()));
            }
            if let Some(value) = ratio(&group, Metric::Iops, "foliofs nbd", "raw nbd") {
                let what = format!("{rw} {bs}: foliofs on qemu-nbd / raw qemu-nbd");
                goals.push(Goal::at_least(what, value, 0.8));
            }
            if let Some(value) = ratio(&group, Metric::Iops, "foliofs", "raw device") {
                goals.push(Goal::at_least(format!("{rw} {bs}: foliofs / raw device"), value, 0.9));
            }
            if let Some(value) = ratio(&group, Metric::Iops, "foliofs fuse", "foliofs") {
                let what = format!("{rw} {bs}: through the mount / in process");
                goals.push(Goal::at_least(what, value, 0.9));
            }
            for kernel in ["kernel ext4", "kernel xfs"] {
                if let Some(value) = ratio(&group, Metric::Iops, "foliofs", kernel) {
                    goals.push(Goal::at_least(
                        format!("{rw} {bs}: foliofs / {kernel}"),
                        value,
                        1.0,
                    ));
                }
            }
            groups.push(group);
        }
    }
    if let Some(group) = round_trip(lab, scale)? {
        if let Some(fuse) = group.row("foliofs fuse").filter(|row| row.iops > 0.0) {
            let round_trip_us = 1e6 / fuse.iops;
            let what = "a FUSE round trip (4 KiB cached read), us";
            goals.push(Goal::at_most(what, round_trip_us, 10.0));
        }
        groups.push(group);
    }
    Ok(SeedResult {
        id: "002",
        title: "Seed 002: the cost of the direct I/O path".into(),
        metric: Metric::Iops,
        groups,
        goals,
    })
}

/// One thread reading one cached 4 KiB block again and again: through the
/// mount every read is a FUSE request answered from the engine's cache, so
/// 1/IOPS is the crossing's cost. Only with the FUSE rows. invalidate=0:
/// fio would otherwise drop the kernel peers' page cache at every pass over
/// the 4 KiB file.
fn round_trip(lab: &Lab<'_>, scale: &Scale) -> anyhow::Result<Option<Group>> {
    if !lab.fuse_enabled() {
        return Ok(None);
    }
    let command = format!(
        "--name=roundtrip --ioengine=psync --direct=0 --rw=read --bs=4k --size=4k \
         --invalidate=0 --runtime={} --time_based --filename=/fio",
        scale.runtime
    );
    let mut rows = vec![lab.engine("foliofs", &command, "")?];
    lab.fuse("foliofs fuse", &command, "", &mut rows)?;
    lab.kernel(&command, &mut rows)?;
    Ok(Some(Group {
        name: "round trip: 4 KiB reads of one cached block, psync".into(),
        command,
        rows,
    }))
}

fn seed_003(lab: &Lab<'_>, scale: &Scale) -> anyhow::Result<SeedResult> {
    let mut groups = Vec::new();
    let mut goals = Vec::new();
    for (iodepth, numjobs) in [(1, 1), (1, 16), (16, 1)] {
        let command = format!(
            "--name=seed003 --ioengine=libaio --direct=1 --sync=1 --bs=4k --iodepth={iodepth} \
             --numjobs={numjobs} --rw=randwrite --size={} --runtime={} --time_based --overwrite=1 \
             --filename=/fio --group_reporting",
            scale.seed_003_size, scale.runtime
        );
        let mut rows = vec![
            lab.engine("fua=native", &command, "fua=native")?,
            lab.engine("fua=emulate", &command, "fua=emulate")?,
        ];
        // One FUA write per O_DSYNC write through the mount is checked by
        // foliofs-fuse's tests/dsync_writes.rs (the daemon's counters are
        // not visible from here); these rows give its speed.
        lab.fuse("foliofs fuse", &command, "fua=native", &mut rows)?;
        let on_nbd = [("nbd fua=native", "fua=native"), ("nbd fua=emulate", "fua=emulate")];
        lab.nbd(&command, &on_nbd, None, &mut rows)?;
        let group = Group {
            name: format!("4 KiB O_DSYNC writes, iodepth {iodepth}, {numjobs} jobs"),
            command,
            rows,
        };
        if group.row("nbd fua=native").is_some() {
            let what = format!("O_DSYNC iodepth {iodepth}, {numjobs} jobs");
            goals.push(replay_memory_goal(&what, lab.take_replay_peak()));
        }
        let one_request_per_write = [
            ("fua=native", "fua=native issues one request per write"),
            ("nbd fua=native", "on qemu-nbd too, one request per write"),
        ];
        for (configuration, claim) in one_request_per_write {
            if let Some(native) = group.row(configuration) {
                let requests = native.requests_per_io.unwrap_or(f64::INFINITY);
                goals.push(Goal {
                    text: format!("qd{iodepth}/j{numjobs}: {claim}"),
                    value: requests,
                    target: 1.0,
                    met: requests <= 1.001,
                });
            }
        }
        if let Some(value) = ratio(&group, Metric::Iops, "fua=native", "fua=emulate") {
            let what = format!("qd{iodepth}/j{numjobs}: native / emulate (never slower)");
            goals.push(Goal::at_least(what, value, 0.95));
        }
        groups.push(group);
    }
    Ok(SeedResult {
        id: "003",
        title: "Seed 003: FUA for O_DSYNC writes".into(),
        metric: Metric::Iops,
        groups,
        goals,
    })
}

fn seed_004(lab: &Lab<'_>, scale: &Scale) -> anyhow::Result<SeedResult> {
    let mut groups = Vec::new();
    let mut goals = Vec::new();
    for rw in ["write", "read"] {
        for bs in ["4k", "64k", "1M"] {
            let command = format!(
                "--name=seed004 --ioengine=psync --direct=0 --rw={rw} --bs={bs} --size={} \
                 --runtime={} --time_based --overwrite=1 --pre_read=1",
                scale.seed_004_size, scale.runtime
            );
            let mut rows = vec![
                lab.engine("foliofs", &command, NO_WRITEBACK_OPTIONS)?,
                lab.engine(
                    "folio_max=4k",
                    &command,
                    &format!("{NO_WRITEBACK_OPTIONS},folio_max=4k"),
                )?,
                lab.memcpy("memcpy", &command)?,
            ];
            lab.fuse("foliofs fuse", &command, NO_WRITEBACK_OPTIONS, &mut rows)?;
            lab.fuse(
                "fuse page_cache=kernel",
                &command,
                &format!("{NO_WRITEBACK_OPTIONS},page_cache=kernel"),
                &mut rows,
            )?;
            if lab.fuse_enabled() {
                // The kernel's cache holds the writes here, so it gets the
                // kernel peers' writeback settings too.
                let _no_writeback = SysctlGuard::set(NO_WRITEBACK_SYSCTL)?;
                lab.fuse(
                    "fuse page_cache=writeback",
                    &command,
                    &format!("{NO_WRITEBACK_OPTIONS},page_cache=writeback"),
                    &mut rows,
                )?;
            }
            if lab.peers_enabled() {
                let _no_writeback = SysctlGuard::set(NO_WRITEBACK_SYSCTL)?;
                lab.kernel(&command, &mut rows)?;
            }
            let group = Group { name: format!("buffered {rw} {bs}"), command, rows };
            let kernel_goal = match (rw, bs) {
                ("write", "4k") => Some(4.0),
                ("write", "1M") => Some(2.5),
                ("read", _) => Some(1.5),
                _ => None,
            };
            if let Some(target) = kernel_goal {
                for kernel in ["kernel ext4", "kernel xfs"] {
                    if let Some(value) = ratio(&group, Metric::MibPerSecond, "foliofs", kernel) {
                        let what = format!("{rw} {bs}: foliofs / {kernel}");
                        goals.push(Goal::at_least(what, value, target));
                    }
                }
            }
            // Issue 14: through the mount, in its best mode, 4k and 64k at
            // least kernel ext4, 1M at least 0.8 of it.
            let mount_target = if bs == "1M" { 0.8 } else { 1.0 };
            let best_mount =
                ["foliofs fuse", "fuse page_cache=kernel", "fuse page_cache=writeback"]
                    .iter()
                    .filter_map(|label| {
                        ratio(&group, Metric::MibPerSecond, label, "kernel ext4")
                            .map(|v| (v, *label))
                    })
                    .max_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((value, label)) = best_mount {
                let what = format!("{rw} {bs}: best mount mode ({label}) / kernel ext4");
                goals.push(Goal::at_least(what, value, mount_target));
            }
            if (rw, bs) == ("read", "1M") {
                if let Some(value) = ratio(&group, Metric::MibPerSecond, "foliofs", "memcpy") {
                    goals.push(Goal::at_least("read 1M: foliofs / memcpy", value, 0.7));
                }
            }
            if bs != "4k" {
                if let Some(value) = ratio(&group, Metric::MibPerSecond, "foliofs", "folio_max=4k")
                {
                    let what = format!("{rw} {bs}: large folios / 4 KiB folios");
                    goals.push(Goal::at_least(what, value, 1.0));
                }
            }
            groups.push(group);
        }
    }
    // Writeback throughput: a stream of 1 MiB writes through a cache much
    // smaller than the file, fsynced at the end, against the raw device
    // written directly in requests of the size and depth writeback uses
    // (8 MiB, 8 in flight), so the ratio is the engine's own cost.
    let command = format!(
        "--name=writeback --ioengine=psync --direct=0 --rw=write --bs=1M --size={} --end_fsync=1 \
         --ramp_time={} --runtime={} --time_based",
        scale.writeback_size,
        if scale.ramp == "0s" { "1s" } else { scale.ramp },
        scale.runtime
    );
    let raw_command = format!(
        "--name=raw --ioengine=libaio --direct=1 --rw=write --bs=8M --iodepth=8 --size={} \
         --runtime={} --time_based",
        scale.writeback_size, scale.runtime
    );
    let rows = vec![
        lab.engine(
            "foliofs writeback",
            &command,
            &format!("cache_bytes={}", scale.writeback_cache),
        )?,
        lab.raw("raw device, 8 MiB x 8", &raw_command)?,
    ];
    let group = Group { name: "sequential buffered writes + writeback".into(), command, rows };
    if let Some(value) =
        ratio(&group, Metric::MibPerSecond, "foliofs writeback", "raw device, 8 MiB x 8")
    {
        goals.push(Goal::at_least("writeback / raw device", value, 0.9));
    }
    groups.push(group);
    Ok(SeedResult {
        id: "004",
        title: "Seed 004: the buffered path with large folios".into(),
        metric: Metric::MibPerSecond,
        groups,
        goals,
    })
}

/// The seeds in order, with the bytes of scratch image each needs.
type SeedFn = fn(&Lab<'_>, &Scale) -> anyhow::Result<SeedResult>;

fn seeds(scale: &Scale) -> anyhow::Result<Vec<(&'static str, SeedFn, u64)>> {
    let bytes = |text: &str| crate::jobfile::parse_size(text).map_err(anyhow::Error::msg);
    Ok(vec![
        ("000", seed_000 as SeedFn, bytes(scale.seed_000_size)?),
        ("001", seed_001 as SeedFn, 8 * bytes(scale.seed_001_size)?),
        ("002", seed_002 as SeedFn, bytes(scale.seed_002_size)?),
        ("003", seed_003 as SeedFn, bytes(scale.seed_003_size)?),
        ("004", seed_004 as SeedFn, bytes(scale.seed_004_size)?.max(bytes(scale.writeback_size)?)),
    ])
}

/// How many rows a run measures (for the progress bar).
pub fn planned_rows(options: &SeedOptions) -> usize {
    let selected = |id: &str| options.only.is_empty() || options.only.iter().any(|only| only == id);
    let peers = if options.peers { 2 } else { 0 };
    let fuse_on = usize::from(options.peers && options.mount_program.is_some());
    // Rows per FUSE configuration: one per transport.
    let fuse = fuse_on * FUSE_TRANSPORTS.len();
    let nbd = usize::from(options.nbd);
    let rows = [
        ("000", 3 + peers + fuse),
        ("001", 2 + peers),
        ("002", 4 * (2 + peers + fuse + 2 * nbd) + fuse_on * (1 + peers + fuse)),
        ("003", 3 * (2 + fuse + 2 * nbd)),
        ("004", 6 * (3 + peers + 3 * fuse) + 2),
    ];
    rows.iter().filter(|(id, _)| selected(id)).map(|(_, count)| count * options.reps.max(1)).sum()
}

/// Runs the selected seeds; `progress` hears of every row started, and
/// `finished` gets each seed's result as soon as it is measured, so a long
/// run that is stopped keeps what it already has.
pub fn run(
    options: &SeedOptions,
    progress: &dyn Fn(&str),
    finished: &mut dyn FnMut(&SeedResult) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<SeedResult>> {
    let scale = if options.quick { &QUICK } else { &FULL };
    let plan: Vec<_> = seeds(scale)?
        .into_iter()
        .filter(|(id, _, _)| options.only.is_empty() || options.only.iter().any(|only| only == id))
        .collect();
    let largest = plan.iter().map(|(_, _, bytes)| *bytes).max().unwrap_or(0);
    let image_bytes = largest + largest / 8 + (256 << 20);
    std::fs::create_dir_all(&options.work_dir)?;
    let _clean_up = peers::CleanUpOnDrop;
    let image = options.work_dir.join(format!("foliofs-seeds-{}.img", std::process::id()));
    // Removed by the cleanup, which the SIGINT handler also runs (the main
    // path's drop then waits for it).
    peers::remove_at_cleanup(&image);
    peers::lay_out(&image, image_bytes).context("lay out the scratch image")?;
    let peer_mounts = options.peers.then(|| {
        let dir = options.work_dir.join(format!("foliofs-peers-{}", std::process::id()));
        peers::remove_at_cleanup(&dir);
        dir
    });
    let lab = Lab { options, image, peer_mounts, progress, replay_peak_bytes: Default::default() };
    let mut results = Vec::new();
    for (_, seed, _) in plan {
        let result = seed(&lab, scale)?;
        finished(&result)?;
        results.push(result);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::counted_after;

    #[test]
    fn what_the_ramp_wrote_is_not_counted() {
        let written = AtomicU64::new(7);
        let counter = || written.load(Ordering::SeqCst);
        let (result, counted) = counted_after(Duration::from_millis(50), &counter, || {
            written.fetch_add(100, Ordering::SeqCst); // the ramp
            std::thread::sleep(Duration::from_secs(1));
            written.fetch_add(5, Ordering::SeqCst); // the measured time
            "done"
        });
        assert_eq!((result, counted), ("done", 5));
    }

    #[test]
    fn without_a_ramp_everything_is_counted() {
        let written = AtomicU64::new(0);
        let counter = || written.load(Ordering::SeqCst);
        let (_, counted) = counted_after(Duration::ZERO, &counter, || {
            // The reader thread reads at once, long before this.
            std::thread::sleep(Duration::from_secs(1));
            written.fetch_add(9, Ordering::SeqCst);
        });
        assert_eq!(counted, 9);
    }
}
