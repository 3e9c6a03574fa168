//! Offline consistency check. Loads the volume read-only (checkpoint +
//! journal replay, in memory; nothing is written) and checks every
//! cross-reference the format relies on.

use std::collections::HashMap;
use std::sync::Arc;

use crate::dev::Device;
use crate::format::{InodeKind, ROOT_INO, XATTR_LIST_BYTES_MAX};
use crate::layout;
use crate::meta::{InodeBody, LoadReport, MetaView};
use crate::options::VolumeOptions;
use crate::vfs::Volume;

#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    /// Inconsistencies; empty means clean.
    pub problems: Vec<String>,
    /// Facts worth knowing that are not problems (orphans freed at next mount).
    pub notes: Vec<String>,
    pub load: Option<LoadReport>,
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes.
    pub special_files: u64,
    pub extents: u64,
    /// Extended attributes, and the bytes of their names and values.
    pub xattrs: u64,
    pub xattr_bytes: u64,
    pub data_blocks_used: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the volume on `device`. Never fails: whatever cannot be read or
/// loaded is reported as a problem.
pub fn check(device: Arc<Device>) -> FsckReport {
    let mut report = FsckReport::default();
    check_superblock_copies(&device, &mut report);
    let options =
        VolumeOptions { read_only: true, commit_interval_ms: 0, ..VolumeOptions::default() };
    let volume = match Volume::open_device(device, &options) {
        Ok(volume) => volume,
        Err(error) => {
            report.problems.push(format!("cannot load the volume: {error}"));
            return report;
        }
    };
    report.load = Some(volume.load_report());
    if let Err(error) = volume.shared.meta.check_index() {
        report.problems.push(format!("metadata index: {error}"));
    }
    // Every inode, for the cross-checks: as much memory as format 2 keeps.
    if let Err(error) = volume.shared.meta.make_all_resident() {
        report.problems.push(format!("metadata index: {error}"));
        return report;
    }
    if let Err(error) = volume.shared.meta.check_free_space() {
        report.problems.push(error);
    }
    let state = volume.shared.meta.view_all();
    check_tree(&state, &mut report);
    report
}

fn check_superblock_copies(device: &Device, report: &mut FsckReport) {
    let copies = layout::read_superblock_copies(device);
    match (copies.a, copies.b) {
        (Some(Ok(a)), Some(Ok(b))) if a != b => {
            report.problems.push("superblock copies differ".into())
        }
        (Some(Ok(_)), Some(Ok(_))) => {}
        (Some(Ok(_)), _) => report.problems.push("superblock copy B is missing or damaged".into()),
        (Some(Err(error)), Some(Ok(_))) => {
            report.problems.push(format!("superblock copy A: {error}"))
        }
        (Some(Err(error)), _) => report.problems.push(format!("no valid superblock: {error}")),
        (None, _) => report.problems.push("no valid superblock: the device is too small".into()),
    }
}

/// Checks links, parents, reachability and symlinks.
fn check_tree(state: &MetaView<'_>, report: &mut FsckReport) {
    let Some(root) = state.inode(ROOT_INO) else {
        report.problems.push("the root directory is missing".into());
        return;
    };
    if root.attrs.kind != InodeKind::Dir || root.attrs.parent != ROOT_INO {
        report.problems.push("the root is not a directory that is its own parent".into());
    }
    let mut references: HashMap<u64, Vec<u64>> = HashMap::new();
    for (dir, inode) in state.inodes() {
        let Some(entries) = inode.entries() else {
            continue;
        };
        for (name, &target) in entries {
            if state.inode(target).is_none() {
                let name = String::from_utf8_lossy(name);
                report
                    .problems
                    .push(format!("directory {dir}: entry {name:?} names missing inode {target}"));
            }
            references.entry(target).or_default().push(dir);
        }
    }
    let mut inos: Vec<u64> = state.inodes().map(|(ino, _)| ino).collect();
    inos.sort_unstable();
    for ino in inos {
        let inode = state.inode(ino).expect("listed");
        let parents = references.get(&ino).map_or(&[][..], Vec::as_slice);
        count_inode(inode, report);
        match &inode.body {
            InodeBody::Dir(entries) => check_dir(
                state,
                ino,
                inode.attrs.nlink,
                inode.attrs.parent,
                entries,
                parents,
                report,
            ),
            InodeBody::Symlink(target) if target.is_empty() => {
                report.problems.push(format!("symlink {ino} has no target"));
            }
            _ => check_links(ino, inode.attrs.nlink, parents.len(), report),
        }
        check_xattrs(ino, inode, report);
    }
    check_reachable(state, report);
}

