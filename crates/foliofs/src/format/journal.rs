//! Journal group framing.
//!
//! A group is one atomic commit: a 64 B header followed by the encoded records,
//! padded to the volume's sector size. Both checksums are seeded with the
//! volume uuid, so a group left over from an earlier mkfs of the same image can
//! never be mistaken for one of ours.

use super::codec::{Reader, Writer};
use super::{align_up, FormatError};

pub const GROUP_MAGIC: [u8; 8] = *b"FOLIOJNL";
pub const GROUP_HEADER_BYTES: usize = 64;
const WHAT: &str = "journal group";
const PAYLOAD_CRC_OFFSET: usize = 32;
const HEADER_CRC_OFFSET: usize = 60;
const _: () = assert!(PAYLOAD_CRC_OFFSET + 8 <= HEADER_CRC_OFFSET);
const _: () = assert!(HEADER_CRC_OFFSET + 4 == GROUP_HEADER_BYTES);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupHeader {
    /// Groups are numbered consecutively; replay expects exactly the next one.
    pub seq: u64,
    /// Log sequence number of the first record; records are numbered consecutively.
    pub first_lsn: u64,
    pub record_count: u32,
    pub payload_bytes: u32,
    /// `header_crc` of the group before this one (a hash chain): a stale group
    /// left behind a damaged one can never be taken for its successor.
    pub prev_header_crc: u32,
    /// This header's own checksum, which the next group carries.
    pub header_crc: u32,
}

impl GroupHeader {
    /// Bytes the whole group occupies in the journal.
    pub fn stored_bytes(&self, sector_bytes: u32) -> u64 {
        let bytes = GROUP_HEADER_BYTES as u64 + u64::from(self.payload_bytes);
        let stored = align_up(bytes, u64::from(sector_bytes));
        debug_assert!(stored >= bytes && stored - bytes < u64::from(sector_bytes));
        stored
    }
}

/// What a new group says about itself and its predecessor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLink {
    pub seq: u64,
    pub first_lsn: u64,
    pub record_count: u32,
    pub prev_header_crc: u32,
}

/// Builds the bytes of a group: header, payload, zero padding to
/// `sector_bytes`. Returns them with the header's checksum.
pub fn encode_group(
    uuid: &[u8; 16],
    link: GroupLink,
    payload: &[u8],
    sector_bytes: u32,
) -> (Vec<u8>, u32) {
    let payload_bytes = u32::try_from(payload.len()).expect("journal group payload over 4 GiB");
    assert!(sector_bytes.is_power_of_two(), "sector size {sector_bytes}");
    let GroupLink { seq, first_lsn, record_count, prev_header_crc } = link;
    let header =
        GroupHeader { seq, first_lsn, record_count, payload_bytes, prev_header_crc, header_crc: 0 };
    let mut writer = Writer::with_capacity(header.stored_bytes(sector_bytes) as usize);
    writer.raw(&GROUP_MAGIC);
    writer.u64(seq);
    writer.u64(first_lsn);
    writer.u32(record_count);
    writer.u32(payload_bytes);
    writer.u32(seeded_crc(uuid, payload));
    writer.u32(prev_header_crc);
    writer.raw(&[0u8; HEADER_CRC_OFFSET - PAYLOAD_CRC_OFFSET - 8]);
    let header_crc = seeded_crc(uuid, writer.as_bytes());
    writer.u32(header_crc);
    debug_assert_eq!(writer.len(), GROUP_HEADER_BYTES);
    writer.raw(payload);
    let mut bytes = writer.into_bytes();
    bytes.resize(header.stored_bytes(sector_bytes) as usize, 0);
    // Whole sectors (an O_DIRECT write), the payload within them.
    debug_assert!(bytes.len().is_multiple_of(sector_bytes as usize));
    debug_assert!(bytes.len() >= GROUP_HEADER_BYTES + payload.len());
    (bytes, header_crc)
}

