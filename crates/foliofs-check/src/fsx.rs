//! An fsx-style checker: random operations on one file, each compared with
//! an in-memory copy of what the file must hold.
//!
//! Operations: buffered reads and writes; direct reads and writes with
//! aligned buffers in units of the device's logical block (512 B, so
//! sub-block on every block size); truncation up and down; every fallocate
//! mode (collapse and insert block aligned, as they must be); SEEK_DATA and
//! SEEK_HOLE (what they skip must read as zeros); fsync and fdatasync;
//! clones (FICLONERANGE), deduplication (FIDEDUPERANGE) and copy_file_range
//! within the file, as xfstests' fsx runs them, and between it and a second
//! file that only these ops, writes, truncates, punches and a whole-file
//! re-clone (after unlinking the old one, still open) change; closing and
//! reopening the handles; now and then a clean remount, and a crash right
//! after an fsync of both files (remounted from what the device made
//! durable, which must be the whole of both). Every read is compared, and
//! so is each range a clone, dedupe or copy wrote; both files and their
//! sizes are compared, and the volume's shared-block counts checked against
//! the extent maps, every `compare_every` ops and after every reopen and
//! remount; at the end fsck checks the volume.
//!
//! A clone, dedupe or copy names its source and destination file, its
//! ranges, and whether it goes through the direct handles. What it must do
//! is worked out from the model by the rules the calls document (block
//! alignment, the end-of-file tail, overlap within one file, ranges inside
//! both files for dedupe), so the ops that must fail with EINVAL are
//! checked too. Dedupes pick ranges a clone or copy made equal, ranges
//! first written with the same bytes (or the same but one), and random
//! ones; they must share what the model says is equal and return 0, changing
//! nothing, where it differs.

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use foliofs::dev::fault::Keep;
use foliofs::dev::{AlignedBuf, FaultDev};
use foliofs::FallocateMode;
use foliofs::{File, OpenFlags, Volume};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::{apply_fallocate, clone_rule, copy_rule, overlaps};
use crate::{fill_pattern, mix, new_volume, open_raw, owner, ROOT, SECTOR_BYTES};

/// The second file's name (the first is `fsx`).
const OTHER_NAME: &[u8] = b"fsx.other";

/// Ranges a clone or copy made equal, remembered for dedupes to try.
const EQUAL_RANGES_KEPT: usize = 8;

#[derive(Debug, Clone, Copy)]
pub struct FsxConfig {
    pub seed: u64,
    pub ops: u64,
    pub block_bytes: u32,
    /// The largest the file grows (0: 256 KiB, 2 MiB on 64 KiB blocks).
    pub file_bytes_max: u64,
    /// The longest read, write or fallocate (0: 64 KiB, 256 KiB on 64 KiB blocks).
    pub op_bytes_max: u64,
    /// Ops between whole-file comparisons.
    pub compare_every: u64,
    /// Ops remembered for a failure report.
    pub history: usize,
    /// Volume options over [`crate::quiet_options`], as `-o` takes them; "" for none.
    pub options: &'static str,
    /// Direct reads and writes, and clones, dedupes and copies through the
    /// direct handles (`--no-direct` turns them off).
    pub direct_io: bool,
    /// FICLONERANGE (`--no-clone`, xfstests' fsx `-J`).
    pub clone_range: bool,
    /// FIDEDUPERANGE (`--no-dedupe`, fsx `-B`).
    pub dedupe_range: bool,
    /// copy_file_range (`--no-copy-range`, fsx `-E`).
    pub copy_range: bool,
}

impl FsxConfig {
    pub fn new(seed: u64, ops: u64, block_bytes: u32) -> Self {
        Self {
            seed,
            ops,
            block_bytes,
            file_bytes_max: 0,
            op_bytes_max: 0,
            compare_every: 64,
            history: 24,
            options: "",
            direct_io: true,
            clone_range: true,
            dedupe_range: true,
            copy_range: true,
        }
    }

    fn file_max(&self) -> u64 {
        match self.file_bytes_max {
            0 if self.block_bytes >= 65536 => 2 << 20,
            0 => 256 << 10,
            bytes => bytes,
        }
    }

    fn op_max(&self) -> u64 {
        match self.op_bytes_max {
            0 if self.block_bytes >= 65536 => 256 << 10,
            0 => 64 << 10,
            bytes => bytes,
        }
    }

    /// Whether the second file takes part (it exists only for the ops
    /// between two files).
    fn two_files(&self) -> bool {
        self.clone_range || self.dedupe_range || self.copy_range
    }

    /// The command-line switches that turn off what this run turned off.
    fn switches(&self) -> String {
        let mut switches = String::new();
        if self.file_bytes_max != 0 {
            switches += &format!(" --file-size {}", self.file_bytes_max);
        }
        for (on, switch) in [
            (self.direct_io, " --no-direct"),
            (self.clone_range, " --no-clone"),
            (self.dedupe_range, " --no-dedupe"),
            (self.copy_range, " --no-copy-range"),
        ] {
            if !on {
                switches += switch;
            }
        }
        switches
    }
}

/// Which of the two files an op acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `fsx`, which every op may change.
    Main,
    /// `fsx.other`, the second file of clones, dedupes and copies.
    Other,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Main => "main",
            Side::Other => "other",
        })
    }
}

/// What a dedupe writes first, so that it has equal blocks that are not
/// yet shared to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupeSetup {
    /// Nothing: the ranges are as earlier ops left them.
    None,
    /// The same bytes into both ranges (each clipped to its file's size).
    Same,
    /// The same bytes, but the destination's byte at this offset into the
    /// range flipped.
    DifferAt(u64),
}

/// One operation (data is `pattern(mix(seed, index))`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsxOp {
    Read {
        pos: u64,
        len: u64,
    },
    Write {
        pos: u64,
        len: u64,
    },
    DirectRead {
        pos: u64,
        len: u64,
    },
    DirectWrite {
        pos: u64,
        len: u64,
    },
    Truncate {
        size: u64,
    },
    Fallocate {
        mode: FallocateMode,
        offset: u64,
        len: u64,
    },
    SeekData {
        pos: u64,
    },
    SeekHole {
        pos: u64,
    },
    Fsync {
        data_only: bool,
    },
    /// FICLONERANGE of `from`'s range into `to` (`len` 0: to the source's end).
    CloneRange {
        from: Side,
        to: Side,
        src_pos: u64,
        dst_pos: u64,
        len: u64,
        direct: bool,
    },
    /// FIDEDUPERANGE, after `setup`.
    DedupeRange {
        from: Side,
        to: Side,
        src_pos: u64,
        dst_pos: u64,
        len: u64,
        direct: bool,
        setup: DedupeSetup,
    },
    /// copy_file_range.
    CopyRange {
        from: Side,
        to: Side,
        src_pos: u64,
        dst_pos: u64,
        len: u64,
        direct: bool,
    },
    /// A write into the second file (direct: sector aligned, through its
    /// direct handle).
    OtherWrite {
        pos: u64,
        len: u64,
        direct: bool,
    },
    OtherTruncate {
        size: u64,
    },
    OtherPunch {
        offset: u64,
        len: u64,
    },
    /// Unlinks the second file while it is open, creates it again as a
    /// clone of the whole first file, then closes the old one (the last
    /// reference to its blocks).
    OtherReplace,
    Reopen,
    Remount,
    /// fsync of both files, then crash keeping only what the device made
    /// durable.
    CrashRemount,
}

