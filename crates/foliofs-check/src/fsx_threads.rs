//! fsx with threads: several threads race on shared files, and every read
//! whose answer is defined is checked against a model.
//!
//! Each file is cut into slots, and each slot has one owner thread, the only
//! one that changes it (buffered, direct and asynchronous direct writes,
//! punch hole, zero range, and in the file's last slot truncation). Every
//! thread reads every slot: buffered reads, direct reads, streams of 64 KiB
//! buffered reads through a fresh handle (readahead, as generic/451's
//! readers), and mmap through a mount. A slot's version is odd while its
//! owner changes it; a read by another thread is checked when the version
//! was even and the same before and after it (nothing changed the slot
//! meanwhile), and counted as undefined otherwise. The owner's own reads
//! are always defined.
//!
//! The race that finds stale caching is the owner's window: an
//! asynchronous direct write of a whole slot, then one buffered read of it
//! back, while other threads stream through the slot and fill the cache
//! from the device. A fill that read the old bytes during the write and
//! kept them shows up in the read back (generic/451).

mod model;
mod target;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use foliofs::AlignedBuf;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{fill_pattern, mix};
pub use model::{Files, Slot};
pub use target::{Handle, InProcess, PathTarget, StaleReads, Target};

/// Bytes a stream reader asks for at a time (generic/451's readers).
const STREAM_READ_BYTES: u64 = 64 << 10;
/// Direct I/O's unit: the logical block of every device the engine runs on.
const DIRECT_UNIT: u64 = 512;
/// `Shared::window_slot` before any window race ran.
const NO_WINDOW: u64 = u64::MAX;
/// Ops remembered per thread for a failure report.
const HISTORY_OPS: usize = 16;

#[derive(Debug, Clone)]
pub struct ThreadsConfig {
    pub seed: u64,
    pub threads: usize,
    pub files: usize,
    /// Slots each thread owns in each file.
    pub slots_per_thread: usize,
    pub slot_bytes: u64,
    /// Stop after this many operations, all threads together.
    pub ops: u64,
    /// Or after this long, whichever comes first.
    pub time_limit: Option<Duration>,
    /// Whether the target maps files (through a mount).
    pub mmap: bool,
}

impl ThreadsConfig {
    pub fn new(seed: u64, threads: usize, ops: u64) -> Self {
        Self {
            seed,
            threads,
            files: 1,
            slots_per_thread: 2,
            slot_bytes: 640 << 10,
            ops,
            time_limit: None,
            mmap: false,
        }
    }

    fn slots_per_file(&self) -> usize {
        self.threads * self.slots_per_thread
    }

    fn file_bytes(&self) -> u64 {
        self.slots_per_file() as u64 * self.slot_bytes
    }
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct ThreadsStats {
    pub ops: u64,
    pub window_races: u64,
    pub stream_reads: u64,
    pub reads: u64,
    pub direct_reads: u64,
    pub mmap_reads: u64,
    pub writes: u64,
    pub direct_writes: u64,
    pub truncates: u64,
    pub punches: u64,
    pub zero_ranges: u64,
    pub fsyncs: u64,
    /// Bytes read and compared with the model.
    pub bytes_checked: u64,
    /// Bytes read while their slot changed, so with no defined answer.
    pub bytes_undefined: u64,
    pub elapsed: Duration,
}

impl ThreadsStats {
    fn add(&mut self, other: &ThreadsStats) {
        self.ops += other.ops;
        self.window_races += other.window_races;
        self.stream_reads += other.stream_reads;
        self.reads += other.reads;
        self.direct_reads += other.direct_reads;
        self.mmap_reads += other.mmap_reads;
        self.writes += other.writes;
        self.direct_writes += other.direct_writes;
        self.truncates += other.truncates;
        self.punches += other.punches;
        self.zero_ranges += other.zero_ranges;
        self.fsyncs += other.fsyncs;
        self.bytes_checked += other.bytes_checked;
        self.bytes_undefined += other.bytes_undefined;
    }
}

impl fmt::Display for ThreadsStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let checked = self.bytes_checked as f64;
        let defined_percent = 100.0 * checked / (checked + self.bytes_undefined as f64).max(1.0);
        write!(
            f,
            "{} ops in {:.1} s ({:.0} ops/s): {} window races, {} streams, \
             {} reads, {} direct reads, {} mmap reads, {} writes, {} direct writes, \
             {} truncates, {} punches, {} zero ranges, {} fsyncs; {} MiB compared \
             ({defined_percent:.0}% of bytes read had a defined answer)",
            self.ops,
            self.elapsed.as_secs_f64(),
            self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.window_races,
            self.stream_reads,
            self.reads,
            self.direct_reads,
            self.mmap_reads,
            self.writes,
            self.direct_writes,
            self.truncates,
            self.punches,
            self.zero_ranges,
            self.fsyncs,
            self.bytes_checked >> 20,
        )
    }
}

