//! Runs parsed fio jobs in-process against a volume, as fio would run them
//! against a mounted file system: each job's `numjobs` instances on their own
//! threads, all jobs at once; files laid out (and pre-read) first; the
//! synchronous engines (psync, sync, pvsync2) one request at a time through
//! the blocking API, the asynchronous ones (libaio, io_uring) with direct=1
//! keeping `iodepth` requests in flight through the async API.
//!
//! With verify=crc32c every block written is remembered by its checksum and,
//! with do_verify, read back and checked when the job ends.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use foliofs::dev::{AlignedBuf, DevStats};
use foliofs::{Error as FsError, File, InodeKind, OpenFlags, Owner, Volume};
use futures::stream::{FuturesUnordered, StreamExt};
use rand::{RngExt, SeedableRng};

use crate::jobfile::{JobSpec, SyncMode};
use crate::latency::Latencies;

/// Bytes per request when laying out or pre-reading a file.
const LAYOUT_CHUNK_BYTES: usize = 1 << 20;

/// An asynchronous request's outcome: the bytes moved and the buffer back.
pub type Submitted = Pin<Box<dyn Future<Output = foliofs::DirectResult> + Send>>;

/// What a job instance reads and writes: a file of the engine, a region of
/// the raw device (the engine's limit), or memory (the cache's limit). One
/// loop measures all three the same way.
pub trait Target: Send + Sync {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> foliofs::Result<usize>;
    fn write_at(&self, data: &[u8], offset: u64) -> foliofs::Result<usize>;
    fn read_async(&self, buffer: AlignedBuf, offset: u64) -> Submitted;
    fn write_async(&self, buffer: AlignedBuf, offset: u64) -> Submitted;
    fn fsync(&self) -> foliofs::Result<()>;
    fn fdatasync(&self) -> foliofs::Result<()>;
}

impl Target for File {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> foliofs::Result<usize> {
        File::read_at(self, buffer, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> foliofs::Result<usize> {
        File::write_at(self, data, offset)
    }

    fn read_async(&self, buffer: AlignedBuf, offset: u64) -> Submitted {
        Box::pin(self.read_at_async(buffer, offset))
    }

    fn write_async(&self, buffer: AlignedBuf, offset: u64) -> Submitted {
        Box::pin(self.write_at_async(buffer, offset))
    }

    fn fsync(&self) -> foliofs::Result<()> {
        File::sync_all(self)
    }

    fn fdatasync(&self) -> foliofs::Result<()> {
        File::sync_data(self)
    }
}

/// One direction's figures, as fio reports them per job.
pub struct SideStats {
    pub io_bytes: u64,
    pub ios: u64,
    /// Completion latency of each request (submission to completion).
    pub latencies: Latencies,
}

impl SideStats {
    pub fn empty() -> Self {
        Self::new()
    }

    fn new() -> Self {
        Self { io_bytes: 0, ios: 0, latencies: Latencies::new() }
    }

