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
//! ```
//!
//! Files behave as Python's binary file objects (read, write, seek, tell,
//! truncate, flush, close, context managers, iteration by line is not
//! offered); `stat` returns `os.stat_result`; errors are `OSError` with the
//! errno (so `FileNotFoundError`, `FileExistsError`, ... as `open` raises).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use foliofs::{Error, MkfsOptions, OpenOptions, Volume as CoreVolume, VolumeOptions};

/// OSError(errno, message, filename): Python picks the subclass by errno.
fn os_error(error: Error, filename: Option<&str>) -> PyErr {
    match filename {
        Some(name) => PyOSError::new_err((error.errno(), error.to_string(), name.to_owned())),
        None => PyOSError::new_err((error.errno(), error.to_string())),
    }
}

fn io_error(error: std::io::Error) -> PyErr {
    os_error(Error::from(error), None)
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O operation on closed file")
}

/// Formats `image` (created or overwritten) as a volume of `size_bytes`.
#[pyfunction]
#[pyo3(signature = (image, size_bytes, block_size=4096))]
fn mkfs(image: PathBuf, size_bytes: u64, block_size: u32) -> PyResult<()> {
    let mkfs = MkfsOptions { block_bytes: block_size, ..MkfsOptions::default() };
    CoreVolume::mkfs_path(&image, Some(size_bytes), &mkfs, &VolumeOptions::default())
        .map(drop)
        .map_err(|error| os_error(error, image.to_str()))
}

/// An open volume; a context manager that closes it.
#[pyclass(module = "foliofs")]
struct Volume {
    volume: Option<CoreVolume>,
}

impl Volume {
    fn get(&self) -> PyResult<&CoreVolume> {
        self.volume.as_ref().ok_or_else(|| PyValueError::new_err("the volume is closed"))
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
    /// Opens the volume in `image`.
    #[new]
    fn new(image: PathBuf) -> PyResult<Self> {
        let volume = CoreVolume::open(&image, &VolumeOptions::default())
            .map_err(|error| os_error(error, image.to_str()))?;
        Ok(Self { volume: Some(volume) })
    }

    /// Opens the file at `path` with open()'s `mode` (binary only).
    #[pyo3(signature = (path, mode="rb"))]
    fn open(&self, path: &str, mode: &str) -> PyResult<File> {
        let options = parse_mode(mode)?;
        let file = options.open(self.get()?, path).map_err(|error| os_error(error, Some(path)))?;
        Ok(File { file: Some(file), name: path.to_owned(), mode: mode.to_owned() })
    }

    /// os.stat: an os.stat_result (symlinks followed).
    fn stat<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
        let metadata = self.get()?.metadata(path).map_err(|error| os_error(error, Some(path)))?;
        stat_result(py, &metadata)
    }

    /// os.mkdir.
    fn mkdir(&self, path: &str) -> PyResult<()> {
        self.get()?.create_dir(path).map_err(|error| os_error(error, Some(path)))
    }

    /// os.makedirs.
    #[pyo3(signature = (path, exist_ok=false))]
    fn makedirs(&self, path: &str, exist_ok: bool) -> PyResult<()> {
        let volume = self.get()?;
        if !exist_ok && volume.try_exists(path).map_err(|error| os_error(error, Some(path)))? {
            return Err(os_error(Error::Exists(path.to_owned()), Some(path)));
        }
        volume.create_dir_all(path).map_err(|error| os_error(error, Some(path)))
    }

    /// os.listdir: the names in directory `path`, sorted.
    #[pyo3(signature = (path="/"))]
    fn listdir(&self, path: &str) -> PyResult<Vec<String>> {
        let entries = self.get()?.read_dir(path).map_err(|error| os_error(error, Some(path)))?;
        let mut names: Vec<String> = entries
            .map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned()))
            .collect::<foliofs::Result<_>>()
            .map_err(|error| os_error(error, Some(path)))?;
        names.sort();
        Ok(names)
    }

    /// os.remove.
    fn remove(&self, path: &str) -> PyResult<()> {
        self.get()?.remove_file(path).map_err(|error| os_error(error, Some(path)))
    }

    /// os.rmdir.
    fn rmdir(&self, path: &str) -> PyResult<()> {
        self.get()?.remove_dir(path).map_err(|error| os_error(error, Some(path)))
    }

    /// os.rename (replaces what is at `destination`).
    fn rename(&self, source: &str, destination: &str) -> PyResult<()> {
        self.get()?.rename_path(source, destination).map_err(|error| os_error(error, Some(source)))
    }

    /// os.path.exists.
    fn exists(&self, path: &str) -> PyResult<bool> {
        self.get()?.try_exists(path).map_err(|error| os_error(error, Some(path)))
    }

    /// Writes everything back and closes the volume (again: nothing).
    fn close(&mut self) -> PyResult<()> {
        match self.volume.take() {
            Some(volume) => volume.close().map_err(|error| os_error(error, None)),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &mut self,
        _type: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }
}

