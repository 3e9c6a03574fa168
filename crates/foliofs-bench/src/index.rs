//! How the paged metadata index (`foliofs::index`) holds up as the files
//! grow: each file is what it will cost the metadata store, an inode record
//! (`I` + inode number, 120 bytes) and a directory entry (`D` + parent +
//! name hash, the inode number and a 20-byte name), inserted into one tree
//! on an image file, committed whenever the changed nodes pass a quarter of
//! the cache. Reported: creates per second and RSS per window, every
//! commit's bytes and duration, close, open, a stat of random files on a
//! cold cache (page reads per stat), and a commit after changing 1,000
//! files.

use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use foliofs::dev::{DevOptions, Device};
use foliofs::index::{CommitReport, IndexOptions, Tree};
use parking_lot::{Condvar, Mutex};
use serde_json::json;

pub const INODE_VALUE_BYTES: usize = 120;
const NAME_BYTES: usize = 20;
/// Files per directory, as the measurements made them.
const FILES_PER_DIR: u64 = 1_000;

#[derive(Clone, Debug)]
pub struct IndexBenchOptions {
    pub files: u64,
    pub windows: u64,
    pub cache_bytes: usize,
    /// Random stats on the reopened index.
    pub stats: u64,
    /// Commits written on a thread of their own while the creates go on,
    /// rather than by the creating thread.
    pub background_commits: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Window {
    pub files: u64,
    pub creates_per_s: f64,
    pub rss_bytes: u64,
    pub commits: u64,
    pub commit_bytes: u64,
    pub commit_ms_max: f64,
    /// The longest one file's creation took, commits and waits included.
    pub create_us_max: f64,
}

#[derive(Clone, Debug, Default)]
pub struct IndexBenchResult {
    pub windows: Vec<Window>,
    pub entries: u64,
    pub height: u8,
    pub index_bytes: u64,
    pub close_ms: f64,
    pub open_ms: f64,
    pub stats_per_s: f64,
    pub page_reads_per_stat: f64,
    pub small_commit_bytes: u64,
    pub small_commit_ms: f64,
    pub rss_peak_bytes: u64,
}

/// The bytes of image the index may need: its pages at least a third full,
/// and room to copy.
pub fn image_bytes(files: u64) -> u64 {
    let entry_bytes = 9 + INODE_VALUE_BYTES as u64 + 4 + 17 + 8 + NAME_BYTES as u64 + 4;
    (files * entry_bytes * 3 + (256 << 20)).next_multiple_of(1 << 20)
}

fn inode_key(ino: u64) -> [u8; 9] {
    let mut key = [b'I'; 9];
    key[1..].copy_from_slice(&ino.to_be_bytes());
    key
}

/// A cheap, well-spread 64-bit mix (splitmix64's finaliser), standing in
/// for a name hash and for a random choice of file.
fn mix(mut value: u64) -> u64 {
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d049bb133111eb);
    value ^ (value >> 31)
}

fn entry(ino: u64) -> ([u8; 17], Vec<u8>) {
    let parent = ino / FILES_PER_DIR;
    let mut key = [b'D'; 17];
    key[1..9].copy_from_slice(&parent.to_be_bytes());
    key[9..].copy_from_slice(&mix(ino).to_be_bytes());
    let mut value = ino.to_le_bytes().to_vec();
    value.extend(format!("file-{ino:015}").bytes().take(NAME_BYTES));
    (key, value)
}

fn inode_value(ino: u64, generation: u8) -> Vec<u8> {
    let mut value = vec![generation; INODE_VALUE_BYTES];
    value[..8].copy_from_slice(&ino.to_le_bytes());
    value
}

/// This process's resident and peak resident bytes.
pub fn rss_bytes() -> (u64, u64) {
    let field = |name| crate::scale_worker::status_bytes("self", name).unwrap_or(0);
    (field("VmRSS:"), field("VmHWM:"))
}

fn open_device(image: &Path) -> anyhow::Result<Arc<Device>> {
    Ok(Arc::new(Device::open(image, &DevOptions::default())?))
}

fn index_options(image_bytes: u64, cache_bytes: usize) -> IndexOptions {
    IndexOptions { owner: 1, region: 0..image_bytes, cache_bytes, pages_given: false }
}

