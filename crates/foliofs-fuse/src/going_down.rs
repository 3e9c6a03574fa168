//! Shutdown through the mount: FS_IOC_SHUTDOWN (XFS_IOC_GOINGDOWN, the
//! same number as EXT4_IOC_SHUTDOWN), which xfstests' `godown` and
//! `xfs_io -c shutdown` send to the mount's root directory.
//!
//! Whatever the flag, the mount shuts down as `ShutdownMode::Sync`: the
//! kernel's FUSE sends no SYNCFS to a /dev/fuse daemon (only virtiofs gets
//! it), so a syncfs(2) on the mount returns without the daemon knowing, and
//! only a full flush keeps the promise it made. Everything up to the last
//! syncfs durable is what LOGFLUSH and NOLOGFLUSH guarantee too; keeping
//! more is one of the outcomes a crash may have. The library's
//! `Volume::shutdown` honours each mode (its caller's syncs are its own).
//!
//! The flag is still read, to refuse an invalid one as XFS does: the
//! command is `_IOR('X', 125, __u32)`, for which the kernel copies nothing
//! in for a FUSE file system (it would copy 4 bytes *out*), so the flags
//! word reaches the daemon only as its address in the caller. The daemon
//! reads it from `/proc/PID/mem`, which a daemon running as root (as
//! mount(8) starts one) may; where it may not, it goes on unchecked.

use std::os::unix::fs::FileExt;

use foliofs::ShutdownMode;

/// _IOR('X', 125, __u32).
pub(crate) const FS_IOC_SHUTDOWN: u32 = 0x8004_587d;

/// The mode the caller asked for (None where its memory cannot be read),
/// or the errno: EINVAL for a flags word that is none of the three.
pub(crate) fn requested_mode(
    caller_pid: u32,
    flags_address: u64,
) -> Result<Option<ShutdownMode>, i32> {
    let Some(flags) = read_caller_word(caller_pid, flags_address) else {
        return Ok(None);
    };
    ShutdownMode::from_going_down_flags(flags).map(Some).ok_or(libc::EINVAL)
}

fn read_caller_word(pid: u32, address: u64) -> Option<u32> {
    let memory = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut word = [0; 4];
    memory.read_exact_at(&mut word, address).ok()?;
    Some(u32::from_ne_bytes(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_word_is_read_from_the_callers_memory() {
        for (flags, mode) in
            [(0, ShutdownMode::Sync), (1, ShutdownMode::FlushLog), (2, ShutdownMode::Immediate)]
        {
            let word: u32 = std::hint::black_box(flags);
            let address = &word as *const u32 as u64;
            assert_eq!(requested_mode(std::process::id(), address), Ok(Some(mode)));
        }
        let bad: u32 = std::hint::black_box(7);
        assert_eq!(
            requested_mode(std::process::id(), &bad as *const u32 as u64),
            Err(libc::EINVAL)
        );
        // An address the caller has not mapped.
        assert_eq!(requested_mode(std::process::id(), 0), Ok(None));
    }
}