    fn merge(&mut self, other: &SideStats) {
        self.io_bytes += other.io_bytes;
        self.ios += other.ios;
        self.latencies.merge(&other.latencies);
    }
}

/// What one job (its instances merged with group_reporting, else one
/// instance) did after its ramp.
pub struct JobReport {
    pub name: String,
    pub instances: u32,
    pub read: SideStats,
    pub write: SideStats,
    /// Measured time: from the end of the ramp to the last instance's end.
    pub runtime: Duration,
    pub verified_blocks: u64,
    pub notes: Vec<String>,
}

/// Every job's report and what reached the device during the measured run.
pub struct RunReport {
    pub jobs: Vec<JobReport>,
    pub device: DevStats,
    pub elapsed: Duration,
}

/// One instance's result.
struct InstanceResult {
    read: SideStats,
    write: SideStats,
    runtime: Duration,
    verified_blocks: u64,
}

/// Lays out the jobs' files, runs every instance of every job at once, and
/// reports.
pub fn run(volume: &Volume, specs: &[JobSpec]) -> anyhow::Result<RunReport> {
    let mut targets: Vec<(usize, u32, Box<dyn Target>)> = Vec::new();
    for (spec_index, spec) in specs.iter().enumerate() {
        for index in 0..spec.numjobs {
            let path = spec.file_of(index);
            let ino = prepare_file(volume, spec, &path)
                .with_context(|| format!("job {:?}: file {path}", spec.name))?;
            let flags = OpenFlags {
                read: true,
                write: spec.pattern.writes() || spec.verify,
                direct: spec.direct,
                dsync: spec.sync != SyncMode::None,
                ..OpenFlags::READ
            };
            let file = volume
                .inodes()
                .open_file(ino, flags)
                .with_context(|| format!("job {:?}: open {path}", spec.name))?;
            targets.push((spec_index, index, Box::new(file)));
        }
    }
    run_targets(specs, targets, &|| volume.device().stats())
}

/// Runs every target's instance on its own thread, released together, and
/// reports what they did and what `device_stats` counted meanwhile.
pub fn run_targets(
    specs: &[JobSpec],
    targets: Vec<(usize, u32, Box<dyn Target>)>,
    device_stats: &dyn Fn() -> DevStats,
) -> anyhow::Result<RunReport> {
    let barrier = Arc::new(Barrier::new(targets.len() + 1));
    let threads: Vec<_> = targets
        .into_iter()
        .map(|(spec_index, index, target)| {
            let spec = specs[spec_index].clone();
            let barrier = Arc::clone(&barrier);
            let thread = std::thread::Builder::new()
                .name(format!("{}.{index}", spec.name))
                .spawn(move || {
                    barrier.wait();
                    run_instance(&spec, index, target.as_ref())
                })
                .expect("spawn a job thread");
            (spec_index, thread)
        })
        .collect();
    let mut before = device_stats();
    let mut started = Instant::now();
    barrier.wait();
    // The device counters, like the latencies, cover the measured time only.
    let ramp = specs.iter().map(|spec| spec.ramp_time).max().unwrap_or_default();
    if !ramp.is_zero() {
        std::thread::sleep(ramp);
        before = device_stats();
        started = Instant::now();
    }
    let mut results: Vec<(usize, InstanceResult)> = Vec::new();
    let mut failure = None;
    for (spec_index, thread) in threads {
        match thread.join().map_err(|_| anyhow!("a job thread panicked")).and_then(|result| result)
        {
            Ok(result) => results.push((spec_index, result)),
            Err(error) => failure = failure.or(Some(error)),
        }
    }
    if let Some(error) = failure {
        return Err(error);
    }
    let elapsed = started.elapsed();
    let device = device_stats().since(&before);
    let mut jobs = Vec::new();
    for (spec_index, spec) in specs.iter().enumerate() {
        let mine =
            results.iter().filter(|(index, _)| *index == spec_index).map(|(_, result)| result);
        if spec.group_reporting {
            jobs.push(merge(spec, mine));
        } else {
            for result in mine {
                jobs.push(merge(spec, std::iter::once(result)));
            }
        }
    }
    Ok(RunReport { jobs, device, elapsed })
}

fn merge<'a>(spec: &JobSpec, results: impl Iterator<Item = &'a InstanceResult>) -> JobReport {
    let mut report = JobReport {
        name: spec.name.clone(),
        instances: 0,
        read: SideStats::new(),
        write: SideStats::new(),
        runtime: Duration::ZERO,
        verified_blocks: 0,
        notes: spec.notes.clone(),
    };
    for result in results {
        report.instances += 1;
        report.read.merge(&result.read);
        report.write.merge(&result.write);
        report.runtime = report.runtime.max(result.runtime);
        report.verified_blocks += result.verified_blocks;
    }
    report
}

/// Opens or creates the job's file (and its directories), lays it out when
/// the job reads it or overwrites it, and pre-reads it if asked.
fn prepare_file(volume: &Volume, spec: &JobSpec, path: &str) -> anyhow::Result<u64> {
    let path = format!("/{}", path.trim_start_matches("./").trim_start_matches('/'));
    let ino = match volume.inodes().resolve(&path) {
        Ok(ino) => ino,
        Err(FsError::NotFound(_)) if !spec.allow_file_create => {
            bail!("does not exist, and allow_file_create=0 forbids creating it")
        }
        Err(FsError::NotFound(_)) => create_with_parents(volume, &path)?,
        Err(error) => return Err(error.into()),
    };
    let attr = volume.inodes().getattr(ino)?;
    if attr.kind != InodeKind::File {
        bail!("is not a regular file");
    }
    let lay_out = spec.pattern.reads() || spec.overwrite;
    if lay_out && attr.size < spec.size_bytes {
        let file = volume.inodes().open_file(ino, OpenFlags::WRITE)?;
        lay_out_range(attr.size, spec.size_bytes, |chunk, offset| file.write_at(chunk, offset))?;
        file.fsync()?;
    }
    if spec.pre_read {
        let file = volume.inodes().open_file(ino, OpenFlags::READ)?;
        read_through(spec.size_bytes, |buffer, offset| file.read_at(buffer, offset))?;
    }
    Ok(ino)
}

/// What laid-out files hold (any byte but zero).
const LAID_OUT_BYTE: u8 = 0x5A;

/// Writes `[from, to)` of a file with the layout byte, chunk by chunk,
/// through `write_at` (the engine's files and `--target files` alike).
pub(crate) fn lay_out_range<T, E>(
    from: u64,
    to: u64,
    mut write_at: impl FnMut(&[u8], u64) -> Result<T, E>,
) -> Result<(), E> {
    let chunk = vec![LAID_OUT_BYTE; LAYOUT_CHUNK_BYTES];
    let mut offset = from;
    while offset < to {
        let length = (to - offset).min(LAYOUT_CHUNK_BYTES as u64) as usize;
        write_at(&chunk[..length], offset)?;
        offset += length as u64;
    }
    Ok(())
}

/// Reads a file's first `size` bytes (fewer at end of file) through
/// `read_at`, so that they are cached (`pre_read`).
pub(crate) fn read_through<E>(
    size: u64,
    mut read_at: impl FnMut(&mut [u8], u64) -> Result<usize, E>,
) -> Result<(), E> {
    let mut buffer = vec![0u8; LAYOUT_CHUNK_BYTES];
    let mut offset = 0;
    while offset < size {
        match read_at(&mut buffer, offset)? {
            0 => break,
            read => offset += read as u64,
        }
    }
    Ok(())
}

fn create_with_parents(volume: &Volume, path: &str) -> anyhow::Result<u64> {
    let mut dir = foliofs::ROOT_INO;
    let components: Vec<&str> = path.split('/').filter(|part| !part.is_empty()).collect();
    let (name, parents) = components.split_last().ok_or_else(|| anyhow!("empty file name"))?;
    for part in parents {
        dir = match volume.inodes().lookup(dir, part.as_bytes()) {
            Ok(attr) => attr.ino,
            Err(FsError::NotFound(_)) => {
                volume.inodes().mkdir(dir, part.as_bytes(), 0o755, Owner::current())?.ino
            }
            Err(error) => return Err(error.into()),
        };
    }
    Ok(volume.inodes().create(dir, name.as_bytes(), 0o644, Owner::current())?.ino)
}

/// Where an instance is and what it has done.
struct Instance<'a> {
    spec: &'a JobSpec,
    rng: rand::rngs::SmallRng,
    next_block: u64,
    blocks: u64,
    writes_since_sync: u64,
    /// verify=crc32c: checksum of the last data written at each offset.
    written: HashMap<u64, u32>,
    sequence: u64,
}

