//! The memory direct I/O goes to and from the device through. A write's
//! payload that came through io_uring sits page-aligned in its ring entry
//! and is lent to the engine in place (the entry's reply waits until the
//! device is done with it); any other payload, /dev/fuse's or a misaligned
//! one, is copied once into aligned memory ("staged"). A direct read on
//! io_uring reads into the entry's own buffer, where the kernel takes the
//! reply's data from; on /dev/fuse into a fresh buffer, copied into the
//! reply. Counted, so the zero-copy paths can be checked through a mount.

use std::sync::atomic::{AtomicU64, Ordering};

use foliofs::dev::{AlignedBuf, LentBytes, BUFFER_ALIGN_BYTES};
use fuser::{LentPayload, ReplyData, ReplyWrite};

/// Bytes of direct writes and reads, by how they moved between the request
/// and the engine.
#[derive(Debug, Default)]
pub struct DirectIoCounters {
    lent_write_bytes: AtomicU64,
    staged_write_bytes: AtomicU64,
    lent_read_bytes: AtomicU64,
    staged_read_bytes: AtomicU64,
}

/// A snapshot of [`DirectIoCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectIoStats {
    /// Handed to the engine in place, with no copy.
    pub lent_write_bytes: u64,
    /// Copied into aligned memory first.
    pub staged_write_bytes: u64,
    /// Direct reads into the reply's own memory (asked for, not read).
    pub lent_read_bytes: u64,
    /// Direct reads into a buffer of their own, copied into the reply.
    pub staged_read_bytes: u64,
}

impl DirectIoCounters {
    pub fn stats(&self) -> DirectIoStats {
        DirectIoStats {
            lent_write_bytes: self.lent_write_bytes.load(Ordering::Relaxed),
            staged_write_bytes: self.staged_write_bytes.load(Ordering::Relaxed),
            lent_read_bytes: self.lent_read_bytes.load(Ordering::Relaxed),
            staged_read_bytes: self.staged_read_bytes.load(Ordering::Relaxed),
        }
    }

    /// The buffer a direct read of `length` bytes reads into; the reply
    /// then sends a slice of it from its start.
    pub(crate) fn read_buffer(&self, reply: &ReplyData, length: usize) -> AlignedBuf {
        if let Some(lent) = reply.lend_buffer(length) {
            // The entry's buffer is page-aligned, so only a zero length is
            // refused; the lend is handed back when dropped here.
            if let Ok(buffer) = AlignedBuf::lent(Box::new(RequestPayload(lent))) {
                self.lent_read_bytes.fetch_add(length as u64, Ordering::Relaxed);
                return buffer;
            }
        }
        self.staged_read_bytes.fetch_add(length as u64, Ordering::Relaxed);
        AlignedBuf::zeroed(length)
    }

    /// The buffer for a direct write of `data`, the request's payload.
    pub(crate) fn write_buffer(&self, reply: &ReplyWrite, data: &[u8]) -> AlignedBuf {
        let aligned = (data.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN_BYTES);
        if let Some(lent) = reply.lend_payload(data).filter(|_| aligned) {
            // Refused only when empty, which the engine answers without I/O;
            // the lend is dropped (handed back) then.
            if let Ok(buffer) = AlignedBuf::lent(Box::new(RequestPayload(lent))) {
                self.lent_write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                return buffer;
            }
        }
        self.staged_write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        AlignedBuf::from_slice(data)
    }
}

struct RequestPayload(LentPayload);

// SAFETY: fuser keeps a lent payload at one address, valid and untouched by
// the kernel (its entry is not handed back) until the LentPayload is
// dropped, and lends each request's payload once; the handler that lent it
// passes it on and does not use `data` again.
unsafe impl LentBytes for RequestPayload {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    fn length_bytes(&self) -> usize {
        self.0.len()
    }
}
