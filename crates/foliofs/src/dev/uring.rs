//! The `uring` engine.
//!
//! Blocking reads use a private ring per calling thread: one SQE, one
//! `io_uring_enter` that submits it and waits, no locks. Blocking writes and
//! flushes are the plain syscalls (`pwritev2`, `fdatasync`) in the calling
//! thread: io_uring would run them on a worker thread (see `write_at`).
//!
//! Asynchronous requests go to the submitting thread's *home ring*. When that
//! thread waits (in `completion::block_on`), it waits inside the ring and runs
//! the completions itself: no hand-off between threads, as fio runs its
//! queues. Completions nobody is waiting for wake the sweeper thread through
//! the ring's eventfd, which the waiting owner turns off while it waits. An
//! owner that sleeps in an event loop of its own (a FUSE ring thread) may
//! poll that eventfd there instead (`completion::prepare_to_wait`): while it
//! sleeps the sweeper leaves the ring to it, and takes it back when it wakes.
//! `submit_plugged` holds entries until the submitter unplugs or waits, so a
//! thread that queues many requests hands them to the kernel in one call.
//!
//! A ring never holds more requests than its completion queue has slots;
//! requests beyond that wait in a backlog fed in as completions free room.
//! `submit` therefore never blocks, which matters because callbacks may
//! submit (FUA emulation chains a flush that way).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::Mutex;
use thread_local::ThreadLocal;

use crate::completion::{self, Driver};

use super::file::FileDev;
use super::sys::{self, Direction, MAX_IOVECS};
use super::threads::call_completion;
use super::{AlignedBuf, DevCallback, DevOptions, DevRequest, DevResponse, RawDev};

/// Most bytes one read or write SQE carries: the length field is 32 bits
/// and the kernel stops a transfer short of 2 GiB anyway. A large power of
/// two, so the continuation of a capped transfer stays block-aligned.
const MAX_SQE_BYTES: usize = 1 << 30;
const _: () = assert!(MAX_SQE_BYTES.is_power_of_two() && MAX_SQE_BYTES <= u32::MAX as usize);

/// Most submission queue entries the kernel accepts (IORING_MAX_ENTRIES).
const MAX_RING_ENTRIES: u32 = 32768;

/// Pause before retrying an `io_uring_enter` that failed while requests are
/// in flight: they cannot be abandoned, but a persistent error must not spin.
const ENTER_RETRY_PAUSE: Duration = Duration::from_millis(1);

/// Entries of a blocking call's private ring: it holds one request at a time.
const THREAD_RING_ENTRIES: u32 = 4;
const _: () = assert!(THREAD_RING_ENTRIES >= 1 && THREAD_RING_ENTRIES <= MAX_RING_ENTRIES);

pub(crate) struct UringDev {
    file: Arc<FileDev>,
    ring_entries: u32,
    /// Private rings of the threads that made blocking calls; `None` until a
    /// thread's first call, and again after its ring broke.
    thread_rings: ThreadLocal<RefCell<Option<IoUring>>>,
    /// Each submitting thread's ring for asynchronous requests.
    home_rings: ThreadLocal<Arc<HomeRing>>,
    sweeper: Arc<Sweeper>,
    sweeper_thread: Option<JoinHandle<()>>,
}

/// Creates a ring, saying what to do when the kernel refuses one (no
/// io_uring, `kernel.io_uring_disabled`, a seccomp filter, memlock limits).
fn new_ring(ring_entries: u32) -> io::Result<IoUring> {
    IoUring::new(ring_entries).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!("io_uring is not available: {error}; use -o engine=threads"),
        )
    })
}

/// Maps a CQE result: a negative errno, or the bytes transferred.
fn completion_bytes(result: i32) -> io::Result<usize> {
    usize::try_from(result).map_err(|_| io::Error::from_raw_os_error(result.wrapping_neg()))
}

