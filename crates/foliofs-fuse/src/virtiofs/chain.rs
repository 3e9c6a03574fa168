//! One virtio-fs request in guest memory: the device-readable descriptors
//! hold the FUSE request as /dev/fuse would deliver it, the
//! device-writable ones receive the reply. Everything here is guest input,
//! so a bad address, a length past the chain's buffers or a buffer too
//! small for its reply is answered or logged, never a panic.

use std::io::IoSlice;
use std::sync::Arc;

use fuser::{QueueSession, ReplySink, Served};
use parking_lot::Mutex;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryLoadGuard, GuestMemoryMmap};

use crate::FolioFs;

/// The guest's memory as the vhost-user front end shared it.
pub(crate) type GuestMemory = GuestMemoryLoadGuard<GuestMemoryMmap>;

/// One descriptor: where in guest memory, how many bytes.
pub(crate) type Buffer = (GuestAddress, u32);

/// The largest request copied out of guest memory: the largest write
/// (16 MiB, FUSE's own bound on max_write) and its headers. A chain that
/// claims more is refused before anything is allocated.
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024 + 4096;

/// `fuse_out_header`: len, error, unique.
const OUT_HEADER_BYTES: usize = 16;

/// Hands the chain back to the guest (the used ring and its interrupt)
/// with the number of bytes written into it.
pub(crate) type Completion = Box<dyn FnOnce(u32) + Send>;

/// Serves the request in `readable` and has its reply written into
/// `writable`. `complete` runs once, when the reply is written (from
/// whichever thread sends it) or, for requests without a reply (FORGET),
/// when the session lets go of it.
pub(crate) fn serve(
    session: &QueueSession<FolioFs>,
    memory: GuestMemory,
    readable: &[Buffer],
    writable: Vec<Buffer>,
    complete: Completion,
) -> Served {
    let reply = Arc::new(ChainReply { memory, writable, complete: Mutex::new(Some(complete)) });
    let request = match gather(&reply.memory, readable) {
        Ok(request) => request,
        Err(why) => {
            tracing::warn!("virtio-fs: refusing a request: {why}");
            reply.refuse(libc::EINVAL);
            return Served::Refused;
        }
    };
    session.serve(&request, reply)
}

/// Copies the request out of the readable descriptors.
fn gather(memory: &GuestMemoryMmap, readable: &[Buffer]) -> Result<Vec<u8>, String> {
    let total: usize = readable.iter().map(|&(_, len)| len as usize).sum();
    if total > MAX_REQUEST_BYTES {
        return Err(format!("its buffers hold {total} bytes, more than {MAX_REQUEST_BYTES}"));
    }
    let mut request = vec![0; total];
    let mut at = 0;
    for &(address, len) in readable {
        let part = &mut request[at..at + len as usize];
        memory
            .read_slice(part, address)
            .map_err(|error| format!("reading {len} bytes at {:#x}: {error}", address.0))?;
        at += len as usize;
    }
    Ok(request)
}

/// Where a request's reply goes: its writable descriptors.
struct ChainReply {
    memory: GuestMemory,
    writable: Vec<Buffer>,
    complete: Mutex<Option<Completion>>,
}

impl std::fmt::Debug for ChainReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainReply").field("writable", &self.writable).finish()
    }
}

impl ChainReply {
    fn capacity(&self) -> usize {
        self.writable.iter().map(|&(_, len)| len as usize).sum()
    }

    /// Writes `parts` across the writable descriptors; the bytes written.
    fn write(&self, parts: &[&[u8]]) -> std::io::Result<usize> {
        let mut buffers = self.writable.iter().copied();
        let mut current: Option<Buffer> = buffers.next();
        let mut offset = 0u32;
        let mut written = 0;
        for part in parts {
            let mut rest = *part;
            while !rest.is_empty() {
                let Some((address, len)) = current else {
                    return Err(std::io::Error::from_raw_os_error(libc::EOVERFLOW));
                };
                let room = (len - offset) as usize;
                if room == 0 {
                    current = buffers.next();
                    offset = 0;
                    continue;
                }
                let take = room.min(rest.len());
                let at = address.checked_add(u64::from(offset)).ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "a buffer past 2^64")
                })?;
                self.memory.write_slice(&rest[..take], at).map_err(|error| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, error)
                })?;
                offset += take as u32;
                written += take;
                rest = &rest[take..];
            }
        }
        Ok(written)
    }

    /// Answers `errno` with an out header of request id 0 (virtio-fs matches
    /// a reply by its buffer), or returns the chain unanswered when not even
    /// a header fits.
    fn refuse(&self, errno: i32) {
        let mut header = [0u8; OUT_HEADER_BYTES];
        header[0..4].copy_from_slice(&(OUT_HEADER_BYTES as u32).to_ne_bytes());
        header[4..8].copy_from_slice(&(-errno).to_ne_bytes());
        let written = self.write(&[&header]).unwrap_or(0);
        self.finish(written);
    }

    fn finish(&self, written: usize) {
        if let Some(complete) = self.complete.lock().take() {
            complete(u32::try_from(written).unwrap_or(u32::MAX));
        }
    }
}

