//! Volume lifecycle: mkfs, open (load + replay + orphan cleanup), the
//! background committer, sync, close.

use std::path::Path;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cache::{CachePolicy, InodeCache};
use crate::dev::Device;
use crate::engine::Engine;
use crate::error::{Error, IoContext, Result};
use crate::format::{
    InodeAttrs, InodeKind, Record, Superblock, Timestamp, NAME_BYTES_MAX, ROOT_INO,
};
use crate::iomap::MapKind;
use crate::journal::SyncOnTheWay;
use crate::layout;
use crate::meta::{InodeTable, LoadLimits, LoadReport, MetaStore};
use crate::options::VolumeOptions;
use crate::writeback;

use super::attr::{Attr, Owner, StatFs};
use super::freeze::{Frozen, WriteGate};
use super::observe::{ChangeEvent, ChangeObserver, NamespaceEvent, NamespaceObserver, Observers};

/// How [`Volume::mkfs_path`] and [`Volume::format`] lay out a volume.
#[derive(Debug, Clone, Copy)]
pub struct MkfsOptions {
    /// File-system block size: a power of two from 1 KiB to 64 KiB.
    pub block_bytes: u32,
    /// Journal size; by default 1/128 of the volume, at least 1 MiB.
    pub journal_bytes: Option<u64>,
    /// Room for the metadata (every inode, directory entry, extent and
    /// extended attribute): each of the two checkpoint slots, 1 MiB to
    /// 1 GiB; by default 1/128 of the volume, at least 1 MiB (about 75,000
    /// empty files a GiB of volume). A volume for many small files wants
    /// more, as ext4's `mkfs -N` gives it more inodes.
    pub metadata_bytes: Option<u64>,
    /// Keep the metadata's checkpoint in a paged index that grows from the
    /// data region (format 3) instead of two fixed slots: no cap on files
    /// but space, and a checkpoint writes only what changed since the last
    /// (`docs/metadata.md`). Needs blocks of at least 4 KiB.
    pub metadata_index: bool,
    /// Owner of the root directory.
    pub root_owner: Owner,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        Self {
            block_bytes: 4096,
            journal_bytes: None,
            metadata_bytes: None,
            metadata_index: false,
            root_owner: Owner::current(),
        }
    }
}

/// An open volume's state, which the [`Volume`] and each of its `File` and
/// `Dir` handles hold an `Arc` of (the field each calls `shared`): the
/// engine, the superblock, the observers and the write gate.
pub(crate) struct VolumeCore {
    /// Device, metadata and policies; `VolumeCore` derefs to it.
    pub(crate) engine: Arc<Engine>,
    pub(crate) superblock: Superblock,
    pub(crate) load_report: LoadReport,
    pub(crate) observers: Observers,
    /// Passed by every changing operation; closed by a freeze.
    pub(crate) write_gate: WriteGate,
}

impl std::ops::Deref for VolumeCore {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl VolumeCore {
    /// Counts one open handle of `ino` (a file or a directory) out; true when
    /// it was the last of an inode no name refers to: an orphan to free.
    pub(crate) fn close_handle(&self, ino: u64) -> bool {
        let Some(mut inode) = self.meta.inode_mut(ino) else { return false };
        debug_assert!(inode.open_handles > 0, "inode {ino}: a handle closed that was not open");
        inode.open_handles -= 1;
        inode.open_handles == 0 && inode.attrs.nlink == 0
    }