/// One operation, as a failure report names it.
#[derive(Debug, Clone, Copy)]
pub enum ThreadOp {
    WindowRace { file: usize, pos: u64, len: u64 },
    Stream { file: usize, slot: usize },
    Read { file: usize, pos: u64, len: u64 },
    DirectRead { file: usize, pos: u64, len: u64 },
    MmapRead { file: usize, pos: u64, len: u64 },
    Write { file: usize, pos: u64, len: u64 },
    DirectWrite { file: usize, pos: u64, len: u64 },
    Truncate { file: usize, size: u64 },
    Punch { file: usize, pos: u64, len: u64 },
    ZeroRange { file: usize, pos: u64, len: u64 },
    Fsync { file: usize, data_only: bool },
    FinalCompare { file: usize, direct: bool },
}

impl fmt::Display for ThreadOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ThreadOp::WindowRace { file, pos, len } => write!(
                f,
                "file {file}: async direct write {pos:#x}+{len:#x}, then one buffered read back"
            ),
            ThreadOp::Stream { file, slot } => {
                write!(f, "file {file}: stream of 64 KiB buffered reads over slot {slot}")
            }
            ThreadOp::Read { file, pos, len } => write!(f, "file {file}: read {pos:#x}+{len:#x}"),
            ThreadOp::DirectRead { file, pos, len } => {
                write!(f, "file {file}: direct read {pos:#x}+{len:#x}")
            }
            ThreadOp::MmapRead { file, pos, len } => {
                write!(f, "file {file}: mmap read {pos:#x}+{len:#x}")
            }
            ThreadOp::Write { file, pos, len } => write!(f, "file {file}: write {pos:#x}+{len:#x}"),
            ThreadOp::DirectWrite { file, pos, len } => {
                write!(f, "file {file}: direct write {pos:#x}+{len:#x}")
            }
            ThreadOp::Truncate { file, size } => write!(f, "file {file}: truncate {size:#x}"),
            ThreadOp::Punch { file, pos, len } => write!(f, "file {file}: punch {pos:#x}+{len:#x}"),
            ThreadOp::ZeroRange { file, pos, len } => {
                write!(f, "file {file}: zero range {pos:#x}+{len:#x}")
            }
            ThreadOp::Fsync { file, data_only: false } => write!(f, "file {file}: fsync"),
            ThreadOp::Fsync { file, data_only: true } => write!(f, "file {file}: fdatasync"),
            ThreadOp::FinalCompare { file, direct } => write!(
                f,
                "file {file}: whole-file {} read after every thread stopped",
                if direct { "direct" } else { "buffered" }
            ),
        }
    }
}

/// Why a run failed: a mismatch or an operation that returned an error.
#[derive(Debug)]
pub struct ThreadsFailure {
    pub thread: usize,
    pub op: ThreadOp,
    pub message: String,
    /// The failing thread's last operations, oldest first.
    pub history: Vec<ThreadOp>,
    pub after: Duration,
    pub stats: ThreadsStats,
}

