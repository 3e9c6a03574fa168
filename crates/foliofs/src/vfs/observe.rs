//! Change notification: who else caches a volume's file data (a FUSE
//! mount's kernel page cache) hears of every change to a file's bytes or
//! size, after the change is made and with no lock of the volume held, so
//! the listener may wait on readers of the same file.

use std::sync::{Arc, RwLock};

/// A change to a file's data or size: the bytes from `offset`, `length` of
/// them (`u64::MAX` for "to the end of file and beyond", as a truncate or a
/// size change makes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeEvent {
    /// The inode that changed.
    pub ino: u64,
    /// First byte that changed.
    pub offset: u64,
    /// Bytes that changed from `offset` (u64::MAX: to the end).
    pub length: u64,
    /// Reported by whichever thread completed asynchronous I/O (often one
    /// of the engine's completion threads, which other requests wait on):
    /// the observer must not block on this call.
    pub deferred: bool,
}

impl ChangeEvent {
    /// `length` bytes at `offset`, reported by the caller's own thread.
    pub fn range(ino: u64, offset: u64, length: u64) -> Self {
        Self { ino, offset, length, deferred: false }
    }

    /// From `offset` to wherever the file now ends, and past the old end.
    pub fn from_offset(ino: u64, offset: u64) -> Self {
        Self::range(ino, offset, u64::MAX)
    }
}

/// Called once the change is visible to readers of the volume: on the
/// thread that made it, or for asynchronous I/O on the thread that completed
/// it (`deferred`).
pub type ChangeObserver = Arc<dyn Fn(ChangeEvent) + Send + Sync>;

/// A change to the namespace or to an inode's attributes, for caches of
/// names and attributes (a FUSE mount's dentries and inode attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceEvent {
    /// `name` in directory `parent` appeared, went, or names another inode
    /// now; the directory's own attributes (times, link count) changed too.
    Entry {
        /// The directory's inode number.
        parent: u64,
        /// The name in it, as bytes.
        name: Vec<u8>,
    },
    /// An inode's attributes changed (mode, owner, times, link count).
    Attributes {
        /// The inode whose attributes changed.
        ino: u64,
    },
}

/// Called after a namespace or attribute change, on the thread that made
/// it, with no lock of the volume held.
pub type NamespaceObserver = Arc<dyn Fn(&NamespaceEvent) + Send + Sync>;

/// The observers a volume calls ([`Volume::set_change_observer`] and
/// [`Volume::set_namespace_observer`] set them).
///
/// [`Volume::set_change_observer`]: super::Volume::set_change_observer
/// [`Volume::set_namespace_observer`]: super::Volume::set_namespace_observer
#[derive(Default)]
pub(crate) struct Observers {
    observer: RwLock<Option<ChangeObserver>>,
    namespace: RwLock<Option<NamespaceObserver>>,
}

impl Observers {
    /// Replaces the observer of data and size changes (`None`: no calls).
    pub(crate) fn set_change(&self, observer: Option<ChangeObserver>) {
        let mut slot = self.observer.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = observer;
    }

    /// Replaces the observer of namespace and attribute changes.
    pub(crate) fn set_namespace(&self, observer: Option<NamespaceObserver>) {
        let mut slot = self.namespace.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = observer;
    }

    pub(crate) fn changed(&self, event: ChangeEvent) {
        let observer =
            self.observer.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        if let Some(observer) = observer {
            observer(event);
        }
    }

    /// Reports `events`; a no-op (not even a clone) without an observer.
    pub(crate) fn namespace_changed(&self, events: &[NamespaceEvent]) {
        let observer =
            self.namespace.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        if let Some(observer) = observer {
            for event in events {
                observer(event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::dev::AlignedBuf;
    use crate::options::VolumeOptions;
    use crate::space::FallocateMode;
    use crate::vfs::{MkfsOptions, OpenFlags, Owner, SetAttr, Volume};

    #[test]
    fn every_data_and_size_change_is_reported_after_it_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("vol.img");
        let options = VolumeOptions::default();
        Volume::mkfs_path(&image, Some(64 << 20), &MkfsOptions::default(), &options).unwrap();
        let volume = Arc::new(Volume::open(&image, &options).unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let reader = Arc::downgrade(&volume);
        volume.set_change_observer(Some(Arc::new(move |event: ChangeEvent| {
            // Made before it is reported: the size already shows it.
            let size = reader.upgrade().unwrap().inodes().getattr(event.ino).unwrap().size;
            record.lock().unwrap().push((event, size));
        })));
        let ino = volume.inodes().create(1, b"f", 0o644, Owner { uid: 0, gid: 0 }).unwrap().ino;
        let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE).unwrap();
        file.write_at(b"hello", 10).unwrap();
        file.set_len(8192).unwrap();
        file.fallocate(FallocateMode::PunchHole, 4096, 4096).unwrap();
        let direct = volume.inodes().open_file(ino, OpenFlags::READ_WRITE.with_direct()).unwrap();
        direct.write_at(&AlignedBuf::zeroed(4096), 8192).unwrap();
        let (written, _) =
            crate::completion::block_on(direct.write_at_async(AlignedBuf::zeroed(4096), 16384));
        written.unwrap();
        volume.inodes().setattr(ino, &SetAttr { size: Some(100), ..SetAttr::default() }).unwrap();
        let event = |offset, length| ChangeEvent::range(ino, offset, length);
        let expected = [
            (event(10, 5), 15),
            (ChangeEvent::from_offset(ino, 8192), 8192),
            (event(4096, 4096), 8192),
            (event(8192, 4096), 12288),
            (ChangeEvent { deferred: true, ..event(16384, 4096) }, 20480),
            (ChangeEvent::from_offset(ino, 100), 100),
        ];
        assert_eq!(*seen.lock().unwrap(), expected);
        volume.set_change_observer(None);
        file.write_at(b"unseen", 0).unwrap();
        assert_eq!(seen.lock().unwrap().len(), expected.len());
        direct.close().unwrap();
        file.close().unwrap();
    }
}
