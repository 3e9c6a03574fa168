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
    // secs is rounded toward minus infinity and nanos is added to it; what
    // the platform cannot represent saturates rather than panics.
    let whole = Duration::from_secs(time.secs.unsigned_abs());
    let base =
        if time.secs >= 0 { UNIX_EPOCH.checked_add(whole) } else { UNIX_EPOCH.checked_sub(whole) };
    let Some(base) = base else { return UNIX_EPOCH };
    base.checked_add(Duration::from_nanos(u64::from(time.nanos))).unwrap_or(base)
}

pub(crate) fn timestamp(time: SystemTime) -> Timestamp {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => match i64::try_from(after.as_secs()) {
            Ok(secs) => Timestamp { secs, nanos: after.subsec_nanos() },
            Err(_) => Timestamp { secs: i64::MAX, nanos: 999_999_999 },
        },
        Err(before) => {
            let before = before.duration();
            // Round toward minus infinity so nanos stays in 0..1e9; a time
            // before i64::MIN seconds saturates (it panicked on overflow).
            let Some(secs) = i64::try_from(before.as_secs()).ok().map(|secs| -secs) else {
                return Timestamp { secs: i64::MIN, nanos: 0 };
            };
            match (before.subsec_nanos(), secs.checked_sub(1)) {
                (0, _) => Timestamp { secs, nanos: 0 },
                (nanos, Some(below)) => Timestamp { secs: below, nanos: 1_000_000_000 - nanos },
                (_, None) => Timestamp { secs: i64::MIN, nanos: 0 },
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
            // The extremes a SETATTR may carry (xfstests generic/402): they
            // overflowed the conversion, which panicked the serving thread.
            Timestamp { secs: i64::MIN, nanos: 0 },
            Timestamp { secs: i64::MAX, nanos: 999_999_999 },
        ] {
            assert_eq!(timestamp(system_time(time)), time);
        }
    }
}
