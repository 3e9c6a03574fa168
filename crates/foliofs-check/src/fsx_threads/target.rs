//! What the threads run against: the library in process, files under a
//! path (a foliofs mount, or any file system), and a deliberately broken
//! wrapper the checker must catch.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use foliofs::{block_on, AlignedBuf, FallocateMode, File, OpenFlags, Volume, VolumeOptions};

use super::file_path;
use crate::owner;

/// Files the threads open handles on.
pub trait Target: Sync {
    /// A handle on file `file`: direct I/O or buffered, writable or not.
    fn open(&self, file: usize, direct: bool, write: bool) -> Result<Box<dyn Handle>, String>;
    /// After the run: make everything durable and check the volume.
    fn finish(&self) -> Result<(), String>;
}

/// One thread's handle. Errors are messages naming the call.
pub trait Handle {
    fn read(&mut self, buffer: &mut [u8], pos: u64) -> Result<usize, String>;
    fn write(&mut self, data: &[u8], pos: u64) -> Result<(), String>;
    /// A direct write submitted asynchronously, waited for.
    fn write_async(&mut self, data: &AlignedBuf, pos: u64) -> Result<(), String>;
    fn punch(&mut self, pos: u64, len: u64) -> Result<(), String>;
    fn zero_range(&mut self, pos: u64, len: u64) -> Result<(), String>;
    fn set_len(&mut self, size: u64) -> Result<(), String>;
    fn sync(&mut self, data_only: bool) -> Result<(), String>;
    /// Reads through a shared mapping of the file.
    fn mmap_read(&mut self, buffer: &mut [u8], pos: u64) -> Result<usize, String> {
        let _ = (buffer, pos);
        Err("this target cannot map files".to_string())
    }
}

/// The library in process, on a volume in a temporary image file.
pub struct InProcess {
    volume: Volume,
    inos: Vec<u64>,
    _dir: tempfile::TempDir,
}

