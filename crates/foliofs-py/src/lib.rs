//! The foliofs library as a Python module, over its std-shaped API:
//!
//! ```python
//! import foliofs
//! foliofs.mkfs("vol.img", 64 << 20)
//! with foliofs.Volume("vol.img") as volume:
//!     volume.makedirs("/docs", exist_ok=True)
//!     with volume.open("/docs/a.txt", "w+b") as f:
//!         f.write(b"hello")
//!         f.seek(0)
//!         assert f.read() == b"hello"
//!     assert volume.stat("/docs/a.txt").st_size == 5
//! with foliofs.Volume("vol.img", read_only=True) as volume:
//!     volume.listdir("/docs")  # writes raise OSError(errno.EROFS)
//! ```
//!
//! - `mkfs(image, size, block_size=4096, options=None,
//!   journal_size=None, metadata_size=None)` formats `image` (created or
//!   overwritten); the sizes are bytes, as `foliofs mkfs --journal-size`
//!   and `--metadata-size` (room for every inode, entry and extent: a
//!   volume for many small files wants more).
//! - `Volume(image, options=None, read_only=False)` opens the volume in
//!   `image`. `options` is a `key=value,...` string with the keys of
//!   `foliofs mount -o` and `foliofs bench -o` (`engine=sync,cache_bytes=64M`,
//!   `ro`, ...; see `foliofs::VolumeOptions::parse`); an unknown key or a bad
//!   value raises `ValueError` with the library's message. `read_only=True`
//!   is `ro`: the image is locked shared, and every change (opening a file
//!   for writing, mkdir, rename, ...) raises `OSError` with `errno.EROFS`.
//!   `mkfs` takes the same `options` for the device it formats (engine,
//!   direct, fua).
//! - `Volume`'s path calls are named, take their arguments and raise as
//!   `os`'s: `stat`, `mkdir`, `makedirs`, `listdir`, `remove`, `rmdir`,
//!   `rename`, `link(src, dst)`, `symlink(src, dst)`, `readlink` (a str),
//!   `chmod(path, mode)`, and `exists` as `os.path.exists`; paths are from
//!   the volume's root.
//!
//! Files behave as Python's binary file objects (read, write, seek, tell,
//! truncate, flush, close, context managers, iteration by line is not
//! offered); `write` takes any bytes-like object; `stat` returns
//! `os.stat_result`; errors are `OSError` with the errno (so
//! `FileNotFoundError`, `FileExistsError`, ... as `open` raises).
//!
//! Threads: every call into the library releases the GIL while it runs
//! (`mkfs`, `Volume(...)` and all of `Volume`'s methods, `close` included,
//! and all of `File`'s: `read`, `write`, `fsync`, `truncate`, `stat`, `seek`,
//! `tell`, `close`, ...; also the implicit close when an unclosed `Volume` or
//! `File` is garbage-collected), so other Python threads run while one waits
//! for the device. What the library is given (the data to `write`, paths)
//! is copied out of the Python objects before the GIL is released. Objects can be shared between threads: calls on one `Volume`
//! run concurrently (the library is thread-safe) and its `close` waits for
//! the calls in flight; calls on one `File` are serialized (a second thread
//! waits for the first's call to return, as with Python's buffered files),
//! since a file has one position.

use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError, RwLock};

use pyo3::exceptions::{PyAttributeError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyTuple, PyType};
use pyo3::IntoPyObjectExt;

use foliofs::{
    Error, MkfsOptions, OpenOptions, Permissions, Timestamp, Volume as CoreVolume, VolumeOptions,
};

/// OSError(errno, message, filename): Python picks the subclass by errno.
fn os_error(error: Error, filename: Option<&str>) -> PyErr {
    match filename {
        Some(name) => PyOSError::new_err((error.errno(), error.to_string(), name.to_owned())),
        None => PyOSError::new_err((error.errno(), error.to_string())),
    }
}

/// OSError(errno, message, filename, None, filename2), for the calls of two
/// paths (link, symlink), as os raises it.
fn os_error2(error: Error, filename: &str, filename2: &str) -> PyErr {
    PyOSError::new_err((
        error.errno(),
        error.to_string(),
        filename.to_owned(),
        None::<i32>,
        filename2.to_owned(),
    ))
}

