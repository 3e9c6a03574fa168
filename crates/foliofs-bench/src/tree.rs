//! `foliofs bench tree`: the metadata workload of issue 14. A tree of small
//! files in nested directories (`b<i>/l<j>/f<k>`) is created, stat'ed, read,
//! renamed and deleted, one phase after another, as a new user's `tar x`,
//! `find`, `grep -r`, `mv` and `rm -r` would. The same phases run in process
//! (the library's calls, directory inodes kept as a library user keeps
//! them), through a FUSE mount in each `page_cache` mode and on the kernel's
//! ext4 and XFS in the same run, each on a fresh file system with warm
//! caches (nothing dropped between phases).
//!
//! With several jobs (threads; every phase starts them together and ends
//! when the last is done) the tree's files are shared out between them in
//! one of two layouts: each job its own subtree `j<k>/b<i>/l<j>/f<k>`, or
//! all jobs in the same directories, each with its own file names
//! (`j<k>-f<n>`), the hard case for a file system's directory locks. In the
//! shared layout the directories are made and removed outside the timing,
//! and the rename phase renames files within their directory.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use foliofs::vfs::MkfsOptions;
use foliofs::{OpenFlags, Owner, RenameFlags, Volume, VolumeOptions};
use serde_json::{json, Value};

use crate::latency::lock_waits_line;
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
    /// rename every leaf directory within its parent (in the shared
    /// layout: every file within its directory).
    Rename,
    /// unlink every file, rmdir every directory.
    Delete,
}

impl Phase {
    pub fn name(self, layout: Layout) -> &'static str {
        match (self, layout) {
            (Phase::Create, _) => "create",
            (Phase::Stat, _) => "stat",
            (Phase::Read, _) => "read",
            (Phase::Rename, Layout::Subtrees) => "rename dir",
            (Phase::Rename, Layout::SharedDirs) => "rename file",
            (Phase::Delete, _) => "delete",
        }
    }

    /// What the phase's rate counts.
    pub fn unit(self, layout: Layout) -> &'static str {
        match (self, layout) {
            (Phase::Rename, Layout::Subtrees) => "dirs/s",
            _ => "files/s",
        }
    }
}

/// How the jobs share the tree out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Each job its own subtree `j<k>` of the whole shape.
    Subtrees,
    /// One tree; every job puts its share of each leaf directory's files
    /// in that directory.
    SharedDirs,
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

    /// Job `job` of `jobs`'s part of the tree: its share of the files (the
    /// first `files % jobs` jobs take one more), in directories of the same
    /// size (each its own subtree) or in the same directories, each holding
    /// its share of every directory's files.
    pub fn share(&self, job: u64, jobs: u64, layout: Layout) -> TreeShape {
        let files = self.files / jobs + u64::from(job < self.files % jobs);
        let files_per_dir = match layout {
            Layout::Subtrees => self.files_per_dir,
            Layout::SharedDirs => (self.files_per_dir / jobs).max(1),
        };
        TreeShape { files, files_per_dir, ..*self }
    }
}

/// The operations a phase needs, on one file system. Leaves are numbered
/// across the tree; the tree remembers which names are its second ones.
trait TreeFs: Send {
    fn mkdir_root(&mut self) -> anyhow::Result<()>;
    fn mkdir_branch(&mut self, branch: u64) -> anyhow::Result<()>;
    fn mkdir_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()>;
    fn create_file(&mut self, leaf: u64, file: u64, data: &[u8]) -> anyhow::Result<()>;
    fn stat_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<u64>;
    fn read_file(&mut self, leaf: u64, file: u64, buffer: &mut [u8]) -> anyhow::Result<usize>;
    fn rename_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()>;
    fn rename_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<()>;
    fn unlink_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<()>;
    fn rmdir_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()>;
    fn rmdir_branch(&mut self, branch: u64) -> anyhow::Result<()>;
    fn rmdir_root(&mut self) -> anyhow::Result<()>;
    /// Takes the directories another tree made (the shared layout's jobs
    /// work in the directories its setup made).
    fn adopt_directories(&mut self, setup: &Self)
    where
        Self: Sized;
    fn names(&mut self) -> &mut Names;
}

/// The names in one job's tree, and which of them have been renamed.
#[derive(Debug, Clone)]
struct Names {
    dirs_per_branch: u64,
    /// Before each file name: the job's, in the shared layout.
    file_prefix: String,
    leaves_renamed: bool,
    files_renamed: bool,
}

