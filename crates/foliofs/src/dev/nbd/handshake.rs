//! Opening one connection: connect, then the fixed newstyle handshake,
//! which says what the export is and what the server offers.

use std::io::{self, Read, Write};
use std::time::Duration;

use super::proto::{self, GoRequest, Info};
use super::{NbdAddress, Stream};

/// What the handshake agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Negotiated {
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub structured: bool,
    pub block_min_bytes: u32,
    pub payload_max_bytes: u32,
}

impl Negotiated {
    pub fn has(&self, flag: u16) -> bool {
        self.transmission_flags & flag != 0
    }

    /// Whether `other` describes the same export: what the client has
    /// promised its callers (the size, what it may send) must not change
    /// under them across a reconnect.
    pub fn same_export(&self, other: &Negotiated) -> bool {
        (self.size_bytes, self.transmission_flags, self.block_min_bytes)
            == (other.size_bytes, other.transmission_flags, other.block_min_bytes)
    }
}

pub(super) fn protocol(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
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

/// Connects and negotiates one connection, giving up on a peer silent for
/// `patience` (the request timeout, or less when reconnecting late).
pub(super) fn connect(
    address: &NbdAddress,
    patience: Duration,
) -> io::Result<(Stream, Negotiated)> {
    let mut stream = address
        .connect(patience)
        .map_err(|error| io::Error::new(error.kind(), format!("connect: {error}")))?;
    // Neither the handshake nor a request may hang on a peer that stopped
    // reading or answering: after the timeout the connection is lost.
    stream.set_read_timeout(Some(patience))?;
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
