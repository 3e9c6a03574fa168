//! The NBD wire protocol (NetworkBlockDevice/nbd doc/proto.md), shared by
//! the client backend and the server front end: constants, fixed-size
//! headers, option payloads and reply chunks. Pure: encoders return bytes,
//! decoders take bytes and return [`ProtoError`] on anything malformed;
//! none panics on any input.

use std::fmt;

pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
/// The oldstyle handshake's second word; refused with a clear message.
pub const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply types; errors have the top bit set.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_FLAG_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

/// Information types of NBD_OPT_INFO / NBD_OPT_GO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_ROTATIONAL: u16 = 1 << 4;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply chunk flags and types.
pub const CHUNK_FLAG_DONE: u16 = 1 << 0;
pub const CHUNK_NONE: u16 = 0;
pub const CHUNK_OFFSET_DATA: u16 = 1;
pub const CHUNK_OFFSET_HOLE: u16 = 2;
pub const CHUNK_BLOCK_STATUS: u16 = 5;
pub const CHUNK_ERROR: u16 = (1 << 15) | 1;
pub const CHUNK_ERROR_OFFSET: u16 = (1 << 15) | 2;

/// The one metadata context served and read: allocation status.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// base:allocation flags of a block status descriptor.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// Error values on the wire (Linux numbers, as the spec fixes them).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The largest option payload either side accepts: names and queries are
/// short, so anything larger is hostile or broken.
pub const OPTION_DATA_MAX_BYTES: u32 = 64 << 10;
/// The largest payload of a request or reply chunk accepted when the peer
/// gave no block size limit (the spec's default maximum).
pub const PAYLOAD_DEFAULT_MAX_BYTES: u32 = 32 << 20;

pub const REQUEST_HEADER_BYTES: usize = 28;
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// A structured chunk header after its 4-byte magic.
pub const CHUNK_HEADER_REST_BYTES: usize = 16;
pub const OPTION_HEADER_BYTES: usize = 16;
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
// The sizes are the fields the encoders write: magic, then the rest.
const _: () = assert!(REQUEST_HEADER_BYTES == 4 + 2 + 2 + 8 + 8 + 4);
const _: () = assert!(SIMPLE_REPLY_BYTES == 4 + 4 + 8);
const _: () = assert!(CHUNK_HEADER_REST_BYTES == 2 + 2 + 8 + 4);
const _: () = assert!(OPTION_HEADER_BYTES == 8 + 4 + 4);
const _: () = assert!(OPTION_REPLY_HEADER_BYTES == 8 + 4 + 4 + 4);

/// A malformed message: the peer does not speak the protocol as we do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "NBD protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtoError {}

impl From<ProtoError> for std::io::Error {
    fn from(error: ProtoError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, error)
    }
}

pub type ProtoResult<T> = Result<T, ProtoError>;

fn malformed(what: impl Into<String>) -> ProtoError {
    ProtoError(what.into())
}

/// A bounds-checked big-endian reader over one message.
pub struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { bytes, what }
    }

    pub fn take(&mut self, length: usize) -> ProtoResult<&'a [u8]> {
        if self.bytes.len() < length {
            return Err(malformed(format!(
                "{} is truncated: {} more bytes wanted, {} left",
                self.what,
                length,
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(length);
        self.bytes = rest;
        debug_assert_eq!(head.len(), length);
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> ProtoResult<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u16(&mut self) -> ProtoResult<u16> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> ProtoResult<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> ProtoResult<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A string of `length` bytes that must be UTF-8.
    pub fn string(&mut self, length: usize) -> ProtoResult<String> {
        let what = self.what;
        String::from_utf8(self.take(length)?.to_vec())
            .map_err(|_| malformed(format!("{what} holds a name that is not UTF-8")))
    }

    /// Fails unless every byte was consumed.
    pub fn finish(self) -> ProtoResult<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(malformed(format!("{} has {} trailing bytes", self.what, self.bytes.len())))
        }
    }
}

fn length_u32(length: usize, what: &str) -> u32 {
    u32::try_from(length).unwrap_or_else(|_| panic!("{what} of {length} bytes does not fit u32"))
}

/// A transmission request (28 bytes; a WRITE's payload follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = [0; REQUEST_HEADER_BYTES];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8; REQUEST_HEADER_BYTES]) -> ProtoResult<Self> {
        let mut reader = Reader::new(bytes, "request header");
        let magic = reader.u32()?;
        if magic != REQUEST_MAGIC {
            return Err(malformed(format!("bad request magic {magic:#x}")));
        }
        Ok(Self {
            flags: reader.u16()?,
            command: reader.u16()?,
            cookie: reader.u64()?,
            offset: reader.u64()?,
            length: reader.u32()?,
        })
    }
}

