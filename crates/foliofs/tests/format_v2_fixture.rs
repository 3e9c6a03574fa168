//! Volumes of format version 2 keep opening (issue 53): two images made once
//! by a version-2 build and checked in under `tests/fixtures/`, never to be
//! made again, are opened by today's build, checked against the description
//! they were made from, fsck'd, changed, closed and reopened.
//!
//! - `format-v2-clean.sparse`: the volume closed cleanly (a checkpoint holds
//!   everything).
//! - `format-v2-replay.sparse`: the same contents, the last
//!   [`STEPS_AFTER_CHECKPOINT`] steps made after a checkpoint and only
//!   synced, the image taken without a close: opening it replays the journal.
//!
//! [`description`] is the single list of steps that made the fixtures and
//! that [`Model`] turns into the expected tree; keep it as it is, since the
//! fixtures cannot be remade once the format changes. `cargo test --test
//! format_v2_fixture -- --ignored make_format_v2_fixtures` made them, and
//! refuses to overwrite them.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use foliofs::dev::{Device, FaultDev, FuaMode};
use foliofs::format::{Superblock, HEADER_BYTES};
use foliofs::{
    FallocateMode, MapKind, MkfsOptions, OpenOptions, Permissions, Privilege, SetAttr, Volume,
    XattrFlags,
};

use common::{open_image, owner, pattern};

// ---------------------------------------------------------------------------
// The description
// ---------------------------------------------------------------------------

const VOLUME_BYTES: u64 = 64 << 20;
const BLOCK_BYTES: u32 = 4096;
const BLOCK: u64 = BLOCK_BYTES as u64;
/// The format version the fixtures were made in, as their superblocks say.
const FIXTURE_FORMAT_VERSION: u32 = 2;

const CLEAN_FIXTURE: &str = "format-v2-clean.sparse";
const REPLAY_FIXTURE: &str = "format-v2-replay.sparse";

/// How many of the description's last steps the replay fixture holds only in
/// its journal.
const STEPS_AFTER_CHECKPOINT: usize = 20;

// The paths the shape checks (hole, clone, preallocation) look at, named once
// so that the description and the checks cannot drift apart.
const SPARSE: &str = "/data/sparse";
const SPARSE_FIRST_BYTES: usize = 64 << 10;
const SPARSE_SECOND_AT: u64 = 600 << 10;
const CLONE_SOURCE: &str = "/data/file-100k";
const CLONE: &str = "/data/file-100k.clone";
const CLONE_OVERWRITTEN_BLOCK: u64 = 5;
const CLONED_BYTES: usize = 100 << 10;
const PREALLOCATED: &str = "/data/preallocated";
const PREALLOCATED_WRITTEN: usize = 5000;
const PREALLOCATED_AT: u64 = 2 * BLOCK;
const PREALLOCATED_BYTES: u64 = 16 * BLOCK;
/// Unshared data that the flipped-byte test damages.
const LARGE_FILE: &str = "/data/file-1m-plus-3";
/// What the tests add after opening a fixture.
const ADDED_AFTER_OPEN: &str = "/added-after-open";

/// One change to the volume, made through the public path API where it
/// reaches (the inode-level calls only for xattrs and owners).
#[derive(Debug, Clone)]
enum Step {
    Mkdir {
        path: &'static str,
    },
    /// `count` empty files `entry-000`... in `dir`.
    ManyEmptyFiles {
        dir: &'static str,
        count: usize,
    },
    /// Writes `pattern(seed, length)` at `offset`, creating the file (mode
    /// 0o644 after the umask) if it is missing.
    Write {
        path: &'static str,
        offset: u64,
        seed: u64,
        length: usize,
    },
    Truncate {
        path: &'static str,
        length: u64,
    },
    /// Allocates unwritten space (fallocate without KEEP_SIZE).
    Preallocate {
        path: &'static str,
        offset: u64,
        length: u64,
    },
    /// `cp --reflink`: the copy shares the source's blocks.
    Clone {
        source: &'static str,
        target: &'static str,
    },
    HardLink {
        original: &'static str,
        link: &'static str,
    },
    Symlink {
        target: &'static str,
        link: &'static str,
    },
    SetXattr {
        path: &'static str,
        name: &'static str,
        seed: u64,
        length: usize,
    },
    Chmod {
        path: &'static str,
        mode: u32,
    },
    Chown {
        path: &'static str,
        uid: u32,
        gid: u32,
    },
    /// Of a non-directory.
    Rename {
        from: &'static str,
        to: &'static str,
    },
    /// Of a non-directory.
    Remove {
        path: &'static str,
    },
}