fn io_error(error: std::io::Error) -> PyErr {
    os_error(Error::from(error), None)
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O operation on closed file")
}

fn volume_closed() -> PyErr {
    PyValueError::new_err("the volume is closed")
}

/// The volume options of `options` (a `mount -o` list) and `read_only`; a
/// bad list is a ValueError with the library's message.
fn volume_options(options: Option<&str>, read_only: bool) -> PyResult<VolumeOptions> {
    let mut parsed = match options {
        Some(list) => {
            VolumeOptions::parse(list).map_err(|error| PyValueError::new_err(error.to_string()))?
        }
        None => VolumeOptions::default(),
    };
    parsed.read_only |= read_only;
    Ok(parsed)
}

/// Formats `image` (created or overwritten) as a volume of `size` bytes;
/// `options` as `Volume`'s, for the device (engine, direct, fua);
/// `journal_size` and `metadata_size` in bytes (`MkfsOptions`'
/// `journal_bytes` and `metadata_bytes`), None for the defaults.
#[pyfunction]
#[pyo3(signature = (image, size, block_size=4096, options=None, journal_size=None, metadata_size=None))]
fn mkfs(
    py: Python<'_>,
    image: PathBuf,
    size: u64,
    block_size: u32,
    options: Option<&str>,
    journal_size: Option<u64>,
    metadata_size: Option<u64>,
) -> PyResult<()> {
    let options = volume_options(options, false)?;
    let mkfs = MkfsOptions {
        block_bytes: block_size,
        journal_bytes: journal_size,
        metadata_bytes: metadata_size,
        ..MkfsOptions::default()
    };
    py.detach(|| CoreVolume::mkfs_path(&image, Some(size), &mkfs, &options))
        .map(drop)
        .map_err(|error| os_error(error, image.to_str()))
}

/// An open volume; a context manager that closes it.
#[pyclass(module = "foliofs")]
struct Volume {
    /// Read-locked by the calls (they run concurrently, without the GIL),
    /// write-locked by `close`, which so waits for the calls in flight.
    volume: RwLock<Option<CoreVolume>>,
}

impl Volume {
    /// Runs `call` on the open volume with the GIL released.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        call: impl Send + FnOnce(&CoreVolume) -> PyResult<T>,
    ) -> PyResult<T> {
        py.detach(|| {
            let volume = self.volume.read().unwrap_or_else(PoisonError::into_inner);
            call(volume.as_ref().ok_or_else(volume_closed)?)
        })
    }
}

impl Drop for Volume {
    /// An unclosed volume is closed here (writing everything back): without
    /// the GIL where the interpreter still runs.
    fn drop(&mut self) {
        let volume = self.volume.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(volume) = volume {
            // Not attached (the interpreter is gone): the closure is dropped
            // uncalled, and the volume with it.
            Python::try_attach(|py| py.detach(move || drop(volume)));
        }
    }
}

/// open()'s mode string as options: r, w, a, x, with + and an optional b.
fn parse_mode(mode: &str) -> PyResult<OpenOptions> {
    let mut options = OpenOptions::new();
    let plus = mode.contains('+');
    let invalid = || PyValueError::new_err(format!("invalid mode: {mode:?}"));
    if mode.contains('t') {
        return Err(PyValueError::new_err("foliofs files are binary: use a 'b' mode"));
    }
    if mode.chars().any(|c| !"rwaxb+".contains(c)) {
        return Err(invalid());
    }
    match mode.chars().filter(|c| "rwax".contains(*c)).collect::<String>().as_str() {
        "r" => options.read(true).write(plus),
        "w" => options.write(true).create(true).truncate(true).read(plus),
        "a" => options.append(true).create(true).read(plus),
        "x" => options.write(true).create_new(true).read(plus),
        _ => return Err(invalid()),
    };
    Ok(options)
}

#[pymethods]
impl Volume {
    /// Opens the volume in `image`; `options` a `mount -o` list
    /// (`engine=sync,cache_bytes=64M`), `read_only` as `ro`.
    #[new]
    #[pyo3(signature = (image, options=None, read_only=false))]
    fn new(
        py: Python<'_>,
        image: PathBuf,
        options: Option<&str>,
        read_only: bool,
    ) -> PyResult<Self> {
        let options = volume_options(options, read_only)?;
        let volume = py
            .detach(|| CoreVolume::open(&image, &options))
            .map_err(|error| os_error(error, image.to_str()))?;
        Ok(Self { volume: RwLock::new(Some(volume)) })
    }

