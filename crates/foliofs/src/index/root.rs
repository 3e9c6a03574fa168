//! An index's root record and its free list on disk.
//!
//! The record is written to one of two slots at the start of the index's
//! region, alternating by generation, with FUA after every page it names is
//! flushed: whichever valid slot holds the higher generation is the index.
//! A torn or lost record write leaves the other slot, the previous commit,
//! whose pages were not overwritten (see `alloc`).
//!
//! ```text
//! 0  magic "FIDR"   4  crc32c of bytes 0..128 (this field as zero)
//! 8  generation     16 owner u32    20 root level u8
//! 24 root address   32 root generation   40 entries
//! 48 high-water mark   56 free list: first page address, 64 its generation
//! 72 free pages listed   80 pages holding the list
//! 88..128 the owner's own bytes (the metadata store: where its log
//!         resumes), committed atomically with the tree
//! ```
//!
//! An index whose pages come from its owner (`Grower`) keeps, in place of
//! the high-water mark, the number of pages it was given.
//!
//! The free list is a chain of leaf pages owned by `owner | FREE_LIST_BIT`:
//! an entry with the empty key points to the next page (address and
//! generation), the others are free addresses, 8 bytes big-endian.

use super::page::{self, Expected, Leaf, Node, PageRef, PAGE_BYTES};
use crate::error::{Error, Result};

pub const RECORD_BYTES: usize = 128;
const MAGIC: [u8; 4] = *b"FIDR";
/// Set in the owner of free-list pages, so one is never taken for a node.
pub const FREE_LIST_BIT: u32 = 1 << 31;
/// Bytes of the record its owner fills (`Tree::set_attached`).
pub const ATTACHED_BYTES: usize = RECORD_BYTES - ATTACHED_OFFSET;
const ATTACHED_OFFSET: usize = 88;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootRecord {
    pub generation: u64,
    pub owner: u32,
    pub root_level: u8,
    pub root: PageRef,
    pub entries: u64,
    pub high_water: u64,
    pub free_list: Option<PageRef>,
    pub free_listed: u64,
    pub free_list_pages: u64,
    pub attached: [u8; ATTACHED_BYTES],
}

impl RootRecord {
    pub fn encode(&self, out: &mut [u8]) {
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC);
        let mut put = |at: usize, value: u64| out[at..at + 8].copy_from_slice(&value.to_le_bytes());
        put(8, self.generation);
        put(24, self.root.address);
        put(32, self.root.generation);
        put(40, self.entries);
        put(48, self.high_water);
        let free = self.free_list.unwrap_or(PageRef { address: u64::MAX, generation: 0 });
        put(56, free.address);
        put(64, free.generation);
        put(72, self.free_listed);
        put(80, self.free_list_pages);
        out[16..20].copy_from_slice(&self.owner.to_le_bytes());
        out[20] = self.root_level;
        out[ATTACHED_OFFSET..RECORD_BYTES].copy_from_slice(&self.attached);
        let crc = crc32c::crc32c(&out[..RECORD_BYTES]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
    }

    /// The record in a slot, or why there is none (never written, torn,
    /// another tree's).
    pub fn decode(bytes: &[u8], owner: u32) -> std::result::Result<Self, String> {
        if bytes.len() < RECORD_BYTES || bytes[0..4] != MAGIC {
            return Err("no root record".into());
        }
        let mut copy = [0u8; RECORD_BYTES];
        copy.copy_from_slice(&bytes[..RECORD_BYTES]);
        copy[4..8].fill(0);
        let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        if crc32c::crc32c(&copy) != field(4) as u32 {
            return Err("root record checksum mismatch".into());
        }
        let stored_owner = u32::from_le_bytes(bytes[16..20].try_into().unwrap());
        if stored_owner != owner {
            return Err(format!("the root record is tree {stored_owner}'s, not tree {owner}'s"));
        }
        let free_list =
            (field(56) != u64::MAX).then(|| PageRef { address: field(56), generation: field(64) });
        Ok(Self {
            generation: field(8),
            owner,
            root_level: bytes[20],
            root: PageRef { address: field(24), generation: field(32) },
            entries: field(40),
            high_water: field(48),
            free_list,
            free_listed: field(72),
            free_list_pages: field(80),
            attached: bytes[ATTACHED_OFFSET..RECORD_BYTES].try_into().unwrap(),
        })
    }
}

