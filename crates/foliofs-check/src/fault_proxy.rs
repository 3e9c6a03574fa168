//! A byte-forwarding proxy between an NBD client and its server that fails
//! the link on command, for tests of the client's reconnection: the link
//! drops (a switch flap), stalls (a congested or paused path), swallows the
//! server's replies (a half-dead path: requests arrive, answers never come
//! back), or the server refuses connections (it is down).
//!
//! The proxy knows nothing of NBD: it copies bytes. Each client connection
//! accepted on its unix socket gets a fresh connection to the upstream
//! server and two forwarding threads, one per direction.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the proxy connects for each client connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// How long connecting to a TCP upstream may take before the client's
/// connection is closed instead (a unix connect does not wait).
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes one forwarding thread moves per read: a few NBD requests.
const FORWARD_BUFFER_BYTES: usize = 64 << 10;

/// A running proxy. Dropping it closes every link and joins its threads.
pub struct FaultProxy {
    socket_path: PathBuf,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FaultProxy {
    /// Listens on a fresh unix socket in its own temporary directory and
    /// forwards every connection to `upstream`.
    pub fn start(upstream: Upstream) -> io::Result<FaultProxy> {
        let dir = tempfile::tempdir()?;
        let socket_path = dir.path().join("proxy.sock");
        let listener = UnixListener::bind(&socket_path)?;
        let shared = Arc::new(Shared::default());
        let accept_shared = Arc::clone(&shared);
        let accept_thread = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || accept_loop(&listener, &upstream, &accept_shared))?;
        Ok(FaultProxy { socket_path, shared, accept_thread: Some(accept_thread), _dir: dir })
    }

    /// The unix socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// The NBD URI of `export` through the proxy; callers may append more
    /// `&key=value` query parameters.
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket_path.display())
    }

    /// Shuts down every current link, both its client and its upstream
    /// connection in both directions, at once: a switch flap. A connection
    /// the proxy accepted but has not finished setting up is cut too.
    /// Connections made afterwards are forwarded normally.
    pub fn drop_links(&self) {
        let mut links = self.shared.links();
        links.cuts += 1;
        for link in links.live.drain(..) {
            link.cut();
            self.shared.links_dropped.fetch_add(1, Ordering::Relaxed);
        }
        drop(links);
        // Forwarding threads holding bytes through a stall end now.
        self.shared.wake_stalled();
    }

    /// Shuts down the oldest live link only, as one path of several
    /// failing would; false when there is none.
    pub fn drop_oldest_link(&self) -> bool {
        let mut links = self.shared.links();
        if links.live.is_empty() {
            return false;
        }
        let link = links.live.remove(0);
        drop(links);
        link.cut();
        self.shared.links_dropped.fetch_add(1, Ordering::Relaxed);
        self.shared.wake_stalled();
        true
    }

    /// For `duration` from now (or until an earlier stall ends, if later),
    /// accepts and forwards nothing: bytes read are held, new connections
    /// wait unanswered. Then forwarding resumes with the held bytes.
    pub fn stall(&self, duration: Duration) {
        let end = Instant::now() + duration;
        let mut stalled_until = self.shared.stalled_until();
        *stalled_until = Some(stalled_until.map_or(end, |current| current.max(end)));
    }

    /// From now on, the current links swallow every byte from the server
    /// to the client (requests still reach the server). Links made after
    /// the call are normal.
    pub fn blackhole_replies(&self) {
        let mut links = self.shared.links();
        links.blackholes += 1;
        for link in &links.live {
            link.blackholed.store(true, Ordering::Relaxed);
        }
    }

    /// While `refusing`, new client connections are accepted and closed at
    /// once, never reaching the upstream: a server that is down.
    pub fn refuse_connections(&self, refusing: bool) {
        self.shared.refusing.store(refusing, Ordering::Relaxed);
    }

    /// Client connections forwarded to a fresh upstream connection.
    pub fn links_accepted(&self) -> u64 {
        self.shared.links_accepted.load(Ordering::Relaxed)
    }

    /// Links cut by [`Self::drop_links`].
    pub fn links_dropped(&self) -> u64 {
        self.shared.links_dropped.load(Ordering::Relaxed)
    }

    /// Client connections closed by [`Self::refuse_connections`].
    pub fn links_refused(&self) -> u64 {
        self.shared.links_refused.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        for link in self.shared.links().live.drain(..) {
            link.cut();
        }
        self.shared.wake_stalled();
        // Wakes the accept thread from accept(); it then sees `stopping`.
        // If it is elsewhere, this connection just stays unanswered.
        let _ = UnixStream::connect(&self.socket_path);
        if let Some(accept_thread) = self.accept_thread.take() {
            let _ = accept_thread.join();
        }
        // No thread adds forwarders any more: the accept thread has ended.
        let forwarders = std::mem::take(&mut *self.shared.forwarders());
        for forwarder in forwarders {
            let _ = forwarder.join();
        }
    }
}

