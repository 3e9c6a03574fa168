//! The allocation bound: a counting global allocator refuses any single
//! allocation larger than an image of the case's size justifies.

use super::*;

/// Largest single allocation since the last reset.
pub(crate) static LARGEST_ALLOCATION: AtomicUsize = AtomicUsize::new(0);
/// Requests above this are refused (the process aborts naming the size)
/// rather than letting a hostile length exhaust the machine.
pub(crate) const ALLOCATION_REFUSED_ABOVE: usize = 1 << 30;

pub(crate) struct WatchedAllocator;

pub(crate) fn note_allocation(bytes: usize) -> bool {
    LARGEST_ALLOCATION.fetch_max(bytes, Ordering::Relaxed);
    bytes <= ALLOCATION_REFUSED_ABOVE
}

// SAFETY: every call forwards to the system allocator with the caller's
// layout unchanged; refusing returns null, which GlobalAlloc permits.
unsafe impl GlobalAlloc for WatchedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note_allocation(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as is (see above).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note_allocation(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note_allocation(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
pub(crate) static ALLOCATOR: WatchedAllocator = WatchedAllocator;

/// What one mount case may allocate at once: two copies of the image (the
/// in-memory device keeps a base and a current copy) plus the cache's
/// largest folio buffers and slack.
pub(crate) fn allocation_bound(image_bytes: usize) -> usize {
    image_bytes * 2 + (32 << 20)
}
