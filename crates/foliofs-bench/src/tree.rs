//! `foliofs bench tree`: the metadata workload of issue 14. A tree of small
//! files in nested directories (`b<i>/l<j>/f<k>`) is created, stat'ed, read,
//! its leaf directories renamed, and deleted, one phase after another from
//! one thread, as a new user's `tar x`, `find`, `grep -r`, `mv` and `rm -r`
//! would. The same phases run in process (the library's calls, directory
//! inodes kept as a library user keeps them), through a FUSE mount in each
//! `page_cache` mode and on the kernel's ext4 and XFS in the same run, each
//! on a fresh file system with warm caches (nothing dropped between phases).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use foliofs::vfs::MkfsOptions;
use foliofs::{OpenFlags, Owner, RenameFlags, Volume, VolumeOptions};
use serde_json::{json, Value};

use crate::peers::{FuseMount, Peers};

/// The phases, in the order they run.
pub const PHASES: [Phase; 5] =
    [Phase::Create, Phase::Stat, Phase::Read, Phase::Rename, Phase::Delete];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// mkdir the directories; create, write and close every file.
    Create,
    /// stat every file by its path.
    Stat,
    /// open, read whole and close every file.
    Read,
    /// rename every leaf directory within its parent.
    Rename,
    /// unlink every file, rmdir every directory.
    Delete,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Create => "create",
            Phase::Stat => "stat",
            Phase::Read => "read",
            Phase::Rename => "rename dir",
            Phase::Delete => "delete",
        }
    }

    /// What the phase's rate counts.
    pub fn unit(self) -> &'static str {
        match self {
            Phase::Rename => "dirs/s",
            _ => "files/s",
        }
    }
}

/// The tree's size and shape.
#[derive(Debug, Clone, Copy)]
pub struct TreeShape {
    pub files: u64,
    pub file_bytes: usize,
    /// Files in each leaf directory.
    pub files_per_dir: u64,
    /// Leaf directories under each top-level directory.
    pub dirs_per_branch: u64,
}

impl TreeShape {
    pub fn leaf_dirs(&self) -> u64 {
        self.files.div_ceil(self.files_per_dir)
    }

    pub fn branches(&self) -> u64 {
        self.leaf_dirs().div_ceil(self.dirs_per_branch)
    }

    /// Files in leaf directory `leaf` (counted across branches).
    fn files_in(&self, leaf: u64) -> u64 {
        (self.files - leaf * self.files_per_dir).min(self.files_per_dir)
    }
}

/// The operations a phase needs, on one file system. Leaves are numbered
/// across the tree; `renamed` says whether a leaf has its second name.
trait TreeFs {
    fn mkdir_branch(&mut self, branch: u64) -> anyhow::Result<()>;
    fn mkdir_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()>;
    fn create_file(&mut self, leaf: u64, file: u64, data: &[u8]) -> anyhow::Result<()>;
    fn stat_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<u64>;
    fn read_file(&mut self, leaf: u64, file: u64, buffer: &mut [u8]) -> anyhow::Result<usize>;
    fn rename_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()>;
    fn unlink_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<()>;
    fn rmdir_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()>;
    fn rmdir_branch(&mut self, branch: u64) -> anyhow::Result<()>;
}

fn branch_name(branch: u64) -> String {
    format!("b{branch}")
}

fn leaf_name(leaf: u64, renamed: bool) -> String {
    if renamed {
        format!("r{leaf}")
    } else {
        format!("l{leaf}")
    }
}

fn file_name(file: u64) -> String {
    format!("f{file}")
}

/// The tree under a directory of a mounted file system, through std::fs.
struct PathTree {
    root: PathBuf,
    shape: TreeShape,
    renamed: bool,
}

impl PathTree {
    fn branch(&self, branch: u64) -> PathBuf {
        self.root.join(branch_name(branch))
    }

    fn leaf(&self, leaf: u64) -> PathBuf {
        self.branch(leaf / self.shape.dirs_per_branch).join(leaf_name(leaf, self.renamed))
    }

    fn file(&self, leaf: u64, file: u64) -> PathBuf {
        self.leaf(leaf).join(file_name(file))
    }
}