impl UringDev {
    pub(crate) fn open(path: &Path, options: &DevOptions) -> io::Result<Self> {
        let ring_entries = options.ring_entries;
        if !(1..=MAX_RING_ENTRIES).contains(&ring_entries) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "ring_entries must be between 1 and {MAX_RING_ENTRIES}, not {ring_entries}"
                ),
            ));
        }
        let file = Arc::new(FileDev::open(path, options)?);
        // Fail now, not at the first request, when io_uring is unavailable.
        drop(new_ring(THREAD_RING_ENTRIES)?);
        let sweeper = Arc::new(Sweeper::new()?);
        let sweeper_thread =
            thread::Builder::new().name("foliofs-uring-sweeper".to_owned()).spawn({
                let sweeper = Arc::clone(&sweeper);
                move || sweeper.run()
            })?;
        Ok(Self {
            file,
            ring_entries,
            thread_rings: ThreadLocal::new(),
            home_rings: ThreadLocal::new(),
            sweeper,
            sweeper_thread: Some(sweeper_thread),
        })
    }

    fn fd(&self) -> types::Fd {
        types::Fd(self.file.file().as_raw_fd())
    }

    /// Runs `entry` on the calling thread's ring and returns its CQE result.
    ///
    /// # Safety
    ///
    /// Every buffer (and iovec array) `entry` points to must stay valid, and
    /// not be accessed elsewhere where the kernel writes, until this returns.
    unsafe fn run_on_thread_ring(&self, entry: &squeue::Entry) -> io::Result<i32> {
        let mut slot = self.thread_rings.get_or_default().borrow_mut();
        let mut ring = match slot.take() {
            Some(ring) => ring,
            None => new_ring(THREAD_RING_ENTRIES)?,
        };
        // SAFETY: forwarded from this function's contract.
        let result = unsafe { complete_entry(&mut ring, entry) }?;
        // An error above drops the ring with the entry never submitted, so it
        // can never reach the kernel after the buffers are gone.
        debug_assert!(ring.submission().is_empty(), "a private ring kept a submitted entry");
        debug_assert!(ring.completion().is_empty(), "a private ring holds one request at a time");
        *slot = Some(ring);
        Ok(result)
    }

    /// One readv of (at most [`MAX_IOVECS`] of) `buffers`.
    fn readv_once(&self, buffers: &mut [IoSliceMut<'_>], offset_bytes: u64) -> io::Result<usize> {
        let count = buffers.len().min(MAX_IOVECS);
        assert!(count > 0, "a readv of no buffers");
        let buffers = &mut buffers[..count];
        // IoSliceMut is documented to be ABI-compatible with iovec on Unix.
        let iovecs = buffers.as_ptr().cast::<libc::iovec>();
        let entry = opcode::Readv::new(self.fd(), iovecs, buffers.len() as u32)
            .offset(offset_bytes)
            .build();
        // SAFETY: the iovecs and the memory they describe are borrowed (the
        // memory mutably) for this whole call, and run_on_thread_ring returns
        // only once the kernel is done with them.
        completion_bytes(unsafe { self.run_on_thread_ring(&entry) }?)
    }
}

/// Pushes `entry` to an idle private ring, submits it and waits for its CQE;
/// returns the CQE's result.
///
/// An `Err` means the entry never reached the kernel but is still queued in
/// the ring: the caller must drop the ring, not reuse it.
///
/// # Safety
///
/// As [`UringDev::run_on_thread_ring`]: this returns only after the CQE, or
/// with the entry unsubmitted.
unsafe fn complete_entry(ring: &mut IoUring, entry: &squeue::Entry) -> io::Result<i32> {
    // SAFETY: the caller keeps the buffers valid until we return, and we
    // return only once the kernel has completed the entry (or never got it).
    unsafe { ring.submission().push(entry) }
        .map_err(|_| io::Error::other("a private io_uring submission queue is full"))?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) if !ring.submission().is_empty() => return Err(error),
            Err(error) => {
                // The entry is in flight and its buffers in use: wait it out.
                tracing::warn!(%error, "io_uring_enter failed with a request in flight; retrying");
                thread::sleep(ENTER_RETRY_PAUSE);
            }
        }
        if let Some(completion) = ring.completion().next() {
            return Ok(completion.result());
        }
    }
}

impl RawDev for UringDev {
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        sys::read_exact_at(buffers, offset, |buffers, offset_bytes| {
            self.readv_once(buffers, offset_bytes)
        })
    }

    /// A blocking write is the plain syscall in the calling thread: through
    /// a ring, a write that must update the file's times (nearly every one)
    /// cannot complete without blocking, so io_uring hands it to one of its
    /// worker threads, and the caller waits for that hop as well as for the
    /// device. Seed 001 (4 KiB overwrites + fdatasync, 8 jobs) ran at
    /// 1.5-1.9x the IOPS without it.
    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        self.file.write_at(offset, buffers, fua)
    }

    /// fdatasync(2) in the calling thread, for the same reason: a ring's
    /// fsync always runs on an io_uring worker thread.
    fn flush(&self) -> io::Result<()> {
        self.file.flush()
    }

    fn submit(&self, request: DevRequest, done: DevCallback) {
        self.start(request, done, false);
    }

    fn submit_plugged(&self, request: DevRequest, done: DevCallback) {
        self.start(request, done, true);
    }

    /// Unplugs the calling thread's ring first, then any other ring still
    /// plugged: a future may be polled on another thread than its submitter.
    fn unplug(&self) {
        if let Some(ring) = self.home_rings.get() {
            if ring.unplug() {
                let before = self.sweeper.plugged_rings.fetch_sub(1, Ordering::AcqRel);
                debug_assert!(before > 0, "a plugged ring the count left out");
            }
        }
        self.sweeper.unplug_all();
    }

    fn discard(&self, offset: u64, length: u64, mode: super::DiscardMode) -> io::Result<()> {
        self.file.discard(offset, length, mode)
    }

    fn size_bytes(&self) -> u64 {
        self.file.size_bytes()
    }

    fn logical_block_bytes(&self) -> u32 {
        self.file.logical_block_bytes()
    }
}

impl Drop for UringDev {
    fn drop(&mut self) {
        // Requests in flight still point into their buffers: finish them here
        // before any ring goes away.
        self.sweeper.closing.store(true, Ordering::Release);
        for ring in self.sweeper.rings() {
            ring.unplug();
            while ring.has_work() {
                ring.drive();
            }
        }
        sys::eventfd_signal(self.sweeper.stop.as_fd());
        let Some(sweeper) = self.sweeper_thread.take() else { return };
        // The last reference can go away inside a completion callback on the
        // sweeper, which cannot join itself; it exits on its own.
        if sweeper.thread().id() == thread::current().id() {
            return;
        }
        if sweeper.join().is_err() {
            tracing::error!("the io_uring sweeper thread panicked");
        }
    }
}

