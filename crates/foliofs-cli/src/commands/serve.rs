//! `foliofs serve nbd IMAGE:/path ...`: files inside a volume served as
//! NBD exports (crates/foliofs-nbd) until SIGINT/SIGTERM, which answers
//! what was read, writes everything back and closes the volume. With
//! `--control PATH`, `foliofs snapshot --server PATH` snapshots exports
//! while they are served.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use foliofs::options::parse_size;
use foliofs::{Error, OpenFlags, Owner, Volume, VolumeOptions};
use foliofs_nbd::{ControlListener, ExportSpec, Listener, Server};

use crate::image_path::ImagePath;

#[derive(Subcommand)]
pub enum ServeProtocol {
    /// Serve files as NBD exports, each named by its path inside the
    /// volume without the leading / (the first is the default export).
    Nbd(NbdArgs),
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
    let ServeProtocol::Nbd(args) = protocol;
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