impl TreeFs for PathTree {
    fn mkdir_branch(&mut self, branch: u64) -> anyhow::Result<()> {
        let path = self.branch(branch);
        std::fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))
    }

    fn mkdir_leaf(&mut self, _branch: u64, leaf: u64) -> anyhow::Result<()> {
        let path = self.leaf(leaf);
        std::fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))
    }

    fn create_file(&mut self, leaf: u64, file: u64, data: &[u8]) -> anyhow::Result<()> {
        let path = self.file(leaf, file);
        let mut created =
            std::fs::File::create(&path).with_context(|| format!("create {}", path.display()))?;
        created.write_all(data).with_context(|| format!("write {}", path.display()))
    }

    fn stat_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<u64> {
        let path = self.file(leaf, file);
        let metadata =
            std::fs::symlink_metadata(&path).with_context(|| format!("stat {}", path.display()))?;
        Ok(metadata.len())
    }

    fn read_file(&mut self, leaf: u64, file: u64, buffer: &mut [u8]) -> anyhow::Result<usize> {
        let path = self.file(leaf, file);
        let mut opened =
            std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
        let mut total = 0;
        loop {
            let read = opened
                .read(&mut buffer[total..])
                .with_context(|| format!("read {}", path.display()))?;
            if read == 0 || total + read == buffer.len() {
                return Ok(total + read);
            }
            total += read;
        }
    }

    fn rename_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()> {
        let from = self.branch(branch).join(leaf_name(leaf, false));
        let to = self.branch(branch).join(leaf_name(leaf, true));
        std::fs::rename(&from, &to).with_context(|| format!("rename {}", from.display()))?;
        if leaf + 1 == self.shape.leaf_dirs() {
            self.renamed = true;
        }
        Ok(())
    }

    fn unlink_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<()> {
        let path = self.file(leaf, file);
        std::fs::remove_file(&path).with_context(|| format!("unlink {}", path.display()))
    }

    fn rmdir_leaf(&mut self, _branch: u64, leaf: u64) -> anyhow::Result<()> {
        let path = self.leaf(leaf);
        std::fs::remove_dir(&path).with_context(|| format!("rmdir {}", path.display()))
    }

    fn rmdir_branch(&mut self, branch: u64) -> anyhow::Result<()> {
        let path = self.branch(branch);
        std::fs::remove_dir(&path).with_context(|| format!("rmdir {}", path.display()))
    }
}

/// The tree in process: the library's calls, with the directories' inode
/// numbers kept (as a library user keeps its directories open) and files
/// looked up by name in them.
struct LibraryTree<'a> {
    volume: &'a Volume,
    root: u64,
    owner: Owner,
    shape: TreeShape,
    branches: Vec<u64>,
    leaves: Vec<u64>,
    renamed: bool,
}

impl TreeFs for LibraryTree<'_> {
    fn mkdir_branch(&mut self, branch: u64) -> anyhow::Result<()> {
        let name = branch_name(branch);
        let attr = self.volume.inodes().mkdir(self.root, name.as_bytes(), 0o755, self.owner)?;
        self.branches.push(attr.ino);
        Ok(())
    }

    fn mkdir_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()> {
        let name = leaf_name(leaf, false);
        let parent = self.branches[branch as usize];
        let attr = self.volume.inodes().mkdir(parent, name.as_bytes(), 0o755, self.owner)?;
        self.leaves.push(attr.ino);
        Ok(())
    }

    fn create_file(&mut self, leaf: u64, file: u64, data: &[u8]) -> anyhow::Result<()> {
        let dir = self.leaves[leaf as usize];
        let attr =
            self.volume.inodes().create(dir, file_name(file).as_bytes(), 0o644, self.owner)?;
        let opened = self.volume.inodes().open_file(attr.ino, OpenFlags::WRITE)?;
        opened.write_at(data, 0)?;
        opened.close()?;
        Ok(())
    }

    fn stat_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<u64> {
        let dir = self.leaves[leaf as usize];
        Ok(self.volume.inodes().lookup(dir, file_name(file).as_bytes())?.size)
    }

    fn read_file(&mut self, leaf: u64, file: u64, buffer: &mut [u8]) -> anyhow::Result<usize> {
        let dir = self.leaves[leaf as usize];
        let attr = self.volume.inodes().lookup(dir, file_name(file).as_bytes())?;
        let opened = self.volume.inodes().open_file(attr.ino, OpenFlags::READ)?;
        let read = opened.read_at(buffer, 0)?;
        opened.close()?;
        Ok(read)
    }

    fn rename_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()> {
        let parent = self.branches[branch as usize];
        let (from, to) = (leaf_name(leaf, false), leaf_name(leaf, true));
        self.volume.inodes().rename(
            parent,
            from.as_bytes(),
            parent,
            to.as_bytes(),
            RenameFlags::default(),
        )?;
        if leaf + 1 == self.shape.leaf_dirs() {
            self.renamed = true;
        }
        Ok(())
    }

    fn unlink_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<()> {
        let dir = self.leaves[leaf as usize];
        Ok(self.volume.inodes().unlink(dir, file_name(file).as_bytes())?)
    }

    fn rmdir_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()> {
        let parent = self.branches[branch as usize];
        Ok(self.volume.inodes().rmdir(parent, leaf_name(leaf, self.renamed).as_bytes())?)
    }

    fn rmdir_branch(&mut self, branch: u64) -> anyhow::Result<()> {
        Ok(self.volume.inodes().rmdir(self.root, branch_name(branch).as_bytes())?)
    }
}

