//! Crash-point enumeration over a finished [`Workload`].
//!
//! The fault model is the one of [`FaultDev`]: a plain write is volatile
//! until a flush completes after it; a FUA write is durable on completion;
//! a power cut keeps every durable write and any subset of the volatile
//! ones, each kept whole, lost, or torn at 512-byte sectors.
//!
//! Crash points are every log position right before and right after
//! something became durable (a flush or a FUA write) and every position
//! where an fsync or syncfs returned. At each, the image keeping none of the volatile writes
//! is checked, and where there are volatile writes also the one keeping all
//! of them and `variants` random mixtures (kept, lost, torn). Each image
//! must pass fsck, mount, read the same through a read-only and a writable
//! mount, read the same again after a crash right after that recovery
//! mount and after its clean close, and agree with the model:
//!
//! - every file shows only bytes it was given at that offset (or zeros):
//!   no stale data, no data of another file, no garbage;
//! - its size is one it had, the end of a direct write, or a block boundary
//!   below a larger size it had (writeback moves the on-disk size run by
//!   run, a direct write to its end);
//! - an append-only log is an exact prefix of what was appended to it (so
//!   a size never covers a block whose write did not complete), at least
//!   as long as its last fsync;
//! - a file fsynced (or fdatasynced) before the cut and not changed after
//!   has exactly the fsynced content (and, after fsync, the fsynced
//!   extended attributes); a thread's subtree after a syncfs it issued,
//!   with no later op of it started, is exactly the model's;
//! - every file's extended attributes are a set it had after one of its
//!   setxattr/removexattr ops (each is atomic), the same on every mount.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use foliofs::dev::fault::{CowImage, Keep, LogEntry, TEAR_SECTOR_BYTES};
use foliofs::dev::{Device, FaultDev, FuaMode, RawDev};
use foliofs::{InodeKind, VolumeOptions};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::{read_tree, read_tree_xattrs, subtree, tree_diff, Tree};
use crate::workload::{
    LiveFailure, Op, Span, SpanKind, ThreadModel, Workload, WorkloadConfig, Xattrs,
};
use crate::{mix, open_cow_image, SECTOR_BYTES};

/// How thoroughly each workload is crashed.
#[derive(Debug, Clone, Copy)]
pub struct CrashOptions {
    /// Random mixtures of kept, lost and torn volatile writes per point.
    pub variants: usize,
    /// Shrink a failing workload to a short op list.
    pub shrink: bool,
    /// Replays the shrinker may spend.
    pub shrink_attempts: usize,
}

impl Default for CrashOptions {
    fn default() -> Self {
        Self { variants: 2, shrink: true, shrink_attempts: 400 }
    }
}

/// Counts over the workloads checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub workloads: u64,
    pub ops: u64,
    pub crash_points: u64,
    pub images: u64,
    pub violations: u64,
    /// NBD links dropped under the workloads (`--over-nbd`), each a
    /// reconnect that had to lose nothing.
    pub links_dropped: u64,
}

impl Stats {
    pub fn add(&mut self, other: &Stats) {
        self.workloads += other.workloads;
        self.ops += other.ops;
        self.crash_points += other.crash_points;
        self.images += other.images;
        self.violations += other.violations;
        self.links_dropped += other.links_dropped;
    }
}

/// What went wrong, and where.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The crash point (log entries kept); None for a failure while running.
    pub cut: Option<usize>,
    pub log_len: usize,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cut {
            Some(cut) => write!(
                f,
                "crash after {cut} of {} device log entries: {}",
                self.log_len, self.message
            ),
            None => write!(f, "while running: {}", self.message),
        }
    }
}

/// A failing workload, shrunk.
#[derive(Debug, Clone)]
pub struct CrashFailure {
    pub config: WorkloadConfig,
    pub violation: Violation,
    /// The shortest op lists found that still fail (one per thread).
    pub ops: Vec<Vec<Op>>,
    pub original_ops: usize,
}