/// What the fixtures hold, in the order it was made. Never edit it: the
/// fixtures were made from it by a build that no longer exists.
fn description() -> Vec<Step> {
    use Step::*;
    vec![
        Mkdir { path: "/a" },
        Mkdir { path: "/a/b" },
        Mkdir { path: "/a/b/c" },
        Mkdir { path: "/a/b/c/d" },
        Mkdir { path: "/data" },
        Mkdir { path: "/links" },
        Mkdir { path: "/scratch" },
        Mkdir { path: "/many" },
        ManyEmptyFiles { dir: "/many", count: 300 },
        Write { path: "/a/b/c/d/deep.txt", offset: 0, seed: 1, length: 777 },
        Write { path: "/data/empty", offset: 0, seed: 2, length: 0 },
        Write { path: "/data/one-byte", offset: 0, seed: 3, length: 1 },
        Write { path: "/data/file-4k", offset: 0, seed: 4, length: 4096 },
        Write { path: CLONE_SOURCE, offset: 0, seed: 5, length: CLONED_BYTES },
        Write { path: LARGE_FILE, offset: 0, seed: 6, length: (1 << 20) + 3 },
        Write { path: SPARSE, offset: 0, seed: 7, length: SPARSE_FIRST_BYTES },
        Write { path: "/data/shrunk", offset: 0, seed: 8, length: 100 << 10 },
        Write { path: "/scratch/doomed", offset: 0, seed: 9, length: 10_000 },
        Write { path: "/scratch/draft", offset: 0, seed: 10, length: 3000 },
        Write { path: PREALLOCATED, offset: 0, seed: 11, length: PREALLOCATED_WRITTEN },
        // The replay fixture's checkpoint falls here: what follows is only
        // in its journal.
        Write { path: SPARSE, offset: SPARSE_SECOND_AT, seed: 12, length: SPARSE_FIRST_BYTES },
        Clone { source: CLONE_SOURCE, target: CLONE },
        Write {
            path: CLONE,
            offset: CLONE_OVERWRITTEN_BLOCK * BLOCK,
            seed: 13,
            length: BLOCK_BYTES as usize,
        },
        Truncate { path: "/data/shrunk", length: 30_001 },
        Preallocate { path: PREALLOCATED, offset: PREALLOCATED_AT, length: PREALLOCATED_BYTES },
        HardLink { original: "/data/file-4k", link: "/links/hard-4k" },
        Symlink { target: "../data/one-byte", link: "/links/to-one-byte" },
        Symlink { target: "nowhere/at/all", link: "/links/dangling" },
        SetXattr { path: LARGE_FILE, name: "user.checksum", seed: 14, length: 200 },
        SetXattr { path: "/a", name: "user.purpose", seed: 15, length: 17 },
        // Through the hard link's second name: one inode, both names see it.
        SetXattr { path: "/links/hard-4k", name: "user.via-link", seed: 16, length: 5 },
        Chmod { path: "/data/one-byte", mode: 0o600 },
        Chmod { path: "/a/b", mode: 0o750 },
        Chown { path: "/data/file-4k", uid: 1234, gid: 5678 },
        Chown { path: "/a/b/c", uid: 4321, gid: 8765 },
        Rename { from: "/scratch/draft", to: "/a/b/final" },
        Remove { path: "/scratch/doomed" },
        Write { path: "/many/entry-299", offset: 0, seed: 17, length: 10 },
        Mkdir { path: "/a/b/c/d/e" },
        Write { path: "/a/b/c/d/e/late.txt", offset: 0, seed: 18, length: 1234 },
    ]
}

fn many_entry_name(index: usize) -> String {
    format!("entry-{index:03}")
}

