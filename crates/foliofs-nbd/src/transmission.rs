//! The transmission phase of one connection: one thread reads requests
//! (and WRITE payloads, which follow their headers), a few workers run
//! them against the export, and replies go out in completion order under
//! a lock, paired with their requests by cookie. WRITE, TRIM and
//! WRITE_ZEROES pass the server's write gate (shared) for their library
//! call and release it before the reply, so a snapshot (`control`) holds
//! every write already answered and none in part.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::mpsc;

use foliofs::dev::nbd::proto::{self, BlockStatus, ChunkError, ChunkHeader, Request, SimpleReply};
use foliofs::dev::nbd::Stream;
use foliofs::dev::AlignedBuf;
use foliofs::Volume;
use parking_lot::Mutex;

use crate::control::Gate;
use crate::export::{CommandError, CommandResult, Export};
use crate::handshake::{Agreed, BASE_ALLOCATION_ID};

const KNOWN_FLAGS: u16 = proto::CMD_FLAG_FUA
    | proto::CMD_FLAG_NO_HOLE
    | proto::CMD_FLAG_DF
    | proto::CMD_FLAG_REQ_ONE
    | proto::CMD_FLAG_FAST_ZERO;

struct Job {
    request: Request,
    payload: Option<AlignedBuf>,
}

/// Sends replies; a failed send shuts the connection down, so the reader
/// stops too.
struct Replier {
    stream: Mutex<Stream>,
    structured: bool,
}