impl UringDev {
    /// The calling thread's ring for asynchronous requests, created on first
    /// use and registered as the thread's [`Driver`].
    ///
    /// `ThreadLocal` recycles the slot of an exited thread, so a new thread
    /// can find a ring it never registered: registration is therefore keyed
    /// by a token no thread ever reuses, not by finding the slot empty.
    fn home_ring(&self) -> io::Result<&Arc<HomeRing>> {
        let ring = self.home_rings.get_or_try(|| {
            let ring =
                Arc::new(HomeRing::new(new_ring(self.ring_entries)?, Arc::clone(&self.file))?);
            self.sweeper.watch(&ring)?;
            Ok::<_, io::Error>(ring)
        })?;
        let token = thread_token();
        // Only the thread owning the slot reads or writes `driver_thread`.
        if ring.driver_thread.load(Ordering::Relaxed) != token {
            let driver: Arc<dyn Driver> = ring.clone();
            completion::register_thread_driver(Arc::downgrade(&driver));
            ring.driver_thread.store(token, Ordering::Relaxed);
        }
        Ok(ring)
    }

    fn start(&self, request: DevRequest, done: DevCallback, plugged: bool) {
        match self.home_ring() {
            Ok(ring) => ring.start(Pending::new(request, done), plugged, &self.sweeper),
            Err(error) => {
                let buffer = match request {
                    DevRequest::Read { buffer, .. } | DevRequest::Write { buffer, .. } => {
                        Some(buffer)
                    }
                    DevRequest::Flush => None,
                };
                call_completion(done, DevResponse { buffer, result: Err(error) });
            }
        }
    }
}

/// A number naming the calling thread, never reused by a later thread (0 is
/// never one).
fn thread_token() -> u64 {
    static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: u64 = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    }
    let token = TOKEN.with(|token| *token);
    debug_assert_ne!(token, 0, "0 names no thread");
    token
}

/// An io_uring ring for the asynchronous requests of one submitting thread.
///
/// The thread that submitted waits for and runs the completions itself when
/// it waits in `completion::block_on` (the ring is registered as its
/// [`Driver`]); meanwhile the ring's eventfd is off. Completions nobody is
/// waiting for make the eventfd readable and the sweeper runs them. Either
/// way, the completion queue is read only under `state`.
struct HomeRing {
    ring: IoUring,
    /// Keeps the descriptor open while requests are in flight.
    file: Arc<FileDev>,
    state: Mutex<RingState>,
    /// Requests the ring holds at most: its completion queue's size.
    in_flight_limit: usize,
    /// Entries were queued by `submit_plugged` and not yet handed over.
    plugged: AtomicBool,
    eventfd: OwnedFd,
    /// [`thread_token`] of the thread that registered this ring as its
    /// driver; 0 before any did.
    driver_thread: AtomicU64,
    /// Waits the owning thread drove itself (the no-hand-off path).
    owner_drives: AtomicUsize,
    /// The owning thread sleeps in an event loop of its own that wakes on
    /// this ring's eventfd ([`Driver::begin_owner_wait`]): the sweeper leaves
    /// the completions (and the eventfd's count) to it.
    owner_waits: AtomicBool,
}

#[derive(Default)]
struct RingState {
    /// Requests with an SQE in the ring (queued or submitted), by user_data.
    in_flight: HashMap<u64, Pending>,
    /// Requests waiting for room in the ring, oldest first; remainders of
    /// short transfers go first.
    backlog: VecDeque<Pending>,
    next_user_data: u64,
    /// The owner is waiting in the kernel for this ring's completions: the
    /// sweeper must not take them, or the owner could wait for ever.
    driving: bool,
}

impl HomeRing {
    fn new(ring: IoUring, file: Arc<FileDev>) -> io::Result<Self> {
        let in_flight_limit = ring.params().cq_entries() as usize;
        // The kernel gives a completion queue at least as long as the
        // submission queue, so a ring always has room for one request.
        assert!(in_flight_limit >= ring.params().sq_entries() as usize && in_flight_limit > 0);
        let eventfd = sys::eventfd()?;
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        Ok(Self {
            ring,
            file,
            state: Mutex::default(),
            in_flight_limit,
            plugged: AtomicBool::new(false),
            eventfd,
            driver_thread: AtomicU64::new(0),
            owner_drives: AtomicUsize::new(0),
            owner_waits: AtomicBool::new(false),
        })
    }

    fn fd(&self) -> types::Fd {
        types::Fd(self.file.file().as_raw_fd())
    }