/// A simple reply: error and cookie (a successful READ's data follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReply {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_BYTES] {
        let mut out = [0; SIMPLE_REPLY_BYTES];
        out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        out[4..8].copy_from_slice(&self.error.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out
    }
}

/// A structured reply chunk's header (its payload of `length` bytes follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub chunk_type: u16,
    pub cookie: u64,
    pub length: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; 4 + CHUNK_HEADER_REST_BYTES] {
        let mut out = [0; 4 + CHUNK_HEADER_REST_BYTES];
        out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.chunk_type.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..20].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    pub fn is_done(&self) -> bool {
        self.flags & CHUNK_FLAG_DONE != 0
    }
}

/// The header of any reply, told apart by its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple(SimpleReply),
    Chunk(ChunkHeader),
}

impl ReplyHeader {
    /// Bytes that follow the 4-byte magic, or an error for an unknown magic.
    pub fn rest_bytes(magic: [u8; 4]) -> ProtoResult<usize> {
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => Ok(SIMPLE_REPLY_BYTES - 4),
            STRUCTURED_REPLY_MAGIC => Ok(CHUNK_HEADER_REST_BYTES),
            other => Err(malformed(format!("bad reply magic {other:#x}"))),
        }
    }

    /// Decodes the header from its magic and the `rest_bytes` after it.
    pub fn decode(magic: [u8; 4], rest: &[u8]) -> ProtoResult<Self> {
        let mut reader = Reader::new(rest, "reply header");
        let header = match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => {
                Self::Simple(SimpleReply { error: reader.u32()?, cookie: reader.u64()? })
            }
            STRUCTURED_REPLY_MAGIC => Self::Chunk(ChunkHeader {
                flags: reader.u16()?,
                chunk_type: reader.u16()?,
                cookie: reader.u64()?,
                length: reader.u32()?,
            }),
            other => return Err(malformed(format!("bad reply magic {other:#x}"))),
        };
        reader.finish()?;
        Ok(header)
    }
}

/// The client's option header: `IHAVEOPT, option, length` (data follows).
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_HEADER_BYTES + data.len());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&length_u32(data.len(), "option data").to_be_bytes());
    out.extend_from_slice(data);
    debug_assert_eq!(out.len(), OPTION_HEADER_BYTES + data.len());
    out
}

/// Decodes an option header into (option, data length); the length is
/// checked against [`OPTION_DATA_MAX_BYTES`] before anyone allocates it.
pub fn decode_option_header(bytes: &[u8; OPTION_HEADER_BYTES]) -> ProtoResult<(u32, u32)> {
    let mut reader = Reader::new(bytes, "option header");
    let magic = reader.u64()?;
    if magic != IHAVEOPT {
        return Err(malformed(format!("bad option magic {magic:#x}")));
    }
    let option = reader.u32()?;
    let length = reader.u32()?;
    if length > OPTION_DATA_MAX_BYTES {
        return Err(malformed(format!(
            "option {option} carries {length} bytes, more than the {OPTION_DATA_MAX_BYTES} accepted"
        )));
    }
    Ok((option, length))
}

/// The server's option reply header (data follows).
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_BYTES + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&length_u32(data.len(), "option reply").to_be_bytes());
    out.extend_from_slice(data);
    debug_assert_eq!(out.len(), OPTION_REPLY_HEADER_BYTES + data.len());
    out
}

/// Decodes an option reply header into (option, reply type, data length).
pub fn decode_option_reply_header(
    bytes: &[u8; OPTION_REPLY_HEADER_BYTES],
) -> ProtoResult<(u32, u32, u32)> {
    let mut reader = Reader::new(bytes, "option reply header");
    let magic = reader.u64()?;
    if magic != OPTION_REPLY_MAGIC {
        return Err(malformed(format!("bad option reply magic {magic:#x}")));
    }
    let option = reader.u32()?;
    let reply_type = reader.u32()?;
    let length = reader.u32()?;
    if length > OPTION_DATA_MAX_BYTES {
        return Err(malformed(format!(
            "option reply of {length} bytes, more than the {OPTION_DATA_MAX_BYTES} accepted"
        )));
    }
    Ok((option, reply_type, length))
}

