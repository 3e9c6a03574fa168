//! Running one op on the volume and on the thread's model together, and
//! what the crash checks may then expect of it.

use foliofs::dev::AlignedBuf;
use foliofs::FallocateMode;
use foliofs::{OpenFlags, Privilege, RenameFlags, Volume, XattrFlags};

use super::{xattr_name, CloneMode, InodeModel, Op, SpanKind, ThreadModel};
use crate::model::{apply_fallocate, clone_rule, copy_rule, read_file, read_xattrs};
use crate::{owner, pattern, SECTOR_BYTES};

pub(super) type Executed = Result<(Vec<u64>, SpanKind), String>;

fn skipped() -> Executed {
    Ok((Vec::new(), SpanKind::Other))
}

fn dsync_kind(durable: bool, ino: u64, pos: u64, data: Vec<u8>) -> SpanKind {
    if durable {
        SpanKind::DsyncWrite { ino, pos, data }
    } else {
        SpanKind::Other
    }
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').expect("absolute path")
}

/// Metadata room below which a refusal for want of space is believed: more
/// than any one operation's records (a few extent records of up to 59 bytes
/// and an inode's) and the other threads' at the same time.
const METADATA_SHORT_BYTES: u64 = 16 << 10;

fn open(volume: &Volume, ino: u64, flags: OpenFlags) -> Result<foliofs::File, String> {
    volume.inodes().open_file(ino, flags).map_err(|error| format!("open inode {ino}: {error}"))
}

