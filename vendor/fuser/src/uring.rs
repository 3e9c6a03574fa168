//! FUSE over io_uring (Linux 6.14+, protocol 7.42), the second transport.
//!
//! After INIT (which stays on /dev/fuse) the kernel routes every request to
//! the queue of the CPU its caller runs on. Each queue is served by one or
//! more ring threads; a ring thread owns an io_uring with 128-byte SQEs and a
//! fixed set of ring entries (a 288-byte header and a payload buffer each)
//! registered with `FUSE_IO_URING_CMD_REGISTER`. A completion hands one
//! request in an entry; the reply goes back with `COMMIT_AND_FETCH`, which
//! also re-arms the entry. FORGET, INTERRUPT and notifications stay on
//! /dev/fuse, so the session keeps one classic reader too.
//!
//! A request is rebuilt in the /dev/fuse layout for the existing parser
//! without copying its payload: the payload buffer follows a page-sized gap,
//! and the 40-byte `fuse_in_header` plus the per-opcode header are written
//! into the end of that gap.
//!
//! Replies may be sent from any thread (asynchronous handlers). The kernel
//! runs the delivery of the next request to an entry as task work of the
//! task that submitted the entry's last command, so every command is
//! submitted by the ring's own thread: a reply sent elsewhere is written into
//! the entry's buffers and its commit handed to the ring thread through a
//! list and an eventfd the ring keeps a read armed on.

