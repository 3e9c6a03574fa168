//! The superblock: written once by mkfs, in two copies (blocks 0 and 1).
//!
//! It only describes the fixed layout; everything that changes lives in the
//! checkpoint slots and the journal, so the superblock is never rewritten and
//! can never be torn after mkfs.

use std::ops::RangeInclusive;

use super::codec::{crc_with_hole, open_header, Writer};
use super::record::Timestamp;
use super::{
    FormatError, BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, FORMAT_VERSION, FORMAT_VERSION_INDEX,
    FORMAT_VERSION_OLDEST, HEADER_BYTES, SECTOR_BYTES_MIN,
};

/// The metadata index's page (`index::PAGE_BYTES`, checked where
/// both are named: the `meta` module), which format 3's blocks must hold whole.
pub const INDEX_PAGE_BYTES: u64 = 4096;

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"FOLIOFS\0";
const WHAT: &str = "superblock";
const CRC_OFFSET: usize = HEADER_BYTES - 4;

/// Smallest volume mkfs accepts: room for a 1 MiB journal, two 1 MiB checkpoint
/// slots and some data.
pub const VOLUME_BYTES_MIN: u64 = 8 << 20;
/// Journal size bounds; mkfs picks 1/128 of the volume within
/// `JOURNAL_BYTES_DEFAULT_MIN..=JOURNAL_BYTES_MAX` unless told otherwise.
pub const JOURNAL_BYTES_MIN: u64 = 64 << 10;
pub const JOURNAL_BYTES_MAX: u64 = 256 << 20;
const JOURNAL_BYTES_DEFAULT_MIN: u64 = 1 << 20;
const SLOT_BYTES_MIN: u64 = 1 << 20;
const SLOT_BYTES_MAX: u64 = 1 << 30;

/// A run of file-system blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub start_block: u64,
    pub block_count: u64,
}

impl Region {
    pub fn end_block(&self) -> u64 {
        self.start_block + self.block_count
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// The volume's format ([`FORMAT_VERSION`] for new volumes): what it may
    /// hold, and so which builds open it.
    pub version: u32,
    pub block_bytes: u32,
    /// Alignment of journal groups and checkpoint headers: the device's
    /// logical block size at mkfs, at least 512 B.
    pub sector_bytes: u32,
    pub uuid: [u8; 16],
    pub block_count: u64,
    pub journal: Region,
    pub checkpoint_slots: [Region; 2],
    pub data: Region,
    pub created: Timestamp,
}

impl Superblock {
    /// Computes the layout of a new volume of `volume_bytes`, with a journal
    /// of `journal_bytes` and checkpoint slots of `checkpoint_bytes` each
    /// (rounded up to blocks), or default sizes.
    pub fn layout(
        volume_bytes: u64,
        block_bytes: u32,
        sector_bytes: u32,
        journal_bytes: Option<u64>,
        checkpoint_bytes: Option<u64>,
        uuid: [u8; 16],
        created: Timestamp,
    ) -> Result<Self, FormatError> {
        check_block_bytes(block_bytes)?;
        check_sector_bytes(sector_bytes, block_bytes)?;
        if volume_bytes < VOLUME_BYTES_MIN {
            return Err(FormatError::invalid(
                WHAT,
                "size",
                format!(
                    "volume of {volume_bytes} bytes is too small; the minimum is {} MiB",
                    VOLUME_BYTES_MIN >> 20
                ),
            ));
        }
        let block = u64::from(block_bytes);
        let block_count = volume_bytes / block;
        let blocks_of = |bytes: u64| bytes.div_ceil(block);
        let journal_bytes = size_within(
            "journal size",
            journal_bytes,
            JOURNAL_BYTES_MIN..=JOURNAL_BYTES_MAX,
            (volume_bytes / 128).clamp(JOURNAL_BYTES_DEFAULT_MIN, JOURNAL_BYTES_MAX),
        )?;
        let journal_blocks = blocks_of(journal_bytes);
        let slot_bytes = size_within(
            "metadata size",
            checkpoint_bytes,
            SLOT_BYTES_MIN..=SLOT_BYTES_MAX,
            (volume_bytes / 128).clamp(SLOT_BYTES_MIN, SLOT_BYTES_MAX),
        )?;
        let slot_blocks = blocks_of(slot_bytes);
        let journal = Region { start_block: 2, block_count: journal_blocks };
        let slot_a = Region { start_block: journal.end_block(), block_count: slot_blocks };
        let slot_b = Region { start_block: slot_a.end_block(), block_count: slot_blocks };
        let data_start = slot_b.end_block();
        if data_start >= block_count {
            return Err(FormatError::invalid(WHAT, "size", "no room left for data"));
        }
        let data = Region { start_block: data_start, block_count: block_count - data_start };
        // The regions fill the volume's whole blocks, in order.
        debug_assert!(journal_blocks > 0 && slot_blocks > 0);
        debug_assert_eq!(data.end_block(), block_count);
        let superblock = Self {
            version: FORMAT_VERSION,
            block_bytes,
            sector_bytes,
            uuid,
            block_count,
            journal,
            checkpoint_slots: [slot_a, slot_b],
            data,
            created,
        };
        superblock.validate()?;
        Ok(superblock)
    }

