//! The foliofs library's C ABI, over its std-shaped API: open a volume,
//! open files by path with open(2)'s flags, read and write at offsets, sync,
//! and the path calls of the namespace. `include/foliofs.h` is generated
//! from this file by cbindgen (`cbindgen.toml`).
//!
//! Every call returns 0 (or a byte count) on success and a negative errno
//! on failure; `foliofs_last_error` then gives the message, per thread.
//! Handles are opaque pointers, freed by their close call.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr;

use foliofs::{Error, File, MkfsOptions, OpenOptions, Volume, VolumeOptions};

/// An open volume (opaque).
pub struct FoliofsVolume {
    volume: Volume,
}

/// An open file (opaque).
pub struct FoliofsFile {
    file: File,
}

/// A node's attributes, as struct stat's fields of the same names.
#[repr(C)]
pub struct FoliofsStat {
    /// Inode number.
    pub ino: u64,
    /// File type and permission bits (S_IFMT | 07777).
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Allocated space in 512-byte units.
    pub blocks: u64,
    /// Last modification, seconds since the epoch.
    pub mtime_sec: i64,
    /// Nanoseconds of `mtime_sec`.
    pub mtime_nsec: u32,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Runs `call`, turning an error (or a panic, which must not cross into C)
/// into a negative errno and the thread's last error message.
fn guarded(call: impl FnOnce() -> foliofs::Result<i64>) -> i64 {
    let outcome = catch_unwind(AssertUnwindSafe(call)).unwrap_or_else(|_| {
        Err(Error::io("foliofs panicked", std::io::Error::from_raw_os_error(libc::EIO)))
    });
    match outcome {
        Ok(value) => value,
        Err(error) => {
            let message = CString::new(error.to_string().replace('\0', " ")).unwrap_or_default();
            LAST_ERROR.with(|last| *last.borrow_mut() = message);
            -i64::from(error.errno())
        }
    }
}

fn status(result: i64) -> c_int {
    // Errnos fit in an int; successes here are 0.
    c_int::try_from(result).unwrap_or(-libc::EOVERFLOW)
}

/// The path behind a C string.
///
/// # Safety
///
/// `path` is null or a NUL-terminated string valid for this call.
unsafe fn path_of<'a>(path: *const c_char) -> foliofs::Result<&'a Path> {
    if path.is_null() {
        return Err(Error::invalid("null path"));
    }
    // SAFETY: non-null, and NUL-terminated and valid by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    Ok(Path::new(OsStr::from_bytes(bytes)))
}

/// The message of this thread's last failed call ("" if none); valid until
/// this thread's next call.
#[no_mangle]
pub extern "C" fn foliofs_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Creates (or overwrites) the image file `image` with `size_bytes` and
/// formats it with 4 KiB blocks. 0 or -errno.
///
/// # Safety
///
/// `image` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_mkfs(image: *const c_char, size_bytes: u64) -> c_int {
    status(guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let image = unsafe { path_of(image) }?;
        let options = VolumeOptions::default();
        Volume::mkfs_path(image, Some(size_bytes), &MkfsOptions::default(), &options)?;
        Ok(0)
    }))
}

/// Opens the volume in `image` into `*volume`. 0 or -errno.
///
/// # Safety
///
/// `image` is a NUL-terminated string; `volume` points to writable storage
/// for a pointer.
#[no_mangle]
pub unsafe extern "C" fn foliofs_volume_open(
    image: *const c_char,
    volume: *mut *mut FoliofsVolume,
) -> c_int {
    status(guarded(|| {
        if volume.is_null() {
            return Err(Error::invalid("null volume out-pointer"));
        }
        // SAFETY: forwarded from this function's contract.
        let image = unsafe { path_of(image) }?;
        let opened = Volume::open(image, &VolumeOptions::default())?;
        let handle = Box::into_raw(Box::new(FoliofsVolume { volume: opened }));
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { volume.write(handle) };
        Ok(0)
    }))
}