    /// Queues `pending` and, unless plugged, hands the kernel what fits.
    fn start(&self, pending: Pending, plugged: bool, sweeper: &Sweeper) {
        let mut state = self.state.lock();
        state.backlog.push_back(pending);
        let pushed = self.fill_ring(&mut state);
        debug_assert!(pushed > 0 || !state.backlog.is_empty(), "a request lost between queues");
        drop(state);
        if pushed == 0 {
            return; // Backlogged: fed in as completions free room.
        }
        if plugged {
            // Counted before the flag is set: an unplug on another thread
            // that clears the flag must find the count that includes it (the
            // other order let it count down first, below zero).
            sweeper.plugged_rings.fetch_add(1, Ordering::AcqRel);
            if self.plugged.swap(true, Ordering::AcqRel) {
                // Plugged and counted already.
                sweeper.plugged_rings.fetch_sub(1, Ordering::AcqRel);
            }
            return;
        }
        self.enter_submit();
    }

    /// Hands entries held by `submit_plugged` to the kernel. True if there were any.
    fn unplug(&self) -> bool {
        let was_plugged = self.plugged.swap(false, Ordering::AcqRel);
        if was_plugged {
            self.enter_submit();
        }
        was_plugged
    }

    fn enter_submit(&self) {
        if let Err(error) = self.ring.submit() {
            tracing::debug!(%error, "io_uring submit failed; the next wait retries");
        }
    }

    /// Moves backlogged requests into the submission queue while the ring
    /// has room for their completions. Returns how many it moved.
    fn fill_ring(&self, state: &mut RingState) -> usize {
        // SAFETY: every SubmissionQueue of this ring is created here, with
        // the state lock held (`state` borrows its guard), so this one is the
        // only one in existence.
        let mut queue = unsafe { self.ring.submission_shared() };
        let mut pushed = 0;
        debug_assert!(state.in_flight.len() <= self.in_flight_limit, "over the in-flight limit");
        while state.in_flight.len() < self.in_flight_limit && !state.backlog.is_empty() {
            if queue.is_full() {
                queue.sync();
                self.enter_submit();
                queue.sync();
                if queue.is_full() {
                    break;
                }
            }
            let Some(mut pending) = state.backlog.pop_front() else { break };
            let user_data = state.next_user_data;
            state.next_user_data = user_data.wrapping_add(1);
            let entry = pending.entry(self.fd()).user_data(user_data);
            // SAFETY: the entry points into `pending`'s heap buffer, which
            // does not move when `pending` does and stays in `in_flight` until
            // this entry's CQE is handled; the descriptor stays open through
            // `self.file`.
            if unsafe { queue.push(&entry) }.is_err() {
                state.backlog.push_front(pending);
                break;
            }
            let previous = state.in_flight.insert(user_data, pending);
            assert!(previous.is_none(), "io_uring user_data {user_data} given to two requests");
            pushed += 1;
        }
        assert!(
            state.in_flight.len() <= self.in_flight_limit,
            "{} requests in flight in a ring of {} completions",
            state.in_flight.len(),
            self.in_flight_limit
        );
        pushed // Dropping `queue` publishes the new entries to the kernel.
    }

    /// Runs the callbacks of every completion available, without waiting.
    /// The sweeper (`by_sweeper`) leaves a ring its owner is driving alone.
    /// Returns how many requests finished.
    fn reap(&self, by_sweeper: bool) -> usize {
        // This thread's list from its last reap (taken, so a reap inside a
        // callback gets a fresh one): no allocation per reap.
        let mut finished = REAPED.take();
        let resubmitted = {
            let mut state = self.state.lock();
            if by_sweeper && state.driving {
                return 0;
            }
            // SAFETY: the completion queue is read only under `state`, which
            // this thread holds.
            let queue = unsafe { self.ring.completion_shared() };
            for completion in queue {
                let user_data = completion.user_data();
                let Some(mut pending) = state.in_flight.remove(&user_data) else {
                    UNKNOWN_COMPLETIONS.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(user_data, "io_uring completion for an unknown request");
                    continue;
                };
                match pending.record(completion.result()) {
                    None => {
                        debug_assert!(pending.done_bytes > 0, "a remainder of nothing done");
                        state.backlog.push_front(pending);
                    }
                    Some(outcome) => finished.push(pending.finish(outcome)),
                }
            }
            self.fill_ring(&mut state)
        };
        if resubmitted > 0 {
            self.enter_submit();
        }
        let count = finished.len();
        // Callbacks may submit: never run them under the lock.
        for (done, response) in finished.drain(..) {
            call_completion(done, response);
        }
        REAPED.set(finished);
        count
    }
}

thread_local! {
    /// The completions one reap collected under the ring's lock, run after it.
    static REAPED: Cell<Vec<(DevCallback, DevResponse)>> = const { Cell::new(Vec::new()) };
}

impl Driver for HomeRing {
    fn has_work(&self) -> bool {
        !self.state.lock().in_flight.is_empty()
    }

    fn reap_ready(&self) -> usize {
        self.reap(false)
    }

    /// Drains the eventfd before reaping: a completion posted after the
    /// drain either is reaped now or leaves the eventfd readable, so the
    /// owner's coming wait wakes at once; none is missed.
    fn begin_owner_wait(&self) -> Option<RawFd> {
        sys::eventfd_drain(self.eventfd.as_fd());
        self.reap(false);
        self.owner_waits.store(true, Ordering::SeqCst);
        Some(self.eventfd.as_raw_fd())
    }

    /// Reaps after taking the completions back from the owner's loop: the
    /// sweeper may have left some to it just before it woke (for another
    /// reason), and it may block on something they would free before it
    /// waits again.
    fn end_owner_wait(&self) {
        self.owner_waits.store(false, Ordering::SeqCst);
        self.reap(false);
    }