    /// This layout as format 3: the slots shrink to one index root record
    /// each (a page, in whole blocks) and the data region takes the rest.
    /// The index's pages come from the data region, so blocks must hold
    /// whole pages.
    pub fn with_metadata_index(mut self) -> Result<Self, FormatError> {
        let page = INDEX_PAGE_BYTES;
        if self.block_bytes_u64() < page {
            return Err(FormatError::invalid(
                WHAT,
                "block_bytes",
                format!(
                    "a metadata index needs blocks of at least {page} bytes, not {}",
                    self.block_bytes
                ),
            ));
        }
        let slot_a = Region { start_block: self.journal.end_block(), block_count: 1 };
        let slot_b = Region { start_block: slot_a.end_block(), block_count: 1 };
        let data_start = slot_b.end_block();
        self.data = Region { start_block: data_start, block_count: self.block_count - data_start };
        self.checkpoint_slots = [slot_a, slot_b];
        self.version = FORMAT_VERSION_INDEX;
        self.validate()?;
        Ok(self)
    }

    /// Whether the metadata's checkpoint lives in a paged index (format 3).
    pub fn metadata_in_index(&self) -> bool {
        self.version >= FORMAT_VERSION_INDEX
    }

    /// The bytes where an index of format 3 keeps its two root records, a
    /// page each: from slot A's start, inside the two slots.
    pub fn index_root_region(&self) -> std::ops::Range<u64> {
        let start = self.checkpoint_slots[0].start_block * self.block_bytes_u64();
        start..start + 2 * INDEX_PAGE_BYTES
    }

    pub fn block_bytes_u64(&self) -> u64 {
        u64::from(self.block_bytes)
    }

    pub fn volume_bytes(&self) -> u64 {
        self.block_count * self.block_bytes_u64()
    }

