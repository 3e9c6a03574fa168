//! Mutations: raw (bit flips, hostile values, splices) and structure-aware
//! (a record or header field changed, checksums and hash chain recomputed).

use super::*;

pub(crate) const INTERESTING_U64: [u64; 16] = [
    0,
    1,
    2,
    3,
    7,
    255,
    4096,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
    u64::MAX / 4096,
];

pub(crate) const INTERESTING_U32: [u32; 9] =
    [0, 1, 2, 255, 0x7FFF_FFFF, 0x8000_0000, u32::MAX - 1, u32::MAX, 4095];

pub(crate) fn interesting_u64(rng: &mut ChaCha8Rng, near: &[u64]) -> u64 {
    match rng.random_range(0..4) {
        0 if !near.is_empty() => {
            let base = near[rng.random_range(0..near.len())];
            base.wrapping_add_signed(rng.random_range(-2i64..=2))
        }
        1 => rng.random(),
        _ => INTERESTING_U64[rng.random_range(0..INTERESTING_U64.len())],
    }
}

pub(crate) fn interesting_u32(rng: &mut ChaCha8Rng) -> u32 {
    if rng.random_bool(0.2) {
        rng.random()
    } else {
        INTERESTING_U32[rng.random_range(0..INTERESTING_U32.len())]
    }
}

/// Byte ranges worth mutating: the superblock copies and every non-zero
/// sector of the journal and checkpoint slots.
pub(crate) fn hot_ranges(image: &[u8]) -> Vec<(usize, usize)> {
    let Ok(superblock) = Superblock::decode(&image[..HEADER_BYTES.min(image.len())]) else {
        return vec![(0, image.len().min(2 << 16))];
    };
    let block = superblock.block_bytes as usize;
    let mut ranges = vec![(0, HEADER_BYTES), (block, block + HEADER_BYTES)];
    let metadata_end = superblock.data.start_block as usize * block;
    let mut at = superblock.journal.start_block as usize * block;
    while at < metadata_end.min(image.len()) {
        let end = (at + 512).min(image.len());
        if image[at..end].iter().any(|&byte| byte != 0) {
            ranges.push((at, end));
        }
        at += 512;
    }
    // A truncated image may end before the second copy.
    ranges.retain(|&(_, end)| end <= image.len());
    if ranges.is_empty() {
        ranges.push((0, image.len()));
    }
    ranges
}

/// The non-zero sectors of the data area: file contents (all metadata lives
/// in the journal and checkpoints), which nothing checks against anything.
pub(crate) fn data_ranges(image: &[u8]) -> Vec<(usize, usize)> {
    let Ok(superblock) = Superblock::decode(&image[..HEADER_BYTES.min(image.len())]) else {
        return Vec::new();
    };
    let block = superblock.block_bytes as usize;
    let start = (superblock.data.start_block as usize).saturating_mul(block);
    let end = (superblock.data.end_block() as usize).saturating_mul(block).min(image.len());
    (start..end)
        .step_by(512)
        .filter(|&at| image[at..(at + 512).min(end)].iter().any(|&byte| byte != 0))
        .map(|at| (at, (at + 512).min(end)))
        .collect()
}

/// One mutation of file data: bits, bytes, a sector of garbage, of 0xFF,
/// zeroed, or overwritten with metadata (a journal or checkpoint sector, so
/// data that looks like structure). Mount and fsck must not care; reading
/// the file returns bytes or an error.
pub(crate) fn mutate_data(rng: &mut ChaCha8Rng, image: &mut [u8]) -> Option<String> {
    let ranges = data_ranges(image);
    let at = pick_offset(rng, &ranges, 8)?;
    let sector = at / 512 * 512;
    let end = (sector + 512).min(image.len());
    Some(match rng.random_range(0..6) {
        0 => {
            let bit = rng.random_range(0..8);
            image[at] ^= 1 << bit;
            format!("data: flip bit {bit} at {at}")
        }
        1 => {
            let value = interesting_u64(rng, &[]);
            image[at..at + 8].copy_from_slice(&value.to_le_bytes());
            format!("data: u64 {value:#x} at {at}")
        }
        2 => {
            rng.fill(&mut image[sector..end]);
            format!("data: random sector at {sector}")
        }
        3 => {
            image[sector..end].fill(0xFF);
            format!("data: 0xFF sector at {sector}")
        }
        4 => {
            image[sector..end].fill(0);
            format!("data: zero sector at {sector}")
        }
        _ => {
            let metadata = hot_ranges(image);
            let from = pick_offset(rng, &metadata, end - sector)?;
            image.copy_within(from..from + (end - sector), sector);
            format!("data: metadata sector from {from} at {sector}")
        }
    })
}

