//! Block devices: the only layer that performs I/O on the image.
//!
//! A backend implements [`RawDev`] (blocking vectored read/write, flush, and an
//! asynchronous `submit`). Everything above uses [`Device`], which wraps a
//! backend with the FUA policy (`fua=native` passes the flag down as
//! RWF_DSYNC; `fua=emulate` issues the write and then a flush) and counts every
//! request, so benchmarks and tests can read exactly what reached the device.

mod aligned;
mod cow_image;
pub mod fault;
mod file;
pub mod nbd;
mod sys;
mod threads;
mod uring;

pub use aligned::{AlignedBuf, LentBytes, BUFFER_ALIGN_BYTES};
pub use fault::FaultDev;
pub(crate) use sys::{effective_ids, physical_memory_bytes, realtime_coarse_secs};

use std::io::{self, IoSlice, IoSliceMut};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// How a write that must be durable on completion reaches the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FuaMode {
    /// One write carrying RWF_DSYNC (io_uring rw_flags / pwritev2).
    #[default]
    Native,
    /// A plain write followed by a separate flush: two device requests.
    Emulate,
}

/// Which backend performs the I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// pread/pwritev2 in the calling thread; `submit` completes inline.
    Sync,
    /// Blocking calls as `Sync`; `submit` runs on a pool of worker threads.
    Threads,
    /// io_uring: one ring per calling thread for blocking calls, a shared ring
    /// with a completion thread for `submit`.
    #[default]
    Uring,
}

impl std::str::FromStr for FuaMode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "native" => Ok(Self::Native),
            "emulate" => Ok(Self::Emulate),
            other => Err(format!("fua must be native or emulate, not {other:?}")),
        }
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "sync" => Ok(Self::Sync),
            "threads" => Ok(Self::Threads),
            "uring" => Ok(Self::Uring),
            other => Err(format!("engine must be sync, threads or uring, not {other:?}")),
        }
    }
}

/// What a discard promises about the range afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardMode {
    /// The device may forget the blocks (TRIM, BLKDISCARD, a punched hole):
    /// reads return zeros or old data, whichever the device likes.
    Trim,
    /// Reads return zeros (WRITE_ZEROES, BLKZEROOUT, a zeroed range).
    Zero,
}

/// An asynchronous request; buffers are owned so they outlive the call.
#[derive(Debug)]
pub enum DevRequest {
    Read { offset: u64, buffer: AlignedBuf },
    Write { offset: u64, buffer: AlignedBuf, fua: bool },
    Flush,
}

/// What an asynchronous request hands back: its buffer (none for a flush) and
/// the outcome.
#[derive(Debug)]
pub struct DevResponse {
    pub buffer: Option<AlignedBuf>,
    pub result: io::Result<()>,
}

pub type DevCallback = Box<dyn FnOnce(DevResponse) + Send>;

/// A backend. Offsets and lengths are multiples of `logical_block_bytes`;
/// [`Device`] checks that before calling in.
pub trait RawDev: Send + Sync {
    /// Fills `buffers` from `offset`; reading past the end is an error.
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()>;
    /// Writes all of `buffers` at `offset`; with `fua` the data is durable when
    /// this returns.
    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Starts `request`; `done` runs exactly once, possibly on another thread,
    /// possibly before `submit` returns.
    fn submit(&self, request: DevRequest, done: DevCallback);
    /// Like `submit`, but the backend may hold the request until `unplug`
    /// (or its own completion loop) hands a batch to the kernel: one system
    /// call, and one device notification, for many requests.
    fn submit_plugged(&self, request: DevRequest, done: DevCallback) {
        self.submit(request, done)
    }
    /// Hands requests held by `submit_plugged` to the kernel.
    fn unplug(&self) {}
    /// Discards or zeroes `length` bytes at `offset`, as a plain write: a
    /// later flush makes it durable. `Unsupported` where the device cannot.
    fn discard(&self, offset: u64, length: u64, mode: DiscardMode) -> io::Result<()> {
        let _ = (offset, length, mode);
        Err(io::Error::new(io::ErrorKind::Unsupported, "the device cannot discard"))
    }
    fn size_bytes(&self) -> u64;
    fn logical_block_bytes(&self) -> u32;
    /// What surviving lost links took, for a device on a network link.
    fn link_stats(&self) -> Option<nbd::LinkStats> {
        None
    }
}

