//! The fixed layout on the device: planning a new volume and reading and
//! writing its two superblock copies. Everything else on disk belongs to
//! the journal (log and checkpoints) and to the files' extents.

use crate::dev::{AlignedBuf, Device};
use crate::error::{Error, IoContext, Result};
use crate::format::superblock::VOLUME_BYTES_MIN;
use crate::format::{
    FormatError, Superblock, Timestamp, BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, HEADER_BYTES,
    SECTOR_BYTES_MIN,
};

/// Checks what mkfs was asked for before anything is written.
pub fn check_mkfs_args(size_bytes: u64, block_bytes: u32) -> Result<()> {
    if !block_bytes.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
    {
        return Err(Error::invalid(format!(
            "block size {block_bytes} is not a power of two between {BLOCK_BYTES_MIN} and \
             {BLOCK_BYTES_MAX}"
        )));
    }
    if size_bytes < VOLUME_BYTES_MIN {
        return Err(Error::invalid(format!(
            "volume size {size_bytes} bytes is too small; the minimum is {} MiB",
            VOLUME_BYTES_MIN >> 20
        )));
    }
    Ok(())
}

/// Lays out a new volume of `volume_bytes` at the start of `device`: a
/// block device may be larger than the volume asked for (`mkfs --size`),
/// as with other file systems' mkfs; the rest of it is left alone.
pub fn plan_sized(
    device: &Device,
    volume_bytes: u64,
    block_bytes: u32,
    journal_bytes: Option<u64>,
    checkpoint_bytes: Option<u64>,
) -> Result<Superblock> {
    check_mkfs_args(volume_bytes, block_bytes)?;
    if volume_bytes > device.size_bytes() {
        return Err(Error::invalid(format!(
            "a volume of {volume_bytes} bytes does not fit on the device's {} bytes",
            device.size_bytes()
        )));
    }
    let sector_bytes = device.logical_block_bytes().max(SECTOR_BYTES_MIN);
    if sector_bytes > block_bytes {
        return Err(Error::invalid(format!(
            "block size {block_bytes} is smaller than the device's logical block size {sector_bytes}"
        )));
    }
    let uuid: [u8; 16] = rand::random();
    let superblock = Superblock::layout(
        volume_bytes,
        block_bytes,
        sector_bytes,
        journal_bytes,
        checkpoint_bytes,
        uuid,
        Timestamp::now(),
    )
    .map_err(|error| Error::invalid(error.to_string()))?;
    // Whole blocks of the size asked for, on the device checked above.
    debug_assert!(superblock.volume_bytes() <= volume_bytes && volume_bytes <= device.size_bytes());
    Ok(superblock)
}

/// Writes both superblock copies and flushes: the last step of mkfs, so an
/// interrupted mkfs leaves nothing that looks like a volume.
pub fn write_superblocks(device: &Device, superblock: &Superblock) -> Result<()> {
    // A validated superblock's sector holds a header, and its blocks whole
    // sectors.
    assert!(superblock.sector_bytes as usize >= HEADER_BYTES, "sector {}", superblock.sector_bytes);
    let mut sector = AlignedBuf::zeroed(superblock.sector_bytes as usize);
    sector[..HEADER_BYTES].copy_from_slice(&superblock.encode());
    for copy in 0..2 {
        let offset = Superblock::copy_offset(superblock.block_bytes, copy);
        debug_assert!(offset.is_multiple_of(u64::from(superblock.sector_bytes)));
        device.write(offset, &sector, false).context(|| "write superblock".into())?;
    }
    device.flush().context(|| "flush after mkfs".into())
}

/// What each superblock copy decodes to; `None` where the device is too
/// small to hold it. Copy B sits at block 1, whose size copy A tells; when
/// A is unreadable every block size is tried.
pub struct SuperblockCopies {
    pub a: Option<Result<Superblock, String>>,
    pub b: Option<Result<Superblock, String>>,
    /// The first device error met reading a copy.
    pub read_error: Option<std::io::Error>,
    /// Why a copy was refused for its format version (a newer build's
    /// volume, not a damaged one).
    pub unsupported_version: Option<String>,
}