/// Decodes and checks a group header. `payload_bytes_max` bounds the payload
/// length so a corrupt header cannot make the caller read past the journal.
pub fn decode_group_header(
    bytes: &[u8],
    uuid: &[u8; 16],
    payload_bytes_max: u64,
) -> Result<GroupHeader, FormatError> {
    if bytes.len() < GROUP_HEADER_BYTES {
        return Err(FormatError::Truncated { what: WHAT });
    }
    if bytes[..8] != GROUP_MAGIC {
        return Err(FormatError::BadMagic { what: WHAT });
    }
    let stored =
        u32::from_le_bytes(bytes[HEADER_CRC_OFFSET..GROUP_HEADER_BYTES].try_into().expect("4"));
    let computed = seeded_crc(uuid, &bytes[..HEADER_CRC_OFFSET]);
    if stored != computed {
        return Err(FormatError::BadChecksum { what: WHAT, stored, computed });
    }
    let mut reader = Reader::new(&bytes[8..HEADER_CRC_OFFSET], WHAT);
    let seq = reader.u64()?;
    let first_lsn = reader.u64()?;
    let record_count = reader.u32()?;
    let payload_bytes = reader.u32()?;
    let _payload_crc = reader.u32()?;
    let prev_header_crc = reader.u32()?;
    let header = GroupHeader {
        seq,
        first_lsn,
        record_count,
        payload_bytes,
        prev_header_crc,
        header_crc: stored,
    };
    if u64::from(header.payload_bytes) > payload_bytes_max {
        return Err(FormatError::invalid(WHAT, "payload_bytes", header.payload_bytes.to_string()));
    }
    Ok(header)
}

/// Checks the payload that follows a decoded header; returns the payload slice.
pub fn check_group_payload<'a>(
    group_bytes: &'a [u8],
    header: &GroupHeader,
    uuid: &[u8; 16],
) -> Result<&'a [u8], FormatError> {
    let end = GROUP_HEADER_BYTES + header.payload_bytes as usize;
    if group_bytes.len() < end {
        return Err(FormatError::Truncated { what: WHAT });
    }
    let payload = &group_bytes[GROUP_HEADER_BYTES..end];
    debug_assert_eq!(payload.len(), header.payload_bytes as usize);
    let stored = u32::from_le_bytes(
        group_bytes[PAYLOAD_CRC_OFFSET..PAYLOAD_CRC_OFFSET + 4].try_into().expect("4 bytes"),
    );
    let computed = seeded_crc(uuid, payload);
    if stored != computed {
        return Err(FormatError::BadChecksum { what: WHAT, stored, computed });
    }
    Ok(payload)
}

fn seeded_crc(uuid: &[u8; 16], bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(uuid), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_padding() {
        let uuid = [3u8; 16];
        let link = GroupLink { seq: 9, first_lsn: 100, record_count: 2, prev_header_crc: 77 };
        let (bytes, header_crc) = encode_group(&uuid, link, b"payload!", 512);
        assert_eq!(bytes.len(), 512);
        let header = decode_group_header(&bytes, &uuid, 1 << 20).unwrap();
        let expected = GroupHeader {
            seq: 9,
            first_lsn: 100,
            record_count: 2,
            payload_bytes: 8,
            prev_header_crc: 77,
            header_crc,
        };
        assert_eq!(header, expected);
        assert_eq!(check_group_payload(&bytes, &header, &uuid).unwrap(), b"payload!");
    }

    #[test]
    fn foreign_uuid_and_flipped_bits_are_rejected() {
        let uuid = [3u8; 16];
        let link = GroupLink { seq: 1, first_lsn: 1, record_count: 0, prev_header_crc: 0 };
        let (bytes, _) = encode_group(&uuid, link, b"x", 512);
        assert!(decode_group_header(&bytes, &[4u8; 16], 1 << 20).is_err());
        for index in 0..GROUP_HEADER_BYTES + 1 {
            let mut flipped = bytes.clone();
            flipped[index] ^= 0x10;
            let ok = decode_group_header(&flipped, &uuid, 1 << 20)
                .and_then(|header| check_group_payload(&flipped, &header, &uuid).map(|_| ()));
            assert!(ok.is_err(), "flip at {index} went unnoticed");
        }
    }

    #[test]
    fn oversized_payload_claim_is_rejected() {
        let uuid = [0u8; 16];
        let link = GroupLink { seq: 1, first_lsn: 1, record_count: 0, prev_header_crc: 0 };
        let (bytes, _) = encode_group(&uuid, link, &[0u8; 1000], 512);
        assert!(decode_group_header(&bytes, &uuid, 999).is_err());
    }
}