/// Writes everything back and closes the volume, freeing `volume` (also
/// when this fails). Close its files first: one still open keeps the image
/// in use, and only its own `foliofs_file_sync` makes later writes durable.
/// 0 or -errno.
///
/// # Safety
///
/// `volume` came from `foliofs_volume_open` and is not used after this.
#[no_mangle]
pub unsafe extern "C" fn foliofs_volume_close(volume: *mut FoliofsVolume) -> c_int {
    status(guarded(|| {
        if volume.is_null() {
            return Err(Error::invalid("null volume"));
        }
        // SAFETY: made by Box::into_raw in foliofs_volume_open and handed
        // back once, by the caller's contract.
        let volume = unsafe { Box::from_raw(volume) };
        volume.volume.close()?;
        Ok(0)
    }))
}

/// # Safety
///
/// `volume` is null or came from `foliofs_volume_open` and is still open.
unsafe fn volume_ref<'a>(volume: *const FoliofsVolume) -> foliofs::Result<&'a Volume> {
    // SAFETY: null or a live handle, by the caller's contract.
    unsafe { volume.as_ref() }
        .map(|handle| &handle.volume)
        .ok_or_else(|| Error::invalid("null volume"))
}

/// # Safety
///
/// `file` is null or came from `foliofs_file_open` and is still open.
unsafe fn file_ref<'a>(file: *const FoliofsFile) -> foliofs::Result<&'a File> {
    // SAFETY: null or a live handle, by the caller's contract.
    unsafe { file.as_ref() }.map(|handle| &handle.file).ok_or_else(|| Error::invalid("null file"))
}

/// Opens the file at `path` with open(2)'s `flags` (O_RDONLY, O_WRONLY,
/// O_RDWR, O_CREAT, O_EXCL, O_TRUNC, O_APPEND, O_DIRECT, O_DSYNC), creating
/// it with `mode` (less the umask 022), into `*file`. 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string; `file` points to
/// writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_open(
    volume: *const FoliofsVolume,
    path: *const c_char,
    flags: c_int,
    mode: u32,
    file: *mut *mut FoliofsFile,
) -> c_int {
    status(guarded(|| {
        if file.is_null() {
            return Err(Error::invalid("null file out-pointer"));
        }
        // SAFETY: forwarded from this function's contract.
        let (volume, path) = unsafe { (volume_ref(volume)?, path_of(path)?) };
        let opened = OpenOptions::from_posix_flags(flags).mode(mode).open(volume, path)?;
        let handle = Box::into_raw(Box::new(FoliofsFile { file: opened }));
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { file.write(handle) };
        Ok(0)
    }))
}

/// Reads up to `length` bytes at `offset` into `buffer`: the bytes read
/// (fewer at end of file), or -errno.
///
/// # Safety
///
/// `file` is open; `buffer` is writable for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_pread(
    file: *const FoliofsFile,
    buffer: *mut u8,
    length: usize,
    offset: u64,
) -> i64 {
    guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let file = unsafe { file_ref(file) }?;
        if length == 0 {
            return Ok(0);
        }
        check_buffer(buffer)?;
        // SAFETY: non-null and writable for `length` bytes by the contract.
        let buffer = unsafe { std::slice::from_raw_parts_mut(buffer, length) };
        Ok(file.read_at(buffer, offset)? as i64)
    })
}

/// Writes `length` bytes from `buffer` at `offset` (at the end of file
/// with O_APPEND): the bytes written, or -errno.
///
/// # Safety
///
/// `file` is open; `buffer` is readable for `length` bytes.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_pwrite(
    file: *const FoliofsFile,
    buffer: *const u8,
    length: usize,
    offset: u64,
) -> i64 {
    guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let file = unsafe { file_ref(file) }?;
        if length == 0 {
            return Ok(0);
        }
        check_buffer(buffer)?;
        // SAFETY: non-null and readable for `length` bytes by the contract.
        let data = unsafe { std::slice::from_raw_parts(buffer, length) };
        Ok(file.write_at(data, offset)? as i64)
    })
}