    /// Waits in the kernel for a completion with the eventfd off (so the
    /// sweeper stays asleep), then runs what completed.
    fn drive(&self) {
        {
            // Decided under the lock the sweeper reaps under: what is in
            // flight now can only complete into this thread's hands.
            let mut state = self.state.lock();
            if state.in_flight.is_empty() {
                return;
            }
            debug_assert!(state.in_flight.len() <= self.in_flight_limit);
            state.driving = true;
        }
        self.owner_drives.fetch_add(1, Ordering::Relaxed);
        self.set_eventfd_enabled(false);
        self.plugged.store(false, Ordering::Release);
        match self.ring.submitter().submit_and_wait(1) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::warn!(%error, "io_uring_enter failed while driving; retrying");
                thread::sleep(ENTER_RETRY_PAUSE);
            }
        }
        self.reap(false);
        self.state.lock().driving = false;
        self.set_eventfd_enabled(true);
        // Completions posted while the eventfd was off signalled no one.
        self.reap(false);
    }
}

impl HomeRing {
    /// Turns the eventfd signalling of completions off or on.
    fn set_eventfd_enabled(&self, enabled: bool) {
        let _state = self.state.lock();
        // SAFETY: the completion queue is touched only under `state`, held
        // here; this handle is dropped (storing back the head it read) before
        // the lock is released, so it cannot roll back a later reap.
        let queue = unsafe { self.ring.completion_shared() };
        if enabled {
            queue.enable_eventfd();
        } else {
            queue.disable_eventfd();
        }
    }
}

/// The thread that runs completions nobody waits for: it sleeps in epoll on
/// the rings' eventfds.
struct Sweeper {
    epoll: OwnedFd,
    /// Signalled by drop to stop the thread.
    stop: OwnedFd,
    rings: Mutex<Vec<Arc<HomeRing>>>,
    /// Rings with entries held by `submit_plugged`.
    plugged_rings: AtomicUsize,
    closing: AtomicBool,
}

const STOP_TOKEN: u64 = u64::MAX;

/// Completions whose request was not in flight: a bookkeeping bug (a
/// completion seen twice). Tests assert it stays zero.
static UNKNOWN_COMPLETIONS: AtomicUsize = AtomicUsize::new(0);

impl Sweeper {
    fn new() -> io::Result<Self> {
        let epoll = sys::epoll()?;
        let stop = sys::eventfd()?;
        sys::epoll_add(epoll.as_fd(), stop.as_fd(), STOP_TOKEN, false)?;
        Ok(Self {
            epoll,
            stop,
            rings: Mutex::new(Vec::new()),
            plugged_rings: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
        })
    }

    fn watch(&self, ring: &Arc<HomeRing>) -> io::Result<()> {
        let mut rings = self.rings.lock();
        // Edge-triggered: a ring left to its waiting owner keeps its count
        // (the owner's wake-up), and must not wake the sweeper again and
        // again meanwhile.
        let token = rings.len();
        debug_assert_ne!(token as u64, STOP_TOKEN);
        sys::epoll_add(self.epoll.as_fd(), ring.eventfd.as_fd(), token as u64, true)?;
        rings.push(Arc::clone(ring));
        // `run` finds the ring by its token: its index, rings never removed.
        debug_assert!(Arc::ptr_eq(&rings[token], ring));
        Ok(())
    }

    fn rings(&self) -> Vec<Arc<HomeRing>> {
        self.rings.lock().clone()
    }

    /// Hands every plugged ring's entries to the kernel.
    fn unplug_all(&self) {
        if self.plugged_rings.load(Ordering::Acquire) == 0 {
            return;
        }
        for ring in self.rings() {
            if ring.unplug() {
                let before = self.plugged_rings.fetch_sub(1, Ordering::AcqRel);
                debug_assert!(before > 0, "a plugged ring the count left out");
            }
        }
    }

    fn run(&self) {
        let mut tokens = Vec::new();
        while !self.closing.load(Ordering::Acquire) {
            if let Err(error) = sys::epoll_wait(self.epoll.as_fd(), &mut tokens) {
                if error.kind() != io::ErrorKind::Interrupted {
                    tracing::warn!(%error, "epoll_wait failed in the io_uring sweeper; retrying");
                    thread::sleep(ENTER_RETRY_PAUSE);
                }
                continue;
            }
            for &token in &tokens {
                if token == STOP_TOKEN {
                    continue;
                }
                let ring = self.rings.lock().get(token as usize).map(Arc::clone);
                if let Some(ring) = ring {
                    // Its owner sleeps where this eventfd wakes it: one
                    // hand-off fewer. (Asleep there, it is blocked on
                    // nothing the completions would free.)
                    if ring.owner_waits.load(Ordering::SeqCst) {
                        continue;
                    }
                    sys::eventfd_drain(ring.eventfd.as_fd());
                    ring.reap(true);
                }
            }
        }
    }
}

/// An asynchronous request, owning its buffer while the kernel uses it.
struct Pending {
    transfer: Transfer,
    offset_bytes: u64,
    /// Bytes transferred by earlier SQEs (short transfers).
    done_bytes: usize,
    done: DevCallback,
}