impl ThreadModel {
    /// Runs `op` on the volume and the model. Ops that do not fit the
    /// model (after shrinking removed what they needed) are skipped.
    pub fn execute(&mut self, volume: &Volume, op: &Op) -> Executed {
        match op {
            Op::Create { path } | Op::Mkdir { path } => {
                let (dir_path, name) = split(path);
                let Some(dir) = self.dir_ino(dir_path) else { return skipped() };
                if self.exists(path) {
                    return skipped();
                }
                if matches!(op, Op::Mkdir { .. }) {
                    let attr = volume
                        .inodes()
                        .mkdir(dir, name.as_bytes(), 0o755, owner())
                        .map_err(|error| format!("mkdir: {error}"))?;
                    self.dirs.push((path.clone(), attr.ino));
                    return Ok((vec![dir, attr.ino], SpanKind::Other));
                }
                let attr = volume
                    .inodes()
                    .create(dir, name.as_bytes(), 0o644, owner())
                    .map_err(|error| format!("create: {error}"))?;
                self.files.insert(path.clone(), attr.ino);
                self.inodes.insert(attr.ino, InodeModel::new(false));
                Ok((vec![dir, attr.ino], SpanKind::Other))
            }
            Op::Write { path, pos, len, data, direct, dsync } => {
                let Some(&ino) = self.files.get(path) else { return skipped() };
                let data = pattern(*data, *len);
                let whole = self.write(volume, ino, *pos, &data, *direct, *dsync)?;
                Ok((vec![ino], dsync_kind(*dsync && whole, ino, *pos, data)))
            }
            Op::Append { path, len, data, direct, dsync } => {
                let Some(&ino) = self.logs.get(path) else { return skipped() };
                let pos = self.inodes[&ino].content.len() as u64;
                let direct = *direct && pos.is_multiple_of(u64::from(SECTOR_BYTES));
                let data = pattern(*data, *len);
                let whole = self.write(volume, ino, pos, &data, direct, *dsync)?;
                Ok((vec![ino], dsync_kind(*dsync && whole, ino, pos, data)))
            }
            Op::Truncate { path, size } => {
                let Some(&ino) = self.files.get(path) else { return skipped() };
                let file = open(volume, ino, OpenFlags::WRITE)?;
                if let Err(error) = file.set_len(*size) {
                    // Cutting into a shared block copies it (XFS's ftruncate
                    // on a reflinked file can fail so too): on a full volume
                    // that is refused, with the file as it was.
                    // Cutting into a shared block, or growing from an end
                    // of file inside one (its tail is zeroed), copies it.
                    let block = u64::from(volume.statfs().block_bytes);
                    let old_size = self.inodes[&ino].content.len() as u64;
                    let zeroes_in_a_block = if *size < old_size {
                        !size.is_multiple_of(block)
                    } else {
                        !old_size.is_multiple_of(block)
                    };
                    if error.errno() != libc::ENOSPC || !zeroes_in_a_block {
                        return Err(format!("truncate: {error}"));
                    }
                    self.judge_no_space(volume, 1, &error)?;
                    let now =
                        read_file(volume, ino).map_err(|error| format!("read back: {error}"))?;
                    if now != self.inodes[&ino].content {
                        return Err(format!("truncate refused ({error}) but changed the file"));
                    }
                    return skipped();
                }
                let inode = self.inodes.get_mut(&ino).expect("known");
                inode.content.resize(*size as usize, 0);
                inode.sizes_seen.insert(*size);
                Ok((vec![ino], SpanKind::Other))
            }
            Op::Fallocate { path, mode, offset, len } => {
                self.fallocate_op(volume, path, *mode, *offset, *len)
            }
            Op::Rename { from, to } => self.rename_op(volume, from, to),
            Op::Link { from, to } => {
                let Some(ino) = self.files.get(from).copied().or_else(|| self.symlink_ino(from))
                else {
                    return skipped();
                };
                let (to_dir_path, to_name) = split(to);
                let Some(to_dir) = self.dir_ino(to_dir_path) else { return skipped() };
                if self.exists(to) {
                    return skipped();
                }
                volume
                    .inodes()
                    .link(ino, to_dir, to_name.as_bytes())
                    .map_err(|error| format!("link: {error}"))?;
                if let Some(link) = self.symlinks.get(from).cloned() {
                    self.symlinks.insert(to.clone(), link);
                } else {
                    self.files.insert(to.clone(), ino);
                }
                Ok((vec![ino, to_dir], SpanKind::Other))
            }
            Op::Unlink { path } => {
                let Some(ino) = self.files.get(path).copied().or_else(|| self.symlink_ino(path))
                else {
                    return skipped();
                };
                let (dir_path, name) = split(path);
                let dir = self.dir_ino(dir_path).expect("a file's directory is known");
                volume
                    .inodes()
                    .unlink(dir, name.as_bytes())
                    .map_err(|error| format!("unlink: {error}"))?;
                self.files.remove(path);
                self.symlinks.remove(path);
                Ok((vec![ino, dir], SpanKind::Other))
            }
            Op::Symlink { path, target } => {
                let (dir_path, name) = split(path);
                let Some(dir) = self.dir_ino(dir_path) else { return skipped() };
                if self.exists(path) {
                    return skipped();
                }
                let attr = volume
                    .inodes()
                    .symlink(dir, name.as_bytes(), target.as_bytes(), owner())
                    .map_err(|error| format!("symlink: {error}"))?;
                self.symlinks.insert(path.clone(), (attr.ino, target.clone()));
                Ok((vec![dir, attr.ino], SpanKind::Other))
            }
            Op::RenameDir { from, to } => self.rename_dir_op(volume, from, to),
            Op::Rmdir { path } => {
                let Some(ino) = self.dir_ino(path).filter(|_| *path != self.base) else {
                    return skipped();
                };
                let (parent_path, name) = split(path);
                let parent = self.dir_ino(parent_path).expect("a directory's parent is known");
                let result = volume.inodes().rmdir(parent, name.as_bytes());
                if !self.is_empty_dir(path) {
                    return match result {
                        Err(error) if error.errno() == libc::ENOTEMPTY => skipped(),
                        Err(error) => Err(format!("rmdir of a non-empty directory: {error}")),
                        Ok(()) => Err("rmdir removed a directory that is not empty".into()),
                    };
                }
                result.map_err(|error| format!("rmdir: {error}"))?;
                self.dirs.retain(|(dir, _)| dir != path);
                Ok((vec![parent, ino], SpanKind::Other))
            }
            Op::FsyncDir { path } => {
                let Some(ino) = self.dir_ino(path) else { return skipped() };
                volume
                    .inodes()
                    .fsync_inode(ino, false)
                    .map_err(|error| format!("fsync dir: {error}"))?;
                Ok((Vec::new(), SpanKind::FsyncDir { ino }))
            }
            Op::Fsync { path, data_only } => self.fsync_op(volume, path, *data_only),
            Op::Sync => {
                volume.sync().map_err(|error| format!("syncfs: {error}"))?;
                Ok((Vec::new(), SpanKind::Sync(self.tree())))
            }
            Op::Checkpoint => {
                volume.checkpoint().map_err(|error| format!("checkpoint: {error}"))?;
                Ok((Vec::new(), SpanKind::Other))
            }
            Op::SetXattr { path, name, len, data } => {
                let Some(&ino) = self.files.get(path).or_else(|| self.logs.get(path)) else {
                    return skipped();
                };
                let (name, value) = (xattr_name(*name), pattern(*data, *len));
                volume
                    .inodes()
                    .set_xattr(ino, &name, &value, XattrFlags::default(), Privilege::Unprivileged)
                    .map_err(|error| format!("setxattr: {error}"))?;
                let inode = self.inodes.get_mut(&ino).expect("known");
                inode.xattrs.insert(name, value);
                inode.xattr_states.push(inode.xattrs.clone());
                Ok((vec![ino], SpanKind::Other))
            }
            Op::RemoveXattr { path, name } => {
                let Some(&ino) = self.files.get(path).or_else(|| self.logs.get(path)) else {
                    return skipped();
                };
                let name = xattr_name(*name);
                let inode = self.inodes.get_mut(&ino).expect("known");
                if !inode.xattrs.contains_key(&name) {
                    return skipped();
                }
                volume
                    .inodes()
                    .remove_xattr(ino, &name, Privilege::Unprivileged)
                    .map_err(|error| format!("removexattr: {error}"))?;
                inode.xattrs.remove(&name);
                inode.xattr_states.push(inode.xattrs.clone());
                Ok((vec![ino], SpanKind::Other))
            }
            Op::CloneRange { mode, from, to, src_pos, dst_pos, len } => {
                let (Some(&src), Some(&dst)) = (self.files.get(from), self.files.get(to)) else {
                    return skipped();
                };
                self.clone_range_op(volume, *mode, (src, *src_pos), (dst, *dst_pos), *len)
            }
        }
    }

