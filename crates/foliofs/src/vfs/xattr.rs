//! Extended attributes: names in the `user.`, `trusted.`, `security.` and
//! `system.` (POSIX ACL) namespaces, stored in the metadata and changed by
//! journalled records like every other attribute.
//!
//! Limits and errors follow Linux (xattr(7), ext4 and XFS): a name is 1 to
//! 255 bytes (`ERANGE` otherwise), a value at most 64 KiB (`E2BIG`), the
//! names of one inode fit listxattr's 64 KiB (`ENOSPC` otherwise, as ext4
//! when an inode's attribute space is full), an unknown namespace is
//! `EOPNOTSUPP`. `trusted.` needs CAP_SYS_ADMIN and `user.` lives only on
//! regular files and directories: writes fail with `EPERM`, reads find
//! nothing (`ENODATA`), as the kernel's `xattr_permission` answers.

use crate::error::{Error, Result};
use crate::format::journal::GROUP_HEADER_BYTES;
use crate::format::record::{XATTR_PREFIXES, XATTR_SYSTEM_NAMES};
use crate::format::{
    InodeKind, Record, Timestamp, XATTR_LIST_BYTES_MAX, XATTR_NAME_BYTES_MAX, XATTR_VALUE_BYTES_MAX,
};
use crate::meta::Inode;

use super::acl;
use super::inodes::Inodes;
use super::observe::NamespaceEvent;

/// setxattr(2)'s flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XattrFlags {
    /// XATTR_CREATE: fail with EEXIST if the attribute exists.
    pub create: bool,
    /// XATTR_REPLACE: fail with ENODATA if it does not.
    pub replace: bool,
    /// Setting an access ACL clears the setgid bit: the caller is neither
    /// in the file's group nor holds CAP_FSETID (FUSE's
    /// FUSE_SETXATTR_ACL_KILL_SGID; `posix_acl_update_mode`).
    pub acl_kill_sgid: bool,
}

impl XattrFlags {
    /// Decodes setxattr(2)'s flags; other bits are EINVAL.
    pub fn from_bits(bits: i32) -> Result<Self> {
        if bits & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            return Err(Error::invalid(format!("setxattr flags {bits:#x}")));
        }
        Ok(Self {
            create: bits & libc::XATTR_CREATE != 0,
            replace: bits & libc::XATTR_REPLACE != 0,
            acl_kill_sgid: false,
        })
    }
}

/// Whether the caller holds CAP_SYS_ADMIN, which the `trusted.` namespace
/// requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// CAP_SYS_ADMIN: may see and change `trusted.` attributes.
    SysAdmin,
    /// Anyone else.
    Unprivileged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Namespace {
    User,
    Trusted,
    Security,
    System,
}

