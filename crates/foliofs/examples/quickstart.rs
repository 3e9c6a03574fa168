//! A first program over the library's std-shaped API: formats a volume in
//! a file, makes directories and files by path, writes through `std::io`
//! and the direct path, and lists what it made.
//!
//! cargo run -p foliofs --example quickstart -- /path/to/vol.img

use std::io::Write;

use foliofs::{block_on, AlignedBuf, MkfsOptions, OpenOptions, Volume, VolumeOptions};

fn main() -> foliofs::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "quickstart.img".into());
    let options = VolumeOptions::default();
    Volume::mkfs_path(path.as_ref(), Some(64 << 20), &MkfsOptions::default(), &options)?;
    let volume = Volume::open(path.as_ref(), &options)?;

    volume.create_dir_all("/docs")?;
    let mut file = OpenOptions::new().write(true).create(true).open(&volume, "/docs/hello.txt")?;
    writeln!(file, "hello")?;
    file.sync_all()?; // durable when this returns

    // O_DIRECT + O_DSYNC: aligned buffers, many requests in flight per thread.
    let direct = OpenOptions::new()
        .write(true)
        .create(true)
        .direct(true)
        .dsync(true)
        .open(&volume, "/docs/direct.bin")?;
    let pending: Vec<_> = (0..256u64)
        .map(|index| direct.write_at_async(AlignedBuf::zeroed(4096), index * 4096))
        .collect(); // futures: any executor can drive them
    for future in pending {
        let (written, _buffer) = block_on(future);
        written?;
    }
    for entry in volume.read_dir("/docs")? {
        let entry = entry?;
        let metadata = volume.metadata(std::path::Path::new("/docs").join(entry.file_name()))?;
        println!("{:?}: {} bytes", entry.file_name(), metadata.len());
    }
    volume.close()
}
