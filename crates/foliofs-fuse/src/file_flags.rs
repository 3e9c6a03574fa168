//! chattr / lsattr through FUSE: the kernel turns FS_IOC_GETFLAGS and
//! FS_IOC_SETFLAGS (and xfs_io's FS_IOC_FSGETXATTR / FSSETXATTR) on a file
//! or directory into FUSE_IOCTL requests of its own (fs/fuse/ioctl.c,
//! `fuse_fileattr_get` / `_set`), on a handle it opens read-only for them.
//! This module decodes those four and encodes the answers; the volume keeps
//! and enforces the flags (`Volume::flags`, `Volume::set_flags`).

use foliofs::format::{
    INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE, INODE_FLAG_NOATIME, INODE_FLAG_NODUMP,
};

/// _IOR('f', 1, long) and _IOW('f', 2, long); the kernel passes 4 bytes.
pub(crate) const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
pub(crate) const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// _IOR('X', 31, struct fsxattr) and _IOW('X', 32, struct fsxattr).
pub(crate) const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
pub(crate) const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

/// struct fsxattr: xflags, extsize, nextents, projid, cowextsize, 8 pad.
const FSXATTR_BYTES: usize = 28;

/// FS_XFLAG_* for each inode flag (the FS_*_FL values the volume keeps).
const XFLAGS: [(u32, u32); 4] = [
    (INODE_FLAG_IMMUTABLE, 0x08),
    (INODE_FLAG_APPEND, 0x10),
    (INODE_FLAG_NOATIME, 0x40),
    (INODE_FLAG_NODUMP, 0x80),
];

/// The request, decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FlagsRequest {
    Get { as_fsxattr: bool },
    Set { flags: u32 },
}

/// Decodes a FUSE_IOCTL; `Err` is the errno: ENOTTY for commands that are
/// not these four, EINVAL for a short argument, EOPNOTSUPP for XFS-only
/// settings (extent size hints, project ids, flags with no FS_*_FL twin).
pub(crate) fn decode(cmd: u32, in_data: &[u8]) -> Result<FlagsRequest, i32> {
    let u32_at = |offset: usize| -> Result<u32, i32> {
        let bytes = in_data.get(offset..offset + 4).ok_or(libc::EINVAL)?;
        Ok(u32::from_ne_bytes(bytes.try_into().expect("4 bytes")))
    };
    match cmd {
        FS_IOC_GETFLAGS => Ok(FlagsRequest::Get { as_fsxattr: false }),
        FS_IOC_FSGETXATTR => Ok(FlagsRequest::Get { as_fsxattr: true }),
        FS_IOC_SETFLAGS => Ok(FlagsRequest::Set { flags: u32_at(0)? }),
        FS_IOC_FSSETXATTR => {
            if in_data.len() < FSXATTR_BYTES {
                return Err(libc::EINVAL);
            }
            let xflags = u32_at(0)?;
            let (extsize, projid, cowextsize) = (u32_at(4)?, u32_at(12)?, u32_at(16)?);
            let known: u32 = XFLAGS.iter().map(|&(_, xflag)| xflag).sum();
            if xflags & !known != 0 || extsize != 0 || projid != 0 || cowextsize != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            let flags = XFLAGS
                .iter()
                .filter(|&&(_, xflag)| xflags & xflag != 0)
                .map(|&(flag, _)| flag)
                .sum();
            Ok(FlagsRequest::Set { flags })
        }
        _ => Err(libc::ENOTTY),
    }
}

/// The reply's data for a get: the flags as 4 bytes, or a struct fsxattr.
pub(crate) fn encode(flags: u32, as_fsxattr: bool) -> Vec<u8> {
    if !as_fsxattr {
        return flags.to_ne_bytes().to_vec();
    }
    let xflags: u32 =
        XFLAGS.iter().filter(|&&(flag, _)| flags & flag != 0).map(|&(_, xflag)| xflag).sum();
    let mut fsxattr = vec![0; FSXATTR_BYTES];
    fsxattr[..4].copy_from_slice(&xflags.to_ne_bytes());
    fsxattr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_fsxattr_round_trip() {
        let both = INODE_FLAG_IMMUTABLE | INODE_FLAG_NODUMP;
        assert_eq!(
            decode(FS_IOC_SETFLAGS, &both.to_ne_bytes()),
            Ok(FlagsRequest::Set { flags: both })
        );
        let fsxattr = encode(both, true);
        assert_eq!(fsxattr.len(), FSXATTR_BYTES);
        assert_eq!(u32::from_ne_bytes(fsxattr[..4].try_into().unwrap()), 0x08 | 0x80);
        assert_eq!(decode(FS_IOC_FSSETXATTR, &fsxattr), Ok(FlagsRequest::Set { flags: both }));
        assert_eq!(encode(both, false), both.to_ne_bytes());
        assert_eq!(decode(FS_IOC_GETFLAGS, &[]), Ok(FlagsRequest::Get { as_fsxattr: false }));
    }

    #[test]
    fn other_commands_and_xfs_only_settings_are_refused() {
        assert_eq!(decode(0x5401, &[]), Err(libc::ENOTTY));
        assert_eq!(decode(FS_IOC_SETFLAGS, &[1, 2]), Err(libc::EINVAL));
        let mut projid = vec![0; FSXATTR_BYTES];
        projid[12] = 7;
        assert_eq!(decode(FS_IOC_FSSETXATTR, &projid), Err(libc::EOPNOTSUPP));
        let mut realtime = vec![0; FSXATTR_BYTES];
        realtime[0] = 0x01;
        assert_eq!(decode(FS_IOC_FSSETXATTR, &realtime), Err(libc::EOPNOTSUPP));
    }
}
