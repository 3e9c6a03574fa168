//! NBD: the wire protocol ([`proto`]), shared with the server front end,
//! and the client backend ([`NbdDev`]) that puts a volume on a network
//! block device: `nbd://HOST[:PORT]/EXPORT` or
//! `nbd+unix:///EXPORT?socket=PATH` wherever an image path goes.

mod client;
mod handshake;
mod link;
pub mod proto;
#[cfg(test)]
mod reconnect_tests;
mod replay;

pub use client::{LinkStats, NbdDev};

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;
/// How long a request may wait for its reply before the connection is
/// declared lost (the `timeout=SECONDS` query parameter changes it).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a lost connection is tried again before its requests fail
/// with EIO (`reconnect=SECONDS`; 0 fails them at once). Long enough for a
/// switch to flap or a server to restart for an upgrade.
pub const DEFAULT_RECONNECT_WITHIN: Duration = Duration::from_secs(30);
/// How much acknowledged, not yet flushed write data the client keeps to
/// replay after a server restart (`replay-mib=N`); past it, a write's
/// acknowledgement waits for a FLUSH.
pub const DEFAULT_REPLAY_MAX_BYTES: u64 = 64 << 20;

/// Where an export is and what it is called, from an NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdAddress {
    pub endpoint: Endpoint,
    pub export: String,
    pub request_timeout: Duration,
    /// How long a lost connection is tried again; zero: never.
    pub reconnect_within: Duration,
    /// The most written data kept for replay after a reconnect.
    pub replay_max_bytes: u64,
    /// Connections to open (`connections=N`); more than one only when the
    /// server offers CAN_MULTI_CONN.
    pub connections: usize,
}

/// The most connections `connections=N` asks for.
pub const CONNECTIONS_MAX: usize = 16;
/// The most `replay-mib=N` asks for.
pub const REPLAY_MAX_MIB: u64 = 16 << 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// Whether `path` is an NBD URI rather than a file name.
pub fn is_nbd_uri(path: &Path) -> bool {
    path.to_str().is_some_and(|text| text.starts_with("nbd://") || text.starts_with("nbd+unix://"))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Decodes %XX escapes (export names and socket paths may carry them).
fn percent_decode(text: &str) -> io::Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text
                .get(index + 1..index + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| invalid(format!("bad %-escape in {text:?}")))?;
            out.push(hex);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid(format!("{text:?} is not UTF-8 once decoded")))
}

/// The query parameters of an NBD URI.
struct Query {
    socket: Option<PathBuf>,
    request_timeout: Duration,
    reconnect_within: Duration,
    replay_max_bytes: u64,
    connections: usize,
}

impl Query {
    fn parse(uri: &str, query: &str) -> io::Result<Self> {
        let mut socket = None;
        let mut request_timeout = DEFAULT_REQUEST_TIMEOUT;
        let mut connections = 1;
        let mut reconnect_within = DEFAULT_RECONNECT_WITHIN;
        let mut replay_max_bytes = DEFAULT_REPLAY_MAX_BYTES;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "socket" => socket = Some(PathBuf::from(percent_decode(value)?)),
                "timeout" => {
                    let seconds: u64 =
                        value.parse().ok().filter(|seconds| *seconds > 0).ok_or_else(|| {
                            invalid(format!("timeout={value:?} in {uri:?} is not whole seconds"))
                        })?;
                    request_timeout = Duration::from_secs(seconds);
                }
                "connections" => {
                    connections = value
                        .parse()
                        .ok()
                        .filter(|count| (1..=CONNECTIONS_MAX).contains(count))
                        .ok_or_else(|| {
                            invalid(format!(
                                "connections={value:?} in {uri:?} is not 1..={CONNECTIONS_MAX}"
                            ))
                        })?;
                }
                "reconnect" => {
                    let seconds: u64 = value.parse().map_err(|_| {
                        invalid(format!("reconnect={value:?} in {uri:?} is not whole seconds"))
                    })?;
                    reconnect_within = Duration::from_secs(seconds);
                }
                "replay-mib" => {
                    let mib: u64 = value
                        .parse()
                        .ok()
                        .filter(|mib| (1..=REPLAY_MAX_MIB).contains(mib))
                        .ok_or_else(|| {
                            invalid(format!(
                                "replay-mib={value:?} in {uri:?} is not 1..={REPLAY_MAX_MIB}"
                            ))
                        })?;
                    replay_max_bytes = mib << 20;
                }
                other => {
                    return Err(invalid(format!(
                        "unknown parameter {other:?} in {uri:?} (socket, timeout, connections, \
                         reconnect, replay-mib)"
                    )))
                }
            }
        }
        Ok(Self { socket, request_timeout, reconnect_within, replay_max_bytes, connections })
    }
}