fn apply(volume: &Volume, step: &Step) -> foliofs::Result<()> {
    match *step {
        Step::Mkdir { path } => volume.create_dir(path),
        Step::ManyEmptyFiles { dir, count } => {
            for index in 0..count {
                let path = format!("{dir}/{}", many_entry_name(index));
                OpenOptions::new().write(true).create_new(true).open(volume, path)?.close()?;
            }
            Ok(())
        }
        Step::Write { path, offset, seed, length } => {
            let file = OpenOptions::new().write(true).create(true).open(volume, path)?;
            file.write_all_at(&pattern(seed, length), offset)?;
            file.close()
        }
        Step::Truncate { path, length } => {
            let file = OpenOptions::new().write(true).open(volume, path)?;
            file.set_len(length)?;
            file.close()
        }
        Step::Preallocate { path, offset, length } => {
            let file = OpenOptions::new().write(true).open(volume, path)?;
            file.fallocate(FallocateMode::Allocate { keep_size: false }, offset, length)?;
            file.close()
        }
        Step::Clone { source, target } => volume.clone_file(source, target),
        Step::HardLink { original, link } => volume.hard_link(original, link),
        Step::Symlink { target, link } => volume.symlink(target, link),
        Step::SetXattr { path, name, seed, length } => {
            let ino = volume.symlink_metadata(path)?.ino();
            let value = pattern(seed, length);
            let flags = XattrFlags::default();
            volume.inodes().set_xattr(ino, name.as_bytes(), &value, flags, Privilege::Unprivileged)
        }
        Step::Chmod { path, mode } => volume.set_permissions(path, Permissions::from_mode(mode)),
        Step::Chown { path, uid, gid } => {
            // The path API has no chown: the inode-level setattr does it.
            let ino = volume.symlink_metadata(path)?.ino();
            let changes = SetAttr { uid: Some(uid), gid: Some(gid), ..SetAttr::default() };
            volume.inodes().setattr(ino, &changes).map(drop)
        }
        Step::Rename { from, to } => volume.rename(from, to),
        Step::Remove { path } => volume.remove_file(path),
    }
}

// ---------------------------------------------------------------------------
// The model: the description applied to a tree in memory
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Contents {
    Dir,
    File(Vec<u8>),
    Symlink(String),
}

#[derive(Debug, Clone)]
struct Node {
    contents: Contents,
    /// Permission bits: 0o755 for directories and 0o644 for files as the
    /// path API makes them (umask 022), or what a chmod set.
    mode: u32,
    /// Set only by a chown: the path API creates nodes owned by the process
    /// that made the fixture, which says nothing about the format.
    owner: Option<(u32, u32)>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

/// Paths to nodes (hard links share one), and the paths that once existed
/// and must not any more.
#[derive(Debug, Default)]
struct Model {
    paths: BTreeMap<String, usize>,
    nodes: Vec<Node>,
    gone: BTreeSet<String>,
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) => "/",
        Some(at) => &path[..at],
        None => panic!("{path} is not absolute"),
    }
}

fn name_of(path: &str) -> &str {
    &path[path.rfind('/').expect("absolute") + 1..]
}

impl Model {
    fn of(steps: &[Step]) -> Self {
        let mut model = Model::default();
        model.add("/", Contents::Dir, 0o755);
        // mkfs's root owner.
        model.nodes[0].owner = Some((owner().uid, owner().gid));
        for step in steps {
            model.apply(step);
        }
        model
    }

    fn add(&mut self, path: &str, contents: Contents, mode: u32) {
        let node = Node { contents, mode, owner: None, xattrs: BTreeMap::new() };
        self.nodes.push(node);
        assert!(self.paths.insert(path.to_string(), self.nodes.len() - 1).is_none(), "{path}");
        self.gone.remove(path);
    }

    fn node_mut(&mut self, path: &str) -> &mut Node {
        let index = self.paths[path];
        &mut self.nodes[index]
    }