impl Instance<'_> {
    fn next_offset(&mut self) -> u64 {
        let block = if self.spec.pattern.random() {
            self.rng.random_range(0..self.blocks)
        } else {
            let block = self.next_block;
            self.next_block = (self.next_block + 1) % self.blocks;
            block
        };
        block * self.spec.block_bytes
    }

    /// `offset`, or the next block after it (wrapping) with no write in
    /// flight; `None` when every block has one.
    fn free_block_from(&self, offset: u64, writing: &HashSet<u64>) -> Option<u64> {
        let block_bytes = self.spec.block_bytes;
        let first = offset / block_bytes;
        (0..self.blocks)
            .map(|step| (first + step) % self.blocks * block_bytes)
            .find(|candidate| !writing.contains(candidate))
    }

    fn next_is_read(&mut self) -> bool {
        match (self.spec.pattern.reads(), self.spec.pattern.writes()) {
            (true, true) => self.rng.random_range(0..100) < self.spec.read_mix_percent,
            (reads, _) => reads,
        }
    }

    /// Fills `buffer` with data for a write at `offset` and remembers its
    /// checksum when verifying.
    fn fill_for_write(&mut self, buffer: &mut [u8], offset: u64) {
        if !self.spec.verify {
            return;
        }
        self.sequence += 1;
        let mut state = (offset ^ self.sequence.rotate_left(32)) | 1;
        for chunk in buffer.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        self.written.insert(offset, crc32c::crc32c(buffer));
    }

    /// After a write: fsync / fdatasync every so many writes.
    fn after_write(&mut self, file: &dyn Target) -> anyhow::Result<()> {
        self.writes_since_sync += 1;
        let spec = self.spec;
        if spec.fsync_every > 0 && self.writes_since_sync.is_multiple_of(spec.fsync_every) {
            file.fsync()?;
        }
        if spec.fdatasync_every > 0 && self.writes_since_sync.is_multiple_of(spec.fdatasync_every) {
            file.fdatasync()?;
        }
        Ok(())
    }
}