/// Runs one phase over the whole tree; returns its rate in its unit.
fn run_phase(fs: &mut dyn TreeFs, shape: &TreeShape, phase: Phase) -> anyhow::Result<f64> {
    let data = vec![0x5Au8; shape.file_bytes];
    let mut buffer = vec![0u8; shape.file_bytes.max(1)];
    let started = Instant::now();
    let mut operations = 0u64;
    let branch_of = |leaf: u64| leaf / shape.dirs_per_branch;
    match phase {
        Phase::Create => {
            for leaf in 0..shape.leaf_dirs() {
                if leaf % shape.dirs_per_branch == 0 {
                    fs.mkdir_branch(branch_of(leaf))?;
                }
                fs.mkdir_leaf(branch_of(leaf), leaf)?;
                for file in 0..shape.files_in(leaf) {
                    fs.create_file(leaf, file, &data)?;
                    operations += 1;
                }
            }
        }
        Phase::Stat => {
            for leaf in 0..shape.leaf_dirs() {
                for file in 0..shape.files_in(leaf) {
                    let size = fs.stat_file(leaf, file)?;
                    anyhow::ensure!(size == shape.file_bytes as u64, "stat: size {size}");
                    operations += 1;
                }
            }
        }
        Phase::Read => {
            for leaf in 0..shape.leaf_dirs() {
                for file in 0..shape.files_in(leaf) {
                    let read = fs.read_file(leaf, file, &mut buffer)?;
                    anyhow::ensure!(read == shape.file_bytes, "read {read} bytes");
                    anyhow::ensure!(buffer[..read] == data[..], "read back other bytes");
                    operations += 1;
                }
            }
        }
        Phase::Rename => {
            for leaf in 0..shape.leaf_dirs() {
                fs.rename_leaf(branch_of(leaf), leaf)?;
                operations += 1;
            }
        }
        Phase::Delete => {
            for leaf in 0..shape.leaf_dirs() {
                for file in 0..shape.files_in(leaf) {
                    fs.unlink_file(leaf, file)?;
                    operations += 1;
                }
                fs.rmdir_leaf(branch_of(leaf), leaf)?;
                let last_of_branch =
                    (leaf + 1) % shape.dirs_per_branch == 0 || leaf + 1 == shape.leaf_dirs();
                if last_of_branch {
                    fs.rmdir_branch(branch_of(leaf))?;
                }
            }
        }
    }
    Ok(operations as f64 / started.elapsed().as_secs_f64().max(1e-9))
}

fn run_phases(fs: &mut dyn TreeFs, shape: &TreeShape) -> anyhow::Result<Vec<f64>> {
    PHASES.iter().map(|&phase| run_phase(fs, shape, phase).with_context(|| phase.name())).collect()
}

/// One row: a file system and its rate per phase (in `PHASES` order).
#[derive(Debug, Clone)]
pub struct TreeRow {
    pub label: String,
    pub rates: Vec<f64>,
}

pub struct TreeGoal {
    pub text: String,
    pub value: f64,
    pub target: f64,
    pub met: bool,
}

pub struct TreeResult {
    pub shape: TreeShape,
    pub rows: Vec<TreeRow>,
    pub goals: Vec<TreeGoal>,
}

