//! The README's library example, kept compiling: formats a volume in a file,
//! writes through the simple path and the direct path, and reads back.
//!
//! cargo run -p foliofs --example quickstart -- /path/to/vol.img

use foliofs::completion::block_on;
use foliofs::dev::AlignedBuf;
use foliofs::vfs::MkfsOptions;
use foliofs::{OpenFlags, Owner, Volume, VolumeOptions};

fn main() -> foliofs::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "quickstart.img".into());
    let options = VolumeOptions::default();
    Volume::mkfs_path(path.as_ref(), Some(64 << 20), &MkfsOptions::default(), &options)?;

    let volume = Volume::open(path.as_ref(), &options)?;
    let attr = volume.create(1, b"hello.txt", 0o644, Owner::current())?; // 1 is the root
    let file = volume.open_file(attr.ino, OpenFlags::READ_WRITE)?;
    file.write_at(b"hello", 0)?;
    file.fsync()?; // durable when this returns

    // O_DIRECT + O_DSYNC: aligned buffers, many requests in flight per thread.
    let direct = volume.open_file(attr.ino, OpenFlags::READ_WRITE.with_direct().with_dsync())?;
    let pending: Vec<_> = (0..256u64)
        .map(|index| direct.write_at_async(AlignedBuf::zeroed(4096), index * 4096))
        .collect(); // IoFutures: any executor can drive them
    for future in pending {
        let (_buffer, written) = block_on(future);
        written?;
    }
    let mut back = AlignedBuf::zeroed(4096);
    direct.read_at(&mut back, 0)?;
    println!("{} bytes in hello.txt", volume.getattr(attr.ino)?.size);
    volume.close()
}
