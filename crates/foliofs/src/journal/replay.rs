//! Loading at mount: the newest valid checkpoint, then the journal groups
//! after it, walked until the first one missing, torn or out of sequence.
//! Reads only; nothing here writes the device.

use super::*;

/// Reads the newest valid checkpoint and the journal groups after it.
pub fn load(device: &Device, geometry: &JournalGeometry) -> Result<Loaded> {
    let (checkpoint, checkpoint_records) = load_checkpoint(device, geometry)?;
    load_from(device, geometry, checkpoint, checkpoint_records)
}

/// The journal groups after `checkpoint`, one an index's root record named
/// (a volume of format 3: the state itself is in the index).
pub fn load_after(
    device: &Device,
    geometry: &JournalGeometry,
    checkpoint: CheckpointHeader,
) -> Result<Loaded> {
    check_replay_point(&checkpoint, geometry)?;
    load_from(device, geometry, checkpoint, Vec::new())
}

fn load_from(
    device: &Device,
    geometry: &JournalGeometry,
    checkpoint: CheckpointHeader,
    checkpoint_records: Vec<Record>,
) -> Result<Loaded> {
    let mut reader = GroupReader::new(device, geometry, &checkpoint);
    let mut journal_records = Vec::new();
    let mut groups_replayed = 0u64;
    while let Some((header, records)) = reader.next_group()? {
        groups_replayed += 1;
        debug_assert!(header.first_lsn >= 1, "`continues` takes no group at lsn 0");
        let skip = checkpoint.lsn_applied.saturating_sub(header.first_lsn - 1) as usize;
        journal_records.extend(records.into_iter().skip(skip));
    }
    let position = JournalPosition {
        head: reader.head,
        tail: checkpoint.journal_replay_offset,
        next_seq: reader.expected_seq,
        last_header_crc: reader.expected_prev_crc,
        next_lsn: reader.expected_lsn.max(checkpoint.lsn_applied + 1),
        checkpoint_generation: checkpoint.generation,
    };
    debug_assert!(position.tail <= position.head, "replay moved the head backwards");
    Ok(Loaded {
        checkpoint,
        checkpoint_records,
        journal_records,
        journal_groups_replayed: groups_replayed,
        position,
    })
}

fn load_checkpoint(
    device: &Device,
    geometry: &JournalGeometry,
) -> Result<(CheckpointHeader, Vec<Record>)> {
    let mut best: Option<(CheckpointHeader, Vec<Record>)> = None;
    let mut problems = Vec::new();
    for (index, &slot_offset) in geometry.slot_offsets.iter().enumerate() {
        match read_checkpoint_slot(device, geometry, slot_offset) {
            // A slot that cannot be read may hold the newest checkpoint:
            // mounting the other one instead would bring back an older state
            // (and the next checkpoint would overwrite the newer one), so a
            // device error fails the mount as the error it is (found by
            // tests/faults/, checked by tests/faults/targeted.rs).
            Err(error @ Error::Io { .. }) => return Err(error),
            Ok((header, records)) => {
                if header.slot_index() != index {
                    problems.push(format!("slot {index}: generation in the wrong slot"));
                } else if best
                    .as_ref()
                    .is_none_or(|(current, _)| header.generation > current.generation)
                {
                    best = Some((header, records));
                }
            }
            Err(error) => problems.push(format!("slot {index}: {error}")),
        }
    }
    best.ok_or_else(|| Error::Corrupt(format!("no valid checkpoint ({})", problems.join("; "))))
}

fn read_checkpoint_slot(
    device: &Device,
    geometry: &JournalGeometry,
    slot_offset: u64,
) -> Result<(CheckpointHeader, Vec<Record>)> {
    let header_area = geometry.header_area_bytes();
    let mut header_bytes = AlignedBuf::zeroed(header_area);
    device.read(slot_offset, &mut header_bytes).context(|| "read checkpoint header".into())?;
    let header = CheckpointHeader::decode(&header_bytes, geometry.slot_payload_bytes_max())?;
    if header.uuid != geometry.uuid {
        return Err(Error::Corrupt("checkpoint belongs to another volume (uuid differs)".into()));
    }
    check_replay_point(&header, geometry)?;
    let payload_stored = align_up(header.payload_bytes, u64::from(geometry.sector_bytes));
    let mut payload = AlignedBuf::zeroed(payload_stored as usize);
    if payload_stored > 0 {
        device
            .read(slot_offset + header_area as u64, &mut payload)
            .context(|| "read checkpoint payload".into())?;
    }
    debug_assert!(payload_stored >= header.payload_bytes);
    let payload = &payload[..header.payload_bytes as usize];
    header.check_payload(payload)?;
    let count = u32::try_from(header.record_count).map_err(|_| {
        Error::Corrupt(format!("checkpoint claims {} records", header.record_count))
    })?;
    Ok((header, decode_all(payload, count)?))
}

/// Counters (generation, group sequence, lsn) start at 1 and grow by one per
/// checkpoint, group or record: no volume comes near this, and a header
/// claiming more would overflow the arithmetic that continues from it.
const COUNTER_MAX: u64 = 1 << 62;