/// When an instance stops: after its ramp and runtime when time based, else
/// after `size` bytes (or the runtime, if that comes first).
struct Clock {
    ramp_end: Instant,
    deadline: Option<Instant>,
    bytes_max: Option<u64>,
}

impl Clock {
    fn new(spec: &JobSpec, start: Instant) -> Self {
        let ramp_end = start + spec.ramp_time;
        Self {
            ramp_end,
            deadline: spec.runtime.map(|runtime| ramp_end + runtime),
            bytes_max: (!spec.time_based).then_some(spec.size_bytes),
        }
    }

    fn done(&self, now: Instant, bytes: u64) -> bool {
        self.deadline.is_some_and(|deadline| now >= deadline)
            || self.bytes_max.is_some_and(|bytes_max| bytes >= bytes_max)
    }
}

fn run_instance(spec: &JobSpec, index: u32, file: &dyn Target) -> anyhow::Result<InstanceResult> {
    let seed = if spec.randrepeat { u64::from(index) + 1 } else { rand::random() };
    let mut instance = Instance {
        spec,
        rng: rand::rngs::SmallRng::seed_from_u64(seed),
        next_block: 0,
        blocks: (spec.size_bytes / spec.block_bytes).max(1),
        writes_since_sync: 0,
        written: HashMap::new(),
        sequence: 0,
    };
    let start = Instant::now();
    let clock = Clock::new(spec, start);
    let (mut read, mut write) = (SideStats::new(), SideStats::new());
    if spec.direct && spec.ioengine.asynchronous() {
        run_async(&mut instance, file, &clock, &mut read, &mut write)?;
    } else {
        run_sync(&mut instance, file, &clock, &mut read, &mut write)?;
    }
    if spec.end_fsync && spec.pattern.writes() {
        file.fsync()?;
    }
    let runtime = start.elapsed().saturating_sub(spec.ramp_time);
    let verified_blocks = if spec.verify && spec.do_verify { verify(&instance, file)? } else { 0 };
    Ok(InstanceResult { read, write, runtime, verified_blocks })
}

fn run_sync(
    instance: &mut Instance<'_>,
    file: &dyn Target,
    clock: &Clock,
    read: &mut SideStats,
    write: &mut SideStats,
) -> anyhow::Result<()> {
    let block_bytes = instance.spec.block_bytes as usize;
    // Page-aligned, as fio's buffers are (direct I/O needs it; copies are
    // faster with it).
    let mut buffer = AlignedBuf::zeroed(block_bytes);
    buffer.fill(0xA5);
    let mut bytes_done = 0u64;
    loop {
        let now = Instant::now();
        if clock.done(now, bytes_done) {
            return Ok(());
        }
        let offset = instance.next_offset();
        let is_read = instance.next_is_read();
        if !is_read {
            instance.fill_for_write(&mut buffer, offset);
        }
        let started = Instant::now();
        let transferred = if is_read {
            file.read_at(&mut buffer, offset)
        } else {
            file.write_at(&buffer, offset)
        }
        .with_context(|| {
            format!("{} at offset {offset}", if is_read { "read" } else { "write" })
        })?;
        let latency = started.elapsed();
        bytes_done += transferred as u64;
        let sides = (&mut *read, &mut *write);
        completed(instance, file, clock, sides, is_read, started, latency, transferred)?;
    }
}

