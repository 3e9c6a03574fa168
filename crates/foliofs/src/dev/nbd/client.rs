//! The NBD client backend: many requests in flight on one connection, or
//! on several when the server offers multi-conn (`connections=N`).
//!
//! Callers write requests under a mutex; one reader thread reads replies,
//! pairs them with their requests by cookie and completes them. Blocking
//! calls are completed on the reader thread (they only wake their caller);
//! asynchronous callbacks run on a completion thread of their own, since
//! they may make blocking calls whose replies the reader must read.
//!
//! Durability follows the spec's rules: a FUA write is the FUA flag when
//! the server offers SEND_FUA, else the write and, once it is answered, a
//! FLUSH (QEMU's `emulate_flags`). A lost connection, a timed-out request
//! or a protocol violation fails every request in flight and every later
//! one with EIO: nothing after it may be believed durable.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::proto::{self, ChunkError, ChunkHeader, GoRequest, Info, ReplyHeader, Request};
use super::{NbdAddress, Stream};
use crate::dev::{
    AlignedBuf, DevCallback, DevOptions, DevRequest, DevResponse, DiscardMode, RawDev,
};

/// The smallest logical block used: the engine's direct I/O unit, and
/// what the spec asks clients to align to when the server names none.
const LOGICAL_BLOCK_MIN_BYTES: u32 = 512;
/// A chunk's payload beyond its data (error messages, block status) is
/// small; longer ones are refused rather than allocated.
const CHUNK_PAYLOAD_MAX_BYTES: u32 = 64 << 10;
/// The longest TRIM or WRITE_ZEROES sent: a request's length is 32 bits,
/// and servers split long ones themselves.
const DISCARD_PIECE_MAX_BYTES: u64 = 1 << 30;

/// What the handshake agreed.
#[derive(Debug, Clone, Copy)]
struct Negotiated {
    size_bytes: u64,
    transmission_flags: u16,
    structured: bool,
    block_min_bytes: u32,
    payload_max_bytes: u32,
}

impl Negotiated {
    fn has(&self, flag: u16) -> bool {
        self.transmission_flags & flag != 0
    }
}

/// A volume's device on an NBD export.
pub struct NbdDev {
    /// One, or `connections=N` when the server offers CAN_MULTI_CONN (its
    /// FLUSH and FUA then cover the writes answered on every connection).
    connections: Vec<Arc<Connection>>,
    next_connection: AtomicUsize,
    negotiated: Negotiated,
    logical_block_bytes: u32,
    readers: Vec<JoinHandle<()>>,
}

struct Connection {
    description: String,
    writer: Mutex<Stream>,
    inflight: Mutex<Inflight>,
    next_cookie: AtomicU64,
    structured: bool,
    request_timeout: Duration,
    closing: AtomicBool,
    completions: Mutex<mpsc::Sender<(DevCallback, DevResponse)>>,
}

#[derive(Default)]
struct Inflight {
    requests: HashMap<u64, Pending>,
    /// Why the connection is unusable; set once, never cleared.
    failure: Option<String>,
}

struct Pending {
    command: u16,
    offset: u64,
    length: u32,
    /// A read's target, or a write's payload once it is on the wire.
    buffer: Option<AlignedBuf>,
    /// Whether the sender is done with the request (a write's payload is
    /// back in `buffer`); until then the reply is parked in `replied`.
    sent: bool,
    replied: Option<io::Result<()>>,
    /// The first error chunk of a structured reply not yet DONE.
    chunk_error: Option<io::Error>,
    started: Instant,
    done: DevCallback,
    /// Completed on the reader thread (a blocking caller's wake-up).
    inline: bool,
}

fn lost(description: &str, why: &str) -> io::Error {
    io::Error::other(format!("NBD connection to {description} is lost: {why}"))
}