/// A checksummed header can still be hostile (or written by a buggy
/// build): its replay point must lie inside the journal, on a sector, and
/// its counters must leave room to count on. Found by fuzz_images.
fn check_replay_point(header: &CheckpointHeader, geometry: &JournalGeometry) -> Result<()> {
    let offset = header.journal_replay_offset;
    if offset >= geometry.journal_bytes || !offset.is_multiple_of(u64::from(geometry.sector_bytes))
    {
        return Err(Error::Corrupt(format!(
            "checkpoint replay offset {offset} is not a sector inside the journal ({} bytes)",
            geometry.journal_bytes
        )));
    }
    let counters = [
        ("generation", header.generation),
        ("journal sequence", header.journal_replay_seq),
        ("lsn", header.lsn_applied),
    ];
    if let Some((name, value)) = counters.iter().find(|(_, value)| *value > COUNTER_MAX) {
        return Err(Error::Corrupt(format!("checkpoint {name} {value} is out of range")));
    }
    Ok(())
}

/// Walks the journal from a checkpoint's replay point, group by group, until
/// the first group that is missing, torn, or out of sequence.
struct GroupReader<'a> {
    device: &'a Device,
    geometry: &'a JournalGeometry,
    head: u64,
    expected_seq: u64,
    expected_prev_crc: u32,
    expected_lsn: u64,
    lsn_applied: u64,
}

impl<'a> GroupReader<'a> {
    fn new(
        device: &'a Device,
        geometry: &'a JournalGeometry,
        checkpoint: &CheckpointHeader,
    ) -> Self {
        Self {
            device,
            geometry,
            head: checkpoint.journal_replay_offset,
            expected_seq: checkpoint.journal_replay_seq,
            expected_prev_crc: checkpoint.journal_prev_crc,
            expected_lsn: checkpoint.lsn_applied + 1,
            lsn_applied: checkpoint.lsn_applied,
        }
    }

    /// The next valid group, trying the current position and then the start
    /// of the next lap; `None` ends replay.
    fn next_group(&mut self) -> Result<Option<(GroupHeader, Vec<Record>)>> {
        let journal_bytes = self.geometry.journal_bytes;
        let here = self.head;
        let next_lap = align_up_any(here + 1, journal_bytes);
        for candidate in [here, next_lap] {
            if candidate != here && here.is_multiple_of(journal_bytes) {
                continue;
            }
            if let Some(found) = self.try_group_at(candidate)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    fn try_group_at(&mut self, virtual_offset: u64) -> Result<Option<(GroupHeader, Vec<Record>)>> {
        let geometry = self.geometry;
        let physical = virtual_offset % geometry.journal_bytes;
        let sector = u64::from(geometry.sector_bytes);
        if physical + sector > geometry.journal_bytes {
            return Ok(None);
        }
        let mut first_sector = AlignedBuf::zeroed(sector as usize);
        self.device
            .read(geometry.journal_offset + physical, &mut first_sector)
            .context(|| "read journal".into())?;
        let payload_max = geometry.group_payload_bytes_max();
        let Ok(header) = decode_group_header(&first_sector, &geometry.uuid, payload_max) else {
            return Ok(None);
        };
        if !self.continues(&header) {
            return Ok(None);
        }
        let stored = header.stored_bytes(geometry.sector_bytes);
        if physical + stored > geometry.journal_bytes {
            return Ok(None);
        }
        let mut group = AlignedBuf::zeroed(stored as usize);
        self.device
            .read(geometry.journal_offset + physical, &mut group)
            .context(|| "read journal".into())?;
        let Ok(payload) = check_group_payload(&group, &header, &geometry.uuid) else {
            return Ok(None);
        };
        let records = decode_all(payload, header.record_count).map_err(|error| {
            Error::Corrupt(format!("journal group {} has a valid checksum but {error}", header.seq))
        })?;
        // The checkpoint's replay point is a sector, and groups fill whole
        // sectors: every group starts on one.
        debug_assert!(physical.is_multiple_of(sector) && stored.is_multiple_of(sector));
        debug_assert!(virtual_offset >= self.head, "replay went back");
        self.head = virtual_offset + stored;
        self.expected_seq += 1;
        self.expected_prev_crc = header.header_crc;
        self.expected_lsn = header.first_lsn + u64::from(header.record_count);
        Ok(Some((header, records)))
    }

    /// Whether `header` is the group replay expects next: the next sequence
    /// number, and records that continue the last group's, except that while
    /// replay is still inside what the checkpoint holds, a group may start
    /// anywhere up to the first record the checkpoint lacks (a crash can lose
    /// a group whose records the checkpoint already has).
    fn continues(&self, header: &GroupHeader) -> bool {
        let first_missing = self.lsn_applied + 1;
        header.seq == self.expected_seq
            && header.prev_header_crc == self.expected_prev_crc
            && header.first_lsn != 0
            && (header.first_lsn == self.expected_lsn
                || header.first_lsn <= first_missing && self.expected_lsn <= first_missing)
    }
}