    fn file_mut(&mut self, path: &str) -> &mut Vec<u8> {
        match &mut self.node_mut(path).contents {
            Contents::File(data) => data,
            other => panic!("{path} is {other:?}, not a file"),
        }
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Mkdir { path } => self.add(path, Contents::Dir, 0o755),
            Step::ManyEmptyFiles { dir, count } => {
                for index in 0..count {
                    let path = format!("{dir}/{}", many_entry_name(index));
                    self.add(&path, Contents::File(Vec::new()), 0o644);
                }
            }
            Step::Write { path, offset, seed, length } => {
                if !self.paths.contains_key(path) {
                    self.add(path, Contents::File(Vec::new()), 0o644);
                }
                let data = self.file_mut(path);
                let (start, end) = (offset as usize, offset as usize + length);
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[start..end].copy_from_slice(&pattern(seed, length));
            }
            Step::Truncate { path, length } => self.file_mut(path).resize(length as usize, 0),
            Step::Preallocate { path, offset, length } => {
                let data = self.file_mut(path);
                let end = (offset + length) as usize;
                if data.len() < end {
                    data.resize(end, 0);
                }
            }
            Step::Clone { source, target } => {
                let node = &self.nodes[self.paths[source]];
                let (contents, mode) = (node.contents.clone(), node.mode);
                self.add(target, contents, mode);
            }
            Step::HardLink { original, link } => {
                let index = self.paths[original];
                self.paths.insert(link.to_string(), index);
            }
            Step::Symlink { target, link } => {
                self.add(link, Contents::Symlink(target.to_string()), 0o777)
            }
            Step::SetXattr { path, name, seed, length } => {
                self.node_mut(path).xattrs.insert(name.to_string(), pattern(seed, length));
            }
            Step::Chmod { path, mode } => self.node_mut(path).mode = mode,
            Step::Chown { path, uid, gid } => self.node_mut(path).owner = Some((uid, gid)),
            Step::Rename { from, to } => {
                let index = self.paths.remove(from).expect("renamed path exists");
                assert_ne!(self.nodes[index].contents, Contents::Dir, "{from}: a directory");
                self.paths.insert(to.to_string(), index);
                self.gone.insert(from.to_string());
            }
            Step::Remove { path } => {
                let index = self.paths.remove(path).expect("removed path exists");
                assert_ne!(self.nodes[index].contents, Contents::Dir, "{path}: a directory");
                self.gone.insert(path.to_string());
            }
        }
    }

    fn children_of(&self, dir: &str) -> BTreeSet<String> {
        self.paths
            .keys()
            .filter(|path| path.as_str() != "/" && parent_of(path) == dir)
            .map(|path| name_of(path).to_string())
            .collect()
    }

    /// A file's names; a directory's "." and its entry in its parent, and
    /// each subdirectory's "..".
    fn link_count(&self, path: &str) -> u32 {
        let index = self.paths[path];
        match self.nodes[index].contents {
            Contents::Dir => {
                let subdirs = self
                    .children_of(path)
                    .iter()
                    .filter(|name| {
                        let child =
                            if path == "/" { format!("/{name}") } else { format!("{path}/{name}") };
                        self.nodes[self.paths[&child]].contents == Contents::Dir
                    })
                    .count();
                2 + subdirs as u32
            }
            _ => self.paths.values().filter(|&&other| other == index).count() as u32,
        }
    }
}

// ---------------------------------------------------------------------------
// Checking a volume against the model
// ---------------------------------------------------------------------------

/// Every way `volume` differs from `model`, one line each (empty: none).
fn mismatches(volume: &Volume, model: &Model) -> Vec<String> {
    let mut problems = Vec::new();
    for (path, &index) in &model.paths {
        if let Err(problem) = check_node(volume, model, path, &model.nodes[index]) {
            problems.push(format!("{path}: {problem}"));
        }
    }
    for path in &model.gone {
        match volume.try_exists(path) {
            Ok(false) => {}
            other => problems.push(format!("{path}: should be gone, try_exists says {other:?}")),
        }
    }
    problems
}

fn check_node(volume: &Volume, model: &Model, path: &str, node: &Node) -> Result<(), String> {
    let metadata = volume.symlink_metadata(path).map_err(|error| format!("stat: {error}"))?;
    let attr = metadata.attr();
    let kind_matches = match node.contents {
        Contents::Dir => metadata.is_dir(),
        Contents::File(_) => metadata.is_file(),
        Contents::Symlink(_) => metadata.is_symlink(),
    };
    if !kind_matches {
        return Err(format!("kind {:?}, expected {:?}", attr.kind, node.contents_kind()));
    }
    if !metadata.is_symlink() && attr.mode & 0o7777 != node.mode {
        return Err(format!("mode {:o}, expected {:o}", attr.mode & 0o7777, node.mode));
    }
    if let Some((uid, gid)) = node.owner {
        if (attr.uid, attr.gid) != (uid, gid) {
            return Err(format!("owner {}:{}, expected {uid}:{gid}", attr.uid, attr.gid));
        }
    }
    let links = model.link_count(path);
    if attr.nlink != links {
        return Err(format!("{} links, expected {links}", attr.nlink));
    }
    match &node.contents {
        Contents::File(expected) => {
            if attr.size != expected.len() as u64 {
                return Err(format!("size {}, expected {}", attr.size, expected.len()));
            }
            let data = volume.read(path).map_err(|error| format!("read: {error}"))?;
            if let Some(at) = first_difference(&data, expected) {
                return Err(format!("contents differ first at byte {at}"));
            }
        }
        Contents::Symlink(target) => {
            let found = volume.read_link(path).map_err(|error| format!("readlink: {error}"))?;
            if found != Path::new(target) {
                return Err(format!("links to {found:?}, expected {target:?}"));
            }
        }
        Contents::Dir => {
            let found: BTreeSet<String> = volume
                .read_dir(path)
                .map_err(|error| format!("read_dir: {error}"))?
                .map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned()))
                .collect::<foliofs::Result<_>>()
                .map_err(|error| format!("read_dir: {error}"))?;
            let expected = model.children_of(path);
            if found != expected {
                let extra: Vec<_> = found.difference(&expected).collect();
                let missing: Vec<_> = expected.difference(&found).collect();
                return Err(format!("entries: extra {extra:?}, missing {missing:?}"));
            }
        }
    }
    let ino = metadata.ino();
    let names = volume
        .inodes()
        .list_xattr(ino, Privilege::SysAdmin)
        .map_err(|error| format!("listxattr: {error}"))?;
    let names: BTreeSet<String> =
        names.iter().map(|name| String::from_utf8_lossy(name).into_owned()).collect();
    let expected_names: BTreeSet<String> = node.xattrs.keys().cloned().collect();
    if names != expected_names {
        return Err(format!("xattrs {names:?}, expected {expected_names:?}"));
    }
    for (name, expected) in &node.xattrs {
        let value = volume
            .inodes()
            .get_xattr(ino, name.as_bytes(), Privilege::SysAdmin)
            .map_err(|error| format!("getxattr {name}: {error}"))?;
        if &value != expected {
            return Err(format!("xattr {name} differs"));
        }
    }
    Ok(())
}

