//! Which transport carries a mount's requests, and the kernel's switch for
//! FUSE over io_uring.

use std::io;

pub use fuser::Transport as LiveTransport;

/// The kernel's switch for FUSE over io_uring (present when the kernel is
/// built with CONFIG_FUSE_IO_URING; off by default).
pub const ENABLE_URING_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel offers FUSE over io_uring to new mounts; `None` when
/// it has no such switch.
pub fn kernel_uring_enabled() -> Option<bool> {
    let value = std::fs::read_to_string(ENABLE_URING_PARAMETER).ok()?;
    Some(matches!(value.trim(), "Y" | "y" | "1"))
}

/// Turns the kernel's switch on (root only); `Ok(true)` when it was off.
/// Mounts made before keep the transport they negotiated.
pub fn enable_kernel_uring() -> io::Result<bool> {
    match kernel_uring_enabled() {
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{ENABLE_URING_PARAMETER} is missing: this kernel has no FUSE over io_uring"),
        )),
        Some(true) => Ok(false),
        Some(false) => std::fs::write(ENABLE_URING_PARAMETER, "1").map(|()| true),
    }
}

/// One line naming the live transport, for the mount's log.
pub fn describe(transport: &LiveTransport) -> String {
    match transport {
        LiveTransport::IoUring(info) => format!(
            "FUSE over io_uring: {} CPU queues, {} threads and {} entries each, {} KiB payloads",
            info.queues,
            info.threads_per_queue,
            info.entries_per_queue,
            info.payload_bytes >> 10
        ),
        LiveTransport::DevFuse(None) => "/dev/fuse".to_string(),
        LiveTransport::DevFuse(Some(why)) => format!("/dev/fuse ({why})"),
    }
}
