//! The foliofs library's C ABI, over its std-shaped API: format and open a
//! volume (with `key=value` options), open files by path with open(2)'s
//! flags, read, write, truncate and sync them, list directories, and the
//! path calls of the namespace. `include/foliofs.h` is generated from this
//! file by cbindgen (`cbindgen.toml`).
//!
//! Every call returns 0 (or a byte count, or 1 for "an entry") on success
//! and a negative errno on failure; `foliofs_last_error` then gives the
//! message, per thread. A null pointer where one is required, or an options
//! string that is not UTF-8, is -EINVAL. Paths are NUL-terminated byte
//! strings from the volume's root (UTF-8 by convention; names are bytes, as
//! on Linux). Handles are opaque pointers, freed by their close call.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr;

use foliofs::{
    Error, File, InodeKind, Metadata, MkfsOptions, OpenOptions, Permissions, ReadDir, Volume,
    VolumeOptions,
};

/// An open volume (opaque).
pub struct FoliofsVolume {
    volume: Volume,
}

/// An open file (opaque).
pub struct FoliofsFile {
    file: File,
}

/// An open directory listing (opaque), from `foliofs_dir_open`.
pub struct FoliofsDir {
    entries: ReadDir,
    /// The name the last `foliofs_dir_next` handed out.
    name: CString,
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
    /// Last access, seconds since the epoch.
    pub atime_sec: i64,
    /// Nanoseconds of `atime_sec`.
    pub atime_nsec: u32,
    /// Last change of the attributes or contents, seconds since the epoch.
    pub ctime_sec: i64,
    /// Nanoseconds of `ctime_sec`.
    pub ctime_nsec: u32,
    /// Preferred I/O size: the volume's block size.
    pub blksize: u32,
    /// A device node's number; 0 for other kinds.
    pub rdev: u32,
}

/// How `foliofs_mkfs_with_options` lays out a volume. Fill it with
/// `foliofs_mkfs_options_default`, then change what you need.
#[repr(C)]
pub struct FoliofsMkfsOptions {
    /// File-system block size: a power of two from 1024 to 65536, at least
    /// the device's logical block (default 4096).
    pub block_bytes: u32,
    /// Owner of the root directory (default: this process's effective user).
    pub root_uid: u32,
    /// Group of the root directory (default: this process's effective group).
    pub root_gid: u32,
    /// Journal size in bytes; 0 (the default) for 1/128 of the volume, at
    /// least 1 MiB.
    pub journal_bytes: u64,
    /// Room for the metadata (every inode, directory entry, extent and
    /// extended attribute) in bytes, 1 MiB to 1 GiB (each of the two
    /// checkpoint slots); 0 (the default) for 1/128 of the volume, at least
    /// 1 MiB: about 75,000 empty files a GiB. A volume for many small files
    /// wants more, as `foliofs mkfs --metadata-size` gives it.
    pub metadata_bytes: u64,
}

/// One directory entry, from `foliofs_dir_next`.
#[repr(C)]
pub struct FoliofsDirEntry {
    /// The entry's name, NUL-terminated; owned by the directory handle and
    /// valid until its next `foliofs_dir_next` or `foliofs_dir_close`.
    pub name: *const c_char,
    /// Length of `name` in bytes, without the NUL.
    pub name_len: usize,
    /// Inode number of the node it names.
    pub ino: u64,
    /// The node's type as dirent's d_type: DT_REG, DT_DIR, DT_LNK, DT_FIFO,
    /// DT_SOCK, DT_CHR or DT_BLK.
    pub kind: u8,
}

/// Volume-wide figures, as struct statvfs's.
#[repr(C)]
pub struct FoliofsStatFs {
    /// Block size (f_bsize, f_frsize).
    pub block_bytes: u32,
    /// Longest name in bytes (f_namemax).
    pub name_max: u32,
    /// Blocks of the data region (f_blocks).
    pub blocks: u64,
    /// Data blocks not in use (f_bfree).
    pub free_blocks: u64,
    /// Blocks a new write can use (f_bavail).
    pub available_blocks: u64,
    /// Inodes in use.
    pub inodes: u64,
    /// About how many more inodes fit (f_ffree).
    pub free_inodes: u64,
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

/// The UTF-8 text behind a C string, or None for null.
///
/// # Safety
///
/// `text` is null or a NUL-terminated string valid for this call.
unsafe fn optional_str<'a>(text: *const c_char, what: &str) -> foliofs::Result<Option<&'a str>> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and NUL-terminated and valid by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(text) }.to_bytes();
    std::str::from_utf8(bytes).map(Some).map_err(|_| Error::invalid(format!("{what} is not UTF-8")))
}

