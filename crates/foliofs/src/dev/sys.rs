//! The raw system calls the file backends need, as safe functions. This is
//! the only file of the device layer with `unsafe` syscalls.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd};

/// `BLKGETSIZE64`: size of a block device in bytes (`_IOR(0x12, 114, size_t)`).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `BLKSSZGET`: logical sector size of a block device (`_IO(0x12, 104)`).
const BLKSSZGET: libc::c_ulong = 0x1268;
/// iovecs per preadv/pwritev2 call (IOV_MAX on Linux).
const IOVECS_MAX: usize = 1024;

fn check(result: isize) -> io::Result<usize> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result as usize)
    }
}

/// One preadv call; returns the bytes read (0 at end of file).
pub fn preadv(
    fd: BorrowedFd<'_>,
    buffers: &mut [IoSliceMut<'_>],
    offset: u64,
) -> io::Result<usize> {
    let count = buffers.len().min(IOVECS_MAX) as libc::c_int;
    // SAFETY: IoSliceMut is ABI-compatible with iovec on Unix; the buffers are
    // valid for writes of their lengths for the duration of the call.
    let result = unsafe {
        libc::preadv(fd.as_raw_fd(), buffers.as_mut_ptr().cast(), count, offset as libc::off_t)
    };
    check(result)
}

/// One pwritev2 call with `flags` (0 or RWF_DSYNC); returns the bytes written.
pub fn pwritev2(
    fd: BorrowedFd<'_>,
    buffers: &[IoSlice<'_>],
    offset: u64,
    flags: i32,
) -> io::Result<usize> {
    let count = buffers.len().min(IOVECS_MAX) as libc::c_int;
    // SAFETY: IoSlice is ABI-compatible with iovec on Unix; the buffers are
    // valid for reads of their lengths for the duration of the call.
    let result = unsafe {
        libc::pwritev2(fd.as_raw_fd(), buffers.as_ptr().cast(), count, offset as libc::off_t, flags)
    };
    check(result)
}

/// Reads until `buffers` are full; a premature end of file is an error.
pub fn read_exact_vectored(
    fd: BorrowedFd<'_>,
    mut buffers: &mut [IoSliceMut<'_>],
    mut offset: u64,
) -> io::Result<()> {
    while !buffers.is_empty() {
        match preadv(fd, buffers, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("end of device at offset {offset}"),
                ))
            }
            Ok(read) => {
                offset += read as u64;
                IoSliceMut::advance_slices(&mut buffers, read);
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Writes all of `buffers`; every continuation of a short write carries the
/// same `flags`, so a durable write stays durable.
pub fn write_all_vectored(
    fd: BorrowedFd<'_>,
    mut buffers: &mut [IoSlice<'_>],
    mut offset: u64,
    flags: i32,
) -> io::Result<()> {
    while !buffers.is_empty() {
        match pwritev2(fd, buffers, offset, flags) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("no progress at offset {offset}"),
                ))
            }
            Ok(written) => {
                offset += written as u64;
                IoSlice::advance_slices(&mut buffers, written);
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

pub fn fdatasync(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fdatasync takes a file descriptor, which `fd` keeps open.
    let result = unsafe { libc::fdatasync(fd.as_raw_fd()) };
    check(result as isize).map(|_| ())
}

pub fn block_device_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
    let result = unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut bytes as *mut u64) };
    check(result as isize).map(|_| bytes)
}

pub fn block_device_sector_bytes(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which is valid.
    let result = unsafe { libc::ioctl(fd.as_raw_fd(), BLKSSZGET, &mut bytes as *mut libc::c_int) };
    check(result as isize).map(|_| bytes as u32)
}

/// The file offset alignment O_DIRECT needs on this file, when the kernel
/// and the file system report it (statx STATX_DIOALIGN, Linux 6.1+).
pub fn direct_io_offset_align(fd: BorrowedFd<'_>) -> Option<u32> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut stat: libc::statx = unsafe { std::mem::zeroed() };
    let empty_path = c"";
    // SAFETY: the path is a valid NUL-terminated string and `stat` a valid
    // out-pointer; AT_EMPTY_PATH makes statx describe `fd` itself.
    let result = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            empty_path.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stat,
        )
    };
    if result != 0 || stat.stx_mask & libc::STATX_DIOALIGN == 0 || stat.stx_dio_offset_align == 0 {
        return None;
    }
    Some(stat.stx_dio_offset_align)
}
