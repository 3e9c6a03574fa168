//! One connection of an NBD device, and how it survives losing its link.
//!
//! Callers write requests under the link's mutex; one reader thread reads
//! replies, pairs them with their requests by cookie and completes them.
//! Blocking calls are completed on the reader thread (they only wake their
//! caller); asynchronous callbacks run on a completion thread of their
//! own, since they may make blocking calls whose replies the reader must
//! read.
//!
//! A request stays in the in-flight table, with what it needs to be sent
//! again (a write keeps its payload), until its reply arrives. When the
//! link is lost (a read or write error, a protocol violation, or a request
//! without a reply for the request timeout), the connection reconnects
//! with backoff for up to `reconnect=SECONDS` and, before it carries any
//! other request:
//! 1. checks that the export is the same one: size, flags and block size
//!    from the handshake, and the first bytes of the export as last read
//!    or written;
//! 2. replays the writes acknowledged since the last completed FLUSH
//!    ([`ReplayLog`]), while no connection of the device sends anything
//!    else, so a server that lost its volatile cache gets them back
//!    before a new FLUSH can report success over their loss;
//! 3. sends again every request that had no reply, oldest first.
//!
//! Callers wait meanwhile. When the bound passes, or the export is a
//! different one, every request fails with EIO, as does every later one.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::handshake::{self, protocol, Negotiated};
use super::proto::{self, ChunkError, ChunkHeader, ReplyHeader, Request};
use super::replay::{KeptChange, ReplayLog};
use super::{NbdAddress, Stream};
use crate::dev::{AlignedBuf, DevCallback, DevResponse};

/// A chunk's payload beyond its data (error messages, block status) is
/// small; longer ones are refused rather than allocated.
const CHUNK_PAYLOAD_MAX_BYTES: u32 = 64 << 10;
/// How many of the export's first bytes identify it across a reconnect
/// (a volume's superblock lies there and is never rewritten).
pub(super) const IDENTITY_BYTES: usize = 512;
/// The first and the longest pause between reconnect attempts.
const RECONNECT_PAUSE_MIN: Duration = Duration::from_millis(20);
const RECONNECT_PAUSE_MAX: Duration = Duration::from_secs(1);
/// The longest TRIM or WRITE_ZEROES sent: a request's length is 32 bits.
pub(super) const DISCARD_PIECE_MAX_BYTES: u64 = 1 << 30;

/// Counters of what surviving lost links took.
#[derive(Debug, Default)]
pub(super) struct LinkCounters {
    pub reconnects: AtomicU64,
    pub requests_resent: AtomicU64,
    pub replayed_requests: AtomicU64,
    pub replayed_bytes: AtomicU64,
    pub flushes_forced: AtomicU64,
}

/// What every connection of a device shares.
pub(super) struct Shared {
    pub description: String,
    pub address: NbdAddress,
    pub negotiated: Negotiated,
    pub replay: Mutex<ReplayLog>,
    /// Connections replaying the log now; while any does, no other
    /// request goes out on any connection.
    replaying: AtomicUsize,
    /// One replay at a time.
    replay_turn: Mutex<()>,
    /// The export's first bytes as last read or written.
    identity: Mutex<Option<Vec<u8>>>,
    pub counters: LinkCounters,
    completions: Mutex<mpsc::Sender<(DevCallback, DevResponse)>>,
    connections: Mutex<Vec<Weak<Connection>>>,
}

impl Shared {
    pub fn new(description: String, address: NbdAddress, negotiated: Negotiated) -> Arc<Self> {
        let (completions, completion_queue) = mpsc::channel::<(DevCallback, DevResponse)>();
        std::thread::Builder::new()
            .name("nbd-complete".into())
            .spawn(move || {
                for (done, response) in completion_queue {
                    done(response)
                }
            })
            .expect("spawn the NBD completion thread");
        Arc::new(Self {
            description,
            address,
            negotiated,
            replay: Mutex::default(),
            replaying: AtomicUsize::new(0),
            replay_turn: Mutex::new(()),
            identity: Mutex::new(None),
            counters: LinkCounters::default(),
            completions: Mutex::new(completions),
            connections: Mutex::default(),
        })
    }

    fn keeps_replay(&self) -> bool {
        !self.address.reconnect_within.is_zero()
    }