/// NBD_OPT_INFO / NBD_OPT_GO data: an export name and the information asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    pub name: String,
    pub info_requests: Vec<u16>,
}

impl GoRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&length_u32(self.name.len(), "export name").to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        let count = u16::try_from(self.info_requests.len()).expect("few info requests");
        out.extend_from_slice(&count.to_be_bytes());
        for info in &self.info_requests {
            out.extend_from_slice(&info.to_be_bytes());
        }
        debug_assert_eq!(out.len(), 4 + self.name.len() + 2 + 2 * self.info_requests.len());
        out
    }

    pub fn decode(data: &[u8]) -> ProtoResult<Self> {
        let mut reader = Reader::new(data, "NBD_OPT_GO data");
        let name_length = reader.u32()? as usize;
        let name = reader.string(name_length)?;
        let count = reader.u16()?;
        let mut info_requests = Vec::new();
        for _ in 0..count {
            info_requests.push(reader.u16()?);
        }
        reader.finish()?;
        Ok(Self { name, info_requests })
    }
}

/// One NBD_REP_INFO payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    Export {
        size_bytes: u64,
        transmission_flags: u16,
    },
    BlockSize {
        minimum: u32,
        preferred: u32,
        maximum: u32,
    },
    /// A type this side does not use (name, description, future ones).
    Other(u16),
}

impl Info {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Info::Export { size_bytes, transmission_flags } => {
                out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                out.extend_from_slice(&size_bytes.to_be_bytes());
                out.extend_from_slice(&transmission_flags.to_be_bytes());
            }
            Info::BlockSize { minimum, preferred, maximum } => {
                out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                out.extend_from_slice(&minimum.to_be_bytes());
                out.extend_from_slice(&preferred.to_be_bytes());
                out.extend_from_slice(&maximum.to_be_bytes());
            }
            Info::Other(kind) => out.extend_from_slice(&kind.to_be_bytes()),
        }
        out
    }

    pub fn decode(data: &[u8]) -> ProtoResult<Self> {
        let mut reader = Reader::new(data, "NBD_REP_INFO");
        let info = match reader.u16()? {
            INFO_EXPORT => {
                Info::Export { size_bytes: reader.u64()?, transmission_flags: reader.u16()? }
            }
            INFO_BLOCK_SIZE => {
                let info = Info::BlockSize {
                    minimum: reader.u32()?,
                    preferred: reader.u32()?,
                    maximum: reader.u32()?,
                };
                let Info::BlockSize { minimum, preferred, maximum } = info else { unreachable!() };
                if !minimum.is_power_of_two()
                    || !preferred.is_power_of_two()
                    || preferred < minimum
                    || maximum < minimum
                {
                    return Err(malformed(format!(
                        "block sizes minimum {minimum}, preferred {preferred}, maximum \
                         {maximum} are inconsistent"
                    )));
                }
                info
            }
            other => return Ok(Info::Other(other)),
        };
        reader.finish()?;
        Ok(info)
    }
}

/// NBD_OPT_LIST_META_CONTEXT / SET_META_CONTEXT data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export_name: String,
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&length_u32(self.export_name.len(), "export name").to_be_bytes());
        out.extend_from_slice(self.export_name.as_bytes());
        out.extend_from_slice(&length_u32(self.queries.len(), "queries").to_be_bytes());
        for query in &self.queries {
            out.extend_from_slice(&length_u32(query.len(), "query").to_be_bytes());
            out.extend_from_slice(query.as_bytes());
        }
        out
    }

    pub fn decode(data: &[u8]) -> ProtoResult<Self> {
        let mut reader = Reader::new(data, "meta context request");
        let name_length = reader.u32()? as usize;
        let export_name = reader.string(name_length)?;
        let count = reader.u32()?;
        let mut queries = Vec::new();
        for _ in 0..count {
            let length = reader.u32()? as usize;
            queries.push(reader.string(length)?);
        }
        reader.finish()?;
        Ok(Self { export_name, queries })
    }
}

/// NBD_REP_META_CONTEXT data: a context id and its name.
pub fn encode_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(name.as_bytes());
    out
}

pub fn decode_meta_context(data: &[u8]) -> ProtoResult<(u32, String)> {
    let mut reader = Reader::new(data, "NBD_REP_META_CONTEXT");
    let id = reader.u32()?;
    let name = reader.rest();
    let name = String::from_utf8(name.to_vec())
        .map_err(|_| malformed("meta context name is not UTF-8"))?;
    Ok((id, name))
}

/// One block status descriptor: `length` bytes with `flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStatus {
    pub length: u32,
    pub flags: u32,
}