/// Counters of what reached the backend.
#[derive(Debug, Default)]
struct Counters {
    read_requests: AtomicU64,
    write_requests: AtomicU64,
    flush_requests: AtomicU64,
    fua_writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    discard_requests: AtomicU64,
    bytes_discarded: AtomicU64,
    /// Reads and writes handed to the backend and not yet completed.
    in_flight: AtomicU64,
    in_flight_peak: AtomicU64,
}

impl Counters {
    /// Counts a read or write in as it is handed to the backend; `leave`
    /// counts it out when it completes (when its callback runs, for a
    /// submitted one).
    fn enter(&self) {
        let in_flight = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.in_flight_peak.fetch_max(in_flight, Ordering::Relaxed);
    }

    fn leave(&self) {
        let before = self.in_flight.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "a request counted out that was never counted in");
    }
}

/// A snapshot of the device counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevStats {
    pub read_requests: u64,
    pub write_requests: u64,
    pub flush_requests: u64,
    /// Writes sent with the FUA flag (only with `fua=native`).
    pub fua_writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Discards and zeroings (TRIM / WRITE_ZEROES, punched holes) that the
    /// device carried out.
    pub discard_requests: u64,
    pub bytes_discarded: u64,
    /// The most reads and writes in flight at once since the device was
    /// opened, blocking and submitted ones alike: the queue depth the
    /// engine's callers reached.
    pub in_flight_peak: u64,
}

impl DevStats {
    pub fn requests(&self) -> u64 {
        self.read_requests + self.write_requests + self.flush_requests + self.discard_requests
    }

    /// Counter-wise difference `self - earlier`.
    pub fn since(&self, earlier: &DevStats) -> DevStats {
        DevStats {
            read_requests: self.read_requests - earlier.read_requests,
            write_requests: self.write_requests - earlier.write_requests,
            flush_requests: self.flush_requests - earlier.flush_requests,
            fua_writes: self.fua_writes - earlier.fua_writes,
            bytes_read: self.bytes_read - earlier.bytes_read,
            bytes_written: self.bytes_written - earlier.bytes_written,
            discard_requests: self.discard_requests - earlier.discard_requests,
            bytes_discarded: self.bytes_discarded - earlier.bytes_discarded,
            // A high-water mark, not a count: the later one covers both.
            in_flight_peak: self.in_flight_peak,
        }
    }
}

/// Options for opening an image file or block device.
#[derive(Debug, Clone)]
pub struct DevOptions {
    pub engine: EngineKind,
    pub fua: FuaMode,
    /// Open with O_DIRECT (the default). Off only for backing file systems
    /// without O_DIRECT support (tmpfs before 6.6); then writes sit in the
    /// host page cache until flush.
    pub direct: bool,
    pub read_only: bool,
    /// Worker threads of the `threads` engine.
    pub worker_threads: usize,
    /// Entries of each io_uring submission queue.
    pub ring_entries: u32,
}

impl Default for DevOptions {
    fn default() -> Self {
        Self {
            engine: EngineKind::default(),
            fua: FuaMode::default(),
            direct: true,
            read_only: false,
            worker_threads: 8,
            ring_entries: 256,
        }
    }
}

