//! POSIX ACLs, stored as the `system.posix_acl_access` and
//! `system.posix_acl_default` attributes in the kernel's xattr format
//! (version 2: a u32 header, then `{u16 tag, u16 perm, u32 id}` entries,
//! little-endian). The kernel enforces them (FUSE_POSIX_ACL); the volume
//! keeps what the kernel leaves to the file system, as fs/posix_acl.c does
//! for local file systems:
//!
//! - setting an access ACL sets the mode's permission bits from it, and an
//!   ACL the mode expresses whole is not stored (`posix_acl_update_mode`);
//! - chmod rewrites the owner, group-or-mask and other entries of the access
//!   ACL (`posix_acl_chmod`);
//! - a new inode in a directory with a default ACL inherits it as its access
//!   ACL masked by the requested mode, directories also as their default,
//!   and the umask is not applied (`posix_acl_create`).

use super::inodes::Inodes;
use crate::error::{Error, Result};
use crate::format::{InodeKind, Record};
use crate::meta::{Inode, InodeTable, Txn};

pub(crate) const ACCESS: &[u8] = b"system.posix_acl_access";
pub(crate) const DEFAULT: &[u8] = b"system.posix_acl_default";

const XATTR_VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;
/// Most entries an ACL may have in one attribute (as ext4's limit for
/// a block; the kernel refuses larger ones through FUSE anyway).
const ENTRIES_MAX: usize = 8190;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A decoded, valid ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Decodes and checks an ACL as `posix_acl_from_xattr` and
    /// `posix_acl_valid` do: one owner, group and other entry, a mask when
    /// there are named entries, named entries sorted by tag and id and
    /// unique, permissions within rwx.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let invalid = |why: &str| Err(Error::invalid(format!("POSIX ACL: {why}")));
        if bytes.len() < 4 || !(bytes.len() - 4).is_multiple_of(8) {
            return invalid("its length is not a header and whole entries");
        }
        let version = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        if version != XATTR_VERSION {
            return invalid(&format!("version {version}, not {XATTR_VERSION}"));
        }
        let count = (bytes.len() - 4) / 8;
        if count > ENTRIES_MAX {
            return invalid(&format!("{count} entries"));
        }
        let entries: Vec<Entry> = bytes[4..]
            .chunks_exact(8)
            .map(|chunk| Entry {
                tag: u16::from_le_bytes([chunk[0], chunk[1]]),
                perm: u16::from_le_bytes([chunk[2], chunk[3]]),
                id: u32::from_le_bytes(chunk[4..8].try_into().expect("4 bytes")),
            })
            .collect();
        let order = |tag: u16| match tag {
            USER_OBJ => Some(0),
            USER => Some(1),
            GROUP_OBJ => Some(2),
            GROUP => Some(3),
            MASK => Some(4),
            OTHER => Some(5),
            _ => None,
        };
        let mut previous: Option<(u8, u32)> = None;
        for entry in &entries {
            let Some(rank) = order(entry.tag) else {
                return invalid(&format!("unknown tag {:#x}", entry.tag));
            };
            if entry.perm & !7 != 0 {
                return invalid(&format!("permissions {:#o}", entry.perm));
            }
            let named = matches!(entry.tag, USER | GROUP);
            let key = (rank, if named { entry.id } else { 0 });
            if previous.is_some_and(|previous| previous >= key) {
                return invalid("entries out of order or repeated");
            }
            previous = Some(key);
        }
        let has = |tag: u16| entries.iter().any(|entry| entry.tag == tag);
        if !has(USER_OBJ) || !has(GROUP_OBJ) || !has(OTHER) {
            return invalid("an owner, group or other entry is missing");
        }
        if (has(USER) || has(GROUP)) && !has(MASK) {
            return invalid("named entries without a mask");
        }
        Ok(Self { entries })
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut bytes = XATTR_VERSION.to_le_bytes().to_vec();
        for entry in &self.entries {
            bytes.extend_from_slice(&entry.tag.to_le_bytes());
            bytes.extend_from_slice(&entry.perm.to_le_bytes());
            let id = if matches!(entry.tag, USER | GROUP) { entry.id } else { UNDEFINED_ID };
            bytes.extend_from_slice(&id.to_le_bytes());
        }
        bytes
    }

    fn perm_of(&self, tag: u16) -> Option<u32> {
        self.entries.iter().find(|entry| entry.tag == tag).map(|entry| u32::from(entry.perm))
    }

    /// Whether the mode bits say all the ACL says (no named entries, no mask).
    fn is_minimal(&self) -> bool {
        self.entries.len() == 3
    }

    /// The permission bits the ACL implies (`posix_acl_equiv_mode`): the
    /// group bits are the mask's where there is one.
    fn mode_bits(&self) -> u32 {
        let group = self.perm_of(MASK).or(self.perm_of(GROUP_OBJ)).unwrap_or(0);
        self.perm_of(USER_OBJ).unwrap_or(0) << 6 | group << 3 | self.perm_of(OTHER).unwrap_or(0)
    }

    /// Rewrites the entries the mode bits stand for (`posix_acl_chmod`).
    fn chmod(&mut self, mode: u32) {
        let has_mask = self.perm_of(MASK).is_some();
        for entry in &mut self.entries {
            let bits = match entry.tag {
                USER_OBJ => mode >> 6,
                MASK => mode >> 3,
                GROUP_OBJ if !has_mask => mode >> 3,
                OTHER => mode,
                _ => continue,
            };
            entry.perm = (bits & 7) as u16;
        }
    }

    /// Masks an inherited ACL by the requested mode and the mode by the ACL
    /// (`posix_acl_create_masq`); returns the new permission bits.
    fn create_masq(&mut self, mode: u32) -> u32 {
        let has_mask = self.perm_of(MASK).is_some();
        let mut bits = mode & 0o777;
        for entry in &mut self.entries {
            let shift = match entry.tag {
                USER_OBJ => 6,
                MASK => 3,
                GROUP_OBJ if !has_mask => 3,
                OTHER => 0,
                _ => continue,
            };
            let perm = u32::from(entry.perm) & (bits >> shift) & 7;
            entry.perm = perm as u16;
            bits = (bits & !(7 << shift)) | perm << shift;
        }
        bits
    }
}