enum Transfer {
    Read(AlignedBuf),
    Write { buffer: AlignedBuf, rw_flags: i32 },
    Flush,
}

impl Pending {
    fn new(request: DevRequest, done: DevCallback) -> Self {
        let (transfer, offset_bytes) = match request {
            DevRequest::Read { offset, buffer } => (Transfer::Read(buffer), offset),
            DevRequest::Write { offset, buffer, fua } => {
                let rw_flags = if fua { libc::RWF_DSYNC } else { 0 };
                (Transfer::Write { buffer, rw_flags }, offset)
            }
            DevRequest::Flush => (Transfer::Flush, 0),
        };
        Self { transfer, offset_bytes, done_bytes: 0, done }
    }

    fn total_bytes(&self) -> usize {
        match &self.transfer {
            Transfer::Read(buffer) | Transfer::Write { buffer, .. } => buffer.len(),
            Transfer::Flush => 0,
        }
    }

    fn current_offset_bytes(&self) -> u64 {
        debug_assert!(self.done_bytes <= self.total_bytes(), "done past the request's end");
        // Device checked that offset + length fits.
        self.offset_bytes + self.done_bytes as u64
    }

    /// The SQE for what is left to transfer (without user_data).
    fn entry(&mut self, fd: types::Fd) -> squeue::Entry {
        let offset_bytes = self.current_offset_bytes();
        match &mut self.transfer {
            Transfer::Read(buffer) => {
                // `record` finishes a request once nothing is left.
                debug_assert!(self.done_bytes < buffer.len() || buffer.is_empty());
                let rest = &mut buffer[self.done_bytes..];
                let length = rest.len().min(MAX_SQE_BYTES) as u32;
                opcode::Read::new(fd, rest.as_mut_ptr(), length).offset(offset_bytes).build()
            }
            Transfer::Write { buffer, rw_flags } => {
                debug_assert!(self.done_bytes < buffer.len() || buffer.is_empty());
                let rest = &buffer[self.done_bytes..];
                let length = rest.len().min(MAX_SQE_BYTES) as u32;
                opcode::Write::new(fd, rest.as_ptr(), length)
                    .offset(offset_bytes)
                    .rw_flags(*rw_flags)
                    .build()
            }
            Transfer::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
        }
    }

    /// Accounts a CQE result: the outcome when the request is finished,
    /// `None` when a short transfer leaves a remainder to resubmit (with the
    /// same rw_flags, so a FUA write stays FUA).
    fn record(&mut self, result: i32) -> Option<io::Result<()>> {
        let transferred_bytes = match completion_bytes(result) {
            Ok(transferred_bytes) => transferred_bytes,
            Err(error) => return Some(Err(error)),
        };
        let direction = match self.transfer {
            Transfer::Flush => return Some(Ok(())),
            Transfer::Read(_) => Direction::Read,
            Transfer::Write { .. } => Direction::Write,
        };
        debug_assert!(self.done_bytes <= self.total_bytes(), "done past the request's end");
        let remaining_bytes = self.total_bytes() - self.done_bytes;
        if transferred_bytes > remaining_bytes {
            let offset_bytes = self.current_offset_bytes();
            return Some(Err(sys::overlong_transfer_error(
                transferred_bytes,
                remaining_bytes,
                offset_bytes,
            )));
        }
        if transferred_bytes == remaining_bytes {
            return Some(Ok(()));
        }
        if transferred_bytes == 0 {
            return Some(Err(sys::stalled_transfer_error(direction, self.current_offset_bytes())));
        }
        self.done_bytes += transferred_bytes;
        debug_assert!(self.done_bytes < self.total_bytes(), "a remainder past the end");
        None
    }

