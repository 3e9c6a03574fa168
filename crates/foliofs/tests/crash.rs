//! Crash recovery: random namespace and write workloads on the
//! fault-injecting device, crashed at every point where something became
//! durable (a flush or a FUA write), and at each such point also with random
//! subsets and sector-torn versions of the writes not yet flushed. Every
//! crash image must mount, pass fsck, replay the same way twice, and agree
//! with a model of what the workload made durable. Everything runs on 1 KiB,
//! 4 KiB and 64 KiB blocks.

#[macro_use]
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use foliofs::dev::fault::Keep;
use foliofs::dev::FaultDev;
use foliofs::space::FallocateMode;
use foliofs::{InodeKind, OpenFlags, RenameFlags, Volume};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{new_volume_with_journal, open_image, owner, pattern, ROOT};

const VOLUME_BYTES: u64 = 8 << 20;
/// A small journal wraps and fills within one workload, so checkpoints and
/// replay across the wrap are exercised.
const JOURNAL_BYTES: u64 = 64 << 10;

block_size_tests!(
    crash_at_every_durability_point,
    freed_blocks_are_reused_only_after_their_free_is_durable,
    buffered_appends_recover_as_exact_prefixes,
    shifted_blocks_are_overwritten_only_after_the_shift_is_durable,
);

/// The sizes a workload works with on one block size.
#[derive(Clone, Copy)]
struct Geometry {
    file_bytes_max: u64,
    write_bytes_max: usize,
    fallocate_bytes_max: u64,
    /// Data written before the workload so that little space is left and
    /// freed blocks are soon reused: a block's old owner must never see its
    /// new data.
    ballast_bytes: usize,
}

impl Geometry {
    fn of(block_bytes: u32) -> Self {
        if block_bytes < 65536 {
            // Files of up to 12 blocks of 4 KiB (48 of 1 KiB); about 264 KiB
            // left free next to the ballast.
            Self {
                file_bytes_max: 48 << 10,
                write_bytes_max: 12 << 10,
                fallocate_bytes_max: 16 << 10,
                ballast_bytes: (5 << 20) + (800 << 10),
            }
        } else {
            // The same shapes in 64 KiB blocks: files of up to 8 blocks,
            // writes and fallocates of up to 2 (so partial blocks, collapses
            // and inserts inside files happen), and 40 blocks (2.5 MiB) free
            // next to the ballast, which ends inside a block. The data area
            // of the 8 MiB volume is 93 blocks (the checkpoint slots take 32).
            Self {
                file_bytes_max: 512 << 10,
                write_bytes_max: 128 << 10,
                fallocate_bytes_max: 128 << 10,
                ballast_bytes: 53 * 65536 - 1000,
            }
        }
    }
}

/// What a recovered tree holds: path -> (ino, kind, content for files).
type Tree = BTreeMap<String, (u64, InodeKind, Vec<u8>)>;

/// Which byte values each offset of an inode was ever given (zero always allowed).
#[derive(Default, Clone)]
struct ByteHistory {
    allowed: Vec<[u64; 4]>,
}

impl ByteHistory {
    fn record(&mut self, pos: usize, data: &[u8]) {
        if self.allowed.len() < pos + data.len() {
            self.allowed.resize(pos + data.len(), [1, 0, 0, 0]);
        }
        for (index, &byte) in data.iter().enumerate() {
            self.allowed[pos + index][usize::from(byte / 64)] |= 1 << (byte % 64);
        }
    }

    fn allows(&self, pos: usize, byte: u8) -> bool {
        byte == 0
            || self
                .allowed
                .get(pos)
                .is_some_and(|bits| bits[usize::from(byte / 64)] & (1 << (byte % 64)) != 0)
    }
}

/// One operation of the workload, with the device log range it spanned.
struct OpSpan {
    log_start: usize,
    log_end: usize,
    description: String,
    touched: Vec<u64>,
    kind: SpanKind,
}

enum SpanKind {
    Other,
    /// fsync of `ino` completed with this content.
    Fsync {
        ino: u64,
        content: Vec<u8>,
    },
    /// syncfs completed with this whole tree.
    Sync(Tree),
}