    /// A clone, dedupe or copy from `src` into `dst`, each an inode and an
    /// offset. What the call must answer is worked out from the model
    /// first (the engine's rules are FICLONERANGE's, FIDEDUPERANGE's and
    /// copy_file_range(2)'s), so a wrong refusal, a wrong length or a
    /// dedupe that disagrees with the bytes fails the workload live.
    fn clone_range_op(
        &mut self,
        volume: &Volume,
        mode: CloneMode,
        (src, src_pos): (u64, u64),
        (dst, dst_pos): (u64, u64),
        len: u64,
    ) -> Executed {
        let block = u64::from(volume.statfs().block_bytes);
        let source = self.inodes[&src].content.clone();
        let (src_bytes, dst_bytes) = (source.len() as u64, self.inodes[&dst].content.len() as u64);
        let same_file = src == dst;
        let expected = match mode {
            CloneMode::Copy => copy_rule(src_bytes, same_file, src_pos, dst_pos, len),
            CloneMode::Clone | CloneMode::Dedupe => {
                let dedupe = mode == CloneMode::Dedupe;
                let rule = clone_rule(
                    block, src_bytes, dst_bytes, same_file, src_pos, dst_pos, len, dedupe,
                );
                rule.map(|length| {
                    // A dedupe's ranges lie inside both files (the rule).
                    let target = &self.inodes[&dst].content;
                    let (src_end, dst_end) = (src_pos + length, dst_pos + length);
                    let differ = || {
                        source[src_pos as usize..src_end as usize]
                            != target[dst_pos as usize..dst_end as usize]
                    };
                    if dedupe && differ() {
                        0
                    } else {
                        length
                    }
                })
            }
        };
        let source_file = open(volume, src, OpenFlags::READ)?;
        let target_file = open(volume, dst, OpenFlags::WRITE)?;
        let result = match mode {
            CloneMode::Clone => target_file.clone_range_from(&source_file, src_pos, dst_pos, len),
            CloneMode::Dedupe => target_file.dedupe_range_from(&source_file, src_pos, dst_pos, len),
            CloneMode::Copy => target_file.copy_range_from(&source_file, src_pos, dst_pos, len),
        };
        drop((source_file, target_file));
        let unchanged = |model: &Self| -> Result<(), String> {
            for ino in [src, dst] {
                let now = read_file(volume, ino).map_err(|error| format!("read back: {error}"))?;
                if now != model.inodes[&ino].content {
                    return Err(format!("the refused {mode:?} changed inode {ino}"));
                }
            }
            Ok(())
        };
        let done = match (result, expected) {
            (Ok(done), Some(length)) if done == length => done,
            (Ok(done), Some(length)) if mode == CloneMode::Copy && done < length => {
                // Cut short for want of space: adopted below.
                done
            }
            (Ok(done), Some(length)) => {
                return Err(format!("{mode:?} answered {done} bytes where {length} were due"));
            }
            (Ok(done), None) => {
                return Err(format!("{mode:?} of {done} bytes accepted what its rules refuse"));
            }
            (Err(error), None) if error.errno() == libc::EINVAL => {
                unchanged(self)?;
                return skipped();
            }
            (Err(error), Some(length))
                if error.errno() == libc::ENOSPC && mode != CloneMode::Dedupe =>
            {
                self.judge_no_space(volume, length.div_ceil(block) + 2, &error)?;
                let Some(data) = source.get(src_pos as usize..(src_pos + length) as usize) else {
                    return Err(format!("{mode:?}: {error}, where the model has nothing to copy"));
                };
                self.adopt_partial(volume, dst, dst_pos as usize, data)?;
                self.inodes.get_mut(&dst).expect("known").history.record(dst_pos as usize, data);
                return Ok((vec![dst], SpanKind::Other));
            }
            (Err(error), _) => return Err(format!("{mode:?}: {error}")),
        };
        // A copy starting at or past the source's end copies nothing
        // (copy_file_range(2)), so the slice is empty there; bytes done
        // past the end the model knows are a violation, never a panic.
        let range = src_pos as usize..(src_pos + done) as usize;
        let data: &[u8] = match source.get(range) {
            _ if done == 0 => &[],
            Some(data) => data,
            None => {
                return Err(format!(
                    "{mode:?} answered {done} bytes from offset {src_pos} of inode {src}, \
                     whose model holds {src_bytes} bytes"
                ))
            }
        };
        let inode = self.inodes.get_mut(&dst).expect("known");
        inode.history.record(dst_pos as usize, data);
        let (start, end) = (dst_pos as usize, (dst_pos + done) as usize);
        if done > 0 && mode != CloneMode::Dedupe {
            if inode.content.len() < end {
                inode.content.resize(end, 0);
            }
            inode.content[start..end].copy_from_slice(data);
            inode.sizes_seen.insert(inode.content.len() as u64);
        }
        let live = read_file(volume, dst).map_err(|error| format!("read back: {error}"))?;
        if live != self.inodes[&dst].content {
            let at = live.iter().zip(&self.inodes[&dst].content).position(|(a, b)| a != b);
            return Err(format!(
                "after the {mode:?} the file differs from the model: {} vs {} bytes, first \
                 difference at {at:?}",
                live.len(),
                self.inodes[&dst].content.len()
            ));
        }
        Ok((vec![dst], SpanKind::Other))
    }

