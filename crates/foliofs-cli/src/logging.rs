//! Where log lines go, and the one FUSE message that is not news.
//!
//! A command in a terminal logs to stderr (coloured only on a terminal). A
//! mount daemon logs to `-o log=PATH` (appended, plain text) or, detached,
//! to syslog, which journald also collects. Every destination swallows its
//! write errors: a daemon whose log is gone (a closed pipe, a full disk, no
//! syslog socket) keeps serving, because a failed log write must never be
//! what takes a file system away from its users.
//!
//! Syslog is libc's `syslog(3)`, not a crate: it is one call, it reaches
//! journald through /dev/log as well as any syslog daemon, and it drops a
//! message quietly when neither listens, which is what a daemon wants.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Where a process's log lines go.
pub enum LogTarget {
    Stderr,
    /// Appended to this file (created if missing).
    File(File),
    /// syslog(3) under the name foliofs, facility daemon.
    Syslog,
}

impl LogTarget {
    /// Opens `path` for appending; the error names it.
    pub fn file(path: &Path) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|error| anyhow::anyhow!("log file {}: {error}", path.display()))?;
        Ok(Self::File(file))
    }
}

/// How many replies the kernel refused because their request had been
/// interrupted (see [`InterruptedReplies`]).
static REFUSED_INTERRUPTED_REPLIES: AtomicU64 = AtomicU64::new(0);

pub fn refused_interrupted_replies() -> u64 {
    REFUSED_INTERRUPTED_REPLIES.load(Ordering::Relaxed)
}

/// Installs the process's logger. `FOLIOFS_LOG` (EnvFilter syntax) overrides
/// the levels; by default a daemon logs at info (mount, unmount, close),
/// commands at warn.
pub fn init(target: LogTarget, daemon: bool) {
    let default_levels = if daemon { "info,fuser=error" } else { "warn,fuser=error" };
    let filter =
        EnvFilter::try_from_env("FOLIOFS_LOG").unwrap_or_else(|_| EnvFilter::new(default_levels));
    let ansi = matches!(target, LogTarget::Stderr) && io::stderr().is_terminal();
    let syslog = matches!(target, LogTarget::Syslog);
    if syslog {
        // SAFETY: the identifier is a static NUL-terminated string, which
        // openlog requires to outlive every later syslog call.
        unsafe { libc::openlog(c"foliofs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    }
    let sink = LogSink(target);
    let format = tracing_subscriber::fmt::layer()
        .with_writer(sink)
        .with_ansi(ansi)
        // The default reports a failed write on stderr, and a failed
        // report panics: exactly how a daemon with a dead stderr died.
        .log_internal_errors(false);
    let registry = tracing_subscriber::registry().with(filter).with(InterruptedReplies);
    // syslog stamps its own time.
    let installed = if syslog {
        registry.with(format.without_time()).try_init()
    } else {
        registry.with(format).try_init()
    };
    if let Err(error) = installed {
        eprintln!("foliofs: installing the logger: {error}");
    }
}

/// fuser replies to FUSE_INTERRUPT with ENOSYS from whichever thread reads
/// it, while the interrupted request is still being served on another
/// thread's cloned /dev/fuse; the kernel finds no such request on that fd and
/// refuses the reply with ENOENT, and fuser logs that at error level. The
/// interrupted request itself completes normally (the kernel waits for it:
/// only a fatal signal ends a request early, with EINTR, and then only
/// while it is still queued), so nothing failed. Those lines are counted, not
/// logged; every other failed reply still is.
struct InterruptedReplies;

impl<S: Subscriber> Layer<S> for InterruptedReplies {
    fn event_enabled(&self, event: &Event<'_>, _context: Context<'_, S>) -> bool {
        if !is_refused_interrupted_reply(event) {
            return true;
        }
        REFUSED_INTERRUPTED_REPLIES.fetch_add(1, Ordering::Relaxed);
        false
    }
}

fn is_refused_interrupted_reply(event: &Event<'_>) -> bool {
    if *event.metadata().level() != Level::ERROR {
        return false;
    }
    // fuser logs through the `log` crate: its records arrive with the target
    // "log" and the real one in the field `log.target`.
    let mut fields =
        Fields { target: event.metadata().target().to_string(), message: String::new() };
    event.record(&mut fields);
    let enoent = io::Error::from_raw_os_error(libc::ENOENT).to_string();
    fields.target == "fuser::reply"
        && fields.message.starts_with("Failed to send FUSE reply")
        && fields.message.ends_with(&enoent)
}

struct Fields {
    target: String,
    message: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "log.target" {
            self.target = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

struct LogSink(LogTarget);

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = LogLine<'a>;

    fn make_writer(&'a self) -> LogLine<'a> {
        LogLine { target: &self.0, priority: libc::LOG_INFO, line: Vec::new() }
    }

    fn make_writer_for(&'a self, metadata: &Metadata<'_>) -> LogLine<'a> {
        let priority = match *metadata.level() {
            Level::ERROR => libc::LOG_ERR,
            Level::WARN => libc::LOG_WARNING,
            Level::INFO => libc::LOG_INFO,
            Level::DEBUG | Level::TRACE => libc::LOG_DEBUG,
        };
        LogLine { target: &self.0, priority, line: Vec::new() }
    }
}

/// One event's text, written out whole when dropped (one write(2) on an
/// O_APPEND file, so lines from many threads never interleave), with every
/// error swallowed.
struct LogLine<'a> {
    target: &'a LogTarget,
    priority: libc::c_int,
    line: Vec<u8>,
}

impl Write for LogLine<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.line.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine<'_> {
    fn drop(&mut self) {
        if self.line.is_empty() {
            return;
        }
        match self.target {
            LogTarget::Stderr => {
                let _ = io::stderr().write_all(&self.line);
            }
            LogTarget::File(file) => {
                let _ = (&*file).write_all(&self.line);
            }
            LogTarget::Syslog => {
                let text = String::from_utf8_lossy(&self.line);
                let text = text.trim_end().replace('\0', " ");
                let Ok(text) = CString::new(text) else { return };
                // SAFETY: both strings are NUL-terminated and live across the
                // call; the format takes exactly the one string argument.
                unsafe { libc::syslog(self.priority, c"%s".as_ptr(), text.as_ptr()) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the events that reach the layers after [`InterruptedReplies`].
    struct Seen(&'static AtomicUsize);

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_event(&self, _event: &Event<'_>, _context: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn only_refused_replies_to_interrupted_requests_are_held_back() {
        static SEEN: AtomicUsize = AtomicUsize::new(0);
        let subscriber = tracing_subscriber::registry().with(InterruptedReplies).with(Seen(&SEEN));
        let before = refused_interrupted_replies();
        tracing::subscriber::with_default(subscriber, || {
            let enoent = io::Error::from_raw_os_error(libc::ENOENT);
            let einval = io::Error::from_raw_os_error(libc::EINVAL);
            tracing::error!(target: "fuser::reply", "Failed to send FUSE reply: {enoent}");
            tracing::error!(target: "fuser::reply", "Failed to send FUSE reply: {einval}");
            tracing::warn!(target: "fuser::reply", "Failed to send FUSE reply: {enoent}");
            tracing::error!(target: "foliofs", "Failed to send FUSE reply: {enoent}");
        });
        assert_eq!(refused_interrupted_replies() - before, 1);
        assert_eq!(SEEN.load(Ordering::Relaxed), 3);
    }
}
