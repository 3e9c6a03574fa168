//! Namespace operations. Each validates against the current state and then
//! applies its records in one transaction, so a failed check changes nothing.

use crate::error::{Error, Result};
use crate::format::record::is_valid_name;
use crate::format::{
    InodeAttrs, InodeKind, Record, Timestamp, NAME_BYTES_MAX, ROOT_INO, SYMLINK_BYTES_MAX,
};
use crate::meta::{InodeTable, MetaStore, Txn};

use super::attr::{Attr, DirEntry, Owner};
use super::flags::{check_changeable, check_not_immutable};
use super::inodes::Inodes;
use super::observe::NamespaceEvent;

/// Most links a file may have (as ext4's EXT4_LINK_MAX).
const LINK_COUNT_MAX: u32 = 65000;

/// The set-group-ID bit (a directory passes it to what is made in it).
pub(super) const SET_GID: u32 = 0o2000;

/// renameat2 flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST instead of replacing the target.
    pub no_replace: bool,
    /// Atomically swap source and target, which must both exist.
    pub exchange: bool,
    /// RENAME_WHITEOUT: leave a whiteout (a character device 0:0, mode 0,
    /// owned by this owner) at the source name, in the same transaction,
    /// as overlayfs asks of its upper file system.
    pub whiteout: Option<Owner>,
}

