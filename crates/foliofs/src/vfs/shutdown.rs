//! Shutdown (XFS_IOC_GOINGDOWN, EXT4_IOC_SHUTDOWN): the volume stops where
//! it stands, as if the machine had, after flushing as much as the caller
//! asked. Every later operation fails EIO and nothing more reaches the
//! device; opening the volume again recovers from the journal what was
//! durable. Crash tests and programs that must stop a damaged volume at
//! once use it.

use crate::error::Result;

use super::volume::Volume;

/// What reaches the device before a shutdown stops it: the flags of
/// XFS_IOC_GOINGDOWN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// XFS_FSOP_GOING_FLAGS_DEFAULT: everything, as syncfs (cached data
    /// written back, the journal committed, the device flushed).
    Sync,
    /// XFS_FSOP_GOING_FLAGS_LOGFLUSH: the journal's records committed;
    /// cached data not yet written back is lost.
    FlushLog,
    /// XFS_FSOP_GOING_FLAGS_NOLOGFLUSH: nothing; what was not durable
    /// already is lost, as in a crash.
    Immediate,
}

impl ShutdownMode {
    /// The mode for the flags word of XFS_IOC_GOINGDOWN (0, 1 or 2); None
    /// for any other value (the ioctl's EINVAL).
    pub fn from_going_down_flags(flags: u32) -> Option<Self> {
        match flags {
            0 => Some(Self::Sync),
            1 => Some(Self::FlushLog),
            2 => Some(Self::Immediate),
            _ => None,
        }
    }
}

impl Volume {
    /// Shuts the volume down after flushing what `mode` says. From then on
    /// every operation fails with [`Error::ShutDown`](crate::error::Error::ShutDown) (EIO), nothing
    /// more is written or read, and closing it writes nothing either;
    /// opening it again replays the journal. Shutting down a volume that is
    /// already down does nothing. The volume goes down even when the flush
    /// fails; the flush's error is returned then.
    pub fn shutdown(&self, mode: ShutdownMode) -> Result<()> {
        let shared = &self.shared;
        if shared.device.is_shut_down() {
            return Ok(());
        }
        let flushed = match mode {
            ShutdownMode::Sync => shared.sync(),
            ShutdownMode::FlushLog => {
                shared.meta.make_durable(shared.meta.journal().last_lsn(), None)
            }
            ShutdownMode::Immediate => Ok(()),
        };
        shared.meta.journal().shut_down();
        shared.stop_background();
        tracing::info!("volume shut down ({mode:?})");
        flushed
    }

    /// Whether [`Volume::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shared.device.is_shut_down()
    }
}
