//! The library's error type. Every variant maps to one errno (the FUSE
//! adapter returns it as is) and carries enough words to say what was wrong.

use std::io;

use crate::format::FormatError;

/// The library's result: [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, as one POSIX errno ([`Error::errno`]) with a message
/// naming the file or value involved. Converts into [`std::io::Error`] with
/// the matching [`std::io::ErrorKind`], so `?` works in functions returning
/// `io::Result`.
///
/// ```
/// # fn main() -> foliofs::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let image = dir.path().join("vol.img");
/// # foliofs::Volume::mkfs_path(&image, Some(64 << 20), &Default::default(), &Default::default())?;
/// # let volume = foliofs::Volume::open(&image, &Default::default())?;
/// let missing = volume.metadata("/no/such/file").unwrap_err();
/// assert_eq!(missing.errno(), libc::ENOENT);
/// assert_eq!(std::io::Error::from(missing).kind(), std::io::ErrorKind::NotFound);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// ENOENT.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// EEXIST.
    #[error("{0}: file exists")]
    Exists(String),
    /// ENOTDIR.
    #[error("{0}: not a directory")]
    NotDir(String),
    /// EISDIR.
    #[error("{0}: is a directory")]
    IsDir(String),
    /// ENOTEMPTY.
    #[error("{0}: directory not empty")]
    NotEmpty(String),
    /// ENAMETOOLONG.
    #[error("{0}: name too long (at most 255 bytes)")]
    NameTooLong(String),
    /// ENOSPC: out of data blocks or metadata room.
    #[error("no space left on the volume: {0}")]
    NoSpace(String),
    /// EINVAL.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// EPERM: only the owner or a privileged caller may do this.
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    /// EACCES: the permission bits refuse the caller.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// EFBIG.
    #[error("{0}: file too large")]
    FileTooLarge(String),
    /// EBADF: the handle is not open for this (reading, writing).
    #[error("bad file handle: {0}")]
    BadHandle(String),
    /// EROFS: mounted read-only, or gone read-only after a failed write.
    #[error("the volume is read-only: {0}")]
    ReadOnly(String),
    /// EUCLEAN: the volume's metadata is damaged.
    #[error("corrupt volume: {0}")]
    Corrupt(String),
    /// ENXIO: seeking data or a hole past the end of file.
    #[error("{0}: past the end of file")]
    PastEnd(String),
    /// EOPNOTSUPP.
    #[error("operation not supported: {0}")]
    Unsupported(String),
    /// ENODATA: no such extended attribute.
    #[error("{0}: no such attribute")]
    NoAttribute(String),
    /// ERANGE.
    #[error("{0}: out of range")]
    OutOfRange(String),
    /// E2BIG.
    #[error("{0}: argument too big")]
    TooBig(String),
    /// EXDEV: an operation between two volumes that works only within one
    /// (a clone, a rename).
    #[error("{0}: not on the same volume")]
    CrossDevice(String),
    /// ELOOP: too many symbolic links while resolving a path.
    #[error("{0}: too many levels of symbolic links")]
    Loop(String),
    /// EIO: the volume was shut down (`Volume::shutdown`); only
    /// closing it is left, and opening it again recovers what was durable.
    #[error("the volume was shut down (unmount it and mount it again to recover)")]
    ShutDown,
    /// An I/O error from the device or the host, with what was being done.
    /// Its message includes the cause's, so `source()` does not return the
    /// cause again (a printed chain would say it twice); [`Error::io_error`]
    /// returns it.
    #[error("{context}: {cause}")]
    Io {
        /// What was being done.
        context: String,
        /// The host's error.
        cause: io::Error,
    },
}

impl Error {
    /// The errno a POSIX caller should see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound(_) => libc::ENOENT,
            Error::Exists(_) => libc::EEXIST,
            Error::NotDir(_) => libc::ENOTDIR,
            Error::IsDir(_) => libc::EISDIR,
            Error::NotEmpty(_) => libc::ENOTEMPTY,
            Error::NameTooLong(_) => libc::ENAMETOOLONG,
            Error::NoSpace(_) => libc::ENOSPC,
            Error::Invalid(_) => libc::EINVAL,
            Error::NotPermitted(_) => libc::EPERM,
            Error::PermissionDenied(_) => libc::EACCES,
            Error::Loop(_) => libc::ELOOP,
            Error::CrossDevice(_) => libc::EXDEV,
            Error::FileTooLarge(_) => libc::EFBIG,
            Error::BadHandle(_) => libc::EBADF,
            Error::ReadOnly(_) => libc::EROFS,
            Error::Corrupt(_) => libc::EUCLEAN,
            Error::PastEnd(_) => libc::ENXIO,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::NoAttribute(_) => libc::ENODATA,
            Error::OutOfRange(_) => libc::ERANGE,
            Error::TooBig(_) => libc::E2BIG,
            Error::ShutDown => libc::EIO,
            // "In use" errors made here (an image locked by another
            // process, a device claimed by another program) carry no errno.
            Error::Io { cause, .. } => cause.raw_os_error().unwrap_or(match cause.kind() {
                io::ErrorKind::ResourceBusy => libc::EBUSY,
                _ => libc::EIO,
            }),
        }
    }

    /// An [`Error::Io`]: `cause` while doing `context`.
    pub fn io(context: impl Into<String>, cause: io::Error) -> Self {
        Error::Io { context: context.into(), cause }
    }

    /// The host's I/O error behind an [`Error::Io`].
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            Error::Io { cause, .. } => Some(cause),
            _ => None,
        }
    }

    /// An [`Error::Invalid`] (EINVAL).
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid(message.into())
    }
}

impl From<FormatError> for Error {
    fn from(error: FormatError) -> Self {
        Error::Corrupt(error.to_string())
    }
}

impl From<Error> for io::Error {
    fn from(error: Error) -> Self {
        let errno = error.errno();
        io::Error::new(io::Error::from_raw_os_error(errno).kind(), error)
    }
}

/// So `?` takes `std::io` results (from `std::io::Read` on a `File`) in
/// functions returning this crate's [`Result`]: an error that began as one
/// of ours comes back as it was, with its errno; any other becomes
/// [`Error::Io`].
impl From<io::Error> for Error {
    fn from(error: io::Error) -> Self {
        match error.downcast::<Error>() {
            Ok(ours) => ours,
            Err(error) => Error::io("I/O", error),
        }
    }
}

/// Attaches a context to I/O results.
#[doc(hidden)]
pub trait IoContext<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::io(context(), source))
    }
}