pub fn read_superblock_copies(device: &Device) -> SuperblockCopies {
    let sector = device.logical_block_bytes().max(SECTOR_BYTES_MIN) as usize;
    let mut buffer = AlignedBuf::zeroed(sector);
    let mut read_error = None;
    let mut unsupported_version = None;
    let mut read_at = |offset: u64| -> Option<Result<Superblock, String>> {
        if offset + sector as u64 > device.size_bytes() {
            return None;
        }
        Some(match device.read(offset, &mut buffer) {
            Ok(()) => Superblock::decode(&buffer).map_err(|error: FormatError| {
                if matches!(error, FormatError::UnsupportedVersion { .. }) {
                    unsupported_version.get_or_insert(error.to_string());
                }
                error.to_string()
            }),
            Err(error) => {
                let message = error.to_string();
                read_error.get_or_insert(error);
                Err(message)
            }
        })
    };
    let a = read_at(0);
    let candidates: Vec<u32> = match &a {
        Some(Ok(superblock)) => vec![superblock.block_bytes],
        _ => std::iter::successors(Some(BLOCK_BYTES_MIN), |size| Some(size * 2))
            .take_while(|&size| size <= BLOCK_BYTES_MAX)
            .collect(),
    };
    let mut b = None;
    for block_bytes in candidates {
        let found = read_at(Superblock::copy_offset(block_bytes, 1));
        let matches =
            matches!(&found, Some(Ok(superblock)) if superblock.block_bytes == block_bytes);
        if matches || b.is_none() {
            b = found;
        }
        if matches {
            break;
        }
    }
    SuperblockCopies { a, b, read_error, unsupported_version }
}

/// The superblock to mount with: copy A, or copy B when A is damaged.
pub fn read_superblock(device: &Device) -> Result<Superblock> {
    let copies = read_superblock_copies(device);
    let superblock = match (copies.a, copies.b) {
        (Some(Ok(a)), _) => a,
        (a, Some(Ok(b))) => {
            let why = a.map_or_else(|| "missing".into(), |result| result.err().unwrap_or_default());
            tracing::warn!("superblock copy A is damaged ({why}); using copy B");
            b
        }
        (None, _) => {
            return Err(Error::Corrupt("the device is too small to hold a foliofs volume".into()))
        }
        // No copy decoded and the device failed a read: that is the error
        // (EIO), not a damaged volume (found by tests/faults/, checked by tests/faults/targeted.rs).
        (Some(Err(_)), _) if copies.read_error.is_some() => {
            let error = copies.read_error.expect("checked");
            return Err(Error::io("read superblock", error));
        }
        // A newer build's volume: EOPNOTSUPP naming the version, not
        // "damaged".
        (Some(Err(_)), _) if copies.unsupported_version.is_some() => {
            let why = copies.unsupported_version.expect("checked");
            return Err(Error::Unsupported(format!("cannot open this volume: {why}")));
        }
        (Some(Err(why)), _) => {
            return Err(Error::Corrupt(format!(
                "not a foliofs volume, or both superblocks are damaged: {why}"
            )))
        }
    };
    check_fits(device, superblock)
}

fn check_fits(device: &Device, superblock: Superblock) -> Result<Superblock> {
    if superblock.volume_bytes() > device.size_bytes() {
        return Err(Error::Corrupt(format!(
            "the volume needs {} bytes but the device has only {} (truncated image?)",
            superblock.volume_bytes(),
            device.size_bytes()
        )));
    }
    if device.logical_block_bytes() > superblock.sector_bytes {
        return Err(Error::invalid(format!(
            "the device's logical block size {} exceeds the volume's sector size {}",
            device.logical_block_bytes(),
            superblock.sector_bytes
        )));
    }
    Ok(superblock)
}
