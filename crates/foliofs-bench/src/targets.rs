//! The limits a job is measured against, as runner targets: a region of the
//! raw device (the image file or block device with no file system: the
//! engine's limit for direct I/O) and a region of memory (plain copies: the
//! limit for cached I/O).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use foliofs::completion::{self, IoFuture};
use foliofs::dev::{AlignedBuf, DevRequest, DevResponse, Device};
use foliofs::Error as FsError;
use parking_lot::Mutex;

use crate::jobfile::JobSpec;
use crate::runner::{Submitted, Target};

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