impl Names {
    fn new(dirs_per_branch: u64, file_prefix: String) -> Names {
        Names { dirs_per_branch, file_prefix, leaves_renamed: false, files_renamed: false }
    }

    fn branch(&self, branch: u64) -> String {
        format!("b{branch}")
    }

    fn branch_of(&self, leaf: u64) -> u64 {
        leaf / self.dirs_per_branch
    }

    fn leaf(&self, leaf: u64, renamed: bool) -> String {
        if renamed {
            format!("r{leaf}")
        } else {
            format!("l{leaf}")
        }
    }

    fn current_leaf(&self, leaf: u64) -> String {
        self.leaf(leaf, self.leaves_renamed)
    }

    fn file(&self, file: u64, renamed: bool) -> String {
        let letter = if renamed { 'g' } else { 'f' };
        format!("{}{letter}{file}", self.file_prefix)
    }

    fn current_file(&self, file: u64) -> String {
        self.file(file, self.files_renamed)
    }
}

/// The tree under a directory of a mounted file system, through std::fs.
struct PathTree {
    root: PathBuf,
    names: Names,
}

impl PathTree {
    fn branch(&self, branch: u64) -> PathBuf {
        self.root.join(self.names.branch(branch))
    }

    fn leaf(&self, leaf: u64) -> PathBuf {
        self.branch(self.names.branch_of(leaf)).join(self.names.current_leaf(leaf))
    }

    fn file(&self, leaf: u64, file: u64) -> PathBuf {
        self.leaf(leaf).join(self.names.current_file(file))
    }
}

impl TreeFs for PathTree {
    fn mkdir_root(&mut self) -> anyhow::Result<()> {
        std::fs::create_dir(&self.root).with_context(|| format!("mkdir {}", self.root.display()))
    }

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
        let from = self.branch(branch).join(self.names.leaf(leaf, false));
        let to = self.branch(branch).join(self.names.leaf(leaf, true));
        std::fs::rename(&from, &to).with_context(|| format!("rename {}", from.display()))
    }

    fn rename_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<()> {
        let dir = self.leaf(leaf);
        let from = dir.join(self.names.file(file, false));
        let to = dir.join(self.names.file(file, true));
        std::fs::rename(&from, &to).with_context(|| format!("rename {}", from.display()))
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

    fn rmdir_root(&mut self) -> anyhow::Result<()> {
        std::fs::remove_dir(&self.root).with_context(|| format!("rmdir {}", self.root.display()))
    }

    fn adopt_directories(&mut self, _setup: &Self) {}

    fn names(&mut self) -> &mut Names {
        &mut self.names
    }
}

/// The tree in process: the library's calls, with the directories' inode
/// numbers kept (as a library user keeps its directories open) and files
/// looked up by name in them.
struct LibraryTree<'a> {
    volume: &'a Volume,
    /// The directory the tree hangs from, and the tree's own root's name
    /// in it (None: the tree is the parent's).
    parent: u64,
    root_name: Option<String>,
    root: u64,
    owner: Owner,
    names: Names,
    branches: Vec<u64>,
    leaves: Vec<u64>,
}

