//! Folio memory: aligned buffers (so writeback and readahead can hand folio
//! memory straight to O_DIRECT requests), cheap for every folio size.
//!
//! - Folios smaller than a slab are pieces of 2 MiB slabs, one size per
//!   slab, each piece aligned to its size: a 4 KiB folio costs no system
//!   call and no allocator header (an aligned heap allocation per 4 KiB
//!   folio costs about twice its size), and a freed piece is reused by the
//!   next folio of its size. A slab whose pieces are all free goes back to
//!   the system unless it is the only one of its size with room.
//! - Folios of a slab or more are buffers of their own (huge-page backed),
//!   recycled by size: up to a quarter of the cache's limit, and more while
//!   all the pool's memory stays within that limit, so that a cache that evicts and refills does not fault fresh
//!   pages in every time (on the bench VM fresh memory faulted in at 0.3
//!   GB/s, memory freed and touched again at 13 GB/s; a pool capped at a
//!   quarter of a 1 GiB cache freed and re-faulted 0.6-0.9 GiB in each 6 s
//!   writeback run).

use std::alloc::{self, Layout};
use std::collections::{BTreeSet, HashMap};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex as StdMutex, MutexGuard};
use std::time::Duration;

use parking_lot::Mutex;

use crate::dev::AlignedBuf;

/// Size classes: powers of two from 512 B to 64 MiB.
const CLASS_COUNT: usize = 18;
const SMALLEST_CLASS_SHIFT: u32 = 9;
/// Freed memory of dropped-behind folios the pool keeps at most (two of
/// the engine's largest readahead windows).
const RELEASED_KEPT_BYTES_MAX: u64 = 8 << 20;
/// Memory carved into small folios: a huge page.
pub const SLAB_BYTES: usize = 2 << 20;
// A slab divides into whole pieces of every class below it.
const _: () = assert!(SLAB_BYTES.is_power_of_two() && SLAB_BYTES >> SMALLEST_CLASS_SHIFT > 1);
/// Freed buffers kept whatever else the pool holds: a quarter of its limit,
/// at most this.
const KEPT_BYTES_ALWAYS_MAX: u64 = 256 << 20;

/// Slab mappings ready for the next slab of any pool in the process: slabs
/// a pool let go of, and slabs a background thread mapped ahead. Their old
/// bytes are initialised memory, and a piece's contents are unspecified
/// anyway.
///
/// - Freed slabs are kept (up to 32) because a process that opens volumes
///   one after another otherwise maps and populates fresh slabs for each
///   and unmaps them at close: the crash checker, which mounts every crash
///   image four times, spent half its time there.
/// - Slabs are mapped ahead (4 kept ready) because populating one costs
///   about 0.5 ms here, 1 us per 4 KiB folio: a fifth of a small file's
///   create + write in process. The thread does that work beside the
///   writer, not in its path, as the kernel's page allocator hands out
///   pages it did not have to clear.
static FREE_SLABS: FreeSlabs = FreeSlabs::new(32, 4, SLAB_MAPPER_IDLE);

/// How long the thread that maps slabs ahead waits for work before it
/// exits (the next shortage starts another).
const SLAB_MAPPER_IDLE: Duration = Duration::from_secs(10);

struct FreeSlabs {
    state: StdMutex<FreeSlabsState>,
    /// Wakes the thread that maps slabs ahead.
    short: Condvar,
    count_max: usize,
    /// Slabs the thread keeps ready (0: no thread).
    prepared_min: usize,
    /// How long the thread waits for work before it ends.
    mapper_idle: Duration,
}

struct FreeSlabsState {
    addresses: Vec<usize>,
    mapper_running: bool,
}

impl FreeSlabs {
    const fn new(count_max: usize, prepared_min: usize, mapper_idle: Duration) -> Self {
        Self {
            state: StdMutex::new(FreeSlabsState { addresses: Vec::new(), mapper_running: false }),
            short: Condvar::new(),
            count_max,
            prepared_min,
            mapper_idle,
        }
    }