struct Workload {
    rng: ChaCha8Rng,
    volume: Volume,
    device: Arc<FaultDev>,
    dirs: Vec<(String, u64)>,
    files: BTreeMap<String, u64>,
    contents: HashMap<u64, Vec<u8>>,
    history: HashMap<u64, ByteHistory>,
    sizes_seen: HashMap<u64, HashSet<u64>>,
    spans: Vec<OpSpan>,
    next_name: u32,
    seed: u64,
    block_bytes: u64,
    geometry: Geometry,
}

impl Workload {
    fn new(seed: u64, block_bytes: u32) -> Self {
        let (device, volume) =
            new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
        let mut workload = Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            volume,
            device,
            dirs: vec![(String::new(), ROOT)],
            files: BTreeMap::new(),
            contents: HashMap::new(),
            history: HashMap::new(),
            sizes_seen: HashMap::new(),
            spans: Vec::new(),
            next_name: 0,
            seed,
            block_bytes: u64::from(block_bytes),
            geometry: Geometry::of(block_bytes),
        };
        workload.write_ballast();
        workload
    }

    fn write_ballast(&mut self) {
        let attr = self.volume.create(ROOT, b"ballast", 0o644, owner()).expect("create");
        let data = pattern(self.seed ^ 0xBA11A57, self.geometry.ballast_bytes);
        let file = self.volume.open_file(attr.ino, OpenFlags::WRITE).expect("open");
        assert_eq!(file.write_at(&data, 0).expect("ballast"), data.len());
        self.volume.sync().expect("sync");
        self.files.insert("/ballast".into(), attr.ino);
        let mut history = ByteHistory::default();
        history.record(0, &data);
        self.history.insert(attr.ino, history);
        self.sizes_seen.insert(attr.ino, HashSet::from([0, data.len() as u64]));
        self.contents.insert(attr.ino, data);
        self.device.reset_log();
    }

    fn fresh_name(&mut self) -> String {
        self.next_name += 1;
        format!("n{}", self.next_name)
    }

    /// A random file other than the ballast, which stays as it is.
    fn pick_file(&mut self) -> Option<(String, u64)> {
        let candidates: Vec<(&String, &u64)> =
            self.files.iter().filter(|(path, _)| *path != "/ballast").collect();
        if candidates.is_empty() {
            return None;
        }
        let (path, ino) = candidates[self.rng.random_range(0..candidates.len())];
        Some((path.clone(), *ino))
    }

    fn run(&mut self, op_count: usize) {
        for _ in 0..op_count {
            let log_start = self.device.log_len();
            let (description, touched, kind) = self.step();
            let log_end = self.device.log_len();
            self.spans.push(OpSpan { log_start, log_end, description, touched, kind });
        }
    }

    fn step(&mut self) -> (String, Vec<u64>, SpanKind) {
        let choice = self.rng.random_range(0..100);
        match (choice, self.pick_file()) {
            (0..=14, _) | (_, None) => self.create(),
            (15..=19, _) => self.mkdir(),
            (20..=43, Some((path, ino))) => self.write(path, ino),
            (44..=49, Some((path, ino))) => self.fallocate(path, ino),
            (50..=56, Some((path, ino))) => self.truncate(path, ino),
            (57..=62, Some((path, ino))) => self.unlink(path, ino),
            (63..=69, Some((path, ino))) => self.rename(path, ino),
            (70..=74, Some((path, ino))) => self.link(path, ino),
            (75..=89, Some((path, ino))) => self.fsync(path, ino),
            (90..=93, Some(_)) => self.checkpoint(),
            (_, Some(_)) => self.sync(),
        }
    }

    fn create(&mut self) -> (String, Vec<u64>, SpanKind) {
        let (dir_path, dir) = self.dirs[self.rng.random_range(0..self.dirs.len())].clone();
        let name = self.fresh_name();
        let attr = self.volume.create(dir, name.as_bytes(), 0o644, owner()).expect("create");
        let path = format!("{dir_path}/{name}");
        self.files.insert(path.clone(), attr.ino);
        self.contents.insert(attr.ino, Vec::new());
        self.history.insert(attr.ino, ByteHistory::default());
        self.sizes_seen.insert(attr.ino, HashSet::from([0]));
        (format!("create {path}"), vec![attr.ino], SpanKind::Other)
    }

    fn mkdir(&mut self) -> (String, Vec<u64>, SpanKind) {
        let (dir_path, dir) = self.dirs[self.rng.random_range(0..self.dirs.len())].clone();
        let name = self.fresh_name();
        let attr = self.volume.mkdir(dir, name.as_bytes(), 0o755, owner()).expect("mkdir");
        let path = format!("{dir_path}/{name}");
        self.dirs.push((path.clone(), attr.ino));
        (format!("mkdir {path}"), vec![], SpanKind::Other)
    }

    fn write(&mut self, path: String, ino: u64) -> (String, Vec<u64>, SpanKind) {
        let pos = self.rng.random_range(0..self.geometry.file_bytes_max) as usize;
        let length = self.rng.random_range(1..=self.geometry.write_bytes_max);
        let data = pattern(self.seed ^ (self.spans.len() as u64) << 20 ^ ino, length);
        let file = self.volume.open_file(ino, OpenFlags::WRITE).expect("open");
        let written = match file.write_at(&data, pos as u64) {
            Ok(written) => written,
            Err(error) if error.errno() == libc::ENOSPC => 0,
            Err(error) => panic!("write: {error}"),
        };
        let data = &data[..written];
        self.history.get_mut(&ino).expect("known").record(pos, data);
        let content = self.contents.get_mut(&ino).expect("known file");
        // A write refused for want of space changes nothing (and may start
        // past the end of the file).
        if written > 0 {
            if content.len() < pos + written {
                content.resize(pos + written, 0);
            }
            content[pos..pos + written].copy_from_slice(data);
        }
        self.sizes_seen.get_mut(&ino).expect("known").insert(content.len() as u64);
        (format!("write {path} {pos}+{length} wrote {written}"), vec![ino], SpanKind::Other)
    }

    fn fallocate(&mut self, path: String, ino: u64) -> (String, Vec<u64>, SpanKind) {
        let length_now = self.contents[&ino].len() as u64;
        let block = self.block_bytes;
        let mode = match self.rng.random_range(0..6) {
            0 => FallocateMode::Allocate { keep_size: self.rng.random_bool(0.5) },
            1 | 2 => FallocateMode::PunchHole,
            3 => FallocateMode::ZeroRange { keep_size: self.rng.random_bool(0.5) },
            4 => FallocateMode::CollapseRange,
            _ => FallocateMode::InsertRange,
        };
        let (offset, length) = match mode {
            FallocateMode::CollapseRange | FallocateMode::InsertRange => {
                let blocks = (length_now / block).max(1);
                (self.rng.random_range(0..blocks) * block, self.rng.random_range(1..=3) * block)
            }
            _ => (
                self.rng.random_range(0..self.geometry.file_bytes_max),
                self.rng.random_range(1..self.geometry.fallocate_bytes_max),
            ),
        };
        let file = self.volume.open_file(ino, OpenFlags::WRITE).expect("open");
        let description = format!("fallocate {path} {mode:?} {offset}+{length}");
        match file.fallocate(mode, offset, length) {
            Ok(()) => {}
            Err(error) if matches!(error.errno(), libc::EINVAL | libc::ENOSPC | libc::EFBIG) => {
                return (format!("{description}: {error}"), vec![], SpanKind::Other);
            }
            Err(error) => panic!("{description}: {error}"),
        }
        let content = self.contents.get_mut(&ino).expect("known file");
        common::apply_fallocate_to_model(content, mode, offset as usize, length as usize);
        // Shifted bytes were given at their new offsets too.
        self.history.get_mut(&ino).expect("known").record(0, content);
        self.sizes_seen.get_mut(&ino).expect("known").insert(content.len() as u64);
        (description, vec![ino], SpanKind::Other)
    }

    fn truncate(&mut self, path: String, ino: u64) -> (String, Vec<u64>, SpanKind) {
        let size = self.rng.random_range(0..self.geometry.file_bytes_max);
        let file = self.volume.open_file(ino, OpenFlags::WRITE).expect("open");
        file.set_len(size).expect("truncate");
        self.contents.get_mut(&ino).expect("known").resize(size as usize, 0);
        self.sizes_seen.get_mut(&ino).expect("known").insert(size);
        (format!("truncate {path} {size}"), vec![ino], SpanKind::Other)
    }

    fn split(path: &str) -> (&str, &str) {
        path.rsplit_once('/').expect("absolute path")
    }

    fn dir_ino(&self, dir_path: &str) -> u64 {
        self.dirs.iter().find(|(path, _)| path == dir_path).expect("known dir").1
    }

    fn unlink(&mut self, path: String, ino: u64) -> (String, Vec<u64>, SpanKind) {
        let (dir_path, name) = Self::split(&path);
        self.volume.unlink(self.dir_ino(dir_path), name.as_bytes()).expect("unlink");
        self.files.remove(&path);
        (format!("unlink {path}"), vec![ino], SpanKind::Other)
    }

    fn rename(&mut self, path: String, ino: u64) -> (String, Vec<u64>, SpanKind) {
        let (dir_path, name) = Self::split(&path);
        let (to_dir_path, to_dir) = self.dirs[self.rng.random_range(0..self.dirs.len())].clone();
        // Half the time onto an existing file, replacing it.
        let replace = self
            .files
            .keys()
            .filter(|other| **other != path && *other != "/ballast")
            .nth(self.rng.random_range(0..4))
            .cloned();
        let (to_dir_path, to_dir, to_name) = match replace {
            Some(victim) if self.rng.random_bool(0.5) => {
                let (victim_dir, victim_name) = Self::split(&victim);
                (victim_dir.to_string(), self.dir_ino(victim_dir), victim_name.to_string())
            }
            _ => (to_dir_path, to_dir, self.fresh_name()),
        };
        self.volume
            .rename(
                self.dir_ino(dir_path),
                name.as_bytes(),
                to_dir,
                to_name.as_bytes(),
                RenameFlags::default(),
            )
            .expect("rename");
        let to_path = format!("{to_dir_path}/{to_name}");
        if self.files.get(&to_path) == Some(&ino) {
            // Both names are links to the same inode: POSIX says do nothing.
            return (format!("rename {path} {to_path} (same inode)"), vec![], SpanKind::Other);
        }
        self.files.remove(&path);
        let victim = self.files.insert(to_path.clone(), ino);
        (
            format!("rename {path} {to_path}"),
            [Some(ino), victim].into_iter().flatten().collect(),
            SpanKind::Other,
        )
    }

    fn link(&mut self, path: String, ino: u64) -> (String, Vec<u64>, SpanKind) {
        let (dir_path, dir) = self.dirs[self.rng.random_range(0..self.dirs.len())].clone();
        let name = self.fresh_name();
        self.volume.link(ino, dir, name.as_bytes()).expect("link");
        let to_path = format!("{dir_path}/{name}");
        self.files.insert(to_path.clone(), ino);
        (format!("link {path} {to_path}"), vec![ino], SpanKind::Other)
    }

    fn fsync(&mut self, path: String, ino: u64) -> (String, Vec<u64>, SpanKind) {
        let file = self.volume.open_file(ino, OpenFlags::READ).expect("open");
        if self.rng.random_bool(0.5) { file.fsync() } else { file.fdatasync() }.expect("fsync");
        let content = self.contents[&ino].clone();
        (format!("fsync {path}"), vec![], SpanKind::Fsync { ino, content })
    }

    fn checkpoint(&mut self) -> (String, Vec<u64>, SpanKind) {
        self.volume.checkpoint().expect("checkpoint");
        ("checkpoint".into(), vec![], SpanKind::Other)
    }

    fn sync(&mut self) -> (String, Vec<u64>, SpanKind) {
        self.volume.sync().expect("sync");
        ("sync".into(), vec![], SpanKind::Sync(self.model_tree()))
    }

    fn model_tree(&self) -> Tree {
        let mut tree = Tree::new();
        for (path, ino) in &self.dirs {
            if !path.is_empty() {
                tree.insert(path.clone(), (*ino, InodeKind::Dir, Vec::new()));
            }
        }
        for (path, ino) in &self.files {
            tree.insert(path.clone(), (*ino, InodeKind::File, self.contents[ino].clone()));
        }
        tree
    }
}

