//! Checkpoint slots.
//!
//! A checkpoint is the whole metadata state written as a sequence of records
//! (a compacted log) after a one-sector header. Checkpoints alternate between
//! the two slots; mount picks the valid one with the higher generation, so a
//! torn checkpoint write falls back to the previous one, whose journal tail is
//! kept until the new checkpoint is durable.

use super::codec::{crc_with_hole, open_header, Writer};
use super::{FormatError, CHECKPOINT_HEADER_VERSION, HEADER_BYTES};

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"FOLIOCKP";
const WHAT: &str = "checkpoint";
const CRC_OFFSET: usize = HEADER_BYTES - 4;
/// Bytes of an index root record its owner fills (the `index` module).
pub const ATTACHED_BYTES: usize = 40;
const ATTACHED_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub uuid: [u8; 16],
    /// Increases by one per checkpoint; generation `g` lives in slot `g % 2`.
    pub generation: u64,
    /// Where replay starts, in bytes from the start of the journal region.
    pub journal_replay_offset: u64,
    /// The group sequence number replay expects at that offset.
    pub journal_replay_seq: u64,
    /// The `prev_header_crc` that group must carry (the journal's hash chain).
    pub journal_prev_crc: u32,
    /// Records with an lsn at or below this are already in the checkpoint.
    pub lsn_applied: u64,
    /// Next inode number to hand out.
    pub next_ino: u64,
    pub record_count: u64,
    pub payload_bytes: u64,
    pub payload_crc: u32,
}

impl CheckpointHeader {
    pub fn slot_index(&self) -> usize {
        (self.generation % 2) as usize
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut writer = Writer::with_capacity(HEADER_BYTES);
        writer.raw(&CHECKPOINT_MAGIC);
        writer.u32(CHECKPOINT_HEADER_VERSION);
        writer.u32(HEADER_BYTES as u32);
        writer.raw(&self.uuid);
        writer.u64(self.generation);
        writer.u64(self.journal_replay_offset);
        writer.u64(self.journal_replay_seq);
        writer.u64(self.lsn_applied);
        writer.u64(self.next_ino);
        writer.u64(self.record_count);
        writer.u64(self.payload_bytes);
        writer.u32(self.payload_crc);
        writer.u32(self.journal_prev_crc);
        assert!(writer.len() <= CRC_OFFSET, "checkpoint header fields run into its checksum");
        let mut bytes = [0u8; HEADER_BYTES];
        bytes[..writer.len()].copy_from_slice(writer.as_bytes());
        let crc = crc_with_hole(&bytes, CRC_OFFSET);
        bytes[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes a header; `payload_bytes_max` is the room the slot has after it.
    pub fn decode(bytes: &[u8], payload_bytes_max: u64) -> Result<Self, FormatError> {
        let (mut reader, _) = open_header(
            bytes,
            &CHECKPOINT_MAGIC,
            WHAT,
            CHECKPOINT_HEADER_VERSION..=CHECKPOINT_HEADER_VERSION,
        )?;
        let header = Self {
            uuid: reader.array()?,
            generation: reader.u64()?,
            journal_replay_offset: reader.u64()?,
            journal_replay_seq: reader.u64()?,
            lsn_applied: reader.u64()?,
            next_ino: reader.u64()?,
            record_count: reader.u64()?,
            payload_bytes: reader.u64()?,
            payload_crc: reader.u32()?,
            journal_prev_crc: reader.u32()?,
        };
        if header.payload_bytes > payload_bytes_max {
            return Err(FormatError::invalid(
                WHAT,
                "payload_bytes",
                format!("{} exceeds the slot ({payload_bytes_max})", header.payload_bytes),
            ));
        }
        if header.generation == 0 || header.next_ino < 2 {
            return Err(FormatError::invalid(WHAT, "generation/next_ino", "zero"));
        }
        Ok(header)
    }

    /// What a volume of format 3 keeps in its index's root record
    /// (`index::ATTACHED_BYTES`) in place of a slot's header: where
    /// the log resumes and the next inode number. The index is the payload.
    pub fn encode_attached(&self) -> [u8; ATTACHED_BYTES] {
        let mut writer = Writer::with_capacity(ATTACHED_BYTES);
        writer.u32(ATTACHED_VERSION);
        writer.u64(self.journal_replay_offset);
        writer.u64(self.journal_replay_seq);
        writer.u64(self.lsn_applied);
        writer.u64(self.next_ino);
        writer.u32(self.journal_prev_crc);
        let mut bytes = [0u8; ATTACHED_BYTES];
        bytes[..writer.len()].copy_from_slice(writer.as_bytes());
        bytes
    }

    /// The header `encode_attached` wrote into the root record of index
    /// generation `generation` (the root record's checksum covers it).
    pub fn decode_attached(
        bytes: &[u8; ATTACHED_BYTES],
        uuid: [u8; 16],
        generation: u64,
    ) -> Result<Self, FormatError> {
        let mut reader = super::codec::Reader::new(bytes, WHAT);
        let version = reader.u32()?;
        if version != ATTACHED_VERSION {
            return Err(FormatError::invalid(
                WHAT,
                "version",
                format!("the index root names log position version {version}"),
            ));
        }
        let header = Self {
            uuid,
            generation,
            journal_replay_offset: reader.u64()?,
            journal_replay_seq: reader.u64()?,
            lsn_applied: reader.u64()?,
            next_ino: reader.u64()?,
            journal_prev_crc: reader.u32()?,
            record_count: 0,
            payload_bytes: 0,
            payload_crc: 0,
        };
        if header.generation == 0 || header.next_ino < 2 {
            return Err(FormatError::invalid(WHAT, "generation/next_ino", "zero"));
        }
        Ok(header)
    }

    pub fn check_payload(&self, payload: &[u8]) -> Result<(), FormatError> {
        if payload.len() as u64 != self.payload_bytes {
            return Err(FormatError::Truncated { what: WHAT });
        }
        let computed = crc32c::crc32c(payload);
        if computed != self.payload_crc {
            return Err(FormatError::BadChecksum {
                what: WHAT,
                stored: self.payload_crc,
                computed,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointHeader {
        CheckpointHeader {
            uuid: [1; 16],
            generation: 3,
            journal_replay_offset: 4096,
            journal_replay_seq: 17,
            lsn_applied: 99,
            next_ino: 12,
            record_count: 5,
            payload_bytes: 3,
            payload_crc: crc32c::crc32c(b"abc"),
            journal_prev_crc: 5,
        }
    }

    #[test]
    fn round_trip_and_payload_check() {
        let header = sample();
        let decoded = CheckpointHeader::decode(&header.encode(), 1 << 20).unwrap();
        assert_eq!(decoded, header);
        assert_eq!(decoded.slot_index(), 1);
        decoded.check_payload(b"abc").unwrap();
        assert!(decoded.check_payload(b"abd").is_err());
        assert!(decoded.check_payload(b"ab").is_err());
    }

    #[test]
    fn the_log_position_round_trips_through_an_index_root() {
        let mut header = sample();
        (header.record_count, header.payload_bytes, header.payload_crc) = (0, 0, 0);
        let attached = header.encode_attached();
        assert_eq!(CheckpointHeader::decode_attached(&attached, [1; 16], 3).unwrap(), header);
        assert!(CheckpointHeader::decode_attached(&[0; ATTACHED_BYTES], [1; 16], 3).is_err());
    }

    #[test]
    fn rejects_payload_larger_than_slot() {
        let mut header = sample();
        header.payload_bytes = 1 << 40;
        assert!(CheckpointHeader::decode(&header.encode(), 1 << 20).is_err());
    }
}