/// Flush bookkeeping: which plain writes a completed flush covers.
///
/// Every plain write bumps `dirty_generation` when it completes. A flush
/// notes the generation when it starts; once it succeeds every write with a
/// generation up to that is durable. `flush_if_needed` waits for a flush
/// already in flight only when that flush covers the caller's writes, and
/// otherwise issues its own at once: concurrent fsyncs share the flushes
/// that cover them (QEMU's flush once per write generation) and never queue
/// behind one that does not, leaving the rest of the merging to the block
/// layer (the kernel's fdatasync issues its flush at once too). With at
/// most one flush in flight, seed 001's 8 syncers each waited out the flush
/// before their own too, at about two thirds of the IOPS.
#[derive(Default)]
struct FlushTracker {
    dirty_generation: AtomicU64,
    state: parking_lot::Mutex<FlushState>,
    finished: parking_lot::Condvar,
}

#[derive(Default)]
struct FlushState {
    durable_generation: u64,
    /// The generation each flush in flight covers once it succeeds.
    in_flight_generations: Vec<u64>,
}

impl FlushState {
    fn in_flight_covers(&self, generation: u64) -> bool {
        self.in_flight_generations.iter().any(|&in_flight| in_flight >= generation)
    }
}

impl FlushTracker {
    fn write_completed(&self) {
        self.dirty_generation.fetch_add(1, Ordering::AcqRel);
    }

    fn generation(&self) -> u64 {
        self.dirty_generation.load(Ordering::Acquire)
    }

    /// Registers a flush about to be issued; returns the generation it covers.
    fn start(&self) -> u64 {
        let mut state = self.state.lock();
        // Read under the lock, so a waiter that finds this flush in flight
        // knows what it covers.
        let generation = self.generation();
        // Generations only grow: no flush done covers more than this one.
        debug_assert!(generation >= state.durable_generation);
        state.in_flight_generations.push(generation);
        generation
    }

    /// Records a finished flush and wakes the callers waiting for it.
    fn finish(&self, generation: u64, succeeded: bool) {
        let mut state = self.state.lock();
        let index =
            state.in_flight_generations.iter().position(|&in_flight| in_flight == generation);
        debug_assert!(index.is_some(), "a flush of generation {generation} finished unstarted");
        if let Some(index) = index {
            state.in_flight_generations.swap_remove(index);
        }
        if succeeded {
            state.durable_generation = state.durable_generation.max(generation);
        }
        self.finished.notify_all();
    }
}

/// The device handle every layer above uses.
pub struct Device {
    raw: Arc<dyn RawDev>,
    fua: FuaMode,
    logical_block_bytes: u32,
    counters: Arc<Counters>,
    flushes: Arc<FlushTracker>,
    /// Set by [`Device::shut_down`]: every later request fails EIO.
    shut_down: Arc<AtomicBool>,
}

/// The error of a request made after [`Device::shut_down`].
fn shut_down_error() -> io::Error {
    io::Error::other("the volume was shut down: no more I/O reaches the device")
}

impl Device {
    pub fn new(raw: Arc<dyn RawDev>, fua: FuaMode) -> Self {
        let logical_block_bytes = raw.logical_block_bytes();
        assert!(logical_block_bytes.is_power_of_two());
        Self {
            raw,
            fua,
            logical_block_bytes,
            counters: Arc::default(),
            flushes: Arc::default(),
            shut_down: Arc::default(),
        }
    }

    /// Stops all I/O: every request made from now on fails (EIO) without
    /// reaching the backend, as after XFS_IOC_GOINGDOWN. Requests already
    /// handed to the backend finish as they would have. There is no way
    /// back: the volume is opened again to go on.
    pub fn shut_down(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
    }