fn read_tree(volume: &Volume) -> Tree {
    let mut tree = Tree::new();
    let mut stack = vec![(String::new(), ROOT)];
    while let Some((path, dir)) = stack.pop() {
        for entry in volume.readdir(dir).expect("readdir") {
            let child = format!("{path}/{}", String::from_utf8_lossy(&entry.name));
            let content = match entry.kind {
                InodeKind::File => {
                    let size = volume.getattr(entry.ino).expect("getattr").size as usize;
                    let mut content = vec![0u8; size];
                    let file = volume.open_file(entry.ino, OpenFlags::READ).expect("open");
                    assert_eq!(file.read_at(&mut content, 0).expect("read"), size);
                    content
                }
                InodeKind::Dir => {
                    stack.push((child.clone(), entry.ino));
                    Vec::new()
                }
                InodeKind::Symlink => Vec::new(),
            };
            tree.insert(child, (entry.ino, entry.kind, content));
        }
    }
    tree
}

impl Workload {
    /// Checks one crash image; returns a description of the first violation.
    fn check_crash(&self, cut: usize, image: Vec<u8>) -> Result<(), String> {
        let fsck = foliofs::fsck::check(
            open_image(image.clone()).map_err(|e| e.to_string())?.1.device().clone(),
        );
        if !fsck.is_clean() {
            return Err(format!("fsck: {:?}", fsck.problems));
        }
        let read_only = |image: Vec<u8>| {
            let raw = Arc::new(FaultDev::from_image(image, 512));
            let device = Arc::new(foliofs::dev::Device::new(raw, foliofs::dev::FuaMode::Native));
            let options = foliofs::VolumeOptions { read_only: true, ..common::options() };
            Volume::open_device(device, &options).map(|volume| read_tree(&volume))
        };
        let first = read_only(image.clone()).map_err(|error| format!("mount: {error}"))?;
        let second = read_only(image.clone()).map_err(|error| format!("second mount: {error}"))?;
        if first != second {
            return Err("two replays of the same image differ".into());
        }
        let (_, writable) =
            open_image(image).map_err(|error| format!("writable mount: {error}"))?;
        if read_tree(&writable) != first {
            return Err("the writable mount sees a different tree".into());
        }
        self.check_tree_against_model(cut, &first)
    }