fn protocol(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl NbdDev {
    /// Connects to `uri`, negotiates, and checks that the export can hold
    /// a volume opened as `options` asks.
    pub fn open(uri: &str, options: &DevOptions) -> io::Result<Self> {
        let address = NbdAddress::parse(uri)?;
        let (first, negotiated) = connect(&address)?;
        if !options.read_only {
            if negotiated.has(proto::TF_READ_ONLY) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the export is read-only; open it with -o ro",
                ));
            }
            if !negotiated.has(proto::TF_SEND_FLUSH) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the server does not support FLUSH, so no write could be made durable; enable \
                     flush on the server (nbd-server: flush = true) or open with -o ro",
                ));
            }
        }
        let logical_block_bytes = negotiated.block_min_bytes.max(LOGICAL_BLOCK_MIN_BYTES);
        if negotiated.size_bytes < u64::from(logical_block_bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the export holds only {} bytes", negotiated.size_bytes),
            ));
        }
        let mut streams = vec![first];
        if address.connections > 1 {
            if negotiated.has(proto::TF_CAN_MULTI_CONN) {
                for _ in 1..address.connections {
                    let (stream, also) = connect(&address)?;
                    if (also.size_bytes, also.transmission_flags)
                        != (negotiated.size_bytes, negotiated.transmission_flags)
                    {
                        return Err(protocol(
                            "the server described the export differently on another connection"
                                .into(),
                        ));
                    }
                    streams.push(stream);
                }
            } else {
                // Without the promise a FLUSH on one connection need not
                // cover writes answered on another (the spec: SHOULD NOT).
                tracing::warn!(
                    "{uri}: the server does not offer multi-conn; using one connection, not {}",
                    address.connections
                );
            }
        }
        let (completions, completion_queue) = mpsc::channel::<(DevCallback, DevResponse)>();
        std::thread::Builder::new().name("nbd-complete".into()).spawn(move || {
            for (done, response) in completion_queue {
                done(response)
            }
        })?;
        let tick = (address.request_timeout / 4).min(Duration::from_secs(1));
        let mut connections = Vec::new();
        let mut readers = Vec::new();
        for stream in streams {
            let reader_stream = stream.try_clone()?;
            reader_stream.set_read_timeout(Some(tick))?;
            let connection = Arc::new(Connection {
                description: uri.to_string(),
                writer: Mutex::new(stream),
                inflight: Mutex::default(),
                next_cookie: AtomicU64::new(1),
                structured: negotiated.structured,
                request_timeout: address.request_timeout,
                closing: AtomicBool::new(false),
                completions: Mutex::new(completions.clone()),
            });
            let reader = Arc::clone(&connection);
            readers.push(
                std::thread::Builder::new()
                    .name("nbd-reader".into())
                    .spawn(move || reader.read_replies(reader_stream))?,
            );
            connections.push(connection);
        }
        Ok(Self {
            connections,
            next_connection: AtomicUsize::new(0),
            negotiated,
            logical_block_bytes,
            readers,
        })
    }

    /// How many connections carry requests.
    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    /// The export's transmission flags (NBD_FLAG_*), as the server sent them.
    pub fn transmission_flags(&self) -> u16 {
        self.negotiated.transmission_flags
    }

    /// Whether replies may be structured (negotiated at the handshake).
    pub fn structured_replies(&self) -> bool {
        self.negotiated.structured
    }

    fn check_length(&self, length: usize) -> io::Result<u32> {
        u32::try_from(length)
            .ok()
            .filter(|length| *length <= self.negotiated.payload_max_bytes)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "NBD request of {length} bytes exceeds the server's maximum of {}",
                        self.negotiated.payload_max_bytes
                    ),
                )
            })
    }

    /// Sends a request and, for FUA writes the server cannot flag, the
    /// FLUSH after its reply; `done` gets the buffer back.
    fn start(&self, request: DevRequest, done: DevCallback, inline: bool) {
        debug_assert!(!self.connections.is_empty(), "an NBD device with no connection");
        let next = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let connection = &self.connections[next % self.connections.len()];
        match request {
            DevRequest::Read { offset, buffer } => match self.check_length(buffer.len()) {
                Ok(length) => {
                    connection.send(proto::CMD_READ, 0, offset, length, Some(buffer), done, inline)
                }
                Err(error) => done(DevResponse { buffer: Some(buffer), result: Err(error) }),
            },
            DevRequest::Write { offset, buffer, fua } => {
                let length = match self.check_length(buffer.len()) {
                    Ok(length) => length,
                    Err(error) => {
                        return done(DevResponse { buffer: Some(buffer), result: Err(error) })
                    }
                };
                if !fua || self.negotiated.has(proto::TF_SEND_FUA) {
                    let flags = if fua { proto::CMD_FLAG_FUA } else { 0 };
                    return connection.send(
                        proto::CMD_WRITE,
                        flags,
                        offset,
                        length,
                        Some(buffer),
                        done,
                        inline,
                    );
                }
                // The flush covers only writes already answered: send it
                // from the write's completion.
                let then_flush = Arc::clone(connection);
                let after_write: DevCallback = Box::new(move |written: DevResponse| {
                    if written.result.is_err() {
                        return done(written);
                    }
                    let buffer = written.buffer;
                    then_flush.send(
                        proto::CMD_FLUSH,
                        0,
                        0,
                        0,
                        None,
                        Box::new(move |flushed| {
                            done(DevResponse { buffer, result: flushed.result })
                        }),
                        inline,
                    )
                });
                connection.send(
                    proto::CMD_WRITE,
                    0,
                    offset,
                    length,
                    Some(buffer),
                    after_write,
                    false,
                )
            }
            DevRequest::Flush => {
                if !self.negotiated.has(proto::TF_SEND_FLUSH) {
                    // Only a read-only open gets here: nothing was written.
                    return done(DevResponse { buffer: None, result: Ok(()) });
                }
                connection.send(proto::CMD_FLUSH, 0, 0, 0, None, done, inline)
            }
        }
    }

    /// TRIM or WRITE_ZEROES over `length` bytes at `offset`, in pieces a
    /// 32-bit length holds, all in flight at once; the first error wins.
    fn discard_range(&self, offset: u64, length: u64, mode: DiscardMode) -> io::Result<()> {
        let (command, flag) = match mode {
            DiscardMode::Trim => (proto::CMD_TRIM, proto::TF_SEND_TRIM),
            DiscardMode::Zero => (proto::CMD_WRITE_ZEROES, proto::TF_SEND_WRITE_ZEROES),
        };
        if !self.negotiated.has(flag) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the NBD server does not offer {}", proto::command_name(command)),
            ));
        }
        let piece_max_bytes = DISCARD_PIECE_MAX_BYTES / u64::from(self.logical_block_bytes)
            * u64::from(self.logical_block_bytes);
        // Each piece's length goes out as a u32, and each piece moves on.
        debug_assert!(piece_max_bytes > 0 && piece_max_bytes <= u64::from(u32::MAX));
        let (sender, receiver) = mpsc::channel();
        let mut pieces = 0;
        let mut piece_offset = offset;
        while piece_offset < offset + length {
            let piece_bytes = piece_max_bytes.min(offset + length - piece_offset);
            let next = self.next_connection.fetch_add(1, Ordering::Relaxed);
            let connection = &self.connections[next % self.connections.len()];
            let sender = sender.clone();
            connection.send(
                command,
                0,
                piece_offset,
                piece_bytes as u32,
                None,
                Box::new(move |response| {
                    let _ = sender.send(response.result);
                }),
                true,
            );
            pieces += 1;
            piece_offset += piece_bytes;
        }
        debug_assert_eq!(piece_offset, offset + length);
        drop(sender);
        let mut outcome = Ok(());
        for _ in 0..pieces {
            let result = receiver
                .recv()
                .unwrap_or_else(|_| Err(lost(&self.connections[0].description, "request dropped")));
            if outcome.is_ok() {
                outcome = result;
            }
        }
        outcome
    }

    fn run(&self, request: DevRequest) -> DevResponse {
        let (sender, receiver) = mpsc::sync_channel(1);
        self.start(
            request,
            Box::new(move |response| {
                let _ = sender.send(response);
            }),
            true,
        );
        receiver.recv().unwrap_or_else(|_| DevResponse {
            buffer: None,
            result: Err(lost(&self.connections[0].description, "request dropped")),
        })
    }
}