// `check_name` shows the first 32 bytes of a name too long.
const _: () = assert!(NAME_BYTES_MAX >= 32);

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_BYTES_MAX {
        return Err(Error::NameTooLong(String::from_utf8_lossy(&name[..32]).into_owned() + "..."));
    }
    if !is_valid_name(name) {
        return Err(Error::invalid(format!(
            "invalid file name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    debug_assert!(!name.is_empty() && name.len() <= NAME_BYTES_MAX);
    Ok(())
}

fn display(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// The entry `name` in directory `dir`: its inode number.
fn entry_of(state: &(impl InodeTable + ?Sized), dir: u64, name: &[u8]) -> Result<u64> {
    let entries = dir_entries(state, dir)?;
    entries.get(name).copied().ok_or_else(|| Error::NotFound(display(name)))
}

fn dir_entries(
    state: &(impl InodeTable + ?Sized),
    dir: u64,
) -> Result<&std::collections::BTreeMap<Vec<u8>, u64>> {
    let inode =
        state.inode(dir).ok_or_else(|| Error::NotFound(format!("directory inode {dir}")))?;
    inode.entries().ok_or_else(|| Error::NotDir(format!("inode {dir}")))
}

fn parent_dir_of(state: &(impl InodeTable + ?Sized), dir: u64) -> Result<u64> {
    let attrs = attrs_of(state, dir)?;
    if attrs.kind != InodeKind::Dir {
        return Err(Error::NotDir(format!("inode {dir}")));
    }
    Ok(attrs.parent)
}

/// A directory removed while open lists nothing and takes no new entries
/// (ENOENT, as the kernel's IS_DEADDIR).
fn check_not_removed(state: &(impl InodeTable + ?Sized), dir: u64) -> Result<()> {
    if attrs_of(state, dir)?.nlink == 0 {
        return Err(Error::NotFound(format!("directory {dir} was removed")));
    }
    Ok(())
}

pub(super) fn attrs_of(state: &(impl InodeTable + ?Sized), ino: u64) -> Result<InodeAttrs> {
    state.inode(ino).map(|inode| inode.attrs).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
}

/// Applies an InodeSet with `change` made to the current attributes.
pub(super) fn update_attrs(txn: &mut Txn<'_>, ino: u64, change: impl FnOnce(&mut InodeAttrs)) {
    let mut attrs = txn.state().inode(ino).expect("validated inode").attrs;
    let kind = attrs.kind;
    change(&mut attrs);
    debug_assert_eq!(attrs.kind, kind, "inode {ino}: an inode never changes kind");
    txn.apply(Record::InodeSet { ino, attrs });
}

fn touch_dir(txn: &mut Txn<'_>, dir: u64, nlink_delta: i32, now: Timestamp) {
    // One subdirectory's ".." at a time.
    debug_assert!((-1..=1).contains(&nlink_delta), "a link count change of {nlink_delta}");
    update_attrs(txn, dir, |attrs| {
        debug_assert_eq!(attrs.kind, InodeKind::Dir, "touching inode {dir}, not a directory");
        // Saturating: the count is loaded from the image unchecked, so a
        // damaged one (0, u32::MAX) must not panic a live change; fsck
        // reports it (found by fuzz_images).
        attrs.nlink = attrs.nlink.saturating_add_signed(nlink_delta);
        attrs.mtime = now;
        attrs.ctime = now;
    });
}

/// Drops one link of `ino` (named in a directory that is being changed; a
/// directory's only one); frees it when no link and no open handle remains.
/// An open one stays, with nlink 0, until its last handle closes.
fn drop_link(txn: &mut Txn<'_>, ino: u64, now: Timestamp) {
    let inode = txn.state().inode(ino).expect("validated inode");
    let is_dir = inode.attrs.kind == InodeKind::Dir;
    // rmdir and rename checked that a directory losing its name is empty.
    debug_assert!(
        !is_dir || inode.entries().is_some_and(|entries| entries.is_empty()),
        "directory {ino} dropped while not empty"
    );
    let nlink = if is_dir { 0 } else { inode.attrs.nlink.saturating_sub(1) };
    let frees_at_once = || txn.shared_counts_unmapping(ino, 0, u64::MAX) <= txn.shared_count_room();
    if nlink == 0 && inode.open_handles == 0 && frees_at_once() {
        txn.apply(Record::InodeFree { ino });
    } else {
        // An inode whose blocks' shared counts would not fit this
        // transaction stays an orphan, freed in steps right after it
        // (`VolumeCore::free_orphan`) or by the next mount.
        update_attrs(txn, ino, |attrs| {
            attrs.nlink = nlink;
            attrs.ctime = now;
        });
    }
}

/// What a new inode is made of, besides what it inherits from its directory.
pub(super) struct NewInode {
    pub(super) ino: u64,
    pub(super) kind: InodeKind,
    pub(super) mode: u32,
    pub(super) owner: Owner,
    pub(super) nlink: u32,
    pub(super) size: u64,
    pub(super) now: Timestamp,
}

/// Applies the records of a new inode made in `parent`: its attributes and
/// what it inherits from `parent` (default ACL, set-group-ID group). `extra`
/// is the journal room the caller's own records need.
pub(super) fn apply_new_inode(
    txn: &mut Txn<'_>,
    parent: u64,
    new: NewInode,
    extra: u64,
) -> Result<()> {
    let NewInode { ino, kind, mode, owner, nlink, size, now } = new;
    // Each caller refused a number in use, and found `parent` a directory.
    debug_assert!(txn.state().inode(ino).is_none(), "inode {ino} made twice");
    debug_assert!(
        txn.state().inode(parent).is_some_and(|dir| dir.entries().is_some()),
        "inode {ino} made in {parent}, not a directory"
    );
    let is_dir = kind == InodeKind::Dir;
    let (mode, inherited) = super::acl::inherit(txn.state(), parent, ino, kind, mode);
    let inherited_bytes: usize = inherited.iter().map(Record::encoded_bytes_max).sum();
    txn.ensure_metadata_room(extra + inherited_bytes as u64)?;
    // A set-group-ID directory hands its group to what is created in
    // it, and its set-group-ID bit to new directories, so a shared
    // tree keeps one group (inode_init_owner). Stripping the bit from
    // a new file whose creator is not in that group is the kernel's
    // (vfs_prepare_mode), before the request reaches the adapter.
    let parent_attrs = attrs_of(txn.state(), parent)?;
    let inherits_group = parent_attrs.mode & SET_GID != 0;
    let gid = if inherits_group { parent_attrs.gid } else { owner.gid };
    let mode = if inherits_group && is_dir { mode | SET_GID } else { mode };
    let attrs = InodeAttrs {
        kind,
        mode: mode & 0o7777,
        uid: owner.uid,
        gid,
        nlink,
        size,
        atime: now,
        mtime: now,
        ctime: now,
        parent: if is_dir { parent } else { 0 },
    };
    txn.apply(Record::InodeSet { ino, attrs });
    for record in inherited {
        txn.apply(record);
    }
    Ok(())
}

/// The entries of directory `dir`, sorted by name. The names are read
/// under the directory's shard, then each entry's kind under its own, a
/// shard at a time (an entry whose inode went meanwhile is left out).
pub(super) fn list(meta: &MetaStore, dir: u64) -> Result<Vec<DirEntry>> {
    let named: Vec<(Vec<u8>, u64)> = {
        let view = meta.view(&[dir]);
        let entries = dir_entries(&view, dir)?;
        entries.iter().map(|(name, &ino)| (name.clone(), ino)).collect()
    };
    let mut kinds: Vec<Option<InodeKind>> = vec![None; named.len()];
    let mut by_shard: Vec<usize> = (0..named.len()).collect();
    by_shard.sort_by_key(|&index| crate::meta::shard_of(named[index].1));
    for group in by_shard
        .chunk_by(|&a, &b| crate::meta::shard_of(named[a].1) == crate::meta::shard_of(named[b].1))
    {
        // Every inode read is named: on a volume of format 3 one not in
        // memory is read from the index then.
        let inos: Vec<u64> = group.iter().map(|&index| named[index].1).collect();
        let view = meta.view(&inos);
        for &index in group {
            kinds[index] = view.inode(named[index].1).map(|inode| inode.attrs.kind);
        }
    }
    let listed: Vec<DirEntry> = named
        .into_iter()
        .zip(kinds)
        .filter_map(|((name, ino), kind)| Some(DirEntry { name, ino, kind: kind? }))
        .collect();
    debug_assert!(listed.windows(2).all(|pair| pair[0].name < pair[1].name), "unsorted");
    Ok(listed)
}

/// True if directory `ancestor` is `dir` or one of its parents, read a
/// directory at a time: the caller holds the rename mutex, so no
/// directory changes parent meanwhile.
fn is_ancestor_walk(meta: &MetaStore, ancestor: u64, mut dir: u64) -> bool {
    for _ in 0..meta.inode_count() + 1 {
        if dir == ancestor {
            return true;
        }
        if dir == ROOT_INO {
            return false;
        }
        match meta.inode(dir) {
            Some(inode) => dir = inode.attrs.parent,
            None => return false,
        }
    }
    false
}

impl Inodes<'_> {
    /// The attributes of inode `ino` (stat).
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.volume.shared.attr_of(&self.volume.shared.meta.view(&[ino]), ino)
    }

    /// The inode `name` in directory `parent`. "." is `parent` itself,
    /// whatever its kind, and ".." its parent directory: the two lookups the
    /// kernel makes to turn a file handle back into an inode (FUSE export
    /// support, NFS re-export, open_by_handle_at).
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let meta = &self.volume.shared.meta;
        let ino = match name {
            b"." => parent,
            b".." => parent_dir_of(&meta.view(&[parent]), parent)?,
            _ => entry_of(&meta.view(&[parent]), parent, name)?,
        };
        // A second look, under the entry's own shard: an entry removed in
        // between is not found, as a lookup that came a moment later.
        self.volume.shared.attr_of(&meta.view(&[ino]), ino)
    }

    /// The directory that holds directory `dir` (the root holds itself).
    pub fn parent_of(&self, dir: u64) -> Result<u64> {
        self.volume.shared.check_running()?;
        parent_dir_of(&self.volume.shared.meta.view(&[dir]), dir)
    }

    /// The inode at an absolute path; symlinks are not followed.
    pub fn resolve(&self, path: &str) -> Result<u64> {
        self.volume.shared.check_running()?;
        let meta = &self.volume.shared.meta;
        let mut ino = ROOT_INO;
        for component in path.split('/').filter(|part| !part.is_empty() && *part != ".") {
            let view = meta.view(&[ino]);
            ino = if component == ".." {
                attrs_of(&view, ino)?.parent
            } else {
                entry_of(&view, ino, component.as_bytes()).map_err(|error| match error {
                    Error::NotFound(_) => Error::NotFound(path.to_string()),
                    Error::NotDir(_) => Error::NotDir(path.to_string()),
                    other => other,
                })?
            };
        }
        Ok(ino)
    }

    /// The entries of directory `dir`, without "." and "..".
    pub fn readdir(&self, dir: u64) -> Result<Vec<DirEntry>> {
        self.volume.shared.check_running()?;
        let entries = list(&self.volume.shared.meta, dir)?;
        self.volume.shared.accessed(dir);
        Ok(entries)
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.volume.shared.check_running()?;
        let inode = self.volume.shared.existing_inode(ino)?;
        match &inode.body {
            crate::meta::InodeBody::Symlink(target) => Ok(target.clone()),
            _ => Err(Error::invalid(format!("inode {ino} is not a symlink"))),
        }
    }

    /// Creates a node of any kind named `name` in `parent`; `rdev` is a
    /// device node's number (0 for other kinds).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn make_node(
        &self,
        parent: u64,
        name: &[u8],
        kind: InodeKind,
        mode: u32,
        owner: Owner,
        target: Option<&[u8]>,
        rdev: u32,
    ) -> Result<Attr> {
        debug_assert!(target.is_none() || kind == InodeKind::Symlink, "a target for a {kind:?}");
        debug_assert!(rdev == 0 || kind.is_device(), "a device number for a {kind:?}");
        let _writing = self.volume.shared.write_gate.start_write();
        check_name(name)?;
        let ino = self.volume.shared.meta.take_ino(kind == InodeKind::Dir);
        let (attr, _) = self.volume.shared.meta.transact(&[parent, ino], |txn| {
            if dir_entries(txn.state(), parent)?.contains_key(name) {
                return Err(Error::Exists(display(name)));
            }
            check_not_removed(txn.state(), parent)?;
            check_not_immutable(txn.state(), parent, "adding an entry")?;
            let extra = 200 + name.len() as u64 + target.map_or(0, |target| target.len() as u64);
            txn.ensure_metadata_room(extra)?;
            let now = Timestamp::now();
            if txn.state().inode(ino).is_some() {
                // Numbers only grow, and `next_ino` stops at u64::MAX: an
                // image using that number has none left. Handing it out again
                // would change an existing inode (found by fuzz_images).
                return Err(Error::NoSpace("no inode numbers left".into()));
            }
            let is_dir = kind == InodeKind::Dir;
            let size = target.map_or(0, |target| target.len() as u64);
            let nlink = if is_dir { 2 } else { 1 };
            let new = NewInode { ino, kind, mode, owner, nlink, size, now };
            apply_new_inode(txn, parent, new, extra)?;
            if let Some(target) = target {
                txn.apply(Record::SymlinkSet { ino, target: target.to_vec() });
            }
            if rdev != 0 {
                txn.apply(Record::DeviceSet { ino, rdev });
            }
            txn.apply(Record::DirAdd { dir: parent, name: name.to_vec(), ino });
            touch_dir(txn, parent, i32::from(is_dir), now);
            self.volume.shared.attr_of(txn.state(), ino)
        })?;
        self.volume
            .shared
            .namespace_changed(&[NamespaceEvent::Entry { parent, name: name.to_vec() }]);
        Ok(attr)
    }

    /// Creates regular file `name` in `parent` with permission bits `mode` (final: see [`Inodes::creation_mode`]); EEXIST if the name is taken.
    pub fn create(&self, parent: u64, name: &[u8], mode: u32, owner: Owner) -> Result<Attr> {
        self.make_node(parent, name, InodeKind::File, mode, owner, None, 0)
    }

    /// Creates directory `name` in `parent`, as [`Inodes::create`] a file.
    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, owner: Owner) -> Result<Attr> {
        self.make_node(parent, name, InodeKind::Dir, mode, owner, None, 0)
    }

    /// Creates symlink `name` in `parent` pointing to `target`.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], owner: Owner) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) {
            return Err(Error::invalid("a symlink target must be non-empty and contain no NUL"));
        }
        if target.len() > SYMLINK_BYTES_MAX {
            return Err(Error::NameTooLong(format!("symlink target of {} bytes", target.len())));
        }
        self.make_node(parent, name, InodeKind::Symlink, 0o777, owner, Some(target), 0)
    }

    /// Adds the name `new_name` in `new_parent` for the existing inode `ino`.
    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr> {
        let _writing = self.volume.shared.write_gate.start_write();
        check_name(new_name)?;
        let (attr, _) = self.volume.shared.meta.transact(&[ino, new_parent], |txn| {
            let attrs = attrs_of(txn.state(), ino)?;
            if attrs.kind == InodeKind::Dir {
                return Err(Error::NotPermitted("hard links to directories".into()));
            }
            if attrs.nlink >= LINK_COUNT_MAX {
                return Err(Error::NotPermitted(format!(
                    "inode {ino} already has {} links",
                    attrs.nlink
                )));
            }
            let linkable = txn.state().inode(ino).is_some_and(|inode| inode.linkable);
            if attrs.nlink == 0 && !linkable {
                return Err(Error::NotFound(format!("inode {ino} was unlinked")));
            }
            if dir_entries(txn.state(), new_parent)?.contains_key(new_name) {
                return Err(Error::Exists(display(new_name)));
            }
            check_not_removed(txn.state(), new_parent)?;
            check_changeable(txn.state(), ino, "linking it")?;
            check_not_immutable(txn.state(), new_parent, "adding an entry")?;
            txn.ensure_metadata_room(100 + new_name.len() as u64)?;
            let now = Timestamp::now();
            update_attrs(txn, ino, |attrs| {
                debug_assert!(attrs.nlink < LINK_COUNT_MAX, "checked in this transaction");
                attrs.nlink += 1;
                attrs.ctime = now;
            });
            txn.apply(Record::DirAdd { dir: new_parent, name: new_name.to_vec(), ino });
            touch_dir(txn, new_parent, 0, now);
            if let Some(inode) = txn.state_mut().inode_mut(ino) {
                // Named once; losing that name again makes an orphan.
                inode.linkable = false;
            }
            self.volume.shared.attr_of(txn.state(), ino)
        })?;
        self.volume.shared.namespace_changed(&[
            NamespaceEvent::Entry { parent: new_parent, name: new_name.to_vec() },
            NamespaceEvent::Attributes { ino },
        ]);
        Ok(attr)
    }

    /// Removes a non-directory name; the inode goes when its last link and
    /// its last open handle are gone.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        let _writing = self.volume.shared.write_gate.start_write();
        let mut unlinked = None;
        self.with_quiesced_victim(parent, name, |victim| {
            let done = self.unlink_entry(parent, name, victim)?;
            unlinked = victim.filter(|_| done);
            if let Some(ino) = unlinked {
                self.volume.shared.free_orphan(ino)?;
            }
            Ok(done)
        })?;
        // Its other names, if any, show one link fewer.
        let mut events = vec![NamespaceEvent::Entry { parent, name: name.to_vec() }];
        events.extend(unlinked.map(|ino| NamespaceEvent::Attributes { ino }));
        self.volume.shared.namespace_changed(&events);
        Ok(())
    }

    /// Returns false, changing nothing, if `name` no longer names `victim`.
    fn unlink_entry(&self, parent: u64, name: &[u8], victim: Option<u64>) -> Result<bool> {
        let inos: Vec<u64> = std::iter::once(parent).chain(victim).collect();
        let (done, _) = self.volume.shared.meta.transact(&inos, |txn| {
            let ino = entry_of(txn.state(), parent, name)?;
            if Some(ino) != victim {
                return Ok(false);
            }
            check_changeable(txn.state(), parent, "removing an entry")?;
            check_changeable(txn.state(), ino, "unlinking it")?;
            if attrs_of(txn.state(), ino)?.kind == InodeKind::Dir {
                return Err(Error::IsDir(display(name)));
            }
            let now = Timestamp::now();
            txn.apply(Record::DirRemove { dir: parent, name: name.to_vec() });
            drop_link(txn, ino, now);
            touch_dir(txn, parent, 0, now);
            Ok(true)
        })?;
        Ok(done)
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        let _writing = self.volume.shared.write_gate.start_write();
        const ATTEMPTS_MAX: usize = 16;
        let meta = &self.volume.shared.meta;
        for _ in 0..ATTEMPTS_MAX {
            let named = entry_of(&meta.view(&[parent]), parent, name)?;
            if self.rmdir_entry(parent, name, named)? {
                self.volume
                    .shared
                    .namespace_changed(&[NamespaceEvent::Entry { parent, name: name.to_vec() }]);
                return Ok(());
            }
        }
        Err(Error::invalid(format!(
            "{}: renamed or replaced concurrently too often",
            display(name)
        )))
    }

    /// Removes `parent`/`name` if it still names directory `named`; false,
    /// changing nothing, if it names another inode now.
    fn rmdir_entry(&self, parent: u64, name: &[u8], named: u64) -> Result<bool> {
        let (done, _) = self.volume.shared.meta.transact(&[parent, named], |txn| {
            let ino = entry_of(txn.state(), parent, name)?;
            if ino != named {
                return Ok(false);
            }
            let entries = dir_entries(txn.state(), ino)?;
            // Before the emptiness check, as the kernel's may_delete.
            check_changeable(txn.state(), parent, "removing an entry")?;
            check_changeable(txn.state(), ino, "removing it")?;
            if !entries.is_empty() {
                return Err(Error::NotEmpty(display(name)));
            }
            let now = Timestamp::now();
            txn.apply(Record::DirRemove { dir: parent, name: name.to_vec() });
            touch_dir(txn, parent, -1, now);
            drop_link(txn, ino, now);
            Ok(true)
        })?;
        Ok(done)
    }

    /// Moves `name` in `parent` to `new_name` in `new_parent`, as renameat2 with `flags`; replaces what is there unless `flags` say otherwise.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        let _writing = self.volume.shared.write_gate.start_write();
        check_name(name)?;
        check_name(new_name)?;
        if flags.exchange && flags.no_replace {
            return Err(Error::invalid("RENAME_EXCHANGE and RENAME_NOREPLACE together"));
        }
        if flags.exchange && flags.whiteout.is_some() {
            return Err(Error::invalid("RENAME_EXCHANGE and RENAME_WHITEOUT together"));
        }
        let meta = &self.volume.shared.meta;
        let moved = entry_of(&meta.view(&[parent]), parent, name).ok();
        let mut replaced = None;
        self.with_quiesced_victim(new_parent, new_name, |victim| {
            let moving = entry_of(&meta.view(&[parent]), parent, name).ok();
            let names = RenameNames { parent, name, new_parent, new_name };
            let done = self.rename_entry(names, flags, moving, victim)?;
            replaced = victim.filter(|_| done);
            if let Some(ino) = replaced.filter(|_| !flags.exchange) {
                self.volume.shared.free_orphan(ino)?;
            }
            Ok(done)
        })?;
        // The moved inode's ctime (and a directory's ".."), and the
        // replaced or exchanged one's link count or name.
        let mut events = vec![
            NamespaceEvent::Entry { parent, name: name.to_vec() },
            NamespaceEvent::Entry { parent: new_parent, name: new_name.to_vec() },
        ];
        events.extend(
            moved.into_iter().chain(replaced).map(|ino| NamespaceEvent::Attributes { ino }),
        );
        self.volume.shared.namespace_changed(&events);
        Ok(())
    }

    /// Returns false, changing nothing, if the source no longer names
    /// `moving` or the target no longer names `victim`.
    fn rename_entry(
        &self,
        names: RenameNames<'_>,
        flags: RenameFlags,
        moving: Option<u64>,
        victim: Option<u64>,
    ) -> Result<bool> {
        let RenameNames { parent, name, new_parent, new_name } = names;
        // `rename` refused these pairs: plan_rename and apply_rename rely on it.
        debug_assert!(!(flags.exchange && (flags.no_replace || flags.whiteout.is_some())));
        let meta = &self.volume.shared.meta;
        let is_dir = |ino: Option<u64>| {
            ino.and_then(|ino| meta.inode(ino))
                .is_some_and(|inode| inode.attrs.kind == InodeKind::Dir)
        };
        let (moving_is_dir, victim_is_dir) = (is_dir(moving), is_dir(victim));
        // A directory that changes parent: its ancestry is checked (it must
        // not go under itself) with the rename mutex held to the end, so no
        // other such rename changes the ancestry meanwhile (the VFS's
        // s_vfs_rename_mutex). Renames within one directory, and of other
        // kinds, need neither.
        let moves_dirs =
            parent != new_parent && (moving_is_dir || (flags.exchange && victim_is_dir));
        let _rename_lock = moves_dirs.then(|| meta.rename_lock());
        let ancestry = RenameAncestry {
            moved_under_itself: moves_dirs
                && moving
                    .is_some_and(|ino| moving_is_dir && is_ancestor_walk(meta, ino, new_parent)),
            victim_under_itself: moves_dirs
                && victim.is_some_and(|ino| victim_is_dir && is_ancestor_walk(meta, ino, parent)),
        };
        let whiteout = flags.whiteout.map(|_| meta.take_ino(false));
        let inos: Vec<u64> =
            [parent, new_parent].into_iter().chain(moving).chain(victim).chain(whiteout).collect();
        let (done, _) = meta.transact(&inos, |txn| {
            if entry_of(txn.state(), new_parent, new_name).ok() != victim {
                return Ok(false);
            }
            let moving_now = entry_of(txn.state(), parent, name).ok();
            if moving_now != moving {
                return Ok(false);
            }
            // The kinds decided on above are the kinds now (an inode never
            // changes kind), so the ancestry answers hold.
            let plan = plan_rename(txn.state(), names, flags, ancestry)?;
            if plan.is_noop {
                return Ok(true);
            }
            let whiteout_bytes = flags.whiteout.map_or(0, |_| 200 + name.len() as u64);
            txn.ensure_metadata_room(300 + new_name.len() as u64 + whiteout_bytes)?;
            apply_rename(txn, &plan, parent, name, new_parent, new_name, flags.exchange);
            if let (Some(owner), Some(ino)) = (flags.whiteout, whiteout) {
                apply_whiteout(txn, parent, name, ino, owner, whiteout_bytes)?;
            }
            Ok(true)
        })?;
        Ok(done)
    }

    /// Runs `change` with the inode that `dir`/`name` names now (which the
    /// change may free) quiesced: no direct I/O in flight and no writeback
    /// running, since a late write would land in blocks the free hands to
    /// another file. `change` returns false when the name moved to another
    /// inode meanwhile; then it runs again with that one.
    fn with_quiesced_victim(
        &self,
        dir: u64,
        name: &[u8],
        mut change: impl FnMut(Option<u64>) -> Result<bool>,
    ) -> Result<()> {
        const ATTEMPTS_MAX: usize = 16;
        for _ in 0..ATTEMPTS_MAX {
            let victim = entry_of(&self.volume.shared.meta.view(&[dir]), dir, name).ok();
            let Some(cached) = victim.and_then(|ino| self.volume.shared.cache.existing_inode(ino))
            else {
                if change(victim)? {
                    return Ok(());
                }
                continue;
            };
            debug_assert_eq!(Some(cached.ino), victim, "the cache entry of another inode");
            let done = {
                let _exclusive = cached.io.exclusive(|| self.volume.shared.engine.device.unplug());
                let _serial = cached.lock_writeback();
                let done = change(victim);
                if self.volume.shared.meta.inode(cached.ino).is_none() {
                    cached.remove_range(0, u64::MAX);
                }
                done
            };
            let ino = cached.ino;
            drop(cached);
            self.volume.shared.cache.release_inode(ino, 0);
            if done? {
                return Ok(());
            }
        }
        Err(Error::invalid(format!(
            "{}: renamed or replaced concurrently too often",
            display(name)
        )))
    }

    /// Makes the inode's changes durable: all of them (fsync), or only those
    /// needed to read its data back (fdatasync).
    pub fn fsync_inode(&self, ino: u64, data_only: bool) -> Result<()> {
        self.volume.shared.fsync_inode(ino, data_only, None)
    }
}

