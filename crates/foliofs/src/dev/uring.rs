//! The `uring` engine (io_uring).
//!
//! Blocking calls use one small ring per calling thread: submit and wait in
//! one `io_uring_enter`, no hand-off to another thread. Asynchronous
//! `submit` uses one shared ring: submitters push under a lock, and a
//! completion thread waits on the ring, finishes each request (resubmitting
//! the rest of a short transfer) and runs its callback. FUA writes carry
//! RWF_DSYNC in the SQE's rw_flags, as QEMU does.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use parking_lot::Mutex;
use thread_local::ThreadLocal;

use super::file::FileDev;
use super::{DevCallback, DevOptions, DevRequest, DevResponse, RawDev};

/// Entries of each per-thread ring: blocking calls have one request in flight.
const THREAD_RING_ENTRIES: u32 = 4;
/// Completion queue entries of the shared ring, as a multiple of its
/// submission entries: many submitters may each have a full queue in flight.
const SHARED_RING_CQ_FACTOR: u32 = 16;
/// user_data of the no-op that tells the completion thread to stop.
const SHUTDOWN_KEY: u64 = u64::MAX;

pub(crate) struct UringDev {
    file: Arc<FileDev>,
    thread_rings: ThreadLocal<RefCell<IoUring>>,
    shared: Arc<SharedRing>,
    reaper: Option<JoinHandle<()>>,
}

/// The ring for asynchronous requests and what is in flight on it.
struct SharedRing {
    ring: IoUring,
    fd: RawFd,
    /// Serializes pushes to the submission queue.
    submit_lock: Mutex<()>,
    in_flight: Mutex<HashMap<u64, InFlight>>,
    next_key: AtomicU64,
}

/// An asynchronous request on the shared ring; owns its buffer, whose heap
/// memory stays put until the completion arrives.
struct InFlight {
    request: DevRequest,
    done: DevCallback,
    /// Bytes already transferred (short transfers are resubmitted).
    progress: usize,
}

fn setup_error(error: io::Error) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("io_uring is not available: {error}; use -o engine=threads"),
    )
}

impl UringDev {
    pub(crate) fn open(path: &Path, options: &DevOptions) -> io::Result<Self> {
        let file = Arc::new(FileDev::open(path, options)?);
        let entries = options.ring_entries.max(8).next_power_of_two();
        let ring = IoUring::builder()
            .setup_cqsize(entries * SHARED_RING_CQ_FACTOR)
            .build(entries)
            .map_err(setup_error)?;
        let shared = Arc::new(SharedRing {
            ring,
            fd: file.file().as_raw_fd(),
            submit_lock: Mutex::new(()),
            in_flight: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(0),
        });
        let reaper_ring = Arc::clone(&shared);
        let reaper = std::thread::Builder::new()
            .name("foliofs-uring-reaper".into())
            .spawn(move || reaper_ring.reap())?;
        Ok(Self { file, thread_rings: ThreadLocal::new(), shared, reaper: Some(reaper) })
    }

    /// Runs one SQE on the calling thread's ring and returns its result.
    fn run_on_thread_ring(&self, entry: squeue::Entry) -> io::Result<usize> {
        let cell = self
            .thread_rings
            .get_or_try(|| IoUring::new(THREAD_RING_ENTRIES).map(RefCell::new))
            .map_err(setup_error)?;
        let mut ring = cell.borrow_mut();
        // SAFETY: the entry's buffers are borrowed by our caller, which waits
        // below until the kernel has completed the request.
        unsafe { ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                Err(error) => return Err(error),
            }
        }
        let completion =
            ring.completion().next().ok_or_else(|| io::Error::other("io_uring: no completion"))?;
        result_bytes(completion.result())
    }
}

fn result_bytes(result: i32) -> io::Result<usize> {
    if result < 0 {
        Err(io::Error::from_raw_os_error(-result))
    } else {
        Ok(result as usize)
    }
}

impl RawDev for UringDev {
    fn read_at(&self, offset: u64, mut buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        let mut offset = offset;
        while !buffers.is_empty() {
            let count = buffers.len().min(1024) as u32;
            let entry =
                opcode::Readv::new(types::Fd(self.shared.fd), buffers.as_ptr().cast(), count)
                    .offset(offset)
                    .build();
            let read = self.run_on_thread_ring(entry)?;
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("end of device at offset {offset}"),
                ));
            }
            offset += read as u64;
            IoSliceMut::advance_slices(&mut buffers, read);
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        let mut owned: Vec<IoSlice<'_>> = buffers.to_vec();
        let mut buffers = &mut owned[..];
        let mut offset = offset;
        let flags = if fua { libc::RWF_DSYNC } else { 0 };
        while !buffers.is_empty() {
            let count = buffers.len().min(1024) as u32;
            let entry =
                opcode::Writev::new(types::Fd(self.shared.fd), buffers.as_ptr().cast(), count)
                    .offset(offset)
                    .rw_flags(flags)
                    .build();
            let written = self.run_on_thread_ring(entry)?;
            if written == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("no progress at offset {offset}"),
                ));
            }
            offset += written as u64;
            IoSlice::advance_slices(&mut buffers, written);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let entry = opcode::Fsync::new(types::Fd(self.shared.fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        self.run_on_thread_ring(entry).map(|_| ())
    }

    fn submit(&self, request: DevRequest, done: DevCallback) {
        self.shared.start(request, done);
    }

    fn size_bytes(&self) -> u64 {
        self.file.size_bytes()
    }

    fn logical_block_bytes(&self) -> u32 {
        self.file.logical_block_bytes()
    }
}