    fn check_tree_against_model(&self, cut: usize, tree: &Tree) -> Result<(), String> {
        for (path, (ino, kind, content)) in tree {
            if *kind != InodeKind::File {
                continue;
            }
            let history = self
                .history
                .get(ino)
                .ok_or_else(|| format!("{path}: inode {ino} was never created"))?;
            // Writeback moves the on-disk size run by run, so a crash may show
            // a size the file never had, but only one ending at a block
            // boundary inside data the workload wrote (checked byte by byte
            // below), never past the largest size the file had.
            let size = content.len() as u64;
            let seen = &self.sizes_seen[ino];
            let between_writebacks = size.is_multiple_of(self.block_bytes)
                && seen.iter().any(|&seen_size| seen_size > size);
            if !seen.contains(&size) && !between_writebacks {
                return Err(format!("{path}: size {size} was never the file's size"));
            }
            if let Some(pos) = (0..content.len()).find(|&pos| !history.allows(pos, content[pos])) {
                return Err(format!(
                    "{path}: byte {pos} = {:#04x} was never written there",
                    content[pos]
                ));
            }
        }
        let synced = self
            .spans
            .iter()
            .rev()
            .find(|span| span.log_end <= cut && matches!(span.kind, SpanKind::Sync(_)));
        if let Some(OpSpan { log_end, kind: SpanKind::Sync(expected), .. }) = synced {
            let later_started =
                self.spans.iter().any(|span| span.log_end > *log_end && span.log_start < cut);
            if !later_started && tree != expected {
                return Err(format!("state after sync differs: {}", tree_diff(expected, tree)));
            }
        }
        for (index, span) in self.spans.iter().enumerate() {
            let SpanKind::Fsync { ino, content } = &span.kind else {
                continue;
            };
            if span.log_end > cut {
                break;
            }
            let modified_later = self.spans[index + 1..]
                .iter()
                .any(|later| later.touched.contains(ino) && later.log_start < cut);
            if modified_later {
                continue;
            }
            let found = tree.values().find(|(found_ino, _, _)| found_ino == ino);
            match found {
                Some((_, _, recovered)) if recovered == content => {}
                Some((_, _, recovered)) => {
                    return Err(format!(
                        "{}: recovered {} bytes differ from the fsynced {}",
                        span.description,
                        recovered.len(),
                        content.len()
                    ))
                }
                None => return Err(format!("{}: the fsynced file is missing", span.description)),
            }
        }
        Ok(())
    }
}

