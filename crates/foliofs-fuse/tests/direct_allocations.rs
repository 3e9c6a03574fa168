//! Asynchronous direct reads and writes through the mount allocate a few
//! times per request, not a dozen or more: their pieces, device requests and
//! returned buffers are inline, their reply continuation is no boxed future,
//! and a writer's ids are not read from /proc. The test process hosts the
//! daemon, so a counting global allocator sees every allocation its serving
//! and completion threads make.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU64, Ordering};

use common::InProcessMount;
use foliofs::dev::AlignedBuf;

struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the
// count is a relaxed atomic, which allocates nothing.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(pointer, layout, new_size) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(pointer, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const BLOCK_BYTES: usize = 4096;
const FILE_BLOCKS: u64 = 256;
/// Enough that the pools are warm and the volume's own background work (a
/// timer's wake-up allocating now and then) is small per request.
const REQUESTS: u64 = 2048;

/// Allocations per request, at most: the four each request still makes
/// (its in-flight task, the engine's completion slot, the device's callback,
/// and on io_uring the box lending the payload or on /dev/fuse the aligned
/// buffer it is staged in), plus half of one for the volume's background
/// work spread over the run. 21 per write and 12 per read before the
/// pooling and inlining of 2026-11-23.
const ALLOCATIONS_PER_REQUEST_MAX: f64 = 4.5;

fn allocations_per_request(mut request: impl FnMut(u64)) -> f64 {
    // Warm: pools filled, every thread's first-use state made.
    for index in 0..256 {
        request(index);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for index in 0..REQUESTS {
        request(index);
    }
    let counted = ALLOCATIONS.load(Ordering::Relaxed) - before;
    counted as f64 / REQUESTS as f64
}

#[test]
fn direct_requests_allocate_at_most_a_few_times_each() {
    if common::skip_requested() {
        return;
    }
    let mount = InProcessMount::new(64 << 20, "engine=uring");
    let path = mount.point.join("allocations");
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).custom_flags(libc::O_DIRECT);
    let file = options.open(&path).unwrap();
    // Laid out first, so the writes measured are overwrites (seed 000's).
    file.write_all_at(&AlignedBuf::zeroed(BLOCK_BYTES * FILE_BLOCKS as usize), 0).unwrap();
    let offset = |index: u64| (index * 97 % FILE_BLOCKS) * BLOCK_BYTES as u64;

    let mut buffer = AlignedBuf::zeroed(BLOCK_BYTES);
    buffer.fill(0x5a);
    let per_write =
        allocations_per_request(|index| file.write_all_at(&buffer, offset(index)).unwrap());
    let per_read =
        allocations_per_request(|index| file.read_exact_at(&mut buffer, offset(index)).unwrap());
    drop(file);
    mount.unmount();

    eprintln!("allocations per request: {per_write:.2} per direct write, {per_read:.2} per read");
    for (what, per_request) in [("write", per_write), ("read", per_read)] {
        assert!(
            per_request <= ALLOCATIONS_PER_REQUEST_MAX,
            "{per_request:.2} allocations per direct {what} through the mount \
             (at most {ALLOCATIONS_PER_REQUEST_MAX} expected)"
        );
    }
}