    /// Opens the file at `path` with open()'s `mode` (binary only).
    #[pyo3(signature = (path, mode="rb"))]
    fn open(&self, py: Python<'_>, path: String, mode: &str) -> PyResult<File> {
        let options = parse_mode(mode)?;
        let file = self.call(py, |volume| {
            options.open(volume, &path).map_err(|error| os_error(error, Some(&path)))
        })?;
        Ok(File { file: Mutex::new(Some(file)), name: path, mode: mode.to_owned() })
    }

    /// os.stat: an os.stat_result (symlinks followed).
    fn stat<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let metadata = self.call(py, |volume| {
            volume.metadata(&path).map_err(|error| os_error(error, Some(&path)))
        })?;
        stat_result(py, &metadata)
    }

    /// os.mkdir.
    fn mkdir(&self, py: Python<'_>, path: String) -> PyResult<()> {
        self.call(py, |volume| {
            volume.create_dir(&path).map_err(|error| os_error(error, Some(&path)))
        })
    }

    /// os.makedirs.
    #[pyo3(signature = (path, exist_ok=false))]
    fn makedirs(&self, py: Python<'_>, path: String, exist_ok: bool) -> PyResult<()> {
        self.call(py, |volume| {
            if !exist_ok
                && volume.try_exists(&path).map_err(|error| os_error(error, Some(&path)))?
            {
                return Err(os_error(Error::Exists(path.clone()), Some(&path)));
            }
            volume.create_dir_all(&path).map_err(|error| os_error(error, Some(&path)))
        })
    }

    /// os.listdir: the names in directory `path`, sorted.
    #[pyo3(signature = (path=String::from("/")))]
    fn listdir(&self, py: Python<'_>, path: String) -> PyResult<Vec<String>> {
        self.call(py, |volume| {
            let entries = volume.read_dir(&path).map_err(|error| os_error(error, Some(&path)))?;
            let mut names: Vec<String> = entries
                .map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned()))
                .collect::<foliofs::Result<_>>()
                .map_err(|error| os_error(error, Some(&path)))?;
            names.sort();
            Ok(names)
        })
    }

    /// os.remove.
    fn remove(&self, py: Python<'_>, path: String) -> PyResult<()> {
        self.call(py, |volume| {
            volume.remove_file(&path).map_err(|error| os_error(error, Some(&path)))
        })
    }

    /// os.rmdir.
    fn rmdir(&self, py: Python<'_>, path: String) -> PyResult<()> {
        self.call(py, |volume| {
            volume.remove_dir(&path).map_err(|error| os_error(error, Some(&path)))
        })
    }

    /// os.rename (replaces what is at `destination`).
    fn rename(&self, py: Python<'_>, source: String, destination: String) -> PyResult<()> {
        self.call(py, |volume| {
            volume.rename(&source, &destination).map_err(|error| os_error(error, Some(&source)))
        })
    }

    /// os.link: makes `dst` a new name of the node at `src` (a symlink there
    /// is linked itself, as link(2) on Linux).
    fn link(&self, py: Python<'_>, src: String, dst: String) -> PyResult<()> {
        self.call(py, |volume| {
            volume.hard_link(&src, &dst).map_err(|error| os_error2(error, &src, &dst))
        })
    }

    /// os.symlink: makes `dst` a symlink to `src`, stored as given (a
    /// relative target resolves from the link's directory).
    fn symlink(&self, py: Python<'_>, src: String, dst: String) -> PyResult<()> {
        self.call(py, |volume| {
            volume.symlink(&src, &dst).map_err(|error| os_error2(error, &src, &dst))
        })
    }

    /// os.readlink: the target of the symlink at `path`, as a str
    /// (undecodable bytes as os.fsdecode leaves them).
    fn readlink(&self, py: Python<'_>, path: String) -> PyResult<OsString> {
        self.call(py, |volume| {
            volume
                .read_link(&path)
                .map(PathBuf::into_os_string)
                .map_err(|error| os_error(error, Some(&path)))
        })
    }

    /// os.chmod: sets the permission bits (`mode & 0o7777`) of the node at
    /// `path`, following symlinks.
    fn chmod(&self, py: Python<'_>, path: String, mode: u32) -> PyResult<()> {
        self.call(py, |volume| {
            volume
                .set_permissions(&path, Permissions::from_mode(mode))
                .map_err(|error| os_error(error, Some(&path)))
        })
    }

    /// `cp --reflink=always`: creates `destination` (which must not exist)
    /// sharing all of `source`'s blocks; a later write to either copies
    /// only the blocks it touches.
    fn clone_file(&self, py: Python<'_>, source: String, destination: String) -> PyResult<()> {
        self.call(py, |volume| {
            volume.clone_file(&source, &destination).map_err(|error| os_error(error, Some(&source)))
        })
    }

    /// Clones the directory tree `source` to `destination` (which must not
    /// exist) as one instant of the volume: other threads' changes wait
    /// while it is made. Returns (files cloned, nodes skipped).
    fn clone_tree(
        &self,
        py: Python<'_>,
        source: String,
        destination: String,
    ) -> PyResult<(u64, u64)> {
        self.call(py, |volume| {
            volume.clone_tree(&source, &destination).map_err(|error| os_error(error, Some(&source)))
        })
    }

    /// os.path.exists.
    fn exists(&self, py: Python<'_>, path: String) -> PyResult<bool> {
        self.call(py, |volume| {
            volume.try_exists(&path).map_err(|error| os_error(error, Some(&path)))
        })
    }

    /// Writes everything back and closes the volume (again: nothing); waits
    /// for the calls other threads have in flight on it.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let volume = self.volume.write().unwrap_or_else(PoisonError::into_inner).take();
            match volume {
                Some(volume) => volume.close().map_err(|error| os_error(error, None)),
                None => Ok(()),
            }
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _type: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// Where each field of `os.stat_result` sits: found once, by building one
/// from the indexes, since the hidden fields after the ten visible ones
/// differ between platforms and versions (st_rdev, st_flags, st_birthtime,
/// ...).
struct StatLayout {
    /// `os.stat_result`, a struct sequence type.
    class: Py<PyType>,
    /// Index of st_atime, st_mtime and st_ctime as floats.
    float_times: [usize; 3],
    /// Index of st_atime_ns, st_mtime_ns and st_ctime_ns.
    nanos_times: [usize; 3],
    /// Index of st_blksize, st_blocks and st_rdev (None where absent).
    blksize: Option<usize>,
    blocks: Option<usize>,
    rdev: Option<usize>,
    /// The indexes of the fields this module has no value for (st_flags,
    /// st_birthtime, ...): None, as os.stat leaves what the platform lacks.
    others: Vec<usize>,
}

