//! access(2)'s rule: which caller may read, write or search a node, by its
//! owner, group and other bits and the caller's supplementary groups.

use crate::error::{Error, Result};
use crate::format::InodeKind;

use super::attr::Attr;
use super::inodes::Inodes;

/// Who is asking: the file-system user and group and the supplementary
/// groups, as the kernel's `in_group_p` sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// File-system user id; 0 is root.
    pub uid: u32,
    /// File-system group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Credentials {
    /// Whether `gid` is the caller's group or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// What an access check asks for: any of [`Access::READ`], [`Access::WRITE`]
/// and [`Access::EXECUTE`] together (R_OK, W_OK, X_OK); empty asks only
/// whether the node exists (F_OK).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access(u32);

impl Access {
    /// R_OK.
    pub const READ: Self = Self(4);
    /// W_OK.
    pub const WRITE: Self = Self(2);
    /// X_OK: execute a file, search a directory.
    pub const EXECUTE: Self = Self(1);

    /// From access(2)'s mask; bits other than R_OK, W_OK and X_OK are refused.
    pub fn from_mask(mask: i32) -> Result<Self> {
        u32::try_from(mask)
            .ok()
            .filter(|bits| bits & !7 == 0)
            .map(Self)
            .ok_or_else(|| Error::invalid(format!("access mask {mask:#o}")))
    }

    /// Both `self` and `other`.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl Attr {
    /// Whether `caller` may access this node as `wanted` asks, by the owner,
    /// group (with supplementary groups) and other bits. Root passes, except
    /// that executing needs some execute bit on a non-directory.
    pub fn permits(&self, caller: &Credentials, wanted: Access) -> bool {
        let wanted = wanted.0;
        if caller.uid == 0 {
            return wanted & 1 == 0 || self.mode & 0o111 != 0 || self.kind == InodeKind::Dir;
        }
        let granted = if caller.uid == self.uid {
            (self.mode >> 6) & 7
        } else if caller.in_group(self.gid) {
            (self.mode >> 3) & 7
        } else {
            self.mode & 7
        };
        granted & wanted == wanted
    }
}

impl Inodes<'_> {
    /// access(2) on inode `ino`: EACCES when the permission bits refuse
    /// `caller`.
    pub fn access(&self, ino: u64, caller: &Credentials, wanted: Access) -> Result<()> {
        let attr = self.getattr(ino)?;
        if attr.permits(caller, wanted) {
            Ok(())
        } else {
            Err(Error::PermissionDenied(format!("inode {ino} (mode {:o})", attr.mode)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Timestamp;

    fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
        let zero = Timestamp { secs: 0, nanos: 0 };
        Attr {
            ino: 2,
            kind: InodeKind::File,
            mode,
            uid,
            gid,
            nlink: 1,
            size: 0,
            blocks_512: 0,
            atime: zero,
            mtime: zero,
            ctime: zero,
            block_bytes: 4096,
            rdev: 0,
        }
    }

    fn caller(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials { uid, gid, groups: groups.to_vec() }
    }

    const READ_WRITE: Access = Access::READ.union(Access::WRITE);

    #[test]
    fn access_follows_owner_group_and_other_bits() {
        let file = attr(0o640, 1000, 100);
        assert!(file.permits(&caller(1000, 5, &[]), READ_WRITE));
        assert!(!file.permits(&caller(1000, 5, &[]), Access::EXECUTE));
        assert!(file.permits(&caller(1001, 100, &[]), Access::READ));
        assert!(!file.permits(&caller(1001, 100, &[]), Access::WRITE));
        assert!(!file.permits(&caller(1002, 101, &[]), Access::READ));
        assert!(file.permits(&caller(0, 0, &[]), READ_WRITE));
        assert!(!file.permits(&caller(0, 0, &[]), Access::EXECUTE), "root needs an execute bit");
        assert!(attr(0o744, 1, 1).permits(&caller(0, 0, &[]), Access::EXECUTE));
    }

    /// The group bits apply to a caller in the file's group through a
    /// supplementary group (the adapter's old rule ignored them).
    #[test]
    fn supplementary_groups_get_the_group_bits() {
        let file = attr(0o640, 1000, 100);
        assert!(file.permits(&caller(1001, 5, &[7, 100]), Access::READ));
        assert!(!file.permits(&caller(1001, 5, &[7]), Access::READ));
    }

    #[test]
    fn masks_beyond_rwx_are_refused() {
        assert_eq!(Access::from_mask(libc::R_OK | libc::X_OK).unwrap(), Access(5));
        assert!(Access::from_mask(8).is_err());
        assert!(Access::from_mask(-1).is_err());
    }
}