/// Free addresses one list page holds beside its link to the next.
pub const FREE_PER_PAGE: usize = (PAGE_BYTES - page::HEADER_BYTES - 4 - 16) / (4 + 8);

/// The list pages holding `free`: `pages[i]` links to `pages[i + 1]`.
pub fn free_list_nodes(free: &[u64], pages: &[PageRef]) -> Vec<Node> {
    assert!(free.len() <= pages.len() * FREE_PER_PAGE, "too few pages for the free list");
    let mut sorted = free.to_vec();
    sorted.sort_unstable();
    let mut chunks = sorted.chunks(FREE_PER_PAGE);
    (0..pages.len())
        .map(|index| {
            let mut leaf = Leaf::default();
            if let Some(next) = pages.get(index + 1) {
                let mut link = next.address.to_le_bytes().to_vec();
                link.extend_from_slice(&next.generation.to_le_bytes());
                leaf.push(&[], &link);
            }
            for address in chunks.next().unwrap_or(&[]) {
                leaf.push(&address.to_be_bytes(), &[]);
            }
            Node::Leaf(leaf)
        })
        .collect()
}

/// Reads one list page: its free addresses and the next page, if any.
pub fn decode_free_list_page(
    bytes: &[u8],
    page: PageRef,
    owner: u32,
) -> Result<(Vec<u64>, Option<PageRef>)> {
    let expected = Expected { page, owner: owner | FREE_LIST_BIT, level: Some(0) };
    let Node::Leaf(leaf) = page::decode(bytes, expected)? else {
        unreachable!("level 0 decodes as a leaf");
    };
    let corrupt = || Error::Corrupt(format!("free-list page at byte {}: bad entry", page.address));
    let mut next = None;
    let mut free = Vec::with_capacity(leaf.len());
    for (key, value) in leaf.iter() {
        match (key.len(), value.len()) {
            (0, 16) => {
                let address = u64::from_le_bytes(value[..8].try_into().unwrap());
                let generation = u64::from_le_bytes(value[8..].try_into().unwrap());
                next = Some(PageRef { address, generation });
            }
            (8, 0) => free.push(u64::from_be_bytes(key.try_into().unwrap())),
            _ => return Err(corrupt()),
        }
    }
    Ok((free, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_torn_or_foreign_one_is_refused() {
        let record = RootRecord {
            generation: 7,
            owner: 2,
            root_level: 3,
            root: PageRef { address: 81920, generation: 7 },
            entries: 1_000_000,
            high_water: 1 << 30,
            free_list: Some(PageRef { address: 4096 * 9, generation: 6 }),
            free_listed: 500,
            free_list_pages: 2,
            attached: [9; ATTACHED_BYTES],
        };
        let mut slot = vec![0u8; PAGE_BYTES];
        record.encode(&mut slot);
        assert_eq!(RootRecord::decode(&slot, 2), Ok(record));
        assert!(RootRecord::decode(&slot, 3).unwrap_err().contains("tree 2"));
        slot[50] ^= 4;
        assert!(RootRecord::decode(&slot, 2).unwrap_err().contains("checksum"));
        assert!(RootRecord::decode(&[0u8; PAGE_BYTES], 2).is_err());
    }

    #[test]
    fn a_free_list_reads_back_page_by_page() {
        let free: Vec<u64> = (0..FREE_PER_PAGE as u64 + 10).map(|page| page * 4096).collect();
        let pages =
            [PageRef { address: 1 << 40, generation: 3 }, PageRef { address: 8, generation: 3 }];
        let nodes = free_list_nodes(&free, &pages);
        let mut read = Vec::new();
        let mut buffer = vec![0u8; PAGE_BYTES];
        for (index, node) in nodes.iter().enumerate() {
            page::encode(node, pages[index], 5 | FREE_LIST_BIT, &mut buffer);
            let (addresses, next) = decode_free_list_page(&buffer, pages[index], 5).unwrap();
            assert_eq!(next, pages.get(index + 1).copied());
            read.extend(addresses);
        }
        assert_eq!(read, free);
        // A node page is never taken for a list page.
        page::encode(&nodes[0], pages[0], 5, &mut buffer);
        assert!(decode_free_list_page(&buffer, pages[0], 5).is_err());
    }
}