impl fmt::Display for CrashFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let WorkloadConfig { seed, block_bytes, threads, ops, options, over_nbd, metadata_index } =
            self.config;
        writeln!(f, "VIOLATION: {}", self.violation)?;
        let options = if options.is_empty() { String::new() } else { format!("-o {options} ") };
        writeln!(
            f,
            "reproduce: foliofs {options}crashtest --seed {seed} --workloads 1 --ops {ops} \
             --block-size {block_bytes} --threads {threads}{}{}",
            if over_nbd { " --over-nbd" } else { "" },
            if metadata_index { " --metadata-index" } else { "" }
        )?;
        let kept: usize = self.ops.iter().map(Vec::len).sum();
        writeln!(f, "op list ({kept} of {} ops still fail):", self.original_ops)?;
        write!(f, "{}", Workload::format_ops(&self.ops))
    }
}

/// Generates, runs and crash-checks one workload, adding to `stats`; on a
/// violation shrinks it.
pub fn run_one(
    config: WorkloadConfig,
    options: &CrashOptions,
    stats: &mut Stats,
) -> Result<(), Box<CrashFailure>> {
    stats.workloads += 1;
    let workload = Workload::generate(config);
    stats.ops += workload.op_count() as u64;
    stats.links_dropped += workload.links_dropped();
    let (ops, violation) = match &workload.failure {
        None => match check_workload(&workload, options.variants, stats) {
            Ok(()) => return Ok(()),
            Err(violation) => (workload.ops.clone(), violation),
        },
        Some(live) => (truncated(&workload.ops, live), live_violation(&workload, live)),
    };
    drop(workload);
    stats.violations += 1;
    let original_ops = ops.iter().map(Vec::len).sum();
    let (ops, violation) =
        if options.shrink { shrink(config, ops, violation, options) } else { (ops, violation) };
    Err(Box::new(CrashFailure { config, violation, ops, original_ops }))
}

/// [`run_one`] with the workload on `real` (an NBD export, say) through a
/// [`crate::mirror::MirrorDev`]; after the run the real device must hold
/// exactly what the log says was written. Not shrunk: the shrinker replays
/// on the in-memory device, where the reproduce line points too.
pub fn run_one_on(
    config: WorkloadConfig,
    real: Arc<dyn RawDev>,
    options: &CrashOptions,
    stats: &mut Stats,
) -> Result<(), Box<CrashFailure>> {
    stats.workloads += 1;
    let workload = Workload::generate_on(config, real);
    stats.ops += workload.op_count() as u64;
    let violation = match &workload.failure {
        Some(live) => Some(live_violation(&workload, live)),
        None => mirror_violation(&workload)
            .or_else(|| check_workload(&workload, options.variants, stats).err()),
    };
    let Some(violation) = violation else { return Ok(()) };
    stats.violations += 1;
    let ops = match &workload.failure {
        Some(live) => truncated(&workload.ops, live),
        None => workload.ops.clone(),
    };
    let original_ops = ops.iter().map(Vec::len).sum();
    Err(Box::new(CrashFailure { config, violation, ops, original_ops }))
}

/// The real device under a mirrored workload differs from the log's image.
fn mirror_violation(workload: &Workload) -> Option<Violation> {
    let mirror = workload.mirror.as_ref()?;
    // A trim leaves the real device's bytes to the server; the log fills
    // them with a marker, so the images are compared only without trims.
    if workload.device.discard_requests() > 0 {
        return None;
    }
    let message = match mirror.first_difference() {
        Ok(None) => return None,
        Ok(Some(offset)) => format!("the real device differs from the write log at byte {offset}"),
        Err(error) => format!("reading the real device back: {error}"),
    };
    Some(Violation { cut: None, log_len: workload.device.log_len(), message })
}

fn truncated(ops: &[Vec<Op>], live: &LiveFailure) -> Vec<Vec<Op>> {
    let mut ops = ops.to_vec();
    ops[live.thread].truncate(live.op_index + 1);
    ops
}

fn live_violation(workload: &Workload, live: &LiveFailure) -> Violation {
    Violation {
        cut: None,
        log_len: workload.device.log_len(),
        message: format!(
            "thread {} op {} ({}): {}",
            live.thread, live.op_index, workload.ops[live.thread][live.op_index], live.message
        ),
    }
}

/// Replays `ops`; the violation it shows, if any.
fn replay_fails(config: WorkloadConfig, ops: &[Vec<Op>], variants: usize) -> Option<Violation> {
    let workload = Workload::replay(config, ops);
    match &workload.failure {
        None => check_workload(&workload, variants, &mut Stats::default()).err(),
        Some(live) => Some(live_violation(&workload, live)),
    }
}

