//! Raw system calls, wrapped safely: the only direct syscalls of the device
//! layer (io_uring goes through the io-uring crate), plus the loops that
//! finish short transfers.
//!
//! Every wrapper takes a [`BorrowedFd`], so the descriptor is open for the
//! duration of the call by construction.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Most iovecs one preadv/pwritev2 or io_uring readv/writev accepts
/// (`UIO_MAXIOV`); longer lists go down in several transfers.
pub(crate) const MAX_IOVECS: usize = libc::UIO_MAXIOV as usize;
const _: () = assert!(MAX_IOVECS > 0 && MAX_IOVECS <= libc::c_int::MAX as usize);

/// `_IOR(0x12, 114, size_t)` from <linux/fs.h>; libc does not export it.
const BLKGETSIZE64: libc::Ioctl = ioctl_read_request(0x12, 114, std::mem::size_of::<usize>());

/// mips, powerpc and sparc place the ioctl direction bits differently from
/// the generic layout (and give "read" another value).
const IOCTL_ALTERNATE_LAYOUT: bool = cfg!(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "sparc",
    target_arch = "sparc64"
));

/// Encodes `_IOR(kind, number, size)` for this architecture.
const fn ioctl_read_request(kind: u32, number: u32, size_bytes: usize) -> libc::Ioctl {
    let read_direction: u32 = if IOCTL_ALTERNATE_LAYOUT { 2 << 29 } else { 2 << 30 };
    (read_direction | ((size_bytes as u32) << 16) | (kind << 8) | number) as libc::Ioctl
}

/// The O_DIRECT alignment a regular file's file system requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DioAlignment {
    /// Alignment of user memory buffers.
    pub(crate) memory_bytes: u32,
    /// Alignment of file offsets and transfer lengths.
    pub(crate) offset_bytes: u32,
}

/// Converts a `-1`-on-error return value into an `io::Result`.
fn check(result: libc::ssize_t) -> io::Result<usize> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result as usize)
    }
}

fn file_offset(offset_bytes: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset_bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("offset {offset_bytes} does not fit in off_t"),
        )
    })
}

