//! What the data paths share: the device, the metadata store, the folio
//! cache, the block size, the policies and a queue of background work. Held
//! in an `Arc` so asynchronous completions, the flusher and the background
//! workers can finish their work (conversions, size updates, readahead)
//! after the caller has moved on.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::cache::PageCache;
use crate::dev::Device;
use crate::error::{Error, Result};
use crate::format::Timestamp;
use crate::meta::MetaStore;
use crate::options::VolumeOptions;

/// Largest file size, as the kernel's MAX_LFS_FILESIZE on 64-bit: offsets
/// past it are EFBIG, and byte arithmetic on file offsets never overflows.
pub const FILE_BYTES_MAX: u64 = i64::MAX as u64;

pub struct Engine {
    pub device: Arc<Device>,
    pub meta: MetaStore,
    pub cache: PageCache,
    pub block_bytes: u64,
    pub options: VolumeOptions,
    /// Shared with the background workers, which hold the engine weakly.
    pub background: Arc<BackgroundQueue>,
}

impl Drop for Engine {
    /// Ends the background workers of an engine no volume closed (one whose
    /// open failed after they started).
    fn drop(&mut self) {
        self.background.stop();
    }
}

impl Engine {
    /// The size callers see.
    pub fn size_of(&self, ino: u64) -> Result<u64> {
        let inode =
            self.meta.inode(ino).ok_or_else(|| Error::BadHandle(format!("inode {ino} is gone")))?;
        Ok(inode.size)
    }

    /// Refuses every operation once the volume was shut down, those the
    /// cache and the metadata in memory could still answer included.
    pub fn check_running(&self) -> Result<()> {
        if self.device.is_shut_down() {
            return Err(Error::ShutDown);
        }
        Ok(())
    }

    /// A write changed data only: advance the file's times in memory.
    pub fn touch_times(&self, ino: u64) {
        let now = Timestamp::now();
        if let Some(mut inode) = self.meta.inode_mut(ino) {
            inode.attrs.mtime = now;
            inode.attrs.ctime = now;
            inode.times_dirty = true;
        }
    }

    pub fn align_down(&self, value: u64) -> u64 {
        debug_assert!(self.block_bytes.is_power_of_two(), "block size {}", self.block_bytes);
        value - value % self.block_bytes
    }

    pub fn align_up(&self, value: u64) -> u64 {
        debug_assert!(self.block_bytes.is_power_of_two(), "block size {}", self.block_bytes);
        value.div_ceil(self.block_bytes) * self.block_bytes
    }
}

/// Work done off the callers' threads (readahead beyond what a reader
/// waits for), by the workers [`spawn_background_workers`] starts.
pub type BackgroundJob = Box<dyn FnOnce(&Engine) + Send>;

/// Jobs queued beyond this are refused: background work is best effort.
const BACKGROUND_JOBS_QUEUED_MAX: usize = 1024;

/// The engine's queue of [`BackgroundJob`]s. Best effort: a job is refused
/// (handed back) when no worker serves the queue, when it is full or
/// stopped, and jobs still queued at the stop are dropped unrun, so a job
/// may only do work that its caller's later steps do themselves if it did
/// not happen.
#[derive(Default)]
pub struct BackgroundQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<BackgroundJob>,
    workers: usize,
    stopped: bool,
}

impl BackgroundQueue {
    /// Queues `job`, or hands it back if it will not run.
    pub fn submit(&self, job: BackgroundJob) -> std::result::Result<(), BackgroundJob> {
        let mut state = self.state.lock();
        if state.workers == 0 || state.stopped || state.jobs.len() >= BACKGROUND_JOBS_QUEUED_MAX {
            return Err(job);
        }
        state.jobs.push_back(job);
        debug_assert!(state.jobs.len() <= BACKGROUND_JOBS_QUEUED_MAX, "an unbounded queue");
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// Drops the jobs queued and ends the workers after their current job.
    pub fn stop(&self) {
        let mut state = self.state.lock();
        state.stopped = true;
        let dropped = std::mem::take(&mut state.jobs);
        drop(state);
        self.ready.notify_all();
        drop(dropped);
    }

    /// The next job, or None once stopped.
    fn next(&self) -> Option<BackgroundJob> {
        let mut state = self.state.lock();
        loop {
            if state.stopped {
                return None;
            }
            if let Some(job) = state.jobs.pop_front() {
                return Some(job);
            }
            self.ready.wait(&mut state);
        }
    }
}

/// Starts `count` threads running `engine`'s background jobs until its
/// queue is stopped ([`BackgroundQueue::stop`]).
pub fn spawn_background_workers(
    engine: &Arc<Engine>,
    count: usize,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut workers = Vec::with_capacity(count);
    for index in 0..count {
        let queue = Arc::clone(&engine.background);
        let weak: Weak<Engine> = Arc::downgrade(engine);
        let worker =
            std::thread::Builder::new().name(format!("foliofs-bg{index}")).spawn(move || {
                while let Some(job) = queue.next() {
                    let Some(engine) = weak.upgrade() else { return };
                    job(&engine);
                }
            })?;
        workers.push(worker);
        engine.background.state.lock().workers += 1;
    }
    Ok(workers)
}
