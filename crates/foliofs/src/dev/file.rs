//! The `sync` engine: preadv/pwritev2/fdatasync in the calling thread.
//!
//! [`FileDev`] also does the opening and sizing for the other engines, which
//! wrap one.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::{sys, DevCallback, DevOptions, DevRequest, DiscardMode, RawDev, BUFFER_ALIGN_BYTES};

/// The smallest logical block we report: the classic sector, which every
/// device and file system accepts for O_DIRECT at worst.
const MIN_LOGICAL_BLOCK_BYTES: u32 = 512;

/// An open image file or block device.
#[derive(Debug)]
pub(crate) struct FileDev {
    file: File,
    size_bytes: u64,
    logical_block_bytes: u32,
    /// Discards go to the block layer's ioctls, not to fallocate.
    block_device: bool,
}

impl FileDev {
    pub(crate) fn open(path: &Path, options: &DevOptions) -> io::Result<Self> {
        let file = open_file(path, options)?;
        lock_image(&file, path, options.read_only)?;
        let metadata = file.metadata()?;
        let file_type = metadata.file_type();
        let fd = file.as_fd();
        let (size_bytes, reported_block_bytes) = if file_type.is_block_device() {
            (sys::block_device_size_bytes(fd)?, sys::block_device_logical_sector_bytes(fd)?)
        } else if file_type.is_file() {
            (metadata.len(), regular_file_block_bytes(fd, path)?)
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is neither a regular file nor a block device", path.display()),
            ));
        };
        // Device requires a power of two; every real device reports one.
        let logical_block_bytes =
            reported_block_bytes.max(MIN_LOGICAL_BLOCK_BYTES).next_power_of_two();
        // What `Device::new` asserts, and every alignment check relies on.
        debug_assert!(
            logical_block_bytes.is_power_of_two() && logical_block_bytes >= MIN_LOGICAL_BLOCK_BYTES
        );
        let block_device = file_type.is_block_device();
        Ok(Self { file, size_bytes, logical_block_bytes, block_device })
    }

    /// The open file, for engines that issue their own I/O on it.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn kind_name(&self) -> &'static str {
        if self.block_device {
            "block device"
        } else {
            "file system"
        }
    }
}

/// One writer or any number of readers per image, across processes: a
/// mounted image opened again by `foliofs cp` (or mounted twice) would have
/// two journals appending to one log. The lock is flock(2)'s, held until the
/// file closes; read-only opens (fsck, info, ls) take it shared, so they
/// fail too while a writer holds the image instead of reading it mid-change.
///
/// A holder that is letting go gets a moment: a daemon still closing the
/// volume after `umount` returned, or a device whose last reference drops on
/// one of its own completion threads.
fn lock_image(file: &File, path: &Path, read_only: bool) -> io::Result<()> {
    let started = std::time::Instant::now();
    loop {
        let locked = if read_only { file.try_lock_shared() } else { file.try_lock() };
        match locked {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LET_GO_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{} is in use by another process (mounted, or open in another foliofs \
                         command)",
                        path.display()
                    ),
                ))
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(error),
        }
    }
}

/// How long an open waits for another holder of the image to let go.
const LET_GO_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A block device opened for writing is claimed exclusively (O_EXCL), as
/// the kernel's file systems, mkfs and swapon claim theirs: the flock alone
/// keeps out other foliofs processes, not a kernel mount of the device, a
/// swap area on it, or another file system's mkfs.
fn open_file(path: &Path, options: &DevOptions) -> io::Result<File> {
    let mut flags = libc::O_CLOEXEC;
    if options.direct {
        flags |= libc::O_DIRECT;
    }
    let exclusive = !options.read_only
        && std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device());
    if exclusive {
        flags |= libc::O_EXCL;
    }
    let started = std::time::Instant::now();
    let opened = loop {
        let opened =
            OpenOptions::new().read(true).write(!options.read_only).custom_flags(flags).open(path);
        match opened {
            Err(error)
                if exclusive
                    && error.raw_os_error() == Some(libc::EBUSY)
                    && started.elapsed() < LET_GO_WAIT =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(error) if exclusive && error.raw_os_error() == Some(libc::EBUSY) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{} is in use (mounted, a swap area, or open exclusively by another \
                         program): {error}",
                        path.display()
                    ),
                ))
            }
            opened => break opened,
        }
    };
    opened.map_err(|error| {
        // open(2) answers EINVAL for O_DIRECT on file systems without it
        // (tmpfs before Linux 6.6, some FUSE and network file systems).
        if options.direct && error.raw_os_error() == Some(libc::EINVAL) {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: the backing file system does not support O_DIRECT ({error}); \
                     `-o direct=off` opens it without",
                    path.display()
                ),
            )
        } else {
            io::Error::new(error.kind(), format!("cannot open {}: {error}", path.display()))
        }
    })
}