impl InProcess {
    /// A fresh volume of `image_bytes` with `files` empty files.
    pub fn create(files: usize, image_bytes: u64, options: &VolumeOptions) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|error| format!("temporary directory: {error}"))?;
        let image = dir.path().join("fsx-threads.img");
        let mkfs = foliofs::MkfsOptions::default();
        Volume::mkfs_path(&image, Some(image_bytes), &mkfs, options)
            .map_err(|error| format!("mkfs {}: {error}", image.display()))?;
        let volume = Volume::open(&image, options)
            .map_err(|error| format!("open {}: {error}", image.display()))?;
        let inos = (0..files)
            .map(|file| {
                let name = format!("fsx-threads-{file}");
                volume
                    .inodes()
                    .create(foliofs::ROOT_INO, name.as_bytes(), 0o644, owner())
                    .map(|attr| attr.ino)
                    .map_err(|error| format!("create {name}: {error}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { volume, inos, _dir: dir })
    }
}

impl Target for InProcess {
    fn open(&self, file: usize, direct: bool, write: bool) -> Result<Box<dyn Handle>, String> {
        let flags = if write { OpenFlags::READ_WRITE } else { OpenFlags::READ };
        let flags = if direct { flags.with_direct() } else { flags };
        let handle = self
            .volume
            .inodes()
            .open_file(self.inos[file], flags)
            .map_err(|error| format!("open file {file}: {error}"))?;
        Ok(Box::new(LibraryHandle(handle)))
    }

    fn finish(&self) -> Result<(), String> {
        self.volume.sync().map_err(|error| format!("sync: {error}"))?;
        let report = foliofs::fsck::check(self.volume.device().clone());
        if report.is_clean() {
            Ok(())
        } else {
            Err(format!("fsck after the run: {}", report.problems.join("; ")))
        }
    }
}

struct LibraryHandle(File);

impl Handle for LibraryHandle {
    fn read(&mut self, buffer: &mut [u8], pos: u64) -> Result<usize, String> {
        self.0.read_at(buffer, pos).map_err(|error| format!("read: {error}"))
    }

    fn write(&mut self, data: &[u8], pos: u64) -> Result<(), String> {
        let written = self.0.write_at(data, pos).map_err(|error| format!("write: {error}"))?;
        check_whole(written, data.len())
    }

    fn write_async(&mut self, data: &AlignedBuf, pos: u64) -> Result<(), String> {
        let future = self.0.write_at_async(AlignedBuf::from_slice(data), pos);
        let (written, _) = block_on(future);
        let written = written.map_err(|error| format!("async direct write: {error}"))?;
        check_whole(written, data.len())
    }

    fn punch(&mut self, pos: u64, len: u64) -> Result<(), String> {
        self.0
            .fallocate(FallocateMode::PunchHole, pos, len)
            .map_err(|error| format!("punch: {error}"))
    }

    fn zero_range(&mut self, pos: u64, len: u64) -> Result<(), String> {
        let mode = FallocateMode::ZeroRange { keep_size: true };
        self.0.fallocate(mode, pos, len).map_err(|error| format!("zero range: {error}"))
    }

    fn set_len(&mut self, size: u64) -> Result<(), String> {
        self.0.set_len(size).map_err(|error| format!("truncate: {error}"))
    }

    fn sync(&mut self, data_only: bool) -> Result<(), String> {
        let result = if data_only { self.0.sync_data() } else { self.0.sync_all() };
        result.map_err(|error| format!("fsync: {error}"))
    }
}

fn check_whole(written: usize, wanted: usize) -> Result<(), String> {
    if written == wanted {
        Ok(())
    } else {
        Err(format!("short write: {written} of {wanted} bytes"))
    }
}

/// Files under a directory, through the OS: a foliofs mount (or, to check
/// the checker, any file system). Asynchronous direct writes are plain
/// O_DIRECT writes here: the kernel's FUSE splits them into requests it
/// sends at once (async_dio) either way.
pub struct PathTarget {
    dir: PathBuf,
}

impl PathTarget {
    /// Creates (or empties) `files` files under `dir`.
    pub fn create(dir: &Path, files: usize) -> Result<Self, String> {
        for file in 0..files {
            let path = file_path(dir, file);
            std::fs::File::create(&path)
                .map_err(|error| format!("create {}: {error}", path.display()))?;
        }
        Ok(Self { dir: dir.to_path_buf() })
    }
}

impl Target for PathTarget {
    fn open(&self, file: usize, direct: bool, write: bool) -> Result<Box<dyn Handle>, String> {
        let path = file_path(&self.dir, file);
        let handle = OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
            .open(&path)
            .map_err(|error| format!("open {}: {error}", path.display()))?;
        Ok(Box::new(OsHandle(handle)))
    }

    fn finish(&self) -> Result<(), String> {
        Ok(())
    }
}

struct OsHandle(std::fs::File);

impl OsHandle {
    fn fallocate(&mut self, mode: i32, pos: u64, len: u64, what: &str) -> Result<(), String> {
        // SAFETY: fallocate(2) on a descriptor this handle owns; it reads no memory of ours.
        let result = unsafe {
            libc::fallocate(self.0.as_raw_fd(), mode, pos as libc::off_t, len as libc::off_t)
        };
        if result == 0 {
            Ok(())
        } else {
            Err(format!("{what}: {}", std::io::Error::last_os_error()))
        }
    }
}

impl Handle for OsHandle {
    fn read(&mut self, buffer: &mut [u8], pos: u64) -> Result<usize, String> {
        self.0.read_at(buffer, pos).map_err(|error| format!("read: {error}"))
    }

    fn write(&mut self, data: &[u8], pos: u64) -> Result<(), String> {
        self.0.write_all_at(data, pos).map_err(|error| format!("write: {error}"))
    }

    fn write_async(&mut self, data: &AlignedBuf, pos: u64) -> Result<(), String> {
        self.0.write_all_at(data, pos).map_err(|error| format!("direct write: {error}"))
    }

    fn punch(&mut self, pos: u64, len: u64) -> Result<(), String> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        self.fallocate(mode, pos, len, "punch")
    }

    fn zero_range(&mut self, pos: u64, len: u64) -> Result<(), String> {
        let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        self.fallocate(mode, pos, len, "zero range")
    }

    fn set_len(&mut self, size: u64) -> Result<(), String> {
        self.0.set_len(size).map_err(|error| format!("truncate: {error}"))
    }

    fn sync(&mut self, data_only: bool) -> Result<(), String> {
        let result = if data_only { self.0.sync_data() } else { self.0.sync_all() };
        result.map_err(|error| format!("fsync: {error}"))
    }

    fn mmap_read(&mut self, buffer: &mut [u8], pos: u64) -> Result<usize, String> {
        const PAGE: u64 = 4096;
        let map_pos = pos - pos % PAGE;
        let map_len = (pos + buffer.len() as u64 - map_pos) as usize;
        // SAFETY: a new read-only shared mapping of a file this handle
        // holds open; the checker maps only ranges inside the file's size
        // (never its last slot, the one truncation moves), so no access
        // below faults past the end.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                self.0.as_raw_fd(),
                map_pos as libc::off_t,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `mapped` is the start of the `map_len` bytes just mapped,
        // readable until the munmap below.
        let view = unsafe { std::slice::from_raw_parts(mapped as *const u8, map_len) };
        buffer.copy_from_slice(&view[(pos - map_pos) as usize..]);
        // SAFETY: unmaps exactly the mapping made above; `view` is not used again.
        unsafe { libc::munmap(mapped, map_len) };
        Ok(buffer.len())
    }
}

/// A target that serves stale reads: a buffered read that repeats an
/// earlier one on the same handle (same offset and length) returns what the
/// earlier one returned, as a cache that kept bytes across a write would.
/// The checker must catch it.
pub struct StaleReads<'a>(pub &'a dyn Target);