use std::alloc::Layout;
use std::cell::Cell;
use std::fmt;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::ReplyEmpty;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::idle_commit::IdleCommit;
use crate::ll::Operation;
use crate::request::ReplyTo;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// The smallest payload buffer the kernel accepts (FUSE_MIN_READ_BUFFER).
const PAYLOAD_MIN_BYTES: usize = 8192;
/// Room before the payload for the rebuilt `fuse_in_header` and per-opcode
/// header (at most 40 + 128 bytes); a page keeps the payload page-aligned.
const GAP_BYTES: usize = 4096;
const IN_HEADER_BYTES: usize = 40;
/// The kernel sends these in the background: no caller waits on the reply.
const FUSE_RELEASE: u32 = 18;
const FUSE_RELEASEDIR: u32 = 29;
const OUT_HEADER_BYTES: usize = 16;
const OP_IN_BYTES: usize = 128;
/// `user_data` of the eventfd read; entries use their index.
const WAKE_TAG: u64 = u64::MAX;
/// `user_data` of the poll on the file system's own descriptor
/// (`Filesystem::before_wait`).
const FS_WAIT_TAG: u64 = u64::MAX - 1;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`: the entry's first iovec.
#[repr(C, align(8))]
struct ReqHeader {
    in_out: [u8; 128],
    op_in: [u8; OP_IN_BYTES],
    ring_ent_in_out: EntInOut,
}

/// `struct fuse_uring_cmd_req`, in the SQE's command area.
#[repr(C)]
struct CmdReq {
    flags: u64,
    commit_id: u64,
    qid: u16,
    padding: [u8; 6],
}

const _: () = assert!(size_of::<EntInOut>() == 32);
const _: () = assert!(size_of::<ReqHeader>() == 288);
const _: () = assert!(size_of::<CmdReq>() == 24);

/// What the session reports about the io_uring transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoUringInfo {
    /// Queues, one per possible CPU.
    pub queues: usize,
    /// Ring threads per queue.
    pub threads_per_queue: usize,
    /// Ring entries (requests in flight at once) per queue.
    pub entries_per_queue: usize,
    /// Payload buffer of each entry.
    pub payload_bytes: usize,
}

/// The number of possible CPUs, which is the number of queues the kernel
/// creates and waits for (`num_possible_cpus()`).
pub(crate) fn possible_cpus() -> usize {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|list| count_cpu_list(list.trim()));
    listed.unwrap_or_else(|| {
        // SAFETY: sysconf has no preconditions.
        let configured = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        usize::try_from(configured).unwrap_or(1).max(1)
    })
}

/// Counts the CPUs in a kernel CPU list such as `0-3,8,10-11`.
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut count = 0;
    for range in list.split(',') {
        let (first, last) = match range.split_once('-') {
            Some((first, last)) => (first.parse::<usize>().ok()?, last.parse::<usize>().ok()?),
            None => {
                let cpu = range.parse::<usize>().ok()?;
                (cpu, cpu)
            }
        };
        count += last.checked_sub(first)? + 1;
    }
    (count > 0).then_some(count)
}

/// One entry's memory: the header the kernel and the daemon exchange
/// through, the gap plus payload, and the reply staged while the request's
/// own payload may still be borrowed.
struct EntryMemory {
    header: *mut ReqHeader,
    area: *mut u8,
    reply: Mutex<ReplyState>,
}

#[derive(Default)]
struct ReplyState {
    /// The ring thread is dispatching the request (its bytes are borrowed).
    dispatching: bool,
    /// The request carried a payload, which the reply would overwrite.
    request_has_payload: bool,
    /// A [`LentPayload`] of the request lives: the entry is not committed
    /// (handed back to the kernel) until it is dropped.
    payload_lent: bool,
    /// The unique of a reply sent while both of the above held; the reply
    /// itself is in `staged` (kept between requests) until dispatch returns.
    staged_unique: Option<u64>,
    staged: Vec<u8>,
    /// The staged reply is already in the entry (its data was written in
    /// place, into a lent reply buffer): only its commit waits.
    staged_in_place: bool,
}

/// What a ring thread shares with the reply senders of its entries.
pub(crate) struct RingShared {
    qid: u16,
    entries: Box<[EntryMemory]>,
    payload_bytes: usize,
    /// Commits from reply senders, (entry, unique), for the ring thread to submit.
    commits: Mutex<Vec<(u16, u64)>>,
    wake: OwnedFd,
    /// The session's /dev/fuse, for what only it carries (backing files).
    channel: ChannelSender,
}

// SAFETY: the raw pointers are heap memory owned by this struct. Who may
// touch an entry's memory is decided by the protocol: the kernel until the
// entry's completion, then the ring thread while it dispatches, then the one
// reply sender of that request until it queues the commit (the commit list's
// mutex orders its writes before the ring thread's submission).
unsafe impl Send for RingShared {}
// SAFETY: as for Send; shared state other than the entry memory is behind mutexes.
unsafe impl Sync for RingShared {}

impl fmt::Debug for RingShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingShared")
            .field("qid", &self.qid)
            .finish_non_exhaustive()
    }
}

fn area_layout(payload_bytes: usize) -> Layout {
    Layout::from_size_align(GAP_BYTES + payload_bytes, GAP_BYTES).expect("payload size")
}

impl RingShared {
    fn new(
        channel: ChannelSender,
        qid: u16,
        entries: usize,
        payload_bytes: usize,
    ) -> io::Result<Self> {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let mut memory = Vec::with_capacity(entries);
        for _ in 0..entries {
            let header = Box::into_raw(Box::new(ReqHeader {
                in_out: [0; 128],
                op_in: [0; OP_IN_BYTES],
                ring_ent_in_out: EntInOut::default(),
            }));
            // SAFETY: the layout has a non-zero size. Untouched pages of the
            // payload cost no memory until the kernel copies into them.
            let area = unsafe { std::alloc::alloc(area_layout(payload_bytes)) };
            if area.is_null() {
                // SAFETY: allocated just above by Box.
                drop(unsafe { Box::from_raw(header) });
                return Err(io::Error::from(io::ErrorKind::OutOfMemory));
            }
            memory.push(EntryMemory {
                header,
                area,
                reply: Mutex::new(ReplyState::default()),
            });
        }
        Ok(Self {
            qid,
            entries: memory.into_boxed_slice(),
            payload_bytes,
            commits: Mutex::new(Vec::with_capacity(entries)),
            wake,
            channel,
        })
    }

    fn payload(&self, index: usize) -> *mut u8 {
        // SAFETY: the area is GAP_BYTES + payload_bytes long.
        unsafe { self.entries[index].area.add(GAP_BYTES) }
    }

    /// Queues the commit of entry `index` for the ring thread, waking it when
    /// it may be asleep.
    fn queue_commit(&self, index: u16, unique: u64) {
        let was_empty = {
            let mut commits = self.commits.lock();
            let was_empty = commits.is_empty();
            commits.push((index, unique));
            was_empty
        };
        let on_ring_thread = RING_THREAD.with(|ring| ring.get() == self as *const Self);
        if was_empty && !on_ring_thread {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to our eventfd.
            let written = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
            if written != 8 {
                error!(
                    "waking io_uring queue {}: {}",
                    self.qid,
                    io::Error::last_os_error()
                );
            }
        }
    }

    /// Commits the reply staged for entry `index`, if any, now that
    /// nothing borrows the request's bytes.
    fn commit_staged(&self, index: usize, mut state: parking_lot::MutexGuard<'_, ReplyState>) {
        if let Some(unique) = state.staged_unique.take() {
            if std::mem::take(&mut state.staged_in_place) {
                drop(state);
                self.queue_commit(index as u16, unique);
                return;
            }
            let reply = &state.staged;
            let parts: [&[u8]; 2] = [&reply[..OUT_HEADER_BYTES], &reply[OUT_HEADER_BYTES..]];
            self.write_reply(index, &parts);
            drop(state);
            self.queue_commit(index as u16, unique);
        }
    }

    /// Writes a reply (`fuse_out_header` first) into entry `index`.
    fn write_reply(&self, index: usize, reply: &[&[u8]]) -> u64 {
        let entry = &self.entries[index];
        let header = reply[0];
        let mut out = [0u8; OUT_HEADER_BYTES];
        out.copy_from_slice(&header[..OUT_HEADER_BYTES]);
        let unique = u64::from_ne_bytes(out[8..16].try_into().unwrap());
        let body_bytes: usize = reply[1..].iter().map(|part| part.len()).sum();
        let mut payload_sz = body_bytes;
        if body_bytes > self.payload_bytes {
            error!(
                "reply of {body_bytes} bytes exceeds the io_uring payload buffer ({} bytes)",
                self.payload_bytes
            );
            out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            payload_sz = 0;
        } else {
            let mut at = self.payload(index);
            for part in &reply[1..] {
                // SAFETY: the entry is ours until its commit is queued, the
                // total fits the payload buffer, and no request bytes of this
                // entry are borrowed any more (see `EntrySender::send`). Data
                // already in place (a lent reply buffer) is not copied.
                unsafe {
                    if !std::ptr::eq(part.as_ptr(), at) {
                        std::ptr::copy_nonoverlapping(part.as_ptr(), at, part.len());
                    }
                    at = at.add(part.len());
                }
            }
        }
        // SAFETY: as above; the header is the entry's own allocation.
        unsafe {
            let header = &mut *entry.header;
            header.in_out[..OUT_HEADER_BYTES].copy_from_slice(&out);
            header.ring_ent_in_out.payload_sz = payload_sz as u32;
        }
        unique
    }
}

impl Drop for RingShared {
    fn drop(&mut self) {
        for entry in &*self.entries {
            // SAFETY: both were allocated in `new` with these layouts, and
            // `RingThread` leaks the last reference instead of dropping it
            // while the kernel may still write into an entry.
            unsafe {
                drop(Box::from_raw(entry.header));
                std::alloc::dealloc(entry.area, area_layout(self.payload_bytes));
            }
        }
    }
}

thread_local! {
    /// The ring a thread serves, so a reply sent from it needs no wake-up.
    static RING_THREAD: Cell<*const RingShared> = const { Cell::new(std::ptr::null()) };
}

/// Sends the reply to one request that arrived on a ring.
#[derive(Clone, Debug)]
pub(crate) struct EntrySender {
    ring: Arc<RingShared>,
    index: u16,
}

impl EntrySender {
    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.ring.channel
    }

    pub(crate) fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let index = usize::from(self.index);
        let parts: smallvec::SmallVec<[&[u8]; 4]> = bufs.iter().map(|b| &**b).collect();
        if parts
            .first()
            .is_none_or(|header| header.len() < OUT_HEADER_BYTES)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "reply without a header",
            ));
        }
        {
            let mut state = self.ring.entries[index].reply.lock();
            if state.payload_lent && self.is_in_place(&parts) {
                // The data is where the kernel reads it (a lent reply
                // buffer): write the header now, commit once handed back.
                let unique = self.ring.write_reply(index, &parts);
                state.staged_unique = Some(unique);
                state.staged_in_place = true;
                return Ok(());
            }
            if (state.dispatching && state.request_has_payload) || state.payload_lent {
                // The handler (or a lent payload's user) may still hold the
                // request's payload, which the reply would overwrite: keep
                // it until dispatch returns and the payload is handed back.
                let unique = u64::from_ne_bytes(parts[0][8..16].try_into().unwrap());
                state.staged.clear();
                for part in &parts {
                    state.staged.extend_from_slice(part);
                }
                state.staged_unique = Some(unique);
                return Ok(());
            }
        }
        let unique = self.ring.write_reply(index, &parts);
        self.ring.queue_commit(self.index, unique);
        Ok(())
    }

    /// Whether a reply's data is one slice at the start of the entry's
    /// payload buffer, where the kernel reads it from.
    fn is_in_place(&self, parts: &[&[u8]]) -> bool {
        let payload = self.ring.payload(usize::from(self.index));
        matches!(parts, [_, data] if std::ptr::eq(data.as_ptr(), payload))
    }

    /// Lends the first `length` bytes of the entry's payload buffer, for
    /// a request that carried no payload, to receive the reply's data in
    /// place (a direct read): replying with a slice that starts there
    /// copies nothing. `None` when it does not fit or the request carried a
    /// payload.
    pub(crate) fn lend_reply_buffer(&self, length: usize) -> Option<LentPayload> {
        let index = usize::from(self.index);
        if length == 0 || length > self.ring.payload_bytes {
            return None;
        }
        let mut state = self.ring.entries[index].reply.lock();
        if !state.dispatching
            || state.request_has_payload
            || state.payload_lent
            || state.staged_unique.is_some()
        {
            return None;
        }
        state.payload_lent = true;
        Some(LentPayload {
            ring: Arc::clone(&self.ring),
            index: self.index,
            pointer: self.ring.payload(index),
            length,
        })
    }

    /// Lends `data`, a slice of this request's payload as the handler got
    /// it, in place: see [`LentPayload`]. `None` when `data` lies elsewhere,
    /// the request is no longer being dispatched, or it was lent already.
    pub(crate) fn lend(&self, data: &[u8]) -> Option<LentPayload> {
        let index = usize::from(self.index);
        let start = self.ring.payload(index) as usize;
        let address = data.as_ptr() as usize;
        let inside = address >= start
            && address
                .checked_add(data.len())
                .is_some_and(|end| end <= start + self.ring.payload_bytes);
        if !inside || data.is_empty() {
            return None;
        }
        let mut state = self.ring.entries[index].reply.lock();
        if !state.dispatching || state.payload_lent || state.staged_unique.is_some() {
            return None;
        }
        state.payload_lent = true;
        Some(LentPayload {
            ring: Arc::clone(&self.ring),
            index: self.index,
            pointer: data.as_ptr().cast_mut(),
            length: data.len(),
        })
    }
}

/// A request's payload lent in place out of its io_uring entry, so that a
/// handler can hand it to asynchronous work (a direct write) without a
/// copy; or the entry's payload buffer lent to receive a reply's data in
/// place (a direct read). Until this is dropped the bytes stay at their
/// address and the kernel does not touch them: the request's reply, whose
/// commit returns the entry to the kernel, is held back until then. Page-aligned when it
/// starts the payload (the payload buffer is).
pub struct LentPayload {
    ring: Arc<RingShared>,
    index: u16,
    pointer: *mut u8,
    length: usize,
}

// SAFETY: the bytes are the entry's, which no one else touches while the
// lend lasts (see `EntrySender::lend` and `send`); `ring` keeps them alive.
unsafe impl Send for LentPayload {}
// SAFETY: as for Send; shared access only reads.
unsafe impl Sync for LentPayload {}

impl LentPayload {
    /// The first byte, which stays at this address while `self` lives.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.pointer
    }

    /// The number of bytes lent.
    pub fn len(&self) -> usize {
        self.length
    }

    /// Whether no bytes are lent.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
}

impl std::ops::Deref for LentPayload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the lent bytes stay valid and unchanged by the kernel
        // while `self` lives (see the type's documentation).
        unsafe { std::slice::from_raw_parts(self.pointer, self.length) }
    }
}

impl fmt::Debug for LentPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentPayload")
            .field("qid", &self.ring.qid)
            .field("entry", &self.index)
            .field("bytes", &self.length)
            .finish()
    }
}

impl Drop for LentPayload {
    fn drop(&mut self) {
        let index = usize::from(self.index);
        let mut state = self.ring.entries[index].reply.lock();
        state.payload_lent = false;
        if !state.dispatching {
            self.ring.commit_staged(index, state);
        }
    }
}

/// A ring thread before it is started: its io_uring, built before the INIT
/// reply so that a failure can still decline the capability.
pub(crate) struct RingThread {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    shared: Arc<RingShared>,
    dev_fuse: RawFd,
    /// Keeps `dev_fuse` open.
    _channel: Channel,
    iovecs: Box<[[libc::iovec; 2]]>,
    wake_value: Box<u64>,
    /// For the rare request whose headers would leave the payload unaligned.
    scratch: Vec<u64>,
    /// The commits being submitted, swapped with the shared list.
    commit_batch: Vec<(u16, u64)>,
    live_entries: usize,
    /// Whether the thread commits single replies at SCHED_IDLE
    /// (`Config::io_uring_sched_idle`).
    sched_idle: bool,
    /// Its SCHED_IDLE switch for commits, once the thread runs with one.
    idle_commit: Option<IdleCommit>,
    /// A poll is armed on the descriptor `Filesystem::before_wait` gave.
    fs_wait_armed: bool,
    /// Per entry: its request wakes nobody when answered (a release, which
    /// the kernel sends in the background), so its commit is no hand-off
    /// and needs no policy of its own.
    background: Vec<bool>,
}

// SAFETY: the iovecs point into the entries' memory, which `shared` owns;
// the thread that runs the ring is the only user of these pointers.
unsafe impl Send for RingThread {}

impl fmt::Debug for RingThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingThread")
            .field("qid", &self.shared.qid)
            .finish_non_exhaustive()
    }
}

/// The plan for the rings of a session.
#[derive(Debug)]
pub(crate) struct RingPlan {
    pub(crate) threads: Vec<RingThread>,
    pub(crate) info: IoUringInfo,
}

/// Builds the rings: `queue_depth` entries per queue, the `threads` serving
/// threads spread evenly over the queues (at least one each).
pub(crate) fn build_rings(
    channel: &Channel,
    queue_depth: usize,
    threads: usize,
    payload_bytes: usize,
    sched_idle: bool,
) -> io::Result<RingPlan> {
    let queues = possible_cpus();
    let threads_per_queue = threads.div_ceil(queues).clamp(1, queue_depth.max(1));
    let entries_per_thread = queue_depth.max(1).div_ceil(threads_per_queue);
    let payload_bytes = payload_bytes.max(PAYLOAD_MIN_BYTES).next_multiple_of(4096);
    let mut threads = Vec::with_capacity(queues * threads_per_queue);
    for qid in 0..queues {
        let qid = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
        for _ in 0..threads_per_queue {
            threads.push(RingThread::new(
                channel,
                qid,
                entries_per_thread,
                payload_bytes,
                sched_idle,
            )?);
        }
    }
    let info = IoUringInfo {
        queues,
        threads_per_queue,
        entries_per_queue: entries_per_thread * threads_per_queue,
        payload_bytes,
    };
    Ok(RingPlan { threads, info })
}

/// What a ring thread reports once its entries are registered.
pub(crate) type Registered = Result<(), String>;

impl RingThread {
    fn new(
        channel: &Channel,
        qid: u16,
        entries: usize,
        payload_bytes: usize,
        sched_idle: bool,
    ) -> io::Result<Self> {
        // One SQE per entry plus the eventfd read and the file system's
        // poll; the same for completions.
        let slots = u32::try_from(entries + 2).map_err(|_| io::Error::other("queue depth"))?;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(2 * slots)
            .build(slots)?;
        let shared = Arc::new(RingShared::new(
            channel.sender(),
            qid,
            entries,
            payload_bytes,
        )?);
        let iovecs = (0..entries)
            .map(|index| {
                [
                    libc::iovec {
                        iov_base: shared.entries[index].header.cast(),
                        iov_len: size_of::<ReqHeader>(),
                    },
                    libc::iovec {
                        iov_base: shared.payload(index).cast(),
                        iov_len: payload_bytes,
                    },
                ]
            })
            .collect();
        Ok(Self {
            ring,
            shared,
            dev_fuse: channel.as_fd().as_raw_fd(),
            _channel: channel.clone(),
            iovecs,
            wake_value: Box::new(0),
            scratch: Vec::new(),
            commit_batch: Vec::with_capacity(entries),
            background: vec![false; entries],
            live_entries: entries,
            sched_idle,
            idle_commit: None,
            fs_wait_armed: false,
        })
    }

    /// Starts the thread: it registers its entries, reports, then waits for
    /// the session's event loop before it dispatches anything.
    pub(crate) fn spawn<FS: Filesystem>(
        self,
        name: String,
        registered: mpsc::Sender<Registered>,
        start: mpsc::Receiver<SessionEventLoop<FS>>,
    ) -> io::Result<JoinHandle<io::Result<()>>> {
        thread::Builder::new()
            .name(name)
            .spawn(move || self.run(registered, start))
    }

    fn command(&self, index: usize, cmd_op: u32, commit_id: u64) -> squeue::Entry128 {
        let request = CmdReq {
            flags: 0,
            commit_id,
            qid: self.shared.qid,
            padding: [0; 6],
        };
        let mut cmd = [0u8; 80];
        cmd[..8].copy_from_slice(&request.flags.to_ne_bytes());
        cmd[8..16].copy_from_slice(&request.commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&request.qid.to_ne_bytes());
        let mut sqe = opcode::UringCmd80::new(types::Fd(self.dev_fuse), cmd_op).cmd(cmd);
        if cmd_op == FUSE_IO_URING_CMD_REGISTER {
            sqe = sqe.addr(Some(self.iovecs[index].as_ptr() as u64));
        }
        let mut entry = sqe.build().user_data(index as u64);
        if cmd_op == FUSE_IO_URING_CMD_REGISTER {
            // The kernel wants sqe->len == 2 (the iovec count), which the
            // builder has no setter for: `len` is the u32 at byte 24.
            let sqe_bytes = (&raw mut entry).cast::<u8>();
            // SAFETY: Entry128 is repr(C), 128 bytes, starting with the
            // kernel's io_uring_sqe; offset 24 is its `len` field.
            unsafe { sqe_bytes.add(24).cast::<u32>().write_unaligned(2) };
        }
        entry
    }

    fn push(&mut self, entry: &squeue::Entry128) -> io::Result<()> {
        loop {
            // SAFETY: every pointer in the entry (iovecs, eventfd buffer)
            // lives as long as the ring: both are owned by `self`.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            match self.ring.submit() {
                Ok(_) => {}
                Err(error) if is_transient(&error) => {}
                Err(error) => return Err(error),
            }
        }
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let read = opcode::Read::new(
            types::Fd(self.shared.wake.as_raw_fd()),
            (&raw mut *self.wake_value).cast(),
            8,
        )
        .build()
        .user_data(WAKE_TAG);
        self.push(&read.into())
    }

    fn run<FS: Filesystem>(
        mut self,
        registered: mpsc::Sender<Registered>,
        start: mpsc::Receiver<SessionEventLoop<FS>>,
    ) -> io::Result<()> {
        RING_THREAD.with(|ring| ring.set(Arc::as_ptr(&self.shared)));
        pin_to_cpu(usize::from(self.shared.qid));
        if self.sched_idle {
            let name = thread::current().name().unwrap_or("fuser-ring").to_string();
            self.idle_commit = IdleCommit::new(&name);
        }
        let result = self
            .register(&registered)
            .and_then(|arrived| match start.recv() {
                Ok(event_loop) => self.serve(&event_loop, arrived),
                // The session was dropped before it ran.
                Err(_) => Ok(()),
            });
        if self.live_entries > 0 {
            // The kernel may still copy a request into an armed entry until
            // the ring's cancellation reaches it: never free that memory.
            std::mem::forget(Arc::clone(&self.shared));
        }
        result
    }

    /// Registers every entry; what already completed (requests, failures)
    /// is returned for dispatch.
    fn register(&mut self, registered: &mpsc::Sender<Registered>) -> io::Result<Vec<(u64, i32)>> {
        for index in 0..self.iovecs.len() {
            let register = self.command(index, FUSE_IO_URING_CMD_REGISTER, 0);
            self.push(&register)?;
        }
        self.arm_wake()?;
        let submitted = self.ring.submit();
        // A registration is issued inline: a failure has completed by now.
        let arrived: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        let failed = arrived
            .iter()
            .find(|(tag, result)| *tag != WAKE_TAG && *result < 0);
        let report = match (&submitted, failed) {
            (Err(error), _) => Err(format!("io_uring_enter: {error}")),
            (Ok(_), Some((_, result))) => Err(format!(
                "FUSE_IO_URING_CMD_REGISTER: {}",
                io::Error::from_raw_os_error(-result)
            )),
            (Ok(_), None) => Ok(()),
        };
        let _ = registered.send(report);
        submitted?;
        Ok(arrived)
    }

    fn serve<FS: Filesystem>(
        &mut self,
        event_loop: &SessionEventLoop<FS>,
        mut arrived: Vec<(u64, i32)>,
    ) -> io::Result<()> {
        loop {
            // The requests this wake brought (besides background ones).
            let (mut requests, mut last_request) = (0usize, None);
            for (tag, result) in arrived.drain(..) {
                if let Some(index) = self.completed(event_loop, tag, result)?
                    && !self.background[usize::from(index)]
                {
                    requests += 1;
                    last_request = Some(index);
                }
            }
            if self.live_entries == 0 {
                debug!("io_uring queue {}: every entry ended", self.shared.qid);
                return Ok(());
            }
            if let Some(filesystem) = &event_loop.filesystem.fs {
                if let Some(fd) = filesystem.before_wait() {
                    if !self.fs_wait_armed {
                        let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
                            .build()
                            .user_data(FS_WAIT_TAG);
                        self.push(&poll.into())?;
                        self.fs_wait_armed = true;
                    }
                }
            }
            // Swapped with a spare list, so neither side allocates again.
            std::mem::swap(&mut *self.shared.commits.lock(), &mut self.commit_batch);
            let mut commits = std::mem::take(&mut self.commit_batch);
            // One reply is the synchronous hand-off SCHED_IDLE is for (a
            // caller blocked on it); a batch is mostly asynchronous I/O at
            // depth, whose submitter waits on no single reply, and a caller
            // woken by its first commit would preempt the rest of the batch.
            // And only when nothing else waits for this thread: with more
            // work queued, the caller preempting it would delay that work.
            // Background replies (releases) wake nobody: they count for
            // neither.
            let mut waking = commits
                .iter()
                .map(|(index, _)| *index)
                .filter(|index| !self.background[usize::from(*index)]);
            let first_waking = waking.next();
            let one_reply =
                first_waking.is_some() && waking.next().is_none() && self.ring.completion().is_empty();
            // A hand-off: that reply answers the one request this wake
            // brought, served at once; its caller sends the next one.
            let hand_off = one_reply && requests == 1 && last_request == first_waking;
            for (index, unique) in commits.drain(..) {
                let commit = self.command(
                    usize::from(index),
                    FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
                    unique,
                );
                self.push(&commit)?;
            }
            self.commit_batch = commits;
            if let Some(idle_commit) = &mut self.idle_commit {
                if first_waking.is_none() {
                    // Nobody to wake: the policy stays as it is.
                } else if !one_reply {
                    idle_commit.other();
                } else if hand_off && idle_commit.hand_off() {
                    // Committed with the wait below, both at SCHED_IDLE.
                } else {
                    // The commit wakes its caller on this CPU (see
                    // idle_commit); the wait below is at SCHED_OTHER again.
                    idle_commit.enter();
                    let submitted = self.ring.submit();
                    // Whatever reached the ring meanwhile waited for this
                    // thread.
                    let work_waited = !self.ring.completion().is_empty();
                    idle_commit.leave(work_waited);
                    match submitted {
                        Ok(_) => {}
                        Err(error) if is_transient(&error) => {}
                        Err(error) => return Err(error),
                    }
                }
            }
            let waited = self.ring.submit_and_wait(1);
            if let Some(idle_commit) = &mut self.idle_commit {
                idle_commit.woke();
            }
            if let Some(filesystem) = &event_loop.filesystem.fs {
                filesystem.after_wait();
            }
            match waited {
                Ok(_) => {}
                Err(error) if is_transient(&error) => {}
                Err(error) => return Err(error),
            }
            arrived.extend(
                self.ring
                    .completion()
                    .map(|cqe| (cqe.user_data(), cqe.result())),
            );
        }
    }

    fn completed<FS: Filesystem>(
        &mut self,
        event_loop: &SessionEventLoop<FS>,
        tag: u64,
        result: i32,
    ) -> io::Result<Option<u16>> {
        if tag == FS_WAIT_TAG {
            // Readable (or cancelled at teardown): the next `before_wait`
            // runs what is ready and asks for a new poll.
            self.fs_wait_armed = false;
            return Ok(None);
        }
        if tag == WAKE_TAG {
            if result < 0 && result != -libc::EINTR && result != -libc::EAGAIN {
                return Err(io::Error::from_raw_os_error(-result));
            }
            return self.arm_wake().map(|()| None);
        }
        let index = tag as usize;
        if result < 0 {
            // Unmount (-ENOTCONN) or abort ends the entry; anything else is
            // a protocol error worth saying.
            self.live_entries -= 1;
            match -result {
                libc::ENOTCONN | libc::ENODEV | libc::ECONNABORTED | libc::ECANCELED => {}
                errno => warn!(
                    "io_uring queue {} entry {index}: {}",
                    self.shared.qid,
                    io::Error::from_raw_os_error(errno)
                ),
            }
            return Ok(None);
        }
        self.dispatch(event_loop, index);
        Ok(u16::try_from(index).ok())
    }

    /// Rebuilds the request in entry `index` in the /dev/fuse layout and
    /// dispatches it like a request read from /dev/fuse.
    fn dispatch<FS: Filesystem>(&mut self, event_loop: &SessionEventLoop<FS>, index: usize) {
        let shared = Arc::clone(&self.shared);
        let entry = &shared.entries[index];
        // SAFETY: the kernel completed the entry, so it is ours until the
        // commit; nothing else writes the header meanwhile.
        let header = unsafe { &*entry.header };
        let in_header = &header.in_out[..IN_HEADER_BYTES];
        let length = u32::from_ne_bytes(in_header[..4].try_into().unwrap()) as usize;
        let unique = u64::from_ne_bytes(in_header[8..16].try_into().unwrap());
        let opcode = u32::from_ne_bytes(in_header[4..8].try_into().unwrap());
        self.background[index] = matches!(opcode, FUSE_RELEASE | FUSE_RELEASEDIR);
        let payload_bytes = header.ring_ent_in_out.payload_sz as usize;
        let op_in_bytes = length.checked_sub(IN_HEADER_BYTES + payload_bytes);
        let sender = EntrySender {
            ring: Arc::clone(&shared),
            index: index as u16,
        };
        let Some(op_in_bytes) = op_in_bytes
            .filter(|bytes| *bytes <= OP_IN_BYTES && payload_bytes <= shared.payload_bytes)
        else {
            error!(
                "io_uring queue {}: request {unique} of {length} bytes with a payload of \
                 {payload_bytes}: malformed",
                shared.qid
            );
            let reply: [&[u8]; 1] = [&error_header(unique, libc::EIO)];
            let unique = shared.write_reply(index, &reply);
            shared.queue_commit(index as u16, unique);
            return;
        };
        let headers_bytes = IN_HEADER_BYTES + op_in_bytes;
        let request: &[u8] = if headers_bytes % 8 == 0 {
            // SAFETY: the gap is ours (see above) and GAP_BYTES > 168; the
            // header lands 8-byte aligned, right before the payload.
            unsafe {
                let start = entry.area.add(GAP_BYTES - headers_bytes);
                std::ptr::copy_nonoverlapping(in_header.as_ptr(), start, IN_HEADER_BYTES);
                std::ptr::copy_nonoverlapping(
                    header.op_in.as_ptr(),
                    start.add(IN_HEADER_BYTES),
                    op_in_bytes,
                );
                std::slice::from_raw_parts(start, length)
            }
        } else {
            self.scratch.clear();
            self.scratch.resize(length.div_ceil(8), 0);
            // SAFETY: the scratch vector holds at least `length` bytes.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(self.scratch.as_mut_ptr().cast::<u8>(), length)
            };
            bytes[..IN_HEADER_BYTES].copy_from_slice(in_header);
            bytes[IN_HEADER_BYTES..headers_bytes].copy_from_slice(&header.op_in[..op_in_bytes]);
            // SAFETY: the payload holds `payload_bytes` bytes the kernel wrote.
            let payload =
                unsafe { std::slice::from_raw_parts(shared.payload(index), payload_bytes) };
            bytes[headers_bytes..].copy_from_slice(payload);
            bytes
        };
        {
            let mut state = entry.reply.lock();
            state.dispatching = true;
            state.request_has_payload = payload_bytes > 0;
        }
        match RequestWithSender::new(ReplyTo::Uring(sender.clone()), request) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                } else {
                    req.dispatch(event_loop);
                }
            }
            None => {
                let reply: [&[u8]; 1] = [&error_header(unique, libc::EIO)];
                let _ = sender.send(&[IoSlice::new(reply[0])]);
            }
        }
        let mut state = entry.reply.lock();
        state.dispatching = false;
        if !state.payload_lent {
            shared.commit_staged(index, state);
        }
    }
}

/// Keeps a ring thread on its queue's CPU (the kernel numbers queues by
/// CPU). The kernel queues a request on the caller's CPU and runs its
/// delivery as task work of the ring thread: on the same CPU, the caller
/// blocking and the ring thread waking is one local switch, where a thread
/// elsewhere costs a cross-CPU wake-up (an IPI, a VM exit on a guest) each
/// way. Best effort: a CPU outside the process's allowed set stays unpinned.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * size_of::<libc::cpu_set_t>() {
        return;
    }
    // SAFETY: `cpu` is within the set's bits (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is this thread; the set outlives the call.
    let pinned = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if pinned != 0 {
        debug!(
            "io_uring ring thread left unpinned (CPU {cpu}): {}",
            io::Error::last_os_error()
        );
    }
}

/// io_uring_enter failures worth another try: a signal, or completions to
/// reap first (the loop reaps them before it enters again).
fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
    )
}

fn error_header(unique: u64, errno: i32) -> [u8; OUT_HEADER_BYTES] {
    let mut out = [0u8; OUT_HEADER_BYTES];
    out[..4].copy_from_slice(&(OUT_HEADER_BYTES as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_as_the_kernel_does() {
        assert_eq!(count_cpu_list("0-1"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
    }

    #[test]
    fn error_headers_carry_a_negative_errno() {
        let header = error_header(7, libc::EIO);
        assert_eq!(
            i32::from_ne_bytes(header[4..8].try_into().unwrap()),
            -libc::EIO
        );
        assert_eq!(u64::from_ne_bytes(header[8..16].try_into().unwrap()), 7);
    }
}