/// One preadv(2): reads into `buffers` at `offset_bytes`; may return fewer
/// bytes than asked for. At most [`MAX_IOVECS`] buffers.
pub(crate) fn preadv(
    fd: BorrowedFd<'_>,
    buffers: &mut [IoSliceMut<'_>],
    offset_bytes: u64,
) -> io::Result<usize> {
    let offset = file_offset(offset_bytes)?;
    let count = buffers.len().min(MAX_IOVECS);
    let buffers = &mut buffers[..count];
    // SAFETY: IoSliceMut is documented to be ABI-compatible with iovec on
    // Unix; the iovecs describe memory borrowed mutably for this call, so the
    // kernel may write all of it, and the count matches the slice (bounded by
    // UIO_MAXIOV, so the cast cannot truncate).
    let result = unsafe {
        libc::preadv(
            fd.as_raw_fd(),
            buffers.as_ptr() as *const libc::iovec,
            buffers.len() as libc::c_int,
            offset,
        )
    };
    check(result)
}

/// One pwritev2(2) with `flags` (0 or `RWF_DSYNC`); may write fewer bytes
/// than asked for. At most [`MAX_IOVECS`] buffers.
pub(crate) fn pwritev2(
    fd: BorrowedFd<'_>,
    buffers: &[IoSlice<'_>],
    offset_bytes: u64,
    flags: i32,
) -> io::Result<usize> {
    let offset = file_offset(offset_bytes)?;
    let buffers = &buffers[..buffers.len().min(MAX_IOVECS)];
    // SAFETY: IoSlice is documented to be ABI-compatible with iovec on Unix;
    // the iovecs describe memory borrowed for this call, which the kernel only
    // reads, and the count matches the slice (bounded by UIO_MAXIOV).
    let result = unsafe {
        libc::pwritev2(
            fd.as_raw_fd(),
            buffers.as_ptr() as *const libc::iovec,
            buffers.len() as libc::c_int,
            offset,
            flags,
        )
    };
    check(result)
}

/// fdatasync(2), retried when a signal interrupts it.
pub(crate) fn fdatasync(fd: BorrowedFd<'_>) -> io::Result<()> {
    loop {
        // SAFETY: fdatasync takes only a descriptor, which the borrow keeps open.
        let result = unsafe { libc::fdatasync(fd.as_raw_fd()) };
        match check(result as libc::ssize_t) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// `_IO(0x12, 119)` and `_IO(0x12, 127)` from <linux/fs.h>; libc exports
/// neither.
const BLKDISCARD: libc::Ioctl = ioctl_none_request(0x12, 119);
const BLKZEROOUT: libc::Ioctl = ioctl_none_request(0x12, 127);

/// Encodes `_IO(kind, number)` for this architecture: "no direction" is 0
/// in the generic layout and 1 << 29 in the alternate one.
const fn ioctl_none_request(kind: u32, number: u32) -> libc::Ioctl {
    let none_direction: u32 = if IOCTL_ALTERNATE_LAYOUT { 1 << 29 } else { 0 };
    (none_direction | (kind << 8) | number) as libc::Ioctl
}

/// fallocate(2) with `mode` over `[offset_bytes, offset_bytes + length_bytes)`,
/// retried when a signal interrupts it.
pub(crate) fn fallocate(
    fd: BorrowedFd<'_>,
    mode: libc::c_int,
    offset_bytes: u64,
    length_bytes: u64,
) -> io::Result<()> {
    let offset = file_offset(offset_bytes)?;
    let length = file_offset(length_bytes)?;
    loop {
        // SAFETY: fallocate takes a descriptor, which the borrow keeps open,
        // and plain integers.
        let result = unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset, length) };
        match check(result as libc::ssize_t) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// Discards (`zero` false: BLKDISCARD) or zeroes (BLKZEROOUT) a byte range
/// of a block device.
pub(crate) fn block_device_discard(
    fd: BorrowedFd<'_>,
    offset_bytes: u64,
    length_bytes: u64,
    zero: bool,
) -> io::Result<()> {
    let range: [u64; 2] = [offset_bytes, length_bytes];
    let request = if zero { BLKZEROOUT } else { BLKDISCARD };
    // SAFETY: both ioctls read two u64s (start, length) from the pointer,
    // which points at `range`, alive for the call; they write nothing back.
    let result = unsafe { libc::ioctl(fd.as_raw_fd(), request, range.as_ptr()) };
    check(result as libc::ssize_t).map(drop)
}

/// Size of a block device (ioctl BLKGETSIZE64).
pub(crate) fn block_device_size_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to
    // a live, writable u64 on this stack frame.
    let result = unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut size_bytes as *mut u64) };
    check(result as libc::ssize_t)?;
    Ok(size_bytes)
}

/// Logical sector size of a block device (ioctl BLKSSZGET).
pub(crate) fn block_device_logical_sector_bytes(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut sector_bytes: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points to a
    // live, writable c_int on this stack frame.
    let result = unsafe {
        libc::ioctl(fd.as_raw_fd(), libc::BLKSSZGET, &mut sector_bytes as *mut libc::c_int)
    };
    check(result as libc::ssize_t)?;
    u32::try_from(sector_bytes).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidData, format!("BLKSSZGET returned {sector_bytes}"))
    })
}

/// The O_DIRECT alignment of an open regular file (statx STATX_DIOALIGN,
/// Linux 6.1+). `None` when the kernel or the file system does not report it.
pub(crate) fn dio_alignment(fd: BorrowedFd<'_>) -> io::Result<Option<DioAlignment>> {
    let mut buffer = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the path is a NUL-terminated empty string, which with
    // AT_EMPTY_PATH makes statx describe `fd` itself; `buffer` is a writable
    // statx-sized allocation the kernel fills in.
    let result = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            buffer.as_mut_ptr(),
        )
    };
    if let Err(error) = check(result as libc::ssize_t) {
        // Kernels before 4.11 (or seccomp filters) lack statx altogether.
        return match error.raw_os_error() {
            Some(libc::ENOSYS) => Ok(None),
            _ => Err(error),
        };
    }
    // SAFETY: statx succeeded, so the kernel initialised the structure (and
    // it started zeroed, so every field is initialised either way).
    let stat = unsafe { buffer.assume_init() };
    if stat.stx_mask & libc::STATX_DIOALIGN == 0 || stat.stx_dio_offset_align == 0 {
        // Not reported, or reported as "O_DIRECT unsupported" (zero).
        return Ok(None);
    }
    Ok(Some(DioAlignment {
        memory_bytes: stat.stx_dio_mem_align,
        offset_bytes: stat.stx_dio_offset_align,
    }))
}

/// A non-blocking, close-on-exec eventfd: io_uring signals one when a
/// ring posts completions.
pub(crate) fn eventfd() -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new
    // descriptor that we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by no one else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Resets an eventfd's counter (ignores "nothing to read").
