//! Seeded random workloads on the fault-injecting in-memory device.
//!
//! A workload runs `threads` threads. Each works in a directory of its own
//! (the root when there is one thread) on files of its own, so the model of
//! each thread is exact however the threads interleave; volume-wide calls
//! (syncfs, checkpoints) and the flushes one thread's fsync issues act on
//! everyone's data and are what makes the interleaving matter. Every thread
//! also has one append-only log, whose recovered content must be an exact
//! prefix of what was appended to it.
//!
//! Operations are generated against the thread's model and recorded as
//! [`Op`]s, so a workload can be replayed from its op lists, including a
//! list with ops removed (an op whose file no longer exists is skipped):
//! that is how failures are shrunk.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use foliofs::dev::{AlignedBuf, FaultDev};
use foliofs::space::FallocateMode;
use foliofs::{InodeKind, OpenFlags, Privilege, RenameFlags, Volume, VolumeOptions, XattrFlags};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::{apply_fallocate, read_file, read_xattrs, ByteHistory, Tree};
use crate::{mix, owner, pattern, ROOT, SECTOR_BYTES};

/// What one workload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadConfig {
    pub seed: u64,
    pub block_bytes: u32,
    pub threads: usize,
    /// Operations per thread.
    pub ops: usize,
    /// Volume options over [`crate::quiet_options`], as `-o` takes them
    /// (`dirty=folio,fua=emulate,dirty_bytes=64k`); "" for none.
    pub options: &'static str,
}

impl WorkloadConfig {
    pub fn new(seed: u64, block_bytes: u32, threads: usize, ops: usize) -> Self {
        Self { seed, block_bytes, threads, ops, options: "" }
    }

    /// The volume options this workload (and every mount of its images) uses.
    pub fn volume_options(&self) -> VolumeOptions {
        crate::options_with(self.options)
            .unwrap_or_else(|error| panic!("options {:?}: {error}", self.options))
    }
}

/// The sizes a workload works with on one block size.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub volume_bytes: u64,
    /// A small journal wraps and fills within one workload, so checkpoints
    /// and replay across the wrap are exercised.
    pub journal_bytes: u64,
    pub file_bytes_max: u64,
    pub write_bytes_max: usize,
    pub fallocate_bytes_max: u64,
    /// Data written before the workload so that little space is left and
    /// freed blocks are soon reused: a block's old owner must never see its
    /// new data.
    pub ballast_bytes: usize,
}

impl Geometry {
    pub fn of(block_bytes: u32) -> Self {
        if block_bytes < 65536 {
            // Files of up to 12 blocks of 4 KiB (48 of 1 KiB); about 264 KiB
            // left free next to the ballast.
            Self {
                volume_bytes: 8 << 20,
                journal_bytes: 64 << 10,
                file_bytes_max: 48 << 10,
                write_bytes_max: 12 << 10,
                fallocate_bytes_max: 16 << 10,
                ballast_bytes: (5 << 20) + (800 << 10),
            }
        } else {
            // The same shapes in 64 KiB blocks: files of up to 8 blocks,
            // writes and fallocates of up to 2, and 40 blocks free next to
            // the ballast, which ends inside a block. The data area of the
            // 8 MiB volume is 93 blocks (the checkpoint slots take 32).
            Self {
                volume_bytes: 8 << 20,
                journal_bytes: 64 << 10,
                file_bytes_max: 512 << 10,
                write_bytes_max: 128 << 10,
                fallocate_bytes_max: 128 << 10,
                ballast_bytes: 53 * 65536 - 1000,
            }
        }
    }
}

