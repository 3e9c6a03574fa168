//! The table of open handles: the `fh` the kernel quotes back in every
//! request names an open [`File`] or a directory listing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use foliofs::{Dir, DirEntry, File};
use parking_lot::{Mutex, RwLock};

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
}

impl Handles {
    pub(crate) fn new() -> Self {
        Self {
            shards: std::array::from_fn(|_| RwLock::new(HashMap::new())),
            next_fh: AtomicU64::new(1),
        }
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
