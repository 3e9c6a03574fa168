//! The structures of an image (superblock copies, checkpoint slots,
//! journal groups), located for structure-aware mutation.

use super::*;

pub(crate) struct Slot {
    pub(crate) offset: usize,
    pub(crate) header: CheckpointHeader,
    pub(crate) records: Vec<Record>,
}

pub(crate) struct Group {
    pub(crate) offset: usize,
    pub(crate) header: GroupHeader,
    pub(crate) stored_bytes: usize,
    pub(crate) records: Vec<Record>,
}

pub(crate) struct Structures {
    pub(crate) superblock: Superblock,
    pub(crate) slots: Vec<Slot>,
    /// Valid groups found anywhere in the journal, in sequence order.
    pub(crate) groups: Vec<Group>,
}

impl Structures {
    pub(crate) fn of(image: &[u8]) -> Option<Self> {
        let superblock = Superblock::decode(image.get(..HEADER_BYTES)?).ok()?;
        let block = superblock.block_bytes as usize;
        let sector = superblock.sector_bytes as usize;
        let slot_bytes = superblock.checkpoint_slots[0].block_count as usize * block;
        let payload_max = (slot_bytes - sector) as u64;
        let mut slots = Vec::new();
        for region in superblock.checkpoint_slots {
            let offset = region.start_block as usize * block;
            let Some(bytes) = image.get(offset..offset + slot_bytes) else { continue };
            let Ok(header) = CheckpointHeader::decode(bytes, payload_max) else { continue };
            let payload = &bytes[sector..sector + header.payload_bytes as usize];
            let Ok(count) = u32::try_from(header.record_count) else { continue };
            let Ok(records) = decode_all(payload, count) else { continue };
            slots.push(Slot { offset, header, records });
        }
        let journal_start = superblock.journal.start_block as usize * block;
        let journal_bytes = superblock.journal.block_count as usize * block;
        let group_payload_max = (journal_bytes / 4 - GROUP_HEADER_BYTES) as u64;
        let mut groups = Vec::new();
        let mut at = 0;
        while at + sector <= journal_bytes {
            let offset = journal_start + at;
            let found = decode_group_header(
                image.get(offset..offset + sector)?,
                &superblock.uuid,
                group_payload_max,
            )
            .ok()
            .and_then(|header| {
                let stored = header.stored_bytes(superblock.sector_bytes) as usize;
                let bytes = image.get(offset..offset + stored)?;
                if at + stored > journal_bytes {
                    return None;
                }
                let payload = check_group_payload(bytes, &header, &superblock.uuid).ok()?;
                let records = decode_all(payload, header.record_count).ok()?;
                Some(Group { offset, header, stored_bytes: stored, records })
            });
            match found {
                Some(group) => {
                    at += group.stored_bytes;
                    groups.push(group);
                }
                None => at += sector,
            }
        }
        groups.sort_by_key(|group| group.header.seq);
        Some(Self { superblock, slots, groups })
    }

    pub(crate) fn newest_slot(&self) -> Option<usize> {
        (0..self.slots.len()).max_by_key(|&index| self.slots[index].header.generation)
    }

    pub(crate) fn journal_end(&self) -> usize {
        let block = self.superblock.block_bytes as usize;
        (self.superblock.journal.start_block + self.superblock.journal.block_count) as usize * block
    }
}

// ---------------------------------------------------------------------------