fn tree_diff(expected: &Tree, found: &Tree) -> String {
    for (path, entry) in expected {
        match found.get(path) {
            None => return format!("{path} missing"),
            Some(other) if other != entry => {
                return format!(
                    "{path} differs (ino {} vs {}, {} vs {} bytes)",
                    entry.0,
                    other.0,
                    entry.2.len(),
                    other.2.len()
                )
            }
            _ => {}
        }
    }
    let extra: Vec<&String> = found.keys().filter(|path| !expected.contains_key(*path)).collect();
    format!("extra entries {extra:?}")
}

/// Runs one workload and checks every crash point; panics with the seed and
/// the op list on the first violation.
fn run_workload(seed: u64, block_bytes: u32, op_count: usize, variants_per_point: usize) -> usize {
    let mut workload = Workload::new(seed, block_bytes);
    workload.run(op_count);
    // Every point where something became durable, and every point where an
    // fsync or sync returned (it may have needed no device request at all).
    let mut points = workload.device.durability_points();
    points.extend(
        workload
            .spans
            .iter()
            .filter(|span| matches!(span.kind, SpanKind::Fsync { .. } | SpanKind::Sync(_)))
            .map(|span| span.log_end),
    );
    points.sort_unstable();
    points.dedup();
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(31));
    let mut states = 0;
    for &cut in &points {
        let unflushed = workload.device.unflushed_writes(cut);
        let mut variants: Vec<HashMap<usize, Keep>> = vec![HashMap::new()];
        for _ in 0..if unflushed.is_empty() { 0 } else { variants_per_point } {
            let choice = unflushed
                .iter()
                .map(|&index| {
                    let keep = match rng.random_range(0..4) {
                        0 => Keep::Nothing,
                        1 => Keep::Sectors((0..256).map(|_| rng.random_bool(0.5)).collect()),
                        _ => Keep::All,
                    };
                    (index, keep)
                })
                .collect();
            variants.push(choice);
        }
        for variant in variants {
            let image = workload
                .device
                .crash_image(cut, &|index| variant.get(&index).cloned().unwrap_or(Keep::Nothing));
            if let Err(violation) = workload.check_crash(cut, image) {
                let ops: Vec<String> = workload
                    .spans
                    .iter()
                    .take_while(|span| span.log_start < cut)
                    .map(|span| {
                        format!("  [{}..{}) {}", span.log_start, span.log_end, span.description)
                    })
                    .collect();
                panic!(
                    "seed {seed}, block size {block_bytes}, crash after {cut} of {} device log entries: \
                     {violation}\nops issued before the crash:\n{}",
                    workload.device.log_len(),
                    ops.join("\n")
                );
            }
            states += 1;
        }
    }
    states
}