impl TreeFs for LibraryTree<'_> {
    fn mkdir_root(&mut self) -> anyhow::Result<()> {
        if let Some(name) = &self.root_name {
            let attr =
                self.volume.inodes().mkdir(self.parent, name.as_bytes(), 0o755, self.owner)?;
            self.root = attr.ino;
        }
        Ok(())
    }

    fn mkdir_branch(&mut self, branch: u64) -> anyhow::Result<()> {
        let name = self.names.branch(branch);
        let attr = self.volume.inodes().mkdir(self.root, name.as_bytes(), 0o755, self.owner)?;
        self.branches.push(attr.ino);
        Ok(())
    }

    fn mkdir_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()> {
        let name = self.names.leaf(leaf, false);
        let parent = self.branches[branch as usize];
        let attr = self.volume.inodes().mkdir(parent, name.as_bytes(), 0o755, self.owner)?;
        self.leaves.push(attr.ino);
        Ok(())
    }

    fn create_file(&mut self, leaf: u64, file: u64, data: &[u8]) -> anyhow::Result<()> {
        let dir = self.leaves[leaf as usize];
        let name = self.names.file(file, false);
        let attr = self.volume.inodes().create(dir, name.as_bytes(), 0o644, self.owner)?;
        let opened = self.volume.inodes().open_file(attr.ino, OpenFlags::WRITE)?;
        opened.write_at(data, 0)?;
        opened.close()?;
        Ok(())
    }

    fn stat_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<u64> {
        let dir = self.leaves[leaf as usize];
        Ok(self.volume.inodes().lookup(dir, self.names.current_file(file).as_bytes())?.size)
    }

    fn read_file(&mut self, leaf: u64, file: u64, buffer: &mut [u8]) -> anyhow::Result<usize> {
        let dir = self.leaves[leaf as usize];
        let attr = self.volume.inodes().lookup(dir, self.names.current_file(file).as_bytes())?;
        let opened = self.volume.inodes().open_file(attr.ino, OpenFlags::READ)?;
        let read = opened.read_at(buffer, 0)?;
        opened.close()?;
        Ok(read)
    }

    fn rename_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()> {
        let parent = self.branches[branch as usize];
        let (from, to) = (self.names.leaf(leaf, false), self.names.leaf(leaf, true));
        self.volume.inodes().rename(
            parent,
            from.as_bytes(),
            parent,
            to.as_bytes(),
            RenameFlags::default(),
        )?;
        Ok(())
    }

    fn rename_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<()> {
        let dir = self.leaves[leaf as usize];
        let (from, to) = (self.names.file(file, false), self.names.file(file, true));
        self.volume.inodes().rename(
            dir,
            from.as_bytes(),
            dir,
            to.as_bytes(),
            RenameFlags::default(),
        )?;
        Ok(())
    }

    fn unlink_file(&mut self, leaf: u64, file: u64) -> anyhow::Result<()> {
        let dir = self.leaves[leaf as usize];
        Ok(self.volume.inodes().unlink(dir, self.names.current_file(file).as_bytes())?)
    }

    fn rmdir_leaf(&mut self, branch: u64, leaf: u64) -> anyhow::Result<()> {
        let parent = self.branches[branch as usize];
        Ok(self.volume.inodes().rmdir(parent, self.names.current_leaf(leaf).as_bytes())?)
    }

    fn rmdir_branch(&mut self, branch: u64) -> anyhow::Result<()> {
        Ok(self.volume.inodes().rmdir(self.root, self.names.branch(branch).as_bytes())?)
    }

    fn rmdir_root(&mut self) -> anyhow::Result<()> {
        if let Some(name) = &self.root_name {
            self.volume.inodes().rmdir(self.parent, name.as_bytes())?;
        }
        Ok(())
    }

    fn adopt_directories(&mut self, setup: &Self) {
        self.root = setup.root;
        self.branches = setup.branches.clone();
        self.leaves = setup.leaves.clone();
    }

    fn names(&mut self) -> &mut Names {
        &mut self.names
    }
}

