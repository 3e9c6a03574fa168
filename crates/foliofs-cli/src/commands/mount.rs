//! `foliofs mount IMAGE MOUNTPOINT [-o opts] [-f]`, and the same as the
//! `mount.fuse.foliofs` helper that `mount -t fuse.foliofs` runs.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context};
use foliofs_fuse::{Mount, MountOptions, Transport, Unmounter};

use crate::logging;

/// What the daemon writes on its stdout once the mount is in place.
const READY: &[u8] = b"mounted\n";

/// How `foliofs mount` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Start the daemon, return once it has mounted.
    Background,
    /// Serve in this process, logging to stderr (or `-o log=`).
    Foreground,
    /// The daemon the background form starts: mount, tell the parent,
    /// detach, serve.
    Daemon,
}

pub fn run(image: &Path, mountpoint: &Path, options: &str, mode: Mode) -> anyhow::Result<ExitCode> {
    let mountpoint = mountpoint
        .canonicalize()
        .with_context(|| format!("mount point {}", mountpoint.display()))?;
    if let Some(rest) = remount_options(options) {
        // mount(8) runs the helper for `mount -o remount,...` too.
        foliofs_fuse::remount(image, &mountpoint, &rest)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mount_options = MountOptions::parse(options)?;
    // An NBD URI names no local file: it stays as written.
    let image = if foliofs::dev::nbd::is_nbd_uri(image) {
        image.to_path_buf()
    } else {
        image.canonicalize().with_context(|| format!("image {}", image.display()))?
    };
    let image = image.as_path();
    if !mountpoint.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    // Quietly, as mount(8) helpers succeed: one daemon serves both views
    // until the last is unmounted.
    if mode != Mode::Daemon && foliofs_fuse::bind_if_mounted(image, &mountpoint)? {
        return Ok(ExitCode::SUCCESS);
    }
    if mode != Mode::Daemon {
        enable_uring_if_root(&mount_options);
    }
    match mode {
        Mode::Foreground => serve(image, &mountpoint, &mount_options, false)?,
        Mode::Daemon => serve(image, &mountpoint, &mount_options, true)?,
        Mode::Background => start_daemon(image, &mountpoint, options)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// With `transport=uring` (the default) root turns the kernel's switch for
/// FUSE over io_uring on, saying so; otherwise the mount falls back to
/// /dev/fuse and its log says why.
fn enable_uring_if_root(options: &MountOptions) {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if options.transport != Transport::Uring || !root {
        return;
    }
    if let Ok(true) = foliofs_fuse::transport::enable_kernel_uring() {
        eprintln!(
            "foliofs: turned on FUSE over io_uring in the kernel ({})",
            foliofs_fuse::transport::ENABLE_URING_PARAMETER
        );
    }
}

/// The options of a remount (`remount` among them), or None.
fn remount_options(options: &str) -> Option<String> {
    options.split(',').any(|item| item.trim() == "remount").then(|| options.to_string())
}

/// Mounts and serves until unmounted (`umount`, `fusermount3 -u`, SIGINT or
/// SIGTERM), then writes everything back and closes the volume. A daemon
/// detaches once mounted: its own session, `/` as working directory (so it
/// keeps no caller's directory busy), stdio on /dev/null (so nothing it
/// prints depends on a caller still reading).
fn serve(
    image: &Path,
    mountpoint: &Path,
    options: &MountOptions,
    daemon: bool,
) -> anyhow::Result<()> {
    if daemon {
        // Its own session: no terminal's signals (^C to the caller) and no
        // hangup reach it.
        // SAFETY: setsid takes no arguments; it fails only for a process
        // group leader, which the spawned daemon is not.
        unsafe { libc::setsid() };
    }
    let mut mount = Mount::new(image, mountpoint, options)?;
    let unmounter = mount.unmounter();
    if let Err(error) = prepare_to_serve(image, mountpoint, unmounter.clone(), daemon) {
        // Nothing will serve the mount: take it away rather than leave a
        // dead one ("transport endpoint is not connected").
        let _ = unmounter.unmount();
        return Err(error);
    }
    let served = mount.run();
    let refused = logging::refused_interrupted_replies();
    if refused > 0 {
        tracing::info!(
            "{refused} replies to interrupted requests were refused by the kernel (the requests \
             completed)"
        );
    }
    match &served {
        Ok(()) => tracing::info!("{} unmounted; the volume is closed", mountpoint.display()),
        Err(error) => tracing::error!("{}: {error}", mountpoint.display()),
    }
    Ok(served?)
}

/// The signal handler; for a daemon, the report to `foliofs mount` and the
/// detach.
fn prepare_to_serve(
    image: &Path,
    mountpoint: &Path,
    unmounter: Unmounter,
    daemon: bool,
) -> anyhow::Result<()> {
    let target = mountpoint.to_path_buf();
    ctrlc::set_handler(move || {
        if let Err(error) = unmounter.unmount() {
            // Busy (files still open): detach now; the session ends, and the
            // volume is closed, when the last user lets go.
            tracing::warn!("unmount {}: {error}; detaching it lazily", target.display());
            let _ = Command::new("umount").arg("-l").arg(&target).status();
        }
    })
    .context("installing the SIGINT/SIGTERM handler")?;
    tracing::info!("{} mounted on {}", image.display(), mountpoint.display());
    if daemon {
        std::env::set_current_dir("/").context("changing to /")?;
        let mut stdout = std::io::stdout();
        if let Err(error) = stdout.write_all(READY).and_then(|()| stdout.flush()) {
            // `foliofs mount` is gone (killed); the mount it asked for is up.
            tracing::warn!("telling foliofs mount that the mount is up: {error}");
        }
        detach_stdio().context("detaching from the caller's stdin/stdout/stderr")?;
    }
    Ok(())
}

/// Points stdin, stdout and stderr at /dev/null.
fn detach_stdio() -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    for fd in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors, which stay open (now
        // on /dev/null); `null` is a valid open descriptor.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The background form: starts the daemon (`foliofs mount --daemon`) and
/// returns once it reports the mount in place, passing on what it prints
/// until then; if it exits first, that is the error.
fn start_daemon(image: &Path, mountpoint: &Path, options: &str) -> anyhow::Result<()> {
    let executable = std::env::current_exe().context("finding the foliofs executable")?;
    let mut daemon = Command::new(executable)
        .arg("mount")
        .arg(image)
        .arg(mountpoint)
        .arg("--daemon")
        .arg("-o")
        .arg(options)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the mount daemon")?;
    let mut daemon_stderr = daemon.stderr.take().expect("piped");
    let relay =
        std::thread::spawn(move || std::io::copy(&mut daemon_stderr, &mut std::io::stderr()));
    // Ends when the daemon detaches its stdout or exits.
    let mut said = Vec::new();
    let _ = daemon.stdout.take().expect("piped").read_to_end(&mut said);
    let _ = relay.join();
    if said == READY {
        return Ok(());
    }
    let status = daemon.wait().context("waiting for the mount daemon")?;
    bail!("the mount daemon exited ({status}) before mounting {}", mountpoint.display());
}

/// The arguments `mount(8)` gives a `mount.fuse.foliofs` helper (`IMAGE
/// MOUNTPOINT [-o OPTIONS] [-n] [-s] [-v]...`) as `foliofs mount` ones.
pub fn helper_arguments(args: &[String]) -> anyhow::Result<Vec<String>> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "-o" => options.push(rest.next().context("-o needs a value")?.clone()),
            // mount(8) names the type when the helper's name does not.
            "-t" => {
                rest.next().context("-t needs a value")?;
            }
            // -n (no mtab), -s (sloppy), -v (verbose), -f (fake) and friends
            // are for mount(8)'s bookkeeping, not the file system.
            flag if flag.starts_with('-') => {}
            value => positional.push(value.to_string()),
        }
    }
    let [image, mountpoint] = positional.as_slice() else {
        bail!("usage: mount.fuse.foliofs IMAGE MOUNTPOINT [-o OPTIONS]");
    };
    let mut out = vec![args[0].clone(), "mount".into(), image.clone(), mountpoint.clone()];
    out.extend(["-o".into(), options.join(",")]);
    Ok(out)
}

pub fn is_helper_name(program: &str) -> bool {
    let name = PathBuf::from(program).file_name().map(|n| n.to_string_lossy().into_owned());
    matches!(name.as_deref(), Some("mount.fuse.foliofs" | "mount.foliofs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_helper_arguments_become_a_mount_command() {
        let args: Vec<String> =
            ["/sbin/mount.fuse.foliofs", "/img", "/mnt", "-n", "-o", "rw,dirty=folio", "-t", "x"]
                .map(String::from)
                .to_vec();
        assert!(is_helper_name(&args[0]));
        assert_eq!(
            helper_arguments(&args).unwrap(),
            ["/sbin/mount.fuse.foliofs", "mount", "/img", "/mnt", "-o", "rw,dirty=folio"]
        );
        assert!(helper_arguments(&args[..2]).is_err());
        assert!(!is_helper_name("foliofs"));
    }
}
