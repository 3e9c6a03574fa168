//! `foliofs`: the command-line front end. Every command is a thin layer over
//! the library: parse arguments, call `foliofs::Volume`, print.

mod commands;
mod image_path;
mod logging;
mod options_doc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "foliofs", version, about = "A crash-safe file storage engine in user space")]
struct Cli {
    /// Volume options, comma separated key=value (--help lists every key).
    #[arg(
        short = 'o',
        long = "options",
        global = true,
        default_value = "",
        long_help = options_help()
    )]
    options: String,
    #[command(subcommand)]
    command: Command,
}

/// The `-o` help, made from the tables the option parsers check against, so
/// it lists every switch there is.
fn options_help() -> String {
    let mut help = String::from("Volume options, comma separated key=value:\n");
    let list = |help: &mut String, keys: &[(&str, &str)]| {
        for (key, description) in keys {
            help.push_str(&format!("  {key}: {description}\n"));
        }
    };
    list(&mut help, foliofs::options::OPTION_KEYS);
    help.push_str("foliofs mount also takes:\n");
    list(&mut help, foliofs_fuse::MOUNT_OPTION_KEYS);
    help
}

#[derive(Subcommand)]
enum Command {
    /// Create a volume in IMAGE (a file, created or resized, or a block device).
    Mkfs {
        image: PathBuf,
        /// Volume size, e.g. 4G; required for a file that does not exist yet; on a
        /// block device, the part of it the volume takes (default: all of it).
        #[arg(long)]
        size: Option<String>,
        /// File-system block size: 1024, 2048, 4096, ..., 65536.
        #[arg(long, default_value = "4096")]
        block_size: String,
        /// Journal size (default 1/128 of the volume, at least 1 MiB).
        #[arg(long)]
        journal_size: Option<String>,
        /// Room for metadata (inodes, names, extents, xattrs): each of the two
        /// checkpoint slots, 1M to 1G (default 1/128 of the volume, at least
        /// 1 MiB: about 75,000 empty files a GiB).
        #[arg(long)]
        metadata_size: Option<String>,
        /// Keep the metadata in a paged index that grows from the data
        /// region (format 3) instead of two fixed checkpoint slots: no cap
        /// on files but space, and checkpoints write only what changed.
        #[arg(long, conflicts_with = "metadata_size")]
        metadata_index: bool,
    },
    /// Print the superblock, layout and usage of a volume.
    Info { image: PathBuf },
    /// Check a volume's consistency without changing it (exit 0 when clean).
    Fsck { image: PathBuf },
    /// Convert a closed volume of format 1 or 2 in place to format 3, its
    /// metadata in a paged index (mkfs --metadata-index); a power cut
    /// leaves it as it was or converted.
    Convert { image: PathBuf },
    /// List a directory: IMAGE:/path.
    Ls {
        target: String,
        /// Long listing: mode, links, owner, size, time.
        #[arg(short = 'l')]
        long: bool,
    },
    /// Write a file's contents to standard output: IMAGE:/path.
    Cat { target: String },
    /// Copy between the host and a volume (one side is IMAGE:/path), or
    /// inside one volume (both are, naming the same image): there files are
    /// cloned, sharing their blocks, as `cp --reflink` does.
    Cp {
        source: String,
        destination: String,
        /// Copy directories recursively (symlinks are copied as symlinks).
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
        /// Inside one volume: clone (always: fail where a clone cannot be
        /// made; auto: copy the bytes there instead; never: copy the bytes).
        #[arg(
            long,
            value_enum,
            num_args = 0..=1,
            require_equals = true,
            default_value = "auto",
            default_missing_value = "always"
        )]
        reflink: commands::files::Reflink,
    },
    /// Clone a directory tree inside a volume: IMAGE:/src /dst. The copy
    /// shares every file's blocks and takes only metadata; it is one
    /// instant of the tree, since the command holds the image alone. With
    /// --server, snapshots files a `foliofs serve nbd --control SOCKET`
    /// exports while it serves them: EXPORT /dst [EXPORT /dst]..., all at
    /// one instant, durable when the command returns.
    Snapshot {
        /// IMAGE:/src; with --server, an export's name or its file's path.
        source: String,
        /// The new copy's path inside the volume (it must not exist).
        destination: String,
        /// More EXPORT /dst pairs, snapshotted at the same instant.
        #[arg(requires = "server")]
        more: Vec<String>,
        /// The control socket of the server holding the image.
        #[arg(long)]
        server: Option<PathBuf>,
    },
    /// Remove a file (or a directory tree with -r): IMAGE:/path.
    Rm {
        target: String,
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
    },
    /// Create a directory: IMAGE:/path.
    Mkdir {
        target: String,
        /// Create missing parents; no error if it exists.
        #[arg(short = 'p')]
        parents: bool,
    },
    /// Show a file's extents and their states, like filefrag -v: IMAGE:/path.
    Fiemap { target: String },
    /// Preallocate, punch, zero, collapse or insert a range: IMAGE:/path.
    Fallocate(commands::fallocate::FallocateArgs),
    /// Mount a volume through FUSE at MOUNTPOINT; -o takes the engine's switches
    /// and mount options (page_cache=engine|kernel, fuse_threads=N, allow_other,
    /// default_permissions, ro, log=PATH, ...). Runs in the background unless -f,
    /// logging to syslog or log=PATH. After umount, `flock IMAGE true` waits
    /// until the daemon has closed the volume.
    Mount {
        image: PathBuf,
        mountpoint: PathBuf,
        /// Stay in the foreground (serve until unmounted or SIGINT/SIGTERM).
        #[arg(short = 'f', long)]
        foreground: bool,
        /// The daemon the background form starts (detaches once mounted).
        #[arg(long, hide = true)]
        daemon: bool,
    },
    /// Serve files inside a volume to other machines: `serve nbd IMAGE:/disk.raw
    /// [--socket PATH | --listen ADDR]` (a VM's disk, qemu-img, nbdcopy), or
    /// `serve virtiofs IMAGE --socket PATH` (a VM guest mounts the volume),
    /// until SIGINT/SIGTERM.
    #[command(subcommand)]
    Serve(commands::serve::ServeProtocol),
    /// Run fio jobs (a job file, or fio options such as --name=t --rw=randread
    /// --bs=4k --size=1G) or a fixed benchmark, in-process on a temporary image.
    Bench(Box<commands::bench::BenchArgs>),
    /// Crash-test the library: seeded random workloads on an in-memory device,
    /// crashed at every flush boundary (and with volatile writes kept, lost
    /// or torn), remounted and checked against a model.
    Crashtest(commands::crashtest::CrashtestArgs),
    /// fsx-style checker: random operations on one file (and a second one
    /// for clones) compared with an in-memory model after every step.
    Fsx(commands::fsx::FsxArgs),
    /// List every -o option; --markdown prints docs/options.md (with the
    /// flags of mkfs, mount and serve nbd).
    Options {
        /// Print the whole of docs/options.md.
        #[arg(long)]
        markdown: bool,
    },
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    if args.first().is_some_and(|program| commands::mount::is_helper_name(program)) {
        match commands::mount::helper_arguments(&args) {
            Ok(rewritten) => args = rewritten,
            Err(error) => {
                eprintln!("mount.fuse.foliofs: {error:#}");
                return ExitCode::FAILURE;
            }
        }
    }
    let cli = Cli::parse_from(args);
    match log_target(&cli) {
        Ok((target, daemon)) => logging::init(target, daemon),
        Err(error) => {
            eprintln!("foliofs: {error:#}");
            return ExitCode::FAILURE;
        }
    }
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("foliofs: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Where this process logs, and whether it is a mount daemon: a mount logs
/// to `-o log=PATH` when given; otherwise the detached daemon logs to syslog
/// and everything else to stderr.
fn log_target(cli: &Cli) -> anyhow::Result<(logging::LogTarget, bool)> {
    let Command::Mount { foreground, daemon, .. } = &cli.command else {
        return Ok((logging::LogTarget::Stderr, false));
    };
    let serving = *foreground || *daemon;
    // A bad list is reported by the mount itself, naming the option.
    let log = foliofs_fuse::MountOptions::parse(&cli.options).ok().and_then(|options| options.log);
    Ok(match log {
        // Only the process that serves opens the file (and creates it).
        Some(path) if serving => (logging::LogTarget::file(&path)?, true),
        _ if *daemon => (logging::LogTarget::Syslog, true),
        _ => (logging::LogTarget::Stderr, serving),
    })
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // A mount's -o mixes engine switches with mount options; it parses both.
    if let Command::Mount { image, mountpoint, foreground, daemon } = &cli.command {
        let mode = match (foreground, daemon) {
            (_, true) => commands::mount::Mode::Daemon,
            (true, false) => commands::mount::Mode::Foreground,
            (false, false) => commands::mount::Mode::Background,
        };
        return commands::mount::run(image, mountpoint, &cli.options, mode);
    }
    let options = foliofs::VolumeOptions::parse(&cli.options)?;
    use commands::*;
    match cli.command {
        Command::Mkfs { image, size, block_size, journal_size, metadata_size, metadata_index } => {
            let sizes = mkfs::Sizes {
                volume: size.as_deref(),
                block: &block_size,
                journal: journal_size.as_deref(),
                metadata: metadata_size.as_deref(),
                metadata_index,
            };
            mkfs::run(&image, &sizes, &options)
        }
        Command::Info { image } => info::run(&image, &options),
        Command::Fsck { image } => fsck::run(&image, &options),
        Command::Convert { image } => convert::run(&image, &options),
        Command::Ls { target, long } => files::ls(&target, long, &options),
        Command::Cat { target } => files::cat(&target, &options),
        Command::Cp { source, destination, recursive, reflink } => {
            files::cp(&source, &destination, recursive, reflink, &options)
        }
        Command::Snapshot { source, destination, more, server: None } => {
            debug_assert!(more.is_empty(), "clap requires --server");
            files::snapshot(&source, &destination, &options)
        }
        Command::Snapshot { source, destination, more, server: Some(server) } => {
            files::snapshot_served(&server, &source, &destination, &more)
        }
        Command::Rm { target, recursive } => files::rm(&target, recursive, &options),
        Command::Mkdir { target, parents } => files::mkdir(&target, parents, &options),
        Command::Fiemap { target } => files::fiemap(&target, &options),
        Command::Fallocate(args) => fallocate::run(&args, &options),
        Command::Mount { .. } => unreachable!("handled above"),
        Command::Serve(protocol) => serve::run(&protocol, &options),
        Command::Bench(args) => bench::run(*args, &options, &cli.options),
        Command::Crashtest(args) => crashtest::run(&args, &cli.options),
        Command::Fsx(args) => fsx::run(&args, &cli.options),
        Command::Options { markdown: true } => {
            print!("{}", options_doc::markdown());
            Ok(ExitCode::SUCCESS)
        }
        Command::Options { markdown: false } => {
            print!("{}", options_help());
            Ok(ExitCode::SUCCESS)
        }
    }
}
