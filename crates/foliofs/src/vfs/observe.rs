//! Change notification: who else caches a volume's file data (a FUSE
//! mount's kernel page cache) hears of every change to a file's bytes or
//! size, after the change is made and with no lock of the volume held, so
//! the listener may wait on readers of the same file.

use std::sync::{Arc, RwLock};

use super::volume::{Shared, Volume};

/// A change to a file's data or size: the bytes from `offset`, `length` of
/// them (`u64::MAX` for "to the end of file and beyond", as a truncate or a
/// size change makes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeEvent {
    pub ino: u64,
    pub offset: u64,
    pub length: u64,
}

impl ChangeEvent {
    /// From `offset` to wherever the file now ends, and past the old end.
    pub fn from_offset(ino: u64, offset: u64) -> Self {
        Self { ino, offset, length: u64::MAX }
    }
}

/// Called on the thread that made the change, once it is visible to readers
/// of the volume.
pub type ChangeObserver = Arc<dyn Fn(ChangeEvent) + Send + Sync>;

#[derive(Default)]
pub(crate) struct Observers {
    observer: RwLock<Option<ChangeObserver>>,
}

impl Observers {
    pub(crate) fn changed(&self, event: ChangeEvent) {
        let observer =
            self.observer.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        if let Some(observer) = observer {
            observer(event);
        }
    }
}

impl Shared {
    pub(crate) fn changed(&self, event: ChangeEvent) {
        self.observers.changed(event);
    }
}

impl Volume {
    /// Calls `observer` after every change to a file's data or size, made
    /// through any handle of this volume (buffered or direct writes,
    /// truncates, fallocate); `None` stops the calls. One observer at a
    /// time: setting one replaces the last.
    pub fn set_change_observer(&self, observer: Option<ChangeObserver>) {
        let mut slot =
            self.shared.observers.observer.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = observer;
    }
}