/// Checks an ACL value before it is stored, with the mode it implies for
/// an access ACL: `(value to store or None to remove, new permission bits)`.
pub(crate) fn prepare_set(
    name: &[u8],
    value: &[u8],
    inode: &Inode,
) -> Result<(Option<Vec<u8>>, Option<u32>)> {
    if name == DEFAULT && inode.attrs.kind != InodeKind::Dir {
        return Err(Error::NotPermitted("a default ACL exists only on directories".into()));
    }
    let acl = Acl::decode(value)?;
    if name == DEFAULT {
        return Ok((Some(acl.encode()), None));
    }
    if inode.attrs.kind == InodeKind::Symlink {
        return Err(Error::Unsupported("ACLs on symlinks".into()));
    }
    let mode = (inode.attrs.mode & !0o777) | acl.mode_bits();
    let stored = (!acl.is_minimal()).then(|| acl.encode());
    Ok((stored, Some(mode)))
}

/// Whether a stored ACL value decodes: fsck's check.
pub fn is_valid_acl(value: &[u8]) -> bool {
    Acl::decode(value).is_ok()
}

/// After a mode change: the access ACL rewritten to match (chmod).
pub(crate) fn sync_access_acl(txn: &mut Txn<'_>, ino: u64, mode: u32) {
    let Some(stored) = txn.state().inode(ino).and_then(|inode| inode.xattrs.get(ACCESS)) else {
        return;
    };
    // Stored ACLs were valid when set; one that is not (a damaged image) is
    // left for fsck to report rather than failing the chmod.
    let Ok(mut acl) = Acl::decode(stored) else {
        return;
    };
    acl.chmod(mode);
    let value = acl.encode();
    if &value != stored {
        txn.apply(Record::XattrSet { ino, name: ACCESS.to_vec(), value });
    }
}

/// The mode to create a node with: the umask applies unless the parent
/// directory has a default ACL, which then masks the mode instead.
pub(crate) fn creation_mode(
    state: &(impl InodeTable + ?Sized),
    parent: u64,
    mode: u32,
    umask: u32,
) -> u32 {
    let has_default = state.inode(parent).is_some_and(|dir| dir.xattrs.contains_key(DEFAULT));
    if has_default {
        mode
    } else {
        mode & !umask
    }
}