/// Drops chunks of ops (halves, then quarters, ... then single ops) while
/// the replay still fails.
fn shrink(
    config: WorkloadConfig,
    mut ops: Vec<Vec<Op>>,
    mut violation: Violation,
    options: &CrashOptions,
) -> (Vec<Vec<Op>>, Violation) {
    let mut attempts = 0;
    let deadline = Instant::now() + std::time::Duration::from_secs(300);
    for thread in 0..ops.len() {
        let mut chunk = ops[thread].len().div_ceil(2).max(1);
        loop {
            let mut start = 0;
            while start < ops[thread].len() {
                if attempts >= options.shrink_attempts || Instant::now() > deadline {
                    return (ops, violation);
                }
                attempts += 1;
                let mut candidate = ops.clone();
                let end = (start + chunk).min(candidate[thread].len());
                candidate[thread].drain(start..end);
                match replay_fails(config, &candidate, options.variants) {
                    Some(found) => {
                        ops = candidate;
                        violation = found;
                    }
                    None => start += chunk,
                }
            }
            if chunk == 1 {
                break;
            }
            chunk = chunk.div_ceil(2);
        }
    }
    (ops, violation)
}

/// Crashes `workload` at every point; the first violation.
pub fn check_workload(
    workload: &Workload,
    variants: usize,
    stats: &mut Stats,
) -> Result<(), Violation> {
    let device = &workload.device;
    let log = device.log();
    let mut points = device.durability_points();
    // Right before each flush or FUA write: everything written since the
    // previous flush is still volatile there.
    points.extend(log.iter().enumerate().filter_map(|(index, entry)| {
        matches!(entry, LogEntry::Flush | LogEntry::Write { fua: true, .. }).then_some(index)
    }));
    points.extend(
        workload
            .spans
            .iter()
            .filter(|span| !matches!(span.kind, SpanKind::Other))
            .map(|span| span.log_end),
    );
    points.sort_unstable();
    points.dedup();
    let mut rng = ChaCha8Rng::seed_from_u64(mix(&[workload.config.seed, 31]));
    for &cut in &points {
        stats.crash_points += 1;
        let unflushed = device.unflushed_writes(cut);
        let mut choices: Vec<HashMap<usize, Keep>> = vec![HashMap::new()];
        if !unflushed.is_empty() {
            choices.push(unflushed.iter().map(|&index| (index, Keep::All)).collect());
            for _ in 0..variants {
                let choice = unflushed
                    .iter()
                    .map(|&index| {
                        let keep = match rng.random_range(0..4) {
                            0 => Keep::Nothing,
                            1 => {
                                let LogEntry::Write { data, .. } = &log[index] else {
                                    unreachable!("unflushed writes are writes")
                                };
                                let sectors = data.len().div_ceil(TEAR_SECTOR_BYTES);
                                Keep::Sectors((0..sectors).map(|_| rng.random_bool(0.5)).collect())
                            }
                            _ => Keep::All,
                        };
                        (index, keep)
                    })
                    .collect();
                choices.push(choice);
            }
        }
        for choice in choices {
            let image = device.crash_cow_image(cut, &|index| {
                choice.get(&index).cloned().unwrap_or(Keep::Nothing)
            });
            stats.images += 1;
            check_image(workload, cut, image).map_err(|message| Violation {
                cut: Some(cut),
                log_len: log.len(),
                message,
            })?;
        }
    }
    reservations_left(workload)
}

/// Once the workload is over and its data written back, no block may stay
/// reserved: a reservation that outlives its write is space lost until the
/// volume is opened again, and refuses writes for want of space meanwhile.
/// Checked after the crash points, whose log the sync here extends.
fn reservations_left(workload: &Workload) -> Result<(), Violation> {
    let violation = |message| Violation { cut: None, log_len: workload.device.log_len(), message };
    workload
        .volume
        .sync()
        .map_err(|error| violation(format!("sync after the workload: {error}")))?;
    let stat = workload.volume.statfs();
    if stat.available_blocks != stat.free_blocks {
        return Err(violation(format!(
            "{} blocks still reserved with the volume idle ({} free, {} available)",
            stat.free_blocks.saturating_sub(stat.available_blocks),
            stat.free_blocks,
            stat.available_blocks
        )));
    }
    Ok(())
}