impl NbdAddress {
    /// Parses `nbd://HOST[:PORT]/EXPORT` and `nbd+unix:///EXPORT?socket=PATH`
    /// (the URI convention of qemu and libnbd), plus `timeout=SECONDS`,
    /// `connections=N`, `reconnect=SECONDS` and `replay-mib=N`.
    pub fn parse(uri: &str) -> io::Result<Self> {
        let (scheme, rest) =
            uri.split_once("://").ok_or_else(|| invalid(format!("{uri:?} is not an NBD URI")))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, export) = rest.split_once('/').unwrap_or((rest, ""));
        let export = percent_decode(export)?;
        let Query { socket, request_timeout, reconnect_within, replay_max_bytes, connections } =
            Query::parse(uri, query)?;
        let endpoint = match scheme {
            "nbd" => {
                if socket.is_some() {
                    return Err(invalid(format!("{uri:?}: socket= needs nbd+unix://")));
                }
                let (host, port) = match authority.strip_prefix('[') {
                    Some(bracketed) => {
                        let (host, after) = bracketed
                            .split_once(']')
                            .ok_or_else(|| invalid(format!("unclosed [ in {uri:?}")))?;
                        (host, after.strip_prefix(':'))
                    }
                    None => match authority.split_once(':') {
                        Some((host, port)) => (host, Some(port)),
                        None => (authority, None),
                    },
                };
                let port = match port {
                    Some(port) => port
                        .parse()
                        .map_err(|_| invalid(format!("bad port {port:?} in {uri:?}")))?,
                    None => DEFAULT_PORT,
                };
                if host.is_empty() {
                    return Err(invalid(format!("{uri:?} names no host")));
                }
                Endpoint::Tcp { host: host.to_string(), port }
            }
            "nbd+unix" => {
                if !authority.is_empty() {
                    return Err(invalid(format!("{uri:?}: nbd+unix:// takes no host")));
                }
                Endpoint::Unix(socket.ok_or_else(|| {
                    invalid(format!("{uri:?} needs ?socket=PATH (the server's unix socket)"))
                })?)
            }
            other => {
                return Err(invalid(format!(
                    "unsupported scheme {other:?} in {uri:?} (nbd, nbd+unix)"
                )))
            }
        };
        Ok(Self {
            endpoint,
            export,
            request_timeout,
            reconnect_within,
            replay_max_bytes,
            connections,
        })
    }

    /// Opens a connection, giving up on an address silent for `patience`.
    pub fn connect(&self, patience: Duration) -> io::Result<Stream> {
        match &self.endpoint {
            Endpoint::Tcp { host, port } => {
                let mut last_error = None;
                let mut connected = None;
                for address in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&address, patience) {
                        Ok(stream) => {
                            connected = Some(stream);
                            break;
                        }
                        Err(error) => last_error = Some(error),
                    }
                }
                let stream = connected.ok_or_else(|| {
                    last_error.unwrap_or_else(|| {
                        io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"))
                    })
                })?;
                // Requests are small and latency-bound; never wait to batch them.
                stream.set_nodelay(true)?;
                Ok(Stream::Tcp(stream))
            }
            Endpoint::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path)?)),
        }
    }
}

/// A connection, over TCP or a unix socket.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Stream::Tcp(stream) => Stream::Tcp(stream.try_clone()?),
            Stream::Unix(stream) => Stream::Unix(stream.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.shutdown(how),
            Stream::Unix(stream) => stream.shutdown(how),
        }
    }

    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.set_write_timeout(timeout),
            Stream::Unix(stream) => stream.set_write_timeout(timeout),
        }
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.set_read_timeout(timeout),
            Stream::Unix(stream) => stream.set_read_timeout(timeout),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.read(buffer),
            Stream::Unix(stream) => stream.read(buffer),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.write(buffer),
            Stream::Unix(stream) => stream.write(buffer),
        }
    }

    fn write_vectored(&mut self, buffers: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(stream) => stream.write_vectored(buffers),
            Stream::Unix(stream) => stream.write_vectored(buffers),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_uri_forms() {
        let tcp = NbdAddress::parse("nbd://example.org:10810/disk%20a").unwrap();
        assert_eq!(tcp.endpoint, Endpoint::Tcp { host: "example.org".into(), port: 10810 });
        assert_eq!(tcp.export, "disk a");
        let default_port = NbdAddress::parse("nbd://127.0.0.1/").unwrap();
        assert_eq!(default_port.endpoint, Endpoint::Tcp { host: "127.0.0.1".into(), port: 10809 });
        assert_eq!(default_port.export, "");
        let v6 = NbdAddress::parse("nbd://[::1]:9000/x").unwrap();
        assert_eq!(v6.endpoint, Endpoint::Tcp { host: "::1".into(), port: 9000 });
        let unix = NbdAddress::parse(
            "nbd+unix:///vol?socket=/tmp/s.sock&timeout=5&connections=4&reconnect=0&replay-mib=8",
        )
        .unwrap();
        assert_eq!(unix.reconnect_within, Duration::ZERO);
        assert_eq!(unix.replay_max_bytes, 8 << 20);
        assert_eq!(tcp.reconnect_within, DEFAULT_RECONNECT_WITHIN);
        assert_eq!(unix.connections, 4);
        assert_eq!(unix.endpoint, Endpoint::Unix("/tmp/s.sock".into()));
        assert_eq!(unix.export, "vol");
        assert_eq!(unix.request_timeout, Duration::from_secs(5));
        for bad in [
            "nbd+unix:///vol",
            "nbd://:80/x",
            "nbd://h:port/x",
            "nbd+tls://h/x",
            "nbd://h/x?color=red",
            "nbd+unix://host/x?socket=/s",
            "nbd://h/x?timeout=0",
            "nbd://h/x?connections=0",
            "nbd://h/x?connections=17",
            "nbd://h/x?reconnect=-1",
            "nbd://h/x?replay-mib=0",
        ] {
            assert!(NbdAddress::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(is_nbd_uri(Path::new("nbd+unix:///x?socket=/s")));
        assert!(!is_nbd_uri(Path::new("/tmp/nbd://x")));
    }
}