    fn finish(self, result: io::Result<()>) -> (DevCallback, DevResponse) {
        let buffer = match self.transfer {
            Transfer::Read(buffer) | Transfer::Write { buffer, .. } => Some(buffer),
            Transfer::Flush => None,
        };
        (self.done, DevResponse { buffer, result })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::dev::file::test_support::{self as support, Image, BLOCK_BYTES, IMAGE_BYTES};
    use crate::dev::{EngineKind, FuaMode};

    const ENGINE: EngineKind = EngineKind::Uring;

    #[test]
    fn vectored_round_trip() {
        support::vectored_round_trip(ENGINE);
    }

    #[test]
    fn many_iovecs() {
        support::many_iovecs(ENGINE);
    }

    #[test]
    fn fua_counts() {
        support::fua_counts(ENGINE);
    }

    #[test]
    fn discard_punches_and_zeroes() {
        support::discard_punches_and_zeroes(ENGINE);
    }

    #[test]
    fn misaligned_and_out_of_range() {
        support::misaligned_and_out_of_range(ENGINE);
    }

    #[test]
    fn concurrent_async() {
        support::concurrent_async(&support::options(ENGINE, FuaMode::Native));
    }

    /// A tiny ring: the submission queue fills and most requests wait in
    /// the backlog.
    #[test]
    fn concurrent_async_tiny_ring() {
        let options = DevOptions { ring_entries: 4, ..support::options(ENGINE, FuaMode::Native) };
        support::concurrent_async(&options);
    }

    #[test]
    fn async_flush_and_fua() {
        support::async_flush_and_fua(ENGINE);
    }

    #[test]
    fn drop_finishes() {
        support::drop_finishes(ENGINE);
    }

    fn open_raw(path: &Path) -> UringDev {
        let options = support::options(ENGINE, FuaMode::Native);
        UringDev::open(path, &options)
            .or_else(|_| UringDev::open(path, &DevOptions { direct: false, ..options }))
            .unwrap()
    }

    fn submit_raw(raw: &UringDev, request: DevRequest) -> DevResponse {
        let (sender, receiver) = mpsc::channel();
        raw.submit(
            request,
            Box::new(move |response| {
                let _ = sender.send(response);
            }),
        );
        receiver.recv_timeout(support::CALLBACK_TIMEOUT).unwrap()
    }

    /// Two blocks from the last one: a short transfer, then end of file, on
    /// both paths.
    #[test]
    fn backend_read_past_end_is_unexpected_eof() {
        let image = Image::new();
        let raw = open_raw(&image.path);
        let offset = IMAGE_BYTES - BLOCK_BYTES as u64;
        let mut buffer = AlignedBuf::zeroed(2 * BLOCK_BYTES);
        let error = raw.read_at(offset, &mut [IoSliceMut::new(&mut buffer)]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert!(error.to_string().contains(&IMAGE_BYTES.to_string()), "{error}");

        let response = submit_raw(&raw, DevRequest::Read { offset, buffer });
        let error = response.result.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert!(error.to_string().contains(&IMAGE_BYTES.to_string()), "{error}");
        assert_eq!(response.buffer.map(|buffer| buffer.len()), Some(2 * BLOCK_BYTES));
    }

    #[test]
    fn sweeper_is_named_and_survives_a_panicking_callback() {
        let image = Image::new();
        let raw = open_raw(&image.path);
        raw.submit(
            DevRequest::Flush,
            Box::new(|_| panic!("callback panic (expected in this test)")),
        );
        let (sender, receiver) = mpsc::channel();
        raw.submit(
            DevRequest::Flush,
            Box::new(move |response| {
                let name = thread::current().name().map(str::to_owned);
                let _ = sender.send((name, response.result));
            }),
        );
        let (name, result) = receiver.recv_timeout(support::CALLBACK_TIMEOUT).unwrap();
        assert_eq!(name.as_deref(), Some("foliofs-uring-sweeper"));
        result.unwrap();
    }

    /// Waits (at most `timeout`) for `fd` to become readable.
    fn poll_readable(fd: RawFd, timeout: Duration) -> bool {
        let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let timeout_ms = timeout.as_millis() as libc::c_int;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, timeout_ms) == 1 }
    }

    /// A thread that sleeps where its ring's eventfd wakes it
    /// (`completion::prepare_to_wait`, a FUSE ring thread) runs its
    /// completions itself: the sweeper leaves them, and the descriptor
    /// wakes the thread. Once it woke (`completion::woke`) the sweeper runs
    /// them again, so a thread blocked elsewhere never strands its I/O.
    #[test]
    fn an_owner_asleep_on_its_eventfd_runs_its_completions_itself() {
        let image = Image::new();
        let raw = open_raw(&image.path);
        let read = |sender: mpsc::Sender<Option<String>>| {
            let request = DevRequest::Read { offset: 0, buffer: AlignedBuf::zeroed(BLOCK_BYTES) };
            raw.submit(
                request,
                Box::new(move |response| {
                    response.result.unwrap();
                    let _ = sender.send(thread::current().name().map(str::to_owned));
                }),
            );
        };
        // The ring exists (and is this thread's driver) after a first request.
        let (sender, receiver) = mpsc::channel();
        read(sender.clone());
        receiver.recv_timeout(support::CALLBACK_TIMEOUT).unwrap();
        let me = thread::current().name().map(str::to_owned);
        // A sweeper already past its check when the owner went to sleep may
        // still take one (harmless: it runs it as before), so most, not all.
        let mut run_by_owner = 0;
        for _ in 0..100 {
            let fd = completion::prepare_to_wait().expect("a home ring's eventfd");
            read(sender.clone());
            let woken = poll_readable(fd, Duration::from_millis(200));
            // Time enough for a sweeper that would take it.
            thread::sleep(Duration::from_millis(2));
            let run_by_sweeper = receiver.try_recv().ok();
            completion::woke();
            let ran_on = run_by_sweeper
                .or_else(|| receiver.recv_timeout(support::CALLBACK_TIMEOUT).ok())
                .expect("the completion ran");
            if ran_on == me {
                assert!(woken, "the completion woke the owner");
                run_by_owner += 1;
            }
        }
        assert!(run_by_owner >= 50, "the owner ran {run_by_owner} of 100 completions");
        // Awake, the owner may block on anything: the sweeper runs its I/O.
        completion::prepare_to_wait();
        completion::woke();
        read(sender);
        let ran_on = receiver.recv_timeout(support::CALLBACK_TIMEOUT).unwrap();
        assert_eq!(ran_on.as_deref(), Some("foliofs-uring-sweeper"));
    }

