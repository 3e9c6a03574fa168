//! FITRIM through the mount (`fstrim MOUNTPOINT`): a directory ioctl,
//! `_IOWR('X', 121, struct fstrim_range)`, which the kernel's FUSE passes to
//! the daemon with the caller's 24-byte range copied in and copies the
//! 24 bytes of the reply back out (fs/fuse/ioctl.c: a restricted ioctl's
//! buffers come from the command's size and direction). As ext4 does, the
//! reply's `len` is the number of bytes discarded.

use foliofs::TrimRange;

/// _IOWR('X', 121, struct fstrim_range).
pub(crate) const FITRIM: u32 = 0xc018_5879;

/// `struct fstrim_range { __u64 start, len, minlen; }`.
const RANGE_BYTES: usize = 24;

/// The range the caller asked for; EINVAL when the kernel passed anything
/// but the whole structure.
pub(crate) fn decode(in_data: &[u8]) -> Result<TrimRange, i32> {
    let words: &[u8; RANGE_BYTES] = in_data.try_into().map_err(|_| libc::EINVAL)?;
    let word = |index: usize| {
        let bytes = words[index * 8..index * 8 + 8].try_into().expect("8 bytes");
        u64::from_ne_bytes(bytes)
    };
    Ok(TrimRange { start_bytes: word(0), length_bytes: word(1), minimum_bytes: word(2) })
}

/// The range copied back to the caller: its `len` says what was trimmed.
pub(crate) fn encode(asked: TrimRange, trimmed_bytes: u64) -> Vec<u8> {
    [asked.start_bytes, trimmed_bytes, asked.minimum_bytes]
        .iter()
        .flat_map(|word| word.to_ne_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_the_kernels() {
        // _IOC(_IOC_READ | _IOC_WRITE, 'X', 121, 24)
        let expected = (3 << 30) | ((RANGE_BYTES as u32) << 16) | ((b'X' as u32) << 8) | 121;
        assert_eq!(FITRIM, expected);
    }

    #[test]
    fn the_range_round_trips_with_the_trimmed_length() {
        let asked = TrimRange { start_bytes: 1 << 20, length_bytes: u64::MAX, minimum_bytes: 4096 };
        let bytes = encode(asked, u64::MAX);
        assert_eq!(decode(&bytes), Ok(asked));
        let reply = encode(asked, 12345);
        assert_eq!(decode(&reply).unwrap().length_bytes, 12345);
        assert_eq!(decode(&bytes[..16]), Err(libc::EINVAL));
        assert_eq!(decode(&[]), Err(libc::EINVAL));
    }
}