pub struct TreeOptions {
    pub shape: TreeShape,
    /// Run the kernel peers and the rows through FUSE (root and the tools).
    pub peers: bool,
    /// Where the images and the peers' loop files go (the disk measured).
    pub work_dir: PathBuf,
    pub volume_options: VolumeOptions,
    /// The same options as text, for `foliofs mount -o`.
    pub volume_options_text: String,
    /// The `foliofs` executable, to mount the engine; None leaves the rows
    /// through FUSE out.
    pub mount_program: Option<PathBuf>,
    /// `page_cache` modes measured through the mount.
    pub page_cache_modes: Vec<String>,
    /// `opens` settings measured with each mode that uses the kernel's page
    /// cache (`engine` always opens through the daemon); empty: the mount's
    /// default only.
    pub opens_modes: Vec<String>,
}

/// The mounts measured: a label and the options that make it, one per
/// page_cache mode and, where it applies, per `opens` setting.
fn mount_variants(options: &TreeOptions) -> Vec<(String, String)> {
    let mut variants = Vec::new();
    for mode in &options.page_cache_modes {
        let label = format!("fuse page_cache={mode}");
        let page_cache = format!("page_cache={mode}");
        if mode == "engine" || options.opens_modes.is_empty() {
            variants.push((label, page_cache));
            continue;
        }
        for opens in &options.opens_modes {
            variants
                .push((format!("{label} opens={opens}"), format!("{page_cache},opens={opens}")));
        }
    }
    variants
}

/// Bytes of image the tree needs: the data twice over and the metadata
/// (the checkpoint slots are a fixed share of the volume, about 16 KiB of it
/// per file).
pub fn image_bytes(shape: &TreeShape) -> u64 {
    let per_file = (16 << 10) + 2 * shape.file_bytes.div_ceil(4096) as u64 * 4096;
    (1 << 30) + shape.files * per_file
}

/// Bytes of each kernel peer's loop file: the data, rounded to blocks,
/// twice over, plus room for the file system's own metadata.
fn peer_bytes(shape: &TreeShape) -> u64 {
    (1 << 30) + shape.files * 2 * shape.file_bytes.div_ceil(4096) as u64 * 4096
}