pub(crate) fn pick_offset(
    rng: &mut ChaCha8Rng,
    ranges: &[(usize, usize)],
    width: usize,
) -> Option<usize> {
    if ranges.is_empty() {
        return None;
    }
    let (start, end) = ranges[rng.random_range(0..ranges.len())];
    if end < start + width {
        return None;
    }
    Some(rng.random_range(start..=end - width))
}

/// One raw mutation; returns what it did.
pub(crate) fn mutate_raw(rng: &mut ChaCha8Rng, image: &mut Vec<u8>, donor: &[u8]) -> String {
    let ranges = hot_ranges(image);
    let kind = rng.random_range(0..100);
    if kind < 3 && image.len() > 512 {
        let sectors = image.len() / 512;
        let keep = rng.random_range(1..sectors) * 512;
        image.truncate(keep);
        return format!("truncate to {keep}");
    }
    let Some(at) = pick_offset(rng, &ranges, 8) else { return "nothing".into() };
    match kind {
        0..=29 => {
            let bit = rng.random_range(0..8);
            image[at] ^= 1 << bit;
            format!("flip bit {bit} at {at}")
        }
        30..=44 => {
            let value = [0u8, 1, 0x7F, 0x80, 0xFF, rng.random()][rng.random_range(0..6)];
            image[at] = value;
            format!("byte {value:#x} at {at}")
        }
        45..=59 => {
            let value = interesting_u32(rng);
            image[at..at + 4].copy_from_slice(&value.to_le_bytes());
            format!("u32 {value:#x} at {at}")
        }
        60..=74 => {
            let value = interesting_u64(rng, &[]);
            image[at..at + 8].copy_from_slice(&value.to_le_bytes());
            format!("u64 {value:#x} at {at}")
        }
        75..=89 => {
            // Splice: bytes of a hot range of this image or another seed.
            let source = if rng.random_bool(0.5) { donor } else { &image[..] };
            let source_ranges = hot_ranges(source);
            let length = rng.random_range(1..=512usize);
            let Some(from) = pick_offset(rng, &source_ranges, length) else {
                return "nothing".into();
            };
            let length = length.min(image.len() - at);
            let bytes = source[from..from + length].to_vec();
            image[at..at + length].copy_from_slice(&bytes);
            format!("splice {length} bytes from {from} to {at}")
        }
        _ => {
            let sector = at / 512 * 512;
            let end = (sector + 512).min(image.len());
            image[sector..end].fill(0);
            format!("zero sector at {sector}")
        }
    }
}

pub(crate) fn mutate_attrs(rng: &mut ChaCha8Rng, attrs: &mut InodeAttrs, near: &[u64]) {
    match rng.random_range(0..8) {
        0 => attrs.size = interesting_u64(rng, near),
        1 => attrs.nlink = interesting_u32(rng),
        2 => {
            attrs.kind = [
                InodeKind::File,
                InodeKind::Dir,
                InodeKind::Symlink,
                InodeKind::Fifo,
                InodeKind::CharDevice,
            ][rng.random_range(0..5)]
        }
        3 => attrs.parent = interesting_u64(rng, near),
        4 => attrs.mode = interesting_u32(rng) & 0o7777,
        5 => attrs.mtime = Timestamp { secs: interesting_u64(rng, &[]) as i64, nanos: 999_999_999 },
        6 => attrs.uid = interesting_u32(rng),
        _ => attrs.size = interesting_u64(rng, &[]) >> rng.random_range(0..64),
    }
}

