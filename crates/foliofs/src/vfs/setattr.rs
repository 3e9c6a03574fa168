//! Attribute changes: `setattr` (mode, owner, times, and a size change that
//! truncates or extends), and the privileges (set-ID bits, file
//! capabilities) a data change or a chown takes away first.

use crate::buffered;
use crate::error::{Error, Result};
use crate::format::{InodeAttrs, InodeKind, Record, Timestamp};
use crate::meta::InodeTable;

use super::attr::{Attr, Owner, SetAttr, TimeSet};
use super::flags::{check_changeable, check_not_immutable};
use super::inodes::Inodes;
use super::namespace::{attrs_of, update_attrs, SET_GID};
use super::observe::NamespaceEvent;
use super::volume::VolumeCore;

const SET_UID: u32 = 0o4000;
const GROUP_EXEC: u32 = 0o010;

/// The extended attribute that holds a file's capabilities (setcap).
const FILE_CAPABILITIES: &[u8] = b"security.capability";

/// The set-ID bits that a change of a file's data (write, truncate,
/// fallocate) by `caller` removes, as the kernel's
/// `setattr_should_drop_suidgid`: set-user-ID always; set-group-ID when
/// group execute is set (without it the bit is a locking mark, not a
/// privilege) or the caller is not in the file's group. Root (taken as
/// holding CAP_FSETID) keeps both; only regular files lose them.
fn setid_bits_to_drop(attrs: &InodeAttrs, caller: Owner) -> u32 {
    if attrs.kind != InodeKind::File || caller.uid == 0 {
        return 0;
    }
    let mut dropped = attrs.mode & SET_UID;
    if attrs.mode & SET_GID != 0 && (attrs.mode & GROUP_EXEC != 0 || caller.gid != attrs.gid) {
        dropped |= SET_GID;
    }
    debug_assert_eq!(dropped & !(SET_UID | SET_GID), 0, "only set-ID bits are dropped");
    dropped
}

impl Inodes<'_> {
    /// Changes attributes; a size change truncates or extends the file.
    pub fn setattr(&self, ino: u64, changes: &SetAttr) -> Result<Attr> {
        let _writing = self.volume.shared.write_gate.start_write();
        check_attr_change(&self.volume.shared.meta.view(&[ino]), ino, changes)?;
        if let Some(size) = changes.size {
            let kind = attrs_of(&self.volume.shared.meta.view(&[ino]), ino)?.kind;
            match kind {
                InodeKind::Dir => return Err(Error::IsDir(format!("inode {ino}"))),
                InodeKind::Symlink => return Err(Error::invalid("truncating a symlink")),
                InodeKind::File => {}
                _ => return Err(Error::invalid("truncating a special file")),
            }
            if let Some(refusal) = self.volume.shared.meta.refusal() {
                return Err(refusal);
            }
            let inode = self.volume.shared.inode_cache(ino);
            {
                let _exclusive = inode.io.exclusive(|| self.volume.shared.engine.device.unplug());
                buffered::set_size(&self.volume.shared.engine, &inode, size)?;
            }
            drop(inode);
            self.volume.shared.cache.release_inode(ino, 0);
            self.volume.shared.changed(super::observe::ChangeEvent::from_offset(ino, size));
        }
        self.volume.shared.change_attrs(ino, changes)
    }

    /// Takes away what a write, truncate or fallocate by `caller` must take
    /// away before the change, as the kernel's `file_remove_privs`: the
    /// set-ID bits `setid_bits_to_drop` names (when `kill_setid`: the kernel
    /// says so for unprivileged callers), and the file capabilities
    /// (`security.capability`), which any data change removes, root's too.
    /// Front ends call it where the kernel leaves the rule to the file
    /// system (FUSE direct writes; fallocate). Returns whether the mode
    /// changed.
    pub fn remove_privileges(&self, ino: u64, caller: Owner, kill_setid: bool) -> Result<bool> {
        let _writing = self.volume.shared.write_gate.start_write();
        let to_remove = |state: &dyn InodeTable| -> Result<(u32, bool)> {
            // The data change that follows is refused on an immutable file:
            // nothing may change before it either.
            check_not_immutable(state, ino, "writing")?;
            let inode = state.inode(ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
            let setid = if kill_setid { setid_bits_to_drop(&inode.attrs, caller) } else { 0 };
            let capability = inode.xattrs.contains_key(FILE_CAPABILITIES);
            Ok((setid, capability))
        };
        // Most files have neither, and this runs before every write: a read
        // lock decides.
        if to_remove(&self.volume.shared.meta.view(&[ino]))? == (0, false) {
            return Ok(false);
        }
        let (dropped, _) = self.volume.shared.meta.transact(&[ino], |txn| {
            let (dropped, capability) = to_remove(txn.state())?;
            if dropped == 0 && !capability {
                return Ok(false);
            }
            if capability {
                txn.apply(Record::XattrRemove { ino, name: FILE_CAPABILITIES.to_vec() });
            }
            let now = Timestamp::now();
            update_attrs(txn, ino, |attrs| {
                attrs.mode &= !dropped;
                attrs.ctime = now;
            });
            Ok(dropped != 0)
        })?;
        Ok(dropped)
    }

    /// What a truncate or a chown by `caller` takes away before the
    /// setattr that makes it, where the kernel leaves this to the file
    /// system (FUSE_HANDLE_KILLPRIV_V2): a truncate as a data change
    /// ([`Inodes::remove_privileges`] with the set-ID rule); a chown the
    /// file capabilities, and from a regular file set-user-ID always and
    /// set-group-ID where group execute is set, root's too (the kernel's
    /// chown rule, `setattr_should_drop_sgid`). Returns the mode the
    /// setattr must set instead of `mode` (the one it asks for, or the
    /// file's) when the chown clears set-ID bits from it.
    pub fn remove_privileges_for_setattr(
        &self,
        ino: u64,
        caller: Owner,
        truncate: bool,
        chown: bool,
        mode: Option<u32>,
    ) -> Result<Option<u32>> {
        let _writing = self.volume.shared.write_gate.start_write();
        if truncate || chown {
            self.remove_privileges(ino, caller, truncate)?;
        }
        if !chown {
            return Ok(None);
        }
        let attrs = attrs_of(&self.volume.shared.meta.view(&[ino]), ino)?;
        if attrs.kind != InodeKind::File {
            return Ok(None);
        }
        let current = attrs.mode & 0o7777;
        let mut cleared = current & SET_UID;
        if current & GROUP_EXEC != 0 {
            cleared |= current & SET_GID;
        }
        debug_assert_eq!(cleared & !(SET_UID | SET_GID), 0, "only set-ID bits are cleared");
        Ok((cleared != 0).then(|| mode.unwrap_or(current) & !cleared))
    }
}