/// Twelve workloads on 4 KiB blocks, six on the others.
fn crash_at_every_durability_point(block_bytes: u32) {
    let (seeds, states_min) = match block_bytes {
        1024 => (100..106, 50),
        4096 => (0..12, 100),
        _ => (200..206, 50),
    };
    let states: usize = seeds.map(|seed| run_workload(seed, block_bytes, 40, 2)).sum();
    assert!(states > states_min, "explored only {states} crash states");
}

/// Fills the volume, then unlinks a synced file and writes a new one that can
/// only use the freed blocks. Whatever the crash keeps, the old file (if it
/// is still there) must show its own data and the new one only its own.
fn freed_blocks_are_reused_only_after_their_free_is_durable(block_bytes: u32) {
    let (device, volume) = new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
    let old_data = pattern(1, 40 << 10);
    let old = volume.create(ROOT, b"old", 0o644, owner()).unwrap();
    volume.open_file(old.ino, OpenFlags::WRITE).unwrap().write_at(&old_data, 0).unwrap();
    let filler = volume.create(ROOT, b"filler", 0o644, owner()).unwrap();
    let filler_file = volume.open_file(filler.ino, OpenFlags::WRITE).unwrap();
    let mut filled = 0u64;
    for chunk in [1 << 20, block_bytes as usize] {
        while filler_file.write_at(&vec![0x5A; chunk], filled).is_ok_and(|written| written == chunk)
        {
            filled += chunk as u64;
        }
    }
    drop(filler_file);
    volume.sync().unwrap();
    assert!(volume.statfs().available_blocks < 10, "the volume is full");
    device.reset_log();

    volume.unlink(ROOT, b"old").unwrap();
    let new_data = pattern(2, 40 << 10);
    let new = volume.create(ROOT, b"new", 0o644, owner()).unwrap();
    let written =
        volume.open_file(new.ino, OpenFlags::WRITE).unwrap().write_at(&new_data, 0).unwrap();
    assert_eq!(written, new_data.len(), "the freed space is reused after a commit");

    for cut in 0..=device.log_len() {
        for keep in [Keep::All, Keep::Nothing] {
            let image = device.crash_image(cut, &|_| keep.clone());
            let (_, recovered) = open_image(image).unwrap();
            let tree = read_tree(&recovered);
            if let Some((_, _, content)) = tree.get("/old") {
                assert_eq!(content, &old_data, "crash at {cut}: the old file shows foreign data");
            }
            if let Some((_, _, content)) = tree.get("/new") {
                let own =
                    content.iter().zip(&new_data).all(|(byte, own)| byte == own || *byte == 0);
                assert!(own, "crash at {cut}: the new file shows foreign data");
            }
        }
    }
}