impl fmt::Display for FsxOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let through = |direct: bool| if direct { " (direct handles)" } else { "" };
        match self {
            FsxOp::Read { pos, len } => write!(f, "read {pos:#x}+{len:#x}"),
            FsxOp::Write { pos, len } => write!(f, "write {pos:#x}+{len:#x}"),
            FsxOp::DirectRead { pos, len } => write!(f, "direct read {pos:#x}+{len:#x}"),
            FsxOp::DirectWrite { pos, len } => write!(f, "direct write {pos:#x}+{len:#x}"),
            FsxOp::Truncate { size } => write!(f, "truncate {size:#x}"),
            FsxOp::Fallocate { mode, offset, len } => {
                write!(f, "fallocate {mode:?} {offset:#x}+{len:#x}")
            }
            FsxOp::SeekData { pos } => write!(f, "seek_data {pos:#x}"),
            FsxOp::SeekHole { pos } => write!(f, "seek_hole {pos:#x}"),
            FsxOp::Fsync { data_only: false } => write!(f, "fsync"),
            FsxOp::Fsync { data_only: true } => write!(f, "fdatasync"),
            FsxOp::CloneRange { from, to, src_pos, dst_pos, len, direct } => write!(
                f,
                "clone {from} {src_pos:#x}+{len:#x} to {to} {dst_pos:#x}{}",
                through(*direct)
            ),
            FsxOp::DedupeRange { from, to, src_pos, dst_pos, len, direct, setup } => {
                match setup {
                    DedupeSetup::None => {}
                    DedupeSetup::Same => write!(f, "write the same bytes to both, then ")?,
                    DedupeSetup::DifferAt(at) => {
                        write!(f, "write the same bytes to both but at +{at:#x}, then ")?
                    }
                }
                write!(
                    f,
                    "dedupe {from} {src_pos:#x}+{len:#x} with {to} {dst_pos:#x}{}",
                    through(*direct)
                )
            }
            FsxOp::CopyRange { from, to, src_pos, dst_pos, len, direct } => write!(
                f,
                "copy_file_range {from} {src_pos:#x}+{len:#x} to {to} {dst_pos:#x}{}",
                through(*direct)
            ),
            FsxOp::OtherWrite { pos, len, direct: false } => {
                write!(f, "write other {pos:#x}+{len:#x}")
            }
            FsxOp::OtherWrite { pos, len, direct: true } => {
                write!(f, "direct write other {pos:#x}+{len:#x}")
            }
            FsxOp::OtherTruncate { size } => write!(f, "truncate other {size:#x}"),
            FsxOp::OtherPunch { offset, len } => write!(f, "punch other {offset:#x}+{len:#x}"),
            FsxOp::OtherReplace => {
                write!(
                    f,
                    "unlink other (open), create it, clone all of main into it, close the old"
                )
            }
            FsxOp::Reopen => write!(f, "close and reopen"),
            FsxOp::Remount => write!(f, "clean remount"),
            FsxOp::CrashRemount => write!(f, "fsync both, crash, remount"),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsxStats {
    pub ops: u64,
    pub reads: u64,
    pub writes: u64,
    pub direct_reads: u64,
    pub direct_writes: u64,
    pub truncates: u64,
    pub fallocates: u64,
    pub seeks: u64,
    pub fsyncs: u64,
    /// FICLONERANGE calls, refused ones included.
    pub clones: u64,
    /// FIDEDUPERANGE calls, refused ones included.
    pub dedupes: u64,
    /// Dedupes of ranges the model held equal (which must share them).
    pub dedupes_equal: u64,
    /// Dedupes of ranges that differ (which must answer 0).
    pub dedupes_differ: u64,
    /// copy_file_range calls, refused ones included.
    pub copies: u64,
    /// Clones, dedupes and copies refused with EINVAL, as the rules say
    /// they must be.
    pub refused: u64,
    /// Bytes the accepted clones, dedupes and copies covered.
    pub bytes_remapped: u64,
    /// Writes, truncates, punches and re-clones of the second file.
    pub other_file_ops: u64,
    pub reopens: u64,
    pub remounts: u64,
    pub crash_remounts: u64,
    pub compares: u64,
    /// Checks of the shared-block counts against the extent maps.
    pub shared_checks: u64,
    /// Bytes read back and compared with the model.
    pub bytes_checked: u64,
}

impl FsxStats {
    pub fn add(&mut self, other: &FsxStats) {
        self.ops += other.ops;
        self.reads += other.reads;
        self.writes += other.writes;
        self.direct_reads += other.direct_reads;
        self.direct_writes += other.direct_writes;
        self.truncates += other.truncates;
        self.fallocates += other.fallocates;
        self.seeks += other.seeks;
        self.fsyncs += other.fsyncs;
        self.clones += other.clones;
        self.dedupes += other.dedupes;
        self.dedupes_equal += other.dedupes_equal;
        self.dedupes_differ += other.dedupes_differ;
        self.copies += other.copies;
        self.refused += other.refused;
        self.bytes_remapped += other.bytes_remapped;
        self.other_file_ops += other.other_file_ops;
        self.reopens += other.reopens;
        self.remounts += other.remounts;
        self.crash_remounts += other.crash_remounts;
        self.compares += other.compares;
        self.shared_checks += other.shared_checks;
        self.bytes_checked += other.bytes_checked;
    }
}

/// A mismatch: where, what, and the ops that led there.
#[derive(Debug, Clone)]
pub struct FsxFailure {
    /// `-o LIST ` when the run had options, else "".
    pub options: String,
    /// The run's `--file-size` and `--no-...` switches, each after a space.
    pub switches: String,
    pub seed: u64,
    pub block_bytes: u32,
    /// Index of the failing op (counted from 0).
    pub op_index: u64,
    pub message: String,
    pub recent: Vec<(u64, FsxOp)>,
}

impl fmt::Display for FsxFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "MISMATCH: seed {}, block size {}, op {}: {}",
            self.seed, self.block_bytes, self.op_index, self.message
        )?;
        writeln!(
            f,
            "reproduce: foliofs {}fsx --seed {} --ops {} --block-size {}{}",
            self.options,
            self.seed,
            self.op_index + 1,
            self.block_bytes,
            self.switches
        )?;
        writeln!(f, "last ops:")?;
        for (index, op) in &self.recent {
            writeln!(f, "  {index:8}: {op}")?;
        }
        Ok(())
    }
}

