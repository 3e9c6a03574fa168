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
//!
//! The server can also be restarted in place
//! ([`NbdLoop::restart_losing_unflushed`]): its connections close and the
//! writes no completed FLUSH or FUA covered are lost, as when a server with
//! a volatile write cache dies, while the socket stays for the client to
//! reconnect to.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{mpsc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use foliofs::dev::nbd::proto::{self, Info, Request, SimpleReply};
use foliofs::dev::{FaultDev, RawDev};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A running server: its socket's URI; dropping it removes the socket's
/// directory (the server thread ends when its client disconnects).
pub struct NbdLoop {
    pub uri: String,
    socket_path: PathBuf,
    device: Arc<FaultDev>,
    shared: Arc<Shared>,
    _dir: tempfile::TempDir,
}

/// What the server thread and the [`NbdLoop`] handle share.
struct Shared {
    /// Batches of two or more requests carried out in a shuffled order.
    shuffled_batches: AtomicU64,
    restarts: AtomicU64,
    /// Bumped by every restart (under `lives`); a connection of an earlier
    /// life is gone and carries out no more requests.
    life: AtomicU64,
    lives: Mutex<Lives>,
    /// Held while a request is carried out, and by a restart to wait for
    /// the one under way: after that no request of an earlier life reaches
    /// the device, so none lands after the volatile writes were lost.
    device_gate: Mutex<()>,
    /// One request in this many ends its connection instead (0: none), as
    /// a link that drops would: the client must reconnect and send again.
    drop_link_one_in: AtomicU32,
    links_dropped: AtomicU64,
}

/// The connections of the server's current life.
struct Lives {
    next_connection_id: u64,
    /// Clones of the open connections' sockets, kept to shut them down.
    connections: Vec<(u64, UnixStream)>,
}

impl Shared {
    fn lives(&self) -> MutexGuard<'_, Lives> {
        // A panicking server thread leaves nothing half-updated in `Lives`.
        self.lives.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn device_gate(&self) -> MutexGuard<'_, ()> {
        self.device_gate.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl NbdLoop {
    /// From now on, one request in `one_in` (0: none) ends its connection
    /// at random (seeded), before or after it is carried out, without a
    /// reply: the client must reconnect and send again what it lost.
    pub fn drop_links_at_random(&self, one_in: u32) {
        self.shared.drop_link_one_in.store(one_in, Ordering::Relaxed);
    }

    /// How many connections [`Self::drop_links_at_random`] ended.
    pub fn links_dropped(&self) -> u64 {
        self.shared.links_dropped.load(Ordering::Relaxed)
    }

    /// How many times requests in flight together were carried out out of
    /// their arrival order: the reordering the checker counts on.
    pub fn shuffled_batches(&self) -> u64 {
        self.shared.shuffled_batches.load(Ordering::Relaxed)
    }

    /// The unix socket the server listens on.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Restarts the server as one whose volatile write cache died with it:
    /// every open connection is shut down (requests not yet carried out are
    /// never carried out, replies not yet sent are never sent), the device
    /// forgets every write no completed FLUSH or FUA covered, and the
    /// socket keeps listening for the client's reconnection. Returns how
    /// many writes were lost, acknowledged ones among them.
    pub fn restart_losing_unflushed(&self) -> u64 {
        {
            let mut lives = self.shared.lives();
            self.shared.life.fetch_add(1, Ordering::SeqCst);
            for (_, connection) in lives.connections.drain(..) {
                // Already closed by its client: nothing left to shut.
                let _ = connection.shutdown(Shutdown::Both);
            }
        }
        // Once the request under way (if any) is done, no other of the old
        // life starts: each checks the life under the gate.
        let _gate = self.shared.device_gate();
        let lost_writes = self.device.lose_unflushed();
        self.shared.restarts.fetch_add(1, Ordering::Relaxed);
        lost_writes
    }

    /// How many times [`Self::restart_losing_unflushed`] ran.
    pub fn restarts(&self) -> u64 {
        self.shared.restarts.load(Ordering::Relaxed)
    }
}

/// Starts a server for `device` on a fresh unix socket; `seed` drives its
/// reordering.
pub fn start(device: Arc<FaultDev>, seed: u64) -> io::Result<NbdLoop> {
    let dir = tempfile::tempdir()?;
    let socket_path = dir.path().join("nbd.sock");
    let listener = UnixListener::bind(&socket_path)?;
    let shared = Arc::new(Shared {
        shuffled_batches: AtomicU64::new(0),
        restarts: AtomicU64::new(0),
        life: AtomicU64::new(0),
        lives: Mutex::new(Lives { next_connection_id: 0, connections: Vec::new() }),
        device_gate: Mutex::new(()),
        drop_link_one_in: AtomicU32::new(0),
        links_dropped: AtomicU64::new(0),
    });
    let server_shared = Arc::clone(&shared);
    let server_device = Arc::clone(&device);
    std::thread::Builder::new().name("crash-nbd".into()).spawn(move || {
        // One client at a time (the export does not offer multi-conn);
        // each is a mount of the workload's volume.
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            // A failed connection ends; its client sees the error.
            let _ = serve_connection(stream, &server_device, seed, &server_shared);
        }
    })?;
    let uri = format!("nbd+unix:///crash?socket={}", socket_path.display());
    Ok(NbdLoop { uri, socket_path, device, shared, _dir: dir })
}