    /// The submitting thread waits in its own ring (block_on drives it) while
    /// the sweeper may take completions nobody waits for: thousands of
    /// single-request waits from several threads, none lost, none seen twice.
    #[test]
    fn driven_waits_never_hang_or_repeat() {
        let image = Image::new();
        let device =
            Arc::new(support::open(&image.path, &support::options(ENGINE, FuaMode::Native)));
        // More threads than cores: owners get preempted between deciding to
        // wait and entering the kernel, which is when the sweeper could steal.
        let workers: Vec<_> = (0..8u64)
            .map(|worker| {
                let device = Arc::clone(&device);
                thread::spawn(move || {
                    for round in 0..1500u64 {
                        let (future, completer) = completion::pair();
                        let offset = ((worker * 1500 + round) % 1024) * BLOCK_BYTES as u64;
                        let request =
                            DevRequest::Read { offset, buffer: AlignedBuf::zeroed(BLOCK_BYTES) };
                        let done: DevCallback =
                            Box::new(move |response| completer.complete(response.result.is_ok()));
                        if round % 2 == 0 {
                            device.submit_plugged(request, done);
                        } else {
                            device.submit(request, done);
                        }
                        device.unplug();
                        assert!(completion::block_on(future));
                    }
                })
            })
            .collect();
        let (finished, all_done) = mpsc::channel();
        thread::spawn(move || {
            for worker in workers {
                worker.join().unwrap();
            }
            finished.send(()).unwrap();
        });
        all_done.recv_timeout(Duration::from_secs(60)).expect("a driven wait hung");
        assert_eq!(
            UNKNOWN_COMPLETIONS.load(Ordering::Relaxed),
            0,
            "a completion was handled twice"
        );
    }

    /// `ThreadLocal` hands an exited thread's ring to a later thread; that
    /// thread must still wait in the ring itself (found by review 1). The
    /// request is plugged, so only a driving owner or an unplug submits it: a
    /// watchdog unplugs from outside if the owner never drives, so the bug
    /// shows as a missing drive, not a hang.
    #[test]
    fn recycled_thread_still_drives_its_inherited_ring() {
        let image = Image::new();
        let raw = Arc::new(open_raw(&image.path));
        let mut first_owner_of = HashMap::new();
        for attempt in 0..200usize {
            let raw_for_thread = Arc::clone(&raw);
            let (ring_address, drove) = thread::spawn(move || {
                let raw = raw_for_thread;
                let (future, completer) = completion::pair();
                let request =
                    DevRequest::Read { offset: 0, buffer: AlignedBuf::zeroed(BLOCK_BYTES) };
                raw.submit_plugged(
                    request,
                    Box::new(move |response| completer.complete(response.result.is_ok())),
                );
                let ring = Arc::clone(raw.home_rings.get().unwrap());
                let drives_before = ring.owner_drives.load(Ordering::Relaxed);
                let (stop, stopped) = mpsc::channel::<()>();
                let watchdog = thread::spawn({
                    let raw = Arc::clone(&raw);
                    move || {
                        if stopped.recv_timeout(Duration::from_secs(2)).is_err() {
                            raw.unplug();
                        }
                    }
                });
                assert!(completion::block_on(future));
                drop(stop);
                watchdog.join().unwrap();
                let drove = ring.owner_drives.load(Ordering::Relaxed) > drives_before;
                (Arc::as_ptr(&ring) as usize, drove)
            })
            .join()
            .unwrap();
            match first_owner_of.insert(ring_address, attempt) {
                None => assert!(drove, "a ring's first owner did not drive it"),
                Some(_) => {
                    assert!(drove, "a thread that inherited a ring did not drive it");
                    return;
                }
            }
        }
        panic!("no thread inherited an exited thread's ring in 200 attempts");
    }

    #[test]
    fn blocking_calls_from_many_threads() {
        let image = Image::new();
        let device =
            Arc::new(support::open(&image.path, &support::options(ENGINE, FuaMode::Native)));
        let workers: Vec<_> = (0..4)
            .map(|thread_index| {
                let device = Arc::clone(&device);
                thread::spawn(move || {
                    for block_index in (thread_index..64).step_by(4) {
                        let offset = (block_index * BLOCK_BYTES) as u64;
                        device
                            .write(offset, &support::pattern(block_index), block_index % 2 == 0)
                            .unwrap();
                        let mut back = AlignedBuf::zeroed(BLOCK_BYTES);
                        device.read(offset, &mut back).unwrap();
                        assert!(back[..] == support::pattern(block_index)[..]);
                    }
                    device.flush().unwrap();
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
    }

    #[test]
    fn ring_entries_are_validated() {
        let image = Image::new();
        for ring_entries in [0, MAX_RING_ENTRIES + 1] {
            let options = DevOptions { ring_entries, ..support::options(ENGINE, FuaMode::Native) };
            let error = UringDev::open(&image.path, &options).err().unwrap();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
        }
    }

    #[test]
    fn setup_failure_names_the_fallback() {
        // The kernel refuses a ring of zero entries, as it would refuse
        // io_uring altogether where it is disabled.
        let error = new_ring(0).err().unwrap();
        let message = error.to_string();
        assert!(message.starts_with("io_uring is not available: "), "{message}");
        assert!(message.ends_with("use -o engine=threads"), "{message}");
    }
}