/// Changes one field of `record` to a hostile (but decodable) value.
pub(crate) fn mutate_record(rng: &mut ChaCha8Rng, record: &mut Record, near: &[u64]) {
    match record {
        Record::InodeSet { ino, attrs } => {
            if rng.random_bool(0.2) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                mutate_attrs(rng, attrs, near);
            }
        }
        Record::InodeFree { ino } => *ino = interesting_u64(rng, near).max(1),
        Record::SymlinkSet { ino, target } => {
            if rng.random_bool(0.5) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                *target = vec![b'x'; rng.random_range(1..=4095)];
            }
        }
        Record::DirAdd { dir, name, ino } => match rng.random_range(0..3) {
            0 => *dir = interesting_u64(rng, near).max(1),
            1 => *ino = interesting_u64(rng, near).max(1),
            _ => *name = vec![b'n'; rng.random_range(1..=255)],
        },
        Record::DirRemove { dir, name } => {
            if rng.random_bool(0.5) {
                *dir = interesting_u64(rng, near).max(1);
            } else {
                name.push(b'x');
            }
        }
        Record::ExtentMap { ino, file_block, dev_block, block_count, state } => {
            match rng.random_range(0..5) {
                0 => *ino = interesting_u64(rng, near).max(1),
                1 => *file_block = interesting_u64(rng, near),
                2 => *dev_block = interesting_u64(rng, near),
                3 => *block_count = interesting_u64(rng, near).max(1),
                _ => {
                    *state = match state {
                        ExtentState::Written => ExtentState::Unwritten,
                        ExtentState::Unwritten => ExtentState::Written,
                    }
                }
            }
            // Keep the record decodable so it reaches the state.
            *block_count = (*block_count).min(u64::MAX - *file_block).max(1);
            if file_block.checked_add(*block_count).is_none() {
                *file_block = u64::MAX - *block_count;
            }
            *block_count = (*block_count).min(u64::MAX - *dev_block).max(1);
            if dev_block.checked_add(*block_count).is_none() {
                *dev_block = u64::MAX - *block_count;
            }
        }
        Record::ExtentUnmap { ino, file_block, block_count } => {
            match rng.random_range(0..3) {
                0 => *ino = interesting_u64(rng, near).max(1),
                1 => *file_block = interesting_u64(rng, near),
                _ => *block_count = interesting_u64(rng, near).max(1),
            }
            *block_count = (*block_count).min(u64::MAX - *file_block).max(1);
        }
        Record::XattrSet { ino, name, value } => match rng.random_range(0..3) {
            0 => *ino = interesting_u64(rng, near).max(1),
            1 => *value = vec![0xA5; rng.random_range(0..=65536)],
            _ => *name = [&b"trusted."[..], &vec![b'n'; rng.random_range(1..=247)]].concat(),
        },
        Record::XattrRemove { ino, name } => {
            if rng.random_bool(0.5) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                name.push(b'x');
            }
        }
        Record::DeviceSet { ino, rdev } => {
            if rng.random_bool(0.5) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                *rdev = interesting_u32(rng);
            }
        }
        Record::FlagsSet { ino, flags } => {
            if rng.random_bool(0.5) {
                *ino = interesting_u64(rng, near).max(1);
            } else {
                // Decodable: any set of the known flags.
                *flags = interesting_u32(rng) & foliofs::format::INODE_FLAGS_KNOWN;
            }
        }
        Record::SharedSet { dev_block, block_count, refs } => {
            match rng.random_range(0..3) {
                0 => *dev_block = interesting_u64(rng, near),
                1 => *block_count = interesting_u64(rng, near).max(1),
                _ => *refs = interesting_u32(rng).max(1),
            }
            *block_count = (*block_count).min(u64::MAX - *dev_block).max(1);
        }
    }
}

/// A record built to contradict a sane tree: cycles, huge extents and
/// sizes, links to the root.
pub(crate) fn hostile_record(
    rng: &mut ChaCha8Rng,
    near: &[u64],
    superblock: &Superblock,
) -> Record {
    let pick = |rng: &mut ChaCha8Rng| {
        if near.is_empty() {
            1
        } else {
            near[rng.random_range(0..near.len())].max(1)
        }
    };
    let data = superblock.data;
    let attrs = |kind, size, nlink, parent| InodeAttrs {
        kind,
        mode: 0o755,
        uid: 0,
        gid: 0,
        nlink,
        size,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        parent,
    };
    match rng.random_range(0..15) {
        // A count the extent maps do not bear out.
        14 => Record::SharedSet {
            dev_block: data.start_block + rng.random_range(0..data.block_count.max(1)),
            block_count: rng.random_range(1..=16),
            refs: rng.random_range(1..=3),
        },
        13 => Record::FlagsSet {
            ino: pick(rng),
            flags: foliofs::format::INODE_FLAG_IMMUTABLE | foliofs::format::INODE_FLAG_APPEND,
        },
        9 => Record::XattrSet {
            ino: pick(rng),
            name: b"user.fuzz".to_vec(),
            value: vec![0x5A; rng.random_range(0..=65536)],
        },
        10 => Record::XattrRemove { ino: pick(rng), name: b"user.fuzz".to_vec() },
        11 => Record::DeviceSet { ino: pick(rng), rdev: interesting_u32(rng) },
        12 => Record::InodeSet {
            ino: interesting_u64(rng, near).max(2),
            attrs: attrs(InodeKind::Socket, 0, 1, 0),
        },
        0 => Record::DirAdd { dir: pick(rng), name: b"loop".to_vec(), ino: ROOT },
        1 => {
            let ino = pick(rng);
            Record::DirAdd { dir: ino, name: b"self".to_vec(), ino }
        }
        2 => Record::ExtentMap {
            ino: pick(rng),
            file_block: u64::MAX / 2 - rng.random_range(0..4),
            dev_block: data.start_block,
            block_count: rng.random_range(1..4),
            state: ExtentState::Written,
        },
        3 => Record::ExtentMap {
            ino: pick(rng),
            file_block: 0,
            dev_block: data.start_block,
            block_count: data.block_count,
            state: ExtentState::Written,
        },
        4 => Record::InodeSet {
            ino: pick(rng),
            attrs: attrs(InodeKind::File, interesting_u64(rng, &[]), 1, 0),
        },
        5 => Record::InodeSet {
            ino: interesting_u64(rng, &[]).max(2),
            attrs: attrs(InodeKind::Dir, 0, u32::MAX, ROOT),
        },
        6 => Record::InodeFree { ino: pick(rng) },
        7 => Record::ExtentUnmap { ino: pick(rng), file_block: 0, block_count: u64::MAX },
        _ => Record::ExtentMap {
            ino: pick(rng),
            file_block: rng.random_range(0..1 << 20),
            dev_block: data.end_block() - rng.random_range(1..3),
            block_count: rng.random_range(1..4),
            state: ExtentState::Unwritten,
        },
    }
}