fn read_only(workload: &Workload) -> VolumeOptions {
    VolumeOptions { read_only: true, ..workload.config.volume_options() }
}

/// One crash image: fsck, mounts, replays, then the model.
fn check_image(workload: &Workload, cut: usize, image: CowImage) -> Result<(), String> {
    // Every device on the image shares its chunks (the writable mount
    // copies those it writes).
    let raw = Arc::new(FaultDev::from_cow_image(image.clone(), SECTOR_BYTES));
    let fsck = foliofs::fsck::check(Arc::new(Device::new(raw, FuaMode::Native)));
    if !fsck.is_clean() {
        return Err(format!("fsck: {:?}", fsck.problems));
    }
    let ballast = workload.ballast.1;
    let skip = HashSet::from([ballast]);
    let (full, xattrs) = {
        let (_, volume) = open_cow_image(image.clone(), &read_only(workload))
            .map_err(|error| format!("mount: {error}"))?;
        let tree = read_tree(&volume, &HashSet::new())?;
        let xattrs = read_tree_xattrs(&volume, &tree)?;
        (tree, xattrs)
    };
    let same_xattrs = |volume: &foliofs::Volume, when: &str| -> Result<(), String> {
        if read_tree_xattrs(volume, &full)? != xattrs {
            return Err(format!("extended attributes differ {when}"));
        }
        Ok(())
    };
    // What the later mounts must read: the tree, the ballast's content
    // skipped (as they read it).
    let first: Tree = full
        .iter()
        .map(|(path, (ino, kind, content))| {
            let content = if *path == workload.ballast.0 { Vec::new() } else { content.clone() };
            (path.clone(), (*ino, *kind, content))
        })
        .collect();
    // Recovery by a writable mount (which frees orphans and may write).
    let (recovered_raw, recovered) = open_cow_image(image, &workload.config.volume_options())
        .map_err(|error| format!("writable mount: {error}"))?;
    let seen = read_tree(&recovered, &skip)?;
    if seen != first {
        return Err(format!("the writable mount differs: {}", tree_diff(&first, &seen)));
    }
    same_xattrs(&recovered, "on the writable mount")?;
    // A crash right after the recovery mount: only what it made durable.
    let again = recovered_raw.crash_cow_image(recovered_raw.log_len(), &|_| Keep::Nothing);
    let (_, volume) = open_cow_image(again, &read_only(workload))
        .map_err(|error| format!("mount after a crash during recovery: {error}"))?;
    let seen = read_tree(&volume, &skip)?;
    if seen != first {
        return Err(format!(
            "replaying again after recovery differs: {}",
            tree_diff(&first, &seen)
        ));
    }
    same_xattrs(&volume, "replaying again after recovery")?;
    drop(volume);
    recovered.close().map_err(|error| format!("closing the recovered volume: {error}"))?;
    let (_, volume) = open_cow_image(recovered_raw.cow_image(), &read_only(workload))
        .map_err(|error| format!("mount after recovery and close: {error}"))?;
    let seen = read_tree(&volume, &skip)?;
    if seen != first {
        return Err(format!("mount after a clean close differs: {}", tree_diff(&first, &seen)));
    }
    same_xattrs(&volume, "after recovery and a clean close")?;
    check_against_model(workload, cut, &full, &xattrs)
}

