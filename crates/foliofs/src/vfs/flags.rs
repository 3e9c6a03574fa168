//! Inode attribute flags (chattr / lsattr, FS_IOC_GETFLAGS and SETFLAGS):
//! immutable and append-only, enforced here as ext4 enforces them (the
//! kernel's VFS checks S_IMMUTABLE / S_APPEND, which a FUSE inode never
//! carries, so every rule is the volume's), plus no-dump and no-atime.
//!
//! - immutable: no data change (write, truncate, fallocate), no attribute
//!   change (mode, owner, times, extended attributes), no new link, no
//!   unlink or rename; in an immutable directory no entry is added or
//!   removed;
//! - append-only: data changes only past the end of file (a write at an
//!   earlier offset, truncation and every fallocate mode but plain
//!   preallocation are refused), no attribute change but times set to now,
//!   no new link, no unlink or rename; in an append-only directory entries
//!   are only added.
//!
//! Every refusal is EPERM. Only a caller with CAP_LINUX_IMMUTABLE may set
//! or clear either flag.

use crate::error::{Error, Result};
use crate::format::record::{
    INODE_FLAGS_KNOWN, INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE, INODE_FLAG_NOATIME,
};
use crate::format::Record;
use crate::meta::InodeTable;

use super::inodes::Inodes;
use super::volume::VolumeCore;

/// The flags only CAP_LINUX_IMMUTABLE may change.
const PROTECTION_FLAGS: u32 = INODE_FLAG_IMMUTABLE | INODE_FLAG_APPEND;

fn flags_of(state: &(impl InodeTable + ?Sized), ino: u64) -> Result<u32> {
    state.inode(ino).map(|inode| inode.flags).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
}

fn refused(ino: u64, flags: u32, what: &str) -> Error {
    let flag = if flags & INODE_FLAG_IMMUTABLE != 0 { "immutable" } else { "append-only" };
    Error::NotPermitted(format!("inode {ino} is {flag}: {what}"))
}

/// Refuses `what` (a change of the inode itself: its attributes, a link, an
/// unlink, a rename) when `ino` is immutable or append-only.
pub(super) fn check_changeable(
    state: &(impl InodeTable + ?Sized),
    ino: u64,
    what: &str,
) -> Result<()> {
    let flags = flags_of(state, ino)?;
    if flags & PROTECTION_FLAGS != 0 {
        return Err(refused(ino, flags, what));
    }
    Ok(())
}

/// Refuses `what` when `ino` is immutable (append-only allows it: adding a
/// directory entry, appending data, setting times to now).
pub(super) fn check_not_immutable(
    state: &(impl InodeTable + ?Sized),
    ino: u64,
    what: &str,
) -> Result<()> {
    let flags = flags_of(state, ino)?;
    if flags & INODE_FLAG_IMMUTABLE != 0 {
        return Err(refused(ino, flags, what));
    }
    Ok(())
}

/// Whether reads of `inode` leave its access time alone (chattr +A).
pub(super) fn skips_atime(inode: &crate::meta::Inode) -> bool {
    inode.flags & INODE_FLAG_NOATIME != 0
}

impl VolumeCore {
    /// A data change of `ino` from byte `start` on: refused on an immutable
    /// file, and on an append-only one below its end of file.
    pub(super) fn check_data_change(&self, ino: u64, start: u64, what: &str) -> Result<()> {
        let inode = self.existing_inode(ino)?;
        let flags = inode.flags;
        if flags & INODE_FLAG_IMMUTABLE != 0
            || (flags & INODE_FLAG_APPEND != 0 && start < inode.size)
        {
            return Err(refused(ino, flags, what));
        }
        Ok(())
    }
}

impl Inodes<'_> {
    /// The inode's attribute flags (`INODE_FLAG_*`, FS_IOC_GETFLAGS values).
    pub fn flags(&self, ino: u64) -> Result<u32> {
        self.volume.shared.check_running()?;
        flags_of(&self.volume.shared.meta.view(&[ino]), ino)
    }

    /// open(2)'s rule for an append-only file, for a caller that positions
    /// O_APPEND writes itself (the kernel, through FUSE) and so opens its
    /// handle without `OpenFlags::append`: writable only with O_APPEND.
    /// (Without it, `File` refuses each write below the end of file.)
    pub fn check_append_only_open(&self, ino: u64, write: bool, o_append: bool) -> Result<()> {
        let flags = flags_of(&self.volume.shared.meta.view(&[ino]), ino)?;
        if write && !o_append && flags & INODE_FLAG_APPEND != 0 {
            return Err(refused(ino, flags, "opening it for writing without O_APPEND"));
        }
        Ok(())
    }

    /// Sets the inode's attribute flags. Unknown flags are EOPNOTSUPP;
    /// setting or clearing immutable or append-only needs
    /// `may_protect` (CAP_LINUX_IMMUTABLE), EPERM otherwise.
    pub fn set_flags(&self, ino: u64, flags: u32, may_protect: bool) -> Result<()> {
        let _writing = self.volume.shared.write_gate.start_write();
        if flags & !INODE_FLAGS_KNOWN != 0 {
            return Err(Error::Unsupported(format!(
                "inode flags {:#x} (this volume keeps {INODE_FLAGS_KNOWN:#x})",
                flags & !INODE_FLAGS_KNOWN
            )));
        }
        self.volume.shared.meta.transact(&[ino], |txn| {
            let old = flags_of(txn.state(), ino)?;
            if (old ^ flags) & PROTECTION_FLAGS != 0 && !may_protect {
                return Err(Error::NotPermitted(
                    "only a caller with CAP_LINUX_IMMUTABLE sets or clears immutable and \
                     append-only"
                        .into(),
                ));
            }
            if old == flags {
                return Ok(());
            }
            if old & INODE_FLAG_IMMUTABLE != 0 && flags & INODE_FLAG_IMMUTABLE != 0 {
                // Only the immutable flag itself may change on an immutable
                // inode (ext4: EPERM for any other change).
                return Err(refused(ino, old, "changing its other flags"));
            }
            txn.ensure_metadata_room(32)?;
            let now = crate::format::Timestamp::now();
            let mut attrs = txn.state().inode(ino).expect("checked").attrs;
            attrs.ctime = now;
            txn.apply(Record::InodeSet { ino, attrs });
            txn.apply(Record::FlagsSet { ino, flags });
            Ok(())
        })?;
        Ok(())
    }
}