    fn state(&self) -> MutexGuard<'_, FreeSlabsState> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// A ready slab, if there is one; asks for more when few are left.
    fn take(&'static self) -> Option<NonNull<u8>> {
        let mut state = self.state();
        let address = state.addresses.pop();
        if state.addresses.len() < self.prepared_min {
            if state.mapper_running {
                self.short.notify_one();
            } else if std::thread::Builder::new()
                .name("foliofs-slabs".into())
                .spawn(move || self.map_ahead())
                .is_ok()
            {
                // Without the thread, slabs are mapped in the caller's path
                // as before.
                state.mapper_running = true;
            }
        }
        address.map(|address| NonNull::new(address as *mut u8).expect("mapped slabs"))
    }

    /// Keeps a slab for reuse; false when enough are kept (unmap it).
    fn keep(&self, address: usize) -> bool {
        let mut state = self.state();
        if state.addresses.len() < self.count_max {
            state.addresses.push(address);
            debug_assert!(state.addresses.len() <= self.count_max, "more slabs kept than allowed");
            return true;
        }
        false
    }

    /// The background thread: maps slabs while fewer than `prepared_min`
    /// are ready; ends after `mapper_idle` with nothing to do.
    fn map_ahead(&self) {
        let mut state = self.state();
        loop {
            if state.addresses.len() >= self.prepared_min {
                let (guard, waited) = self
                    .short
                    .wait_timeout(state, self.mapper_idle)
                    .unwrap_or_else(|poison| poison.into_inner());
                state = guard;
                if waited.timed_out() && state.addresses.len() >= self.prepared_min {
                    state.mapper_running = false;
                    return;
                }
                continue;
            }
            drop(state);
            let address = map_slab_piecewise().as_ptr() as usize;
            state = self.state();
            if state.addresses.len() < self.count_max {
                state.addresses.push(address);
            } else {
                unmap_slab(address);
            }
        }
    }
}

/// Maps a slab: `SLAB_BYTES` of zeroed memory, aligned to a page, its
/// pages faulted in.
fn map_slab() -> NonNull<u8> {
    // Populated at once: one system call faults in the 512 zeroed pages
    // (a fault per 4 KiB folio cost twice the CPU of the rest of a small
    // file's create + write; a huge page cleared on first touch stalled the
    // writer for milliseconds on this VM). Anonymous pages are zero-filled,
    // so the slab is initialised memory.
    map_anonymous(libc::MAP_POPULATE)
}

/// As [`map_slab`], for the thread that maps ahead: its pages faulted in
/// one by one, by touching them. Populating (MAP_POPULATE, or
/// MADV_POPULATE_WRITE a few pages at a time) holds the process's mmap
/// lock, and every writer thread growing its heap (malloc's mprotect, brk)
/// waited behind it: a single job creating small files spent a fifth of its
/// time there (`perf record -a -e sched:sched_switch`), and the create took
/// 16.5 us of CPU against 13.8 us touched (`bench metadata --file-size 1k`,
/// 2 CPUs, medians of 5). A page fault takes only its own mapping's lock.
/// (Huge pages, tried too, cost 18.8 us: clearing 2 MiB at a time was the
/// slower path on this VM.)
fn map_slab_piecewise() -> NonNull<u8> {
    const PAGE_BYTES: usize = 4096;
    let pointer = map_anonymous(0);
    for offset in (0..SLAB_BYTES).step_by(PAGE_BYTES) {
        // SAFETY: a byte inside the mapping just made, which nothing else
        // uses yet; writing the zero it holds only faults the page in.
        unsafe { pointer.as_ptr().add(offset).write_volatile(0) };
    }
    pointer
}

/// An anonymous private mapping of `SLAB_BYTES`, zero-filled.
fn map_anonymous(extra_flags: libc::c_int) -> NonNull<u8> {
    // SAFETY: an anonymous private mapping of SLAB_BYTES at an address of
    // the kernel's choosing; it touches no existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SLAB_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        alloc::handle_alloc_error(Layout::from_size_align(SLAB_BYTES, 4096).expect("layout"));
    }
    NonNull::new(raw.cast()).expect("mmap returned a mapping")
}