/// The logical block of a regular file: the file system's O_DIRECT offset
/// alignment where the kernel reports it, else the classic 512.
fn regular_file_block_bytes(fd: BorrowedFd<'_>, path: &Path) -> io::Result<u32> {
    let Some(alignment) = sys::dio_alignment(fd)? else {
        return Ok(MIN_LOGICAL_BLOCK_BYTES);
    };
    if alignment.memory_bytes as usize > BUFFER_ALIGN_BYTES {
        // Our AlignedBufs would then fail with EINVAL under O_DIRECT.
        tracing::warn!(
            path = %path.display(),
            memory_alignment_bytes = alignment.memory_bytes,
            "O_DIRECT needs buffers aligned beyond {BUFFER_ALIGN_BYTES} bytes"
        );
    }
    Ok(alignment.offset_bytes)
}

impl RawDev for FileDev {
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        let fd = self.fd();
        sys::read_exact_at(buffers, offset, |buffers, offset_bytes| {
            sys::preadv(fd, buffers, offset_bytes)
        })
    }

    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        let fd = self.fd();
        let flags = if fua { libc::RWF_DSYNC } else { 0 };
        sys::write_all_at(buffers, offset, |buffers, offset_bytes| {
            sys::pwritev2(fd, buffers, offset_bytes, flags)
        })
    }

    fn flush(&self) -> io::Result<()> {
        sys::fdatasync(self.fd())
    }

    fn submit(&self, request: DevRequest, done: DevCallback) {
        done(super::run_blocking(self, request))
    }

    fn discard(&self, offset: u64, length: u64, mode: DiscardMode) -> io::Result<()> {
        let zero = mode == DiscardMode::Zero;
        let result = if self.block_device {
            sys::block_device_discard(self.fd(), offset, length, zero)
        } else {
            let how = if zero { libc::FALLOC_FL_ZERO_RANGE } else { libc::FALLOC_FL_PUNCH_HOLE };
            sys::fallocate(self.fd(), how | libc::FALLOC_FL_KEEP_SIZE, offset, length)
        };
        result.map_err(|error| match error.raw_os_error() {
            Some(libc::EOPNOTSUPP) => io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the backing {} cannot discard: {error}", self.kind_name()),
            ),
            _ => error,
        })
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn logical_block_bytes(&self) -> u32 {
        self.logical_block_bytes
    }
}

/// Engine-independent tests, run by each engine's test module through the
/// public [`Device`](super::Device) wrapper.
#[cfg(test)]
pub(super) mod test_support {
    use std::path::{Path, PathBuf};
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    use crate::dev::{
        AlignedBuf, DevOptions, DevRequest, DevResponse, Device, EngineKind, FuaMode,
    };

    pub(crate) const IMAGE_BYTES: u64 = 8 << 20;
    pub(crate) const BLOCK_BYTES: usize = 4096;
    /// Long enough for any healthy run; a hang fails instead of stalling CI.
    pub(crate) const CALLBACK_TIMEOUT: Duration = Duration::from_secs(60);

    /// An 8 MiB image in its own temporary directory.
    pub(crate) struct Image {
        _directory: tempfile::TempDir,
        pub(crate) path: PathBuf,
    }

    impl Image {
        pub(crate) fn new() -> Self {
            let directory = tempfile::tempdir().expect("create temporary directory");
            let path = directory.path().join("image");
            let file = std::fs::File::create(&path).expect("create image");
            file.set_len(IMAGE_BYTES).expect("size image");
            Self { _directory: directory, path }
        }
    }

    /// Options for `engine`, O_DIRECT on.
    pub(crate) fn options(engine: EngineKind, fua: FuaMode) -> DevOptions {
        DevOptions { engine, fua, ..DevOptions::default() }
    }

