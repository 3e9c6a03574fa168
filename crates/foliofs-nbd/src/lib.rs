//! foliofs-nbd: files inside a volume served as NBD exports, so a VM (or
//! any NBD client: qemu, nbdkit's nbd plugin, nbdcopy, the kernel's
//! nbd-client) keeps its disk in a foliofs file.
//!
//! A thin front end over the library: the wire codec is the library's
//! (`foliofs::dev::nbd::proto`, shared with the client backend), each
//! command is one library call on the exported file (`export`), option
//! haggling is `handshake`, the request loop `transmission`. All
//! connections share one volume and one set of file handles.

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
        if let Ok(metadata) = std::fs::symlink_metadata(&path) {
            let alive = UnixStream::connect(&path).is_ok();
            if !metadata.file_type().is_socket() || alive {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists (and is not a stale socket)", path.display()),
                ));
            }
            std::fs::remove_file(&path)?;
        }
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
    waker: Arc<Mutex<Option<Waker>>>,
}

impl Stopper {
    pub fn stop(&self) {
        self.connections.stop();
        if let Some(waker) = self.waker.lock().as_ref() {
            waker.wake();
        }
    }
}

pub struct Server {
    volume: Arc<Volume>,
    exports: Vec<Arc<Export>>,
    workers_per_connection: usize,
    connections: Arc<Connections>,
    waker: Arc<Mutex<Option<Waker>>>,
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
            connections: Arc::default(),
            waker: Arc::default(),
        })
    }

    pub fn exports(&self) -> impl Iterator<Item = &Export> {
        self.exports.iter().map(|export| &**export)
    }

    pub fn stopper(&self) -> Stopper {
        Stopper { connections: Arc::clone(&self.connections), waker: Arc::clone(&self.waker) }
    }

    /// Serves until stopped, then answers what was read, writes everything
    /// back and closes the exports and the volume (errors reported).
    pub fn serve(self, listener: Listener) -> foliofs::Result<()> {
        *self.waker.lock() = Some(
            listener
                .waker()
                .map_err(|error| foliofs::Error::io("finding the listening address", error))?,
        );
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
            let spawned = std::thread::Builder::new().name("nbd-conn".into()).spawn(move || {
                if let Err(error) =
                    serve_connection(stream, &volume, &exports, &connections, workers)
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
    workers: usize,
) -> io::Result<()> {
    let Some(id) = connections.register(&stream)? else { return Ok(()) };
    let served = match handshake::negotiate(&mut stream, exports) {
        Ok(Some(agreed)) => transmission::serve(stream, agreed, volume, workers),
        Ok(None) => Ok(()),
        // A stop during the handshake, or a client that went away.
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Ok(()),
        Err(error) => Err(error),
    };
    connections.open.lock().remove(&id);
    served
}