/// The two names of a rename.
#[derive(Clone, Copy)]
struct RenameNames<'a> {
    parent: u64,
    name: &'a [u8],
    new_parent: u64,
    new_name: &'a [u8],
}

/// What the ancestry walk found, before the rename's transaction.
#[derive(Clone, Copy)]
struct RenameAncestry {
    /// The moved directory is the target directory or one of its parents.
    moved_under_itself: bool,
    /// Exchanging: the target directory is the source directory or one of
    /// its parents.
    victim_under_itself: bool,
}

/// What a rename will do, decided before anything changes.
struct RenamePlan {
    ino: u64,
    ino_is_dir: bool,
    /// The inode currently named by the target, if any.
    victim: Option<(u64, bool)>,
    is_noop: bool,
}

fn plan_rename(
    state: &(impl InodeTable + ?Sized),
    names: RenameNames<'_>,
    flags: RenameFlags,
    ancestry: RenameAncestry,
) -> Result<RenamePlan> {
    let RenameNames { parent, name, new_parent, new_name } = names;
    let ino = entry_of(state, parent, name)?;
    let ino_is_dir = attrs_of(state, ino)?.kind == InodeKind::Dir;
    let target_entries = dir_entries(state, new_parent)?;
    check_not_removed(state, new_parent)?;
    let victim = match target_entries.get(new_name) {
        Some(&victim) => Some((victim, attrs_of(state, victim)?.kind == InodeKind::Dir)),
        None => None,
    };
    let same_entry = parent == new_parent && name == new_name;
    if flags.exchange && victim.is_none() {
        return Err(Error::NotFound(display(new_name)));
    }
    if flags.no_replace && victim.is_some() && !same_entry {
        return Err(Error::Exists(display(new_name)));
    }
    if same_entry || victim.is_some_and(|(victim, _)| victim == ino) {
        return Ok(RenamePlan { ino, ino_is_dir, victim, is_noop: true });
    }
    // Before the kinds and emptiness, as the kernel's may_delete.
    check_changeable(state, parent, "removing an entry")?;
    check_changeable(state, ino, "renaming it")?;
    match victim {
        Some((victim, _)) => {
            check_changeable(state, new_parent, "replacing an entry")?;
            check_changeable(state, victim, "replacing it")?;
        }
        None => check_not_immutable(state, new_parent, "adding an entry")?,
    }
    if ino_is_dir && ancestry.moved_under_itself {
        return Err(Error::invalid(format!("cannot move directory {} into itself", display(name))));
    }
    if let Some((victim_ino, victim_is_dir)) = victim {
        if flags.exchange {
            if victim_is_dir && ancestry.victim_under_itself {
                return Err(Error::invalid(
                    "cannot exchange a directory with one of its descendants",
                ));
            }
        } else if ino_is_dir && !victim_is_dir {
            return Err(Error::NotDir(display(new_name)));
        } else if !ino_is_dir && victim_is_dir {
            return Err(Error::IsDir(display(new_name)));
        } else if victim_is_dir && !dir_entries(state, victim_ino)?.is_empty() {
            return Err(Error::NotEmpty(display(new_name)));
        }
    }
    debug_assert!(victim.is_none_or(|(victim, _)| victim != ino), "a rename onto itself");
    debug_assert!(!flags.exchange || victim.is_some(), "an exchange with nothing");
    Ok(RenamePlan { ino, ino_is_dir, victim, is_noop: false })
}

