//! The crash checker over NBD: an in-process NBD server in front of the
//! checker's [`FaultDev`], so that a workload's volume reaches its device
//! through the engine's NBD client (`foliofs::dev::nbd`) and every crash
//! image is cut from what the *server* was told, in the order it did it.
//!
//! The server is as unhelpful as the protocol allows, so that a client
//! relying on more than the protocol promises loses data here: requests
//! that arrive together are carried out in a shuffled order (NBD servers
//! may complete requests in any order), and a FLUSH goes first among them,
//! covering only the writes already answered when it arrived (the spec's
//! rule: a flush covers the writes completed before it was received). A
//! client that sends the FLUSH for a write before that write's reply, or
//! takes a write's reply for durability without FUA or a later flush,
//! shows up as a lost fsync in the checker.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use foliofs::dev::nbd::proto::{self, Info, Request, SimpleReply};
use foliofs::dev::{FaultDev, RawDev};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A running server: its socket's URI; dropping it removes the socket's
/// directory (the server thread ends when its client disconnects).
pub struct NbdLoop {
    pub uri: String,
    /// Batches of two or more requests carried out in a shuffled order.
    shuffled_batches: Arc<AtomicU64>,
    _dir: tempfile::TempDir,
}

impl NbdLoop {
    /// How many times requests in flight together were carried out out of
    /// their arrival order: the reordering the checker counts on.
    pub fn shuffled_batches(&self) -> u64 {
        self.shuffled_batches.load(Ordering::Relaxed)
    }
}

/// Starts a server for `device` on a fresh unix socket; `seed` drives its
/// reordering.
pub fn start(device: Arc<FaultDev>, seed: u64) -> io::Result<NbdLoop> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("nbd.sock");
    let listener = UnixListener::bind(&socket)?;
    let shuffled_batches = Arc::new(AtomicU64::new(0));
    let shuffled = Arc::clone(&shuffled_batches);
    std::thread::Builder::new().name("crash-nbd".into()).spawn(move || {
        // One client at a time (the export does not offer multi-conn);
        // each is a mount of the workload's volume.
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            // A failed connection ends; its client sees the error.
            let _ = serve(stream, &device, seed, &shuffled);
        }
    })?;
    let uri = format!("nbd+unix:///crash?socket={}", socket.display());
    Ok(NbdLoop { uri, shuffled_batches, _dir: dir })
}

fn serve(
    mut stream: UnixStream,
    device: &FaultDev,
    seed: u64,
    shuffled_batches: &AtomicU64,
) -> io::Result<()> {
    handshake(&mut stream, device.size_bytes())?;
    let (requests, arrived) = mpsc::channel::<(Request, Vec<u8>)>();
    let mut reader = stream.try_clone()?;
    std::thread::Builder::new().name("crash-nbd-read".into()).spawn(move || {
        while let Ok(request) = read_request(&mut reader) {
            let last = request.0.command == proto::CMD_DISC;
            if requests.send(request).is_err() || last {
                return;
            }
        }
    })?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    loop {
        // Whatever has arrived by now is in flight together.
        let Ok(first) = arrived.recv() else { return Ok(()) };
        let mut batch = vec![first];
        // A moment for the requests the client sends without waiting.
        std::thread::sleep(Duration::from_micros(50));
        batch.extend(arrived.try_iter());
        let (flushes, mut others): (Vec<_>, Vec<_>) =
            batch.into_iter().partition(|(request, _)| request.command == proto::CMD_FLUSH);
        others.shuffle(&mut rng);
        if flushes.len() + others.len() > 1 {
            shuffled_batches.fetch_add(1, Ordering::Relaxed);
        }
        for (request, payload) in flushes.into_iter().chain(others) {
            if request.command == proto::CMD_DISC {
                return Ok(());
            }
            let (error, data) = carry_out(device, &request, &payload);
            stream.write_all(&SimpleReply { error, cookie: request.cookie }.encode())?;
            if error == 0 && request.command == proto::CMD_READ {
                stream.write_all(&data)?;
            }
        }
    }
}

fn carry_out(device: &FaultDev, request: &Request, payload: &[u8]) -> (u32, Vec<u8>) {
    let fua = request.flags & proto::CMD_FLAG_FUA != 0;
    let result = match request.command {
        proto::CMD_WRITE => device.write_at(request.offset, &[IoSlice::new(payload)], fua),
        proto::CMD_FLUSH => device.flush(),
        proto::CMD_READ => {
            let mut data = vec![0; request.length as usize];
            let read = device.read_at(request.offset, &mut [IoSliceMut::new(&mut data)]);
            return match read {
                Ok(()) => (0, data),
                Err(_) => (proto::EIO, Vec::new()),
            };
        }
        _ => return (proto::EINVAL, Vec::new()),
    };
    (if result.is_ok() { 0 } else { proto::EIO }, Vec::new())
}

fn read_request(stream: &mut UnixStream) -> io::Result<(Request, Vec<u8>)> {
    let mut header = [0; proto::REQUEST_HEADER_BYTES];
    stream.read_exact(&mut header)?;
    let request = Request::decode(&header).map_err(io::Error::other)?;
    let mut payload = Vec::new();
    if request.command == proto::CMD_WRITE {
        payload.resize(request.length as usize, 0);
        stream.read_exact(&mut payload)?;
    }
    Ok((request, payload))
}

/// Fixed newstyle, answering only NBD_OPT_GO: FLUSH and FUA offered,
/// nothing else (no structured replies, TRIM, WRITE_ZEROES or multi-conn).
fn handshake(stream: &mut UnixStream, size_bytes: u64) -> io::Result<()> {
    let mut greeting = proto::NBD_MAGIC.to_be_bytes().to_vec();
    greeting.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&proto::FLAG_FIXED_NEWSTYLE.to_be_bytes());
    stream.write_all(&greeting)?;
    stream.read_exact(&mut [0; 4])?;
    loop {
        let mut header = [0; proto::OPTION_HEADER_BYTES];
        stream.read_exact(&mut header)?;
        let (option, length) = proto::decode_option_header(&header).map_err(io::Error::other)?;
        stream.read_exact(&mut vec![0; length as usize])?;
        let reply = |reply_type, data: &[u8]| proto::encode_option_reply(option, reply_type, data);
        if option != proto::OPT_GO {
            stream.write_all(&reply(proto::REP_ERR_UNSUP, &[]))?;
            continue;
        }
        let transmission_flags = proto::TF_HAS_FLAGS | proto::TF_SEND_FLUSH | proto::TF_SEND_FUA;
        let info = Info::Export { size_bytes, transmission_flags };
        stream.write_all(&reply(proto::REP_INFO, &info.encode()))?;
        stream.write_all(&reply(proto::REP_ACK, &[]))?;
        return Ok(());
    }
}