/// One job's part of one phase; returns the operations it made.
fn run_job_phase(
    fs: &mut dyn TreeFs,
    shape: &TreeShape,
    phase: Phase,
    layout: Layout,
) -> anyhow::Result<u64> {
    let data = vec![0x5Au8; shape.file_bytes];
    let mut buffer = vec![0u8; shape.file_bytes.max(1)];
    let mut operations = 0u64;
    // The shared layout's directories are made and removed by the setup.
    let own_dirs = layout == Layout::Subtrees;
    let branch_of = |leaf: u64| leaf / shape.dirs_per_branch;
    match phase {
        Phase::Create => {
            for leaf in 0..shape.leaf_dirs() {
                if own_dirs {
                    if leaf % shape.dirs_per_branch == 0 {
                        fs.mkdir_branch(branch_of(leaf))?;
                    }
                    fs.mkdir_leaf(branch_of(leaf), leaf)?;
                }
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
        Phase::Rename if own_dirs => {
            for leaf in 0..shape.leaf_dirs() {
                fs.rename_leaf(branch_of(leaf), leaf)?;
                operations += 1;
            }
            fs.names().leaves_renamed = true;
        }
        Phase::Rename => {
            for leaf in 0..shape.leaf_dirs() {
                for file in 0..shape.files_in(leaf) {
                    fs.rename_file(leaf, file)?;
                    operations += 1;
                }
            }
            fs.names().files_renamed = true;
        }
        Phase::Delete => {
            for leaf in 0..shape.leaf_dirs() {
                for file in 0..shape.files_in(leaf) {
                    fs.unlink_file(leaf, file)?;
                    operations += 1;
                }
                if own_dirs {
                    fs.rmdir_leaf(branch_of(leaf), leaf)?;
                    let last_of_branch =
                        (leaf + 1) % shape.dirs_per_branch == 0 || leaf + 1 == shape.leaf_dirs();
                    if last_of_branch {
                        fs.rmdir_branch(branch_of(leaf))?;
                    }
                }
            }
        }
    }
    Ok(operations)
}

/// One phase from every job at once: each job a thread, the phase timed
/// from their start to the last one's end. Returns the operations made.
fn run_phase<T: TreeFs>(
    trees: &mut [T],
    shapes: &[TreeShape],
    phase: Phase,
    layout: Layout,
) -> anyhow::Result<(u64, f64)> {
    let started = Instant::now();
    let operations = std::thread::scope(|scope| -> anyhow::Result<u64> {
        let jobs: Vec<_> = trees
            .iter_mut()
            .zip(shapes)
            .map(|(tree, shape)| scope.spawn(move || run_job_phase(tree, shape, phase, layout)))
            .collect();
        let mut total = 0;
        for (job, handle) in jobs.into_iter().enumerate() {
            let made = handle.join().map_err(|_| anyhow::anyhow!("tree job {job} panicked"))?;
            total += made.with_context(|| format!("job {job}"))?;
        }
        Ok(total)
    })?;
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    Ok((operations, operations as f64 / seconds))
}

/// Every phase, from `trees.len()` jobs (`shapes`: each one's part), with
/// the untimed setup and teardown around them: each job's root, and in
/// the shared layout every directory. Returns the rate of each phase and
/// the operations made in all.
fn run_phases<T: TreeFs>(
    trees: &mut [T],
    shapes: &[TreeShape],
    layout: Layout,
) -> anyhow::Result<(Vec<f64>, u64)> {
    anyhow::ensure!(!trees.is_empty() && trees.len() == shapes.len());
    // The shared layout's directories: as many leaves as the job with the
    // most needs.
    let most_leaves = shapes.iter().map(TreeShape::leaf_dirs).max().unwrap_or(0);
    let dirs = TreeShape { files: most_leaves, files_per_dir: 1, ..shapes[0] };
    match layout {
        Layout::Subtrees => {
            for tree in trees.iter_mut() {
                tree.mkdir_root()?;
            }
        }
        Layout::SharedDirs => {
            let (setup, others) = trees.split_first_mut().expect("at least one job");
            setup.mkdir_root()?;
            for leaf in 0..dirs.leaf_dirs() {
                let branch = leaf / dirs.dirs_per_branch;
                if leaf % dirs.dirs_per_branch == 0 {
                    setup.mkdir_branch(branch)?;
                }
                setup.mkdir_leaf(branch, leaf)?;
            }
            for tree in others {
                tree.adopt_directories(setup);
            }
        }
    }
    let mut rates = Vec::new();
    let mut operations = 0;
    for phase in PHASES {
        let (made, rate) =
            run_phase(trees, shapes, phase, layout).with_context(|| phase.name(layout))?;
        rates.push(rate);
        operations += made;
    }
    match layout {
        Layout::Subtrees => {
            for tree in trees.iter_mut() {
                tree.rmdir_root()?;
            }
        }
        Layout::SharedDirs => {
            let setup = &mut trees[0];
            for leaf in 0..dirs.leaf_dirs() {
                let branch = leaf / dirs.dirs_per_branch;
                setup.rmdir_leaf(branch, leaf)?;
                if (leaf + 1) % dirs.dirs_per_branch == 0 || leaf + 1 == dirs.leaf_dirs() {
                    setup.rmdir_branch(branch)?;
                }
            }
            setup.rmdir_root()?;
        }
    }
    Ok((rates, operations))
}

/// Each job's root directory's name and its names.
fn job_names(job: u64, layout: Layout, shape: &TreeShape) -> (String, Names) {
    match layout {
        Layout::Subtrees => (format!("j{job}"), Names::new(shape.dirs_per_branch, String::new())),
        Layout::SharedDirs => {
            ("shared".to_string(), Names::new(shape.dirs_per_branch, format!("j{job}-")))
        }
    }
}

fn shares(shape: &TreeShape, jobs: u64, layout: Layout) -> Vec<TreeShape> {
    (0..jobs).map(|job| shape.share(job, jobs, layout)).collect()
}

/// The phases from `jobs` threads in the directory `base` of a mounted
/// file system.
fn run_on_path(
    base: &Path,
    shape: &TreeShape,
    jobs: u64,
    layout: Layout,
) -> anyhow::Result<(Vec<f64>, u64)> {
    let mut trees: Vec<PathTree> = (0..jobs)
        .map(|job| {
            let (root, names) = job_names(job, layout, shape);
            PathTree { root: base.join(root), names }
        })
        .collect();
    run_phases(&mut trees, &shares(shape, jobs, layout), layout)
}

/// The phases from `jobs` threads through the library's calls, on an open
/// volume; the rates, and the metadata lock waits as one line.
fn run_in_process(
    volume: &Volume,
    shape: &TreeShape,
    jobs: u64,
    layout: Layout,
) -> anyhow::Result<(Vec<f64>, String)> {
    // Taken once, as a library user holds its credentials; the kernel
    // peers read theirs from the task, at no cost.
    let owner = Owner::current();
    let mut trees: Vec<LibraryTree> = (0..jobs)
        .map(|job| {
            let (root, names) = job_names(job, layout, shape);
            LibraryTree {
                volume,
                parent: 1,
                root_name: Some(root),
                root: 1,
                owner,
                names,
                branches: Vec::new(),
                leaves: Vec::new(),
            }
        })
        .collect();
    let waits_before = volume.lock_waits();
    let (rates, operations) = run_phases(&mut trees, &shares(shape, jobs, layout), layout)?;
    let waits = volume.lock_waits();
    Ok((rates, lock_waits_line(&waits_before, &waits, operations as f64)))
}

/// One row: a file system, the jobs that ran on it and its rate per phase
/// (in `PHASES` order).
#[derive(Debug, Clone)]
pub struct TreeRow {
    pub label: String,
    pub jobs: u64,
    /// The median of `runs`, per phase.
    pub rates: Vec<f64>,
    /// Each run's rates, in the order they ran.
    pub runs: Vec<Vec<f64>>,
    /// What else was measured (in process: the metadata lock waits).
    pub note: Option<String>,
}

pub struct TreeGoal {
    pub text: String,
    pub value: f64,
    pub target: f64,
    pub met: bool,
}

pub struct TreeResult {
    pub shape: TreeShape,
    pub layout: Layout,
    pub rows: Vec<TreeRow>,
    pub goals: Vec<TreeGoal>,
}

pub struct TreeOptions {
    pub shape: TreeShape,
    /// Each count of jobs to run every row with (the tree shared out
    /// between them).
    pub jobs: Vec<u64>,
    /// Runs of every row, at least 1; within a run each count of jobs runs
    /// in turn, so a drift of the machine's speed falls on all of them.
    pub reps: usize,
    pub layout: Layout,
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
    let layout = options.layout;
    anyhow::ensure!(shape.files > 0 && shape.files_per_dir > 0 && shape.dirs_per_branch > 0);
    anyhow::ensure!(!options.jobs.is_empty(), "no job counts to run");
    if let Some(&jobs) = options.jobs.iter().find(|&&jobs| jobs == 0 || jobs > shape.files) {
        anyhow::bail!("{jobs} jobs for {} files: each job needs a file at least", shape.files);
    }
    anyhow::ensure!(options.reps > 0, "no runs to make");
    let mkfs = MkfsOptions { block_bytes: 4096, ..MkfsOptions::default() };
    let mut rows = Vec::new();
    let runs_text = |rep: usize| {
        if options.reps == 1 {
            String::new()
        } else {
            format!(", run {} of {}", rep + 1, options.reps)
        }
    };

    for rep in 0..options.reps {
        for &jobs in &options.jobs {
            progress(&format!("foliofs (in process), {}{}", jobs_text(jobs), runs_text(rep)));
            Volume::mkfs_path(image, None, &mkfs, &options.volume_options)?;
            let volume = Volume::open(image, &options.volume_options)?;
            let (rates, waits) =
                run_in_process(&volume, &shape, jobs, layout).context("in process")?;
            volume.close()?;
            record(&mut rows, "foliofs", jobs, rates, Some(waits));
        }
    }

    if options.peers {
        if let Some(program) = &options.mount_program {
            let mount_point =
                options.work_dir.join(format!("foliofs-tree-mnt-{}", std::process::id()));
            for (label, variant_options) in mount_variants(options) {
                for (rep, &jobs) in runs_of(options) {
                    progress(&format!("{label}, {}{}", jobs_text(jobs), runs_text(rep)));
                    Volume::mkfs_path(image, None, &mkfs, &options.volume_options)?;
                    let mount_options = [options.volume_options_text.as_str(), &variant_options]
                        .iter()
                        .filter(|part| !part.is_empty())
                        .copied()
                        .collect::<Vec<_>>()
                        .join(",");
                    let mounted = FuseMount::start(program, image, &mount_point, &mount_options)?;
                    let measured = run_on_path(&mounted.mount, &shape, jobs, layout)
                        .with_context(|| label.clone());
                    mounted.stop()?;
                    let (rates, _) = measured?;
                    record(&mut rows, &label, jobs, rates, None);
                }
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
            for (rep, &jobs) in runs_of(options) {
                progress(&format!("{label}, {}{}", jobs_text(jobs), runs_text(rep)));
                let (rates, _) =
                    run_on_path(&fs.mount, &shape, jobs, layout).with_context(|| label.clone())?;
                record(&mut rows, &label, jobs, rates, None);
            }
        }
        drop(peers);
    }
    let goals = goals(&rows, layout);
    Ok(TreeResult { shape, layout, rows, goals })
}

/// Every (run, count of jobs) in the order they run.
fn runs_of(options: &TreeOptions) -> impl Iterator<Item = (usize, &u64)> {
    (0..options.reps).flat_map(move |rep| options.jobs.iter().map(move |jobs| (rep, jobs)))
}

/// Adds a run to the row of `label` with `jobs` (made on its first run);
/// the row's rates become the median of its runs, its note the last run's.
fn record(rows: &mut Vec<TreeRow>, label: &str, jobs: u64, rates: Vec<f64>, note: Option<String>) {
    let index = match rows.iter().position(|row| row.label == label && row.jobs == jobs) {
        Some(index) => index,
        None => {
            rows.push(TreeRow {
                label: label.to_string(),
                jobs,
                rates: Vec::new(),
                runs: Vec::new(),
                note: None,
            });
            rows.len() - 1
        }
    };
    let row = &mut rows[index];
    row.runs.push(rates);
    row.rates = (0..PHASES.len())
        .map(|phase| median(row.runs.iter().map(|run| run[phase]).collect()))
        .collect();
    row.note = note;
}

/// The middle value (the mean of the middle two of an even count).
/// The median of `values` (the mean of the middle two when even).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

/// The goals: in process every phase >= 2x kernel ext4 with as many
/// workers (issue 14), through the mount >= 0.5x; in the shared layout,
/// creates in process >= kernel ext4's (issue 36); and from one job to two,
/// every phase in process >= 1.6x (issue 36, on 2 CPUs).
fn goals(rows: &[TreeRow], layout: Layout) -> Vec<TreeGoal> {
    let mut goals = Vec::new();
    let find =
        |label: &str, jobs: u64| rows.iter().find(|row| row.label == label && row.jobs == jobs);
    for row in rows.iter().filter(|row| !row.label.starts_with("kernel")) {
        let Some(ext4) = find("kernel ext4", row.jobs) else {
            continue;
        };
        let in_process = row.label == "foliofs";
        let (target, phases): (f64, &[Phase]) = match layout {
            Layout::Subtrees if in_process => (2.0, &PHASES),
            Layout::Subtrees => (0.5, &PHASES),
            Layout::SharedDirs if in_process => (1.0, &[Phase::Create]),
            Layout::SharedDirs => continue,
        };
        for &phase in phases {
            let index = phase_index(phase);
            let value = row.rates[index] / ext4.rates[index].max(1e-9);
            goals.push(TreeGoal {
                text: format!(
                    "{} {} ({}) / kernel ext4 >= {target}",
                    row.label,
                    phase.name(layout),
                    jobs_text(row.jobs)
                ),
                value,
                target,
                met: value >= target,
            });
        }
    }
    if let (Layout::Subtrees, Some(one), Some(two)) =
        (layout, find("foliofs", 1), find("foliofs", 2))
    {
        let target = 1.6;
        let factors = scaling_of(two, one);
        for (index, phase) in PHASES.iter().enumerate() {
            let value = factors[index].median;
            goals.push(TreeGoal {
                text: format!("foliofs {} 2 jobs / 1 job >= {target}", phase.name(layout)),
                value,
                target,
                met: value >= target,
            });
        }
    }
    goals
}

/// "1 job", "2 jobs".
pub fn jobs_text(jobs: u64) -> String {
    if jobs == 1 {
        "1 job".to_string()
    } else {
        format!("{jobs} jobs")
    }
}

fn phase_index(phase: Phase) -> usize {
    PHASES.iter().position(|&each| each == phase).expect("every phase is in PHASES")
}

fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Subtrees => "each job its own subtree",
        Layout::SharedDirs => "all jobs in the same directories",
    }
}

/// How a phase scaled: the median of each run's own factor (a run's rate
/// over the same run's rate with fewer jobs), and the lowest and highest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Factor {
    pub median: f64,
    pub low: f64,
    pub high: f64,
}