impl ReplySink for ChainReply {
    fn send(&self, reply: &[IoSlice<'_>]) -> std::io::Result<()> {
        let length: usize = reply.iter().map(|part| part.len()).sum();
        if length > self.capacity() {
            tracing::warn!(
                "virtio-fs: a {length}-byte reply for a request whose buffers hold {}",
                self.capacity()
            );
            self.refuse(libc::EOVERFLOW);
            return Err(std::io::Error::from_raw_os_error(libc::EOVERFLOW));
        }
        let parts: Vec<&[u8]> = reply.iter().map(|part| &**part).collect();
        let result = self.write(&parts);
        match result {
            Ok(written) => {
                self.finish(written);
                Ok(())
            }
            Err(error) => {
                self.finish(0);
                Err(error)
            }
        }
    }
}

impl Drop for ChainReply {
    /// A request without a reply (FORGET, BATCH_FORGET) still hands its
    /// chain back.
    fn drop(&mut self) {
        self.finish(0);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use foliofs::{MkfsOptions, Volume, VolumeOptions};
    use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

    use super::*;
    use crate::MountOptions;

    const IN_HEADER_BYTES: usize = 40;
    const FUSE_INIT: u32 = 26;
    const FUSE_GETATTR: u32 = 3;

    struct Guest {
        memory: GuestMemoryAtomic<GuestMemoryMmap>,
        session: QueueSession<FolioFs>,
        _dir: tempfile::TempDir,
    }

    impl Guest {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let image = dir.path().join("image");
            Volume::mkfs_path(
                &image,
                Some(64 << 20),
                &MkfsOptions::default(),
                &VolumeOptions::default(),
            )
            .unwrap();
            let volume = Arc::new(Volume::open(&image, &VolumeOptions::default()).unwrap());
            let fs = FolioFs::new(volume, &MountOptions::default());
            let ranges = [(GuestAddress(0), 1 << 20)];
            let memory = GuestMemoryAtomic::new(GuestMemoryMmap::from_ranges(&ranges).unwrap());
            Self { memory, session: QueueSession::new(fs, fuser::SessionACL::All), _dir: dir }
        }

        /// Puts `request` at 0x1000 in `pieces` descriptors claiming
        /// `claimed` bytes in all, a reply buffer of `reply_bytes` at
        /// 0x80000; the reply's bytes, or None when the chain came back
        /// with nothing written.
        fn send(&self, request: &[u8], claimed: u32, reply_bytes: u32) -> (Served, Vec<u8>) {
            let memory = self.memory.memory();
            memory.write_slice(request, GuestAddress(0x1000)).unwrap();
            let readable = [(GuestAddress(0x1000), claimed)];
            let writable = vec![(GuestAddress(0x80000), reply_bytes)];
            memory.write_slice(&vec![0xee; reply_bytes as usize], GuestAddress(0x80000)).unwrap();
            let (done, written) = mpsc::channel();
            let complete: Completion = Box::new(move |length| done.send(length).unwrap());
            let served = serve(&self.session, self.memory.memory(), &readable, writable, complete);
            let length = written.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
            let mut reply = vec![0; length as usize];
            memory.read_slice(&mut reply, GuestAddress(0x80000)).unwrap();
            (served, reply)
        }

        fn init(&self) {
            let mut init = header(FUSE_INIT, 1, 64);
            init.extend_from_slice(&7u32.to_ne_bytes()); // major
            init.extend_from_slice(&31u32.to_ne_bytes()); // minor
            init.extend_from_slice(&(128u32 << 10).to_ne_bytes()); // max_readahead
            init.extend_from_slice(&0u32.to_ne_bytes()); // flags
            init.resize(64, 0);
            let (served, reply) = self.send(&init, 64, 256);
            assert_eq!(served, Served::Initialized);
            assert_eq!(error_of(&reply), 0);
        }
    }

