//! The `threads` engine: blocking calls run in the calling thread (a pool
//! adds nothing to a call that waits anyway); `submit` hands requests to a
//! pool of worker threads, so many can be in flight at once. FUA is
//! pwritev2 with RWF_DSYNC, as QEMU's thread pool does since its FUA work.

use std::io::{self, IoSlice, IoSliceMut};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use super::file::FileDev;
use super::{run_blocking, DevCallback, DevOptions, DevRequest, RawDev};

type Job = (DevRequest, DevCallback);

pub(crate) struct ThreadsDev {
    file: Arc<FileDev>,
    jobs: Mutex<Option<Sender<Job>>>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadsDev {
    pub(crate) fn open(path: &Path, options: &DevOptions) -> io::Result<Self> {
        let file = Arc::new(FileDev::open(path, options)?);
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let workers = (0..options.worker_threads.max(1))
            .map(|index| {
                let file = Arc::clone(&file);
                let receiver = Arc::clone(&receiver);
                std::thread::Builder::new()
                    .name(format!("foliofs-io-{index}"))
                    .spawn(move || work(&file, &receiver))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { file, jobs: Mutex::new(Some(sender)), workers })
    }
}

/// A worker: takes one job at a time until the sender is dropped.
fn work(file: &FileDev, receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = receiver.lock().recv();
        let Ok((request, done)) = job else { return };
        done(run_blocking(file, request));
    }
}

impl RawDev for ThreadsDev {
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        self.file.read_at(offset, buffers)
    }

    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        self.file.write_at(offset, buffers, fua)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.flush()
    }

    fn submit(&self, request: DevRequest, done: DevCallback) {
        let jobs = self.jobs.lock();
        let Some(sender) = jobs.as_ref() else {
            return done(super::DevResponse {
                buffer: None,
                result: Err(io::Error::other("the device is closing")),
            });
        };
        if let Err(mpsc::SendError((request, done))) = sender.send((request, done)) {
            drop(jobs);
            done(run_blocking(&*self.file, request));
        }
    }

    fn size_bytes(&self) -> u64 {
        self.file.size_bytes()
    }

    fn logical_block_bytes(&self) -> u32 {
        self.file.logical_block_bytes()
    }
}

impl Drop for ThreadsDev {
    fn drop(&mut self) {
        // Closing the channel ends each worker after the jobs already queued.
        self.jobs.lock().take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}
