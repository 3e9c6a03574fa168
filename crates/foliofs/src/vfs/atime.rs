//! Access times: whether a read advances a file's or a directory's access
//! time (the volume's `AtimePolicy`, nodiratime, chattr +A), and the
//! outlook a handle keeps so that most reads decide it without a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{InodeAttrs, InodeKind, Timestamp};
use crate::meta::{InodeView, Viewed};
use crate::options::AtimePolicy;

use super::volume::VolumeCore;

/// Under relatime an access time is advanced at least this often (a day, as
/// the kernel).
const RELATIME_AGE_SECS: i64 = 24 * 60 * 60;

impl VolumeCore {
    /// `ino`'s size and access-time outlook for a read, from `view` while
    /// the inode has not changed since it was taken, else under its shard's
    /// read lock (refreshing `view`): see `meta::view`. The caller holds the
    /// inode's I/O lock shared, as for any read.
    pub(crate) fn read_view(&self, ino: u64, view: &InodeView) -> Result<Viewed> {
        if let Some(viewed) = view.current() {
            return Ok(viewed);
        }
        let gone = || Error::BadHandle(format!("inode {ino} is gone"));
        let has_generation = self.meta.inode(ino).ok_or_else(gone)?.view_generation.is_some();
        if !has_generation {
            // The first handle to read this inode gives it a generation.
            let mut inode = self.meta.inode_mut(ino).ok_or_else(gone)?;
            inode.view_generation.get_or_insert_with(|| Arc::new(AtomicU64::new(1)));
        }
        let inode = self.meta.inode(ino).ok_or_else(gone)?;
        let source = inode.view_generation.as_ref().expect("given above, never taken away");
        view.attach(source);
        let generation = source.load(Ordering::Acquire);
        let attrs = &inode.attrs;
        let atime_quiet_until_secs = match self.options.atime {
            _ if self.options.read_only || super::flags::skips_atime(&inode) => u64::MAX,
            AtimePolicy::NoAtime => u64::MAX,
            AtimePolicy::Strict => 0,
            AtimePolicy::Relatime if attrs.mtime >= attrs.atime || attrs.ctime >= attrs.atime => 0,
            AtimePolicy::Relatime => {
                u64::try_from(attrs.atime.secs.saturating_add(RELATIME_AGE_SECS)).unwrap_or(0)
            }
        };
        let viewed = Viewed { size_bytes: inode.size, atime_quiet_until_secs };
        view.set(generation, viewed);
        Ok(viewed)
    }

    /// [`VolumeCore::accessed`] after a read that looked at `viewed`: nothing to
    /// do, and no lock taken, while its access time is not due.
    pub(crate) fn accessed_viewed(&self, ino: u64, viewed: &Viewed) {
        let quiet = match viewed.atime_quiet_until_secs {
            u64::MAX => true,
            0 => false,
            until => u64::try_from(crate::dev::realtime_coarse_secs()).is_ok_and(|now| now < until),
        };
        if !quiet {
            self.accessed(ino);
        }
    }

    /// A read of `ino` (its data, or a directory's listing) happened:
    /// advances its access time where the volume's policy says so
    /// (`AtimePolicy`), in memory. Under relatime a read lock decides and most
    /// reads change nothing.
    pub(crate) fn accessed(&self, ino: u64) {
        let policy = self.options.atime;
        if policy == AtimePolicy::NoAtime || self.options.read_only {
            return;
        }
        let nodiratime = self.options.nodiratime;
        let strict_now = (policy == AtimePolicy::Strict).then(Timestamp::now);
        // Relatime's age is a day, so the coarse clock decides it: a full
        // clock read on every cached read cost it 5% (4 KiB reads, `perf`);
        // the time written is read in full, and only when an update is due.
        let coarse_secs = match policy {
            AtimePolicy::Relatime => crate::dev::realtime_coarse_secs(),
            _ => 0,
        };
        let due = |attrs: &InodeAttrs| {
            if nodiratime && attrs.kind == InodeKind::Dir {
                return false;
            }
            match policy {
                AtimePolicy::NoAtime => false,
                AtimePolicy::Strict => strict_now.is_some_and(|now| attrs.atime != now),
                // The kernel's relatime_need_update.
                AtimePolicy::Relatime => {
                    attrs.mtime >= attrs.atime
                        || attrs.ctime >= attrs.atime
                        || coarse_secs - attrs.atime.secs >= RELATIME_AGE_SECS
                }
            }
        };
        {
            let Some(inode) = self.meta.inode(ino) else { return };
            if !due(&inode.attrs) || super::flags::skips_atime(&inode) {
                return;
            }
        }
        let now = strict_now.unwrap_or_else(Timestamp::now);
        // The read lock's answer again under the write lock: another
        // reader may have advanced it meanwhile.
        if let Some(mut inode) = self.meta.inode_mut(ino) {
            if due(&inode.attrs) {
                inode.attrs.atime = now;
                inode.times_dirty = true;
            }
        }
    }
}