impl Drop for NbdDev {
    fn drop(&mut self) {
        for connection in &self.connections {
            connection.closing.store(true, Ordering::Release);
            let mut writer = connection.writer.lock();
            let disconnect =
                Request { flags: 0, command: proto::CMD_DISC, cookie: 0, offset: 0, length: 0 };
            // A polite goodbye; the server may already be gone.
            let _ = writer.write_all(&disconnect.encode());
            let _ = writer.shutdown(Shutdown::Both);
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl RawDev for NbdDev {
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        let length: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        let response = self.run(DevRequest::Read { offset, buffer: AlignedBuf::zeroed(length) });
        response.result?;
        let data = response.buffer.expect("a read returns its buffer");
        let mut copied = 0;
        for buffer in buffers.iter_mut() {
            let end = copied + buffer.len();
            buffer.copy_from_slice(&data[copied..end]);
            copied = end;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        let length: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        let mut payload = AlignedBuf::zeroed(length);
        let mut copied = 0;
        for buffer in buffers {
            payload[copied..copied + buffer.len()].copy_from_slice(buffer);
            copied += buffer.len();
        }
        self.run(DevRequest::Write { offset, buffer: payload, fua }).result
    }

    fn flush(&self) -> io::Result<()> {
        self.run(DevRequest::Flush).result
    }

    fn submit(&self, request: DevRequest, done: DevCallback) {
        self.start(request, done, false)
    }

    fn discard(&self, offset: u64, length: u64, mode: DiscardMode) -> io::Result<()> {
        self.discard_range(offset, length, mode)
    }

    fn size_bytes(&self) -> u64 {
        // Whole logical blocks only: the tail cannot be addressed aligned.
        self.negotiated.size_bytes / u64::from(self.logical_block_bytes)
            * u64::from(self.logical_block_bytes)
    }

    fn logical_block_bytes(&self) -> u32 {
        self.logical_block_bytes
    }
}

impl Connection {
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        buffer: Option<AlignedBuf>,
        done: DevCallback,
        inline: bool,
    ) {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let is_write = command == proto::CMD_WRITE;
        let (stashed, payload) = if is_write { (None, buffer) } else { (buffer, None) };
        // The header's length is the buffer's: a write's payload, a read's room.
        debug_assert!(
            stashed
                .as_ref()
                .or(payload.as_ref())
                .is_none_or(|buffer| buffer.len() == length as usize),
            "an NBD {} of {length} bytes with a buffer of another length",
            proto::command_name(command)
        );
        debug_assert!(!is_write || payload.is_some(), "an NBD write without data");
        {
            let mut inflight = self.inflight.lock();
            if let Some(why) = &inflight.failure {
                let error = lost(&self.description, why);
                drop(inflight);
                let buffer = stashed.or(payload);
                return done(DevResponse { buffer, result: Err(error) });
            }
            let previous = inflight.requests.insert(
                cookie,
                Pending {
                    command,
                    offset,
                    length,
                    buffer: stashed,
                    sent: !is_write,
                    replied: None,
                    chunk_error: None,
                    started: Instant::now(),
                    done,
                    inline,
                },
            );
            debug_assert!(previous.is_none(), "NBD cookie {cookie} given to two requests");
        }
        let header = Request { flags, command, cookie, offset, length }.encode();
        let written = {
            let mut writer = self.writer.lock();
            writer.write_all(&header).and_then(|()| match &payload {
                Some(payload) => writer.write_all(payload),
                None => Ok(()),
            })
        };
        if let Err(error) = written {
            self.fail(&format!("sending {}: {error}", proto::command_name(command)));
        }
        if is_write {
            let mut inflight = self.inflight.lock();
            let entry =
                inflight.requests.get_mut(&cookie).expect("only the sender ends an unsent write");
            entry.buffer = payload;
            entry.sent = true;
            if let Some(result) = entry.replied.take() {
                let entry = inflight.requests.remove(&cookie).expect("present");
                drop(inflight);
                self.complete(entry, result);
            }
        }
    }

    fn complete(&self, entry: Pending, result: io::Result<()>) {
        let response = DevResponse { buffer: entry.buffer, result };
        if entry.inline {
            (entry.done)(response)
        } else {
            let _ = self.completions.lock().send((entry.done, response));
        }
    }

    /// Marks the connection unusable and fails every request in flight;
    /// unsent writes are failed by their senders.
    fn fail(&self, why: &str) {
        let finished: Vec<Pending> = {
            let mut inflight = self.inflight.lock();
            if inflight.failure.is_none() {
                inflight.failure = Some(why.to_string());
            }
            let cookies: Vec<u64> = inflight.requests.keys().copied().collect();
            let mut finished = Vec::new();
            for cookie in cookies {
                let entry = inflight.requests.get_mut(&cookie).expect("listed");
                if entry.sent {
                    finished.push(inflight.requests.remove(&cookie).expect("listed"));
                } else {
                    entry.replied = Some(Err(lost(&self.description, why)));
                }
            }
            // What is left in flight are unsent writes, which their senders end.
            debug_assert!(inflight.requests.values().all(|entry| !entry.sent));
            finished
        };
        if !self.closing.load(Ordering::Acquire) {
            tracing::error!("NBD connection to {} failed: {why}", self.description);
        }
        let _ = self.writer.lock().shutdown(Shutdown::Both);
        for entry in finished {
            let error = lost(&self.description, why);
            self.complete(entry, Err(error));
        }
    }

    fn read_replies(self: Arc<Self>, mut stream: Stream) {
        let why = loop {
            if let Err(error) = self.read_reply(&mut stream) {
                break if self.closing.load(Ordering::Acquire) {
                    "the device was closed".to_string()
                } else {
                    error.to_string()
                };
            }
        };
        self.fail(&why);
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
        let oldest =
            inflight.requests.values().filter(|entry| entry.sent).min_by_key(|e| e.started);
        match oldest {
            Some(entry) if entry.started.elapsed() > self.request_timeout => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no reply to {} at {} for {} s",
                    proto::command_name(entry.command),
                    entry.offset,
                    self.request_timeout.as_secs()
                ),
            )),
            _ => Ok(()),
        }
    }

    fn read_reply(&self, stream: &mut Stream) -> io::Result<()> {
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
                if !self.structured {
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

    fn command_of(&self, cookie: u64) -> io::Result<u16> {
        let inflight = self.inflight.lock();
        inflight
            .requests
            .get(&cookie)
            .filter(|entry| entry.replied.is_none())
            .map(|entry| entry.command)
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
            (entry.command, entry.offset, u64::from(entry.length))
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
                        self.description,
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
    fn finish(&self, cookie: u64, result: io::Result<()>) {
        let mut inflight = self.inflight.lock();
        let Some(entry) = inflight.requests.get_mut(&cookie) else { return };
        if !entry.sent {
            entry.replied = Some(result);
            return;
        }
        let entry = inflight.requests.remove(&cookie).expect("present");
        drop(inflight);
        self.complete(entry, result);
    }
}

fn read_exact(stream: &mut Stream, buffer: &mut [u8]) -> io::Result<()> {
    stream.read_exact(buffer).map_err(|error| match error.kind() {
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection during the handshake",
        ),
        _ => error,
    })
}

/// Reads one option reply to `option`: its type and data.
fn read_option_reply(stream: &mut Stream, option: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut header = [0; proto::OPTION_REPLY_HEADER_BYTES];
    read_exact(stream, &mut header)?;
    let (replied_to, reply_type, length) = proto::decode_option_reply_header(&header)?;
    if replied_to != option {
        return Err(protocol(format!("reply to option {replied_to} while asking {option}")));
    }
    let mut data = vec![0; length as usize];
    read_exact(stream, &mut data)?;
    Ok((reply_type, data))
}

fn option_error(option: &str, reply_type: u32, data: &[u8]) -> io::Error {
    let reason = match reply_type {
        proto::REP_ERR_UNSUP => "unsupported",
        proto::REP_ERR_POLICY => "refused by policy",
        proto::REP_ERR_INVALID => "invalid",
        proto::REP_ERR_PLATFORM => "unsupported on the server's platform",
        proto::REP_ERR_TLS_REQD => "refused without TLS (not supported here)",
        proto::REP_ERR_UNKNOWN => "unknown export",
        proto::REP_ERR_SHUTDOWN => "refused: the server is shutting down",
        proto::REP_ERR_BLOCK_SIZE_REQD => "refused without block size negotiation",
        proto::REP_ERR_TOO_BIG => "too big",
        _ => "failed",
    };
    let message = String::from_utf8_lossy(data);
    let kind = if reply_type == proto::REP_ERR_UNKNOWN {
        io::ErrorKind::NotFound
    } else {
        io::ErrorKind::Unsupported
    };
    io::Error::new(kind, format!("{option}: {reason} ({reply_type:#x}) {message}"))
}

/// Connects and negotiates one connection.
fn connect(address: &NbdAddress) -> io::Result<(Stream, Negotiated)> {
    let mut stream = address
        .connect()
        .map_err(|error| io::Error::new(error.kind(), format!("connect: {error}")))?;
    // Neither the handshake nor a request may hang on a peer that stopped
    // reading or answering: after the timeout the connection is lost.
    stream.set_read_timeout(Some(address.request_timeout))?;
    stream.set_write_timeout(Some(address.request_timeout))?;
    let negotiated = handshake(&mut stream, &address.export)
        .map_err(|error| io::Error::new(error.kind(), format!("NBD handshake: {error}")))?;
    Ok((stream, negotiated))
}

/// Fixed newstyle negotiation: structured replies if offered, then
/// NBD_OPT_GO asking for the block size constraints.
fn handshake(stream: &mut Stream, export: &str) -> io::Result<Negotiated> {
    let mut greeting = [0; 18];
    read_exact(stream, &mut greeting)?;
    let mut reader = proto::Reader::new(&greeting, "greeting");
    if reader.u64()? != proto::NBD_MAGIC {
        return Err(protocol("the peer is not an NBD server (no NBDMAGIC)".into()));
    }
    match reader.u64()? {
        proto::IHAVEOPT => {}
        proto::OLDSTYLE_MAGIC => {
            return Err(protocol("the server speaks the oldstyle handshake only".into()))
        }
        other => return Err(protocol(format!("unknown handshake magic {other:#x}"))),
    }
    let handshake_flags = reader.u16()?;
    if handshake_flags & proto::FLAG_FIXED_NEWSTYLE == 0 {
        return Err(protocol("the server does not speak fixed newstyle".into()));
    }
    let mut client_flags = proto::CLIENT_FIXED_NEWSTYLE;
    if handshake_flags & proto::FLAG_NO_ZEROES != 0 {
        client_flags |= proto::CLIENT_NO_ZEROES;
    }
    stream.write_all(&client_flags.to_be_bytes())?;

    stream.write_all(&proto::encode_option(proto::OPT_STRUCTURED_REPLY, &[]))?;
    let (reply_type, _) = read_option_reply(stream, proto::OPT_STRUCTURED_REPLY)?;
    let structured = match reply_type {
        proto::REP_ACK => true,
        error if error & proto::REP_FLAG_ERROR != 0 => false,
        other => return Err(protocol(format!("reply {other} to NBD_OPT_STRUCTURED_REPLY"))),
    };

    let go = GoRequest { name: export.to_string(), info_requests: vec![proto::INFO_BLOCK_SIZE] };
    stream.write_all(&proto::encode_option(proto::OPT_GO, &go.encode()))?;
    let mut export_info = None;
    let mut block_min_bytes = 1;
    let mut payload_max_bytes = proto::PAYLOAD_DEFAULT_MAX_BYTES;
    loop {
        let (reply_type, data) = read_option_reply(stream, proto::OPT_GO)?;
        match reply_type {
            proto::REP_ACK => break,
            proto::REP_INFO => match Info::decode(&data)? {
                Info::Export { size_bytes, transmission_flags } => {
                    export_info = Some((size_bytes, transmission_flags))
                }
                Info::BlockSize { minimum, maximum, .. } => {
                    block_min_bytes = minimum;
                    payload_max_bytes = maximum.min(proto::PAYLOAD_DEFAULT_MAX_BYTES);
                }
                Info::Other(_) => {}
            },
            error if error & proto::REP_FLAG_ERROR != 0 => {
                return Err(option_error(&format!("export {export:?}"), error, &data))
            }
            other => return Err(protocol(format!("reply {other} to NBD_OPT_GO"))),
        }
    }
    let (size_bytes, transmission_flags) =
        export_info.ok_or_else(|| protocol("NBD_OPT_GO ended without the export's size".into()))?;
    if block_min_bytes > 64 << 10 {
        return Err(protocol(format!("minimum block size {block_min_bytes} is too large")));
    }
    Ok(Negotiated {
        size_bytes,
        transmission_flags,
        structured,
        block_min_bytes,
        payload_max_bytes: payload_max_bytes.max(block_min_bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    const EXPORT_BYTES: u64 = 1 << 20;

    /// A one-connection server: the handshake as `flags` and `structured`
    /// say, then `serve` with the stream.
    fn fake_server(
        flags: u16,
        structured: bool,
        serve: impl FnOnce(&mut UnixStream) + Send + 'static,
    ) -> (tempfile::TempDir, String, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("fake.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let thread = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut greeting = proto::NBD_MAGIC.to_be_bytes().to_vec();
            greeting.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
            greeting.extend_from_slice(&proto::FLAG_FIXED_NEWSTYLE.to_be_bytes());
            stream.write_all(&greeting).unwrap();
            stream.read_exact(&mut [0; 4]).unwrap();
            loop {
                let mut header = [0; proto::OPTION_HEADER_BYTES];
                stream.read_exact(&mut header).unwrap();
                let (option, length) = proto::decode_option_header(&header).unwrap();
                stream.read_exact(&mut vec![0; length as usize]).unwrap();
                let reply =
                    |reply_type, data: &[u8]| proto::encode_option_reply(option, reply_type, data);
                match option {
                    proto::OPT_STRUCTURED_REPLY if structured => {
                        stream.write_all(&reply(proto::REP_ACK, &[])).unwrap()
                    }
                    proto::OPT_GO => {
                        let info = Info::Export {
                            size_bytes: EXPORT_BYTES,
                            transmission_flags: proto::TF_HAS_FLAGS | flags,
                        };
                        stream.write_all(&reply(proto::REP_INFO, &info.encode())).unwrap();
                        stream.write_all(&reply(proto::REP_ACK, &[])).unwrap();
                        break;
                    }
                    _ => stream.write_all(&reply(proto::REP_ERR_UNSUP, &[])).unwrap(),
                }
            }
            serve(&mut stream);
        });
        let uri = format!("nbd+unix:///disk?socket={}&timeout=1", socket.display());
        (dir, uri, thread)
    }

    fn read_request(stream: &mut UnixStream) -> Option<Request> {
        let mut header = [0; proto::REQUEST_HEADER_BYTES];
        stream.read_exact(&mut header).ok()?;
        Some(Request::decode(&header).unwrap())
    }

    fn writable() -> DevOptions {
        DevOptions::default()
    }

    #[test]
    fn a_read_write_open_without_flush_is_refused() {
        let (_dir, uri, server) =
            fake_server(0, false, |stream| while read_request(stream).is_some() {});
        let error = NbdDev::open(&uri, &writable()).err().expect("refused");
        assert!(error.to_string().contains("does not support FLUSH"), "{error}");
        server.join().unwrap();
        let (_dir, uri, server) =
            fake_server(0, false, |stream| while read_request(stream).is_some() {});
        let read_only = DevOptions { read_only: true, ..DevOptions::default() };
        let device = NbdDev::open(&uri, &read_only).unwrap();
        assert_eq!(device.size_bytes(), EXPORT_BYTES);
        drop(device);
        server.join().unwrap();
    }

    #[test]
    fn a_failed_flush_is_eio() {
        let (_dir, uri, server) = fake_server(proto::TF_SEND_FLUSH, false, |stream| {
            while let Some(request) = read_request(stream) {
                if request.command == proto::CMD_DISC {
                    break;
                }
                let error = if request.command == proto::CMD_FLUSH { proto::EIO } else { 0 };
                let reply = proto::SimpleReply { error, cookie: request.cookie };
                stream.write_all(&reply.encode()).unwrap();
            }
        });
        let device = NbdDev::open(&uri, &writable()).unwrap();
        let error = device.flush().unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
        drop(device);
        server.join().unwrap();
    }

    #[test]
    fn a_lost_connection_fails_requests_in_flight_and_later_ones_with_eio() {
        let (_dir, uri, server) = fake_server(proto::TF_SEND_FLUSH, false, |stream| {
            // Read one request, then vanish without replying.
            read_request(stream);
        });
        let device = NbdDev::open(&uri, &writable()).unwrap();
        let mut buffer = [0; 512];
        let error = device.read_at(0, &mut [IoSliceMut::new(&mut buffer)]).unwrap_err();
        assert!(error.to_string().contains("lost"), "{error}");
        let error = device.flush().unwrap_err();
        assert!(error.to_string().contains("lost"), "{error}");
        server.join().unwrap();
        drop(device);
    }

    #[test]
    fn discards_are_trim_and_write_zeroes_only_where_offered() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&seen);
        let flags = proto::TF_SEND_FLUSH | proto::TF_SEND_TRIM;
        let (_dir, uri, server) = fake_server(flags, false, move |stream| {
            while let Some(request) = read_request(stream) {
                if request.command == proto::CMD_DISC {
                    break;
                }
                recorded.lock().push((request.command, request.offset, request.length));
                let reply = proto::SimpleReply { error: 0, cookie: request.cookie };
                stream.write_all(&reply.encode()).unwrap();
            }
        });
        let device = NbdDev::open(&uri, &writable()).unwrap();
        device.discard(8192, 65536, DiscardMode::Trim).unwrap();
        let error = device.discard(0, 4096, DiscardMode::Zero).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::Unsupported, "{error}");
        assert!(error.to_string().contains("WRITE_ZEROES"), "{error}");
        drop(device);
        server.join().unwrap();
        assert_eq!(*seen.lock(), [(proto::CMD_TRIM, 8192, 65536)], "nothing sent for the refusal");
    }

    #[test]
    fn a_request_without_reply_times_out() {
        let (_dir, uri, server) = fake_server(proto::TF_SEND_FLUSH, false, |stream| {
            // Hold the connection open, never replying, until the client hangs up.
            while read_request(stream).is_some() {}
        });
        let device = NbdDev::open(&uri, &writable()).unwrap();
        let error = device.flush().unwrap_err();
        assert!(error.to_string().contains("no reply to FLUSH"), "{error}");
        drop(device);
        server.join().unwrap();
    }

    #[test]
    fn structured_read_chunks_are_assembled_in_any_order() {
        let (_dir, uri, server) = fake_server(proto::TF_SEND_FLUSH, true, |stream| {
            let request = read_request(stream).unwrap();
            assert_eq!((request.command, request.length), (proto::CMD_READ, 4096));
            let chunk = |flags, chunk_type, length| ChunkHeader {
                flags,
                chunk_type,
                cookie: request.cookie,
                length,
            };
            // The second half as data, then the first half as a hole.
            let mut data = chunk(0, proto::CHUNK_OFFSET_DATA, 8 + 2048).encode().to_vec();
            data.extend_from_slice(&(request.offset + 2048).to_be_bytes());
            data.extend_from_slice(&[0xee; 2048]);
            stream.write_all(&data).unwrap();
            let mut hole =
                chunk(proto::CHUNK_FLAG_DONE, proto::CHUNK_OFFSET_HOLE, 12).encode().to_vec();
            hole.extend_from_slice(&request.offset.to_be_bytes());
            hole.extend_from_slice(&2048u32.to_be_bytes());
            stream.write_all(&hole).unwrap();
            while read_request(stream).is_some() {}
        });
        let device = NbdDev::open(&uri, &writable()).unwrap();
        assert!(device.structured_replies());
        let mut buffer = [0x11; 4096];
        device.read_at(8192, &mut [IoSliceMut::new(&mut buffer)]).unwrap();
        assert!(buffer[..2048].iter().all(|byte| *byte == 0));
        assert!(buffer[2048..].iter().all(|byte| *byte == 0xee));
        drop(device);
        server.join().unwrap();
    }
}
