//! A checkpoint's payload, shard by shard, without stopping writers.
//!
//! The checkpoint is the state after one point of the log (its cut). To
//! find the cut, the checkpointer read-locks every shard at once: a
//! transaction holds its shards from its first change until its records
//! are in the log, so with every shard held none is half done, and the
//! log's end is exactly the point the state reflects. It then marks every
//! shard *owed* and lets them all go. From there the shards are encoded one
//! at a time: by the checkpointer, under that shard's read lock, or by the
//! first writer to lock an owed shard, before it changes anything
//! (`MetaCore::pay_checkpoint`). Either way a shard is encoded as it was at
//! the cut, and a writer waits at most for one shard's encoding.
//!
//! The payload is every shard's inode records, then every shard's
//! directory entries, so that at load each entry's inode already exists.

use rustc_hash::FxHashMap;

use super::inode::{Inode, InodeBody};
use crate::format::codec::Writer;
use crate::format::Record;

/// One shard's records at the cut.
#[derive(Debug, Clone)]
pub struct ShardPart {
    inodes: Vec<u8>,
    inode_records: u64,
    entries: Vec<u8>,
    entry_records: u64,
}

impl ShardPart {
    /// The records of one shard's `inodes`, by number.
    pub fn encode(inodes: &FxHashMap<u64, Inode>) -> Self {
        let mut inos: Vec<u64> = inodes.keys().copied().collect();
        inos.sort_unstable();
        let mut part =
            Self { inodes: Vec::new(), inode_records: 0, entries: Vec::new(), entry_records: 0 };
        let mut inode_writer = Writer::with_capacity(inos.len() * 96);
        let mut entry_writer = Writer::with_capacity(0);
        for ino in inos {
            let inode = &inodes[&ino];
            part.inode_records += encode_inode(ino, inode, &mut inode_writer);
            if let Some(entries) = inode.entries() {
                for (name, &target) in entries {
                    Record::DirAdd { dir: ino, name: name.clone(), ino: target }
                        .encode(&mut entry_writer);
                    part.entry_records += 1;
                }
            }
        }
        part.inodes = inode_writer.into_bytes();
        part.entries = entry_writer.into_bytes();
        assert!(part.inode_records >= inodes.len() as u64, "an inode without its record");
        assert_eq!(part.inodes.is_empty(), part.inode_records == 0);
        assert_eq!(part.entries.is_empty(), part.entry_records == 0);
        part
    }
}

/// Encodes one inode with its symlink target, device number, extents,
/// extended attributes and flags; returns how many records.
pub(super) fn encode_inode(ino: u64, inode: &Inode, writer: &mut Writer) -> u64 {
    let mut count = 0;
    let mut emit = |record: Record, writer: &mut Writer| {
        record.encode(writer);
        count += 1;
    };
    emit(Record::InodeSet { ino, attrs: inode.attrs }, writer);
    match &inode.body {
        InodeBody::Symlink(target) if !target.is_empty() => {
            emit(Record::SymlinkSet { ino, target: target.clone() }, writer);
        }
        InodeBody::File(extents) => {
            for extent in extents.iter() {
                let Some(state) = extent.kind.persisted() else {
                    continue;
                };
                let record = Record::ExtentMap {
                    ino,
                    file_block: extent.file_block,
                    dev_block: extent.dev_block,
                    block_count: extent.block_count,
                    state,
                };
                emit(record, writer);
            }
        }
        InodeBody::Special { rdev } if *rdev != 0 => {
            emit(Record::DeviceSet { ino, rdev: *rdev }, writer);
        }
        _ => {}
    }
    for (name, value) in &inode.xattrs {
        emit(Record::XattrSet { ino, name: name.clone(), value: value.clone() }, writer);
    }
    if inode.flags != 0 {
        emit(Record::FlagsSet { ino, flags: inode.flags }, writer);
    }
    debug_assert!(count >= 1, "inode {ino} encoded without its InodeSet");
    count
}

/// The payload of every shard's part (inode records first, then entries)
/// and its record count.
pub fn assemble(parts: &[ShardPart]) -> (Vec<u8>, u64) {
    let bytes = parts.iter().map(|part| part.inodes.len() + part.entries.len()).sum();
    let mut payload = Vec::with_capacity(bytes);
    let mut count = 0;
    for part in parts {
        payload.extend_from_slice(&part.inodes);
        count += part.inode_records;
    }
    for part in parts {
        payload.extend_from_slice(&part.entries);
        count += part.entry_records;
    }
    assert_eq!(payload.len(), bytes, "the payload is every part's bytes");
    (payload, count)
}