impl fmt::Display for ThreadsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fsx --threads: thread {} failed after {:.1} s ({} ops in all): {}",
            self.thread,
            self.after.as_secs_f64(),
            self.stats.ops,
            self.op
        )?;
        writeln!(f, "  {}", self.message)?;
        writeln!(f, "  the thread's operations before it, oldest first:")?;
        for op in &self.history {
            writeln!(f, "    {op}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ThreadsFailure {}

/// Runs the threads on `target` until `config.ops` operations or the time
/// limit, then compares every file whole; `progress` is called from the
/// threads with the running op count every 10,000 ops.
pub fn run(
    config: &ThreadsConfig,
    target: &dyn Target,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<ThreadsStats, Box<ThreadsFailure>> {
    assert!(config.threads >= 1, "at least one thread");
    assert!(config.files >= 1, "at least one file");
    assert!(config.slot_bytes.is_multiple_of(STREAM_READ_BYTES), "slots hold whole stream reads");
    let started = Instant::now();
    let files = Files::new(config.files, config.slots_per_file(), config.slot_bytes);
    let fail = |thread, op, message: String| {
        Box::new(ThreadsFailure {
            thread,
            op,
            message,
            history: Vec::new(),
            after: started.elapsed(),
            stats: ThreadsStats::default(),
        })
    };
    // Every file starts full of one pattern per slot, made durable.
    for file in 0..config.files {
        let mut handle = target
            .open(file, false, true)
            .map_err(|error| fail(0, ThreadOp::Write { file, pos: 0, len: 0 }, error))?;
        let mut data = vec![0u8; config.file_bytes() as usize];
        fill_pattern(mix(&[config.seed, file as u64]), &mut data);
        handle.write(&data, 0).map_err(|error| {
            fail(0, ThreadOp::Write { file, pos: 0, len: config.file_bytes() }, error)
        })?;
        handle
            .sync(false)
            .map_err(|error| fail(0, ThreadOp::Fsync { file, data_only: false }, error))?;
        files.set_initial(file, &data);
    }

    let shared = Shared {
        config,
        target,
        files: &files,
        ops_started: AtomicU64::new(0),
        window_slot: AtomicU64::new(NO_WINDOW),
        stop: AtomicBool::new(false),
        started,
        progress,
        failure: Mutex::new(None),
    };
    let mut total = ThreadsStats::default();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..config.threads)
            .map(|thread| {
                let shared = &shared;
                scope.spawn(move || Worker::new(shared, thread).run())
            })
            .collect();
        for worker in workers {
            let stats = worker.join().expect("a checker thread panicked");
            total.add(&stats);
        }
    });
    total.elapsed = started.elapsed();
    if let Some(mut failure) = shared.failure.lock().expect("failure lock").take() {
        failure.stats = total;
        return Err(failure);
    }
    // Quiesced: every byte of every file is defined now.
    for file in 0..config.files {
        for direct in [false, true] {
            let op = ThreadOp::FinalCompare { file, direct };
            let expected = files.whole_file(file);
            let mut buffer = AlignedBuf::zeroed((config.file_bytes() + DIRECT_UNIT) as usize);
            let mut handle =
                target.open(file, direct, false).map_err(|error| fail(0, op, error))?;
            let count = handle.read(&mut buffer, 0).map_err(|error| fail(0, op, error))?;
            if let Err(message) = compare(&buffer[..count], &expected, 0) {
                let mut failure = fail(0, op, message);
                failure.stats = total;
                return Err(failure);
            }
            total.bytes_checked += count as u64;
        }
    }
    target.finish().map_err(|error| {
        let mut failure = fail(0, ThreadOp::Fsync { file: 0, data_only: false }, error);
        failure.stats = total.clone();
        failure
    })?;
    total.elapsed = started.elapsed();
    Ok(total)
}