    /// Whether [`Device::shut_down`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    fn check_running(&self) -> io::Result<()> {
        if self.is_shut_down() {
            return Err(shut_down_error());
        }
        Ok(())
    }

    /// Opens an image file or block device, or an NBD export named by its
    /// URI (`nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`).
    pub fn open(path: &Path, options: &DevOptions) -> io::Result<Self> {
        if let Some(uri) = path.to_str().filter(|_| nbd::is_nbd_uri(path)) {
            return Ok(Self::new(Arc::new(nbd::NbdDev::open(uri, options)?), options.fua));
        }
        let raw: Arc<dyn RawDev> = match options.engine {
            EngineKind::Sync => Arc::new(file::FileDev::open(path, options)?),
            EngineKind::Threads => Arc::new(threads::ThreadsDev::open(path, options)?),
            EngineKind::Uring => Arc::new(uring::UringDev::open(path, options)?),
        };
        Ok(Self::new(raw, options.fua))
    }

    pub fn logical_block_bytes(&self) -> u32 {
        self.logical_block_bytes
    }

    pub fn size_bytes(&self) -> u64 {
        self.raw.size_bytes()
    }

    pub fn fua_mode(&self) -> FuaMode {
        self.fua
    }

    /// What surviving lost links took, where the device is on NBD.
    pub fn link_stats(&self) -> Option<nbd::LinkStats> {
        self.raw.link_stats()
    }

    pub fn stats(&self) -> DevStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        DevStats {
            read_requests: load(&counters.read_requests),
            write_requests: load(&counters.write_requests),
            flush_requests: load(&counters.flush_requests),
            fua_writes: load(&counters.fua_writes),
            bytes_read: load(&counters.bytes_read),
            bytes_written: load(&counters.bytes_written),
            discard_requests: load(&counters.discard_requests),
            bytes_discarded: load(&counters.bytes_discarded),
            in_flight_peak: load(&counters.in_flight_peak),
        }
    }

    fn check_aligned(&self, offset: u64, length: usize) -> io::Result<()> {
        self.check_range(offset, length as u64)
    }

    fn check_range(&self, offset: u64, length: u64) -> io::Result<()> {
        let mask = u64::from(self.logical_block_bytes) - 1;
        if offset & mask != 0 || length & mask != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "device request at {offset} of {length} bytes is not aligned to the logical \
                     block size {}",
                    self.logical_block_bytes
                ),
            ));
        }
        let end = offset.checked_add(length);
        if end.is_none_or(|end| end > self.raw.size_bytes()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "device request at {offset} of {length} bytes passes the end of the device"
                ),
            ));
        }
        Ok(())
    }

    pub fn read(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()> {
        self.read_vectored(offset, &mut [IoSliceMut::new(buffer)])
    }

    pub fn read_vectored(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        let length: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        self.check_running()?;
        self.check_aligned(offset, length)?;
        self.counters.read_requests.fetch_add(1, Ordering::Relaxed);
        self.counters.enter();
        let read = self.raw.read_at(offset, buffers);
        self.counters.leave();
        read?;
        self.counters.bytes_read.fetch_add(length as u64, Ordering::Relaxed);
        Ok(())
    }

    pub fn write(&self, offset: u64, buffer: &[u8], fua: bool) -> io::Result<()> {
        self.write_vectored(offset, &[IoSlice::new(buffer)], fua)
    }

    /// Writes `buffers` at `offset`; with `fua` the data is durable on return
    /// (one request with `fua=native`, a write and a flush with `emulate`).
    pub fn write_vectored(
        &self,
        offset: u64,
        buffers: &[IoSlice<'_>],
        fua: bool,
    ) -> io::Result<()> {
        let length: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        self.check_running()?;
        self.check_aligned(offset, length)?;
        let native_fua = fua && self.fua == FuaMode::Native;
        self.count_write(native_fua);
        self.counters.enter();
        let written = self.raw.write_at(offset, buffers, native_fua);
        self.counters.leave();
        written?;
        self.counters.bytes_written.fetch_add(length as u64, Ordering::Relaxed);
        if !native_fua {
            self.flushes.write_completed();
        }
        if fua && !native_fua {
            self.flush()?;
        }
        Ok(())
    }

    fn count_write(&self, native_fua: bool) {
        self.counters.write_requests.fetch_add(1, Ordering::Relaxed);
        if native_fua {
            self.counters.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Discards or zeroes `length` bytes at `offset` (see
    /// [`RawDev::discard`]); counted only when the device did it. Like a
    /// plain write it is durable after the next flush, so it joins the
    /// writes that [`Device::flush_if_needed`] covers.
    pub fn discard(&self, offset: u64, length: u64, mode: DiscardMode) -> io::Result<()> {
        self.check_range(offset, length)?;
        if length == 0 {
            return Ok(());
        }
        self.raw.discard(offset, length, mode)?;
        self.counters.discard_requests.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_discarded.fetch_add(length, Ordering::Relaxed);
        self.flushes.write_completed();
        Ok(())
    }

    /// Issues a flush: every write completed before the call is durable
    /// when it returns Ok.
    pub fn flush(&self) -> io::Result<()> {
        self.check_running()?;
        let generation = self.flushes.start();
        self.counters.flush_requests.fetch_add(1, Ordering::Relaxed);
        let result = self.raw.flush();
        self.flushes.finish(generation, result.is_ok());
        result
    }

    /// Makes every plain write completed before the call durable, issuing a
    /// flush only when no flush already done or in flight covers them: a
    /// flush in flight that covers them is waited for, otherwise one is
    /// issued at once (see [`FlushTracker`]). Returns whether this call
    /// issued one.
    pub fn flush_if_needed(&self) -> io::Result<bool> {
        let wanted = self.flushes.generation();
        let mut state = self.flushes.state.lock();
        loop {
            if state.durable_generation >= wanted {
                return Ok(false);
            }
            if !state.in_flight_covers(wanted) {
                break;
            }
            // It may fail: then look again, and flush if still needed.
            self.flushes.finished.wait(&mut state);
        }
        drop(state);
        self.flush().map(|()| true)
    }

    /// Asynchronous form of read/write/flush; `done` runs exactly once.
    /// (Unboxed: a read or write boxes it once, with the device's own
    /// accounting, for the backend.)
    pub fn submit(&self, request: DevRequest, done: impl FnOnce(DevResponse) + Send + 'static) {
        self.submit_with(request, done, false)
    }

    /// Asynchronous read or write that the backend may hold for a batch
    /// until [`Device::unplug`] (the kernel's block plug, for io_uring: one
    /// `io_uring_enter` for many requests). Callers unplug before they wait.
    pub fn submit_plugged(
        &self,
        request: DevRequest,
        done: impl FnOnce(DevResponse) + Send + 'static,
    ) {
        self.submit_with(request, done, true)
    }

    /// Hands every plugged request to the kernel.
    pub fn unplug(&self) {
        self.raw.unplug()
    }

    fn raw_submit(&self, request: DevRequest, done: DevCallback, plugged: bool) {
        if plugged {
            self.raw.submit_plugged(request, done)
        } else {
            self.raw.submit(request, done)
        }
    }

    fn submit_with<F>(&self, request: DevRequest, done: F, plugged: bool)
    where
        F: FnOnce(DevResponse) + Send + 'static,
    {
        if let Err(error) = self.check_running() {
            return done(DevResponse { buffer: take_buffer(request), result: Err(error) });
        }
        let (offset, length) = match &request {
            DevRequest::Read { offset, buffer } | DevRequest::Write { offset, buffer, .. } => {
                (*offset, buffer.len())
            }
            DevRequest::Flush => return self.submit_flush(Box::new(done)),
        };
        if let Err(error) = self.check_aligned(offset, length) {
            return done(DevResponse { buffer: take_buffer(request), result: Err(error) });
        }
        match request {
            DevRequest::Read { .. } => self.submit_read(request, length, done, plugged),
            DevRequest::Write { offset, buffer, fua } => {
                let native_fua = fua && self.fua == FuaMode::Native;
                let request = DevRequest::Write { offset, buffer, fua: native_fua };
                self.submit_write(request, fua && !native_fua, done, plugged)
            }
            DevRequest::Flush => unreachable!("handled above"),
        }
    }

    fn submit_read<F>(&self, request: DevRequest, length: usize, done: F, plugged: bool)
    where
        F: FnOnce(DevResponse) + Send + 'static,
    {
        self.counters.read_requests.fetch_add(1, Ordering::Relaxed);
        self.counters.enter();
        let counters = Arc::clone(&self.counters);
        self.raw_submit(
            request,
            Box::new(move |response| {
                counters.leave();
                if response.result.is_ok() {
                    counters.bytes_read.fetch_add(length as u64, Ordering::Relaxed);
                }
                done(response)
            }),
            plugged,
        );
    }

    fn submit_write<F>(&self, request: DevRequest, emulate_fua: bool, done: F, plugged: bool)
    where
        F: FnOnce(DevResponse) + Send + 'static,
    {
        let DevRequest::Write { buffer, fua: native_fua, .. } = &request else {
            unreachable!("submit_write takes writes")
        };
        let native_fua = *native_fua;
        let length = buffer.len() as u64;
        self.count_write(native_fua);
        self.counters.enter();
        let counters = Arc::clone(&self.counters);
        let flushes = Arc::clone(&self.flushes);
        let flusher = emulate_fua.then(|| self.flush_submitter());
        self.raw_submit(
            request,
            Box::new(move |response| {
                counters.leave();
                if response.result.is_err() {
                    return done(response);
                }
                counters.bytes_written.fetch_add(length, Ordering::Relaxed);
                if !native_fua {
                    flushes.write_completed();
                }
                match flusher {
                    None => done(response),
                    Some(flush) => flush(Box::new(move |flushed: DevResponse| {
                        done(DevResponse { buffer: response.buffer, result: flushed.result })
                    })),
                }
            }),
            plugged,
        );
    }

    fn submit_flush(&self, done: DevCallback) {
        (self.flush_submitter())(done)
    }

    /// A closure that submits a counted, tracked flush; FUA emulation chains
    /// it after the write's completion, possibly on a backend thread.
    fn flush_submitter(&self) -> impl FnOnce(DevCallback) + Send + 'static {
        let raw = Arc::clone(&self.raw);
        let counters = Arc::clone(&self.counters);
        let flushes = Arc::clone(&self.flushes);
        let shut_down = Arc::clone(&self.shut_down);
        move |done: DevCallback| {
            // FUA emulation's flush follows its write, which may have been
            // in flight when the device was shut down.
            if shut_down.load(Ordering::SeqCst) {
                return done(DevResponse { buffer: None, result: Err(shut_down_error()) });
            }
            let generation = flushes.start();
            counters.flush_requests.fetch_add(1, Ordering::Relaxed);
            raw.submit(
                DevRequest::Flush,
                Box::new(move |response| {
                    flushes.finish(generation, response.result.is_ok());
                    done(response)
                }),
            )
        }
    }
}

fn take_buffer(request: DevRequest) -> Option<AlignedBuf> {
    match request {
        DevRequest::Read { buffer, .. } | DevRequest::Write { buffer, .. } => Some(buffer),
        DevRequest::Flush => None,
    }
}

/// Runs `request` with the blocking calls of `raw`; backends without a real
/// asynchronous path (and the fault injector) use it for `submit`.
pub(crate) fn run_blocking(raw: &dyn RawDev, request: DevRequest) -> DevResponse {
    match request {
        DevRequest::Read { offset, mut buffer } => {
            let result = raw.read_at(offset, &mut [IoSliceMut::new(&mut buffer)]);
            DevResponse { buffer: Some(buffer), result }
        }
        DevRequest::Write { offset, buffer, fua } => {
            let result = raw.write_at(offset, &[IoSlice::new(&buffer)], fua);
            DevResponse { buffer: Some(buffer), result }
        }
        DevRequest::Flush => DevResponse { buffer: None, result: raw.flush() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::{Condvar, Mutex};
    use std::time::Duration;

    /// A device whose flushes block until the test lets them finish, in
    /// the order they were issued, each with the outcome it is given.
    #[derive(Default)]
    struct GatedDev {
        state: Mutex<Gate>,
        changed: Condvar,
    }

    #[derive(Default)]
    struct Gate {
        flushes_entered: usize,
        /// Outcomes handed out so far: flush `i` returns `outcomes[i]`.
        outcomes: Vec<bool>,
    }

    /// Long enough never to pass on a loaded machine; only a wrong
    /// implementation waits this long.
    const PATIENCE: Duration = Duration::from_secs(30);

    impl GatedDev {
        fn wait_for_flushes_entered(&self, count: usize) {
            let mut state = self.state.lock();
            while state.flushes_entered < count {
                let waited = self.changed.wait_for(&mut state, PATIENCE);
                assert!(!waited.timed_out(), "{count} flushes never reached the device");
            }
        }

        fn finish_next_flush(&self, succeeded: bool) {
            self.state.lock().outcomes.push(succeeded);
            self.changed.notify_all();
        }

        fn flushes_entered(&self) -> usize {
            self.state.lock().flushes_entered
        }
    }

    impl RawDev for GatedDev {
        fn read_at(&self, _offset: u64, _buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
            Ok(())
        }
        fn write_at(&self, _offset: u64, _buffers: &[IoSlice<'_>], _fua: bool) -> io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            let mut state = self.state.lock();
            let index = state.flushes_entered;
            state.flushes_entered += 1;
            self.changed.notify_all();
            while state.outcomes.len() <= index {
                self.changed.wait(&mut state);
            }
            if state.outcomes[index] {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
        fn submit(&self, request: DevRequest, done: DevCallback) {
            done(run_blocking(self, request))
        }
        fn size_bytes(&self) -> u64 {
            1 << 20
        }
        fn logical_block_bytes(&self) -> u32 {
            512
        }
    }

    fn gated_device() -> (Arc<GatedDev>, Arc<Device>) {
        let raw = Arc::new(GatedDev::default());
        let device = Arc::new(Device::new(Arc::clone(&raw) as Arc<dyn RawDev>, FuaMode::Native));
        (raw, device)
    }

    fn flush_on_thread(device: &Arc<Device>) -> std::thread::JoinHandle<io::Result<bool>> {
        let device = Arc::clone(device);
        std::thread::spawn(move || device.flush_if_needed())
    }

    #[test]
    fn a_syncer_whose_writes_the_flush_in_flight_misses_flushes_at_once() {
        let (raw, device) = gated_device();
        device.write(0, &[1; 512], false).unwrap();
        let first = flush_on_thread(&device);
        raw.wait_for_flushes_entered(1);
        // Completed after the first flush started: it does not cover this.
        device.write(512, &[2; 512], false).unwrap();
        let second = flush_on_thread(&device);
        // Without waiting for the first one to end.
        raw.wait_for_flushes_entered(2);
        raw.finish_next_flush(true);
        raw.finish_next_flush(true);
        assert!(first.join().unwrap().unwrap());
        assert!(second.join().unwrap().unwrap());
        assert!(!device.flush_if_needed().unwrap(), "both writes are durable");
        assert_eq!(device.stats().flush_requests, 2);
    }

    #[test]
    fn a_syncer_whose_writes_the_flush_in_flight_covers_shares_it() {
        let (raw, device) = gated_device();
        device.write(0, &[1; 512], false).unwrap();
        let first = flush_on_thread(&device);
        raw.wait_for_flushes_entered(1);
        let second = flush_on_thread(&device);
        raw.finish_next_flush(true);
        assert!(first.join().unwrap().unwrap());
        assert!(!second.join().unwrap().unwrap(), "the first flush covered it");
        assert_eq!(raw.flushes_entered(), 1);
    }

    #[test]
    fn a_syncer_sharing_a_flush_that_fails_flushes_again() {
        let (raw, device) = gated_device();
        device.write(0, &[1; 512], false).unwrap();
        let first = flush_on_thread(&device);
        raw.wait_for_flushes_entered(1);
        let second = flush_on_thread(&device);
        raw.finish_next_flush(false);
        assert!(first.join().unwrap().is_err());
        raw.wait_for_flushes_entered(2);
        raw.finish_next_flush(true);
        assert!(second.join().unwrap().unwrap(), "it issued its own flush");
        assert!(!device.flush_if_needed().unwrap());
    }
}
