//! Library values in the kernel's shapes: attributes, file types, errnos.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use foliofs::{Attr, InodeKind, Timestamp};
use fuser::{Errno, FileAttr, FileType, INodeNo};

pub(crate) fn file_type(kind: InodeKind) -> FileType {
    match kind {
        InodeKind::File => FileType::RegularFile,
        InodeKind::Dir => FileType::Directory,
        InodeKind::Symlink => FileType::Symlink,
        InodeKind::Fifo => FileType::NamedPipe,
        InodeKind::Socket => FileType::Socket,
        InodeKind::CharDevice => FileType::CharDevice,
        InodeKind::BlockDevice => FileType::BlockDevice,
    }
}

pub(crate) fn system_time(time: Timestamp) -> SystemTime {
    // secs is rounded toward minus infinity and nanos is added to it.
    let whole = Duration::from_secs(time.secs.unsigned_abs());
    let base = if time.secs >= 0 { UNIX_EPOCH + whole } else { UNIX_EPOCH - whole };
    base + Duration::from_nanos(u64::from(time.nanos))
}

pub(crate) fn timestamp(time: SystemTime) -> Timestamp {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => Timestamp { secs: after.as_secs() as i64, nanos: after.subsec_nanos() },
        Err(before) => {
            let before = before.duration();
            // Round toward minus infinity so nanos stays in 0..1e9.
            match before.subsec_nanos() {
                0 => Timestamp { secs: -(before.as_secs() as i64), nanos: 0 },
                nanos => {
                    Timestamp { secs: -(before.as_secs() as i64) - 1, nanos: 1_000_000_000 - nanos }
                }
            }
        }
    }
}

pub(crate) fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks_512,
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.ctime),
        kind: file_type(attr.kind),
        perm: (attr.mode & 0o7777) as u16,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.block_bytes,
        flags: 0,
    }
}

pub(crate) fn errno(error: &foliofs::Error) -> Errno {
    Errno::from_i32(error.errno())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_survive_the_round_trip_on_both_sides_of_the_epoch() {
        for time in [
            Timestamp { secs: 1_700_000_000, nanos: 123_456_789 },
            Timestamp { secs: 0, nanos: 0 },
            Timestamp { secs: -1, nanos: 500_000_000 },
            Timestamp { secs: -86_400, nanos: 0 },
        ] {
            assert_eq!(timestamp(system_time(time)), time);
        }
    }
}