/// Where fsx's volume lives.
pub enum FsxDevice<'a> {
    /// The in-memory fault device: a crash keeps exactly what it made
    /// durable.
    Memory,
    /// An image or NBD export (`nbd://`, `nbd+unix://`), formatted at the
    /// start. `power_cut` crashes it: it must lose what the device has not
    /// made durable (kill a server with a volatile cache) and return once
    /// the device serves again.
    Path { path: &'a Path, power_cut: &'a mut dyn FnMut() },
}

enum Backend<'a> {
    Memory(Arc<FaultDev>),
    Path { path: &'a Path, power_cut: &'a mut dyn FnMut() },
}

/// A range a clone or copy made equal: (from, to, src_pos, dst_pos, len).
type EqualRange = (Side, Side, u64, u64, u64);

struct Fsx<'a> {
    config: FsxConfig,
    options: foliofs::VolumeOptions,
    rng: ChaCha8Rng,
    backend: Backend<'a>,
    volume: Option<Volume>,
    ino: u64,
    other_ino: u64,
    /// Each file's buffered and direct handle.
    handles: Option<(File, File)>,
    other_handles: Option<(File, File)>,
    model: Vec<u8>,
    other_model: Vec<u8>,
    /// Ranges recent clones and copies made equal, for dedupes.
    equal: VecDeque<EqualRange>,
    stats: FsxStats,
    scratch: Vec<u8>,
}

type Checked = Result<(), String>;

impl Fsx<'_> {
    fn reopen(&self) -> foliofs::Result<Volume> {
        match &self.backend {
            Backend::Memory(raw) => open_raw(raw, &self.options),
            Backend::Path { path, .. } => Volume::open(path, &self.options),
        }
    }
}

/// Runs `config.ops` operations; `progress` is called every 10,000 ops.
pub fn run(config: FsxConfig, progress: &mut dyn FnMut(&FsxStats)) -> Result<FsxStats, FsxFailure> {
    run_on(config, FsxDevice::Memory, progress)
}

/// [`run`] on `device`.
pub fn run_on(
    config: FsxConfig,
    device: FsxDevice<'_>,
    progress: &mut dyn FnMut(&FsxStats),
) -> Result<FsxStats, FsxFailure> {
    run_inner(config, device, None, None, progress)
}

/// Runs exactly `ops` (each checked as [`run`] checks it) on the in-memory
/// device; `config.seed` still decides the data written.
pub fn replay(config: FsxConfig, ops: &[FsxOp]) -> Result<FsxStats, FsxFailure> {
    let config = FsxConfig { ops: ops.len() as u64, ..config };
    run_inner(config, FsxDevice::Memory, Some(ops), None, &mut |_| {})
}

/// The ops [`run`] draws for `config`, up to the first failure (included)
/// or `config.ops`.
pub fn recorded_ops(config: FsxConfig) -> Vec<FsxOp> {
    let mut ops = Vec::new();
    let _ = run_inner(config, FsxDevice::Memory, None, Some(&mut ops), &mut |_| {});
    ops
}

/// Shrinks a failing op list to one that still fails as `same` says
/// (e.g. with the same kind of message): drops runs of ops, halving their
/// length down to single ops, while the replay keeps failing.
pub fn shrink(config: FsxConfig, ops: &[FsxOp], same: &dyn Fn(&FsxFailure) -> bool) -> Vec<FsxOp> {
    let fails = |ops: &[FsxOp]| matches!(replay(config, ops), Err(failure) if same(&failure));
    let mut ops = ops.to_vec();
    if !fails(&ops) {
        return ops;
    }
    let mut chunk = ops.len().div_ceil(2).max(1);
    loop {
        let mut start = 0;
        while start < ops.len() {
            let end = (start + chunk).min(ops.len());
            let candidate: Vec<FsxOp> = ops[..start].iter().chain(&ops[end..]).copied().collect();
            if !candidate.is_empty() && fails(&candidate) {
                ops = candidate;
            } else {
                start = end;
            }
        }
        if chunk == 1 {
            return ops;
        }
        chunk = chunk.div_ceil(2);
    }
}

fn run_inner(
    config: FsxConfig,
    device: FsxDevice<'_>,
    script: Option<&[FsxOp]>,
    mut record: Option<&mut Vec<FsxOp>>,
    progress: &mut dyn FnMut(&FsxStats),
) -> Result<FsxStats, FsxFailure> {
    let file_max = config.file_max();
    // Room for both files (a clone shares, but a copy-on-write overwrite
    // of every shared block doubles them again) and the space freed late.
    let volume_bytes = (file_max * 24).max(16 << 20);
    let options = crate::options_with(config.options)
        .unwrap_or_else(|error| panic!("options {:?}: {error}", config.options));
    let (backend, volume) = match device {
        FsxDevice::Memory => {
            let (raw, volume) = new_volume(volume_bytes, config.block_bytes, None, &options)
                .expect("mkfs on the in-memory device");
            (Backend::Memory(raw), volume)
        }
        FsxDevice::Path { path, power_cut } => {
            let mkfs = crate::mkfs_options(config.block_bytes, None);
            Volume::mkfs_path(path, None, &mkfs, &options)
                .unwrap_or_else(|error| panic!("mkfs {}: {error}", path.display()));
            let volume = Volume::open(path, &options)
                .unwrap_or_else(|error| panic!("open {}: {error}", path.display()));
            (Backend::Path { path, power_cut }, volume)
        }
    };
    let ino = volume.inodes().create(ROOT, b"fsx", 0o644, owner()).expect("create").ino;
    let other_ino = volume.inodes().create(ROOT, OTHER_NAME, 0o644, owner()).expect("create").ino;
    let mut fsx = Fsx {
        config,
        options,
        rng: ChaCha8Rng::seed_from_u64(mix(&[config.seed, u64::from(config.block_bytes)])),
        backend,
        volume: Some(volume),
        ino,
        other_ino,
        handles: None,
        other_handles: None,
        model: Vec::new(),
        other_model: Vec::new(),
        equal: VecDeque::with_capacity(EQUAL_RANGES_KEPT + 1),
        stats: FsxStats::default(),
        scratch: Vec::new(),
    };
    fsx.open_handles().expect("open");
    let failure = |op_index: u64, message: String, recent: Vec<(u64, FsxOp)>| FsxFailure {
        options: failure_options(config.options),
        switches: config.switches(),
        seed: config.seed,
        block_bytes: config.block_bytes,
        op_index,
        message,
        recent,
    };
    let mut recent: VecDeque<(u64, FsxOp)> = VecDeque::with_capacity(config.history + 1);
    for index in 0..config.ops {
        let op = match script {
            Some(ops) => ops[index as usize],
            None => fsx.generate(),
        };
        if let Some(record) = record.as_deref_mut() {
            record.push(op);
        }
        recent.push_back((index, op));
        if recent.len() > config.history {
            recent.pop_front();
        }
        let mut result = fsx.execute(index, op);
        if result.is_ok() && (index + 1) % config.compare_every == 0 {
            result = fsx.compare_all();
        }
        if let Err(message) = result {
            return Err(failure(index, message, recent.into_iter().collect()));
        }
        fsx.stats.ops += 1;
        if (index + 1) % 4096 == 0 {
            // The device's write log is only needed back to the last crash
            // point we may take: drop it now and then to bound memory.
            if let Backend::Memory(raw) = &fsx.backend {
                raw.reset_log();
            }
        }
        if (index + 1) % 10_000 == 0 {
            progress(&fsx.stats);
        }
    }
    let recent: Vec<(u64, FsxOp)> = recent.into_iter().collect();
    fsx.finish().map_err(|message| failure(config.ops, message, recent))?;
    Ok(fsx.stats)
}