/// Serves one connection as part of the server's current life.
fn serve_connection(
    stream: UnixStream,
    device: &FaultDev,
    seed: u64,
    shared: &Shared,
) -> io::Result<()> {
    let (life, id) = {
        let mut lives = shared.lives();
        let id = lives.next_connection_id;
        lives.next_connection_id += 1;
        lives.connections.push((id, stream.try_clone()?));
        (shared.life.load(Ordering::SeqCst), id)
    };
    // Each connection rolls its own dice: the same seed on every one
    // would drop each after the same number of requests.
    let seed = seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let result = serve(stream, device, seed, life, shared);
    shared.lives().connections.retain(|(open, _)| *open != id);
    result
}

fn serve(
    mut stream: UnixStream,
    device: &FaultDev,
    seed: u64,
    life: u64,
    shared: &Shared,
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
            shared.shuffled_batches.fetch_add(1, Ordering::Relaxed);
        }
        for (request, payload) in flushes.into_iter().chain(others) {
            if request.command == proto::CMD_DISC {
                return Ok(());
            }
            let one_in = shared.drop_link_one_in.load(Ordering::Relaxed);
            if one_in > 0 && rng.random_range(0..one_in) == 0 {
                // The link drops here: this request is carried out or not
                // (its reply is lost either way), the rest of the batch never.
                if rng.random_range(0..2) == 0 {
                    let _gate = shared.device_gate();
                    let _ = carry_out(device, &request, &payload);
                }
                shared.links_dropped.fetch_add(1, Ordering::Relaxed);
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return Ok(());
            }
            let (error, data) = {
                let _gate = shared.device_gate();
                if shared.life.load(Ordering::SeqCst) != life {
                    // Restarted: this connection and its requests died with
                    // the old life.
                    return Ok(());
                }
                carry_out(device, &request, &payload)
            };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_nbd_client::TestNbdClient;

    const BLOCK_BYTES: usize = 4096;

    #[test]
    fn a_restart_loses_the_writes_no_flush_covered() {
        let device = Arc::new(FaultDev::new(1 << 20, 512));
        let server = start(Arc::clone(&device), 7).unwrap();
        let mut client = TestNbdClient::connect(server.socket_path(), "crash").unwrap();
        assert_eq!(client.size_bytes, 1 << 20);
        let flushed = vec![0xA1; BLOCK_BYTES];
        let forced = vec![0xC3; BLOCK_BYTES];
        let volatile = vec![0xB2; BLOCK_BYTES];
        client.write(0, &flushed, false).unwrap();
        client.flush().unwrap();
        client.write(BLOCK_BYTES as u64, &volatile, false).unwrap();
        client.write(2 * BLOCK_BYTES as u64, &forced, true).unwrap();
        assert_eq!(client.read(BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap(), volatile);

        assert_eq!(server.restart_losing_unflushed(), 1, "only the unflushed plain write");
        assert_eq!(server.restarts(), 1);
        let closed = client.read(0, 512).unwrap_err();
        assert!(
            !matches!(closed.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
            "the old connection is closed, not just silent: {closed}"
        );

        let mut again = TestNbdClient::connect(server.socket_path(), "crash").unwrap();
        assert_eq!(again.read(0, BLOCK_BYTES as u32).unwrap(), flushed);
        assert_eq!(
            again.read(BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap(),
            vec![0; BLOCK_BYTES],
            "an acknowledged write without a flush is gone"
        );
        assert_eq!(again.read(2 * BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap(), forced);
        // The new life serves writes as before.
        again.write(BLOCK_BYTES as u64, &volatile, false).unwrap();
        assert_eq!(again.read(BLOCK_BYTES as u64, BLOCK_BYTES as u32).unwrap(), volatile);
    }

    #[test]
    fn a_request_in_flight_across_a_restart_never_lands() {
        let device = Arc::new(FaultDev::new(1 << 20, 512));
        let server = start(Arc::clone(&device), 3).unwrap();
        let mut client = TestNbdClient::connect(server.socket_path(), "crash").unwrap();
        // Each write takes 200 ms: the restart comes while the first one is
        // being carried out and the second waits its turn in the server.
        device.limit_write_bandwidth(Some(5 * BLOCK_BYTES as u64));
        client.send_write(0, &[0x11; BLOCK_BYTES]).unwrap();
        client.send_write(BLOCK_BYTES as u64, &[0x22; BLOCK_BYTES]).unwrap();
        let waiting_since = std::time::Instant::now();
        while device.log_len() == 0 {
            assert!(
                waiting_since.elapsed() < Duration::from_secs(10),
                "no write reached the device"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(server.restart_losing_unflushed(), 1, "the write under way when it came");
        device.limit_write_bandwidth(None);
        let mut again = TestNbdClient::connect(server.socket_path(), "crash").unwrap();
        let both_blocks = again.read(0, 2 * BLOCK_BYTES as u32).unwrap();
        assert_eq!(both_blocks, vec![0; 2 * BLOCK_BYTES], "a write of the old life landed");
        assert_eq!(device.log_len(), 0);
    }

    #[test]
    fn a_restart_with_no_client_connected_still_loses_the_cache() {
        let device = Arc::new(FaultDev::new(1 << 16, 512));
        let server = start(Arc::clone(&device), 1).unwrap();
        let mut client = TestNbdClient::connect(server.socket_path(), "crash").unwrap();
        client.write(0, &[0x5A; 512], false).unwrap();
        drop(client);
        assert_eq!(server.restart_losing_unflushed(), 1);
        let mut again = TestNbdClient::connect(server.socket_path(), "crash").unwrap();
        assert_eq!(again.read(0, 512).unwrap(), vec![0; 512]);
        assert_eq!(server.restarts(), 1);
    }
}