impl SharedRing {
    /// Registers `request` and pushes its first SQE.
    fn start(&self, request: DevRequest, done: DevCallback) {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let entry = self.entry_for(&request, 0).user_data(key);
        self.in_flight.lock().insert(key, InFlight { request, done, progress: 0 });
        self.push(entry);
    }

    /// The SQE for the part of `request` after `progress` bytes.
    fn entry_for(&self, request: &DevRequest, progress: usize) -> squeue::Entry {
        let fd = types::Fd(self.fd);
        match request {
            DevRequest::Read { offset, buffer } => {
                let remaining = (buffer.len() - progress) as u32;
                // The pointer stays valid: the buffer is owned by the in-flight
                // entry until its completion is handled.
                let pointer = buffer.as_ptr().wrapping_add(progress).cast_mut();
                opcode::Read::new(fd, pointer, remaining).offset(offset + progress as u64).build()
            }
            DevRequest::Write { offset, buffer, fua } => {
                let remaining = (buffer.len() - progress) as u32;
                let pointer = buffer.as_ptr().wrapping_add(progress);
                let flags = if *fua { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, pointer, remaining)
                    .offset(offset + progress as u64)
                    .rw_flags(flags)
                    .build()
            }
            DevRequest::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
        }
    }

    fn push(&self, entry: squeue::Entry) {
        let _exclusive = self.submit_lock.lock();
        loop {
            // SAFETY: submit_lock gives this thread exclusive use of the
            // submission queue; the entry's buffer is kept alive by its
            // in-flight record until the completion is handled.
            let pushed = unsafe { self.ring.submission_shared().push(&entry) }.is_ok();
            if pushed {
                break;
            }
            // Full: hand what is queued to the kernel, then retry.
            self.enter_submit();
        }
        self.enter_submit();
    }

    fn enter_submit(&self) {
        loop {
            match self.ring.submitter().submit() {
                Ok(_) => return,
                // The completion queue is full: the reaper drains it.
                Err(error)
                    if matches!(
                        error.raw_os_error(),
                        Some(libc::EBUSY | libc::EAGAIN | libc::EINTR)
                    ) =>
                {
                    std::thread::yield_now()
                }
                Err(error) => {
                    tracing::error!("io_uring submit failed: {error}");
                    return;
                }
            }
        }
    }

    /// The completion thread: waits for completions and finishes requests,
    /// until told to stop and nothing is left in flight.
    fn reap(&self) {
        let mut stopping = false;
        loop {
            if stopping && self.in_flight.lock().is_empty() {
                return;
            }
            match self.ring.submitter().submit_and_wait(1) {
                Ok(_) => {}
                Err(error)
                    if matches!(
                        error.raw_os_error(),
                        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(error) => {
                    tracing::error!("io_uring wait failed: {error}");
                    return;
                }
            }
            // SAFETY: only this thread reads the completion queue.
            let completions: Vec<cqueue::Entry> =
                unsafe { self.ring.completion_shared() }.collect();
            for completion in completions {
                if completion.user_data() == SHUTDOWN_KEY {
                    stopping = true;
                    continue;
                }
                self.complete(completion.user_data(), completion.result());
            }
        }
    }

    fn complete(&self, key: u64, result: i32) {
        let Some(mut in_flight) = self.in_flight.lock().remove(&key) else {
            tracing::error!("io_uring completion for unknown request {key}");
            return;
        };
        let total = match &in_flight.request {
            DevRequest::Read { buffer, .. } | DevRequest::Write { buffer, .. } => buffer.len(),
            DevRequest::Flush => 0,
        };
        let outcome = match result_bytes(result) {
            Err(error) => Err(error),
            Ok(0) if total > in_flight.progress => {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no progress: end of device"))
            }
            Ok(bytes) => {
                in_flight.progress += bytes;
                if in_flight.progress < total {
                    let entry =
                        self.entry_for(&in_flight.request, in_flight.progress).user_data(key);
                    self.in_flight.lock().insert(key, in_flight);
                    self.push(entry);
                    return;
                }
                Ok(())
            }
        };
        let buffer = match in_flight.request {
            DevRequest::Read { buffer, .. } | DevRequest::Write { buffer, .. } => Some(buffer),
            DevRequest::Flush => None,
        };
        (in_flight.done)(DevResponse { buffer, result: outcome });
    }
}

impl Drop for UringDev {
    fn drop(&mut self) {
        let stop = opcode::Nop::new().build().user_data(SHUTDOWN_KEY);
        self.shared.push(stop);
        if let Some(reaper) = self.reaper.take() {
            let _ = reaper.join();
        }
    }
}