    /// Frees `ino` if it is still an orphan (no links, no handles: someone
    /// may have opened it by number since its last handle closed); whether
    /// it did. When its blocks' shared counts would not fit one
    /// transaction, the leading part of the file that fits is unmapped
    /// first, step by step: the orphan is out of every directory already,
    /// so a crash between steps leaves it for the next mount to free.
    pub(crate) fn free_orphan(&self, ino: u64) -> Result<bool> {
        enum Step {
            Freed,
            Kept,
            Cut,
        }
        let is_orphan =
            |inode: &crate::meta::Inode| inode.open_handles == 0 && inode.attrs.nlink == 0;
        // Nearly always gone already (freed where its last link went): a
        // read, not a transaction, says so.
        if !self.meta.inode(ino).is_some_and(|inode| is_orphan(&inode)) {
            return Ok(false);
        }
        loop {
            let (step, _) = self.meta.transact(&[ino], |txn| {
                if !txn.state().inode(ino).is_some_and(is_orphan) {
                    return Ok(Step::Kept);
                }
                let room = txn.shared_count_room();
                assert!(room > 0, "a journal group holds no shared-count record");
                match txn.unmapping_cut(ino, room) {
                    None => {
                        txn.apply(Record::InodeFree { ino });
                        Ok(Step::Freed)
                    }
                    Some(cut) => {
                        txn.apply(Record::ExtentUnmap { ino, file_block: 0, block_count: cut });
                        Ok(Step::Cut)
                    }
                }
            })?;
            match step {
                Step::Freed => return Ok(true),
                Step::Kept => return Ok(false),
                Step::Cut => {}
            }
        }
    }

    /// Tells the background committer, the flusher and the background
    /// workers to end.
    pub(crate) fn stop_background(&self) {
        self.meta.stop_committer();
        self.cache.stop_flusher();
        self.engine.background.stop();
    }

    /// The I/O lock, folios and error sequence of `ino`, shared by every
    /// handle and operation on it.
    pub(crate) fn inode_cache(&self, ino: u64) -> Arc<InodeCache> {
        self.engine.cache.inode(ino)
    }

    /// Inode `ino` under its shard's read lock while the guard lives, or
    /// ENOENT naming it.
    pub(crate) fn existing_inode(
        &self,
        ino: u64,
    ) -> Result<impl std::ops::Deref<Target = crate::meta::Inode> + '_> {
        self.meta.inode(ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
    }

    /// Inode `ino` for a memory-only change (`MetaStore::inode_mut`), or
    /// ENOENT naming it.
    pub(crate) fn existing_inode_mut(
        &self,
        ino: u64,
    ) -> Result<impl std::ops::DerefMut<Target = crate::meta::Inode> + '_> {
        self.meta.inode_mut(ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))
    }

    pub(crate) fn attr_of(&self, state: &(impl InodeTable + ?Sized), ino: u64) -> Result<Attr> {
        self.check_running()?;
        let inode = state.inode(ino).ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
        Ok(Attr::of(ino, inode, self.superblock.block_bytes))
    }

    /// Commits the journal up to the inode's last change (all changes, or
    /// with `data_only` those needed to read the data back), then flushes
    /// plain data writes the commit did not already cover.
    pub(crate) fn fsync_inode(
        &self,
        ino: u64,
        data_only: bool,
        on_the_way: Option<SyncOnTheWay<'_>>,
    ) -> Result<()> {
        let (lsn, times_dirty) = {
            let inode = self.existing_inode(ino)?;
            (if data_only { inode.data_lsn } else { inode.meta_lsn }, inode.times_dirty)
        };
        if let Some(failure) = self.meta.journal().failure() {
            return Err(Error::io(failure, std::io::Error::from_raw_os_error(libc::EIO)));
        }
        // fsync persists the times an overwrite advanced in memory only;
        // fdatasync does not need them.
        let lsn = if times_dirty && !data_only {
            let (_, lsn) = self.meta.transact(&[ino], |txn| {
                if let Some(attrs) = txn.state().inode(ino).map(|inode| inode.attrs) {
                    txn.apply(Record::InodeSet { ino, attrs });
                }
                Ok(())
            })?;
            lsn
        } else {
            lsn
        };
        self.meta.make_durable(lsn, on_the_way)
    }

    /// Makes everything changed so far durable: cached data is written
    /// back, then the journal committed and the device flushed.
    pub(crate) fn sync(&self) -> Result<()> {
        writeback::write_back_all(&self.engine)?;
        self.meta.make_durable(self.meta.journal().last_lsn(), None)
    }

    /// Reports a change to a file's data or size to the observer.
    pub(crate) fn changed(&self, event: ChangeEvent) {
        self.observers.changed(event);
    }

    /// Reports `events`; a no-op (not even a clone) without an observer.
    pub(crate) fn namespace_changed(&self, events: &[NamespaceEvent]) {
        self.observers.namespace_changed(events);
    }
}