/// One operation, by path (relative to nothing: paths are absolute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Create {
        path: String,
    },
    Mkdir {
        path: String,
    },
    /// `len` bytes of `pattern(data, len)` at `pos`; direct writes are
    /// sector aligned (sub-block when the block is larger than a sector).
    /// `dsync`: through a handle opened with O_DSYNC (the library's O_SYNC
    /// is the same flag: the FUSE adapter maps both to it), so the write is
    /// durable when it returns.
    Write {
        path: String,
        pos: u64,
        len: usize,
        data: u64,
        direct: bool,
        dsync: bool,
    },
    /// `len` bytes at the end of an append-only log; direct only where the
    /// end is sector aligned (otherwise buffered).
    Append {
        path: String,
        len: usize,
        data: u64,
        direct: bool,
        dsync: bool,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Fallocate {
        path: String,
        mode: FallocateMode,
        offset: u64,
        len: u64,
    },
    Rename {
        from: String,
        to: String,
    },
    Link {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Symlink {
        path: String,
        target: String,
    },
    /// Renames a directory (not the thread's own), to a new name or over an
    /// empty directory, within or across directories.
    RenameDir {
        from: String,
        to: String,
    },
    /// rmdir; on a directory that is not empty it must fail with ENOTEMPTY
    /// and change nothing.
    Rmdir {
        path: String,
    },
    /// fsync of a directory ("" is the root): its entries are durable on
    /// return.
    FsyncDir {
        path: String,
    },
    Fsync {
        path: String,
        data_only: bool,
    },
    /// syncfs: `Volume::sync`.
    Sync,
    Checkpoint,
    /// Sets `user.x{name}` to `len` bytes of `pattern(data, len)`.
    SetXattr {
        path: String,
        name: u8,
        len: usize,
        data: u64,
    },
    RemoveXattr {
        path: String,
        name: u8,
    },
}

/// The name of the workload's extended attribute number `index`.
pub fn xattr_name(index: u8) -> Vec<u8> {
    format!("user.x{index}").into_bytes()
}

/// One inode's extended attributes: name -> value.
pub type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = |direct: &bool| if *direct { "direct" } else { "buffered" };
        let sync = |dsync: &bool| if *dsync { " dsync" } else { "" };
        match self {
            Op::Create { path } => write!(f, "create {path}"),
            Op::Mkdir { path } => write!(f, "mkdir {path}"),
            Op::Write { path, pos, len, data, direct, dsync } => {
                write!(f, "write {path} {pos}+{len} {}{} data={data:#x}", how(direct), sync(dsync))
            }
            Op::Append { path, len, data, direct, dsync } => {
                write!(f, "append {path} +{len} {}{} data={data:#x}", how(direct), sync(dsync))
            }
            Op::Truncate { path, size } => write!(f, "truncate {path} {size}"),
            Op::Fallocate { path, mode, offset, len } => {
                write!(f, "fallocate {path} {mode:?} {offset}+{len}")
            }
            Op::Rename { from, to } => write!(f, "rename {from} {to}"),
            Op::Link { from, to } => write!(f, "link {from} {to}"),
            Op::Unlink { path } => write!(f, "unlink {path}"),
            Op::Symlink { path, target } => write!(f, "symlink {path} -> {target}"),
            Op::RenameDir { from, to } => write!(f, "rename-dir {from} {to}"),
            Op::Rmdir { path } => write!(f, "rmdir {path}"),
            Op::FsyncDir { path } => write!(f, "fsync-dir {path}/"),
            Op::Fsync { path, data_only: false } => write!(f, "fsync {path}"),
            Op::Fsync { path, data_only: true } => write!(f, "fdatasync {path}"),
            Op::Sync => write!(f, "syncfs"),
            Op::Checkpoint => write!(f, "checkpoint"),
            Op::SetXattr { path, name, len, data } => {
                write!(f, "setxattr {path} user.x{name} {len} bytes data={data:#x}")
            }
            Op::RemoveXattr { path, name } => write!(f, "removexattr {path} user.x{name}"),
        }
    }
}

/// What the model knows of one inode.
#[derive(Debug, Clone, Default)]
pub struct InodeModel {
    /// The content now (what a read returns).
    pub content: Vec<u8>,
    /// Every byte value each offset was ever given.
    pub history: ByteHistory,
    /// Every size the file had.
    pub sizes_seen: HashSet<u64>,
    /// Only ever appended to: a recovered version must be a prefix of `content`.
    pub append_only: bool,
    /// The extended attributes now, and every set of them the inode had
    /// (each change is one transaction, so a crash recovers one of these).
    pub xattrs: Xattrs,
    pub xattr_states: Vec<Xattrs>,
}

impl InodeModel {
    fn new(append_only: bool) -> Self {
        Self {
            sizes_seen: HashSet::from([0]),
            append_only,
            xattr_states: vec![Xattrs::new()],
            ..Self::default()
        }
    }
}

/// One executed operation and the device log entries it spanned.
#[derive(Debug, Clone)]
pub struct Span {
    pub thread: usize,
    /// Index into the thread's op list.
    pub op_index: usize,
    pub log_start: usize,
    pub log_end: usize,
    pub description: String,
    /// Inodes whose content or names the op changed.
    pub touched: Vec<u64>,
    pub kind: SpanKind,
    /// The thread's namespace when the op returned (see
    /// [`ThreadModel::namespace`]).
    pub namespace: Tree,
}

#[derive(Debug, Clone)]
pub enum SpanKind {
    Other,
    /// fsync or fdatasync of `ino` returned with this content (and, for
    /// fsync, these extended attributes).
    Fsync {
        ino: u64,
        content: Vec<u8>,
        xattrs: Option<Xattrs>,
    },
    /// syncfs returned with the thread's subtree like this.
    Sync(Tree),
    /// A write through an O_DSYNC handle returned having written all of
    /// `data` at `pos` of `ino`.
    DsyncWrite {
        ino: u64,
        pos: u64,
        data: Vec<u8>,
    },
    /// fsync of the directory `ino` returned.
    FsyncDir {
        ino: u64,
    },
}

/// One thread's namespace and files.
#[derive(Debug, Clone)]
pub struct ThreadModel {
    pub index: usize,
    /// The thread's directory ("" for the root).
    pub base: String,
    /// Directories (the base first) with their inodes.
    pub dirs: Vec<(String, u64)>,
    /// Ordinary files by path.
    pub files: BTreeMap<String, u64>,
    /// Append-only logs by path.
    pub logs: BTreeMap<String, u64>,
    /// Symbolic links by path: inode and target.
    pub symlinks: BTreeMap<String, (u64, String)>,
    /// The namespace before the first op.
    pub initial_namespace: Tree,
    /// Every inode the thread created, linked or not.
    pub inodes: HashMap<u64, InodeModel>,
    next_name: u32,
}

/// A failure found while the workload ran (before any crash).
#[derive(Debug, Clone)]
pub struct LiveFailure {
    pub thread: usize,
    pub op_index: usize,
    pub message: String,
}

/// A workload that has run: its device (with the whole write log), model
/// and spans.
pub struct Workload {
    pub config: WorkloadConfig,
    pub geometry: Geometry,
    pub device: Arc<FaultDev>,
    pub volume: Volume,
    pub threads: Vec<ThreadModel>,
    /// The ops each thread executed (generated or replayed).
    pub ops: Vec<Vec<Op>>,
    /// Every op's span, ordered by where it started in the log.
    pub spans: Vec<Span>,
    /// The ballast file: path, inode, content. Synced before the log starts.
    pub ballast: (String, u64, Vec<u8>),
    /// A failure while running (the failing thread stopped there).
    pub failure: Option<LiveFailure>,
}

