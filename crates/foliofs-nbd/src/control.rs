//! The control socket (`foliofs serve nbd --control PATH`): a unix socket
//! of mode 0600 beside the NBD listener, through which a backup tool asks
//! for snapshots of exports while they are served.
//!
//! One JSON object a line each way. Requests:
//!
//! - `{"snapshot": {"export": "disk", "to": "/snaps/disk-1"}}`: clones the
//!   export's file (named by its export name or its path inside the
//!   volume) to a new file `to`; an array of such objects snapshots them
//!   all at one instant.
//! - `{"exports": {}}`: the exports, with their paths and sizes.
//!
//! Each is answered `{"ok": {...}}` or `{"error": "why"}`.
//!
//! A snapshot holds every write (WRITE, FUA or not, TRIM, WRITE_ZEROES)
//! whose reply was sent before the request was read, and no part of one
//! that had not started when the snapshot began: writes pass the server's
//! write gate (`Gate`) shared for their whole library call, and a snapshot
//! takes it exclusively, so writes already running finish first and new
//! ones wait for the clones (milliseconds; reads go on). `Volume::clone_file`
//! then writes back the source's cached data and shares its blocks. The
//! new files are made durable (fsync, which commits their names too)
//! before the answer; a failed snapshot removes what it made.

use std::collections::HashSet;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use foliofs::dev::nbd::Stream;
use foliofs::{OpenFlags, Volume};
use parking_lot::RwLock;
use serde_json::{json, Value};

use crate::export::Export;
use crate::Connections;

/// The longest request line read; a longer one ends the connection.
const LINE_BYTES_MAX: u64 = 1 << 20;

/// Writes hold it shared for their library call; a snapshot exclusively.
pub(crate) type Gate = RwLock<()>;

/// The listening control socket; removed when dropped.
pub struct ControlListener {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlListener {
    /// Listens on `path` with mode 0600 from the start (bound under a
    /// temporary name, restricted, then renamed into place, so no other
    /// user ever finds it open); a stale socket is replaced as
    /// [`crate::Listener::unix`] does.
    pub fn bind(path: PathBuf) -> io::Result<Self> {
        crate::clear_stale_socket(&path)?;
        let mut temporary = path.clone().into_os_string();
        temporary.push(format!(".{}.binding", std::process::id()));
        let temporary = PathBuf::from(temporary);
        let _ = std::fs::remove_file(&temporary);
        let bound = UnixListener::bind(&temporary)
            .and_then(|listener| {
                std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))?;
                std::fs::rename(&temporary, &path)?;
                Ok(listener)
            })
            .map_err(|error| {
                let _ = std::fs::remove_file(&temporary);
                io::Error::new(error.kind(), format!("{}: {error}", path.display()))
            })?;
        Ok(Self { listener: bound, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a control connection acts on.
pub(crate) struct Control {
    pub volume: Arc<Volume>,
    pub exports: Vec<Arc<Export>>,
    pub gate: Arc<Gate>,
    pub read_only: bool,
}

/// Accepts control connections until stopped, a thread each; returns once
/// every one has ended.
pub(crate) fn serve(
    listener: ControlListener,
    control: Arc<Control>,
    connections: &Arc<Connections>,
) {
    let mut threads: Vec<std::thread::JoinHandle<()>> = Vec::new();
    loop {
        let stream = match listener.listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                tracing::warn!("control accept failed: {error}");
                if connections.stopping.load(Ordering::Acquire) {
                    break;
                }
                continue;
            }
        };
        if connections.stopping.load(Ordering::Acquire) {
            break;
        }
        threads.retain(|thread| !thread.is_finished());
        let stream = Stream::Unix(stream);
        let id = match connections.register(&stream) {
            Ok(Some(id)) => id,
            Ok(None) => continue,
            Err(error) => {
                tracing::warn!("control connection refused: {error}");
                continue;
            }
        };
        let Stream::Unix(stream) = stream else { unreachable!("made as a unix stream") };
        let (control, registry) = (Arc::clone(&control), Arc::clone(connections));
        let spawned = std::thread::Builder::new().name("nbd-control".into()).spawn(move || {
            if let Err(error) = serve_connection(stream, &control) {
                tracing::warn!("control connection ended: {error}");
            }
            registry.open.lock().remove(&id);
        });
        match spawned {
            Ok(thread) => threads.push(thread),
            Err(error) => {
                connections.open.lock().remove(&id);
                tracing::error!("control connection thread not started: {error}");
            }
        }
    }
    drop(listener);
    connections.stop();
    for thread in threads {
        let _ = thread.join();
    }
}

fn serve_connection(stream: UnixStream, control: &Control) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        (&mut reader).take(LINE_BYTES_MAX + 1).read_until(b'\n', &mut line)?;
        if line.is_empty() {
            return Ok(());
        }
        if line.last() != Some(&b'\n') && line.len() as u64 > LINE_BYTES_MAX {
            let reply = json!({ "error": format!("a request longer than {LINE_BYTES_MAX} bytes") });
            writeln!(writer, "{reply}")?;
            return Ok(());
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let reply = match serde_json::from_slice::<Value>(&line) {
            Ok(request) => match control.handle(&request) {
                Ok(answer) => json!({ "ok": answer }),
                Err(why) => json!({ "error": why }),
            },
            Err(error) => json!({ "error": format!("the request is not JSON: {error}") }),
        };
        writeln!(writer, "{reply}")?;
    }
}