    /// Notes what a completed request changed or showed; true for a write
    /// that keeping would take past `replay-mib`: it is not kept, and its
    /// acknowledgement waits for a FLUSH instead.
    fn note_completed(&self, request: &Request, buffer: Option<&AlignedBuf>, covers: u64) -> bool {
        let Request { flags, command, offset, length, .. } = *request;
        let length = u64::from(length);
        let at_start = offset < IDENTITY_BYTES as u64;
        match command {
            proto::CMD_READ if offset == 0 && length >= IDENTITY_BYTES as u64 => {
                let bytes = buffer.map(|buffer| buffer[..IDENTITY_BYTES].to_vec());
                *self.identity.lock() = bytes;
            }
            proto::CMD_WRITE => {
                let data = buffer.expect("a write keeps its payload until its reply");
                if at_start {
                    *self.identity.lock() = (offset == 0 && data.len() >= IDENTITY_BYTES)
                        .then(|| data[..IDENTITY_BYTES].to_vec());
                }
                if !self.keeps_replay() {
                    return false;
                }
                let mut replay = self.replay.lock();
                if flags & proto::CMD_FLAG_FUA != 0 {
                    replay.release_range(offset, length);
                    return false;
                }
                if replay.data_bytes() + length > self.address.replay_max_bytes {
                    return true;
                }
                let change = KeptChange::Data { data: Arc::from(&data[..]), start: 0 };
                replay.record(offset, length, change);
            }
            proto::CMD_WRITE_ZEROES | proto::CMD_TRIM => {
                if at_start {
                    *self.identity.lock() = None;
                }
                if self.keeps_replay() {
                    let change = if command == proto::CMD_TRIM {
                        KeptChange::Trim
                    } else {
                        KeptChange::Zeroes
                    };
                    self.replay.lock().record(offset, length, change);
                }
            }
            proto::CMD_FLUSH => self.replay.lock().release_through(covers),
            _ => {}
        }
        false
    }

    fn live_connections(&self) -> Vec<Arc<Connection>> {
        self.connections.lock().iter().filter_map(Weak::upgrade).collect()
    }

    pub fn adopt(&self, connections: &[Arc<Connection>]) {
        *self.connections.lock() = connections.iter().map(Arc::downgrade).collect();
    }

    /// The ranges changes in flight on any connection will write: newer
    /// than anything kept, so a replay leaves them alone.
    fn ranges_in_flight(&self) -> Vec<(u64, u64)> {
        let mut ranges = Vec::new();
        for connection in self.live_connections() {
            let inflight = connection.inflight.lock();
            ranges.extend(
                inflight.requests.values().filter(|entry| entry.internal.is_none()).filter_map(
                    |entry| {
                        let Request { command, offset, length, .. } = entry.request;
                        matches!(
                            command,
                            proto::CMD_WRITE | proto::CMD_WRITE_ZEROES | proto::CMD_TRIM
                        )
                        .then_some((offset, u64::from(length)))
                    },
                ),
            );
        }
        ranges
    }

    fn replaying(&self) -> bool {
        self.replaying.load(Ordering::SeqCst) > 0
    }
}