#[derive(Default)]
struct Shared {
    stopping: AtomicBool,
    refusing: AtomicBool,
    /// When the current stall ends; `None`: not stalled.
    stall: Mutex<Option<Instant>>,
    /// Notified when a waiter may have to stop waiting out a stall early.
    stall_woken: Condvar,
    links: Mutex<Links>,
    forwarders: Mutex<Vec<JoinHandle<()>>>,
    links_accepted: AtomicU64,
    links_dropped: AtomicU64,
    links_refused: AtomicU64,
    /// Threads waiting out a stall now: forwarders holding bytes and the
    /// accept thread holding a connection (for tests to know they are).
    stall_waiters: AtomicU64,
}

#[derive(Default)]
struct Links {
    next_id: u64,
    live: Vec<Arc<Link>>,
    /// Calls of `drop_links` and `blackhole_replies` so far: a connection
    /// accepted before one of them and set up after it gets its effect.
    cuts: u64,
    blackholes: u64,
}

/// One client connection and its upstream connection.
struct Link {
    id: u64,
    /// Clones kept to shut the connections down; the forwarding threads
    /// read and write through their own.
    client: Socket,
    upstream: Socket,
    /// Set when the link is cut: a forwarding thread waiting out a stall
    /// gives up at once.
    cut: AtomicBool,
    blackholed: AtomicBool,
    /// Forwarding threads ended; the second one removes the link.
    directions_done: AtomicU8,
}

impl Link {
    fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        self.client.shutdown(Shutdown::Both);
        self.upstream.shutdown(Shutdown::Both);
    }
}