/// Threads running the engine's background jobs: enough to keep a few
/// readahead reads in flight per reader (each fills one folio).
const BACKGROUND_WORKERS: usize = 4;

/// An open volume. Dropping it commits and checkpoints (errors are logged);
/// call [`Volume::close`] to see them.
pub struct Volume {
    pub(crate) shared: Arc<VolumeCore>,
    background: Option<JoinHandle<()>>,
    flusher: Option<JoinHandle<()>>,
    /// The engine's background workers (readahead ahead of readers).
    workers: Vec<JoinHandle<()>>,
    closed: bool,
}

impl Volume {
    /// Creates (or overwrites) the image at `path` with `size_bytes` and formats it.
    pub fn mkfs_path(
        path: &Path,
        size_bytes: Option<u64>,
        mkfs: &MkfsOptions,
        options: &VolumeOptions,
    ) -> Result<Superblock> {
        if size_bytes.is_some() && crate::dev::nbd::is_nbd_uri(path) {
            return Err(Error::invalid(format!(
                "{}: an NBD export's size is the server's; mkfs it without a size",
                path.display()
            )));
        }
        if let Some(size_bytes) = size_bytes {
            layout::check_mkfs_args(size_bytes, mkfs.block_bytes)?;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(path)
                .context(|| format!("create {}", path.display()))?;
            let metadata = file.metadata().context(|| format!("stat {}", path.display()))?;
            if metadata.is_file() {
                file.set_len(size_bytes).context(|| format!("resize {}", path.display()))?;
            }
        }
        let device = Device::open(path, &options.dev_options())
            .context(|| format!("open {}", path.display()))?;
        // A file was sized above; a block device keeps its size, and the
        // volume takes the part of it asked for.
        let volume_bytes = size_bytes.unwrap_or(device.size_bytes());
        if volume_bytes > device.size_bytes() {
            return Err(Error::invalid(format!(
                "{}: a volume of {volume_bytes} bytes does not fit on its {} bytes",
                path.display(),
                device.size_bytes()
            )));
        }
        Self::format_sized(&Arc::new(device), volume_bytes, mkfs)
    }

    /// Formats `device`: checkpoint with an empty root first, superblocks last,
    /// so an interrupted mkfs leaves no volume that looks valid.
    pub fn format(device: &Arc<Device>, mkfs: &MkfsOptions) -> Result<Superblock> {
        Self::format_sized(device, device.size_bytes(), mkfs)
    }

    fn format_sized(
        device: &Arc<Device>,
        volume_bytes: u64,
        mkfs: &MkfsOptions,
    ) -> Result<Superblock> {
        let superblock = layout::plan_sized(
            device,
            volume_bytes,
            mkfs.block_bytes,
            mkfs.journal_bytes,
            mkfs.metadata_bytes,
        )?;
        let superblock = match (mkfs.metadata_index, mkfs.metadata_bytes) {
            (false, _) => superblock,
            (true, Some(_)) => {
                return Err(Error::invalid(
                    "a metadata index grows as it needs: give no metadata size with it",
                ))
            }
            (true, None) => superblock
                .with_metadata_index()
                .map_err(|error| Error::invalid(error.to_string()))?,
        };
        let now = Timestamp::now();
        let root = InodeAttrs {
            kind: InodeKind::Dir,
            mode: 0o755,
            uid: mkfs.root_owner.uid,
            gid: mkfs.root_owner.gid,
            nlink: 2,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            parent: ROOT_INO,
        };
        MetaStore::format(device, &superblock, root)?;
        layout::write_superblocks(device, &superblock)?;
        Ok(superblock)
    }