fn failure_options(options: &str) -> String {
    if options.is_empty() {
        String::new()
    } else {
        format!("-o {options} ")
    }
}

/// Whether `[a, a + len)` and `[b, b + len)` overlap.
/// One of the four (from, to) pairs, most often within the first file as
/// xfstests' fsx runs them.
fn pick_pair(rng: &mut ChaCha8Rng) -> (Side, Side) {
    match rng.random_range(0..10) {
        0..=4 => (Side::Main, Side::Main),
        5 | 6 => (Side::Main, Side::Other),
        7 | 8 => (Side::Other, Side::Main),
        _ => (Side::Other, Side::Other),
    }
}

/// `data` copied over `[dst_pos, ..)` of `model`, growing it as needed
/// (nothing, not even the size, changes for no data).
fn model_write(model: &mut Vec<u8>, dst_pos: u64, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let start = dst_pos as usize;
    if model.len() < start + data.len() {
        model.resize(start + data.len(), 0);
    }
    model[start..start + data.len()].copy_from_slice(data);
}

impl Fsx<'_> {
    fn volume(&self) -> &Volume {
        self.volume.as_ref().expect("mounted")
    }

    fn buffered(&self) -> &File {
        &self.handles.as_ref().expect("open").0
    }

    fn direct(&self) -> &File {
        &self.handles.as_ref().expect("open").1
    }

    /// `side`'s buffered or direct handle.
    fn file(&self, side: Side, direct: bool) -> &File {
        let pair = match side {
            Side::Main => &self.handles,
            Side::Other => &self.other_handles,
        };
        let pair = pair.as_ref().expect("open");
        if direct {
            &pair.1
        } else {
            &pair.0
        }
    }

    fn model_of(&self, side: Side) -> &Vec<u8> {
        match side {
            Side::Main => &self.model,
            Side::Other => &self.other_model,
        }
    }

    fn model_mut(&mut self, side: Side) -> &mut Vec<u8> {
        match side {
            Side::Main => &mut self.model,
            Side::Other => &mut self.other_model,
        }
    }

    fn size_of(&self, side: Side) -> u64 {
        self.model_of(side).len() as u64
    }

    fn open_pair(&self, ino: u64) -> Result<(File, File), String> {
        let volume = self.volume();
        let buffered = volume
            .inodes()
            .open_file(ino, OpenFlags::READ_WRITE)
            .map_err(|error| format!("open inode {ino}: {error}"))?;
        let direct = volume
            .inodes()
            .open_file(ino, OpenFlags::READ_WRITE.with_direct())
            .map_err(|error| format!("open inode {ino} direct: {error}"))?;
        Ok((buffered, direct))
    }

    fn open_handles(&mut self) -> Checked {
        self.handles = Some(self.open_pair(self.ino)?);
        self.other_handles = Some(self.open_pair(self.other_ino)?);
        Ok(())
    }

    fn close_handles(&mut self) {
        self.handles = None;
        self.other_handles = None;
    }

    fn size(&self) -> u64 {
        self.model.len() as u64
    }

    /// Whether an op drawn from the table runs in this configuration (a
    /// turned-off kind is drawn again, as xfstests' fsx skips it).
    fn enabled(&self, op: &FsxOp) -> bool {
        let config = &self.config;
        match op {
            FsxOp::DirectRead { .. } | FsxOp::DirectWrite { .. } => config.direct_io,
            FsxOp::CloneRange { .. } => config.clone_range,
            FsxOp::DedupeRange { .. } => config.dedupe_range,
            FsxOp::CopyRange { .. } => config.copy_range,
            FsxOp::OtherWrite { .. } | FsxOp::OtherTruncate { .. } | FsxOp::OtherPunch { .. } => {
                config.two_files()
            }
            // It clones the whole first file.
            FsxOp::OtherReplace => config.clone_range,
            _ => true,
        }
    }

    fn generate(&mut self) -> FsxOp {
        loop {
            let op = self.draw();
            if self.enabled(&op) {
                return op;
            }
        }
    }

    fn draw(&mut self) -> FsxOp {
        let file_max = self.config.file_max();
        let op_max = self.config.op_max();
        let block = u64::from(self.config.block_bytes);
        let size = self.size();
        let roll = self.rng.random_range(0..1000);
        match roll {
            860..=909 => return self.draw_clone(),
            910..=934 => return self.draw_dedupe(),
            935..=964 => return self.draw_copy(),
            965..=979 => return self.draw_other(),
            _ => {}
        }
        let rng = &mut self.rng;
        let range = |rng: &mut ChaCha8Rng| random_range(rng, file_max, op_max);
        let aligned = |rng: &mut ChaCha8Rng| sector_range(rng, file_max, op_max);
        match roll {
            0..=179 => {
                let (pos, len) = range(rng);
                FsxOp::Read { pos, len }
            }
            180..=379 => {
                let (pos, len) = range(rng);
                FsxOp::Write { pos, len }
            }
            380..=469 => {
                let (pos, len) = aligned(rng);
                FsxOp::DirectRead { pos, len }
            }
            470..=589 => {
                let (pos, len) = aligned(rng);
                FsxOp::DirectWrite { pos, len }
            }
            590..=639 => FsxOp::Truncate { size: rng.random_range(0..=file_max) },
            640..=779 => {
                let mode = match rng.random_range(0..7) {
                    0 => FallocateMode::Allocate { keep_size: rng.random_bool(0.5) },
                    1 | 2 => FallocateMode::PunchHole,
                    3 => FallocateMode::ZeroRange { keep_size: rng.random_bool(0.5) },
                    4 | 5 if size >= 2 * block => FallocateMode::CollapseRange,
                    _ if size >= block && size + block <= file_max => FallocateMode::InsertRange,
                    _ => FallocateMode::ZeroRange { keep_size: true },
                };
                let (offset, len) = match mode {
                    FallocateMode::CollapseRange => {
                        // The range must end before the end of file.
                        let blocks = (size - 1) / block;
                        let first = rng.random_range(0..blocks);
                        let count = rng.random_range(1..=(blocks - first).min(op_max / block + 1));
                        (first * block, count * block)
                    }
                    FallocateMode::InsertRange => {
                        let first = rng.random_range(0..size.div_ceil(block));
                        let room = (file_max - size) / block;
                        let count = rng.random_range(1..=room.min(op_max / block + 1));
                        (first * block, count * block)
                    }
                    _ => range(rng),
                };
                FsxOp::Fallocate { mode, offset, len }
            }
            780..=809 => {
                let pos = rng.random_range(0..=size + block);
                if rng.random_bool(0.5) {
                    FsxOp::SeekData { pos }
                } else {
                    FsxOp::SeekHole { pos }
                }
            }
            810..=859 => FsxOp::Fsync { data_only: rng.random_bool(0.5) },
            980..=995 => FsxOp::Reopen,
            996..=997 => FsxOp::Remount,
            _ => FsxOp::CrashRemount,
        }
    }

    /// Through the direct handles a quarter of the time, where direct I/O runs.
    fn draw_direct(&mut self) -> bool {
        self.config.direct_io && self.rng.random_bool(0.25)
    }

    /// A block-aligned source offset inside `from` (0 when it is empty).
    fn draw_source(&mut self, from: Side) -> u64 {
        let block = u64::from(self.config.block_bytes);
        let blocks = self.size_of(from).div_ceil(block);
        self.rng.random_range(0..blocks.max(1)) * block
    }

    /// A block-aligned destination in `[first_block, last_block]` blocks
    /// that does not overlap `[src_pos, src_pos + span)` when both are one
    /// file, in up to 30 tries (then one that does: the op must be refused).
    fn draw_destination(
        &mut self,
        same_file: bool,
        src_pos: u64,
        span: u64,
        first_block: u64,
        last_block: u64,
    ) -> u64 {
        let block = u64::from(self.config.block_bytes);
        let rounded = span.div_ceil(block) * block;
        let mut dst_pos = 0;
        for _ in 0..30 {
            dst_pos = self.rng.random_range(first_block.min(last_block)..=last_block) * block;
            if !same_file || !overlaps(src_pos, dst_pos, rounded.max(1)) {
                break;
            }
        }
        dst_pos
    }

    /// Now and then, an offset or length knocked off the block grid (the
    /// rules decide whether the op must then be refused).
    fn perturb(&mut self, src_pos: &mut u64, dst_pos: &mut u64, len: &mut u64) {
        if !self.rng.random_bool(1.0 / 16.0) {
            return;
        }
        let sectors = u64::from(self.config.block_bytes / SECTOR_BYTES);
        let shift = self.rng.random_range(1..sectors) * u64::from(SECTOR_BYTES);
        match self.rng.random_range(0..3) {
            0 => *src_pos += shift,
            1 => *dst_pos += shift,
            _ => *len += shift,
        }
    }

    fn draw_clone(&mut self) -> FsxOp {
        let block = u64::from(self.config.block_bytes);
        let (file_max, op_max) = (self.config.file_max(), self.config.op_max());
        let (from, to) = pick_pair(&mut self.rng);
        let mut src_pos = self.draw_source(from);
        let left = self.size_of(from) - src_pos.min(self.size_of(from));
        let whole = (left / block).min(op_max / block);
        let (mut len, span) = match self.rng.random_range(0..8) {
            // Length 0: up to the source's end of file.
            0 => (0, left),
            1 => (left, left),
            _ if whole > 0 => {
                let len = self.rng.random_range(1..=whole) * block;
                (len, len)
            }
            _ => (left, left),
        };
        let last_block = file_max.saturating_sub(span) / block;
        // A range with a partial last block must reach the destination's
        // end: start it there most of the time.
        let first_block = if !span.is_multiple_of(block) && self.rng.random_bool(0.75) {
            self.size_of(to).saturating_sub(span).div_ceil(block)
        } else {
            0
        };
        let mut dst_pos = self.draw_destination(from == to, src_pos, span, first_block, last_block);
        self.perturb(&mut src_pos, &mut dst_pos, &mut len);
        let direct = self.draw_direct();
        FsxOp::CloneRange { from, to, src_pos, dst_pos, len, direct }
    }

    fn draw_dedupe(&mut self) -> FsxOp {
        let block = u64::from(self.config.block_bytes);
        let op_max = self.config.op_max();
        let direct = self.draw_direct();
        let kind = self.rng.random_range(0..10);
        if kind < 3 && !self.equal.is_empty() {
            let (from, to, src_pos, dst_pos, len) =
                self.equal[self.rng.random_range(0..self.equal.len())];
            return FsxOp::DedupeRange {
                from,
                to,
                src_pos,
                dst_pos,
                len,
                direct,
                setup: DedupeSetup::None,
            };
        }
        let (from, to) = pick_pair(&mut self.rng);
        let (src_size, dst_size) = (self.size_of(from), self.size_of(to));
        let mut src_pos = self.draw_source(from);
        let left = src_size - src_pos.min(src_size);
        let whole = (left / block).min(op_max / block).min(dst_size / block);
        let tail_dst = dst_size.checked_sub(left).filter(|dst| dst.is_multiple_of(block));
        let (mut len, mut dst_pos) = match tail_dst {
            // Both ranges end at their files' ends, the last block partial.
            Some(dst_pos) if self.rng.random_bool(0.125) => (left, dst_pos),
            _ => {
                let len = self.rng.random_range(1..=whole.max(1)) * block;
                let last_block = dst_size.saturating_sub(len) / block;
                (len, self.draw_destination(from == to, src_pos, len, 0, last_block))
            }
        };
        self.perturb(&mut src_pos, &mut dst_pos, &mut len);
        let setup = match kind {
            3..=4 => DedupeSetup::Same,
            5 => DedupeSetup::DifferAt(self.rng.random_range(0..len.max(1))),
            _ => DedupeSetup::None,
        };
        FsxOp::DedupeRange { from, to, src_pos, dst_pos, len, direct, setup }
    }

    fn draw_copy(&mut self) -> FsxOp {
        let block = u64::from(self.config.block_bytes);
        let (file_max, op_max) = (self.config.file_max(), self.config.op_max());
        let (from, to) = pick_pair(&mut self.rng);
        let src_size = self.size_of(from);
        let mut src_pos = match self.rng.random_range(0..8) {
            // Sometimes at or past the end: nothing to copy.
            0 => self.rng.random_range(0..=src_size + block),
            _ => self.rng.random_range(0..src_size.max(1)),
        };
        if self.rng.random_bool(0.5) {
            src_pos = src_pos / block * block;
        }
        let len = self.rng.random_range(1..=op_max);
        let copied = len.min(src_size.saturating_sub(src_pos));
        let last = file_max.saturating_sub(copied);
        // Half the time at the source's place in its block, so whole blocks
        // are cloned and only the edges copied.
        let same_offset = self.rng.random_bool(0.5);
        let mut dst_pos = 0;
        for _ in 0..30 {
            dst_pos = self.rng.random_range(0..=last);
            if same_offset {
                dst_pos = dst_pos / block * block + src_pos % block;
            }
            if from != to || !overlaps(src_pos, dst_pos, copied.max(1)) {
                break;
            }
        }
        let direct = self.draw_direct();
        FsxOp::CopyRange { from, to, src_pos, dst_pos, len, direct }
    }

    fn draw_other(&mut self) -> FsxOp {
        let (file_max, op_max) = (self.config.file_max(), self.config.op_max());
        match self.rng.random_range(0..15) {
            0..=5 => {
                let direct = self.draw_direct();
                let (pos, len) = if direct {
                    sector_range(&mut self.rng, file_max, op_max)
                } else {
                    random_range(&mut self.rng, file_max, op_max)
                };
                FsxOp::OtherWrite { pos, len, direct }
            }
            6..=8 => FsxOp::OtherTruncate { size: self.rng.random_range(0..=file_max) },
            9..=11 => {
                let (offset, len) = random_range(&mut self.rng, file_max, op_max);
                FsxOp::OtherPunch { offset, len }
            }
            _ => FsxOp::OtherReplace,
        }
    }

    fn execute(&mut self, index: u64, op: FsxOp) -> Checked {
        match op {
            FsxOp::Read { pos, len } => {
                self.stats.reads += 1;
                let mut buffer = std::mem::take(&mut self.scratch);
                buffer.resize(len as usize, 0);
                let result = self.buffered().read_at(&mut buffer, pos);
                let checked = self.check_read(Side::Main, "read", pos, &buffer, result);
                self.scratch = buffer;
                checked
            }
            FsxOp::DirectRead { pos, len } => {
                self.stats.direct_reads += 1;
                let mut buffer = AlignedBuf::zeroed(len as usize);
                let result = self.direct().read_at(&mut buffer, pos);
                self.check_read(Side::Main, "direct read", pos, &buffer, result)
            }
            FsxOp::Write { pos, len } => {
                self.stats.writes += 1;
                self.write(Side::Main, "write", index, pos, len, false)
            }
            FsxOp::DirectWrite { pos, len } => {
                self.stats.direct_writes += 1;
                self.write(Side::Main, "direct write", index, pos, len, true)
            }
            FsxOp::Truncate { size } => {
                self.stats.truncates += 1;
                self.truncate(Side::Main, size)
            }
            FsxOp::Fallocate { mode, offset, len } => {
                self.stats.fallocates += 1;
                self.fallocate(Side::Main, mode, offset, len)
            }
            FsxOp::SeekData { pos } | FsxOp::SeekHole { pos } => {
                self.stats.seeks += 1;
                self.check_seek(op, pos)
            }
            FsxOp::Fsync { data_only } => {
                self.stats.fsyncs += 1;
                let file = self.buffered();
                if data_only { file.sync_data() } else { file.sync_all() }
                    .map_err(|error| format!("fsync: {error}"))
            }
            FsxOp::CloneRange { from, to, src_pos, dst_pos, len, direct } => {
                self.stats.clones += 1;
                self.clone_range(from, to, src_pos, dst_pos, len, direct)
            }
            FsxOp::DedupeRange { from, to, src_pos, dst_pos, len, direct, setup } => {
                self.stats.dedupes += 1;
                self.dedupe_setup(index, from, to, src_pos, dst_pos, len, setup)?;
                self.dedupe_range(from, to, src_pos, dst_pos, len, direct)
            }
            FsxOp::CopyRange { from, to, src_pos, dst_pos, len, direct } => {
                self.stats.copies += 1;
                self.copy_range(from, to, src_pos, dst_pos, len, direct)
            }
            FsxOp::OtherWrite { pos, len, direct } => {
                self.stats.other_file_ops += 1;
                let what = if direct { "direct write other" } else { "write other" };
                self.write(Side::Other, what, index, pos, len, direct)
            }
            FsxOp::OtherTruncate { size } => {
                self.stats.other_file_ops += 1;
                self.truncate(Side::Other, size)
            }
            FsxOp::OtherPunch { offset, len } => {
                self.stats.other_file_ops += 1;
                self.fallocate(Side::Other, FallocateMode::PunchHole, offset, len)
            }
            FsxOp::OtherReplace => {
                self.stats.other_file_ops += 1;
                self.replace_other()
            }
            FsxOp::Reopen => {
                self.stats.reopens += 1;
                self.close_handles();
                self.open_handles()?;
                self.compare_all()
            }
            FsxOp::Remount => {
                self.stats.remounts += 1;
                self.close_handles();
                let volume = self.volume.take().expect("mounted");
                volume.close().map_err(|error| format!("close: {error}"))?;
                let volume = self.reopen().map_err(|error| format!("remount: {error}"))?;
                self.volume = Some(volume);
                self.open_handles()?;
                self.compare_all()
            }
            FsxOp::CrashRemount => {
                self.stats.crash_remounts += 1;
                self.buffered().sync_all().map_err(|error| format!("fsync: {error}"))?;
                self.file(Side::Other, false)
                    .sync_all()
                    .map_err(|error| format!("fsync other: {error}"))?;
                self.close_handles();
                match &mut self.backend {
                    Backend::Memory(raw) => {
                        let image = raw.crash_image(raw.log_len(), &|_| Keep::Nothing);
                        // The old volume closes on its own device, which no
                        // longer matters.
                        drop(self.volume.take());
                        *raw = Arc::new(FaultDev::from_image(image, SECTOR_BYTES));
                    }
                    Backend::Path { power_cut, .. } => {
                        power_cut();
                        // Its connection died with the server: closing
                        // writes nothing to the new one.
                        drop(self.volume.take());
                    }
                }
                let volume =
                    self.reopen().map_err(|error| format!("mount after the crash: {error}"))?;
                self.volume = Some(volume);
                self.open_handles()?;
                self.compare_all().map_err(|error| format!("after fsync and crash: {error}"))
            }
        }
    }

    /// A write of `pattern(mix(seed, index))` to `side`, through its direct
    /// handle (`pos` and `len` sector aligned) or its buffered one.
    fn write(
        &mut self,
        side: Side,
        what: &str,
        index: u64,
        pos: u64,
        len: u64,
        direct: bool,
    ) -> Checked {
        let seed = mix(&[self.config.seed, index]);
        if direct {
            let mut data = AlignedBuf::zeroed(len as usize);
            fill_pattern(seed, &mut data);
            let result = self.file(side, true).write_at(&data, pos);
            self.apply_write(side, what, pos, &data, result)
        } else {
            let mut data = std::mem::take(&mut self.scratch);
            data.resize(len as usize, 0);
            fill_pattern(seed, &mut data);
            let result = self.file(side, false).write_at(&data, pos);
            let checked = self.apply_write(side, what, pos, &data, result);
            self.scratch = data;
            checked
        }
    }

    fn truncate(&mut self, side: Side, size: u64) -> Checked {
        self.file(side, false)
            .set_len(size)
            .map_err(|error| format!("truncate {side}: {error}"))?;
        self.model_mut(side).resize(size as usize, 0);
        self.check_size_of(side)
    }

    fn fallocate(&mut self, side: Side, mode: FallocateMode, offset: u64, len: u64) -> Checked {
        self.file(side, false)
            .fallocate(mode, offset, len)
            .map_err(|error| format!("fallocate {side}: {error}"))?;
        apply_fallocate(self.model_mut(side), mode, offset as usize, len as usize);
        self.check_size_of(side)
    }

    /// Remembers a range a clone or copy made equal, for dedupes to try.
    fn remember_equal(&mut self, range: EqualRange) {
        if range.4 == 0 {
            return;
        }
        self.equal.push_back(range);
        if self.equal.len() > EQUAL_RANGES_KEPT {
            self.equal.pop_front();
        }
    }

    /// Compares the answer of a clone, dedupe or copy with what the rules
    /// say (`expected`: bytes, or None for EINVAL); Ok(Some(bytes)) when it
    /// was accepted.
    fn check_answer(
        &mut self,
        what: &str,
        answer: foliofs::Result<u64>,
        expected: Option<u64>,
    ) -> Result<Option<u64>, String> {
        match (answer, expected) {
            (Ok(got), Some(want)) if got == want => {
                self.stats.bytes_remapped += got;
                Ok(Some(got))
            }
            (Ok(got), Some(want)) => Err(format!("{what} returned {got:#x}, expected {want:#x}")),
            (Ok(got), None) => {
                Err(format!("{what} returned {got:#x}; by the rules it must fail with EINVAL"))
            }
            (Err(error), None) if error.errno() == libc::EINVAL => {
                self.stats.refused += 1;
                Ok(None)
            }
            (Err(error), Some(want)) => Err(format!("{what}: {error} (expected {want:#x} bytes)")),
            (Err(error), None) => Err(format!("{what}: {error} (expected EINVAL)")),
        }
    }

    fn clone_range(
        &mut self,
        from: Side,
        to: Side,
        src_pos: u64,
        dst_pos: u64,
        len: u64,
        direct: bool,
    ) -> Checked {
        let block = u64::from(self.config.block_bytes);
        let (src_size, dst_size) = (self.size_of(from), self.size_of(to));
        let expected =
            clone_rule(block, src_size, dst_size, from == to, src_pos, dst_pos, len, false);
        let answer =
            self.file(to, direct).clone_range_from(self.file(from, direct), src_pos, dst_pos, len);
        if let Some(cloned) = self.check_answer("clone", answer, expected)? {
            let data = self.model_of(from)[src_pos as usize..(src_pos + cloned) as usize].to_vec();
            model_write(self.model_mut(to), dst_pos, &data);
            self.remember_equal((from, to, src_pos, dst_pos, cloned));
            self.verify_range(to, "after the clone", dst_pos, cloned, direct)?;
        }
        self.check_size_of(to)
    }

    /// DedupeSetup: the same bytes (`pattern(mix(seed, index, 1))`) into
    /// both ranges, each clipped to its file's size, maybe one flipped.
    #[allow(clippy::too_many_arguments)]
    fn dedupe_setup(
        &mut self,
        index: u64,
        from: Side,
        to: Side,
        src_pos: u64,
        dst_pos: u64,
        len: u64,
        setup: DedupeSetup,
    ) -> Checked {
        if setup == DedupeSetup::None {
            return Ok(());
        }
        let mut data = vec![0u8; len as usize];
        fill_pattern(mix(&[self.config.seed, index, 1]), &mut data);
        for (destination, side, pos) in [(false, from, src_pos), (true, to, dst_pos)] {
            if destination {
                if let DedupeSetup::DifferAt(at) = setup {
                    if let Some(byte) = data.get_mut(at as usize) {
                        *byte ^= 0x01;
                    }
                }
            }
            let inside = self.size_of(side).saturating_sub(pos).min(len) as usize;
            if inside == 0 {
                continue;
            }
            let result = self.file(side, false).write_at(&data[..inside], pos);
            self.apply_write(side, "dedupe's setup write", pos, &data[..inside], result)?;
        }
        Ok(())
    }

    fn dedupe_range(
        &mut self,
        from: Side,
        to: Side,
        src_pos: u64,
        dst_pos: u64,
        len: u64,
        direct: bool,
    ) -> Checked {
        let block = u64::from(self.config.block_bytes);
        let (src_size, dst_size) = (self.size_of(from), self.size_of(to));
        let rule = clone_rule(block, src_size, dst_size, from == to, src_pos, dst_pos, len, true);
        let equal = rule.map(|len| {
            let (src, dst) = (self.model_of(from), self.model_of(to));
            src[src_pos as usize..(src_pos + len) as usize]
                == dst[dst_pos as usize..(dst_pos + len) as usize]
        });
        let expected = match (rule, equal) {
            (Some(len), Some(true)) => Some(len),
            (Some(_), _) => Some(0),
            (None, _) => None,
        };
        let answer =
            self.file(to, direct).dedupe_range_from(self.file(from, direct), src_pos, dst_pos, len);
        if let Some(deduped) = self.check_answer("dedupe", answer, expected)? {
            match equal {
                Some(true) => self.stats.dedupes_equal += 1,
                _ => self.stats.dedupes_differ += 1,
            }
            // Equal or not, the bytes stay what they were.
            let span = rule.unwrap_or(deduped);
            self.verify_range(to, "after the dedupe", dst_pos, span, direct)?;
            self.verify_range(from, "after the dedupe", src_pos, span, direct)?;
        }
        self.check_size_of(from)?;
        self.check_size_of(to)
    }

    fn copy_range(
        &mut self,
        from: Side,
        to: Side,
        src_pos: u64,
        dst_pos: u64,
        len: u64,
        direct: bool,
    ) -> Checked {
        let block = u64::from(self.config.block_bytes);
        let expected = copy_rule(self.size_of(from), from == to, src_pos, dst_pos, len);
        let answer =
            self.file(to, direct).copy_range_from(self.file(from, direct), src_pos, dst_pos, len);
        if let Some(copied) = self.check_answer("copy_file_range", answer, expected)? {
            if copied == 0 {
                return self.check_size_of(to);
            }
            let data = self.model_of(from)[src_pos as usize..(src_pos + copied) as usize].to_vec();
            model_write(self.model_mut(to), dst_pos, &data);
            if src_pos.is_multiple_of(block) && dst_pos.is_multiple_of(block) {
                self.remember_equal((from, to, src_pos, dst_pos, copied / block * block));
            }
            self.verify_range(to, "after the copy", dst_pos, copied, direct)?;
        }
        self.check_size_of(to)
    }

    /// OtherReplace: unlink the second file while it is open, create it
    /// again, clone the whole first file into it, then close the old one.
    fn replace_other(&mut self) -> Checked {
        let volume = self.volume();
        volume
            .inodes()
            .unlink(ROOT, OTHER_NAME)
            .map_err(|error| format!("unlink other: {error}"))?;
        let ino = volume
            .inodes()
            .create(ROOT, OTHER_NAME, 0o644, owner())
            .map_err(|error| format!("create other: {error}"))?
            .ino;
        let handles = self.open_pair(ino)?;
        let answer = handles.0.clone_range_from(self.buffered(), 0, 0, 0);
        let size = self.size();
        // The orphan's blocks go (or lose a reference) as its handles close.
        self.other_handles = Some(handles);
        self.other_ino = ino;
        self.other_model = Vec::new();
        let cloned =
            self.check_answer("clone of all of main into a new other", answer, Some(size))?;
        self.other_model = self.model.clone();
        self.remember_equal((Side::Main, Side::Other, 0, 0, cloned.unwrap_or(0)));
        self.check_size_of(Side::Other)?;
        self.check_shared_counts()
    }

    /// Reads `[pos, pos + len)` of `side` back (through its direct handle
    /// on the sectors around it) and compares it with the model.
    fn verify_range(
        &mut self,
        side: Side,
        what: &str,
        pos: u64,
        len: u64,
        direct: bool,
    ) -> Checked {
        if len == 0 {
            return Ok(());
        }
        if direct {
            let sector = u64::from(SECTOR_BYTES);
            let start = pos / sector * sector;
            let end = (pos + len).div_ceil(sector) * sector;
            let mut buffer = AlignedBuf::zeroed((end - start) as usize);
            let result = self.file(side, true).read_at(&mut buffer, start);
            self.check_read(side, &format!("direct read of {side} {what}"), start, &buffer, result)
        } else {
            let mut buffer = std::mem::take(&mut self.scratch);
            buffer.resize(len as usize, 0);
            let result = self.file(side, false).read_at(&mut buffer, pos);
            let checked =
                self.check_read(side, &format!("read of {side} {what}"), pos, &buffer, result);
            self.scratch = buffer;
            checked
        }
    }

    fn check_shared_counts(&mut self) -> Checked {
        self.stats.shared_checks += 1;
        self.volume().check_shared_counts().map_err(|error| format!("shared-block counts: {error}"))
    }

    fn check_read(
        &mut self,
        side: Side,
        what: &str,
        pos: u64,
        buffer: &[u8],
        result: foliofs::Result<usize>,
    ) -> Checked {
        let read = result.map_err(|error| format!("{what}: {error}"))?;
        let model = self.model_of(side);
        let start = (pos as usize).min(model.len());
        let expected = &model[start..(start + buffer.len()).min(model.len())];
        if read != expected.len() {
            return Err(format!("{what} returned {read} bytes, expected {}", expected.len()));
        }
        if let Some(at) = buffer[..read].iter().zip(expected).position(|(a, b)| a != b) {
            return Err(format!(
                "{what}: byte at {side} offset {:#x} is {:#04x}, expected {:#04x}",
                pos + at as u64,
                buffer[at],
                expected[at]
            ));
        }
        self.stats.bytes_checked += read as u64;
        Ok(())
    }

    fn apply_write(
        &mut self,
        side: Side,
        what: &str,
        pos: u64,
        data: &[u8],
        result: foliofs::Result<usize>,
    ) -> Checked {
        let written = result.map_err(|error| format!("{what}: {error}"))?;
        if written != data.len() {
            return Err(format!("{what} wrote {written} of {} bytes", data.len()));
        }
        model_write(self.model_mut(side), pos, data);
        self.check_size_of(side)
    }

    fn check_size_of(&self, side: Side) -> Checked {
        let size =
            self.file(side, false).attr().map_err(|error| format!("stat {side}: {error}"))?.size;
        if size != self.size_of(side) {
            return Err(format!("{side}'s size is {size:#x}, expected {:#x}", self.size_of(side)));
        }
        Ok(())
    }

    fn check_seek(&self, op: FsxOp, pos: u64) -> Checked {
        let size = self.size();
        let block = u64::from(self.config.block_bytes);
        let file = self.buffered();
        let (what, result) = match op {
            FsxOp::SeekData { .. } => ("seek_data", file.seek_data(pos)),
            _ => ("seek_hole", file.seek_hole(pos)),
        };
        let zeros =
            |from: u64, to: u64| self.model[from as usize..to as usize].iter().all(|&b| b == 0);
        match result {
            Err(error) if error.errno() == libc::ENXIO => {
                let past_data =
                    matches!(op, FsxOp::SeekData { .. }) && pos < size && zeros(pos, size);
                if pos >= size || past_data {
                    Ok(())
                } else {
                    Err(format!(
                        "{what} {pos:#x}: ENXIO inside a file of {size:#x} bytes with data after"
                    ))
                }
            }
            Err(error) => Err(format!("{what} {pos:#x}: {error}")),
            Ok(_) if pos >= size => {
                Err(format!("{what} {pos:#x}: found something past the end of file {size:#x}"))
            }
            Ok(found) if found < pos || found > size => {
                Err(format!("{what} {pos:#x}: {found:#x} is outside [{pos:#x}, {size:#x}]"))
            }
            Ok(found) => {
                let skipped_zeros = match op {
                    // What SEEK_DATA skipped is a hole.
                    FsxOp::SeekData { .. } => zeros(pos, found),
                    // A hole found inside the file reads as zeros to the end of its block.
                    _ => zeros(found, (found / block * block + block).min(size).max(found)),
                };
                if skipped_zeros {
                    Ok(())
                } else {
                    Err(format!("{what} {pos:#x} = {found:#x}, but data is in the hole"))
                }
            }
        }
    }

    /// Both files whole (the second through its direct handle every other
    /// time, where direct I/O runs), their sizes, and the shared-block
    /// counts.
    fn compare_all(&mut self) -> Checked {
        self.stats.compares += 1;
        for side in [Side::Main, Side::Other] {
            self.check_size_of(side)?;
            let size = self.size_of(side);
            if side == Side::Other && !self.config.two_files() {
                continue;
            }
            let direct = side == Side::Other
                && self.config.direct_io
                && self.stats.compares.is_multiple_of(2);
            self.verify_range(side, "whole", 0, size, direct)?;
        }
        self.check_shared_counts()
    }

    /// The end of a run: the last comparison, a sync, fsck on the synced
    /// volume (which checks the shared counts as a mount does), and a
    /// clean close.
    fn finish(&mut self) -> Checked {
        self.compare_all()?;
        let volume = self.volume();
        volume.sync().map_err(|error| format!("sync: {error}"))?;
        let report = foliofs::fsck::check(volume.device().clone());
        if !report.is_clean() {
            return Err(format!("fsck after the run: {}", report.problems.join("; ")));
        }
        self.close_handles();
        if let Some(volume) = self.volume.take() {
            volume.close().map_err(|error| format!("close: {error}"))?;
        }
        Ok(())
    }
}

/// A range anywhere in the file, at most `op_max` long.
fn random_range(rng: &mut ChaCha8Rng, file_max: u64, op_max: u64) -> (u64, u64) {
    let pos = rng.random_range(0..file_max);
    let len = rng.random_range(1..=op_max).min(file_max - pos).max(1);
    (pos, len)
}

/// A range in whole sectors, as direct I/O takes them.
fn sector_range(rng: &mut ChaCha8Rng, file_max: u64, op_max: u64) -> (u64, u64) {
    let sector = u64::from(SECTOR_BYTES);
    let pos = rng.random_range(0..file_max / sector) * sector;
    let len = rng.random_range(1..=op_max / sector) * sector;
    (pos, len.min(file_max - pos))
}
