//! Keeps the kernel's page cache and attribute cache of a mount coherent
//! with changes it did not make itself: the library reports every change to
//! a file's data or size ([`foliofs::ChangeEvent`]); this turns the ones the
//! kernel cannot know about into FUSE_NOTIFY_INVAL_INODE.
//!
//! Which changes the kernel already knows: a buffered write through a handle
//! that goes through its page cache (write-through: it filled its pages
//! before sending the write) and the write-back of its own pages. With
//! `page_cache=kernel` every other change is invalidated: direct writes,
//! truncates and fallocate through the mount (cheap, and the kernel's own
//! handling of them varies by version; Linux 6.18 drops its pages after a
//! synchronous direct write but not after an asynchronous one, so a direct
//! write's reply waits for its invalidation: `after_queued`) and
//! every change a library user of the volume makes. With
//! `page_cache=engine` the kernel caches pages only for mmap and its direct
//! I/O path keeps them coherent: only a library user's changes are sent.
//!
//! Names and attributes: the kernel keeps dentries and attributes for the
//! mount's `attr_timeout` (long by default), which is safe because every
//! change it did not make itself is told: a library user's creates,
//! unlinks, renames and attribute changes ([`foliofs::NamespaceEvent`])
//! become FUSE_NOTIFY_INVAL_ENTRY (with the parent's pages, which hold
//! the listing the kernel caches in every mode) and attribute-only
//! INVAL_INODE, and a
//! library user's data change to a file the mount never opened (whose size
//! and times the kernel may still hold from a lookup) an attribute-only
//! INVAL_INODE. The kernel's own changes through the mount it updates
//! itself.
//!
//! Deadlock rule: invalidating waits for the page locks of the range, and
//! the kernel holds those while it waits for some replies of this daemon (a
//! write-through write holds its pages until its WRITE is answered). So a
//! change made while serving a request is queued and sent from a thread of
//! its own, never from the serving thread, and so is a change reported by
//! the thread that completed asynchronous I/O (an engine completion thread,
//! which the kernel's page-lock holder may be waiting on); a library user's
//! other changes are sent before its call returns (it holds no lock of the
//! volume by then), so a reader through the mount sees them at once.

use std::cell::Cell;
use std::collections::HashSet;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use foliofs::{ChangeEvent, ChangeObserver, NamespaceEvent, NamespaceObserver};
use fuser::{INodeNo, Notifier};

thread_local! {
    /// Set while a change the kernel made in its own page cache is applied.
    static KERNEL_SEES: Cell<bool> = const { Cell::new(false) };
    /// Set for good on threads that serve the kernel's requests.
    static SERVING: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as one that serves the kernel's requests: its
/// changes are invalidated from the notification thread, if at all.
pub(crate) fn mark_serving() {
    SERVING.with(|serving| serving.set(true));
}

/// `future`, a served request's I/O: its change events count as served on
/// whichever thread polls it (the one that completes it may be an engine
/// thread that serves nothing else).
pub(crate) fn serving<F: Future + Unpin>(future: F) -> Serving<F> {
    Serving(future)
}

pub(crate) struct Serving<F>(F);

impl<F: Future + Unpin> Future for Serving<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        let before = SERVING.with(|serving| serving.replace(true));
        let polled = Pin::new(&mut self.0).poll(context);
        SERVING.with(|serving| serving.set(before));
        polled
    }
}

/// Runs `work`, a change the kernel already holds in its page cache.
pub(crate) fn kernel_sees<R>(work: impl FnOnce() -> R) -> R {
    KERNEL_SEES.with(|sees| sees.set(true));
    let result = work();
    KERNEL_SEES.with(|sees| sees.set(false));
    result
}

/// A set of inode numbers in shards, each under its own lock: every open
/// and every change of a file asks it, and requests for unrelated files
/// from many threads must not meet on one lock.
struct InodeSet {
    shards: [Mutex<HashSet<u64>>; INODE_SET_SHARDS],
}

const INODE_SET_SHARDS: usize = 64;

impl Default for InodeSet {
    fn default() -> Self {
        Self { shards: std::array::from_fn(|_| Mutex::default()) }
    }
}

impl InodeSet {
    fn shard(&self, ino: u64) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        let shard = &self.shards[ino as usize % INODE_SET_SHARDS];
        // A panic elsewhere leaves the set whole: insert and lookup only.
        shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn insert(&self, ino: u64) {
        self.shard(ino).insert(ino);
    }

    fn contains(&self, ino: u64) -> bool {
        self.shard(ino).contains(&ino)
    }
}

pub(crate) struct Invalidator {
    notifier: Arc<OnceLock<Notifier>>,
    /// Files the kernel may hold pages or attributes of: opened through the
    /// mount at least once. Changes to others need no notification.
    page_cached: InodeSet,
    /// Whether changes made while serving a request are sent.
    served_changes: bool,
    /// Every inode counts as cached: with zero-message opens the daemon
    /// does not see the opens that would put a file in `page_cached`.
    every_inode_cached: std::sync::atomic::AtomicBool,
    queue: mpsc::Sender<Queued>,
}

/// What the notification thread does, in the order it was queued.
enum Queued {
    Invalidate(ChangeEvent),
    /// A reply that must not reach the kernel before the invalidations
    /// queued ahead of it.
    Then(Box<dyn FnOnce() + Send>),
}