fn count_inode(inode: &crate::meta::Inode, report: &mut FsckReport) {
    match &inode.body {
        InodeBody::File(extents) => {
            report.files += 1;
            report.extents += extents.len() as u64;
            report.data_blocks_used += extents.iter().map(|extent| extent.block_count).sum::<u64>();
        }
        InodeBody::Dir(_) => report.directories += 1,
        InodeBody::Symlink(_) => report.symlinks += 1,
        InodeBody::Special { .. } => report.special_files += 1,
    }
    report.xattrs += inode.xattrs.len() as u64;
    report.xattr_bytes +=
        inode.xattrs.iter().map(|(name, value)| (name.len() + value.len()) as u64).sum::<u64>();
}

/// Rules the live path keeps that replay does not check: user attributes
/// only on regular files and directories (as the kernel allows them), a
/// default ACL only on directories, ACLs that decode, and listxattr's 64 KiB
/// fits every name.
fn check_xattrs(ino: u64, inode: &crate::meta::Inode, report: &mut FsckReport) {
    let kind = inode.attrs.kind;
    let holds_user = matches!(kind, InodeKind::File | InodeKind::Dir);
    for name in inode.xattrs.keys() {
        let shown = String::from_utf8_lossy(name);
        if name.starts_with(b"user.") && !holds_user {
            report.problems.push(format!("inode {ino} ({kind:?}) holds user attribute {shown:?}"));
        }
        if name.as_slice() == b"system.posix_acl_default" && kind != InodeKind::Dir {
            report.problems.push(format!("inode {ino} ({kind:?}) holds a default ACL"));
        }
        if name.starts_with(b"system.posix_acl_") && !crate::vfs::is_valid_acl(&inode.xattrs[name])
        {
            report.problems.push(format!("inode {ino}: {shown} is not a valid ACL"));
        }
    }
    let list_bytes = inode.xattr_list_bytes();
    if list_bytes > XATTR_LIST_BYTES_MAX {
        report.problems.push(format!(
            "inode {ino}: its attribute names take {list_bytes} bytes, more than listxattr \
             returns ({XATTR_LIST_BYTES_MAX})"
        ));
    }
}

fn check_links(ino: u64, nlink: u32, names: usize, report: &mut FsckReport) {
    if nlink == 0 && names == 0 {
        report.notes.push(format!(
            "inode {ino} is an orphan (unlinked while open); the next mount frees it"
        ));
    } else if nlink as usize != names {
        report.problems.push(format!("inode {ino} has link count {nlink} but {names} names"));
    }
}

fn check_dir(
    state: &MetaView<'_>,
    ino: u64,
    nlink: u32,
    parent: u64,
    entries: &std::collections::BTreeMap<Vec<u8>, u64>,
    parents: &[u64],
    report: &mut FsckReport,
) {
    if nlink == 0 && parents.is_empty() && entries.is_empty() && ino != ROOT_INO {
        report.notes.push(format!(
            "directory {ino} is an orphan (removed while open); the next mount frees it"
        ));
        return;
    }
    let expected_names = usize::from(ino != ROOT_INO);
    if parents.len() != expected_names {
        report.problems.push(format!(
            "directory {ino} has {} names (expected {expected_names})",
            parents.len()
        ));
    } else if ino != ROOT_INO && parents[0] != parent {
        report.problems.push(format!(
            "directory {ino} records parent {parent} but is named in {}",
            parents[0]
        ));
    }
    let subdirs = entries
        .values()
        .filter(|&&child| {
            state.inode(child).is_some_and(|inode| inode.attrs.kind == InodeKind::Dir)
        })
        .count();
    if nlink as usize != 2 + subdirs {
        report
            .problems
            .push(format!("directory {ino} has link count {nlink}, expected {}", 2 + subdirs));
    }
}

fn check_reachable(state: &MetaView<'_>, report: &mut FsckReport) {
    let mut seen = std::collections::HashSet::from([ROOT_INO]);
    let mut stack = vec![ROOT_INO];
    while let Some(dir) = stack.pop() {
        let Some(entries) = state.inode(dir).and_then(|inode| inode.entries()) else {
            continue;
        };
        for &child in entries.values() {
            if seen.insert(child) {
                stack.push(child);
            }
        }
    }
    let unreachable =
        state.inodes().filter(|(ino, inode)| !seen.contains(ino) && inode.attrs.nlink > 0).count();
    if unreachable > 0 {
        report
            .problems
            .push(format!("{unreachable} linked inodes are not reachable from the root"));
    }
}