impl Node {
    fn contents_kind(&self) -> &'static str {
        match self.contents {
            Contents::Dir => "directory",
            Contents::File(_) => "file",
            Contents::Symlink(_) => "symlink",
        }
    }
}

fn first_difference(found: &[u8], expected: &[u8]) -> Option<usize> {
    if found.len() != expected.len() {
        return Some(found.len().min(expected.len()));
    }
    found.iter().zip(expected).position(|(a, b)| a != b)
}

/// What the byte comparison cannot see: the hole is a hole, the clone
/// still shares every block but the overwritten one, the preallocated range
/// is unwritten.
fn shape_mismatches(volume: &Volume) -> Vec<String> {
    let mut problems = Vec::new();
    let fiemap_of = |path: &str| {
        let ino = volume.metadata(path).expect("stat").ino();
        volume.inodes().fiemap(ino).expect("fiemap")
    };
    let sparse = OpenOptions::new().read(true).open(volume, SPARSE).expect("open the sparse file");
    let hole_start = SPARSE_FIRST_BYTES as u64;
    match (sparse.seek_hole(0), sparse.seek_data(hole_start)) {
        (Ok(hole), Ok(data)) if hole == hole_start && data == SPARSE_SECOND_AT => {}
        other => problems.push(format!(
            "{SPARSE}: (SEEK_HOLE 0, SEEK_DATA {hole_start}) = {other:?}, expected \
             ({hole_start}, {SPARSE_SECOND_AT})"
        )),
    }
    drop(sparse);
    // The bytes reading as zeros are not enough: no extent may map the hole.
    for extent in fiemap_of(SPARSE) {
        if extent.logical < SPARSE_SECOND_AT && extent.logical + extent.length > hole_start {
            problems.push(format!("{SPARSE}: {extent:?} maps part of the hole"));
        }
    }

    let physical_of = |extents: &[foliofs::vfs::FiemapExtent], block: u64| {
        let at = block * BLOCK;
        extents
            .iter()
            .find(|extent| extent.logical <= at && at < extent.logical + extent.length)
            .map(|extent| (extent.physical + (at - extent.logical), extent.kind))
    };
    let (source_map, clone_map) = (fiemap_of(CLONE_SOURCE), fiemap_of(CLONE));
    for block in 0..(CLONED_BYTES as u64).div_ceil(BLOCK) {
        let (source, clone) = (physical_of(&source_map, block), physical_of(&clone_map, block));
        let shared = source.is_some() && source == clone;
        if shared == (block == CLONE_OVERWRITTEN_BLOCK) {
            problems.push(format!(
                "{CLONE}: block {block} at {clone:?}, the source's at {source:?}: only block \
                 {CLONE_OVERWRITTEN_BLOCK} should have its own"
            ));
        }
    }
    match (volume.read(CLONE_SOURCE), volume.read(CLONE)) {
        (Ok(source), Ok(clone)) if source.len() == clone.len() => {
            let overwritten =
                CLONE_OVERWRITTEN_BLOCK * BLOCK..(CLONE_OVERWRITTEN_BLOCK + 1) * BLOCK;
            let differing: Vec<usize> =
                (0..source.len()).filter(|&at| source[at] != clone[at]).collect();
            if differing.is_empty()
                || differing.iter().any(|&at| !overwritten.contains(&(at as u64)))
            {
                problems.push(format!(
                    "{CLONE}: differs from {CLONE_SOURCE} at {} bytes, first {:?} last {:?}; \
                     expected only within {overwritten:?}",
                    differing.len(),
                    differing.first(),
                    differing.last()
                ));
            }
        }
        other => problems.push(format!("{CLONE}: reading it and its source: {other:?}")),
    }

    let preallocated = fiemap_of(PREALLOCATED);
    for block in PREALLOCATED_AT / BLOCK..(PREALLOCATED_AT + PREALLOCATED_BYTES) / BLOCK {
        match physical_of(&preallocated, block) {
            Some((_, MapKind::Unwritten)) => {}
            other => problems.push(format!(
                "{PREALLOCATED}: block {block} is {other:?}, expected allocated and unwritten"
            )),
        }
    }
    problems
}