    fn fallocate_op(
        &mut self,
        volume: &Volume,
        path: &str,
        mode: FallocateMode,
        offset: u64,
        len: u64,
    ) -> Executed {
        let Some(&ino) = self.files.get(path) else { return skipped() };
        let file = open(volume, ino, OpenFlags::WRITE)?;
        match file.fallocate(mode, offset, len) {
            Ok(()) => {
                let inode = self.inodes.get_mut(&ino).expect("known");
                apply_fallocate(&mut inode.content, mode, offset as usize, len as usize);
                // Shifted bytes were given at their new offsets too.
                inode.history.record(0, &inode.content);
                inode.sizes_seen.insert(inode.content.len() as u64);
                Ok((vec![ino], SpanKind::Other))
            }
            Err(error) if matches!(error.errno(), libc::EINVAL | libc::ENOSPC | libc::EFBIG) => {
                if error.errno() == libc::ENOSPC {
                    let block = u64::from(volume.statfs().block_bytes);
                    self.judge_no_space(volume, len.div_ceil(block) + 2, &error)?;
                }
                // Refused: the file must be as it was.
                let now = read_file(volume, ino).map_err(|error| format!("read back: {error}"))?;
                if now != self.inodes[&ino].content {
                    return Err(format!("fallocate refused ({error}) but changed the file"));
                }
                Ok((Vec::new(), SpanKind::Other))
            }
            Err(error) => Err(format!("fallocate: {error}")),
        }
    }