fn unmap_slab(address: usize) {
    // SAFETY: a mapping made by `map_slab`, of exactly SLAB_BYTES, that
    // nothing uses any more (its owner is being dropped, or it was never
    // handed out).
    let unmapped = unsafe { libc::munmap(address as *mut libc::c_void, SLAB_BYTES) };
    debug_assert_eq!(unmapped, 0, "unmapping the slab at {address:#x}");
}

/// One slab's memory: `SLAB_BYTES`, aligned to it, initialised (zeroed when
/// mapped, or a freed slab's old bytes).
struct SlabMemory {
    pointer: NonNull<u8>,
    /// Where it goes when freed.
    free_slabs: &'static FreeSlabs,
}

// SAFETY: SlabMemory owns its allocation; which bytes each piece may touch
// is decided by the pool, which hands every piece to one owner at a time.
unsafe impl Send for SlabMemory {}
// SAFETY: as above; SlabMemory itself never reads or writes the bytes.
unsafe impl Sync for SlabMemory {}

impl SlabMemory {
    fn new(free_slabs: &'static FreeSlabs) -> Self {
        let pointer = free_slabs.take().unwrap_or_else(map_slab);
        // Pieces are aligned to their size up to a page: the slab to a page.
        debug_assert_eq!(pointer.as_ptr() as usize % 4096, 0, "a slab not page-aligned");
        Self { pointer, free_slabs }
    }

    fn address(&self) -> usize {
        self.pointer.as_ptr() as usize
    }
}

impl Drop for SlabMemory {
    fn drop(&mut self) {
        if !self.free_slabs.keep(self.address()) {
            unmap_slab(self.address());
        }
    }
}

/// A folio's memory: a piece of a slab, or a buffer of its own.
pub struct FolioMemory {
    kind: MemoryKind,
}

enum MemoryKind {
    Whole(AlignedBuf),
    /// `length` bytes at `offset` in the slab, which this piece keeps alive.
    Piece {
        slab: Arc<SlabMemory>,
        offset: usize,
        length: usize,
    },
}

impl FolioMemory {
    /// A buffer of its own, outside the pool (for tests and odd sizes).
    pub fn whole(buffer: AlignedBuf) -> Self {
        Self { kind: MemoryKind::Whole(buffer) }
    }

    /// No memory (a folio that holds none of its bytes yet).
    pub fn empty() -> Self {
        Self::whole(AlignedBuf::zeroed(0))
    }
}

impl Deref for FolioMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.kind {
            MemoryKind::Whole(buffer) => buffer,
            // SAFETY: the piece lies inside the slab (the pool carves pieces
            // at multiples of their length below SLAB_BYTES), the slab is
            // initialised (see SlabMemory) and kept alive by the Arc,
            // and the pool hands each piece to one FolioMemory at a time.
            MemoryKind::Piece { slab, offset, length } => unsafe {
                debug_assert!(*offset + *length <= SLAB_BYTES, "a piece past its slab");
                std::slice::from_raw_parts(slab.pointer.as_ptr().add(*offset), *length)
            },
        }
    }
}

impl DerefMut for FolioMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.kind {
            MemoryKind::Whole(buffer) => buffer,
            // SAFETY: as in deref; no other FolioMemory covers these bytes,
            // and &mut self makes this access exclusive.
            MemoryKind::Piece { slab, offset, length } => unsafe {
                debug_assert!(*offset + *length <= SLAB_BYTES, "a piece past its slab");
                std::slice::from_raw_parts_mut(slab.pointer.as_ptr().add(*offset), *length)
            },
        }
    }
}

impl std::fmt::Debug for FolioMemory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            MemoryKind::Whole(buffer) => write!(formatter, "FolioMemory({} bytes)", buffer.len()),
            MemoryKind::Piece { length, .. } => {
                write!(formatter, "FolioMemory({length} bytes of a slab)")
            }
        }
    }
}

/// A slab of one size class: pieces never handed out are carved in order,
/// pieces given back are reused first.
struct Slab {
    memory: Arc<SlabMemory>,
    piece_bytes: usize,
    /// Pieces `[carved, SLAB_BYTES / piece_bytes)` were never handed out.
    carved: usize,
    /// Offsets of pieces given back.
    returned: Vec<usize>,
    live: usize,
}