    /// Opens with O_DIRECT, falling back to buffered I/O where the temporary
    /// directory's file system has no O_DIRECT.
    pub(crate) fn open(path: &Path, options: &DevOptions) -> Device {
        match Device::open(path, options) {
            Ok(device) => device,
            Err(error) if error.to_string().contains("does not support O_DIRECT") => {
                eprintln!("note: {error}; testing without O_DIRECT");
                let buffered = DevOptions { direct: false, ..options.clone() };
                Device::open(path, &buffered).expect("open image without O_DIRECT")
            }
            Err(error) => panic!("open {}: {error}", path.display()),
        }
    }

    /// A block whose every 8-byte word encodes `(block_index, word_index)`.
    pub(crate) fn pattern(block_index: usize) -> AlignedBuf {
        let mut buffer = AlignedBuf::zeroed(BLOCK_BYTES);
        for (word_index, word) in buffer.chunks_exact_mut(8).enumerate() {
            let value = ((block_index as u64) << 32) | word_index as u64;
            word.copy_from_slice(&value.to_le_bytes());
        }
        buffer
    }

    fn byte_offset(block_index: usize) -> u64 {
        (block_index * BLOCK_BYTES) as u64
    }

    /// Submits `request` and waits for its callback.
    pub(crate) fn submit_and_wait(device: &Device, request: DevRequest) -> DevResponse {
        let (sender, receiver) = mpsc::channel();
        device.submit(
            request,
            Box::new(move |response| {
                let _ = sender.send(response);
            }),
        );
        receiver.recv_timeout(CALLBACK_TIMEOUT).expect("completion callback never ran")
    }

    /// TRIM punches a hole in the image (its blocks go back to the file
    /// system) and reads zeros; a zeroed range reads zeros; both counted.
    pub(crate) fn discard_punches_and_zeroes(engine: EngineKind) {
        use crate::dev::DiscardMode;
        use std::os::unix::fs::MetadataExt;
        let image = Image::new();
        let device = open(&image.path, &options(engine, FuaMode::Native));
        let data: Vec<u8> = (0..16).flat_map(|block| pattern(block).to_vec()).collect();
        device.write(0, &AlignedBuf::from_slice(&data), true).unwrap();
        let allocated_sectors = || std::fs::metadata(&image.path).unwrap().blocks();
        let before = allocated_sectors();
        device.discard(byte_offset(4), byte_offset(4), DiscardMode::Trim).unwrap();
        device.discard(byte_offset(8), byte_offset(4), DiscardMode::Zero).unwrap();
        device.flush().unwrap();
        assert!(allocated_sectors() < before, "the trimmed blocks went back to the file system");
        let mut back = AlignedBuf::zeroed(data.len());
        device.read(0, &mut back).unwrap();
        assert_eq!(back[..byte_offset(4) as usize], data[..byte_offset(4) as usize]);
        assert!(back[byte_offset(4) as usize..byte_offset(12) as usize].iter().all(|&b| b == 0));
        assert_eq!(back[byte_offset(12) as usize..], data[byte_offset(12) as usize..]);
        let stats = device.stats();
        assert_eq!((stats.discard_requests, stats.bytes_discarded), (2, byte_offset(8)));
        let error = device.discard(100, byte_offset(1), DiscardMode::Trim).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{error}");
        let error = device.discard(IMAGE_BYTES, byte_offset(1), DiscardMode::Trim).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{error}");
        assert_eq!(device.stats().discard_requests, 2, "refused discards are not counted");
    }

    pub(crate) fn vectored_round_trip(engine: EngineKind) {
        let image = Image::new();
        let device = open(&image.path, &options(engine, FuaMode::Native));
        assert_eq!(device.size_bytes(), IMAGE_BYTES);
        let block_bytes = device.logical_block_bytes();
        assert!(block_bytes >= 512 && block_bytes.is_power_of_two());
        for (first_block, block_counts) in [(0, [1, 2, 1]), (5, [3, 1, 4]), (2040, [2, 2, 4])] {
            let patterns: Vec<AlignedBuf> = (0..block_counts.len())
                .map(|index| {
                    let mut buffer = AlignedBuf::zeroed(block_counts[index] * BLOCK_BYTES);
                    for (block, chunk) in buffer.chunks_exact_mut(BLOCK_BYTES).enumerate() {
                        chunk.copy_from_slice(&pattern(first_block + index * 10 + block));
                    }
                    buffer
                })
                .collect();
            let slices: Vec<_> =
                patterns.iter().map(|buffer| std::io::IoSlice::new(buffer)).collect();
            device.write_vectored(byte_offset(first_block), &slices, false).unwrap();
            let mut back: Vec<AlignedBuf> =
                patterns.iter().map(|buffer| AlignedBuf::zeroed(buffer.len())).collect();
            let mut slices: Vec<_> =
                back.iter_mut().map(|buffer| std::io::IoSliceMut::new(buffer)).collect();
            device.read_vectored(byte_offset(first_block), &mut slices).unwrap();
            for (written, read) in patterns.iter().zip(&back) {
                assert!(written[..] == read[..], "mismatch at block {first_block}");
            }
        }
    }

