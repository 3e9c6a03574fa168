//! TEMPORARY
pub(crate) use super::file::FileDev as ThreadsDev;
