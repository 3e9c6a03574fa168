//! foliofs-nbd: files inside a volume served as NBD exports, so a VM (or
//! any NBD client: qemu, nbdkit's nbd plugin, nbdcopy, the kernel's
//! nbd-client) keeps its disk in a foliofs file.
//!
//! A thin front end over the library: the wire codec is the library's
//! (`foliofs::dev::nbd::proto`, shared with the client backend), each
//! command is one library call on the exported file (`export`), option
//! haggling is `handshake`, the request loop `transmission`, snapshots
//! asked for on the control socket `control`. All connections share one
//! volume and one set of file handles.

mod control;
mod export;
mod handshake;
mod transmission;

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use foliofs::dev::nbd::Stream;
use foliofs::Volume;
use parking_lot::Mutex;

pub use control::ControlListener;
pub use export::Export;

/// One file to export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    /// The name clients ask for (the default export is the first).
    pub name: String,
    /// The file's path inside the volume.
    pub path: String,
}

/// Where the server listens.
pub enum Listener {
    Tcp(TcpListener),
    Unix { listener: UnixListener, path: PathBuf },
}

impl Listener {
    /// Listens on a unix socket; a stale socket file left by a server that
    /// died is replaced, anything else at `path` is an error.
    pub fn unix(path: PathBuf) -> io::Result<Self> {
        clear_stale_socket(&path)?;
        let listener = UnixListener::bind(&path).map_err(|error| {
            io::Error::new(error.kind(), format!("{}: {error}", path.display()))
        })?;
        Ok(Self::Unix { listener, path })
    }

    pub fn tcp(address: &str) -> io::Result<Self> {
        let listener = TcpListener::bind(address)
            .map_err(|error| io::Error::new(error.kind(), format!("{address}: {error}")))?;
        Ok(Self::Tcp(listener))
    }

    /// What clients connect to, as an NBD URI without the export name.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(listener) => match listener.local_addr() {
                Ok(address) => format!("nbd://{address}/"),
                Err(_) => "nbd://?".into(),
            },
            Listener::Unix { path, .. } => format!("nbd+unix:///?socket={}", path.display()),
        }
    }

    fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Tcp(listener) => {
                let (stream, _) = listener.accept()?;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
            Listener::Unix { listener, .. } => Stream::Unix(listener.accept()?.0),
        })
    }

    /// Something that makes a blocked `accept` return.
    fn waker(&self) -> io::Result<Waker> {
        Ok(match self {
            Listener::Tcp(listener) => Waker::Tcp(listener.local_addr()?),
            Listener::Unix { path, .. } => Waker::Unix(path.clone()),
        })
    }
}