    fn rename_op(&mut self, volume: &Volume, from: &str, to: &str) -> Executed {
        let Some(ino) = self.files.get(from).copied().or_else(|| self.symlink_ino(from)) else {
            return skipped();
        };
        let (from_dir, from_name) = split(from);
        let (to_dir_path, to_name) = split(to);
        let Some(to_dir) = self.dir_ino(to_dir_path) else { return skipped() };
        let from_dir = self.dir_ino(from_dir).expect("a file's directory is known");
        if from == to || self.logs.contains_key(to) || self.dirs.iter().any(|d| d.0 == to) {
            return skipped();
        }
        let target_ino = self.files.get(to).copied().or_else(|| self.symlink_ino(to));
        volume
            .inodes()
            .rename(
                from_dir,
                from_name.as_bytes(),
                to_dir,
                to_name.as_bytes(),
                RenameFlags::default(),
            )
            .map_err(|error| format!("rename: {error}"))?;
        if target_ino == Some(ino) {
            // Both names are links to one inode: POSIX says do nothing.
            return Ok((Vec::new(), SpanKind::Other));
        }
        let victim = self.files.remove(to).or(self.symlinks.remove(to).map(|(ino, _)| ino));
        if let Some(ino) = self.files.remove(from) {
            self.files.insert(to.to_string(), ino);
        } else if let Some(link) = self.symlinks.remove(from) {
            self.symlinks.insert(to.to_string(), link);
        }
        let touched = [Some(ino), victim, Some(from_dir), Some(to_dir)];
        Ok((touched.into_iter().flatten().collect(), SpanKind::Other))
    }

    fn fsync_op(&mut self, volume: &Volume, path: &str, data_only: bool) -> Executed {
        let Some(&ino) = self.files.get(path).or_else(|| self.logs.get(path)) else {
            return skipped();
        };
        let file = open(volume, ino, OpenFlags::READ)?;
        if data_only { file.sync_data() } else { file.sync_all() }
            .map_err(|error| format!("fsync: {error}"))?;
        let content = self.inodes[&ino].content.clone();
        let xattrs = self.inodes[&ino].xattrs.clone();
        // The model must agree with the live file, or every crash
        // check after this would be wrong.
        let live_xattrs = read_xattrs(volume, ino)?;
        if live_xattrs != xattrs {
            return Err(format!(
                "live extended attributes differ from the model: {:?} vs {:?}",
                live_xattrs.keys().collect::<Vec<_>>(),
                xattrs.keys().collect::<Vec<_>>()
            ));
        }
        let live = read_file(volume, ino).map_err(|error| format!("read: {error}"))?;
        if live != content {
            let at = live.iter().zip(&content).position(|(a, b)| a != b);
            return Err(format!(
                "live file differs from the model: {} vs {} bytes, first difference at {at:?}",
                live.len(),
                content.len()
            ));
        }
        let xattrs = (!data_only).then_some(xattrs);
        Ok((Vec::new(), SpanKind::Fsync { ino, content, xattrs }))
    }

    fn rename_dir_op(&mut self, volume: &Volume, from: &str, to: &str) -> Executed {
        let Some(ino) = self.dir_ino(from).filter(|_| from != self.base) else {
            return skipped();
        };
        let (from_parent_path, from_name) = split(from);
        let (to_parent_path, to_name) = split(to);
        let Some(to_parent) = self.dir_ino(to_parent_path) else { return skipped() };
        let from_parent = self.dir_ino(from_parent_path).expect("a directory's parent is known");
        let inside = |path: &str| path == from || path.starts_with(&format!("{from}/"));
        let victim = self.dir_ino(to);
        let over_empty_dir = victim.is_some() && self.is_empty_dir(to);
        if inside(to) || (self.exists(to) && !over_empty_dir) {
            return skipped();
        }
        volume
            .inodes()
            .rename(
                from_parent,
                from_name.as_bytes(),
                to_parent,
                to_name.as_bytes(),
                RenameFlags::default(),
            )
            .map_err(|error| format!("rename of a directory: {error}"))?;
        self.dirs.retain(|(dir, _)| dir != to);
        let moved = |path: &String| -> String {
            if inside(path) {
                format!("{to}{}", &path[from.len()..])
            } else {
                path.clone()
            }
        };
        for (dir, _) in &mut self.dirs {
            *dir = moved(dir);
        }
        self.files = self.files.iter().map(|(path, ino)| (moved(path), *ino)).collect();
        self.symlinks =
            self.symlinks.iter().map(|(path, link)| (moved(path), link.clone())).collect();
        let touched = [Some(ino), victim, Some(from_parent), Some(to_parent)];
        Ok((touched.into_iter().flatten().collect(), SpanKind::Other))
    }