impl Slab {
    fn piece_count(&self) -> usize {
        SLAB_BYTES / self.piece_bytes
    }

    fn has_room(&self) -> bool {
        debug_assert!(self.carved <= self.piece_count(), "carved past the slab's end");
        !self.returned.is_empty() || self.carved < self.piece_count()
    }
}

pub struct BufferPool {
    state: Mutex<PoolState>,
    /// Freed buffers are kept while slabs, buffers handed out and buffers
    /// kept stay within this (the memory the cache may hold anyway).
    memory_bytes_max: u64,
    /// Buffers handed out from freed memory, and from fresh memory.
    reused: AtomicU64,
    allocated: AtomicU64,
    /// Bytes of buffers of a slab or more handed out and not given back.
    whole_bytes_out: AtomicU64,
}

struct PoolState {
    /// Freed buffers of a slab or more, by class.
    classes: Vec<Vec<AlignedBuf>>,
    kept_bytes: u64,
    /// Every slab, by address.
    slabs: HashMap<usize, Slab>,
    /// Per class, the slabs with a free piece, by address (the lowest is
    /// used first, so live pieces gather in few slabs and empty ones go).
    slabs_with_room: Vec<BTreeSet<usize>>,
}

impl BufferPool {
    pub fn new(memory_bytes_max: u64) -> Self {
        Self {
            state: Mutex::new(PoolState {
                classes: (0..CLASS_COUNT).map(|_| Vec::new()).collect(),
                kept_bytes: 0,
                slabs: HashMap::new(),
                slabs_with_room: (0..CLASS_COUNT).map(|_| BTreeSet::new()).collect(),
            }),
            memory_bytes_max,
            reused: AtomicU64::new(0),
            allocated: AtomicU64::new(0),
            whole_bytes_out: AtomicU64::new(0),
        }
    }

    fn class_of(bytes: usize) -> Option<usize> {
        if !bytes.is_power_of_two() {
            return None;
        }
        let class = bytes.trailing_zeros().checked_sub(SMALLEST_CLASS_SHIFT)? as usize;
        (class < CLASS_COUNT).then_some(class)
    }

    /// Memory for a folio of `bytes` (a power of two), aligned to its size
    /// up to a page. Its contents are unspecified: the folio's uptodate bits
    /// say which bytes mean anything.
    pub fn take(&self, bytes: usize) -> FolioMemory {
        match Self::class_of(bytes) {
            Some(class) if bytes < SLAB_BYTES => self.take_piece(class, bytes),
            Some(class) => {
                self.whole_bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
                let mut state = self.state.lock();
                if let Some(buffer) = state.classes[class].pop() {
                    debug_assert!(state.kept_bytes >= bytes as u64, "kept bytes miscounted");
                    state.kept_bytes -= bytes as u64;
                    self.reused.fetch_add(1, Ordering::Relaxed);
                    return FolioMemory::whole(buffer);
                }
                drop(state);
                self.allocated.fetch_add(1, Ordering::Relaxed);
                FolioMemory::whole(AlignedBuf::zeroed(bytes))
            }
            None => {
                self.allocated.fetch_add(1, Ordering::Relaxed);
                self.whole_bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
                FolioMemory::whole(AlignedBuf::zeroed(bytes))
            }
        }
    }