pub fn run(
    options: &TreeOptions,
    image: &Path,
    progress: &dyn Fn(&str),
) -> anyhow::Result<TreeResult> {
    let shape = options.shape;
    anyhow::ensure!(shape.files > 0 && shape.files_per_dir > 0 && shape.dirs_per_branch > 0);
    let mkfs = MkfsOptions { block_bytes: 4096, ..MkfsOptions::default() };
    let mut rows = Vec::new();

    progress("foliofs (in process)");
    Volume::mkfs_path(image, None, &mkfs, &options.volume_options)?;
    let volume = Volume::open(image, &options.volume_options)?;
    let rates = {
        let mut tree = LibraryTree {
            volume: &volume,
            root: 1,
            // Taken once, as a library user holds its credentials; the
            // kernel peers read theirs from the task, at no cost.
            owner: Owner::current(),
            shape,
            branches: Vec::new(),
            leaves: Vec::new(),
            renamed: false,
        };
        run_phases(&mut tree, &shape).context("in process")?
    };
    volume.close()?;
    rows.push(TreeRow { label: "foliofs".into(), rates });

    if options.peers {
        if let Some(program) = &options.mount_program {
            let mount_point =
                options.work_dir.join(format!("foliofs-tree-mnt-{}", std::process::id()));
            for (label, variant_options) in mount_variants(options) {
                progress(&label);
                Volume::mkfs_path(image, None, &mkfs, &options.volume_options)?;
                let mount_options = [options.volume_options_text.as_str(), &variant_options]
                    .iter()
                    .filter(|part| !part.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(",");
                let mounted = FuseMount::start(program, image, &mount_point, &mount_options)?;
                let mut tree = PathTree { root: mounted.mount.clone(), shape, renamed: false };
                let rates = run_phases(&mut tree, &shape).with_context(|| label.clone());
                mounted.stop()?;
                rows.push(TreeRow { label, rates: rates? });
            }
            let _ = std::fs::remove_dir(&mount_point);
        }
        let peers_dir = options.work_dir.join(format!("foliofs-tree-peers-{}", std::process::id()));
        let peers = Peers::start_for_files(
            &peers_dir,
            peer_bytes(&shape),
            shape.files + shape.leaf_dirs() + 1024,
        )?;
        for fs in &peers.file_systems {
            let label = format!("kernel {}", fs.name);
            progress(&label);
            let root = fs.mount.join("tree");
            std::fs::create_dir(&root)?;
            let mut tree = PathTree { root, shape, renamed: false };
            let rates = run_phases(&mut tree, &shape).with_context(|| label.clone())?;
            rows.push(TreeRow { label, rates });
        }
        drop(peers);
    }
    let goals = goals(&rows);
    Ok(TreeResult { shape, rows, goals })
}

/// Issue 14's goals: in process every phase >= 2x kernel ext4; through the
/// mount (each mode shown) every phase >= 0.5x kernel ext4.
fn goals(rows: &[TreeRow]) -> Vec<TreeGoal> {
    let Some(ext4) = rows.iter().find(|row| row.label == "kernel ext4") else {
        return Vec::new();
    };
    let mut goals = Vec::new();
    for row in rows.iter().filter(|row| !row.label.starts_with("kernel")) {
        let target = if row.label == "foliofs" { 2.0 } else { 0.5 };
        for (index, phase) in PHASES.iter().enumerate() {
            let value = row.rates[index] / ext4.rates[index].max(1e-9);
            goals.push(TreeGoal {
                text: format!("{} {} / kernel ext4 >= {target}", row.label, phase.name()),
                value,
                target,
                met: value >= target,
            });
        }
    }
    goals
}

pub fn to_markdown(result: &TreeResult) -> String {
    let shape = &result.shape;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "## bench tree: {} files of {} bytes, {} per directory, {} directories under each of {}\n",
        shape.files,
        shape.file_bytes,
        shape.files_per_dir,
        shape.dirs_per_branch,
        shape.branches()
    );
    let header: Vec<String> =
        PHASES.iter().map(|phase| format!("{} ({})", phase.name(), phase.unit())).collect();
    let _ = writeln!(text, "| row | {} |", header.join(" | "));
    let _ = writeln!(text, "|---|{}", "---:|".repeat(PHASES.len()));
    for row in &result.rows {
        let rates: Vec<String> = row.rates.iter().map(|rate| format!("{rate:.0}")).collect();
        let _ = writeln!(text, "| {} | {} |", row.label, rates.join(" | "));
    }
    if !result.goals.is_empty() {
        let _ = writeln!(text, "\n| goal | value | met |\n|---|---:|---|");
        for goal in &result.goals {
            let met = if goal.met { "met" } else { "missed" };
            let _ = writeln!(text, "| {} | {:.2} | {met} |", goal.text, goal.value);
        }
    }
    text
}

pub fn to_json(result: &TreeResult) -> Value {
    let shape = &result.shape;
    json!({
        "files": shape.files,
        "file_bytes": shape.file_bytes,
        "files_per_dir": shape.files_per_dir,
        "dirs_per_branch": shape.dirs_per_branch,
        "phases": PHASES.iter().map(|phase| phase.name()).collect::<Vec<_>>(),
        "rows": result.rows.iter().map(|row| json!({
            "label": row.label,
            "rates": row.rates,
        })).collect::<Vec<_>>(),
        "goals": result.goals.iter().map(|goal| json!({
            "text": goal.text,
            "value": goal.value,
            "target": goal.target,
            "met": goal.met,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_counts_leaves_and_branches_with_partial_ones() {
        let shape =
            TreeShape { files: 1050, file_bytes: 1, files_per_dir: 100, dirs_per_branch: 4 };
        assert_eq!(shape.leaf_dirs(), 11);
        assert_eq!(shape.branches(), 3);
        assert_eq!(shape.files_in(10), 50);
        assert_eq!((0..11).map(|leaf| shape.files_in(leaf)).sum::<u64>(), 1050);
    }

    #[test]
    fn every_phase_runs_on_a_directory_tree_and_leaves_it_empty() {
        let root = std::env::temp_dir().join(format!("foliofs-tree-test-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let shape = TreeShape { files: 23, file_bytes: 100, files_per_dir: 5, dirs_per_branch: 2 };
        let mut tree = PathTree { root: root.clone(), shape, renamed: false };
        let rates = run_phases(&mut tree, &shape).unwrap();
        assert_eq!(rates.len(), PHASES.len());
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        std::fs::remove_dir(&root).unwrap();
    }
}