impl Factor {
    /// The median of runs' own factors, and their range.
    pub fn of(factors: Vec<f64>) -> Self {
        let low = factors.iter().copied().fold(f64::INFINITY, f64::min);
        let high = factors.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Self { median: median(factors), low, high }
    }
}

/// `row` over `base`, per phase, run by run.
fn scaling_of(row: &TreeRow, base: &TreeRow) -> Vec<Factor> {
    (0..PHASES.len())
        .map(|phase| {
            let factors: Vec<f64> = row
                .runs
                .iter()
                .zip(&base.runs)
                .map(|(run, base_run)| run[phase] / base_run[phase].max(1e-9))
                .collect();
            Factor::of(factors)
        })
        .collect()
}

/// Each row's rates over the same file system's rates with the fewest
/// jobs, for the file systems run with more than one count of jobs.
fn scaling_rows(rows: &[TreeRow]) -> Vec<(String, u64, u64, Vec<Factor>)> {
    let mut scaling = Vec::new();
    for row in rows {
        let fewest = rows
            .iter()
            .filter(|other| other.label == row.label)
            .min_by_key(|other| other.jobs)
            .expect("the row itself");
        if fewest.jobs == row.jobs {
            continue;
        }
        scaling.push((row.label.clone(), row.jobs, fewest.jobs, scaling_of(row, fewest)));
    }
    scaling
}