    /// Byte offset of superblock copy `index` (0 or 1).
    pub fn copy_offset(block_bytes: u32, index: usize) -> u64 {
        debug_assert!(index < 2);
        index as u64 * u64::from(block_bytes)
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut writer = Writer::with_capacity(HEADER_BYTES);
        writer.raw(&SUPERBLOCK_MAGIC);
        writer.u32(self.version);
        writer.u32(HEADER_BYTES as u32);
        writer.u32(self.block_bytes);
        writer.u32(self.sector_bytes);
        writer.raw(&self.uuid);
        writer.u64(self.block_count);
        for region in [self.journal, self.checkpoint_slots[0], self.checkpoint_slots[1], self.data]
        {
            writer.u64(region.start_block);
            writer.u64(region.block_count);
        }
        writer.i64(self.created.secs);
        writer.u32(self.created.nanos);
        assert!(writer.len() <= CRC_OFFSET, "superblock fields run into its checksum");
        let mut bytes = [0u8; HEADER_BYTES];
        bytes[..writer.len()].copy_from_slice(writer.as_bytes());
        let crc = crc_with_hole(&bytes, CRC_OFFSET);
        bytes[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let (mut reader, version) = open_header(
            bytes,
            &SUPERBLOCK_MAGIC,
            WHAT,
            FORMAT_VERSION_OLDEST..=FORMAT_VERSION_INDEX,
        )?;
        let block_bytes = reader.u32()?;
        let sector_bytes = reader.u32()?;
        let uuid = reader.array::<16>()?;
        let block_count = reader.u64()?;
        let mut regions = [Region { start_block: 0, block_count: 0 }; 4];
        for region in &mut regions {
            region.start_block = reader.u64()?;
            region.block_count = reader.u64()?;
        }
        let created = Timestamp { secs: reader.i64()?, nanos: reader.u32()? };
        let superblock = Self {
            version,
            block_bytes,
            sector_bytes,
            uuid,
            block_count,
            journal: regions[0],
            checkpoint_slots: [regions[1], regions[2]],
            data: regions[3],
            created,
        };
        superblock.validate()?;
        Ok(superblock)
    }

    /// Checks every relationship between fields; run after decode and before encode.
    pub fn validate(&self) -> Result<(), FormatError> {
        check_block_bytes(self.block_bytes)?;
        check_sector_bytes(self.sector_bytes, self.block_bytes)?;
        if self.created.nanos >= 1_000_000_000 {
            return Err(FormatError::invalid(WHAT, "created", "nanoseconds out of range"));
        }
        let ordered = [
            ("journal", self.journal),
            ("checkpoint slot A", self.checkpoint_slots[0]),
            ("checkpoint slot B", self.checkpoint_slots[1]),
            ("data", self.data),
        ];
        let mut next_free_block = 2u64;
        for (name, region) in ordered {
            let Some(end) = region.start_block.checked_add(region.block_count) else {
                return Err(FormatError::invalid(
                    WHAT,
                    "layout",
                    format!("{name} region overflows"),
                ));
            };
            if region.block_count == 0
                || region.start_block < next_free_block
                || end > self.block_count
            {
                return Err(FormatError::invalid(
                    WHAT,
                    "layout",
                    format!(
                        "{name} region [{}, {end}) is empty, overlaps the previous region or \
                         passes the end of the volume ({} blocks)",
                        region.start_block, self.block_count
                    ),
                ));
            }
            next_free_block = end;
        }
        // mkfs never makes a journal outside these bounds, and a smaller one
        // cannot hold a transaction in a group (found by fuzz_images).
        let journal_bytes = self.journal.block_count.saturating_mul(self.block_bytes_u64());
        if !(JOURNAL_BYTES_MIN..=JOURNAL_BYTES_MAX).contains(&journal_bytes) {
            return Err(FormatError::invalid(
                WHAT,
                "layout",
                format!("a journal of {journal_bytes} bytes is outside the sizes mkfs makes"),
            ));
        }
        if self.checkpoint_slots[0].block_count != self.checkpoint_slots[1].block_count {
            return Err(FormatError::invalid(WHAT, "layout", "checkpoint slots differ in size"));
        }
        if self.block_count.checked_mul(self.block_bytes_u64()).is_none() {
            return Err(FormatError::invalid(WHAT, "block_count", "volume size overflows"));
        }
        Ok(())
    }
}

fn check_block_bytes(block_bytes: u32) -> Result<(), FormatError> {
    if !block_bytes.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
    {
        return Err(FormatError::invalid(
            WHAT,
            "block_bytes",
            format!(
                "{block_bytes} is not a power of two between {BLOCK_BYTES_MIN} and {BLOCK_BYTES_MAX}"
            ),
        ));
    }
    Ok(())
}

fn check_sector_bytes(sector_bytes: u32, block_bytes: u32) -> Result<(), FormatError> {
    if !sector_bytes.is_power_of_two()
        || sector_bytes < SECTOR_BYTES_MIN
        || sector_bytes > block_bytes
    {
        return Err(FormatError::invalid(
            WHAT,
            "sector_bytes",
            format!(
                "{sector_bytes} is not a power of two between {SECTOR_BYTES_MIN} and the block size \
                 {block_bytes}"
            ),
        ));
    }
    Ok(())
}

/// The size asked for if it is within `range` (an error naming `what`
/// if not), else `default`.
fn size_within(
    what: &'static str,
    chosen: Option<u64>,
    range: RangeInclusive<u64>,
    default: u64,
) -> Result<u64, FormatError> {
    let Some(bytes) = chosen else { return Ok(default) };
    if range.contains(&bytes) {
        return Ok(bytes);
    }
    let (min, max) = (size_text(*range.start()), size_text(*range.end()));
    Err(FormatError::invalid(WHAT, what, format!("{bytes} bytes is outside {min} ..= {max}")))
}

/// A power-of-two size as people write it: 65536 as "64 KiB".
fn size_text(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock::layout(
            64 << 20,
            4096,
            512,
            None,
            None,
            [7; 16],
            Timestamp { secs: 1, nanos: 2 },
        )
        .unwrap()
    }

