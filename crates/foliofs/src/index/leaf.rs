//! A leaf's entries in memory: every key and value back to back in one
//! buffer, in key order, with a small slot per entry. Two allocations a
//! leaf rather than two an entry: a commit that moved a few thousand leaves
//! through the cache spent most of its time in the allocator, freeing
//! their entries one by one.

/// Where one entry's bytes are in the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    start: u32,
    key_bytes: u16,
    value_bytes: u16,
}

impl Slot {
    fn end(self) -> usize {
        self.start as usize + usize::from(self.key_bytes) + usize::from(self.value_bytes)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leaf {
    bytes: Vec<u8>,
    slots: Vec<Slot>,
}

impl Leaf {
    pub fn from_entries<K: AsRef<[u8]>, V: AsRef<[u8]>>(entries: &[(K, V)]) -> Self {
        let mut leaf = Leaf::default();
        for (key, value) in entries {
            leaf.push(key.as_ref(), value.as_ref());
        }
        leaf
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn key(&self, index: usize) -> &[u8] {
        let slot = self.slots[index];
        &self.bytes[slot.start as usize..slot.start as usize + usize::from(slot.key_bytes)]
    }

    pub fn value(&self, index: usize) -> &[u8] {
        let slot = self.slots[index];
        &self.bytes[slot.start as usize + usize::from(slot.key_bytes)..slot.end()]
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        (0..self.len()).map(|index| (self.key(index), self.value(index)))
    }

    /// Where `key` is, or where it would go.
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        self.slots.binary_search_by(|slot| {
            let start = slot.start as usize;
            self.bytes[start..start + usize::from(slot.key_bytes)].cmp(key)
        })
    }

    /// Appends an entry whose key sorts after every other.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        let index = self.len();
        self.insert(index, key, value);
    }

    pub fn insert(&mut self, index: usize, key: &[u8], value: &[u8]) {
        let start = self.slots.get(index).map_or(self.bytes.len(), |slot| slot.start as usize);
        let added = key.len() + value.len();
        self.bytes.splice(start..start, key.iter().chain(value).copied());
        for slot in &mut self.slots[index..] {
            slot.start += added as u32;
        }
        let slot = Slot { start: start as u32, key_bytes: len16(key), value_bytes: len16(value) };
        self.slots.insert(index, slot);
    }

    /// Sets entry `index`'s value, returning the one it had.
    pub fn replace_value(&mut self, index: usize, value: &[u8]) -> Vec<u8> {
        let old = self.value(index).to_vec();
        let slot = self.slots[index];
        let value_start = slot.start as usize + usize::from(slot.key_bytes);
        self.bytes.splice(value_start..slot.end(), value.iter().copied());
        self.slots[index].value_bytes = len16(value);
        let delta = value.len() as i64 - old.len() as i64;
        for slot in &mut self.slots[index + 1..] {
            slot.start = (i64::from(slot.start) + delta) as u32;
        }
        old
    }

    /// Removes entry `index`, returning its value.
    pub fn remove(&mut self, index: usize) -> Vec<u8> {
        let value = self.value(index).to_vec();
        let slot = self.slots.remove(index);
        let removed = slot.end() - slot.start as usize;
        self.bytes.drain(slot.start as usize..slot.end());
        for slot in &mut self.slots[index..] {
            slot.start -= removed as u32;
        }
        value
    }

    /// Moves the entries from `index` on into a new leaf.
    pub fn split_off(&mut self, index: usize) -> Leaf {
        let start = self.slots.get(index).map_or(self.bytes.len(), |slot| slot.start as usize);
        let bytes = self.bytes.split_off(start);
        let mut slots = self.slots.split_off(index);
        for slot in &mut slots {
            slot.start -= start as u32;
        }
        self.bytes.shrink_to_fit();
        self.slots.shrink_to_fit();
        Leaf { bytes, slots }
    }

    /// Appends `other`, whose keys all sort after this leaf's.
    pub fn append(&mut self, other: Leaf) {
        debug_assert!(
            self.is_empty() || other.is_empty() || self.key(self.len() - 1) < other.key(0)
        );
        let base = self.bytes.len() as u32;
        self.bytes.extend_from_slice(&other.bytes);
        self.slots
            .extend(other.slots.iter().map(|slot| Slot { start: slot.start + base, ..*slot }));
    }

    /// Each entry's bytes on a page (two lengths, key, value), in order.
    pub fn entry_page_bytes(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        self.slots.iter().map(|slot| ENTRY_OVERHEAD + slot.end() - slot.start as usize)
    }

    /// Bytes its entries take on a page.
    pub fn page_bytes(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD * self.len()
    }

    /// Bytes it holds in memory.
    pub fn memory_bytes(&self) -> usize {
        self.bytes.capacity() + std::mem::size_of::<Slot>() * self.slots.capacity()
    }
}

/// Bytes of an entry's two lengths on a page.
pub const ENTRY_OVERHEAD: usize = 4;

fn len16(bytes: &[u8]) -> u16 {
    u16::try_from(bytes.len()).expect("entries are checked against the page's limits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_keeps_its_entries_in_order_through_every_change() {
        let mut leaf = Leaf::from_entries(&[(b"b".as_slice(), b"2".as_slice()), (b"d", b"4444")]);
        leaf.insert(0, b"a", b"");
        leaf.insert(2, b"c", b"333");
        assert_eq!(leaf.search(b"c"), Ok(2));
        assert_eq!(leaf.search(b"bb"), Err(2));
        assert_eq!(leaf.replace_value(1, b"twenty-two"), b"2");
        assert_eq!(leaf.remove(0), b"");
        let pairs: Vec<_> = leaf.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
        let wanted = [
            (b"b".to_vec(), b"twenty-two".to_vec()),
            (b"c".to_vec(), b"333".to_vec()),
            (b"d".to_vec(), b"4444".to_vec()),
        ];
        assert_eq!(pairs, wanted);
        assert_eq!(leaf.page_bytes(), 3 * ENTRY_OVERHEAD + 3 + 10 + 3 + 4);
        let right = leaf.split_off(1);
        assert_eq!(
            (leaf.len(), right.key(0), right.value(1)),
            (1, b"c".as_slice(), b"4444".as_slice())
        );
        leaf.append(right);
        let again: Vec<_> = leaf.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
        assert_eq!(again, wanted);
    }
}
