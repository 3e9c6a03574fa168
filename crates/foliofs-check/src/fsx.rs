//! An fsx-style checker: random operations on one file, each compared with
//! an in-memory copy of what the file must hold.
//!
//! Operations: buffered reads and writes; direct reads and writes with
//! aligned buffers in units of the device's logical block (512 B, so
//! sub-block on every block size); truncation up and down; every fallocate
//! mode (collapse and insert block aligned, as they must be); SEEK_DATA and
//! SEEK_HOLE (what they skip must read as zeros); fsync and fdatasync;
//! closing and reopening the handles; now and then a clean remount, and a
//! crash right after an fsync (remounted from what the device made durable,
//! which must be the whole file). Every read is compared; the whole file
//! and its size are compared every `compare_every` ops and after every
//! reopen and remount.

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use foliofs::dev::fault::Keep;
use foliofs::dev::{AlignedBuf, FaultDev};
use foliofs::FallocateMode;
use foliofs::{File, MkfsOptions, OpenFlags, Volume};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::apply_fallocate;
use crate::{fill_pattern, mix, new_volume, open_raw, owner, ROOT, SECTOR_BYTES};

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
    Reopen,
    Remount,
    /// fsync, then crash keeping only what the device made durable.
    CrashRemount,
}

impl fmt::Display for FsxOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
            FsxOp::Reopen => write!(f, "close and reopen"),
            FsxOp::Remount => write!(f, "clean remount"),
            FsxOp::CrashRemount => write!(f, "fsync, crash, remount"),
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
    pub reopens: u64,
    pub remounts: u64,
    pub crash_remounts: u64,
    pub compares: u64,
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
        self.reopens += other.reopens;
        self.remounts += other.remounts;
        self.crash_remounts += other.crash_remounts;
        self.compares += other.compares;
        self.bytes_checked += other.bytes_checked;
    }
}