    /// Writes `data` at `pos`, buffered or direct, and updates the model.
    /// A write refused or cut short for want of space must leave every byte
    /// either as it was or as written; the model then takes what the file
    /// holds. Whether the whole write went in.
    fn write(
        &mut self,
        volume: &Volume,
        ino: u64,
        pos: u64,
        data: &[u8],
        direct: bool,
        dsync: bool,
    ) -> Result<bool, String> {
        let flags = if direct { OpenFlags::WRITE.with_direct() } else { OpenFlags::WRITE };
        let flags = if dsync { flags.with_dsync() } else { flags };
        let file = open(volume, ino, flags)?;
        let result = if direct {
            file.write_at(&AlignedBuf::from_slice(data), pos)
        } else {
            file.write_at(data, pos)
        };
        drop(file);
        let inode = self.inodes.get_mut(&ino).expect("known");
        let start = pos as usize;
        inode.history.record(start, data);
        match result {
            Ok(written) if written == data.len() => {
                if inode.content.len() < start + written {
                    inode.content.resize(start + written, 0);
                }
                inode.content[start..start + written].copy_from_slice(data);
                inode.sizes_seen.insert(inode.content.len() as u64);
                if direct {
                    // A direct write past the on-disk size moves it to the
                    // write's end, even when buffered data not yet written
                    // back makes the file longer.
                    inode.sizes_seen.insert((start + written) as u64);
                }
                Ok(true)
            }
            Ok(_) => self.adopt_partial(volume, ino, start, data).map(|()| false),
            Err(error) if error.errno() == libc::ENOSPC => {
                let block = u64::from(volume.statfs().block_bytes);
                self.judge_no_space(volume, (data.len() as u64).div_ceil(block) + 2, &error)?;
                self.adopt_partial(volume, ino, start, data).map(|()| false)
            }
            Err(error) => Err(format!("write: {error}")),
        }
    }

    /// Accepts a refusal for want of space only when the volume is short:
    /// `statfs` shows fewer blocks available (free less reserved) than the
    /// `needed_blocks` the operation could have wanted plus what the other
    /// threads may have freed since, or the metadata nearly at its room.
    fn judge_no_space(
        &self,
        volume: &Volume,
        needed_blocks: u64,
        error: &foliofs::Error,
    ) -> Result<(), String> {
        let stat = volume.statfs();
        let blocks_short = stat.available_blocks < needed_blocks + self.others_may_free_blocks;
        let metadata_short = stat.metadata_bytes + METADATA_SHORT_BYTES > stat.metadata_bytes_max;
        if blocks_short || metadata_short {
            return Ok(());
        }
        Err(format!(
            "{error}, where the volume has {} blocks available ({} free), more than the {} \
             the operation could want and {} the other threads could have freed; metadata \
             {} of {} bytes",
            stat.available_blocks,
            stat.free_blocks,
            needed_blocks,
            self.others_may_free_blocks,
            stat.metadata_bytes,
            stat.metadata_bytes_max
        ))
    }

    fn adopt_partial(
        &mut self,
        volume: &Volume,
        ino: u64,
        start: usize,
        data: &[u8],
    ) -> Result<(), String> {
        let now = read_file(volume, ino).map_err(|error| format!("read back: {error}"))?;
        let inode = self.inodes.get_mut(&ino).expect("known");
        let old = &inode.content;
        let end = start + data.len();
        if now.len() < old.len() || now.len() > old.len().max(end) {
            return Err(format!(
                "a write cut short for want of space left size {} (was {}, write ended at {end})",
                now.len(),
                old.len()
            ));
        }
        for (pos, &byte) in now.iter().enumerate() {
            let before = old.get(pos).copied().unwrap_or(0);
            let written = (start..end).contains(&pos).then(|| data[pos - start]);
            if byte != before && Some(byte) != written {
                return Err(format!(
                    "a write cut short for want of space left byte {pos} = {byte:#04x}, \
                     neither the old {before:#04x} nor the new {written:?}"
                ));
            }
        }
        inode.content = now;
        inode.sizes_seen.insert(inode.content.len() as u64);
        Ok(())
    }
}