/// Runs the bench on `image` (a file of at least `image_bytes(files)`),
/// calling `progress` after each window.
pub fn run(
    options: &IndexBenchOptions,
    image: &Path,
    progress: &dyn Fn(&Window),
) -> anyhow::Result<IndexBenchResult> {
    let image_bytes = std::fs::metadata(image)?.len();
    let region = index_options(image_bytes, options.cache_bytes);
    let tree = Arc::new(Shared {
        tree: Mutex::new(Tree::create(open_device(image)?, region.clone())?),
        committed: Condvar::new(),
        reports: Mutex::new(Vec::new()),
        committer_failed: Default::default(),
    });
    let committer = options.background_commits.then(|| Committer::start(tree.clone()));
    let mut result = IndexBenchResult::default();
    let window_files = options.files.div_ceil(options.windows.max(1)).max(1);
    let mut ino = 0;
    while ino < options.files {
        let end = (ino + window_files).min(options.files);
        let window = create_window(&tree, committer.as_ref(), ino, end)?;
        ino += window_files;
        progress(&window);
        result.windows.push(window);
    }
    if let Some(committer) = committer {
        committer.stop()?;
    }
    let mut tree = Arc::into_inner(tree).expect("the committer has stopped").tree.into_inner();
    tree.commit()?;
    result.entries = tree.len();
    result.height = tree.height();
    result.index_bytes = tree.used_pages() * foliofs::index::PAGE_BYTES as u64;
    let started = Instant::now();
    drop(tree);
    result.close_ms = ms_since(started);
    let started = Instant::now();
    let mut tree = Tree::open(open_device(image)?, region)?;
    result.open_ms = ms_since(started);
    stat_random_files(&mut tree, options, &mut result)?;
    // A checkpoint after changing 1,000 files writes only their pages.
    for index in 0..1_000u64 {
        let ino = mix(index ^ 0x5eed) % options.files;
        tree.insert(&inode_key(ino), &inode_value(ino, 2))?;
    }
    let commit = tree.commit()?;
    result.small_commit_bytes = commit.bytes_written;
    result.small_commit_ms = commit.duration_ns as f64 / 1e6;
    result.rss_peak_bytes = rss_bytes().1;
    Ok(result)
}

fn ms_since(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}

/// The tree, shared between the creating thread and a committer.
struct Shared {
    tree: Mutex<Tree>,
    /// Signalled when a background commit finishes.
    committed: Condvar,
    reports: Mutex<Vec<CommitReport>>,
    /// The committer stopped on an error: nobody is to wait for it.
    committer_failed: std::sync::atomic::AtomicBool,
}

/// A thread that commits when asked, writing outside the tree's lock.
struct Committer {
    request: SyncSender<()>,
    thread: JoinHandle<anyhow::Result<()>>,
}

impl Committer {
    fn start(shared: Arc<Shared>) -> Self {
        let (request, requests) = sync_channel(1);
        let thread = std::thread::spawn(move || Self::serve(&shared, &requests));
        Self { request, thread }
    }

    fn serve(shared: &Shared, requests: &Receiver<()>) -> anyhow::Result<()> {
        let result = Self::commit_when_asked(shared, requests);
        if result.is_err() {
            let _tree = shared.tree.lock(); // so a creator cannot miss it
            shared.committer_failed.store(true, std::sync::atomic::Ordering::Release);
            shared.committed.notify_all();
        }
        result
    }

    fn commit_when_asked(shared: &Shared, requests: &Receiver<()>) -> anyhow::Result<()> {
        while requests.recv().is_ok() {
            let sealed = shared.tree.lock().seal()?;
            let written = sealed.write();
            let report = shared.tree.lock().finish(written);
            shared.committed.notify_all();
            shared.reports.lock().push(report?);
        }
        Ok(())
    }

    /// Asks for a commit unless one is asked for already.
    fn ask(&self) {
        match self.request.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) => {}
            Err(TrySendError::Disconnected(())) => {} // its error comes out of stop
        }
    }

    fn stop(self) -> anyhow::Result<()> {
        drop(self.request);
        self.thread.join().map_err(|_| anyhow::anyhow!("the committer panicked"))?
    }
}

fn create_window(
    shared: &Shared,
    committer: Option<&Committer>,
    first: u64,
    end: u64,
) -> anyhow::Result<Window> {
    let mut window = Window { files: end, ..Window::default() };
    let started = Instant::now();
    let mut create_ns_max = 0;
    for ino in first..end {
        let create_started = Instant::now();
        let mut tree = shared.tree.lock();
        tree.insert(&inode_key(ino), &inode_value(ino, 1))?;
        let (key, value) = entry(ino);
        tree.insert(&key, &value)?;
        match committer {
            None if tree.needs_commit() => shared.reports.lock().push(tree.commit()?),
            None => {}
            Some(committer) => {
                if tree.needs_commit() {
                    committer.ask();
                }
                // Past its share of memory, the creator waits for the commit.
                while tree.needs_throttle() {
                    if shared.committer_failed.load(std::sync::atomic::Ordering::Acquire) {
                        anyhow::bail!("the index's committer failed");
                    }
                    shared.committed.wait(&mut tree);
                }
            }
        }
        drop(tree);
        create_ns_max = create_ns_max.max(create_started.elapsed().as_nanos());
    }
    window.creates_per_s = (end - first) as f64 / started.elapsed().as_secs_f64();
    window.create_us_max = create_ns_max as f64 / 1e3;
    window.rss_bytes = rss_bytes().0;
    for commit in shared.reports.lock().drain(..) {
        window.commits += 1;
        window.commit_bytes += commit.bytes_written;
        window.commit_ms_max = window.commit_ms_max.max(commit.duration_ns as f64 / 1e6);
    }
    Ok(window)
}