/// An NBD_REPLY_TYPE_BLOCK_STATUS payload.
pub fn encode_block_status(context_id: u32, descriptors: &[BlockStatus]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 8 * descriptors.len());
    out.extend_from_slice(&context_id.to_be_bytes());
    for descriptor in descriptors {
        out.extend_from_slice(&descriptor.length.to_be_bytes());
        out.extend_from_slice(&descriptor.flags.to_be_bytes());
    }
    debug_assert_eq!(out.len(), 4 + 8 * descriptors.len());
    out
}

pub fn decode_block_status(data: &[u8]) -> ProtoResult<(u32, Vec<BlockStatus>)> {
    let mut reader = Reader::new(data, "block status chunk");
    let context_id = reader.u32()?;
    if reader.is_empty() || !reader.bytes.len().is_multiple_of(8) {
        return Err(malformed("block status chunk without whole descriptors"));
    }
    let mut descriptors = Vec::new();
    while !reader.is_empty() {
        descriptors.push(BlockStatus { length: reader.u32()?, flags: reader.u32()? });
    }
    Ok((context_id, descriptors))
}

/// An error chunk's payload: error, message and (for ERROR_OFFSET) offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkError {
    pub error: u32,
    pub message: String,
    pub offset: Option<u64>,
}

impl ChunkError {
    pub fn encode(&self) -> Vec<u8> {
        // The message is informational; it is cut rather than refused.
        let message = &self.message.as_bytes()[..self.message.len().min(4096)];
        // Its length goes out as a u16.
        debug_assert!(message.len() <= usize::from(u16::MAX));
        let mut out = self.error.to_be_bytes().to_vec();
        out.extend_from_slice(&(message.len() as u16).to_be_bytes());
        out.extend_from_slice(message);
        if let Some(offset) = self.offset {
            out.extend_from_slice(&offset.to_be_bytes());
        }
        out
    }

    pub fn decode(chunk_type: u16, data: &[u8]) -> ProtoResult<Self> {
        let mut reader = Reader::new(data, "error chunk");
        let error = reader.u32()?;
        let length = reader.u16()? as usize;
        let message = String::from_utf8_lossy(reader.take(length)?).into_owned();
        let offset = if chunk_type == CHUNK_ERROR_OFFSET { Some(reader.u64()?) } else { None };
        reader.finish()?;
        if error == 0 {
            return Err(malformed("error chunk with error value 0"));
        }
        Ok(Self { error, message, offset })
    }
}

