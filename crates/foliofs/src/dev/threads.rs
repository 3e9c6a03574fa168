//! The `threads` engine: blocking calls as the `sync` engine, `submit` on a
//! pool of worker threads.
//!
//! The job queue is a std mpsc channel whose receiver the workers share
//! behind a mutex: one idle worker waits in `recv` holding it, the others
//! wait for the lock. That costs nothing next to an O_DIRECT transfer and
//! needs no extra dependency.

use std::io::{self, IoSlice, IoSliceMut};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use parking_lot::Mutex;

use super::file::FileDev;
use super::{run_blocking, DevCallback, DevOptions, DevRequest, DevResponse, RawDev};

type Job = (DevRequest, DevCallback);

pub(crate) struct ThreadsDev {
    file: Arc<FileDev>,
    /// `None` once dropping: closing the channel is what stops the workers.
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadsDev {
    pub(crate) fn open(path: &Path, options: &DevOptions) -> io::Result<Self> {
        if options.worker_threads == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the threads engine needs at least one worker thread",
            ));
        }
        let file = Arc::new(FileDev::open(path, options)?);
        let (sender, receiver) = mpsc::channel();
        let receiver = Arc::new(Mutex::new(receiver));
        // Built before spawning, so a failed spawn drops it and joins the
        // workers already started.
        let mut device = Self { file, jobs: Some(sender), workers: Vec::new() };
        for worker_index in 0..options.worker_threads {
            let file = Arc::clone(&device.file);
            let receiver = Arc::clone(&receiver);
            let worker = thread::Builder::new()
                .name(format!("foliofs-io-{worker_index}"))
                .spawn(move || run_worker(&file, &receiver))?;
            device.workers.push(worker);
        }
        debug_assert_eq!(device.workers.len(), options.worker_threads);
        Ok(device)
    }
}

/// Runs jobs until the channel is closed and drained.
fn run_worker(file: &FileDev, jobs: &Mutex<Receiver<Job>>) {
    loop {
        // The guard drops at the end of this statement: the lock is not held
        // while the job runs.
        let job = jobs.lock().recv();
        let Ok((request, done)) = job else { return };
        call_completion(done, run_blocking(file, request));
    }
}

/// Runs a completion callback on an engine thread. A panicking callback is a
/// bug above this layer, but it must not kill the thread: every request
/// queued behind it would never complete.
pub(super) fn call_completion(done: DevCallback, response: DevResponse) {
    if panic::catch_unwind(AssertUnwindSafe(move || done(response))).is_err() {
        tracing::error!("a device completion callback panicked");
    }
}

impl RawDev for ThreadsDev {
    // A blocking call gains nothing from a hop to a worker: it runs here.
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
        // Sending fails only if every worker is gone (and `jobs` is only
        // taken by drop): run the job here rather than lose it.
        let unsent = match &self.jobs {
            Some(jobs) => jobs.send((request, done)).err().map(|mpsc::SendError(job)| job),
            None => Some((request, done)),
        };
        if let Some((request, done)) = unsent {
            done(run_blocking(&*self.file, request));
        }
    }

    fn discard(&self, offset: u64, length: u64, mode: super::DiscardMode) -> io::Result<()> {
        self.file.discard(offset, length, mode)
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
        // Workers finish the jobs already queued, then see the channel closed.
        drop(self.jobs.take());
        let current = thread::current().id();
        for worker in self.workers.drain(..) {
            // The last reference can go away inside a completion callback on
            // a worker; that worker cannot join itself, and exits on its own
            // once the callback returns.
            if worker.thread().id() == current {
                continue;
            }
            if worker.join().is_err() {
                tracing::error!("a device worker thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::file::test_support::{self as support, Image};
    use crate::dev::{EngineKind, FuaMode};

    const ENGINE: EngineKind = EngineKind::Threads;

    #[test]
    fn vectored_round_trip() {
        support::vectored_round_trip(ENGINE);
    }

    #[test]
    fn many_iovecs() {
        support::many_iovecs(ENGINE);
    }

    #[test]
    fn fua_counts() {
        support::fua_counts(ENGINE);
    }

    #[test]
    fn discard_punches_and_zeroes() {
        support::discard_punches_and_zeroes(ENGINE);
    }

    #[test]
    fn misaligned_and_out_of_range() {
        support::misaligned_and_out_of_range(ENGINE);
    }

    #[test]
    fn concurrent_async() {
        support::concurrent_async(&support::options(ENGINE, FuaMode::Native));
    }

    #[test]
    fn concurrent_async_one_worker() {
        let options = DevOptions { worker_threads: 1, ..support::options(ENGINE, FuaMode::Native) };
        support::concurrent_async(&options);
    }

    #[test]
    fn async_flush_and_fua() {
        support::async_flush_and_fua(ENGINE);
    }

    #[test]
    fn drop_finishes() {
        support::drop_finishes(ENGINE);
    }

    #[test]
    fn workers_are_named_and_survive_a_panicking_callback() {
        let image = Image::new();
        let options = DevOptions { worker_threads: 1, ..support::options(ENGINE, FuaMode::Native) };
        let device = support::open(&image.path, &options);
        device.submit(
            DevRequest::Flush,
            Box::new(|_| panic!("callback panic (expected in this test)")),
        );
        let (sender, receiver) = mpsc::channel();
        device.submit(DevRequest::Flush, move |response: DevResponse| {
            let name = thread::current().name().map(str::to_owned);
            let _ = sender.send((name, response.result));
        });
        let (name, result) = receiver.recv_timeout(support::CALLBACK_TIMEOUT).unwrap();
        assert_eq!(name.as_deref(), Some("foliofs-io-0"));
        result.unwrap();
    }

    #[test]
    fn zero_workers_is_rejected() {
        let image = Image::new();
        let options = DevOptions { worker_threads: 0, ..support::options(ENGINE, FuaMode::Native) };
        let error = ThreadsDev::open(&image.path, &options).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }
}
