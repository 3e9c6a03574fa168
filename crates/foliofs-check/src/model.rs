//! What the checkers compare against.

use std::collections::{BTreeMap, HashSet};

use foliofs::FallocateMode;
use foliofs::{InodeKind, OpenFlags, Privilege, Volume};

use crate::ROOT;

/// What a recovered tree holds: path -> (ino, kind, content for files,
/// target for symbolic links).
pub type Tree = BTreeMap<String, (u64, InodeKind, Vec<u8>)>;

/// Which byte values each offset of an inode was ever given. Zero is always
/// allowed (holes, truncation, fallocate); anything else must have been
/// written at that offset (or shifted there by COLLAPSE/INSERT_RANGE).
#[derive(Default, Clone, Debug)]
pub struct ByteHistory {
    allowed: Vec<[u64; 4]>,
}

impl ByteHistory {
    pub fn record(&mut self, pos: usize, data: &[u8]) {
        if self.allowed.len() < pos + data.len() {
            self.allowed.resize(pos + data.len(), [1, 0, 0, 0]);
        }
        for (index, &byte) in data.iter().enumerate() {
            self.allowed[pos + index][usize::from(byte / 64)] |= 1 << (byte % 64);
        }
    }

    pub fn allows(&self, pos: usize, byte: u8) -> bool {
        byte == 0
            || self
                .allowed
                .get(pos)
                .is_some_and(|bits| bits[usize::from(byte / 64)] & (1 << (byte % 64)) != 0)
    }

    /// The first offset of `content` holding a byte never given there.
    pub fn first_foreign(&self, content: &[u8]) -> Option<usize> {
        (0..content.len()).find(|&pos| !self.allows(pos, content[pos]))
    }
}

/// Applies a fallocate to a byte-vector model of a file, as the kernel does.
pub fn apply_fallocate(model: &mut Vec<u8>, mode: FallocateMode, offset: usize, length: usize) {
    let end = offset + length;
    let zero = |model: &mut Vec<u8>| {
        let stop = end.min(model.len());
        if offset < stop {
            model[offset..stop].fill(0);
        }
    };
    match mode {
        FallocateMode::Allocate { keep_size } => {
            if !keep_size && end > model.len() {
                model.resize(end, 0);
            }
        }
        FallocateMode::PunchHole => zero(model),
        FallocateMode::ZeroRange { keep_size } => {
            zero(model);
            if !keep_size && end > model.len() {
                model.resize(end, 0);
            }
        }
        FallocateMode::CollapseRange => {
            model.drain(offset..end);
        }
        FallocateMode::InsertRange => {
            let tail = model.split_off(offset);
            model.resize(offset + length, 0);
            model.extend_from_slice(&tail);
        }
    }
}

/// Whether `[a, a + len)` and `[b, b + len)` meet.
pub fn overlaps(a: u64, b: u64, len: u64) -> bool {
    a < b + len && b < a + len
}

/// What FICLONERANGE (and, with `inside_both`, FIDEDUPERANGE) must answer
/// for these ranges by `File::clone_range_from`'s rules: the length
/// covered (0 resolved to the source's end), or None for EINVAL.
#[allow(clippy::too_many_arguments)]
pub fn clone_rule(
    block: u64,
    src_size: u64,
    dst_size: u64,
    same_file: bool,
    src_pos: u64,
    dst_pos: u64,
    len: u64,
    inside_both: bool,
) -> Option<u64> {
    if src_pos > src_size {
        return None;
    }
    let len = if len == 0 { src_size - src_pos } else { len };
    let (src_end, dst_end) = (src_pos + len, dst_pos + len);
    let unaligned = !src_pos.is_multiple_of(block) || !dst_pos.is_multiple_of(block);
    let tail_allowed = src_end == src_size && dst_end >= dst_size;
    let rounded = len.div_ceil(block) * block;
    if src_end > src_size
        || (inside_both && dst_end > dst_size)
        || unaligned
        || (!len.is_multiple_of(block) && !tail_allowed)
        || (same_file && overlaps(src_pos, dst_pos, rounded))
    {
        return None;
    }
    Some(len)
}

/// What copy_file_range must answer: the bytes copied, or None for EINVAL.
pub fn copy_rule(
    src_size: u64,
    same_file: bool,
    src_pos: u64,
    dst_pos: u64,
    len: u64,
) -> Option<u64> {
    let len = len.min(src_size.saturating_sub(src_pos));
    if len > 0 && same_file && overlaps(src_pos, dst_pos, len) {
        return None;
    }
    Some(len)
}

