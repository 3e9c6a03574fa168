//! The table of open handles: the `fh` the kernel quotes back in every
//! request names an open [`File`] or a directory listing.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use foliofs::{Dir, DirEntry, File};
use parking_lot::{Condvar, Mutex, RwLock};

/// An open directory and the listing readdir pages through: a snapshot taken
/// when a walk starts (offset 0: the first read, and every one after
/// rewinddir), so entries added or removed mid-walk neither repeat nor
/// vanish, and a rewound walk sees what was created since opendir.
pub(crate) struct DirListing {
    pub(crate) dir: Dir,
    snapshot: Mutex<Arc<Vec<DirEntry>>>,
}

impl DirListing {
    pub(crate) fn new(dir: Dir) -> Self {
        Self { dir, snapshot: Mutex::new(Arc::new(Vec::new())) }
    }

    /// The entries to list from `offset`: a fresh snapshot at offset 0.
    pub(crate) fn entries(&self, offset: u64) -> foliofs::Result<Arc<Vec<DirEntry>>> {
        let mut snapshot = self.snapshot.lock();
        if offset == 0 {
            *snapshot = Arc::new(self.dir.entries()?);
        }
        Ok(Arc::clone(&snapshot))
    }
}

/// Directory walks without a handle (FUSE no-opendir: every READDIR quotes
/// handle 0). A walk's snapshot is taken at offset 0, as [`DirListing`]'s,
/// and named in the offsets handed out: the snapshot's number in the high 32
/// bits, the position in it in the low 32, so a walk finds its snapshot
/// again and entries added or removed mid-walk neither repeat nor vanish.
/// The kernel never says when a walk ends, so the oldest snapshots are
/// dropped beyond a bound; a walk whose snapshot is gone goes on from its
/// position in a fresh listing (as an index-offset file system would).
pub(crate) struct DirSnapshots {
    inner: Mutex<SnapshotTable>,
}

#[derive(Default)]
struct SnapshotTable {
    next_id: u32,
    by_id: HashMap<u32, (u64, Arc<Vec<DirEntry>>)>,
    oldest_first: VecDeque<u32>,
    entries_held: usize,
}

/// Walks remembered at once, and the entries their snapshots may hold.
const SNAPSHOTS_MAX: usize = 256;
const SNAPSHOT_ENTRIES_MAX: usize = 1 << 18;

/// The offset of the entry after position `position` of snapshot `id`.
pub(crate) fn walk_offset(id: u32, position: u64) -> u64 {
    (u64::from(id) << 32) | position
}

impl DirSnapshots {
    pub(crate) fn new() -> Self {
        Self { inner: Mutex::new(SnapshotTable::default()) }
    }

    /// The snapshot of directory `dir` a READDIR at `offset` continues, with
    /// its number and the position to list from: a fresh one at offset 0.
    pub(crate) fn entries(
        &self,
        dir: &Dir,
        offset: u64,
    ) -> foliofs::Result<(u32, Arc<Vec<DirEntry>>, u64)> {
        let (id, position) = ((offset >> 32) as u32, offset & u64::from(u32::MAX));
        if offset != 0 {
            let table = self.inner.lock();
            if let Some((ino, entries)) = table.by_id.get(&id) {
                if *ino == dir.ino() {
                    return Ok((id, Arc::clone(entries), position));
                }
            }
        }
        let entries = Arc::new(dir.entries()?);
        let mut table = self.inner.lock();
        let table = &mut *table;
        // Never 0, so offset 0 always means a fresh walk.
        table.next_id = table.next_id.checked_add(1).unwrap_or(1);
        let id = table.next_id;
        table.entries_held += entries.len();
        table.by_id.insert(id, (dir.ino(), Arc::clone(&entries)));
        table.oldest_first.push_back(id);
        while table.oldest_first.len() > SNAPSHOTS_MAX
            || (table.entries_held > SNAPSHOT_ENTRIES_MAX && table.oldest_first.len() > 1)
        {
            let Some(oldest) = table.oldest_first.pop_front() else { break };
            if let Some((_, dropped)) = table.by_id.remove(&oldest) {
                table.entries_held -= dropped.len();
            }
        }
        Ok((id, entries, position))
    }
}

pub(crate) enum Handle {
    File(Arc<File>),
    Dir(Arc<DirListing>),
}

/// Shards keep parallel direct I/O on different handles from meeting on one
/// lock; each request only takes a shard's read lock for a clone of an Arc.
const SHARD_COUNT: usize = 16;

pub(crate) struct Handles {
    shards: [RwLock<HashMap<u64, Handle>>; SHARD_COUNT],
    next_fh: AtomicU64,
    /// File handles released and closed so far, and their waiters
    /// ([`Handles::wait_for_release`]).
    released: Mutex<u64>,
    release_done: Condvar,
}

impl Handles {
    pub(crate) fn new() -> Self {
        Self {
            shards: std::array::from_fn(|_| RwLock::new(HashMap::new())),
            next_fh: AtomicU64::new(1),
            released: Mutex::new(0),
            release_done: Condvar::new(),
        }
    }

    /// How many file handles have been released and closed.
    pub(crate) fn released(&self) -> u64 {
        *self.released.lock()
    }

    /// After a file handle was removed and its file closed.
    pub(crate) fn note_released(&self) {
        *self.released.lock() += 1;
        self.release_done.notify_all();
    }

    /// Waits until more than `seen` file handles were released, or until
    /// `deadline`; whether one was.
    pub(crate) fn wait_for_release(&self, seen: u64, deadline: Instant) -> bool {
        let mut released = self.released.lock();
        while *released == seen {
            if self.release_done.wait_until(&mut released, deadline).timed_out() {
                break;
            }
        }
        *released != seen
    }

    /// The inodes of the open file handles but `except`.
    pub(crate) fn open_file_inos(&self, except: u64) -> Vec<u64> {
        let mut inos = Vec::new();
        for shard in &self.shards {
            for (&fh, handle) in shard.read().iter() {
                if let (Handle::File(file), true) = (handle, fh != except) {
                    inos.push(file.ino());
                }
            }
        }
        inos
    }

    fn shard(&self, fh: u64) -> &RwLock<HashMap<u64, Handle>> {
        &self.shards[fh as usize % SHARD_COUNT]
    }

    pub(crate) fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.shard(fh).write().insert(fh, handle);
        fh
    }

    pub(crate) fn file(&self, fh: u64) -> Option<Arc<File>> {
        match self.shard(fh).read().get(&fh) {
            Some(Handle::File(file)) => Some(Arc::clone(file)),
            _ => None,
        }
    }

    pub(crate) fn dir(&self, fh: u64) -> Option<Arc<DirListing>> {
        match self.shard(fh).read().get(&fh) {
            Some(Handle::Dir(listing)) => Some(Arc::clone(listing)),
            _ => None,
        }
    }

    pub(crate) fn remove(&self, fh: u64) -> Option<Handle> {
        self.shard(fh).write().remove(&fh)
    }

    /// Every handle still open (the kernel releases all before a clean
    /// unmount; after a forced one some may remain).
    pub(crate) fn drain(&self) -> Vec<Handle> {
        self.shards
            .iter()
            .flat_map(|shard| shard.write().drain().map(|(_, handle)| handle).collect::<Vec<_>>())
            .collect()
    }
}
