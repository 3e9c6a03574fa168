//! What a job runs against besides the engine, as runner targets: a region
//! of the raw device (the image file or block device with no file system:
//! the engine's limit for direct I/O), a region of memory (plain copies: the
//! limit for cached I/O), and files on any mounted file system, reached
//! through the OS as fio reaches them (a foliofs FUSE mount, ext4, XFS).

use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use foliofs::completion::{self, IoFuture};
use foliofs::dev::{AlignedBuf, DevOptions, DevRequest, DevResponse, Device, EngineKind};
use foliofs::Error as FsError;
use parking_lot::Mutex;

use crate::jobfile::JobSpec;
use crate::runner::{lay_out_range, read_through, Submitted, Target};

/// Bytes `[base, base + size)` of the raw device.
pub struct RawRegion {
    device: Arc<Device>,
    base: u64,
    fua: bool,
}

/// One region per job instance (one shared region when the job names a
/// single file), laid out back to back from the start of the device.
pub fn raw_regions(device: &Arc<Device>, spec: &JobSpec) -> Vec<RawRegion> {
    (0..spec.numjobs)
        .map(|index| {
            let slot = if spec.filename.is_some() { 0 } else { u64::from(index) };
            RawRegion {
                device: Arc::clone(device),
                base: slot * spec.size_bytes,
                fua: spec.sync != crate::jobfile::SyncMode::None,
            }
        })
        .collect()
}

/// Files of a mounted file system, one per job instance as fio names them
/// (`filename=`, or `name.index.0`), each inside the job's `directory=` when
/// it has one (relative paths are the current directory's, as fio's are).
/// Each file is laid out as the engine's are (written once when the job
/// reads or overwrites, read through with `pre_read`) and opened as a
/// device with the job's O_DIRECT choice: a synchronous job's requests are
/// plain pread/pwrite calls, as fio's psync engine makes, and an
/// asynchronous job's go through the volume's I/O backend (io_uring by
/// default) at the job's depth. So the same jobs run on the mount that run
/// in process, on a machine without fio.
pub fn file_regions(spec: &JobSpec, options: &DevOptions) -> io::Result<Vec<RawRegion>> {
    let engine = if spec.ioengine.asynchronous() { options.engine } else { EngineKind::Sync };
    let options = DevOptions { direct: spec.direct, read_only: false, engine, ..options.clone() };
    let mut opened: Vec<(PathBuf, Arc<Device>)> = Vec::new();
    let mut regions = Vec::new();
    for index in 0..spec.numjobs {
        let path = PathBuf::from(spec.file_of(index));
        let device = match opened.iter().find(|(known, _)| *known == path) {
            Some((_, device)) => Arc::clone(device),
            None => {
                lay_out_file(spec, &path)?;
                let device = Device::open(&path, &options).map_err(|error| {
                    io::Error::new(error.kind(), format!("open {}: {error}", path.display()))
                })?;
                let device = Arc::new(device);
                opened.push((path, Arc::clone(&device)));
                device
            }
        };
        regions.push(RawRegion {
            device,
            base: 0,
            fua: spec.sync != crate::jobfile::SyncMode::None,
        });
    }
    Ok(regions)
}

/// Creates `path` (and its parents) at the job's size: written through with
/// a pattern when the job reads or overwrites (so reads find data, not
/// holes), else only sized; then read through when the job asks `pre_read`.
fn lay_out_file(spec: &JobSpec, path: &Path) -> io::Result<()> {
    let named =
        |error: io::Error| io::Error::new(error.kind(), format!("{}: {error}", path.display()));
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(named)?;
    }
    if !spec.allow_file_create && !path.exists() {
        return Err(named(io::Error::new(
            io::ErrorKind::NotFound,
            "does not exist, and allow_file_create=0 forbids creating it",
        )));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(named)?;
    let size_bytes = file.metadata().map_err(named)?.len();
    if (spec.pattern.reads() || spec.overwrite) && size_bytes < spec.size_bytes {
        lay_out_range(size_bytes, spec.size_bytes, |chunk, offset| {
            file.write_all_at(chunk, offset)
        })
        .map_err(named)?;
        file.sync_all().map_err(named)?;
    } else if size_bytes < spec.size_bytes {
        file.set_len(spec.size_bytes).map_err(named)?;
    }
    if spec.pre_read {
        read_through(spec.size_bytes, |buffer, offset| file.read_at(buffer, offset))
            .map_err(named)?;
    }
    Ok(())
}

