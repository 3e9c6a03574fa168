//! The dirty-page limits of a mount's backing device info, for
//! `page_cache=writeback`. The kernel gives every FUSE mount a strict limit
//! of 1% of the dirty threshold (BDI_CAP_STRICTLIMIT, max_ratio 1), so a
//! writer through the kernel's write-back cache is throttled in
//! balance_dirty_pages long before the system's own limits (libfuse#279:
//! `dd bs=1M` at 146 kB/s). As root, after mounting, the limits become the
//! ones a kernel file system has: no strict limit, and a share of the
//! dirty threshold a single busy device may take (Linux 6.2+ lets both be
//! set from `/sys/class/bdi/<major>:<minor>/`).

use std::path::Path;

/// The share of the system's dirty threshold this mount may hold.
const DIRTY_RATIO_MAX_PERCENT: u32 = 40;

/// Relaxes the limits of the device `mountpoint` is mounted from; a kernel
/// or a user that does not allow it leaves the defaults (logged). Called
/// before the session serves, so the device number comes from mountinfo:
/// a stat of the mount would wait for a daemon that is not answering yet.
pub(crate) fn relax_dirty_limits(mountpoint: &Path) {
    let Some(device) = device_of(mountpoint) else {
        tracing::warn!("dirty limits left strict: {} not in mountinfo", mountpoint.display());
        return;
    };
    for (file, value) in [("strict_limit", 0), ("max_ratio", DIRTY_RATIO_MAX_PERCENT)] {
        let path = format!("/sys/class/bdi/{device}/{file}");
        match std::fs::write(&path, value.to_string()) {
            Ok(()) => tracing::debug!("{path} = {value}"),
            Err(error) => tracing::info!("dirty limits: {path} = {value}: {error}"),
        }
    }
}

/// "major:minor" of the newest mount on `mountpoint`.
fn device_of(mountpoint: &Path) -> Option<String> {
    // Canonical as mountinfo shows it, without a lookup in the mount itself.
    let parent = mountpoint.parent()?.canonicalize().ok()?;
    let canonical = parent.join(mountpoint.file_name()?);
    let point = canonical.to_str()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .rev()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields.get(4) == Some(&point)).then(|| fields.get(2).map(|device| device.to_string()))
        })
        .next()
        .flatten()
}