impl Replier {
    fn send(&self, parts: &[&[u8]]) {
        let mut stream = self.stream.lock();
        let sent = parts.iter().try_for_each(|part| stream.write_all(part));
        if let Err(error) = sent {
            tracing::warn!("NBD reply not sent ({error}); closing the connection");
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    fn simple(&self, cookie: u64, error: u32) {
        self.send(&[&SimpleReply { error, cookie }.encode()])
    }

    fn chunk(&self, cookie: u64, chunk_type: u16, payload: &[&[u8]]) {
        let length: usize = payload.iter().map(|part| part.len()).sum();
        let header = ChunkHeader {
            flags: proto::CHUNK_FLAG_DONE,
            chunk_type,
            cookie,
            length: length as u32,
        };
        let header = header.encode();
        let mut parts: Vec<&[u8]> = vec![&header];
        parts.extend_from_slice(payload);
        self.send(&parts)
    }

    fn read_data(&self, request: &Request, data: &AlignedBuf) {
        if self.structured {
            let offset = request.offset.to_be_bytes();
            self.chunk(request.cookie, proto::CHUNK_OFFSET_DATA, &[&offset, data])
        } else {
            let header = SimpleReply { error: 0, cookie: request.cookie }.encode();
            self.send(&[&header, data])
        }
    }

    fn failed(&self, request: &Request, failure: CommandError) {
        if failure.error == proto::EIO {
            tracing::error!(
                "NBD {} at {} of {} bytes: {}",
                proto::command_name(request.command),
                request.offset,
                request.length,
                failure.message
            );
        }
        // Replies with payloads must be structured once negotiated.
        let with_payload = matches!(request.command, proto::CMD_READ | proto::CMD_BLOCK_STATUS);
        if self.structured && with_payload {
            let error = ChunkError { error: failure.error, message: failure.message, offset: None };
            self.chunk(request.cookie, proto::CHUNK_ERROR, &[&error.encode()])
        } else {
            self.simple(request.cookie, failure.error)
        }
    }
}

/// Serves requests until the client disconnects or the stream is shut down.
pub fn serve(
    mut stream: Stream,
    agreed: Agreed,
    volume: &Volume,
    gate: &Gate,
    workers: usize,
) -> io::Result<()> {
    let export = &*agreed.export;
    let replier =
        Replier { stream: Mutex::new(stream.try_clone()?), structured: agreed.structured };
    // Bounded: a client that sends faster than the export works waits in
    // its socket instead of in our memory (a WRITE may carry 32 MiB).
    let (jobs, queue) = mpsc::sync_channel::<Job>(2 * workers.max(1));
    let queue = Mutex::new(queue);
    std::thread::scope(|scope| {
        for _ in 0..workers.max(1) {
            scope.spawn(|| loop {
                let job = queue.lock().recv();
                let Ok(job) = job else { return };
                run(export, volume, gate, &replier, agreed.base_allocation, job);
            });
        }
        let ended = read_requests(&mut stream, export, &agreed, &replier, &jobs);
        drop(jobs);
        ended
    })
}

fn read_requests(
    stream: &mut Stream,
    export: &Export,
    agreed: &Agreed,
    replier: &Replier,
    jobs: &mpsc::SyncSender<Job>,
) -> io::Result<()> {
    loop {
        let mut header = [0; proto::REQUEST_HEADER_BYTES];
        match stream.read_exact(&mut header) {
            Ok(()) => {}
            // A client that hangs up without DISC, or a shutdown.
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error),
        }
        let request = Request::decode(&header)?;
        let payload = if request.command == proto::CMD_WRITE {
            match read_payload(stream, request.length)? {
                Some(payload) => Some(payload),
                None => {
                    let text = format!("WRITE of {} bytes is too large", request.length);
                    replier.failed(&request, CommandError::invalid(text));
                    continue;
                }
            }
        } else {
            None
        };
        if request.command == proto::CMD_DISC {
            return Ok(());
        }
        match check(export, agreed, &request) {
            Ok(()) => {
                if jobs.send(Job { request, payload }).is_err() {
                    return Ok(());
                }
            }
            Err(failure) => replier.failed(&request, failure),
        }
    }
}

/// Reads a WRITE payload; None (after discarding it) when it is larger
/// than any request we accept.
fn read_payload(stream: &mut Stream, length: u32) -> io::Result<Option<AlignedBuf>> {
    if length <= proto::PAYLOAD_DEFAULT_MAX_BYTES {
        let mut payload = AlignedBuf::zeroed(length as usize);
        stream.read_exact(&mut payload)?;
        return Ok(Some(payload));
    }
    io::copy(&mut stream.take(u64::from(length)), &mut io::sink())?;
    Ok(None)
}

/// Refuses what no export command could do, before any work.
fn check(export: &Export, agreed: &Agreed, request: &Request) -> CommandResult<()> {
    let name = proto::command_name(request.command);
    if request.flags & !KNOWN_FLAGS != 0 {
        return Err(CommandError::invalid(format!(
            "{name} with unknown flags {:#x}",
            request.flags
        )));
    }
    let writes =
        matches!(request.command, proto::CMD_WRITE | proto::CMD_TRIM | proto::CMD_WRITE_ZEROES);
    if writes && export.read_only {
        return Err(CommandError {
            error: proto::EPERM,
            message: format!("{name} on the read-only export {:?}", export.name),
        });
    }
    let ranged = matches!(
        request.command,
        proto::CMD_READ
            | proto::CMD_WRITE
            | proto::CMD_TRIM
            | proto::CMD_WRITE_ZEROES
            | proto::CMD_BLOCK_STATUS
    );
    if ranged {
        let end = request.offset.checked_add(u64::from(request.length));
        if end.is_none_or(|end| end > export.size_bytes) {
            return Err(CommandError {
                error: if writes { proto::ENOSPC } else { proto::EINVAL },
                message: format!(
                    "{name} at {} of {} bytes passes the end of the export ({} bytes)",
                    request.offset, request.length, export.size_bytes
                ),
            });
        }
        if request.length == 0 {
            return Err(CommandError::invalid(format!("{name} of 0 bytes")));
        }
    }
    match request.command {
        proto::CMD_READ if request.length > proto::PAYLOAD_DEFAULT_MAX_BYTES => {
            Err(CommandError::invalid(format!("READ of {} bytes is too large", request.length)))
        }
        proto::CMD_BLOCK_STATUS if !agreed.base_allocation => Err(CommandError::invalid(
            "BLOCK_STATUS without the base:allocation context negotiated".into(),
        )),
        proto::CMD_READ
        | proto::CMD_WRITE
        | proto::CMD_FLUSH
        | proto::CMD_TRIM
        | proto::CMD_WRITE_ZEROES
        | proto::CMD_BLOCK_STATUS => Ok(()),
        other => Err(CommandError::invalid(format!("command {other} is not supported"))),
    }
}

fn run(
    export: &Export,
    volume: &Volume,
    gate: &Gate,
    replier: &Replier,
    base_allocation: bool,
    job: Job,
) {
    let Job { request, payload } = job;
    let fua = request.flags & proto::CMD_FLAG_FUA != 0;
    let (offset, length) = (request.offset, request.length);
    let writes =
        matches!(request.command, proto::CMD_WRITE | proto::CMD_TRIM | proto::CMD_WRITE_ZEROES);
    // Released before the reply below: a write answered is in a snapshot
    // asked for after.
    let gate_held = writes.then(|| gate.read());
    let done = match request.command {
        proto::CMD_READ => match export.read(offset, length) {
            Ok(data) => return replier.read_data(&request, &data),
            Err(failure) => Err(failure),
        },
        proto::CMD_WRITE => export.write(offset, payload.as_ref().expect("read with it"), fua),
        proto::CMD_FLUSH => export.flush(),
        proto::CMD_TRIM => export.trim(offset, length, fua),
        proto::CMD_WRITE_ZEROES => {
            let keep_allocated = request.flags & proto::CMD_FLAG_NO_HOLE != 0;
            export.write_zeroes(offset, length, keep_allocated, fua)
        }
        proto::CMD_BLOCK_STATUS => {
            debug_assert!(base_allocation);
            let only_one = request.flags & proto::CMD_FLAG_REQ_ONE != 0;
            match export.block_status(volume, offset, length, only_one) {
                Ok(descriptors) => return block_status_reply(replier, &request, &descriptors),
                Err(failure) => Err(failure),
            }
        }
        other => unreachable!("command {other} passed check()"),
    };
    drop(gate_held);
    match done {
        Ok(()) => replier.simple(request.cookie, 0),
        Err(failure) => replier.failed(&request, failure),
    }
}

fn block_status_reply(replier: &Replier, request: &Request, descriptors: &[BlockStatus]) {
    let payload = proto::encode_block_status(BASE_ALLOCATION_ID, descriptors);
    replier.chunk(request.cookie, proto::CHUNK_BLOCK_STATUS, &[&payload])
}
