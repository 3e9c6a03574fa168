//! Little-endian byte encoding helpers shared by every on-disk structure.
//!
//! `Reader` never panics: every read is bounds-checked and returns
//! [`FormatError::Truncated`] when the input runs out, so decoders built on it
//! are safe to run over untrusted images.

use super::{FormatError, HEADER_BYTES};

/// Appends little-endian fields to a byte vector.
#[derive(Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(capacity_bytes: usize) -> Self {
        Self { bytes: Vec::with_capacity(capacity_bytes) }
    }

    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    pub fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn i64(&mut self, value: i64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn raw(&mut self, value: &[u8]) {
        self.bytes.extend_from_slice(value);
    }

    /// A byte string prefixed by its u16 length. Callers bound the length
    /// (names are at most 255 bytes, symlink targets at most 4095).
    pub fn bytes16(&mut self, value: &[u8]) {
        let length = u16::try_from(value.len()).expect("byte string longer than u16::MAX");
        self.u16(length);
        self.raw(value);
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Reads little-endian fields from a byte slice, failing cleanly on short input.
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// `what` names the structure being decoded; it appears in error messages.
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { bytes, position: 0, what }
    }

    pub fn position(&self) -> usize {
        self.position
    }

    pub fn remaining(&self) -> usize {
        debug_assert!(self.position <= self.bytes.len(), "a reader past its input");
        self.bytes.len() - self.position
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub fn take(&mut self, count: usize) -> Result<&'a [u8], FormatError> {
        if count > self.remaining() {
            return Err(FormatError::Truncated { what: self.what });
        }
        let slice = &self.bytes[self.position..self.position + count];
        self.position += count;
        debug_assert!(self.position <= self.bytes.len() && slice.len() == count);
        Ok(slice)
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Result<i64, FormatError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    pub fn bytes16(&mut self) -> Result<&'a [u8], FormatError> {
        let length = self.u16()?;
        self.take(usize::from(length))
    }
}

/// Checks the frame every 512-byte header shares (magic, trailing crc32c,
/// format version among `versions`, header size) and returns a reader
/// positioned after it, with the version found.
pub fn open_header<'a>(
    bytes: &'a [u8],
    magic: &[u8; 8],
    what: &'static str,
    versions: std::ops::RangeInclusive<u32>,
) -> Result<(Reader<'a>, u32), FormatError> {
    let crc_offset = HEADER_BYTES - 4;
    if bytes.len() < HEADER_BYTES {
        return Err(FormatError::Truncated { what });
    }
    let bytes = &bytes[..HEADER_BYTES];
    if bytes[..8] != *magic {
        return Err(FormatError::BadMagic { what });
    }
    let stored = u32::from_le_bytes(bytes[crc_offset..].try_into().expect("4 bytes"));
    let computed = crc_with_hole(bytes, crc_offset);
    if stored != computed {
        return Err(FormatError::BadChecksum { what, stored, computed });
    }
    let mut reader = Reader::new(&bytes[8..crc_offset], what);
    let version = reader.u32()?;
    if !versions.contains(&version) {
        return Err(FormatError::UnsupportedVersion {
            what,
            found: version,
            oldest: *versions.start(),
            newest: *versions.end(),
        });
    }
    let header_bytes = reader.u32()?;
    if header_bytes as usize != HEADER_BYTES {
        return Err(FormatError::invalid(what, "header_bytes", header_bytes.to_string()));
    }
    // Callers read their fields from here: after the magic, version and size.
    debug_assert_eq!(reader.position(), 8);
    Ok((reader, version))
}

/// crc32c of `bytes` with the 4-byte checksum field at `crc_offset` treated as zero.
pub fn crc_with_hole(bytes: &[u8], crc_offset: usize) -> u32 {
    assert!(crc_offset + 4 <= bytes.len(), "a checksum field past the end of its bytes");
    let crc = crc32c::crc32c(&bytes[..crc_offset]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    crc32c::crc32c_append(crc, &bytes[crc_offset + 4..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_all_widths() {
        let mut writer = Writer::new();
        writer.u8(7);
        writer.u16(0xBEEF);
        writer.u32(0xDEAD_BEEF);
        writer.u64(u64::MAX - 1);
        writer.i64(-5);
        writer.bytes16(b"name");
        let bytes = writer.into_bytes();
        let mut reader = Reader::new(&bytes, "test");
        assert_eq!(reader.u8().unwrap(), 7);
        assert_eq!(reader.u16().unwrap(), 0xBEEF);
        assert_eq!(reader.u32().unwrap(), 0xDEAD_BEEF);
        assert_eq!(reader.u64().unwrap(), u64::MAX - 1);
        assert_eq!(reader.i64().unwrap(), -5);
        assert_eq!(reader.bytes16().unwrap(), b"name");
        assert!(reader.is_empty());
        assert!(matches!(reader.u8(), Err(FormatError::Truncated { what: "test" })));
    }

    #[test]
    fn short_length_prefixed_string_is_truncated_not_panic() {
        let bytes = [200u8, 0, b'a'];
        let mut reader = Reader::new(&bytes, "name");
        assert!(reader.bytes16().is_err());
    }
}
