//! The server's side of option haggling (fixed newstyle).
//!
//! Supported: EXPORT_NAME, ABORT, LIST, INFO/GO (with NBD_INFO_BLOCK_SIZE),
//! STRUCTURED_REPLY and LIST/SET_META_CONTEXT for base:allocation; every
//! other option (STARTTLS, EXTENDED_HEADERS) is answered ERR_UNSUP, as the
//! spec's baseline asks.

use std::io::{self, Read, Write};
use std::sync::Arc;

use foliofs::dev::nbd::proto::{self, GoRequest, Info, MetaContextRequest};

use crate::export::Export;

/// The one metadata context id this server hands out.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// What a connection agreed before transmission.
pub struct Agreed {
    pub export: Arc<Export>,
    pub structured: bool,
    pub base_allocation: bool,
}

fn reply(stream: &mut impl Write, option: u32, reply_type: u32, data: &[u8]) -> io::Result<()> {
    stream.write_all(&proto::encode_option_reply(option, reply_type, data))
}

fn reply_error(
    stream: &mut impl Write,
    option: u32,
    reply_type: u32,
    text: &str,
) -> io::Result<()> {
    reply(stream, option, reply_type, text.as_bytes())
}

fn find<'a>(exports: &'a [Arc<Export>], name: &str) -> Option<&'a Arc<Export>> {
    // The empty name is the default export: the first one.
    if name.is_empty() {
        return exports.first();
    }
    exports.iter().find(|export| export.name == name)
}

fn unknown_export(exports: &[Arc<Export>], name: &str) -> String {
    let names: Vec<&str> = exports.iter().map(|export| export.name.as_str()).collect();
    format!("no export named {name:?} (exports: {})", names.join(", "))
}

/// Negotiates with a client; `Ok(None)` when the client went away or
/// aborted before transmission.
pub fn negotiate(
    stream: &mut (impl Read + Write),
    exports: &[Arc<Export>],
) -> io::Result<Option<Agreed>> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&proto::NBD_MAGIC.to_be_bytes());
    greeting.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    stream.write_all(&greeting)?;
    let mut client_flags = [0; 4];
    stream.read_exact(&mut client_flags)?;
    let client_flags = u32::from_be_bytes(client_flags);
    if client_flags & !(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown client flags {client_flags:#x}"),
        ));
    }
    let no_zeroes = client_flags & proto::CLIENT_NO_ZEROES != 0;
    let mut structured = false;
    let mut base_allocation = false;
    loop {
        let mut header = [0; proto::OPTION_HEADER_BYTES];
        stream.read_exact(&mut header)?;
        let (option, length) = proto::decode_option_header(&header)?;
        let mut data = vec![0; length as usize];
        stream.read_exact(&mut data)?;
        match option {
            proto::OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data);
                // This option cannot report errors: the spec says hang up.
                let Some(export) = find(exports, &name) else { return Ok(None) };
                let mut answer = Vec::with_capacity(134);
                answer.extend_from_slice(&export.size_bytes.to_be_bytes());
                answer.extend_from_slice(&export.transmission_flags().to_be_bytes());
                if !no_zeroes {
                    answer.extend_from_slice(&[0; 124]);
                }
                stream.write_all(&answer)?;
                let export = Arc::clone(export);
                return Ok(Some(Agreed { export, structured, base_allocation }));
            }
            proto::OPT_ABORT => {
                reply(stream, option, proto::REP_ACK, &[])?;
                return Ok(None);
            }
            proto::OPT_LIST => {
                if !data.is_empty() {
                    reply_error(stream, option, proto::REP_ERR_INVALID, "LIST takes no data")?;
                    continue;
                }
                for export in exports {
                    let mut entry = (export.name.len() as u32).to_be_bytes().to_vec();
                    entry.extend_from_slice(export.name.as_bytes());
                    reply(stream, option, proto::REP_SERVER, &entry)?;
                }
                reply(stream, option, proto::REP_ACK, &[])?;
            }
            proto::OPT_INFO | proto::OPT_GO => {
                let request = match GoRequest::decode(&data) {
                    Ok(request) => request,
                    Err(error) => {
                        reply_error(stream, option, proto::REP_ERR_INVALID, &error.to_string())?;
                        continue;
                    }
                };
                let Some(export) = find(exports, &request.name) else {
                    let text = unknown_export(exports, &request.name);
                    reply_error(stream, option, proto::REP_ERR_UNKNOWN, &text)?;
                    continue;
                };
                let info = Info::Export {
                    size_bytes: export.size_bytes,
                    transmission_flags: export.transmission_flags(),
                };
                reply(stream, option, proto::REP_INFO, &info.encode())?;
                if request.info_requests.contains(&proto::INFO_BLOCK_SIZE) {
                    let info = Info::BlockSize {
                        minimum: export.direct_align_bytes,
                        preferred: export.block_bytes.max(export.direct_align_bytes),
                        maximum: proto::PAYLOAD_DEFAULT_MAX_BYTES,
                    };
                    reply(stream, option, proto::REP_INFO, &info.encode())?;
                }
                reply(stream, option, proto::REP_ACK, &[])?;
                if option == proto::OPT_GO {
                    let export = Arc::clone(export);
                    return Ok(Some(Agreed { export, structured, base_allocation }));
                }
            }
            proto::OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    let text = "STRUCTURED_REPLY takes no data";
                    reply_error(stream, option, proto::REP_ERR_INVALID, text)?;
                    continue;
                }
                structured = true;
                reply(stream, option, proto::REP_ACK, &[])?;
            }
            proto::OPT_LIST_META_CONTEXT | proto::OPT_SET_META_CONTEXT => {
                let setting = option == proto::OPT_SET_META_CONTEXT;
                if !structured {
                    let text = "metadata contexts need structured replies first";
                    reply_error(stream, option, proto::REP_ERR_INVALID, text)?;
                    continue;
                }
                let request = match MetaContextRequest::decode(&data) {
                    Ok(request) => request,
                    Err(error) => {
                        reply_error(stream, option, proto::REP_ERR_INVALID, &error.to_string())?;
                        continue;
                    }
                };
                if find(exports, &request.export_name).is_none() {
                    let text = unknown_export(exports, &request.export_name);
                    reply_error(stream, option, proto::REP_ERR_UNKNOWN, &text)?;
                    continue;
                }
                let matches =
                    |query: &str| query == proto::BASE_ALLOCATION || (!setting && query == "base:");
                let selected = if request.queries.is_empty() {
                    !setting
                } else {
                    request.queries.iter().any(|query| matches(query))
                };
                if setting {
                    base_allocation = selected;
                }
                if selected {
                    let context =
                        proto::encode_meta_context(BASE_ALLOCATION_ID, proto::BASE_ALLOCATION);
                    reply(stream, option, proto::REP_META_CONTEXT, &context)?;
                }
                reply(stream, option, proto::REP_ACK, &[])?;
            }
            _ => {
                let text = format!("option {option} is not supported");
                reply_error(stream, option, proto::REP_ERR_UNSUP, &text)?;
            }
        }
    }
}
