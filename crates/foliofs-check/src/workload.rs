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

use foliofs::dev::{FaultDev, RawDev};
use foliofs::FallocateMode;
use foliofs::{InodeKind, OpenFlags, Volume, VolumeOptions};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::mirror::MirrorDev;
use crate::model::{ByteHistory, Tree};
use crate::{mix, owner, pattern, ROOT};

mod execute;
mod generate;

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
    /// The volume reaches its device through the engine's NBD client and
    /// an in-process server that reorders what the protocol lets it
    /// ([`crate::nbd_loop`]); crash images are cut from what the server did.
    pub over_nbd: bool,
    /// The volume is of format 3, its metadata in a paged index (blocks of
    /// 4 KiB or more; `FOLIOFS_CHECK_METADATA_INDEX=1` asks the same of
    /// every workload).
    pub metadata_index: bool,
}

impl WorkloadConfig {
    pub fn new(seed: u64, block_bytes: u32, threads: usize, ops: usize) -> Self {
        Self {
            seed,
            block_bytes,
            threads,
            ops,
            options: "",
            over_nbd: false,
            metadata_index: false,
        }
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
    /// A range of one of the thread's files shared with or copied into
    /// another (or elsewhere in the same file): FICLONERANGE,
    /// FIDEDUPERANGE or copy_file_range, `len` bytes (0 for a clone: to
    /// the source's end of file).
    CloneRange {
        mode: CloneMode,
        from: String,
        to: String,
        src_pos: u64,
        dst_pos: u64,
        len: u64,
    },
}

/// Which call a [`Op::CloneRange`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneMode {
    /// `File::clone_range_from`: the destination shares the source's blocks.
    Clone,
    /// `File::dedupe_range_from`: shares them only if the bytes are equal.
    Dedupe,
    /// `File::copy_range_from`: clones the whole blocks, copies the edges.
    Copy,
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
            Op::CloneRange { mode, from, to, src_pos, dst_pos, len } => {
                let call = match mode {
                    CloneMode::Clone => "clone",
                    CloneMode::Dedupe => "dedupe",
                    CloneMode::Copy => "copy-range",
                };
                write!(f, "{call} {from} {src_pos}+{len} -> {to} {dst_pos}")
            }
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
    /// Blocks the other threads may free between a refusal for want of
    /// space and this thread's look at `statfs` (each may remove a whole
    /// file meanwhile): the slack [`ThreadModel::judge_no_space`] allows.
    pub(super) others_may_free_blocks: u64,
}

impl ThreadModel {
    /// The thread's directory and log, created before the log starts.
    pub(super) fn setup(volume: &Volume, index: usize, config: WorkloadConfig) -> Self {
        let (base, base_ino) = if config.threads == 1 {
            (String::new(), ROOT)
        } else {
            let name = format!("t{index}");
            let attr = volume.inodes().mkdir(ROOT, name.as_bytes(), 0o755, owner()).expect("mkdir");
            (format!("/{name}"), attr.ino)
        };
        let log = volume.inodes().create(base_ino, b"log", 0o644, owner()).expect("create log");
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
            others_may_free_blocks: (config.threads as u64 - 1)
                * Geometry::of(config.block_bytes)
                    .file_bytes_max
                    .div_ceil(config.block_bytes as u64),
        };
        model.inodes.insert(log.ino, InodeModel::new(true));
        model.initial_namespace = model.namespace();
        model
    }

    pub(super) fn is_empty_dir(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        !self.namespace_paths().any(|other| other.starts_with(&prefix))
    }

    /// Every path of the thread (its base excluded).
    pub(super) fn namespace_paths(&self) -> impl Iterator<Item = &String> {
        self.dirs
            .iter()
            .skip(1)
            .map(|(path, _)| path)
            .chain(self.files.keys())
            .chain(self.logs.keys())
            .chain(self.symlinks.keys())
    }

    pub(super) fn dir_ino(&self, dir_path: &str) -> Option<u64> {
        self.dirs.iter().find(|(path, _)| path == dir_path).map(|(_, ino)| *ino)
    }

    pub(super) fn exists(&self, path: &str) -> bool {
        self.files.contains_key(path)
            || self.logs.contains_key(path)
            || self.symlinks.contains_key(path)
            || self.dirs.iter().any(|(dir, _)| dir == path)
    }

    pub(super) fn symlink_ino(&self, path: &str) -> Option<u64> {
        self.symlinks.get(path).map(|(ino, _)| *ino)
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
    /// The NBD server the volume runs over, if any (`over_nbd`).
    _nbd: Option<crate::nbd_loop::NbdLoop>,
    /// The real device the workload ran on, when not only in memory.
    pub mirror: Option<Arc<MirrorDev>>,
}