/// The volume options an options string names (the defaults for null).
///
/// # Safety
///
/// `options` is null or a NUL-terminated string valid for this call.
unsafe fn volume_options(options: *const c_char) -> foliofs::Result<VolumeOptions> {
    // SAFETY: forwarded from the caller's contract.
    match unsafe { optional_str(options, "the options string") }? {
        Some(list) => VolumeOptions::parse(list),
        None => Ok(VolumeOptions::default()),
    }
}

/// Creates (or overwrites) the image file `image` with `size_bytes` and
/// formats it with the default layout (4 KiB blocks, root owned by this
/// process's effective user and group). 0 or -errno.
///
/// # Safety
///
/// `image` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_mkfs(image: *const c_char, size_bytes: u64) -> c_int {
    // SAFETY: forwarded from this function's contract; null is allowed for
    // the other two.
    unsafe { foliofs_mkfs_with_options(image, size_bytes, ptr::null(), ptr::null()) }
}

/// Fills `*mkfs` with the default layout: 4096-byte blocks, the default
/// journal and metadata room, the root directory owned by this process's
/// effective user and group. 0 or -EINVAL for a null `mkfs`.
///
/// # Safety
///
/// `mkfs` is null or points to writable storage for a `FoliofsMkfsOptions`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_mkfs_options_default(mkfs: *mut FoliofsMkfsOptions) -> c_int {
    status(guarded(|| {
        if mkfs.is_null() {
            return Err(Error::invalid("null mkfs options"));
        }
        let defaults = MkfsOptions::default();
        let filled = FoliofsMkfsOptions {
            block_bytes: defaults.block_bytes,
            root_uid: defaults.root_owner.uid,
            root_gid: defaults.root_owner.gid,
            journal_bytes: defaults.journal_bytes.unwrap_or(0),
            metadata_bytes: defaults.metadata_bytes.unwrap_or(0),
        };
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { ptr::write(mkfs, filled) };
        Ok(0)
    }))
}

/// Creates (or overwrites) the image file `image` with `size_bytes` and
/// formats it as `*mkfs` says (null: the defaults of
/// `foliofs_mkfs_options_default`), opening the image with the volume
/// options `options` (as `foliofs_volume_open_with_options`; null for the
/// defaults: of them only the I/O ones, such as `direct=off`, matter here).
/// 0 or -errno: -EINVAL for a bad block size, a size too small (the
/// volume's, the journal's or the metadata room's) or a bad option, with
/// `foliofs_last_error` saying which.
///
/// # Safety
///
/// `image` is a NUL-terminated string; `mkfs` is null or points to a
/// `FoliofsMkfsOptions`; `options` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_mkfs_with_options(
    image: *const c_char,
    size_bytes: u64,
    mkfs: *const FoliofsMkfsOptions,
    options: *const c_char,
) -> c_int {
    status(guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let (image, options) = unsafe { (path_of(image)?, volume_options(options)?) };
        let mut layout = MkfsOptions::default();
        // SAFETY: null or a readable FoliofsMkfsOptions, by the contract.
        if let Some(mkfs) = unsafe { mkfs.as_ref() } {
            layout.block_bytes = mkfs.block_bytes;
            layout.journal_bytes = (mkfs.journal_bytes != 0).then_some(mkfs.journal_bytes);
            layout.metadata_bytes = (mkfs.metadata_bytes != 0).then_some(mkfs.metadata_bytes);
            layout.root_owner.uid = mkfs.root_uid;
            layout.root_owner.gid = mkfs.root_gid;
        }
        Volume::mkfs_path(image, Some(size_bytes), &layout, &options)?;
        Ok(0)
    }))
}

/// Opens the volume in `image` with the default options into `*volume`.
/// 0 or -errno.
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
    // SAFETY: forwarded from this function's contract; null options are
    // the defaults.
    unsafe { foliofs_volume_open_with_options(image, ptr::null(), volume) }
}