fn stat_result<'py>(py: Python<'py>, metadata: &foliofs::Metadata) -> PyResult<Bound<'py, PyAny>> {
    let seconds = |time: std::time::SystemTime| {
        time.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64())
    };
    let nanos = |time: std::time::SystemTime| {
        time.duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos())
    };
    let (atime, mtime, ctime) = (metadata.accessed(), metadata.modified(), metadata.changed());
    // os.stat_result((mode, ino, dev, nlink, uid, gid, size, atime, mtime,
    // ctime), {extra fields by name}).
    let fields = (
        metadata.mode(),
        metadata.ino(),
        0u64,
        metadata.nlink(),
        metadata.uid(),
        metadata.gid(),
        metadata.len(),
        seconds(atime) as i64,
        seconds(mtime) as i64,
        seconds(ctime) as i64,
    );
    let extra = pyo3::types::PyDict::new(py);
    extra.set_item("st_atime", seconds(atime))?;
    extra.set_item("st_mtime", seconds(mtime))?;
    extra.set_item("st_ctime", seconds(ctime))?;
    extra.set_item("st_atime_ns", nanos(atime))?;
    extra.set_item("st_mtime_ns", nanos(mtime))?;
    extra.set_item("st_ctime_ns", nanos(ctime))?;
    extra.set_item("st_blocks", metadata.blocks())?;
    extra.set_item("st_blksize", metadata.blksize())?;
    py.import("os")?.getattr("stat_result")?.call1((fields, extra))
}

/// An open file, as Python's binary file objects.
#[pyclass(module = "foliofs")]
struct File {
    file: Option<foliofs::File>,
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    mode: String,
}

impl File {
    fn get(&mut self) -> PyResult<&mut foliofs::File> {
        self.file.as_mut().ok_or_else(closed)
    }
}

#[pymethods]
impl File {
    /// Reads up to `size` bytes (all to the end of file when negative).
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&mut self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        let file = self.get()?;
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
        Ok(PyBytes::new(py, &data))
    }

    /// Writes all of `data`; returns its length.
    fn write(&mut self, data: &[u8]) -> PyResult<usize> {
        self.get()?.write_all(data).map_err(io_error)?;
        Ok(data.len())
    }

    /// Moves the position: `whence` 0 from the start, 1 from here, 2 from
    /// the end. Returns the new position.
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&mut self, offset: i64, whence: i32) -> PyResult<u64> {
        let position =
            match whence {
                0 => SeekFrom::Start(u64::try_from(offset).map_err(|_| {
                    PyValueError::new_err(format!("negative seek position {offset}"))
                })?),
                1 => SeekFrom::Current(offset),
                2 => SeekFrom::End(offset),
                _ => return Err(PyValueError::new_err(format!("invalid whence ({whence})"))),
            };
        self.get()?.seek(position).map_err(io_error)
    }

    /// The current position.
    fn tell(&mut self) -> PyResult<u64> {
        self.get()?.stream_position().map_err(io_error)
    }

    /// Truncates or extends to `size` (default: the current position).
    #[pyo3(signature = (size=None))]
    fn truncate(&mut self, size: Option<u64>) -> PyResult<u64> {
        let file = self.get()?;
        let size = match size {
            Some(size) => size,
            None => file.stream_position().map_err(io_error)?,
        };
        file.set_len(size).map_err(|error| os_error(error, None))?;
        Ok(size)
    }

    /// Nothing is buffered in the object; see `fsync` for durability.
    fn flush(&mut self) -> PyResult<()> {
        self.get().map(drop)
    }

    /// Makes the data and metadata durable (os.fsync).
    fn fsync(&mut self) -> PyResult<()> {
        self.get()?.sync_all().map_err(|error| os_error(error, None))
    }

    /// os.fstat.
    fn stat<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let metadata = self.get()?.metadata().map_err(|error| os_error(error, None))?;
        stat_result(py, &metadata)
    }

    /// Whether reads are allowed.
    fn readable(&mut self) -> PyResult<bool> {
        Ok(self.get()?.flags().read)
    }

    /// Whether writes are allowed.
    fn writable(&mut self) -> PyResult<bool> {
        Ok(self.get()?.flags().write)
    }

    /// Always true.
    fn seekable(&mut self) -> PyResult<bool> {
        self.get().map(|_| true)
    }

    /// Whether the file is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.file.is_none()
    }

    /// Closes the file (again: nothing).
    fn close(&mut self) -> PyResult<()> {
        match self.file.take() {
            Some(file) => file.close().map_err(|error| os_error(error, None)),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &mut self,
        _type: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close()?;
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
