//! One index page on disk: a 4 KiB block holding one node of a tree, framed
//! so that a page read from the wrong place or from an older write is
//! caught before it is followed.
//!
//! ```text
//! 0   magic "FIDX"          4   crc32c of the page (this field as zero)
//! 8   address (bytes)       16  generation (the commit that wrote it)
//! 24  owner (tree id)       28  level (0 = leaf)   29 reserved
//! 30  entry count           32  reserved to 40
//! 40  entries
//!     leaf:   key length u16, value length u16, key, value
//!     branch: key length u16, key, child address u64, child generation u64
//! ```
//!
//! The parent names each child by address *and* generation, as btrfs's
//! pointers do: a page whose own address differs was misdirected, one whose
//! generation differs is a stale copy (a lost write), one whose owner or
//! level differs belongs elsewhere. Each is refused as corruption naming
//! the page, never followed.

pub use super::leaf::Leaf;
use super::leaf::ENTRY_OVERHEAD as LEAF_ENTRY_OVERHEAD;
use crate::error::{Error, Result};

/// Bytes in one index page.
pub const PAGE_BYTES: usize = 4096;
/// Bytes of the page header.
pub const HEADER_BYTES: usize = 40;
/// The largest key plus value one leaf entry may hold: at least three
/// entries fit a page, so a split always leaves both halves non-empty.
pub const ENTRY_BYTES_MAX: usize = (PAGE_BYTES - HEADER_BYTES) / 3 - LEAF_ENTRY_OVERHEAD;
/// The largest key (a branch entry carries one beside its child pointer).
pub const KEY_BYTES_MAX: usize = 512;

/// Splits `addresses` (sorted) into runs of adjacent pages, at most
/// `run_pages_max` each, as index ranges: one device request per run.
pub fn adjacent_runs(
    addresses: &[u64],
    run_pages_max: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start == addresses.len() {
            return None;
        }
        let mut end = start + 1;
        while end < addresses.len()
            && end - start < run_pages_max
            && addresses[end] == addresses[end - 1] + PAGE_BYTES as u64
        {
            end += 1;
        }
        let run = start..end;
        start = end;
        Some(run)
    })
}

const MAGIC: [u8; 4] = *b"FIDX";
const BRANCH_ENTRY_OVERHEAD: usize = 2 + 8 + 8;

/// Where a child page is and which write of it the parent expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRef {
    /// Byte address of the page on the device.
    pub address: u64,
    /// The commit generation that wrote it.
    pub generation: u64,
}

/// What the reader expects a page to be.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub page: PageRef,
    pub owner: u32,
    /// `None` where the level is not known yet (a root read from its record
    /// carries it; every other page's level is its parent's less one).
    pub level: Option<u8>,
}

/// A node as it lives in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Leaf(Leaf),
    /// `keys[i]` is the least key `children[i]` may hold (`keys[0]` is the
    /// node's own lower bound and never compared); level ≥ 1.
    Branch {
        level: u8,
        keys: Vec<Vec<u8>>,
        children: Vec<Child>,
    },
}

/// A branch's pointer to a child: on disk, or a node changed since the
/// last commit and held in memory under a number until it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Child {
    OnDisk(PageRef),
    Dirty(u64),
}