impl Shared {
    // Poisoning: every critical section leaves its data consistent, so a
    // panicking thread elsewhere is no reason to fail here.
    fn links(&self) -> MutexGuard<'_, Links> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stalled_until(&self) -> MutexGuard<'_, Option<Instant>> {
        self.stall.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn forwarders(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.forwarders.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Returns when no stall is on (true), or early when the proxy stops
    /// or `cut` is set (false).
    fn wait_out_stall(&self, cut: Option<&AtomicBool>) -> bool {
        let mut stalled_until = self.stalled_until();
        loop {
            if self.stopping() || cut.is_some_and(|cut| cut.load(Ordering::Relaxed)) {
                return false;
            }
            let now = Instant::now();
            let Some(end) = (*stalled_until).filter(|&end| end > now) else {
                return true;
            };
            self.stall_waiters.fetch_add(1, Ordering::Relaxed);
            stalled_until = self
                .stall_woken
                .wait_timeout(stalled_until, end - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            self.stall_waiters.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn wake_stalled(&self) {
        // Taking the lock orders this after any waiter's check of its flags,
        // so none misses the notification and sleeps out the whole stall.
        let _stalled_until = self.stalled_until();
        self.stall_woken.notify_all();
    }
}

fn accept_loop(listener: &UnixListener, upstream: &Upstream, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopping() {
            return;
        }
        let client = match client {
            Ok(client) => Socket::Unix(client),
            // The client gave up before it was accepted; others may not.
            Err(error) if error.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            // Out of descriptors or worse: stop rather than spin.
            Err(_) => return,
        };
        let (cuts, blackholes) = {
            let links = shared.links();
            (links.cuts, links.blackholes)
        };
        if !shared.wait_out_stall(None) {
            return;
        }
        if shared.refusing.load(Ordering::Relaxed) {
            // Counted first: whoever sees the connection end sees the count.
            shared.links_refused.fetch_add(1, Ordering::Relaxed);
            client.shutdown(Shutdown::Both);
            continue;
        }
        // Unreachable upstream: dropping the client closes it, as a server
        // that is down would.
        let Ok(upstream) = Socket::connect(upstream) else { continue };
        // Failing to clone a descriptor ends this link only.
        let _ = start_link(client, upstream, cuts, blackholes, shared);
    }
}

/// Registers the link and starts its two forwarding threads.
fn start_link(
    client: Socket,
    upstream: Socket,
    cuts_at_accept: u64,
    blackholes_at_accept: u64,
    shared: &Arc<Shared>,
) -> io::Result<()> {
    let (client_reader, client_writer) = (client.try_clone()?, client.try_clone()?);
    let (upstream_reader, upstream_writer) = (upstream.try_clone()?, upstream.try_clone()?);
    let mut links = shared.links();
    let link = Arc::new(Link {
        id: links.next_id,
        client,
        upstream,
        cut: AtomicBool::new(false),
        blackholed: AtomicBool::new(links.blackholes != blackholes_at_accept),
        directions_done: AtomicU8::new(0),
    });
    links.next_id += 1;
    shared.links_accepted.fetch_add(1, Ordering::Relaxed);
    if shared.stopping() || links.cuts != cuts_at_accept {
        // Cut while it was being set up (or the proxy is going away).
        link.cut();
        if !shared.stopping() {
            shared.links_dropped.fetch_add(1, Ordering::Relaxed);
        }
        return Ok(());
    }
    links.live.push(Arc::clone(&link));
    drop(links);
    let mut forwarders = shared.forwarders();
    // Forget the threads of links long gone, so the list stays short.
    forwarders.retain(|forwarder| !forwarder.is_finished());
    for (from, to, replies) in
        [(client_reader, upstream_writer, false), (upstream_reader, client_writer, true)]
    {
        let forward_link = Arc::clone(&link);
        let forward_shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("fault-proxy-link".into())
            .spawn(move || forward(from, to, &forward_link, replies, &forward_shared));
        match spawned {
            Ok(forwarder) => forwarders.push(forwarder),
            Err(error) => {
                // The other direction, if started, ends on the shutdown.
                link.cut();
                return Err(error);
            }
        }
    }
    Ok(())
}

/// Copies bytes `from` → `to` until either side ends. `replies`: this is
/// the server-to-client direction, the one a blackhole swallows.
fn forward(mut from: Socket, mut to: Socket, link: &Link, replies: bool, shared: &Shared) {
    let mut buffer = vec![0; FORWARD_BUFFER_BYTES];
    loop {
        let length = match from.read(&mut buffer) {
            Ok(0) => {
                // Pass the end of stream on: the other side may still answer.
                to.shutdown(Shutdown::Write);
                break;
            }
            Ok(length) => length,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                link.cut();
                break;
            }
        };
        if !shared.wait_out_stall(Some(&link.cut)) {
            link.cut();
            break;
        }
        if replies && link.blackholed.load(Ordering::Relaxed) {
            continue;
        }
        if to.write_all(&buffer[..length]).is_err() {
            link.cut();
            break;
        }
    }
    if link.directions_done.fetch_add(1, Ordering::AcqRel) == 1 {
        shared.links().live.retain(|live| live.id != link.id);
    }
}

/// A unix or TCP stream.
enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Socket {
    fn connect(upstream: &Upstream) -> io::Result<Socket> {
        Ok(match upstream {
            Upstream::Unix(path) => Socket::Unix(UnixStream::connect(path)?),
            Upstream::Tcp(address) => {
                let stream = TcpStream::connect_timeout(address, UPSTREAM_CONNECT_TIMEOUT)?;
                // NBD requests are small and latency-bound.
                stream.set_nodelay(true)?;
                Socket::Tcp(stream)
            }
        })
    }

    fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Unix(stream) => Socket::Unix(stream.try_clone()?),
            Socket::Tcp(stream) => Socket::Tcp(stream.try_clone()?),
        })
    }

