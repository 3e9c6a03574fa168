//! Drawing the next op: random choices against one thread's model, so
//! that every op generated applies to what that thread has.

use std::collections::BTreeMap;

use foliofs::FallocateMode;
use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use super::{CloneMode, Geometry, Op, ThreadModel, WorkloadConfig};
use crate::{mix, SECTOR_BYTES};

impl ThreadModel {
    fn fresh_path(&mut self, rng: &mut ChaCha8Rng) -> String {
        self.next_name += 1;
        let dir = &self.dirs[rng.random_range(0..self.dirs.len())].0;
        format!("{dir}/n{}", self.next_name)
    }

    fn pick<'a>(rng: &mut ChaCha8Rng, map: &'a BTreeMap<String, u64>) -> Option<&'a String> {
        if map.is_empty() {
            return None;
        }
        map.keys().nth(rng.random_range(0..map.len()))
    }

    /// The next random op for this model.
    pub fn generate(
        &mut self,
        rng: &mut ChaCha8Rng,
        geometry: &Geometry,
        config: WorkloadConfig,
        op_index: usize,
    ) -> Op {
        let data = mix(&[config.seed, self.index as u64, op_index as u64]);
        let block = u64::from(config.block_bytes);
        let sector = u64::from(SECTOR_BYTES);
        let choice = rng.random_range(0..108);
        // Namespace ops that need no file come first in every draw.
        match choice {
            0..=2 => return Op::Symlink { path: self.fresh_path(rng), target: self.target(rng) },
            3..=5 => {
                if let Some(op) = self.rename_dir(rng) {
                    return op;
                }
            }
            6..=7 if self.dirs.len() > 1 => {
                let path = self.dirs[rng.random_range(1..self.dirs.len())].0.clone();
                return Op::Rmdir { path };
            }
            8..=11 => {
                let path = self.dirs[rng.random_range(0..self.dirs.len())].0.clone();
                return Op::FsyncDir { path };
            }
            _ => {}
        }
        let Some(path) = Self::pick(rng, &self.files).cloned() else {
            return match choice {
                12..=69 => Op::Create { path: self.fresh_path(rng) },
                70..=79 => self.append(rng, geometry, data),
                _ => Op::Mkdir { path: self.fresh_path(rng) },
            };
        };
        let length_now = self.inodes[&self.files[&path]].content.len() as u64;
        match choice {
            0..=17 => Op::Create { path: self.fresh_path(rng) },
            18..=22 => Op::Mkdir { path: self.fresh_path(rng) },
            23..=37 => {
                let direct = rng.random_bool(0.35);
                let mut pos = rng.random_range(0..geometry.file_bytes_max);
                let mut len = rng.random_range(1..=geometry.write_bytes_max);
                if direct {
                    // Half whole blocks, half sub-block sector runs.
                    let unit = if rng.random_bool(0.5) { block } else { sector };
                    pos -= pos % unit;
                    len = len.div_ceil(unit as usize) * unit as usize;
                }
                Op::Write { path, pos, len, data, direct, dsync: rng.random_bool(0.2) }
            }
            38..=43 => self.append(rng, geometry, data),
            44..=49 => {
                let mode = match rng.random_range(0..6) {
                    0 => FallocateMode::Allocate { keep_size: rng.random_bool(0.5) },
                    1 | 2 => FallocateMode::PunchHole,
                    3 => FallocateMode::ZeroRange { keep_size: rng.random_bool(0.5) },
                    4 => FallocateMode::CollapseRange,
                    _ => FallocateMode::InsertRange,
                };
                let (offset, len) = match mode {
                    FallocateMode::CollapseRange | FallocateMode::InsertRange => {
                        let blocks = (length_now / block).max(1);
                        (rng.random_range(0..blocks) * block, rng.random_range(1..=3) * block)
                    }
                    _ => (
                        rng.random_range(0..geometry.file_bytes_max),
                        rng.random_range(1..geometry.fallocate_bytes_max),
                    ),
                };
                Op::Fallocate { path, mode, offset, len }
            }
            50..=54 => Op::Truncate { path, size: rng.random_range(0..geometry.file_bytes_max) },
            55..=59 => {
                // Now and then a symbolic link instead of a file.
                let link = Self::pick_symlink(rng, &self.symlinks).filter(|_| rng.random_bool(0.3));
                Op::Unlink { path: link.unwrap_or(path) }
            }
            60..=65 => {
                let from = Self::pick_symlink(rng, &self.symlinks)
                    .filter(|_| rng.random_bool(0.2))
                    .unwrap_or(path);
                // Half the time onto another file (or link) of the thread,
                // replacing it.
                let victim = Self::pick(rng, &self.files).filter(|victim| **victim != from);
                let to = match victim {
                    Some(victim) if rng.random_bool(0.5) => victim.clone(),
                    _ => self.fresh_path(rng),
                };
                Op::Rename { from, to }
            }
            66..=69 => {
                let from = Self::pick_symlink(rng, &self.symlinks)
                    .filter(|_| rng.random_bool(0.2))
                    .unwrap_or(path);
                Op::Link { from, to: self.fresh_path(rng) }
            }
            70..=83 => {
                let path = if rng.random_bool(0.25) {
                    self.logs.keys().next().cloned().expect("every thread has a log")
                } else {
                    path
                };
                Op::Fsync { path, data_only: rng.random_bool(0.5) }
            }
            84..=89 => Op::Checkpoint,
            90..=95 => self.clone_range(rng, geometry, block, path),
            100..=107 => {
                let path = if rng.random_bool(0.2) {
                    self.logs.keys().next().cloned().expect("every thread has a log")
                } else {
                    path
                };
                let name = rng.random_range(0..4);
                if choice >= 105 {
                    Op::RemoveXattr { path, name }
                } else {
                    let len = [0, 16, 900, 4000][rng.random_range(0..4)];
                    Op::SetXattr { path, name, len, data }
                }
            }
            _ => Op::Sync,
        }
    }

    fn pick_symlink(rng: &mut ChaCha8Rng, map: &BTreeMap<String, (u64, String)>) -> Option<String> {
        if map.is_empty() {
            return None;
        }
        map.keys().nth(rng.random_range(0..map.len())).cloned()
    }

    /// A symlink target: a path of the thread (in another directory, often),
    /// relative or absolute, or a name that does not exist.
    fn target(&self, rng: &mut ChaCha8Rng) -> String {
        let known: Vec<&String> = self.files.keys().chain(self.dirs.iter().map(|d| &d.0)).collect();
        match rng.random_range(0..3) {
            0 => format!("dangling-{}", rng.random_range(0..1000)),
            1 => format!("..{}", known[rng.random_range(0..known.len())]),
            _ => format!("{}/", known[rng.random_range(0..known.len())]),
        }
    }

    /// A directory rename: to a fresh name (in the same or another
    /// directory) or over an empty directory; never into itself.
    fn rename_dir(&mut self, rng: &mut ChaCha8Rng) -> Option<Op> {
        if self.dirs.len() < 2 {
            return None;
        }
        let from = self.dirs[rng.random_range(1..self.dirs.len())].0.clone();
        let inside = |path: &str| path == from || path.starts_with(&format!("{from}/"));
        let empty: Vec<String> = self
            .dirs
            .iter()
            .skip(1)
            .map(|(path, _)| path.clone())
            .filter(|path| !inside(path) && self.is_empty_dir(path))
            .collect();
        if !empty.is_empty() && rng.random_bool(0.6) {
            let to = empty[rng.random_range(0..empty.len())].clone();
            return Some(Op::RenameDir { from, to });
        }
        if empty.is_empty() && rng.random_bool(0.5) {
            // An empty directory for a later rename to replace.
            return Some(Op::Mkdir { path: self.fresh_path(rng) });
        }
        let parents: Vec<String> =
            self.dirs.iter().map(|(path, _)| path.clone()).filter(|path| !inside(path)).collect();
        let parent = parents[rng.random_range(0..parents.len())].clone();
        self.next_name += 1;
        Some(Op::RenameDir { from, to: format!("{parent}/d{}", self.next_name) })
    }

    /// A clone, deduplication or copy from `from` into one of the thread's
    /// files (a quarter of the time `from` itself). Clones and dedupes are
    /// block-aligned and mostly valid; dedupes look for ranges the model
    /// holds equal (a clone's leftovers, zeroes) and, finding none, ask
    /// for ranges that differ.
    fn clone_range(
        &self,
        rng: &mut ChaCha8Rng,
        geometry: &Geometry,
        block: u64,
        from: String,
    ) -> Op {
        // An empty source shares nothing: take one with data if there is.
        let with_data: Vec<&String> = self
            .files
            .iter()
            .filter(|(_, ino)| !self.inodes[*ino].content.is_empty())
            .map(|(path, _)| path)
            .collect();
        let from = match with_data.len() {
            0 => from,
            count => with_data[rng.random_range(0..count)].clone(),
        };
        let to = match Self::pick(rng, &self.files) {
            Some(other) if rng.random_bool(0.75) => other.clone(),
            _ => from.clone(),
        };
        let src_bytes = self.inodes[&self.files[&from]].content.len() as u64;
        let dst_bytes = self.inodes[&self.files[&to]].content.len() as u64;
        let blocks_max = geometry.file_bytes_max / block;
        let mode = [CloneMode::Clone, CloneMode::Clone, CloneMode::Dedupe, CloneMode::Copy]
            [rng.random_range(0..4)];
        let (src_pos, dst_pos, len) = match mode {
            CloneMode::Clone => {
                // Mostly inside the source; a fifth of the lengths may run
                // past its end (refused).
                let src_pos = rng.random_range(0..src_bytes.div_ceil(block).max(1)) * block;
                let blocks = rng.random_range(1..=4) * block;
                let len = match rng.random_range(0..10) {
                    0..=2 => 0,
                    3..=7 => src_bytes.saturating_sub(src_pos).min(blocks),
                    _ => blocks,
                };
                (src_pos, rng.random_range(0..blocks_max) * block, len)
            }
            CloneMode::Dedupe => self.dedupe_ranges(rng, block, &from, &to),
            CloneMode::Copy => (
                rng.random_range(0..=src_bytes),
                rng.random_range(0..geometry.file_bytes_max.max(dst_bytes)),
                rng.random_range(1..=geometry.write_bytes_max as u64),
            ),
        };
        Op::CloneRange { mode, from, to, src_pos, dst_pos, len }
    }

    /// Block-aligned ranges inside both files, equal in the model if a few
    /// tries find such.
    fn dedupe_ranges(
        &self,
        rng: &mut ChaCha8Rng,
        block: u64,
        from: &str,
        to: &str,
    ) -> (u64, u64, u64) {
        let src = &self.inodes[&self.files[from]].content;
        let dst = &self.inodes[&self.files[to]].content;
        let (src_blocks, dst_blocks) = (src.len() as u64 / block, dst.len() as u64 / block);
        if src_blocks == 0 || dst_blocks == 0 {
            return (0, 0, block);
        }
        let mut candidate = (0, 0, block);
        for _ in 0..24 {
            let len = rng.random_range(1..=src_blocks.min(dst_blocks).min(3)) * block;
            let src_pos = rng.random_range(0..=src_blocks - len / block) * block;
            let dst_pos = rng.random_range(0..=dst_blocks - len / block) * block;
            candidate = (src_pos, dst_pos, len);
            let overlap = from == to && src_pos < dst_pos + len && dst_pos < src_pos + len;
            let (src_range, dst_range) = (
                src_pos as usize..(src_pos + len) as usize,
                dst_pos as usize..(dst_pos + len) as usize,
            );
            if !overlap && src[src_range] == dst[dst_range] {
                break;
            }
        }
        candidate
    }

    pub(super) fn append(&mut self, rng: &mut ChaCha8Rng, geometry: &Geometry, data: u64) -> Op {
        let path = self.logs.keys().next().cloned().expect("every thread has a log");
        let length_now = self.inodes[&self.logs[&path]].content.len();
        let direct = length_now.is_multiple_of(SECTOR_BYTES as usize) && rng.random_bool(0.4);
        let mut len = rng.random_range(1..=geometry.write_bytes_max / 2);
        if direct {
            len = len.div_ceil(SECTOR_BYTES as usize) * SECTOR_BYTES as usize;
        }
        Op::Append { path, len, data, direct, dsync: rng.random_bool(0.2) }
    }
}