static STAT_LAYOUT: PyOnceLock<StatLayout> = PyOnceLock::new();

/// The visible fields: mode, ino, dev, nlink, uid, gid, size, and the
/// three times in whole seconds.
const STAT_VISIBLE_FIELDS: usize = 10;

impl StatLayout {
    fn find(py: Python<'_>) -> PyResult<Self> {
        let class = py.import("os")?.getattr("stat_result")?.cast_into::<PyType>()?;
        let fields: usize = class.getattr("n_fields")?.extract()?;
        let probe = class.call1((PyTuple::new(py, 0..fields)?,))?;
        let index = |name: &str| -> PyResult<Option<usize>> {
            match probe.getattr(name) {
                Ok(value) => value.extract().map(Some),
                Err(error) if error.is_instance_of::<PyAttributeError>(py) => Ok(None),
                Err(error) => Err(error),
            }
        };
        let required = |name: &str| -> PyResult<usize> {
            index(name)?.ok_or_else(|| PyAttributeError::new_err(format!("os.stat_result.{name}")))
        };
        let mut layout = Self {
            float_times: [required("st_atime")?, required("st_mtime")?, required("st_ctime")?],
            nanos_times: [
                required("st_atime_ns")?,
                required("st_mtime_ns")?,
                required("st_ctime_ns")?,
            ],
            blksize: index("st_blksize")?,
            blocks: index("st_blocks")?,
            rdev: index("st_rdev")?,
            class: class.unbind(),
            others: Vec::new(),
        };
        let mut known: Vec<usize> = (0..STAT_VISIBLE_FIELDS).collect();
        known.extend(layout.float_times.iter().chain(&layout.nanos_times));
        known.extend([layout.blksize, layout.blocks, layout.rdev].into_iter().flatten());
        layout.others = (0..fields).filter(|index| !known.contains(index)).collect();
        assert!(known.iter().all(|&index| index < fields), "os.stat_result's layout");
        Ok(layout)
    }
}