    #[test]
    fn round_trip() {
        let superblock = sample();
        let bytes = superblock.encode();
        assert_eq!(Superblock::decode(&bytes).unwrap(), superblock);
    }

    #[test]
    fn layout_regions_are_ordered_and_fill_the_volume() {
        let superblock = sample();
        assert_eq!(superblock.journal.start_block, 2);
        assert_eq!(superblock.checkpoint_slots[0].start_block, superblock.journal.end_block());
        assert_eq!(superblock.data.end_block(), superblock.block_count);
        assert_eq!(superblock.volume_bytes(), 64 << 20);
    }

    #[test]
    fn every_block_size_lays_out() {
        for shift in 10..=16 {
            let superblock = Superblock::layout(
                32 << 20,
                1 << shift,
                512,
                None,
                None,
                [1; 16],
                Timestamp::default(),
            )
            .unwrap();
            assert_eq!(Superblock::decode(&superblock.encode()).unwrap(), superblock);
        }
    }

    #[test]
    fn rejects_bad_block_sizes_and_small_volumes() {
        let ts = Timestamp::default();
        assert!(Superblock::layout(64 << 20, 3000, 512, None, None, [0; 16], ts).is_err());
        assert!(Superblock::layout(64 << 20, 512, 512, None, None, [0; 16], ts).is_err());
        assert!(Superblock::layout(64 << 20, 1 << 17, 512, None, None, [0; 16], ts).is_err());
        let err = Superblock::layout(1 << 20, 4096, 512, None, None, [0; 16], ts).unwrap_err();
        assert!(err.to_string().contains("too small"), "{err}");
        assert!(Superblock::layout(64 << 20, 4096, 512, Some(1 << 10), None, [0; 16], ts).is_err());
        let small =
            Superblock::layout(64 << 20, 4096, 512, Some(64 << 10), None, [0; 16], ts).unwrap();
        assert_eq!(small.journal.block_count, 16);
        // Room for metadata: 1 MiB to 1 GiB a slot, and data left over.
        let roomy =
            Superblock::layout(64 << 20, 4096, 512, None, Some(3 << 20), [0; 16], ts).unwrap();
        assert_eq!(roomy.checkpoint_slots.map(|slot| slot.block_count), [768, 768]);
        let tiny = Superblock::layout(64 << 20, 4096, 512, None, Some(64 << 10), [0; 16], ts);
        assert!(tiny.unwrap_err().to_string().contains("metadata size"));
        let no_data = Superblock::layout(64 << 20, 4096, 512, None, Some(32 << 20), [0; 16], ts);
        assert!(no_data.unwrap_err().to_string().contains("no room left for data"));
    }

    #[test]
    fn detects_corruption_and_foreign_data() {
        let bytes = sample().encode();
        let mut flipped = bytes;
        flipped[40] ^= 1;
        assert!(matches!(Superblock::decode(&flipped), Err(FormatError::BadChecksum { .. })));
        assert!(matches!(Superblock::decode(&[0u8; 512]), Err(FormatError::BadMagic { .. })));
        assert!(matches!(Superblock::decode(&bytes[..100]), Err(FormatError::Truncated { .. })));
    }
}