    /// Errors are ignored: the peer may have closed it already.
    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Socket::Unix(stream) => stream.shutdown(how),
            Socket::Tcp(stream) => stream.shutdown(how),
        };
    }
}

impl Read for Socket {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(stream) => stream.read(buffer),
            Socket::Tcp(stream) => stream.read(buffer),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(stream) => stream.write(buffer),
            Socket::Tcp(stream) => stream.write(buffer),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::mpsc::{self, Receiver, Sender};
    use std::sync::Arc;

    use foliofs::dev::FaultDev;

    use super::*;
    use crate::test_nbd_client::TestNbdClient;

    /// How long a test waits for something that should happen before
    /// failing instead of hanging; never slept through on success.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// What the echo upstream saw.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Connected,
        /// Bytes received (and already sent back).
        Echoed(Vec<u8>),
        Closed,
    }

    /// An upstream that sends every byte back and reports what it saw,
    /// and when.
    struct Echo {
        upstream: Upstream,
        seen: Receiver<(Instant, Seen)>,
        _dir: Option<tempfile::TempDir>,
    }

    impl Echo {
        fn unix() -> Echo {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("echo.sock");
            let listener = UnixListener::bind(&path).unwrap();
            let (report, seen) = mpsc::channel();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let stream = stream.unwrap();
                    let report = report.clone();
                    std::thread::spawn(move || echo(Socket::Unix(stream), &report));
                }
            });
            Echo { upstream: Upstream::Unix(path), seen, _dir: Some(dir) }
        }

        fn tcp() -> Echo {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap();
            let (report, seen) = mpsc::channel();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let stream = stream.unwrap();
                    let report = report.clone();
                    std::thread::spawn(move || echo(Socket::Tcp(stream), &report));
                }
            });
            Echo { upstream: Upstream::Tcp(address), seen, _dir: None }
        }

        fn next(&self) -> Seen {
            self.next_timed().1
        }

        fn next_timed(&self) -> (Instant, Seen) {
            self.seen.recv_timeout(PATIENCE).expect("the echo upstream saw nothing")
        }

        /// Nothing more reached the upstream so far.
        fn saw_nothing_more(&self) -> bool {
            self.seen.try_recv().is_err()
        }
    }

    fn echo(mut stream: Socket, report: &Sender<(Instant, Seen)>) {
        let report = |seen| report.send((Instant::now(), seen));
        let _ = report(Seen::Connected);
        let mut buffer = [0; 4096];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(length) => {
                    if stream.write_all(&buffer[..length]).is_err() {
                        break;
                    }
                    let _ = report(Seen::Echoed(buffer[..length].to_vec()));
                }
            }
        }
        let _ = report(Seen::Closed);
    }

    fn connect(proxy: &FaultProxy) -> UnixStream {
        let stream = UnixStream::connect(proxy.socket_path()).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream
    }

    /// Sends `message` and reads the echo back.
    fn round_trip(stream: &mut UnixStream, message: &[u8]) -> Vec<u8> {
        stream.write_all(message).unwrap();
        let mut answer = vec![0; message.len()];
        stream.read_exact(&mut answer).unwrap();
        answer
    }

    /// Whether the peer closed the stream: a read ends without data.
    fn at_end_of_stream(stream: &mut UnixStream) -> bool {
        let mut byte = [0];
        matches!(stream.read(&mut byte), Ok(0))
    }

    #[test]
    fn forwards_both_ways_to_a_unix_upstream() {
        let echo = Echo::unix();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        let mut client = connect(&proxy);
        assert_eq!(round_trip(&mut client, b"hello"), b"hello");
        assert_eq!(echo.next(), Seen::Connected);
        assert_eq!(echo.next(), Seen::Echoed(b"hello".to_vec()));
        assert_eq!(proxy.links_accepted(), 1);
        // The client's end of stream reaches the upstream.
        client.shutdown(Shutdown::Write).unwrap();
        assert_eq!(echo.next(), Seen::Closed);
        assert!(at_end_of_stream(&mut client), "and the upstream's comes back");
    }

    #[test]
    fn forwards_to_a_tcp_upstream() {
        let echo = Echo::tcp();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        let mut client = connect(&proxy);
        let large = crate::pattern(3, 3 * FORWARD_BUFFER_BYTES + 17);
        let writer = {
            let mut client = client.try_clone().unwrap();
            let large = large.clone();
            std::thread::spawn(move || client.write_all(&large).unwrap())
        };
        let mut answer = vec![0; large.len()];
        client.read_exact(&mut answer).unwrap();
        writer.join().unwrap();
        assert!(answer == large, "bytes arrive whole and in order");
    }

    #[test]
    fn the_uri_names_the_export_and_the_socket() {
        let echo = Echo::unix();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        let uri = proxy.uri("disk");
        assert_eq!(uri, format!("nbd+unix:///disk?socket={}", proxy.socket_path().display()));
        assert!(proxy.socket_path().exists());
    }

    #[test]
    fn dropped_links_end_and_later_links_work() {
        let echo = Echo::unix();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        let mut first = connect(&proxy);
        let mut second = connect(&proxy);
        assert_eq!(round_trip(&mut first, b"one"), b"one");
        assert_eq!(round_trip(&mut second, b"two"), b"two");
        proxy.drop_links();
        assert!(at_end_of_stream(&mut first));
        assert!(at_end_of_stream(&mut second));
        assert_eq!(proxy.links_dropped(), 2);
        let closed = (0..6).map(|_| echo.next()).filter(|seen| *seen == Seen::Closed).count();
        assert_eq!(closed, 2, "both upstream connections were cut too");

        let mut third = connect(&proxy);
        assert_eq!(round_trip(&mut third, b"three"), b"three");
        assert_eq!(proxy.links_accepted(), 3);
        assert_eq!(proxy.links_dropped(), 2);
    }

    #[test]
    fn refused_connections_close_without_reaching_the_upstream() {
        let echo = Echo::unix();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        proxy.refuse_connections(true);
        let mut refused = connect(&proxy);
        assert!(at_end_of_stream(&mut refused));
        assert_eq!(proxy.links_refused(), 1);
        assert_eq!(proxy.links_accepted(), 0);
        assert!(echo.saw_nothing_more(), "the upstream was never contacted");

        proxy.refuse_connections(false);
        let mut accepted = connect(&proxy);
        assert_eq!(round_trip(&mut accepted, b"up again"), b"up again");
        assert_eq!(echo.next(), Seen::Connected);
        assert_eq!(proxy.links_accepted(), 1);
    }

    #[test]
    fn blackholed_links_swallow_replies_but_deliver_requests() {
        let echo = Echo::unix();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        let mut client = connect(&proxy);
        assert_eq!(round_trip(&mut client, b"before"), b"before");
        assert_eq!(echo.next(), Seen::Connected);
        assert_eq!(echo.next(), Seen::Echoed(b"before".to_vec()));

        proxy.blackhole_replies();
        client.write_all(b"lost").unwrap();
        assert_eq!(echo.next(), Seen::Echoed(b"lost".to_vec()), "the request arrives");
        // The echo was sent back before it was reported; give the proxy a
        // moment it would need to pass it on, and see that it did not.
        client.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut byte = [0];
        let error = client.read(&mut byte).unwrap_err();
        assert!(matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut));

        let mut fresh = connect(&proxy);
        assert_eq!(round_trip(&mut fresh, b"after"), b"after", "a new link is normal");
    }

    #[test]
    fn a_stall_holds_bytes_and_connections_until_it_ends() {
        let echo = Echo::unix();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        let mut client = connect(&proxy);
        assert_eq!(round_trip(&mut client, b"warm"), b"warm");
        let stall = Duration::from_millis(300);
        let stall_start = Instant::now();
        proxy.stall(stall);
        client.write_all(b"held").unwrap();
        let mut late = connect(&proxy);
        late.write_all(b"late").unwrap();
        let mut answer = [0; 4];
        client.read_exact(&mut answer).unwrap();
        assert!(stall_start.elapsed() >= stall, "bytes passed during the stall");
        assert_eq!(&answer, b"held");
        late.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"late");
        assert_eq!(proxy.links_accepted(), 2);
        let mut connections_at = std::iter::from_fn(|| Some(echo.next_timed()))
            .filter_map(|(at, seen)| (seen == Seen::Connected).then_some(at));
        let (_, late_connected_at) = (connections_at.next(), connections_at.next().unwrap());
        assert!(late_connected_at >= stall_start + stall, "a connection was accepted in a stall");
        // A stall over is over: no delay now.
        let after_start = Instant::now();
        assert_eq!(round_trip(&mut client, b"free"), b"free");
        assert!(after_start.elapsed() < stall);
    }

    /// Drops `proxy` on another thread and fails if that hangs.
    fn drop_within_patience(proxy: FaultProxy) {
        let (done, dropped) = mpsc::channel();
        std::thread::spawn(move || {
            drop(proxy);
            let _ = done.send(());
        });
        dropped.recv_timeout(PATIENCE).expect("dropping the proxy hung");
    }

    #[test]
    fn dropping_the_proxy_closes_its_links_and_socket() {
        let echo = Echo::unix();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        let socket_path = proxy.socket_path().to_owned();
        let mut client = connect(&proxy);
        assert_eq!(round_trip(&mut client, b"bye"), b"bye");
        drop_within_patience(proxy);
        assert!(at_end_of_stream(&mut client));
        assert!(UnixStream::connect(&socket_path).is_err(), "nobody listens any more");
    }

    #[test]
    fn dropping_the_proxy_ends_a_stall() {
        let echo = Echo::unix();
        let proxy = FaultProxy::start(echo.upstream.clone()).unwrap();
        let mut client = connect(&proxy);
        assert_eq!(round_trip(&mut client, b"x"), b"x");
        proxy.stall(Duration::from_secs(3600));
        // Bytes held by a forwarding thread, and a connection held by the
        // accept thread, both waiting out the stall.
        client.write_all(b"held").unwrap();
        let _waiting = UnixStream::connect(proxy.socket_path()).unwrap();
        let waiting_since = Instant::now();
        while proxy.shared.stall_waiters.load(Ordering::Relaxed) < 2 {
            assert!(waiting_since.elapsed() < PATIENCE, "nobody waits out the stall");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop_within_patience(proxy);
        assert!(at_end_of_stream(&mut client));
    }

    #[test]
    fn an_nbd_client_reconnects_through_a_dropped_link() {
        let device = Arc::new(FaultDev::new(1 << 20, 512));
        let server = crate::nbd_loop::start(Arc::clone(&device), 5).unwrap();
        let proxy = FaultProxy::start(Upstream::Unix(server.socket_path().to_owned())).unwrap();
        let mut client = TestNbdClient::connect(proxy.socket_path(), "crash").unwrap();
        let data = crate::pattern(9, 8192);
        client.write(4096, &data, false).unwrap();
        client.flush().unwrap();
        proxy.drop_links();
        assert!(client.read(4096, 8192).is_err(), "the link is gone");
        // The server serves one client at a time: this works only once it
        // saw the old connection end, as the proxy cut both sides.
        let mut again = TestNbdClient::connect(proxy.socket_path(), "crash").unwrap();
        assert_eq!(again.read(4096, 8192).unwrap(), data);
        assert_eq!((proxy.links_accepted(), proxy.links_dropped()), (2, 1));
    }
}
