//! `foliofs serve nbd IMAGE:/path ...`: files inside a volume served as
//! NBD exports (crates/foliofs-nbd) until SIGINT/SIGTERM, which answers
//! what was read, writes everything back and closes the volume. With
//! `--control PATH`, `foliofs snapshot --server PATH` snapshots exports
//! while they are served.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use foliofs::options::parse_size;
use foliofs::{Error, OpenFlags, Owner, Volume, VolumeOptions};
use foliofs_fuse::{virtiofs, MountOptions, PageCacheUse};
use foliofs_nbd::{ControlListener, ExportSpec, Listener, Server};

use crate::image_path::ImagePath;

#[derive(Subcommand)]
pub enum ServeProtocol {
    /// Serve files as NBD exports, each named by its path inside the
    /// volume without the leading / (the first is the default export).
    Nbd(NbdArgs),
    /// Serve the volume to a VM guest as a virtio-fs file system: a
    /// vhost-user-fs back end for QEMU's `vhost-user-fs-pci` device, which
    /// the guest mounts with `mount -t virtiofs TAG /mnt`. One guest at a
    /// time; ends when the guest unmounts or disconnects, or on
    /// SIGINT/SIGTERM, closing the volume.
    Virtiofs(VirtiofsArgs),
}

#[derive(Args)]
pub struct VirtiofsArgs {
    /// The volume's image (IMAGE or IMAGE:/; subtrees are not served yet).
    image: String,
    /// The vhost-user socket to listen on (QEMU's `-chardev socket,path=`).
    #[arg(long)]
    socket: PathBuf,
    /// The tag, for front ends that read it from the back end (QEMU's
    /// `vhost-user-fs-pci` takes its own `tag=`); at most 36 bytes.
    #[arg(long)]
    tag: Option<String>,
    /// Serve read-only.
    #[arg(long)]
    read_only: bool,
    /// Request queues offered (each served by its own thread), besides the
    /// hiprio queue; QEMU's `num-request-queues` may not exceed it.
    #[arg(long, default_value_t = 4)]
    request_queues: usize,
    /// Whose cache holds file data: `kernel` (the guest's page cache; mmap
    /// works on every guest kernel) or `engine` (the volume's folio cache
    /// only: every guest read and write reaches the server; shared mmap
    /// needs a guest kernel of 6.6 or later).
    #[arg(long, default_value = "kernel")]
    page_cache: String,
}

#[derive(Args)]
pub struct NbdArgs {
    /// The files: IMAGE:/path, all in one image.
    #[arg(required = true)]
    targets: Vec<String>,
    /// Listen on this unix socket.
    #[arg(long, conflicts_with = "listen")]
    socket: Option<PathBuf>,
    /// Listen on this TCP address (NBD has no authentication: loopback or a
    /// trusted network only). The default is 127.0.0.1:10809.
    #[arg(long)]
    listen: Option<String>,
    /// Create a missing file with this size (sparse), e.g. 10G.
    #[arg(long)]
    size: Option<String>,
    /// Export read-only.
    #[arg(long)]
    read_only: bool,
    /// Requests served at once per connection.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Answer snapshot requests on this unix socket (mode 0600), e.g. from
    /// `foliofs snapshot --server PATH EXPORT /dst`; one JSON object a line.
    #[arg(long)]
    control: Option<PathBuf>,
}

pub fn run(protocol: &ServeProtocol, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let args = match protocol {
        ServeProtocol::Nbd(args) => args,
        ServeProtocol::Virtiofs(args) => return serve_virtiofs(args, options),
    };
    let targets: Vec<ImagePath> =
        args.targets.iter().map(|target| ImagePath::require(target)).collect::<Result<_, _>>()?;
    let image = &targets[0].image;
    if let Some(other) = targets.iter().find(|target| &target.image != image) {
        anyhow::bail!(
            "all exports must be in one image: {} and {}",
            image.display(),
            other.image.display()
        );
    }
    let read_only = args.read_only || options.read_only;
    let options = VolumeOptions { read_only, ..options.clone() };
    let size_bytes = args.size.as_deref().map(parse_size).transpose().context("--size")?;
    let listener = match (&args.socket, &args.listen) {
        (Some(socket), _) => Listener::unix(socket.clone())?,
        (None, listen) => Listener::tcp(listen.as_deref().unwrap_or("127.0.0.1:10809"))?,
    };
    let control = args.control.clone().map(ControlListener::bind).transpose()?;
    let volume =
        Volume::open(image, &options).with_context(|| format!("open {}", image.display()))?;
    let mut exports = Vec::new();
    for target in &targets {
        if let Some(size_bytes) = size_bytes {
            create_if_missing(&volume, target, size_bytes)?;
        }
        let name = target.path.trim_start_matches('/').to_string();
        exports.push(ExportSpec { name, path: target.path.clone() });
    }
    let server = Server::new(volume, &exports, read_only, args.threads)
        .with_context(|| format!("exporting from {}", image.display()))?;
    let stopper = server.stopper();
    ctrlc::set_handler(move || stopper.stop()).context("installing the SIGINT/SIGTERM handler")?;
    let address = listener.describe();
    for export in server.exports() {
        let uri = address.replacen(":///", &format!(":///{}", export.name), 1);
        let uri = if uri == address { format!("{address}{}", export.name) } else { uri };
        note(&format!("serving {} ({} bytes) as {uri}", export.path, export.size_bytes));
    }
    if let Some(control) = &control {
        note(&format!("snapshots on the control socket {}", control.path().display()));
    }
    server.serve_with_control(listener, control).context("closing the volume")?;
    note("stopped; the volume is closed");
    Ok(ExitCode::SUCCESS)
}