fn io_error(what: &str, error: std::io::Error) -> FsError {
    FsError::io(format!("raw device {what}"), error)
}

impl RawRegion {
    fn submit(&self, request: DevRequest, length: usize) -> Submitted {
        let (future, completer) = completion::pair();
        // Plugged, and unplugged when the job would wait, as the engine's
        // direct path submits.
        self.device.submit_plugged(request, move |response: DevResponse| {
            let buffer = response.buffer.expect("reads and writes hand their buffer back");
            let result =
                response.result.map(|()| length).map_err(|error| io_error("request", error));
            completer.complete((result, buffer));
        });
        Box::pin(Unplugging { inner: future, device: Arc::clone(&self.device) })
    }
}

impl Target for RawRegion {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> foliofs::Result<usize> {
        self.device.read(self.base + offset, buffer).map_err(|error| io_error("read", error))?;
        Ok(buffer.len())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> foliofs::Result<usize> {
        self.device
            .write(self.base + offset, data, self.fua)
            .map_err(|error| io_error("write", error))?;
        Ok(data.len())
    }

    fn read_async(&self, buffer: AlignedBuf, offset: u64) -> Submitted {
        let length = buffer.len();
        self.submit(DevRequest::Read { offset: self.base + offset, buffer }, length)
    }

    fn write_async(&self, buffer: AlignedBuf, offset: u64) -> Submitted {
        let length = buffer.len();
        self.submit(DevRequest::Write { offset: self.base + offset, buffer, fua: self.fua }, length)
    }

    fn fsync(&self) -> foliofs::Result<()> {
        self.device.flush_if_needed().map(|_| ()).map_err(|error| io_error("flush", error))
    }

    fn fdatasync(&self) -> foliofs::Result<()> {
        self.fsync()
    }
}

/// A raw request's future: unplugs the device when it would wait.
struct Unplugging {
    inner: IoFuture<foliofs::DirectResult>,
    device: Arc<Device>,
}

impl Future for Unplugging {
    type Output = foliofs::DirectResult;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let polled = Pin::new(&mut self.inner).poll(context);
        if polled.is_pending() {
            self.device.unplug();
        }
        polled
    }
}

/// A file-sized region of memory, in page-aligned (huge-page backed where
/// whole) memory as the cache's folios are. The lock is uncontended (one
/// instance per region) and costs about what a folio lock does.
pub struct MemoryRegion {
    bytes: Mutex<AlignedBuf>,
}

/// One region per instance, every byte written before the run as a laid
/// out file's are: memory never written reads from the kernel's shared zero
/// page, which stays in the CPU's cache, so copies from it would run at
/// cache speed rather than memory speed.
pub fn memory_regions(spec: &JobSpec) -> Vec<MemoryRegion> {
    (0..spec.numjobs)
        .map(|_| {
            let mut bytes = AlignedBuf::zeroed(spec.size_bytes as usize);
            bytes.fill(LAID_OUT_BYTE);
            MemoryRegion { bytes: Mutex::new(bytes) }
        })
        .collect()
}

/// What a memory region holds before the run (any byte but zero).
const LAID_OUT_BYTE: u8 = 0xA5;

impl Target for MemoryRegion {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> foliofs::Result<usize> {
        let bytes = self.bytes.lock();
        let start = offset as usize;
        buffer.copy_from_slice(&bytes[start..start + buffer.len()]);
        Ok(buffer.len())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> foliofs::Result<usize> {
        let mut bytes = self.bytes.lock();
        let start = offset as usize;
        bytes[start..start + data.len()].copy_from_slice(data);
        Ok(data.len())
    }

    fn read_async(&self, mut buffer: AlignedBuf, offset: u64) -> Submitted {
        let result = self.read_at(&mut buffer, offset);
        Box::pin(completion::ready((result, buffer)))
    }

    fn write_async(&self, buffer: AlignedBuf, offset: u64) -> Submitted {
        let result = self.write_at(&buffer, offset);
        Box::pin(completion::ready((result, buffer)))
    }

    fn fsync(&self) -> foliofs::Result<()> {
        Ok(())
    }

    fn fdatasync(&self) -> foliofs::Result<()> {
        Ok(())
    }
}