    /// More buffers than one preadv/readv takes (UIO_MAXIOV).
    pub(crate) fn many_iovecs(engine: EngineKind) {
        const BUFFERS: usize = 1100;
        let image = Image::new();
        let device = open(&image.path, &options(engine, FuaMode::Native));
        let written: Vec<AlignedBuf> = (0..BUFFERS).map(pattern).collect();
        let slices: Vec<_> = written.iter().map(|buffer| std::io::IoSlice::new(buffer)).collect();
        device.write_vectored(0, &slices, true).unwrap();
        let mut back: Vec<AlignedBuf> =
            (0..BUFFERS).map(|_| AlignedBuf::zeroed(BLOCK_BYTES)).collect();
        let mut slices: Vec<_> =
            back.iter_mut().map(|buffer| std::io::IoSliceMut::new(buffer)).collect();
        device.read_vectored(0, &mut slices).unwrap();
        for (index, (written, read)) in written.iter().zip(&back).enumerate() {
            assert!(written[..] == read[..], "mismatch in buffer {index}");
        }
        assert_eq!(device.stats().requests(), 2, "one request each, however many transfers");
    }

    pub(crate) fn fua_counts(engine: EngineKind) {
        let image = Image::new();
        let block = pattern(1);
        let native = open(&image.path, &options(engine, FuaMode::Native));
        let before = native.stats();
        native.write(0, &block, true).unwrap();
        let delta = native.stats().since(&before);
        assert_eq!((delta.write_requests, delta.fua_writes, delta.flush_requests), (1, 1, 0));
        assert_eq!(delta.bytes_written, BLOCK_BYTES as u64);
        drop(native);

        let emulate = open(&image.path, &options(engine, FuaMode::Emulate));
        let before = emulate.stats();
        emulate.write(byte_offset(1), &block, true).unwrap();
        let delta = emulate.stats().since(&before);
        assert_eq!((delta.write_requests, delta.fua_writes, delta.flush_requests), (1, 0, 1));
        emulate.flush().unwrap();
        assert_eq!(emulate.stats().since(&before).flush_requests, 2);
    }