/// Inode numbers and block numbers the records mention: hostile values
/// "near" them reach real objects.
pub(crate) fn numbers_of(records: &[Record], superblock: &Superblock) -> Vec<u64> {
    let mut out = vec![
        ROOT,
        superblock.data.start_block,
        superblock.data.end_block(),
        superblock.block_count,
    ];
    for record in records {
        match record {
            Record::InodeSet { ino, .. }
            | Record::InodeFree { ino }
            | Record::SymlinkSet { ino, .. }
            | Record::XattrSet { ino, .. }
            | Record::XattrRemove { ino, .. }
            | Record::DeviceSet { ino, .. }
            | Record::FlagsSet { ino, .. } => out.push(*ino),
            Record::DirAdd { dir, ino, .. } => out.extend([*dir, *ino]),
            Record::DirRemove { dir, .. } => out.push(*dir),
            Record::ExtentMap { ino, file_block, dev_block, .. } => {
                out.extend([*ino, *file_block, *dev_block])
            }
            Record::ExtentUnmap { ino, file_block, .. } => out.extend([*ino, *file_block]),
            Record::SharedSet { dev_block, .. } => out.push(*dev_block),
        }
    }
    out
}

/// Changes a list of records: one field, a deletion, a duplicate, a swap,
/// or a hostile insertion.
pub(crate) fn mutate_records(
    rng: &mut ChaCha8Rng,
    records: &mut Vec<Record>,
    superblock: &Superblock,
) -> String {
    let near = numbers_of(records, superblock);
    let kind = rng.random_range(0..10);
    if records.is_empty() || kind >= 8 {
        let record = hostile_record(rng, &near, superblock);
        let at = rng.random_range(0..=records.len());
        let what = format!("insert {record:?} at {at}");
        records.insert(at, record);
        return what;
    }
    let index = rng.random_range(0..records.len());
    match kind {
        0..=4 => {
            let before = format!("{:?}", records[index]);
            mutate_record(rng, &mut records[index], &near);
            format!("record {index}: {before} -> {:?}", records[index])
        }
        5 => format!("delete record {index}: {:?}", records.remove(index)),
        6 => {
            let copy = records[index].clone();
            let at = rng.random_range(0..=records.len());
            records.insert(at, copy);
            format!("duplicate record {index} at {at}")
        }
        _ => {
            let other = rng.random_range(0..records.len());
            records.swap(index, other);
            format!("swap records {index} and {other}")
        }
    }
}