    /// Opens the volume in the image file or block device at `path`, replaying its journal; the image stays locked against other openers until the volume closes.
    pub fn open(path: &Path, options: &VolumeOptions) -> Result<Self> {
        let device = Device::open(path, &options.dev_options())
            .context(|| format!("open {}", path.display()))?;
        Self::open_device(Arc::new(device), options)
    }

    /// Opens a formatted device: reads the superblock, loads the checkpoint,
    /// replays the journal and (unless read-only) frees orphaned inodes.
    pub fn open_device(device: Arc<Device>, options: &VolumeOptions) -> Result<Self> {
        let superblock = layout::read_superblock(&device)?;
        let block_bytes = superblock.block_bytes_u64();
        let limits = LoadLimits { block_bytes, size_max: crate::engine::FILE_BYTES_MAX };
        let (meta, load_report) =
            MetaStore::load(Arc::clone(&device), &superblock, options.read_only, limits)?;
        meta.set_inode_cache_bytes(options.inode_cache_bytes);
        // A hostile image may hold sizes and extents no live operation makes;
        // refusing them here keeps the byte arithmetic of every later path
        // (fiemap, reads, seeks) from overflowing. Found by fuzz_images.
        crate::meta::check_limits(
            meta.view_all().inodes(),
            block_bytes,
            crate::engine::FILE_BYTES_MAX,
        )
        .map_err(|error| Error::Corrupt(error.0))?;
        if options.folio_max_bytes < block_bytes {
            return Err(Error::invalid(format!(
                "option folio_max={} is smaller than the volume's block size ({block_bytes})",
                options.folio_max_bytes
            )));
        }
        if options.discard && !options.read_only {
            meta.enable_discard(block_bytes);
        }
        let cache = crate::cache::PageCache::new(
            CachePolicy::new(options, block_bytes)
                .for_device(u64::from(device.logical_block_bytes())),
            meta.copy_release(),
        );
        let background = Default::default();
        let engine =
            Engine { device, meta, cache, block_bytes, options: options.clone(), background };
        let shared = Arc::new(VolumeCore {
            engine: Arc::new(engine),
            superblock,
            load_report,
            observers: Default::default(),
            write_gate: Default::default(),
        });
        if !options.read_only {
            free_orphans(&shared)?;
        }
        // A thread that cannot be had (resource limits) fails the open; the
        // threads already started end when `shared` goes with the error.
        let background = (!options.read_only && options.commit_interval_ms > 0)
            .then(|| spawn_background(Arc::downgrade(&shared), options.commit_interval_ms))
            .transpose()
            .map_err(|error| Error::io("starting the background commit thread", error))?;
        let flusher = (!options.read_only)
            .then(|| {
                let engine = Arc::downgrade(&shared.engine);
                writeback::spawn_flusher(engine, options.writeback_interval_ms)
            })
            .transpose()
            .map_err(|error| Error::io("starting the writeback thread", error))?;
        let workers = crate::engine::spawn_background_workers(&shared.engine, BACKGROUND_WORKERS)
            .map_err(|error| Error::io("starting the background workers", error))?;
        Ok(Self { shared, background, flusher, workers, closed: false })
    }