/// Reads every file and directory under the root. The contents of inodes
/// in `skip` are not read (left empty), to save time on big fixed files.
pub fn read_tree(volume: &Volume, skip: &HashSet<u64>) -> Result<Tree, String> {
    let mut tree = Tree::new();
    let mut stack = vec![(String::new(), ROOT)];
    while let Some((path, dir)) = stack.pop() {
        let entries =
            volume.inodes().readdir(dir).map_err(|error| format!("readdir {path}/: {error}"))?;
        for entry in entries {
            let child = format!("{path}/{}", String::from_utf8_lossy(&entry.name));
            let content = match entry.kind {
                InodeKind::File if !skip.contains(&entry.ino) => read_file(volume, entry.ino)
                    .map_err(|error| format!("read {child}: {error}"))?,
                InodeKind::Dir => {
                    stack.push((child.clone(), entry.ino));
                    Vec::new()
                }
                InodeKind::Symlink => volume
                    .inodes()
                    .readlink(entry.ino)
                    .map_err(|error| format!("readlink {child}: {error}"))?,
                _ => Vec::new(),
            };
            tree.insert(child, (entry.ino, entry.kind, content));
        }
    }
    Ok(tree)
}

/// The extended attributes of `ino`, all namespaces.
pub fn read_xattrs(volume: &Volume, ino: u64) -> Result<crate::workload::Xattrs, String> {
    let names = volume
        .inodes()
        .list_xattr(ino, Privilege::SysAdmin)
        .map_err(|error| format!("listxattr of inode {ino}: {error}"))?;
    names
        .into_iter()
        .map(|name| {
            let value = volume
                .inodes()
                .get_xattr(ino, &name, Privilege::SysAdmin)
                .map_err(|error| format!("getxattr of inode {ino}: {error}"))?;
            Ok((name, value))
        })
        .collect()
}

/// The extended attributes of every inode in `tree`.
pub fn read_tree_xattrs(
    volume: &Volume,
    tree: &Tree,
) -> Result<BTreeMap<u64, crate::workload::Xattrs>, String> {
    let mut out = BTreeMap::new();
    for (ino, _, _) in tree.values() {
        if !out.contains_key(ino) {
            out.insert(*ino, read_xattrs(volume, *ino)?);
        }
    }
    Ok(out)
}

/// A whole file, read through the cache.
pub fn read_file(volume: &Volume, ino: u64) -> foliofs::Result<Vec<u8>> {
    let size = volume.inodes().getattr(ino)?.size as usize;
    let mut content = vec![0u8; size];
    let file = volume.inodes().open_file(ino, OpenFlags::READ)?;
    let mut done = 0;
    while done < size {
        let read = file.read_at(&mut content[done..], done as u64)?;
        if read == 0 {
            return Err(foliofs::Error::invalid(format!(
                "short read: {done} of {size} bytes inside the size"
            )));
        }
        done += read;
    }
    Ok(content)
}

/// The first difference between two trees, in words.
pub fn tree_diff(expected: &Tree, found: &Tree) -> String {
    for (path, entry) in expected {
        match found.get(path) {
            None => return format!("{path} missing"),
            Some(other) if other != entry => {
                let first_byte = entry.2.iter().zip(&other.2).position(|(a, b)| a != b);
                return format!(
                    "{path} differs (ino {} vs {}, {} vs {} bytes, first differing byte {:?})",
                    entry.0,
                    other.0,
                    entry.2.len(),
                    other.2.len(),
                    first_byte
                );
            }
            _ => {}
        }
    }
    let extra: Vec<&String> = found.keys().filter(|path| !expected.contains_key(*path)).collect();
    format!("extra entries {extra:?}")
}

/// The entries of `tree` at or under `base` ("" is everything) but the one
/// at `except` (never copied: the crash checker's ballast file is most of
/// the volume).
pub fn subtree(tree: &Tree, base: &str, except: Option<&str>) -> Tree {
    let prefix = format!("{base}/");
    tree.iter()
        .filter(|(path, _)| base.is_empty() || path.as_str() == base || path.starts_with(&prefix))
        .filter(|(path, _)| Some(path.as_str()) != except)
        .map(|(path, entry)| (path.clone(), entry.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_allows_zero_and_what_was_written() {
        let mut history = ByteHistory::default();
        history.record(2, &[7, 8]);
        assert!(history.allows(0, 0) && history.allows(100, 0));
        assert!(history.allows(2, 7) && history.allows(3, 8));
        assert!(!history.allows(2, 8) && !history.allows(1, 7) && !history.allows(9, 1));
        assert_eq!(history.first_foreign(&[0, 0, 7, 7]), Some(3));
    }

    #[test]
    fn fallocate_model_shifts_and_zeroes() {
        let mut model: Vec<u8> = (1..=8).collect();
        apply_fallocate(&mut model, FallocateMode::CollapseRange, 2, 2);
        assert_eq!(model, [1, 2, 5, 6, 7, 8]);
        apply_fallocate(&mut model, FallocateMode::InsertRange, 2, 2);
        assert_eq!(model, [1, 2, 0, 0, 5, 6, 7, 8]);
        apply_fallocate(&mut model, FallocateMode::PunchHole, 6, 10);
        assert_eq!(model, [1, 2, 0, 0, 5, 6, 0, 0]);
        apply_fallocate(&mut model, FallocateMode::ZeroRange { keep_size: false }, 7, 3);
        assert_eq!(model.len(), 10);
        apply_fallocate(&mut model, FallocateMode::Allocate { keep_size: true }, 0, 20);
        assert_eq!(model.len(), 10);
    }
}