/// A mismatch: where, what, and the ops that led there.
#[derive(Debug, Clone)]
pub struct FsxFailure {
    /// `-o LIST ` when the run had options, else "".
    pub options: String,
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
            "reproduce: foliofs {}fsx --seed {} --ops {} --block-size {}",
            self.options,
            self.seed,
            self.op_index + 1,
            self.block_bytes
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

struct Fsx<'a> {
    config: FsxConfig,
    options: foliofs::VolumeOptions,
    rng: ChaCha8Rng,
    backend: Backend<'a>,
    volume: Option<Volume>,
    ino: u64,
    handles: Option<(File, File)>,
    model: Vec<u8>,
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
    let file_max = config.file_max();
    let volume_bytes = (file_max * 16).max(16 << 20);
    let options = crate::options_with(config.options)
        .unwrap_or_else(|error| panic!("options {:?}: {error}", config.options));
    let (backend, volume) = match device {
        FsxDevice::Memory => {
            let (raw, volume) = new_volume(volume_bytes, config.block_bytes, None, &options)
                .expect("mkfs on the in-memory device");
            (Backend::Memory(raw), volume)
        }
        FsxDevice::Path { path, power_cut } => {
            let mkfs = MkfsOptions {
                block_bytes: config.block_bytes,
                journal_bytes: None,
                root_owner: owner(),
            };
            Volume::mkfs_path(path, None, &mkfs, &options)
                .unwrap_or_else(|error| panic!("mkfs {}: {error}", path.display()));
            let volume = Volume::open(path, &options)
                .unwrap_or_else(|error| panic!("open {}: {error}", path.display()));
            (Backend::Path { path, power_cut }, volume)
        }
    };
    let ino = volume.inodes().create(ROOT, b"fsx", 0o644, owner()).expect("create").ino;
    let mut fsx = Fsx {
        config,
        options,
        rng: ChaCha8Rng::seed_from_u64(mix(&[config.seed, u64::from(config.block_bytes)])),
        backend,
        volume: Some(volume),
        ino,
        handles: None,
        model: Vec::new(),
        stats: FsxStats::default(),
        scratch: Vec::new(),
    };
    fsx.open_handles().expect("open");
    let mut recent: VecDeque<(u64, FsxOp)> = VecDeque::with_capacity(config.history + 1);
    for index in 0..config.ops {
        let op = fsx.generate();
        recent.push_back((index, op));
        if recent.len() > config.history {
            recent.pop_front();
        }
        let mut result = fsx.execute(index, op);
        if result.is_ok() && (index + 1) % config.compare_every == 0 {
            result = fsx.compare_all();
        }
        if let Err(message) = result {
            return Err(FsxFailure {
                options: failure_options(config.options),
                seed: config.seed,
                block_bytes: config.block_bytes,
                op_index: index,
                message,
                recent: recent.into_iter().collect(),
            });
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
    let stats = fsx.stats;
    fsx.handles = None;
    if let Some(volume) = fsx.volume.take() {
        volume.close().map_err(|error| FsxFailure {
            options: failure_options(config.options),
            seed: config.seed,
            block_bytes: config.block_bytes,
            op_index: config.ops,
            message: format!("close: {error}"),
            recent: Vec::new(),
        })?;
    }
    Ok(stats)
}

fn failure_options(options: &str) -> String {
    if options.is_empty() {
        String::new()
    } else {
        format!("-o {options} ")
    }
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

    fn open_handles(&mut self) -> Checked {
        let volume = self.volume();
        let buffered = volume
            .inodes()
            .open_file(self.ino, OpenFlags::READ_WRITE)
            .map_err(|error| format!("open: {error}"))?;
        let direct = volume
            .inodes()
            .open_file(self.ino, OpenFlags::READ_WRITE.with_direct())
            .map_err(|error| format!("open direct: {error}"))?;
        self.handles = Some((buffered, direct));
        Ok(())
    }

    fn size(&self) -> u64 {
        self.model.len() as u64
    }

    fn generate(&mut self) -> FsxOp {
        let file_max = self.config.file_max();
        let op_max = self.config.op_max();
        let block = u64::from(self.config.block_bytes);
        let sector = u64::from(SECTOR_BYTES);
        let size = self.size();
        let rng = &mut self.rng;
        let range = |rng: &mut ChaCha8Rng| {
            let pos = rng.random_range(0..file_max);
            let len = rng.random_range(1..=op_max).min(file_max - pos).max(1);
            (pos, len)
        };
        let aligned = |rng: &mut ChaCha8Rng| {
            let pos = rng.random_range(0..file_max / sector) * sector;
            let len = rng.random_range(1..=op_max / sector) * sector;
            (pos, len.min(file_max - pos))
        };
        match rng.random_range(0..1000) {
            0..=199 => {
                let (pos, len) = range(rng);
                FsxOp::Read { pos, len }
            }
            200..=419 => {
                let (pos, len) = range(rng);
                FsxOp::Write { pos, len }
            }
            420..=519 => {
                let (pos, len) = aligned(rng);
                FsxOp::DirectRead { pos, len }
            }
            520..=659 => {
                let (pos, len) = aligned(rng);
                FsxOp::DirectWrite { pos, len }
            }
            660..=719 => FsxOp::Truncate { size: rng.random_range(0..=file_max) },
            720..=879 => {
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
            880..=919 => {
                let pos = rng.random_range(0..=size + block);
                if rng.random_bool(0.5) {
                    FsxOp::SeekData { pos }
                } else {
                    FsxOp::SeekHole { pos }
                }
            }
            920..=979 => FsxOp::Fsync { data_only: rng.random_bool(0.5) },
            980..=995 => FsxOp::Reopen,
            996..=997 => FsxOp::Remount,
            _ => FsxOp::CrashRemount,
        }
    }

    fn execute(&mut self, index: u64, op: FsxOp) -> Checked {
        match op {
            FsxOp::Read { pos, len } => {
                self.stats.reads += 1;
                let mut buffer = std::mem::take(&mut self.scratch);
                buffer.resize(len as usize, 0);
                let result = self.buffered().read_at(&mut buffer, pos);
                let checked = self.check_read("read", pos, &buffer, result);
                self.scratch = buffer;
                checked
            }
            FsxOp::DirectRead { pos, len } => {
                self.stats.direct_reads += 1;
                let mut buffer = AlignedBuf::zeroed(len as usize);
                let result = self.direct().read_at(&mut buffer, pos);
                self.check_read("direct read", pos, &buffer, result)
            }
            FsxOp::Write { pos, len } => {
                self.stats.writes += 1;
                let mut data = std::mem::take(&mut self.scratch);
                data.resize(len as usize, 0);
                fill_pattern(mix(&[self.config.seed, index]), &mut data);
                let result = self.buffered().write_at(&data, pos);
                let checked = self.apply_write("write", pos, &data, result);
                self.scratch = data;
                checked
            }
            FsxOp::DirectWrite { pos, len } => {
                self.stats.direct_writes += 1;
                let mut data = AlignedBuf::zeroed(len as usize);
                fill_pattern(mix(&[self.config.seed, index]), &mut data);
                let result = self.direct().write_at(&data, pos);
                self.apply_write("direct write", pos, &data, result)
            }
            FsxOp::Truncate { size } => {
                self.stats.truncates += 1;
                self.buffered().set_len(size).map_err(|error| format!("truncate: {error}"))?;
                self.model.resize(size as usize, 0);
                self.check_size()
            }
            FsxOp::Fallocate { mode, offset, len } => {
                self.stats.fallocates += 1;
                self.buffered()
                    .fallocate(mode, offset, len)
                    .map_err(|error| format!("fallocate: {error}"))?;
                apply_fallocate(&mut self.model, mode, offset as usize, len as usize);
                self.check_size()
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
            FsxOp::Reopen => {
                self.stats.reopens += 1;
                self.handles = None;
                self.open_handles()?;
                self.compare_all()
            }
            FsxOp::Remount => {
                self.stats.remounts += 1;
                self.handles = None;
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
                self.handles = None;
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

    fn check_read(
        &mut self,
        what: &str,
        pos: u64,
        buffer: &[u8],
        result: foliofs::Result<usize>,
    ) -> Checked {
        let read = result.map_err(|error| format!("{what}: {error}"))?;
        let start = (pos as usize).min(self.model.len());
        let expected = &self.model[start..(start + buffer.len()).min(self.model.len())];
        if read != expected.len() {
            return Err(format!("{what} returned {read} bytes, expected {}", expected.len()));
        }
        self.stats.bytes_checked += read as u64;
        if let Some(at) = buffer[..read].iter().zip(expected).position(|(a, b)| a != b) {
            return Err(format!(
                "{what}: byte at file offset {:#x} is {:#04x}, expected {:#04x}",
                pos + at as u64,
                buffer[at],
                expected[at]
            ));
        }
        Ok(())
    }

    fn apply_write(
        &mut self,
        what: &str,
        pos: u64,
        data: &[u8],
        result: foliofs::Result<usize>,
    ) -> Checked {
        let written = result.map_err(|error| format!("{what}: {error}"))?;
        if written != data.len() {
            return Err(format!("{what} wrote {written} of {} bytes", data.len()));
        }
        let start = pos as usize;
        if self.model.len() < start + written {
            self.model.resize(start + written, 0);
        }
        self.model[start..start + written].copy_from_slice(data);
        self.check_size()
    }

    fn check_size(&self) -> Checked {
        let size = self.buffered().attr().map_err(|error| format!("stat: {error}"))?.size;
        if size != self.size() {
            return Err(format!("size is {size:#x}, expected {:#x}", self.size()));
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

    fn compare_all(&mut self) -> Checked {
        self.stats.compares += 1;
        self.check_size()?;
        let size = self.model.len();
        let mut buffer = std::mem::take(&mut self.scratch);
        buffer.resize(size, 0);
        let result = self.buffered().read_at(&mut buffer, 0);
        let checked = self.check_read("whole-file read", 0, &buffer, result);
        self.scratch = buffer;
        checked
    }
}
