//! The library's error type. Every variant maps to one errno (the FUSE
//! adapter returns it as is) and carries enough words to say what was wrong.

use std::io;

use crate::format::FormatError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: file exists")]
    Exists(String),
    #[error("{0}: not a directory")]
    NotDir(String),
    #[error("{0}: is a directory")]
    IsDir(String),
    #[error("{0}: directory not empty")]
    NotEmpty(String),
    #[error("{0}: name too long (at most 255 bytes)")]
    NameTooLong(String),
    #[error("no space left on the volume: {0}")]
    NoSpace(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("{0}: file too large")]
    FileTooLarge(String),
    #[error("bad file handle: {0}")]
    BadHandle(String),
    #[error("the volume is read-only: {0}")]
    ReadOnly(String),
    #[error("corrupt volume: {0}")]
    Corrupt(String),
    #[error("{0}: past the end of file")]
    PastEnd(String),
    #[error("operation not supported: {0}")]
    Unsupported(String),
    #[error("{0}: no such attribute")]
    NoAttribute(String),
    #[error("{0}: out of range")]
    OutOfRange(String),
    #[error("{0}: argument too big")]
    TooBig(String),
    /// An I/O error from the device or the host, with what was being done.
    /// Its message includes the cause's, so `source()` does not return the
    /// cause again (a printed chain would say it twice); [`Error::io_error`]
    /// returns it.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
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
            Error::FileTooLarge(_) => libc::EFBIG,
            Error::BadHandle(_) => libc::EBADF,
            Error::ReadOnly(_) => libc::EROFS,
            Error::Corrupt(_) => libc::EUCLEAN,
            Error::PastEnd(_) => libc::ENXIO,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::NoAttribute(_) => libc::ENODATA,
            Error::OutOfRange(_) => libc::ERANGE,
            Error::TooBig(_) => libc::E2BIG,
            Error::Io { cause, .. } => cause.raw_os_error().unwrap_or(libc::EIO),
        }
    }

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

/// Attaches a context to I/O results.
pub trait IoContext<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::io(context(), source))
    }
}