/// What one thread leaves behind.
struct ThreadRun {
    model: ThreadModel,
    ops: Vec<Op>,
    spans: Vec<Span>,
    failure: Option<LiveFailure>,
}

impl Workload {
    /// Generates and runs a random workload.
    pub fn generate(config: WorkloadConfig) -> Self {
        Self::run(config, None)
    }

    /// Runs the given op lists (one per thread) instead of generating them.
    pub fn replay(config: WorkloadConfig, ops: &[Vec<Op>]) -> Self {
        Self::run(config, Some(ops))
    }

    fn run(config: WorkloadConfig, replay: Option<&[Vec<Op>]>) -> Self {
        let geometry = Geometry::of(config.block_bytes);
        let (device, volume) = crate::new_volume(
            geometry.volume_bytes,
            config.block_bytes,
            Some(geometry.journal_bytes),
            &config.volume_options(),
        )
        .expect("mkfs on the in-memory device");
        let ballast = write_ballast(&volume, config.seed, geometry.ballast_bytes);
        let mut threads: Vec<ThreadModel> =
            (0..config.threads).map(|index| ThreadModel::setup(&volume, index, config)).collect();
        volume.sync().expect("sync after setup");
        device.reset_log();

        let results: Vec<ThreadRun> = std::thread::scope(|scope| {
            let handles: Vec<_> = threads
                .drain(..)
                .map(|model| {
                    let (volume, device) = (&volume, &device);
                    let list = replay.map(|lists| lists[model.index].clone());
                    scope.spawn(move || run_thread(model, volume, device, config, &geometry, list))
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().expect("workload thread")).collect()
        });
        let mut ops = Vec::new();
        let mut spans = Vec::new();
        let mut failure = None;
        for run in results {
            threads.push(run.model);
            ops.push(run.ops);
            spans.extend(run.spans);
            failure = failure.or(run.failure);
        }
        spans.sort_by_key(|span| (span.log_start, span.log_end, span.thread));
        Self { config, geometry, device, volume, threads, ops, spans, ballast, failure }
    }

    /// The model of `ino`, whichever thread made it.
    pub fn inode(&self, ino: u64) -> Option<&InodeModel> {
        self.threads.iter().find_map(|thread| thread.inodes.get(&ino))
    }

    pub fn op_count(&self) -> usize {
        self.ops.iter().map(Vec::len).sum()
    }

    /// The op lists, one line each, by thread.
    pub fn format_ops(ops: &[Vec<Op>]) -> String {
        let mut out = String::new();
        for (thread, list) in ops.iter().enumerate() {
            if ops.len() > 1 {
                out.push_str(&format!("thread {thread}:\n"));
            }
            for (index, op) in list.iter().enumerate() {
                out.push_str(&format!("  {index:3}: {op}\n"));
            }
        }
        out
    }
}

fn write_ballast(volume: &Volume, seed: u64, bytes: usize) -> (String, u64, Vec<u8>) {
    let attr = volume.create(ROOT, b"ballast", 0o644, owner()).expect("create ballast");
    let data = pattern(seed ^ 0xBA11A57, bytes);
    let file = volume.open_file(attr.ino, OpenFlags::WRITE).expect("open ballast");
    assert_eq!(file.write_at(&data, 0).expect("write ballast"), data.len());
    ("/ballast".into(), attr.ino, data)
}

fn run_thread(
    mut model: ThreadModel,
    volume: &Volume,
    device: &FaultDev,
    config: WorkloadConfig,
    geometry: &Geometry,
    replay: Option<Vec<Op>>,
) -> ThreadRun {
    let mut rng = ChaCha8Rng::seed_from_u64(mix(&[
        config.seed,
        model.index as u64,
        u64::from(config.block_bytes),
    ]));
    let count = replay.as_ref().map_or(config.ops, Vec::len);
    let mut ops = Vec::with_capacity(count);
    let mut spans = Vec::with_capacity(count);
    for op_index in 0..count {
        let op = match &replay {
            Some(list) => list[op_index].clone(),
            None => model.generate(&mut rng, geometry, config, op_index),
        };
        let log_start = device.log_len();
        let result = model.execute(volume, &op);
        let log_end = device.log_len();
        ops.push(op.clone());
        match result {
            Ok((touched, kind)) => spans.push(Span {
                thread: model.index,
                op_index,
                log_start,
                log_end,
                description: op.to_string(),
                touched,
                kind,
                namespace: model.namespace(),
            }),
            Err(message) => {
                let failure = Some(LiveFailure { thread: model.index, op_index, message });
                return ThreadRun { model, ops, spans, failure };
            }
        }
    }
    ThreadRun { model, ops, spans, failure: None }
}

type Executed = Result<(Vec<u64>, SpanKind), String>;

fn skipped() -> Executed {
    Ok((Vec::new(), SpanKind::Other))
}

fn dsync_kind(durable: bool, ino: u64, pos: u64, data: Vec<u8>) -> SpanKind {
    if durable {
        SpanKind::DsyncWrite { ino, pos, data }
    } else {
        SpanKind::Other
    }
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').expect("absolute path")
}

impl ThreadModel {
    /// The thread's directory and log, created before the log starts.
    fn setup(volume: &Volume, index: usize, config: WorkloadConfig) -> Self {
        let (base, base_ino) = if config.threads == 1 {
            (String::new(), ROOT)
        } else {
            let name = format!("t{index}");
            let attr = volume.mkdir(ROOT, name.as_bytes(), 0o755, owner()).expect("mkdir");
            (format!("/{name}"), attr.ino)
        };
        let log = volume.create(base_ino, b"log", 0o644, owner()).expect("create log");
        let mut model = Self {
            index,
            base: base.clone(),
            dirs: vec![(base.clone(), base_ino)],
            files: BTreeMap::new(),
            logs: BTreeMap::from([(format!("{base}/log"), log.ino)]),
            symlinks: BTreeMap::new(),
            initial_namespace: Tree::new(),
            inodes: HashMap::new(),
            next_name: 0,
        };
        model.inodes.insert(log.ino, InodeModel::new(true));
        model.initial_namespace = model.namespace();
        model
    }