/// Makes the file's data and metadata durable (fsync). 0 or -errno.
///
/// # Safety
///
/// `file` is open.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_sync(file: *const FoliofsFile) -> c_int {
    // SAFETY: forwarded from this function's contract.
    status(guarded(|| unsafe { file_ref(file) }?.sync_all().map(|()| 0)))
}

/// Closes the file, freeing `file` (also when this fails). 0 or -errno.
///
/// # Safety
///
/// `file` came from `foliofs_file_open` and is not used after this.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_close(file: *mut FoliofsFile) -> c_int {
    status(guarded(|| {
        if file.is_null() {
            return Err(Error::invalid("null file"));
        }
        // SAFETY: made by Box::into_raw in foliofs_file_open and handed back
        // once, by the caller's contract.
        let file = unsafe { Box::from_raw(file) };
        file.file.close()?;
        Ok(0)
    }))
}

/// The attributes of the node at `path` (symlinks followed) into `*stat`.
/// 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string; `stat` points to
/// writable storage for a `FoliofsStat`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_stat(
    volume: *const FoliofsVolume,
    path: *const c_char,
    stat: *mut FoliofsStat,
) -> c_int {
    status(guarded(|| {
        if stat.is_null() {
            return Err(Error::invalid("null stat out-pointer"));
        }
        // SAFETY: forwarded from this function's contract.
        let (volume, path) = unsafe { (volume_ref(volume)?, path_of(path)?) };
        let metadata = volume.metadata(path)?;
        let mtime = metadata.attr().mtime;
        let filled = FoliofsStat {
            ino: metadata.ino(),
            mode: metadata.mode(),
            nlink: metadata.nlink(),
            uid: metadata.uid(),
            gid: metadata.gid(),
            size: metadata.len(),
            blocks: metadata.blocks(),
            mtime_sec: mtime.secs,
            mtime_nsec: mtime.nanos,
        };
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { ptr::write(stat, filled) };
        Ok(0)
    }))
}

/// Runs a path call of the volume, for the namespace entry points below.
///
/// # Safety
///
/// As those: `volume` is open and `path` a NUL-terminated string.
unsafe fn with_path(
    volume: *const FoliofsVolume,
    path: *const c_char,
    call: impl FnOnce(&Volume, &Path) -> foliofs::Result<()>,
) -> c_int {
    status(guarded(|| {
        // SAFETY: forwarded from the caller's contract.
        let (volume, path) = unsafe { (volume_ref(volume)?, path_of(path)?) };
        call(volume, path).map(|()| 0)
    }))
}

/// Creates the directory `path` (mode 0777 less the umask). 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_mkdir(volume: *const FoliofsVolume, path: *const c_char) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { with_path(volume, path, |volume, path| volume.create_dir(path)) }
}

/// Removes the file (or symlink) `path`. 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_unlink(
    volume: *const FoliofsVolume,
    path: *const c_char,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { with_path(volume, path, |volume, path| volume.remove_file(path)) }
}

/// Removes the empty directory `path`. 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_rmdir(volume: *const FoliofsVolume, path: *const c_char) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { with_path(volume, path, |volume, path| volume.remove_dir(path)) }
}

/// Renames `from` to `to`, replacing what is there. 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `from` and `to` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_rename(
    volume: *const FoliofsVolume,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        with_path(volume, from, |volume, from| {
            // SAFETY: forwarded from this function's contract.
            let to = path_of(to)?;
            volume.rename_path(from, to)
        })
    }
}

/// A caller's data buffer of non-zero length must not be null.
fn check_buffer(buffer: *const u8) -> foliofs::Result<()> {
    if buffer.is_null() {
        return Err(Error::invalid("null buffer"));
    }
    Ok(())
}