/// A timestamp in nanoseconds since the epoch, as a Python int (an i64
/// while it fits, as it does from 1678 to 2262).
fn nanos_since_epoch(py: Python<'_>, time: Timestamp) -> PyResult<Bound<'_, PyAny>> {
    let nanos = i128::from(time.secs) * 1_000_000_000 + i128::from(time.nanos);
    match i64::try_from(nanos) {
        Ok(nanos) => nanos.into_bound_py_any(py),
        Err(_) => nanos.into_bound_py_any(py),
    }
}

/// `metadata` as an `os.stat_result`, made as os.stat makes it: a new
/// struct sequence whose fields are set in place (no argument tuple, no
/// constructor call, no lookups by name).
fn stat_result<'py>(py: Python<'py>, metadata: &foliofs::Metadata) -> PyResult<Bound<'py, PyAny>> {
    let layout = STAT_LAYOUT.get_or_try_init(py, || StatLayout::find(py))?;
    // SAFETY: `class` is os.stat_result, a struct sequence type (checked by
    // the probe that found its layout); the new object, or the error, is
    // owned here.
    let result = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyStructSequence_New(layout.class.as_ptr().cast()),
        )?
    };
    let set = |index: usize, value: Bound<'py, PyAny>| {
        // SAFETY: `result` is a struct sequence of `n_fields` slots, all
        // below it set once each (the layout's indexes are distinct and
        // below n_fields); SetItem takes the reference `into_ptr` gives up.
        // A slot left empty by an early error is NULL, which the struct
        // sequence's deallocation skips.
        unsafe {
            pyo3::ffi::PyStructSequence_SetItem(
                result.as_ptr(),
                index as pyo3::ffi::Py_ssize_t,
                value.into_ptr(),
            )
        }
    };
    let attr = metadata.attr();
    let times = [attr.atime, attr.mtime, attr.ctime];
    set(0, u64::from(metadata.mode()).into_bound_py_any(py)?);
    set(1, metadata.ino().into_bound_py_any(py)?);
    set(2, 0u64.into_bound_py_any(py)?);
    set(3, metadata.nlink().into_bound_py_any(py)?);
    set(4, metadata.uid().into_bound_py_any(py)?);
    set(5, metadata.gid().into_bound_py_any(py)?);
    set(6, metadata.len().into_bound_py_any(py)?);
    for (index, time) in (7..STAT_VISIBLE_FIELDS).zip(times) {
        set(index, time.secs.into_bound_py_any(py)?);
    }
    for (&index, time) in layout.float_times.iter().zip(times) {
        let seconds = time.secs as f64 + f64::from(time.nanos) * 1e-9;
        set(index, seconds.into_bound_py_any(py)?);
    }
    for (&index, time) in layout.nanos_times.iter().zip(times) {
        set(index, nanos_since_epoch(py, time)?);
    }
    if let Some(index) = layout.blksize {
        set(index, metadata.blksize().into_bound_py_any(py)?);
    }
    if let Some(index) = layout.blocks {
        set(index, metadata.blocks().into_bound_py_any(py)?);
    }
    if let Some(index) = layout.rdev {
        set(index, attr.rdev.into_bound_py_any(py)?);
    }
    for &index in &layout.others {
        set(index, py.None().into_bound(py));
    }
    Ok(result)
}

/// An open file, as Python's binary file objects.
#[pyclass(module = "foliofs")]
struct File {
    /// Locked by each call, without the GIL: calls from several threads are
    /// serialized (a file has one position), a second one waits.
    file: Mutex<Option<foliofs::File>>,
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    mode: String,
}

impl File {
    /// Runs `call` on the open file with the GIL released.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        call: impl Send + FnOnce(&mut foliofs::File) -> PyResult<T>,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
            call(file.as_mut().ok_or_else(closed)?)
        })
    }
}