/// One snapshot asked for: the export and the new file's path.
struct Wanted<'a> {
    export: &'a Export,
    to: String,
}

impl Control {
    fn handle(&self, request: &Value) -> Result<Value, String> {
        let fields = request.as_object().filter(|fields| fields.len() == 1).ok_or_else(|| {
            "a request is one JSON object with one key: \"snapshot\" or \"exports\"".to_string()
        })?;
        let (name, arguments) = fields.iter().next().expect("one key");
        match name.as_str() {
            "snapshot" => self.snapshot(arguments),
            "exports" => Ok(self.list()),
            other => Err(format!("unknown request {other:?}: ask \"snapshot\" or \"exports\"")),
        }
    }

    fn list(&self) -> Value {
        let exports: Vec<Value> = self
            .exports
            .iter()
            .map(|export| {
                json!({
                    "name": export.name,
                    "path": export.path,
                    "bytes": export.size_bytes,
                    "read_only": export.read_only,
                })
            })
            .collect();
        json!({ "exports": exports })
    }

    fn find(&self, name: &str) -> Result<&Export, String> {
        let by_path = name.starts_with('/');
        self.exports
            .iter()
            .find(|export| if by_path { export.path == name } else { export.name == name })
            .map(|export| &**export)
            .ok_or_else(|| {
                let names: Vec<&str> = self.exports.iter().map(|export| &*export.name).collect();
                format!(
                    "no export {} {name:?} (this server exports {})",
                    if by_path { "at" } else { "named" },
                    names.join(", ")
                )
            })
    }

    /// Parses and checks what is wanted before anything changes.
    fn wanted(&self, arguments: &Value) -> Result<Vec<Wanted<'_>>, String> {
        let items: Vec<&Value> = match arguments {
            Value::Array(items) if !items.is_empty() => items.iter().collect(),
            Value::Array(_) => return Err("a snapshot of no exports".into()),
            single => vec![single],
        };
        let mut wanted: Vec<Wanted<'_>> = Vec::new();
        let mut destinations = HashSet::new();
        for item in items {
            let text = |key: &str| {
                item.get(key).and_then(Value::as_str).ok_or_else(|| {
                    format!(
                        "a snapshot is {{\"export\": NAME_OR_PATH, \"to\": \"/path\"}}; {item} \
                         lacks {key:?}"
                    )
                })
            };
            let (export, to) = (self.find(text("export")?)?, text("to")?);
            if let Some(extra) = item.as_object().and_then(|fields| {
                fields.keys().find(|key| !matches!(key.as_str(), "export" | "to"))
            }) {
                return Err(format!("a snapshot takes \"export\" and \"to\", not {extra:?}"));
            }
            if !to.starts_with('/') {
                return Err(format!("{to:?}: the destination is a path inside the volume, from /"));
            }
            if !destinations.insert(to.trim_end_matches('/').to_string()) {
                return Err(format!("{to}: named twice as a destination"));
            }
            match self.volume.symlink_metadata(to) {
                Ok(_) => return Err(format!("{to} exists: a snapshot makes a new file")),
                Err(foliofs::Error::NotFound(_)) => {}
                Err(error) => return Err(format!("{to}: {error}")),
            }
            wanted.push(Wanted { export, to: to.to_string() });
        }
        Ok(wanted)
    }

    fn snapshot(&self, arguments: &Value) -> Result<Value, String> {
        let started = Instant::now();
        let wanted = self.wanted(arguments)?;
        if self.read_only {
            return Err("the volume is served read-only (--read-only): a snapshot writes a new \
                        file into it"
                .into());
        }
        let paused_ms = {
            let _writes_wait = self.gate.write();
            let paused = Instant::now();
            for (index, item) in wanted.iter().enumerate() {
                if let Err(error) = self.volume.clone_file(&item.export.path, &item.to) {
                    // clone_file removed its own half-made file; remove the
                    // ones made before it.
                    for made in &wanted[..index] {
                        let _ = self.volume.remove_file(&made.to);
                    }
                    return Err(format!(
                        "snapshot of {} ({}) to {}: {error}",
                        item.export.name, item.export.path, item.to
                    ));
                }
            }
            paused.elapsed().as_secs_f64() * 1e3
        };
        for item in &wanted {
            self.make_durable(&item.to).map_err(|error| {
                format!(
                    "{} was made but is not durable (the volume has failed, so it stays): {error}",
                    item.to
                )
            })?;
        }
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let made = |item: &Wanted<'_>| {
            json!({
                "export": item.export.name,
                "path": item.export.path,
                "to": item.to,
                "bytes": item.export.size_bytes,
            })
        };
        let mut answer = match arguments {
            Value::Array(_) => json!({ "snapshots": wanted.iter().map(made).collect::<Vec<_>>() }),
            _ => made(&wanted[0]),
        };
        answer["ms"] = json!(ms);
        answer["writes_paused_ms"] = json!(paused_ms);
        answer["durable"] = json!(true);
        Ok(answer)
    }

    /// fsync of the new file: its clone records and, before them in the
    /// journal, its creation and name.
    fn make_durable(&self, path: &str) -> foliofs::Result<()> {
        let file = self.volume.inodes().open_path(path, OpenFlags::READ)?;
        let synced = file.sync_all();
        synced.and(file.close())
    }
}
