//! The client across lost links: a server in memory with a volatile
//! cache that a restart loses, dropped and swallowed connections, and a
//! different export behind the same socket.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::proto::{self, Info, Request, SimpleReply};
use super::NbdDev;
use crate::dev::{DevOptions, DiscardMode, RawDev};

const EXPORT_BYTES: u64 = 4 << 20;
const BLOCK: usize = 4096;

/// What the server was asked, in order: (connection number, command,
/// offset, length).
type Seen = (usize, u16, u64, u32);

struct State {
    size_bytes: u64,
    /// What survives a restart.
    durable: Vec<u8>,
    /// What the server answers from: durable plus acknowledged writes.
    cached: Vec<u8>,
    seen: Vec<Seen>,
    connections: usize,
    /// The current connection, to drop it.
    current: Option<UnixStream>,
    /// Read requests on the current connection without answering any.
    swallow: bool,
    /// Leave FLUSHes unanswered (and not carried out).
    swallow_flushes: bool,
    /// Close new connections at once (a server that is down).
    refuse: bool,
}

/// An NBD server in memory on a unix socket, one connection at a time.
struct MemoryServer {
    state: Arc<Mutex<State>>,
    uri: String,
    _dir: tempfile::TempDir,
}

impl MemoryServer {
    fn start(query: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("memory.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let state = Arc::new(Mutex::new(State {
            size_bytes: EXPORT_BYTES,
            durable: vec![0; EXPORT_BYTES as usize],
            cached: vec![0; EXPORT_BYTES as usize],
            seen: Vec::new(),
            connections: 0,
            current: None,
            swallow: false,
            swallow_flushes: false,
            refuse: false,
        }));
        let serving = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let number = {
                    let mut state = serving.lock();
                    if state.refuse {
                        continue;
                    }
                    state.connections += 1;
                    state.swallow = false;
                    state.swallow_flushes = false;
                    state.current = stream.try_clone().ok();
                    state.connections
                };
                let serving = Arc::clone(&serving);
                std::thread::spawn(move || serve(stream, number, &serving));
            }
        });
        let uri = format!("nbd+unix:///disk?socket={}&timeout=1&{query}", socket.display());
        Self { state, uri, _dir: dir }
    }

    fn open(&self) -> NbdDev {
        NbdDev::open(&self.uri, &DevOptions::default()).unwrap()
    }

    /// Cuts the current connection, as a switch that flaps.
    fn drop_link(&self) {
        if let Some(stream) = self.state.lock().current.take() {
            stream.shutdown(Shutdown::Both).unwrap();
        }
    }

    /// Cuts the connection and loses every write not flushed.
    fn restart_losing_cache(&self) {
        let mut state = self.state.lock();
        state.cached = state.durable.clone();
        if let Some(stream) = state.current.take() {
            stream.shutdown(Shutdown::Both).unwrap();
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().seen.clone()
    }

    fn durable(&self, offset: usize, length: usize) -> Vec<u8> {
        self.state.lock().durable[offset..offset + length].to_vec()
    }
}

fn serve(mut stream: UnixStream, number: usize, state: &Mutex<State>) {
    let size_bytes = state.lock().size_bytes;
    if handshake(&mut stream, size_bytes).is_err() {
        return;
    }
    loop {
        let mut header = [0; proto::REQUEST_HEADER_BYTES];
        if stream.read_exact(&mut header).is_err() {
            return;
        }
        let request = Request::decode(&header).unwrap();
        let mut payload = vec![0; request.length as usize];
        if request.command == proto::CMD_WRITE && stream.read_exact(&mut payload).is_err() {
            return;
        }
        let mut state = state.lock();
        if request.command == proto::CMD_DISC {
            return;
        }
        state.seen.push((number, request.command, request.offset, request.length));
        if state.swallow || (state.swallow_flushes && request.command == proto::CMD_FLUSH) {
            continue;
        }
        let range = request.offset as usize..request.offset as usize + request.length as usize;
        let mut data = Vec::new();
        match request.command {
            proto::CMD_READ => data = state.cached[range.clone()].to_vec(),
            proto::CMD_WRITE => state.cached[range.clone()].copy_from_slice(&payload),
            proto::CMD_WRITE_ZEROES | proto::CMD_TRIM => state.cached[range.clone()].fill(0),
            proto::CMD_FLUSH => state.durable = state.cached.clone(),
            _ => {}
        }
        if request.flags & proto::CMD_FLAG_FUA != 0 {
            let written = state.cached[range.clone()].to_vec();
            state.durable[range].copy_from_slice(&written);
        }
        drop(state);
        let mut reply = SimpleReply { error: 0, cookie: request.cookie }.encode().to_vec();
        reply.extend_from_slice(&data);
        if stream.write_all(&reply).is_err() {
            return;
        }
    }
}

