//! A handle's copy of the metadata every cached read asks for (the file's
//! size, and whether its access time is due), kept without a lock.
//!
//! Each read took the metadata read lock twice, for the size and for the
//! access time. The lock's reader count is one cache line that every reader
//! writes, so with many threads reading cached data the line moved between
//! cores on every read: 4 KiB cached reads of private files peaked at 4
//! threads and fell from there on 16 cores (docs/BENCHMARKS.md, "Scaling on
//! 16 cores"; the runs: docs/bench/history/2026-11-27-16-cores.md). The
//! kernel answers the same questions from the inode with no
//! shared write (i_size_read, relatime_need_update).
//!
//! The copy is taken under the inode's shard read lock with the inode's
//! own view generation, which every change of that inode bumps under the
//! shard's write lock (`Inode::note_changed`): changes to other files leave
//! it alone. While the generation still reads the same, the inode has not
//! changed, so the copy is as good as a fresh look; a reader that finds
//! another generation takes the lock and refreshes the copy. The fields are
//! a sequence lock: a reader retries (takes the lock) rather than use a copy
//! caught half written.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// What a read needs of its inode's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Viewed {
    pub size_bytes: u64,
    /// Until which second of the coarse realtime clock a read leaves the
    /// access time alone (`u64::MAX`: always, as under noatime; 0: every
    /// read must look, as under strictatime or when an update is due).
    pub atime_quiet_until_secs: u64,
}

/// One handle's copy; see the module documentation.
#[derive(Debug, Default)]
pub struct InodeView {
    /// The inode's view generation, once a refresh found it.
    source: OnceLock<Arc<AtomicU64>>,
    /// Even when the fields below are whole; odd while one refresh writes
    /// them.
    sequence: AtomicU64,
    /// The store generation the copy was taken at; 0 = no copy yet.
    generation: AtomicU64,
    size_bytes: AtomicU64,
    atime_quiet_until_secs: AtomicU64,
}

impl InodeView {
    /// The copy, if the inode has not changed since it was taken.
    pub fn current(&self) -> Option<Viewed> {
        let source = self.source.get()?;
        self.get(source.load(Ordering::Acquire))
    }

    /// Ties this copy to the inode's view generation (the first refresh).
    pub fn attach(&self, source: &Arc<AtomicU64>) {
        let _ = self.source.set(Arc::clone(source));
    }

    /// The copy, if it was taken at `generation` (the store's, read now).
    pub fn get(&self, generation: u64) -> Option<Viewed> {
        let before = self.sequence.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let taken_at = self.generation.load(Ordering::Relaxed);
        let viewed = Viewed {
            size_bytes: self.size_bytes.load(Ordering::Relaxed),
            atime_quiet_until_secs: self.atime_quiet_until_secs.load(Ordering::Relaxed),
        };
        // The loads above happen before the second look at the sequence.
        fence(Ordering::Acquire);
        let after = self.sequence.load(Ordering::Relaxed);
        (before == after && taken_at == generation && generation != 0).then_some(viewed)
    }

    /// Replaces the copy with `viewed`, taken at `generation` under the
    /// store's read lock. Two readers refreshing at once: one writes, the
    /// other leaves it (its copy is no newer).
    pub fn set(&self, generation: u64, viewed: Viewed) {
        let before = self.sequence.load(Ordering::Relaxed);
        if before & 1 == 1
            || self
                .sequence
                .compare_exchange(before, before + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // The odd sequence is visible before any field changes.
        fence(Ordering::Release);
        self.generation.store(generation, Ordering::Relaxed);
        self.size_bytes.store(viewed.size_bytes, Ordering::Relaxed);
        self.atime_quiet_until_secs.store(viewed.atime_quiet_until_secs, Ordering::Relaxed);
        self.sequence.store(before + 2, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VIEWED: Viewed = Viewed { size_bytes: 4096, atime_quiet_until_secs: 99 };

    #[test]
    fn a_copy_serves_only_its_own_generation() {
        let view = InodeView::default();
        assert_eq!(view.get(1), None, "no copy yet");
        view.set(7, VIEWED);
        assert_eq!(view.get(7), Some(VIEWED));
        assert_eq!(view.get(8), None, "the metadata changed since");
        view.set(8, Viewed { size_bytes: 0, ..VIEWED });
        assert_eq!(view.get(8).map(|viewed| viewed.size_bytes), Some(0));
        assert_eq!(view.get(0), None);
    }

    #[test]
    fn a_copy_being_written_is_not_used() {
        let view = InodeView::default();
        view.set(3, VIEWED);
        // As a refresh in progress leaves it.
        view.sequence.fetch_add(1, Ordering::Relaxed);
        assert_eq!(view.get(3), None);
        view.set(4, VIEWED);
        assert_eq!(view.get(4), None, "a second refresh leaves a copy being written alone");
        view.sequence.fetch_add(1, Ordering::Relaxed);
        assert_eq!(view.get(3), Some(VIEWED));
    }

    /// Readers racing a writer that changes size and generation together
    /// never see one's size with the other's generation. The writer goes on
    /// until the readers have checked copies (or 10 s pass): on a loaded
    /// machine its fixed rounds can end before a reader first runs.
    #[test]
    fn readers_never_see_a_torn_copy() {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        use std::sync::Arc;
        const CHECKS_WANTED: u64 = 1_000;
        let view = Arc::new(InodeView::default());
        let stop = Arc::new(AtomicBool::new(false));
        let checked = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (view, stop, checked) = (view.clone(), stop.clone(), checked.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        for generation in 1..=64 {
                            if let Some(viewed) = view.get(generation) {
                                assert_eq!(viewed.size_bytes, generation * 10);
                                assert_eq!(viewed.atime_quiet_until_secs, generation + 1);
                                checked.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        let started = std::time::Instant::now();
        let mut round = 0u64;
        while round < 200_000
            || (checked.load(Ordering::Relaxed) < CHECKS_WANTED
                && started.elapsed() < std::time::Duration::from_secs(10))
        {
            let generation = round % 64 + 1;
            view.set(
                generation,
                Viewed { size_bytes: generation * 10, atime_quiet_until_secs: generation + 1 },
            );
            round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for reader in readers {
            reader.join().unwrap();
        }
        assert!(checked.load(Ordering::Relaxed) > 0, "the readers found copies to check");
    }
}