impl Inodes<'_> {
    /// The permission bits to create a node in `parent` with, from the
    /// mode and umask the caller passed: the umask applies unless `parent`
    /// has a default ACL, which masks the mode instead (POSIX.1e).
    pub fn creation_mode(&self, parent: u64, mode: u32, umask: u32) -> u32 {
        creation_mode(&self.volume.shared.meta.view(&[parent]), parent, mode, umask)
    }
}

/// What a new inode of `kind` made in `parent` with permission bits `mode`
/// inherits: its permission bits and the ACL records to apply after its
/// InodeSet. Nothing when the parent has no default ACL.
pub(crate) fn inherit(
    state: &(impl InodeTable + ?Sized),
    parent: u64,
    ino: u64,
    kind: InodeKind,
    mode: u32,
) -> (u32, Vec<Record>) {
    let Some(default) = state.inode(parent).and_then(|dir| dir.xattrs.get(DEFAULT)) else {
        return (mode, Vec::new());
    };
    let Ok(mut acl) = Acl::decode(default) else {
        return (mode, Vec::new());
    };
    if kind == InodeKind::Symlink {
        return (mode, Vec::new());
    }
    let mut records = Vec::new();
    if kind == InodeKind::Dir {
        records.push(Record::XattrSet { ino, name: DEFAULT.to_vec(), value: default.clone() });
    }
    let bits = acl.create_masq(mode);
    if !acl.is_minimal() {
        records.push(Record::XattrSet { ino, name: ACCESS.to_vec(), value: acl.encode() });
    }
    ((mode & !0o777) | bits, records)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An ACL from `(tag, perm, id)` triples.
    pub(crate) fn acl_bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let entries = entries.iter().map(|&(tag, perm, id)| Entry { tag, perm, id }).collect();
        Acl { entries }.encode()
    }

    fn named() -> Vec<u8> {
        acl_bytes(&[
            (USER_OBJ, 7, 0),
            (USER, 6, 1000),
            (GROUP_OBJ, 5, 0),
            (GROUP, 4, 50),
            (MASK, 6, 0),
            (OTHER, 0, 0),
        ])
    }

    #[test]
    fn decode_checks_what_the_kernel_checks() {
        let acl = Acl::decode(&named()).unwrap();
        assert_eq!(acl.encode(), named());
        assert_eq!(acl.mode_bits(), 0o760);
        let minimal = acl_bytes(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]);
        assert!(Acl::decode(&minimal).unwrap().is_minimal());
        for bad in [
            vec![],
            vec![1, 0, 0, 0],
            named()[..named().len() - 1].to_vec(),
            acl_bytes(&[(USER_OBJ, 6, 0), (OTHER, 4, 0)]),
            acl_bytes(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (OTHER, 8, 0)]),
            acl_bytes(&[(USER_OBJ, 6, 0), (USER, 4, 3), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]),
            acl_bytes(&[(GROUP_OBJ, 4, 0), (USER_OBJ, 6, 0), (OTHER, 4, 0)]),
            acl_bytes(&[(USER_OBJ, 6, 0), (USER, 4, 3), (USER, 4, 3), (GROUP_OBJ, 4, 0)]),
            acl_bytes(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (0x40, 4, 0), (OTHER, 4, 0)]),
        ] {
            assert!(Acl::decode(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn chmod_and_create_follow_posix_acl_c() {
        let mut acl = Acl::decode(&named()).unwrap();
        acl.chmod(0o705);
        // The mask takes the group bits; the owning group's entry stays.
        assert_eq!(acl.perm_of(MASK), Some(0));
        assert_eq!(acl.perm_of(GROUP_OBJ), Some(5));
        assert_eq!(acl.mode_bits(), 0o705);
        let mut inherited = Acl::decode(&named()).unwrap();
        // mkdir 0755 under this default: owner rwx, mask r-x & rw- = r--.
        assert_eq!(inherited.create_masq(0o755), 0o740);
        assert_eq!(inherited.perm_of(MASK), Some(4));
        assert_eq!(inherited.perm_of(USER), Some(6), "named entries are kept");
    }
}