impl Invalidator {
    /// Starts the notification thread; it ends once the observer is gone.
    pub(crate) fn start(notifier: Arc<OnceLock<Notifier>>, served_changes: bool) -> Arc<Self> {
        let (queue, queued) = mpsc::channel::<Queued>();
        let sender = Arc::clone(&notifier);
        let spawned = std::thread::Builder::new().name("foliofs-inval".into()).spawn(move || {
            for job in queued {
                match job {
                    Queued::Invalidate(event) => send(&sender, event),
                    Queued::Then(reply) => reply(),
                }
            }
        });
        if let Err(error) = spawned {
            tracing::warn!("no thread for page cache invalidations: {error}");
        }
        Arc::new(Self {
            notifier,
            page_cached: InodeSet::default(),
            served_changes,
            every_inode_cached: Default::default(),
            queue,
        })
    }

    /// Runs `reply` once the invalidations queued so far are sent: a direct
    /// write's reply, so that no page the kernel cached of the range while
    /// the write was in flight (a concurrent buffered reader's) outlives the
    /// write's completion. The kernel drops such pages itself only after a
    /// synchronous direct write, not after an asynchronous (AIO) one
    /// (generic/451). Nothing is queued when served changes are not sent
    /// (`page_cache=engine`: the kernel caches no pages to go stale).
    pub(crate) fn after_queued(&self, reply: impl FnOnce() + Send + 'static) {
        if !self.served_changes {
            return reply();
        }
        if let Err(mpsc::SendError(Queued::Then(reply))) =
            self.queue.send(Queued::Then(Box::new(reply)))
        {
            // No notification thread: nothing is queued ahead of it.
            reply();
        }
    }

    /// The kernel may cache pages of `ino` from now on.
    pub(crate) fn page_cached(&self, ino: u64) {
        self.page_cached.insert(ino);
    }

    /// From now on the kernel may cache pages of any inode without the
    /// daemon seeing an open of it (zero-message opens).
    pub(crate) fn assume_every_inode_cached(&self) {
        self.every_inode_cached.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn observer(self: &Arc<Self>) -> ChangeObserver {
        let invalidator = Arc::clone(self);
        Arc::new(move |event: ChangeEvent| invalidator.changed(event))
    }

    pub(crate) fn namespace_observer(self: &Arc<Self>) -> NamespaceObserver {
        let invalidator = Arc::clone(self);
        Arc::new(move |event: &NamespaceEvent| invalidator.namespace_changed(event))
    }

    /// A library user's change to names or attributes, sent before its
    /// call returns; the kernel made (and knows) those it served.
    fn namespace_changed(&self, event: &NamespaceEvent) {
        if SERVING.with(Cell::get) {
            return;
        }
        let Some(notifier) = self.notifier.get() else { return };
        let sent = match event {
            NamespaceEvent::Entry { parent, name } => {
                let entry =
                    notifier.inval_entry(INodeNo(*parent), std::ffi::OsStr::from_bytes(name));
                // The kernel also caches the parent's listing (in its page
                // cache: FOPEN_CACHE_DIR, which every mode asks for), which
                // an entry notification drops only for a name it had looked
                // up: a name added here would stay unlisted. Dropping the
                // directory's pages makes the next listing ask again.
                let listing = notifier.inval_inode(INodeNo(*parent), 0, 0);
                report_unsent(event, entry);
                listing
            }
            NamespaceEvent::Attributes { ino } => notifier.inval_inode(INodeNo(*ino), -1, 0),
        };
        report_unsent(event, sent);
    }

    fn changed(&self, event: ChangeEvent) {
        let serving = SERVING.with(Cell::get);
        if KERNEL_SEES.with(Cell::get) || (serving && !self.served_changes) {
            return;
        }
        let every = self.every_inode_cached.load(std::sync::atomic::Ordering::Relaxed);
        if !every && !self.page_cached.contains(event.ino) {
            // No pages to drop, but the kernel may hold its size and times
            // from a lookup: a library user's change is told now (dropping
            // attributes takes no page lock, so not even a completion
            // thread waits on it); a served one the kernel made itself.
            if !serving {
                if let Some(notifier) = self.notifier.get() {
                    let _ = notifier.inval_inode(INodeNo(event.ino), -1, 0);
                }
            }
            return;
        }
        if serving || event.deferred {
            let _ = self.queue.send(Queued::Invalidate(event));
        } else {
            send(&self.notifier, event);
        }
    }
}

/// Logs a namespace notification the kernel refused for a reason other
/// than not caching what it names.
fn report_unsent(event: &NamespaceEvent, sent: std::io::Result<()>) {
    match sent {
        Ok(()) => {}
        // Not cached by the kernel: nothing to drop.
        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => {}
        Err(error) => tracing::debug!("invalidating {event:?}: {error}"),
    }
}

fn send(notifier: &OnceLock<Notifier>, event: ChangeEvent) {
    let Some(notifier) = notifier.get() else { return };
    let offset = i64::try_from(event.offset).unwrap_or(i64::MAX);
    // 0: to the end of the file.
    let length = i64::try_from(event.length).unwrap_or(0);
    match notifier.inval_inode(INodeNo(event.ino), offset, length) {
        Ok(()) => {}
        // The kernel no longer knows the inode: nothing cached to drop.
        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => {}
        Err(error) => tracing::debug!("invalidating inode {}: {error}", event.ino),
    }
}