/// Opens the volume in `image` into `*volume`, with the comma-separated
/// `key=value` volume options `options` (as `mount -o`; null or "" for the
/// defaults), for example "ro" to open it read-only (every change is then
/// -EROFS) or "engine=sync,direct=off,cache_bytes=64M". An unknown key or a
/// bad value is -EINVAL, with `foliofs_last_error` naming it. 0 or -errno;
/// `*volume` is only written on success.
///
/// # Safety
///
/// `image` is a NUL-terminated string; `options` is null or a
/// NUL-terminated string; `volume` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn foliofs_volume_open_with_options(
    image: *const c_char,
    options: *const c_char,
    volume: *mut *mut FoliofsVolume,
) -> c_int {
    status(guarded(|| {
        if volume.is_null() {
            return Err(Error::invalid("null volume out-pointer"));
        }
        // SAFETY: forwarded from this function's contract.
        let (image, options) = unsafe { (path_of(image)?, volume_options(options)?) };
        let opened = Volume::open(image, &options)?;
        let handle = Box::into_raw(Box::new(FoliofsVolume { volume: opened }));
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { volume.write(handle) };
        Ok(0)
    }))
}

/// Makes every change to the volume so far durable (syncfs). 0 or -errno.
///
/// # Safety
///
/// `volume` is open.
#[no_mangle]
pub unsafe extern "C" fn foliofs_volume_sync(volume: *const FoliofsVolume) -> c_int {
    // SAFETY: forwarded from this function's contract.
    status(guarded(|| unsafe { volume_ref(volume) }?.sync().map(|()| 0)))
}

/// The volume's figures (statvfs) into `*statfs`. 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `statfs` points to writable storage for a
/// `FoliofsStatFs`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_statfs(
    volume: *const FoliofsVolume,
    statfs: *mut FoliofsStatFs,
) -> c_int {
    status(guarded(|| {
        if statfs.is_null() {
            return Err(Error::invalid("null statfs out-pointer"));
        }
        // SAFETY: forwarded from this function's contract.
        let figures = unsafe { volume_ref(volume) }?.statfs();
        let filled = FoliofsStatFs {
            block_bytes: figures.block_bytes,
            name_max: figures.name_bytes_max,
            blocks: figures.data_blocks,
            free_blocks: figures.free_blocks,
            available_blocks: figures.available_blocks,
            inodes: figures.inodes,
            free_inodes: figures.free_inodes_estimate(),
        };
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { ptr::write(statfs, filled) };
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
/// `volume` came from `foliofs_volume_open` (or `_with_options`) and is not
/// used after this.
#[no_mangle]
pub unsafe extern "C" fn foliofs_volume_close(volume: *mut FoliofsVolume) -> c_int {
    status(guarded(|| {
        if volume.is_null() {
            return Err(Error::invalid("null volume"));
        }
        // SAFETY: made by Box::into_raw in foliofs_volume_open_with_options
        // and handed back once, by the caller's contract.
        let volume = unsafe { Box::from_raw(volume) };
        volume.volume.close()?;
        Ok(0)
    }))
}

/// # Safety
///
/// `volume` is null or came from `foliofs_volume_open` (or `_with_options`)
/// and is still open.
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

/// Runs `call` on two open files: its byte count, or -errno.
///
/// # Safety
///
/// `dst` and `src` are null or open.
unsafe fn with_two_files(
    dst: *const FoliofsFile,
    src: *const FoliofsFile,
    call: impl FnOnce(&File, &File) -> foliofs::Result<u64>,
) -> i64 {
    guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let (dst, src) = unsafe { (file_ref(dst)?, file_ref(src)?) };
        Ok(call(dst, src)? as i64)
    })
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

/// Clones `length` bytes of `src` at `src_offset` into `dst` at
/// `dst_offset` (FICLONERANGE): the blocks are shared, not copied, and a
/// later write to either file copies only what it touches. `length` 0
/// means to the end of `src`. Offsets must be multiples of the block size,
/// and so must `length` unless the range ends at `src`'s end of file. The
/// bytes cloned, or -errno (-EINVAL misaligned, -EXDEV across volumes,
/// -EOPNOTSUPP on a volume of format version 1).
///
/// # Safety
///
/// `dst` and `src` are open (they may be the same file).
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_clone_range(
    dst: *const FoliofsFile,
    src: *const FoliofsFile,
    src_offset: u64,
    dst_offset: u64,
    length: u64,
) -> i64 {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        with_two_files(dst, src, |dst, src| {
            dst.clone_range_from(src, src_offset, dst_offset, length)
        })
    }
}

/// copy_file_range(2): copies up to `length` bytes of `src` at
/// `src_offset` to `dst` at `dst_offset`, cloning the whole blocks where
/// both offsets sit alike in their blocks: the bytes copied (fewer at
/// `src`'s end of file), or -errno.
///
/// # Safety
///
/// `dst` and `src` are open.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_copy_range(
    dst: *const FoliofsFile,
    src: *const FoliofsFile,
    src_offset: u64,
    dst_offset: u64,
    length: u64,
) -> i64 {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        with_two_files(dst, src, |dst, src| {
            dst.copy_range_from(src, src_offset, dst_offset, length)
        })
    }
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

/// Makes the file's data durable, with the metadata needed to read it back
/// (its size), but not its timestamps (fdatasync). 0 or -errno.
///
/// # Safety
///
/// `file` is open.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_sync_data(file: *const FoliofsFile) -> c_int {
    // SAFETY: forwarded from this function's contract.
    status(guarded(|| unsafe { file_ref(file) }?.sync_data().map(|()| 0)))
}