/// A collapse moves blocks down without moving their data, and an insert
/// moves them up; a write into a moved block then overwrites it in place.
/// Whatever a crash keeps, the data written at the new offset must never
/// show at the block's old one: the file is either as before the shift or
/// as after it, with the moved block holding its old or its new data.
fn shifted_blocks_are_overwritten_only_after_the_shift_is_durable(block_bytes: u32) {
    let block = block_bytes as usize;
    for mode in [FallocateMode::CollapseRange, FallocateMode::InsertRange] {
        let (device, volume) =
            new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
        let ino = volume.create(ROOT, b"f", 0o644, owner()).unwrap().ino;
        let file = volume.open_file(ino, OpenFlags::READ_WRITE).unwrap();
        let before = pattern(1, 8 * block);
        file.write_at(&before, 0).unwrap();
        file.fsync().unwrap();
        device.reset_log();
        // Blocks 4.. move to 2.. (collapse) or to 6.. (insert); the first of
        // them is then overwritten at its new place.
        file.fallocate(mode, 2 * block as u64, 2 * block as u64).unwrap();
        let moved_to = if mode == FallocateMode::CollapseRange { 2 } else { 6 };
        let mut after = before.clone();
        common::apply_fallocate_to_model(&mut after, mode, 2 * block, 2 * block);
        let shifted = after.clone();
        let new_data = pattern(2, block);
        after[moved_to * block..(moved_to + 1) * block].copy_from_slice(&new_data);
        file.write_at(&new_data, (moved_to * block) as u64).unwrap();
        volume.sync().unwrap();
        for cut in 0..=device.log_len() {
            for keep in [Keep::All, Keep::Nothing] {
                let (_, recovered) =
                    open_image(device.crash_image(cut, &|_| keep.clone())).unwrap();
                let tree = read_tree(&recovered);
                let (_, _, content) = &tree["/f"];
                let context = format!("{mode:?}, crash at {cut} of {}", device.log_len());
                if content.len() == before.len() {
                    assert!(*content == before, "{context}: the unshifted file changed");
                } else {
                    assert!(
                        *content == after || *content == shifted,
                        "{context}: the shifted file has foreign data"
                    );
                }
            }
        }
    }
}