    /// The volume's superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.shared.superblock
    }

    /// The options the volume was opened with.
    pub fn options(&self) -> &VolumeOptions {
        &self.shared.options
    }

    /// What opening found and replayed.
    pub fn load_report(&self) -> LoadReport {
        self.shared.load_report
    }

    /// The device under the volume (for its statistics).
    pub fn device(&self) -> &Arc<Device> {
        &self.shared.device
    }

    /// Commits the journal and flushes the device (syncfs).
    pub fn sync(&self) -> Result<()> {
        self.shared.sync()
    }

    /// Writes a checkpoint now (normally done when the journal fills).
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.meta.checkpoint()
    }

    /// Waits for the metadata's locks so far.
    pub fn lock_waits(&self) -> LockWaits {
        let meta = &self.shared.meta;
        let ((shard_waits, shard_wait_ns), (space_waits, space_wait_ns)) = meta.lock_waits();
        let (journal_waits, journal_wait_ns) = meta.journal().lock_waits();
        LockWaits {
            shard_waits,
            shard_wait_ns,
            space_waits,
            space_wait_ns,
            journal_waits,
            journal_wait_ns,
        }
    }

    /// Checkpoints written since the volume was opened.
    pub fn checkpoint_stats(&self) -> CheckpointStats {
        let (checkpoints, bytes_total, ns_total) = self.shared.meta.checkpoint_totals();
        CheckpointStats { checkpoints, bytes_total, ns_total }
    }

    /// Inodes in memory now: every one on format 2; on format 3 those in
    /// use, changed since the last checkpoint, or within
    /// `inode_cache_bytes`. Counted a shard at a time: not for hot paths.
    pub fn inodes_in_memory(&self) -> u64 {
        self.shared.meta.inodes_in_memory()
    }

    /// What the folio cache holds now.
    pub fn cache_stats(&self) -> CacheStats {
        let (folios_reused, folios_allocated) = self.shared.cache.buffers_handed_out();
        let throttle = self.shared.cache.throttle();
        let (throttle_pauses, throttle_pause_ns_total) = throttle.pauses();
        CacheStats {
            cached_bytes: self.shared.cache.cached_bytes(),
            dirty_bytes: self.shared.cache.dirty_bytes(),
            folios: self.shared.cache.folio_count(),
            memory_bytes: self.shared.cache.memory_bytes(),
            folios_reused,
            folios_allocated,
            write_bandwidth_bytes_per_s: throttle.write_bytes_per_s(),
            throttle_pauses,
            throttle_pause_ns_total,
        }
    }

    /// Volume figures. Space freed by a transaction not yet durable cannot
    /// be reused until it is: when some waits, the journal is committed
    /// first, so space freed by `rm` shows as free at once (FUSE passes no
    /// syncfs to hurry it).
    pub fn statfs(&self) -> StatFs {
        let frees_pending = self.shared.meta.space().pending_free_blocks() > 0;
        if frees_pending && self.shared.meta.refusal().is_none() {
            if let Err(error) = self.shared.meta.commit_all() {
                tracing::warn!("statfs: committing freed space: {error}");
            }
        }
        self.shared.meta.release_durable_frees();
        let space = self.shared.meta.space();
        StatFs {
            block_bytes: self.shared.superblock.block_bytes,
            data_blocks: self.shared.superblock.data.block_count,
            available_blocks: space.alloc.available_blocks(),
            // Delayed allocations count as used: their space is promised.
            free_blocks: space.alloc.available_blocks() + space.pending_free_blocks(),
            inodes: self.shared.meta.inode_count(),
            name_bytes_max: NAME_BYTES_MAX as u32,
            metadata_bytes: self.shared.meta.persisted_bytes_estimate(),
            metadata_bytes_max: self.shared.meta.metadata_bytes_max(),
            shared_blocks: space.shared.shared_blocks(),
        }
    }

    /// Commits, checkpoints and stops the background committer; reports errors.
    pub fn close(mut self) -> Result<()> {
        self.close_once()
    }

    fn close_once(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        self.shared.stop_background();
        if let Some(background) = self.background.take() {
            let _ = background.join();
        }
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        // What a shutdown left in memory is lost on purpose.
        if self.shared.device.is_shut_down() {
            return Ok(());
        }
        if self.shared.meta.refusal().is_some() {
            return match self.shared.meta.journal().failure() {
                Some(failure) => Err(Error::ReadOnly(failure)),
                None => Ok(()),
            };
        }
        self.shared.sync()?;
        self.shared.meta.checkpoint()
    }
}

