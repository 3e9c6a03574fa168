//! The memory a direct write goes to the device from. A payload that came
//! through io_uring sits page-aligned in its ring entry and is lent to the
//! engine in place (the entry's reply waits until the device is done with
//! it); any other payload, /dev/fuse's or a misaligned one, is copied once
//! into aligned memory ("staged"). Counted, so the zero-copy path can be
//! checked through a real mount.

use std::sync::atomic::{AtomicU64, Ordering};

use foliofs::dev::{AlignedBuf, LentBytes, BUFFER_ALIGN_BYTES};
use fuser::{LentPayload, ReplyWrite};

/// Payload bytes of direct writes, by how they reached the engine.
#[derive(Debug, Default)]
pub struct DirectWriteCounters {
    lent_bytes: AtomicU64,
    staged_bytes: AtomicU64,
}

/// A snapshot of [`DirectWriteCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectWriteStats {
    /// Handed to the engine in place, with no copy.
    pub lent_bytes: u64,
    /// Copied into aligned memory first.
    pub staged_bytes: u64,
}

impl DirectWriteCounters {
    pub fn stats(&self) -> DirectWriteStats {
        DirectWriteStats {
            lent_bytes: self.lent_bytes.load(Ordering::Relaxed),
            staged_bytes: self.staged_bytes.load(Ordering::Relaxed),
        }
    }

    /// The buffer for a direct write of `data`, the request's payload.
    pub(crate) fn buffer(&self, reply: &ReplyWrite, data: &[u8]) -> AlignedBuf {
        let aligned = (data.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN_BYTES);
        if let Some(lent) = reply.lend_payload(data).filter(|_| aligned) {
            // Refused only when empty, which the engine answers without I/O;
            // the lend is dropped (handed back) then.
            if let Ok(buffer) = AlignedBuf::lent(Box::new(RequestPayload(lent))) {
                self.lent_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                return buffer;
            }
        }
        self.staged_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
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

    fn len(&self) -> usize {
        self.0.len()
    }
}