/// Puts a whiteout at `parent`/`name`, which the rename just emptied: the
/// character device 0:0 with mode 0 that overlayfs reads as "deleted below".
fn apply_whiteout(
    txn: &mut Txn<'_>,
    parent: u64,
    name: &[u8],
    ino: u64,
    owner: Owner,
    extra: u64,
) -> Result<()> {
    if txn.state().inode(ino).is_some() {
        return Err(Error::NoSpace("no inode numbers left".into()));
    }
    debug_assert!(
        dir_entries(txn.state(), parent).is_ok_and(|entries| !entries.contains_key(name)),
        "a whiteout over an entry the rename left"
    );
    let now = Timestamp::now();
    let kind = InodeKind::CharDevice;
    let new = NewInode { ino, kind, mode: 0, owner, nlink: 1, size: 0, now };
    apply_new_inode(txn, parent, new, extra)?;
    txn.apply(Record::DirAdd { dir: parent, name: name.to_vec(), ino });
    touch_dir(txn, parent, 0, now);
    Ok(())
}

fn apply_rename(
    txn: &mut Txn<'_>,
    plan: &RenamePlan,
    parent: u64,
    name: &[u8],
    new_parent: u64,
    new_name: &[u8],
    exchange: bool,
) {
    debug_assert!(!plan.is_noop, "a rename that changes nothing applied");
    let now = Timestamp::now();
    let moves_dir = |txn: &mut Txn<'_>, dir: u64, from: u64, to: u64| {
        if from != to {
            update_attrs(txn, dir, |attrs| attrs.parent = to);
            touch_dir(txn, from, -1, now);
            touch_dir(txn, to, 1, now);
        }
    };
    if exchange {
        let (victim, victim_is_dir) = plan.victim.expect("exchange has a target");
        txn.apply(Record::DirAdd { dir: parent, name: name.to_vec(), ino: victim });
        txn.apply(Record::DirAdd { dir: new_parent, name: new_name.to_vec(), ino: plan.ino });
        if plan.ino_is_dir {
            moves_dir(txn, plan.ino, parent, new_parent);
        }
        if victim_is_dir {
            moves_dir(txn, victim, new_parent, parent);
        }
        update_attrs(txn, victim, |attrs| attrs.ctime = now);
    } else {
        txn.apply(Record::DirRemove { dir: parent, name: name.to_vec() });
        txn.apply(Record::DirAdd { dir: new_parent, name: new_name.to_vec(), ino: plan.ino });
        if let Some((victim, victim_is_dir)) = plan.victim {
            if victim_is_dir {
                touch_dir(txn, new_parent, -1, now);
            }
            drop_link(txn, victim, now);
        }
        if plan.ino_is_dir {
            moves_dir(txn, plan.ino, parent, new_parent);
        }
    }
    update_attrs(txn, plan.ino, |attrs| attrs.ctime = now);
    touch_dir(txn, parent, 0, now);
    if new_parent != parent {
        touch_dir(txn, new_parent, 0, now);
    }
}