/// Truncates or extends (with zeros) the file to `size` bytes (ftruncate).
/// 0 or -errno: -EBADF if the file is not open for writing.
///
/// # Safety
///
/// `file` is open.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_set_len(file: *const FoliofsFile, size: u64) -> c_int {
    // SAFETY: forwarded from this function's contract.
    status(guarded(|| unsafe { file_ref(file) }?.set_len(size).map(|()| 0)))
}

/// The attributes of the open file into `*stat` (fstat). 0 or -errno.
///
/// # Safety
///
/// `file` is open; `stat` points to writable storage for a `FoliofsStat`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_stat(
    file: *const FoliofsFile,
    stat: *mut FoliofsStat,
) -> c_int {
    status(guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let metadata = unsafe { file_ref(file) }?.metadata()?;
        // SAFETY: forwarded from this function's contract.
        unsafe { write_stat(stat, &metadata) }
    }))
}

/// Sets the open file's permission bits to `mode & 07777` (fchmod). 0 or
/// -errno.
///
/// # Safety
///
/// `file` is open.
#[no_mangle]
pub unsafe extern "C" fn foliofs_file_chmod(file: *const FoliofsFile, mode: u32) -> c_int {
    status(guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let file = unsafe { file_ref(file) }?;
        file.set_permissions(Permissions::from_mode(mode)).map(|()| 0)
    }))
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

/// Writes `metadata` into `*stat`, for the stat calls.
///
/// # Safety
///
/// `stat` is null (-EINVAL) or points to writable storage for a
/// `FoliofsStat`.
unsafe fn write_stat(stat: *mut FoliofsStat, metadata: &Metadata) -> foliofs::Result<i64> {
    if stat.is_null() {
        return Err(Error::invalid("null stat out-pointer"));
    }
    let attr = metadata.attr();
    let filled = FoliofsStat {
        ino: metadata.ino(),
        mode: metadata.mode(),
        nlink: metadata.nlink(),
        uid: metadata.uid(),
        gid: metadata.gid(),
        size: metadata.len(),
        blocks: metadata.blocks(),
        mtime_sec: attr.mtime.secs,
        mtime_nsec: attr.mtime.nanos,
        atime_sec: attr.atime.secs,
        atime_nsec: attr.atime.nanos,
        ctime_sec: attr.ctime.secs,
        ctime_nsec: attr.ctime.nanos,
        blksize: metadata.blksize(),
        rdev: attr.rdev,
    };
    // SAFETY: checked non-null; writable by the caller's contract.
    unsafe { ptr::write(stat, filled) };
    Ok(0)
}

/// The attributes of the node at `path` (symlinks followed) into `*stat`
/// (stat). 0 or -errno.
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
        // SAFETY: forwarded from this function's contract.
        let (volume, path) = unsafe { (volume_ref(volume)?, path_of(path)?) };
        let metadata = volume.metadata(path)?;
        // SAFETY: forwarded from this function's contract.
        unsafe { write_stat(stat, &metadata) }
    }))
}