fn lost(description: &str, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        format!("NBD connection to {description} is lost: {why}"),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkState {
    /// Carrying requests.
    Up,
    /// Just reconnected: only the checks and the replay go out.
    Verifying,
    /// Lost; a reconnect thread is trying.
    Down,
    /// Failed for good (or closed): every request fails.
    Dead,
}

struct Link {
    stream: Option<Stream>,
    /// The reader's handle on `stream`, until the reader takes it.
    reader: Option<Stream>,
    /// Counts the links: a request records which one it went out on.
    generation: u64,
    state: LinkState,
    /// When the link went down; the reconnect bound counts from here.
    lost_at: Option<Instant>,
}

struct Inflight {
    requests: HashMap<u64, Pending>,
    /// Mirrors of the link's, readable without the link's lock.
    generation: u64,
    state: LinkState,
    /// Why the connection is dead; set once, never cleared.
    failure: Option<String>,
}

struct Pending {
    request: Request,
    /// A read's target, or a write's payload (kept until the reply, to be
    /// sent again after a reconnect).
    buffer: Option<AlignedBuf>,
    /// A sender holds a write's payload while it writes it; a reply that
    /// arrives meanwhile is parked in `replied`.
    transmitting: bool,
    replied: Option<io::Result<()>>,
    /// The link generation the request last went out on whole.
    on_link: Option<u64>,
    /// The first error chunk of a structured reply not yet DONE.
    chunk_error: Option<io::Error>,
    /// When it last went out: the request timeout counts from here.
    started: Instant,
    done: DevCallback,
    /// Completed on the reader thread (a blocking caller's wake-up).
    inline: bool,
    /// A reconnect's own check or replay, for the link `on_link` names
    /// only; never sent again.
    internal: Option<u64>,
    /// For a FLUSH: the replay sequence it covers.
    covers: u64,
    /// A write answered on this link and held for a FLUSH (past the
    /// replay bound); no reply is awaited.
    held_on: Option<u64>,
}

/// How a rejoin attempt ended.
enum Rejoin {
    Done {
        replayed_requests: u64,
        replayed_bytes: u64,
        resent_requests: u64,
    },
    /// The link was lost again; `link_lost` started another attempt.
    LostAgain,
    /// The device was closed meanwhile.
    Closed,
    /// The export is not the one the device was opened on, or refused
    /// what it must take back.
    Refused(String),
}

pub(super) struct Connection {
    shared: Arc<Shared>,
    link: Mutex<Link>,
    link_changed: Condvar,
    inflight: Mutex<Inflight>,
    next_cookie: AtomicU64,
    structured: AtomicBool,
    closing: AtomicBool,
}

impl Connection {
    /// A connection on `stream`, just negotiated.
    pub fn new(shared: &Arc<Shared>, stream: Stream) -> io::Result<Arc<Self>> {
        let reader = reader_handle(&stream, shared.address.request_timeout)?;
        Ok(Arc::new(Self {
            structured: AtomicBool::new(shared.negotiated.structured),
            shared: Arc::clone(shared),
            link: Mutex::new(Link {
                stream: Some(stream),
                reader: Some(reader),
                generation: 1,
                state: LinkState::Up,
                lost_at: None,
            }),
            link_changed: Condvar::new(),
            inflight: Mutex::new(Inflight {
                requests: HashMap::new(),
                generation: 1,
                state: LinkState::Up,
                failure: None,
            }),
            next_cookie: AtomicU64::new(1),
            closing: AtomicBool::new(false),
        }))
    }

    /// Queues a request and sends it when the link allows; `done` runs
    /// once, with the buffer back.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        self: &Arc<Self>,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        buffer: Option<AlignedBuf>,
        done: DevCallback,
        inline: bool,
    ) {
        self.enqueue(
            Request { flags, command, cookie: 0, offset, length },
            buffer,
            done,
            inline,
            None,
        )
    }

    fn enqueue(
        self: &Arc<Self>,
        mut request: Request,
        buffer: Option<AlignedBuf>,
        done: DevCallback,
        inline: bool,
        internal: Option<u64>,
    ) {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        request.cookie = cookie;
        // The header's length is the buffer's: a write's payload, a read's room.
        debug_assert!(
            buffer.as_ref().is_none_or(|buffer| buffer.len() == request.length as usize),
            "an NBD {} of {} bytes with a buffer of another length",
            proto::command_name(request.command),
            request.length
        );
        debug_assert!(
            request.command != proto::CMD_WRITE || buffer.is_some(),
            "an NBD write without data"
        );
        let covers = if request.command == proto::CMD_FLUSH {
            self.shared.replay.lock().sequence()
        } else {
            0
        };
        {
            let mut inflight = self.inflight.lock();
            if let Some(why) = &inflight.failure {
                let error = lost(&self.shared.description, why);
                drop(inflight);
                return done(DevResponse { buffer, result: Err(error) });
            }
            let previous = inflight.requests.insert(
                cookie,
                Pending {
                    request,
                    buffer,
                    transmitting: false,
                    replied: None,
                    on_link: None,
                    chunk_error: None,
                    started: Instant::now(),
                    done,
                    inline,
                    internal,
                    covers,
                    held_on: None,
                },
            );
            debug_assert!(previous.is_none(), "NBD cookie {cookie} given to two requests");
        }
        self.transmit(cookie);
    }

    /// Whether `entry` may go out now: a caller's request on a link that
    /// is up while nothing replays, a reconnect's own on its link.
    fn may_send(&self, inflight: &Inflight, entry: &Pending) -> bool {
        match entry.internal {
            Some(generation) => {
                inflight.state == LinkState::Verifying && inflight.generation == generation
            }
            None => inflight.state == LinkState::Up && !self.shared.replaying(),
        }
    }

    /// Writes request `cookie` on the current link, unless it is already
    /// there or the link cannot take it now (a reconnect sends it later).
    fn transmit(self: &Arc<Self>, cookie: u64) {
        loop {
            let (request, payload) = {
                let mut inflight = self.inflight.lock();
                let generation = inflight.generation;
                let Some(entry) = inflight.requests.get(&cookie) else { return };
                if entry.transmitting || entry.on_link == Some(generation) {
                    return;
                }
                if !self.may_send(&inflight, entry) {
                    if entry.internal.is_some() {
                        // Its link is gone: so is the check it was for.
                        let entry = inflight.requests.remove(&cookie).expect("present");
                        drop(inflight);
                        let error = lost(&self.shared.description, "the link went down again");
                        self.complete(entry, Err(error));
                    }
                    return;
                }
                let entry = inflight.requests.get_mut(&cookie).expect("present");
                entry.transmitting = true;
                entry.held_on = None;
                // Whatever an earlier link said of it no longer counts.
                entry.chunk_error = None;
                entry.started = Instant::now();
                let payload = match entry.request.command {
                    proto::CMD_WRITE => entry.buffer.take(),
                    _ => None,
                };
                (entry.request, payload)
            };
            let (written_on, written) = {
                let mut link = self.link.lock();
                let generation = link.generation;
                let state = link.state;
                let written = match (&mut link.stream, state) {
                    (Some(stream), LinkState::Up | LinkState::Verifying) => {
                        stream.write_all(&request.encode()).and_then(|()| match &payload {
                            Some(payload) => stream.write_all(payload),
                            None => Ok(()),
                        })
                    }
                    _ => Err(io::Error::other("the link is down")),
                };
                (generation, written)
            };
            let mut inflight = self.inflight.lock();
            let entry = inflight
                .requests
                .get_mut(&cookie)
                .expect("a transmitting request stays until its sender lets go");
            if payload.is_some() {
                entry.buffer = payload;
            }
            entry.transmitting = false;
            if written.is_ok() {
                entry.on_link = Some(written_on);
            }
            if let Some(result) = entry.replied.take() {
                let entry = inflight.requests.remove(&cookie).expect("present");
                drop(inflight);
                return self.complete(entry, result);
            }
            let current = inflight.generation;
            drop(inflight);
            match written {
                // A reconnect that came meanwhile passed over this request.
                Ok(()) if written_on != current => continue,
                Ok(()) => return,
                Err(error) => {
                    let why = format!("sending {}: {error}", proto::command_name(request.command));
                    self.link_lost(written_on, &why);
                }
            }
        }
    }

    /// A reply arrived (or the request failed): note what it changed and
    /// hand it back, or hold a write that cannot be kept until a FLUSH.
    fn complete(self: &Arc<Self>, entry: Pending, result: io::Result<()>) {
        if result.is_ok()
            && entry.internal.is_none()
            && self.shared.note_completed(&entry.request, entry.buffer.as_ref(), entry.covers)
        {
            return self.hold_until_flushed(entry);
        }
        self.hand_back(entry, result)
    }

    fn hand_back(&self, entry: Pending, result: io::Result<()>) {
        let response = DevResponse { buffer: entry.buffer, result };
        if entry.inline {
            (entry.done)(response)
        } else {
            let _ = self.shared.completions.lock().send((entry.done, response));
        }
    }

    /// Past `replay-mib` a write is not copied: it stays in the table, its
    /// payload with it, until a FLUSH sent after its reply completes. A
    /// link lost meanwhile sends the write itself again, so the bound holds
    /// and nothing acknowledged can be lost.
    fn hold_until_flushed(self: &Arc<Self>, mut entry: Pending) {
        let cookie = entry.request.cookie;
        let Some(generation) = entry.on_link else {
            return self.hand_back(entry, Err(io::Error::other("a reply to a request never sent")));
        };
        {
            let mut inflight = self.inflight.lock();
            if let Some(why) = &inflight.failure {
                let error = lost(&self.shared.description, why);
                drop(inflight);
                return self.hand_back(entry, Err(error));
            }
            entry.held_on = Some(generation);
            inflight.requests.insert(cookie, entry);
        }
        self.shared.counters.flushes_forced.fetch_add(1, Ordering::Relaxed);
        // Sent from the completion thread: the reader, which may be here,
        // must stay free to read the FLUSH's reply.
        let connection = Arc::clone(self);
        let send_flush: DevCallback = Box::new(move |_| {
            let then = Arc::clone(&connection);
            let release: DevCallback =
                Box::new(move |flushed| then.release_held(cookie, generation, flushed.result));
            connection.send(proto::CMD_FLUSH, 0, 0, 0, None, release, false)
        });
        let idle = DevResponse { buffer: None, result: Ok(()) };
        let _ = self.shared.completions.lock().send((send_flush, idle));
    }

    /// The FLUSH for a held write completed: hand the write back, unless
    /// it went out again on a newer link (its new reply decides then).
    fn release_held(&self, cookie: u64, generation: u64, result: io::Result<()>) {
        let entry = {
            let mut inflight = self.inflight.lock();
            match inflight.requests.get(&cookie) {
                Some(entry) if entry.held_on == Some(generation) && !entry.transmitting => {
                    inflight.requests.remove(&cookie).expect("present")
                }
                _ => return,
            }
        };
        self.hand_back(entry, result)
    }

    /// Closes the connection: a polite goodbye, then every request fails.
    pub fn close(self: &Arc<Self>) {
        self.closing.store(true, Ordering::Release);
        {
            let mut link = self.link.lock();
            if let Some(stream) = &mut link.stream {
                let disconnect =
                    Request { flags: 0, command: proto::CMD_DISC, cookie: 0, offset: 0, length: 0 };
                // The server may already be gone.
                let _ = stream.write_all(&disconnect.encode());
            }
        }
        self.die("the device was closed");
    }

    /// Fails the connection for good: every request in flight and every
    /// later one gets EIO.
    fn die(self: &Arc<Self>, why: &str) {
        {
            let mut link = self.link.lock();
            link.state = LinkState::Dead;
            if let Some(stream) = link.stream.take() {
                let _ = stream.shutdown(Shutdown::Both);
            }
            link.reader = None;
            self.link_changed.notify_all();
        }
        let finished: Vec<Pending> = {
            let mut inflight = self.inflight.lock();
            inflight.state = LinkState::Dead;
            inflight.failure.get_or_insert_with(|| why.to_string());
            let cookies: Vec<u64> = inflight.requests.keys().copied().collect();
            let mut finished = Vec::new();
            for cookie in cookies {
                let entry = inflight.requests.get_mut(&cookie).expect("listed");
                if entry.transmitting {
                    // Its sender ends it.
                    entry.replied = Some(Err(lost(&self.shared.description, why)));
                } else {
                    finished.push(inflight.requests.remove(&cookie).expect("listed"));
                }
            }
            finished
        };
        if !self.closing.load(Ordering::Acquire) {
            tracing::error!("NBD connection to {} failed: {why}", self.shared.description);
        }
        for entry in finished {
            self.complete(entry, Err(lost(&self.shared.description, why)));
        }
    }

    /// The link of `generation` failed: reconnect (or die where that is
    /// off). Whoever notices first acts; later reports of the same link
    /// are ignored.
    fn link_lost(self: &Arc<Self>, generation: u64, why: &str) {
        let abandoned: Vec<Pending> = {
            let mut link = self.link.lock();
            if link.generation != generation
                || !matches!(link.state, LinkState::Up | LinkState::Verifying)
            {
                return;
            }
            if let Some(stream) = link.stream.take() {
                let _ = stream.shutdown(Shutdown::Both);
            }
            link.reader = None;
            if self.closing.load(Ordering::Acquire) || !self.shared.keeps_replay() {
                drop(link);
                let why = if self.closing.load(Ordering::Acquire) {
                    "the device was closed"
                } else {
                    why
                };
                return self.die(why);
            }
            link.state = LinkState::Down;
            link.lost_at.get_or_insert_with(Instant::now);
            let mut inflight = self.inflight.lock();
            inflight.state = LinkState::Down;
            // A reconnect's own requests belong to the link that is gone.
            let internal: Vec<u64> = inflight
                .requests
                .iter()
                .filter(|(_, entry)| entry.internal.is_some() && !entry.transmitting)
                .map(|(cookie, _)| *cookie)
                .collect();
            internal
                .iter()
                .map(|cookie| inflight.requests.remove(cookie).expect("listed"))
                .collect()
        };
        for entry in abandoned {
            self.complete(entry, Err(lost(&self.shared.description, why)));
        }
        tracing::warn!(
            "NBD connection to {} lost ({why}); reconnecting for up to {} s",
            self.shared.description,
            self.shared.address.reconnect_within.as_secs()
        );
        let connection = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nbd-reconnect".into())
            .spawn(move || connection.reconnect());
        if let Err(error) = spawned {
            self.die(&format!("{why}; no thread to reconnect: {error}"));
        }
    }

    /// Tries to bring the link back until the bound passes.
    fn reconnect(self: Arc<Self>) {
        let lost_at = self.link.lock().lost_at.unwrap_or_else(Instant::now);
        let deadline = lost_at + self.shared.address.reconnect_within;
        let mut pause = RECONNECT_PAUSE_MIN;
        let mut last_error = String::from("no attempt finished");
        loop {
            if self.closing.load(Ordering::Acquire) {
                return self.die("the device was closed");
            }
            let now = Instant::now();
            if now >= deadline {
                let bound = self.shared.address.reconnect_within.as_secs();
                return self.die(&format!("not back within {bound} s (reconnect=): {last_error}"));
            }
            let patience = (deadline - now).min(self.shared.address.request_timeout);
            match handshake::connect(&self.shared.address, patience) {
                Ok((stream, negotiated)) if !self.shared.negotiated.same_export(&negotiated) => {
                    let was = self.shared.negotiated;
                    drop(stream);
                    return self.die(&format!(
                        "after reconnecting, the export is {} bytes with flags {:#x} where it was \
                         {} bytes with flags {:#x}: a different export, refused",
                        negotiated.size_bytes,
                        negotiated.transmission_flags,
                        was.size_bytes,
                        was.transmission_flags
                    ));
                }
                Ok((stream, negotiated)) => match self.rejoin(stream, negotiated.structured) {
                    Ok(Rejoin::Done { replayed_requests, replayed_bytes, resent_requests }) => {
                        return self.report_back(
                            lost_at,
                            replayed_requests,
                            replayed_bytes,
                            resent_requests,
                        )
                    }
                    Ok(Rejoin::LostAgain | Rejoin::Closed) => return,
                    Ok(Rejoin::Refused(why)) => return self.die(&why),
                    Err(error) => last_error = error.to_string(),
                },
                Err(error) => last_error = error.to_string(),
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(RECONNECT_PAUSE_MAX);
        }
    }

    fn report_back(
        &self,
        lost_at: Instant,
        replayed_requests: u64,
        replayed_bytes: u64,
        resent_requests: u64,
    ) {
        tracing::warn!(
            "NBD connection to {} is back after {} ms; {replayed_requests} unflushed changes \
             ({replayed_bytes} bytes) replayed, {resent_requests} requests without a reply sent \
             again",
            self.shared.description,
            lost_at.elapsed().as_millis()
        );
    }

    /// Puts a fresh, negotiated stream in place and does what must come
    /// before any caller's request: the identity check and the replay.
    fn rejoin(self: &Arc<Self>, stream: Stream, structured: bool) -> io::Result<Rejoin> {
        let reader = reader_handle(&stream, self.shared.address.request_timeout)?;
        let generation = {
            let mut link = self.link.lock();
            if link.state != LinkState::Down {
                return Ok(Rejoin::Closed);
            }
            link.generation += 1;
            link.stream = Some(stream);
            link.reader = Some(reader);
            link.state = LinkState::Verifying;
            let mut inflight = self.inflight.lock();
            inflight.generation = link.generation;
            inflight.state = LinkState::Verifying;
            self.structured.store(structured, Ordering::Release);
            self.link_changed.notify_all();
            link.generation
        };
        if let Some(outcome) = self.check_identity(generation) {
            return Ok(outcome);
        }
        let _turn = self.shared.replay_turn.lock();
        self.shared.replaying.fetch_add(1, Ordering::SeqCst);
        let outcome = self.replay_kept(generation);
        let outcome = match outcome {
            Rejoin::Done { .. } => {
                let mut link = self.link.lock();
                if link.generation == generation && link.state == LinkState::Verifying {
                    link.state = LinkState::Up;
                    link.lost_at = None;
                    self.inflight.lock().state = LinkState::Up;
                    // Counted before anything waiting completes, so that
                    // whoever sees a request done sees its reconnect too.
                    if let Rejoin::Done { replayed_requests, replayed_bytes, .. } = outcome {
                        let counters = &self.shared.counters;
                        counters.reconnects.fetch_add(1, Ordering::Relaxed);
                        counters.replayed_requests.fetch_add(replayed_requests, Ordering::Relaxed);
                        counters.replayed_bytes.fetch_add(replayed_bytes, Ordering::Relaxed);
                    }
                    outcome
                } else {
                    Rejoin::LostAgain
                }
            }
            other => other,
        };
        self.shared.replaying.fetch_sub(1, Ordering::SeqCst);
        // Whatever waited for the link, or for the replay, goes out now.
        let mut resent_requests = 0;
        for connection in self.shared.live_connections() {
            resent_requests += connection.resend_pending();
        }
        Ok(match outcome {
            Rejoin::Done { replayed_requests, replayed_bytes, .. } => {
                Rejoin::Done { replayed_requests, replayed_bytes, resent_requests }
            }
            other => other,
        })
    }

    /// Sends a reconnect's own request on link `generation` and waits for
    /// its reply.
    fn call_internal(
        self: &Arc<Self>,
        request: Request,
        buffer: Option<AlignedBuf>,
        generation: u64,
    ) -> mpsc::Receiver<DevResponse> {
        let (sender, receiver) = mpsc::channel();
        let done: DevCallback = Box::new(move |response| {
            let _ = sender.send(response);
        });
        self.enqueue(request, buffer, done, true, Some(generation));
        receiver
    }

    /// Reads the export's first bytes and compares them with what the
    /// device last read or wrote there; None when they match or nothing
    /// is known to compare.
    fn check_identity(self: &Arc<Self>, generation: u64) -> Option<Rejoin> {
        let expected = self.shared.identity.lock().clone()?;
        let unsettled = self.shared.replay.lock().touches(0, IDENTITY_BYTES as u64)
            || self
                .shared
                .ranges_in_flight()
                .iter()
                .any(|(offset, _)| *offset < IDENTITY_BYTES as u64);
        if unsettled {
            // The server may hold the old bytes or the new ones.
            return None;
        }
        let read = Request {
            flags: 0,
            command: proto::CMD_READ,
            cookie: 0,
            offset: 0,
            length: IDENTITY_BYTES as u32,
        };
        let receiver =
            self.call_internal(read, Some(AlignedBuf::zeroed(IDENTITY_BYTES)), generation);
        match receiver.recv() {
            Ok(DevResponse { result: Ok(()), buffer: Some(found) })
                if found[..] == expected[..] =>
            {
                None
            }
            Ok(DevResponse { result: Ok(()), .. }) => Some(Rejoin::Refused(format!(
                "after reconnecting, the export's first {IDENTITY_BYTES} bytes differ from what \
                 this device last read or wrote there: a different export, refused"
            ))),
            Ok(DevResponse { result: Err(error), .. })
                if error.kind() != io::ErrorKind::ConnectionAborted =>
            {
                Some(Rejoin::Refused(format!("reading the export's first block: {error}")))
            }
            _ => Some(Rejoin::LostAgain),
        }
    }

    /// Replays every kept change outside the ranges still in flight, and
    /// waits until the server acknowledged them all.
    fn replay_kept(self: &Arc<Self>, generation: u64) -> Rejoin {
        let in_flight = self.shared.ranges_in_flight();
        let pieces = self.shared.replay.lock().pieces_outside(&in_flight);
        let payload_max_bytes = u64::from(self.shared.negotiated.payload_max_bytes);
        let mut receivers = Vec::new();
        let mut replayed_bytes = 0;
        for piece in &pieces {
            let (command, piece_max_bytes) = match piece.change {
                KeptChange::Data { .. } => (proto::CMD_WRITE, payload_max_bytes),
                KeptChange::Zeroes => (proto::CMD_WRITE_ZEROES, DISCARD_PIECE_MAX_BYTES),
                KeptChange::Trim => (proto::CMD_TRIM, DISCARD_PIECE_MAX_BYTES),
            };
            let mut done_bytes = 0;
            while done_bytes < piece.length {
                let length = piece_max_bytes.min(piece.length - done_bytes);
                let buffer = piece.data().map(|data| {
                    AlignedBuf::from_slice(
                        &data[done_bytes as usize..(done_bytes + length) as usize],
                    )
                });
                let request = Request {
                    flags: 0,
                    command,
                    cookie: 0,
                    offset: piece.offset + done_bytes,
                    length: length as u32,
                };
                receivers.push(self.call_internal(request, buffer, generation));
                done_bytes += length;
                replayed_bytes += length;
            }
        }
        let replayed_requests = receivers.len() as u64;
        for receiver in receivers {
            match receiver.recv() {
                Ok(DevResponse { result: Ok(()), .. }) => {}
                Ok(DevResponse { result: Err(error), .. })
                    if error.kind() != io::ErrorKind::ConnectionAborted =>
                {
                    return Rejoin::Refused(format!(
                        "the server refused a write it had acknowledged before it restarted: \
                         {error}"
                    ));
                }
                _ => return Rejoin::LostAgain,
            }
        }
        Rejoin::Done { replayed_requests, replayed_bytes, resent_requests: 0 }
    }

    /// Sends every caller's request that has not gone out on the current
    /// link, oldest first; returns how many had gone out on an earlier one.
    fn resend_pending(self: &Arc<Self>) -> u64 {
        let mut waiting: Vec<(u64, bool)> = {
            let inflight = self.inflight.lock();
            if inflight.state != LinkState::Up {
                return 0;
            }
            inflight
                .requests
                .iter()
                .filter(|(_, entry)| {
                    entry.internal.is_none()
                        && !entry.transmitting
                        && entry.on_link != Some(inflight.generation)
                })
                .map(|(cookie, entry)| (*cookie, entry.on_link.is_some()))
                .collect()
        };
        waiting.sort_unstable();
        let resent = waiting.iter().filter(|(_, sent_before)| *sent_before).count() as u64;
        self.shared.counters.requests_resent.fetch_add(resent, Ordering::Relaxed);
        for (cookie, _) in waiting {
            self.transmit(cookie);
        }
        resent
    }

    /// The reader thread: replies on each link in turn, until the
    /// connection dies.
    pub fn read_replies(self: Arc<Self>) {
        let mut generation = 0;
        while let Some((mut stream, current)) = self.wait_for_link(generation) {
            generation = current;
            let why = loop {
                if let Err(error) = self.read_reply(&mut stream) {
                    break error.to_string();
                }
            };
            self.link_lost(generation, &why);
        }
    }

    /// Waits for a link newer than `after`; None once the connection died.
    fn wait_for_link(&self, after: u64) -> Option<(Stream, u64)> {
        let mut link = self.link.lock();
        loop {
            match link.state {
                LinkState::Dead => return None,
                LinkState::Up | LinkState::Verifying if link.generation > after => {
                    if let Some(reader) = link.reader.take() {
                        return Some((reader, link.generation));
                    }
                    // Taken already: wait for the next link.
                    self.link_changed.wait(&mut link);
                }
                _ => self.link_changed.wait(&mut link),
            }
        }
    }

    /// Fills `buffer`, checking the oldest request's age whenever the
    /// socket stays silent for a tick.
    fn read_full(&self, stream: &mut Stream, buffer: &mut [u8]) -> io::Result<()> {
        let mut filled = 0;
        while filled < buffer.len() {
            match stream.read(&mut buffer[filled..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ))
                }
                Ok(read) => filled += read,
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    self.check_timeout()?
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    fn check_timeout(&self) -> io::Result<()> {
        if self.closing.load(Ordering::Acquire) {
            return Err(io::Error::other("closing"));
        }
        let inflight = self.inflight.lock();
        let oldest = inflight
            .requests
            .values()
            .filter(|entry| {
                !entry.transmitting
                    && entry.held_on.is_none()
                    && entry.on_link == Some(inflight.generation)
            })
            .min_by_key(|entry| entry.started);
        let timeout = self.shared.address.request_timeout;
        match oldest {
            Some(entry) if entry.started.elapsed() > timeout => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no reply to {} at {} for {} s",
                    proto::command_name(entry.request.command),
                    entry.request.offset,
                    timeout.as_secs()
                ),
            )),
            _ => Ok(()),
        }
    }

    fn read_reply(self: &Arc<Self>, stream: &mut Stream) -> io::Result<()> {
        let mut magic = [0; 4];
        self.read_full(stream, &mut magic)?;
        let mut rest = [0; proto::CHUNK_HEADER_REST_BYTES];
        let rest = &mut rest[..ReplyHeader::rest_bytes(magic)?];
        self.read_full(stream, rest)?;
        match ReplyHeader::decode(magic, rest)? {
            ReplyHeader::Simple(reply) => {
                let command = self.command_of(reply.cookie)?;
                if command == proto::CMD_READ && reply.error == 0 {
                    self.fill_buffer(stream, reply.cookie, |stream, buffer| {
                        self.read_full(stream, buffer)
                    })?;
                }
                let result = match reply.error {
                    0 => Ok(()),
                    error => Err(io::Error::from_raw_os_error(proto::errno_from_error(error))),
                };
                self.finish(reply.cookie, result);
                Ok(())
            }
            ReplyHeader::Chunk(chunk) => {
                if !self.structured.load(Ordering::Acquire) {
                    return Err(protocol("structured reply without negotiation".into()));
                }
                self.read_chunk(stream, chunk)?;
                if chunk.is_done() {
                    let error = {
                        let mut inflight = self.inflight.lock();
                        inflight
                            .requests
                            .get_mut(&chunk.cookie)
                            .and_then(|entry| entry.chunk_error.take())
                    };
                    self.finish(chunk.cookie, error.map_or(Ok(()), Err));
                }
                Ok(())
            }
        }
    }

    /// The command of the request `cookie` names, which must be awaiting
    /// its reply on this link.
    fn command_of(&self, cookie: u64) -> io::Result<u16> {
        let inflight = self.inflight.lock();
        inflight
            .requests
            .get(&cookie)
            .filter(|entry| entry.replied.is_none())
            .map(|entry| entry.request.command)
            .ok_or_else(|| protocol(format!("reply to unknown cookie {cookie}")))
    }

    /// Runs `fill` on the read buffer of `cookie`, outside the lock.
    fn fill_buffer(
        &self,
        stream: &mut Stream,
        cookie: u64,
        fill: impl FnOnce(&mut Stream, &mut AlignedBuf) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut buffer = {
            let mut inflight = self.inflight.lock();
            inflight
                .requests
                .get_mut(&cookie)
                .filter(|entry| entry.request.command == proto::CMD_READ)
                .and_then(|entry| entry.buffer.take())
                .ok_or_else(|| protocol(format!("data for cookie {cookie}, not a read")))?
        };
        let filled = fill(stream, &mut buffer);
        if let Some(entry) = self.inflight.lock().requests.get_mut(&cookie) {
            entry.buffer = Some(buffer);
        }
        filled
    }

    fn read_chunk(&self, stream: &mut Stream, chunk: ChunkHeader) -> io::Result<()> {
        let (command, request_offset, request_length) = {
            let inflight = self.inflight.lock();
            let entry = inflight
                .requests
                .get(&chunk.cookie)
                .filter(|entry| entry.replied.is_none())
                .ok_or_else(|| protocol(format!("chunk for unknown cookie {}", chunk.cookie)))?;
            (entry.request.command, entry.request.offset, u64::from(entry.request.length))
        };
        // Where `length` bytes at `offset` land in the read buffer.
        let place = |offset: u64, length: u64| -> io::Result<usize> {
            if command != proto::CMD_READ
                || offset < request_offset
                || offset.saturating_add(length) > request_offset + request_length
            {
                return Err(protocol(format!(
                    "chunk at {offset} of {length} bytes outside the request at \
                     {request_offset} of {request_length}"
                )));
            }
            Ok((offset - request_offset) as usize)
        };
        match chunk.chunk_type {
            proto::CHUNK_NONE if chunk.length == 0 => Ok(()),
            proto::CHUNK_OFFSET_DATA if chunk.length >= 8 => {
                let mut offset = [0; 8];
                self.read_full(stream, &mut offset)?;
                let length = u64::from(chunk.length - 8);
                let start = place(u64::from_be_bytes(offset), length)?;
                self.fill_buffer(stream, chunk.cookie, |stream, buffer| {
                    self.read_full(stream, &mut buffer[start..start + length as usize])
                })
            }
            proto::CHUNK_OFFSET_HOLE if chunk.length == 12 => {
                let mut payload = [0; 12];
                self.read_full(stream, &mut payload)?;
                let mut reader = proto::Reader::new(&payload, "hole chunk");
                let (offset, length) = (reader.u64()?, u64::from(reader.u32()?));
                let start = place(offset, length)?;
                self.fill_buffer(stream, chunk.cookie, |_, buffer| {
                    buffer[start..start + length as usize].fill(0);
                    Ok(())
                })
            }
            chunk_type if chunk_type & (1 << 15) != 0 => {
                if chunk.length > CHUNK_PAYLOAD_MAX_BYTES {
                    return Err(protocol(format!("error chunk of {} bytes", chunk.length)));
                }
                let mut payload = vec![0; chunk.length as usize];
                self.read_full(stream, &mut payload)?;
                // Unknown error types still carry the error first.
                let decoded = ChunkError::decode(chunk_type, &payload).unwrap_or(ChunkError {
                    error: proto::EIO,
                    message: format!("error chunk of type {chunk_type}"),
                    offset: None,
                });
                let error = io::Error::from_raw_os_error(proto::errno_from_error(decoded.error));
                if !decoded.message.is_empty() {
                    tracing::warn!(
                        "NBD server {}: {} at {}: {}",
                        self.shared.description,
                        proto::command_name(command),
                        request_offset,
                        decoded.message
                    );
                }
                let mut inflight = self.inflight.lock();
                if let Some(entry) = inflight.requests.get_mut(&chunk.cookie) {
                    entry.chunk_error.get_or_insert(error);
                }
                Ok(())
            }
            other => Err(protocol(format!(
                "unexpected chunk type {other} of {} bytes for {}",
                chunk.length,
                proto::command_name(command)
            ))),
        }
    }

    /// A reply is complete: hand the request back, or park the result for
    /// a sender still holding a write's payload.
    fn finish(self: &Arc<Self>, cookie: u64, result: io::Result<()>) {
        let mut inflight = self.inflight.lock();
        let Some(entry) = inflight.requests.get_mut(&cookie) else { return };
        if entry.transmitting {
            entry.replied = Some(result);
            return;
        }
        let entry = inflight.requests.remove(&cookie).expect("present");
        drop(inflight);
        self.complete(entry, result);
    }
}

/// The reader's handle on `stream`: it wakes every tick (a quarter of the
/// request timeout, at most a second) to check for requests without reply.
fn reader_handle(stream: &Stream, request_timeout: Duration) -> io::Result<Stream> {
    let reader = stream.try_clone()?;
    reader.set_read_timeout(Some((request_timeout / 4).min(Duration::from_secs(1))))?;
    Ok(reader)
}
