//! Heap buffers aligned for O_DIRECT.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`]: a page, which satisfies the DMA
/// alignment of every device and file system we open with O_DIRECT.
pub const BUFFER_ALIGN_BYTES: usize = 4096;

/// Buffers of whole huge pages are aligned to them (x86-64 and arm64 with
/// 4 KiB pages: 2 MiB).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A zero-initialised, page-aligned byte buffer of fixed length.
pub struct AlignedBuf {
    pointer: NonNull<u8>,
    length: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of the owned bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(length: usize) -> Self {
        if length == 0 {
            return Self { pointer: NonNull::dangling(), length: 0 };
        }
        let layout = Self::layout(length);
        if layout.align() == HUGE_PAGE_BYTES {
            return Self { pointer: map_huge_pages(length), length };
        }
        // SAFETY: the layout has a non-zero size (checked above) and a valid alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(pointer) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        Self { pointer, length }
    }

    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut buffer = Self::zeroed(bytes.len());
        buffer.copy_from_slice(bytes);
        buffer
    }

    fn layout(length: usize) -> Layout {
        let align = if length.is_multiple_of(HUGE_PAGE_BYTES) {
            HUGE_PAGE_BYTES
        } else {
            BUFFER_ALIGN_BYTES
        };
        Layout::from_size_align(length, align).expect("buffer length overflows")
    }
}

/// `length` bytes (a multiple of a huge page) of zeroed anonymous memory
/// aligned to a huge page, a mapping of their own: freeing one returns its
/// memory to the system at once. From the heap, a freed buffer stayed
/// resident (the allocator raises its mmap threshold after the first such
/// free and then serves these sizes from its arenas), so memory the cache
/// let go of, such as the folios it drops behind the kernel's page cache,
/// still counted against the process.
fn map_huge_pages(length: usize) -> NonNull<u8> {
    let mapped_bytes = length + HUGE_PAGE_BYTES;
    // SAFETY: a fresh anonymous private mapping at an address of the
    // kernel's choosing; it touches no existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped_bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        let layout = Layout::from_size_align(length, HUGE_PAGE_BYTES).expect("layout");
        alloc::handle_alloc_error(layout);
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(HUGE_PAGE_BYTES);
    let head_bytes = aligned - start;
    let tail_bytes = mapped_bytes - head_bytes - length;
    // SAFETY: the unaligned head and the tail past `length` are parts of
    // the mapping just made, used by nothing; failure to unmap only wastes
    // address space. madvise only advises on the range kept; failure is
    // harmless (no transparent huge pages: 4 KiB faults).
    unsafe {
        if head_bytes > 0 {
            libc::munmap(raw, head_bytes);
        }
        if tail_bytes > 0 {
            libc::munmap((aligned + length) as *mut libc::c_void, tail_bytes);
        }
        // Transparent huge pages before the first touch: one fault (and one
        // page clear) per 2 MiB instead of 512.
        libc::madvise(aligned as *mut libc::c_void, length, libc::MADV_HUGEPAGE);
    }
    NonNull::new(aligned as *mut u8).expect("mmap returned a mapping")
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: pointer is valid for `length` initialised bytes (zeroed at
        // allocation), or dangling with length 0, which from_raw_parts allows.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.length) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.length) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.length != 0 {
            if Self::layout(self.length).align() == HUGE_PAGE_BYTES {
                // SAFETY: the mapping of exactly `length` bytes made by
                // map_huge_pages in `zeroed`; nothing else refers to it.
                unsafe { libc::munmap(self.pointer.as_ptr().cast(), self.length) };
                return;
            }
            // SAFETY: allocated in `zeroed` with exactly this layout.
            unsafe { alloc::dealloc(self.pointer.as_ptr(), Self::layout(self.length)) }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "AlignedBuf({} bytes)", self.length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable() {
        for length in [0usize, 1, 512, 4096, 12345] {
            let mut buffer = AlignedBuf::zeroed(length);
            assert_eq!(buffer.len(), length);
            assert!(buffer.iter().all(|&byte| byte == 0));
            if length > 0 {
                assert_eq!(buffer.as_ptr() as usize % BUFFER_ALIGN_BYTES, 0);
                buffer[length - 1] = 9;
                assert_eq!(buffer[length - 1], 9);
            }
        }
        let mut huge = AlignedBuf::zeroed(2 * HUGE_PAGE_BYTES);
        assert_eq!(huge.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
        assert!(huge.iter().all(|&byte| byte == 0));
        huge[2 * HUGE_PAGE_BYTES - 1] = 9;
        assert_eq!(huge[2 * HUGE_PAGE_BYTES - 1], 9);
        assert_eq!(&AlignedBuf::from_slice(b"abc")[..], b"abc");
    }
}