    fn take_piece(&self, class: usize, bytes: usize) -> FolioMemory {
        debug_assert!(bytes.is_power_of_two() && bytes < SLAB_BYTES, "a piece of {bytes} bytes");
        debug_assert_eq!(Self::class_of(bytes), Some(class), "a piece of {bytes} in class {class}");
        let mut state = self.state.lock();
        if state.slabs_with_room[class].is_empty() {
            // Allocated (and zeroed) outside the lock: it faults in 2 MiB.
            drop(state);
            let memory = Arc::new(SlabMemory::new(&FREE_SLABS));
            state = self.state.lock();
            let address = memory.address();
            let slab =
                Slab { memory, piece_bytes: bytes, carved: 0, returned: Vec::new(), live: 0 };
            state.slabs.insert(address, slab);
            state.slabs_with_room[class].insert(address);
        }
        let address = *state.slabs_with_room[class].first().expect("a slab with room");
        let slab = state.slabs.get_mut(&address).expect("listed slabs exist");
        debug_assert_eq!(slab.piece_bytes, bytes, "a slab listed under another class");
        let offset = match slab.returned.pop() {
            Some(offset) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                offset
            }
            None => {
                self.allocated.fetch_add(1, Ordering::Relaxed);
                slab.carved += 1;
                (slab.carved - 1) * bytes
            }
        };
        // What `FolioMemory`'s from_raw_parts relies on: the piece lies
        // inside its slab, at a multiple of its length.
        assert!(
            offset + bytes <= SLAB_BYTES,
            "piece [{offset}, {}) past the slab of {SLAB_BYTES} bytes",
            offset + bytes
        );
        assert!(offset.is_multiple_of(bytes), "piece at {offset} not aligned to its {bytes} bytes");
        slab.live += 1;
        debug_assert!(slab.live <= slab.piece_count(), "more pieces live than the slab holds");
        let memory = Arc::clone(&slab.memory);
        if !slab.has_room() {
            state.slabs_with_room[class].remove(&address);
        }
        FolioMemory { kind: MemoryKind::Piece { slab: memory, offset, length: bytes } }
    }

    /// Returns a folio's memory for reuse. When the pool is full, buffers of
    /// the class holding the most bytes make room for it (so the pool follows
    /// the folio sizes in use), or it is freed.
    pub fn give(&self, memory: FolioMemory) {
        match memory.kind {
            MemoryKind::Piece { slab, offset, length } => self.give_piece(slab, offset, length),
            MemoryKind::Whole(buffer) => self.give_whole(buffer),
        }
    }

    /// Returns the memory of a folio another cache also holds (drop-behind):
    /// kept for reuse only while the pool keeps less than
    /// `RELEASED_KEPT_BYTES_MAX` (enough for a readahead window to recycle),
    /// otherwise freed. Slab pieces go back as with [`Self::give`].
    pub fn give_for_release(&self, memory: FolioMemory) {
        match memory.kind {
            MemoryKind::Piece { slab, offset, length } => self.give_piece(slab, offset, length),
            MemoryKind::Whole(buffer) => {
                let kept_bytes = self.state.lock().kept_bytes;
                if kept_bytes + buffer.len() as u64 <= RELEASED_KEPT_BYTES_MAX {
                    self.give_whole(buffer);
                } else {
                    self.whole_bytes_out.fetch_sub(buffer.len() as u64, Ordering::Relaxed);
                    drop(buffer);
                }
            }
        }
    }

    fn give_piece(&self, memory: Arc<SlabMemory>, offset: usize, bytes: usize) {
        let class = Self::class_of(bytes).expect("pieces have a class");
        let address = memory.address();
        let mut state = self.state.lock();
        let Some(slab) = state.slabs.get_mut(&address) else { return };
        debug_assert_eq!(slab.piece_bytes, bytes, "a piece given back to a slab of another size");
        debug_assert!(
            offset.is_multiple_of(bytes) && offset + bytes <= SLAB_BYTES,
            "piece [{offset}, {}) given back is none of the slab's",
            offset + bytes
        );
        debug_assert!(slab.live > 0, "a piece given back to a slab with none live");
        debug_assert!(slab.returned.len() < slab.piece_count(), "a piece given back twice");
        slab.returned.push(offset);
        slab.live -= 1;
        let empty = slab.live == 0;
        state.slabs_with_room[class].insert(address);
        // An empty slab goes back to the system, unless no other slab of its
        // size has room (then the next folio would need a fresh one).
        let freed = if empty && state.slabs_with_room[class].len() > 1 {
            state.slabs_with_room[class].remove(&address);
            state.slabs.remove(&address)
        } else {
            None
        };
        drop(state);
        // Freed outside the lock: returning memory to the system is slow.
        drop(freed);
        drop(memory);
    }

    fn give_whole(&self, buffer: AlignedBuf) {
        self.whole_bytes_out.fetch_sub(buffer.len() as u64, Ordering::Relaxed);
        let Some(class) = Self::class_of(buffer.len()) else { return };
        let bytes = buffer.len() as u64;
        let mut freed = Vec::new();
        let mut state = self.state.lock();
        let in_use_bytes =
            (state.slabs.len() * SLAB_BYTES) as u64 + self.whole_bytes_out.load(Ordering::Relaxed);
        // Kept up to a quarter of the limit however full the cache is (it
        // evicts one folio for each it allocates then), and beyond while
        // everything stays within the limit.
        let always_bytes = KEPT_BYTES_ALWAYS_MAX.min(self.memory_bytes_max / 4);
        let fits = |kept_bytes: u64| {
            let kept_bytes = kept_bytes + bytes;
            kept_bytes <= always_bytes || in_use_bytes + kept_bytes <= self.memory_bytes_max
        };
        if !fits(state.classes[class].len() as u64 * bytes) {
            // Even without the other sizes it would not fit: freed.
            return;
        }
        while !fits(state.kept_bytes) {
            let fullest = (0..CLASS_COUNT)
                .filter(|&other| other != class)
                .max_by_key(|&other| state.classes[other].len() << other)
                .filter(|&other| !state.classes[other].is_empty());
            let Some(fullest) = fullest else { return };
            let evicted = state.classes[fullest].pop().expect("non-empty class");
            debug_assert!(state.kept_bytes >= evicted.len() as u64, "kept bytes miscounted");
            state.kept_bytes -= evicted.len() as u64;
            freed.push(evicted);
        }
        state.kept_bytes += bytes;
        state.classes[class].push(buffer);
        drop(state);
        // Freed outside the lock: returning memory to the system is slow.
        drop(freed);
    }

    /// Buffers handed out (from freed memory, from fresh memory).
    pub fn handed_out(&self) -> (u64, u64) {
        (self.reused.load(Ordering::Relaxed), self.allocated.load(Ordering::Relaxed))
    }

    /// Freed buffers of a slab or more kept for reuse.
    #[cfg(test)]
    fn kept_bytes(&self) -> u64 {
        self.state.lock().kept_bytes
    }

    /// Memory held in slabs (pieces in use and free).
    #[cfg(test)]
    fn slab_bytes(&self) -> u64 {
        (self.state.lock().slabs.len() * SLAB_BYTES) as u64
    }

    /// All the memory the pool answers for: slabs, buffers handed out, and
    /// buffers kept for reuse.
    pub fn memory_bytes(&self) -> u64 {
        let state = self.state.lock();
        let slab_bytes = (state.slabs.len() * SLAB_BYTES) as u64;
        slab_bytes + state.kept_bytes + self.whole_bytes_out.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycles_large_buffers_by_size_within_its_memory_limit() {
        let slab = SLAB_BYTES;
        let pool = BufferPool::new(3 * slab as u64);
        let first = pool.take(slab);
        let address = first.as_ptr() as usize;
        pool.give(first);
        assert_eq!(pool.kept_bytes(), slab as u64);
        let again = pool.take(slab);
        assert_eq!(again.as_ptr() as usize, address, "the same buffer comes back");
        let taken: Vec<FolioMemory> = (0..3).map(|_| pool.take(slab)).collect();
        assert_eq!(pool.memory_bytes(), 4 * slab as u64, "handing out is never refused");
        pool.give(again);
        assert_eq!(pool.kept_bytes(), 0, "over the limit a buffer is freed");
        for buffer in taken {
            pool.give(buffer);
        }
        assert_eq!(pool.kept_bytes(), 3 * slab as u64, "kept up to the limit");
        let large = pool.take(2 * slab);
        assert_eq!(pool.memory_bytes(), 5 * slab as u64);
        pool.give(large);
        assert_eq!(pool.kept_bytes(), 3 * slab as u64, "other sizes make room");
        assert_eq!(pool.take(2 * slab).len(), 2 * slab);
        assert_eq!(pool.handed_out(), (2, 5));
    }

    #[test]
    fn freed_slabs_are_mapped_again_up_to_a_limit() {
        let free_slabs: &'static FreeSlabs =
            Box::leak(Box::new(FreeSlabs::new(1, 0, SLAB_MAPPER_IDLE)));
        let first = SlabMemory::new(free_slabs);
        let second = SlabMemory::new(free_slabs);
        let first_address = first.address();
        drop(first);
        drop(second);
        assert_eq!(free_slabs.state().addresses, vec![first_address], "one kept, one unmapped");
        let again = SlabMemory::new(free_slabs);
        assert_eq!(again.address(), first_address, "the kept slab comes back");
        assert!(free_slabs.state().addresses.is_empty());
        let fresh = SlabMemory::new(free_slabs);
        drop((again, fresh));
        assert_eq!(free_slabs.state().addresses.len(), 1);
    }

    /// Waits (at most 30 s) until `done` holds.
    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let started = std::time::Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(30), "{what}: not within 30 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn slabs_are_mapped_ahead_resident_and_the_mapper_ends_when_idle() {
        let free_slabs: &'static FreeSlabs =
            Box::leak(Box::new(FreeSlabs::new(8, 2, Duration::from_millis(50))));
        let first = SlabMemory::new(free_slabs);
        wait_until("two slabs ready", || free_slabs.state().addresses.len() == 2);
        let ready = free_slabs.state().addresses.clone();
        for &address in &ready {
            let mut pages = vec![0u8; SLAB_BYTES / 4096];
            // SAFETY: a query on a mapping the pool made and keeps; the
            // vector holds one byte per page of it.
            let queried = unsafe {
                libc::mincore(address as *mut libc::c_void, SLAB_BYTES, pages.as_mut_ptr())
            };
            assert_eq!(queried, 0);
            assert!(pages.iter().all(|page| page & 1 == 1), "every page faulted in ahead");
        }
        let second = SlabMemory::new(free_slabs);
        assert!(ready.contains(&second.address()), "a ready slab is handed out");
        wait_until("the stock refilled", || free_slabs.state().addresses.len() == 2);
        wait_until("the idle mapper ended", || !free_slabs.state().mapper_running);
        drop((first, second));
        assert_eq!(free_slabs.state().addresses.len(), 4, "freed slabs are kept too");
    }

    #[test]
    fn small_folios_are_aligned_pieces_of_shared_slabs() {
        let pool = BufferPool::new(0);
        let per_slab = SLAB_BYTES / 4096;
        let mut pieces: Vec<FolioMemory> = (0..per_slab).map(|_| pool.take(4096)).collect();
        assert_eq!(pool.slab_bytes(), SLAB_BYTES as u64, "one slab holds them all");
        for piece in &mut pieces {
            assert_eq!(piece.as_ptr() as usize % 4096, 0);
            piece.fill(0x5A);
        }
        let mut addresses: Vec<usize> =
            pieces.iter().map(|piece| piece.as_ptr() as usize).collect();
        addresses.sort_unstable();
        addresses.dedup();
        assert_eq!(addresses.len(), per_slab, "no two pieces share memory");
        let small = pool.take(512);
        assert_eq!(small.as_ptr() as usize % 512, 0);
        assert_eq!(pool.slab_bytes(), 2 * SLAB_BYTES as u64, "one slab per size");
        let freed_address = pieces[7].as_ptr() as usize;
        pool.give(pieces.swap_remove(7));
        let again = pool.take(4096);
        assert_eq!(again.as_ptr() as usize, freed_address, "a freed piece is reused");
        assert_eq!(again[0], 0x5A, "reused memory is not cleared");
        pieces.push(again);
        // A slab emptied while it is the only one of its size with room
        // stays; one emptied beside another with room goes.
        let next = pool.take(4096);
        assert_eq!(pool.slab_bytes(), 3 * SLAB_BYTES as u64);
        pool.give(next);
        assert_eq!(pool.slab_bytes(), 3 * SLAB_BYTES as u64);
        for piece in pieces {
            pool.give(piece);
        }
        assert_eq!(pool.slab_bytes(), 2 * SLAB_BYTES as u64);
        assert_eq!(pool.handed_out(), (1, per_slab as u64 + 2));
        pool.give(small);
    }
}