struct Shared<'a> {
    config: &'a ThreadsConfig,
    target: &'a dyn Target,
    files: &'a Files,
    ops_started: AtomicU64,
    /// The file and slot (`file << 32 | slot`) of the latest window race.
    window_slot: AtomicU64,
    stop: AtomicBool,
    started: Instant,
    progress: &'a (dyn Fn(u64) + Sync),
    failure: Mutex<Option<Box<ThreadsFailure>>>,
}

/// One thread's handles: buffered and direct, one per file.
struct Worker<'a> {
    shared: &'a Shared<'a>,
    thread: usize,
    rng: ChaCha8Rng,
    buffered: Vec<Box<dyn Handle>>,
    direct: Vec<Box<dyn Handle>>,
    history: std::collections::VecDeque<ThreadOp>,
    stats: ThreadsStats,
    op_index: u64,
}

type OpResult = Result<(), String>;

/// A read into a buffer at an offset, returning the bytes read.
type ReadFn<'a> = dyn FnMut(&mut [u8], u64) -> Result<usize, String> + 'a;

impl<'a> Worker<'a> {
    fn new(shared: &'a Shared<'a>, thread: usize) -> Self {
        Self {
            shared,
            thread,
            rng: ChaCha8Rng::seed_from_u64(mix(&[shared.config.seed, thread as u64, 0x7468])),
            buffered: Vec::new(),
            direct: Vec::new(),
            history: std::collections::VecDeque::new(),
            stats: ThreadsStats::default(),
            op_index: 0,
        }
    }

    fn run(mut self) -> ThreadsStats {
        let config = self.shared.config;
        for file in 0..config.files {
            let opened =
                self.shared.target.open(file, false, true).and_then(|buffered| {
                    Ok((buffered, self.shared.target.open(file, true, true)?))
                });
            match opened {
                Ok((buffered, direct)) => {
                    self.buffered.push(buffered);
                    self.direct.push(direct);
                }
                Err(message) => {
                    self.failed(ThreadOp::Fsync { file, data_only: false }, message);
                    return self.stats;
                }
            }
        }
        while !self.shared.stop.load(Ordering::Relaxed) {
            let count = self.shared.ops_started.fetch_add(1, Ordering::Relaxed) + 1;
            let out_of_time =
                config.time_limit.is_some_and(|limit| self.shared.started.elapsed() >= limit);
            if count > config.ops || out_of_time {
                break;
            }
            if count.is_multiple_of(10_000) {
                (self.shared.progress)(count);
            }
            let (op, result) = self.step();
            self.stats.ops += 1;
            if let Err(message) = result {
                self.failed(op, message);
                break;
            }
            if self.history.len() == HISTORY_OPS {
                self.history.pop_front();
            }
            self.history.push_back(op);
        }
        self.stats
    }