impl Drop for File {
    /// An unclosed file is closed here: without the GIL where the
    /// interpreter still runs.
    fn drop(&mut self) {
        let file = self.file.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(file) = file {
            Python::try_attach(|py| py.detach(move || drop(file)));
        }
    }
}

/// A copy of bytes-like `data` (bytes, bytearray, memoryview, array, ...),
/// to use without the GIL.
fn bytes_like(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    if let Ok(array) = data.cast::<PyByteArray>() {
        return Ok(array.to_vec());
    }
    // Whatever else has the buffer protocol (memoryview raises TypeError,
    // "a bytes-like object is required", for what has not).
    let view = data.py().import("builtins")?.getattr("memoryview")?.call1((data,))?;
    Ok(view.call_method0("tobytes")?.cast::<PyBytes>()?.as_bytes().to_vec())
}

#[pymethods]
impl File {
    /// Reads up to `size` bytes (all to the end of file when negative).
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.call(py, |file| {
            let mut data = Vec::new();
            match usize::try_from(size) {
                Ok(size) => {
                    data.resize(size, 0);
                    let mut filled = 0;
                    while filled < size {
                        match file.read(&mut data[filled..]).map_err(io_error)? {
                            0 => break,
                            read => filled += read,
                        }
                    }
                    data.truncate(filled);
                }
                Err(_) => {
                    file.read_to_end(&mut data).map_err(io_error)?;
                }
            }
            Ok(data)
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Writes all of `data` (bytes-like); returns its length in bytes.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let data = bytes_like(data)?;
        self.call(py, |file| file.write_all(&data).map_err(io_error))?;
        Ok(data.len())
    }

    /// Moves the position: `whence` 0 from the start, 1 from here, 2 from
    /// the end. Returns the new position.
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let position =
            match whence {
                0 => SeekFrom::Start(u64::try_from(offset).map_err(|_| {
                    PyValueError::new_err(format!("negative seek position {offset}"))
                })?),
                1 => SeekFrom::Current(offset),
                2 => SeekFrom::End(offset),
                _ => return Err(PyValueError::new_err(format!("invalid whence ({whence})"))),
            };
        self.call(py, |file| file.seek(position).map_err(io_error))
    }

    /// The current position.
    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        self.call(py, |file| file.stream_position().map_err(io_error))
    }

    /// Truncates or extends to `size` (default: the current position).
    #[pyo3(signature = (size=None))]
    fn truncate(&self, py: Python<'_>, size: Option<u64>) -> PyResult<u64> {
        self.call(py, |file| {
            let size = match size {
                Some(size) => size,
                None => file.stream_position().map_err(io_error)?,
            };
            file.set_len(size).map_err(|error| os_error(error, None))?;
            Ok(size)
        })
    }

    /// Nothing is buffered in the object; see `fsync` for durability.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, |_| Ok(()))
    }

    /// Makes the data and metadata durable (os.fsync).
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, |file| file.sync_all().map_err(|error| os_error(error, None)))
    }

    /// os.fstat.
    fn stat<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let metadata =
            self.call(py, |file| file.metadata().map_err(|error| os_error(error, None)))?;
        stat_result(py, &metadata)
    }

    /// Whether reads are allowed.
    fn readable(&self, py: Python<'_>) -> PyResult<bool> {
        self.call(py, |file| Ok(file.flags().read))
    }

    /// Whether writes are allowed.
    fn writable(&self, py: Python<'_>) -> PyResult<bool> {
        self.call(py, |file| Ok(file.flags().write))
    }

    /// Always true.
    fn seekable(&self, py: Python<'_>) -> PyResult<bool> {
        self.call(py, |_| Ok(true))
    }

    /// Whether the file is closed.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.file.lock().unwrap_or_else(PoisonError::into_inner).is_none())
    }

    /// Closes the file (again: nothing).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let file = self.file.lock().unwrap_or_else(PoisonError::into_inner).take();
            match file {
                Some(file) => file.close().map_err(|error| os_error(error, None)),
                None => Ok(()),
            }
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _type: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// The module: `mkfs`, `Volume` and `File`.
#[pymodule]
#[pyo3(name = "foliofs")]
fn foliofs_module(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(mkfs, module)?)?;
    module.add_class::<Volume>()?;
    module.add_class::<File>()?;
    Ok(())
}
