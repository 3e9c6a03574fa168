//! Requests that arrive as byte buffers instead of from /dev/fuse: virtio-fs
//! carries the same FUSE messages in a guest's virtqueues. The embedder
//! hands each request's bytes to [`QueueSession::serve`] with a
//! [`ReplySink`] saying where the reply goes; decoding, the INIT handshake
//! and dispatch to the [`Filesystem`] are the ones /dev/fuse uses.

use std::fmt;
use std::io;
use std::io::IoSlice;
use std::sync::Arc;
use std::sync::OnceLock;

use log::error;
use nix::unistd::geteuid;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::KernelConfig;
use crate::Request;
use crate::ll;
use crate::ll::Errno;
use crate::ll::Operation;
use crate::ll::ResponseErrno;
use crate::ll::Version;
use crate::ll::flags::init_flags::InitFlags;
use crate::ll::fuse_abi as abi;
use crate::reply::Reply;
use crate::reply::ReplyEmpty;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::request::ReplyTo;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

/// Where the reply to one request goes. `send` is called once per request
/// (never for FORGET and BATCH_FORGET), from whichever thread replies.
pub trait ReplySink: Send + Sync + fmt::Debug {
    /// Writes the reply, header first.
    fn send(&self, reply: &[IoSlice<'_>]) -> io::Result<()>;
}

/// What [`QueueSession::serve`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Dispatched; its reply is sent now or later, from any thread.
    Dispatched,
    /// FUSE_INIT answered: the session is serving.
    Initialized,
    /// FUSE_DESTROY answered: the client is done with the file system.
    Destroyed,
    /// Not a valid request: answered EINVAL where its header could be read.
    Refused,
}

/// A file system served from request buffers.
pub struct QueueSession<FS: Filesystem> {
    /// The file system until FUSE_INIT: `init` takes it mutably.
    before_init: Mutex<Option<FS>>,
    serving: OnceLock<SessionEventLoop<FS>>,
    acl: SessionACL,
}

impl<FS: Filesystem> fmt::Debug for QueueSession<FS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueSession")
            .field("initialized", &self.serving.get().is_some())
            .finish()
    }
}

/// The size of `fuse_in_header`, the least a request holds.
const IN_HEADER_BYTES: usize = size_of::<abi::fuse_in_header>();

impl<FS: Filesystem> QueueSession<FS> {
    /// A session waiting for FUSE_INIT. `acl` filters callers as the
    /// mount's `allow_other`/`allow_root` do.
    pub fn new(filesystem: FS, acl: SessionACL) -> Self {
        Self {
            before_init: Mutex::new(Some(filesystem)),
            serving: OnceLock::new(),
            acl,
        }
    }

    /// Decodes one request and serves it. A request that does not decode
    /// (short header, a length its bytes do not hold, an unknown shape) is
    /// answered EINVAL when its header names a request id, never a panic.
    pub fn serve(&self, request: &[u8], sink: Arc<dyn ReplySink>) -> Served {
        let reply_to = ReplyTo::Queue(Arc::clone(&sink));
        let Some(parsed) = RequestWithSender::new(reply_to, request) else {
            refuse(request, &sink);
            return Served::Refused;
        };
        let operation = match parsed.request.operation() {
            Ok(operation) => operation,
            Err(error) => {
                error!("undecodable request: {error}");
                parsed.reply::<ReplyRaw>().error(Errno::EINVAL);
                return Served::Refused;
            }
        };
        match operation {
            Operation::Init(init) => self.init(&parsed, &init),
            Operation::Destroy(_) => {
                parsed.reply::<ReplyEmpty>().ok();
                Served::Destroyed
            }
            _ => match self.serving.get() {
                Some(event_loop) => {
                    parsed.dispatch(event_loop);
                    Served::Dispatched
                }
                None => {
                    error!("a request before FUSE_INIT: {}", parsed.request);
                    parsed.reply::<ReplyRaw>().error(Errno::EIO);
                    Served::Dispatched
                }
            },
        }
    }

    /// FUSE_INIT as `Session::handshake` answers it on /dev/fuse.
    fn init(&self, parsed: &RequestWithSender<'_>, init: &ll::request::Init<'_>) -> Served {
        let version = init.version();
        if version.0 > abi::FUSE_KERNEL_VERSION {
            // A newer major version: ours goes back, and a second INIT follows.
            parsed
                .reply::<ReplyRaw>()
                .send_ll(&init.reply_version_only());
            return Served::Dispatched;
        }
        if version < Version(7, 6) {
            error!("unsupported FUSE ABI version {version}");
            parsed.reply::<ReplyRaw>().error(Errno::EPROTO);
            return Served::Refused;
        }
        let Some(mut filesystem) = self.before_init.lock().take() else {
            error!("a second FUSE_INIT on one session");
            parsed.reply::<ReplyRaw>().error(Errno::EIO);
            return Served::Refused;
        };
        let mut config = KernelConfig::new(init.capabilities(), init.max_readahead(), version);
        let header = Request::ref_cast(parsed.request.header());
        if let Err(error) = filesystem.init(header, &mut config) {
            let errno = Errno::from_i32(error.raw_os_error().unwrap_or(libc::EIO));
            parsed.reply::<ReplyRaw>().error(errno);
            *self.before_init.lock() = Some(filesystem);
            return Served::Refused;
        }
        // No rings on this transport.
        config.requested.remove(InitFlags::FUSE_OVER_IO_URING);
        let event_loop = SessionEventLoop {
            thread_name: "queue".to_string(),
            filesystem: Arc::new(FilesystemHolder {
                fs: Some(filesystem),
            }),
            ch: None,
            allowed: self.acl,
            session_owner: geteuid(),
        };
        if self.serving.set(event_loop).is_err() {
            error!("a second FUSE_INIT on one session");
        }
        parsed.reply::<ReplyRaw>().send_ll(&init.reply(&config));
        Served::Initialized
    }
}

/// Answers EINVAL to bytes that are not a request, quoting the request id
/// where the bytes hold one (0 otherwise: virtio-fs matches replies by
/// buffer, not by id).
fn refuse(request: &[u8], sink: &Arc<dyn ReplySink>) {
    if request.len() < IN_HEADER_BYTES {
        error!(
            "a request of {} bytes, shorter than the {IN_HEADER_BYTES}-byte FUSE header",
            request.len()
        );
    }
    // fuse_in_header: len (4), opcode (4), unique (8), ...
    let unique = request
        .get(8..16)
        .and_then(|bytes| bytes.try_into().ok())
        .map(u64::from_ne_bytes)
        .unwrap_or(0);
    <ReplyRaw as Reply>::new(ll::RequestId(unique), ReplySender::Queue(Arc::clone(sink)))
        .send_ll(&ResponseErrno(Errno::EINVAL));
}
