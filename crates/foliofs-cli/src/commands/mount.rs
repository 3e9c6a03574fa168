//! `foliofs mount IMAGE MOUNTPOINT [-o opts] [-f]`, and the same as the
//! `mount.fuse.foliofs` helper that `mount -t fuse.foliofs` runs.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use foliofs_fuse::{Mount, MountOptions};

/// How long the background form waits for the daemon's mount to appear.
const MOUNT_WAIT: Duration = Duration::from_secs(30);

pub fn run(
    image: &Path,
    mountpoint: &Path,
    options: &str,
    foreground: bool,
) -> anyhow::Result<ExitCode> {
    let mount_options = MountOptions::parse(options)?;
    let image = image.canonicalize().with_context(|| format!("image {}", image.display()))?;
    let image = image.as_path();
    let mountpoint = mountpoint
        .canonicalize()
        .with_context(|| format!("mount point {}", mountpoint.display()))?;
    if !mountpoint.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    if foreground {
        serve(image, &mountpoint, &mount_options)?;
    } else {
        start_daemon(image, &mountpoint, options)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Mounts and serves until unmounted (`umount`, `fusermount3 -u`, SIGINT or
/// SIGTERM), then writes everything back and closes the volume.
fn serve(image: &Path, mountpoint: &Path, options: &MountOptions) -> anyhow::Result<()> {
    let mut mount = Mount::new(image, mountpoint, options)?;
    let mut unmounter = mount.unmounter();
    let target = mountpoint.to_path_buf();
    ctrlc::set_handler(move || {
        if let Err(error) = unmounter.unmount() {
            // Busy (files still open): detach now; the session ends, and the
            // volume is closed, when the last user lets go.
            eprintln!("foliofs: unmount {}: {error}; detaching it lazily", target.display());
            let _ = Command::new("umount").arg("-l").arg(&target).status();
        }
    })
    .context("installing the SIGINT/SIGTERM handler")?;
    mount.run()?;
    Ok(())
}

/// The background form: runs `foliofs mount -f` as a daemon in its own
/// process group and returns once its mount is in place (or it failed).
fn start_daemon(image: &Path, mountpoint: &Path, options: &str) -> anyhow::Result<()> {
    let executable = std::env::current_exe().context("finding the foliofs executable")?;
    let mut daemon = Command::new(executable)
        .arg("mount")
        .arg(image)
        .arg(mountpoint)
        .arg("-f")
        .arg("-o")
        .arg(options)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Its messages reach our stderr while we wait; once we exit, nothing
        // holds our caller's stderr open (`$(mount ...)` would hang on it).
        // Run with -f to keep seeing the daemon's log.
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("starting the mount daemon")?;
    let mut daemon_stderr = daemon.stderr.take().expect("piped");
    std::thread::spawn(move || std::io::copy(&mut daemon_stderr, &mut std::io::stderr()));
    let started = Instant::now();
    loop {
        if let Some(status) = daemon.try_wait()? {
            bail!("the mount daemon exited ({status}) before mounting {}", mountpoint.display());
        }
        if is_foliofs_mount(mountpoint)? {
            return Ok(());
        }
        if started.elapsed() > MOUNT_WAIT {
            let _ = daemon.kill();
            bail!("{} was not mounted within {MOUNT_WAIT:?}", mountpoint.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether /proc/self/mountinfo lists a foliofs FUSE mount at `mountpoint`.
fn is_foliofs_mount(mountpoint: &Path) -> anyhow::Result<bool> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = mountpoint.to_string_lossy();
    Ok(mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let separator = fields.iter().position(|field| *field == "-");
        fields.get(4).is_some_and(|point| unescape(point) == wanted)
            && separator
                .and_then(|at| fields.get(at + 1))
                .is_some_and(|kind| kind.starts_with("fuse"))
    }))
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
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
            ["/sbin/mount.fuse.foliofs", "/img", "/mnt", "-n", "-o", "rw,dirty=folio"]
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

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
    }
}