/// A line on stderr; a closed stderr (a caller that stopped listening)
/// must not fail the server, least of all as it closes the volume.
fn serve_virtiofs(args: &VirtiofsArgs, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let target = ImagePath::parse(&args.image)
        .unwrap_or_else(|| ImagePath { image: PathBuf::from(&args.image), path: "/".into() });
    if target.path != "/" {
        anyhow::bail!(
            "{}: serving a subtree over virtio-fs is not supported yet; serve the whole volume ({})",
            args.image,
            target.image.display()
        );
    }
    if args.tag.as_ref().is_some_and(|tag| tag.is_empty() || tag.len() > 36) {
        anyhow::bail!("--tag: a virtio-fs tag is 1 to 36 bytes");
    }
    if args.request_queues == 0 || args.request_queues > 62 {
        anyhow::bail!("--request-queues: 1 to 62 (one thread each)");
    }
    let page_cache = match args.page_cache.as_str() {
        "kernel" => PageCacheUse::Kernel,
        "engine" => PageCacheUse::Engine,
        other => anyhow::bail!("--page-cache: {other:?} is neither kernel nor engine"),
    };
    let read_only = args.read_only || options.read_only;
    let volume_options = VolumeOptions { read_only, ..options.clone() };
    let mount_options = MountOptions {
        volume: volume_options.clone(),
        page_cache,
        // The guest's kernel checks permissions (virtio-fs mounts with
        // default_permissions) and enforces ACLs.
        default_permissions: true,
        ..MountOptions::default()
    };
    let image = &target.image;
    let volume = Arc::new(
        Volume::open(image, &volume_options)
            .with_context(|| format!("open {}", image.display()))?,
    );
    let stopper = virtiofs::Stopper::default();
    let stop = stopper.clone();
    ctrlc::set_handler(move || stop.stop()).context("installing the SIGINT/SIGTERM handler")?;
    let served = virtiofs::VirtiofsOptions {
        socket: args.socket.clone(),
        tag: args.tag.clone(),
        request_queues: args.request_queues,
    };
    note(&format!(
        "serving {} over virtio-fs on {}{}",
        image.display(),
        args.socket.display(),
        if read_only { " (read-only)" } else { "" }
    ));
    let ended = virtiofs::serve(Arc::clone(&volume), &mount_options, &served, &stopper);
    let closed = match Arc::try_unwrap(volume) {
        Ok(volume) => volume.close(),
        Err(volume) => volume.sync(),
    };
    let ended = ended.context("serving virtio-fs")?;
    closed.context("closing the volume")?;
    note(match ended {
        virtiofs::Ended::GuestLeft => "the guest left; the volume is closed",
        virtiofs::Ended::Stopped => "stopped; the volume is closed",
    });
    Ok(ExitCode::SUCCESS)
}

fn note(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "foliofs: {text}");
}

fn create_if_missing(volume: &Volume, target: &ImagePath, size_bytes: u64) -> anyhow::Result<()> {
    match volume.inodes().resolve(&target.path) {
        Ok(_) => return Ok(()),
        Err(Error::NotFound(_)) => {}
        Err(error) => return Err(error.into()),
    }
    let (parent, name) =
        target.split().ok_or_else(|| anyhow::anyhow!("{}: not a file", target.path))?;
    let parent = volume.inodes().resolve(&parent)?;
    let ino = volume.inodes().create(parent, name.as_bytes(), 0o644, Owner::current())?.ino;
    let file = volume.inodes().open_file(ino, OpenFlags::READ_WRITE)?;
    file.set_len(size_bytes)?;
    file.sync_all()?;
    Ok(file.close()?)
}