/// A structure-aware mutation with checksums recomputed; `None` if the
/// image has no structure to change.
pub(crate) fn mutate_structured(rng: &mut ChaCha8Rng, image: &mut [u8]) -> Option<String> {
    let structures = Structures::of(image)?;
    let superblock = &structures.superblock;
    let sector = superblock.sector_bytes as usize;
    match rng.random_range(0..10) {
        0..=3 if !structures.slots.is_empty() => {
            let index = if rng.random_bool(0.8) {
                structures.newest_slot()?
            } else {
                rng.random_range(0..structures.slots.len())
            };
            let slot = &structures.slots[index];
            let mut header = slot.header;
            let mut records = slot.records.clone();
            let what = if rng.random_bool(0.3) {
                let value = interesting_u64(rng, &[header.lsn_applied, header.generation]);
                let field = rng.random_range(0..6);
                match field {
                    0 => header.generation = value,
                    1 => header.journal_replay_offset = value,
                    2 => header.journal_replay_seq = value,
                    3 => header.lsn_applied = value,
                    4 => header.next_ino = value,
                    _ => header.record_count = value,
                }
                format!("checkpoint slot {index} header field {field} = {value:#x}")
            } else {
                mutate_records(rng, &mut records, superblock)
            };
            let payload = encode_all(&records);
            let slot_bytes = superblock.checkpoint_slots[0].block_count as usize
                * superblock.block_bytes as usize;
            if sector + payload.len() > slot_bytes {
                return None;
            }
            if !what.contains("header field 5") {
                header.record_count = records.len() as u64;
            }
            header.payload_bytes = payload.len() as u64;
            header.payload_crc = crc32c::crc32c(&payload);
            image[slot.offset..slot.offset + HEADER_BYTES].copy_from_slice(&header.encode());
            image[slot.offset + sector..slot.offset + sector + payload.len()]
                .copy_from_slice(&payload);
            Some(format!("checkpoint: {what}"))
        }
        4..=7 if !structures.groups.is_empty() => {
            let index = rng.random_range(0..structures.groups.len());
            let mut groups: Vec<(GroupLink, Vec<Record>)> = structures
                .groups
                .iter()
                .map(|group| {
                    let header = group.header;
                    let link = GroupLink {
                        seq: header.seq,
                        first_lsn: header.first_lsn,
                        record_count: header.record_count,
                        prev_header_crc: header.prev_header_crc,
                    };
                    (link, group.records.clone())
                })
                .collect();
            let what = if rng.random_bool(0.25) {
                let link = &mut groups[index].0;
                let field = rng.random_range(0..3);
                match field {
                    0 => link.seq = interesting_u64(rng, &[link.seq]),
                    1 => link.first_lsn = interesting_u64(rng, &[link.first_lsn]),
                    _ => link.record_count = interesting_u32(rng),
                }
                format!("group {index} link {field}: {link:?}")
            } else {
                let (link, records) = &mut groups[index];
                let what = mutate_records(rng, records, superblock);
                link.record_count = records.len() as u32;
                format!("group {index}: {what}")
            };
            // Rewrite the group and the run of groups physically after it,
            // re-chaining their hashes so replay goes on past the change.
            let mut position = structures.groups[index].offset;
            let mut prev_crc = groups[index].0.prev_header_crc;
            let journal_end = structures.journal_end();
            for (number, (link, records)) in groups.iter().enumerate().skip(index) {
                let original = &structures.groups[number];
                if number > index
                    && (original.offset < structures.groups[number - 1].offset
                        || original.header.seq != structures.groups[number - 1].header.seq + 1)
                {
                    break;
                }
                let link = GroupLink { prev_header_crc: prev_crc, ..*link };
                let payload = encode_all(records);
                let (bytes, header_crc) =
                    encode_group(&superblock.uuid, link, &payload, superblock.sector_bytes);
                if position + bytes.len() > journal_end
                    || bytes.len()
                        > (journal_end
                            - superblock.journal.start_block as usize
                                * superblock.block_bytes as usize)
                            / 4
                {
                    break;
                }
                image[position..position + bytes.len()].copy_from_slice(&bytes);
                position += bytes.len();
                prev_crc = header_crc;
            }
            Some(format!("journal: {what}"))
        }
        _ => {
            let mut changed = superblock.clone();
            let value = interesting_u64(rng, &numbers_of(&[], superblock));
            let field = rng.random_range(0..8);
            match field {
                0 => changed.block_bytes = interesting_u32(rng),
                1 => changed.sector_bytes = [512, 1024, 4096, 65536][rng.random_range(0..4)],
                2 => changed.block_count = value,
                3 => changed.journal.block_count = value,
                4 => changed.journal.start_block = value,
                5 => changed.checkpoint_slots[rng.random_range(0..2)].block_count = value,
                6 => changed.data.start_block = value,
                _ => changed.data.block_count = value,
            }
            let bytes = changed.encode();
            image[..HEADER_BYTES].copy_from_slice(&bytes);
            if rng.random_bool(0.5) {
                let copy = Superblock::copy_offset(superblock.block_bytes, 1) as usize;
                image[copy..copy + HEADER_BYTES].copy_from_slice(&bytes);
            }
            Some(format!("superblock field {field}: {changed:?}"))
        }
    }
}

// ---------------------------------------------------------------------------