impl Volume {
    /// FIFREEZE: waits for every operation that changes the volume to end,
    /// writes back and commits everything, and keeps other threads' changes
    /// waiting until the returned value is dropped (FITHAW), so the image
    /// on the device is whole and stays so: a backup may copy it meanwhile.
    /// Reads go on. This thread may still change the volume; a frozen
    /// volume's snapshot is made so.
    pub fn freeze(&self) -> Result<Frozen<'_>> {
        let frozen = self.shared.write_gate.freeze()?;
        self.shared.sync()?;
        Ok(frozen)
    }

    /// Freezes without the sync, for work that flushes what it reads.
    pub(super) fn freeze_unsynced(&self) -> Result<Frozen<'_>> {
        self.shared.write_gate.freeze()
    }

    /// Calls `observer` after every change to a file's data or size, made
    /// through any handle of this volume (buffered or direct writes,
    /// truncates, fallocate); `None` stops the calls. One observer at a
    /// time: setting one replaces the last.
    pub fn set_change_observer(&self, observer: Option<ChangeObserver>) {
        self.shared.observers.set_change(observer);
    }

    /// Calls `observer` after every change to a name (create, link,
    /// unlink, rmdir, rename) or to an inode's attributes (setattr,
    /// extended attributes), so that a cache of names and attributes may
    /// keep them for long; `None` stops the calls.
    pub fn set_namespace_observer(&self, observer: Option<NamespaceObserver>) {
        self.shared.observers.set_namespace(observer);
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Err(error) = self.close_once() {
            tracing::error!("closing the volume: {error}");
        }
    }
}

/// How often operations found the metadata's locks taken, and how long
/// they waited, since the volume was opened: the contention `foliofs bench`
/// prints beside its rates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockWaits {
    /// Waits for an inode shard's lock (read or write).
    pub shard_waits: u64,
    /// Time those waits took, all threads together.
    pub shard_wait_ns: u64,
    /// Waits for free space's mutex (allocation and frees).
    pub space_waits: u64,
    /// Time those waits took.
    pub space_wait_ns: u64,
    /// Waits for the journal's mutex (appends, commits).
    pub journal_waits: u64,
    /// Time those waits took.
    pub journal_wait_ns: u64,
}

/// Checkpoints written since the volume was opened (when the journal
/// filled, or asked for), each from its cut to durable: `foliofs bench
/// scale` prints each one's bytes and time from the differences.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Their payloads' bytes (the encoded metadata), all together.
    pub bytes_total: u64,
    /// Their time, all together.
    pub ns_total: u64,
}

/// Memory of the folio cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Bytes of file data in the cache.
    pub cached_bytes: u64,
    /// Bytes of the cache not yet written back.
    pub dirty_bytes: u64,
    /// Folios alive (cached, or still in use after being dropped from it).
    pub folios: u64,
    /// Memory behind the folios (what the allocator holds for them: slabs
    /// of small folios, buffers of large ones, freed buffers kept).
    pub memory_bytes: u64,
    /// Folio memory recycled from evicted folios, and freshly allocated.
    pub folios_reused: u64,
    /// Folios allocated since the volume opened.
    pub folios_allocated: u64,
    /// Writeback's measured bandwidth, smoothed: what paced writers share.
    /// None until writeback has written a dirty limit's worth (1 to 64 MiB)
    /// and come to rest with no batch in flight.
    pub write_bandwidth_bytes_per_s: Option<u64>,
    /// Times a buffered writer slept to keep to the paced rate (above the
    /// freerun ceiling, below the dirty limit).
    pub throttle_pauses: u64,
    /// Those sleeps' total time.
    pub throttle_pause_ns_total: u64,
}

/// One extent as `fiemap` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FiemapExtent {
    /// Byte offset in the file.
    pub logical: u64,
    /// Byte offset on the device.
    pub physical: u64,
    /// Length in bytes.
    pub length: u64,
    /// Written, unwritten (preallocated) or delayed.
    pub kind: MapKind,
    /// The file's last extent.
    pub last: bool,
}