fn handshake(stream: &mut UnixStream, size_bytes: u64) -> std::io::Result<()> {
    let mut greeting = proto::NBD_MAGIC.to_be_bytes().to_vec();
    greeting.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&proto::FLAG_FIXED_NEWSTYLE.to_be_bytes());
    stream.write_all(&greeting)?;
    stream.read_exact(&mut [0; 4])?;
    loop {
        let mut header = [0; proto::OPTION_HEADER_BYTES];
        stream.read_exact(&mut header)?;
        let (option, length) = proto::decode_option_header(&header).unwrap();
        stream.read_exact(&mut vec![0; length as usize])?;
        let reply = |reply_type, data: &[u8]| proto::encode_option_reply(option, reply_type, data);
        if option != proto::OPT_GO {
            stream.write_all(&reply(proto::REP_ERR_UNSUP, &[]))?;
            continue;
        }
        let transmission_flags = proto::TF_HAS_FLAGS
            | proto::TF_SEND_FLUSH
            | proto::TF_SEND_FUA
            | proto::TF_SEND_TRIM
            | proto::TF_SEND_WRITE_ZEROES;
        let info = Info::Export { size_bytes, transmission_flags };
        stream.write_all(&reply(proto::REP_INFO, &info.encode()))?;
        return stream.write_all(&reply(proto::REP_ACK, &[]));
    }
}

fn write(device: &NbdDev, offset: u64, byte: u8) {
    device.write_at(offset, &[IoSlice::new(&[byte; BLOCK])], false).unwrap();
}

fn read(device: &NbdDev, offset: u64) -> Vec<u8> {
    let mut buffer = vec![0; BLOCK];
    device.read_at(offset, &mut [IoSliceMut::new(&mut buffer)]).unwrap();
    buffer
}

/// The commands connection `number` was sent, in order.
fn commands_on(seen: &[Seen], number: usize) -> Vec<(u16, u64)> {
    seen.iter()
        .filter(|(connection, ..)| *connection == number)
        .map(|(_, command, offset, _)| (*command, *offset))
        .collect()
}

#[test]
fn a_dropped_link_is_reconnected_and_what_had_no_reply_is_sent_again() {
    let server = MemoryServer::start("");
    let device = server.open();
    write(&device, 0, 7);
    device.flush().unwrap();
    server.state.lock().swallow = true;
    let reading = std::thread::scope(|scope| {
        let reader = scope.spawn(|| read(&device, 0));
        // The read reached the server and got no answer; then the link drops.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !server
            .seen()
            .iter()
            .any(|(number, command, ..)| *number == 1 && *command == proto::CMD_READ)
        {
            assert!(Instant::now() < deadline, "the read never reached the server");
            std::thread::sleep(Duration::from_millis(5));
        }
        server.drop_link();
        reader.join().unwrap()
    });
    assert_eq!(reading, vec![7; BLOCK], "the read answered on the new link");
    let stats = device.link_stats();
    assert_eq!(stats.reconnects, 1, "{stats:?}");
    assert_eq!(stats.requests_resent, 1, "{stats:?}");
    assert_eq!(commands_on(&server.seen(), 2).first(), Some(&(proto::CMD_READ, 0)));
}

#[test]
fn a_request_without_reply_times_out_and_goes_out_again_on_a_new_link() {
    let server = MemoryServer::start("");
    let device = server.open();
    server.state.lock().swallow = true;
    let started = Instant::now();
    device.flush().unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1), "answered only after the timeout");
    assert_eq!(device.link_stats().reconnects, 1);
    assert_eq!(commands_on(&server.seen(), 1), [(proto::CMD_FLUSH, 0)]);
    assert_eq!(commands_on(&server.seen(), 2), [(proto::CMD_FLUSH, 0)]);
}

#[test]
fn writes_acknowledged_since_the_last_flush_are_replayed_before_a_new_flush() {
    let server = MemoryServer::start("");
    let device = server.open();
    write(&device, 0, 1);
    write(&device, 8192, 2);
    device.flush().unwrap();
    write(&device, BLOCK as u64, 3);
    write(&device, 8192, 4);
    device.discard(16384, BLOCK as u64, DiscardMode::Zero).unwrap();
    device.write_at(20480, &[IoSlice::new(&[5; BLOCK])], true).unwrap();
    assert_eq!(device.link_stats().replay_data_bytes, 2 * BLOCK as u64);
    server.state.lock().durable[16384..20480].fill(9);
    server.state.lock().cached[16384..20480].fill(9);
    server.restart_losing_cache();
    device.flush().unwrap();
    // Every acknowledged change is durable again, and only the unflushed
    // ones went out twice: the FUA write and the first two were durable.
    assert_eq!(server.durable(0, BLOCK), vec![1; BLOCK]);
    assert_eq!(server.durable(BLOCK, BLOCK), vec![3; BLOCK]);
    assert_eq!(server.durable(8192, BLOCK), vec![4; BLOCK]);
    assert_eq!(server.durable(16384, BLOCK), vec![0; BLOCK]);
    assert_eq!(server.durable(20480, BLOCK), vec![5; BLOCK]);
    let mut replayed = commands_on(&server.seen(), 2);
    assert_eq!(replayed.pop(), Some((proto::CMD_FLUSH, 0)), "the flush comes last");
    replayed.sort_unstable();
    assert_eq!(
        replayed,
        [(proto::CMD_READ, 0), (proto::CMD_WRITE, 4096), (proto::CMD_WRITE, 8192), (6, 16384)],
        "the identity check, then the kept changes"
    );
    let stats = device.link_stats();
    assert_eq!((stats.reconnects, stats.replayed_requests), (1, 3), "{stats:?}");
    assert_eq!(stats.replay_data_bytes, 0, "the flush released what it covered");
}

