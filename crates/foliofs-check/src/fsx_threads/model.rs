//! What each slot of each file must hold, and when a read has an answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Every file's slots.
pub struct Files {
    slots: Vec<Vec<Slot>>,
    slot_bytes: u64,
}

impl Files {
    pub fn new(files: usize, slots_per_file: usize, slot_bytes: u64) -> Self {
        let slots = (0..files)
            .map(|_| {
                (0..slots_per_file)
                    .map(|index| Slot::new(index as u64 * slot_bytes, slot_bytes))
                    .collect()
            })
            .collect();
        Self { slots, slot_bytes }
    }

    pub fn slot(&self, file: usize, slot: usize) -> &Slot {
        &self.slots[file][slot]
    }

    /// Sets a file's contents from `data`, before any thread runs.
    pub fn set_initial(&self, file: usize, data: &[u8]) {
        for (slot, chunk) in self.slots[file].iter().zip(data.chunks(self.slot_bytes as usize)) {
            let mut bytes = slot.bytes.lock().expect("slot lock");
            bytes.data[..chunk.len()].copy_from_slice(chunk);
            bytes.len = chunk.len() as u64;
        }
    }

    /// The whole file as a read from offset 0 returns it (to its end).
    pub fn whole_file(&self, file: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for slot in &self.slots[file] {
            let bytes = slot.bytes.lock().expect("slot lock");
            out.extend_from_slice(&bytes.data[..bytes.len as usize]);
        }
        out
    }
}

/// One slot: its bytes and a version that is odd while its owner changes it.
pub struct Slot {
    version: AtomicU64,
    bytes: Mutex<SlotBytes>,
}

/// A change in progress; the version turns even again when it drops.
pub struct Changing<'a> {
    slot: &'a Slot,
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        let before = self.slot.version.fetch_add(1, Ordering::SeqCst);
        assert!(!before.is_multiple_of(2), "a slot's change ended twice");
    }
}

impl Slot {
    fn new(start: u64, slot_bytes: u64) -> Self {
        Self {
            version: AtomicU64::new(0),
            bytes: Mutex::new(SlotBytes { start, data: vec![0; slot_bytes as usize], len: 0 }),
        }
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Called by the slot's owner before it touches the file.
    pub fn begin_change(&self) -> Changing<'_> {
        let before = self.version.fetch_add(1, Ordering::SeqCst);
        assert!(before.is_multiple_of(2), "a slot has one owner, changing it one thing at a time");
        Changing { slot: self }
    }

    /// Records in the model what the owner's change did to the file, once
    /// the file's call returned.
    pub fn apply(&self, change: &Changing<'_>, edit: impl FnOnce(&mut SlotBytes)) {
        assert!(std::ptr::eq(change.slot, self), "a change applies to its own slot");
        edit(&mut self.bytes.lock().expect("slot lock"));
    }

    /// What a read of `len` bytes at `pos` must return (fewer at end of file).
    pub fn expected(&self, pos: u64, len: u64) -> Vec<u8> {
        expected_from(&self.bytes.lock().expect("slot lock"), pos, len)
    }

    /// The answer of a read that began when the version was `before`, if it
    /// has one: the owner's reads always do (nothing else changes the
    /// slot); another thread's only when no change ran meanwhile.
    pub fn expected_if_unchanged(
        &self,
        before: u64,
        pos: u64,
        len: u64,
        owner: bool,
    ) -> Option<Vec<u8>> {
        if !owner && !before.is_multiple_of(2) {
            return None;
        }
        let bytes = self.bytes.lock().expect("slot lock");
        // The owner updates the bytes before the version turns even, under
        // this lock: an unchanged version here means these bytes are the
        // ones the file held throughout the read.
        if !owner && self.version() != before {
            return None;
        }
        Some(expected_from(&bytes, pos, len))
    }
}

fn expected_from(bytes: &SlotBytes, pos: u64, len: u64) -> Vec<u8> {
    let offset = (pos - bytes.start) as usize;
    let end = (offset + len as usize).min(bytes.len as usize).max(offset);
    bytes.data[offset..end].to_vec()
}

/// A slot's bytes; `len` of them lie inside the file (all but in the last
/// slot, which truncation moves).
pub struct SlotBytes {
    start: u64,
    data: Vec<u8>,
    len: u64,
}

impl SlotBytes {
    pub fn write(&mut self, pos: u64, data: &[u8]) {
        let offset = (pos - self.start) as usize;
        self.data[offset..offset + data.len()].copy_from_slice(data);
        self.len = self.len.max((offset + data.len()) as u64);
    }

    /// Punch hole and zero range, both keeping the size.
    pub fn zero(&mut self, pos: u64, len: u64) {
        let offset = (pos - self.start) as usize;
        let end = (offset + len as usize).min(self.len as usize).max(offset);
        self.data[offset..end].fill(0);
    }

    /// Truncation to `size` (a file offset inside this slot).
    pub fn truncate(&mut self, size: u64) {
        let new_len = size - self.start;
        if new_len < self.len {
            self.data[new_len as usize..self.len as usize].fill(0);
        }
        self.len = new_len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_overlapping_a_change_has_no_answer_unless_the_reader_owns_the_slot() {
        let files = Files::new(1, 2, 8);
        files.set_initial(0, &[1; 16]);
        let slot = files.slot(0, 1);
        let before = slot.version();
        let change = slot.begin_change();
        slot.apply(&change, |bytes| bytes.write(8, &[2; 4]));
        drop(change);
        assert_eq!(slot.expected_if_unchanged(before, 8, 8, false), None);
        assert_eq!(
            slot.expected_if_unchanged(before, 8, 8, true),
            Some(vec![2, 2, 2, 2, 1, 1, 1, 1])
        );
        let now = slot.version();
        assert_eq!(slot.expected_if_unchanged(now, 10, 4, false), Some(vec![2, 2, 1, 1]));
    }

    #[test]
    fn truncation_zeroes_what_it_cuts_and_reads_end_at_the_size() {
        let files = Files::new(1, 2, 8);
        files.set_initial(0, &[7; 16]);
        let slot = files.slot(0, 1);
        let change = slot.begin_change();
        slot.apply(&change, |bytes| bytes.truncate(10));
        slot.apply(&change, |bytes| bytes.truncate(14));
        drop(change);
        assert_eq!(slot.expected(8, 8), vec![7, 7, 0, 0, 0, 0]);
        assert_eq!(files.whole_file(0).len(), 14);
    }
}