/// chattr's rules for a setattr: nothing changes an immutable inode; an
/// append-only one takes only times set to now (touch), as the kernel's
/// notify_change and vfs_utimes.
fn check_attr_change(
    state: &(impl InodeTable + ?Sized),
    ino: u64,
    changes: &SetAttr,
) -> Result<()> {
    let is_explicit = |time: Option<TimeSet>| matches!(time, Some(TimeSet::At(_)));
    let changes_protected = changes.mode.is_some()
        || changes.uid.is_some()
        || changes.gid.is_some()
        || changes.size.is_some()
        || is_explicit(changes.atime)
        || is_explicit(changes.mtime);
    if changes_protected {
        check_changeable(state, ino, "changing its attributes or size")
    } else if changes.atime.is_some() || changes.mtime.is_some() {
        check_not_immutable(state, ino, "changing its times")
    } else {
        Ok(())
    }
}

impl VolumeCore {
    /// `setattr` without the size: one transaction.
    pub(super) fn change_attrs(&self, ino: u64, changes: &SetAttr) -> Result<Attr> {
        let (attr, _) = self.meta.transact(&[ino], |txn| {
            let mut attrs = attrs_of(txn.state(), ino)?;
            check_attr_change(txn.state(), ino, changes)?;
            if changes.mode.is_none()
                && changes.uid.is_none()
                && changes.gid.is_none()
                && changes.atime.is_none()
                && changes.mtime.is_none()
                && changes.ctime.is_none()
            {
                return self.attr_of(txn.state(), ino);
            }
            let now = Timestamp::now();
            attrs.mode = changes.mode.map_or(attrs.mode, |mode| mode & 0o7777);
            attrs.uid = changes.uid.unwrap_or(attrs.uid);
            attrs.gid = changes.gid.unwrap_or(attrs.gid);
            attrs.atime = changes.atime.map_or(attrs.atime, |time| time.resolve(now));
            attrs.mtime = changes.mtime.map_or(attrs.mtime, |time| time.resolve(now));
            attrs.ctime = changes.ctime.unwrap_or(now);
            txn.apply(Record::InodeSet { ino, attrs });
            if changes.mode.is_some() {
                super::acl::sync_access_acl(txn, ino, attrs.mode);
            }
            self.attr_of(txn.state(), ino)
        })?;
        self.namespace_changed(&[NamespaceEvent::Attributes { ino }]);
        Ok(attr)
    }
}