pub(crate) fn eventfd_drain(fd: BorrowedFd<'_>) {
    let mut counter = 0u64;
    // SAFETY: reads 8 bytes into a valid u64.
    unsafe { libc::read(fd.as_raw_fd(), (&mut counter as *mut u64).cast(), 8) };
}

/// Adds one to an eventfd's counter, waking its watchers.
pub(crate) fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a valid u64.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

pub(crate) fn epoll() -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new
    // descriptor that we own.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by epoll_create1 and is owned by no one else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Watches `fd` for readability, reporting `token` when it is: while it
/// stays readable, or (`edge_triggered`) each time it becomes readable again
/// (for an eventfd, each write).
pub(crate) fn epoll_add(
    epoll: BorrowedFd<'_>,
    fd: BorrowedFd<'_>,
    token: u64,
    edge_triggered: bool,
) -> io::Result<()> {
    let events = if edge_triggered { libc::EPOLLIN | libc::EPOLLET } else { libc::EPOLLIN };
    let mut event = libc::epoll_event { events: events as u32, u64: token };
    // SAFETY: both descriptors are open; the event is a valid in-pointer.
    let result = unsafe {
        libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut event)
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for readiness; returns the tokens of the ready descriptors.
pub(crate) fn epoll_wait(epoll: BorrowedFd<'_>, tokens: &mut Vec<u64>) -> io::Result<()> {
    const EVENTS_MAX: usize = 64;
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS_MAX];
    // SAFETY: `events` is a valid out-array of EVENTS_MAX entries.
    let ready = unsafe {
        libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), EVENTS_MAX as libc::c_int, -1)
    };
    if ready < 0 {
        return Err(io::Error::last_os_error());
    }
    debug_assert!(ready as usize <= EVENTS_MAX, "epoll_wait filled past its array");
    tokens.clear();
    tokens.extend(events[..ready as usize].iter().map(|event| event.u64));
    Ok(())
}

/// What a transfer does; names the error when it stops short.
#[derive(Clone, Copy)]
pub(crate) enum Direction {
    Read,
    Write,
}

/// The error for a transfer that moved nothing before it was complete: the
/// end of the device for a read, a device that accepts nothing for a write.
pub(crate) fn stalled_transfer_error(direction: Direction, offset_bytes: u64) -> io::Error {
    match direction {
        Direction::Read => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read at offset {offset_bytes} reached the end of the device"),
        ),
        Direction::Write => io::Error::new(
            io::ErrorKind::WriteZero,
            format!("write at offset {offset_bytes} transferred nothing"),
        ),
    }
}

/// The error for a transfer reporting more bytes than it was given.
pub(crate) fn overlong_transfer_error(
    transferred_bytes: usize,
    requested_bytes: usize,
    offset_bytes: u64,
) -> io::Error {
    io::Error::other(format!(
        "transfer at offset {offset_bytes} reported {transferred_bytes} bytes of {requested_bytes}"
    ))
}

/// Runs one transfer of up to `requested_bytes` at `offset_bytes`, retrying
/// when a signal interrupts it. A transfer of zero bytes (end of file, or a
/// device that accepts nothing) is an error: the loops would spin otherwise.
fn transfer_once(
    direction: Direction,
    requested_bytes: usize,
    offset_bytes: u64,
    mut transfer: impl FnMut() -> io::Result<usize>,
) -> io::Result<usize> {
    let transferred_bytes = loop {
        match transfer() {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    if transferred_bytes == 0 {
        return Err(stalled_transfer_error(direction, offset_bytes));
    }
    if transferred_bytes > requested_bytes {
        // advance_slices would panic on this; a broken transfer must not.
        return Err(overlong_transfer_error(transferred_bytes, requested_bytes, offset_bytes));
    }
    // What the loops below rely on: progress, and never past the request.
    debug_assert!(transferred_bytes > 0 && transferred_bytes <= requested_bytes);
    Ok(transferred_bytes)
}

fn advanced_offset(offset_bytes: u64, done_bytes: usize) -> io::Result<u64> {
    offset_bytes.checked_add(done_bytes as u64).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "transfer passes the largest offset")
    })
}