    pub(crate) fn misaligned_and_out_of_range(engine: EngineKind) {
        let image = Image::new();
        let device = open(&image.path, &options(engine, FuaMode::Native));
        let block_bytes = device.logical_block_bytes() as u64;
        let mut buffer = AlignedBuf::zeroed(BLOCK_BYTES);
        let kind = |result: std::io::Result<()>| result.unwrap_err().kind();
        assert_eq!(
            kind(device.read(block_bytes / 2, &mut buffer)),
            std::io::ErrorKind::InvalidInput
        );
        assert_eq!(kind(device.write(1, &buffer, false)), std::io::ErrorKind::InvalidInput);
        let mut odd = AlignedBuf::zeroed(BLOCK_BYTES - 1);
        assert_eq!(kind(device.read(0, &mut odd)), std::io::ErrorKind::InvalidInput);
        let last_block = IMAGE_BYTES - BLOCK_BYTES as u64;
        let mut two_blocks = AlignedBuf::zeroed(2 * BLOCK_BYTES);
        assert!(device.read(last_block, &mut two_blocks).is_err(), "read past the end");
        assert!(device.read(IMAGE_BYTES, &mut buffer).is_err(), "read at the end");
        assert!(device.write(u64::MAX - block_bytes + 1, &buffer, false).is_err());
        let response = submit_and_wait(&device, DevRequest::Read { offset: 1, buffer });
        assert_eq!(response.result.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(response.buffer.map(|buffer| buffer.len()), Some(BLOCK_BYTES));
        assert_eq!(device.stats().requests(), 0, "rejected requests never reach the backend");
        device.read(last_block, &mut AlignedBuf::zeroed(BLOCK_BYTES)).unwrap();
    }

    /// 512 asynchronous writes of distinct blocks from 4 threads, then 512
    /// asynchronous reads, all in flight together.
    pub(crate) fn concurrent_async(options: &DevOptions) {
        const THREADS: usize = 4;
        const BLOCKS: usize = 512;
        let image = Image::new();
        let device = Arc::new(open(&image.path, options));
        let (sender, receiver) = mpsc::channel::<(usize, DevResponse)>();
        let submitters: Vec<_> = (0..THREADS)
            .map(|thread_index| {
                let device = Arc::clone(&device);
                let sender = sender.clone();
                thread::spawn(move || {
                    for block_index in (thread_index..BLOCKS).step_by(THREADS) {
                        let sender = sender.clone();
                        let request = DevRequest::Write {
                            offset: byte_offset(block_index),
                            buffer: pattern(block_index),
                            fua: false,
                        };
                        device.submit(
                            request,
                            Box::new(move |response| {
                                let _ = sender.send((block_index, response));
                            }),
                        );
                    }
                })
            })
            .collect();
        for submitter in submitters {
            submitter.join().unwrap();
        }
        let mut completed = vec![false; BLOCKS];
        for _ in 0..BLOCKS {
            let (block_index, response) =
                receiver.recv_timeout(CALLBACK_TIMEOUT).expect("write lost");
            response.result.unwrap();
            assert!(response.buffer.unwrap()[..] == pattern(block_index)[..]);
            assert!(!completed[block_index], "callback ran twice");
            completed[block_index] = true;
        }
        for block_index in 0..BLOCKS {
            let mut back = AlignedBuf::zeroed(BLOCK_BYTES);
            device.read(byte_offset(block_index), &mut back).unwrap();
            assert!(back[..] == pattern(block_index)[..], "block {block_index} after write");
        }
        for block_index in 0..BLOCKS {
            let sender = sender.clone();
            let request = DevRequest::Read {
                offset: byte_offset(block_index),
                buffer: AlignedBuf::zeroed(BLOCK_BYTES),
            };
            device.submit(
                request,
                Box::new(move |response| {
                    let _ = sender.send((block_index, response));
                }),
            );
        }
        for _ in 0..BLOCKS {
            let (block_index, response) =
                receiver.recv_timeout(CALLBACK_TIMEOUT).expect("read lost");
            response.result.unwrap();
            assert!(
                response.buffer.unwrap()[..] == pattern(block_index)[..],
                "block {block_index}"
            );
        }
        let stats = device.stats();
        assert_eq!(
            (stats.write_requests, stats.bytes_written),
            (512, (BLOCKS * BLOCK_BYTES) as u64)
        );
        assert_eq!(stats.bytes_read, 2 * (BLOCKS * BLOCK_BYTES) as u64);
    }

    pub(crate) fn async_flush_and_fua(engine: EngineKind) {
        let image = Image::new();
        let native = open(&image.path, &options(engine, FuaMode::Native));
        let response = submit_and_wait(&native, DevRequest::Flush);
        assert!(response.buffer.is_none());
        response.result.unwrap();
        assert_eq!(native.stats().flush_requests, 1);

        let before = native.stats();
        let request = DevRequest::Write { offset: 0, buffer: pattern(3), fua: true };
        let response = submit_and_wait(&native, request);
        response.result.unwrap();
        let delta = native.stats().since(&before);
        assert_eq!((delta.write_requests, delta.fua_writes, delta.flush_requests), (1, 1, 0));
        drop(native);

        let emulate = open(&image.path, &options(engine, FuaMode::Emulate));
        let request = DevRequest::Write { offset: byte_offset(1), buffer: pattern(4), fua: true };
        let response = submit_and_wait(&emulate, request);
        response.result.unwrap();
        assert!(response.buffer.unwrap()[..] == pattern(4)[..], "buffer handed back");
        let stats = emulate.stats();
        assert_eq!((stats.write_requests, stats.fua_writes, stats.flush_requests), (1, 0, 1));
        let mut back = AlignedBuf::zeroed(2 * BLOCK_BYTES);
        emulate.read(0, &mut back).unwrap();
        assert!(back[..BLOCK_BYTES] == pattern(3)[..] && back[BLOCK_BYTES..] == pattern(4)[..]);
    }

    /// Runs `body` on a thread and fails if it does not finish in time:
    /// a drop that hangs must fail the test, not stall it.
    fn finishes_in_time(body: impl FnOnce() + Send + 'static) {
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            body();
            let _ = sender.send(());
        });
        receiver.recv_timeout(CALLBACK_TIMEOUT).expect("did not finish: a device drop hangs");
    }

    /// Dropping an idle device joins its threads; dropping one while a
    /// FUA-emulated write is in flight leaves the last reference to the
    /// backend in a completion callback, so the backend drops on its own
    /// thread and must neither join itself nor lose the chained flush.
    pub(crate) fn drop_finishes(engine: EngineKind) {
        let image = Image::new();
        let path = image.path.clone();
        finishes_in_time(move || {
            let idle = open(&path, &options(engine, FuaMode::Native));
            idle.write(0, &pattern(0), false).unwrap();
            drop(idle);

            let device = open(&path, &options(engine, FuaMode::Emulate));
            let (sender, receiver) = mpsc::channel();
            let request = DevRequest::Write { offset: 0, buffer: pattern(9), fua: true };
            device.submit(request, move |response: DevResponse| {
                let _ = sender.send(response.result);
            });
            drop(device);
            let result = receiver.recv_timeout(CALLBACK_TIMEOUT).expect("callback lost on drop");
            result.unwrap();
        });
        let device = open(&image.path, &options(engine, FuaMode::Native));
        let mut back = AlignedBuf::zeroed(BLOCK_BYTES);
        device.read(0, &mut back).unwrap();
        assert!(back[..] == pattern(9)[..]);
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{self as support, Image, BLOCK_BYTES, IMAGE_BYTES};
    use super::*;
    use crate::dev::{EngineKind, FuaMode};

    const ENGINE: EngineKind = EngineKind::Sync;

    #[test]
    fn vectored_round_trip() {
        support::vectored_round_trip(ENGINE);
    }

    #[test]
    fn many_iovecs() {
        support::many_iovecs(ENGINE);
    }

    #[test]
    fn fua_counts() {
        support::fua_counts(ENGINE);
    }

    #[test]
    fn discard_punches_and_zeroes() {
        support::discard_punches_and_zeroes(ENGINE);
    }

    #[test]
    fn misaligned_and_out_of_range() {
        support::misaligned_and_out_of_range(ENGINE);
    }

    #[test]
    fn concurrent_async() {
        support::concurrent_async(&support::options(ENGINE, FuaMode::Native));
    }

    #[test]
    fn async_flush_and_fua() {
        support::async_flush_and_fua(ENGINE);
    }

    #[test]
    fn drop_finishes() {
        support::drop_finishes(ENGINE);
    }

    /// Opens the raw backend, falling back to buffered I/O like the helper.
    fn open_raw(path: &Path) -> FileDev {
        let options = support::options(ENGINE, FuaMode::Native);
        FileDev::open(path, &options)
            .or_else(|_| FileDev::open(path, &DevOptions { direct: false, ..options }))
            .unwrap()
    }

    #[test]
    fn backend_read_past_end_is_unexpected_eof() {
        let image = Image::new();
        let raw = open_raw(&image.path);
        let mut buffer = crate::dev::AlignedBuf::zeroed(2 * BLOCK_BYTES);
        // Starts inside the file: the first read is short, the next returns 0.
        let offset = IMAGE_BYTES - BLOCK_BYTES as u64;
        let error = raw.read_at(offset, &mut [IoSliceMut::new(&mut buffer)]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert!(error.to_string().contains(&IMAGE_BYTES.to_string()), "{error}");
    }

    #[test]
    fn open_errors_name_the_path() {
        let image = Image::new();
        let missing = image.path.with_file_name("missing");
        let error = FileDev::open(&missing, &DevOptions::default()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert!(error.to_string().contains("missing"), "{error}");
        let directory = image.path.parent().unwrap();
        let read_only = DevOptions { read_only: true, ..DevOptions::default() };
        assert!(FileDev::open(directory, &read_only).is_err());
    }

    #[test]
    fn read_only_rejects_writes() {
        let image = Image::new();
        let options = DevOptions { read_only: true, ..support::options(ENGINE, FuaMode::Native) };
        let device = support::open(&image.path, &options);
        let block = support::pattern(0);
        assert!(device.write(0, &block, false).is_err());
        device.read(0, &mut crate::dev::AlignedBuf::zeroed(BLOCK_BYTES)).unwrap();
    }
}