/// As `foliofs_stat`, but a symlink at the end of `path` is described
/// itself (lstat). 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string; `stat` points to
/// writable storage for a `FoliofsStat`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_lstat(
    volume: *const FoliofsVolume,
    path: *const c_char,
    stat: *mut FoliofsStat,
) -> c_int {
    status(guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let (volume, path) = unsafe { (volume_ref(volume)?, path_of(path)?) };
        let metadata = volume.symlink_metadata(path)?;
        // SAFETY: forwarded from this function's contract.
        unsafe { write_stat(stat, &metadata) }
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

/// Runs a call of the volume that takes two paths (rename, link, symlink).
///
/// # Safety
///
/// As those: `volume` is open; `first` and `second` are NUL-terminated
/// strings.
unsafe fn with_two_paths(
    volume: *const FoliofsVolume,
    first: *const c_char,
    second: *const c_char,
    call: impl FnOnce(&Volume, &Path, &Path) -> foliofs::Result<()>,
) -> c_int {
    status(guarded(|| {
        // SAFETY: forwarded from the caller's contract.
        let (volume, first, second) =
            unsafe { (volume_ref(volume)?, path_of(first)?, path_of(second)?) };
        call(volume, first, second).map(|()| 0)
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

/// Creates `to` (which must not exist) as a clone of the regular file
/// `from`: it shares all of `from`'s blocks (`cp --reflink=always`).
/// 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `from` and `to` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_clone_file(
    volume: *const FoliofsVolume,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { with_two_paths(volume, from, to, |volume, from, to| volume.clone_file(from, to)) }
}

/// Clones the directory tree `from` to `to` (which must not exist) as one
/// instant of the volume: other threads' changes wait while it is made.
/// Directories and symlinks are made again, regular files share their
/// blocks, other nodes are skipped. The files cloned, or -errno.
///
/// # Safety
///
/// `volume` is open; `from` and `to` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_clone_tree(
    volume: *const FoliofsVolume,
    from: *const c_char,
    to: *const c_char,
) -> i64 {
    guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let (volume, from, to) = unsafe { (volume_ref(volume)?, path_of(from)?, path_of(to)?) };
        volume.clone_tree(from, to).map(|(files, _skipped)| files as i64)
    })
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
    unsafe { with_two_paths(volume, from, to, |volume, from, to| volume.rename(from, to)) }
}

/// Sets the permission bits of the node at `path` (symlinks followed) to
/// `mode & 07777` (chmod). 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_chmod(
    volume: *const FoliofsVolume,
    path: *const c_char,
    mode: u32,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        with_path(volume, path, |volume, path| {
            volume.set_permissions(path, Permissions::from_mode(mode))
        })
    }
}

/// Makes `link` a new name of the node at `original` (link; a symlink there
/// is linked itself). 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `original` and `link` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_link(
    volume: *const FoliofsVolume,
    original: *const c_char,
    link: *const c_char,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        with_two_paths(volume, original, link, |volume, original, link| {
            volume.hard_link(original, link)
        })
    }
}

/// Makes `link` a symlink to `target`, stored as given (symlink; a relative
/// target resolves from the link's directory). 0 or -errno.
///
/// # Safety
///
/// `volume` is open; `target` and `link` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_symlink(
    volume: *const FoliofsVolume,
    target: *const c_char,
    link: *const c_char,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        with_two_paths(volume, target, link, |volume, target, link| volume.symlink(target, link))
    }
}

/// The target of the symlink at `path` (readlink): copies up to `size`
/// bytes of it into `buffer`, without a NUL, and returns the target's whole
/// length, so a result above `size` means the copy was cut short. -errno
/// on failure (-EINVAL if `path` is not a symlink).
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string; `buffer` is
/// writable for `size` bytes (it may be null when `size` is 0).
#[no_mangle]
pub unsafe extern "C" fn foliofs_readlink(
    volume: *const FoliofsVolume,
    path: *const c_char,
    buffer: *mut c_char,
    size: usize,
) -> i64 {
    guarded(|| {
        // SAFETY: forwarded from this function's contract.
        let (volume, path) = unsafe { (volume_ref(volume)?, path_of(path)?) };
        let target = volume.read_link(path)?;
        let target = target.as_os_str().as_bytes();
        let copied = target.len().min(size);
        if copied > 0 {
            check_buffer(buffer.cast_const().cast())?;
            // SAFETY: non-null and writable for `size` >= `copied` bytes by
            // the contract; `target` is a distinct Rust allocation.
            unsafe { ptr::copy_nonoverlapping(target.as_ptr(), buffer.cast::<u8>(), copied) };
        }
        i64::try_from(target.len()).map_err(|_| Error::invalid("symlink target too long"))
    })
}

