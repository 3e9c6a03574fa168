//! ls, cat, cp, rm, mkdir and fiemap on `IMAGE:/path`.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use foliofs::MapKind;
use foliofs::{InodeKind, OpenFlags, Owner, Volume, VolumeOptions};

use crate::image_path::ImagePath;

/// Bytes moved per read/write call when copying.
const COPY_CHUNK_BYTES: usize = 1 << 20;

fn open_read_only(image: &Path, options: &VolumeOptions) -> anyhow::Result<Volume> {
    let options = VolumeOptions { read_only: true, commit_interval_ms: 0, ..options.clone() };
    Volume::open(image, &options).with_context(|| format!("open {}", image.display()))
}

fn open_writable(image: &Path, options: &VolumeOptions) -> anyhow::Result<Volume> {
    let options = VolumeOptions { commit_interval_ms: 0, ..options.clone() };
    Volume::open(image, &options).with_context(|| format!("open {}", image.display()))
}

fn kind_char(kind: InodeKind) -> char {
    match kind {
        InodeKind::File => '-',
        InodeKind::Dir => 'd',
        InodeKind::Symlink => 'l',
        InodeKind::Fifo => 'p',
        InodeKind::Socket => 's',
        InodeKind::CharDevice => 'c',
        InodeKind::BlockDevice => 'b',
    }
}