fn shown(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// The namespace of a name a caller passed, with Linux's errors for names
/// that cannot be stored.
fn namespace_of(name: &[u8]) -> Result<Namespace> {
    if name.is_empty() || name.len() > XATTR_NAME_BYTES_MAX {
        return Err(Error::OutOfRange(format!(
            "extended attribute name of {} bytes (1 to {XATTR_NAME_BYTES_MAX})",
            name.len()
        )));
    }
    if name.contains(&0) {
        return Err(Error::invalid("an extended attribute name contains NUL"));
    }
    if name.starts_with(b"system.") {
        return if XATTR_SYSTEM_NAMES.contains(&name) {
            Ok(Namespace::System)
        } else {
            Err(Error::Unsupported(format!("extended attribute {}", shown(name))))
        };
    }
    let Some(prefix) = XATTR_PREFIXES.iter().find(|prefix| name.starts_with(prefix)) else {
        return Err(Error::Unsupported(format!(
            "extended attribute {}: the namespace must be user., trusted., security. or system.",
            shown(name)
        )));
    };
    if name.len() == prefix.len() {
        return Err(Error::invalid(format!(
            "extended attribute {}: no name after the prefix",
            shown(name)
        )));
    }
    Ok(match *prefix {
        b"user." => Namespace::User,
        b"trusted." => Namespace::Trusted,
        _ => Namespace::Security,
    })
}

/// Why `privilege` may not reach `namespace` on `kind`, if it may not.
fn refusal(
    namespace: Namespace,
    kind: InodeKind,
    privilege: Privilege,
    name: &[u8],
) -> Option<String> {
    match namespace {
        Namespace::Trusted if privilege != Privilege::SysAdmin => {
            Some(format!("{}: trusted attributes need CAP_SYS_ADMIN", shown(name)))
        }
        Namespace::User if !matches!(kind, InodeKind::File | InodeKind::Dir) => Some(format!(
            "{}: user attributes exist only on regular files and directories",
            shown(name)
        )),
        _ => None,
    }
}

fn inode_of(state: &(impl crate::meta::InodeTable + ?Sized), ino: u64) -> Result<&Inode> {
    state.inode(ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
}

impl Inodes<'_> {
    /// Sets `name` to `value` on `ino` (setxattr). Durable at the next
    /// commit, or at an fsync of the inode.
    pub fn set_xattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
        privilege: Privilege,
    ) -> Result<()> {
        let _writing = self.volume.shared.write_gate.start_write();
        let namespace = namespace_of(name)?;
        if value.len() > XATTR_VALUE_BYTES_MAX {
            return Err(Error::TooBig(format!(
                "extended attribute value of {} bytes (at most {XATTR_VALUE_BYTES_MAX})",
                value.len()
            )));
        }
        let record_bytes = (15 + name.len() + value.len()) as u64;
        // The transaction must fit one journal group: this record and an
        // InodeSet, or for a default ACL the two copies a mkdir under it
        // inherits with the new inode's records. Only a journal smaller than
        // mkfs's default makes that fail.
        let group_bytes_max = self.volume.shared.meta.journal().geometry().group_bytes_max();
        let copies = if name == acl::DEFAULT { 2 } else { 1 };
        let transaction_bytes = copies * record_bytes + GROUP_HEADER_BYTES as u64 + 1024;
        if transaction_bytes > group_bytes_max {
            return Err(Error::NoSpace(format!(
                "an extended attribute of {} bytes does not fit this volume's journal groups \
                 ({group_bytes_max} bytes); make the volume with a larger journal",
                value.len()
            )));
        }
        self.volume.shared.meta.transact(&[ino], |txn| {
            txn.ensure_metadata_room(record_bytes)?;
            let inode = inode_of(txn.state(), ino)?;
            if let Some(why) = refusal(namespace, inode.attrs.kind, privilege, name) {
                return Err(Error::NotPermitted(why));
            }
            super::flags::check_changeable(txn.state(), ino, "changing its extended attributes")?;
            // An ACL is checked, stored in its canonical encoding, and an
            // access ACL sets the mode (and is dropped when the mode says
            // all it does).
            let (value, mode) = if namespace == Namespace::System {
                acl::prepare_set(name, value, inode)?
            } else {
                (Some(value.to_vec()), None)
            };
            let exists = inode.xattrs.contains_key(name);
            if flags.replace && !exists {
                return Err(Error::NoAttribute(shown(name)));
            }
            if flags.create && exists {
                return Err(Error::Exists(shown(name)));
            }
            if !exists && inode.xattr_list_bytes() + name.len() + 1 > XATTR_LIST_BYTES_MAX {
                return Err(Error::NoSpace(format!(
                    "inode {ino}: the names of its extended attributes would exceed \
                     {XATTR_LIST_BYTES_MAX} bytes"
                )));
            }
            let mut attrs = inode.attrs;
            attrs.ctime = Timestamp::now();
            attrs.mode = mode.unwrap_or(attrs.mode);
            if flags.acl_kill_sgid && name == acl::ACCESS {
                attrs.mode &= !libc::S_ISGID;
            }
            match value {
                Some(value) => txn.apply(Record::XattrSet { ino, name: name.to_vec(), value }),
                None if exists => txn.apply(Record::XattrRemove { ino, name: name.to_vec() }),
                None => {}
            }
            txn.apply(Record::InodeSet { ino, attrs });
            Ok(())
        })?;
        // The ctime, and the mode where an access ACL changed.
        self.volume.shared.namespace_changed(&[NamespaceEvent::Attributes { ino }]);
        Ok(())
    }

    /// The value of `name` on `ino` (getxattr).
    pub fn get_xattr(&self, ino: u64, name: &[u8], privilege: Privilege) -> Result<Vec<u8>> {
        self.volume.shared.check_running()?;
        let namespace = namespace_of(name)?;
        let state = self.volume.shared.meta.view(&[ino]);
        let inode = inode_of(&state, ino)?;
        if refusal(namespace, inode.attrs.kind, privilege, name).is_some() {
            return Err(Error::NoAttribute(shown(name)));
        }
        inode.xattrs.get(name).cloned().ok_or_else(|| Error::NoAttribute(shown(name)))
    }

    /// The names of the attributes of `ino` that `privilege` may see
    /// (listxattr; `trusted.` names only for CAP_SYS_ADMIN), in byte order.
    pub fn list_xattr(&self, ino: u64, privilege: Privilege) -> Result<Vec<Vec<u8>>> {
        self.volume.shared.check_running()?;
        let state = self.volume.shared.meta.view(&[ino]);
        let inode = inode_of(&state, ino)?;
        Ok(inode
            .xattrs
            .keys()
            .filter(|name| privilege == Privilege::SysAdmin || !name.starts_with(b"trusted."))
            .cloned()
            .collect())
    }

    /// Removes `name` from `ino` (removexattr).
    pub fn remove_xattr(&self, ino: u64, name: &[u8], privilege: Privilege) -> Result<()> {
        let _writing = self.volume.shared.write_gate.start_write();
        let namespace = namespace_of(name)?;
        self.volume.shared.meta.transact(&[ino], |txn| {
            let inode = inode_of(txn.state(), ino)?;
            if let Some(why) = refusal(namespace, inode.attrs.kind, privilege, name) {
                return Err(Error::NotPermitted(why));
            }
            super::flags::check_changeable(txn.state(), ino, "changing its extended attributes")?;
            if !inode.xattrs.contains_key(name) {
                return Err(Error::NoAttribute(shown(name)));
            }
            let mut attrs = inode.attrs;
            attrs.ctime = Timestamp::now();
            txn.apply(Record::XattrRemove { ino, name: name.to_vec() });
            txn.apply(Record::InodeSet { ino, attrs });
            Ok(())
        })?;
        // The ctime, and the mode where an access ACL changed.
        self.volume.shared.namespace_changed(&[NamespaceEvent::Attributes { ino }]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_linux_errors() {
        let errno = |name: &[u8]| namespace_of(name).map_err(|error| error.errno());
        assert_eq!(errno(b"user.a"), Ok(Namespace::User));
        assert_eq!(errno(b"trusted.a"), Ok(Namespace::Trusted));
        assert_eq!(errno(b"security.capability"), Ok(Namespace::Security));
        assert_eq!(errno(b"system.posix_acl_access"), Ok(Namespace::System));
        assert_eq!(errno(b""), Err(libc::ERANGE));
        assert_eq!(errno(&[b'u'; 256]), Err(libc::ERANGE));
        assert_eq!(errno(b"user."), Err(libc::EINVAL));
        assert_eq!(errno(b"os2.name"), Err(libc::EOPNOTSUPP));
        assert_eq!(errno(b"system.nfs4_acl"), Err(libc::EOPNOTSUPP));
        assert_eq!(XattrFlags::from_bits(4).map_err(|error| error.errno()), Err(libc::EINVAL));
        assert_eq!(
            XattrFlags::from_bits(libc::XATTR_CREATE).unwrap(),
            XattrFlags { create: true, replace: false, acl_kill_sgid: false }
        );
    }
}