fn check_against_model(
    workload: &Workload,
    cut: usize,
    tree: &Tree,
    xattrs: &BTreeMap<u64, Xattrs>,
) -> Result<(), String> {
    let block_bytes = u64::from(workload.config.block_bytes);
    let (ballast_path, ballast_ino, ballast_content) = &workload.ballast;
    for (path, (ino, kind, content)) in tree {
        if *kind != InodeKind::File {
            continue;
        }
        if ino == ballast_ino {
            if path != ballast_path || content != ballast_content {
                return Err(format!("{path}: the synced ballast file changed"));
            }
            continue;
        }
        let inode =
            workload.inode(*ino).ok_or_else(|| format!("{path}: inode {ino} was never created"))?;
        let found_xattrs = &xattrs[ino];
        if !inode.xattr_states.contains(found_xattrs) {
            return Err(format!(
                "{path}: extended attributes {:?} were never the file's",
                found_xattrs
                    .iter()
                    .map(|(name, value)| (String::from_utf8_lossy(name), value.len()))
                    .collect::<Vec<_>>()
            ));
        }
        if let Some(pos) = inode.history.first_foreign(content) {
            return Err(format!(
                "{path}: byte {pos} = {:#04x} was never written there",
                content[pos]
            ));
        }
        let size = content.len() as u64;
        if inode.append_only {
            if !inode.content.starts_with(content) {
                let at = content.iter().zip(&inode.content).position(|(a, b)| a != b);
                return Err(format!(
                    "{path}: {size} bytes are not a prefix of the appends (first difference at {at:?})"
                ));
            }
            continue;
        }
        // Writeback moves the on-disk size run by run, so a crash may show a
        // size the file never had, but only one ending at a block boundary
        // below a larger size it had (direct write ends are in sizes_seen).
        let between_writebacks = size.is_multiple_of(block_bytes)
            && inode.sizes_seen.iter().any(|&seen_size| seen_size > size);
        if !inode.sizes_seen.contains(&size) && !between_writebacks {
            return Err(format!("{path}: size {size} was never the file's size"));
        }
    }
    for thread in &workload.threads {
        let own = |span: &&crate::workload::Span| span.thread == thread.index;
        let synced = workload
            .spans
            .iter()
            .filter(own)
            .filter(|span| span.log_end <= cut && matches!(span.kind, SpanKind::Sync(_)))
            .max_by_key(|span| span.op_index);
        if let Some(span) = synced {
            let SpanKind::Sync(expected) = &span.kind else { unreachable!() };
            let later_started = workload
                .spans
                .iter()
                .filter(own)
                .any(|later| later.op_index > span.op_index && later.log_start < cut);
            if !later_started {
                let found = subtree(tree, &thread.base, Some(ballast_path));
                if &found != expected {
                    return Err(format!(
                        "thread {}: the tree after {} (op {}) differs: {}",
                        thread.index,
                        span.description,
                        span.op_index,
                        tree_diff(expected, &found)
                    ));
                }
            }
        }
    }
    for thread in &workload.threads {
        check_namespace(workload, thread, cut, tree)?;
    }
    for span in &workload.spans {
        let SpanKind::DsyncWrite { ino, pos, data } = &span.kind else {
            continue;
        };
        if span.log_end > cut {
            continue;
        }
        let inode = workload.inode(*ino).expect("written files are known");
        if !inode.append_only && modified_later(workload, span, *ino, cut) {
            continue;
        }
        let end = *pos as usize + data.len();
        let found = tree.values().find(|(found_ino, _, _)| found_ino == ino);
        match found {
            Some((_, _, recovered))
                if recovered.len() >= end && recovered[*pos as usize..end] == data[..] => {}
            Some((_, _, recovered)) => {
                let at = recovered
                    .get(*pos as usize..)
                    .and_then(|tail| tail.iter().zip(data).position(|(a, b)| a != b));
                return Err(format!(
                    "thread {} op {} ({}): the O_DSYNC write is not durable: {} bytes \
                     recovered, first difference inside the write at {at:?}",
                    span.thread,
                    span.op_index,
                    span.description,
                    recovered.len()
                ));
            }
            None => {
                return Err(format!(
                    "thread {} op {} ({}): the file written with O_DSYNC is missing",
                    span.thread, span.op_index, span.description
                ))
            }
        }
    }
    for span in &workload.spans {
        let SpanKind::Fsync { ino, content, xattrs: synced_xattrs } = &span.kind else {
            continue;
        };
        if span.log_end > cut {
            continue;
        }
        let inode = workload.inode(*ino).expect("fsynced files are known");
        let found = tree.values().find(|(found_ino, _, _)| found_ino == ino);
        if inode.append_only {
            match found {
                Some((_, _, recovered)) if recovered.len() >= content.len() => {}
                Some((_, _, recovered)) => {
                    return Err(format!(
                        "thread {} op {} ({}): {} bytes recovered, {} were fsynced",
                        span.thread,
                        span.op_index,
                        span.description,
                        recovered.len(),
                        content.len()
                    ))
                }
                None => return Err(format!("{}: the fsynced log is missing", span.description)),
            }
            continue;
        }
        if modified_later(workload, span, *ino, cut) {
            continue;
        }
        if let (Some(expected), Some((found_ino, _, _))) = (synced_xattrs, found) {
            if &xattrs[found_ino] != expected {
                return Err(format!(
                    "thread {} op {} ({}): the extended attributes differ from the fsynced ones",
                    span.thread, span.op_index, span.description
                ));
            }
        }
        match found {
            Some((_, _, recovered)) if recovered == content => {}
            Some((_, _, recovered)) => {
                let at = recovered.iter().zip(content).position(|(a, b)| a != b);
                return Err(format!(
                    "thread {} op {} ({}): recovered {} bytes differ from the fsynced {} \
                     (first difference at {at:?})",
                    span.thread,
                    span.op_index,
                    span.description,
                    recovered.len(),
                    content.len()
                ));
            }
            None => {
                return Err(format!(
                    "thread {} op {} ({}): the fsynced file is missing",
                    span.thread, span.op_index, span.description
                ))
            }
        }
    }
    Ok(())
}