    fn fresh_path(&mut self, rng: &mut ChaCha8Rng) -> String {
        self.next_name += 1;
        let dir = &self.dirs[rng.random_range(0..self.dirs.len())].0;
        format!("{dir}/n{}", self.next_name)
    }

    fn pick<'a>(rng: &mut ChaCha8Rng, map: &'a BTreeMap<String, u64>) -> Option<&'a String> {
        if map.is_empty() {
            return None;
        }
        map.keys().nth(rng.random_range(0..map.len()))
    }

    /// The next random op for this model.
    pub fn generate(
        &mut self,
        rng: &mut ChaCha8Rng,
        geometry: &Geometry,
        config: WorkloadConfig,
        op_index: usize,
    ) -> Op {
        let data = mix(&[config.seed, self.index as u64, op_index as u64]);
        let block = u64::from(config.block_bytes);
        let sector = u64::from(SECTOR_BYTES);
        let choice = rng.random_range(0..108);
        // Namespace ops that need no file come first in every draw.
        match choice {
            0..=2 => return Op::Symlink { path: self.fresh_path(rng), target: self.target(rng) },
            3..=5 => {
                if let Some(op) = self.rename_dir(rng) {
                    return op;
                }
            }
            6..=7 if self.dirs.len() > 1 => {
                let path = self.dirs[rng.random_range(1..self.dirs.len())].0.clone();
                return Op::Rmdir { path };
            }
            8..=11 => {
                let path = self.dirs[rng.random_range(0..self.dirs.len())].0.clone();
                return Op::FsyncDir { path };
            }
            _ => {}
        }
        let Some(path) = Self::pick(rng, &self.files).cloned() else {
            return match choice {
                12..=69 => Op::Create { path: self.fresh_path(rng) },
                70..=79 => self.append(rng, geometry, data),
                _ => Op::Mkdir { path: self.fresh_path(rng) },
            };
        };
        let length_now = self.inodes[&self.files[&path]].content.len() as u64;
        match choice {
            0..=17 => Op::Create { path: self.fresh_path(rng) },
            18..=22 => Op::Mkdir { path: self.fresh_path(rng) },
            23..=37 => {
                let direct = rng.random_bool(0.35);
                let mut pos = rng.random_range(0..geometry.file_bytes_max);
                let mut len = rng.random_range(1..=geometry.write_bytes_max);
                if direct {
                    // Half whole blocks, half sub-block sector runs.
                    let unit = if rng.random_bool(0.5) { block } else { sector };
                    pos -= pos % unit;
                    len = len.div_ceil(unit as usize) * unit as usize;
                }
                Op::Write { path, pos, len, data, direct, dsync: rng.random_bool(0.2) }
            }
            38..=43 => self.append(rng, geometry, data),
            44..=49 => {
                let mode = match rng.random_range(0..6) {
                    0 => FallocateMode::Allocate { keep_size: rng.random_bool(0.5) },
                    1 | 2 => FallocateMode::PunchHole,
                    3 => FallocateMode::ZeroRange { keep_size: rng.random_bool(0.5) },
                    4 => FallocateMode::CollapseRange,
                    _ => FallocateMode::InsertRange,
                };
                let (offset, len) = match mode {
                    FallocateMode::CollapseRange | FallocateMode::InsertRange => {
                        let blocks = (length_now / block).max(1);
                        (rng.random_range(0..blocks) * block, rng.random_range(1..=3) * block)
                    }
                    _ => (
                        rng.random_range(0..geometry.file_bytes_max),
                        rng.random_range(1..geometry.fallocate_bytes_max),
                    ),
                };
                Op::Fallocate { path, mode, offset, len }
            }
            50..=54 => Op::Truncate { path, size: rng.random_range(0..geometry.file_bytes_max) },
            55..=59 => {
                // Now and then a symbolic link instead of a file.
                let link = Self::pick_symlink(rng, &self.symlinks).filter(|_| rng.random_bool(0.3));
                Op::Unlink { path: link.unwrap_or(path) }
            }
            60..=65 => {
                let from = Self::pick_symlink(rng, &self.symlinks)
                    .filter(|_| rng.random_bool(0.2))
                    .unwrap_or(path);
                // Half the time onto another file (or link) of the thread,
                // replacing it.
                let victim = Self::pick(rng, &self.files).filter(|victim| **victim != from);
                let to = match victim {
                    Some(victim) if rng.random_bool(0.5) => victim.clone(),
                    _ => self.fresh_path(rng),
                };
                Op::Rename { from, to }
            }
            66..=69 => {
                let from = Self::pick_symlink(rng, &self.symlinks)
                    .filter(|_| rng.random_bool(0.2))
                    .unwrap_or(path);
                Op::Link { from, to: self.fresh_path(rng) }
            }
            70..=83 => {
                let path = if rng.random_bool(0.25) {
                    self.logs.keys().next().cloned().expect("every thread has a log")
                } else {
                    path
                };
                Op::Fsync { path, data_only: rng.random_bool(0.5) }
            }
            84..=89 => Op::Checkpoint,
            100..=107 => {
                let path = if rng.random_bool(0.2) {
                    self.logs.keys().next().cloned().expect("every thread has a log")
                } else {
                    path
                };
                let name = rng.random_range(0..4);
                if choice >= 105 {
                    Op::RemoveXattr { path, name }
                } else {
                    let len = [0, 16, 900, 4000][rng.random_range(0..4)];
                    Op::SetXattr { path, name, len, data }
                }
            }
            _ => Op::Sync,
        }
    }

    fn pick_symlink(rng: &mut ChaCha8Rng, map: &BTreeMap<String, (u64, String)>) -> Option<String> {
        if map.is_empty() {
            return None;
        }
        map.keys().nth(rng.random_range(0..map.len())).cloned()
    }

    /// A symlink target: a path of the thread (in another directory, often),
    /// relative or absolute, or a name that does not exist.
    fn target(&self, rng: &mut ChaCha8Rng) -> String {
        let known: Vec<&String> = self.files.keys().chain(self.dirs.iter().map(|d| &d.0)).collect();
        match rng.random_range(0..3) {
            0 => format!("dangling-{}", rng.random_range(0..1000)),
            1 => format!("..{}", known[rng.random_range(0..known.len())]),
            _ => format!("{}/", known[rng.random_range(0..known.len())]),
        }
    }

    /// A directory rename: to a fresh name (in the same or another
    /// directory) or over an empty directory; never into itself.
    fn rename_dir(&mut self, rng: &mut ChaCha8Rng) -> Option<Op> {
        if self.dirs.len() < 2 {
            return None;
        }
        let from = self.dirs[rng.random_range(1..self.dirs.len())].0.clone();
        let inside = |path: &str| path == from || path.starts_with(&format!("{from}/"));
        let empty: Vec<String> = self
            .dirs
            .iter()
            .skip(1)
            .map(|(path, _)| path.clone())
            .filter(|path| !inside(path) && self.is_empty_dir(path))
            .collect();
        if !empty.is_empty() && rng.random_bool(0.6) {
            let to = empty[rng.random_range(0..empty.len())].clone();
            return Some(Op::RenameDir { from, to });
        }
        if empty.is_empty() && rng.random_bool(0.5) {
            // An empty directory for a later rename to replace.
            return Some(Op::Mkdir { path: self.fresh_path(rng) });
        }
        let parents: Vec<String> =
            self.dirs.iter().map(|(path, _)| path.clone()).filter(|path| !inside(path)).collect();
        let parent = parents[rng.random_range(0..parents.len())].clone();
        self.next_name += 1;
        Some(Op::RenameDir { from, to: format!("{parent}/d{}", self.next_name) })
    }

    fn is_empty_dir(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        !self.namespace_paths().any(|other| other.starts_with(&prefix))
    }

    /// Every path of the thread (its base excluded).
    fn namespace_paths(&self) -> impl Iterator<Item = &String> {
        self.dirs
            .iter()
            .skip(1)
            .map(|(path, _)| path)
            .chain(self.files.keys())
            .chain(self.logs.keys())
            .chain(self.symlinks.keys())
    }

    fn append(&mut self, rng: &mut ChaCha8Rng, geometry: &Geometry, data: u64) -> Op {
        let path = self.logs.keys().next().cloned().expect("every thread has a log");
        let length_now = self.inodes[&self.logs[&path]].content.len();
        let direct = length_now.is_multiple_of(SECTOR_BYTES as usize) && rng.random_bool(0.4);
        let mut len = rng.random_range(1..=geometry.write_bytes_max / 2);
        if direct {
            len = len.div_ceil(SECTOR_BYTES as usize) * SECTOR_BYTES as usize;
        }
        Op::Append { path, len, data, direct, dsync: rng.random_bool(0.2) }
    }

    fn dir_ino(&self, dir_path: &str) -> Option<u64> {
        self.dirs.iter().find(|(path, _)| path == dir_path).map(|(_, ino)| *ino)
    }

    fn exists(&self, path: &str) -> bool {
        self.files.contains_key(path)
            || self.logs.contains_key(path)
            || self.symlinks.contains_key(path)
            || self.dirs.iter().any(|(dir, _)| dir == path)
    }

    /// Runs `op` on the volume and the model. Ops that do not fit the
    /// model (after shrinking removed what they needed) are skipped.
    pub fn execute(&mut self, volume: &Volume, op: &Op) -> Executed {
        match op {
            Op::Create { path } | Op::Mkdir { path } => {
                let (dir_path, name) = split(path);
                let Some(dir) = self.dir_ino(dir_path) else { return skipped() };
                if self.exists(path) {
                    return skipped();
                }
                if matches!(op, Op::Mkdir { .. }) {
                    let attr = volume
                        .mkdir(dir, name.as_bytes(), 0o755, owner())
                        .map_err(|error| format!("mkdir: {error}"))?;
                    self.dirs.push((path.clone(), attr.ino));
                    return Ok((vec![dir, attr.ino], SpanKind::Other));
                }
                let attr = volume
                    .create(dir, name.as_bytes(), 0o644, owner())
                    .map_err(|error| format!("create: {error}"))?;
                self.files.insert(path.clone(), attr.ino);
                self.inodes.insert(attr.ino, InodeModel::new(false));
                Ok((vec![dir, attr.ino], SpanKind::Other))
            }
            Op::Write { path, pos, len, data, direct, dsync } => {
                let Some(&ino) = self.files.get(path) else { return skipped() };
                let data = pattern(*data, *len);
                let whole = self.write(volume, ino, *pos, &data, *direct, *dsync)?;
                Ok((vec![ino], dsync_kind(*dsync && whole, ino, *pos, data)))
            }
            Op::Append { path, len, data, direct, dsync } => {
                let Some(&ino) = self.logs.get(path) else { return skipped() };
                let pos = self.inodes[&ino].content.len() as u64;
                let direct = *direct && pos.is_multiple_of(u64::from(SECTOR_BYTES));
                let data = pattern(*data, *len);
                let whole = self.write(volume, ino, pos, &data, direct, *dsync)?;
                Ok((vec![ino], dsync_kind(*dsync && whole, ino, pos, data)))
            }
            Op::Truncate { path, size } => {
                let Some(&ino) = self.files.get(path) else { return skipped() };
                let file = open(volume, ino, OpenFlags::WRITE)?;
                file.set_len(*size).map_err(|error| format!("truncate: {error}"))?;
                let inode = self.inodes.get_mut(&ino).expect("known");
                inode.content.resize(*size as usize, 0);
                inode.sizes_seen.insert(*size);
                Ok((vec![ino], SpanKind::Other))
            }
            Op::Fallocate { path, mode, offset, len } => {
                let Some(&ino) = self.files.get(path) else { return skipped() };
                let file = open(volume, ino, OpenFlags::WRITE)?;
                match file.fallocate(*mode, *offset, *len) {
                    Ok(()) => {
                        let inode = self.inodes.get_mut(&ino).expect("known");
                        apply_fallocate(&mut inode.content, *mode, *offset as usize, *len as usize);
                        // Shifted bytes were given at their new offsets too.
                        inode.history.record(0, &inode.content);
                        inode.sizes_seen.insert(inode.content.len() as u64);
                        Ok((vec![ino], SpanKind::Other))
                    }
                    Err(error)
                        if matches!(error.errno(), libc::EINVAL | libc::ENOSPC | libc::EFBIG) =>
                    {
                        // Refused: the file must be as it was.
                        let now = read_file(volume, ino)
                            .map_err(|error| format!("read back: {error}"))?;
                        if now != self.inodes[&ino].content {
                            return Err(format!(
                                "fallocate refused ({error}) but changed the file"
                            ));
                        }
                        Ok((Vec::new(), SpanKind::Other))
                    }
                    Err(error) => Err(format!("fallocate: {error}")),
                }
            }
            Op::Rename { from, to } => {
                let Some(ino) = self.files.get(from).copied().or_else(|| self.symlink_ino(from))
                else {
                    return skipped();
                };
                let (from_dir, from_name) = split(from);
                let (to_dir_path, to_name) = split(to);
                let Some(to_dir) = self.dir_ino(to_dir_path) else { return skipped() };
                let from_dir = self.dir_ino(from_dir).expect("a file's directory is known");
                if from == to || self.logs.contains_key(to) || self.dirs.iter().any(|d| d.0 == *to)
                {
                    return skipped();
                }
                let target_ino = self.files.get(to).copied().or_else(|| self.symlink_ino(to));
                volume
                    .rename(
                        from_dir,
                        from_name.as_bytes(),
                        to_dir,
                        to_name.as_bytes(),
                        RenameFlags::default(),
                    )
                    .map_err(|error| format!("rename: {error}"))?;
                if target_ino == Some(ino) {
                    // Both names are links to one inode: POSIX says do nothing.
                    return Ok((Vec::new(), SpanKind::Other));
                }
                let victim = self.files.remove(to).or(self.symlinks.remove(to).map(|(ino, _)| ino));
                if let Some(ino) = self.files.remove(from) {
                    self.files.insert(to.clone(), ino);
                } else if let Some(link) = self.symlinks.remove(from) {
                    self.symlinks.insert(to.clone(), link);
                }
                let touched = [Some(ino), victim, Some(from_dir), Some(to_dir)];
                Ok((touched.into_iter().flatten().collect(), SpanKind::Other))
            }
            Op::Link { from, to } => {
                let Some(ino) = self.files.get(from).copied().or_else(|| self.symlink_ino(from))
                else {
                    return skipped();
                };
                let (to_dir_path, to_name) = split(to);
                let Some(to_dir) = self.dir_ino(to_dir_path) else { return skipped() };
                if self.exists(to) {
                    return skipped();
                }
                volume
                    .link(ino, to_dir, to_name.as_bytes())
                    .map_err(|error| format!("link: {error}"))?;
                if let Some(link) = self.symlinks.get(from).cloned() {
                    self.symlinks.insert(to.clone(), link);
                } else {
                    self.files.insert(to.clone(), ino);
                }
                Ok((vec![ino, to_dir], SpanKind::Other))
            }
            Op::Unlink { path } => {
                let Some(ino) = self.files.get(path).copied().or_else(|| self.symlink_ino(path))
                else {
                    return skipped();
                };
                let (dir_path, name) = split(path);
                let dir = self.dir_ino(dir_path).expect("a file's directory is known");
                volume.unlink(dir, name.as_bytes()).map_err(|error| format!("unlink: {error}"))?;
                self.files.remove(path);
                self.symlinks.remove(path);
                Ok((vec![ino, dir], SpanKind::Other))
            }
            Op::Symlink { path, target } => {
                let (dir_path, name) = split(path);
                let Some(dir) = self.dir_ino(dir_path) else { return skipped() };
                if self.exists(path) {
                    return skipped();
                }
                let attr = volume
                    .symlink(dir, name.as_bytes(), target.as_bytes(), owner())
                    .map_err(|error| format!("symlink: {error}"))?;
                self.symlinks.insert(path.clone(), (attr.ino, target.clone()));
                Ok((vec![dir, attr.ino], SpanKind::Other))
            }
            Op::RenameDir { from, to } => self.rename_dir_op(volume, from, to),
            Op::Rmdir { path } => {
                let Some(ino) = self.dir_ino(path).filter(|_| *path != self.base) else {
                    return skipped();
                };
                let (parent_path, name) = split(path);
                let parent = self.dir_ino(parent_path).expect("a directory's parent is known");
                let result = volume.rmdir(parent, name.as_bytes());
                if !self.is_empty_dir(path) {
                    return match result {
                        Err(error) if error.errno() == libc::ENOTEMPTY => skipped(),
                        Err(error) => Err(format!("rmdir of a non-empty directory: {error}")),
                        Ok(()) => Err("rmdir removed a directory that is not empty".into()),
                    };
                }
                result.map_err(|error| format!("rmdir: {error}"))?;
                self.dirs.retain(|(dir, _)| dir != path);
                Ok((vec![parent, ino], SpanKind::Other))
            }
            Op::FsyncDir { path } => {
                let Some(ino) = self.dir_ino(path) else { return skipped() };
                volume.fsync_inode(ino, false).map_err(|error| format!("fsync dir: {error}"))?;
                Ok((Vec::new(), SpanKind::FsyncDir { ino }))
            }
            Op::Fsync { path, data_only } => {
                let Some(&ino) = self.files.get(path).or_else(|| self.logs.get(path)) else {
                    return skipped();
                };
                let file = open(volume, ino, OpenFlags::READ)?;
                if *data_only { file.fdatasync() } else { file.fsync() }
                    .map_err(|error| format!("fsync: {error}"))?;
                let content = self.inodes[&ino].content.clone();
                let xattrs = self.inodes[&ino].xattrs.clone();
                // The model must agree with the live file, or every crash
                // check after this would be wrong.
                let live_xattrs = read_xattrs(volume, ino)?;
                if live_xattrs != xattrs {
                    return Err(format!(
                        "live extended attributes differ from the model: {:?} vs {:?}",
                        live_xattrs.keys().collect::<Vec<_>>(),
                        xattrs.keys().collect::<Vec<_>>()
                    ));
                }
                let live = read_file(volume, ino).map_err(|error| format!("read: {error}"))?;
                if live != content {
                    let at = live.iter().zip(&content).position(|(a, b)| a != b);
                    return Err(format!(
                        "live file differs from the model: {} vs {} bytes, first difference at {at:?}",
                        live.len(),
                        content.len()
                    ));
                }
                let xattrs = (!*data_only).then_some(xattrs);
                Ok((Vec::new(), SpanKind::Fsync { ino, content, xattrs }))
            }
            Op::Sync => {
                volume.sync().map_err(|error| format!("syncfs: {error}"))?;
                Ok((Vec::new(), SpanKind::Sync(self.tree())))
            }
            Op::Checkpoint => {
                volume.checkpoint().map_err(|error| format!("checkpoint: {error}"))?;
                Ok((Vec::new(), SpanKind::Other))
            }
            Op::SetXattr { path, name, len, data } => {
                let Some(&ino) = self.files.get(path).or_else(|| self.logs.get(path)) else {
                    return skipped();
                };
                let (name, value) = (xattr_name(*name), pattern(*data, *len));
                volume
                    .set_xattr(ino, &name, &value, XattrFlags::default(), Privilege::Unprivileged)
                    .map_err(|error| format!("setxattr: {error}"))?;
                let inode = self.inodes.get_mut(&ino).expect("known");
                inode.xattrs.insert(name, value);
                inode.xattr_states.push(inode.xattrs.clone());
                Ok((vec![ino], SpanKind::Other))
            }
            Op::RemoveXattr { path, name } => {
                let Some(&ino) = self.files.get(path).or_else(|| self.logs.get(path)) else {
                    return skipped();
                };
                let name = xattr_name(*name);
                let inode = self.inodes.get_mut(&ino).expect("known");
                if !inode.xattrs.contains_key(&name) {
                    return skipped();
                }
                volume
                    .remove_xattr(ino, &name, Privilege::Unprivileged)
                    .map_err(|error| format!("removexattr: {error}"))?;
                inode.xattrs.remove(&name);
                inode.xattr_states.push(inode.xattrs.clone());
                Ok((vec![ino], SpanKind::Other))
            }
        }
    }

    fn symlink_ino(&self, path: &str) -> Option<u64> {
        self.symlinks.get(path).map(|(ino, _)| *ino)
    }

    fn rename_dir_op(&mut self, volume: &Volume, from: &str, to: &str) -> Executed {
        let Some(ino) = self.dir_ino(from).filter(|_| from != self.base) else {
            return skipped();
        };
        let (from_parent_path, from_name) = split(from);
        let (to_parent_path, to_name) = split(to);
        let Some(to_parent) = self.dir_ino(to_parent_path) else { return skipped() };
        let from_parent = self.dir_ino(from_parent_path).expect("a directory's parent is known");
        let inside = |path: &str| path == from || path.starts_with(&format!("{from}/"));
        let victim = self.dir_ino(to);
        let over_empty_dir = victim.is_some() && self.is_empty_dir(to);
        if inside(to) || (self.exists(to) && !over_empty_dir) {
            return skipped();
        }
        volume
            .rename(
                from_parent,
                from_name.as_bytes(),
                to_parent,
                to_name.as_bytes(),
                RenameFlags::default(),
            )
            .map_err(|error| format!("rename of a directory: {error}"))?;
        self.dirs.retain(|(dir, _)| dir != to);
        let moved = |path: &String| -> String {
            if inside(path) {
                format!("{to}{}", &path[from.len()..])
            } else {
                path.clone()
            }
        };
        for (dir, _) in &mut self.dirs {
            *dir = moved(dir);
        }
        self.files = self.files.iter().map(|(path, ino)| (moved(path), *ino)).collect();
        self.symlinks =
            self.symlinks.iter().map(|(path, link)| (moved(path), link.clone())).collect();
        let touched = [Some(ino), victim, Some(from_parent), Some(to_parent)];
        Ok((touched.into_iter().flatten().collect(), SpanKind::Other))
    }

    /// Writes `data` at `pos`, buffered or direct, and updates the model.
    /// A write refused or cut short for want of space must leave every byte
    /// either as it was or as written; the model then takes what the file
    /// holds. Whether the whole write went in.
    fn write(
        &mut self,
        volume: &Volume,
        ino: u64,
        pos: u64,
        data: &[u8],
        direct: bool,
        dsync: bool,
    ) -> Result<bool, String> {
        let flags = if direct { OpenFlags::WRITE.with_direct() } else { OpenFlags::WRITE };
        let flags = if dsync { flags.with_dsync() } else { flags };
        let file = open(volume, ino, flags)?;
        let result = if direct {
            file.write_at(&AlignedBuf::from_slice(data), pos)
        } else {
            file.write_at(data, pos)
        };
        drop(file);
        let inode = self.inodes.get_mut(&ino).expect("known");
        let start = pos as usize;
        inode.history.record(start, data);
        match result {
            Ok(written) if written == data.len() => {
                if inode.content.len() < start + written {
                    inode.content.resize(start + written, 0);
                }
                inode.content[start..start + written].copy_from_slice(data);
                inode.sizes_seen.insert(inode.content.len() as u64);
                if direct {
                    // A direct write past the on-disk size moves it to the
                    // write's end, even when buffered data not yet written
                    // back makes the file longer.
                    inode.sizes_seen.insert((start + written) as u64);
                }
                Ok(true)
            }
            Ok(_) => self.adopt_partial(volume, ino, start, data).map(|()| false),
            Err(error) if error.errno() == libc::ENOSPC => {
                self.adopt_partial(volume, ino, start, data).map(|()| false)
            }
            Err(error) => Err(format!("write: {error}")),
        }
    }

    fn adopt_partial(
        &mut self,
        volume: &Volume,
        ino: u64,
        start: usize,
        data: &[u8],
    ) -> Result<(), String> {
        let now = read_file(volume, ino).map_err(|error| format!("read back: {error}"))?;
        let inode = self.inodes.get_mut(&ino).expect("known");
        let old = &inode.content;
        let end = start + data.len();
        if now.len() < old.len() || now.len() > old.len().max(end) {
            return Err(format!(
                "a write cut short for want of space left size {} (was {}, write ended at {end})",
                now.len(),
                old.len()
            ));
        }
        for (pos, &byte) in now.iter().enumerate() {
            let before = old.get(pos).copied().unwrap_or(0);
            let written = (start..end).contains(&pos).then(|| data[pos - start]);
            if byte != before && Some(byte) != written {
                return Err(format!(
                    "a write cut short for want of space left byte {pos} = {byte:#04x}, \
                     neither the old {before:#04x} nor the new {written:?}"
                ));
            }
        }
        inode.content = now;
        inode.sizes_seen.insert(inode.content.len() as u64);
        Ok(())
    }

    /// The thread's subtree as the model has it (symlinks with their
    /// targets as content).
    pub fn tree(&self) -> Tree {
        let mut tree = self.namespace();
        for (path, ino) in self.files.iter().chain(&self.logs) {
            tree.insert(path.clone(), (*ino, InodeKind::File, self.inodes[ino].content.clone()));
        }
        tree
    }

    /// The thread's names only: [`Self::tree`] with file contents left
    /// empty (symlink targets kept). Namespace operations are atomic and
    /// journaled in order, so a recovered namespace must be one of these.
    pub fn namespace(&self) -> Tree {
        let mut tree = Tree::new();
        for (path, ino) in &self.dirs {
            if !path.is_empty() {
                tree.insert(path.clone(), (*ino, InodeKind::Dir, Vec::new()));
            }
        }
        for (path, ino) in self.files.iter().chain(&self.logs) {
            tree.insert(path.clone(), (*ino, InodeKind::File, Vec::new()));
        }
        for (path, (ino, target)) in &self.symlinks {
            tree.insert(path.clone(), (*ino, InodeKind::Symlink, target.as_bytes().to_vec()));
        }
        tree
    }
}

fn open(volume: &Volume, ino: u64, flags: OpenFlags) -> Result<foliofs::File, String> {
    volume.open_file(ino, flags).map_err(|error| format!("open inode {ino}: {error}"))
}