/// The wire error for an errno: the spec's set, anything else as EIO
/// except what reads as an invalid request.
pub fn error_from_errno(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EROFS | libc::EACCES => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL | libc::EFBIG => EINVAL,
        libc::ENOSPC | libc::EDQUOT => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::EOPNOTSUPP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// The errno for a wire error; unknown values are EIO (the spec asks
/// clients to treat them so).
pub fn errno_from_error(error: u32) -> i32 {
    match error {
        EPERM => libc::EPERM,
        ENOMEM => libc::ENOMEM,
        EINVAL => libc::EINVAL,
        ENOSPC => libc::ENOSPC,
        EOVERFLOW => libc::EOVERFLOW,
        ENOTSUP => libc::EOPNOTSUPP,
        ESHUTDOWN => libc::ESHUTDOWN,
        _ => libc::EIO,
    }
}

/// A name for a command, for messages.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown command",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_round_trips_with_the_spec_layout() {
        let request = Request {
            flags: CMD_FLAG_FUA,
            command: CMD_WRITE,
            cookie: 7,
            offset: 4096,
            length: 512,
        };
        let bytes = request.encode();
        assert_eq!(&bytes[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&bytes[4..8], &[0, 1, 0, 1]);
        assert_eq!(Request::decode(&bytes).unwrap(), request);
        let mut bad = bytes;
        bad[0] = 0;
        assert!(Request::decode(&bad).unwrap_err().0.contains("magic"));
    }

    #[test]
    fn replies_decode_by_magic() {
        let simple = SimpleReply { error: EIO, cookie: 9 }.encode();
        let magic: [u8; 4] = simple[0..4].try_into().unwrap();
        assert_eq!(ReplyHeader::rest_bytes(magic).unwrap(), 12);
        assert_eq!(
            ReplyHeader::decode(magic, &simple[4..]).unwrap(),
            ReplyHeader::Simple(SimpleReply { error: EIO, cookie: 9 })
        );
        let chunk = ChunkHeader {
            flags: CHUNK_FLAG_DONE,
            chunk_type: CHUNK_OFFSET_DATA,
            cookie: 3,
            length: 4104,
        };
        let bytes = chunk.encode();
        let magic: [u8; 4] = bytes[0..4].try_into().unwrap();
        assert_eq!(ReplyHeader::decode(magic, &bytes[4..]).unwrap(), ReplyHeader::Chunk(chunk));
        assert!(ReplyHeader::rest_bytes([1, 2, 3, 4]).is_err());
    }

    #[test]
    fn options_round_trip() {
        let go = GoRequest { name: "disk".into(), info_requests: vec![INFO_BLOCK_SIZE] };
        let bytes = encode_option(OPT_GO, &go.encode());
        let (option, length) = decode_option_header(bytes[..16].try_into().unwrap()).unwrap();
        assert_eq!((option, length as usize), (OPT_GO, bytes.len() - 16));
        assert_eq!(GoRequest::decode(&bytes[16..]).unwrap(), go);

        let info = Info::BlockSize { minimum: 512, preferred: 4096, maximum: 32 << 20 };
        assert_eq!(Info::decode(&info.encode()).unwrap(), info);
        let export = Info::Export { size_bytes: 1 << 30, transmission_flags: TF_SEND_FUA };
        assert_eq!(Info::decode(&export.encode()).unwrap(), export);
        let bad = Info::BlockSize { minimum: 3, preferred: 4096, maximum: 1 << 20 };
        assert!(Info::decode(&bad.encode()).is_err());

        let meta = MetaContextRequest {
            export_name: "disk".into(),
            queries: vec![BASE_ALLOCATION.into()],
        };
        assert_eq!(MetaContextRequest::decode(&meta.encode()).unwrap(), meta);
        let reply = encode_option_reply(OPT_GO, REP_ACK, &[]);
        assert_eq!(
            decode_option_reply_header(reply[..20].try_into().unwrap()).unwrap(),
            (OPT_GO, REP_ACK, 0)
        );
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocation() {
        let mut header = encode_option(OPT_GO, &[]);
        header[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_option_header(header[..16].try_into().unwrap()).is_err());
        // A name length past the data.
        let mut data = GoRequest { name: "x".into(), info_requests: vec![] }.encode();
        data[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(GoRequest::decode(&data).is_err());
    }

    #[test]
    fn chunks_round_trip() {
        let descriptors = [
            BlockStatus { length: 65536, flags: 0 },
            BlockStatus { length: 4096, flags: STATE_HOLE | STATE_ZERO },
        ];
        let bytes = encode_block_status(1, &descriptors);
        assert_eq!(decode_block_status(&bytes).unwrap(), (1, descriptors.to_vec()));
        assert!(decode_block_status(&bytes[..7]).is_err());
        let error = ChunkError { error: EIO, message: "lost".into(), offset: Some(512) };
        assert_eq!(ChunkError::decode(CHUNK_ERROR_OFFSET, &error.encode()).unwrap(), error);
        let plain = ChunkError { offset: None, ..error };
        assert_eq!(ChunkError::decode(CHUNK_ERROR, &plain.encode()).unwrap(), plain);
    }

    #[test]
    fn errors_map_both_ways() {
        for errno in [libc::EPERM, libc::EIO, libc::ENOSPC, libc::EINVAL, libc::EOPNOTSUPP] {
            assert_eq!(errno_from_error(error_from_errno(errno)), errno);
        }
        assert_eq!(error_from_errno(libc::EROFS), EPERM);
        assert_eq!(errno_from_error(12345), libc::EIO);
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96),
                                kind in any::<u16>()) {
            let _ = GoRequest::decode(&bytes);
            let _ = Info::decode(&bytes);
            let _ = MetaContextRequest::decode(&bytes);
            let _ = decode_meta_context(&bytes);
            let _ = decode_block_status(&bytes);
            let _ = ChunkError::decode(kind, &bytes);
            if bytes.len() >= 28 {
                let _ = Request::decode(bytes[..28].try_into().unwrap());
                let _ = decode_option_header(bytes[..16].try_into().unwrap());
                let _ = decode_option_reply_header(bytes[..20].try_into().unwrap());
                let magic: [u8; 4] = bytes[..4].try_into().unwrap();
                let _ = ReplyHeader::decode(magic, &bytes[4..]);
                let _ = ReplyHeader::decode(magic, &bytes[4..16]);
                let _ = ReplyHeader::decode(magic, &bytes[4..20]);
            }
        }
    }
}