fn mode_string(kind: InodeKind, mode: u32) -> String {
    let mut text = String::from(kind_char(kind));
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

pub fn ls(target: &str, long: bool, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let target = ImagePath::require(target)?;
    let volume = open_read_only(&target.image, options)?;
    let ino = volume.inodes().resolve(&target.path)?;
    let attr = volume.inodes().getattr(ino)?;
    let entries = if attr.kind == InodeKind::Dir {
        volume.inodes().readdir(ino)?
    } else {
        let name = target.split().map_or_else(|| "/".into(), |(_, name)| name);
        vec![foliofs::DirEntry { name: name.into_bytes(), ino, kind: attr.kind }]
    };
    let mut out = std::io::stdout().lock();
    for entry in entries {
        let name = String::from_utf8_lossy(&entry.name);
        if !long {
            writeln!(out, "{name}")?;
            continue;
        }
        let attr = volume.inodes().getattr(entry.ino)?;
        let suffix = if attr.kind == InodeKind::Symlink {
            format!(" -> {}", String::from_utf8_lossy(&volume.inodes().readlink(entry.ino)?))
        } else {
            String::new()
        };
        writeln!(
            out,
            "{} {:>3} {:>5} {:>5} {:>12} {:>10}.{:09} {name}{suffix}",
            mode_string(attr.kind, attr.mode),
            attr.nlink,
            attr.uid,
            attr.gid,
            attr.size,
            attr.mtime.secs,
            attr.mtime.nanos
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn cat(target: &str, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let target = ImagePath::require(target)?;
    let volume = open_read_only(&target.image, options)?;
    let file = volume.inodes().open_path(&target.path, OpenFlags::READ)?;
    copy_file_out(&file, &mut std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}

/// Writes a volume file's whole contents to `output`.
fn copy_file_out(file: &foliofs::File, output: &mut impl Write) -> anyhow::Result<()> {
    let mut buffer = vec![0u8; COPY_CHUNK_BYTES];
    let mut pos = 0u64;
    loop {
        let read = file.read_at(&mut buffer, pos)?;
        if read == 0 {
            return Ok(());
        }
        output.write_all(&buffer[..read])?;
        pos += read as u64;
    }
}

pub fn mkdir(target: &str, parents: bool, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let target = ImagePath::require(target)?;
    let volume = open_writable(&target.image, options)?;
    let mut dir = foliofs::ROOT_INO;
    let components: Vec<&str> = target.path.split('/').filter(|part| !part.is_empty()).collect();
    for (index, component) in components.iter().enumerate() {
        let last = index + 1 == components.len();
        match volume.inodes().lookup(dir, component.as_bytes()) {
            Ok(attr) if attr.kind == InodeKind::Dir && (parents || !last) => dir = attr.ino,
            Ok(_) if last => bail!("{}: file exists", target.path),
            Ok(_) => bail!("{}: not a directory", component),
            Err(foliofs::Error::NotFound(_)) if parents || last => {
                dir =
                    volume.inodes().mkdir(dir, component.as_bytes(), 0o755, Owner::current())?.ino;
            }
            Err(error) => return Err(error.into()),
        }
    }
    volume.close()?;
    Ok(ExitCode::SUCCESS)
}

pub fn rm(target: &str, recursive: bool, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let target = ImagePath::require(target)?;
    let Some((parent_path, name)) = target.split() else { bail!("refusing to remove the root") };
    let volume = open_writable(&target.image, options)?;
    let parent = volume.inodes().resolve(&parent_path)?;
    let attr = volume.inodes().lookup(parent, name.as_bytes())?;
    if attr.kind == InodeKind::Dir {
        if !recursive {
            bail!("{}: is a directory (use -r)", target.path);
        }
        remove_tree(&volume, attr.ino)?;
        volume.inodes().rmdir(parent, name.as_bytes())?;
    } else {
        volume.inodes().unlink(parent, name.as_bytes())?;
    }
    volume.close()?;
    Ok(ExitCode::SUCCESS)
}

fn remove_tree(volume: &Volume, dir: u64) -> anyhow::Result<()> {
    for entry in volume.inodes().readdir(dir)? {
        if entry.kind == InodeKind::Dir {
            remove_tree(volume, entry.ino)?;
            volume.inodes().rmdir(dir, &entry.name)?;
        } else {
            volume.inodes().unlink(dir, &entry.name)?;
        }
    }
    Ok(())
}

/// `cp --reflink`'s choices, for copies inside one volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Reflink {
    /// Clone; fail where a clone cannot be made.
    Always,
    /// Clone where possible, else copy the bytes.
    Auto,
    /// Copy the bytes.
    Never,
}

pub fn cp(
    source: &str,
    destination: &str,
    recursive: bool,
    reflink: Reflink,
    options: &VolumeOptions,
) -> anyhow::Result<ExitCode> {
    match (ImagePath::parse(source), ImagePath::parse(destination)) {
        (None, Some(to)) => copy_into_image(Path::new(source), &to, recursive, options)?,
        (Some(from), None) => copy_out_of_image(&from, Path::new(destination), recursive, options)?,
        (Some(from), Some(to)) => copy_within_image(&from, &to, recursive, reflink, options)?,
        (None, None) => bail!("one of {source:?} and {destination:?} must be IMAGE:/path"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `IMAGE:/src` and `IMAGE:/dst` of one image: `dst` is the new name, or
/// an existing directory to copy into.
fn resolve_within_image(
    from: &ImagePath,
    to: &ImagePath,
    volume: &Volume,
) -> anyhow::Result<String> {
    let same = std::fs::canonicalize(&from.image).ok() == std::fs::canonicalize(&to.image).ok();
    if !same {
        bail!("copying between two images is not supported; copy out and back in");
    }
    let into_dir = volume.metadata(&to.path).map(|found| found.is_dir()).unwrap_or(false);
    Ok(match (into_dir, from.split()) {
        (true, Some((_, name))) => format!("{}/{name}", to.path.trim_end_matches('/')),
        _ => to.path.clone(),
    })
}

fn copy_within_image(
    from: &ImagePath,
    to: &ImagePath,
    recursive: bool,
    reflink: Reflink,
    options: &VolumeOptions,
) -> anyhow::Result<()> {
    let volume = open_writable(&from.image, options)?;
    let destination = resolve_within_image(from, to, &volume)?;
    let is_dir = volume.symlink_metadata(&from.path)?.is_dir();
    if is_dir && !recursive {
        bail!("{}: is a directory (use -r)", from.path);
    }
    let cloned = match reflink {
        Reflink::Never => Err(foliofs::Error::Unsupported("--reflink=never".into())),
        _ if is_dir => volume.clone_tree(&from.path, &destination).map(drop),
        _ => volume.clone_file(&from.path, &destination),
    };
    let copied = match cloned {
        Err(foliofs::Error::Unsupported(why)) if reflink != Reflink::Always => {
            if reflink == Reflink::Auto {
                eprintln!("foliofs: copying the bytes: {why}");
            }
            copy_bytes_within(&volume, &from.path, &destination, is_dir)
        }
        other => other.map_err(anyhow::Error::from),
    };
    let closed = volume.close();
    copied?;
    closed?;
    Ok(())
}

/// A copy that moves every byte (no clones), of a file or a tree.
fn copy_bytes_within(
    volume: &Volume,
    source: &str,
    destination: &str,
    is_dir: bool,
) -> anyhow::Result<()> {
    if is_dir {
        volume.create_dir(destination)?;
        for entry in volume.read_dir(source)? {
            let entry = entry?;
            let name = String::from_utf8_lossy(&entry.name).into_owned();
            let (from, to) = (format!("{source}/{name}"), format!("{destination}/{name}"));
            match entry.kind {
                InodeKind::Dir => copy_bytes_within(volume, &from, &to, true)?,
                InodeKind::File => copy_bytes_within(volume, &from, &to, false)?,
                InodeKind::Symlink => volume.symlink(volume.read_link(&from)?, &to)?,
                _ => eprintln!("foliofs: skipping {from} (not a file, directory or symlink)"),
            }
        }
        return Ok(());
    }
    volume.write(destination, volume.read(source)?)?;
    Ok(())
}

/// `foliofs snapshot IMAGE:/src /dst`.
pub fn snapshot(
    source: &str,
    destination: &str,
    options: &VolumeOptions,
) -> anyhow::Result<ExitCode> {
    let from = ImagePath::require(source)?;
    let to = match ImagePath::parse(destination) {
        Some(to) => to,
        None => ImagePath { image: from.image.clone(), path: destination.to_string() },
    };
    let volume = open_writable(&from.image, options).map_err(|error| {
        if format!("{error:#}").contains("in use by another process") {
            error.context(
                "a served image takes snapshots through its server: foliofs serve nbd --control \
                 SOCKET, then foliofs snapshot --server SOCKET EXPORT /dst",
            )
        } else {
            error
        }
    })?;
    let destination = resolve_within_image(&from, &to, &volume)?;
    let started = std::time::Instant::now();
    let cloned = volume.clone_tree(&from.path, &destination);
    let closed = volume.close();
    let (files, skipped) = cloned?;
    closed?;
    println!(
        "{destination}: {files} files cloned in {:.1} ms{}",
        started.elapsed().as_secs_f64() * 1e3,
        if skipped > 0 { format!(", {skipped} special files skipped") } else { String::new() }
    );
    Ok(ExitCode::SUCCESS)
}

/// `foliofs snapshot --server SOCKET EXPORT /dst [EXPORT /dst]...`: asks a
/// `foliofs serve nbd --control SOCKET` for snapshots of exports it serves
/// (crates/foliofs-nbd/src/control.rs), all at one instant.
pub fn snapshot_served(
    server: &Path,
    source: &str,
    destination: &str,
    more: &[String],
) -> anyhow::Result<ExitCode> {
    use std::io::BufRead;
    if !more.len().is_multiple_of(2) {
        bail!("snapshot --server takes EXPORT /dst pairs; {:?} has no destination", more.last());
    }
    let pairs: Vec<(&str, &str)> = std::iter::once((source, destination))
        .chain(more.chunks(2).map(|pair| (pair[0].as_str(), pair[1].as_str())))
        .collect();
    let items: Vec<serde_json::Value> = pairs
        .iter()
        .map(|(export, to)| serde_json::json!({ "export": export, "to": to }))
        .collect();
    let request = match &items[..] {
        [one] => serde_json::json!({ "snapshot": one }),
        _ => serde_json::json!({ "snapshot": items }),
    };
    let stream = std::os::unix::net::UnixStream::connect(server).with_context(|| {
        format!("{}: no server (start one with foliofs serve nbd --control)", server.display())
    })?;
    writeln!(&stream, "{request}").with_context(|| format!("sending to {}", server.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(&stream)
        .read_line(&mut line)
        .with_context(|| format!("reading the answer from {}", server.display()))?;
    if line.is_empty() {
        bail!("{}: the server closed the connection without answering", server.display());
    }
    let reply: serde_json::Value = serde_json::from_str(&line)
        .with_context(|| format!("{}: an answer that is not JSON: {line}", server.display()))?;
    if let Some(why) = reply.get("error") {
        bail!("snapshot refused: {}", why.as_str().map_or_else(|| why.to_string(), String::from));
    }
    let ok = reply
        .get("ok")
        .ok_or_else(|| anyhow::anyhow!("{}: an answer without ok: {line}", server.display()))?;
    let made: Vec<&serde_json::Value> = match ok.get("snapshots").and_then(|all| all.as_array()) {
        Some(all) => all.iter().collect(),
        None => vec![ok],
    };
    let mut out = std::io::stdout().lock();
    for snapshot in made {
        let text = |key: &str| snapshot.get(key).and_then(|value| value.as_str()).unwrap_or("?");
        let bytes = snapshot.get("bytes").and_then(serde_json::Value::as_u64).unwrap_or(0);
        writeln!(
            out,
            "{}: snapshot of export {} ({}, {bytes} bytes)",
            text("to"),
            text("export"),
            text("path")
        )?;
    }
    let number = |key: &str| ok.get(key).and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN);
    writeln!(
        out,
        "durable in {:.1} ms; writes paused {:.1} ms",
        number("ms"),
        number("writes_paused_ms")
    )?;
    Ok(ExitCode::SUCCESS)
}

fn copy_into_image(
    source: &Path,
    to: &ImagePath,
    recursive: bool,
    options: &VolumeOptions,
) -> anyhow::Result<()> {
    let metadata =
        std::fs::symlink_metadata(source).with_context(|| format!("{}", source.display()))?;
    if metadata.is_dir() && !recursive {
        bail!("{}: is a directory (use -r)", source.display());
    }
    let volume = open_writable(&to.image, options)?;
    let source_name = source
        .file_name()
        .map(|name| name.as_bytes().to_vec())
        .ok_or_else(|| anyhow::anyhow!("{}: has no file name", source.display()))?;
    let (parent, name) = match volume.inodes().resolve(&to.path) {
        Ok(ino) if volume.inodes().getattr(ino)?.kind == InodeKind::Dir => (ino, source_name),
        _ => {
            let (parent_path, name) =
                to.split().ok_or_else(|| anyhow::anyhow!("bad destination"))?;
            (volume.inodes().resolve(&parent_path)?, name.into_bytes())
        }
    };
    let copied = copy_in(&volume, source, parent, &name, recursive, true);
    let closed = volume.close();
    copied?;
    closed?;
    Ok(())
}

fn copy_in(
    volume: &Volume,
    source: &Path,
    parent: u64,
    name: &[u8],
    recursive: bool,
    top: bool,
) -> anyhow::Result<()> {
    let metadata = if recursive || !top {
        std::fs::symlink_metadata(source)
    } else {
        std::fs::metadata(source)
    }
    .with_context(|| format!("{}", source.display()))?;
    let mode = metadata.mode() & 0o7777;
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        let dir = match volume.inodes().lookup(parent, name) {
            Ok(attr) if attr.kind == InodeKind::Dir => attr.ino,
            Ok(_) => bail!("{}: exists and is not a directory", String::from_utf8_lossy(name)),
            Err(_) => volume.inodes().mkdir(parent, name, mode, Owner::current())?.ino,
        };
        let mut children: Vec<_> = std::fs::read_dir(source)?.collect::<Result<_, _>>()?;
        children.sort_by_key(|entry| entry.file_name());
        for child in children {
            copy_in(volume, &child.path(), dir, child.file_name().as_bytes(), recursive, false)?;
        }
    } else if file_type.is_symlink() {
        let target = std::fs::read_link(source)?;
        volume.inodes().symlink(parent, name, target.as_os_str().as_bytes(), Owner::current())?;
    } else if file_type.is_file() {
        copy_file_in(volume, source, parent, name, mode)?;
    } else {
        eprintln!("foliofs: skipping {} (not a file, directory or symlink)", source.display());
    }
    Ok(())
}

fn copy_file_in(
    volume: &Volume,
    source: &Path,
    parent: u64,
    name: &[u8],
    mode: u32,
) -> anyhow::Result<()> {
    let ino = match volume.inodes().lookup(parent, name) {
        Ok(attr) if attr.kind == InodeKind::File => attr.ino,
        Ok(_) => bail!("{}: exists and is not a regular file", String::from_utf8_lossy(name)),
        Err(_) => volume.inodes().create(parent, name, mode, Owner::current())?.ino,
    };
    let file = volume.inodes().open_file(ino, OpenFlags { truncate: true, ..OpenFlags::WRITE })?;
    let mut input = std::fs::File::open(source).with_context(|| format!("{}", source.display()))?;
    let mut buffer = vec![0u8; COPY_CHUNK_BYTES];
    let mut pos = 0u64;
    loop {
        let read = std::io::Read::read(&mut input, &mut buffer)?;
        if read == 0 {
            break;
        }
        let written = file
            .write_at(&buffer[..read], pos)
            .with_context(|| format!("writing {}", source.display()))?;
        if written < read {
            bail!(
                "writing {}: no space left on the volume after {} bytes",
                source.display(),
                pos + written as u64
            );
        }
        pos += read as u64;
    }
    file.close()?;
    Ok(())
}

fn copy_out_of_image(
    from: &ImagePath,
    destination: &Path,
    recursive: bool,
    options: &VolumeOptions,
) -> anyhow::Result<()> {
    let volume = open_read_only(&from.image, options)?;
    let ino = volume.inodes().resolve(&from.path)?;
    let attr = volume.inodes().getattr(ino)?;
    if attr.kind == InodeKind::Dir && !recursive {
        bail!("{}: is a directory (use -r)", from.path);
    }
    let name = from.split().map_or_else(|| "root".to_string(), |(_, name)| name);
    let target: PathBuf =
        if destination.is_dir() { destination.join(&name) } else { destination.to_path_buf() };
    copy_out(&volume, ino, &target)
}

fn copy_out(volume: &Volume, ino: u64, target: &Path) -> anyhow::Result<()> {
    let attr = volume.inodes().getattr(ino)?;
    match attr.kind {
        InodeKind::Dir => {
            if !target.is_dir() {
                std::fs::create_dir(target).with_context(|| format!("{}", target.display()))?;
            }
            for entry in volume.inodes().readdir(ino)? {
                copy_out(
                    volume,
                    entry.ino,
                    &target.join(std::ffi::OsStr::from_bytes(&entry.name)),
                )?;
            }
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(attr.mode))?;
        }
        InodeKind::Symlink => {
            let link = volume.inodes().readlink(ino)?;
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&link), target)
                .with_context(|| format!("{}", target.display()))?;
        }
        InodeKind::File => {
            let file = volume.inodes().open_file(ino, OpenFlags::READ)?;
            let mut output =
                std::fs::File::create(target).with_context(|| format!("{}", target.display()))?;
            copy_file_out(&file, &mut output)?;
            output.set_permissions(std::fs::Permissions::from_mode(attr.mode))?;
        }
        InodeKind::Fifo | InodeKind::Socket | InodeKind::CharDevice | InodeKind::BlockDevice => {
            eprintln!("{}: a special file ({:?}), not copied", target.display(), attr.kind);
        }
    }
    Ok(())
}

pub fn fiemap(target: &str, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let target = ImagePath::require(target)?;
    let volume = open_read_only(&target.image, options)?;
    let ino = volume.inodes().resolve(&target.path)?;
    let attr = volume.inodes().getattr(ino)?;
    let block = u64::from(attr.block_bytes);
    let extents = volume.inodes().fiemap(ino)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "File size of {} is {} ({} blocks of {} bytes)",
        target.path,
        attr.size,
        attr.size.div_ceil(block),
        block
    )?;
    writeln!(out, " ext:     logical_offset:        physical_offset: length:   flags:")?;
    for (index, extent) in extents.iter().enumerate() {
        let first = extent.logical / block;
        let blocks = extent.length / block;
        let physical = extent.physical / block;
        let mut flags = Vec::new();
        match extent.kind {
            MapKind::Unwritten => flags.push("unwritten"),
            MapKind::Delalloc => flags.push("delalloc,unknown_loc"),
            _ => {}
        }
        if extent.last {
            flags.push("last");
        }
        let physical_range = if extent.kind == MapKind::Delalloc {
            format!("{:>10}..{:>10}", 0, 0)
        } else {
            format!("{:>10}..{:>10}", physical, physical + blocks - 1)
        };
        writeln!(
            out,
            "{index:>4}: {:>10}..{:>10}: {physical_range}: {blocks:>6}:   {}",
            first,
            first + blocks - 1,
            flags.join(",")
        )?;
    }
    writeln!(
        out,
        "{}: {} extent{} found",
        target.path,
        extents.len(),
        if extents.len() == 1 { "" } else { "s" }
    )?;
    Ok(ExitCode::SUCCESS)
}