#[test]
fn a_different_export_behind_the_address_is_refused_and_never_written() {
    for change in ["size", "first bytes"] {
        let server = MemoryServer::start("");
        let device = server.open();
        assert_eq!(read(&device, 0), vec![0; BLOCK], "the identity is read once");
        write(&device, BLOCK as u64, 1);
        {
            let mut state = server.state.lock();
            match change {
                "size" => state.size_bytes = EXPORT_BYTES * 2,
                _ => state.cached[..16].fill(0xee),
            }
            state.durable = state.cached.clone();
        }
        server.drop_link();
        let error = device.flush().unwrap_err();
        assert_eq!(error.raw_os_error(), None, "{error}");
        assert!(error.to_string().contains("a different export"), "{change}: {error}");
        assert!(
            !commands_on(&server.seen(), 2).iter().any(|(command, _)| [
                proto::CMD_WRITE,
                proto::CMD_FLUSH
            ]
            .contains(command)),
            "{change}: written after the refusal: {:?}",
            server.seen()
        );
        let later = device.write_at(0, &[IoSlice::new(&[1; BLOCK])], false).unwrap_err();
        assert!(later.to_string().contains("a different export"), "{later}");
    }
}

#[test]
fn requests_fail_with_eio_once_the_server_is_not_back_within_the_bound() {
    let server = MemoryServer::start("reconnect=1");
    let device = server.open();
    server.state.lock().refuse = true;
    server.drop_link();
    let started = Instant::now();
    let error = device.flush().unwrap_err();
    let waited = started.elapsed();
    assert!(error.to_string().contains("not back within 1 s"), "{error}");
    assert!(waited >= Duration::from_millis(500) && waited < Duration::from_secs(5), "{waited:?}");
    // No errno of its own: the engine reports it as EIO (the volume-level
    // test in foliofs-check's nbd_reconnect.rs checks that).
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionAborted, "{error}");
    server.state.lock().refuse = false;
    assert!(device.flush().is_err(), "dead for good, as before reconnecting existed");
}

#[test]
fn reconnect_0_fails_at_once() {
    let server = MemoryServer::start("reconnect=0");
    let device = server.open();
    server.drop_link();
    let error = device.flush().unwrap_err();
    assert!(error.to_string().contains("lost"), "{error}");
    assert_eq!(server.state.lock().connections, 1, "no second connection");
}

#[test]
fn past_the_replay_bound_a_write_is_not_kept_but_acknowledged_after_a_flush() {
    let server = MemoryServer::start("replay-mib=1");
    let device = server.open();
    let piece = vec![3; 256 << 10];
    for index in 0..4 {
        device.write_at(index * piece.len() as u64, &[IoSlice::new(&piece)], false).unwrap();
    }
    assert_eq!(device.link_stats().flushes_forced, 0, "1 MiB fits in 1 MiB");
    assert_eq!(server.durable(0, 1 << 20), vec![0; 1 << 20], "nothing flushed yet");
    device.write_at(4 * piece.len() as u64, &[IoSlice::new(&piece)], false).unwrap();
    let stats = device.link_stats();
    assert_eq!(stats.flushes_forced, 1, "{stats:?}");
    assert_eq!(stats.replay_data_bytes, 0, "the flush released what was kept: {stats:?}");
    assert_eq!(stats.replay_data_bytes_peak, 1 << 20, "never past the bound: {stats:?}");
    assert_eq!(server.durable(0, 5 << 18), vec![3; 5 << 18], "the held write is durable too");
}

/// A write held for its FLUSH when the link drops: the write itself goes
/// out again (it was never kept), and is acknowledged once durable.
#[test]
fn a_held_write_goes_out_again_when_its_flush_is_lost() {
    let server = MemoryServer::start("replay-mib=1");
    let device = server.open();
    let piece = vec![4; 2 << 20];
    server.state.lock().swallow_flushes = true;
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| device.write_at(0, &[IoSlice::new(&piece)], false));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !commands_on(&server.seen(), 1).contains(&(proto::CMD_FLUSH, 0)) {
            assert!(Instant::now() < deadline, "no flush for the held write");
            std::thread::sleep(Duration::from_millis(5));
        }
        server.restart_losing_cache();
        writer.join().unwrap().unwrap();
    });
    assert_eq!(server.durable(0, 2 << 20), piece, "written again and flushed");
    // The write, the lost FLUSH sent again (it releases nothing: the write
    // went out anew), and the FLUSH for the write's new reply.
    let flush = (proto::CMD_FLUSH, 0);
    assert_eq!(commands_on(&server.seen(), 2), [(proto::CMD_WRITE, 0), flush, flush]);
}