/// After a request: the fsync cadence, and its figures if it started after
/// the ramp.
#[allow(clippy::too_many_arguments)]
fn completed(
    instance: &mut Instance<'_>,
    file: &dyn Target,
    clock: &Clock,
    (read, write): (&mut SideStats, &mut SideStats),
    is_read: bool,
    started: Instant,
    latency: Duration,
    transferred: usize,
) -> anyhow::Result<()> {
    if !is_read {
        instance.after_write(file)?;
    }
    if started >= clock.ramp_end {
        let side = if is_read { read } else { write };
        side.ios += 1;
        side.io_bytes += transferred as u64;
        side.latencies.record(latency);
    }
    Ok(())
}

type Pending =
    Pin<Box<dyn Future<Output = (AlignedBuf, foliofs::Result<usize>, bool, Instant, u64)>>>;

fn run_async(
    instance: &mut Instance<'_>,
    file: &dyn Target,
    clock: &Clock,
    read: &mut SideStats,
    write: &mut SideStats,
) -> anyhow::Result<()> {
    let block_bytes = instance.spec.block_bytes as usize;
    let mut in_flight: FuturesUnordered<Pending> = FuturesUnordered::new();
    // Offsets with a write in flight. Two overlapping writes in flight at
    // once may land in either order (on a device, and through FUSE, where
    // two serving threads can pass them on together), so with verify a
    // write never goes to a block that is still being written: fio's random
    // map keeps its writes apart the same way.
    let mut writing: HashSet<u64> = HashSet::new();
    let submit = |instance: &mut Instance<'_>,
                  writing: &mut HashSet<u64>,
                  mut buffer: AlignedBuf|
     -> Pending {
        let mut offset = instance.next_offset();
        let mut is_read = instance.next_is_read();
        if !is_read && instance.spec.verify {
            match instance.free_block_from(offset, writing) {
                Some(free) => offset = free,
                // Every block is being written (a file of fewer blocks
                // than the depth): read instead.
                None => is_read = true,
            }
        }
        if !is_read {
            writing.insert(offset);
        }
        let started = Instant::now();
        if is_read {
            let future = file.read_async(buffer, offset);
            Box::pin(async move {
                let (result, buffer) = future.await;
                (buffer, result, true, started, offset)
            })
        } else {
            instance.fill_for_write(&mut buffer, offset);
            let future = file.write_async(buffer, offset);
            Box::pin(async move {
                let (result, buffer) = future.await;
                (buffer, result, false, started, offset)
            })
        }
    };
    let mut submitted_bytes = 0u64;
    for _ in 0..instance.spec.iodepth {
        if clock.done(Instant::now(), submitted_bytes) {
            break;
        }
        let mut buffer = AlignedBuf::zeroed(block_bytes);
        buffer.fill(0xA5);
        in_flight.push(submit(instance, &mut writing, buffer));
        submitted_bytes += block_bytes as u64;
    }
    // Ends when the last request in flight completes; none is resubmitted
    // once the clock says done.
    foliofs::block_on(async {
        while let Some((buffer, result, is_read, started, offset)) = in_flight.next().await {
            if !is_read {
                writing.remove(&offset);
            }
            let transferred = result.with_context(|| {
                format!("{} at offset {offset}", if is_read { "read" } else { "write" })
            })?;
            let latency = started.elapsed();
            let sides = (&mut *read, &mut *write);
            completed(instance, file, clock, sides, is_read, started, latency, transferred)?;
            if !clock.done(Instant::now(), submitted_bytes) {
                in_flight.push(submit(instance, &mut writing, buffer));
                submitted_bytes += block_bytes as u64;
            }
        }
        anyhow::Ok(())
    })
}

/// Reads back every block the instance wrote and checks its crc32c.
fn verify(instance: &Instance<'_>, file: &dyn Target) -> anyhow::Result<u64> {
    let mut buffer = AlignedBuf::zeroed(instance.spec.block_bytes as usize);
    let mut offsets: Vec<(&u64, &u32)> = instance.written.iter().collect();
    offsets.sort_unstable();
    for (&offset, &expected) in offsets {
        let read = file
            .read_at(&mut buffer, offset)
            .with_context(|| format!("verify read at {offset}"))?;
        let found = crc32c::crc32c(&buffer[..read]);
        if read != buffer.len() || found != expected {
            bail!(
                "verify: crc32c mismatch in the block at offset {offset}: expected {expected:#010x}, \
                 read {found:#010x} ({read} bytes)"
            );
        }
    }
    Ok(instance.written.len() as u64)
}
