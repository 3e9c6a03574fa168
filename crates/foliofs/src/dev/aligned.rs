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

/// A page-aligned byte buffer of fixed length: zero-initialised memory of
/// its own, or memory lent by another owner ([`AlignedBuf::lent`]).
pub struct AlignedBuf {
    pointer: NonNull<u8>,
    length: usize,
    /// The owner of lent memory, kept (and its bytes with it) until the
    /// buffer is dropped; `None` for memory this buffer allocated.
    lender: Option<Box<dyn LentBytes>>,
}

/// Memory its owner lends to an [`AlignedBuf`], so a direct write can go
/// from it to the device with no staging copy (a FUSE request's payload,
/// received in place in page-aligned memory).
///
/// # Safety
///
/// `as_mut_ptr` returns the same pointer for the whole life of the value,
/// valid for reads and writes of `length_bytes` bytes, and nothing else reads or
/// writes those bytes until the value is dropped: the device may transfer
/// to or from them asynchronously until then.
pub unsafe trait LentBytes: Send + Sync + 'static {
    fn as_mut_ptr(&self) -> *mut u8;
    fn length_bytes(&self) -> usize;
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of the owned bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `length` zero bytes, aligned for direct I/O.
    pub fn zeroed(length: usize) -> Self {
        if length == 0 {
            return Self { pointer: NonNull::dangling(), length: 0, lender: None };
        }
        let layout = Self::layout(length);
        if layout.align() == HUGE_PAGE_BYTES {
            let pointer = map_huge_pages(length);
            debug_assert!((pointer.as_ptr() as usize).is_multiple_of(HUGE_PAGE_BYTES));
            return Self { pointer, length, lender: None };
        }
        // SAFETY: the layout has a non-zero size (checked above) and a valid alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(pointer) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        debug_assert!((raw as usize).is_multiple_of(BUFFER_ALIGN_BYTES), "a misaligned buffer");
        Self { pointer, length, lender: None }
    }

    /// A buffer over lent memory, without a copy; the memory is handed back
    /// (the lender dropped) with the buffer. Memory not aligned to
    /// `BUFFER_ALIGN_BYTES` (4096), or empty, is refused and returned.
    pub fn lent(lender: Box<dyn LentBytes>) -> Result<Self, Box<dyn LentBytes>> {
        let (raw, length) = (lender.as_mut_ptr(), lender.length_bytes());
        match NonNull::new(raw) {
            Some(pointer) if length > 0 && (raw as usize).is_multiple_of(BUFFER_ALIGN_BYTES) => {
                Ok(Self { pointer, length, lender: Some(lender) })
            }
            _ => Err(lender),
        }
    }

    /// Whether the bytes are lent (no copy was made into this buffer).
    pub fn is_lent(&self) -> bool {
        self.lender.is_some()
    }

    /// An aligned copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut buffer = Self::zeroed(bytes.len());
        buffer.copy_from_slice(bytes);
        buffer
    }

    fn layout(length: usize) -> Layout {
        // An empty buffer is dangling: never allocated, never freed.
        assert!(length > 0, "the layout of an empty buffer");
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
    debug_assert!(length > 0 && length.is_multiple_of(HUGE_PAGE_BYTES));
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
    // Whatever the mapping's start, the aligned run fits inside it.
    debug_assert!(head_bytes < HUGE_PAGE_BYTES);
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
        // allocation, or lent under the `LentBytes` contract), or dangling
        // with length 0, which from_raw_parts allows.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.length) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access
        // (lent bytes are the buffer's alone by the `LentBytes` contract).
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.length) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.length != 0 && self.lender.is_none() {
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
        let lent = if self.is_lent() { ", lent" } else { "" };
        write!(formatter, "AlignedBuf({} bytes{lent})", self.length)
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

    /// Lends an owned aligned buffer and counts the lender's drops.
    struct Lender {
        memory: AlignedBuf,
        dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    // SAFETY: the pointer is the owned buffer's, which never moves or
    // changes while the lender lives, and only the borrowing AlignedBuf
    // touches it.
    unsafe impl LentBytes for Lender {
        fn as_mut_ptr(&self) -> *mut u8 {
            self.memory.pointer.as_ptr()
        }
        fn length_bytes(&self) -> usize {
            self.memory.length
        }
    }

    impl Drop for Lender {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn lent_memory_is_used_in_place_and_handed_back_on_drop() {
        let dropped = std::sync::Arc::default();
        let memory = AlignedBuf::from_slice(&[7u8; 4096]);
        let address = memory.as_ptr();
        let lender = Lender { memory, dropped: std::sync::Arc::clone(&dropped) };
        let Ok(mut buffer) = AlignedBuf::lent(Box::new(lender)) else {
            panic!("aligned memory refused")
        };
        assert!(buffer.is_lent());
        assert_eq!(buffer.as_ptr(), address, "no copy");
        assert!(buffer.iter().all(|&byte| byte == 7));
        buffer[0] = 1;
        assert_eq!(buffer[0], 1);
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 0);
        drop(buffer);
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn unaligned_or_empty_memory_is_not_lent() {
        struct Offset(AlignedBuf, usize);
        // SAFETY: as for Lender; the offset stays inside the owned buffer.
        unsafe impl LentBytes for Offset {
            fn as_mut_ptr(&self) -> *mut u8 {
                // SAFETY: the offset is below the buffer's length.
                unsafe { self.0.pointer.as_ptr().add(self.1) }
            }
            fn length_bytes(&self) -> usize {
                self.0.length - self.1
            }
        }
        assert!(AlignedBuf::lent(Box::new(Offset(AlignedBuf::zeroed(8192), 512))).is_err());
        assert!(AlignedBuf::lent(Box::new(Offset(AlignedBuf::zeroed(4096), 4096))).is_err());
        assert!(AlignedBuf::lent(Box::new(Offset(AlignedBuf::zeroed(8192), 4096))).is_ok());
    }
}