fn stat_random_files(
    tree: &mut Tree,
    options: &IndexBenchOptions,
    result: &mut IndexBenchResult,
) -> anyhow::Result<()> {
    let before = tree.stats();
    let stats = options.stats.min(options.files);
    let started = Instant::now();
    for index in 0..stats {
        let ino = mix(index) % options.files;
        let (key, _) = entry(ino);
        let found = tree.get(&key)?;
        anyhow::ensure!(found.is_some(), "file {ino}'s entry is missing");
        let inode = tree.get(&inode_key(ino))?;
        anyhow::ensure!(inode.is_some_and(|value| value[..8] == ino.to_le_bytes()), "inode {ino}");
    }
    result.stats_per_s = stats as f64 / started.elapsed().as_secs_f64();
    let reads = tree.stats().page_reads - before.page_reads;
    result.page_reads_per_stat = reads as f64 / stats.max(1) as f64;
    Ok(())
}

/// The result as a Markdown report.
pub fn to_markdown(options: &IndexBenchOptions, result: &IndexBenchResult) -> String {
    let mut out = format!(
        "## Paged index: {} files ({} entries), cache {} MiB\n\n\
         commits {}\n\n\
         | files | creates/s | longest create ms | RSS MiB | commits | commit MiB | slowest commit ms |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
        options.files,
        result.entries,
        options.cache_bytes >> 20,
        if options.background_commits { "on a thread of their own" } else { "by the creating thread" }
    );
    for window in &result.windows {
        out += &format!(
            "| {} | {:.0} | {:.1} | {:.0} | {} | {:.1} | {:.1} |\n",
            window.files,
            window.creates_per_s,
            window.create_us_max / 1e3,
            window.rss_bytes as f64 / (1 << 20) as f64,
            window.commits,
            window.commit_bytes as f64 / (1 << 20) as f64,
            window.commit_ms_max
        );
    }
    let rates: Vec<f64> = result.windows.iter().map(|window| window.creates_per_s).collect();
    let (slowest, median) = (min(&rates), median(&rates));
    out += &format!(
        "\nslowest window / median: {:.2}\nheight {}, index {:.1} MiB on disk\n\
         close {:.1} ms, open {:.2} ms\n\
         random stats (entry and inode) on a cold cache: {:.0}/s, {:.2} page reads per stat\n\
         commit after changing 1,000 files: {:.2} MiB in {:.1} ms\npeak RSS {:.0} MiB\n",
        slowest / median,
        result.height,
        result.index_bytes as f64 / (1 << 20) as f64,
        result.close_ms,
        result.open_ms,
        result.stats_per_s,
        result.page_reads_per_stat,
        result.small_commit_bytes as f64 / (1 << 20) as f64,
        result.small_commit_ms,
        result.rss_peak_bytes as f64 / (1 << 20) as f64,
    );
    out
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn to_json(options: &IndexBenchOptions, result: &IndexBenchResult) -> serde_json::Value {
    json!({
        "files": options.files,
        "cache_bytes": options.cache_bytes,
        "background_commits": options.background_commits,
        "entries": result.entries,
        "height": result.height,
        "index_bytes": result.index_bytes,
        "windows": result.windows.iter().map(|window| json!({
            "files": window.files,
            "creates_per_s": window.creates_per_s,
            "rss_bytes": window.rss_bytes,
            "commits": window.commits,
            "commit_bytes": window.commit_bytes,
            "commit_ms_max": window.commit_ms_max,
            "create_us_max": window.create_us_max,
        })).collect::<Vec<_>>(),
        "close_ms": result.close_ms,
        "open_ms": result.open_ms,
        "stats_per_s": result.stats_per_s,
        "page_reads_per_stat": result.page_reads_per_stat,
        "small_commit_bytes": result.small_commit_bytes,
        "small_commit_ms": result.small_commit_ms,
        "rss_peak_bytes": result.rss_peak_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_finds_every_file_and_commits_little_for_a_small_change() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("index.img");
        let files = 20_000;
        std::fs::File::create(&image).unwrap().set_len(image_bytes(files)).unwrap();
        for background_commits in [false, true] {
            let options = IndexBenchOptions {
                files,
                windows: 4,
                cache_bytes: 1 << 20,
                stats: 2_000,
                background_commits,
            };
            check_small_run(&options, &image);
        }
    }

    fn check_small_run(options: &IndexBenchOptions, image: &Path) {
        let files = options.files;
        let result = run(options, image, &|_| {}).unwrap();
        assert_eq!(result.entries, 2 * files);
        assert_eq!(result.windows.len(), 4);
        assert!(result.windows.iter().map(|window| window.commits).sum::<u64>() > 0);
        assert!(result.height >= 3, "height {}", result.height);
        // A cold cache of 1 MiB holds the upper levels after the first stats.
        assert!(result.page_reads_per_stat > 0.0 && result.page_reads_per_stat < 4.0);
        // 1,000 changed inodes: at most a leaf each plus their parents.
        assert!(result.small_commit_bytes < 1_100 * 2 * 4096, "{}", result.small_commit_bytes);
        let report = to_markdown(options, &result);
        assert!(report.contains("page reads per stat"), "{report}");
    }
}