/// Frees inodes that lost their last name while open when the volume stopped.
fn free_orphans(shared: &VolumeCore) -> Result<()> {
    let orphans: Vec<u64> = {
        let state = shared.meta.view_all();
        let orphans: Vec<u64> = state
            .inodes()
            .filter(|(_, inode)| inode.attrs.nlink == 0)
            .map(|(ino, _)| ino)
            .collect();
        for &ino in &orphans {
            let inode = state.inode(ino).expect("listed");
            if ino == ROOT_INO || inode.entries().is_some_and(|entries| !entries.is_empty()) {
                return Err(Error::Corrupt(format!(
                    "inode {ino} has no links but is the root or a non-empty directory"
                )));
            }
        }
        orphans
    };
    if orphans.is_empty() {
        return Ok(());
    }
    tracing::info!("freeing {} orphaned inodes", orphans.len());
    if shared.meta.shared_blocks() > 0 {
        // Their blocks' shared counts are records too: one orphan at a
        // time, each in as many steps as its counts need.
        for &ino in &orphans {
            shared.free_orphan(ino)?;
        }
        return shared.meta.commit_all();
    }
    // In batches: one transaction must fit a journal group, and a crash can
    // leave more orphans than a small journal's group holds records.
    let mut lsn = 0;
    for batch in orphans.chunks(ORPHANS_FREED_PER_TXN) {
        let free_record_bytes = Record::InodeFree { ino: batch[0] }.encoded_bytes_max() as u64;
        (_, lsn) = shared.meta.transact(batch, |txn| {
            txn.ensure_metadata_room(free_record_bytes * batch.len() as u64)?;
            for &ino in batch {
                txn.apply(Record::InodeFree { ino });
            }
            Ok(())
        })?;
    }
    shared.meta.commit(lsn)
}

/// Orphans freed by one transaction at mount: 9 bytes of journal each, so a
/// batch fits the smallest journal's 16 KiB group with room to spare.
const ORPHANS_FREED_PER_TXN: usize = 1024;

/// Commits the journal every `interval_ms`, and when a writer has logged
/// half a group; checkpoints when the log fills.
fn spawn_background(shared: Weak<VolumeCore>, interval_ms: u64) -> std::io::Result<JoinHandle<()>> {
    if let Some(shared) = shared.upgrade() {
        shared.meta.committer_starting();
    }
    std::thread::Builder::new().name("foliofs-commit".into()).spawn(move || loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if !shared.meta.wait_for_commit_request(Duration::from_millis(interval_ms)) {
            return;
        }
        if let Err(error) =
            shared.meta.commit_all().and_then(|()| shared.meta.checkpoint_if_due().map(|_| ()))
        {
            tracing::error!("background commit: {error}");
        }
    })
}

/// A volume of 4 KiB blocks on a fresh 64 MiB in-memory device, with
/// `options` (`apply_list` syntax, `,`-separated; an empty one is skipped);
/// the device too, for faults and limits.
#[cfg(test)]
pub(super) fn test_volume(options: &str) -> (Volume, Arc<crate::dev::FaultDev>) {
    use crate::dev::{FaultDev, FuaMode};
    let raw = Arc::new(FaultDev::from_image(vec![0; 64 << 20], 512));
    let device = Arc::new(Device::new(raw.clone(), FuaMode::Native));
    let owner = Owner { uid: 0, gid: 0 };
    Volume::format(
        &device,
        &MkfsOptions {
            block_bytes: 4096,
            journal_bytes: None,
            metadata_bytes: None,
            metadata_index: false,
            root_owner: owner,
        },
    )
    .unwrap();
    let mut volume_options = VolumeOptions::default();
    for option in options.split(',').filter(|option| !option.is_empty()) {
        volume_options.apply_list(option).unwrap();
    }
    (Volume::open_device(device, &volume_options).unwrap(), raw)
}