/// Opens the directory at `path` (symlinks followed) for listing into
/// `*dir` (opendir): its entries, without "." and "..", as they were at
/// this call. The handle owns them, and the names `foliofs_dir_next` hands
/// out, until `foliofs_dir_close`. 0 or -errno (-ENOTDIR for a file).
///
/// # Safety
///
/// `volume` is open; `path` is a NUL-terminated string; `dir` points to
/// writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn foliofs_dir_open(
    volume: *const FoliofsVolume,
    path: *const c_char,
    dir: *mut *mut FoliofsDir,
) -> c_int {
    status(guarded(|| {
        if dir.is_null() {
            return Err(Error::invalid("null dir out-pointer"));
        }
        // SAFETY: forwarded from this function's contract.
        let (volume, path) = unsafe { (volume_ref(volume)?, path_of(path)?) };
        let entries = volume.read_dir(path)?;
        let handle = Box::into_raw(Box::new(FoliofsDir { entries, name: CString::default() }));
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { dir.write(handle) };
        Ok(0)
    }))
}

/// The d_type of a node kind.
fn dirent_type(kind: InodeKind) -> u8 {
    match kind {
        InodeKind::File => libc::DT_REG,
        InodeKind::Dir => libc::DT_DIR,
        InodeKind::Symlink => libc::DT_LNK,
        InodeKind::Fifo => libc::DT_FIFO,
        InodeKind::Socket => libc::DT_SOCK,
        InodeKind::CharDevice => libc::DT_CHR,
        InodeKind::BlockDevice => libc::DT_BLK,
    }
}

/// The next entry of `dir` into `*entry` (readdir): 1 when it filled
/// `*entry`, 0 at the end of the listing, or -errno. `entry->name` is owned
/// by `dir` and valid until the next call on it.
///
/// # Safety
///
/// `dir` came from `foliofs_dir_open`, is not closed, and no other thread
/// uses it meanwhile; `entry` points to writable storage for a
/// `FoliofsDirEntry`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_dir_next(
    dir: *mut FoliofsDir,
    entry: *mut FoliofsDirEntry,
) -> c_int {
    status(guarded(|| {
        if entry.is_null() {
            return Err(Error::invalid("null entry out-pointer"));
        }
        // SAFETY: null or a live handle used by this thread alone, by the
        // caller's contract.
        let dir = unsafe { dir.as_mut() }.ok_or_else(|| Error::invalid("null dir"))?;
        let Some(next) = dir.entries.next() else {
            return Ok(0);
        };
        let next = next?;
        // Names hold no NUL: the file system refuses them.
        dir.name = CString::new(next.name)
            .map_err(|_| Error::invalid("a directory entry's name holds a NUL"))?;
        let filled = FoliofsDirEntry {
            name: dir.name.as_ptr(),
            name_len: dir.name.as_bytes().len(),
            ino: next.ino,
            kind: dirent_type(next.kind),
        };
        // SAFETY: checked non-null; writable by the caller's contract.
        unsafe { ptr::write(entry, filled) };
        Ok(1)
    }))
}

/// Closes a directory listing, freeing `dir` and its names (closedir).
/// 0, or -EINVAL for a null `dir`.
///
/// # Safety
///
/// `dir` came from `foliofs_dir_open` and is not used after this.
#[no_mangle]
pub unsafe extern "C" fn foliofs_dir_close(dir: *mut FoliofsDir) -> c_int {
    status(guarded(|| {
        if dir.is_null() {
            return Err(Error::invalid("null dir"));
        }
        // SAFETY: made by Box::into_raw in foliofs_dir_open and handed back
        // once, by the caller's contract.
        drop(unsafe { Box::from_raw(dir) });
        Ok(0)
    }))
}

/// A caller's data buffer of non-zero length must not be null.
fn check_buffer(buffer: *const u8) -> foliofs::Result<()> {
    if buffer.is_null() {
        return Err(Error::invalid("null buffer"));
    }
    Ok(())
}
