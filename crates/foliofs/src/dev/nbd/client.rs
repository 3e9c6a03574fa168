//! The NBD client backend: many requests in flight on one connection, or
//! on several when the server offers multi-conn (`connections=N`). Each
//! connection ([`link`](super::link)) survives a lost link: it reconnects,
//! replays what the server acknowledged but may not have made durable,
//! and sends again what had no reply.
//!
//! Durability follows the spec's rules: a FUA write is the FUA flag when
//! the server offers SEND_FUA, else the write and, once it is answered, a
//! FLUSH (QEMU's `emulate_flags`). A link not back within the reconnect
//! bound, or a different export behind the address, fails every request
//! in flight and every later one with EIO: nothing after it may be
//! believed durable.

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use super::handshake::{self, protocol};
use super::link::{Connection, Shared, DISCARD_PIECE_MAX_BYTES};
use super::proto;
use super::NbdAddress;
use crate::dev::{
    AlignedBuf, DevCallback, DevOptions, DevRequest, DevResponse, DiscardMode, RawDev,
};

/// The smallest logical block used: the engine's direct I/O unit, and
/// what the spec asks clients to align to when the server names none.
const LOGICAL_BLOCK_MIN_BYTES: u32 = 512;

/// What surviving lost links took, for logs and `foliofs info`-style
/// reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Links lost and brought back.
    pub reconnects: u64,
    /// Requests sent again because their link was lost before the reply.
    pub requests_resent: u64,
    /// Acknowledged, unflushed changes sent again after a reconnect, and
    /// their bytes.
    pub replayed_requests: u64,
    pub replayed_bytes: u64,
    /// Written data kept for replay now, and at most so far.
    pub replay_data_bytes: u64,
    pub replay_data_bytes_peak: u64,
    /// Writes not kept because keeping them would pass `replay-mib`: each
    /// was acknowledged only after a FLUSH made it durable.
    pub flushes_forced: u64,
}

/// A volume's device on an NBD export.
pub struct NbdDev {
    shared: Arc<Shared>,
    /// One, or `connections=N` when the server offers CAN_MULTI_CONN (its
    /// FLUSH and FUA then cover the writes answered on every connection).
    connections: Vec<Arc<Connection>>,
    next_connection: AtomicUsize,
    logical_block_bytes: u32,
    readers: Vec<JoinHandle<()>>,
}

impl NbdDev {
    /// Connects to `uri`, negotiates, and checks that the export can hold
    /// a volume opened as `options` asks.
    pub fn open(uri: &str, options: &DevOptions) -> io::Result<Self> {
        let address = NbdAddress::parse(uri)?;
        let (first, negotiated) = handshake::connect(&address, address.request_timeout)?;
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
                    let (stream, also) = handshake::connect(&address, address.request_timeout)?;
                    if !also.same_export(&negotiated) {
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
        let shared = Shared::new(uri.to_string(), address, negotiated);
        let mut connections = Vec::new();
        let mut readers = Vec::new();
        for stream in streams {
            let connection = Connection::new(&shared, stream)?;
            let reader = Arc::clone(&connection);
            readers.push(
                std::thread::Builder::new()
                    .name("nbd-reader".into())
                    .spawn(move || reader.read_replies())?,
            );
            connections.push(connection);
        }
        shared.adopt(&connections);
        Ok(Self {
            shared,
            connections,
            next_connection: AtomicUsize::new(0),
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
        self.shared.negotiated.transmission_flags
    }

    /// Whether replies may be structured (negotiated at the handshake).
    pub fn structured_replies(&self) -> bool {
        self.shared.negotiated.structured
    }

    /// What surviving lost links took so far.
    pub fn link_stats(&self) -> LinkStats {
        let counters = &self.shared.counters;
        let replay = self.shared.replay.lock();
        LinkStats {
            reconnects: counters.reconnects.load(Ordering::Relaxed),
            requests_resent: counters.requests_resent.load(Ordering::Relaxed),
            replayed_requests: counters.replayed_requests.load(Ordering::Relaxed),
            replayed_bytes: counters.replayed_bytes.load(Ordering::Relaxed),
            replay_data_bytes: replay.data_bytes(),
            replay_data_bytes_peak: replay.data_bytes_peak(),
            flushes_forced: counters.flushes_forced.load(Ordering::Relaxed),
        }
    }

    fn check_length(&self, length: usize) -> io::Result<u32> {
        let payload_max_bytes = self.shared.negotiated.payload_max_bytes;
        u32::try_from(length).ok().filter(|length| *length <= payload_max_bytes).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "NBD request of {length} bytes exceeds the server's maximum of \
                     {payload_max_bytes}"
                ),
            )
        })
    }

    fn next_connection(&self) -> &Arc<Connection> {
        debug_assert!(!self.connections.is_empty(), "an NBD device with no connection");
        let next = self.next_connection.fetch_add(1, Ordering::Relaxed);
        &self.connections[next % self.connections.len()]
    }

    /// Sends a request and, for FUA writes the server cannot flag, the
    /// FLUSH after its reply; `done` gets the buffer back.
    fn start(&self, request: DevRequest, done: DevCallback, inline: bool) {
        let connection = self.next_connection();
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
                if !fua || self.shared.negotiated.has(proto::TF_SEND_FUA) {
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
                if !self.shared.negotiated.has(proto::TF_SEND_FLUSH) {
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
        if !self.shared.negotiated.has(flag) {
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
            let sender = sender.clone();
            self.next_connection().send(
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
            let result = receiver.recv().unwrap_or_else(|_| Err(self.dropped()));
            if outcome.is_ok() {
                outcome = result;
            }
        }
        outcome
    }

    fn dropped(&self) -> io::Error {
        io::Error::other(format!("NBD request to {} dropped", self.shared.description))
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
        receiver
            .recv()
            .unwrap_or_else(|_| DevResponse { buffer: None, result: Err(self.dropped()) })
    }
}

impl Drop for NbdDev {
    fn drop(&mut self) {
        for connection in &self.connections {
            connection.close();
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
        self.shared.negotiated.size_bytes / u64::from(self.logical_block_bytes)
            * u64::from(self.logical_block_bytes)
    }

    fn logical_block_bytes(&self) -> u32 {
        self.logical_block_bytes
    }

    fn link_stats(&self) -> Option<LinkStats> {
        Some(NbdDev::link_stats(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::nbd::proto::{ChunkHeader, Info, Request};
    use parking_lot::Mutex;
    use std::io::{Read, Write};
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
        // These servers serve one connection: losing it is fatal here (the
        // reconnect tests cover the rest).
        let uri = format!("nbd+unix:///disk?socket={}&timeout=1&reconnect=0", socket.display());
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