fn assert_matches(volume: &Volume, model: &Model, when: &str) {
    let mut problems = mismatches(volume, model);
    problems.extend(shape_mismatches(volume));
    assert!(problems.is_empty(), "{when}: the volume differs from the description:\n{problems:#?}");
}

fn assert_fsck_clean(volume: &Volume, when: &str) {
    let report = foliofs::fsck::check(volume.device().clone());
    assert!(report.is_clean(), "{when}: fsck: {:?}", report.problems);
}

// ---------------------------------------------------------------------------
// The fixtures on disk: sparse images
// ---------------------------------------------------------------------------

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

// The encoding of `tests/fuzz_images/corpus.rs`, copied rather than shared:
// an image as its non-zero 512-byte runs, the magic and the image's length,
// then (offset u64, length u32, bytes) to the end, all little-endian. This
// copy reads with plain slices, not the format's codec, which the
// metadata rewrite may change.
const SPARSE_MAGIC: &[u8; 8] = b"FOLIOSPR";
const SPARSE_SECTOR: usize = 512;

fn sparse_encode(image: &[u8]) -> Vec<u8> {
    let mut out = SPARSE_MAGIC.to_vec();
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    let sectors: Vec<&[u8]> = image.chunks(SPARSE_SECTOR).collect();
    let is_zero = |sector: &[u8]| sector.iter().all(|&byte| byte == 0);
    let mut index = 0;
    while index < sectors.len() {
        if is_zero(sectors[index]) {
            index += 1;
            continue;
        }
        let start = index;
        while index < sectors.len() && !is_zero(sectors[index]) {
            index += 1;
        }
        let from = start * SPARSE_SECTOR;
        let to = (index * SPARSE_SECTOR).min(image.len());
        out.extend_from_slice(&(from as u64).to_le_bytes());
        out.extend_from_slice(&((to - from) as u32).to_le_bytes());
        out.extend_from_slice(&image[from..to]);
    }
    out
}

fn sparse_decode(bytes: &[u8]) -> Vec<u8> {
    fn take<'a>(bytes: &mut &'a [u8], count: usize) -> &'a [u8] {
        assert!(bytes.len() >= count, "sparse image cut short");
        let (head, tail) = bytes.split_at(count);
        *bytes = tail;
        head
    }
    let mut rest = bytes;
    assert_eq!(take(&mut rest, 8), SPARSE_MAGIC, "not a sparse image");
    let length = u64::from_le_bytes(take(&mut rest, 8).try_into().unwrap()) as usize;
    let mut image = vec![0u8; length];
    while !rest.is_empty() {
        let offset = u64::from_le_bytes(take(&mut rest, 8).try_into().unwrap()) as usize;
        let run = u32::from_le_bytes(take(&mut rest, 4).try_into().unwrap()) as usize;
        image[offset..offset + run].copy_from_slice(take(&mut rest, run));
    }
    image
}

fn load_fixture(name: &str) -> Vec<u8> {
    let path = fixture_dir().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    sparse_decode(&bytes)
}