impl Node {
    pub fn level(&self) -> u8 {
        match self {
            Node::Leaf(_) => 0,
            Node::Branch { level, .. } => *level,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Node::Leaf(entries) => entries.len(),
            Node::Branch { children, .. } => children.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes its page would take, header included.
    pub fn encoded_bytes(&self) -> usize {
        HEADER_BYTES
            + match self {
                Node::Leaf(leaf) => leaf.page_bytes(),
                Node::Branch { keys, .. } => {
                    keys.iter().map(|key| BRANCH_ENTRY_OVERHEAD + key.len()).sum::<usize>()
                }
            }
    }

    /// Bytes it holds in memory, roughly: what the cache's budget counts.
    pub fn memory_bytes(&self) -> usize {
        const VEC_BYTES: usize = 24;
        const NODE_BYTES: usize = 96;
        NODE_BYTES
            + match self {
                Node::Leaf(leaf) => leaf.memory_bytes(),
                Node::Branch { keys, .. } => {
                    keys.iter().map(|key| VEC_BYTES + 16 + key.len()).sum::<usize>()
                }
            }
    }

    pub fn fits(&self) -> bool {
        self.encoded_bytes() <= PAGE_BYTES
    }
}

/// Encodes `node` as the page written at `page`. Every child must be on
/// disk already (children are written before their parents).
pub fn encode(node: &Node, page: PageRef, owner: u32, out: &mut [u8]) {
    assert_eq!(out.len(), PAGE_BYTES);
    assert!(node.fits(), "a node of {} bytes was left unsplit", node.encoded_bytes());
    out.fill(0);
    out[0..4].copy_from_slice(&MAGIC);
    out[8..16].copy_from_slice(&page.address.to_le_bytes());
    out[16..24].copy_from_slice(&page.generation.to_le_bytes());
    out[24..28].copy_from_slice(&owner.to_le_bytes());
    out[28] = node.level();
    out[30..32].copy_from_slice(&(node.len() as u16).to_le_bytes());
    let mut at = HEADER_BYTES;
    let mut put = |bytes: &[u8]| {
        out[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    match node {
        Node::Leaf(leaf) => {
            for (key, value) in leaf.iter() {
                put(&(key.len() as u16).to_le_bytes());
                put(&(value.len() as u16).to_le_bytes());
                put(key);
                put(value);
            }
        }
        Node::Branch { keys, children, .. } => {
            for (key, child) in keys.iter().zip(children) {
                let Child::OnDisk(child) = child else {
                    panic!("a branch was written before its dirty child");
                };
                put(&(key.len() as u16).to_le_bytes());
                put(key);
                put(&child.address.to_le_bytes());
                put(&child.generation.to_le_bytes());
            }
        }
    }
    let crc = crc32c::crc32c(out);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a page read from `expected.page.address`, refusing anything that
/// is not the page the reader was sent to.
pub fn decode(bytes: &[u8], expected: Expected) -> Result<Node> {
    let address = expected.page.address;
    let corrupt = |what: String| {
        Error::Corrupt(format!(
            "index page at byte {address} (tree {}, generation {}): {what}",
            expected.owner, expected.page.generation
        ))
    };
    if bytes.len() != PAGE_BYTES || bytes[0..4] != MAGIC {
        return Err(corrupt("not an index page (bad magic)".into()));
    }
    let stored_crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
    let mut copy = [0u8; PAGE_BYTES];
    copy.copy_from_slice(bytes);
    copy[4..8].fill(0);
    if crc32c::crc32c(&copy) != stored_crc {
        return Err(corrupt("checksum mismatch".into()));
    }
    let field = |range: std::ops::Range<usize>| u64::from_le_bytes(pad8(&bytes[range]));
    let (own_address, generation) = (field(8..16), field(16..24));
    let owner = field(24..28) as u32;
    let level = bytes[28];
    if own_address != address {
        return Err(corrupt(format!("misdirected: it was written for byte {own_address}")));
    }
    if generation != expected.page.generation {
        return Err(corrupt(format!("stale: it holds generation {generation}")));
    }
    if owner != expected.owner {
        return Err(corrupt(format!("it belongs to tree {owner}")));
    }
    if expected.level.is_some_and(|wanted| wanted != level) {
        return Err(corrupt(format!("level {level}, its parent expects {:?}", expected.level)));
    }
    let count = field(30..32) as usize;
    decode_entries(&bytes[HEADER_BYTES..], level, count).map_err(corrupt)
}

fn pad8(bytes: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..bytes.len()].copy_from_slice(bytes);
    out
}

/// Reads entries off a page body, every length checked against what is
/// left, so a damaged page that passed its checksum still cannot panic.
struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, length: usize) -> std::result::Result<&'a [u8], String> {
        let end = self.at.checked_add(length).filter(|&end| end <= self.body.len());
        let end =
            end.ok_or_else(|| format!("an entry runs past the page at offset {}", self.at))?;
        let bytes = &self.body[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u16(&mut self) -> std::result::Result<usize, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()) as usize)
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}

fn decode_entries(body: &[u8], level: u8, count: usize) -> std::result::Result<Node, String> {
    let mut reader = Reader { body, at: 0 };
    let node = if level == 0 {
        let mut leaf = Leaf::default();
        for _ in 0..count {
            let (key_bytes, value_bytes) = (reader.u16()?, reader.u16()?);
            let key = reader.take(key_bytes)?;
            if !leaf.is_empty() && leaf.key(leaf.len() - 1) >= key {
                return Err("keys out of order".into());
            }
            leaf.push(key, reader.take(value_bytes)?);
        }
        Node::Leaf(leaf)
    } else {
        if count == 0 {
            return Err("a branch with no children".into());
        }
        let (mut keys, mut children) = (Vec::with_capacity(count), Vec::with_capacity(count));
        for _ in 0..count {
            let key_bytes = reader.u16()?;
            keys.push(reader.take(key_bytes)?.to_vec());
            let (address, generation) = (reader.u64()?, reader.u64()?);
            children.push(Child::OnDisk(PageRef { address, generation }));
        }
        Node::Branch { level, keys, children }
    };
    let sorted = match &node {
        Node::Leaf(_) => true, // checked as it was read
        Node::Branch { keys, .. } => keys.windows(2).skip(1).all(|pair| pair[0] < pair[1]),
    };
    if !sorted {
        return Err("keys out of order".into());
    }
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_pages_make_runs_no_longer_than_asked() {
        let page = PAGE_BYTES as u64;
        let addresses = [0, page, 2 * page, 5 * page, 6 * page, 9 * page];
        let runs: Vec<_> = adjacent_runs(&addresses, 2).collect();
        assert_eq!(runs, vec![0..2, 2..3, 3..5, 5..6]);
        assert_eq!(adjacent_runs(&[], 4).count(), 0);
    }

    fn leaf() -> Node {
        Node::Leaf(Leaf::from_entries(&[
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), vec![7; 300]),
        ]))
    }

    fn expected(address: u64, generation: u64) -> Expected {
        Expected { page: PageRef { address, generation }, owner: 3, level: Some(0) }
    }

    #[test]
    fn a_page_decodes_to_the_node_encoded() {
        let mut page = vec![0u8; PAGE_BYTES];
        encode(&leaf(), PageRef { address: 8192, generation: 5 }, 3, &mut page);
        assert_eq!(decode(&page, expected(8192, 5)).unwrap(), leaf());
        let branch = Node::Branch {
            level: 2,
            keys: vec![vec![], b"m".to_vec()],
            children: vec![
                Child::OnDisk(PageRef { address: 4096, generation: 1 }),
                Child::OnDisk(PageRef { address: 12288, generation: 4 }),
            ],
        };
        encode(&branch, PageRef { address: 0, generation: 9 }, 3, &mut page);
        let read = decode(&page, Expected { level: Some(2), ..expected(0, 9) }).unwrap();
        assert_eq!(read, branch);
    }

    #[test]
    fn a_misdirected_stale_foreign_or_damaged_page_is_refused_by_name() {
        let mut page = vec![0u8; PAGE_BYTES];
        encode(&leaf(), PageRef { address: 8192, generation: 5 }, 3, &mut page);
        let refused = |page: &[u8], expected: Expected| match decode(page, expected) {
            Err(Error::Corrupt(message)) => message,
            other => panic!("accepted: {other:?}"),
        };
        assert!(refused(&page, expected(4096, 5)).contains("misdirected"));
        assert!(refused(&page, expected(8192, 6)).contains("stale"));
        assert!(refused(&page, Expected { owner: 4, ..expected(8192, 5) }).contains("tree 3"));
        let as_branch = Expected { level: Some(1), ..expected(8192, 5) };
        assert!(refused(&page, as_branch).contains("level 0"));
        for bit in [0, 40 * 8 + 3, 4000 * 8] {
            let mut damaged = page.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            let message = refused(&damaged, expected(8192, 5));
            assert!(message.contains("byte 8192"), "{message}");
        }
    }

    #[test]
    fn a_page_with_a_valid_checksum_but_lying_lengths_is_refused_not_panicked_on() {
        let mut page = vec![0u8; PAGE_BYTES];
        encode(&leaf(), PageRef { address: 0, generation: 1 }, 3, &mut page);
        page[30..32].copy_from_slice(&400u16.to_le_bytes()); // more entries than the body holds
        page[4..8].fill(0);
        let crc = crc32c::crc32c(&page);
        page[4..8].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&page, expected(0, 1)), Err(Error::Corrupt(_))));
    }
}