/// Removes a socket file left at `path` by a server that died; anything
/// else there (a live socket, another file) is an error.
fn clear_stale_socket(path: &std::path::Path) -> io::Result<()> {
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        let alive = UnixStream::connect(path).is_ok();
        if !metadata.file_type().is_socket() || alive {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists (and is not a stale socket)", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    Ok(())
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[derive(Clone)]
enum Waker {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl Waker {
    fn wake(&self) {
        let _ = match self {
            Waker::Tcp(address) => TcpStream::connect(address).map(drop),
            Waker::Unix(path) => UnixStream::connect(path).map(drop),
        };
    }
}

/// Connections served at once; more are closed at once (each costs a
/// thread per worker, and a client on a loop could exhaust them).
pub const CONNECTIONS_MAX: usize = 64;

#[derive(Default)]
struct Connections {
    stopping: AtomicBool,
    open: Mutex<HashMap<u64, Stream>>,
    next_id: AtomicU64,
}

impl Connections {
    /// Registers a connection so a stop can end it; None once stopping or
    /// with [`CONNECTIONS_MAX`] open.
    fn register(&self, stream: &Stream) -> io::Result<Option<u64>> {
        let mut open = self.open.lock();
        if self.stopping.load(Ordering::Acquire) {
            return Ok(None);
        }
        if open.len() >= CONNECTIONS_MAX {
            tracing::warn!("NBD connection refused: {CONNECTIONS_MAX} are open already");
            return Ok(None);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        open.insert(id, stream.try_clone()?);
        Ok(Some(id))
    }

    fn stop(&self) {
        let open = self.open.lock();
        self.stopping.store(true, Ordering::Release);
        // Reading ends; requests already read are still answered.
        for stream in open.values() {
            let _ = stream.shutdown(Shutdown::Read);
        }
    }
}

/// Stops a running [`Server::serve`] from another thread (a signal handler).
#[derive(Clone)]
pub struct Stopper {
    connections: Arc<Connections>,
    control: Arc<Connections>,
    wakers: Arc<Mutex<Vec<Waker>>>,
}

impl Stopper {
    pub fn stop(&self) {
        self.connections.stop();
        self.control.stop();
        for waker in self.wakers.lock().iter() {
            waker.wake();
        }
    }
}

pub struct Server {
    volume: Arc<Volume>,
    exports: Vec<Arc<Export>>,
    workers_per_connection: usize,
    read_only: bool,
    /// Held shared by every write for its library call, exclusively by a
    /// snapshot (`control`).
    gate: Arc<control::Gate>,
    connections: Arc<Connections>,
    control: Arc<Connections>,
    wakers: Arc<Mutex<Vec<Waker>>>,
}

impl Server {
    /// Opens the exports (each an existing regular file in `volume`).
    pub fn new(
        volume: Volume,
        exports: &[ExportSpec],
        read_only: bool,
        workers_per_connection: usize,
    ) -> foliofs::Result<Self> {
        let mut opened = Vec::new();
        for spec in exports {
            if opened.iter().any(|export: &Arc<Export>| export.name == spec.name) {
                return Err(foliofs::Error::invalid(format!(
                    "two exports are named {:?}",
                    spec.name
                )));
            }
            opened.push(Arc::new(Export::open(&volume, &spec.name, &spec.path, read_only)?));
        }
        if opened.is_empty() {
            return Err(foliofs::Error::invalid("no file to export"));
        }
        Ok(Self {
            volume: Arc::new(volume),
            exports: opened,
            workers_per_connection,
            read_only,
            gate: Arc::default(),
            connections: Arc::default(),
            control: Arc::default(),
            wakers: Arc::default(),
        })
    }

    pub fn exports(&self) -> impl Iterator<Item = &Export> {
        self.exports.iter().map(|export| &**export)
    }

    pub fn stopper(&self) -> Stopper {
        Stopper {
            connections: Arc::clone(&self.connections),
            control: Arc::clone(&self.control),
            wakers: Arc::clone(&self.wakers),
        }
    }

    /// Serves until stopped, then answers what was read, writes everything
    /// back and closes the exports and the volume (errors reported).
    pub fn serve(self, listener: Listener) -> foliofs::Result<()> {
        self.serve_with_control(listener, None)
    }

    /// [`Server::serve`], answering snapshot requests on `control` too
    /// (`crates/foliofs-nbd/src/control.rs` says how).
    pub fn serve_with_control(
        self,
        listener: Listener,
        control: Option<ControlListener>,
    ) -> foliofs::Result<()> {
        let waker = listener
            .waker()
            .map_err(|error| foliofs::Error::io("finding the listening address", error))?;
        self.wakers.lock().push(waker);
        let control_thread = match control {
            Some(control) => {
                self.wakers.lock().push(Waker::Unix(control.path().to_path_buf()));
                let state = Arc::new(control::Control {
                    volume: Arc::clone(&self.volume),
                    exports: self.exports.clone(),
                    gate: Arc::clone(&self.gate),
                    read_only: self.read_only,
                });
                let connections = Arc::clone(&self.control);
                let thread = std::thread::Builder::new()
                    .name("nbd-control".into())
                    .spawn(move || control::serve(control, state, &connections))
                    .map_err(|error| foliofs::Error::io("starting the control thread", error))?;
                Some(thread)
            }
            None => None,
        };
        // A stop that came before the wakers were in place.
        if self.connections.stopping.load(Ordering::Acquire) {
            self.stopper().stop();
        }
        let mut threads = Vec::new();
        loop {
            let stream = match listener.accept() {
                Ok(stream) => stream,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    tracing::warn!("NBD accept failed: {error}");
                    if self.connections.stopping.load(Ordering::Acquire) {
                        break;
                    }
                    continue;
                }
            };
            if self.connections.stopping.load(Ordering::Acquire) {
                break;
            }
            threads.retain(|thread: &std::thread::JoinHandle<()>| !thread.is_finished());
            let (volume, exports) = (Arc::clone(&self.volume), self.exports.clone());
            let (connections, workers) =
                (Arc::clone(&self.connections), self.workers_per_connection);
            let gate = Arc::clone(&self.gate);
            let spawned = std::thread::Builder::new().name("nbd-conn".into()).spawn(move || {
                if let Err(error) =
                    serve_connection(stream, &volume, &exports, &connections, &gate, workers)
                {
                    tracing::warn!("NBD connection ended: {error}");
                }
            });
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(error) => tracing::error!("NBD connection thread not started: {error}"),
            }
        }
        drop(listener);
        self.connections.stop();
        for thread in threads {
            let _ = thread.join();
        }
        self.control.stop();
        if let Some(thread) = control_thread {
            for waker in self.wakers.lock().iter() {
                waker.wake();
            }
            let _ = thread.join();
        }
        self.close()
    }

    fn close(self) -> foliofs::Result<()> {
        let mut result = Ok(());
        for export in self.exports {
            let export = Arc::into_inner(export).expect("every connection has ended");
            result = result.and(export.close());
        }
        let volume = Arc::into_inner(self.volume).expect("every connection has ended");
        result.and(volume.close())
    }
}

fn serve_connection(
    mut stream: Stream,
    volume: &Volume,
    exports: &[Arc<Export>],
    connections: &Connections,
    gate: &control::Gate,
    workers: usize,
) -> io::Result<()> {
    let Some(id) = connections.register(&stream)? else { return Ok(()) };
    let served = match handshake::negotiate(&mut stream, exports) {
        Ok(Some(agreed)) => transmission::serve(stream, agreed, volume, gate, workers),
        Ok(None) => Ok(()),
        // A stop during the handshake, or a client that went away.
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Ok(()),
        Err(error) => Err(error),
    };
    connections.open.lock().remove(&id);
    served
}