    fn failed(&mut self, op: ThreadOp, message: String) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let mut slot = self.shared.failure.lock().expect("failure lock");
        if slot.is_none() {
            *slot = Some(Box::new(ThreadsFailure {
                thread: self.thread,
                op,
                message,
                history: self.history.iter().copied().collect(),
                after: self.shared.started.elapsed(),
                stats: ThreadsStats::default(),
            }));
        }
    }

    /// A slot this thread owns, in a random file: (file, slot).
    fn own_slot(&mut self) -> (usize, usize) {
        let config = self.shared.config;
        let file = self.rng.random_range(0..config.files);
        let nth = self.rng.random_range(0..config.slots_per_thread);
        (file, nth * config.threads + self.thread)
    }

    fn any_slot(&mut self) -> (usize, usize) {
        let config = self.shared.config;
        (self.rng.random_range(0..config.files), self.rng.random_range(0..config.slots_per_file()))
    }

    /// A range inside a slot: `unit`-aligned, at most `max_len` bytes.
    fn range_in(&mut self, slot: usize, unit: u64, max_len: u64) -> (u64, u64) {
        let slot_bytes = self.shared.config.slot_bytes;
        let units = slot_bytes / unit;
        let len_units = self.rng.random_range(1..=(max_len / unit).clamp(1, units));
        let start_unit = self.rng.random_range(0..=units - len_units);
        (slot as u64 * slot_bytes + start_unit * unit, len_units * unit)
    }

    fn step(&mut self) -> (ThreadOp, OpResult) {
        let config = self.shared.config;
        let choice = self.rng.random_range(0..100u32);
        match choice {
            0..20 => {
                let (file, slot) = self.own_slot();
                let (pos, len) = if self.rng.random_bool(0.5) {
                    (slot as u64 * config.slot_bytes, config.slot_bytes)
                } else {
                    self.range_in(slot, 4096, config.slot_bytes)
                };
                let op = ThreadOp::WindowRace { file, pos, len };
                (op, self.window_race(file, slot, pos, len))
            }
            20..40 => {
                // Half the streams go where a window race runs now, so
                // fills from the device meet writes in flight.
                let hot = self.shared.window_slot.load(Ordering::Relaxed);
                let (file, slot) = if hot != NO_WINDOW && self.rng.random_bool(0.5) {
                    ((hot >> 32) as usize, (hot & u64::from(u32::MAX)) as usize)
                } else {
                    self.any_slot()
                };
                (ThreadOp::Stream { file, slot }, self.stream(file, slot))
            }
            40..52 => {
                let (file, slot) = self.any_slot();
                let (pos, len) = self.range_in(slot, 1, 64 << 10);
                (
                    ThreadOp::Read { file, pos, len },
                    self.read(file, slot, pos, len, ReadKind::Buffered),
                )
            }
            52..58 => {
                let (file, slot) = self.any_slot();
                let (pos, len) = self.range_in(slot, DIRECT_UNIT, 64 << 10);
                let op = ThreadOp::DirectRead { file, pos, len };
                (op, self.read(file, slot, pos, len, ReadKind::Direct))
            }
            58..64 if config.mmap => {
                // Never the last slot: truncation there would make a mapped
                // page past the end fault.
                let file = self.rng.random_range(0..config.files);
                let slot = self.rng.random_range(0..config.slots_per_file() - 1);
                let (pos, len) = self.range_in(slot, 1, 64 << 10);
                (
                    ThreadOp::MmapRead { file, pos, len },
                    self.read(file, slot, pos, len, ReadKind::Mmap),
                )
            }
            58..72 => {
                let (file, slot) = self.own_slot();
                let (pos, len) = self.range_in(slot, 1, 64 << 10);
                (
                    ThreadOp::Write { file, pos, len },
                    self.change(file, slot, Change::Write { pos, len }),
                )
            }
            72..82 => {
                let (file, slot) = self.own_slot();
                let (pos, len) = self.range_in(slot, DIRECT_UNIT, 64 << 10);
                let op = ThreadOp::DirectWrite { file, pos, len };
                (op, self.change(file, slot, Change::DirectWrite { pos, len }))
            }
            82..86 => {
                let (file, slot) = self.own_slot();
                let (pos, len) = self.range_in(slot, 1, 128 << 10);
                (
                    ThreadOp::Punch { file, pos, len },
                    self.change(file, slot, Change::Punch { pos, len }),
                )
            }
            86..90 => {
                let (file, slot) = self.own_slot();
                let (pos, len) = self.range_in(slot, 1, 128 << 10);
                let op = ThreadOp::ZeroRange { file, pos, len };
                (op, self.change(file, slot, Change::ZeroRange { pos, len }))
            }
            90..95 if self.owns_last_slot() => {
                let file = self.rng.random_range(0..config.files);
                let slot = config.slots_per_file() - 1;
                let slot_start = slot as u64 * config.slot_bytes;
                let size = slot_start + self.rng.random_range(0..=config.slot_bytes);
                (
                    ThreadOp::Truncate { file, size },
                    self.change(file, slot, Change::Truncate { size }),
                )
            }
            _ => {
                let file = self.rng.random_range(0..config.files);
                let data_only = self.rng.random_bool(0.5);
                self.stats.fsyncs += 1;
                let result = self.buffered[file].sync(data_only);
                (ThreadOp::Fsync { file, data_only }, result)
            }
        }
    }

    fn owns_last_slot(&self) -> bool {
        (self.shared.config.slots_per_file() - 1) % self.shared.config.threads == self.thread
    }

    fn next_data_seed(&mut self) -> u64 {
        self.op_index += 1;
        mix(&[self.shared.config.seed, self.thread as u64, self.op_index])
    }

    /// The owner's window: an asynchronous direct write, then the range
    /// read back in one buffered read, which must return what was written.
    fn window_race(&mut self, file: usize, slot: usize, pos: u64, len: u64) -> OpResult {
        self.stats.window_races += 1;
        let mut data = AlignedBuf::zeroed(len as usize);
        fill_pattern(self.next_data_seed(), &mut data);
        let model = self.shared.files.slot(file, slot);
        let guard = model.begin_change();
        let window = ((file as u64) << 32) | slot as u64;
        self.shared.window_slot.store(window, Ordering::Relaxed);
        self.direct[file].write_async(&data, pos)?;
        model.apply(&guard, |bytes| bytes.write(pos, &data));
        drop(guard);
        let mut back = vec![0u8; len as usize];
        let count = self.buffered[file].read(&mut back, pos)?;
        let expected = model.expected(pos, len);
        self.stats.bytes_checked += count as u64;
        compare(&back[..count], &expected, pos)
    }

    /// Reads a slot in 64 KiB buffered reads through a fresh handle.
    fn stream(&mut self, file: usize, slot: usize) -> OpResult {
        self.stats.stream_reads += 1;
        let slot_bytes = self.shared.config.slot_bytes;
        let mut handle = self.shared.target.open(file, false, false)?;
        let mut pos = slot as u64 * slot_bytes;
        let end = pos + slot_bytes;
        let mut buffer = vec![0u8; STREAM_READ_BYTES as usize];
        while pos < end {
            self.read_checked(file, slot, pos, &mut buffer, &mut |out, at| handle.read(out, at))?;
            pos += STREAM_READ_BYTES;
        }
        Ok(())
    }

    fn read(&mut self, file: usize, slot: usize, pos: u64, len: u64, kind: ReadKind) -> OpResult {
        match kind {
            ReadKind::Buffered => self.stats.reads += 1,
            ReadKind::Direct => self.stats.direct_reads += 1,
            ReadKind::Mmap => self.stats.mmap_reads += 1,
        }
        // Aligned for direct reads; any buffer does for the others.
        let mut buffer = AlignedBuf::zeroed(len as usize);
        let handle = match kind {
            ReadKind::Direct => &mut self.direct[file],
            ReadKind::Buffered | ReadKind::Mmap => &mut self.buffered[file],
        };
        let mut read = |out: &mut [u8], at| match kind {
            ReadKind::Mmap => handle.mmap_read(out, at),
            ReadKind::Buffered | ReadKind::Direct => handle.read(out, at),
        };
        let (shared, thread) = (self.shared, self.thread);
        read_checked(&mut self.stats, shared, thread, file, slot, pos, &mut buffer, &mut read)
    }

    fn read_checked(
        &mut self,
        file: usize,
        slot: usize,
        pos: u64,
        buffer: &mut [u8],
        read: &mut ReadFn<'_>,
    ) -> OpResult {
        read_checked(&mut self.stats, self.shared, self.thread, file, slot, pos, buffer, read)
    }

    /// A change to a slot this thread owns, made while its version is odd.
    fn change(&mut self, file: usize, slot: usize, change: Change) -> OpResult {
        let model = self.shared.files.slot(file, slot);
        let guard = model.begin_change();
        match change {
            Change::Write { pos, len } => {
                self.stats.writes += 1;
                let mut data = vec![0u8; len as usize];
                fill_pattern(self.next_data_seed(), &mut data);
                self.buffered[file].write(&data, pos)?;
                model.apply(&guard, |bytes| bytes.write(pos, &data));
            }
            Change::DirectWrite { pos, len } => {
                self.stats.direct_writes += 1;
                let mut data = AlignedBuf::zeroed(len as usize);
                fill_pattern(self.next_data_seed(), &mut data);
                self.direct[file].write(&data, pos)?;
                model.apply(&guard, |bytes| bytes.write(pos, &data));
            }
            Change::Punch { pos, len } => {
                self.stats.punches += 1;
                self.buffered[file].punch(pos, len)?;
                model.apply(&guard, |bytes| bytes.zero(pos, len));
            }
            Change::ZeroRange { pos, len } => {
                self.stats.zero_ranges += 1;
                self.buffered[file].zero_range(pos, len)?;
                model.apply(&guard, |bytes| bytes.zero(pos, len));
            }
            Change::Truncate { size } => {
                self.stats.truncates += 1;
                self.buffered[file].set_len(size)?;
                model.apply(&guard, |bytes| bytes.truncate(size));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum ReadKind {
    Buffered,
    Direct,
    Mmap,
}

#[derive(Clone, Copy)]
enum Change {
    Write { pos: u64, len: u64 },
    DirectWrite { pos: u64, len: u64 },
    Punch { pos: u64, len: u64 },
    ZeroRange { pos: u64, len: u64 },
    Truncate { size: u64 },
}

/// A read of `buffer.len()` bytes at `pos` inside `slot`, compared with the
/// model when nothing changed the slot while it ran (or when this thread
/// owns the slot: nothing else changes it).
#[allow(clippy::too_many_arguments)]
fn read_checked(
    stats: &mut ThreadsStats,
    shared: &Shared<'_>,
    thread: usize,
    file: usize,
    slot: usize,
    pos: u64,
    buffer: &mut [u8],
    read: &mut ReadFn<'_>,
) -> OpResult {
    let model = shared.files.slot(file, slot);
    let before = model.version();
    let count = read(buffer, pos)?;
    let owner = slot % shared.config.threads == thread;
    match model.expected_if_unchanged(before, pos, buffer.len() as u64, owner) {
        Some(expected) => {
            stats.bytes_checked += count as u64;
            compare(&buffer[..count], &expected, pos)
        }
        None => {
            stats.bytes_undefined += count as u64;
            Ok(())
        }
    }
}

/// Whether `got` is `expected`; if not, what differs, where.
fn compare(got: &[u8], expected: &[u8], pos: u64) -> OpResult {
    if got.len() != expected.len() {
        return Err(format!(
            "read at {pos:#x} returned {} bytes; the model holds {} there (end of file)",
            got.len(),
            expected.len()
        ));
    }
    let Some(first) = got.iter().zip(expected).position(|(a, b)| a != b) else {
        return Ok(());
    };
    let last = got.iter().zip(expected).rposition(|(a, b)| a != b).unwrap_or(first);
    let show = |bytes: &[u8]| {
        bytes[first..(first + 16).min(bytes.len())]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    Err(format!(
        "mismatch: bytes {:#x}..{:#x} of the file differ from the model\n  \
         expected {}\n  got      {}",
        pos + first as u64,
        pos + last as u64 + 1,
        show(expected),
        show(got)
    ))
}

/// Where `foliofs fsx --threads --path` puts its files.
pub fn file_path(dir: &std::path::Path, file: usize) -> PathBuf {
    dir.join(format!("fsx-threads-{file}"))
}