/// What one thread leaves behind.
struct ThreadRun {
    model: ThreadModel,
    ops: Vec<Op>,
    spans: Vec<Span>,
    failure: Option<LiveFailure>,
}

impl Workload {
    /// How many times the NBD link dropped under the workload (over NBD).
    pub fn links_dropped(&self) -> u64 {
        self._nbd.as_ref().map_or(0, |nbd| nbd.links_dropped())
    }

    /// Generates and runs a random workload.
    pub fn generate(config: WorkloadConfig) -> Self {
        Self::run(config, None, None)
    }

    /// Runs the given op lists (one per thread) instead of generating them.
    pub fn replay(config: WorkloadConfig, ops: &[Vec<Op>]) -> Self {
        Self::run(config, Some(ops), None)
    }

    /// Generates a random workload and runs it on `real` (an NBD export,
    /// say) through a [`MirrorDev`], whose in-memory log the crash points
    /// are cut from.
    pub fn generate_on(config: WorkloadConfig, real: Arc<dyn RawDev>) -> Self {
        Self::run(config, None, Some(real))
    }

    fn run(
        config: WorkloadConfig,
        replay: Option<&[Vec<Op>]>,
        real: Option<Arc<dyn RawDev>>,
    ) -> Self {
        let geometry = Geometry::of(config.block_bytes);
        let (device, volume, mirror, nbd) = match real {
            None if config.over_nbd => {
                let (device, volume, nbd) = crate::new_volume_over_nbd(
                    geometry.volume_bytes,
                    config.block_bytes,
                    Some(geometry.journal_bytes),
                    &config.volume_options(),
                    config.seed,
                )
                .expect("mkfs over NBD on the in-memory device");
                (device, volume, None, Some(nbd))
            }
            None => {
                let mut mkfs =
                    crate::mkfs_options(config.block_bytes, Some(geometry.journal_bytes));
                mkfs.metadata_index |= config.metadata_index;
                let (device, volume) =
                    crate::new_volume_with(geometry.volume_bytes, &mkfs, &config.volume_options())
                        .expect("mkfs on the in-memory device");
                (device, volume, None, None)
            }
            Some(real) => {
                let (device, volume, mirror) = crate::new_mirrored_volume(
                    real,
                    geometry.volume_bytes,
                    config.block_bytes,
                    Some(geometry.journal_bytes),
                    &config.volume_options(),
                )
                .expect("mkfs on the mirrored device");
                (device, volume, Some(mirror), None)
            }
        };
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
        Self {
            config,
            geometry,
            device,
            volume,
            threads,
            ops,
            spans,
            ballast,
            failure,
            mirror,
            _nbd: nbd,
        }
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
    let attr = volume.inodes().create(ROOT, b"ballast", 0o644, owner()).expect("create ballast");
    let data = pattern(seed ^ 0xBA11A57, bytes);
    let file = volume.inodes().open_file(attr.ino, OpenFlags::WRITE).expect("open ballast");
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
        // A panic in the op (the engine's or the model's) is reported as
        // this op's violation, with its repro line, not as a crash of the
        // checker.
        let executed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.execute(volume, &op)));
        let result =
            executed.unwrap_or_else(|panic| Err(format!("panicked: {}", panic_message(&panic))));
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

/// The message a panic carried, as `panic!` formats it.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_string()
    } else {
        "a panic without a message".to_string()
    }
}
