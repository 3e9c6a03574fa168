//! The transport the mount tests use: FOLIOFS_TRANSPORT=uring (the default)
//! or dev; `.ci/run` runs the mount tests once with each.

/// The transport named by FOLIOFS_TRANSPORT.
pub fn name() -> &'static str {
    match std::env::var("FOLIOFS_TRANSPORT").as_deref() {
        Ok("dev") => "dev",
        Ok("uring") | Err(_) => "uring",
        Ok(other) => panic!("FOLIOFS_TRANSPORT={other}: expected uring or dev"),
    }
}

/// Whether the tests can run on it; for io_uring the kernel's switch is
/// turned on here (as root), and where the kernel lacks it the test says so
/// and is skipped.
pub fn skip_unavailable() -> bool {
    if name() == "dev" {
        return false;
    }
    match foliofs_fuse::transport::enable_kernel_uring() {
        Ok(_) => false,
        Err(error) => {
            super::skip::skip_or_fail(&format!(
                "FOLIOFS_TRANSPORT=uring: the kernel does not offer FUSE over io_uring ({}: \
                 {error})",
                foliofs_fuse::transport::ENABLE_URING_PARAMETER
            ));
            true
        }
    }
}

/// `options` with the transport added.
pub fn with(options: &str) -> String {
    let separator = if options.is_empty() { "" } else { "," };
    format!("{options}{separator}transport={}", name())
}