/// Buffered appends with fsync now and then, and the flusher writing back in
/// between: whatever the crash keeps, each file is an exact prefix of what
/// was appended to it, at least as long as its last fsync. Zeros inside the
/// size would mean the size covered blocks whose write never completed.
fn buffered_appends_recover_as_exact_prefixes(block_bytes: u32) {
    let seeds = if block_bytes == 4096 { 0..6u64 } else { 0..3 };
    for seed in seeds {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (device, volume) =
            new_volume_with_journal(VOLUME_BYTES, block_bytes, Some(JOURNAL_BYTES));
        let names = ["a", "b", "c"];
        let inos: Vec<u64> = names
            .iter()
            .map(|name| volume.create(ROOT, name.as_bytes(), 0o644, owner()).unwrap().ino)
            .collect();
        let handles: Vec<_> =
            inos.iter().map(|&ino| volume.open_file(ino, OpenFlags::WRITE).unwrap()).collect();
        volume.sync().unwrap();
        device.reset_log();
        let mut contents: Vec<Vec<u8>> = vec![Vec::new(); names.len()];
        // (log position, file, length durable from there on)
        let mut synced: Vec<(usize, usize, usize)> = Vec::new();
        for step in 0..40u64 {
            let file = rng.random_range(0..names.len());
            match rng.random_range(0..10) {
                0..=6 => {
                    let data = pattern(seed * 1000 + step, rng.random_range(1..20_000));
                    let pos = contents[file].len() as u64;
                    assert_eq!(handles[file].write_at(&data, pos).unwrap(), data.len());
                    contents[file].extend_from_slice(&data);
                }
                7..=8 => {
                    handles[file].fsync().unwrap();
                    synced.push((device.log_len(), file, contents[file].len()));
                }
                // What the flusher would do at any moment.
                _ => volume.sync().unwrap(),
            }
        }
        let mut points = device.durability_points();
        points.extend(synced.iter().map(|&(cut, _, _)| cut));
        points.sort_unstable();
        points.dedup();
        for &cut in &points {
            for variant in 0..3 {
                let image = device.crash_image(cut, &|_| match variant {
                    0 => Keep::Nothing,
                    1 => Keep::All,
                    _ => Keep::Sectors((0..64).map(|sector| sector % 3 != 0).collect()),
                });
                let (_, recovered) = open_image(image).unwrap();
                for (file, name) in names.iter().enumerate() {
                    let ino = recovered.lookup(ROOT, name.as_bytes()).unwrap().ino;
                    let size = recovered.getattr(ino).unwrap().size as usize;
                    let mut found = vec![0u8; size];
                    let handle = recovered.open_file(ino, OpenFlags::READ).unwrap();
                    assert_eq!(handle.read_at(&mut found, 0).unwrap(), size);
                    let context =
                        format!("seed {seed}, crash at {cut}, variant {variant}, file {name}");
                    assert!(size <= contents[file].len(), "{context}: size {size} past the data");
                    assert!(
                        found == contents[file][..size],
                        "{context}: not a prefix of the appends ({size} bytes)"
                    );
                    let durable = synced
                        .iter()
                        .filter(|&&(at, synced_file, _)| at <= cut && synced_file == file)
                        .map(|&(_, _, length)| length)
                        .max()
                        .unwrap_or(0);
                    assert!(size >= durable, "{context}: {size} bytes, but {durable} were fsynced");
                }
            }
        }
    }
}