pub fn to_markdown(result: &TreeResult) -> String {
    let shape = &result.shape;
    let layout = result.layout;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "## bench tree: {} files of {} bytes, {} per directory, {} directories under each of {}; {}\n",
        shape.files,
        shape.file_bytes,
        shape.files_per_dir,
        shape.dirs_per_branch,
        shape.branches(),
        layout_name(layout)
    );
    let header: Vec<String> = PHASES
        .iter()
        .map(|phase| format!("{} ({})", phase.name(layout), phase.unit(layout)))
        .collect();
    let runs = result.rows.first().map_or(1, |row| row.runs.len());
    if runs > 1 {
        let _ = writeln!(
            text,
            "Medians of {runs} runs; a scaling factor is the median of each run's own, with \
             the lowest and highest.\n"
        );
    }
    let _ = writeln!(text, "| row | jobs | {} |", header.join(" | "));
    let _ = writeln!(text, "|---|---:|{}", "---:|".repeat(PHASES.len()));
    for row in &result.rows {
        let rates: Vec<String> = row.rates.iter().map(|rate| format!("{rate:.0}")).collect();
        let _ = writeln!(text, "| {} | {} | {} |", row.label, row.jobs, rates.join(" | "));
    }
    let scaling = scaling_rows(&result.rows);
    if !scaling.is_empty() {
        let _ = writeln!(text, "\n| scaling | jobs | {} |", header.join(" | "));
        let _ = writeln!(text, "|---|---:|{}", "---:|".repeat(PHASES.len()));
        for (label, jobs, fewest, factors) in &scaling {
            let factors: Vec<String> = factors
                .iter()
                .map(|factor| match result.rows[0].runs.len() {
                    1 => format!("{:.2}x", factor.median),
                    _ => format!("{:.2}x ({:.2}-{:.2})", factor.median, factor.low, factor.high),
                })
                .collect();
            let _ = writeln!(text, "| {label} | {jobs} / {fewest} | {} |", factors.join(" | "));
        }
    }
    for row in result.rows.iter().filter(|row| row.note.is_some()) {
        let note = row.note.as_deref().unwrap_or_default();
        let _ = writeln!(text, "\n{}, {}: {note}", row.label, jobs_text(row.jobs));
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
    let layout = result.layout;
    json!({
        "files": shape.files,
        "file_bytes": shape.file_bytes,
        "files_per_dir": shape.files_per_dir,
        "dirs_per_branch": shape.dirs_per_branch,
        "layout": match layout {
            Layout::Subtrees => "subtrees",
            Layout::SharedDirs => "shared-dir",
        },
        "phases": PHASES.iter().map(|phase| phase.name(layout)).collect::<Vec<_>>(),
        "rows": result.rows.iter().map(|row| json!({
            "label": row.label,
            "jobs": row.jobs,
            "rates": row.rates,
            "runs": row.runs,
            "note": row.note,
        })).collect::<Vec<_>>(),
        "scaling": scaling_rows(&result.rows).iter().map(|(label, jobs, fewest, factors)| json!({
            "label": label,
            "jobs": jobs,
            "over_jobs": fewest,
            "factors": factors.iter().map(|factor| factor.median).collect::<Vec<_>>(),
            "factor_ranges": factors.iter().map(|factor| [factor.low, factor.high]).collect::<Vec<_>>(),
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
    fn the_jobs_shares_add_up_to_the_tree() {
        let shape =
            TreeShape { files: 1050, file_bytes: 1, files_per_dir: 100, dirs_per_branch: 4 };
        for layout in [Layout::Subtrees, Layout::SharedDirs] {
            let parts = shares(&shape, 4, layout);
            assert_eq!(parts.iter().map(|part| part.files).sum::<u64>(), 1050);
            assert_eq!(parts[0].files, 263);
            assert_eq!(parts[3].files, 262);
        }
        // In one directory tree, each job holds a quarter of every
        // directory: as many directories as the whole tree has.
        let parts = shares(&shape, 4, Layout::SharedDirs);
        assert_eq!(parts[0].files_per_dir, 25);
        assert_eq!(parts[0].leaf_dirs(), 11);
        assert_eq!(shares(&shape, 4, Layout::Subtrees)[0].leaf_dirs(), 3);
    }

    /// A row's rates are the medians of its runs, and a factor the median
    /// of each run's own: a run that was slow throughout moves neither.
    #[test]
    fn factors_are_medians_of_each_runs_own() {
        let mut rows = Vec::new();
        let phases = PHASES.len();
        for (one, two) in [(100.0, 200.0), (50.0, 60.0), (200.0, 250.0)] {
            record(&mut rows, "fs", 1, vec![one; phases], None);
            record(&mut rows, "fs", 2, vec![two; phases], Some("last".into()));
        }
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].rates[0], rows[1].rates[0]), (100.0, 200.0));
        assert_eq!(rows[1].note.as_deref(), Some("last"));
        let scaling = scaling_rows(&rows);
        let factor = scaling[0].3[0];
        // Runs of 2.0, 1.2 and 1.25: the median is 1.25, where the ratio of
        // the medians (200 / 100) would claim 2.0.
        assert_eq!(factor, Factor { median: 1.25, low: 1.2, high: 2.0 });
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    fn entries(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn every_phase_runs_on_a_directory_tree_and_leaves_it_empty() {
        let root = std::env::temp_dir().join(format!("foliofs-tree-test-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let shape = TreeShape { files: 23, file_bytes: 100, files_per_dir: 5, dirs_per_branch: 2 };
        for layout in [Layout::Subtrees, Layout::SharedDirs] {
            for jobs in [1, 3] {
                let (rates, operations) = run_on_path(&root, &shape, jobs, layout).unwrap();
                assert_eq!(rates.len(), PHASES.len());
                let renames = match layout {
                    Layout::Subtrees => {
                        shares(&shape, jobs, layout).iter().map(TreeShape::leaf_dirs).sum::<u64>()
                    }
                    Layout::SharedDirs => 23,
                };
                assert_eq!(operations, 4 * 23 + renames, "{layout:?} with {jobs} jobs");
                assert_eq!(entries(&root), 0, "{layout:?} with {jobs} jobs");
            }
        }
        std::fs::remove_dir(&root).unwrap();
    }

    #[test]
    fn jobs_in_one_volume_share_its_directories_and_leave_it_empty() {
        let dir = std::env::temp_dir().join(format!("foliofs-tree-volume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("image");
        let shape = TreeShape { files: 60, file_bytes: 10, files_per_dir: 8, dirs_per_branch: 3 };
        std::fs::File::create(&image).unwrap().set_len(image_bytes(&shape)).unwrap();
        let options = TreeOptions {
            shape,
            jobs: vec![1, 3],
            reps: 2,
            layout: Layout::SharedDirs,
            peers: false,
            work_dir: dir.clone(),
            volume_options: VolumeOptions::default(),
            volume_options_text: String::new(),
            mount_program: None,
            page_cache_modes: Vec::new(),
            opens_modes: Vec::new(),
        };
        let result = run(&options, &image, &|_| {}).unwrap();
        assert_eq!(result.rows.len(), 2);
        assert!(result.rows.iter().all(|row| row.runs.len() == 2), "two runs a row");
        assert!(result.rows.iter().all(|row| row.rates.iter().all(|&rate| rate > 0.0)));
        assert!(result.rows[1].note.as_deref().unwrap().starts_with("lock waits: shards"));
        let markdown = to_markdown(&result);
        assert!(markdown.contains("| foliofs | 3 / 1 |"), "{markdown}");
        assert!(markdown.contains("Medians of 2 runs"), "{markdown}");
        // The last run's volume: every file and directory gone but the root.
        let volume = Volume::open(&image, &VolumeOptions::default()).unwrap();
        assert_eq!(volume.inodes().readdir(1).unwrap().len(), 0);
        volume.close().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