impl Target for StaleReads<'_> {
    fn open(&self, file: usize, direct: bool, write: bool) -> Result<Box<dyn Handle>, String> {
        let inner = self.0.open(file, direct, write)?;
        if direct {
            return Ok(inner);
        }
        Ok(Box::new(StaleHandle { inner, seen: HashMap::new() }))
    }

    fn finish(&self) -> Result<(), String> {
        self.0.finish()
    }
}

struct StaleHandle {
    inner: Box<dyn Handle>,
    seen: HashMap<(u64, usize), Vec<u8>>,
}

impl Handle for StaleHandle {
    fn read(&mut self, buffer: &mut [u8], pos: u64) -> Result<usize, String> {
        if let Some(old) = self.seen.get(&(pos, buffer.len())) {
            buffer[..old.len()].copy_from_slice(old);
            return Ok(old.len());
        }
        let count = self.inner.read(buffer, pos)?;
        self.seen.insert((pos, buffer.len()), buffer[..count].to_vec());
        Ok(count)
    }

    fn write(&mut self, data: &[u8], pos: u64) -> Result<(), String> {
        self.inner.write(data, pos)
    }

    fn write_async(&mut self, data: &AlignedBuf, pos: u64) -> Result<(), String> {
        self.inner.write_async(data, pos)
    }

    fn punch(&mut self, pos: u64, len: u64) -> Result<(), String> {
        self.inner.punch(pos, len)
    }

    fn zero_range(&mut self, pos: u64, len: u64) -> Result<(), String> {
        self.inner.zero_range(pos, len)
    }

    fn set_len(&mut self, size: u64) -> Result<(), String> {
        self.inner.set_len(size)
    }

    fn sync(&mut self, data_only: bool) -> Result<(), String> {
        self.inner.sync(data_only)
    }
}