/// Fills every buffer from `offset_bytes`, calling `read_once(buffers,
/// offset_bytes)` (one preadv, or one io_uring readv) until done. A read
/// that returns 0 first is an [`io::ErrorKind::UnexpectedEof`] error.
/// The caller's slice array is left as it was.
pub(crate) fn read_exact_at<F>(
    buffers: &mut [IoSliceMut<'_>],
    offset_bytes: u64,
    mut read_once: F,
) -> io::Result<()>
where
    F: FnMut(&mut [IoSliceMut<'_>], u64) -> io::Result<usize>,
{
    let total_bytes: usize = buffers.iter().map(|buffer| buffer.len()).sum();
    if total_bytes == 0 {
        return Ok(());
    }
    let mut done_bytes = transfer_once(Direction::Read, total_bytes, offset_bytes, || {
        read_once(buffers, offset_bytes)
    })?;
    if done_bytes == total_bytes {
        return Ok(());
    }
    // Short read (rare): go on over reborrowed slices, so advancing them does
    // not rewrite the caller's array.
    let mut rest: Vec<IoSliceMut<'_>> =
        buffers.iter_mut().map(|buffer| IoSliceMut::new(&mut buffer[..])).collect();
    let mut remaining = rest.as_mut_slice();
    IoSliceMut::advance_slices(&mut remaining, done_bytes);
    while done_bytes < total_bytes {
        let offset = advanced_offset(offset_bytes, done_bytes)?;
        let requested_bytes = total_bytes - done_bytes;
        let read_bytes = transfer_once(Direction::Read, requested_bytes, offset, || {
            read_once(&mut *remaining, offset)
        })?;
        IoSliceMut::advance_slices(&mut remaining, read_bytes);
        done_bytes += read_bytes;
        debug_assert_eq!(
            remaining.iter().map(|buffer| buffer.len()).sum::<usize>(),
            total_bytes - done_bytes
        );
    }
    Ok(())
}

/// Writes every buffer at `offset_bytes`, calling `write_once(buffers,
/// offset_bytes)` (one pwritev2, or one io_uring writev) until done. The
/// closure carries the write flags, so a continuation after a short
/// `RWF_DSYNC` write is durable too.
pub(crate) fn write_all_at<F>(
    buffers: &[IoSlice<'_>],
    offset_bytes: u64,
    mut write_once: F,
) -> io::Result<()>
where
    F: FnMut(&[IoSlice<'_>], u64) -> io::Result<usize>,
{
    let total_bytes: usize = buffers.iter().map(|buffer| buffer.len()).sum();
    if total_bytes == 0 {
        return Ok(());
    }
    let mut done_bytes = transfer_once(Direction::Write, total_bytes, offset_bytes, || {
        write_once(buffers, offset_bytes)
    })?;
    if done_bytes == total_bytes {
        return Ok(());
    }
    // Short write (rare): go on over a copy of the slices.
    let mut rest = buffers.to_vec();
    let mut remaining = rest.as_mut_slice();
    IoSlice::advance_slices(&mut remaining, done_bytes);
    while done_bytes < total_bytes {
        let offset = advanced_offset(offset_bytes, done_bytes)?;
        let requested_bytes = total_bytes - done_bytes;
        let written_bytes = transfer_once(Direction::Write, requested_bytes, offset, || {
            write_once(remaining, offset)
        })?;
        IoSlice::advance_slices(&mut remaining, written_bytes);
        done_bytes += written_bytes;
        debug_assert_eq!(
            remaining.iter().map(|buffer| buffer.len()).sum::<usize>(),
            total_bytes - done_bytes
        );
    }
    Ok(())
}

/// This process's effective user and group ids.
pub(crate) fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// Seconds since the epoch by the kernel's coarse clock (the time as of the
/// last timer tick: no clock read, a few nanoseconds, as precise as the
/// kernel's own file timestamps): for checks at the scale of seconds on
/// hot paths, where a full clock read costs more than the rest of the work.
pub(crate) fn realtime_coarse_secs() -> i64 {
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `time` is a valid timespec to write; CLOCK_REALTIME_COARSE
    // exists on every Linux this runs on, and on failure `time` stays zero.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut time) };
    time.tv_sec
}

/// Physical memory in bytes (0 if the system does not say).
pub(crate) fn physical_memory_bytes() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page_bytes) =
        unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages.max(0) as u64).saturating_mul(page_bytes.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsFd;

    /// A fake transfer that moves at most `step_bytes` per call, from or to
    /// `device` (a byte array standing in for the file).
    fn short_reader<'a>(
        device: &'a [u8],
        step_bytes: usize,
        calls: &'a mut usize,
    ) -> impl FnMut(&mut [IoSliceMut<'_>], u64) -> io::Result<usize> + 'a {
        move |buffers, offset_bytes| {
            *calls += 1;
            let mut position = offset_bytes as usize;
            let mut budget_bytes = step_bytes;
            for buffer in buffers.iter_mut() {
                let length =
                    buffer.len().min(budget_bytes).min(device.len().saturating_sub(position));
                buffer[..length].copy_from_slice(&device[position..position + length]);
                position += length;
                budget_bytes -= length;
                if length < buffer.len() {
                    break;
                }
            }
            Ok(step_bytes - budget_bytes)
        }
    }

    #[test]
    fn read_exact_at_finishes_short_reads_and_keeps_callers_slices() {
        let device: Vec<u8> = (0..100u8).collect();
        let (mut first, mut second) = ([0u8; 7], [0u8; 13]);
        let mut calls = 0;
        {
            let mut buffers = [IoSliceMut::new(&mut first), IoSliceMut::new(&mut second)];
            read_exact_at(&mut buffers, 10, short_reader(&device, 3, &mut calls)).unwrap();
            assert_eq!(buffers[0].len(), 7, "caller's slices must not be advanced");
            assert_eq!(buffers[1].len(), 13);
        }
        assert_eq!(calls, 7);
        assert_eq!(&first[..], &device[10..17]);
        assert_eq!(&second[..], &device[17..30]);
    }

    #[test]
    fn read_exact_at_reports_end_of_file_with_offset() {
        let device = [1u8; 10];
        let mut buffer = [0u8; 16];
        let mut calls = 0;
        let error = read_exact_at(
            &mut [IoSliceMut::new(&mut buffer)],
            4,
            short_reader(&device, 4, &mut calls),
        )
        .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert!(error.to_string().contains("offset 10"), "{error}");
    }

    #[test]
    fn read_exact_at_retries_interrupted_and_rejects_overcount() {
        let mut buffer = [0u8; 8];
        let mut interrupted = false;
        read_exact_at(&mut [IoSliceMut::new(&mut buffer)], 0, |_, _| {
            if !interrupted {
                interrupted = true;
                return Err(io::ErrorKind::Interrupted.into());
            }
            Ok(8)
        })
        .unwrap();
        let error =
            read_exact_at(&mut [IoSliceMut::new(&mut buffer)], 0, |_, _| Ok(9)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::Other);
    }

    #[test]
    fn write_all_at_finishes_short_writes() {
        let mut device = [0u8; 64];
        let (first, second) = ([1u8; 5], [2u8; 9]);
        let mut offsets = Vec::new();
        write_all_at(
            &[IoSlice::new(&first), IoSlice::new(&second)],
            20,
            |buffers, offset_bytes| {
                offsets.push(offset_bytes);
                // Accept at most 4 bytes, from the first non-empty buffer only.
                let buffer = buffers.iter().find(|buffer| !buffer.is_empty()).unwrap();
                let length = buffer.len().min(4);
                let start = offset_bytes as usize;
                device[start..start + length].copy_from_slice(&buffer[..length]);
                Ok(length)
            },
        )
        .unwrap();
        assert_eq!(offsets, [20, 24, 25, 29, 33]);
        assert_eq!(&device[20..25], &first);
        assert_eq!(&device[25..34], &second);
        let error = write_all_at(&[IoSlice::new(&first)], 0, |_, _| Ok(0)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WriteZero);
    }

    #[test]
    fn syscalls_on_a_regular_file() {
        let file: File = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let fd = file.as_fd();
        let data = [7u8; 100];
        assert_eq!(pwritev2(fd, &[IoSlice::new(&data)], 4000, libc::RWF_DSYNC).unwrap(), 100);
        fdatasync(fd).unwrap();
        let mut back = [0u8; 100];
        assert_eq!(preadv(fd, &mut [IoSliceMut::new(&mut back)], 4000).unwrap(), 100);
        assert_eq!(back, data);
        assert_eq!(preadv(fd, &mut [IoSliceMut::new(&mut back)], 8192).unwrap(), 0);
        // Block-device ioctls on a regular file fail cleanly (ENOTTY).
        assert!(block_device_size_bytes(fd).is_err());
        assert!(block_device_logical_sector_bytes(fd).is_err());
        if let Some(alignment) = dio_alignment(fd).unwrap() {
            assert!(alignment.offset_bytes.is_power_of_two(), "{alignment:?}");
        }
        assert!(preadv(fd, &mut [IoSliceMut::new(&mut back)], u64::MAX).is_err());
    }

    #[test]
    fn blkgetsize64_matches_linux_headers() {
        #[cfg(target_arch = "x86_64")]
        assert_eq!(BLKGETSIZE64 as u32, 0x8008_1272);
    }

    #[test]
    fn discard_ioctls_match_linux_headers() {
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(BLKDISCARD as u32, 0x1277);
            assert_eq!(BLKZEROOUT as u32, 0x127f);
        }
    }
}