/// The version field as version 2 lays out the superblock (magic
/// "FOLIOFS\0", then the version, little-endian), read from the bytes so
/// that the fixture's claim does not depend on today's decoder; the build's
/// own decoder must agree.
fn superblock_version(image: &[u8]) -> u32 {
    assert_eq!(&image[..8], b"FOLIOFS\0", "superblock magic");
    let raw = u32::from_le_bytes(image[8..12].try_into().unwrap());
    let decoded = Superblock::decode(&image[..HEADER_BYTES]).expect("the superblock decodes");
    assert_eq!(decoded.version, raw, "the decoder reads another version than the bytes hold");
    raw
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

/// Opens the fixture read-write, checks it against the description and with
/// fsck, changes it, closes it and checks it again after a reopen.
fn fixture_opens_and_matches(name: &str, replays_journal: bool) {
    let image = load_fixture(name);
    assert_eq!(image.len() as u64, VOLUME_BYTES, "{name}: image length");
    assert_eq!(superblock_version(&image), FIXTURE_FORMAT_VERSION, "{name}: format version");
    let model = Model::of(&description());

    let (raw, volume) = open_image(image).unwrap_or_else(|error| panic!("{name}: open: {error}"));
    let replayed = volume.load_report().journal_groups_replayed;
    if replays_journal {
        assert!(replayed > 0, "{name}: opening replayed no journal group");
    }
    assert_fsck_clean(&volume, &format!("{name} opened"));
    assert_matches(&volume, &model, &format!("{name} opened"));

    // A change on top of the old image, then a close: the path a volume of
    // version 2 takes into whatever this build writes (today: version 2
    // still; after the rewrite, the conversion).
    let mut model = model;
    let change = Step::Write { path: ADDED_AFTER_OPEN, offset: 0, seed: 99, length: 12_345 };
    apply(&volume, &change).expect("write after open");
    model.apply(&change);
    volume.sync().expect("sync");
    volume.close().expect("close");

    let (_, reopened) = open_image(raw.image()).unwrap_or_else(|error| panic!("reopen: {error}"));
    assert_fsck_clean(&reopened, &format!("{name} changed and reopened"));
    assert_matches(&reopened, &model, &format!("{name} changed and reopened"));
    reopened.close().expect("close the reopened volume");
}

#[test]
fn clean_fixture_opens_and_matches_the_description() {
    fixture_opens_and_matches(CLEAN_FIXTURE, false);
}

#[test]
fn replay_fixture_replays_and_matches_the_description() {
    fixture_opens_and_matches(REPLAY_FIXTURE, true);
}

/// Converts the fixture to format 3 (`foliofs convert`): it reads the same,
/// fsck is clean, and it takes a change and a reopen. A power cut at every
/// flush boundary of the conversion leaves a volume that opens, as format 2
/// or 3, and reads the same.
/// `checkpoints_before` more checkpoints first (by an open, checkpoints and
/// a close): the newest lies in either slot depending on their number.
fn fixture_converts(name: &str, checkpoints_before: usize) {
    let mut image = load_fixture(name);
    if checkpoints_before > 0 {
        let (raw, volume) = open_image(image).expect("open before the conversion");
        for _ in 1..checkpoints_before {
            volume.checkpoint().expect("checkpoint before the conversion");
        }
        volume.close().expect("close before the conversion");
        image = raw.image();
    }
    let model = Model::of(&description());
    let raw = Arc::new(FaultDev::from_image(image, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let converted = Volume::convert_to_metadata_index(device)
        .unwrap_or_else(|error| panic!("{name}: convert: {error}"));
    assert_eq!(converted.version, foliofs::format::FORMAT_VERSION_INDEX);
    assert_eq!(superblock_version(&raw.image()), foliofs::format::FORMAT_VERSION_INDEX);

    let mut versions = BTreeSet::new();
    let mut cuts = raw.durability_points();
    cuts.push(raw.log_len());
    for cut in cuts {
        let crashed = raw.crash_image(cut, &|_| foliofs::dev::fault::Keep::Nothing);
        versions.insert(superblock_version(&crashed));
        let (_, volume) = open_image(crashed).unwrap_or_else(|error| {
            panic!("{name}, power cut at {cut} of the conversion: {error}")
        });
        assert_matches(&volume, &model, &format!("{name}, power cut at {cut} of the conversion"));
    }
    assert_eq!(versions.len(), 2, "{name}: the cuts found format 2 and 3: {versions:?}");

    let (raw, volume) = open_image(raw.image()).expect("open the converted volume");
    assert_fsck_clean(&volume, &format!("{name} converted"));
    assert_matches(&volume, &model, &format!("{name} converted"));
    let mut model = model;
    let change = Step::Write { path: ADDED_AFTER_OPEN, offset: 0, seed: 7, length: 54_321 };
    apply(&volume, &change).expect("write after the conversion");
    model.apply(&change);
    volume.close().expect("close");
    let (_, reopened) = open_image(raw.image()).expect("reopen the converted volume");
    assert_fsck_clean(&reopened, &format!("{name} converted, changed and reopened"));
    assert_matches(&reopened, &model, &format!("{name} converted, changed and reopened"));
    let again = Volume::convert_to_metadata_index(reopened.device().clone());
    assert!(again.is_err(), "a volume of format 3 converted again");
}

#[test]
fn clean_fixture_converts_to_format_3_whichever_slot_is_newest() {
    fixture_converts(CLEAN_FIXTURE, 0);
    fixture_converts(CLEAN_FIXTURE, 1);
}

#[test]
fn replay_fixture_converts_to_format_3() {
    fixture_converts(REPLAY_FIXTURE, 0);
    fixture_converts(REPLAY_FIXTURE, 2);
}

/// The content check is not vacuous: one byte flipped in a file's data (no
/// checksum covers data, so the volume opens) is reported, against that file
/// only.
#[test]
fn a_flipped_data_byte_is_caught() {
    let image = load_fixture(CLEAN_FIXTURE);
    let byte_in_file = 1000;
    let device_offset = {
        let (_, volume) = open_image(image.clone()).expect("open");
        let ino = volume.metadata(LARGE_FILE).expect("stat").ino();
        let extents = volume.inodes().fiemap(ino).expect("fiemap");
        let first = extents.iter().find(|extent| extent.logical == 0).expect("a first extent");
        assert_eq!(first.kind, MapKind::Written);
        first.physical + byte_in_file
    };
    let mut damaged = image;
    damaged[device_offset as usize] ^= 0x5A;
    let (_, volume) = open_image(damaged).expect("a data byte does not stop the open");
    let problems = mismatches(&volume, &Model::of(&description()));
    assert_eq!(
        problems,
        vec![format!("{LARGE_FILE}: contents differ first at byte {byte_in_file}")],
        "the flipped byte is reported against {LARGE_FILE} alone"
    );
}

/// A fresh volume of the fixtures' geometry, on a zeroed device (zeros keep
/// the sparse files small), and its raw device.
fn fresh_volume() -> (Arc<FaultDev>, Volume) {
    let raw = Arc::new(FaultDev::new(VOLUME_BYTES, 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let mkfs = MkfsOptions {
        block_bytes: BLOCK_BYTES,
        journal_bytes: None,
        metadata_bytes: None,
        metadata_index: false,
        root_owner: owner(),
    };
    Volume::format(&device, &mkfs).expect("mkfs");
    let volume = Volume::open_device(device, &common::options()).expect("open");
    (raw, volume)
}

fn make_clean_image() -> Vec<u8> {
    let (raw, volume) = fresh_volume();
    for step in description() {
        apply(&volume, &step).unwrap_or_else(|error| panic!("{step:?}: {error}"));
    }
    volume.close().expect("close");
    raw.image()
}

fn make_replay_image() -> Vec<u8> {
    let (raw, volume) = fresh_volume();
    let steps = description();
    let (before, after) = steps.split_at(steps.len() - STEPS_AFTER_CHECKPOINT);
    for step in before {
        apply(&volume, step).unwrap_or_else(|error| panic!("{step:?}: {error}"));
    }
    volume.checkpoint().expect("checkpoint");
    // A sync after each step, as a program that fsyncs every change: each
    // step is its own journal group, so opening replays a chain of them.
    for step in after {
        apply(&volume, step).unwrap_or_else(|error| panic!("{step:?}: {error}"));
        volume.sync().unwrap_or_else(|error| panic!("sync after {step:?}: {error}"));
    }
    // Everything is durable now; the image is what a power cut leaves.
    let image = raw.image();
    // Nothing the volume's drop writes reaches the image taken above, but
    // a dead device keeps the drop from checkpointing for nothing.
    raw.kill();
    drop(volume);
    image
}

#[test]
#[ignore = "makes the fixtures; run once, never again"]
fn make_format_v2_fixtures() {
    assert_eq!(foliofs::format::FORMAT_VERSION, FIXTURE_FORMAT_VERSION, "this build's format");
    let fixtures =
        [(CLEAN_FIXTURE, make_clean_image as fn() -> Vec<u8>), (REPLAY_FIXTURE, make_replay_image)];
    for (name, _) in &fixtures {
        let path = fixture_dir().join(name);
        assert!(!path.exists(), "{}: exists; the fixtures are never made again", path.display());
    }
    std::fs::create_dir_all(fixture_dir()).expect("mkdir tests/fixtures");
    for (name, make) in fixtures {
        let encoded = sparse_encode(&make());
        let path = fixture_dir().join(name);
        // create_new: even a fixture appearing meanwhile is never overwritten.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        file.write_all(&encoded).expect("write the fixture");
        file.sync_all().expect("sync the fixture");
        eprintln!("{}: {} bytes", path.display(), encoded.len());
    }
}