    fn header(opcode: u32, unique: u64, len: u32) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&len.to_ne_bytes());
        bytes.extend_from_slice(&opcode.to_ne_bytes());
        bytes.extend_from_slice(&unique.to_ne_bytes());
        bytes.extend_from_slice(&1u64.to_ne_bytes()); // nodeid: the root
        bytes.extend_from_slice(&[0; 16]); // uid, gid, pid, total_extlen+padding
        assert_eq!(bytes.len(), IN_HEADER_BYTES);
        bytes
    }

    fn error_of(reply: &[u8]) -> i32 {
        assert!(reply.len() >= OUT_HEADER_BYTES, "a reply of {} bytes", reply.len());
        i32::from_ne_bytes(reply[4..8].try_into().unwrap())
    }

    #[test]
    fn a_getattr_after_init_is_answered_from_the_volume() {
        let guest = Guest::new();
        guest.init();
        let mut getattr = header(FUSE_GETATTR, 7, 56);
        getattr.resize(56, 0);
        let (served, reply) = guest.send(&getattr, 56, 256);
        assert_eq!(served, Served::Dispatched);
        assert_eq!(error_of(&reply), 0);
        assert_eq!(u64::from_ne_bytes(reply[8..16].try_into().unwrap()), 7);
        // fuse_attr_out: attr_valid, attr_valid_nsec, dummy, then ino.
        assert_eq!(u64::from_ne_bytes(reply[32..40].try_into().unwrap()), 1);
    }

    #[test]
    fn a_header_shorter_than_fuse_in_header_is_answered_einval() {
        let guest = Guest::new();
        guest.init();
        let (served, reply) = guest.send(&header(FUSE_GETATTR, 9, 56)[..12], 12, 256);
        assert_eq!(served, Served::Refused);
        assert_eq!(error_of(&reply), -libc::EINVAL);
    }

    #[test]
    fn a_chain_shorter_than_its_header_claims_is_answered_einval() {
        let guest = Guest::new();
        guest.init();
        // The header claims 4,096 bytes; the chain holds 56.
        let mut getattr = header(FUSE_GETATTR, 11, 4096);
        getattr.resize(56, 0);
        let (served, reply) = guest.send(&getattr, 56, 256);
        assert_eq!(served, Served::Refused);
        assert_eq!(error_of(&reply), -libc::EINVAL);
        assert_eq!(u64::from_ne_bytes(reply[8..16].try_into().unwrap()), 11);
    }

    #[test]
    fn a_descriptor_outside_guest_memory_is_answered_einval() {
        let guest = Guest::new();
        guest.init();
        let memory = guest.memory.memory();
        let (done, written) = mpsc::channel();
        let complete: Completion = Box::new(move |length| done.send(length).unwrap());
        let readable = [(GuestAddress(0xff000), 0x10000)];
        let writable = vec![(GuestAddress(0x80000), 64)];
        let served = serve(&guest.session, memory.clone(), &readable, writable, complete);
        assert_eq!(served, Served::Refused);
        let length = written.recv().unwrap();
        let mut reply = vec![0; length as usize];
        memory.read_slice(&mut reply, GuestAddress(0x80000)).unwrap();
        assert_eq!(error_of(&reply), -libc::EINVAL);
    }

    #[test]
    fn an_unknown_opcode_is_answered_einval() {
        let guest = Guest::new();
        guest.init();
        let mut request = header(9999, 13, 40);
        request.resize(40, 0);
        let (served, reply) = guest.send(&request, 40, 64);
        assert_eq!(served, Served::Refused);
        assert_eq!(error_of(&reply), -libc::EINVAL);
    }

    #[test]
    fn a_reply_buffer_too_small_for_a_header_comes_back_empty() {
        let guest = Guest::new();
        guest.init();
        let mut getattr = header(FUSE_GETATTR, 15, 56);
        getattr.resize(56, 0);
        let (_, reply) = guest.send(&getattr, 56, 8);
        assert!(reply.is_empty(), "{reply:?}");
    }
}