/// Whether a later op of the span's thread, started before the cut,
/// changed `ino` (its data, size or names).
fn modified_later(workload: &Workload, span: &Span, ino: u64, cut: usize) -> bool {
    workload.spans.iter().any(|later| {
        later.thread == span.thread
            && later.op_index > span.op_index
            && later.touched.contains(&ino)
            && later.log_start < cut
    })
}

/// Namespace operations are atomic and journaled in the order they
/// return, so the thread's recovered names (paths, inodes, kinds, symlink
/// targets) must be exactly its names after some prefix of its ops: no
/// longer than the ops started before the cut, and at least as long as
/// every durability promise that returned before the cut requires:
///
/// - its own syncfs: every op before it;
/// - another thread's syncfs: every op of this thread that returned before
///   that syncfs began;
/// - fsync of a directory: every op before it up to the last that changed
///   that directory's entries (or created it).
///
/// A create, rename, link or unlink that no such call covers may be lost
/// (only together with everything after it).
fn check_namespace(
    workload: &Workload,
    thread: &ThreadModel,
    cut: usize,
    tree: &Tree,
) -> Result<(), String> {
    let mut own: Vec<&Span> =
        workload.spans.iter().filter(|span| span.thread == thread.index).collect();
    own.sort_by_key(|span| span.op_index);
    let started = own.iter().take_while(|span| span.log_start < cut).count();
    let mut required = 0;
    let mut reason = String::from("nothing");
    for span in workload.spans.iter().filter(|span| span.log_end <= cut) {
        let needs = match &span.kind {
            SpanKind::Sync(_) if span.thread == thread.index => span.op_index + 1,
            SpanKind::Sync(_) => own.iter().take_while(|op| op.log_end < span.log_start).count(),
            SpanKind::FsyncDir { ino } if span.thread == thread.index => own[..span.op_index]
                .iter()
                .rposition(|op| op.touched.contains(ino))
                .map_or(0, |last| last + 1),
            _ => continue,
        };
        if needs > required {
            required = needs;
            reason = format!("thread {} op {} ({})", span.thread, span.op_index, span.description);
        }
    }
    let mut found = subtree(tree, &thread.base, Some(&workload.ballast.0));
    for (_, kind, content) in found.values_mut() {
        if *kind == InodeKind::File {
            content.clear();
        }
    }
    let namespace_after =
        |ops: usize| if ops == 0 { &thread.initial_namespace } else { &own[ops - 1].namespace };
    if (required..=started.max(required)).any(|ops| *namespace_after(ops) == found) {
        return Ok(());
    }
    let closest = (0..=started).find(|&ops| *namespace_after(ops) == found);
    Err(format!(
        "thread {}: the names are not those after any op from {required} (required by \
         {reason}) to {started} (started before the cut){}; against the names after op \
         {started}: {}",
        thread.index,
        match closest {
            Some(ops) => format!(", but those after {ops} ops"),
            None => String::new(),
        },
        tree_diff(namespace_after(started), &found)
    ))
}
